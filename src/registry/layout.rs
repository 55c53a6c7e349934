//! The registry's view of an OCI image layout, in the one image model ([`crate::oci::image`])
//! over the one layout reader, [`crate::oci::store::BlobStore`]: every read (`index.json`,
//! manifests, configs, blob checks) goes through it, so links are refused, sizes and digests
//! checked and documents capped as for every other layout. Pulls add blobs and `index.json`
//! entries here; the image-assembly module owns the real layout writer.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{media, Error, Result};
use crate::oci::annotation::REF_NAME;
use crate::oci::image::{Descriptor, Document};
use crate::oci::store::BlobStore;
use crate::oci::Digest;

/// An OCI layout directory.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub root: PathBuf,
    store: BlobStore,
}

impl Layout {
    /// Open an existing layout: `oci-layout` and `index.json` must be there.
    pub(crate) fn open(root: &Path) -> Result<Layout> {
        let store = BlobStore::open(root).map_err(|e| layout_error(root, e))?;
        let layout = Layout {
            root: root.to_path_buf(),
            store,
        };
        layout.read_index()?;
        Ok(layout)
    }

    /// Open `root` as a layout, creating an empty one when it does not exist.
    pub(crate) fn open_or_create(root: &Path) -> Result<Layout> {
        if root.join("oci-layout").is_file() {
            return Layout::open(root);
        }
        std::fs::create_dir_all(root.join("blobs/sha256")).map_err(|e| Error::io(root, e))?;
        write_atomic(
            &root.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        let empty =
            serde_json::json!({"schemaVersion": 2, "mediaType": media::INDEX, "manifests": []});
        write_atomic(
            &root.join("index.json"),
            &crate::oci::cjson::value_to_vec(&empty),
        )?;
        Layout::open(root)
    }

    fn err(&self, e: crate::oci::Error) -> Error {
        layout_error(&self.root, e)
    }

    fn read_index(&self) -> Result<Value> {
        let bytes = self
            .store
            .read_file("index.json")
            .map_err(|e| self.err(e))?;
        serde_json::from_slice(&bytes).map_err(|e| Error::Layout {
            path: self.root.join("index.json"),
            reason: format!("index.json is not JSON: {e}"),
        })
    }

    /// The `index.json` entries.
    pub(crate) fn index(&self) -> Result<Vec<Descriptor>> {
        let index = self.read_index()?;
        let m = serde_json::from_value::<Document>(index).map_err(|e| Error::Layout {
            path: self.root.join("index.json"),
            reason: format!("index.json is not an image index: {e}"),
        })?;
        Ok(m.manifests)
    }

    /// The path of a blob (not checked for existence).
    pub(crate) fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.store.blob_path(digest)
    }

    /// Check that a blob is there, a regular file (no link followed) of the descriptor's size.
    pub(crate) fn check_blob(&self, desc: &Descriptor) -> Result<PathBuf> {
        self.store
            .open_blob(&desc.digest, desc.size)
            .map_err(|e| self.err(e))?;
        Ok(self.store.blob_path(&desc.digest))
    }

    /// Read a small blob (manifest, index, config): a regular file of the descriptor's size, at
    /// most [`crate::oci::MAX_DOCUMENT`] bytes, whose digest is verified.
    pub(crate) fn read_small(&self, desc: &Descriptor) -> Result<Vec<u8>> {
        let d = &desc.digest;
        self.store.read_exact(d, desc.size).map_err(|e| match e {
            crate::oci::Error::Corrupt { actual, .. } => Error::DigestMismatch {
                what: self.store.blob_path(d).display().to_string(),
                expected: d.to_string(),
                actual: actual.to_string(),
            },
            e => self.err(e),
        })
    }

    /// The layout's blob store, for the layer reader.
    pub(crate) fn store(&self) -> &BlobStore {
        &self.store
    }

    #[cfg(test)]
    /// Store bytes as a blob; returns its digest.
    pub(crate) fn put_bytes(&self, bytes: &[u8]) -> Result<Digest> {
        let digest = Digest::of(bytes);
        let path = self.blob_path(&digest);
        if !path.exists() {
            write_atomic(&path, bytes)?;
        }
        Ok(digest)
    }

    /// Add or replace the `index.json` entry named `name` (by `org.opencontainers.image.ref.name`).
    pub(crate) fn set_ref(&self, name: &str, mut desc: Descriptor) -> Result<()> {
        let path = self.root.join("index.json");
        let mut index = self.read_index()?;
        desc.annotations.insert(REF_NAME.into(), name.into());
        let entry = serde_json::to_value(&desc).unwrap_or_default();
        // Entries are edited as JSON: fields of `index.json` the model does not know are kept.
        let list = index
            .get_mut("manifests")
            .and_then(|m| m.as_array_mut())
            .ok_or_else(|| Error::Layout {
                path: path.clone(),
                reason: "index.json has no `manifests` list".into(),
            })?;
        list.retain(|m| {
            m.get("annotations")
                .and_then(|a| a.get(REF_NAME))
                .and_then(Value::as_str)
                != Some(name)
        });
        list.push(entry);
        write_atomic(&path, &crate::oci::cjson::value_to_vec(&index))
    }
}

/// A layout read refused by the one layout reader, as a registry error.
fn layout_error(root: &Path, e: crate::oci::Error) -> Error {
    Error::Layout {
        path: root.to_path_buf(),
        reason: e.to_string(),
    }
}

/// Write `bytes` to `path` through a temporary file in the same directory and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    crate::oci::write_atomic(path, bytes).map_err(|e| Error::io(path, e.into_io()))
}
