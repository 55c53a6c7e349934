//! OCI image layouts on disk: `index.json` writing and reading, resolving tags, walking what a
//! layout references, and writing an `oci-archive` (a tar of the layout) that both OCI tools
//! (skopeo, podman, containerd) and `docker load` accept.
//!
//! The archive holds `oci-layout`, `index.json`, every referenced blob under `blobs/sha256/`
//! (sorted by digest) and a Docker `manifest.json` listing each image with its `RepoTags`:
//! Docker engines before 25 load only that file; newer ones and containerd read `index.json`
//! (with the `io.containerd.image.name` annotation). Entries follow the canonical tar policy of
//! [`super::tar`], so an archive's bytes are as reproducible as the layout.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use serde_json::json;

use super::image::{decode_in, encode, Descriptor, Index, Manifest};
use super::store::BlobStore;
use super::tar::{self, Entry};
use super::{annotation, cjson, media, Digest, Dir, Error};

/// The most layers a manifest read from a layout may list (container runtimes stop well
/// before: overlayfs mounts at most 128 lower directories by default).
pub(crate) const MAX_LAYERS: usize = 1000;

/// Read `index.json`.
pub fn read_index(store: &BlobStore) -> Result<Index, Error> {
    let bytes = store.read_file("index.json").map_err(|e| match e {
        e @ (Error::TooBig { .. } | Error::Symlink { .. } | Error::NotAFile { .. }) => e,
        e => Error::NotALayout {
            path: store.root().into(),
            why: format!("cannot read index.json: {e}"),
        },
    })?;
    decode_in(store.root(), "index.json", &bytes)
}

/// Write `index.json` holding `entries` first, then the old entries whose ref name is not
/// among the new ones (so building one target keeps the others' tags).
pub(crate) fn write_index(store: &BlobStore, entries: Vec<Descriptor>) -> Result<Digest, Error> {
    let new_names: BTreeSet<String> = entries.iter().filter_map(ref_name).collect();
    let mut all = entries;
    if let Ok(old) = read_index(store) {
        let mut keep: Vec<Descriptor> = old
            .manifests
            .into_iter()
            .filter(|d| ref_name(d).is_some_and(|n| !new_names.contains(&n)))
            .collect();
        keep.sort_by_key(|d| ref_name(d).unwrap_or_default());
        all.extend(keep);
    }
    let bytes = encode("index.json", &Index::new(all))?;
    store.write_file("index.json", &bytes)?;
    Ok(Digest::of(&bytes))
}

pub(crate) fn ref_name(d: &Descriptor) -> Option<String> {
    d.ref_name().map(str::to_string)
}

/// The `index.json` entry tagged `tag`.
pub(crate) fn resolve(store: &BlobStore, tag: &str) -> Result<Descriptor, Error> {
    let idx = read_index(store)?;
    let known: Vec<String> = idx.manifests.iter().filter_map(ref_name).collect();
    idx.manifests
        .into_iter()
        .find(|d| ref_name(d).as_deref() == Some(tag))
        .ok_or_else(|| Error::NoSuchTag {
            layout: store.root().into(),
            tag: tag.into(),
            known: known.join(", "),
        })
}

/// One image manifest found in a layout.
#[derive(Debug, Clone)]
pub struct FoundImage {
    pub descriptor: Descriptor,
    pub manifest: Manifest,
    /// The manifest as stored (verified against the descriptor), for readers that keep
    /// fields [`Manifest`] does not model.
    pub manifest_bytes: Vec<u8>,
    /// The config as JSON, verified against its digest.
    pub config: serde_json::Value,
}

/// Every image manifest reachable from `index.json` (through nested indexes too), each once,
/// in index order, plus the nested index descriptors seen.
pub fn walk(store: &BlobStore) -> Result<(Vec<FoundImage>, Vec<Descriptor>), Error> {
    let idx = read_index(store)?;
    let mut images = Vec::new();
    let mut indexes = Vec::new();
    let mut seen = BTreeSet::new();
    let mut stack: Vec<Descriptor> = idx.manifests.into_iter().rev().collect();
    while let Some(d) = stack.pop() {
        if !seen.insert(d.digest.clone()) {
            continue;
        }
        let bytes = store.read_exact(&d.digest, d.size)?;
        match d.media_type.as_str() {
            media::INDEX | media::DOCKER_LIST => {
                let i: Index = decode_in(store.root(), &format!("index {}", d.digest), &bytes)?;
                stack.extend(i.manifests.into_iter().rev());
                indexes.push(d);
            }
            _ => images.push(read_image(store, d, bytes)?),
        }
    }
    Ok((images, indexes))
}

/// The image manifest `d` (whose verified bytes are `bytes`) with its verified config.
fn read_image(store: &BlobStore, d: Descriptor, bytes: Vec<u8>) -> Result<FoundImage, Error> {
    let manifest: Manifest = decode_in(store.root(), &format!("manifest {}", d.digest), &bytes)?;
    if manifest.layers.len() > MAX_LAYERS {
        return Err(Error::NotALayout {
            path: store.root().into(),
            why: format!(
                "manifest {} has {} layers, more than the {MAX_LAYERS} infer-build accepts",
                d.digest,
                manifest.layers.len()
            ),
        });
    }
    let cfg = store.read_exact(&manifest.config.digest, manifest.config.size)?;
    let config = decode_in(
        store.root(),
        &format!("config {}", manifest.config.digest),
        &cfg,
    )?;
    Ok(FoundImage {
        descriptor: d,
        manifest,
        manifest_bytes: bytes,
        config,
    })
}

fn is_index(d: &Descriptor) -> bool {
    media::is_index(&d.media_type)
}

/// The platform every image infer-build builds or reads runs on.
pub(crate) const PLATFORM: (&str, &str) = ("linux", "amd64");

/// Select one image of the layout: `want` is a digest (of a top-level entry, or of a manifest
/// listed in a top-level index: a platform manifest pinned by a lock file), a ref name, or
/// `None` when the layout holds exactly one entry. An index is followed to its `linux/amd64`
/// manifest (else its only one), at most four levels deep. Every document is read verified
/// against its descriptor (size, digest, [`super::MAX_DOCUMENT`]).
pub(crate) fn select(store: &BlobStore, want: Option<&str>) -> Result<FoundImage, Error> {
    let no_image = |why: String| Error::NoImage {
        layout: store.root().into(),
        why,
    };
    let entries = read_index(store)?.manifests;
    let pick = |d: &&Descriptor| match want {
        None => true,
        Some(w) if w.starts_with("sha256:") => d.digest.as_str() == w,
        Some(w) => ref_name(d).as_deref() == Some(w),
    };
    let found: Vec<&Descriptor> = entries.iter().filter(pick).collect();
    let mut desc = match (found.as_slice(), want) {
        ([one], _) => (*one).clone(),
        ([], Some(w)) if w.starts_with("sha256:") => match nested(store, &entries, w)? {
            Some(d) => d,
            None => return Err(no_image(format!("no image `{w}` in the layout"))),
        },
        ([], Some(w)) => return Err(no_image(format!("no image `{w}` in the layout"))),
        ([], None) => return Err(no_image("the layout holds no image".into())),
        (_, _) => {
            return Err(no_image(
                "the layout holds several images; name one (digest or ref name)".into(),
            ))
        }
    };
    for _ in 0..4 {
        let bytes = store.read_exact(&desc.digest, desc.size)?;
        if !is_index(&desc) {
            let img = read_image(store, desc, bytes)?;
            let m = img.manifest.media_type.as_str();
            if !m.is_empty() && !media::is_manifest(m) {
                return Err(no_image(format!(
                    "{} is a `{m}`, not an image manifest",
                    img.descriptor.digest
                )));
            }
            return Ok(img);
        }
        let idx: Index = decode_in(store.root(), &format!("index {}", desc.digest), &bytes)?;
        let (os, arch) = PLATFORM;
        let native = idx.manifests.iter().find(|m| m.is_platform(os, arch));
        desc = match (native, idx.manifests.as_slice()) {
            (Some(m), _) | (None, [m]) => m.clone(),
            _ => {
                return Err(no_image(format!(
                    "index {} has no {os}/{arch} image",
                    desc.digest
                )))
            }
        };
    }
    Err(no_image("indexes nested too deep".into()))
}

/// The descriptor with digest `want` inside one of the indexes listed in `entries`.
fn nested(
    store: &BlobStore,
    entries: &[Descriptor],
    want: &str,
) -> Result<Option<Descriptor>, Error> {
    for e in entries.iter().filter(|e| is_index(e)) {
        let bytes = store.read_exact(&e.digest, e.size)?;
        let idx: Index = decode_in(store.root(), &format!("index {}", e.digest), &bytes)?;
        if let Some(m) = idx
            .manifests
            .into_iter()
            .find(|m| m.digest.as_str() == want)
        {
            return Ok(Some(m));
        }
    }
    Ok(None)
}

/// Write the layout as an `oci-archive` at `dest` (through a temp file and a rename).
pub fn write_archive(store: &BlobStore, dest: &Path, mtime: u64) -> Result<(), Error> {
    let (images, indexes) = walk(store)?;
    let index_bytes = store.read_file("index.json")?;
    let idx: Index = decode_in(store.root(), "index.json", &index_bytes)?;
    let mut blobs: BTreeMap<Digest, u64> = BTreeMap::new();
    for d in &indexes {
        blobs.insert(d.digest.clone(), d.size);
    }
    let mut docker = Vec::new();
    for img in &images {
        blobs.insert(img.descriptor.digest.clone(), img.descriptor.size);
        blobs.insert(img.manifest.config.digest.clone(), img.manifest.config.size);
        for l in &img.manifest.layers {
            blobs.insert(l.digest.clone(), l.size);
        }
        // Docker's manifest.json lists images only: an artifact (the split layout's ModelPack
        // manifest, whose config is not an image config) travels in the blobs and index.json.
        if img.manifest.config.media_type != media::CONFIG
            && img.manifest.config.media_type != media::DOCKER_CONFIG
        {
            continue;
        }
        let tags: Vec<String> = idx
            .manifests
            .iter()
            .filter(|d| d.digest == img.descriptor.digest)
            .filter_map(|d| {
                d.annotations
                    .get(annotation::CONTAINERD_IMAGE_NAME)
                    .cloned()
                    .or_else(|| ref_name(d))
            })
            .collect();
        docker.push(json!({
            "Config": format!("blobs/sha256/{}", img.manifest.config.digest.hex()),
            "RepoTags": tags,
            "Layers": img.manifest.layers.iter().map(|l| format!("blobs/sha256/{}", l.digest.hex())).collect::<Vec<_>>(),
        }));
    }
    let docker_manifest = cjson::value_to_vec(&serde_json::Value::Array(docker));

    // The temp file is created exclusively next to `dest` and renamed over it: a link at
    // `dest` or at an old temp name is replaced, never written through.
    let name = dest
        .file_name()
        .ok_or_else(|| Error::NotAFile { path: dest.into() })?;
    let dir = Dir::open(match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    })?;
    let (tmp_name, file) = dir.create_temp(&format!(".{}.partial-", name.to_string_lossy()))?;
    let tmp = dir.path().join(&tmp_name);
    let mut w = BufWriter::with_capacity(1 << 20, file);
    let res = (|| -> Result<(), Error> {
        let zeros = [0u8; tar::BLOCK];
        let small = |w: &mut BufWriter<File>, name: &str, bytes: &[u8]| -> Result<(), Error> {
            let e = Entry::bytes(name, 0o644, bytes.to_vec());
            w.write_all(&tar::header(&e, mtime)?)
                .map_err(Error::io("write", &tmp))?;
            w.write_all(bytes).map_err(Error::io("write", &tmp))?;
            w.write_all(&zeros[..tar::padding(bytes.len() as u64)])
                .map_err(Error::io("write", &tmp))
        };
        // Canonical order: blobs/, blobs/sha256/, blobs/sha256/<hex>…, index.json, manifest.json, oci-layout.
        for dir in ["blobs", "blobs/sha256"] {
            w.write_all(&tar::header(&Entry::dir(dir, 0o755), mtime)?)
                .map_err(Error::io("write", &tmp))?;
        }
        for (d, size) in &blobs {
            let e = Entry::file(
                &format!("blobs/sha256/{}", d.hex()),
                0o644,
                store.blob_path(d),
                *size,
            );
            w.write_all(&tar::header(&e, mtime)?)
                .map_err(Error::io("write", &tmp))?;
            store.copy_verified(d, *size, &mut w)?;
            w.write_all(&zeros[..tar::padding(*size)])
                .map_err(Error::io("write", &tmp))?;
        }
        small(&mut w, "index.json", &index_bytes)?;
        small(&mut w, "manifest.json", &docker_manifest)?;
        small(&mut w, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        w.write_all(&zeros).map_err(Error::io("write", &tmp))?;
        w.write_all(&zeros).map_err(Error::io("write", &tmp))?;
        let f = w.into_inner().map_err(|e| Error::Io {
            op: "write",
            path: tmp.clone(),
            source: e.into_error(),
        })?;
        f.sync_all().map_err(Error::io("fsync", &tmp))?;
        dir.rename(&tmp_name, &dir, name)?;
        dir.sync();
        Ok(())
    })();
    if res.is_err() {
        let _ = dir.remove(&tmp_name);
    }
    res
}
