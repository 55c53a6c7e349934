//! Precision conversion before any GPU job: an FP32 ONNX becomes the FP16 or INT8 Q/DQ ONNX a
//! strongly typed TensorRT builds, on any machine, and its accuracy figures against the FP32
//! model are measured on the same inputs under ONNX Runtime on the CPU.
//!
//! - FP16: ONNX Runtime's basic optimisation folds constants first; the nodes kept FP32 are the
//!   numerically sensitive operators ([`FP16_KEEP_OPS`] plus the tool's own list), those reading
//!   a constant beyond ±65504 and those reading or writing values beyond ±512 on the range data
//!   (ModelOpt AutoCast's rules and defaults); onnxconverter-common's `convert_float_to_float16`
//!   converts the rest, inputs and outputs kept FP32. The gate also runs an FP32 emulation of
//!   the FP16 model's storage, since ONNX Runtime's CPU provider runs most FP16 nodes in FP32
//!   ([`Report::steps`] says what was done; docs/engines.md has the detail).
//! - INT8: ONNX Runtime's `quantize_static`, QDQ format, symmetric activations and weights
//!   (zero point 0, as TensorRT requires), per-channel weights kept as float behind Q/DQ pairs,
//!   biases unquantized, only the operators TensorRT runs in INT8 ([`QUANTIZE_OPS`]); the
//!   calibration method is `[int8] method` (default `percentile`).
//! - FP8 (E4M3): the script's own Q/DQ insertion with the onnx package (ONNX Runtime 1.32's FP8
//!   path in `quantize_static` fails in its calibrator): opset 19 QuantizeLinear /
//!   DequantizeLinear with FLOAT8E4M3FN zero points on the inputs of [`FP8_QUANTIZE_OPS`];
//!   activations per tensor, scale = calibration amax / 448 (`[fp8] method`: `minmax` or
//!   `percentile`, default `percentile`); weights stored in FP8 behind a
//!   DequantizeLinear, per output channel for Conv (and Gemm with transB = 1), per tensor
//!   otherwise; biases, other operators, inputs and outputs FP32. The gate runs it under ONNX
//!   Runtime on the CPU with graph optimisations off (its Q/DQ fusions miscompute FP8 Conv).
//!
//! With `engine.convert = "modelopt"`, NVIDIA's Model Optimizer converts instead: AutoCast for
//! FP16 (inputs and outputs kept FP32), `modelopt.onnx.quantization.quantize` for INT8 and FP8
//! (calibration `minmax`, its `max`, or `entropy`, its default; the other operators kept FP32),
//! run on ONNX Runtime's CPU execution provider. Its ONNX tools import torch, so it runs in the
//! user's interpreter ([`pyenv::modelopt_python`]), which imports everything it needs before it
//! converts: one that cannot import it is refused with the import error. The key then covers that interpreter instead of the pinned
//! requirements; the report records the versions it ran with (ModelOpt, torch, onnx, ONNX
//! Runtime). The accuracy figures are measured the same way for both tools.
//!
//! The converter is the embedded script `convert.py`, run by the interpreter of the pinned
//! environment ([`super::pyenv`]) through [`crate::process`] with a deadline. The result is
//! content-addressed in the engine cache under `v1/converted/<key>/` (`model.onnx`,
//! `conversion.json`): the key covers the source ONNX digest, the precision, the tool (the
//! requirements file's digest, hence every pinned version, and the script's digest), the
//! options, the calibration data digest and the evaluation inputs, so a second call, or every
//! GPU job of a CI fan-out sharing the cache, reuses it without running Python.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use infer_spec::engine::{canonical_json, Precision};
use serde::{Deserialize, Serialize};

use super::cache::{self, Cache};
use super::pyenv;
use super::spec::{EngineSpec, InputSpec};
use super::Error;
use crate::process::{Cmd, Runner};
use crate::recipe::ConvertTool;

/// Version of the conversion key derivation.
pub(crate) const CONVERT_KEY_SCHEME: &str = "infer-build-convert-key/1";
/// The converted model's file name in its cache entry.
pub(crate) const MODEL_FILE: &str = "model.onnx";
/// The conversion report's file name in its cache entry.
pub(crate) const REPORT_FILE: &str = "conversion.json";
/// Operators quantized for TensorRT: those it runs in INT8; the rest stay in float.
pub(crate) const QUANTIZE_OPS: [&str; 4] = ["Conv", "ConvTranspose", "Gemm", "MatMul"];
/// Operators given FP8 Q/DQ inputs: the GEMM-shaped ones TensorRT runs in FP8.
pub(crate) const FP8_QUANTIZE_OPS: [&str; 3] = ["Conv", "Gemm", "MatMul"];
/// Operators kept FP32 in an FP16 model, besides onnxconverter-common's own block list.
pub(crate) const FP16_KEEP_OPS: [&str; 14] = [
    "Exp",
    "Log",
    "Pow",
    "Sqrt",
    "Reciprocal",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceL2",
    "ReduceLogSumExp",
    "Softmax",
    "LogSoftmax",
    "LayerNormalization",
    "InstanceNormalization",
];
/// Generated evaluation inputs when the recipe gives neither calibration nor evaluation data.
pub(crate) const GENERATED_SAMPLES: u32 = 8;
const CONVERT_TIMEOUT: Duration = Duration::from_secs(3600);

/// What to convert a target's model to, from the recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct ConvertSpec {
    /// The tool that converts (`engine.convert`).
    pub tool: ConvertTool,
    /// The calibration method (INT8, FP8): one of `tool.methods(..)`.
    pub method: String,
    /// Calibration data directory (`*.npy` / `*.npz`); required for INT8 and FP8.
    pub calibration: Option<PathBuf>,
    /// Evaluation data directory for the accuracy figures; default: the calibration data,
    /// else [`GENERATED_SAMPLES`] seeded inputs.
    pub evaluation: Option<PathBuf>,
    /// The accuracy gate.
    pub thresholds: super::accuracy::Thresholds,
}

/// One output's figures: converted vs FP32 on the same inputs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct OutputFigures {
    pub name: String,
    /// Largest absolute difference; `None` when the converted model produced a non-finite value.
    pub max_abs: Option<f64>,
    /// `max_abs` over the FP32 output's largest magnitude.
    pub max_rel: Option<f64>,
    /// For `[N, C]` outputs with C ≥ 2: the fraction of rows whose arg-max agrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top1_agreement: Option<f64>,
    /// Rows compared for `top1_agreement`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
}

/// What the converter reports, stored as `conversion.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Report {
    /// Package versions of the environment that converted (`onnx`, `onnxruntime`, …).
    pub versions: BTreeMap<String, String>,
    /// The tool and the options it ran with.
    pub options: serde_json::Value,
    /// Which inputs the figures were measured on.
    pub evaluation: serde_json::Value,
    pub outputs: Vec<OutputFigures>,
    /// Seconds spent converting and comparing.
    pub seconds: BTreeMap<String, f64>,
}

/// A converted model in the cache.
#[derive(Debug, Clone)]
pub(crate) struct Converted {
    pub key: String,
    pub onnx: PathBuf,
    pub onnx_digest: String,
    pub precision: Precision,
    pub report: Report,
    /// True when it was already in the cache (no Python ran).
    pub cached: bool,
    /// True when this call created the converter environment.
    pub env_created: bool,
}

/// The part of the key that depends on the request.
#[derive(Debug, Clone, Serialize)]
struct KeyMaterial<'a> {
    scheme: &'static str,
    source: &'a str,
    precision: Precision,
    tool: String,
    requirements: String,
    /// The interpreter that converts, when it is the user's (ModelOpt) rather than the pinned
    /// environment's; absent otherwise, so builtin keys are what they were before ModelOpt.
    #[serde(skip_serializing_if = "Option::is_none")]
    interpreter: Option<String>,
    script: String,
    options: serde_json::Value,
    calibration: Option<String>,
    evaluation: Option<String>,
    inputs: Vec<(String, String, Vec<u64>)>,
}

fn tool_name(p: Precision, tool: ConvertTool) -> &'static str {
    match (tool, p) {
        (ConvertTool::ModelOpt, Precision::Int8 | Precision::Fp8) => "modelopt.onnx.quantization",
        (ConvertTool::ModelOpt, _) => "modelopt.onnx.autocast",
        (ConvertTool::Builtin, Precision::Int8) => "onnxruntime.quantization",
        (ConvertTool::Builtin, Precision::Fp8) => "infer-build.fp8-qdq",
        (ConvertTool::Builtin, _) => "onnxconverter-common.float16",
    }
}

/// The converter's options for `precision` (what goes into the key and the request).
fn options(precision: Precision, c: &ConvertSpec) -> serde_json::Value {
    if c.tool == ConvertTool::ModelOpt {
        return match precision {
            Precision::Int8 | Precision::Fp8 => {
                serde_json::json!({ "tool": "modelopt", "method": c.method })
            }
            _ => serde_json::json!({ "tool": "modelopt" }),
        };
    }
    match precision {
        Precision::Int8 => serde_json::json!({
            "method": c.method,
            "quantize_ops": QUANTIZE_OPS,
        }),
        Precision::Fp8 => serde_json::json!({
            "method": c.method,
            "quantize_ops": FP8_QUANTIZE_OPS,
        }),
        _ => serde_json::json!({ "fp16_keep_ops": FP16_KEEP_OPS }),
    }
}

/// Inputs at concrete sample shapes (batch 1), for generated evaluation data.
fn sample_inputs(inputs: &[InputSpec]) -> Vec<(String, String, Vec<u64>)> {
    inputs
        .iter()
        .map(|i| {
            let dims = (0..i.shape.len())
                .map(|d| {
                    if d == 0 {
                        1
                    } else {
                        i.sample_dim(d).unwrap_or(1)
                    }
                })
                .collect();
            (i.name.clone(), i.datatype.recipe_name().to_string(), dims)
        })
        .collect()
}

/// The conversion cache key of `spec` for a source ONNX with digest `source`.
pub(crate) fn key(spec: &EngineSpec, c: &ConvertSpec, source: &str) -> Result<String, Error> {
    check_supported(spec)?;
    let digest = |p: &Option<PathBuf>| {
        p.as_ref()
            .map(|d| super::calibration_digest(&super::Calibration::Data(d.clone())))
            .transpose()
    };
    let m = KeyMaterial {
        scheme: CONVERT_KEY_SCHEME,
        source,
        precision: spec.precision,
        tool: tool_name(spec.precision, c.tool).into(),
        requirements: crate::oci::Digest::of(pyenv::REQUIREMENTS.as_bytes()).to_string(),
        interpreter: (c.tool == ConvertTool::ModelOpt).then(pyenv::modelopt_python),
        script: crate::oci::Digest::of(pyenv::SCRIPT.as_bytes()).to_string(),
        options: options(spec.precision, c),
        calibration: digest(&c.calibration)?,
        evaluation: digest(&c.evaluation)?,
        inputs: sample_inputs(&spec.inputs),
    };
    Ok(crate::oci::Digest::of(&canonical_json(&m))
        .hex()
        .to_string())
}

/// Precisions infer-build converts to, with the reason for the others.
pub(crate) fn check_supported(spec: &EngineSpec) -> Result<(), Error> {
    match spec.precision {
        Precision::Fp16 | Precision::Int8 | Precision::Fp8 => Ok(()),
        other => Err(Error::Input {
            target: spec.target.clone(),
            input: "-".into(),
            reason: format!("infer-build converts models to fp16, int8 and fp8, not {other}"),
        }),
    }
}

fn converted_dir(cache: &Cache) -> PathBuf {
    cache.root().join("v1").join("converted")
}

fn read_entry(dir: &Path, key: &str, precision: Precision) -> Result<Option<Converted>, Error> {
    let report_path = dir.join(REPORT_FILE);
    if !report_path.is_file() {
        return Ok(None);
    }
    let bytes = crate::oci::dir::read_file(&report_path, crate::oci::MAX_DOCUMENT, REPORT_FILE)
        .map_err(|e| Error::Io {
            path: report_path.clone(),
            source: e.into_io(),
        })?;
    let report: Report = serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt {
        path: report_path.clone(),
        reason: e.to_string(),
    })?;
    let onnx = dir.join(MODEL_FILE);
    let onnx_digest = cache::digest_file(&onnx)?;
    Ok(Some(Converted {
        key: key.into(),
        onnx,
        onnx_digest,
        precision,
        report,
        cached: true,
        env_created: false,
    }))
}

/// The converted model of `spec` (source digest `source`): from the cache, or made now in the
/// environment under `pyenv_root` (see [`pyenv::root_for`]).
pub(crate) fn convert(
    spec: &EngineSpec,
    c: &ConvertSpec,
    source: &str,
    cache: &Cache,
    pyenv_root: &Path,
    runner: &dyn Runner,
) -> Result<Converted, Error> {
    let key = key(spec, c, source)?;
    let root = converted_dir(cache);
    let dir = root.join(&key);
    if let Some(hit) = read_entry(&dir, &key, spec.precision)? {
        return Ok(hit);
    }
    let table = match spec.precision {
        Precision::Int8 => "int8",
        Precision::Fp8 => "fp8",
        _ => "",
    };
    if !table.is_empty() && c.calibration.is_none() {
        return Err(Error::Input {
            target: spec.target.clone(),
            input: "-".into(),
            reason: format!("{} conversion needs calibration data: set `[{table}] calibration` to a directory of *.npy / *.npz batches", spec.precision),
        });
    }
    let methods = c.tool.methods(spec.precision == Precision::Fp8);
    if !table.is_empty() && !methods.contains(&c.method.as_str()) {
        return Err(Error::Input {
            target: spec.target.clone(),
            input: "-".into(),
            reason: format!(
                "{table} calibration method `{}` under the {} converter: use one of {}",
                c.method,
                c.tool,
                methods.join(", ")
            ),
        });
    }
    std::fs::create_dir_all(&root).map_err(|source| Error::Io {
        path: root.clone(),
        source,
    })?;
    let _lock = cache.lock(&format!("convert-{key}"))?;
    if let Some(hit) = read_entry(&dir, &key, spec.precision)? {
        return Ok(hit);
    }
    // The interpreter that converts, and whether this call created its environment.
    let (python, env_created) = match c.tool {
        ConvertTool::Builtin => {
            let env = pyenv::ensure(pyenv_root, runner)?;
            (env.python(), env.created)
        }
        ConvertTool::ModelOpt => (PathBuf::from(pyenv::modelopt_python()), false),
    };
    let staging = root.join(format!("{key}.staging.{}", std::process::id()));
    if staging.exists() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    std::fs::create_dir_all(&staging).map_err(|source| Error::Io {
        path: staging.clone(),
        source,
    })?;
    let result = run_converter(spec, c, &python, &staging, runner).and_then(|report| {
        cache::write_atomic(
            &staging.join(REPORT_FILE),
            &serde_json::to_vec_pretty(&report).map_err(|_| Error::Internal("report json"))?,
        )?;
        cache::sync_tree(&staging)?;
        std::fs::rename(&staging, &dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })
    });
    if let Err(e) = result {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    let mut done = read_entry(&dir, &key, spec.precision)?
        .ok_or(Error::Internal("converted entry vanished"))?;
    done.cached = false;
    done.env_created = env_created;
    Ok(done)
}

fn run_converter(
    spec: &EngineSpec,
    c: &ConvertSpec,
    python: &Path,
    staging: &Path,
    runner: &dyn Runner,
) -> Result<Report, Error> {
    let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
    let inputs: Vec<serde_json::Value> = sample_inputs(&spec.inputs)
        .into_iter()
        .map(|(name, datatype, shape)| serde_json::json!({"name": name, "datatype": datatype, "shape": shape}))
        .collect();
    let mut req = serde_json::json!({
        "command": "convert",
        "source": abs(&spec.onnx),
        "output": abs(&staging.join(MODEL_FILE)),
        "precision": spec.precision.to_string(),
        "method": c.method,
        "calibration": c.calibration.as_deref().map(abs),
        "evaluation": c.evaluation.as_deref().map(abs),
        "inputs": inputs,
        "generated_samples": GENERATED_SAMPLES,
    });
    if let (serde_json::Value::Object(r), serde_json::Value::Object(o)) =
        (&mut req, options(spec.precision, c))
    {
        r.extend(o);
    }
    let cmd = Cmd::new(python.to_string_lossy())
        .args(["-c", pyenv::SCRIPT])
        .cwd(staging)
        .stdin(serde_json::to_vec(&req).map_err(|_| Error::Internal("request json"))?)
        .timeout(CONVERT_TIMEOUT);
    let out = runner.run(&cmd).map_err(|e| match c.tool {
        ConvertTool::ModelOpt => Error::NoModelOpt {
            python: pyenv::modelopt_python(),
            reason: e.to_string(),
        },
        ConvertTool::Builtin => Error::Convert {
            reason: format!("running the converter: {e}"),
        },
    })?;
    if !out.success() {
        if c.tool == ConvertTool::ModelOpt {
            if let Some(e) = pyenv::missing_modelopt(&out) {
                return Err(e);
            }
        }
        return Err(Error::ConvertFailed {
            target: spec.target.clone(),
            precision: spec.precision.to_string(),
            tail: out.tail(12),
        });
    }
    if !staging.join(MODEL_FILE).is_file() {
        return Err(Error::ToolOutput {
            tool: "converter",
            reason: "it exited 0 but wrote no model".into(),
        });
    }
    for f in ["preprocessed.onnx", "augmented_model.onnx"] {
        let _ = std::fs::remove_file(staging.join(f));
    }
    pyenv::last_json(&out.stdout_text()).map_err(|reason| Error::ToolOutput {
        tool: "converter",
        reason,
    })
}

impl Report {
    /// The tool that converted, with ModelOpt's and torch's versions when it was ModelOpt.
    pub(crate) fn tool(&self) -> String {
        let name = self.options["tool"].as_str().unwrap_or("unknown");
        match (
            self.versions.get("nvidia-modelopt"),
            self.versions.get("torch"),
        ) {
            (Some(m), Some(t)) => format!("{name} (nvidia-modelopt {m}, torch {t})"),
            _ => name.to_string(),
        }
    }

    /// What the converter did besides its tool's own pass, one line each (FP16: the folding
    /// before it, and how many nodes stayed FP32 and why); empty for the other conversions.
    pub(crate) fn steps(&self) -> Vec<String> {
        let o = &self.options;
        let mut out = Vec::new();
        if let Some(f) = o["folded_by"].as_str() {
            out.push(format!("folded first by {f}"));
        }
        if let (Some(total), Some(kept)) = (o["nodes"].as_u64(), o["fp32_nodes"].as_object()) {
            let n = |k: &str| kept.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
            let limit = |k: &str| o[k].as_f64().map_or("?".to_string(), |v| format!("{v}"));
            out.push(format!(
                "kept FP32: {} of {total} nodes ({} by operator type, {} reading a constant beyond \
                 ±{}, {} with values beyond ±{} on {})",
                n("operator") + n("initializer") + n("activation"),
                n("operator"),
                n("initializer"),
                limit("init_max"),
                n("activation"),
                limit("data_max"),
                o["range_data"].as_str().unwrap_or("?"),
            ));
        }
        out
    }

    /// One line per output: `name: max abs …, max rel …, top-1 …`.
    pub(crate) fn summary(&self) -> Vec<String> {
        summary(&self.outputs)
    }
}

/// One line per output's figures, for messages.
pub(crate) fn summary(outputs: &[OutputFigures]) -> Vec<String> {
    {
        let f = |v: Option<f64>| v.map_or("non-finite".to_string(), |v| format!("{v:.3e}"));
        outputs
            .iter()
            .map(|o| {
                let mut s = format!(
                    "{}: max abs {}, max rel {}",
                    o.name,
                    f(o.max_abs),
                    f(o.max_rel)
                );
                if let Some(t) = o.top1_agreement {
                    s.push_str(&format!(
                        ", top-1 agreement {:.2}% of {} rows",
                        t * 100.0,
                        o.rows.unwrap_or(0)
                    ));
                }
                s
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::spec::{tests::mlp_spec, Toolchain, TrtSpec};
    use crate::process::{Output, RecordingRunner};

    fn spec(precision: Precision, calib: Option<PathBuf>) -> (EngineSpec, ConvertSpec) {
        let v = |s: &str| s.parse().unwrap();
        let t = TrtSpec::new(
            v("11.4.0.106"),
            v("13.0"),
            infer_spec::engine::ComputeCapability::new(8, 9),
            v("580.65"),
        );
        let c = ConvertSpec {
            tool: ConvertTool::Builtin,
            method: ConvertTool::Builtin.default_method().into(),
            calibration: calib,
            evaluation: None,
            thresholds: super::super::accuracy::Thresholds::default_for(precision),
        };
        let mut s = mlp_spec(Toolchain::Tensorrt(t));
        s.convert = Some(c.clone());
        s.precision = precision;
        s.target = format!("sm89-{precision}");
        (s, c)
    }

    #[test]
    fn the_key_covers_source_options_and_data() {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("calib");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("a.npy"), b"1").unwrap();
        let (s, c) = spec(Precision::Int8, Some(data.clone()));
        let k0 = key(&s, &c, "sha256:a").unwrap();
        assert_eq!(k0, key(&s, &c, "sha256:a").unwrap());
        assert_ne!(k0, key(&s, &c, "sha256:b").unwrap());
        let mut c2 = c.clone();
        c2.method = "entropy".into();
        assert_ne!(k0, key(&s, &c2, "sha256:a").unwrap());
        // Thresholds are applied to the stored figures: changing them keeps the conversion.
        let mut c3 = c.clone();
        c3.thresholds.min_top1 = 0.5;
        assert_eq!(k0, key(&s, &c3, "sha256:a").unwrap());
        std::fs::write(data.join("a.npy"), b"2").unwrap();
        assert_ne!(k0, key(&s, &c, "sha256:a").unwrap());
        let (f, cf) = spec(Precision::Fp16, None);
        assert_ne!(k0, key(&f, &cf, "sha256:a").unwrap());
        let (b, cb) = spec(Precision::Fp32, None);
        assert!(key(&b, &cb, "sha256:a").is_err());
    }

    /// The whole sequence through the recording runner: environment creation (venv, pip with
    /// hashes, probe), the conversion run with its request on stdin, the cache entry, and a
    /// second call that runs nothing.
    #[test]
    fn converts_once_through_the_process_runner() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::open(&tmp.path().join("cache")).unwrap();
        let versions = r#"{"numpy": "2.4.6", "onnx": "1.23.2", "onnxconverter-common": "1.16.0", "onnxruntime": "1.32.0", "python": "3.11.7"}"#;
        let runner = RecordingRunner::new(move |cmd| {
            if cmd.args.get(1).map(String::as_str) == Some("venv") {
                std::fs::create_dir_all(std::path::Path::new(&cmd.args[2]).join("bin")).unwrap();
                return Output::ok("");
            }
            if cmd.args.get(1).map(String::as_str) == Some("pip") {
                return Output::ok("");
            }
            let req: serde_json::Value =
                serde_json::from_slice(cmd.stdin.as_deref().unwrap_or(b"{}")).unwrap();
            if req["command"] == "versions" {
                return Output::ok(format!("\n{versions}\n"));
            }
            std::fs::write(req["output"].as_str().unwrap(), b"converted").unwrap();
            Output::ok(format!(
                "\n{{\"versions\": {versions}, \"options\": {{\"tool\": \"onnxconverter-common float16\"}}, \"evaluation\": {{\"source\": \"generated inputs\", \"batches\": 8}}, \"outputs\": [{{\"name\": \"output\", \"max_abs\": 0.001, \"max_rel\": 0.002, \"top1_agreement\": 1.0, \"rows\": 8}}], \"seconds\": {{\"convert\": 0.5, \"compare\": 0.1}}}}\n"
            ))
        });
        let (s, c) = spec(Precision::Fp16, None);
        let envs = tmp.path().join("pyenv");
        let done = convert(&s, &c, "sha256:a", &cache, &envs, &runner).unwrap();
        assert!(!done.cached && done.env_created);
        assert_eq!(std::fs::read(&done.onnx).unwrap(), b"converted");
        assert_eq!(done.report.outputs[0].max_rel, Some(0.002));
        let calls = runner.calls();
        let argv: Vec<Vec<String>> = calls.iter().map(|c| c.argv()).collect();
        assert_eq!(argv.len(), 4, "{argv:?}");
        assert_eq!(argv[0][1..3], ["-m", "venv"]);
        assert!(
            argv[1].contains(&"--require-hashes".to_string()),
            "{argv:?}"
        );
        assert!(argv[1].contains(&"--no-deps".to_string()), "{argv:?}");
        assert!(calls.iter().all(|c| c.timeout.is_some()));
        let req: serde_json::Value =
            serde_json::from_slice(calls[3].stdin.as_ref().unwrap()).unwrap();
        assert_eq!(req["precision"], "fp16");
        assert_eq!(req["inputs"][0]["shape"], serde_json::json!([1, 64]));
        // Second call: from the cache, nothing runs.
        let again = convert(&s, &c, "sha256:a", &cache, &envs, &runner).unwrap();
        assert!(again.cached);
        assert_eq!(runner.calls().len(), 4);
        assert_eq!(again.onnx_digest, done.onnx_digest);
    }

    /// `engine.convert = "modelopt"`: the user's interpreter converts (no venv, no pip, no
    /// separate probe); one that cannot import ModelOpt is refused with the import error; one that
    /// can converts with `"tool": "modelopt"` in the request, and its key is not the builtin one.
    #[test]
    fn modelopt_runs_in_the_users_python_or_is_refused_with_the_import_error() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::open(&tmp.path().join("cache")).unwrap();
        let data = tmp.path().join("calib");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("a.npy"), b"1").unwrap();
        let (s, builtin) = spec(Precision::Int8, Some(data.clone()));
        let c = ConvertSpec {
            tool: ConvertTool::ModelOpt,
            method: ConvertTool::ModelOpt.default_method().into(),
            ..builtin.clone()
        };
        assert_ne!(
            key(&s, &c, "sha256:a").unwrap(),
            key(&s, &builtin, "sha256:a").unwrap()
        );
        let envs = tmp.path().join("pyenv");

        let missing = RecordingRunner::new(|_| {
            Output::failed(
                1,
                "Traceback (most recent call last):\n  File \"<string>\", line 30, in versions\nModuleNotFoundError: No module named 'modelopt'\n",
            )
        });
        let e = convert(&s, &c, "sha256:a", &cache, &envs, &missing).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, Error::NoModelOpt { .. }) && !e.is_bad_input(),
            "{msg}"
        );
        assert!(
            msg.contains("No module named 'modelopt'")
                && msg.contains("INFER_BUILD_MODELOPT_PYTHON")
                && msg.contains(&format!("`{}`", pyenv::modelopt_python())),
            "{msg}"
        );
        let calls = missing.calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].argv()[0], pyenv::modelopt_python());
        assert!(!envs.exists(), "no environment is created for ModelOpt");

        let versions = r#"{"numpy": "2.2.6", "nvidia-modelopt": "0.47.0", "onnx": "1.19.1", "onnxruntime": "1.22.0", "python": "3.11.7", "torch": "2.9.1"}"#;
        let ok = RecordingRunner::new(move |cmd| {
            let req: serde_json::Value =
                serde_json::from_slice(cmd.stdin.as_deref().unwrap_or(b"{}")).unwrap();
            assert_eq!(req["tool"], "modelopt", "{req}");
            assert_eq!(req["command"], "convert", "{req}");
            assert_eq!(req["method"], "entropy", "{req}");
            std::fs::write(req["output"].as_str().unwrap(), b"quantized").unwrap();
            Output::ok(format!(
                "\n{{\"versions\": {versions}, \"options\": {{\"tool\": \"modelopt.onnx.quantization\"}}, \"evaluation\": {{\"source\": \"calibration data\", \"batches\": 1}}, \"outputs\": [{{\"name\": \"output\", \"max_abs\": 0.01, \"max_rel\": 0.02}}], \"seconds\": {{\"convert\": 2.0, \"compare\": 0.1}}}}\n"
            ))
        });
        let done = convert(&s, &c, "sha256:a", &cache, &envs, &ok).unwrap();
        assert!(!done.cached && !done.env_created);
        assert_eq!(
            done.report.tool(),
            "modelopt.onnx.quantization (nvidia-modelopt 0.47.0, torch 2.9.1)"
        );
        let argv: Vec<Vec<String>> = ok.calls().iter().map(|c| c.argv()).collect();
        assert_eq!(argv.len(), 1, "{argv:?}");
        assert!(argv.iter().all(|a| a[0] == pyenv::modelopt_python()));

        // ModelOpt has no percentile calibration.
        let p = ConvertSpec {
            method: "percentile".into(),
            ..c.clone()
        };
        let e = convert(&s, &p, "sha256:b", &cache, &envs, &ok).unwrap_err();
        assert!(
            e.is_bad_input() && e.to_string().contains("minmax, entropy"),
            "{e}"
        );
    }
}
