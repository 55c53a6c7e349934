//! The engine stage: golden trtexec/Polygraphy argument vectors per TensorRT version (through
//! the recording fake of `process`), the cache key in both directions, cache hits, refusals,
//! `lookup` of engines built elsewhere, and the CPU engine built with tract for real.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use infer_build::engine::{self, Cache, Calibration, EngineSpec, InputSpec, Toolchain, TrtSpec};
use infer_build::process::{Cmd, Output, RecordingRunner};
use infer_spec::engine::{
    check_compat, ComputeCapability, EngineMeta, Found, FoundCpu, FoundGpu, HardwareCompat,
    Precision,
};

use super::support;

const TIMES_JSON: &str = r#"[
  { "startEnqMs" : 0.412, "endEnqMs" : 0.45, "startH2dMs" : 0.418, "endH2dMs" : 0.43, "startComputeMs" : 0.431, "endComputeMs" : 0.612, "startD2hMs" : 0.613, "endD2hMs" : 0.62, "h2dMs" : 0.012, "computeMs" : 0.181, "d2hMs" : 0.007, "latencyMs" : 0.2 }
, { "startEnqMs" : 0.9, "endEnqMs" : 0.93, "startH2dMs" : 0.905, "endH2dMs" : 0.917, "startComputeMs" : 0.918, "endComputeMs" : 1.1, "startD2hMs" : 1.101, "endD2hMs" : 1.108, "h2dMs" : 0.012, "computeMs" : 0.182, "d2hMs" : 0.007, "latencyMs" : 0.201 }
, { "startEnqMs" : 1.4, "endEnqMs" : 1.43, "startH2dMs" : 1.405, "endH2dMs" : 1.417, "startComputeMs" : 1.418, "endComputeMs" : 1.597, "startD2hMs" : 1.598, "endD2hMs" : 1.605, "h2dMs" : 0.012, "computeMs" : 0.179, "d2hMs" : 0.007, "latencyMs" : 0.198 }
]
"#;

const LAYERS_JSON: &str = r#"[
  { "count" : 1204 }
, { "name" : "/fc1/Gemm + /Relu", "timeMs" : 48.1, "averageMs" : 0.04, "medianMs" : 0.039, "percentage" : 61.2 }
, { "name" : "/fc2/Gemm", "timeMs" : 25.3, "averageMs" : 0.021, "medianMs" : 0.02, "percentage" : 38.8 }
]
"#;

fn fixture(name: &str) -> PathBuf {
    support::root().join("tests/fixtures/engine").join(name)
}

fn mlp() -> PathBuf {
    support::root().join("examples/mlp/mlp.onnx")
}

/// `NV_TENSORRT_VERSION` and build of a version string, as trtexec prints them.
pub(crate) fn trt_banner(version: &str) -> String {
    let p: Vec<u64> = version.split('.').map(|s| s.parse().unwrap()).collect();
    let n = if p[0] >= 10 {
        p[0] * 10_000 + p[1] * 100 + p[2]
    } else {
        p[0] * 1_000 + p[1] * 100 + p[2]
    };
    format!("[TensorRT v{n}] [b{}]", p[3])
}

pub(crate) fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Stand-ins for the GPU tools of a TensorRT builder image, in `dir`: `nvidia-smi` answers
/// `smi` (`compute_cap, driver_version, name`), `trtexec` of TensorRT `version` (the GA build,
/// `10.16.1.11`) writes the files it is asked to write ([`TIMES_JSON`], [`LAYERS_JSON`]); the
/// engine's bytes name its flags.
pub(crate) fn fake_gpu_tools(dir: &Path, smi: &str, version: &str) {
    fake_gpu_tools_logged(dir, smi, version, None)
}

/// [`fake_gpu_tools`] that also appends each call's arguments to `log`, and whose trtexec
/// sleeps `$FAKE_TRTEXEC_SLEEP` seconds after writing the engine (to be killed mid-build).
pub(crate) fn fake_gpu_tools_logged(dir: &Path, smi: &str, version: &str, log: Option<&Path>) {
    std::fs::create_dir_all(dir).unwrap();
    let logged = |tool: &str| match log {
        Some(l) => format!("echo \"{tool} $*\" >> '{}'\n", l.display()),
        None => String::new(),
    };
    write_script(
        &dir.join("nvidia-smi"),
        &format!("#!/bin/sh\n{}echo '{smi}'\n", logged("nvidia-smi")),
    );
    let banner = trt_banner(version);
    let device = smi.rsplit(", ").next().unwrap_or_default();
    write_script(
        &dir.join("trtexec"),
        &format!(
            r#"#!/bin/bash
# Stand-in for trtexec {version} on a machine without a GPU: the engine bytes depend on the flags.
{log}flags=()
for a in "$@"; do [[ $a == */* ]] || flags+=("$a"); done
for a in "$@"; do
  case $a in
    --saveEngine=*) printf 'fake plan {version} %s' "${{flags[*]}}" > "${{a#*=}}"
                    [ -n "$FAKE_TRTEXEC_SLEEP" ] && sleep "$FAKE_TRTEXEC_SLEEP" ;;
    --exportTimes=*) cat > "${{a#*=}}" <<'JSON'
{TIMES_JSON}JSON
    ;;
    --exportProfile=*) cat > "${{a#*=}}" <<'JSON'
{LAYERS_JSON}JSON
    ;;
  esac
done
echo "&&&& RUNNING TensorRT.trtexec {banner} # trtexec $*"
echo "[I] Selected Device: {device}"
echo "&&&& PASSED TensorRT.trtexec {banner} # trtexec $*"
"#,
            log = logged("trtexec"),
        ),
    );
}

/// A GPU builder host as the tools would answer: nvidia-smi reports `gpu`, trtexec is
/// `trtexec_version` and writes the files it is asked to write, Polygraphy writes a cache.
fn fake_host(gpu: &'static str, trtexec_version: &'static str) -> RecordingRunner {
    RecordingRunner::new(move |cmd: &Cmd| match cmd.program.as_str() {
        "nvidia-smi" => Output::ok(format!("{gpu}\n")),
        "trtexec" => {
            for a in &cmd.args {
                if let Some(p) = a.strip_prefix("--saveEngine=") {
                    // Engine bytes depend on the flags (not the paths), like a real build.
                    let flags: Vec<&str> = cmd
                        .args
                        .iter()
                        .filter(|a| !a.contains('/'))
                        .map(String::as_str)
                        .collect();
                    fs::write(
                        p,
                        format!("fake plan {trtexec_version} {}", flags.join(" ")),
                    )
                    .unwrap();
                }
                if let Some(p) = a.strip_prefix("--exportTimes=") {
                    fs::write(p, TIMES_JSON).unwrap();
                }
                if let Some(p) = a.strip_prefix("--exportProfile=") {
                    fs::write(p, LAYERS_JSON).unwrap();
                }
            }
            let banner = trt_banner(trtexec_version);
            Output::ok(format!(
                "&&&& RUNNING TensorRT.trtexec {banner} # trtexec\n[11/29/2026-10:00:01] [I] Selected Device: NVIDIA L4\n&&&& PASSED TensorRT.trtexec {banner} # trtexec\n"
            ))
        }
        "polygraphy" => {
            let i = cmd
                .args
                .iter()
                .position(|a| a == "--calibration-cache")
                .unwrap();
            fs::write(
                &cmd.args[i + 1],
                "TRT-100800-EntropyCalibration2\ninput: 3c008912\n",
            )
            .unwrap();
            Output::ok("[I] Saved calibration cache\n")
        }
        other => Output::failed(127, format!("{other}: not on this fake host")),
    })
}

fn trt_spec(version: &str, cuda: &str) -> TrtSpec {
    TrtSpec::new(
        version.parse().unwrap(),
        cuda.parse().unwrap(),
        ComputeCapability::new(8, 9),
        "570.26".parse().unwrap(),
    )
}

fn spec(onnx: PathBuf, width: i64, precision: Precision, toolchain: Toolchain) -> EngineSpec {
    let target = match &toolchain {
        Toolchain::Cpu => format!("cpu-{precision}"),
        Toolchain::Tensorrt(t) => format!("{}-{precision}", t.sm.target_id()),
    };
    EngineSpec {
        model: "mlp".into(),
        target,
        precision,
        onnx,
        inputs: vec![InputSpec {
            name: "input".into(),
            datatype: infer_spec::DataType::F32,
            shape: vec![-1, width],
            profile: None,
        }],
        max_batch: 32,
        opt_batch: 16,
        batch_sizes: vec![8, 16, 32],
        toolchain,
        onnxruntime: None,
        openvino: None,
        folding: None,
        convert: None,
        gate: None,
    }
}

/// Replace the temp paths in recorded argument vectors with stable names.
fn normalize(calls: &[Cmd], cache: &Path, onnx: &Path) -> Vec<Vec<String>> {
    let cache = cache.to_string_lossy().into_owned();
    let staging = format!("{cache}/v1/staging/");
    calls
        .iter()
        .map(|c| {
            c.argv()
                .into_iter()
                .map(|a| {
                    let mut a = a.replace(&*onnx.to_string_lossy(), "$ONNX");
                    if let Some(i) = a.find(&staging) {
                        let rest = &a[i + staging.len()..];
                        let end = rest
                            .find('/')
                            .map(|j| i + staging.len() + j)
                            .unwrap_or(a.len());
                        a.replace_range(i..end, "$STAGING");
                    }
                    a.replace(&cache, "$CACHE")
                })
                .collect()
        })
        .collect()
}

struct Case {
    trt: &'static str,
    precision: Precision,
    lean: bool,
    /// The expected trtexec build vector (program included).
    build: &'static [&'static str],
}

fn run_case(case: &Case) {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::open(tmp.path()).unwrap();
    let cuda = if case.trt.starts_with("8.") {
        "12.0"
    } else {
        "12.8"
    };
    let mut t = trt_spec(case.trt, cuda);
    t.lean_runtime = case.lean;
    let eleven = case.trt.starts_with("11.");
    let (onnx, width) = match (eleven, case.precision) {
        (true, Precision::Fp16) => (fixture("mlp_fp16.onnx"), 4),
        (true, Precision::Int8) => (fixture("mlp_qdq.onnx"), 4),
        _ => (mlp(), 64),
    };
    if case.precision == Precision::Int8 && !eleven {
        let c = tmp.path().join("calib.cache");
        fs::write(&c, "TRT-100800-EntropyCalibration2\ninput: 3c008912\n").unwrap();
        t.calibration = Some(Calibration::Cache(c));
    }
    let mut s = spec(onnx.clone(), width, case.precision, Toolchain::Tensorrt(t));
    if eleven && case.precision == Precision::Fp16 {
        s.inputs[0].datatype = infer_spec::DataType::F16;
    }
    let runner = fake_host("8.9, 570.86.10, NVIDIA L4", case.trt);
    let art = engine::build(&s, &cache, &runner)
        .unwrap_or_else(|e| panic!("{} {:?}: {e}", case.trt, case.precision));
    let calls = normalize(&runner.calls(), tmp.path(), &onnx);
    assert_eq!(
        calls[0],
        [
            "nvidia-smi",
            "--query-gpu=compute_cap,driver_version,name",
            "--format=csv,noheader"
        ]
    );
    assert_eq!(
        calls[1], case.build,
        "build vector for TensorRT {} {:?} lean={}",
        case.trt, case.precision, case.lean
    );
    // One profiling run per planned batch size, after the build.
    let batches: Vec<String> = calls[2..]
        .iter()
        .map(|c| {
            c.iter()
                .find(|a| a.starts_with("--shapes="))
                .cloned()
                .unwrap()
        })
        .collect();
    assert_eq!(
        batches,
        [1, 8, 16, 32].map(|b| format!("--shapes=input:{b}x{width}"))
    );
    // Lean engines are timed on the lean runtime as infer-serve runs them: `--useRuntime=lean`
    // alone, never with `--leanDLLPath` (trtexec documents no such combination).
    assert_eq!(
        calls[2].iter().any(|a| a == "--useRuntime=lean"),
        case.lean,
        "{:?}",
        calls[2]
    );
    assert!(
        !calls[2].iter().any(|a| a.starts_with("--leanDLLPath")),
        "{:?}",
        calls[2]
    );

    let g = art.meta.gpu.as_ref().unwrap();
    assert_eq!(g.tensorrt.to_string(), case.trt);
    assert_eq!(
        (g.version_compatible, g.exclude_lean_runtime),
        (case.lean, case.lean)
    );
    assert_eq!(g.builder_gpu, "NVIDIA L4");
    assert_eq!(art.profile.source, infer_spec::engine::TimedBy::Trtexec);
    assert_eq!(art.profile.batches.len(), 4);
    assert_eq!(art.profile.batches[0].median_us, 181.0);
    assert_eq!(art.profile.batches[0].layers[0].name, "/fc1/Gemm + /Relu");
    assert!(!art.cached);
    assert!(art.engine.ends_with("engine.plan"));
}

const ONNX: &str = "--onnx=$ONNX";
const SAVE: &str = "--saveEngine=$STAGING/engine.plan";
const MIN64: &str = "--minShapes=input:1x64";
const OPT64: &str = "--optShapes=input:16x64";
const MAX64: &str = "--maxShapes=input:32x64";
const MIN4: &str = "--minShapes=input:1x4";
const OPT4: &str = "--optShapes=input:16x4";
const MAX4: &str = "--maxShapes=input:32x4";
const CALIB: &str = "--calib=$STAGING/calibration.cache";

#[test]
fn golden_trtexec_vectors_tensorrt_8_6() {
    const TC: &str = "--timingCacheFile=$CACHE/v1/timing/trt-8.6.1.6-sm_89-NVIDIA-L4.cache";
    for case in [
        Case {
            trt: "8.6.1.6",
            precision: Precision::Fp16,
            lean: false,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--fp16",
                MIN64,
                OPT64,
                MAX64,
                "--skipInference",
            ],
        },
        Case {
            trt: "8.6.1.6",
            precision: Precision::Fp16,
            lean: true,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--fp16",
                MIN64,
                OPT64,
                MAX64,
                "--versionCompatible",
                "--excludeLeanRuntime",
                "--skipInference",
            ],
        },
        Case {
            trt: "8.6.1.6",
            precision: Precision::Int8,
            lean: false,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--int8",
                "--fp16",
                CALIB,
                MIN64,
                OPT64,
                MAX64,
                "--skipInference",
            ],
        },
        Case {
            trt: "8.6.1.6",
            precision: Precision::Int8,
            lean: true,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--int8",
                "--fp16",
                CALIB,
                MIN64,
                OPT64,
                MAX64,
                "--versionCompatible",
                "--excludeLeanRuntime",
                "--skipInference",
            ],
        },
    ] {
        run_case(&case);
    }
}

#[test]
fn golden_trtexec_vectors_tensorrt_10() {
    const TC: &str = "--timingCacheFile=$CACHE/v1/timing/trt-10.8.0.43-sm_89-NVIDIA-L4.cache";
    for case in [
        Case {
            trt: "10.8.0.43",
            precision: Precision::Fp16,
            lean: false,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--fp16",
                MIN64,
                OPT64,
                MAX64,
                "--skipInference",
            ],
        },
        Case {
            trt: "10.8.0.43",
            precision: Precision::Fp16,
            lean: true,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--fp16",
                MIN64,
                OPT64,
                MAX64,
                "--versionCompatible",
                "--excludeLeanRuntime",
                "--skipInference",
            ],
        },
        Case {
            trt: "10.8.0.43",
            precision: Precision::Int8,
            lean: false,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--int8",
                "--fp16",
                CALIB,
                MIN64,
                OPT64,
                MAX64,
                "--skipInference",
            ],
        },
        Case {
            trt: "10.8.0.43",
            precision: Precision::Int8,
            lean: true,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--int8",
                "--fp16",
                CALIB,
                MIN64,
                OPT64,
                MAX64,
                "--versionCompatible",
                "--excludeLeanRuntime",
                "--skipInference",
            ],
        },
    ] {
        run_case(&case);
    }
}

#[test]
fn golden_trtexec_vectors_tensorrt_11() {
    const TC: &str = "--timingCacheFile=$CACHE/v1/timing/trt-11.4.0.106-sm_89-NVIDIA-L4.cache";
    for case in [
        Case {
            trt: "11.4.0.106",
            precision: Precision::Fp16,
            lean: false,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--stronglyTyped",
                MIN4,
                OPT4,
                MAX4,
                "--skipInference",
            ],
        },
        Case {
            trt: "11.4.0.106",
            precision: Precision::Fp16,
            lean: true,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--stronglyTyped",
                MIN4,
                OPT4,
                MAX4,
                "--versionCompatible",
                "--excludeLeanRuntime",
                "--skipInference",
            ],
        },
        Case {
            trt: "11.4.0.106",
            precision: Precision::Int8,
            lean: false,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--stronglyTyped",
                MIN4,
                OPT4,
                MAX4,
                "--skipInference",
            ],
        },
        Case {
            trt: "11.4.0.106",
            precision: Precision::Int8,
            lean: true,
            build: &[
                "trtexec",
                ONNX,
                SAVE,
                TC,
                "--stronglyTyped",
                MIN4,
                OPT4,
                MAX4,
                "--versionCompatible",
                "--excludeLeanRuntime",
                "--skipInference",
            ],
        },
    ] {
        run_case(&case);
    }
}

#[test]
fn golden_profile_vector_and_hardware_compat() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::open(tmp.path()).unwrap();
    let mut t = trt_spec("10.8.0.43", "12.8");
    t.sm = ComputeCapability::new(8, 0);
    t.hardware_compat = HardwareCompat::AmperePlus;
    let s = spec(mlp(), 64, Precision::Fp16, Toolchain::Tensorrt(t));
    // An ampere+ engine may be built on any Ampere-or-newer GPU.
    let runner = fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43");
    let art = engine::build(&s, &cache, &runner).unwrap();
    let calls = normalize(&runner.calls(), tmp.path(), &mlp());
    assert_eq!(
        calls[1],
        [
            "trtexec",
            ONNX,
            SAVE,
            "--timingCacheFile=$CACHE/v1/timing/trt-10.8.0.43-sm_89-NVIDIA-L4.cache",
            "--fp16",
            MIN64,
            OPT64,
            MAX64,
            "--hardwareCompatibilityLevel=ampere+",
            "--skipInference"
        ]
    );
    assert_eq!(
        calls[2],
        [
            "trtexec",
            "--loadEngine=$STAGING/engine.plan",
            "--shapes=input:1x64",
            "--warmUp=200",
            "--duration=1",
            "--iterations=50",
            "--separateProfileRun",
            "--exportTimes=$STAGING/times-b1.json",
            "--exportProfile=$STAGING/layers-b1.json"
        ]
    );
    assert_eq!(
        art.meta.gpu.unwrap().hardware_compat,
        HardwareCompat::AmperePlus
    );
}

#[test]
fn golden_polygraphy_calibration_then_trtexec() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::open(&tmp.path().join("cache")).unwrap();
    let data = tmp.path().join("calib");
    fs::create_dir_all(&data).unwrap();
    fs::write(data.join("batch0.npy"), b"not really npy, digested only").unwrap();
    let mut t = trt_spec("10.8.0.43", "12.8");
    t.calibration = Some(Calibration::Data(data.clone()));
    let s = spec(mlp(), 64, Precision::Int8, Toolchain::Tensorrt(t));
    let runner = fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43");
    let art = engine::build(&s, &cache, &runner).unwrap();
    let calls = runner.calls();
    let norm = normalize(&calls, &tmp.path().join("cache"), &mlp());
    assert_eq!(
        norm[1],
        [
            "polygraphy",
            "convert",
            "$ONNX",
            "--int8",
            "--data-loader-script",
            "$STAGING/calib_loader.py:load_data",
            "--calibration-cache",
            "$STAGING/calibration.cache",
            "--calib-base-cls",
            "IInt8EntropyCalibrator2",
            "--trt-min-shapes",
            "input:[1,64]",
            "--trt-opt-shapes",
            "input:[16,64]",
            "--trt-max-shapes",
            "input:[32,64]",
            "-o",
            "$STAGING/calibration-scratch.plan",
        ]
    );
    assert_eq!(
        calls[1].env[0],
        (
            "INFER_BUILD_CALIB_DIR".to_string(),
            data.to_string_lossy().into_owned()
        )
    );
    assert!(norm[2].contains(&CALIB.to_string()), "{:?}", norm[2]);
    // The cache Polygraphy wrote is kept with the engine; the scratch engine and loader are not.
    assert!(art.dir.join("calibration.cache").is_file());
    assert!(!art.dir.join("calibration-scratch.plan").exists());
    assert!(!art.dir.join("calib_loader.py").exists());
}

fn refusal(trt: &str, onnx: PathBuf, width: i64, precision: Precision, calib: bool) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::open(tmp.path()).unwrap();
    let mut t = trt_spec(trt, "12.8");
    if calib {
        let c = tmp.path().join("c.cache");
        fs::write(&c, "TRT").unwrap();
        t.calibration = Some(Calibration::Cache(c));
    }
    let s = spec(onnx, width, precision, Toolchain::Tensorrt(t));
    let runner = fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43");
    let e = engine::build(&s, &cache, &runner).unwrap_err();
    assert!(e.is_bad_input(), "{e}");
    // Refused before any tool ran, and nothing was stored.
    assert!(runner.calls().is_empty(), "{:?}", runner.calls());
    assert_eq!(fs::read_dir(cache.entries_dir()).unwrap().count(), 0);
    e.to_string()
}

#[test]
fn precision_refusals() {
    assert_eq!(
        refusal("11.4.0.106", mlp(), 64, Precision::Fp16, false),
        "target sm89-fp16 with TensorRT 11.4.0.106: TensorRT 11 builds strongly typed networks only: the ONNX must be fp16 (infer-build converts it when the plan's precision mode is `convert`); this model has no fp16 tensors"
    );
    assert_eq!(
        refusal("11.4.0.106", mlp(), 64, Precision::Int8, false),
        "target sm89-int8 with TensorRT 11.4.0.106: TensorRT 11 builds strongly typed networks only: int8 needs a Q/DQ model (infer-build makes one from `[int8] calibration` data); this model has no QuantizeLinear/DequantizeLinear nodes"
    );
    assert!(refusal(
        "11.4.0.106",
        fixture("mlp_qdq.onnx"),
        4,
        Precision::Int8,
        true
    )
    .contains("TensorRT 11 has no calibration"));
    assert!(refusal("10.8.0.43", mlp(), 64, Precision::Int8, false)
        .contains("int8 needs calibration data or a calibration cache"));
    assert_eq!(
        refusal("8.5.3.1", mlp(), 64, Precision::Fp16, false),
        "TensorRT 8.5.3.1 is not supported (8.6, 10.x and 11.x are)"
    );
}

/// An output whose shape only the input values fix (NonZero's) is refused for a TensorRT target,
/// naming the output and the operator, before any tool runs (exit 2); a CPU target is not a
/// TensorRT build and does not refuse it here.
#[test]
fn a_data_dependent_output_is_refused_for_tensorrt_at_build_time() {
    let msg = refusal(
        "10.8.0.43",
        fixture("nonzero.onnx"),
        4,
        Precision::Fp16,
        false,
    );
    assert!(
        msg.starts_with("target sm89-fp16: output `indices` has a shape that depends on the input values (from NonZero)"),
        "{msg}"
    );
    assert!(refusal(
        "8.6.1.6",
        fixture("nonzero.onnx"),
        4,
        Precision::Fp16,
        false
    )
    .contains("`indices`"));
}

#[test]
fn explicit_int8_on_tensorrt_10_needs_no_calibration() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::open(tmp.path()).unwrap();
    let s = spec(
        fixture("mlp_qdq.onnx"),
        4,
        Precision::Int8,
        Toolchain::Tensorrt(trt_spec("10.8.0.43", "12.8")),
    );
    let runner = fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43");
    engine::build(&s, &cache, &runner).unwrap();
    let calls = normalize(&runner.calls(), tmp.path(), &fixture("mlp_qdq.onnx"));
    assert_eq!(calls[1][4..6], ["--int8", "--fp16"]);
    assert!(!calls[1].iter().any(|a| a.starts_with("--calib")));
}

#[test]
fn gpu_and_tool_refusals() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::open(tmp.path()).unwrap();
    let s = spec(
        mlp(),
        64,
        Precision::Fp16,
        Toolchain::Tensorrt(trt_spec("10.8.0.43", "12.8")),
    );

    // The GPU is another architecture: refused after nvidia-smi, before trtexec.
    let runner = fake_host("8.0, 580.95.05, NVIDIA A100-SXM4-40GB", "10.8.0.43");
    let e = engine::build(&s, &cache, &runner).unwrap_err();
    assert_eq!(e.to_string(), "cannot build target sm89-fp16 on NVIDIA A100-SXM4-40GB (sm_80, driver 580.95.05): the target needs sm_89 and sets no hardware compatibility level; build on a sm_89 GPU");
    assert_eq!(runner.calls().len(), 1);

    // The driver is below the floor.
    let runner = fake_host("8.9, 550.54.14, NVIDIA L4", "10.8.0.43");
    let e = engine::build(&s, &cache, &runner).unwrap_err();
    assert!(
        e.to_string()
            .ends_with("driver 550.54.14 is below the target's floor 570.26 (CUDA 12.8)"),
        "{e}"
    );

    // trtexec is another TensorRT than the plan says: the metadata would lie, so refuse.
    let runner = fake_host("8.9, 570.86.10, NVIDIA L4", "10.9.0.34");
    let e = engine::build(&s, &cache, &runner).unwrap_err();
    assert_eq!(e.to_string(), "trtexec is TensorRT 10.9.0.34, the target's plan needs 10.8.0.43: run the build in the matching builder image");

    // trtexec fails: its exit code and the tail of its log are reported.
    let runner = RecordingRunner::new(|c: &Cmd| {
        match c.program.as_str() {
        "nvidia-smi" => Output::ok("8.9, 570.86.10, NVIDIA L4\n"),
        _ => Output { code: Some(1), stdout: b"&&&& RUNNING TensorRT.trtexec [TensorRT v100800] [b43] # trtexec\n[E] Error[4]: network has dynamic shapes but no profile\n&&&& FAILED TensorRT.trtexec [TensorRT v100800] [b43] # trtexec\n".to_vec(), stderr: vec![] },
    }
    });
    let e = engine::build(&s, &cache, &runner).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("`trtexec --onnx="), "{msg}");
    assert!(
        msg.contains("failed (exit 1):\n") && msg.contains("no profile"),
        "{msg}"
    );

    // No trtexec on PATH.
    let runner = RecordingRunner::new(|_: &Cmd| Output::ok("8.9, 570.86.10, NVIDIA L4\n"))
        .with_installed(&["nvidia-smi"]);
    let e = engine::build(&s, &cache, &runner).unwrap_err();
    assert_eq!(e.to_string(), "`trtexec` was not found on PATH");
    // Nothing half-built is left behind.
    assert_eq!(fs::read_dir(cache.entries_dir()).unwrap().count(), 0);
    assert_eq!(
        fs::read_dir(tmp.path().join("v1/staging")).unwrap().count(),
        0
    );
}

#[test]
fn second_build_is_a_cache_hit_without_any_process() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::open(tmp.path()).unwrap();
    let s = spec(
        mlp(),
        64,
        Precision::Fp16,
        Toolchain::Tensorrt(trt_spec("10.8.0.43", "12.8")),
    );
    let runner = fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43");
    let first = engine::build(&s, &cache, &runner).unwrap();
    let n = runner.calls().len();
    let second = engine::build(&s, &cache, &runner).unwrap();
    assert_eq!(runner.calls().len(), n, "a cache hit must not run anything");
    assert!(second.cached && !first.cached);
    assert_eq!(first.meta.engine_digest, second.meta.engine_digest);
    assert_eq!(first.key, second.key);
}

fn key_of(s: &EngineSpec) -> String {
    let digest = format!("sha256:{}", support::sha256_file(&s.onnx));
    engine::key_material(s, &digest).unwrap().key()
}

#[test]
fn key_changes_with_every_input_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let onnx = tmp.path().join("m.onnx");
    fs::copy(mlp(), &onnx).unwrap();
    let base = || {
        spec(
            onnx.clone(),
            64,
            Precision::Fp16,
            Toolchain::Tensorrt(trt_spec("10.8.0.43", "12.8")),
        )
    };
    let k0 = key_of(&base());

    // Nothing else: the same inputs at another path, another cache, another time.
    let other = tmp.path().join("elsewhere/model.onnx");
    fs::create_dir_all(other.parent().unwrap()).unwrap();
    fs::copy(mlp(), &other).unwrap();
    let mut moved = base();
    moved.onnx = other;
    assert_eq!(key_of(&moved), k0);
    let mut renamed_model = base();
    renamed_model.model = "another name".into();
    assert_eq!(
        key_of(&renamed_model),
        k0,
        "the model's display name is not an engine input"
    );

    let mut keys = std::collections::BTreeSet::from([k0.clone()]);
    let mut expect_new = |what: &str, s: EngineSpec| {
        assert!(keys.insert(key_of(&s)), "{what} did not change the key");
    };
    // One byte of the ONNX (a weight's lowest bits; still a valid model).
    let mut bytes = fs::read(mlp()).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    let flipped = tmp.path().join("flipped.onnx");
    fs::write(&flipped, &bytes).unwrap();
    let mut s = base();
    s.onnx = flipped;
    expect_new("one onnx byte", s);
    let with = |f: &dyn Fn(&mut TrtSpec)| {
        let mut s = base();
        if let Toolchain::Tensorrt(t) = &mut s.toolchain {
            f(t);
        }
        s
    };
    expect_new(
        "tensorrt build",
        with(&|t| t.tensorrt = "10.8.0.44".parse().unwrap()),
    );
    expect_new(
        "tensorrt version",
        with(&|t| t.tensorrt = "10.9.0.34".parse().unwrap()),
    );
    expect_new("cuda", with(&|t| t.cuda = "12.9".parse().unwrap()));
    expect_new("lean flag", with(&|t| t.lean_runtime = true));
    expect_new(
        "hw compat flag",
        with(&|t| t.hardware_compat = HardwareCompat::AmperePlus),
    );
    expect_new(
        "opt level",
        with(&|t| t.builder_optimization_level = Some(5)),
    );
    expect_new("workspace", with(&|t| t.workspace_mib = Some(1024)));
    let c = tmp.path().join("calib.cache");
    fs::write(&c, "TRT-100800-EntropyCalibration2\ninput: 3c008912\n").unwrap();
    let mut s = with(&|t| t.calibration = Some(Calibration::Cache(c.clone())));
    s.precision = Precision::Int8;
    let k_calib = key_of(&s);
    expect_new("int8 + calibration", s.clone());
    fs::write(&c, "TRT-100800-EntropyCalibration2\ninput: 3c008913\n").unwrap();
    expect_new("one calibration byte", s.clone());
    assert_ne!(key_of(&s), k_calib);
    let mut s = base();
    s.target = "sm89-fp16-b".into();
    expect_new("target id", s);
    let mut s = base();
    s.opt_batch = 8;
    expect_new("shape profile", s);
    let mut s = base();
    s.batch_sizes = vec![4, 8, 16, 32];
    expect_new("planned batch sizes", s);
    let mut s = base();
    s.toolchain = Toolchain::Cpu;
    expect_new("backend", s);
}

#[test]
fn lookup_verifies_engines_built_elsewhere() {
    // Two "CI jobs" build into their own caches; the assembly step gets one directory holding
    // both caches' entries (as downloaded artifacts) and finds each target's engine in it.
    let jobs = tempfile::tempdir().unwrap();
    let s89 = spec(
        mlp(),
        64,
        Precision::Fp16,
        Toolchain::Tensorrt(trt_spec("10.8.0.43", "12.8")),
    );
    let mut t90 = trt_spec("10.8.0.43", "12.8");
    t90.sm = ComputeCapability::new(9, 0);
    let s90 = spec(mlp(), 64, Precision::Fp16, Toolchain::Tensorrt(t90));
    let a = engine::build(
        &s89,
        &Cache::open(&jobs.path().join("job-sm89")).unwrap(),
        &fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43"),
    )
    .unwrap();
    let b = engine::build(
        &s90,
        &Cache::open(&jobs.path().join("job-sm90")).unwrap(),
        &fake_host("9.0, 580.95.05, NVIDIA H100 80GB HBM3", "10.8.0.43"),
    )
    .unwrap();

    let found = engine::lookup(&s89, jobs.path()).unwrap();
    assert_eq!(found.meta.engine_digest, a.meta.engine_digest);
    let found = engine::lookup(&s90, jobs.path()).unwrap();
    assert_eq!(found.meta.engine_digest, b.meta.engine_digest);
    assert_eq!(
        found.meta.gpu.as_ref().unwrap().builder_gpu,
        "NVIDIA H100 80GB HBM3"
    );
    // A cache root works directly too.
    assert!(engine::lookup(&s89, &jobs.path().join("job-sm89")).is_ok());

    // The plan changed (another TensorRT build): the engine present is named and explained.
    let mut t = trt_spec("10.8.0.44", "12.8");
    t.sm = ComputeCapability::new(8, 9);
    let newer = spec(mlp(), 64, Precision::Fp16, Toolchain::Tensorrt(t));
    let e = engine::lookup(&newer, jobs.path()).unwrap_err();
    assert!(e.is_bad_input());
    assert!(
        e.to_string()
            .contains("TensorRT: plan 10.8.0.44, engine 10.8.0.43"),
        "{e}"
    );

    // A target nobody built.
    let cpu = spec(mlp(), 64, Precision::Fp32, Toolchain::Cpu);
    let e = engine::lookup(&cpu, jobs.path()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("no engine for target cpu-fp32 in "),
        "{e}"
    );

    // A tampered engine file is refused by its digest.
    fs::write(&a.engine, b"fake plan tampered").unwrap();
    let e = engine::lookup(&s89, &jobs.path().join("job-sm89")).unwrap_err();
    assert!(
        e.to_string().contains("size") || e.to_string().contains("digest"),
        "{e}"
    );

    // Tampered metadata (same key, another SM) is refused by the field check.
    let meta_path = b.dir.join("meta.json");
    let text = fs::read_to_string(&meta_path)
        .unwrap()
        .replace("\"sm\":\"sm_90\"", "\"sm\":\"sm_86\"");
    fs::write(&meta_path, text).unwrap();
    let e = engine::lookup(&s90, &jobs.path().join("job-sm90")).unwrap_err();
    assert!(
        e.to_string()
            .contains("compute capability: plan sm_90, engine sm_86"),
        "{e}"
    );
}

#[test]
fn runtime_check_refuses_a_tampered_tuple() {
    // What infer-serve does at start with the meta.json an image carries.
    let tmp = tempfile::tempdir().unwrap();
    let s = spec(
        mlp(),
        64,
        Precision::Fp16,
        Toolchain::Tensorrt(trt_spec("10.8.0.43", "12.8")),
    );
    let art = engine::build(
        &s,
        &Cache::open(tmp.path()).unwrap(),
        &fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43"),
    )
    .unwrap();
    let node = |sm: ComputeCapability| Found {
        gpu: Some(FoundGpu {
            sm,
            driver: "580.95.05".parse().unwrap(),
            name: "NVIDIA L4".into(),
        }),
        tensorrt: Some("10.8.0".parse().unwrap()),
        onnxruntime: None,
        openvino: None,
        cpu: FoundCpu::detect(),
    };
    let meta = EngineMeta::from_json(&fs::read(art.dir.join("meta.json")).unwrap()).unwrap();
    check_compat(&meta, &node(ComputeCapability::new(8, 9))).unwrap();
    let tampered = fs::read_to_string(art.dir.join("meta.json"))
        .unwrap()
        .replace("sm_89", "sm_90");
    let meta = EngineMeta::from_json(tampered.as_bytes()).unwrap();
    let e = check_compat(&meta, &node(ComputeCapability::new(8, 9))).unwrap_err();
    assert_eq!(e.to_string(), "engine for target sm89-fp16 was built for sm_90 with TensorRT 10.8.0.43 (CUDA 12.8, driver >= 570.26), this node has sm_89 (NVIDIA L4) with TensorRT 10.8.0 and driver 580.95.05: compute capability differs (sm_90 != sm_89) and the engine has no hardware compatibility level");
}

#[test]
fn concurrent_builds_of_one_key_build_once() {
    let tmp = tempfile::tempdir().unwrap();
    let s = spec(
        mlp(),
        64,
        Precision::Fp16,
        Toolchain::Tensorrt(trt_spec("10.8.0.43", "12.8")),
    );
    let runner = Arc::new(fake_host("8.9, 570.86.10, NVIDIA L4", "10.8.0.43"));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let (s, r, root) = (s.clone(), runner.clone(), tmp.path().to_path_buf());
            std::thread::spawn(move || {
                engine::build(&s, &Cache::open(&root).unwrap(), &*r).unwrap()
            })
        })
        .collect();
    let arts: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(arts.iter().filter(|a| !a.cached).count(), 1);
    let builds = runner
        .calls()
        .iter()
        .filter(|c| c.args.iter().any(|a| a.starts_with("--saveEngine=")))
        .count();
    assert_eq!(builds, 1);
}

#[test]
fn py_calibration_loader_yields_batches() {
    // The loader script Polygraphy imports, run by a real Python with numpy.
    let py = support::python();
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("calib");
    fs::create_dir_all(&data).unwrap();
    let script = tmp.path().join("loader.py");
    fs::write(&script, engine::LOADER_SCRIPT).unwrap();
    let prog = format!(
        "import numpy as np, sys; sys.path.insert(0, {dir:?}); \
         np.save({a:?}, np.ones((4, 64), np.float32)); np.save({b:?}, np.zeros((2, 64), np.float32)); \
         import loader; print([ (k, v.shape) for d in loader.load_data() for k, v in d.items() ])",
        dir = tmp.path().to_string_lossy(),
        a = data.join("0.npy").to_string_lossy(),
        b = data.join("1.npy").to_string_lossy(),
    );
    let out = match std::process::Command::new(&py)
        .args(["-c", &prog])
        .env("INFER_BUILD_CALIB_DIR", &data)
        .env("INFER_BUILD_CALIB_INPUTS", "input")
        .output()
    {
        Ok(o) => o,
        Err(_) => {
            eprintln!(
                "skipping py_calibration_loader_yields_batches: no python at {}",
                py.display()
            );
            return;
        }
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "[('input', (4, 64)), ('input', (2, 64))]"
    );
}

// ---- The `engine` command, end to end (real process spawning) ----

const GPU_RECIPE: &str = r#"
[model]
name = "mlp"
version = "1.0.0"
onnx = "mlp.onnx"

[model.inputs.input]
datatype = "fp32"
shape = [-1, 64]

[model.outputs.output]
datatype = "fp32"
shape = [-1, 10]

[targets]
gpus = ["A100"]
precision = ["fp16", "int8"]
cpu = true
tensorrt = "10"
version_compatible = true

[engine]
cpu = "tract"

[int8]
calibration = "calib.cache"

[batching]
max_batch_size = 32
preferred_batch_sizes = [8, 16, 32]
max_queue_delay_us = 500
max_queue_size = 1024
default_timeout_ms = 1000
instances = 1

[image]
repository = "localhost/infer-build/mlp"
tag = "{version}-{target}"
"#;

/// A project directory with the recipe above, the example model and a calibration cache, and a
/// `bin/` of stand-in `nvidia-smi` and `trtexec` (an A100 host with TensorRT 10.16.1, see
/// [`fake_gpu_tools_logged`]) that log their arguments to `calls.log`.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    fs::write(d.join("recipe.toml"), GPU_RECIPE).unwrap();
    fs::copy(mlp(), d.join("mlp.onnx")).unwrap();
    fs::write(
        d.join("calib.cache"),
        "TRT-101601-EntropyCalibration2\ninput: 3c008912\n",
    )
    .unwrap();
    fake_gpu_tools_logged(
        &d.join("bin"),
        "8.0, 595.58.03, NVIDIA A100-SXM4-40GB",
        "10.16.1.11",
        Some(&d.join("calls.log")),
    );
    dir
}

fn engine_cmd(project: &Path, target: &str, extra: &[&str]) -> std::process::Command {
    let mut c = support::infer_build();
    let path = format!(
        "{}:{}",
        project.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    c.current_dir(project)
        .env("PATH", path)
        .args([
            "engine",
            "recipe.toml",
            "--target",
            target,
            "--cache",
            "cache",
            "--json",
        ])
        .args(extra);
    c
}

fn engine_json(project: &Path, target: &str) -> serde_json::Value {
    let out = engine_cmd(project, target, &[]).output().unwrap();
    assert!(out.status.success(), "{}", support::stderr(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn cli_cpu_engine_is_cached_by_content() {
    let p = project();
    let first = engine_json(p.path(), "cpu-fp32");
    assert_eq!(first["cached"], false);
    assert_eq!(first["meta"]["kind"], "tract");
    let batches: Vec<u64> = first["profile"]["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch"].as_u64().unwrap())
        .collect();
    assert_eq!(batches, [1, 8, 16, 32]);
    assert!(first["profile"]["startup"]["onnx_ms"].as_f64().unwrap() > 0.0);
    let engine = PathBuf::from(first["engine"].as_str().unwrap());
    assert!(p.path().join(&engine).is_file() || engine.is_file());

    // Unchanged inputs: a cache hit reporting the same engine digest, nothing rebuilt.
    let second = engine_json(p.path(), "cpu-fp32");
    assert_eq!(second["cached"], true);
    assert_eq!(second["engine_digest"], first["engine_digest"]);
    assert_eq!(second["key"], first["key"]);
    assert_eq!(
        fs::read_dir(p.path().join("cache/v1/entries"))
            .unwrap()
            .count(),
        1
    );

    // One byte of the model (a weight's lowest bit): a new key and a new engine.
    let mut bytes = fs::read(p.path().join("mlp.onnx")).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    fs::write(p.path().join("mlp.onnx"), &bytes).unwrap();
    let third = engine_json(p.path(), "cpu-fp32");
    assert_eq!(third["cached"], false);
    assert_ne!(third["key"], first["key"]);
    assert_ne!(third["meta"]["onnx_digest"], first["meta"]["onnx_digest"]);

    // A batching change changes the profile, hence the key.
    let recipe = fs::read_to_string(p.path().join("recipe.toml"))
        .unwrap()
        .replace(
            "preferred_batch_sizes = [8, 16, 32]",
            "preferred_batch_sizes = [4, 16, 32]",
        );
    fs::write(p.path().join("recipe.toml"), recipe).unwrap();
    let fourth = engine_json(p.path(), "cpu-fp32");
    assert_ne!(fourth["key"], third["key"]);
}

#[test]
fn cli_gpu_engine_through_trtexec_on_path() {
    let p = project();
    let fp16 = engine_json(p.path(), "sm80-fp16");
    assert_eq!(fp16["meta"]["gpu"]["tensorrt"], "10.16.1.11");
    assert_eq!(fp16["meta"]["gpu"]["builder_gpu"], "NVIDIA A100-SXM4-40GB");
    assert_eq!(fp16["meta"]["gpu"]["version_compatible"], true);
    assert_eq!(fp16["profile"]["batches"][0]["median_us"], 181.0);
    let int8 = engine_json(p.path(), "sm80-int8");
    let log = fs::read_to_string(p.path().join("calls.log")).unwrap();
    let builds: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("--saveEngine="))
        .collect();
    assert_eq!(builds.len(), 2, "{log}");
    assert!(builds[0].contains(" --fp16 --minShapes=input:1x64 --optShapes=input:32x64 --maxShapes=input:32x64 --versionCompatible --excludeLeanRuntime --skipInference"), "{}", builds[0]);
    assert!(
        builds[1].contains(" --int8 --fp16 --calib="),
        "{}",
        builds[1]
    );
    let dir = p.path().join(int8["dir"].as_str().unwrap());
    assert!(dir.join("calibration.cache").is_file(), "{}", dir.display());
    // A cached GPU engine needs no GPU at all: the same call with no tools on PATH succeeds.
    let n = log.lines().count();
    let out = engine_cmd(p.path(), "sm80-fp16", &[])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", support::stderr(&out));
    assert_eq!(
        fs::read_to_string(p.path().join("calls.log"))
            .unwrap()
            .lines()
            .count(),
        n
    );
}

#[test]
fn cli_refuses_unknown_targets_and_missing_tools() {
    let p = project();
    let out = engine_cmd(p.path(), "sm99-fp16", &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        support::stderr(&out)
            .contains("unknown target `sm99-fp16`; the plan has: cpu-fp32, sm80-fp16, sm80-int8"),
        "{}",
        support::stderr(&out)
    );
    let out = engine_cmd(p.path(), "sm80-fp16", &[])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        support::stderr(&out).contains("`nvidia-smi` was not found on PATH"),
        "{}",
        support::stderr(&out)
    );
}

#[test]
fn cli_kill_9_mid_build_leaves_a_consistent_cache() {
    let p = project();
    let mut child = engine_cmd(p.path(), "sm80-fp16", &[])
        .env("FAKE_TRTEXEC_SLEEP", "30")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until trtexec has written the engine into the staging directory, then kill -9.
    let staging = p.path().join("cache/v1/staging");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let has_plan = fs::read_dir(&staging)
            .map(|rd| rd.flatten().any(|e| e.path().join("engine.plan").exists()))
            .unwrap_or(false);
        if has_plan {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "trtexec never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // No entry appeared; the half-built staging directory is still there.
    assert_eq!(
        fs::read_dir(p.path().join("cache/v1/entries"))
            .unwrap()
            .count(),
        0
    );
    assert_eq!(fs::read_dir(&staging).unwrap().count(), 1);
    // The next build takes the (released) lock, removes the leftovers and completes.
    let json = engine_json(p.path(), "sm80-fp16");
    assert_eq!(json["cached"], false);
    assert_eq!(fs::read_dir(&staging).unwrap().count(), 0);
    assert_eq!(
        fs::read_dir(p.path().join("cache/v1/entries"))
            .unwrap()
            .count(),
        1
    );
}

/// The CPU engine `infer-build engine` writes (tract NNEF decluttered from the ONNX, or the
/// ONNX itself when that loads faster) serves the same numbers as the ONNX it came from, after
/// the runtime checked its tuple. (The NNEF loader itself is tested in infer-serve's
/// `backend::tract` unit tests, whatever the builder chose here.)
#[test]
fn serve_loads_the_cpu_engine_that_infer_build_engine_writes() {
    let dir = tempfile::tempdir().unwrap();
    let o = support::infer_build()
        .current_dir(dir.path())
        .arg("engine")
        .arg(support::root().join("examples/mlp/recipe.toml"))
        .args(["--target", "cpu-fp32", "--json", "--cache", "cache"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", support::stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&support::stdout(&o)).unwrap();
    let engine = dir.path().join(v["engine"].as_str().unwrap());
    // The builder keeps NNEF only when it loads faster than the ONNX on the build machine.
    let kind = match v["meta"]["format"].as_str().unwrap() {
        "tract-nnef-tar" => "tract-nnef",
        "onnx" => "tract-onnx",
        other => panic!("a CPU engine in format {other}"),
    };
    let config = |engine: &str| {
        support::mlp_runtime_config(&format!(
            "[batching]\nmax_batch_size = 8\n\n[engine]\n{engine}\n\n\
             [server]\nhost = \"127.0.0.1\"\nport = PORT\ndrain_delay_s = 0\n"
        ))
    };
    let (built_dir, onnx_dir) = (dir.path().join("built"), dir.path().join("onnx"));
    fs::create_dir_all(&built_dir).unwrap();
    fs::create_dir_all(&onnx_dir).unwrap();
    let built = support::start_serve(
        &built_dir,
        &config(&format!(
            "kind = \"{kind}\"\npath = \"{}\"\nmetadata = \"{}\"",
            engine.display(),
            engine.parent().unwrap().join("meta.json").display()
        )),
    );
    let log = fs::read_to_string(built_dir.join("serve.log")).unwrap();
    assert!(log.contains("engine matches this node"), "{log}");
    let onnx = support::start_serve(
        &onnx_dir,
        &config(&format!(
            "kind = \"tract-onnx\"\npath = \"{}\"",
            support::root().join("examples/mlp/mlp.onnx").display()
        )),
    );
    let rows: Vec<f32> = (0..3 * 64).map(|i| (i % 7) as f32 / 7.0).collect();
    let body = serde_json::json!({
        "inputs": [{ "name": "input", "shape": [3, 64], "datatype": "FP32", "data": rows }]
    })
    .to_string();
    let out = |s: &support::Serve| -> Vec<f64> {
        let (status, answer) = s.post_json("/v2/models/mlp/infer", &body);
        assert_eq!(status, 200, "{answer}");
        serde_json::from_value(answer["outputs"][0]["data"].clone()).unwrap()
    };
    let (a, b) = (out(&built), out(&onnx));
    assert_eq!(a.len(), 30);
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5, "{a:?}\n{b:?}");
    }
}
