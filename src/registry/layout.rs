//! The little OCI image layout reading and writing the registry client needs: `index.json`,
//! `blobs/sha256/<hex>`, descriptors. Generic (any valid layout); the image-assembly module
//! owns the real layout writer.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{canonical_json, digest_hex, media, sha256_digest, Error, Result};

/// The annotation that names a manifest in a layout's `index.json`.
pub const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// An OCI content descriptor (the fields we use; unknown ones are kept).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// A manifest or an index, parsed loosely: what push, pull and warm-up need.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub artifact_type: Option<String>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
    #[serde(default)]
    pub subject: Option<Descriptor>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl Manifest {
    pub fn parse(bytes: &[u8], what: &str) -> Result<Manifest> {
        serde_json::from_slice(bytes).map_err(|e| Error::Protocol {
            what: what.to_string(),
            reason: format!("not a manifest or index: {e}"),
        })
    }
}

/// An OCI layout directory.
#[derive(Debug, Clone)]
pub struct Layout {
    pub root: PathBuf,
}

impl Layout {
    /// Open an existing layout: `oci-layout` and `index.json` must be there.
    pub fn open(root: &Path) -> Result<Layout> {
        let bad = |reason: String| Error::Layout {
            path: root.to_path_buf(),
            reason,
        };
        if !root.join("oci-layout").is_file() {
            return Err(bad(
                "no `oci-layout` file (is this an OCI image layout directory?)".into(),
            ));
        }
        if !root.join("index.json").is_file() {
            return Err(bad("no `index.json`".into()));
        }
        Ok(Layout {
            root: root.to_path_buf(),
        })
    }

    /// Open `root` as a layout, creating an empty one when it does not exist.
    pub fn open_or_create(root: &Path) -> Result<Layout> {
        if root.join("oci-layout").is_file() {
            return Layout::open(root);
        }
        std::fs::create_dir_all(root.join("blobs/sha256")).map_err(|e| Error::io(root, e))?;
        write_atomic(
            &root.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        let empty =
            serde_json::json!({"schemaVersion": 2, "mediaType": media::OCI_INDEX, "manifests": []});
        write_atomic(&root.join("index.json"), &canonical_json(&empty))?;
        Layout::open(root)
    }

    /// Read a top-level file of the layout: a regular file (no link followed), at most
    /// `oci::MAX_DOCUMENT` bytes.
    fn read_top(&self, name: &str) -> Result<Vec<u8>> {
        crate::oci::Dir::open(&self.root)
            .and_then(|d| d.read(name, crate::oci::MAX_DOCUMENT, name))
            .map_err(|e| Error::Layout {
                path: self.root.clone(),
                reason: e.to_string(),
            })
    }

    /// The `index.json` entries.
    pub fn index(&self) -> Result<Vec<Descriptor>> {
        let path = self.root.join("index.json");
        let bytes = self.read_top("index.json")?;
        let m = serde_json::from_slice::<Manifest>(&bytes).map_err(|e| Error::Layout {
            path: path.clone(),
            reason: format!("index.json is not an image index: {e}"),
        })?;
        Ok(m.manifests)
    }

    /// The path of a blob (not checked for existence). Errors on a malformed digest.
    pub fn blob_path(&self, digest: &str) -> Result<PathBuf> {
        let hex = digest_hex(digest).ok_or_else(|| Error::Layout {
            path: self.root.clone(),
            reason: format!("unsupported or malformed digest `{digest}`"),
        })?;
        Ok(self.root.join("blobs/sha256").join(hex))
    }

    /// Check that a blob exists with the descriptor's size.
    pub fn check_blob(&self, desc: &Descriptor) -> Result<PathBuf> {
        let path = self.blob_path(&desc.digest)?;
        let meta = std::fs::metadata(&path).map_err(|_| Error::Layout {
            path: self.root.clone(),
            reason: format!("blob {} is missing", desc.digest),
        })?;
        if meta.len() != desc.size {
            return Err(Error::Layout {
                path: self.root.clone(),
                reason: format!(
                    "blob {} has {} bytes, its descriptor says {}",
                    desc.digest,
                    meta.len(),
                    desc.size
                ),
            });
        }
        Ok(path)
    }

    /// Read a small blob (manifest, index, config) and verify its digest.
    pub fn read_small(&self, desc: &Descriptor) -> Result<Vec<u8>> {
        let path = self.check_blob(desc)?;
        if desc.size > crate::oci::MAX_DOCUMENT {
            return Err(Error::Layout {
                path: self.root.clone(),
                reason: format!(
                    "{} is {} bytes, too big for a manifest or config",
                    desc.digest, desc.size
                ),
            });
        }
        // Opened without following a link, as a regular file, and read no further than the
        // descriptor's size.
        let bytes = crate::oci::Dir::open(&self.root)
            .and_then(|d| d.sub("blobs/sha256", false))
            .and_then(|d| d.read(path.file_name().unwrap_or_default(), desc.size, "blob"))
            .map_err(|e| Error::Layout {
                path: self.root.clone(),
                reason: e.to_string(),
            })?;
        let actual = sha256_digest(&bytes);
        if actual != desc.digest {
            return Err(Error::DigestMismatch {
                what: format!("{}", path.display()),
                expected: desc.digest.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Store bytes as a blob; returns its digest.
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<String> {
        let digest = sha256_digest(bytes);
        let path = self.blob_path(&digest)?;
        if !path.exists() {
            write_atomic(&path, bytes)?;
        }
        Ok(digest)
    }

    /// Add or replace the `index.json` entry named `name` (by `org.opencontainers.image.ref.name`).
    pub fn set_ref(&self, name: &str, mut desc: Descriptor) -> Result<()> {
        let path = self.root.join("index.json");
        let bytes = self.read_top("index.json")?;
        let mut index: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| Error::Layout {
                path: path.clone(),
                reason: format!("index.json is not JSON: {e}"),
            })?;
        desc.annotations.insert(REF_NAME.into(), name.into());
        let entry = serde_json::to_value(&desc).unwrap_or_default();
        let list = index
            .get_mut("manifests")
            .and_then(|m| m.as_array_mut())
            .ok_or_else(|| Error::Layout {
                path: path.clone(),
                reason: "index.json has no `manifests` list".into(),
            })?;
        list.retain(|m| {
            m.pointer("/annotations/org.opencontainers.image.ref.name")
                .and_then(|v| v.as_str())
                != Some(name)
        });
        list.push(entry);
        write_atomic(&path, &canonical_json(&index))
    }
}

/// Write `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::oci::write_atomic(path, bytes).map_err(|e| Error::io(path, e.into_io()))
}
