//! The split layout (`[image] layout = "split"`): beside a target's combined image, the same
//! build writes
//!
//! - a **runtime image**: the combined image without its model. Base, runtime libraries,
//!   `infer-serve`, and an `/etc/infer/runtime.toml` that serves whatever model directory is
//!   mounted at [`MOUNT`]. Nothing in it depends on the model (timestamps are the epoch 0, the
//!   annotations name the runtime), so every model of one target with the same runtime, base
//!   and libraries gets the same digest, and a model update pushes none of its bytes;
//! - a **model image**: one uncompressed tar layer per file of the model's directory (engine or
//!   ONNX, `engine.json`, `runtime.toml` with relative paths, tokenizer, warm-up samples,
//!   profile), files at the root, each layer annotated with its file path
//!   (`org.opencontainers.image.title`, `org.cncf.model.filepath`), an image config for the
//!   target's platform with no entrypoint. It is what a Kubernetes image volume mounts: containerd
//!   2.1 mounts only images with an image config, CRI-O both images and artifacts;
//! - a **ModelPack manifest** (CNCF model-spec): `artifactType`
//!   `application/vnd.cncf.model.manifest.v1+json`, its config describing the model, the very
//!   same layer blobs under ModelPack's media types (no byte is stored twice), `subject` the
//!   model image, so that ModelPack tools read the model and the registry lists it among the
//!   model image's referrers.

use std::collections::BTreeMap;

use infer_spec::engine::EngineFormat;
use serde_json::json;

use super::{
    base_annotations, build_target, compat_annotations, BuildOptions, Error, ImageMeta, ModelSpec,
    Payload, Progress, TargetReport, TargetSpec,
};
use crate::oci::image::{
    self, ContainerConfig, Descriptor, History, ImageConfig, Manifest, RootFs,
};
use crate::oci::layer::{self, LayerOptions};
use crate::oci::store::BlobStore;
use crate::oci::tar::Entry;
use crate::oci::{annotation, media, Compression, ANNOTATION_PREFIX};

/// Where the runtime image looks for its model: the image volume's mount path (KServe's model
/// directory, so a Modelcar-style mount lands there too).
pub(crate) const MOUNT: &str = "/mnt/models";

/// ModelPack's media types and annotation (CNCF model-spec v1).
pub(crate) mod modelpack {
    pub(crate) const ARTIFACT_TYPE: &str = "application/vnd.cncf.model.manifest.v1+json";
    pub(crate) const CONFIG: &str = "application/vnd.cncf.model.config.v1+json";
    /// A tar holding a weights file (the engine or the ONNX model).
    pub(crate) const WEIGHT_TAR: &str = "application/vnd.cncf.model.weight.v1.tar";
    /// A tar holding a configuration file of the weights (`runtime.toml`, tokenizer…).
    pub(crate) const WEIGHT_CONFIG_TAR: &str = "application/vnd.cncf.model.weight.config.v1.tar";
    /// A layer's file path inside the model directory.
    pub(crate) const FILEPATH: &str = "org.cncf.model.filepath";
}

/// The tuple key saying which part of the split layout a manifest is (`runtime`, `model`,
/// `modelpack`); as an annotation, [`PART_ANNOTATION`].
pub(crate) const PART: &str = "part";
/// The annotation every reader of the split layout looks for (push, warm-up, inspect).
pub(crate) const PART_ANNOTATION: &str = "dev.infer-build.part";
/// The model image's annotation naming the runtime image it was built with.
pub(crate) const RUNTIME_ANNOTATION: &str = "dev.infer-build.runtime";

/// The compatibility keys a runtime image keeps: those of its runtime, base and libraries.
/// The engine's own (GPU, precision, digests, profile) travel with the model.
const RUNTIME_KEYS: [&str; 7] = [
    "kind",
    "platform",
    "trt.version",
    "trt.build",
    "trt.version_compatible",
    "cuda.version",
    "driver.floor",
];

/// A target's model as the split layout ships it: made with
/// [`super::spec::Place::Bundled`], so its `runtime.toml` names its files relative to its
/// directory.
#[derive(Debug, Clone)]
pub struct Split {
    pub model: ModelSpec,
    /// `targets.precision`, for the ModelPack config.
    pub precision: infer_spec::engine::Precision,
}

/// The tags of a target's split pair and ModelPack manifest, from the combined image's tag.
pub(crate) fn tags(tag: &str) -> [String; 3] {
    [
        format!("{tag}-runtime"),
        format!("{tag}-model"),
        format!("{tag}-modelpack"),
    ]
}

/// What the split layout wrote for one target (`BuildReport::split`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SplitReport {
    pub target: String,
    pub runtime: TargetReport,
    pub model: TargetReport,
    /// The ModelPack manifest: tag and digest.
    pub modelpack_tag: String,
    pub modelpack_digest: crate::oci::Digest,
}

/// The runtime image's `/etc/infer/runtime.toml`: a bundle of the one model mounted at
/// [`MOUNT`], without a `[server]` table, so the model's own says how it is served.
pub(crate) fn runtime_toml() -> Vec<u8> {
    infer_spec::Bundle {
        server: None,
        models: vec![infer_spec::BundleModel {
            path: MOUNT.to_string(),
        }],
    }
    .to_toml_string()
    .into_bytes()
}

/// The image identity of a runtime image: the runtime's, not the model's.
fn runtime_meta(meta: &ImageMeta) -> ImageMeta {
    ImageMeta {
        name: "infer-serve".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        revision: None,
        source: None,
        repository: meta.repository.clone(),
        index_tag: String::new(),
        labels: BTreeMap::new(),
        user: meta.user,
    }
}

/// Builds a target's runtime image, model image and ModelPack manifest into `store`; returns
/// what it wrote and the descriptors `index.json` lists (each with its tag).
#[allow(
    clippy::too_many_lines,
    reason = "the three artifacts of a split target share their layer descriptors, written in the order they reference each other"
)]
pub(super) fn build(
    store: &BlobStore,
    meta: &ImageMeta,
    t: &TargetSpec,
    split: &Split,
    opts: &BuildOptions,
    progress: &mut dyn Progress,
) -> Result<(SplitReport, Vec<Descriptor>), Error> {
    let [runtime_tag, model_tag, modelpack_tag] = tags(&t.tag);
    // The runtime image: the target's runtime, base and libraries, no model; the epoch 0, so
    // that a model's build time does not reach it.
    let mut compat: BTreeMap<String, String> = t
        .compat
        .iter()
        .filter(|(k, _)| RUNTIME_KEYS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    compat.insert(PART.into(), "runtime".into());
    compat.insert("mount".into(), MOUNT.into());
    let runtime = TargetSpec {
        tag: runtime_tag,
        models: Vec::new(),
        runtime_toml: runtime_toml(),
        extra_files: BTreeMap::new(),
        compat,
        split: None,
        ..t.clone()
    };
    let zero = BuildOptions { epoch: 0, ..*opts };
    let (runtime_report, runtime_desc) = build_target(
        store,
        &runtime_meta(meta),
        &runtime,
        &zero,
        &image::rfc3339(0),
        progress,
    )?;

    let created = image::rfc3339(opts.epoch);
    let mut compat = t.compat.clone();
    compat.insert(PART.into(), "model".into());
    compat.insert("mount".into(), MOUNT.into());
    compat.insert("runtime".into(), runtime_report.manifest_digest.to_string());
    let model_spec = TargetSpec {
        tag: model_tag.clone(),
        compat,
        ..runtime.clone()
    };
    let files = model_files(&split.model)?;
    let mut layers = Vec::new();
    let mut history = Vec::new();
    for f in files {
        let lo = LayerOptions {
            compression: Compression::None,
            mtime: opts.epoch,
            zstd_workers: opts.zstd_workers,
        };
        let role = format!("model-file:{}", f.path);
        progress.start(&t.id, &role, f.entry.size());
        let res = layer::build_layer(store, vec![f.entry], &lo, &mut |n| progress.advance(n));
        progress.finish();
        let (rec, hit) = res?;
        history.push(History {
            created: Some(created.clone()),
            created_by: Some(format!("infer-build model file {}", f.path)),
            comment: None,
            empty_layer: false,
        });
        layers.push((f.path, f.weights, rec, hit));
    }
    let mut labels = meta.labels.clone();
    labels.extend(base_annotations(meta, &created));
    labels.extend(compat_annotations(&model_spec));
    let config = ImageConfig {
        created: Some(created.clone()),
        architecture: t.platform.architecture.clone(),
        os: t.platform.os.clone(),
        config: ContainerConfig {
            labels,
            ..Default::default()
        },
        rootfs: RootFs {
            kind: "layers".into(),
            diff_ids: layers.iter().map(|l| l.2.diff_id.clone()).collect(),
        },
        history,
    };
    let cfg_bytes = image::encode("image config", &config)?;
    let cfg_digest = store.put(&cfg_bytes)?;
    // The layers as both manifests list them: the same blobs and file-path annotations, the
    // media type by whether the file is the weights.
    let layer_descriptors = |media_type: fn(bool) -> &'static str| -> Vec<Descriptor> {
        layers
            .iter()
            .map(|(path, weights, rec, _)| {
                let mut d = Descriptor::new(media_type(*weights), rec.digest.clone(), rec.size);
                d.annotations = BTreeMap::from([
                    (annotation::TITLE.to_string(), path.clone()),
                    (modelpack::FILEPATH.to_string(), path.clone()),
                    (
                        format!("{ANNOTATION_PREFIX}layer"),
                        role_of(path, *weights).to_string(),
                    ),
                ]);
                d
            })
            .collect()
    };
    let mut ann = base_annotations(meta, &created);
    ann.extend(compat_annotations(&model_spec));
    ann.insert(annotation::REF_NAME.into(), model_tag.clone());
    let model_manifest = Manifest {
        schema_version: 2,
        media_type: media::MANIFEST.into(),
        artifact_type: None,
        config: Descriptor::new(media::CONFIG, cfg_digest.clone(), cfg_bytes.len() as u64),
        layers: layer_descriptors(|_| media::LAYER_TAR),
        subject: None,
        annotations: ann,
    };
    let m_bytes = image::encode("manifest", &model_manifest)?;
    let m_digest = store.put(&m_bytes)?;
    let mut model_desc = Descriptor::new(media::MANIFEST, m_digest.clone(), m_bytes.len() as u64);
    model_desc.platform = Some(t.platform.clone());
    model_desc.annotations = compat_annotations(&model_spec);
    model_desc
        .annotations
        .insert(annotation::REF_NAME.into(), model_tag.clone());
    if !meta.repository.is_empty() {
        model_desc.annotations.insert(
            annotation::CONTAINERD_IMAGE_NAME.into(),
            format!("{}:{model_tag}", meta.repository),
        );
    }

    // The ModelPack manifest: the same blobs, ModelPack's types, the model image its subject.
    let format = match &split.model.payload {
        Payload::Model { .. } => EngineFormat::Onnx,
        Payload::Engine { meta_json, .. } => {
            infer_spec::engine::EngineMeta::from_json(meta_json)
                .map_err(|e| Error::Spec {
                    what: format!("engine metadata of target {}: {e}", t.id),
                })?
                .format
        }
    };
    // ModelPack's words for a model format.
    let format = match format {
        EngineFormat::Onnx => "onnx",
        EngineFormat::TractNnefTar => "nnef",
        EngineFormat::TensorrtPlan => "tensorrt",
    };
    let mut mp_config = json!({
        "descriptor": {
            "createdAt": created,
            "name": meta.name,
            "version": meta.version,
        },
        "config": { "format": format },
        "modelfs": {
            "type": "layers",
            "diffIds": layers.iter().map(|l| l.2.diff_id.to_string()).collect::<Vec<_>>(),
        },
    });
    if let Some(p) = modelpack_precision(split.precision) {
        mp_config["config"]["precision"] = json!(p);
    }
    if let Some(r) = &meta.revision {
        mp_config["descriptor"]["revision"] = json!(r);
    }
    if let Some(s) = &meta.source {
        mp_config["descriptor"]["sourceURL"] = json!(s);
    }
    let mp_config_bytes = image::encode("ModelPack config", &mp_config)?;
    let mp_config_digest = store.put(&mp_config_bytes)?;
    let subject = Descriptor::new(media::MANIFEST, m_digest.clone(), m_bytes.len() as u64);
    let mut ann = base_annotations(meta, &created);
    ann.extend(compat_annotations(&model_spec));
    ann.insert(PART_ANNOTATION.into(), "modelpack".into());
    ann.insert(annotation::REF_NAME.into(), modelpack_tag.clone());
    let modelpack_manifest = Manifest {
        schema_version: 2,
        media_type: media::MANIFEST.into(),
        artifact_type: Some(modelpack::ARTIFACT_TYPE.into()),
        config: Descriptor::new(
            modelpack::CONFIG,
            mp_config_digest,
            mp_config_bytes.len() as u64,
        ),
        layers: layer_descriptors(|weights| {
            if weights {
                modelpack::WEIGHT_TAR
            } else {
                modelpack::WEIGHT_CONFIG_TAR
            }
        }),
        subject: Some(subject),
        annotations: ann,
    };
    let mp_bytes = image::encode("manifest", &modelpack_manifest)?;
    let mp_digest = store.put(&mp_bytes)?;
    let mut mp_desc = Descriptor::new(media::MANIFEST, mp_digest.clone(), mp_bytes.len() as u64);
    mp_desc.artifact_type = Some(modelpack::ARTIFACT_TYPE.into());
    mp_desc
        .annotations
        .insert(annotation::REF_NAME.into(), modelpack_tag.clone());

    let model_report = TargetReport {
        id: t.id.clone(),
        tag: model_tag,
        manifest_digest: m_digest,
        manifest_size: m_bytes.len() as u64,
        config_digest: cfg_digest,
        layers: layers
            .into_iter()
            .map(|(path, weights, rec, hit)| super::LayerReport {
                role: role_of(&path, weights).to_string(),
                digest: rec.digest,
                diff_id: rec.diff_id,
                size: rec.size,
                media_type: rec.media_type,
                cache: hit.into(),
            })
            .collect(),
    };
    Ok((
        SplitReport {
            target: t.id.clone(),
            runtime: runtime_report,
            model: model_report,
            modelpack_tag,
            modelpack_digest: mp_digest,
        },
        vec![runtime_desc, model_desc, mp_desc],
    ))
}

/// ModelPack's name of a precision (`float16`…); none for those it has no name for.
pub(crate) fn modelpack_precision(p: infer_spec::engine::Precision) -> Option<&'static str> {
    use infer_spec::engine::Precision as P;
    match p {
        P::Fp32 | P::Tf32 => Some("float32"),
        P::Fp16 => Some("float16"),
        P::Bf16 => Some("bfloat16"),
        P::Int8 => Some("int8"),
        P::Fp8 => Some("float8_e4m3"),
        P::Fp4 => None,
    }
}

/// The `dev.infer-build.layer` role of a model file.
fn role_of(path: &str, weights: bool) -> &'static str {
    match path {
        _ if weights => "weights",
        "engine.json" => "engine-metadata",
        infer_spec::runtime::MODEL_CONFIG_FILE => "config",
        "tokenizer.json" => "tokenizer",
        "profile.json" => "profile",
        p if p.starts_with("warmup/") => "warmup",
        _ => "file",
    }
}

/// One file of a model directory, as a layer.
struct ModelFile {
    /// Its path inside the model directory.
    path: String,
    /// The engine or ONNX model (ModelPack's weight type), not a file describing it.
    weights: bool,
    entry: Entry,
}

/// The files of `m`'s directory, the weights first, then the others by path.
fn model_files(m: &ModelSpec) -> Result<Vec<ModelFile>, Error> {
    let prefix = format!("{}/", m.dir);
    let mut files = Vec::new();
    match &m.payload {
        Payload::Model { onnx } => {
            let size = super::file_size(onnx)?;
            files.push(ModelFile {
                path: "model.onnx".into(),
                weights: true,
                entry: Entry::file("model.onnx", 0o644, onnx.clone(), size),
            });
        }
        Payload::Engine {
            file,
            file_name,
            meta_json,
        } => {
            let size = super::file_size(file)?;
            files.push(ModelFile {
                path: file_name.clone(),
                weights: true,
                entry: Entry::file(file_name, 0o644, file.clone(), size),
            });
            files.push(ModelFile {
                path: "engine.json".into(),
                weights: false,
                entry: Entry::bytes("engine.json", 0o644, meta_json.clone()),
            });
        }
    }
    for (path, bytes) in &m.files {
        let Some(rel) = path.strip_prefix(&prefix) else {
            return Err(Error::Spec {
                what: format!(
                    "model {}: file {path} is outside its directory {}",
                    m.name, m.dir
                ),
            });
        };
        files.push(ModelFile {
            path: rel.to_string(),
            weights: false,
            entry: Entry::bytes(rel, 0o644, bytes.clone()),
        });
    }
    files[1..].sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_runtime_image_serves_whatever_is_mounted_with_its_server() {
        let text = String::from_utf8(runtime_toml()).unwrap();
        match infer_spec::RuntimeFile::from_toml_str(&text).unwrap() {
            infer_spec::RuntimeFile::Bundle(b) => {
                assert_eq!(b.server, None, "{text}");
                assert_eq!(b.models.len(), 1);
                assert_eq!(b.models[0].path, MOUNT);
            }
            other => panic!("not a bundle: {other:?}"),
        }
    }

    #[test]
    fn tags_and_names() {
        assert_eq!(PART_ANNOTATION, format!("{ANNOTATION_PREFIX}{PART}"));
        assert_eq!(RUNTIME_ANNOTATION, format!("{ANNOTATION_PREFIX}runtime"));
        assert_eq!(
            tags("1.0-cpu-fp32"),
            [
                "1.0-cpu-fp32-runtime".to_string(),
                "1.0-cpu-fp32-model".to_string(),
                "1.0-cpu-fp32-modelpack".to_string()
            ]
        );
        use infer_spec::engine::Precision as P;
        // ModelPack's vocabulary (docs/config.md of model-spec).
        for (p, name) in [
            (P::Fp32, Some("float32")),
            (P::Fp16, Some("float16")),
            (P::Bf16, Some("bfloat16")),
            (P::Int8, Some("int8")),
            (P::Fp8, Some("float8_e4m3")),
            (P::Fp4, None),
        ] {
            assert_eq!(modelpack_precision(p), name, "{p:?}");
        }
        for (path, weights, role) in [
            ("model.onnx", true, "weights"),
            ("engine.json", false, "engine-metadata"),
            ("runtime.toml", false, "config"),
            ("tokenizer.json", false, "tokenizer"),
            ("warmup/samples.json", false, "warmup"),
            ("profile.json", false, "profile"),
        ] {
            assert_eq!(role_of(path, weights), role, "{path}");
        }
    }

    #[test]
    fn model_files_are_relative_to_the_model_directory_weights_first() {
        let dir = tempfile::tempdir().unwrap();
        let engine = dir.path().join("model.onnx");
        std::fs::write(&engine, b"onnx").unwrap();
        let mut files = BTreeMap::new();
        for f in ["tokenizer.json", "runtime.toml", "warmup/samples.json"] {
            files.insert(
                format!("opt/infer/models/m/{f}"),
                std::sync::Arc::<[u8]>::from(f.as_bytes()),
            );
        }
        let m = ModelSpec {
            name: "m".into(),
            dir: "opt/infer/models/m".into(),
            payload: Payload::Engine {
                file: engine.clone(),
                file_name: "model.onnx".into(),
                meta_json: b"{}".to_vec(),
            },
            onnx: engine,
            files,
        };
        let got: Vec<(String, bool)> = model_files(&m)
            .unwrap()
            .into_iter()
            .map(|f| (f.path, f.weights))
            .collect();
        let want: Vec<(String, bool)> = [
            ("model.onnx", true),
            ("engine.json", false),
            ("runtime.toml", false),
            ("tokenizer.json", false),
            ("warmup/samples.json", false),
        ]
        .iter()
        .map(|(p, w)| (p.to_string(), *w))
        .collect();
        assert_eq!(got, want);
        // A file outside the directory is a bug to refuse, not to ship at the root.
        let mut bad = m.clone();
        bad.files
            .insert("etc/passwd".into(), std::sync::Arc::<[u8]>::from(&b"x"[..]));
        assert!(model_files(&bad).is_err());
    }
}
