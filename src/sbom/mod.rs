//! Software bill of materials: one SPDX 2.3 JSON document per built image.
//!
//! What an SBOM lists (see [`spdx`] for the exact shape): the per-target image (by manifest
//! digest), the `infer-serve` binary (sha256), the runtime's crates, the ONNX model and the
//! engine (sha256), and the base image of GPU targets (name and digest from the manifest's
//! `org.opencontainers.image.base.*` annotations).
//!
//! The crates come from the workspace `Cargo.lock`, embedded in infer-build at compile time
//! (`include_str!`), walked from the `infer-serve` package ([`lock::closure`]). Compile time,
//! not build time, because the images ship the `infer-serve` that `scripts/build-runtime.sh`
//! builds `--locked` from this same workspace, and infer-build must work without a source
//! checkout. A runtime built from another checkout is still hashed exactly; only its crate
//! list would be this workspace's.
//!
//! Layout: `build` writes `<layout>/sbom/<target>.spdx.json` ([`path_in_layout`]) next to
//! `index.json`; `push` attaches each to its image as an OCI 1.1 artifact (`artifactType`
//! `application/spdx+json`) after checking it describes that image ([`described_image`]).
//! [`spdx`] and [`lock`] are pure; this file does the reading, hashing and writing.

pub(crate) mod lock;
pub(crate) mod spdx;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::assemble::{paths, BuildReport, ImageMeta, Payload, TargetSpec};
use crate::oci::Digest;

/// The workspace lock file, as infer-build was compiled with.
pub(crate) const WORKSPACE_LOCK: &str = include_str!("../../Cargo.lock");
/// Manifests of the workspace members the runtime depends on (for their dev-dependencies).
const MEMBER_MANIFESTS: [(&str, &str); 2] = [
    (
        "infer-serve",
        include_str!("../../crates/infer-serve/Cargo.toml"),
    ),
    (
        "infer-spec",
        include_str!("../../crates/infer-spec/Cargo.toml"),
    ),
];
/// The package the walk starts at.
pub(crate) const RUNTIME_PACKAGE: &str = "infer-serve";
/// The directory under the layout holding the SBOMs.
pub(crate) const DIR: &str = "sbom";
/// The media type of the document and the `artifactType` of its manifest.
pub(crate) const MEDIA_TYPE: &str = "application/spdx+json";

/// Errors of the `sbom` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("workspace Cargo.lock: {0}")]
    Lock(String),
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Oci(crate::oci::Error),
    #[error("target id `{0}` cannot name an SBOM file (letters, digits, `.`, `_`, `-` only)")]
    BadTarget(String),
    #[error("image manifest {digest} in {layout}: {why}")]
    Manifest {
        layout: PathBuf,
        digest: String,
        why: String,
    },
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Oci(e) => e.is_bad_input(),
            e => matches!(e, Error::BadTarget(_)),
        }
    }
}

/// Where the SBOM of `target` lives in the layout at `layout`.
pub(crate) fn path_in_layout(layout: &Path, target: &str) -> Result<PathBuf, Error> {
    let ok = !target.is_empty()
        && !target.starts_with('.')
        && target
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if !ok {
        return Err(Error::BadTarget(target.to_string()));
    }
    Ok(layout.join(DIR).join(format!("{target}.spdx.json")))
}

/// The image manifest digest an SBOM describes (`sha256:<hex>`): the SHA256 checksum of its
/// `SPDXRef-Image` package. `None` when the bytes are not such a document, or its checksum is
/// not a sha256.
pub(crate) fn described_image(bytes: &[u8]) -> Option<Digest> {
    let doc: Value = serde_json::from_slice(bytes).ok()?;
    let pkg = doc
        .get("packages")?
        .as_array()?
        .iter()
        .find(|p| p.get("SPDXID").and_then(Value::as_str) == Some(spdx::IMAGE_ID))?;
    let hex = pkg
        .get("checksums")?
        .as_array()?
        .iter()
        .find(|c| c.get("algorithm").and_then(Value::as_str) == Some("SHA256"))?
        .get("checksumValue")?
        .as_str()?;
    Digest::parse(&format!("sha256:{hex}")).ok()
}

/// The runtime's crates from the embedded lock file: `infer-serve` first.
pub(crate) fn runtime_crates() -> Result<Vec<lock::Crate>, Error> {
    let mut remove: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, manifest) in MEMBER_MANIFESTS {
        remove.insert(name.to_string(), lock::dev_dependencies(manifest)?);
    }
    lock::closure(WORKSPACE_LOCK, RUNTIME_PACKAGE, &remove)
}

fn hash_file(path: &Path) -> Result<(String, u64), Error> {
    let io = |source| Error::Io {
        what: "hash",
        path: path.to_path_buf(),
        source,
    };
    let f = std::fs::File::open(path).map_err(io)?;
    let (digest, size) = crate::oci::Digest::of_reader(f).map_err(io)?;
    Ok((digest.hex().to_string(), size))
}

/// The cache key of a file's digest: its canonical path and the layer cache's stat identity
/// ([`crate::oci::layer::stat_of`]). `None` when it cannot be read.
fn stat_key(path: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(path).ok()?;
    let stat = crate::oci::layer::stat_of(&canon).ok()?;
    let key = serde_json::json!(["file-sha256/v1", canon.to_string_lossy(), stat]);
    Some(
        crate::oci::Digest::of(&crate::oci::cjson::value_to_vec(&key))
            .hex()
            .to_string(),
    )
}

/// [`hash_file`] through a cache in the layout's private directory, keyed by [`stat_key`]:
/// a rebuild with unchanged inputs reads no model or engine again (a 1 GiB model costs
/// ~0.6 s to hash). An entry is written only when the file's stat key is the same after
/// hashing as before, so a file changing while it is read is never cached.
fn hash_file_cached(path: &Path, cache: &Path) -> Result<(String, u64), Error> {
    let key = stat_key(path);
    if let Some(k) = &key {
        if let Ok(text) = std::fs::read_to_string(cache.join(k)) {
            let mut it = text.split_whitespace();
            if let (Some(hex), Some(size)) = (it.next(), it.next().and_then(|n| n.parse().ok())) {
                if crate::oci::digest::is_sha256_hex(hex) {
                    return Ok((hex.to_string(), size));
                }
            }
        }
    }
    let (hex, size) = hash_file(path)?;
    if let Some(k) = key.filter(|k| stat_key(path).as_ref() == Some(k)) {
        // Best effort: a cache that cannot be written only costs the next build a re-read.
        if std::fs::create_dir_all(cache).is_ok() {
            let _ = write_atomic(&cache.join(k), format!("{hex} {size}\n").as_bytes());
        }
    }
    Ok((hex, size))
}

fn file_info(
    path: &Path,
    name: &str,
    in_image: Option<String>,
    cache: &Path,
) -> Result<spdx::FileInfo, Error> {
    let (sha256, size) = hash_file_cached(path, cache)?;
    Ok(spdx::FileInfo {
        name: name.to_string(),
        path_in_image: in_image,
        sha256,
        size,
    })
}

/// The base image recorded in a built manifest's annotations, read through the layout's blob
/// store (verified against its digest, bounded, no link followed).
fn base_of(layout: &Path, digest: &Digest) -> Result<Option<spdx::BaseInfo>, Error> {
    let bad = |why: String| Error::Manifest {
        layout: layout.to_path_buf(),
        digest: digest.to_string(),
        why,
    };
    let store = crate::oci::store::BlobStore::open(layout).map_err(Error::Oci)?;
    let bytes = store.read(digest).map_err(Error::Oci)?;
    let m: crate::oci::image::Manifest =
        crate::oci::image::decode("manifest", &bytes).map_err(|e| bad(e.to_string()))?;
    let ann = |k: &str| m.annotations.get(k).cloned();
    match (
        ann(crate::oci::annotation::BASE_NAME),
        ann(crate::oci::annotation::BASE_DIGEST),
    ) {
        (Some(name), Some(base)) => match Digest::parse(&base) {
            Ok(digest) => Ok(Some(spdx::BaseInfo { name, digest })),
            Err(e) => Err(bad(format!("its base image annotation: {e}"))),
        },
        _ => Ok(None),
    }
}

/// The SBOM input of one built target (reads and hashes its files).
pub(crate) fn input_for(
    layout: &Path,
    meta: &ImageMeta,
    spec: &TargetSpec,
    report: &crate::assemble::TargetReport,
    crates: &[lock::Crate],
    epoch: u64,
) -> Result<spdx::SbomInput, Error> {
    let cache = layout.join(".infer-build").join("file-sha256");
    let runtime = file_info(
        &spec.serve_bin,
        RUNTIME_PACKAGE,
        Some(format!("/{}", paths::SERVE)),
        &cache,
    )?;
    let mut models = Vec::new();
    for m in &spec.models {
        let model_name = m
            .onnx
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model.onnx".into());
        let (model, engine) = match &m.payload {
            Payload::Model { onnx } => (
                file_info(
                    onnx,
                    &model_name,
                    Some(format!("/{}/model.onnx", m.dir)),
                    &cache,
                )?,
                None,
            ),
            Payload::Engine {
                file, file_name, ..
            } => {
                let kind = match spec.kind {
                    crate::plan::TargetKind::Gpu => "TensorRT",
                    crate::plan::TargetKind::Cpu => "tract NNEF",
                };
                (
                    file_info(&m.onnx, &model_name, None, &cache)?,
                    Some((
                        file_info(
                            file,
                            file_name,
                            Some(format!("/{}/{file_name}", m.dir)),
                            &cache,
                        )?,
                        kind.to_string(),
                    )),
                )
            }
        };
        models.push(spdx::ModelInfo {
            bundled: (m.dir != paths::MODEL_DIR).then(|| m.name.clone()),
            model,
            engine,
            converter: converter_of(&m.payload),
        });
    }
    Ok(spdx::SbomInput {
        image: spdx::ImageInfo {
            model: meta.name.clone(),
            version: meta.version.clone(),
            target: spec.id.clone(),
            repository: meta.repository.clone(),
            tag: spec.tag.clone(),
            manifest_digest: report.manifest_digest.clone(),
            os: spec.platform.os.clone(),
            architecture: spec.platform.architecture.clone(),
        },
        runtime,
        models,
        base: base_of(layout, &report.manifest_digest)?,
        crates: crates.to_vec(),
        created: crate::oci::image::rfc3339(epoch),
        tool: format!("infer-build-{}", env!("CARGO_PKG_VERSION")),
        namespace_base: format!("{}/spdx", env!("CARGO_PKG_REPOSITORY")),
    })
}

/// Write the SBOM of every built target to `<layout>/sbom/<target>.spdx.json` (atomically);
/// returns (target, path, sha256 digest of the document) per target, in build order.
pub(crate) fn write_for_build(
    report: &BuildReport,
    meta: &ImageMeta,
    specs: &[TargetSpec],
    epoch: u64,
) -> Result<Vec<Written>, Error> {
    let crates = runtime_crates()?;
    let layout = report.layout.as_path();
    // Opened under the layout without following links: a link planted at `sbom` is refused
    // rather than sending the documents elsewhere.
    let dir = crate::oci::Dir::open(layout)
        .and_then(|d| d.sub(DIR, true))
        .map_err(Error::Oci)?;
    let mut out = Vec::new();
    for t in &report.targets {
        let Some(spec) = specs.iter().find(|s| s.id == t.id) else {
            continue;
        };
        let input = input_for(layout, meta, spec, t, &crates, epoch)?;
        let bytes = spdx::to_bytes(&input);
        let path = path_in_layout(layout, &t.id)?;
        let name = path.file_name().unwrap_or_default();
        dir.write_atomic(name, &bytes, None).map_err(Error::Oci)?;
        out.push(Written {
            target: t.id.clone(),
            path,
            digest: Digest::of(&bytes),
        });
    }
    Ok(out)
}

/// One SBOM a build wrote: the target it describes, its file and digest.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Written {
    pub target: String,
    pub path: PathBuf,
    pub digest: Digest,
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    crate::oci::write_atomic(path, bytes).map_err(Error::Oci)
}

/// The Python packages of the converter that prepared the engine's model, from its metadata
/// (`conversion.versions`, without the interpreter itself), sorted by name.
fn converter_of(payload: &Payload) -> Vec<(String, String)> {
    let Payload::Engine { meta_json, .. } = payload else {
        return Vec::new();
    };
    let Ok(meta) = infer_spec::engine::EngineMeta::from_json(meta_json) else {
        return Vec::new();
    };
    meta.conversion
        .map(|c| {
            c.versions
                .into_iter()
                .filter(|(k, _)| k != "python")
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_crates_are_what_infer_serve_links() {
        let crates = runtime_crates().unwrap();
        assert_eq!(crates[0].name, "infer-serve");
        let names: BTreeSet<&str> = crates.iter().map(|c| c.name.as_str()).collect();
        for linked in [
            "tokio",
            "hyper",
            "hyper-util",
            "serde",
            "infer-spec",
            "tract-onnx",
        ] {
            assert!(names.contains(linked), "{linked} missing from {names:?}");
        }
        for builder_only in ["clap", "ureq", "indicatif", "goblin", "zstd", "infer-build"] {
            assert!(
                !names.contains(builder_only),
                "{builder_only} is not linked by infer-serve"
            );
        }
        // Sorted after the root, no duplicates.
        let keys: Vec<_> = crates[1..].iter().map(lock::Crate::key).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(keys, sorted);
    }

    #[test]
    fn sbom_paths_are_checked() {
        let l = Path::new("/l");
        assert_eq!(
            path_in_layout(l, "cpu").unwrap(),
            Path::new("/l/sbom/cpu.spdx.json")
        );
        for bad in ["", "../x", "a/b", ".hidden", "a b"] {
            assert!(path_in_layout(l, bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn described_image_reads_the_image_package() {
        let hex = "c".repeat(64);
        let doc = serde_json::json!({"packages": [
            {"SPDXID": "SPDXRef-Other", "checksums": [{"algorithm": "SHA256", "checksumValue": "0"}]},
            {"SPDXID": "SPDXRef-Image", "checksums": [{"algorithm": "SHA256", "checksumValue": hex}]},
        ]});
        assert_eq!(
            described_image(doc.to_string().as_bytes()),
            Some(Digest::parse(&format!("sha256:{hex}")).unwrap())
        );
        assert_eq!(described_image(b"not json"), None);
        assert_eq!(described_image(b"{}"), None);
    }
}
