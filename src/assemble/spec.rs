//! From a recipe and its plan to [`TargetSpec`]s: the image identity, the compatibility tuple
//! of each target and the `runtime.toml` the image carries. Pure: values in, values out (the
//! caller resolves files and finds the runtime binary).

use std::collections::BTreeMap;
use std::path::PathBuf;

use infer_spec::{
    BackendKind, EngineSection, MeasuredThreads, ModelSection, RuntimeConfig, Server, TensorSpec,
    Warmup,
};

use super::{paths, BaseRef, Error, ImageMeta, ModelSpec, Payload, TargetSpec};
use crate::oci::image::Platform;
use crate::plan::{BuildPlan, TargetKind, TargetPlan};
use crate::recipe::{Recipe, Tensor};

/// The image identity shared by all targets.
pub(crate) fn image_meta(recipe: &Recipe, plan: &BuildPlan) -> ImageMeta {
    ImageMeta {
        name: plan.model.clone(),
        version: plan.version.clone(),
        revision: None,
        source: None,
        repository: plan.repository.clone(),
        index_tag: plan.version.clone(),
        labels: recipe.image.labels.clone(),
        user: Some(recipe.image.user),
    }
}

/// The compatibility tuple of a target, keys without the `dev.infer-build.` prefix.
pub(crate) fn compat(t: &TargetPlan) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert(
        "kind".into(),
        if t.kind == TargetKind::Gpu {
            "gpu"
        } else {
            "cpu"
        }
        .to_string(),
    );
    m.insert("precision".into(), t.precision.to_string());
    m.insert("platform".into(), t.oci_platform.clone());
    if let Some(g) = &t.gpu {
        m.insert("gpu.sm".into(), g.sm.clone());
        m.insert(
            "gpu.compute_capability".into(),
            g.compute_capability.dotted().to_string(),
        );
        m.insert("gpu.products".into(), g.products.join(","));
    }
    if let Some(trt) = &t.tensorrt {
        m.insert("trt.version".into(), trt.version.to_string());
        m.insert("trt.build".into(), trt.build.clone());
        m.insert(
            "trt.version_compatible".into(),
            trt.version_compatible.to_string(),
        );
        if let Some(h) = trt.hardware_compat {
            let v = serde_json::to_value(h)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default();
            m.insert("trt.hardware_compat".into(), v);
        }
    }
    if let Some(c) = &t.cuda {
        m.insert("cuda.version".into(), c.to_string());
    }
    if let Some(d) = &t.driver_floor {
        m.insert("driver.floor".into(), d.to_string());
    }
    m
}

/// The OCI platform of a target (`linux/amd64` → os `linux`, architecture `amd64`).
pub(crate) fn platform(t: &TargetPlan) -> Platform {
    let mut parts = t.oci_platform.splitn(3, '/');
    let os = parts.next().unwrap_or("linux");
    let architecture = parts.next().unwrap_or("amd64");
    Platform {
        variant: parts.next().map(String::from),
        ..Platform::new(os, architecture)
    }
}

/// Names the variable non-batch dimensions of the runtime config's inputs after the model's
/// `dim_param`s (`names`: per input, one name per dimension including the batch one, as
/// [`crate::engine::onnx::OnnxSummary::input_dim_names`] gives them). Only variable dimensions
/// are named: their sizes are what requests must agree on.
pub(crate) fn name_dims(cfg: &mut RuntimeConfig, names: &[(String, Vec<String>)]) {
    for spec in &mut cfg.inputs {
        let Some((_, dims)) = names.iter().find(|(n, _)| *n == spec.name) else {
            continue;
        };
        if dims.len() != spec.dims.len() || !spec.is_variable() {
            continue;
        }
        let named: Vec<String> = spec
            .dims
            .iter()
            .zip(dims)
            .skip(1)
            .map(|(&d, n)| if d == -1 { n.clone() } else { String::new() })
            .collect();
        if named.iter().any(|n| !n.is_empty()) {
            spec.dim_names = named;
        }
    }
}

/// Bounds the integer inputs of the runtime config that index a table inside the model
/// (`rows`: per input, the table's rows, as
/// [`crate::engine::onnx::OnnxSummary::embedding_rows`] gives them) with `table_rows`, so the
/// runtime refuses an id past the table's end instead of handing it to the engine. Text
/// models' engine inputs (token ids, token types) are bounded the same way.
pub(crate) fn bound_table_inputs(cfg: &mut RuntimeConfig, rows: &[(String, i64)]) {
    for spec in &mut cfg.inputs {
        if !spec.datatype.is_integer() {
            continue;
        }
        let table = rows
            .iter()
            .filter(|(n, _)| *n == spec.name)
            .filter_map(|&(_, r)| u64::try_from(r).ok().filter(|&r| r > 0))
            .min();
        if let Some(r) = table {
            spec.table_rows = Some(r);
        }
    }
}

fn tensor(t: &Tensor) -> TensorSpec {
    TensorSpec {
        name: t.name.clone(),
        datatype: t.datatype,
        dims: t.shape.clone(),
        profile: t.profile.as_ref().map(|p| infer_spec::DimProfile {
            min: p.min.clone(),
            opt: p.opt.clone(),
            max: p.max.clone(),
        }),
        dim_names: Vec::new(),
        pad: t.pad,
        table_rows: None,
    }
}

/// The `runtime.toml` of a target whose engine file is at `engine_path` inside the image.
pub(crate) fn runtime_config(
    recipe: &Recipe,
    kind: BackendKind,
    engine_path: &str,
    metadata: Option<&str>,
) -> Result<RuntimeConfig, Error> {
    if recipe.model.outputs.is_empty() {
        return Err(Error::Spec {
            what: format!(
                "{}: list the model's outputs under [model.outputs.NAME]; the runtime needs them",
                recipe.file.display()
            ),
        });
    }
    let mut cfg = RuntimeConfig {
        model: ModelSection {
            name: recipe.model.name.clone(),
            version: recipe.model.version.clone(),
            platform: None,
        },
        inputs: recipe.model.inputs.iter().map(tensor).collect(),
        outputs: recipe.model.outputs.iter().map(tensor).collect(),
        batching: recipe.batching.clone(),
        engine: EngineSection {
            kind,
            path: Some(engine_path.into()),
            metadata: metadata.map(String::from),
            library: None,
            threads: None,
            measured: None,
            precision: None,
            synthetic: None,
        },
        warmup: Warmup {
            batch_sizes: Some(if recipe.warmup.enabled {
                recipe.warmup_batch_sizes()
            } else {
                vec![]
            }),
            // Set by `target_spec` once the samples are checked against the inputs.
            samples: None,
        },
        server: Server {
            drain_delay_s: recipe.deploy.drain_delay_s.into(),
            ..Server::default()
        },
        text: None,
        vision: None,
        response_cache: recipe
            .response_cache
            .map(|max_bytes| infer_spec::runtime::ResponseCache { max_bytes }),
    };
    // Its defaults depend on the outputs just resolved.
    cfg.text = recipe
        .text
        .as_ref()
        .map(|t| text_section(recipe, t, kind, &cfg))
        .transpose()?;
    cfg.vision = recipe
        .vision
        .as_ref()
        .map(|v| vision_section(recipe, v, &cfg))
        .transpose()?;
    let problems = cfg.problems();
    if !problems.is_empty() {
        return Err(Error::Spec {
            what: format!(
                "the runtime config would be invalid: {}",
                problems.join("; ")
            ),
        });
    }
    Ok(cfg)
}

/// Where the tokenizer travels: beside the model, in its layer.
pub(crate) fn tokenizer_path() -> String {
    format!("{}/tokenizer.json", paths::MODEL_DIR)
}

/// `[text] max_padding_percent` of a CPU engine when the recipe gives none: a CPU computes every
/// padded token, so a batch of mixed lengths can cost more than its requests one by one.
/// Measured on all-MiniLM-L6-v2 (ONNX Runtime, 2 threads, 256 short mixed texts batched in
/// arrival order, at most 16 rows): no bound 339 texts/s, 100% 405, 50% 505, 25% 541, 10%
/// 528, equal lengths only 499 (docs/BENCHMARKS.md). A GPU's cost barely grows with padding
/// up to its width: no bound there.
pub(crate) const DEFAULT_CPU_MAX_PADDING_PERCENT: u32 = 25;

/// `runtime.toml`'s `[text]` from the recipe's, with the defaults that depend on the model's
/// outputs applied and the section checked against the engine's tensors (errors name the
/// recipe's `[text]` table).
fn text_section(
    recipe: &Recipe,
    t: &crate::recipe::Text,
    kind: BackendKind,
    cfg: &RuntimeConfig,
) -> Result<infer_spec::text::Text, Error> {
    use infer_spec::text::Pooling;
    let output = match &t.output {
        Some(o) => o.value.clone(),
        None => cfg
            .outputs
            .first()
            .map(|o| o.name.clone())
            .unwrap_or_default(),
    };
    let rank = cfg
        .outputs
        .iter()
        .find(|o| o.name == output)
        .map_or(0, |o| o.dims.len());
    let section = infer_spec::text::Text {
        tokenizer: format!("/{}", tokenizer_path()),
        max_length: t.max_length,
        truncate: t.truncate,
        special_tokens: t.special_tokens,
        prefix: t.prefix.clone(),
        input_ids: t.input_ids.clone(),
        attention_mask: t.attention_mask.clone(),
        token_type_ids: t.token_type_ids.clone(),
        output,
        pooling: t.pooling.unwrap_or(if rank == 2 {
            Pooling::None
        } else {
            Pooling::Mean
        }),
        normalize: t.normalize,
        token_budget: t.token_budget,
        max_padding_percent: t.max_padding_percent.unwrap_or(match kind {
            BackendKind::TensorRt => 0,
            _ => DEFAULT_CPU_MAX_PADDING_PERCENT,
        }),
        pairs: t.pairs,
        activation: t.activation,
        labels: t.labels.clone(),
        max_client_batch_size: t.max_client_batch_size,
    };
    let problems = section.problems(&cfg.inputs, &cfg.outputs);
    if problems.is_empty() {
        return Ok(section);
    }
    let at = t
        .output
        .as_ref()
        .map_or_else(|| t.at.clone().map(|()| String::new()), Clone::clone);
    Err(Error::Spec {
        what: at.diagnostic(&recipe.file, problems.join("; ")).to_string(),
    })
}

/// `runtime.toml`'s `[vision]` from the recipe's: the output defaults to the model's first, and
/// the section is checked against the engine's tensors (errors name the recipe's `[vision]`
/// table, or its `output` key).
fn vision_section(
    recipe: &Recipe,
    v: &crate::recipe::Vision,
    cfg: &RuntimeConfig,
) -> Result<infer_spec::vision::Vision, Error> {
    let mut section = v.section.clone();
    if section.output.is_empty() {
        section.output = cfg
            .outputs
            .first()
            .map(|o| o.name.clone())
            .unwrap_or_default();
    }
    let problems = section.problems(&cfg.inputs, &cfg.outputs);
    if problems.is_empty() {
        return Ok(section);
    }
    let at = v
        .output
        .as_ref()
        .map_or_else(|| v.at.clone().map(|()| String::new()), Clone::clone);
    Err(Error::Spec {
        what: at.diagnostic(&recipe.file, problems.join("; ")).to_string(),
    })
}

/// Where a model's files go in its image, and how its `runtime.toml` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place<'a> {
    /// The one model of an image: files in [`paths::MODEL_DIR`], `runtime.toml` at
    /// [`paths::RUNTIME_TOML`] naming them by absolute path, warm-up samples in
    /// [`paths::CONFIG_DIR`] (the layout every one-model image has had).
    Single,
    /// A model of a bundle (named): everything in `opt/infer/models/<name>/`, its
    /// `runtime.toml` included, paths relative to that directory.
    Bundled(&'a str),
}

impl Place<'_> {
    /// The model's directory inside the image, without the leading `/`.
    pub(crate) fn dir(self) -> String {
        match self {
            Place::Single => paths::MODEL_DIR.to_string(),
            Place::Bundled(name) => format!("{}/{name}", paths::MODELS_DIR),
        }
    }

    /// Where `file` of the model's directory is inside the image, without the leading `/`.
    fn in_dir(self, file: &str) -> String {
        format!("{}/{file}", self.dir())
    }

    /// How the model's `runtime.toml` names `file` of its directory.
    fn config_ref(self, file: &str) -> String {
        match self {
            Place::Single => format!("/{}/{file}", paths::MODEL_DIR),
            Place::Bundled(_) => file.to_string(),
        }
    }

    /// The warm-up samples: (path inside the image, how `runtime.toml` names it).
    fn samples(self) -> (String, String) {
        const FILE: &str = "warmup/samples.json";
        match self {
            Place::Single => (
                format!("{}/{FILE}", paths::CONFIG_DIR),
                format!("/{}/{FILE}", paths::CONFIG_DIR),
            ),
            Place::Bundled(_) => (self.in_dir(FILE), FILE.to_string()),
        }
    }
}

/// Files a target ships, already checked by the caller.
#[derive(Debug, Clone)]
pub struct Files {
    pub serve_bin: PathBuf,
    /// The ONNX model (when no engine replaces it).
    pub model: PathBuf,
    /// A cached engine for this target: file and metadata JSON.
    pub engine: Option<(PathBuf, Vec<u8>)>,
    /// The engine's profile (`profile.json` of its cache entry): shipped beside the engine,
    /// and its start-up measurement becomes `dev.infer-build.startup.*` annotations.
    pub engine_profile: Option<Vec<u8>>,
    /// Warm-up samples (V2 JSON), shipped as `etc/infer/warmup/samples.json`.
    pub warmup_samples: Option<std::sync::Arc<[u8]>>,
    /// The tokenizer of a text model (`[text]`), shipped at `tokenizer_path`.
    pub tokenizer: Option<std::sync::Arc<[u8]>>,
    /// The model's input dimension names (see `name_dims`).
    pub dim_names: Vec<(String, Vec<String>)>,
    /// The rows of the tables the model's inputs index (see `bound_table_inputs`).
    pub table_rows: Vec<(String, i64)>,
    pub base: Option<BaseRef>,
    /// The native library the engine loads (ONNX Runtime, TensorRT's lean runtime): shipped as
    /// the runtime-libraries layer and named by `runtime.toml`'s `engine.library`.
    pub library: Option<LibraryFiles>,
}

/// A native library's files and the one the engine loads.
#[derive(Debug, Clone)]
pub struct LibraryFiles {
    /// (file on disk, absolute path inside the image).
    pub files: Vec<(PathBuf, String)>,
    /// Absolute path inside the image of the library the engine loads.
    pub load: String,
}

/// The spec of one target of a one-model image.
pub fn target_spec(recipe: &Recipe, t: &TargetPlan, files: Files) -> Result<TargetSpec, Error> {
    target_spec_at(recipe, t, files, Place::Single)
}

/// The spec of one target with the model's files at `place`. For [`Place::Bundled`] the
/// model's `runtime.toml`, samples and profile are in its [`ModelSpec::files`], and the spec's
/// own `runtime_toml` and `extra_files` are empty: [`bundle_spec`] joins such specs.
#[allow(
    clippy::too_many_lines,
    reason = "one TargetSpec field by field from the plan, the model's place deciding each"
)]
pub(crate) fn target_spec_at(
    recipe: &Recipe,
    t: &TargetPlan,
    files: Files,
    place: Place<'_>,
) -> Result<TargetSpec, Error> {
    let (payload, kind, engine_path, metadata) = match files.engine {
        Some((file, meta_json)) => {
            // The engine says what it is: a CPU engine is tract NNEF, or the ONNX itself when
            // NNEF did not load faster (or could not be written).
            let meta =
                infer_spec::engine::EngineMeta::from_json(&meta_json).map_err(|e| Error::Spec {
                    what: format!("engine metadata of target {}: {e}", t.id),
                })?;
            let kind =
                infer_spec::engine::backend_kind(meta.kind, meta.format).ok_or_else(|| {
                    Error::Spec {
                        what: format!(
                        "engine metadata of target {}: no runtime runs a {} engine in format {:?}",
                        t.id, meta.kind, meta.format
                    ),
                    }
                })?;
            let name = meta.format.file_name();
            let p = place.config_ref(name);
            let m = place.config_ref("engine.json");
            (
                Payload::Engine {
                    file,
                    file_name: name.into(),
                    meta_json,
                },
                kind,
                p,
                Some((m, meta)),
            )
        }
        None => (
            Payload::Model {
                onnx: files.model.clone(),
            },
            // A model without an engine runs in ONNX Runtime when its library ships, else tract.
            if files.library.is_some() {
                BackendKind::OnnxRuntime
            } else {
                BackendKind::TractOnnx
            },
            place.config_ref("model.onnx"),
            None,
        ),
    };
    // `runtime_config` checks the config it makes, and an onnxruntime engine is valid only
    // with its library: it is made as the tract kind, then given both (checked again below).
    // A TensorRT engine names the lean runtime it ships with (the full runtime of a CUDA base
    // is found by its soname).
    let engine_def = kind.engine();
    let library = match (engine_def.and_then(|d| d.library), &files.library) {
        (Some(_), Some(l)) => Some(l.load.clone()),
        _ => None,
    };
    let mut rc = runtime_config(
        recipe,
        if library.is_some() && engine_def.is_some_and(|d| d.library.is_some_and(|l| l.required)) {
            BackendKind::TractOnnx
        } else {
            kind
        },
        &engine_path,
        metadata.as_ref().map(|(path, _)| path.as_str()),
    )?;
    if library.is_some() {
        rc.engine.kind = kind;
        rc.engine.library = library;
        if engine_def.is_some_and(|d| d.threads) {
            // The recipe's threads, pinned; the engine stage's measurement, a hint the
            // runtime takes where an instance's share of the CPUs is the one measured.
            rc.engine.threads = recipe.engine.threads.as_ref().map(|t| t.value);
            rc.engine.measured = metadata
                .as_ref()
                .and_then(|(_, m)| m.cpu.as_ref())
                .and_then(|c| {
                    Some(MeasuredThreads {
                        threads: c.threads?,
                        share: c.share?,
                    })
                });
        }
        // A CPU target beyond FP32 (`cpu-bf16`): the precision the engine was gated in,
        // the one it computes in where the node's CPU has it.
        rc.engine.precision = metadata
            .as_ref()
            .filter(|(_, m)| m.precision != infer_spec::engine::Precision::Fp32)
            .and_then(|(_, m)| m.cpu.as_ref())
            .and_then(|c| c.gate.as_ref())
            // INT8 is in the model (Q/DQ), not a setting.
            .and_then(|g| engine_def.and_then(|d| d.setting(g.computed_in)));
    }
    name_dims(&mut rc, &files.dim_names);
    bound_table_inputs(&mut rc, &files.table_rows);
    if let Some(text) = &mut rc.text {
        text.tokenizer = place.config_ref("tokenizer.json");
    }
    let (samples_file, samples_ref) = place.samples();
    if let Some(bytes) = &files.warmup_samples {
        // Checked against the inputs the runtime will serve, so that no image ships a sample
        // its warm-up would refuse; the error names the recipe's key.
        let checked = std::str::from_utf8(bytes)
            .map_err(|_| "the file is not UTF-8 text".to_string())
            .and_then(|text| infer_spec::samples::check(&rc, text));
        if let Err(e) = checked {
            let what = match &recipe.warmup.samples {
                Some(l) => l
                    .diagnostic(
                        &recipe.file,
                        format!("{}: {e}", recipe.resolve(&l.value).display()),
                    )
                    .to_string(),
                None => format!("warm-up samples: {e}"),
            };
            return Err(Error::Spec { what });
        }
        rc.warmup.samples = Some(samples_ref);
    }
    let problems = rc.problems();
    if !problems.is_empty() {
        return Err(Error::Spec {
            what: format!(
                "the runtime config would be invalid: {}",
                problems.join("; ")
            ),
        });
    }
    // An engine's own tuple (digests, shape profile, builder GPU…) completes the plan's.
    let mut compat = compat(t);
    if let Some((_, meta)) = &metadata {
        compat.extend(meta.annotations());
    }
    if let Some(text) = &rc.text {
        compat.extend(text.annotations());
        // Where the tokenizer is in the image, not how its model's config names it.
        compat.insert(
            "text.tokenizer".into(),
            format!("/{}", place.in_dir("tokenizer.json")),
        );
    }
    if let Some(vision) = &rc.vision {
        compat.extend(vision.annotations());
    }
    let mut extra = BTreeMap::new();
    if let Some(bytes) = files.engine_profile {
        let profile =
            infer_spec::engine::EngineProfile::from_json(&bytes).map_err(|e| Error::Spec {
                what: format!("engine profile of target {}: {e}", t.id),
            })?;
        compat.extend(startup_annotations(&profile));
        extra.insert(place.in_dir("profile.json"), bytes.into());
    }
    if let Some(s) = files.warmup_samples {
        extra.insert(samples_file, s);
    }
    let mut model_files = BTreeMap::new();
    match (&rc.text, files.tokenizer) {
        (Some(_), Some(bytes)) => {
            model_files.insert(place.in_dir("tokenizer.json"), bytes);
        }
        (Some(_), None) => {
            return Err(Error::Spec {
                what: format!(
                    "target {}: [text] names a tokenizer that was not read",
                    t.id
                ),
            })
        }
        _ => {}
    }
    let mut runtime_toml = rc.to_toml_string().into_bytes();
    if let Place::Bundled(_) = place {
        model_files.append(&mut extra);
        model_files.insert(
            place.in_dir(infer_spec::runtime::MODEL_CONFIG_FILE),
            std::mem::take(&mut runtime_toml).into(),
        );
    }
    Ok(TargetSpec {
        id: t.id.clone(),
        tag: t.tag.clone(),
        platform: platform(t),
        kind: t.kind,
        base: files.base,
        runtime_libs: files
            .library
            .map(|l| {
                l.files
                    .into_iter()
                    .map(|(src, dest)| (src, dest.trim_start_matches('/').to_string()))
                    .collect()
            })
            .unwrap_or_default(),
        serve_bin: files.serve_bin,
        models: vec![ModelSpec {
            name: recipe.model.name.clone(),
            dir: place.dir(),
            payload,
            onnx: files.model,
            files: model_files,
        }],
        runtime_toml,
        extra_files: extra,
        compat,
        split: None,
    })
}

/// One target's image of a bundle, from each model's spec of that target (made with
/// [`Place::Bundled`], in the bundle's order; `tag` is the bundle's). The models share one
/// runtime, base and runtime libraries: a CPU image where some models run on ONNX Runtime
/// takes their glibc base, dynamic runtime and library for all (that runtime runs tract too);
/// any other difference is refused, naming the models. `/etc/infer/runtime.toml` is an
/// [`infer_spec::Bundle`] naming each model's directory; its `[server]` drains for
/// `drain_delay_s` (the bundle file's `[deploy]`).
///
/// The compatibility tuple keeps each key the models agree on; a key they do not agree on
/// (an engine digest, a text setting) is kept per model as `model.<name>.<key>`. `models` lists
/// the names, and `startup.engine-load-ms` is the sum of the models' (they load in turn).
pub(crate) fn bundle_spec(
    tag: &str,
    drain_delay_s: u32,
    parts: Vec<TargetSpec>,
) -> Result<TargetSpec, Error> {
    let Some(first) = parts.first() else {
        return Err(Error::NoTargets);
    };
    let id = first.id.clone();
    let names: Vec<String> = parts
        .iter()
        .flat_map(|p| p.models.iter().map(|m| m.name.clone()))
        .collect();
    // The image's runtime: one that every model can run on.
    let runs_all = parts
        .iter()
        .find(|p| !p.runtime_libs.is_empty() && p.kind == TargetKind::Cpu)
        .unwrap_or(first);
    for p in &parts {
        let name = p.models.first().map_or("", |m| m.name.as_str());
        let theirs = runs_all.models.first().map_or("", |m| m.name.as_str());
        let same_base = match (&p.base, &runs_all.base) {
            (None, None) => true,
            (Some(a), Some(b)) => a.layout == b.layout && a.tag == b.tag,
            _ => false,
        };
        // A tract model (static runtime, no base, no library) runs on an ONNX Runtime
        // model's image; the reverse and anything else must match exactly.
        let tract_on_glibc =
            p.kind == TargetKind::Cpu && p.runtime_libs.is_empty() && p.base.is_none();
        let differs = if p.platform != runs_all.platform || p.kind != runs_all.kind {
            Some("platform".to_string())
        } else if tract_on_glibc {
            None
        } else if p.serve_bin != runs_all.serve_bin {
            Some(format!(
                "runtime {} vs {}",
                p.serve_bin.display(),
                runs_all.serve_bin.display()
            ))
        } else if !same_base {
            Some("base image".to_string())
        } else if p.runtime_libs != runs_all.runtime_libs {
            Some("runtime libraries (another TensorRT or ONNX Runtime version?)".to_string())
        } else {
            None
        };
        if let Some(what) = differs {
            return Err(Error::Spec {
                what: format!(
                    "target {id}: models {name:?} and {theirs:?} of the bundle need different images ({what}); the models of a bundle share one runtime, base and library per target: pin the same versions in their recipes"
                ),
            });
        }
    }
    // The tuple: shared keys as they are, the others per model.
    let mut compat = BTreeMap::new();
    let keys: std::collections::BTreeSet<&String> =
        parts.iter().flat_map(|p| p.compat.keys()).collect();
    for key in keys {
        let values: Vec<Option<&String>> = parts.iter().map(|p| p.compat.get(key)).collect();
        let all_same = values.iter().all(|v| v.is_some() && *v == values[0]);
        if all_same && !key.starts_with("startup.") {
            if let Some(v) = values[0] {
                compat.insert(key.clone(), v.clone());
            }
            continue;
        }
        for (p, v) in parts.iter().zip(&values) {
            if let (Some(v), Some(m)) = (v, p.models.first()) {
                compat.insert(format!("model.{}.{key}", m.name), (*v).clone());
            }
        }
    }
    let loads: Option<Vec<f64>> = parts
        .iter()
        .map(|p| p.compat.get("startup.engine-load-ms")?.parse().ok())
        .collect();
    if let Some(loads) = loads {
        compat.insert(
            "startup.engine-load-ms".into(),
            format!("{:.1}", loads.iter().sum::<f64>()),
        );
    }
    compat.insert("models".into(), names.join(","));
    let server = Server {
        drain_delay_s: drain_delay_s.into(),
        ..Server::default()
    };
    let bundle = infer_spec::Bundle {
        server: Some(server),
        models: parts
            .iter()
            .flat_map(|p| &p.models)
            .map(|m| infer_spec::BundleModel {
                path: format!("/{}", m.dir),
            })
            .collect(),
    };
    let problems = bundle.problems();
    if !problems.is_empty() {
        return Err(Error::Spec {
            what: format!(
                "the bundle's runtime config would be invalid: {}",
                problems.join("; ")
            ),
        });
    }
    let runs_all = runs_all.clone();
    Ok(TargetSpec {
        id,
        tag: tag.to_string(),
        platform: runs_all.platform,
        kind: runs_all.kind,
        base: runs_all.base,
        runtime_libs: runs_all.runtime_libs,
        serve_bin: runs_all.serve_bin,
        models: parts.into_iter().flat_map(|p| p.models).collect(),
        runtime_toml: bundle.to_toml_string().into_bytes(),
        extra_files: BTreeMap::new(),
        compat,
        split: None,
    })
}

/// The start-up measurement of an engine profile as tuple keys (`startup.engine-load-ms`,
/// milliseconds): what the warm-up manifest and the deploy generator read back from the image.
pub(crate) fn startup_annotations(
    p: &infer_spec::engine::EngineProfile,
) -> BTreeMap<String, String> {
    use infer_spec::engine::EngineFormat;
    let mut m = BTreeMap::new();
    if let Some(s) = &p.startup {
        let load = match s.chosen {
            EngineFormat::TractNnefTar => s.nnef_ms.unwrap_or(s.onnx_ms),
            EngineFormat::Onnx | EngineFormat::TensorrtPlan => s.onnx_ms,
        };
        m.insert("startup.engine-load-ms".into(), format!("{load:.1}"));
        m.insert("startup.onnx-load-ms".into(), format!("{:.1}", s.onnx_ms));
        if let Some(n) = s.nnef_ms {
            m.insert("startup.nnef-load-ms".into(), format!("{n:.1}"));
        }
    }
    // The measured CPU engine choice: policy, what shipped, and each candidate's summed T(b).
    if let Some(sel) = &p.selection {
        let sums: Vec<String> = sel
            .candidates
            .iter()
            .map(|c| match &c.error {
                Some(_) => format!("{}=no-load", c.kind),
                None => format!(
                    "{}={:.1}us",
                    c.kind,
                    c.batches.iter().map(|b| b.median_us).sum::<f64>()
                ),
            })
            .collect();
        m.insert(
            "engine.selection".into(),
            format!("{} -> {} ({})", sel.policy, sel.chosen, sums.join(" ")),
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(src: &str) -> Recipe {
        crate::recipe::parse(src, std::path::Path::new("recipe.toml")).unwrap()
    }

    /// The `runtime.toml` of `recipe`'s CPU target (tract on its ONNX), its inputs bounded by
    /// `rows`.
    fn bounded(recipe: &Recipe, rows: &[(String, i64)]) -> RuntimeConfig {
        let mut cfg = runtime_config(
            recipe,
            BackendKind::TractOnnx,
            "/opt/infer/model/model.onnx",
            None,
        )
        .unwrap();
        bound_table_inputs(&mut cfg, rows);
        cfg
    }

    #[test]
    fn integer_inputs_that_index_a_table_are_bounded_by_its_rows() {
        let r = recipe(
            "[model]\nname = \"m\"\nversion = \"1\"\nonnx = \"m.onnx\"\n\
             [model.inputs.ids]\ndatatype = \"int64\"\nshape = [-1, 8]\n\
             [model.inputs.mask]\ndatatype = \"int32\"\nshape = [-1, 8]\n\
             [model.inputs.scale]\ndatatype = \"fp32\"\nshape = [-1, 8]\n\
             [model.outputs.y]\ndatatype = \"fp32\"\nshape = [-1, 4]\n",
        );
        let rows = |v: &[(&str, i64)]| -> Vec<(String, i64)> {
            v.iter().map(|&(n, r)| (n.to_string(), r)).collect()
        };
        // The smallest table an input indexes; a float input is never bounded (the graph
        // casts it, the runtime checks only integers), nor a table of no rows.
        let cfg = bounded(
            &r,
            &rows(&[
                ("ids", 100),
                ("ids", 60),
                ("scale", 5),
                ("mask", 0),
                ("gone", 3),
            ]),
        );
        let got: Vec<(&str, Option<u64>)> = cfg
            .inputs
            .iter()
            .map(|i| (i.name.as_str(), i.table_rows))
            .collect();
        assert_eq!(got, [("ids", Some(60)), ("mask", None), ("scale", None)]);
        assert!(cfg.problems().is_empty(), "{:?}", cfg.problems());
        assert!(cfg.to_toml_string().contains("table_rows = 60\n"));
        // Nothing indexes a table: the config's bytes are those of before.
        let plain = bounded(&r, &[]);
        assert!(!plain.to_toml_string().contains("table_rows"));
    }

    /// The spec of a text recipe's CPU target whose `[text]` ends with `extra`.
    fn text_target(extra: &str) -> TargetSpec {
        let r = recipe(&format!(
            "[model]\nname = \"m\"\nversion = \"1\"\nonnx = \"m.onnx\"\n\
             [model.inputs.input_ids]\ndatatype = \"int64\"\nshape = [-1, -1]\n\
             profile = {{ min = [1], opt = [16], max = [128] }}\n\
             [model.outputs.y]\ndatatype = \"fp32\"\nshape = [-1, 8]\n\
             [text]\ntokenizer = \"tokenizer.json\"\n{extra}"
        ));
        let matrix = crate::matrix::load(None).unwrap();
        let plan = crate::plan::resolve(&r, &matrix, None).unwrap();
        let files = Files {
            serve_bin: "infer-serve".into(),
            model: "m.onnx".into(),
            engine: None,
            engine_profile: None,
            warmup_samples: None,
            tokenizer: Some(std::sync::Arc::from(&b"{}"[..])),
            dim_names: Vec::new(),
            table_rows: vec![("input_ids".into(), 30522)],
            base: None,
            library: None,
        };
        target_spec(&r, &plan.targets[0], files).unwrap()
    }

    /// `[text] max_client_batch_size` reaches `runtime.toml`'s `[text]` and the image's
    /// annotations (`inspect` shows them); the default is written to neither, so the images of
    /// recipes without the key keep their bytes.
    #[test]
    fn max_client_batch_size_reaches_the_runtime_config_and_the_annotations() {
        let set = text_target("max_client_batch_size = 64\n");
        let cfg =
            RuntimeConfig::from_toml_str(std::str::from_utf8(&set.runtime_toml).unwrap()).unwrap();
        assert_eq!(cfg.text.as_ref().unwrap().max_client_batch_size, 64);
        assert_eq!(set.compat["text.max_client_batch_size"], "64");
        // A text model's token ids are bounded like any integer input.
        assert_eq!(cfg.inputs[0].table_rows, Some(30522));
        let default = text_target("");
        let toml = String::from_utf8(default.runtime_toml.clone()).unwrap();
        assert!(!toml.contains("max_client_batch_size"), "{toml}");
        assert!(!default.compat.contains_key("text.max_client_batch_size"));
        let cfg = RuntimeConfig::from_toml_str(&toml).unwrap();
        assert_eq!(
            cfg.text.unwrap().max_client_batch_size,
            infer_spec::text::DEFAULT_MAX_CLIENT_BATCH_SIZE
        );
    }

    /// The shipped MiniLM recipe's stand-in model gathers `input_ids` from word embeddings of
    /// 30522 rows (BERT's vocabulary): its `runtime.toml` says so, from the model's summary;
    /// the example MLP indexes nothing, so its `runtime.toml` (and image) keep their bytes.
    #[test]
    fn the_minilm_recipe_bounds_its_ids_by_its_embedding_table() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let summary = |onnx: &str| {
            crate::engine::onnx::OnnxSummary::from_bytes(&std::fs::read(root.join(onnx)).unwrap())
                .unwrap()
        };
        let minilm = crate::recipe::load(&root.join("recipes/minilm.toml")).unwrap();
        let s = summary("recipes/models/minilm.onnx");
        assert_eq!(s.embedding_rows, [("input_ids".to_string(), 30522)]);
        let cfg = bounded(&minilm, &s.embedding_rows);
        let ids = cfg.inputs.iter().find(|i| i.name == "input_ids").unwrap();
        assert_eq!(ids.table_rows, Some(30522));
        assert!(cfg.to_toml_string().contains("table_rows = 30522\n"));
        let mlp = crate::recipe::load(&root.join("examples/mlp/recipe.toml")).unwrap();
        let s = summary("examples/mlp/mlp.onnx");
        assert!(s.embedding_rows.is_empty());
        assert_eq!(
            bounded(&mlp, &s.embedding_rows).to_toml_string(),
            bounded(&mlp, &[]).to_toml_string()
        );
    }
}
