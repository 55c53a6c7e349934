//! The TensorRT engine build: GPU check, optional Polygraphy calibration, trtexec build and
//! per-batch profiling runs. Every process goes through [`crate::process::Runner`], so the whole
//! sequence runs under the recording fake in tests.

use std::path::Path;

use infer_spec::engine::{BatchTiming, EngineFormat, InputProfile, Version};

use super::gpu::{self, GpuInfo};
use super::onnx::OnnxSummary;
use super::polygraphy;
use super::spec::{Calibration, EngineSpec, TrtSpec};
use super::trtexec::{self, BuildPaths, PrecisionPath};
use super::{cache, Error};
use crate::process::{Cmd, Output, Runner};

/// The calibration cache stored next to a calibrated engine.
pub(crate) const CALIBRATION_FILE: &str = "calibration.cache";

/// What a TensorRT build produced besides the engine file.
#[derive(Debug, Clone)]
pub(crate) struct TrtBuilt {
    pub gpu: GpuInfo,
    pub batches: Vec<BatchTiming>,
    pub build_log: String,
}

/// The trtexec build flags that go into the cache key (placeholder paths).
pub(crate) fn key_flags(spec: &EngineSpec, trt: &TrtSpec) -> Result<Vec<String>, Error> {
    let path = trtexec::expected_path(&spec.target, trt, spec.precision)?;
    let profile = spec.shape_profile()?;
    trtexec::build_args(
        trt,
        &path,
        &profile,
        spec.dynamic_batch(),
        &BuildPaths::placeholders(path == PrecisionPath::Int8Calibrated),
    )
}

fn run_checked(runner: &dyn Runner, cmd: &Cmd) -> Result<Output, Error> {
    let out = runner.run(cmd).map_err(Error::Process)?;
    if !out.success() {
        return Err(Error::Tool {
            command: cmd.to_string(),
            code: out.code,
            tail: out.tail(8),
        });
    }
    Ok(out)
}

fn path_str(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Refuses a model with an output whose shape depends on the input values (NonZero, NMS, …:
/// [`crate::engine::onnx::data_dependent_outputs`]), naming the first such output: infer-serve's
/// TensorRT backend sizes every output buffer before a batch runs. Checked before any tool runs
/// (conversion, nvidia-smi, trtexec); the runtime refuses such an engine again, by name, when it
/// creates an instance.
pub(crate) fn refuse_data_dependent(target: &str, summary: &OnnxSummary) -> Result<(), Error> {
    match summary.data_dependent.first() {
        Some((output, op)) => Err(Error::DataDependentOutput {
            target: target.to_owned(),
            output: output.clone(),
            op: op.clone(),
        }),
        None => Ok(()),
    }
}

/// Build the engine for `spec` into `staging` (which then holds `engine.plan`).
#[allow(
    clippy::too_many_arguments,
    reason = "the spec, its ONNX (bytes and path), where to write, the cache and the runner: each a different effect the caller owns"
)]
pub(crate) fn build(
    spec: &EngineSpec,
    trt: &TrtSpec,
    onnx_bytes: &[u8],
    onnx_path: &Path,
    staging: &Path,
    cache: &cache::Cache,
    runner: &dyn Runner,
) -> Result<TrtBuilt, Error> {
    let profile: Vec<InputProfile> = spec.shape_profile()?;
    let summary = OnnxSummary::from_bytes(onnx_bytes).map_err(|reason| Error::Onnx {
        path: onnx_path.to_path_buf(),
        reason,
    })?;
    refuse_data_dependent(&spec.target, &summary)?;
    let path = trtexec::precision_path(&spec.target, trt, spec.precision, &summary)?;
    let dynamic = spec.dynamic_batch();

    let gpu = gpu::query(runner)?;
    gpu::check_builder(&spec.target, &gpu, trt)?;

    let mut log = String::new();
    let calib_path = staging.join(CALIBRATION_FILE);
    let calibration_cache = match (&trt.calibration, &path) {
        (Some(Calibration::Cache(p)), PrecisionPath::Int8Calibrated) => {
            std::fs::copy(p, &calib_path).map_err(|source| Error::Io {
                path: p.clone(),
                source,
            })?;
            Some(path_str(&calib_path))
        }
        (Some(Calibration::Data(dir)), PrecisionPath::Int8Calibrated) => {
            let loader = staging.join("calib_loader.py");
            cache::write_atomic(&loader, polygraphy::LOADER_SCRIPT.as_bytes())?;
            let scratch = staging.join("calibration-scratch.plan");
            let cmd = polygraphy::calibration_cmd(
                &trt.polygraphy,
                &path_str(onnx_path),
                &path_str(&loader),
                &path_str(dir),
                &path_str(&calib_path),
                &path_str(&scratch),
                &profile,
                dynamic,
            );
            let out = run_checked(runner, &cmd)?;
            log.push_str(&out.stdout_text());
            let _ = std::fs::remove_file(&scratch);
            let _ = std::fs::remove_file(&loader);
            if !calib_path.is_file() {
                return Err(Error::ToolOutput {
                    tool: "polygraphy",
                    reason: format!(
                        "it exited 0 but wrote no calibration cache at {}",
                        calib_path.display()
                    ),
                });
            }
            Some(path_str(&calib_path))
        }
        _ => None,
    };

    let engine = staging.join(EngineFormat::TensorrtPlan.file_name());
    let (timing, timing_lock) = cache.timing_cache(&format!(
        "trt-{}-{}-{}",
        trt.tensorrt,
        gpu.sm.sm(),
        gpu.name
    ));
    let paths = BuildPaths {
        onnx: path_str(onnx_path),
        engine: path_str(&engine),
        timing_cache: path_str(&timing),
        calibration_cache,
    };
    let args = trtexec::build_args(trt, &path, &profile, dynamic, &paths)?;
    let cmd = gpu::trtexec_cmd(&trt.trtexec).args(args);
    let out = {
        // One trtexec at a time per timing cache: it rewrites the file when it finishes.
        let _guard = cache::FileLock::acquire(&timing_lock)?;
        runner.run(&cmd).map_err(Error::Process)?
    };
    let text = out.stdout_text();
    log.push_str(&text);
    let parsed = trtexec::parse_log(&text);
    if !out.success() || parsed.passed == Some(false) {
        return Err(Error::Tool {
            command: cmd.to_string(),
            code: out.code,
            tail: out.tail(8),
        });
    }
    check_version(&trt.tensorrt, parsed.version.as_ref())?;
    if !engine.is_file() {
        return Err(Error::ToolOutput {
            tool: "trtexec",
            reason: format!("it passed but wrote no engine at {}", engine.display()),
        });
    }

    let mut batches = Vec::new();
    for b in spec.planned_batches() {
        let times = staging.join(format!("times-b{b}.json"));
        let layers = staging.join(format!("layers-b{b}.json"));
        let args = trtexec::profile_args(
            trt,
            &profile,
            b,
            dynamic,
            &path_str(&engine),
            &path_str(&times),
            &path_str(&layers),
        );
        let out = run_checked(runner, &gpu::trtexec_cmd(&trt.trtexec).args(args))?;
        log.push_str(&out.stdout_text());
        let read = |p: &Path| {
            std::fs::read(p).map_err(|source| Error::Io {
                path: p.to_path_buf(),
                source,
            })
        };
        let mut timing =
            trtexec::parse_times(b, &read(&times)?).map_err(|reason| Error::ToolOutput {
                tool: "trtexec",
                reason: format!("{}: {reason}", times.display()),
            })?;
        timing.layers = trtexec::parse_layer_profile(&read(&layers)?, 5).map_err(|reason| {
            Error::ToolOutput {
                tool: "trtexec",
                reason: format!("{}: {reason}", layers.display()),
            }
        })?;
        let _ = std::fs::remove_file(&times);
        let _ = std::fs::remove_file(&layers);
        batches.push(timing);
    }
    Ok(TrtBuilt {
        gpu,
        batches,
        build_log: log,
    })
}

/// trtexec must be the TensorRT the plan names: the engine's metadata records that version.
fn check_version(expected: &Version, found: Option<&Version>) -> Result<(), Error> {
    let Some(found) = found else {
        return Err(Error::ToolOutput {
            tool: "trtexec",
            reason: "its log has no `&&&& RUNNING … [TensorRT vNNNN]` line to tell its version"
                .into(),
        });
    };
    let n = expected.parts().len().min(found.parts().len()).max(3);
    if !expected.same_prefix(found, n) {
        return Err(Error::TrtexecVersion {
            expected: expected.to_string(),
            found: found.to_string(),
        });
    }
    Ok(())
}
