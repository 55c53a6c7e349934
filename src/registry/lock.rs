//! Pinning pulled base images in the recipe's lock file. The format and its parser belong to
//! `plan::lock`; this is the registry side that reads a pinned digest before a pull and writes
//! the resolved one after it (atomically, canonical text).

use std::path::Path;

use crate::plan::lock as plan_lock;

use super::{Error, Result};
use crate::oci::Digest;

/// A lock file that does not parse is bad input; one that cannot be read or written, I/O.
fn lock_error(path: &Path, e: plan_lock::LockError) -> Error {
    match e {
        plan_lock::LockError::Read { path, source }
        | plan_lock::LockError::Write { path, source } => Error::io(path, source),
        e => Error::Lock {
            path: path.to_path_buf(),
            reason: e.to_string(),
        },
    }
}

/// The digest pinned for `reference`, if any.
pub fn lookup(path: &Path, reference: &str) -> Result<Option<Digest>> {
    let lock = plan_lock::read(path).map_err(|e| lock_error(path, e))?;
    let Some(pinned) = lock.as_ref().and_then(|l| l.digest(reference)) else {
        return Ok(None);
    };
    Digest::parse(pinned).map(Some).map_err(|_| Error::Lock {
        path: path.to_path_buf(),
        reason: format!("`{reference}` is pinned to `{pinned}`, not a sha256 digest"),
    })
}

/// Pin `reference` to `digest`, keeping every other entry.
pub(crate) fn record(path: &Path, reference: &str, digest: &Digest) -> Result<()> {
    plan_lock::update(path, |lock| lock.set(reference, digest.as_str()))
        .map_err(|e| lock_error(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keeps_other_entries() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recipe.lock");
        let d1 = Digest::parse(&format!("sha256:{}", "1".repeat(64))).unwrap();
        let d2 = Digest::parse(&format!("sha256:{}", "2".repeat(64))).unwrap();
        record(&path, "z.io/other:1", &d2).unwrap();
        record(&path, "nvcr.io/nvidia/cuda:12", &d1).unwrap();
        assert_eq!(
            lookup(&path, "nvcr.io/nvidia/cuda:12").unwrap(),
            Some(d1.clone())
        );
        assert_eq!(lookup(&path, "z.io/other:1").unwrap(), Some(d2));
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .starts_with("# infer-build lock file"));
        assert_eq!(lookup(&dir.path().join("none"), "x").unwrap(), None);
        std::fs::write(&path, "version = [").unwrap();
        assert!(lookup(&path, "x").unwrap_err().is_bad_input());
    }
}
