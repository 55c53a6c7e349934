//! Resizing 8-bit RGB images exactly as PIL's `Image.resize` does (Pillow's `Resample.c`):
//! separable convolution, the horizontal pass then the vertical, each output pixel a weighted
//! sum of the source pixels under the filter, the filter widened by the scale when shrinking
//! (so every source pixel counts: antialiased), weights in fixed point with 22 fractional bits,
//! the intermediate image rounded to 8 bits. Nearest is PIL's affine nearest (the pixel under
//! each output pixel's centre). The same inputs give the same bytes as PIL, so a model sees the
//! pixels it was evaluated with in Python.
//!
//! A resize may be asked for a window of its output only ([`Window`]): torchvision's
//! `Resize` + `CenterCrop` computes the whole resized image and crops it; computing only the
//! crop gives the same pixels (each output pixel depends only on its own coefficients) for less
//! work.

use infer_spec::vision::Interpolation;

/// An 8-bit RGB image: `height` rows of `width * 3` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// The part of a resized image to compute: columns `x..x + width`, rows `y..y + height` of an
/// image resized to `out_width` x `out_height`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub out_width: usize,
    pub out_height: usize,
    pub x: usize,
    pub y: usize,
    pub width: usize,
    pub height: usize,
}

impl Window {
    /// The whole of an image resized to `width` x `height`.
    pub(crate) fn whole(width: usize, height: usize) -> Window {
        Window {
            out_width: width,
            out_height: height,
            x: 0,
            y: 0,
            width,
            height,
        }
    }
}

/// Pillow's `PRECISION_BITS` for 8-bit images: 32 - 8 - 2.
const PRECISION_BITS: u32 = 22;

/// `src` resized to `w.out_width` x `w.out_height` with `filter`, only the window `w` of it.
pub(crate) fn resize(src: &Rgb, filter: Interpolation, w: Window) -> Rgb {
    debug_assert!(w.x + w.width <= w.out_width && w.y + w.height <= w.out_height);
    if filter == Interpolation::Nearest {
        return nearest(src, w);
    }
    if src.width == w.out_width && src.height == w.out_height {
        return crop(src, w);
    }
    let need_h = src.width != w.out_width;
    let need_v = src.height != w.out_height;
    let vert = need_v.then(|| Coeffs::new(src.height, w.out_height, filter));
    // The source rows the window's output rows read: themselves when the height stays.
    let (first, last) = match &vert {
        Some(vert) if w.height > 0 => {
            (w.y..w.y + w.height).fold((usize::MAX, 0), |(lo, hi), yy| {
                let (min, n) = vert.bounds[yy];
                (lo.min(min), hi.max(min + n))
            })
        }
        Some(_) => (0, 0),
        None => (w.y, w.y + w.height),
    };
    let temp = if need_h {
        let horiz = Coeffs::new(src.width, w.out_width, filter);
        horizontal(src, &horiz, first..last, w.x..w.x + w.width)
    } else {
        // Only the rows and columns the window needs.
        let mut data = Vec::with_capacity((last - first) * w.width * 3);
        for row in first..last {
            let at = row * src.width * 3;
            data.extend_from_slice(&src.data[at + w.x * 3..at + (w.x + w.width) * 3]);
        }
        Rgb {
            width: w.width,
            height: last - first,
            data,
        }
    };
    match vert {
        Some(vert) => vertical(&temp, &vert, first, w.y..w.y + w.height),
        // `first..last` is the window's rows already.
        None => temp,
    }
}

/// The window `w` of `src` itself (no resize).
fn crop(src: &Rgb, w: Window) -> Rgb {
    let mut data = Vec::with_capacity(w.width * w.height * 3);
    for row in w.y..w.y + w.height {
        let at = row * src.width * 3;
        data.extend_from_slice(&src.data[at + w.x * 3..at + (w.x + w.width) * 3]);
    }
    Rgb {
        width: w.width,
        height: w.height,
        data,
    }
}

/// One axis's coefficients: per output pixel, the first source pixel and how many it reads,
/// and `ksize` fixed-point weights.
struct Coeffs {
    ksize: usize,
    bounds: Vec<(usize, usize)>,
    k: Vec<i32>,
}

impl Coeffs {
    /// Pillow's `precompute_coeffs` then `normalize_coeffs_8bpc`, for the whole axis (`in0` 0,
    /// `in1` the source's size).
    fn new(in_size: usize, out_size: usize, filter: Interpolation) -> Coeffs {
        let (support, f): (f64, fn(f64) -> f64) = match filter {
            Interpolation::Bicubic => (2.0, bicubic),
            _ => (1.0, bilinear),
        };
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = support * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut k = vec![0i32; out_size * ksize];
        let mut bounds = Vec::with_capacity(out_size);
        let mut pre = vec![0f64; ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            let ss = 1.0 / filterscale;
            // C's (int) cast truncates toward zero; negative starts clamp to 0 either way.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let n = xmax.saturating_sub(xmin).min(ksize);
            let mut ww = 0.0;
            for (x, p) in pre.iter_mut().enumerate().take(n) {
                let w = f(((x + xmin) as f64 - center + 0.5) * ss);
                *p = w;
                ww += w;
            }
            let row = &mut k[xx * ksize..(xx + 1) * ksize];
            for (x, out) in row.iter_mut().enumerate() {
                let w = if x < n {
                    if ww != 0.0 {
                        pre[x] / ww
                    } else {
                        pre[x]
                    }
                } else {
                    0.0
                };
                let fixed = w * f64::from(1u32 << PRECISION_BITS);
                *out = if w < 0.0 {
                    (-0.5 + fixed) as i32
                } else {
                    (0.5 + fixed) as i32
                };
            }
            bounds.push((xmin, n));
        }
        Coeffs { ksize, bounds, k }
    }
}

fn bilinear(x: f64) -> f64 {
    let x = x.abs();
    if x < 1.0 {
        1.0 - x
    } else {
        0.0
    }
}

fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// Pillow's `clip8`: the fixed-point sum back to a byte (floor, clamped).
#[inline]
fn clip8(v: i64) -> u8 {
    (v >> PRECISION_BITS).clamp(0, 255) as u8
}

/// The horizontal pass over source rows `rows`, output columns `cols`.
fn horizontal(
    src: &Rgb,
    c: &Coeffs,
    rows: std::ops::Range<usize>,
    cols: std::ops::Range<usize>,
) -> Rgb {
    let width = cols.len();
    let mut data = vec![0u8; rows.len() * width * 3];
    let half = 1i64 << (PRECISION_BITS - 1);
    for (oy, y) in rows.enumerate() {
        let line = &src.data[y * src.width * 3..(y + 1) * src.width * 3];
        let out = &mut data[oy * width * 3..(oy + 1) * width * 3];
        for (ox, xx) in cols.clone().enumerate() {
            let (xmin, n) = c.bounds[xx];
            let k = &c.k[xx * c.ksize..xx * c.ksize + n];
            let (mut r, mut g, mut b) = (half, half, half);
            for (x, &w) in k.iter().enumerate() {
                let p = &line[(xmin + x) * 3..(xmin + x) * 3 + 3];
                let w = i64::from(w);
                r += i64::from(p[0]) * w;
                g += i64::from(p[1]) * w;
                b += i64::from(p[2]) * w;
            }
            out[ox * 3] = clip8(r);
            out[ox * 3 + 1] = clip8(g);
            out[ox * 3 + 2] = clip8(b);
        }
    }
    Rgb {
        width,
        height: data.len() / (width * 3).max(1),
        data,
    }
}

/// The vertical pass: `src` holds source rows from `first` on; output rows `rows`.
fn vertical(src: &Rgb, c: &Coeffs, first: usize, rows: std::ops::Range<usize>) -> Rgb {
    let width = src.width;
    let stride = width * 3;
    let mut data = vec![0u8; rows.len() * stride];
    let half = 1i64 << (PRECISION_BITS - 1);
    let mut acc = vec![0i64; stride];
    for (oy, yy) in rows.enumerate() {
        let (ymin, n) = c.bounds[yy];
        let k = &c.k[yy * c.ksize..yy * c.ksize + n];
        acc.fill(half);
        for (y, &w) in k.iter().enumerate() {
            let row = ymin + y - first;
            let line = &src.data[row * stride..(row + 1) * stride];
            let w = i64::from(w);
            for (a, &p) in acc.iter_mut().zip(line) {
                *a += i64::from(p) * w;
            }
        }
        for (o, &a) in data[oy * stride..(oy + 1) * stride].iter_mut().zip(&acc) {
            *o = clip8(a);
        }
    }
    Rgb {
        width,
        height: data.len() / stride.max(1),
        data,
    }
}

/// PIL's nearest: `ImagingScaleAffine`, the source pixel under each output pixel's centre, its
/// coordinate accumulated in steps of the scale as Pillow does.
fn nearest(src: &Rgb, w: Window) -> Rgb {
    let index = |in_size: usize, out_size: usize| -> Vec<usize> {
        let a = in_size as f64 / out_size as f64;
        let mut at = a * 0.5;
        let mut v = Vec::with_capacity(out_size);
        for _ in 0..out_size {
            v.push((at as usize).min(in_size.saturating_sub(1)));
            at += a;
        }
        v
    };
    let xs = index(src.width, w.out_width);
    let ys = index(src.height, w.out_height);
    let mut data = Vec::with_capacity(w.width * w.height * 3);
    for &y in &ys[w.y..w.y + w.height] {
        let line = &src.data[y * src.width * 3..(y + 1) * src.width * 3];
        for &x in &xs[w.x..w.x + w.width] {
            data.extend_from_slice(&line[x * 3..x * 3 + 3]);
        }
    }
    Rgb {
        width: w.width,
        height: w.height,
        data,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(width: usize, height: usize) -> Rgb {
        let mut data = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                data.extend_from_slice(&[
                    (x * 255 / width.max(1)) as u8,
                    (y * 255 / height.max(1)) as u8,
                    ((x * 7 + y * 13) % 256) as u8,
                ]);
            }
        }
        Rgb {
            width,
            height,
            data,
        }
    }

    /// Pillow 12's output for a 4x1 image [0, 100, 200, 255] (one channel shown) resized to
    /// 2, 7 and 3 pixels with each filter (`Image.fromarray(a).resize((w, 1), f)`).
    #[test]
    fn each_filter_matches_pillow_on_a_row() {
        let src = Rgb {
            width: 4,
            height: 1,
            data: [0u8, 100, 200, 255]
                .iter()
                .flat_map(|&v| [v, v, v])
                .collect(),
        };
        let pillow: [(Interpolation, [&[u8]; 3]); 3] = [
            (
                Interpolation::Bilinear,
                [
                    &[71, 209],
                    &[0, 36, 93, 150, 204, 235, 255],
                    &[30, 150, 239],
                ],
            ),
            (
                Interpolation::Bicubic,
                [
                    &[60, 221],
                    &[0, 26, 92, 153, 206, 242, 255],
                    &[19, 152, 247],
                ],
            ),
            (
                Interpolation::Nearest,
                [
                    &[100, 255],
                    &[0, 0, 100, 100, 200, 255, 255],
                    &[0, 200, 255],
                ],
            ),
        ];
        for (filter, want) in pillow {
            for want in want {
                let out = resize(&src, filter, Window::whole(want.len(), 1));
                let got: Vec<u8> = out.data.iter().step_by(3).copied().collect();
                assert_eq!(got, want, "{filter:?} to {} pixels", want.len());
            }
            let same = resize(&src, filter, Window::whole(4, 1));
            assert_eq!(same, src, "the same size is the same image");
        }
    }

    #[test]
    fn a_window_of_the_resize_is_the_same_pixels_as_the_whole_resize_cropped() {
        let src = ramp(97, 61);
        for filter in [
            Interpolation::Bilinear,
            Interpolation::Bicubic,
            Interpolation::Nearest,
        ] {
            for (ow, oh) in [(40, 25), (150, 90), (97, 30), (50, 61)] {
                let whole = resize(&src, filter, Window::whole(ow, oh));
                assert_eq!((whole.width, whole.height), (ow, oh));
                let w = Window {
                    out_width: ow,
                    out_height: oh,
                    x: ow / 5,
                    y: oh / 4,
                    width: ow / 2,
                    height: oh / 2,
                };
                let part = resize(&src, filter, w);
                assert_eq!(part, crop(&whole, w), "{filter:?} to {ow}x{oh}");
            }
        }
    }

    #[test]
    fn a_flat_image_stays_flat_whatever_the_filter_and_scale() {
        let src = Rgb {
            width: 33,
            height: 17,
            data: [10u8, 128, 250].repeat(33 * 17),
        };
        for filter in [Interpolation::Bilinear, Interpolation::Bicubic] {
            for (w, h) in [(5, 3), (100, 80), (33, 1), (1, 17)] {
                let out = resize(&src, filter, Window::whole(w, h));
                assert_eq!(
                    out.data,
                    [10u8, 128, 250].repeat(w * h),
                    "{filter:?} {w}x{h}"
                );
            }
        }
    }
}
