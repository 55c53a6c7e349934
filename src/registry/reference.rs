//! Image references: `REGISTRY[:PORT]/REPO[:TAG][@sha256:HEX]`. Pure parsing, no I/O.

use super::{Error, Result};
use crate::oci::Digest;

/// A parsed image reference. `registry` is the host (and port) the client connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

const DOCKER_HUB: &str = "registry-1.docker.io";

impl Reference {
    /// Parse `reference`. A first path component without `.` or `:` (and not `localhost`) means
    /// Docker Hub, as `docker pull` reads it.
    pub fn parse(reference: &str) -> Result<Reference> {
        let bad = |reason: &str| Error::BadReference {
            reference: reference.to_string(),
            reason: reason.to_string(),
        };
        let (rest, digest) = match reference.split_once('@') {
            Some((rest, d)) => match Digest::parse(d) {
                Ok(d) => (rest, Some(d)),
                Err(_) => {
                    return Err(bad(
                        "the digest must be sha256: followed by 64 lowercase hex digits",
                    ))
                }
            },
            None => (reference, None),
        };
        // A tag follows the last `:` after the last `/` (a `:` before it is a port).
        let last_slash = rest.rfind('/');
        let (name, tag) = match rest.rfind(':') {
            Some(i) if last_slash.is_none_or(|s| i > s) => (&rest[..i], Some(&rest[i + 1..])),
            _ => (rest, None),
        };
        if let Some(tag) = tag {
            if !valid_tag(tag) {
                return Err(bad(
                    "a tag is 1 to 128 of [A-Za-z0-9_.-] and does not start with . or -",
                ));
            }
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ if name.contains('/') => (DOCKER_HUB.to_string(), name.to_string()),
            _ => (DOCKER_HUB.to_string(), format!("library/{name}")),
        };
        if registry.is_empty() || registry.contains(|c: char| c.is_whitespace()) {
            return Err(bad("the registry host is empty or has spaces"));
        }
        if !valid_repository(&repository) {
            return Err(bad(
                "a repository is lowercase path components of [a-z0-9] joined by . _ __ - or /",
            ));
        }
        Ok(Reference {
            registry,
            repository,
            tag: tag.map(str::to_string),
            digest,
        })
    }

    /// The tag or digest used in `/v2/<name>/manifests/<reference>`: the digest when there is
    /// one, else the tag, else `latest`.
    pub fn manifest_ref(&self) -> &str {
        self.digest
            .as_ref()
            .map(Digest::as_str)
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// The same repository with another tag and no digest.
    pub fn with_tag(&self, tag: &str) -> Reference {
        Reference {
            tag: Some(tag.to_string()),
            digest: None,
            ..self.clone()
        }
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// A valid tag: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub fn valid_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn valid_repository(repo: &str) -> bool {
    !repo.is_empty()
        && repo.len() <= 255
        && repo.split('/').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|&c| {
                    c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
                })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &str, expected: Option<(&str, &str, Option<&str>, Option<&str>)>) {
        let got = Reference::parse(input).ok().map(|r| {
            (
                r.registry,
                r.repository,
                r.tag,
                r.digest.map(|d| d.to_string()),
            )
        });
        let expected = expected.map(|(a, b, c, d)| {
            (
                a.to_string(),
                b.to_string(),
                c.map(str::to_string),
                d.map(str::to_string),
            )
        });
        assert_eq!(got, expected, "{input}");
    }

    #[test]
    fn parses_references() {
        let d = format!("sha256:{}", "0".repeat(64));
        check(
            "127.0.0.1:5000/ml/mlp:v1",
            Some(("127.0.0.1:5000", "ml/mlp", Some("v1"), None)),
        );
        check(
            "127.0.0.1:5000/mlp",
            Some(("127.0.0.1:5000", "mlp", None, None)),
        );
        check(
            &format!("nvcr.io/nvidia/cuda:12.4@{d}"),
            Some(("nvcr.io", "nvidia/cuda", Some("12.4"), Some(&d))),
        );
        check(
            &format!("localhost/x@{d}"),
            Some(("localhost", "x", None, Some(&d))),
        );
        check(
            "busybox",
            Some(("registry-1.docker.io", "library/busybox", None, None)),
        );
        check(
            "me/app:1",
            Some(("registry-1.docker.io", "me/app", Some("1"), None)),
        );
        check("127.0.0.1:5000/Upper:v1", None);
        check("127.0.0.1:5000/x:bad tag", None);
        check("127.0.0.1:5000/x@sha256:123", None);
        check("127.0.0.1:5000/", None);
        check("127.0.0.1:5000/a//b", None);
    }

    #[test]
    fn manifest_ref_prefers_digest() {
        let r = Reference::parse("h.io/x:t").unwrap();
        assert_eq!(r.manifest_ref(), "t");
        assert_eq!(r.with_tag("u").to_string(), "h.io/x:u");
        assert_eq!(Reference::parse("h.io/x").unwrap().manifest_ref(), "latest");
    }
}
