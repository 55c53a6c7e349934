//! Base-image digests pinned in a lock file: `[base_images]` maps a reference as written in
//! the recipe to the digest it resolved to. A small stand-in until the plan module's lock file
//! (`plan::lock`) is available; the format is plain TOML so it can be merged into it.

use std::collections::BTreeMap;
use std::path::Path;

use super::{digest_hex, layout::write_atomic, Error, Result};

/// The digest pinned for `reference`, if any.
pub fn lookup(path: &Path, reference: &str) -> Result<Option<String>> {
    let table = read(path)?;
    Ok(table.get(reference).cloned())
}

/// Pin `reference` to `digest`, keeping every other entry and table of the file.
pub fn record(path: &Path, reference: &str, digest: &str) -> Result<()> {
    if digest_hex(digest).is_none() {
        return Err(Error::Lock {
            path: path.to_path_buf(),
            reason: format!("refusing to record malformed digest `{digest}`"),
        });
    }
    let mut doc = read_doc(path)?;
    let bases = doc
        .entry("base_images".to_string())
        .or_insert_with(|| toml::Value::Table(Default::default()));
    let Some(bases) = bases.as_table_mut() else {
        return Err(Error::Lock {
            path: path.to_path_buf(),
            reason: "`base_images` is not a table".into(),
        });
    };
    bases.insert(
        reference.to_string(),
        toml::Value::String(digest.to_string()),
    );
    let text = toml::to_string(&doc).map_err(|e| Error::Lock {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    write_atomic(path, text.as_bytes())
}

fn read_doc(path: &Path) -> Result<toml::Table> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.parse::<toml::Table>().map_err(|e| Error::Lock {
            path: path.to_path_buf(),
            reason: format!("not valid TOML: {}", e.message()),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(toml::Table::new()),
        Err(e) => Err(Error::io(path, e)),
    }
}

fn read(path: &Path) -> Result<BTreeMap<String, String>> {
    let doc = read_doc(path)?;
    let mut out = BTreeMap::new();
    if let Some(t) = doc.get("base_images").and_then(|v| v.as_table()) {
        for (k, v) in t {
            if let Some(d) = v.as_str().filter(|d| digest_hex(d).is_some()) {
                out.insert(k.clone(), d.to_string());
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_keeps_other_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("recipe.lock");
        std::fs::write(&path, "[engines]\nsm90 = \"x\"\n").unwrap();
        let d = format!("sha256:{}", "1".repeat(64));
        record(&path, "nvcr.io/nvidia/cuda:12", &d).unwrap();
        assert_eq!(
            lookup(&path, "nvcr.io/nvidia/cuda:12").unwrap(),
            Some(d.clone())
        );
        assert!(std::fs::read_to_string(&path).unwrap().contains("sm90"));
        assert!(record(&path, "x", "sha256:bad").is_err());
        assert_eq!(lookup(&dir.path().join("none"), "x").unwrap(), None);
    }
}
