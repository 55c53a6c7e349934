//! Image references: `REGISTRY[:PORT]/REPO[:TAG][@sha256:HEX]`. Pure parsing, no I/O. The
//! registry's name is a [`RegistryHost`], canonical.

use super::host::RegistryHost;
use super::{Error, Result};
use crate::oci::Digest;

/// A parsed image reference, normalized as Docker and containerd name images: `registry` is
/// the registry's name as people write it (`docker.io` for Docker Hub), in its canonical
/// spelling ([`RegistryHost`]), which plans, lock files and messages show;
/// [`Reference::endpoint`] is the host the client connects to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    pub registry: RegistryHost,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<Digest>,
}

/// Docker Hub's name in references.
pub(crate) const DOCKER_HUB: &str = "docker.io";
/// The host that serves Docker Hub's registry API.
pub(crate) const DOCKER_HUB_API: &str = "registry-1.docker.io";

impl Reference {
    /// Parse `reference` as `docker pull` reads it (containerd's `ParseNormalizedNamed`): a
    /// first path component with a `.` or `:`, or `localhost`, or any uppercase letter is a
    /// registry; anything else means Docker Hub, `docker.io`. `index.docker.io` becomes
    /// `docker.io`, and a Docker Hub name of one component gets the `library/` namespace. The
    /// registry is canonical ([`RegistryHost`]): a host or port that is not one is refused.
    pub fn parse(reference: &str) -> Result<Reference> {
        Self::parse_as(reference, false)
    }

    /// [`Reference::parse`] of `HOST[:PORT]/REPO[:TAG][@DIGEST]` whose first component is the
    /// registry, whatever it looks like (a registries.conf location rewritten into a
    /// reference: `myreg/app` there is the host `myreg`, not Docker Hub).
    pub(crate) fn parse_at_host(reference: &str) -> Result<Reference> {
        Self::parse_as(reference, true)
    }

    fn parse_as(reference: &str, first_is_host: bool) -> Result<Reference> {
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
        let (registry, mut repository) = match name.split_once('/') {
            Some((first, path))
                if first_is_host
                    || first.contains(['.', ':', '[', ']'])
                    || first == "localhost"
                    || first.chars().any(|c| c.is_ascii_uppercase()) =>
            {
                let host = RegistryHost::parse(first)
                    .map_err(|why| bad(&format!("registry `{first}`: {why}")))?;
                (host, path.to_string())
            }
            _ if first_is_host => return Err(bad("expected HOST[:PORT]/REPOSITORY")),
            _ => (RegistryHost::docker_hub(), name.to_string()),
        };
        if registry == DOCKER_HUB && !repository.contains('/') {
            repository = format!("library/{repository}");
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

    /// The host (and port) the registry API is served from: Docker Hub's is
    /// `registry-1.docker.io` (containerd's `DefaultHost`), every other registry's is its name.
    pub fn endpoint(&self) -> &str {
        endpoint_of(self.registry.as_str())
    }

    /// The tag or digest used in `/v2/<name>/manifests/<reference>`: the digest when there is
    /// one, else the tag, else `latest`.
    pub(crate) fn manifest_ref(&self) -> &str {
        self.digest
            .as_ref()
            .map(Digest::as_str)
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    #[cfg(test)]
    /// The same repository with another tag and no digest.
    pub(crate) fn with_tag(&self, tag: &str) -> Reference {
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

/// The host serving the registry API of the registry named `registry` in references.
pub(crate) fn endpoint_of(registry: &str) -> &str {
    if registry == DOCKER_HUB {
        DOCKER_HUB_API
    } else {
        registry
    }
}

/// A valid tag: `[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`.
pub(crate) fn valid_tag(tag: &str) -> bool {
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
                r.registry.to_string(),
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
            Some(("docker.io", "library/busybox", None, None)),
        );
        check("me/app:1", Some(("docker.io", "me/app", Some("1"), None)));
        check("127.0.0.1:5000/Upper:v1", None);
        check("127.0.0.1:5000/x:bad tag", None);
        check("127.0.0.1:5000/x@sha256:123", None);
        check("127.0.0.1:5000/", None);
        check("127.0.0.1:5000/a//b", None);
        // A registry that is not a host and port is refused, not sent a broken URL.
        for bad in [
            "127.0.0.1:5311#x/y:base",
            "host.io?x=1/y",
            "r.io:99999/x",
            "r.io:/x",
            "[::1/x",
        ] {
            let e = Reference::parse(bad).expect_err(bad);
            assert!(e.is_bad_input(), "{bad}");
            assert!(e.to_string().contains("registry"), "{bad}: {e}");
        }
    }

    /// Docker Hub's names, as containerd normalizes them (`reference/docker/normalize.go`:
    /// `splitDockerDomain`, with `defaultDomain = "docker.io"`, `legacyDefaultDomain =
    /// "index.docker.io"`, `officialRepoPrefix = "library/"`; the cases follow its
    /// `normalize_test.go`) and resolves them to a host (`remotes/docker/resolver.go`:
    /// `DefaultHost` maps `docker.io` to `registry-1.docker.io`). The written form is what
    /// `Display` shows (plans, lock files, messages); the endpoint is where requests go.
    #[test]
    fn normalizes_docker_hub_names_as_containerd_does() {
        #[rustfmt::skip]
        let table = [
            // (written, registry, repository, shown, endpoint)
            ("ubuntu", "docker.io", "library/ubuntu", "docker.io/library/ubuntu", "registry-1.docker.io"),
            ("docker.io/ubuntu", "docker.io", "library/ubuntu", "docker.io/library/ubuntu", "registry-1.docker.io"),
            ("docker.io/library/ubuntu", "docker.io", "library/ubuntu", "docker.io/library/ubuntu", "registry-1.docker.io"),
            ("index.docker.io/ubuntu", "docker.io", "library/ubuntu", "docker.io/library/ubuntu", "registry-1.docker.io"),
            ("index.docker.io/library/ubuntu", "docker.io", "library/ubuntu", "docker.io/library/ubuntu", "registry-1.docker.io"),
            ("user/repo", "docker.io", "user/repo", "docker.io/user/repo", "registry-1.docker.io"),
            ("docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04", "docker.io", "nvidia/cuda", "docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04", "registry-1.docker.io"),
            ("a/b/c", "docker.io", "a/b/c", "docker.io/a/b/c", "registry-1.docker.io"),
            // Written as the API host: kept as written, no `library/` (containerd does the same).
            ("registry-1.docker.io/ubuntu", "registry-1.docker.io", "ubuntu", "registry-1.docker.io/ubuntu", "registry-1.docker.io"),
            ("localhost/repo", "localhost", "repo", "localhost/repo", "localhost"),
            ("localhost:5000/repo", "localhost:5000", "repo", "localhost:5000/repo", "localhost:5000"),
            ("127.0.0.1:5000/ubuntu", "127.0.0.1:5000", "ubuntu", "127.0.0.1:5000/ubuntu", "127.0.0.1:5000"),
            ("nvcr.io/nvidia/tritonserver", "nvcr.io", "nvidia/tritonserver", "nvcr.io/nvidia/tritonserver", "nvcr.io"),
            ("ghcr.io/org/img", "ghcr.io", "org/img", "ghcr.io/org/img", "ghcr.io"),
            // An uppercase first component is a host, not a Docker Hub user; hosts are
            // canonical, lowercase.
            ("Foo/bar", "foo", "bar", "foo/bar", "foo"),
            ("LOCALHOST:5301/x", "localhost:5301", "x", "localhost:5301/x", "localhost:5301"),
            ("127.1:5301/x", "127.0.0.1:5301", "x", "127.0.0.1:5301/x", "127.0.0.1:5301"),
            ("Index.Docker.IO:443/ubuntu", "docker.io", "library/ubuntu", "docker.io/library/ubuntu", "registry-1.docker.io"),
        ];
        for (written, registry, repository, shown, endpoint) in table {
            let r = Reference::parse(written).unwrap_or_else(|e| panic!("{written}: {e}"));
            assert_eq!(
                (
                    r.registry.as_str(),
                    r.repository.as_str(),
                    r.to_string(),
                    r.endpoint()
                ),
                (registry, repository, shown.to_string(), endpoint),
                "{written}"
            );
        }
        // Uppercase in the repository stays invalid, on Docker Hub as anywhere.
        check("Foo", None);
        check("docker.io/Foo/bar", None);
    }

    #[test]
    fn manifest_ref_prefers_digest() {
        let r = Reference::parse("h.io/x:t").unwrap();
        assert_eq!(r.manifest_ref(), "t");
        assert_eq!(r.with_tag("u").to_string(), "h.io/x:u");
        assert_eq!(Reference::parse("h.io/x").unwrap().manifest_ref(), "latest");
    }
}
