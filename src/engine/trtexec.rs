//! trtexec: argument vectors per TensorRT version, and parsers for what it prints and exports.
//!
//! Pure: arguments are computed from values, outputs are parsed from bytes. Spawning happens in
//! [`super::tensorrt`] through [`crate::process`].
//!
//! Per TensorRT version (see `docs/engines.md` for the table and sources):
//! - 8.6 and 10.x: weak typing; `--fp16`; INT8 as `--int8 --fp16` (FP16 for the layers that do not
//!   quantize) with `--calib=<cache>` for implicit quantization, or without `--calib` for a Q/DQ
//!   model (explicit quantization). INT8 with neither is refused: TensorRT would use placeholder
//!   scales.
//! - FP8 (8.6 and 10.x): `--fp8 --fp16` on an FP8 Q/DQ model (explicit quantization only).
//! - 11.x: strongly typed only; `--fp16/--int8/--calib` were removed. FP16 needs an ONNX already
//!   converted to FP16, INT8 one with Q/DQ nodes (infer-build makes both, see
//!   [`super::convert`]); anything else is refused.

use infer_spec::engine::{
    BatchTiming, ComputeCapability, HardwareCompat, InputProfile, LayerTiming, Precision, Version,
};
use serde::Deserialize;

use super::onnx::OnnxSummary;
use super::spec::TrtSpec;
use super::timing::{median_sorted, round_us};
use super::Error;

/// The TensorRT release lines infer-build drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TrtLine {
    /// 8.6: the first with version-compatible engines, lean/dispatch runtimes and `ampere+`.
    V8_6,
    /// 10.x (weakly typed builder flags still accepted, deprecated from 10.12).
    V10,
    /// 11.x: strongly typed only.
    V11,
}

impl TrtLine {
    pub(crate) fn of(v: &Version) -> Result<TrtLine, Error> {
        match (v.major(), v.minor()) {
            (8, 6) => Ok(TrtLine::V8_6),
            (10, _) => Ok(TrtLine::V10),
            (11, _) => Ok(TrtLine::V11),
            _ => Err(Error::UnsupportedTensorrt {
                version: v.to_string(),
            }),
        }
    }
}

/// How the requested precision is obtained with this TensorRT version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PrecisionPath {
    /// FP32 (TF32 where the GPU has it): no flag.
    Fp32,
    /// `--fp16`.
    Fp16Flag,
    /// `--int8 --fp16 --calib=<cache>`: implicit quantization from a calibration cache.
    Int8Calibrated,
    /// `--int8 --fp16` on a Q/DQ model: explicit quantization (8.6/10.x).
    Int8Explicit,
    /// `--fp8 --fp16` on an FP8 Q/DQ model: explicit quantization (8.6/10.x).
    Fp8Explicit,
    /// 11.x: the ONNX carries its types (FP16 tensors or Q/DQ nodes); no precision flag.
    StronglyTyped,
}

/// The precision path, from the spec alone: the TensorRT line, the precision, and whether the
/// plan gave TensorRT a calibration input. This is the one decision; the cache key is computed
/// from it (so a cache hit parses no ONNX), and [`precision_path`] checks the model fits it.
pub(crate) fn expected_path(
    target: &str,
    trt: &TrtSpec,
    precision: Precision,
) -> Result<PrecisionPath, Error> {
    Ok(match (TrtLine::of(&trt.tensorrt)?, precision) {
        (_, Precision::Fp32) => PrecisionPath::Fp32,
        (TrtLine::V11, _) => PrecisionPath::StronglyTyped,
        (_, Precision::Fp16) => PrecisionPath::Fp16Flag,
        (_, Precision::Int8) if trt.calibration.is_some() => PrecisionPath::Int8Calibrated,
        (_, Precision::Int8) => PrecisionPath::Int8Explicit,
        (_, Precision::Fp8) => PrecisionPath::Fp8Explicit,
        (_, p @ (Precision::Tf32 | Precision::Bf16 | Precision::Fp4)) => {
            return Err(Error::Precision {
                target: target.to_string(),
                tensorrt: trt.tensorrt.to_string(),
                reason: format!("{p} engines are not built (fp32, fp16, int8 and fp8 are)"),
            })
        }
    })
}

/// The precision path [`expected_path`] decides, once the ONNX is known to fit it: refused when
/// a calibration input is given where none is used, or the model lacks the Q/DQ nodes or FP16
/// tensors the path builds from (or has Q/DQ nodes where TensorRT would calibrate).
pub(crate) fn precision_path(
    target: &str,
    trt: &TrtSpec,
    precision: Precision,
    onnx: &OnnxSummary,
) -> Result<PrecisionPath, Error> {
    let path = expected_path(target, trt, precision)?;
    let calibrated = trt.calibration.is_some();
    let reason: Option<&str> = match (&path, precision) {
        (PrecisionPath::Fp32 | PrecisionPath::Fp16Flag, _) if calibrated => {
            Some("calibration is only used for int8")
        }
        (PrecisionPath::Int8Calibrated, _) if onnx.has_qdq() => {
            Some("the model already has Q/DQ nodes; drop the calibration input")
        }
        (PrecisionPath::Int8Explicit, _) if !onnx.has_qdq() => Some(
            "int8 needs calibration data or a calibration cache ([int8] calibration), or a model with Q/DQ nodes",
        ),
        (_, Precision::Fp8) if calibrated => Some(
            "fp8 has no TensorRT calibration: infer-build quantizes the model to FP8 Q/DQ from `[fp8] calibration` data",
        ),
        (_, Precision::Fp8) if !onnx.has_qdq() => Some(
            "fp8 needs a model with FP8 Q/DQ nodes (infer-build makes one from `[fp8] calibration` data); this model has no QuantizeLinear/DequantizeLinear nodes",
        ),
        (PrecisionPath::StronglyTyped, Precision::Fp16) if calibrated => {
            Some("TensorRT 11 has no calibration: infer-build converts fp16 models itself")
        }
        (PrecisionPath::StronglyTyped, Precision::Fp16) if !onnx.has_fp16() => Some(
            "TensorRT 11 builds strongly typed networks only: the ONNX must be fp16 (infer-build converts it when the plan's precision mode is `convert`); this model has no fp16 tensors",
        ),
        (PrecisionPath::StronglyTyped, Precision::Int8) if calibrated => Some(
            "TensorRT 11 has no calibration: point `[int8] calibration` at a directory of calibration batches and infer-build quantizes the model to Q/DQ",
        ),
        (PrecisionPath::StronglyTyped, Precision::Int8) if !onnx.has_qdq() => Some(
            "TensorRT 11 builds strongly typed networks only: int8 needs a Q/DQ model (infer-build makes one from `[int8] calibration` data); this model has no QuantizeLinear/DequantizeLinear nodes",
        ),
        _ => None,
    };
    match reason {
        Some(reason) => Err(Error::Precision {
            target: target.to_string(),
            tensorrt: trt.tensorrt.to_string(),
            reason: reason.to_string(),
        }),
        None => Ok(path),
    }
}

/// Paths handed to trtexec. [`BuildPaths::placeholders`] gives the path-free form that goes
/// into the cache key: moving the cache or the ONNX does not change the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BuildPaths {
    pub onnx: String,
    pub engine: String,
    pub timing_cache: String,
    pub calibration_cache: Option<String>,
}

impl BuildPaths {
    pub(crate) fn placeholders(calibrated: bool) -> BuildPaths {
        BuildPaths {
            onnx: "<onnx>".into(),
            engine: "<engine>".into(),
            timing_cache: "<timing-cache>".into(),
            calibration_cache: calibrated.then(|| "<calibration-cache>".into()),
        }
    }
}

/// A trtexec shape list: `input:1x64,mask:1x8` (names with `:` or `,` single-quoted).
pub(crate) fn shape_list<'a>(items: impl IntoIterator<Item = (&'a str, &'a [u64])>) -> String {
    items
        .into_iter()
        .map(|(name, dims)| {
            let name = if name.contains([':', ',', ' ']) {
                format!("'{name}'")
            } else {
                name.to_string()
            };
            let dims: Vec<String> = dims.iter().map(u64::to_string).collect();
            format!("{name}:{}", dims.join("x"))
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The arguments (without the program) of the trtexec run that builds the engine.
pub(crate) fn build_args(
    trt: &TrtSpec,
    path: &PrecisionPath,
    profile: &[InputProfile],
    dynamic: bool,
    paths: &BuildPaths,
) -> Result<Vec<String>, Error> {
    let line = TrtLine::of(&trt.tensorrt)?;
    let mut a = vec![
        format!("--onnx={}", paths.onnx),
        format!("--saveEngine={}", paths.engine),
        format!("--timingCacheFile={}", paths.timing_cache),
    ];
    match path {
        PrecisionPath::Fp32 | PrecisionPath::StronglyTyped => {}
        PrecisionPath::Fp16Flag => a.push("--fp16".into()),
        PrecisionPath::Int8Explicit => a.extend(["--int8".into(), "--fp16".into()]),
        PrecisionPath::Fp8Explicit => a.extend(["--fp8".into(), "--fp16".into()]),
        PrecisionPath::Int8Calibrated => {
            let cache = paths.calibration_cache.as_deref().ok_or(Error::Internal(
                "calibrated int8 build without a calibration cache path",
            ))?;
            a.extend(["--int8".into(), "--fp16".into(), format!("--calib={cache}")]);
        }
    }
    if line == TrtLine::V11 && *path == PrecisionPath::StronglyTyped {
        // A no-op in 11.x (always strongly typed) but documents the intent in logs.
        a.push("--stronglyTyped".into());
    }
    if dynamic {
        let list = |f: fn(&InputProfile) -> &[u64]| {
            shape_list(profile.iter().map(|p| (p.name.as_str(), f(p))))
        };
        a.push(format!("--minShapes={}", list(|p| &p.min)));
        a.push(format!("--optShapes={}", list(|p| &p.opt)));
        a.push(format!("--maxShapes={}", list(|p| &p.max)));
    }
    if let Some(mib) = trt.workspace_mib {
        a.push(format!("--memPoolSize=workspace:{mib}M"));
    }
    if let Some(level) = trt.builder_optimization_level {
        if level > 5 {
            return Err(Error::Flag {
                flag: "builder optimization level",
                value: level.to_string(),
                reason: "must be 0 to 5".into(),
            });
        }
        a.push(format!("--builderOptimizationLevel={level}"));
    }
    if trt.lean_runtime {
        a.push("--versionCompatible".into());
        a.push("--excludeLeanRuntime".into());
    }
    match trt.hardware_compat {
        HardwareCompat::None => {}
        HardwareCompat::AmperePlus => a.push("--hardwareCompatibilityLevel=ampere+".into()),
        HardwareCompat::SameComputeCapability => {
            if trt.tensorrt
                < "10.9"
                    .parse()
                    .map_err(|_| Error::Internal("version literal"))?
            {
                return Err(Error::Flag {
                    flag: "hardware compatibility level",
                    value: "sameComputeCapability".into(),
                    reason: format!(
                        "needs TensorRT 10.9 or newer, the target uses {}",
                        trt.tensorrt
                    ),
                });
            }
            a.push("--hardwareCompatibilityLevel=sameComputeCapability".into());
        }
    }
    // Profiling happens in separate runs per batch size (see `profile_args`).
    a.push("--skipInference".into());
    Ok(a)
}

/// The arguments of the trtexec run that times the built engine at batch size `batch`.
pub(crate) fn profile_args(
    trt: &TrtSpec,
    profile: &[InputProfile],
    batch: u32,
    dynamic: bool,
    engine: &str,
    times_json: &str,
    layers_json: &str,
) -> Vec<String> {
    let mut a = vec![format!("--loadEngine={engine}")];
    if trt.lean_runtime {
        // The plan excludes the lean runtime: time it on the lean library of the installation,
        // as infer-serve runs it. `--useRuntime=lean` alone does exactly that; adding
        // `--leanDLLPath` makes trtexec create its parent runtime from the lean library and
        // `loadRuntime` on it, a combination its documentation does not describe.
        a.push("--useRuntime=lean".into());
    }
    if dynamic {
        let shapes: Vec<(String, Vec<u64>)> = profile
            .iter()
            .map(|p| {
                let mut d = p.opt.clone();
                if let Some(first) = d.first_mut() {
                    *first = batch as u64;
                }
                (p.name.clone(), d)
            })
            .collect();
        a.push(format!(
            "--shapes={}",
            shape_list(shapes.iter().map(|(n, d)| (n.as_str(), d.as_slice())))
        ));
    }
    a.extend([
        "--warmUp=200".into(),
        "--duration=1".into(),
        "--iterations=50".into(),
        "--separateProfileRun".into(),
        format!("--exportTimes={times_json}"),
        format!("--exportProfile={layers_json}"),
    ]);
    a
}

/// What a trtexec log says about itself.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct TrtexecLog {
    /// `Some(true)` on `&&&& PASSED`, `Some(false)` on `&&&& FAILED`, `None` when neither printed.
    pub passed: Option<bool>,
    /// From `&&&& RUNNING TensorRT.trtexec [TensorRT v100800] [b43]`: `10.8.0.43`.
    pub version: Option<Version>,
    /// `Selected Device: NVIDIA L4`.
    pub device: Option<String>,
    /// `Compute Capability: 8.9`.
    pub compute_capability: Option<ComputeCapability>,
    /// `Engine built in 12.3 sec.`
    pub build_seconds: Option<f64>,
}

/// Decode `NV_TENSORRT_VERSION`: `8601` is 8.6.1 (8.x: major*1000+minor*100+patch), `101600` is
/// 10.16.0 (10.x+: major*10000+minor*100+patch).
pub(crate) fn decode_version_number(n: u64, build: Option<u64>) -> Option<Version> {
    let (major, minor, patch) = if n >= 100_000 {
        (n / 10_000, (n / 100) % 100, n % 100)
    } else if n >= 1_000 {
        (n / 1_000, (n / 100) % 10, n % 100)
    } else {
        return None;
    };
    let text = match build {
        Some(b) => format!("{major}.{minor}.{patch}.{b}"),
        None => format!("{major}.{minor}.{patch}"),
    };
    text.parse().ok()
}

/// Parse trtexec's stdout (lines prefixed `[MM/DD/YYYY-HH:MM:SS] [I] `).
pub(crate) fn parse_log(text: &str) -> TrtexecLog {
    let mut log = TrtexecLog::default();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("&&&& ") {
            if rest.starts_with("PASSED") {
                log.passed = Some(true);
            } else if rest.starts_with("FAILED") {
                log.passed = Some(false);
            } else if rest.starts_with("RUNNING") {
                log.version = parse_running_line(rest);
            }
            continue;
        }
        let msg = strip_log_prefix(line);
        if let Some(v) = msg.strip_prefix("Selected Device: ") {
            log.device = Some(v.trim().to_string());
        } else if let Some(v) = msg.strip_prefix("Compute Capability: ") {
            log.compute_capability = v.trim().parse().ok();
        } else if let Some(v) = msg.strip_prefix("Engine built in ") {
            log.build_seconds = v
                .trim_end_matches(['.', ' '])
                .trim_end_matches("sec")
                .trim()
                .parse()
                .ok();
        }
    }
    log
}

fn parse_running_line(rest: &str) -> Option<Version> {
    let after = rest.split_once("[TensorRT v")?.1;
    let (num, tail) = after.split_once(']')?;
    let n: u64 = num.trim().parse().ok()?;
    let build = tail
        .trim_start()
        .strip_prefix("[b")
        .and_then(|t| t.split_once(']'))
        .and_then(|(b, _)| b.parse().ok());
    decode_version_number(n, build)
}

/// Remove `[timestamp] [I] ` and `[TRT] ` prefixes.
fn strip_log_prefix(line: &str) -> &str {
    let mut s = line.trim_start();
    for _ in 0..3 {
        if s.starts_with('[') {
            if let Some((_, rest)) = s.split_once("] ") {
                s = rest;
                continue;
            }
        }
        break;
    }
    s
}

/// trtexec writes C++ stream output as JSON; non-finite floats come out as `nan` or `inf`,
/// which JSON lacks. Turn those into `null` before parsing.
fn sanitize_json(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, piece) in text.split(':').enumerate() {
        if i > 0 {
            out.push(':');
            let trimmed = piece.trim_start();
            let lead = &piece[..piece.len() - trimmed.len()];
            for bad in ["-nan", "nan", "-inf", "inf"] {
                if let Some(rest) = trimmed.strip_prefix(bad) {
                    if rest.trim_start().starts_with([',', '}', ']']) || rest.trim().is_empty() {
                        out.push_str(lead);
                        out.push_str("null");
                        out.push_str(rest);
                        break;
                    }
                }
            }
            if out.ends_with(':') {
                out.push_str(piece);
            }
        } else {
            out.push_str(piece);
        }
    }
    out
}

#[derive(Deserialize)]
struct TimeRecord {
    #[serde(rename = "computeMs")]
    compute_ms: Option<f64>,
}

/// Summarise `--exportTimes` JSON (one record per timed inference) into a [`BatchTiming`]: the
/// median, minimum and maximum of `computeMs`, in microseconds.
pub(crate) fn parse_times(batch: u32, bytes: &[u8]) -> Result<BatchTiming, String> {
    let text = String::from_utf8_lossy(bytes);
    let records: Vec<TimeRecord> =
        serde_json::from_str(&sanitize_json(&text)).map_err(|e| e.to_string())?;
    let mut ms: Vec<f64> = records
        .iter()
        .filter_map(|r| r.compute_ms)
        .filter(|v| v.is_finite() && *v >= 0.0)
        .collect();
    if ms.is_empty() {
        return Err("no timed inferences with computeMs".into());
    }
    ms.sort_by(f64::total_cmp);
    Ok(BatchTiming {
        batch,
        median_us: round_us(median_sorted(&ms) * 1000.0),
        min_us: round_us(ms[0] * 1000.0),
        max_us: round_us(ms[ms.len() - 1] * 1000.0),
        runs: ms.len() as u32,
        layers: Vec::new(),
    })
}

#[derive(Deserialize)]
#[serde(untagged)]
enum ProfileRecord {
    Layer {
        name: String,
        #[serde(rename = "averageMs")]
        average_ms: Option<f64>,
        percentage: Option<f64>,
    },
    Count {
        #[allow(
            dead_code,
            reason = "parsed to accept the document; the timings are what is used"
        )]
        count: u64,
    },
}

/// Parse `--exportProfile` JSON (`[{"count": N}, {"name", "timeMs", "averageMs", "medianMs",
/// "percentage"}, …]`) into the `top` layers by share of time.
pub(crate) fn parse_layer_profile(bytes: &[u8], top: usize) -> Result<Vec<LayerTiming>, String> {
    let text = String::from_utf8_lossy(bytes);
    let records: Vec<ProfileRecord> =
        serde_json::from_str(&sanitize_json(&text)).map_err(|e| e.to_string())?;
    let mut layers: Vec<LayerTiming> = records
        .into_iter()
        .filter_map(|r| match r {
            ProfileRecord::Layer {
                name,
                average_ms,
                percentage,
            } => Some(LayerTiming {
                name,
                average_us: round_us(average_ms.filter(|v| v.is_finite())? * 1000.0),
                percent: percentage
                    .filter(|v| v.is_finite())
                    .map(round_us)
                    .unwrap_or(0.0),
            }),
            ProfileRecord::Count { .. } => None,
        })
        .collect();
    layers.sort_by(|a, b| {
        b.percent
            .total_cmp(&a.percent)
            .then_with(|| a.name.cmp(&b.name))
    });
    layers.truncate(top);
    Ok(layers)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A realistic `--exportTimes` file as trtexec 10.x writes it (stream formatting included).
    pub(crate) const TIMES_JSON: &str = r#"[
  { "startEnqMs" : 0.412, "endEnqMs" : 0.45, "startH2dMs" : 0.418, "endH2dMs" : 0.43, "startComputeMs" : 0.431, "endComputeMs" : 0.612, "startD2hMs" : 0.613, "endD2hMs" : 0.62, "h2dMs" : 0.012, "computeMs" : 0.181, "d2hMs" : 0.007, "latencyMs" : 0.2 }
, { "startEnqMs" : 0.9, "endEnqMs" : 0.93, "startH2dMs" : 0.905, "endH2dMs" : 0.917, "startComputeMs" : 0.918, "endComputeMs" : 1.1, "startD2hMs" : 1.101, "endD2hMs" : 1.108, "h2dMs" : 0.012, "computeMs" : 0.182, "d2hMs" : 0.007, "latencyMs" : 0.201 }
, { "startEnqMs" : 1.4, "endEnqMs" : 1.43, "startH2dMs" : 1.405, "endH2dMs" : 1.417, "startComputeMs" : 1.418, "endComputeMs" : 1.597, "startD2hMs" : 1.598, "endD2hMs" : 1.605, "h2dMs" : 0.012, "computeMs" : 0.179, "d2hMs" : 0.007, "latencyMs" : 0.198 }
, { "startEnqMs" : 1.9, "endEnqMs" : 1.93, "startH2dMs" : 1.905, "endH2dMs" : 1.917, "startComputeMs" : 1.918, "endComputeMs" : 2.168, "startD2hMs" : 2.169, "endD2hMs" : 2.176, "h2dMs" : 0.012, "computeMs" : 0.25, "d2hMs" : 0.007, "latencyMs" : nan }
]
"#;

    pub(crate) const PROFILE_JSON: &str = r#"[
  { "count" : 1204 }
, { "name" : "/fc1/Gemm + /Relu", "timeMs" : 48.1, "averageMs" : 0.04, "medianMs" : 0.039, "percentage" : 61.2 }
, { "name" : "/fc2/Gemm", "timeMs" : 25.3, "averageMs" : 0.021, "medianMs" : 0.02, "percentage" : 32.2 }
, { "name" : "Reformatting CopyNode for Input Tensor 0 to /fc1/Gemm", "timeMs" : 5.2, "averageMs" : 0.0043, "medianMs" : 0.0041, "percentage" : 6.6 }
, { "name" : "idle", "timeMs" : 0, "averageMs" : 0, "medianMs" : 0, "percentage" : -nan }
]
"#;

    #[test]
    fn fp8_needs_a_qdq_model_and_builds_explicitly() {
        let v = |s: &str| s.parse().unwrap();
        let mut summary = OnnxSummary {
            op_types: ["Conv".to_string()].into_iter().collect(),
            inputs: Vec::new(),
            fp16_tensors: false,
            input_dim_names: Vec::new(),
            outputs: Vec::new(),
            data_dependent: Vec::new(),
            embedding_rows: Vec::new(),
        };
        let trt = |version: &str| {
            TrtSpec::new(
                v(version),
                v("12.9"),
                ComputeCapability::new(8, 9),
                v("575.57"),
            )
        };
        let plain = precision_path("sm89-fp8", &trt("10.16.1.11"), Precision::Fp8, &summary);
        assert!(
            matches!(&plain, Err(Error::Precision { reason, .. }) if reason.contains("FP8 Q/DQ")),
            "{plain:?}"
        );
        summary.op_types.insert("QuantizeLinear".into());
        summary.op_types.insert("DequantizeLinear".into());
        let p10 = precision_path("sm89-fp8", &trt("10.16.1.11"), Precision::Fp8, &summary).unwrap();
        assert_eq!(p10, PrecisionPath::Fp8Explicit);
        let args = build_args(
            &trt("10.16.1.11"),
            &p10,
            &[],
            false,
            &BuildPaths::placeholders(false),
        )
        .unwrap();
        assert_eq!(args[3..5], ["--fp8", "--fp16"]);
        let p11 = precision_path("sm89-fp8", &trt("11.4.0.106"), Precision::Fp8, &summary).unwrap();
        assert_eq!(p11, PrecisionPath::StronglyTyped);
        let args = build_args(
            &trt("11.4.0.106"),
            &p11,
            &[],
            false,
            &BuildPaths::placeholders(false),
        )
        .unwrap();
        assert!(
            !args.iter().any(|a| a == "--fp8" || a == "--fp16"),
            "{args:?}"
        );
        assert!(args.contains(&"--stronglyTyped".to_string()), "{args:?}");
    }

    #[test]
    fn times_json_summary() {
        let t = parse_times(8, TIMES_JSON.as_bytes()).unwrap();
        assert_eq!((t.batch, t.runs), (8, 4));
        assert_eq!(t.median_us, 181.5);
        assert_eq!(t.min_us, 179.0);
        assert_eq!(t.max_us, 250.0);
        assert!(parse_times(1, b"[]")
            .unwrap_err()
            .contains("no timed inferences"));
        assert!(parse_times(1, b"[{\"computeMs\" : 1").is_err());
        // Older trtexec (8.x) records carry more fields; they are ignored.
        let old = r#"[ { "startInMs" : 0, "inMs" : 0.1, "computeMs" : 2.0, "outMs" : 0.1, "latencyMs" : 2.2, "endToEndMs" : 2.3 } ]"#;
        assert_eq!(parse_times(1, old.as_bytes()).unwrap().median_us, 2000.0);
    }

    #[test]
    fn layer_profile_top_layers() {
        let l = parse_layer_profile(PROFILE_JSON.as_bytes(), 2).unwrap();
        assert_eq!(l.len(), 2);
        assert_eq!(l[0].name, "/fc1/Gemm + /Relu");
        assert_eq!((l[0].average_us, l[0].percent), (40.0, 61.2));
        assert_eq!(l[1].name, "/fc2/Gemm");
        let all = parse_layer_profile(PROFILE_JSON.as_bytes(), 10).unwrap();
        assert_eq!(all.len(), 4);
        assert_eq!(all[3].percent, 0.0);
        assert!(parse_layer_profile(b"{}", 3).is_err());
    }

    #[test]
    fn sanitize_only_touches_bare_non_finite_values() {
        assert_eq!(
            sanitize_json(r#"{"a" : nan, "b" : -inf}"#),
            r#"{"a" : null, "b" : null}"#
        );
        assert_eq!(
            sanitize_json(r#"{"name" : "nano:info", "x": 1}"#),
            r#"{"name" : "nano:info", "x": 1}"#
        );
        assert_eq!(sanitize_json(r#"[{"x" :inf}]"#), r#"[{"x" :null}]"#);
    }

    #[test]
    fn log_parsing() {
        let log =
            "&&&& RUNNING TensorRT.trtexec [TensorRT v100800] [b43] # trtexec --onnx=m.onnx\n\
[11/29/2026-10:00:01] [I] === Device Information ===\n\
[11/29/2026-10:00:01] [I] Selected Device: NVIDIA L4\n\
[11/29/2026-10:00:01] [I] Compute Capability: 8.9\n\
[11/29/2026-10:00:01] [I] TensorRT version: 10.8.0\n\
[11/29/2026-10:00:09] [I] Engine built in 7.81 sec.\n\
&&&& PASSED TensorRT.trtexec [TensorRT v100800] [b43] # trtexec --onnx=m.onnx\n";
        let p = parse_log(log);
        assert_eq!(p.passed, Some(true));
        assert_eq!(p.version.unwrap().to_string(), "10.8.0.43");
        assert_eq!(p.device.as_deref(), Some("NVIDIA L4"));
        assert_eq!(p.compute_capability, Some(ComputeCapability::new(8, 9)));
        assert_eq!(p.build_seconds, Some(7.81));
        let failed = parse_log("&&&& RUNNING TensorRT.trtexec [TensorRT v8601] [b6] # trtexec\n[E] Unknown option: --fp16\n&&&& FAILED TensorRT.trtexec [TensorRT v8601] [b6] # trtexec\n");
        assert_eq!(failed.passed, Some(false));
        assert_eq!(failed.version.unwrap().to_string(), "8.6.1.6");
        assert_eq!(parse_log("garbage\n"), TrtexecLog::default());
    }

    #[test]
    fn version_numbers() {
        let d = |n, b| decode_version_number(n, b).map(|v| v.to_string());
        assert_eq!(d(8601, Some(6)).as_deref(), Some("8.6.1.6"));
        assert_eq!(d(101600, None).as_deref(), Some("10.16.0"));
        assert_eq!(d(110400, Some(106)).as_deref(), Some("11.4.0.106"));
        assert_eq!(d(12, None), None);
    }

    #[test]
    fn shape_lists() {
        let a = [1u64, 64];
        let b = [1u64, 8];
        assert_eq!(
            shape_list([("input", &a[..]), ("mask", &b[..])]),
            "input:1x64,mask:1x8"
        );
        assert_eq!(shape_list([("Input:0", &a[..])]), "'Input:0':1x64");
    }
}
