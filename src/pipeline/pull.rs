//! `infer-build pull REF`: an image pulled into an OCI layout, by default the shared base cache
//! that `build` pulls GPU targets' bases into (named `REF@DIGEST`), else a layout of the
//! caller's (named by its tag), its digest pinned in a lock file when one is named; and the
//! lock file side of every pull (`build`'s bases, `slim`'s images): the registry client pulls a
//! digest it is given ([`Pin`]), this module reads it from the lock file and records the result.

use std::path::{Path, PathBuf};

use crate::error::Error;
use crate::oci::Digest;
use crate::plan::lock as plan_lock;
use crate::plan::{ImagePin, PinnedBy};
use crate::registry::pull::{Pin, PullOptions};
use crate::registry::{self, PulledImage, Reference};

/// What to pull, and where.
#[derive(Debug, Clone, Default)]
pub(crate) struct PullRequest {
    /// The image: `REGISTRY[:PORT]/REPO[:TAG][@sha256:HEX]`.
    pub reference: String,
    /// The layout to pull into; `None`: the shared base cache.
    pub out: Option<PathBuf>,
    /// The lock file whose pin is used and updated.
    pub lock: Option<PathBuf>,
    /// Re-resolve the tag even when the lock file pins a digest.
    pub update_lock: bool,
    /// The registries.conf to read mirrors from instead of the environment's.
    pub registries_conf: Option<PathBuf>,
    /// The client (TLS, credentials, notes).
    pub client: crate::registry::ClientOptions,
}

/// Pull `req.reference`: the request is checked (a digest has no tag to re-resolve, an
/// `update_lock` needs a lock file, a cache must exist without `out`) before any connection.
pub(crate) fn pull(req: &PullRequest) -> Result<PulledImage, Error> {
    let (dest, name_by_digest) =
        destination(req, crate::cache::path(crate::cache::Entry::Bases, None))?;
    let opts = PullOptions {
        client: req.client.clone(),
        pin: None,
        platform: None,
        name_by_digest,
        registries: Some(std::sync::Arc::new(registry::sources::Registries::load(
            req.registries_conf.as_deref(),
            &registry::env_var,
        )?)),
    };
    pull_locked(
        &req.reference,
        &dest,
        opts,
        req.lock.as_deref(),
        req.update_lock,
    )
}

/// `reference` pulled into `dest` through the lock file `lock`, when one is given: a tag it
/// pins is pulled at its digest (unless `update_lock`), and the digest pulled is recorded in
/// it, every other entry kept.
pub(crate) fn pull_locked(
    reference: &str,
    dest: &Path,
    mut opts: PullOptions,
    lock: Option<&Path>,
    update_lock: bool,
) -> Result<PulledImage, Error> {
    if let Some(lock) = lock {
        if !update_lock && Reference::parse(reference)?.digest.is_none() {
            if let Some(digest) = pinned(lock, reference)? {
                opts.pin = Some(Pin {
                    digest,
                    source: format!("lock file {}", lock.display()),
                });
            }
        }
    }
    let pulled = registry::pull_with(reference, dest, &opts)?;
    if let Some(lock) = lock {
        plan_lock::update(lock, |l| l.set(reference, pulled.digest.as_str()))
            .map_err(crate::plan::Error::from)?;
    }
    Ok(pulled)
}

/// The digest the lock file at `path` pins `reference` to, if any.
pub(crate) fn pinned(path: &Path, reference: &str) -> Result<Option<Digest>, Error> {
    let lock = plan_lock::read(path).map_err(crate::plan::Error::from)?;
    let Some(pinned) = lock.as_ref().and_then(|l| l.digest(reference)) else {
        return Ok(None);
    };
    Digest::parse(pinned).map(Some).map_err(|_| {
        Error::Usage(format!(
            "lock file {}: `{reference}` is pinned to `{pinned}`, not a sha256 digest",
            path.display()
        ))
    })
}

/// What to pull for a plan's base image: the reference (with `@digest` when the matrix or the
/// recipe pins it) and whether the lock file pins it. `None` for `scratch` (nothing to pull).
pub(crate) fn base_request(pin: &ImagePin) -> Option<(String, bool)> {
    match pin.pinned_by {
        PinnedBy::None => None,
        _ if pin.reference == "scratch" => None,
        PinnedBy::Lock => Some((pin.reference.clone(), true)),
        PinnedBy::Matrix | PinnedBy::Recipe => Some((pin.pull_reference(), false)),
    }
}

/// Where to pull and whether images are named `REF@DIGEST` (the shared cache) or by tag.
/// Checks the request before any I/O.
fn destination(req: &PullRequest, cache: Option<PathBuf>) -> Result<(PathBuf, bool), Error> {
    let r = Reference::parse(&req.reference)?;
    if req.update_lock && req.lock.is_none() {
        return Err(Error::Usage(
            "--update-lock needs --lock FILE (the lock file to update)".into(),
        ));
    }
    if req.update_lock && r.digest.is_some() {
        return Err(Error::Usage(format!(
            "--update-lock: {} names a digest, there is no tag to re-resolve",
            req.reference
        )));
    }
    match &req.out {
        Some(out) => Ok((out.clone(), false)),
        None => cache.map(|c| (c, true)).ok_or_else(|| {
            Error::Usage(crate::cache::NoCacheDir { flag: "--out DIR" }.to_string())
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pin(reference: &str, digest: Option<&str>, by: PinnedBy) -> ImagePin {
        ImagePin {
            reference: reference.into(),
            digest: digest.map(|d| Digest::parse(d).unwrap()),
            pinned_by: by,
        }
    }

    #[test]
    fn base_request_follows_who_pins_the_digest() {
        let d = format!("sha256:{}", "b".repeat(64));
        let r = "nvcr.io/nvidia/cuda:12";
        // The lock file pins: pull the tag through the lock (it supplies the digest, if any).
        assert_eq!(
            base_request(&pin(r, Some(&d), PinnedBy::Lock)),
            Some((r.to_string(), true))
        );
        assert_eq!(
            base_request(&pin(r, None, PinnedBy::Lock)),
            Some((r.to_string(), true))
        );
        // The matrix or the recipe pins: pull that digest, leave the lock alone.
        for by in [PinnedBy::Matrix, PinnedBy::Recipe] {
            assert_eq!(
                base_request(&pin(r, Some(&d), by)),
                Some((format!("{r}@{d}"), false))
            );
        }
        assert_eq!(base_request(&pin("scratch", None, PinnedBy::None)), None);
        assert_eq!(base_request(&pin("scratch", None, PinnedBy::Lock)), None);
    }

    #[test]
    fn recording_keeps_other_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recipe.lock");
        let d1 = Digest::parse(&format!("sha256:{}", "1".repeat(64))).unwrap();
        let d2 = Digest::parse(&format!("sha256:{}", "2".repeat(64))).unwrap();
        let record = |reference: &str, d: &Digest| {
            plan_lock::update(&path, |l| l.set(reference, d.as_str())).unwrap();
        };
        record("z.io/other:1", &d2);
        record("nvcr.io/nvidia/cuda:12", &d1);
        assert_eq!(
            pinned(&path, "nvcr.io/nvidia/cuda:12").unwrap(),
            Some(d1.clone())
        );
        assert_eq!(pinned(&path, "z.io/other:1").unwrap(), Some(d2));
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("# infer-build lock file"));
        assert_eq!(pinned(&dir.path().join("none"), "x").unwrap(), None);
        std::fs::write(&path, "version = [").unwrap();
        assert_eq!(pinned(&path, "x").unwrap_err().exit_code(), 2);
    }

    #[test]
    fn a_tag_the_lock_pins_is_pulled_at_its_digest_and_recorded() {
        use crate::registry::layout::Layout;
        // An image complete in the layout: pinned, it needs no registry (the address below
        // does not answer); re-resolving it (`update_lock`) must ask the registry, and fails.
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open_or_create(dir.path()).unwrap();
        let config_bytes = br#"{"architecture":"amd64","os":"linux"}"#;
        let config = layout.put_bytes(config_bytes).unwrap();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": crate::registry::media::CONFIG, "digest": config, "size": config_bytes.len()},
            "layers": [],
        });
        let m = layout
            .put_bytes(&crate::oci::cjson::value_to_vec(&manifest))
            .unwrap();
        let lock = dir.path().join("r.lock");
        let reference = "127.0.0.1:9/bases/cuda:12";
        plan_lock::update(&lock, |l| l.set(reference, m.as_str())).unwrap();
        let offline = PullOptions {
            client: crate::registry::ClientOptions {
                insecure: true,
                max_attempts: 1,
                ..crate::registry::ClientOptions::default()
            },
            name_by_digest: true,
            ..PullOptions::default()
        };
        let p = pull_locked(reference, dir.path(), offline.clone(), Some(&lock), false).unwrap();
        assert!(p.offline);
        assert_eq!(p.digest, m);
        assert_eq!(pinned(&lock, reference).unwrap(), Some(m.clone()));
        assert!(pull_locked(reference, dir.path(), offline, Some(&lock), true).is_err());
        assert_eq!(pinned(&lock, reference).unwrap(), Some(m));
    }

    fn request(reference: &str) -> PullRequest {
        PullRequest {
            reference: reference.into(),
            ..PullRequest::default()
        }
    }

    #[test]
    fn default_destination_is_the_cache_named_by_digest() {
        let r = request("127.0.0.1:5000/bases/cuda:12");
        let (dest, by_digest) = destination(&r, Some(PathBuf::from("/c/bases"))).unwrap();
        assert_eq!(dest, PathBuf::from("/c/bases"));
        assert!(by_digest);
        let r = PullRequest {
            out: Some("x".into()),
            ..request("127.0.0.1:5000/bases/cuda:12")
        };
        assert_eq!(
            destination(&r, Some(PathBuf::from("/c"))).unwrap(),
            (PathBuf::from("x"), false)
        );
        let r = request("127.0.0.1:5000/bases/cuda:12");
        let e = destination(&r, None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--out DIR"), "{e}");
    }

    #[test]
    fn bad_requests_are_usage_errors() {
        let d = format!("@sha256:{}", "a".repeat(64));
        for (reference, lock, update_lock, want) in [
            ("r.io/a:1".to_string(), None, true, "needs --lock"),
            (format!("r.io/a{d}"), Some("l"), true, "names a digest"),
            ("r.io/A:1".to_string(), None, false, "invalid reference"),
            ("r.io/a:-x".to_string(), None, false, "invalid reference"),
        ] {
            let r = PullRequest {
                lock: lock.map(PathBuf::from),
                update_lock,
                ..request(&reference)
            };
            let e = destination(&r, Some(PathBuf::from("/c"))).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{reference}");
            assert!(e.to_string().contains(want), "{reference}: {e}");
        }
        let r = PullRequest {
            lock: Some("l".into()),
            update_lock: true,
            ..request("r.io/a:1")
        };
        assert!(destination(&r, Some(PathBuf::from("/c"))).is_ok());
    }
}
