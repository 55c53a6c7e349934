//! sha256 content digests (`sha256:<64 lowercase hex>`), the only algorithm infer-build writes.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

use super::Error;

/// A validated `sha256:<hex>` digest.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest(String);

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    /// The digest a finished hasher holds.
    pub fn from_hasher(h: Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(h.finalize())))
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

/// The hex part of a `sha256:<64 lowercase hex>` digest, or `None` when it is not one. The
/// check matters: digests become file names in layouts and path segments in URLs.
pub fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    is_sha256_hex(hex).then_some(hex)
}

/// True for 64 lowercase hex digits: a sha256 as wheels' and libraries' pins write it.
pub fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

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
}
