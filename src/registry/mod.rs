//! The registry client: the only module that talks to OCI registries.
//!
//! It owns the distribution-spec HTTP client (`client`: anonymous, basic and bearer-token auth,
//! retries with backoff, TLS, deadlines), the credential lookup (`auth`: environment, containers
//! `auth.json`, Docker's `config.json`, credential helpers, `login`), pushing an OCI layout
//! (`push`, with the artifacts its caller attaches), pulling an image into a layout (`pull`, at
//! a digest its caller may pin), artifacts and the referrers listing (`referrers`), and the
//! small amount of OCI layout reading it needs (`layout`). The
//! image model it reads and writes (descriptors, manifests, indexes, artifact manifests) is
//! `crate::oci::image`'s.
//!
//! It does not build images, encode layers, decide tags, read lock files or know what infer-build
//! attaches: it pushes what a layout holds, under the `org.opencontainers.image.ref.name` names
//! the layout gives. It never prints: progress
//! goes through a callback that the CLI renders. Credentials never appear in errors, logs or
//! `Debug` output.
//!
//! Invariants: every blob is streamed from disk (never a whole layer in memory); a digest is
//! uploaded at most once per push; every object it creates (artifact manifest, fallback index)
//! is canonical JSON, so the same inputs give the same digests.

use std::path::PathBuf;

use crate::oci::image::Document;

pub(crate) mod auth;
pub(crate) mod client;
pub(crate) mod host;
pub(crate) mod inspect;
pub(crate) mod layout;
pub(crate) mod pull;
pub(crate) mod push;
pub(crate) mod reference;
pub(crate) mod referrers;
pub(crate) mod sources;

pub use auth::Keychain;
pub use client::Notify;
pub use client::{Client, ClientOptions};
pub use host::{NameError, RegistryHost};
pub use inspect::{inspect, PlainPull, RemoteImage, RemoteManifest};
pub use pull::{pull, pull_with, PulledImage};
pub use pull::{Pin, PullOptions};
pub use push::Progress;
pub use push::{
    push, ArtifactReport, Attacher, BlobOutcome, BlobReport, PushOptions, PushReport, TagReport,
};
pub use reference::Reference;
pub use referrers::{referrers, Referrer};
pub use sources::Registries;

/// Errors of the `registry` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid reference `{reference}`: {reason}")]
    BadReference { reference: String, reason: String },
    /// A registry name that is not `host[:port]` ([`RegistryHost`]).
    #[error("invalid registry `{registry}`: {reason}")]
    BadRegistry {
        registry: String,
        reason: host::NameError,
    },
    #[error("invalid OCI layout {}: {reason}", path.display())]
    Layout { path: PathBuf, reason: String },
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read CA certificates from {}: {reason}", path.display())]
    CaCert { path: PathBuf, reason: String },
    #[error("credentials for {registry}: {reason}")]
    Credentials { registry: String, reason: String },
    #[error("{registry} refused the credentials (HTTP {status}) for {what}")]
    Unauthorized {
        registry: String,
        status: u16,
        what: String,
    },
    #[error("{method} {url}: {source}")]
    Transport {
        method: String,
        url: String,
        #[source]
        source: Box<ureq::Error>,
    },
    #[error("{method} {url}: unexpected HTTP {status}{}", detail_suffix(.detail))]
    Status {
        method: String,
        url: String,
        status: u16,
        detail: String,
    },
    #[error("{what}: expected digest {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("{reference}: {reason}")]
    NotFound { reference: String, reason: String },
    #[error("{what}: {reason}")]
    Protocol { what: String, reason: String },
    /// A setting from the environment that is not a value it takes.
    #[error("{name}: {reason}")]
    Setting { name: String, reason: String },
    /// A registries.conf file that cannot be used (`line` 0: no line to name).
    #[error("{}{}: {}{reason}", file.display(), line_suffix(*line), key_prefix(key))]
    Config {
        file: PathBuf,
        line: usize,
        key: String,
        reason: String,
    },
    #[error("pulling {reference} is blocked by {} (the [[registry]] with prefix `{prefix}` sets `blocked = true`)", file.display())]
    Blocked {
        reference: String,
        file: PathBuf,
        prefix: String,
    },
    /// Every place to pull from failed: the last one's error, after the mirrors tried first.
    #[error("{source}\n(mirrors tried first: {tried})")]
    Sources { tried: String, source: Box<Error> },
}

fn line_suffix(line: usize) -> String {
    if line == 0 {
        String::new()
    } else {
        format!(":{line}")
    }
}

fn key_prefix(key: &str) -> String {
    if key.is_empty() {
        String::new()
    } else {
        format!("`{key}`: ")
    }
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(" ({detail})")
    }
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::BadReference { .. }
                | Error::BadRegistry { .. }
                | Error::Layout { .. }
                | Error::CaCert { .. }
                | Error::Credentials { .. }
                | Error::Unauthorized { .. }
                | Error::NotFound { .. }
                | Error::Setting { .. }
                | Error::Config { .. }
                | Error::Blocked { .. }
        ) || matches!(self, Error::Sources { source, .. } if source.is_bad_input())
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// Media types (the OCI ones, [`crate::oci::media`]).
pub(crate) mod media {
    pub(crate) use crate::oci::media::*;
}

/// Parse a manifest or index `what` names, as a protocol error when it is not one.
pub(crate) fn parse_document(bytes: &[u8], what: &str) -> Result<Document> {
    Document::parse(bytes).map_err(|e| Error::Protocol {
        what: what.to_string(),
        reason: format!("not a manifest or index: {e}"),
    })
}

/// GET a manifest or index by tag or digest: its bytes and media type (the document's own
/// `mediaType` when it has one, else the `content-type` header without its parameters), bounded
/// in size and in what it lists. `doing` names the operation in an authorisation error
/// ("pulling", "reading").
pub(crate) fn get_manifest(
    client: &client::Client,
    r: &reference::Reference,
    reference: &str,
    scopes: &[String],
    doing: &str,
) -> Result<(Vec<u8>, String)> {
    let url = client.url(&format!("{}/manifests/{reference}", r.repository));
    let req = client::Req::new(ureq::http::Method::GET, url.clone())
        .header("accept", media::ACCEPT_MANIFESTS);
    let mut resp = client.send(&req, scopes)?;
    match resp.status().as_u16() {
        200 => {
            let ct = client::header(&resp, "content-type")
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let bytes = resp
                .body_mut()
                .with_config()
                .limit(client::MAX_MANIFEST)
                .read_to_vec()
                .map_err(|e| Error::Transport {
                    method: "GET".into(),
                    url: url.clone(),
                    source: Box::new(e),
                })?;
            // Trust the document's own mediaType over the header when it has one.
            let m = parse_document(&bytes, reference)?;
            m.check_bounds(&format!("{}:{reference}", r.repository))
                .map_err(|reason| Error::Protocol {
                    what: format!("manifest {reference} from {}", r.registry),
                    reason,
                })?;
            let mt = m.media_type.unwrap_or(ct);
            Ok((bytes, mt))
        }
        s @ (404 | 401 | 403) => Err(manifest_refused(client, r, reference, s, doing)),
        s => Err(client::status_error(
            &ureq::http::Method::GET,
            &url,
            s,
            resp,
        )),
    }
}

/// The error for a manifest the registry does not have (404) or will not give (401, 403).
fn manifest_refused(
    client: &client::Client,
    r: &reference::Reference,
    reference: &str,
    status: u16,
    doing: &str,
) -> Error {
    if status == 404 {
        return Error::NotFound {
            reference: format!("{}/{}:{reference}", r.registry, r.repository),
            reason: "no such manifest in the registry".into(),
        };
    }
    Error::Unauthorized {
        registry: r.registry.to_string(),
        status,
        what: match client.missing_credentials_hint() {
            Some(hint) => format!("{doing} {} ({hint})", r.repository),
            None => format!("{doing} {}", r.repository),
        },
    }
}

/// The digest a registry names for a manifest with a HEAD (`Docker-Content-Digest`), which
/// registries with pull limits do not count; `None` when it does not say (the caller then
/// GETs by tag). A missing manifest or refused credentials are the errors a GET would give.
pub(crate) fn head_manifest(
    client: &client::Client,
    r: &reference::Reference,
    reference: &str,
    scopes: &[String],
) -> Result<Option<crate::oci::Digest>> {
    let url = client.url(&format!("{}/manifests/{reference}", r.repository));
    let req = client::Req::new(ureq::http::Method::HEAD, url.clone())
        .header("accept", media::ACCEPT_MANIFESTS);
    let resp = client.send(&req, scopes)?;
    match resp.status().as_u16() {
        200 => Ok(client::header(&resp, "docker-content-digest")
            .and_then(|d| crate::oci::Digest::parse(d.trim()).ok())),
        s @ (404 | 401 | 403) => Err(manifest_refused(client, r, reference, s, "pulling")),
        // A registry that does not answer HEAD for manifests is asked with a GET.
        405 | 501 => Ok(None),
        s => Err(client::status_error(
            &ureq::http::Method::HEAD,
            &url,
            s,
            resp,
        )),
    }
}

/// Every parser of what a registry (or a credentials file) says, run on `data`: the entry
/// point of the fuzz target `registry_response` and of a mutation test. Must never panic.
pub fn fuzz_registry_response(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let _ = auth::parse_challenge(&text);
    let _ = client::parse_range(&text);
    let _ = client::origin(&text);
    if let Ok(m) = Document::parse(data) {
        let _ = m.check_bounds("fuzz");
    }
    if let Ok(c) = auth::parse_docker_config(&text) {
        for registry in ["r.io", "registry-1.docker.io", "127.0.0.1:5000"] {
            let _ = c.source_for(registry);
        }
    }
    let _ = referrers::fallback_tag(&text);
}

/// The process environment as the lookup function that code reading settings takes (tests
/// pass `test_env` instead).
pub(crate) fn env_var(k: &str) -> Option<String> {
    std::env::var(k).ok()
}

/// An environment lookup over fixed pairs, for tests of code that reads variables through a
/// lookup function.
#[cfg(test)]
pub(crate) fn test_env(
    pairs: &'static [(&'static str, &'static str)],
) -> impl Fn(&str) -> Option<String> {
    move |k: &str| {
        pairs
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.to_string())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_empty_config_has_the_well_known_digest() {
        assert_eq!(
            crate::oci::Digest::of(crate::oci::image::EMPTY_JSON).as_str(),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
