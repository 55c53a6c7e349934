//! sha256 content digests (`sha256:<64 lowercase hex>`), the only algorithm infer-build writes.

use std::fmt;
use std::io::{self, Read, Write};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use super::Error;

/// A validated `sha256:<hex>` digest.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        let mut h = Hasher::new();
        h.update(bytes);
        h.digest()
    }

    /// The digest and length of everything `r` yields, read in 1 MiB pieces.
    pub(crate) fn of_reader(mut r: impl Read) -> io::Result<(Digest, u64)> {
        let mut h = Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            match r.read(&mut buf) {
                Ok(0) => return Ok(h.finish()),
                Ok(n) => h.update(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Parse and validate `sha256:<64 lowercase hex>`.
    pub fn parse(s: &str) -> Result<Digest, Error> {
        match hex_of(s) {
            Some(_) => Ok(Digest(s.into())),
            // Bounded: the text may come from a hostile document.
            None => Err(Error::BadDigest(s.chars().take(80).collect())),
        }
    }

    /// The hex part, which is also the blob's file name under `blobs/sha256/`.
    pub fn hex(&self) -> &str {
        &self.0[7..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `sha256:` and the first 12 hex digits, as people read digests in logs and tables.
    pub fn short(&self) -> &str {
        &self.0[..19]
    }
}

/// A running sha256 and the number of bytes it has seen: the one streaming digest (layers,
/// blobs, downloads, files), so every digest infer-build computes is formatted by [`Digest`].
#[derive(Clone, Default)]
pub(crate) struct Hasher {
    h: Sha256,
    count: u64,
}

impl Hasher {
    pub(crate) fn new() -> Hasher {
        Hasher::default()
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        self.h.update(bytes);
        self.count += bytes.len() as u64;
    }

    /// The bytes seen so far.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// The digest and the byte count.
    pub(crate) fn finish(self) -> (Digest, u64) {
        let n = self.count;
        (self.digest(), n)
    }

    pub(crate) fn digest(self) -> Digest {
        Digest(format!("sha256:{}", hex::encode(self.h.finalize())))
    }
}

/// A writer that hashes and counts everything written through it into `inner` (a file, a
/// compressor, or [`io::sink`] to only hash).
pub(crate) struct HashWriter<W> {
    inner: W,
    hasher: Hasher,
}

impl<W> HashWriter<W> {
    pub(crate) fn new(inner: W) -> HashWriter<W> {
        HashWriter {
            inner,
            hasher: Hasher::new(),
        }
    }

    /// The writer, the digest of what was written through it and its length.
    pub(crate) fn into_parts(self) -> (W, Digest, u64) {
        let (d, n) = self.hasher.finish();
        (self.inner, d, n)
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The hex part of a `sha256:<64 lowercase hex>` digest, or `None` when it is not one. The
/// check matters: digests become file names in layouts and path segments in URLs.
pub fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    is_sha256_hex(hex).then_some(hex)
}

/// True for 64 lowercase hex digits: a sha256 as wheels' and libraries' pins write it.
pub(crate) use infer_spec::engine::is_sha256_hex;

/// A typed digest equals the same text read from elsewhere (a header, a report, a test).
impl PartialEq<str> for Digest {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Digest {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Digest {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Digest::of(b"").as_str(), empty);
        assert_eq!(Digest::parse(empty).unwrap().hex(), &empty[7..]);
        for bad in [
            "",
            "sha256:",
            "sha512:00",
            &empty.to_uppercase(),
            &empty[..70],
            "sha256:../../etc/passwd",
        ] {
            assert_eq!(hex_of(bad), None, "{bad}");
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn streaming_agrees_with_one_shot() {
        let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let whole = Digest::of(&bytes);
        assert_eq!(
            Digest::of_reader(&bytes[..]).unwrap(),
            (whole.clone(), bytes.len() as u64)
        );
        let mut w = HashWriter::new(Vec::new());
        for piece in bytes.chunks(77_777) {
            w.write_all(piece).unwrap();
        }
        let (inner, d, n) = w.into_parts();
        assert_eq!((inner, d, n), (bytes.clone(), whole, bytes.len() as u64));
    }
}
