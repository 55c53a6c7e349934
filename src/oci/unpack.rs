//! The layer reader: a layer blob of a layout opened as its uncompressed tar stream. Every
//! reader of layers (the diff_id check of base layers, `slim`, the registry's warm-up scan) goes
//! through here, so one rule decides which media types are layers and how far one may expand.
//!
//! Invariants: the blob is opened as a regular file without following links and must have the
//! descriptor's size before a byte is read; [`open`] checks its digest before any byte is
//! decoded; the decoded stream fails once it grows past [`expansion_limit`] (a decompression
//! bomb stops there instead of filling the disk or memory). A stream that fails is classified
//! by [`LayerErrors`]: a failed read of the file itself is an I/O error, anything the decoder or
//! a tar reader refuses is [`Error::BadLayer`] (bad input, naming the layout).

use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::store::BlobStore;
use super::{Digest, Error};

/// A layer may uncompress to at most `MAX_EXPANSION` times its compressed size, or
/// [`EXPANSION_FLOOR`] bytes when that is more. Real layers expand 2-5×; deflate's own limit is
/// about 1000×, which only runs of zeros reach.
pub(crate) const MAX_EXPANSION: u64 = 100;
pub(crate) const EXPANSION_FLOOR: u64 = 1 << 30;

/// The most bytes a layer of `size` compressed bytes may uncompress to.
pub(crate) fn expansion_limit(size: u64) -> u64 {
    EXPANSION_FLOOR.max(size.saturating_mul(MAX_EXPANSION))
}

/// How a layer's bytes are encoded, from its media type (OCI and Docker names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Tar,
    Gzip,
    Zstd,
}

impl Encoding {
    /// `None` for a media type that is not a layer infer-build can read.
    pub(crate) fn of(media_type: &str) -> Option<Encoding> {
        let m = media_type;
        if m.ends_with("+gzip") || m.ends_with(".tar.gzip") {
            Some(Encoding::Gzip)
        } else if m.ends_with("+zstd") || m.ends_with(".zstd") {
            Some(Encoding::Zstd)
        } else if m.ends_with(".tar") {
            Some(Encoding::Tar)
        } else {
            None
        }
    }
}

/// An uncompressed layer stream; counts what it yields.
pub struct LayerReader {
    inner: Box<dyn Read>,
    path: PathBuf,
    count: u64,
    errors: LayerErrors,
}

/// Classifies the errors of one layer's stream, also once the [`LayerReader`] has moved into a
/// tar reader: the blob was verified, so an error that is not a failed read of the file is the
/// layer's own fault (corrupt compression, broken tar, decompression bomb).
#[derive(Clone, Debug)]
pub struct LayerErrors {
    layout: PathBuf,
    digest: Digest,
    path: PathBuf,
    raw_failed: Arc<AtomicBool>,
}

impl LayerErrors {
    /// The layout named as the layer's origin (the base a layer was imported from, rather
    /// than the output it is read back from).
    pub(crate) fn in_layout(mut self, origin: &Path) -> LayerErrors {
        self.layout = origin.to_path_buf();
        self
    }

    /// `e`, met while doing `op` on the layer's stream, as an [`Error`].
    pub fn error(&self, op: &'static str, e: io::Error) -> Error {
        if self.raw_failed.load(Ordering::Relaxed) {
            Error::Io {
                op,
                path: self.path.clone(),
                source: e,
            }
        } else {
            Error::BadLayer {
                layout: self.layout.clone(),
                digest: self.digest.clone(),
                why: e.to_string(),
            }
        }
    }
}

/// The blob's file; records whether a read of it failed.
struct Raw<R> {
    inner: R,
    failed: Arc<AtomicBool>,
}

impl<R: Read> Read for Raw<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if e.kind() != io::ErrorKind::Interrupted {
                self.failed.store(true, Ordering::Relaxed);
            }
        })
    }
}

impl Read for LayerReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        Ok(n)
    }
}

impl LayerReader {
    /// The blob's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The classifier of this stream's errors.
    pub fn errors(&self) -> LayerErrors {
        self.errors.clone()
    }

    /// Read what is left (a tar reader stops before the end-of-archive blocks) and return the
    /// uncompressed size of the layer.
    pub fn finish(mut self) -> Result<u64, Error> {
        let errors = self.errors();
        io::copy(&mut self, &mut io::sink()).map_err(|e| errors.error("read layer", e))?;
        Ok(self.count)
    }
}

/// Open layer `d` (`size` bytes, `media_type`) of `store` as its uncompressed tar stream. The
/// blob is verified first (regular file, size, digest), so no unverified byte is decoded.
pub fn open(
    store: &BlobStore,
    d: &Digest,
    size: u64,
    media_type: &str,
) -> Result<LayerReader, Error> {
    store.verify(d, size)?;
    open_unverified(store, d, size, media_type)
}

/// [`open`] without the digest check, for a blob this build has already verified (it still
/// checks that it is a regular file of `size` bytes and reads no further).
pub(crate) fn open_unverified(
    store: &BlobStore,
    d: &Digest,
    size: u64,
    media_type: &str,
) -> Result<LayerReader, Error> {
    let path = store.blob_path(d);
    let encoding = Encoding::of(media_type).ok_or_else(|| Error::UnsupportedLayer {
        layout: store.root().into(),
        digest: d.clone(),
        media_type: media_type.into(),
    })?;
    let errors = LayerErrors {
        layout: store.root().into(),
        digest: d.clone(),
        path: path.clone(),
        raw_failed: Arc::new(AtomicBool::new(false)),
    };
    let raw = Raw {
        inner: store.open_blob(d, size)?.take(size),
        failed: errors.raw_failed.clone(),
    };
    let raw = BufReader::with_capacity(1 << 20, raw);
    let decoded: Box<dyn Read> = match encoding {
        Encoding::Tar => Box::new(raw),
        Encoding::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(raw)),
        Encoding::Zstd => Box::new(
            zstd::stream::read::Decoder::with_buffer(raw)
                .map_err(|e| errors.error("decompress", e))?,
        ),
    };
    let limit = expansion_limit(size);
    Ok(LayerReader {
        inner: Box::new(Bounded {
            inner: decoded,
            left: limit,
            limit,
        }),
        path,
        count: 0,
        errors,
    })
}

/// Fails a read once more than `limit` bytes came through.
struct Bounded<R> {
    inner: R,
    left: u64,
    limit: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the layer uncompresses to more than {} bytes, over {MAX_EXPANSION} times its compressed size (a decompression bomb?)",
                    self.limit
                ),
            )
        })?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn media_types_map_to_encodings() {
        use super::super::media;
        assert_eq!(Encoding::of(media::LAYER_TAR), Some(Encoding::Tar));
        assert_eq!(Encoding::of(media::LAYER_GZIP), Some(Encoding::Gzip));
        assert_eq!(Encoding::of(media::LAYER_ZSTD), Some(Encoding::Zstd));
        assert_eq!(Encoding::of(media::DOCKER_LAYER_GZIP), Some(Encoding::Gzip));
        assert_eq!(Encoding::of(media::CONFIG), None);
    }

    #[test]
    fn reads_verifies_and_bounds_a_layer() {
        let dir = tempfile::tempdir().unwrap();
        let s = BlobStore::create(dir.path()).unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, b"tar bytes").unwrap();
        let blob = gz.finish().unwrap();
        let d = s.put(&blob).unwrap();
        let size = blob.len() as u64;
        let mut r = open(&s, &d, size, super::super::media::LAYER_GZIP).unwrap();
        let mut text = String::new();
        r.read_to_string(&mut text).unwrap();
        assert_eq!(text, "tar bytes");
        assert_eq!(r.finish().unwrap(), 9);
        let e = open(&s, &d, size, "application/vnd.oci.image.config.v1+json");
        assert!(matches!(e, Err(Error::UnsupportedLayer { .. })));
        assert!(matches!(
            open(&s, &d, size + 1, super::super::media::LAYER_GZIP),
            Err(Error::WrongSize { .. })
        ));
        let mut b = Bounded {
            inner: io::repeat(0).take(10),
            left: 4,
            limit: 4,
        };
        let e = io::copy(&mut b, &mut io::sink()).unwrap_err();
        assert!(e.to_string().contains("decompression bomb"), "{e}");
    }

    #[test]
    fn a_layer_that_does_not_decode_is_bad_input_naming_its_layout() {
        let dir = tempfile::tempdir().unwrap();
        let s = BlobStore::create(dir.path()).unwrap();
        let blob = b"not gzip at all".to_vec();
        let d = s.put(&blob).unwrap();
        let r = open(&s, &d, blob.len() as u64, super::super::media::LAYER_GZIP).unwrap();
        let e = r.finish().unwrap_err();
        assert!(matches!(e, Error::BadLayer { .. }), "{e:?}");
        assert!(e.is_bad_input());
        assert!(
            e.to_string().contains(&dir.path().display().to_string()),
            "{e}"
        );
        let r = open(&s, &d, blob.len() as u64, super::super::media::LAYER_GZIP).unwrap();
        let e = r.errors().in_layout(Path::new("/the/base")).error(
            "read layer",
            io::Error::new(io::ErrorKind::InvalidData, "corrupt deflate stream"),
        );
        assert!(e.to_string().contains("/the/base"), "{e}");
    }
}
