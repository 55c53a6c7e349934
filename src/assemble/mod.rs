//! Image assembly: from one value per target (files to ship, runtime config, compatibility
//! tuple) to layers, config, manifest, the image index and `index.json`, in one OCI layout.
//!
//! `build` owns the layer plan of an image (what goes in which layer, in which order, with
//! which modes and compression), the config/manifest/index contents and their annotations,
//! base-image import from a layout on disk, the safety checks on input files, and finding the
//! `infer-serve` binary. It does not parse recipes or resolve targets (the caller passes
//! [`TargetSpec`]s made from the plan), never writes to the terminal (progress goes through
//! the [`Progress`] trait), and leaves bytes and blobs to [`crate::oci`].
//!
//! Layers, least to most often changed: base image layers (GPU targets; none for CPU:
//! scratch) → runtime libraries → `infer-serve` → engine or model → `runtime.toml` and
//! warm-up data. Invariants: the same specs and epoch give the same digests on any machine
//! (nothing here reads the clock, the umask, file owners or modes); every file shipped was
//! checked to be a regular file inside its allowed root.

pub(crate) mod inputs;
pub(crate) mod spec;
pub(crate) mod split;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::oci::image::{
    self, ContainerConfig, Descriptor, History, ImageConfig, Manifest, Platform, RootFs,
};
use crate::oci::layer::{self, CacheHit, LayerOptions};
use crate::oci::store::{BlobStore, LayerRecord};
use crate::oci::tar::Entry;
use crate::oci::{annotation, layout, media, Compression, Digest, ANNOTATION_PREFIX, LAYER_RECIPE};
use crate::plan::TargetKind;

pub use inputs::{
    check_gpu_runtime_headers, check_runtime_binary, flavour_names, headers_newer, locate,
    locate_runtime, runtime_tensorrt_headers, safe_input, RuntimeFlavour,
};
pub use spec::{target_spec, Files};

/// Where things live inside every image.
pub mod paths {
    pub(crate) const SERVE: &str = "usr/local/bin/infer-serve";
    pub const MODEL_DIR: &str = "opt/infer/model";
    /// A bundle's models: one directory each, `opt/infer/models/<name>`.
    pub(crate) const MODELS_DIR: &str = "opt/infer/models";
    pub const CONFIG_DIR: &str = "etc/infer";
    pub const RUNTIME_TOML: &str = "etc/infer/runtime.toml";
    pub(crate) const WORKDIR: &str = "/opt/infer";
}

/// The user the image runs as (distroless "nonroot"). Files belong to root (uid/gid 0) and
/// are world-readable, so the server can read but not modify its binary, model and config.
pub(crate) const USER: &str = "65532:65532";
/// The ports the image config exposes: infer-serve's HTTP and gRPC defaults.
pub(crate) const PORTS: [u16; 2] = [
    infer_spec::runtime::DEFAULT_HTTP_PORT,
    infer_spec::runtime::DEFAULT_GRPC_PORT,
];

/// The environment a GPU image sets when its base does not: which GPUs the NVIDIA container
/// toolkit exposes and which driver libraries it injects (no `libcuda` is ever in an image).
pub(crate) const GPU_ENV: [&str; 2] = [
    "NVIDIA_VISIBLE_DEVICES=all",
    "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
];

/// Layers of barely compressible data (weights, engines) at least this large are stored
/// uncompressed under the `auto` policy: deflate buys ~7% on float weights for 10-20× the time,
/// and an uncompressed layer is both faster and smaller than `umoci insert`'s near-stored gzip
/// (`docs/BENCHMARKS.md`, "Layer build").
pub(crate) const WEIGHTS_THRESHOLD: u64 = 4 << 20;

/// Errors of the `assemble` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Oci(#[from] crate::oci::Error),
    #[error("target `{target}` needs a base image: pass --base-layout DIR (an OCI layout holding the base image)")]
    NeedBaseLayout { target: String },
    #[error("base layout {layout}: {why}")]
    BaseImage { layout: PathBuf, why: String },
    #[error("`{path}` is outside the recipe directory {root}")]
    EscapesRoot { path: PathBuf, root: PathBuf },
    #[error("`{path}` is a {kind}, not a regular file")]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error("cannot read `{path}`")]
    Input {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no infer-serve binary found (looked at {looked})\nhint: build one with `scripts/build-runtime.sh` and pass --runtime FILE or set INFER_SERVE_BIN")]
    NoRuntime { looked: String },
    #[error("no dynamically linked infer-serve found (looked at {looked}); images whose engine is ONNX Runtime need it\nhint: build one with `FLAVOUR=dynamic scripts/build-runtime.sh` and pass --runtime-dynamic FILE or set INFER_SERVE_DYNAMIC_BIN, or force the tract engine with `[engine] cpu = \"tract\"`")]
    NoDynamicRuntime { looked: String },
    #[error("no infer-serve built with TensorRT found (looked at {looked}); GPU images need it (their engine is served by its TensorRT backend)\nhint: build one with `FLAVOUR=gpu scripts/build-runtime.sh` (or `scripts/install.sh --with-gpu`) and pass --runtime-gpu FILE or set INFER_SERVE_GPU_BIN")]
    NoGpuRuntime { looked: String },
    #[error("runtime binary `{path}` {why}\nhint: {hint}")]
    BadRuntime {
        path: PathBuf,
        why: String,
        hint: String,
    },
    #[error("no targets to build")]
    NoTargets,
    #[error("{what}")]
    Spec { what: String },
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Oci(e) => e.is_bad_input(),
            Error::Input { .. } => false,
            _ => true,
        }
    }
}

/// Build-wide identity of the image (from the recipe).
#[derive(Debug, Clone, Default)]
pub struct ImageMeta {
    /// Model name: image title and default layout name.
    pub name: String,
    pub version: String,
    /// VCS revision of the recipe, when known.
    pub revision: Option<String>,
    /// Source URL, when known.
    pub source: Option<String>,
    /// Repository the tags belong to (`registry.example.com/ml/resnet50`).
    pub repository: String,
    /// Tag of the index grouping the targets.
    pub index_tag: String,
    /// Extra labels for every image config (the recipe's `[image] labels`).
    pub labels: BTreeMap<String, String>,
    /// The user the image runs as (`[image] user`, default 65532).
    pub user: Option<u32>,
}

/// The model or engine layer's content.
#[derive(Debug, Clone)]
pub enum Payload {
    /// The ONNX model itself (CPU targets, and GPU targets until an engine exists).
    Model { onnx: PathBuf },
    /// A built engine with its metadata (`engine.json`, from the engine cache).
    Engine {
        file: PathBuf,
        file_name: String,
        meta_json: Vec<u8>,
    },
}

/// One model of an image: the content of its layer and where it lives.
#[derive(Debug, Clone)]
pub struct ModelSpec {
    /// `[model] name`.
    pub name: String,
    /// Its directory inside the image, without the leading `/`: [`paths::MODEL_DIR`] in a
    /// one-model image, `opt/infer/models/<name>` in a bundle.
    pub dir: String,
    pub payload: Payload,
    /// The ONNX model the payload is (or was built from): the SBOM's source.
    pub onnx: PathBuf,
    /// Other files of the model's layer: path inside the image → bytes. A text model's
    /// tokenizer; in a bundle also the model's `runtime.toml`, warm-up samples and engine
    /// profile, so that a change to one model changes one layer.
    pub files: BTreeMap<String, std::sync::Arc<[u8]>>,
}

impl ModelSpec {
    /// The role of the model's layer (its `dev.infer-build.layer` annotation): `model` or
    /// `engine`, and in a bundle `model:<name>` or `engine:<name>`.
    pub fn role(&self) -> String {
        let kind = match self.payload {
            Payload::Model { .. } => "model",
            Payload::Engine { .. } => "engine",
        };
        if self.dir == paths::MODEL_DIR {
            kind.to_string()
        } else {
            format!("{kind}:{}", self.name)
        }
    }
}

/// Everything needed to assemble one target's image.
#[derive(Debug, Clone)]
pub struct TargetSpec {
    pub id: String,
    pub tag: String,
    pub platform: Platform,
    /// CPU or GPU: scratch (CPU) images need a statically linked runtime; GPU images take a base.
    pub kind: TargetKind,
    /// Base image: an OCI layout and an optional tag in it.
    pub base: Option<BaseRef>,
    /// Runtime libraries to add (source file, path inside the image).
    pub runtime_libs: Vec<(PathBuf, String)>,
    pub serve_bin: PathBuf,
    /// The models, one layer each, in the order the server loads them.
    pub models: Vec<ModelSpec>,
    /// `/etc/infer/runtime.toml` bytes: an `infer_spec::RuntimeConfig`, or for a bundle an
    /// `infer_spec::Bundle` naming the models' directories.
    pub runtime_toml: Vec<u8>,
    /// Warm-up and other small data of the config layer: path inside the image → bytes.
    pub extra_files: BTreeMap<String, std::sync::Arc<[u8]>>,
    /// Compatibility tuple (keys without the prefix: `gpu.sm`, `trt.version`, `precision`…).
    pub compat: BTreeMap<String, String>,
    /// The split layout's model (`split`): when set, the runtime image, model image and
    /// ModelPack manifest are written beside this target's image.
    pub split: Option<split::Split>,
}

#[derive(Debug, Clone)]
pub struct BaseRef {
    pub layout: PathBuf,
    pub tag: Option<String>,
}

/// How layers are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// gzip (level 6) for everything, except large engine/model layers: uncompressed.
    Auto,
    /// One encoding for every layer.
    All(Compression),
}

#[derive(Debug, Clone, Copy)]
pub struct BuildOptions {
    /// Seconds since the epoch for every timestamp (`SOURCE_DATE_EPOCH`, else 0).
    pub epoch: u64,
    pub policy: Policy,
    pub zstd_workers: u32,
}

/// Receives progress; the CLI draws it, tests ignore it.
pub trait Progress {
    fn start(&mut self, target: &str, layer: &str, total: u64);
    fn advance(&mut self, n: u64);
    fn finish(&mut self);
}

pub struct NoProgress;
impl Progress for NoProgress {
    fn start(&mut self, _: &str, _: &str, _: u64) {}
    fn advance(&mut self, _: u64) {}
    fn finish(&mut self) {}
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LayerReport {
    pub role: String,
    pub digest: Digest,
    pub diff_id: Digest,
    pub size: u64,
    pub media_type: String,
    pub cache: LayerSource,
}

/// Where a built layer's bytes came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LayerSource {
    /// The build cache, nothing read: the inputs' metadata matched.
    Stat,
    /// The build cache, the inputs re-read and hashed but nothing recompressed.
    Content,
    /// Written by this build.
    Miss,
    /// Copied from the base image's layout.
    Base,
}

impl From<CacheHit> for LayerSource {
    fn from(hit: CacheHit) -> LayerSource {
        match hit {
            CacheHit::Stat => LayerSource::Stat,
            CacheHit::Content => LayerSource::Content,
            CacheHit::Miss => LayerSource::Miss,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TargetReport {
    pub id: String,
    pub tag: String,
    pub manifest_digest: Digest,
    pub manifest_size: u64,
    pub config_digest: Digest,
    pub layers: Vec<LayerReport>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildReport {
    pub layout: PathBuf,
    pub index_tag: String,
    pub index_digest: Digest,
    pub targets: Vec<TargetReport>,
    /// The split layout's images, per target that has one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub split: Vec<split::SplitReport>,
}

/// Assemble every target into the layout at `out` and write its `index.json`.
pub fn build(
    out: &Path,
    meta: &ImageMeta,
    targets: &[TargetSpec],
    opts: &BuildOptions,
    progress: &mut dyn Progress,
) -> Result<BuildReport, Error> {
    if targets.is_empty() {
        return Err(Error::NoTargets);
    }
    for t in targets {
        if t.kind == TargetKind::Gpu && t.base.is_none() {
            return Err(Error::NeedBaseLayout {
                target: t.id.clone(),
            });
        }
    }
    let store = BlobStore::create(out)?;
    let _lock = store.lock()?;
    let created = image::rfc3339(opts.epoch);
    let mut reports = Vec::new();
    let mut descriptors = Vec::new();
    for t in targets {
        let (report, desc) = build_target(&store, meta, t, opts, &created, progress)?;
        reports.push(report);
        descriptors.push(desc);
    }

    // The index grouping the targets; each entry carries the platform and the GPU tuple.
    let mut idx = image::Index::new(descriptors.clone());
    for d in &mut idx.manifests {
        d.annotations.remove(annotation::CONTAINERD_IMAGE_NAME);
        d.annotations.remove(annotation::REF_NAME);
    }
    idx.annotations = base_annotations(meta, &created);
    idx.annotations
        .insert(annotation::REF_NAME.into(), meta.index_tag.clone());
    let idx_bytes = image::encode("image index", &idx)?;
    let idx_digest = store.put(&idx_bytes)?;
    let mut idx_desc = Descriptor::new(media::INDEX, idx_digest.clone(), idx_bytes.len() as u64);
    idx_desc
        .annotations
        .insert(annotation::REF_NAME.into(), meta.index_tag.clone());

    let mut entries = vec![idx_desc];
    entries.extend(descriptors);
    let mut splits = Vec::new();
    for t in targets {
        if let Some(s) = &t.split {
            let (report, descs) = split::build(&store, meta, t, s, opts, progress)?;
            splits.push(report);
            entries.extend(descs);
        }
    }
    layout::write_index(&store, entries)?;
    Ok(BuildReport {
        layout: out.to_path_buf(),
        index_tag: meta.index_tag.clone(),
        index_digest: idx_digest,
        targets: reports,
        split: splits,
    })
}

fn base_annotations(meta: &ImageMeta, created: &str) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    a.insert(annotation::CREATED.into(), created.into());
    a.insert(annotation::TITLE.into(), meta.name.clone());
    a.insert(annotation::VERSION.into(), meta.version.clone());
    if let Some(r) = &meta.revision {
        a.insert(annotation::REVISION.into(), r.clone());
    }
    if let Some(s) = &meta.source {
        a.insert(annotation::SOURCE.into(), s.clone());
    }
    a
}

fn compat_annotations(t: &TargetSpec) -> BTreeMap<String, String> {
    let mut a: BTreeMap<String, String> = t
        .compat
        .iter()
        .map(|(k, v)| (format!("{ANNOTATION_PREFIX}{k}"), v.clone()))
        .collect();
    a.insert(format!("{ANNOTATION_PREFIX}target"), t.id.clone());
    a
}

/// One layer to build.
struct LayerPlan {
    role: String,
    entries: Vec<Entry>,
    compression: Compression,
}

/// The layer plan of a target, base layers excluded.
fn plan_layers(t: &TargetSpec, policy: Policy) -> Result<Vec<LayerPlan>, Error> {
    let pick = |weights: bool, size: u64| match policy {
        Policy::All(c) => c,
        Policy::Auto if weights && size >= WEIGHTS_THRESHOLD => Compression::None,
        Policy::Auto => Compression::Gzip,
    };
    let mut layers = Vec::new();
    if !t.runtime_libs.is_empty() {
        let mut entries = Vec::new();
        for (src, dest) in &t.runtime_libs {
            let size = file_size(src)?;
            entries.push(Entry::file(dest, 0o644, src.clone(), size));
        }
        layers.push(LayerPlan {
            role: "runtime-libs".into(),
            entries,
            compression: pick(false, 0),
        });
    }
    let serve_size = file_size(&t.serve_bin)?;
    layers.push(LayerPlan {
        role: "infer-serve".into(),
        entries: vec![Entry::file(
            paths::SERVE,
            0o755,
            t.serve_bin.clone(),
            serve_size,
        )],
        compression: pick(false, serve_size),
    });
    for m in &t.models {
        let mut entries = match &m.payload {
            Payload::Model { onnx } => {
                let size = file_size(onnx)?;
                vec![Entry::file(
                    &format!("{}/model.onnx", m.dir),
                    0o644,
                    onnx.clone(),
                    size,
                )]
            }
            Payload::Engine {
                file,
                file_name,
                meta_json,
            } => {
                let size = file_size(file)?;
                vec![
                    Entry::file(&format!("{}/{file_name}", m.dir), 0o644, file.clone(), size),
                    Entry::bytes(&format!("{}/engine.json", m.dir), 0o644, meta_json.clone()),
                ]
            }
        };
        for (path, bytes) in &m.files {
            entries.push(Entry::bytes(path, 0o644, bytes.clone()));
        }
        let size: u64 = entries.iter().map(Entry::size).sum();
        layers.push(LayerPlan {
            role: m.role(),
            entries,
            compression: pick(true, size),
        });
    }
    let mut cfg = vec![
        Entry::bytes(paths::RUNTIME_TOML, 0o644, t.runtime_toml.clone()),
        // Scratch images have no /tmp; servers and libraries expect one.
        Entry::dir("tmp", 0o1777),
    ];
    for (path, bytes) in &t.extra_files {
        cfg.push(Entry::bytes(path, 0o644, bytes.clone()));
    }
    layers.push(LayerPlan {
        role: "config".into(),
        entries: cfg,
        compression: pick(false, 0),
    });
    Ok(layers)
}

fn file_size(p: &Path) -> Result<u64, Error> {
    std::fs::metadata(p)
        .map(|m| m.len())
        .map_err(|source| Error::Input {
            path: p.into(),
            source,
        })
}

/// The base image's layers and config, imported into `store`.
struct Base {
    layers: Vec<LayerReport>,
    config: ImageConfig,
    name: String,
    digest: Digest,
    /// A slim base's size-report annotations (manifest, then per layer), kept by the image.
    slim: BTreeMap<String, String>,
    slim_layers: Vec<BTreeMap<String, String>>,
}

fn import_base(store: &BlobStore, b: &BaseRef, platform: &Platform) -> Result<Base, Error> {
    let bad = |why: String| Error::BaseImage {
        layout: b.layout.clone(),
        why,
    };
    let src = BlobStore::open(&b.layout)?;
    let (images, _) = layout::walk(&src)?;
    let wanted = match &b.tag {
        Some(tag) => Some(layout::resolve(&src, tag)?.digest),
        None => None,
    };
    let candidates: Vec<&layout::FoundImage> = images
        .iter()
        .filter(|i| {
            let arch = i.config.get("architecture").and_then(|v| v.as_str());
            let os = i.config.get("os").and_then(|v| v.as_str());
            arch == Some(platform.architecture.as_str()) && os == Some(platform.os.as_str())
        })
        .filter(|i| match &wanted {
            // A tag naming an index selects among its platforms; naming a manifest, just it.
            Some(d) => {
                &i.descriptor.digest == d || layout_index_contains(&src, d, &i.descriptor.digest)
            }
            None => true,
        })
        .collect();
    let img = match candidates.as_slice() {
        [one] => *one,
        [] => {
            return Err(bad(format!(
                "no {}/{} image in it",
                platform.os, platform.architecture
            )))
        }
        _ => {
            return Err(bad(
                "it holds several matching images: name one with --base-tag".into(),
            ))
        }
    };
    let config: ImageConfig = serde_json::from_value(img.config.clone()).map_err(|e| {
        bad(format!(
            "config {} is not an image config: {e}",
            img.manifest.config.digest
        ))
    })?;
    if config.rootfs.diff_ids.len() != img.manifest.layers.len() {
        return Err(bad(
            "config diff_ids and manifest layers differ in number".into()
        ));
    }
    let mut layers = Vec::new();
    for (l, diff_id) in img.manifest.layers.iter().zip(&config.rootfs.diff_ids) {
        if !matches!(
            l.media_type.as_str(),
            media::LAYER_GZIP | media::LAYER_ZSTD | media::LAYER_TAR | media::DOCKER_LAYER_GZIP
        ) {
            return Err(bad(format!(
                "layer {} has unsupported media type {}",
                l.digest, l.media_type
            )));
        }
        store.import(&src, &l.digest, l.size, false)?;
        store.verify_diff_id(&l.digest, l.size, &l.media_type, diff_id, &b.layout)?;
        let media_type = if l.media_type == media::DOCKER_LAYER_GZIP {
            media::LAYER_GZIP.into()
        } else {
            l.media_type.clone()
        };
        layers.push(LayerReport {
            role: "base".into(),
            digest: l.digest.clone(),
            diff_id: diff_id.clone(),
            size: l.size,
            media_type,
            cache: LayerSource::Base,
        });
    }
    let name = b
        .tag
        .clone()
        .unwrap_or_else(|| b.layout.display().to_string());
    let slim = crate::slim::image::carried_annotations(&img.manifest.annotations);
    let slim_layers = img
        .manifest
        .layers
        .iter()
        .map(|l| {
            if slim.is_empty() {
                BTreeMap::new()
            } else {
                crate::slim::image::carried_layer_annotations(&l.annotations)
            }
        })
        .collect();
    Ok(Base {
        layers,
        config,
        name,
        digest: img.descriptor.digest.clone(),
        slim,
        slim_layers,
    })
}

fn layout_index_contains(src: &BlobStore, index: &Digest, manifest: &Digest) -> bool {
    src.read(index)
        .ok()
        .and_then(|b| image::decode::<image::Index>("index", &b).ok())
        .is_some_and(|i| i.manifests.iter().any(|m| &m.digest == manifest))
}

#[allow(
    clippy::too_many_lines,
    reason = "one image's layers in order (base, libraries, runtime, models, config) and then its config and manifest: each step appends to the same lists"
)]
fn build_target(
    store: &BlobStore,
    meta: &ImageMeta,
    t: &TargetSpec,
    opts: &BuildOptions,
    created: &str,
    progress: &mut dyn Progress,
) -> Result<(TargetReport, Descriptor), Error> {
    let base = match &t.base {
        Some(b) => Some(import_base(store, b, &t.platform)?),
        None => None,
    };
    let mut layers: Vec<LayerReport> = base.as_ref().map(|b| b.layers.clone()).unwrap_or_default();
    let mut history: Vec<History> = base
        .as_ref()
        .map(|b| b.config.history.clone())
        .unwrap_or_default();
    // On a slim base, every layer records its uncompressed size for the slim size report.
    let mut slim_layers: Vec<BTreeMap<String, String>> = base
        .as_ref()
        .map(|b| b.slim_layers.clone())
        .unwrap_or_default();
    let on_slim = base.as_ref().is_some_and(|b| !b.slim.is_empty());
    for lp in plan_layers(t, opts.policy)? {
        let lo = LayerOptions {
            compression: lp.compression,
            mtime: opts.epoch,
            zstd_workers: opts.zstd_workers,
        };
        let total: u64 = lp.entries.iter().map(Entry::size).sum();
        progress.start(&t.id, &lp.role, total);
        let res = layer::build_layer(store, lp.entries, &lo, &mut |n| progress.advance(n));
        progress.finish();
        let (rec, hit): (LayerRecord, CacheHit) = res?;
        let mut slim = BTreeMap::new();
        if on_slim {
            let size = rec.tar_size.to_string();
            slim.insert(crate::slim::image::UNCOMPRESSED_SIZE.to_string(), size);
        }
        slim_layers.push(slim);
        layers.push(LayerReport {
            role: lp.role.clone(),
            digest: rec.digest,
            diff_id: rec.diff_id,
            size: rec.size,
            media_type: rec.media_type,
            cache: hit.into(),
        });
        history.push(History {
            created: Some(created.into()),
            created_by: Some(format!(
                "infer-build {} layer ({})",
                lp.role,
                lp.compression.id()
            )),
            comment: None,
            empty_layer: false,
        });
    }

    let mut labels = meta.labels.clone();
    labels.extend(base_annotations(meta, created));
    labels.extend(compat_annotations(t));
    let mut env: Vec<String> = base
        .as_ref()
        .map(|b| b.config.config.env.clone())
        .unwrap_or_default();
    let ours = [
        "PATH=/usr/local/bin:/usr/bin:/bin".to_string(),
        format!("INFER_CONFIG=/{}", paths::RUNTIME_TOML),
    ];
    for kv in ours {
        let key = kv.split('=').next().unwrap_or("").to_string();
        env.retain(|e| e.split('=').next() != Some(key.as_str()));
        env.push(kv);
    }
    // GPU images: the NVIDIA container toolkit injects the driver (libcuda, NVML) only when
    // asked; a CUDA base already asks, a glibc base (lean images) does not. A base's own values
    // are kept.
    if t.kind == TargetKind::Gpu {
        for kv in GPU_ENV {
            let key = kv.split('=').next().unwrap_or("");
            if !env.iter().any(|e| e.split('=').next() == Some(key)) {
                env.push(kv.to_string());
            }
        }
    }
    let mut cc = ContainerConfig {
        user: meta
            .user
            .map(|u| format!("{u}:{u}"))
            .unwrap_or_else(|| USER.into()),
        env,
        entrypoint: vec![format!("/{}", paths::SERVE)],
        cmd: vec!["--config".into(), format!("/{}", paths::RUNTIME_TOML)],
        working_dir: paths::WORKDIR.into(),
        labels,
        stop_signal: "SIGTERM".into(),
        ..Default::default()
    };
    for port in PORTS {
        cc.exposed_ports
            .insert(format!("{port}/tcp"), BTreeMap::new());
    }
    let config = ImageConfig {
        created: Some(created.into()),
        architecture: t.platform.architecture.clone(),
        os: t.platform.os.clone(),
        config: cc,
        rootfs: RootFs {
            kind: "layers".into(),
            diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
        },
        history,
    };
    let cfg_bytes = image::encode("image config", &config)?;
    let cfg_digest = store.put(&cfg_bytes)?;

    let mut ann = base_annotations(meta, created);
    ann.extend(compat_annotations(t));
    // A split layout's runtime image is shared by models whose tags differ: its tag is only
    // in index.json, never in its bytes.
    if t.compat.get(split::PART).map(String::as_str) != Some("runtime") {
        ann.insert(annotation::REF_NAME.into(), t.tag.clone());
    }
    ann.insert(
        format!("{ANNOTATION_PREFIX}layer-recipe"),
        LAYER_RECIPE.into(),
    );
    if let Some(b) = &base {
        ann.insert(annotation::BASE_NAME.into(), b.name.clone());
        ann.insert(annotation::BASE_DIGEST.into(), b.digest.to_string());
        ann.extend(b.slim.clone());
    }
    let manifest = Manifest {
        schema_version: 2,
        media_type: media::MANIFEST.into(),
        config: Descriptor::new(media::CONFIG, cfg_digest.clone(), cfg_bytes.len() as u64),
        layers: layers
            .iter()
            .zip(&slim_layers)
            .map(|(l, slim)| {
                let mut d = Descriptor::new(&l.media_type, l.digest.clone(), l.size);
                d.annotations
                    .insert(format!("{ANNOTATION_PREFIX}layer"), l.role.clone());
                d.annotations.extend(slim.clone());
                d
            })
            .collect(),
        subject: None,
        artifact_type: None,
        annotations: ann,
    };
    let m_bytes = image::encode("manifest", &manifest)?;
    let m_digest = store.put(&m_bytes)?;

    let mut desc = Descriptor::new(media::MANIFEST, m_digest.clone(), m_bytes.len() as u64);
    desc.platform = Some(t.platform.clone());
    desc.annotations = compat_annotations(t);
    desc.annotations
        .insert(annotation::REF_NAME.into(), t.tag.clone());
    if !meta.repository.is_empty() {
        desc.annotations.insert(
            annotation::CONTAINERD_IMAGE_NAME.into(),
            format!("{}:{}", meta.repository, t.tag),
        );
    }
    let report = TargetReport {
        id: t.id.clone(),
        tag: t.tag.clone(),
        manifest_digest: m_digest,
        manifest_size: m_bytes.len() as u64,
        config_digest: cfg_digest,
        layers,
    };
    Ok((report, desc))
}
