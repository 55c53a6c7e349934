//! From a validated recipe and one resolved target to an [`EngineSpec`]: the only place the
//! engine stage reads recipe or plan types. Pure.

use infer_spec::engine::{ComputeCapability, HardwareCompat, Precision};

use super::accuracy::Thresholds;
use super::convert::ConvertSpec;
use super::spec::{Calibration, DimRanges, EngineSpec, Gate, InputSpec, Toolchain, TrtSpec};
use super::Error;
use crate::plan::{TargetKind, TargetPlan};
use crate::recipe::Recipe;

/// The precision of a target's engine; bf16/fp4/tf32 engines are not built.
fn precision(target: &str, p: Precision) -> Result<Precision, Error> {
    if p.engine_buildable() {
        return Ok(p);
    }
    Err(Error::Input {
        target: target.into(),
        input: "-".into(),
        reason: format!(
            "{p} engines are not supported by the engine stage (fp32, fp16, int8 and fp8 are)"
        ),
    })
}

/// The accuracy gate's limits of precision `p`: `[accuracy.<p>]` over the defaults.
fn thresholds(recipe: &Recipe, p: Precision) -> Thresholds {
    let mut thresholds = Thresholds::default_for(p);
    let key = match p {
        Precision::Int8 | Precision::Fp8 | Precision::Bf16 => p,
        _ => Precision::Fp16,
    };
    if let Some(l) = recipe.accuracy.limits.get(&key) {
        thresholds.max_abs = l.max_abs.or(thresholds.max_abs);
        thresholds.max_rel = l.max_rel.unwrap_or(thresholds.max_rel);
        thresholds.min_top1 = l.min_top1.unwrap_or(thresholds.min_top1);
    }
    thresholds
}

/// The conversion of a target: `[int8]` / `[fp8]` method and calibration data, `[accuracy]`
/// data and limits over the per-precision defaults.
fn convert_spec(recipe: &Recipe, p: Precision) -> ConvertSpec {
    let int8 = recipe.int8.as_ref();
    let fp8 = recipe.fp8.as_ref();
    let thresholds = thresholds(recipe, p);
    let tool = recipe.engine.convert.value;
    ConvertSpec {
        tool,
        method: match p {
            Precision::Fp8 => fp8.and_then(|f| f.method.as_ref()),
            _ => int8.and_then(|i| i.method.as_ref()),
        }
        .map_or_else(|| tool.default_method().to_string(), |m| m.value.clone()),
        calibration: match p {
            Precision::Int8 => int8
                .and_then(|i| i.calibration.as_ref())
                .map(|c| recipe.resolve(&c.value)),
            Precision::Fp8 => fp8
                .and_then(|f| f.calibration.as_ref())
                .map(|c| recipe.resolve(&c.value)),
            _ => None,
        },
        evaluation: recipe
            .accuracy
            .data
            .as_ref()
            .map(|d| recipe.resolve(&d.value)),
        thresholds,
    }
}

fn version(target: &str, what: &str, text: &str) -> Result<infer_spec::engine::Version, Error> {
    text.parse().map_err(|e| Error::Input {
        target: target.into(),
        input: "-".into(),
        reason: format!("{what}: {e}"),
    })
}

/// The engine build of `target` as the recipe and the plan describe it.
///
/// - Inputs come from `[model.inputs]` (their order is the recipe's; the CPU build maps them to
///   the model's inputs by name), with their shape profiles for dynamic inner dimensions.
/// - The batch profile is 1 / largest preferred batch size / `max_batch_size`, and T(b) is
///   measured for every warm-up batch size (1, each preferred size, the maximum).
/// - GPU targets take TensorRT's GA build, the CUDA of that build, the compute capability, the
///   driver floor (none for Jetson: `0`), the hardware-compatibility level, version
///   compatibility (built with the lean runtime excluded, so images ship it), and the
///   calibration input (a file is a cache, a directory is data for Polygraphy).
pub(crate) fn spec(recipe: &Recipe, target: &TargetPlan) -> Result<EngineSpec, Error> {
    let id = target.id.as_str();
    let inputs = recipe
        .model
        .inputs
        .iter()
        .map(|t| InputSpec {
            name: t.name.clone(),
            datatype: t.datatype,
            shape: t.shape.clone(),
            profile: t.profile.as_ref().map(|p| {
                let u = |v: &Vec<i64>| v.iter().map(|&d| d.max(0) as u64).collect();
                DimRanges {
                    min: u(&p.min),
                    opt: u(&p.opt),
                    max: u(&p.max),
                }
            }),
        })
        .collect();
    let b = &recipe.batching;
    let opt_batch = b
        .preferred_batch_sizes
        .iter()
        .copied()
        .max()
        .unwrap_or(b.max_batch_size);
    let mut convert = None;
    let toolchain = match target.kind {
        TargetKind::Cpu => Toolchain::Cpu,
        TargetKind::Gpu => {
            let missing = |what: &str| Error::Input {
                target: id.into(),
                input: "-".into(),
                reason: format!("the plan has no {what} for this GPU target"),
            };
            let trt = target
                .tensorrt
                .as_ref()
                .ok_or_else(|| missing("TensorRT release"))?;
            let gpu = target.gpu.as_ref().ok_or_else(|| missing("GPU"))?;
            let cc = gpu.compute_capability;
            let mut t = TrtSpec::new(
                version(id, "TensorRT build", &trt.build)?,
                trt.cuda_build.clone(),
                ComputeCapability::new(cc.major, cc.minor),
                match &target.driver_floor {
                    Some(v) => v.clone(),
                    None => version(id, "driver floor", "0")?,
                },
            );
            t.hardware_compat = trt.hardware_compat.unwrap_or(HardwareCompat::None);
            t.lean_runtime = trt.version_compatible;
            if trt.precision_mode == crate::plan::PrecisionMode::Convert {
                convert = Some(convert_spec(recipe, precision(id, target.precision)?));
            } else if target.precision == Precision::Int8 {
                if let Some(c) = recipe.int8.as_ref().and_then(|i| i.calibration.as_ref()) {
                    let path = recipe.resolve(&c.value);
                    t.calibration = Some(if path.is_dir() {
                        Calibration::Data(path)
                    } else {
                        Calibration::Cache(path)
                    });
                }
            }
            Toolchain::Tensorrt(t)
        }
    };
    // A CPU target computes the FP32 model in its precision at run time (BF16), or the INT8
    // Q/DQ model infer-build makes from calibration data: either is gated against the same
    // engine on the FP32 model.
    let cpu_precision =
        target.kind == TargetKind::Cpu && Precision::CPU.contains(&target.precision);
    if cpu_precision && target.precision == Precision::Int8 {
        if let Some(c) = recipe.int8.as_ref().and_then(|i| i.calibration.as_ref()) {
            let path = recipe.resolve(&c.value);
            if !path.is_dir() {
                return Err(Error::Input {
                    target: id.into(),
                    input: c.value.display().to_string(),
                    reason: "a cpu-int8 target quantises the model from calibration batches (a directory of *.npy / *.npz); a TensorRT calibration cache serves GPU targets only".into(),
                });
            }
        }
        convert = Some(convert_spec(recipe, Precision::Int8));
    }
    // The gate's inputs as the converter takes them: `[accuracy] data`, else the calibration
    // data of a target that has some, else generated.
    let gate = (cpu_precision && target.precision != Precision::Fp32).then(|| Gate {
        thresholds: thresholds(recipe, target.precision),
        evaluation: recipe
            .accuracy
            .data
            .as_ref()
            .map(|d| recipe.resolve(&d.value))
            .or_else(|| convert.as_ref().and_then(|c| c.calibration.clone())),
    });
    Ok(EngineSpec {
        model: recipe.model.name.clone(),
        target: id.into(),
        precision: if cpu_precision {
            target.precision
        } else {
            precision(id, target.precision)?
        },
        onnx: recipe.model_path(),
        inputs,
        max_batch: b.max_batch_size,
        opt_batch,
        batch_sizes: recipe.warmup_batch_sizes(),
        toolchain,
        // Filled by the caller that has the library (see `crate::cli::build`).
        onnxruntime: None,
        openvino: None,
        folding: None,
        convert,
        gate,
    })
}
