//! The engine stage: build one target's engine into the content-addressed engine cache, and find
//! and verify engines built elsewhere.
//!
//! Owns: the cache key (`key`), the on-disk cache (`cache`), the CPU engine with tract
//! (`tract`), the TensorRT engine through trtexec and Polygraphy (`tensorrt`, `trtexec`,
//! `polygraphy`), the builder-side GPU check (`gpu`) and the engine metadata and profile it
//! writes (types in `infer_spec::engine`).
//!
//! Must not: spawn processes except through [`crate::process::Runner`]; read the recipe or the
//! matrix itself (it takes an [`EngineSpec`] of plain values, made by `adapt::spec`); write anywhere but
//! the cache (entries appear atomically, see `cache`).

pub(crate) mod accuracy;
pub(crate) mod adapt;
pub(crate) mod cache;
pub(crate) mod convert;
pub(crate) mod evaluation;
pub(crate) mod gpu;
pub(crate) mod key;
pub(crate) mod onnx;
pub(crate) mod onnxruntime;
pub(crate) mod openvino;
pub(crate) mod polygraphy;
pub(crate) mod pyenv;
pub(crate) mod select;
pub(crate) mod spec;
pub(crate) mod tensorrt;
pub(crate) mod timing;
pub(crate) mod tract;
pub(crate) mod trtexec;

use std::path::{Path, PathBuf};

use infer_spec::engine::{
    CpuEngine, CpuIsa, CpuMeta, EngineFormat, EngineKind, EngineMeta, EngineProfile, GpuMeta,
    MetaError, TimedBy, META_FILE, META_SCHEMA, PROFILE_FILE,
};

pub use cache::digest_file;
pub use cache::{Cache, Entry};
pub use key::{KeyMaterial, TOOL_VERSION};
pub use onnxruntime::OrtError;
pub use polygraphy::LOADER_SCRIPT;
pub use spec::{
    Calibration, DimRanges, EngineSpec, InputSpec, LibraryCandidate, Toolchain, TrtSpec,
};

use crate::process::Runner;
use key::{BackendKey, KEY_SCHEME};

/// Errors of the `engine` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot access {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read the onnx model {path}: {reason}")]
    Onnx { path: PathBuf, reason: String },
    #[error("target {target}, input `{input}`: {reason}")]
    Input {
        target: String,
        input: String,
        reason: String,
    },
    #[error(
        "target {target}: the model does not load in tract with the declared inputs: {reason}"
    )]
    Tract { target: String, reason: String },
    #[error("target {target}: no CPU engine loads the model with the declared inputs:\n{reasons}")]
    NoCpuEngine {
        target: String,
        /// One line per engine tried, `  tract: why`.
        reasons: String,
    },
    #[error(
        "target {target}: {title} does not load the model (engine.cpu = \"{name}\"): {reason}"
    )]
    Forced {
        target: String,
        /// The engine's title and name ([`infer_spec::engines::EngineDef`]).
        title: &'static str,
        name: &'static str,
        reason: String,
    },
    #[error("TensorRT {version} is not supported (8.6, 10.x and 11.x are)")]
    UnsupportedTensorrt { version: String },
    #[error("target {target} with TensorRT {tensorrt}: {reason}")]
    Precision {
        target: String,
        tensorrt: String,
        reason: String,
    },
    #[error("invalid {flag} `{value}`: {reason}")]
    Flag {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("cannot build target {target} on {gpu}: {reason}")]
    GpuMismatch {
        target: String,
        gpu: String,
        reason: String,
    },
    #[error(transparent)]
    Process(#[from] crate::process::Error),
    #[error("`{command}` failed (exit {}){}", code.map(|c| c.to_string()).unwrap_or_else(|| "by signal".into()), if tail.is_empty() { String::new() } else { format!(":\n{tail}") })]
    Tool {
        command: String,
        code: Option<i32>,
        tail: String,
    },
    #[error("unexpected output from {tool}: {reason}")]
    ToolOutput { tool: &'static str, reason: String },
    #[error("trtexec is TensorRT {found}, the target's plan needs {expected}: run the build in the matching builder image")]
    TrtexecVersion { expected: String, found: String },
    #[error("unusable engine metadata {path}")]
    Meta {
        path: PathBuf,
        #[source]
        source: MetaError,
    },
    #[error("corrupt engine cache entry {path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error(transparent)]
    NoCacheDir(#[from] crate::cache::NoCacheDir),
    #[error("no engine for target {target} in {dir}: {reason}")]
    NotFound {
        target: String,
        dir: PathBuf,
        reason: String,
    },
    #[error("the engine in {path} does not match target {target}: {differences}")]
    Mismatch {
        target: String,
        path: PathBuf,
        differences: String,
    },
    #[error("precision conversion: {reason}")]
    Convert { reason: String },
    #[error("target {target}: converting the model to {precision} failed:\n{tail}")]
    ConvertFailed {
        target: String,
        precision: String,
        tail: String,
    },
    #[error("target {target}: the {precision} model fails the accuracy gate ({failures}); against FP32 on {evaluation}:\n  {figures}")]
    Accuracy {
        target: String,
        precision: String,
        failures: String,
        evaluation: String,
        figures: String,
    },
    /// The builder's CPU cannot compute in the target's precision (BF16 without AVX-512 BF16 or
    /// AMX): the target is built on a machine that can, as a GPU target is on its GPU.
    #[error("target {target}: {reason}")]
    CpuPrecision { target: String, reason: String },
    #[error("target {target} needs a GPU to build its TensorRT engine ({reason}); run `infer-build engine` on a {sm} GPU runner{}", if converted.is_empty() { String::new() } else { format!(" (the converted model is cached: {converted})") })]
    NoGpu {
        target: String,
        sm: String,
        reason: String,
        converted: String,
    },
    #[error("engine.convert = \"modelopt\" needs a Python with nvidia-modelopt, torch, onnx and onnxruntime (NVIDIA's TensorRT containers have them), and `{python}` cannot import them: {reason}\nhint: set INFER_BUILD_MODELOPT_PYTHON to such an interpreter, or drop engine.convert to use the builtin converter (no torch needed)")]
    NoModelOpt { python: String, reason: String },
    #[error("target {target}: output `{output}` has a shape that depends on the input values (from {op}), which the TensorRT runtime cannot size before a batch runs; serve the model on a CPU target, move {op} out of the model (into post-processing), or, if the output's dimensions do follow from the inputs, declare them in the ONNX file with the inputs' dimension names")]
    DataDependentOutput {
        target: String,
        output: String,
        op: String,
    },
    #[error("internal error: {0}")]
    Internal(&'static str),
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::Onnx { .. }
                | Error::Input { .. }
                | Error::Tract { .. }
                | Error::NoCpuEngine { .. }
                | Error::Forced { .. }
                | Error::UnsupportedTensorrt { .. }
                | Error::Precision { .. }
                | Error::Flag { .. }
                | Error::NoCacheDir(_)
                | Error::NotFound { .. }
                | Error::Mismatch { .. }
                | Error::Accuracy { .. }
                | Error::DataDependentOutput { .. }
        )
    }
}

/// An engine in a cache or a directory of engines, with its metadata and profile.
#[derive(Debug, Clone)]
pub struct EngineArtifact {
    /// The cache key.
    pub key: String,
    /// The entry directory (engine file, `meta.json`, `profile.json`).
    pub dir: PathBuf,
    /// The engine file.
    pub engine: PathBuf,
    pub meta: EngineMeta,
    pub profile: EngineProfile,
    /// True when the engine was already there and nothing was built.
    pub cached: bool,
}

impl EngineArtifact {
    fn from_entry(e: Entry, cached: bool) -> EngineArtifact {
        EngineArtifact {
            key: e.meta.cache_key.clone(),
            engine: e.engine_path(),
            dir: e.dir,
            meta: e.meta,
            profile: e.profile,
            cached,
        }
    }
}

/// Read a model or calibration file: a regular file (a directory or FIFO is refused naming
/// it), at most 4 GiB (protobuf's own limit is 2 GiB).
fn read(path: &Path) -> Result<Vec<u8>, Error> {
    crate::oci::dir::read_file(path, 4 << 30, "model input").map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e.into_io(),
    })
}

/// `sha256:<hex>` of a calibration input: a cache file's bytes, or for a directory the sorted
/// list of (relative path, file digest) of the files in it.
pub(crate) fn calibration_digest(c: &Calibration) -> Result<String, Error> {
    match c {
        Calibration::Cache(p) => Ok(crate::oci::Digest::of(&read(p)?).to_string()),
        Calibration::Data(dir) => {
            let mut files = Vec::new();
            for e in walkdir::WalkDir::new(dir).sort_by_file_name() {
                let e = e.map_err(|e| Error::Io {
                    path: dir.clone(),
                    source: e.into(),
                })?;
                if e.file_type().is_file() {
                    let rel = e.path().strip_prefix(dir).unwrap_or(e.path());
                    files.push(format!(
                        "{} {}",
                        rel.to_string_lossy(),
                        cache::digest_file(e.path())?
                    ));
                }
            }
            if files.is_empty() {
                return Err(Error::Input {
                    target: "-".into(),
                    input: dir.display().to_string(),
                    reason: "the directory holds no files (calibration and evaluation data are batches in files)".into(),
                });
            }
            Ok(crate::oci::Digest::of(files.join("\n").as_bytes()).to_string())
        }
    }
}

/// The key material for `spec`, given the ONNX digest.
pub fn key_material(spec: &EngineSpec, onnx_digest: &str) -> Result<KeyMaterial, Error> {
    let backend = match &spec.toolchain {
        Toolchain::Cpu => BackendKey::Tract {
            tract: tract::TRACT_VERSION.into(),
            // ONNX Runtime's version when it is a candidate, or (under `tract`) may fold the
            // model, and OpenVINO's when it is a candidate: each can change the engine.
            cpu_engine: match (&spec.onnxruntime, &spec.openvino, &spec.folding) {
                (Some(c), _, _) | (None, Some(c), _) if c.forced => Some(CpuEngine::Only(c.kind)),
                (Some(_), _, _) | (None, Some(_), _) => Some(CpuEngine::Auto),
                (None, None, Some(_)) => Some(CpuEngine::TRACT),
                (None, None, None) => None,
            },
            onnxruntime: match (&spec.onnxruntime, &spec.folding) {
                (Some(c), _) => Some(c.version.to_string()),
                (None, Some(f)) => Some(f.version.to_string()),
                (None, None) => None,
            },
            openvino: spec.openvino.as_ref().map(|c| c.version.to_string()),
            threads: spec
                .onnxruntime
                .iter()
                .chain(&spec.openvino)
                .find(|c| c.given)
                .map(|c| c.threads as u32),
        },
        Toolchain::Tensorrt(trt) => BackendKey::Tensorrt {
            tensorrt: trt.tensorrt.to_string(),
            cuda: trt.cuda.to_string(),
            sm: trt.sm.sm().to_string(),
            driver_floor: trt.driver_floor.to_string(),
            builder_flags: tensorrt::key_flags(spec, trt)?,
            calibration: trt
                .calibration
                .as_ref()
                .map(calibration_digest)
                .transpose()?,
        },
    };
    Ok(KeyMaterial {
        scheme: KEY_SCHEME.into(),
        tool: TOOL_VERSION.into(),
        onnx: onnx_digest.into(),
        target: spec.target.clone(),
        precision: spec.precision,
        shape_profile: spec.shape_profile()?,
        batch_sizes: spec.planned_batches(),
        backend,
        conversion: spec
            .convert
            .as_ref()
            .map(|c| convert::key(spec, c, onnx_digest))
            .transpose()?,
        gate: spec
            .gate
            .as_ref()
            .map(|g| -> Result<String, Error> {
                let t = &g.thresholds;
                Ok(format!(
                    "max_abs={:?} max_rel={:?} min_top1={:?} evaluation={}",
                    t.max_abs,
                    t.max_rel,
                    t.min_top1,
                    match &g.evaluation {
                        Some(d) => calibration_digest(&Calibration::Data(d.clone()))?,
                        None => "generated".into(),
                    }
                ))
            })
            .transpose()?,
    })
}

/// A target's model, ready for the engine build: the recipe's ONNX, and the converted one when
/// the target converts (already through the accuracy gate).
#[derive(Debug)]
pub(crate) struct Prepared {
    onnx_bytes: Vec<u8>,
    onnx_digest: String,
    pub converted: Option<convert::Converted>,
}

/// Read the model and, for targets that convert, convert it (or find the conversion in the
/// cache) and apply the accuracy gate. Runs on any machine: no GPU is involved.
pub(crate) fn prepare(
    spec: &EngineSpec,
    cache: &Cache,
    runner: &dyn Runner,
) -> Result<Prepared, Error> {
    let onnx_bytes = read(&spec.onnx)?;
    let onnx_digest = crate::oci::Digest::of(&onnx_bytes).to_string();
    if matches!(spec.toolchain, Toolchain::Tensorrt(_)) {
        // Before a conversion spends minutes on a model TensorRT targets cannot serve; a model
        // that does not parse is refused, with the reason, where the engine is built.
        if let Ok(summary) = onnx::OnnxSummary::from_bytes(&onnx_bytes) {
            tensorrt::refuse_data_dependent(&spec.target, &summary)?;
        }
    }
    let converted = match &spec.convert {
        Some(c) => {
            let conv = convert::convert(
                spec,
                c,
                &onnx_digest,
                cache,
                &pyenv::root_for(cache),
                runner,
            )?;
            let failures = accuracy::failures(&conv.report.outputs, &c.thresholds);
            if !failures.is_empty() {
                return Err(Error::Accuracy {
                    target: spec.target.clone(),
                    precision: spec.precision.to_string(),
                    failures: failures.join("; "),
                    evaluation: evaluation_text(&conv.report),
                    figures: [conv.report.summary(), conv.report.steps()]
                        .concat()
                        .join("\n  "),
                });
            }
            Some(conv)
        }
        _ => None,
    };
    Ok(Prepared {
        onnx_bytes,
        onnx_digest,
        converted,
    })
}

/// What a report's figures were measured on, in words.
pub(crate) fn evaluation_text(r: &convert::Report) -> String {
    let source = r.evaluation["source"].as_str().unwrap_or("?");
    match r.evaluation["batches"].as_u64() {
        Some(n) => format!("{source}, {n} batches"),
        None => source.to_string(),
    }
}

/// Build `spec`'s engine into `cache`, or return the cached one when the key is present.
pub fn build(
    spec: &EngineSpec,
    cache: &Cache,
    runner: &dyn Runner,
) -> Result<EngineArtifact, Error> {
    let prepared = prepare(spec, cache, runner)?;
    build_prepared(spec, prepared, cache, runner)
}

/// [`build`] after [`prepare`].
pub(crate) fn build_prepared(
    spec: &EngineSpec,
    prepared: Prepared,
    cache: &Cache,
    runner: &dyn Runner,
) -> Result<EngineArtifact, Error> {
    let Prepared {
        onnx_bytes,
        onnx_digest,
        converted,
    } = prepared;
    let material = key_material(spec, &onnx_digest)?;
    let key = material.key();
    if let Some(e) = cache.get(&key)? {
        return Ok(EngineArtifact::from_entry(e, true));
    }
    let _lock = cache.lock(&key)?;
    // Another process may have finished the same key while we waited for the lock.
    if let Some(e) = cache.get(&key)? {
        return Ok(EngineArtifact::from_entry(e, true));
    }
    cache.clean_stale(&key)?;
    let staging = cache.stage(&key)?;
    let dir = staging.path().to_path_buf();

    let shape_profile = spec.shape_profile()?;
    let made = match &spec.toolchain {
        Toolchain::Cpu => make_cpu(spec, &onnx_bytes, converted.as_ref(), &dir)?,
        Toolchain::Tensorrt(trt) => make_tensorrt(
            spec,
            trt,
            onnx_bytes,
            converted.as_ref(),
            &dir,
            cache,
            runner,
        )?,
    };
    if !made.log.is_empty() {
        cache::write_atomic(&dir.join("build.log"), made.log.as_bytes())?;
    }
    let engine_path = dir.join(made.format.file_name());
    let (engine_digest, engine_size) = cache::measure_file(&engine_path)?;
    let kind = made.kind;
    let meta = EngineMeta {
        schema: META_SCHEMA,
        kind,
        format: made.format,
        target: spec.target.clone(),
        precision: spec.precision,
        shape_profile,
        onnx_digest,
        engine_digest: engine_digest.clone(),
        engine_size,
        cache_key: key.clone(),
        builder_version: TOOL_VERSION.into(),
        gpu: made.gpu,
        cpu: made.cpu,
        conversion: converted.as_ref().map(conversion_meta),
    };
    let profile = EngineProfile {
        schema: META_SCHEMA,
        target: spec.target.clone(),
        kind,
        engine_digest,
        source: TimedBy::of(kind),
        measured_on: made.measured_on,
        batches: made.batches,
        startup: made.startup,
        selection: made.selection,
    };
    cache::write_atomic(&dir.join(PROFILE_FILE), &profile.to_canonical_json())?;
    // meta.json last: an entry with metadata is complete.
    cache::write_atomic(&dir.join(META_FILE), &meta.to_canonical_json())?;
    let final_dir = staging.commit()?;
    let entry = Entry::read(&final_dir)?;
    Ok(EngineArtifact::from_entry(entry, false))
}

/// What a backend made in the staging directory: the engine file (named by its format) and what
/// its metadata and profile say about it.
struct Made {
    kind: EngineKind,
    format: EngineFormat,
    gpu: Option<GpuMeta>,
    cpu: Option<CpuMeta>,
    batches: Vec<infer_spec::engine::BatchTiming>,
    startup: Option<infer_spec::engine::StartupMeasurement>,
    measured_on: String,
    selection: Option<infer_spec::engine::EngineSelection>,
    /// The builder's log, kept as `build.log` when not empty.
    log: String,
}

/// A CPU engine: tract, ONNX Runtime or OpenVINO as `engine.cpu`, the target's precision and
/// the measurements decide; of the converted model when the target converts (`cpu-int8`).
fn make_cpu(
    spec: &EngineSpec,
    onnx_bytes: &[u8],
    converted: Option<&convert::Converted>,
    dir: &Path,
) -> Result<Made, Error> {
    let chosen = match converted {
        Some(c) => select::choose(spec, &read(&c.onnx)?, Some(onnx_bytes))?,
        None => select::choose(spec, onnx_bytes, None)?,
    };
    cache::write_atomic(&dir.join(chosen.format.file_name()), &chosen.bytes)?;
    let cpu = CpuMeta {
        arch: std::env::consts::ARCH.into(),
        tract: tract::TRACT_VERSION
            .parse()
            .map_err(|_| Error::Internal("tract version literal"))?,
        onnxruntime: chosen.onnxruntime,
        openvino: chosen.openvino,
        folded_by: chosen.folded_by,
        threads: chosen.measured.map(|m| m.threads),
        share: chosen.measured.map(|m| m.share),
        // tract picks its kernels at run time from the CPU it finds (with portable fallbacks),
        // so the stored model requires nothing beyond the architecture; so does ONNX Runtime's
        // CPU provider.
        required_features: Vec::new(),
        isa: Some(CpuIsa::detect()),
        gate: chosen.gate,
    };
    Ok(Made {
        kind: chosen.kind,
        format: chosen.format,
        gpu: None,
        cpu: Some(cpu),
        batches: chosen.batches,
        startup: Some(chosen.startup),
        measured_on: chosen.measured_on,
        selection: chosen.selection,
        log: String::new(),
    })
}

/// A TensorRT plan, built by trtexec on this machine's GPU from the (converted) ONNX.
fn make_tensorrt(
    spec: &EngineSpec,
    trt: &TrtSpec,
    onnx_bytes: Vec<u8>,
    converted: Option<&convert::Converted>,
    dir: &Path,
    cache: &Cache,
    runner: &dyn Runner,
) -> Result<Made, Error> {
    let (bytes, path) = match converted {
        Some(c) => (read(&c.onnx)?, c.onnx.clone()),
        None => (onnx_bytes, spec.onnx.clone()),
    };
    let built =
        tensorrt::build(spec, trt, &bytes, &path, dir, cache, runner).map_err(|e| match e {
            Error::Process(crate::process::Error::NotFound { program })
                if program == "nvidia-smi" =>
            {
                Error::NoGpu {
                    target: spec.target.clone(),
                    sm: trt.sm.sm().to_string(),
                    reason: "`nvidia-smi` was not found on PATH".into(),
                    converted: converted
                        .map(|c| c.onnx.display().to_string())
                        .unwrap_or_default(),
                }
            }
            e => e,
        })?;
    let gpu = GpuMeta {
        sm: trt.sm,
        tensorrt: trt.tensorrt.clone(),
        cuda: trt.cuda.clone(),
        driver_floor: trt.driver_floor.clone(),
        hardware_compat: trt.hardware_compat,
        version_compatible: trt.lean_runtime,
        exclude_lean_runtime: trt.lean_runtime,
        builder_gpu: built.gpu.name.clone(),
    };
    Ok(Made {
        kind: EngineKind::Tensorrt,
        format: EngineFormat::TensorrtPlan,
        gpu: Some(gpu),
        cpu: None,
        batches: built.batches,
        startup: None,
        measured_on: format!(
            "{} ({}, driver {})",
            built.gpu.name,
            built.gpu.sm.sm(),
            built.gpu.driver
        ),
        selection: None,
        log: built.build_log,
    })
}

/// The metadata record of a conversion.
pub(crate) fn conversion_meta(c: &convert::Converted) -> infer_spec::engine::ConversionMeta {
    infer_spec::engine::ConversionMeta {
        converted_digest: c.onnx_digest.clone(),
        tool: c.report.options["tool"].as_str().unwrap_or("?").to_string(),
        versions: c.report.versions.clone(),
        cache_key: c.key.clone(),
        steps: c.report.steps(),
        evaluation: evaluation_text(&c.report),
        accuracy: figures_meta(&c.report.outputs),
    }
}

/// Per output, `max_abs=… max_rel=… [top1=…]`: the figures as engine metadata records them.
pub(crate) fn figures_meta(
    outputs: &[convert::OutputFigures],
) -> std::collections::BTreeMap<String, String> {
    let fmt = |v: Option<f64>| v.map_or("non-finite".to_string(), |v| format!("{v:.4e}"));
    outputs
        .iter()
        .map(|o| {
            let mut s = format!("max_abs={} max_rel={}", fmt(o.max_abs), fmt(o.max_rel));
            if let Some(t) = o.top1_agreement {
                s.push_str(&format!(" top1={t:.4}"));
            }
            (o.name.clone(), s)
        })
        .collect()
}

/// Find the engine for `spec` in `dir` — an engine cache root, or a directory holding entries
/// copied out of caches (e.g. CI artifacts from separate `engine` jobs, up to 6 levels deep) —
/// and verify it: the metadata must describe exactly what the plan asks for (target, precision,
/// ONNX digest, shape profile, backend tuple) and the engine file must hash to its recorded
/// digest.
pub fn lookup(spec: &EngineSpec, dir: &Path) -> Result<EngineArtifact, Error> {
    let onnx_digest = crate::oci::Digest::of(&read(&spec.onnx)?).to_string();
    let material = key_material(spec, &onnx_digest)?;
    let key = material.key();
    let not_found = |reason: String| Error::NotFound {
        target: spec.target.clone(),
        dir: dir.to_path_buf(),
        reason,
    };
    if !dir.is_dir() {
        return Err(not_found("not a directory".into()));
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if Cache::is_cache_root(dir) {
        candidates.push(Cache::open(dir)?.entry_dir(&key));
    }
    for e in walkdir::WalkDir::new(dir)
        .max_depth(6)
        .sort_by_file_name()
        .into_iter()
        .flatten()
    {
        if e.file_type().is_file() && e.file_name() == META_FILE {
            if let Some(parent) = e.path().parent() {
                candidates.push(parent.to_path_buf());
            }
        }
    }
    candidates.dedup();
    let mut same_target = Vec::new();
    for c in candidates {
        let Ok(bytes) =
            crate::oci::dir::read_file(&c.join(META_FILE), crate::oci::MAX_DOCUMENT, META_FILE)
        else {
            continue;
        };
        let Ok(meta) = EngineMeta::from_json(&bytes) else {
            continue;
        };
        if meta.cache_key == key {
            let entry = Entry::read(&c)?;
            let diffs = differences(spec, &material, &entry.meta);
            if !diffs.is_empty() {
                return Err(Error::Mismatch {
                    target: spec.target.clone(),
                    path: c,
                    differences: diffs.join("; "),
                });
            }
            entry.verify_digest()?;
            return Ok(EngineArtifact::from_entry(entry, true));
        }
        if meta.target == spec.target {
            same_target.push((c, meta));
        }
    }
    match same_target.into_iter().next() {
        Some((path, meta)) => {
            let mut diffs = differences(spec, &material, &meta);
            if diffs.is_empty() {
                // The planned batch sizes are in the key and in the profile, not the metadata.
                if let Ok(entry) = Entry::read(&path) {
                    let profiled: Vec<u32> =
                        entry.profile.batches.iter().map(|b| b.batch).collect();
                    if profiled != material.batch_sizes {
                        diffs.push(format!(
                            "planned batch sizes: plan {:?}, engine {profiled:?}",
                            material.batch_sizes
                        ));
                    }
                }
            }
            Err(Error::Mismatch {
                target: spec.target.clone(),
                path,
                differences: if diffs.is_empty() {
                    format!("it was built under key {} (another infer-build version or other builder flags), the plan needs {key}", meta.cache_key)
                } else {
                    diffs.join("; ")
                },
            })
        }
        None => Err(not_found(format!(
            "no entry with key {key}; build it with `infer-build engine RECIPE --target {}`",
            spec.target
        ))),
    }
}

/// What differs between the plan (`spec`, `material`) and an engine's metadata, one phrase each.
pub(crate) fn differences(
    spec: &EngineSpec,
    material: &KeyMaterial,
    meta: &EngineMeta,
) -> Vec<String> {
    let mut d = Vec::new();
    let mut diff = |what: &str, plan: String, engine: String| {
        if plan != engine {
            d.push(format!("{what}: plan {plan}, engine {engine}"));
        }
    };
    diff("target", spec.target.clone(), meta.target.clone());
    diff(
        "precision",
        spec.precision.to_string(),
        meta.precision.to_string(),
    );
    diff("onnx", material.onnx.clone(), meta.onnx_digest.clone());
    diff(
        "shape profile",
        format!("{:?}", material.shape_profile),
        format!("{:?}", meta.shape_profile),
    );
    match (&spec.toolchain, &meta.gpu, &meta.cpu) {
        (Toolchain::Cpu, None, Some(c)) => {
            diff("tract", tract::TRACT_VERSION.into(), c.tract.to_string());
            if let (Some(o), Some(v)) = (&spec.onnxruntime, &c.onnxruntime) {
                diff("ONNX Runtime", o.version.to_string(), v.to_string());
            }
            if let (Some(o), Some(v)) = (&spec.openvino, &c.openvino) {
                diff("OpenVINO", o.version.to_string(), v.to_string());
            }
            if let (Some(f), Some(v)) = (&spec.folding, &c.folded_by) {
                diff(
                    "ONNX Runtime (folding)",
                    f.version.to_string(),
                    v.to_string(),
                );
            }
        }
        (Toolchain::Tensorrt(t), Some(g), None) => {
            diff(
                "compute capability",
                t.sm.sm().to_string(),
                g.sm.sm().to_string(),
            );
            diff("TensorRT", t.tensorrt.to_string(), g.tensorrt.to_string());
            diff("CUDA", t.cuda.to_string(), g.cuda.to_string());
            diff(
                "driver floor",
                t.driver_floor.to_string(),
                g.driver_floor.to_string(),
            );
            diff(
                "hardware compatibility",
                t.hardware_compat.trtexec_value().into(),
                g.hardware_compat.trtexec_value().into(),
            );
            diff(
                "lean runtime",
                t.lean_runtime.to_string(),
                g.exclude_lean_runtime.to_string(),
            );
        }
        (Toolchain::Cpu, _, _) => diff("engine kind", "tract".into(), meta.kind.to_string()),
        (Toolchain::Tensorrt(_), _, _) => {
            diff("engine kind", "tensorrt".into(), meta.kind.to_string())
        }
    }
    d
}

/// Resolve the engine cache root: `--cache DIR` if given, else `engines` under the cache root
/// ([`crate::cache`]).
pub(crate) fn cache_root(flag: Option<&Path>) -> Result<PathBuf, Error> {
    Ok(crate::cache::require(
        crate::cache::Entry::Engines,
        flag,
        "--cache DIR",
    )?)
}
