//! JPEG pixels as PIL decodes them. PIL decodes JPEG with libjpeg-turbo (its slow-integer IDCT,
//! fancy chroma upsampling, its YCbCr tables); so does this module, with mozjpeg's copy of
//! libjpeg-turbo's decoder (compiled from C, without its assembly: the same bytes, as
//! libjpeg-turbo's SIMD paths equal its C ones). zune-jpeg, which `image` decodes with, rounds
//! its IDCT and colour conversion otherwise and upsamples chroma its own way: on a 4:2:0
//! photograph 16% of the values differed from PIL's, by up to 4 levels.
//!
//! libjpeg reports a failure by unwinding (mozjpeg's error manager), caught here into an error.
//! A file cut short is decoded by libjpeg with its missing part grey (a warning only), where
//! PIL refuses it ("image file is truncated"): it is refused here before decoding.

use crate::error::ApiError;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A JPEG's pixels as 8-bit RGB: (width, height, pixels), or `None` for a file libjpeg does not
/// convert to RGB (CMYK and YCCK, Adobe's), which the caller decodes otherwise. A file that
/// cannot be decoded is `broken(why)`.
pub(crate) fn decode_rgb(
    bytes: &[u8],
    broken: impl Fn(String) -> ApiError,
) -> Result<Option<(u32, u32, Vec<u8>)>, ApiError> {
    if truncated(bytes) {
        return Err(broken(
            "truncated: the file ends before its image data does".into(),
        ));
    }
    let run = || -> std::io::Result<Option<(u32, u32, Vec<u8>)>> {
        let d = mozjpeg::Decompress::new_mem(bytes)?;
        if matches!(
            d.color_space(),
            mozjpeg::ColorSpace::JCS_CMYK | mozjpeg::ColorSpace::JCS_YCCK
        ) {
            return Ok(None);
        }
        let mut started = d.rgb()?;
        let (width, height) = (started.width(), started.height());
        let pixels: Vec<u8> = started.read_scanlines()?;
        started.finish()?;
        if pixels.len() != width * height * 3 {
            return Err(std::io::Error::other(format!(
                "{} bytes of pixels for {width} x {height}",
                pixels.len()
            )));
        }
        let side = |v: usize| u32::try_from(v).map_err(std::io::Error::other);
        Ok(Some((side(width)?, side(height)?, pixels)))
    };
    match catch_unwind(AssertUnwindSafe(run)) {
        Ok(Ok(decoded)) => Ok(decoded),
        Ok(Err(e)) => Err(broken(e.to_string())),
        Err(unwound) => Err(broken(
            unwound
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| unwound.downcast_ref::<&str>().copied())
                .unwrap_or("libjpeg failed")
                .trim_start_matches("libjpeg fatal error: ")
                .to_owned(),
        )),
    }
}

/// Whether the file ends before its image data does: its segments are walked from the start of
/// image to the first start of scan (each `FF xx` with its length), and from there the end of
/// image marker `FF D9` must follow (entropy-coded data holds an `FF` only as `FF 00` or a
/// restart marker, so the first `FF D9` after the scan starts is the end). A file whose segments
/// do not parse is left to libjpeg.
fn truncated(b: &[u8]) -> bool {
    if !b.starts_with(&[0xFF, 0xD8]) {
        return false;
    }
    let mut i = 2;
    loop {
        let Some(&[ff, marker]) = b.get(i..i + 2) else {
            // The end before any scan.
            return true;
        };
        if ff != 0xFF {
            return false;
        }
        match marker {
            // Fill bytes before a marker.
            0xFF => i += 1,
            // Start of scan: the end of image must follow.
            0xDA => return memchr::memmem::find(&b[i + 2..], &[0xFF, 0xD9]).is_none(),
            // Markers without a length.
            0x01 | 0xD0..=0xD8 => i += 2,
            _ => {
                let Some(&[hi, lo]) = b.get(i + 2..i + 4) else {
                    return true;
                };
                i += 2 + usize::from(u16::from_be_bytes([hi, lo]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jpeg(width: u32, height: u32) -> Vec<u8> {
        let img = image::RgbImage::from_fn(width, height, |x, y| {
            image::Rgb([(x * 7) as u8, (y * 5) as u8, ((x + y) * 3) as u8])
        });
        let mut out = std::io::Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Jpeg).unwrap();
        out.into_inner()
    }

    #[test]
    fn a_jpeg_decodes_to_rgb_and_a_cut_or_broken_one_is_refused() {
        let decode = |b: &[u8]| decode_rgb(b, ApiError::BadRequest).map_err(|e| e.to_string());
        let whole = jpeg(33, 17);
        let (w, h, px) = decode(&whole).unwrap().unwrap();
        assert_eq!((w, h, px.len()), (33, 17, 33 * 17 * 3));
        assert!(!truncated(&whole));
        // Cut anywhere after the header: refused before libjpeg pads it with grey.
        for cut in [whole.len() - 2, whole.len() / 2, 30] {
            let e = decode(&whole[..cut]).unwrap_err();
            assert!(e.starts_with("truncated"), "cut at {cut}: {e}");
        }
        // Bytes after the end of image (a camera's trailer) are allowed, as PIL allows them.
        let mut trailer = whole.clone();
        trailer.extend_from_slice(b"trailing bytes");
        assert!(decode(&trailer).unwrap().is_some());
        // A broken header is libjpeg's error, caught, not a panic.
        let mut broken = whole.clone();
        let sof = broken.windows(2).position(|w| w == [0xFF, 0xC0]).unwrap();
        broken[sof + 4] = 0; // the sample precision: 0 bits
        let e = decode(&broken).unwrap_err();
        assert!(!e.is_empty() && !e.contains("panicked"), "{e}");
    }
}
