//! The pinned compressors. Each [`Compression`] names one exact byte-level encoding (backend,
//! library version, level, block parameters); changing any of them is a new
//! [`super::LAYER_RECIPE`].
//!
//! - `gzip`: flate2 1.1.11 with the zlib-rs 0.6 backend, level 6, gzip header with mtime 0,
//!   no name, OS byte 255. Fed in fixed 1 MiB chunks by the layer writer, so the output does not
//!   depend on how files are read.
//! - `gzip-stored`: a gzip stream of deflate *stored* blocks (65,535 bytes each, the last one
//!   final), written by [`StoredGzip`] here: every gzip reader accepts it, decompression is a
//!   copy, and the bytes are fixed by construction. For weights and engines, which deflate
//!   shrinks by a few percent at many times the cost (see `docs/BENCHMARKS.md`).
//! - `zstd`: libzstd 1.5.7 (zstd-sys 2.1.3), level 3, multithreaded mode with at least one
//!   worker (whose output is the same for any worker count), no checksum, no content size.
//! - `none`: the tar itself (media type `…layer.v1.tar`; digest = diff_id).

use std::io::{self, Write};

use serde::{Deserialize, Serialize};

use super::media;

/// One pinned layer encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Compression {
    Gzip,
    GzipStored,
    Zstd,
    None,
}

pub(crate) const GZIP_LEVEL: u32 = 6;
pub(crate) const ZSTD_LEVEL: i32 = 3;
/// Largest deflate stored block.
const STORED_BLOCK: usize = 65_535;

impl Compression {
    pub fn media_type(self) -> &'static str {
        match self {
            Compression::Gzip | Compression::GzipStored => media::LAYER_GZIP,
            Compression::Zstd => media::LAYER_ZSTD,
            Compression::None => media::LAYER_TAR,
        }
    }

    /// The exact encoder identity (recorded in cache keys and layer annotations).
    pub fn id(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip-6/flate2-1.1.11+zlib-rs-0.6",
            Compression::GzipStored => "gzip-stored-65535/infer-build",
            Compression::Zstd => "zstd-3-mt/libzstd-1.5.7",
            Compression::None => "none",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::GzipStored => "gzip-stored",
            Compression::Zstd => "zstd",
            Compression::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Compression> {
        [
            Compression::Gzip,
            Compression::GzipStored,
            Compression::Zstd,
            Compression::None,
        ]
        .into_iter()
        .find(|c| c.name() == s)
    }
}

/// A running encoder writing into `W`.
pub(crate) enum Encoder<W: Write> {
    Gzip(flate2::write::GzEncoder<W>),
    Stored(StoredGzip<W>),
    Zstd(zstd::stream::write::Encoder<'static, W>),
    Plain(W),
}

impl<W: Write> Encoder<W> {
    /// `zstd_workers` only changes speed, never bytes (clamped to at least 1).
    pub(crate) fn new(c: Compression, w: W, zstd_workers: u32) -> io::Result<Encoder<W>> {
        Ok(match c {
            Compression::Gzip => Encoder::Gzip(
                flate2::GzBuilder::new()
                    .mtime(0)
                    .operating_system(255)
                    .write(w, flate2::Compression::new(GZIP_LEVEL)),
            ),
            Compression::GzipStored => Encoder::Stored(StoredGzip::new(w)),
            Compression::Zstd => {
                let mut e = zstd::stream::write::Encoder::new(w, ZSTD_LEVEL)?;
                e.include_checksum(false)?;
                e.include_contentsize(false)?;
                e.multithread(zstd_workers.max(1))?;
                Encoder::Zstd(e)
            }
            Compression::None => Encoder::Plain(w),
        })
    }

    pub(crate) fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match self {
            Encoder::Gzip(e) => e.write_all(buf),
            Encoder::Stored(e) => e.write_all(buf),
            Encoder::Zstd(e) => e.write_all(buf),
            Encoder::Plain(w) => w.write_all(buf),
        }
    }

    /// End the stream and give back the inner writer.
    pub(crate) fn finish(self) -> io::Result<W> {
        match self {
            Encoder::Gzip(e) => e.finish(),
            Encoder::Stored(e) => e.finish(),
            Encoder::Zstd(e) => e.finish(),
            Encoder::Plain(w) => Ok(w),
        }
    }
}

/// gzip of deflate stored blocks (RFC 1951 §3.2.4), 65,535 bytes each.
pub(crate) struct StoredGzip<W: Write> {
    inner: W,
    buf: Vec<u8>,
    crc: crc32fast::Hasher,
    len: u64,
    started: bool,
}

impl<W: Write> StoredGzip<W> {
    pub(crate) fn new(inner: W) -> Self {
        StoredGzip {
            inner,
            buf: Vec::with_capacity(STORED_BLOCK),
            crc: crc32fast::Hasher::new(),
            len: 0,
            started: false,
        }
    }

    fn header(&mut self) -> io::Result<()> {
        if !self.started {
            // magic, CM=8 (deflate), FLG=0, MTIME=0, XFL=0, OS=255 (unknown)
            self.inner
                .write_all(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255])?;
            self.started = true;
        }
        Ok(())
    }

    fn block(&mut self, last: bool) -> io::Result<()> {
        let n = self.buf.len() as u16;
        let mut h = [0u8; 5];
        h[0] = last as u8; // BFINAL, BTYPE=00, then padding to the byte boundary
        h[1..3].copy_from_slice(&n.to_le_bytes());
        h[3..5].copy_from_slice(&(!n).to_le_bytes());
        self.inner.write_all(&h)?;
        self.inner.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    pub(crate) fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        self.header()?;
        self.crc.update(data);
        self.len += data.len() as u64;
        while !data.is_empty() {
            let take = (STORED_BLOCK - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() == STORED_BLOCK {
                self.block(false)?;
            }
        }
        Ok(())
    }

    pub(crate) fn finish(mut self) -> io::Result<W> {
        self.header()?;
        self.block(true)?;
        let crc = self.crc.clone().finalize();
        self.inner.write_all(&crc.to_le_bytes())?;
        self.inner.write_all(&(self.len as u32).to_le_bytes())?;
        Ok(self.inner)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    fn roundtrip(c: Compression, data: &[u8]) -> Vec<u8> {
        let mut e = Encoder::new(c, Vec::new(), 1).unwrap();
        for chunk in data.chunks(100_000) {
            e.write_all(chunk).unwrap();
        }
        let out = e.finish().unwrap();
        let mut back = Vec::new();
        match c {
            Compression::Gzip | Compression::GzipStored => {
                flate2::read::GzDecoder::new(&out[..])
                    .read_to_end(&mut back)
                    .unwrap();
            }
            Compression::Zstd => {
                zstd::stream::read::Decoder::new(&out[..])
                    .unwrap()
                    .read_to_end(&mut back)
                    .unwrap();
            }
            Compression::None => back = out.clone(),
        }
        assert_eq!(back, data, "{c:?}");
        out
    }

    #[test]
    fn every_encoding_round_trips() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for c in [
            Compression::Gzip,
            Compression::GzipStored,
            Compression::Zstd,
            Compression::None,
        ] {
            roundtrip(c, &data);
            roundtrip(c, &[]);
        }
        let stored = roundtrip(Compression::GzipStored, &data);
        assert_eq!(stored.len(), 10 + data.len() + 5 * 5 + 8);
    }

    #[test]
    fn zstd_bytes_do_not_depend_on_worker_count() {
        let data: Vec<u8> = (0..3_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let enc = |n| {
            let mut e = Encoder::new(Compression::Zstd, Vec::new(), n).unwrap();
            e.write_all(&data).unwrap();
            e.finish().unwrap()
        };
        assert_eq!(enc(1), enc(2));
        assert_eq!(enc(1), enc(4));
    }

    #[test]
    fn gzip_stored_is_gzip_to_gzip_readers() {
        let out = roundtrip(Compression::GzipStored, b"hello");
        assert_eq!(&out[..3], &[0x1f, 0x8b, 8]);
    }
}
