//! The CPU engine, built with tract: validate, optimise, choose the fastest-starting stored
//! form, and profile T(b).
//!
//! 1. Load the ONNX with the recipe's input types and shapes (batch as the symbol `N`, variable
//!    non-batch dimensions at their profile's `opt`); it must type-check and optimise, or the
//!    build fails with tract's reason. A model with variable non-batch dimensions must also
//!    optimise and run one row at the profile's `min` and `max`, as the runtime's warm-up will.
//! 2. Write the decluttered model as tract NNEF (`model.nnef.tar`, deterministic tar, with the
//!    tract core, resource and ONNX extensions) and check that it computes the same outputs as
//!    the ONNX. Not for variable non-batch dimensions: the runtime optimises the ONNX per shape.
//! 3. Measure start-up (bytes → runnable model) of both forms, median of several loads, and
//!    store the faster. The measurement is recorded in the engine profile.
//! 4. Time one batch per planned batch size (median of several runs after warm-up).
//!
//! The runtime loads the stored form with [`load_runnable`] (same code, documented in
//! `docs/engines.md`).

use std::sync::Arc;
use std::time::Instant;

use infer_spec::engine::{BatchTiming, EngineFormat, StartupMeasurement};
use infer_spec::DataType;
use tract_onnx::prelude::*;
use tract_onnx::tract_core::internal::{bail, format_err};

use super::spec::{EngineSpec, InputSpec};
use super::timing::{median_of, round_us, time_batch, STARTUP_RUNS};

/// The tract version linked into this binary (checked against Cargo.lock by a test).
pub(crate) const TRACT_VERSION: &str = "0.23.9";

pub(crate) type Runnable = Arc<TypedRunnableModel>;

/// A tract engine as built, before it is written into the cache.
pub(crate) struct Built {
    pub format: EngineFormat,
    pub bytes: Vec<u8>,
    pub startup: StartupMeasurement,
    pub batches: Vec<BatchTiming>,
    /// The inputs the outputs were checked on (one row at the profile's `opt`, in the model's
    /// input order), and tract's outputs for them: the reference another engine is compared to.
    pub reference: (TVec<TValue>, TVec<TValue>),
}

/// tract's datum type for a datatype, where tract has one.
pub(crate) fn datum_type(datatype: DataType) -> Option<DatumType> {
    Some(match datatype {
        DataType::F32 => f32::datum_type(),
        DataType::F16 => f16::datum_type(),
        DataType::F64 => f64::datum_type(),
        DataType::I8 => i8::datum_type(),
        DataType::I16 => i16::datum_type(),
        DataType::I32 => i32::datum_type(),
        DataType::I64 => i64::datum_type(),
        DataType::U8 => u8::datum_type(),
        DataType::Bool => bool::datum_type(),
        _ => return None,
    })
}

/// The NNEF framework with the extensions the stored form needs. The runtime must use the same.
pub(crate) fn nnef() -> tract_nnef::framework::Nnef {
    tract_nnef::nnef().with_tract_resource().with_onnx()
}

/// Load an engine file of the given format into a runnable model. For ONNX, `inputs` gives the
/// input facts; NNEF carries them.
pub(crate) fn load_runnable(
    format: EngineFormat,
    bytes: &[u8],
    inputs: &[InputSpec],
) -> TractResult<Runnable> {
    match format {
        EngineFormat::Onnx => typed_from_onnx(bytes, inputs)?
            .into_optimized()?
            .into_runnable(),
        EngineFormat::TractNnefTar => nnef()
            .model_for_read(&mut &bytes[..])?
            .into_optimized()?
            .into_runnable(),
        EngineFormat::TensorrtPlan => bail!("a TensorRT plan is not a tract model"),
    }
}

/// Which profile size a variable non-batch dimension takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum At {
    Min,
    Opt,
    Max,
}

/// True when an input has a variable (`-1`) dimension after the batch dimension.
pub(crate) fn has_variable_dims(inputs: &[InputSpec]) -> bool {
    inputs
        .iter()
        .any(|i| i.shape.iter().skip(1).any(|&d| d < 0))
}

/// The size of dimension `i` (≥ 1) of `spec` at `at`: its fixed size, else the profile's.
fn dim_at(spec: &InputSpec, i: usize, at: At) -> Option<u64> {
    match spec.shape.get(i) {
        Some(&d) if d >= 1 => Some(d as u64),
        Some(_) => spec.profile.as_ref().and_then(|p| {
            match at {
                At::Min => &p.min,
                At::Opt => &p.opt,
                At::Max => &p.max,
            }
            .get(i - 1)
            .copied()
        }),
        None => None,
    }
}

/// Parse the ONNX with the declared input facts and convert it to a typed model.
pub(crate) fn typed_from_onnx(bytes: &[u8], inputs: &[InputSpec]) -> TractResult<TypedModel> {
    typed_from_onnx_at(bytes, inputs, At::Opt)
}

/// [`typed_from_onnx`] with the variable non-batch dimensions at `at`.
pub(crate) fn typed_from_onnx_at(
    bytes: &[u8],
    inputs: &[InputSpec],
    at: At,
) -> TractResult<TypedModel> {
    match typed_with_hints(bytes, inputs, at, true) {
        Ok(m) => Ok(m),
        // The file's shape hints (`value_info`, output shapes) may name symbols the declared
        // inputs fix otherwise (an export with dynamic height and width served at one size:
        // `batch,16,(height+1)/2,…` against `N,16,160,160`): without them tract infers every
        // shape from the inputs. The first error stands when that fails too.
        Err(first) => typed_with_hints(bytes, inputs, at, false).map_err(|_| first),
    }
}

/// [`typed_from_onnx_at`], reading the file's shape hints or not (`hints`).
fn typed_with_hints(
    bytes: &[u8],
    inputs: &[InputSpec],
    at: At,
    hints: bool,
) -> TractResult<TypedModel> {
    let mut model = tract_onnx::onnx()
        .with_ignore_value_info(!hints)
        .with_ignore_output_shapes(!hints)
        .model_for_read(&mut &bytes[..])?;
    let outlets = model.input_outlets()?.to_vec();
    let names: Vec<String> = outlets
        .iter()
        .map(|o| model.node(o.node).name.clone())
        .collect();
    if names.len() != inputs.len() {
        bail!(
            "the model has {} inputs ({}), the recipe declares {}",
            names.len(),
            names.join(", "),
            inputs.len()
        );
    }
    let batch = model.symbols.sym("N");
    for (ix, name) in names.iter().enumerate() {
        let Some(spec) = inputs.iter().find(|i| &i.name == name) else {
            bail!("the model input `{name}` is not declared in the recipe");
        };
        let Some(dt) = datum_type(spec.datatype) else {
            bail!(
                "input `{name}`: datatype `{}` is not supported by tract",
                spec.datatype.recipe_name()
            );
        };
        let mut dims: TVec<TDim> = TVec::new();
        for (i, &d) in spec.shape.iter().enumerate() {
            dims.push(match (i, d) {
                (0, d) if d < 0 => TDim::Sym(batch.clone()),
                (_, d) if d >= 0 => TDim::Val(d),
                _ => match dim_at(spec, i, at) {
                    Some(v) => TDim::Val(v as i64),
                    None => bail!("input `{name}`: dimension {i} is dynamic and has no profile"),
                },
            });
        }
        model.set_input_fact(ix, InferenceFact::dt_shape(dt, dims))?;
    }
    if has_variable_dims(inputs) {
        // The file's output facts may name symbols that the concrete inputs now fix.
        for ix in 0..model.outputs.len() {
            model.set_output_fact(ix, InferenceFact::default())?;
        }
    }
    model.into_typed()
}

/// A deterministic input batch: values cycle through a small range valid for the type.
pub(crate) fn sample_inputs(
    inputs: &[InputSpec],
    names: &[String],
    batch: usize,
) -> TractResult<TVec<TValue>> {
    sample_inputs_at(inputs, names, batch, At::Opt)
}

/// [`sample_inputs`] with the variable non-batch dimensions at `at`.
pub(crate) fn sample_inputs_at(
    inputs: &[InputSpec],
    names: &[String],
    batch: usize,
    at: At,
) -> TractResult<TVec<TValue>> {
    let mut out = TVec::new();
    for name in names {
        let spec = inputs
            .iter()
            .find(|i| &i.name == name)
            .ok_or_else(|| format_err!("input `{name}` is not declared"))?;
        let shape: Vec<usize> = spec
            .shape
            .iter()
            .enumerate()
            .map(|(i, &d)| {
                if i == 0 && d < 0 {
                    batch
                } else {
                    dim_at(spec, i, at).unwrap_or(1).max(1) as usize
                }
            })
            .collect();
        let n: usize = shape.iter().product();
        let dt = datum_type(spec.datatype)
            .ok_or_else(|| format_err!("datatype {}", spec.datatype.recipe_name()))?;
        // The runtime's warm-up values (`infer_spec::samples`), so what ran here runs at start.
        use infer_spec::samples::{synthetic_integer, synthetic_unit};
        let ramp = (0..n).map(synthetic_unit);
        let t = Tensor::from_shape(&shape, &ramp.map(|v| v as f32).collect::<Vec<f32>>())?;
        let t = if dt == bool::datum_type() {
            Tensor::from_shape(
                &shape,
                &(0..n)
                    .map(|i| synthetic_integer(i) == 1)
                    .collect::<Vec<bool>>(),
            )?
        } else if dt.is_integer() {
            Tensor::from_shape(
                &shape,
                &(0..n)
                    .map(|i| i64::from(synthetic_integer(i)))
                    .collect::<Vec<i64>>(),
            )?
            .cast_to_dt(dt)?
            .into_owned()
        } else {
            t.cast_to_dt(dt)?.into_owned()
        };
        out.push(t.into_tvalue());
    }
    Ok(out)
}

fn input_names(model: &TypedModel) -> TractResult<Vec<String>> {
    Ok(model
        .input_outlets()?
        .iter()
        .map(|o| model.node(o.node).name.clone())
        .collect())
}

fn time_ms(f: impl FnOnce() -> TractResult<Runnable>) -> TractResult<(f64, Runnable)> {
    let t = Instant::now();
    let r = f()?;
    Ok((t.elapsed().as_secs_f64() * 1e3, r))
}

fn outputs_close(a: &TVec<TValue>, b: &TVec<TValue>) -> bool {
    a.len() == b.len()
        && a.iter().zip(b.iter()).all(|(x, y)| {
            if x.shape() != y.shape() {
                return false;
            }
            match (x.cast_to::<f64>(), y.cast_to::<f64>()) {
                (Ok(x), Ok(y)) => match (
                    x.to_plain_array_view::<f64>(),
                    y.to_plain_array_view::<f64>(),
                ) {
                    (Ok(x), Ok(y)) => x
                        .iter()
                        .zip(y.iter())
                        .all(|(p, q)| (p - q).abs() <= 1e-4 * (1.0 + p.abs().max(q.abs()))),
                    _ => false,
                },
                _ => false,
            }
        })
}

/// Build the CPU engine for `spec` from the ONNX `bytes`.
pub(crate) fn build(spec: &EngineSpec, bytes: &[u8]) -> TractResult<Built> {
    let typed = typed_from_onnx(bytes, &spec.inputs)?;
    let names = input_names(&typed)?;
    let decluttered = typed.into_decluttered()?;

    // The ONNX form, optimised: this is the validation, and the reference for outputs.
    let (_, onnx_runnable) = time_ms(|| load_runnable(EngineFormat::Onnx, bytes, &spec.inputs))?;
    let probe = sample_inputs(&spec.inputs, &names, 1)?;
    let reference = onnx_runnable.run(probe.clone())?;

    // Variable non-batch dimensions: the runtime optimises one plan per shape, from the ONNX;
    // the profile's bounds must optimise and run too (the runtime's warm-up runs them).
    let variable = has_variable_dims(&spec.inputs);
    if variable {
        for (at, what) in [(At::Min, "min"), (At::Max, "max")] {
            typed_from_onnx_at(bytes, &spec.inputs, at)
                .and_then(|m| m.into_optimized())
                .and_then(|m| m.into_runnable())
                .and_then(|r| r.run(sample_inputs_at(&spec.inputs, &names, 1, at)?))
                .map_err(|e| format_err!("at the profile's {what} shape: {e:#}"))?;
        }
    }

    // The NNEF form; any failure keeps the ONNX form, with the reason recorded.
    let mut note = None;
    let nnef_bytes = if variable {
        note = Some(
            "variable non-batch dimensions: the runtime optimises the onnx once per shape".into(),
        );
        None
    } else {
        match nnef().write_to_tar_with_config(&decluttered, Vec::new(), false, true) {
            Ok(b) => Some(b),
            Err(e) => {
                note = Some(format!("nnef serialisation failed: {e:#}"));
                None
            }
        }
    };
    let nnef_bytes = match nnef_bytes {
        Some(b) => match load_runnable(EngineFormat::TractNnefTar, &b, &spec.inputs)
            .and_then(|r| r.run(probe.clone()))
        {
            Ok(out) if outputs_close(&out, &reference) => Some(b),
            Ok(_) => {
                note = Some("the nnef form computes different outputs than the onnx".into());
                None
            }
            Err(e) => {
                note = Some(format!("the nnef form does not load: {e:#}"));
                None
            }
        },
        None => None,
    };

    // Start-up: median time from bytes to a runnable model, per form.
    let mut onnx_ms = Vec::with_capacity(STARTUP_RUNS);
    let mut nnef_ms = Vec::with_capacity(STARTUP_RUNS);
    for _ in 0..STARTUP_RUNS {
        onnx_ms.push(time_ms(|| load_runnable(EngineFormat::Onnx, bytes, &spec.inputs))?.0);
        if let Some(b) = &nnef_bytes {
            nnef_ms.push(time_ms(|| load_runnable(EngineFormat::TractNnefTar, b, &spec.inputs))?.0);
        }
    }
    let onnx_med = median_of(onnx_ms);
    let nnef_med = nnef_bytes.as_ref().map(|_| median_of(nnef_ms));
    let (format, engine_bytes) = match (nnef_med, nnef_bytes) {
        (Some(n), Some(b)) if n < onnx_med => (EngineFormat::TractNnefTar, b),
        _ => (EngineFormat::Onnx, bytes.to_vec()),
    };
    let startup = StartupMeasurement {
        onnx_ms: round_us(onnx_med),
        nnef_ms: nnef_med.map(round_us),
        chosen: format,
        runs: STARTUP_RUNS as u32,
        note,
    };

    // T(b) with the form the runtime will load.
    let runnable = load_runnable(format, &engine_bytes, &spec.inputs)?;
    let mut batches = Vec::new();
    for b in spec.planned_batches() {
        let inputs = sample_inputs(&spec.inputs, &names, b as usize)?;
        for _ in 0..3 {
            runnable.run(inputs.clone())?;
        }
        batches.push(time_batch(b, || {
            let inputs = inputs.clone();
            let t = Instant::now();
            runnable.run(inputs)?;
            TractResult::Ok(t.elapsed())
        })?);
    }
    Ok(Built {
        format,
        bytes: engine_bytes,
        startup,
        batches,
        reference: (probe, reference),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::spec::tests::mlp_spec;
    use crate::engine::spec::Toolchain;

    fn mlp_bytes() -> Vec<u8> {
        std::fs::read(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/examples/mlp/mlp.onnx"
        ))
        .unwrap()
    }

    #[test]
    fn tract_version_matches_the_lock_file() {
        let lock =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.lock")).unwrap();
        let needle = format!("name = \"tract-onnx\"\nversion = \"{TRACT_VERSION}\"");
        assert!(
            lock.contains(&needle),
            "Cargo.lock does not pin tract-onnx {TRACT_VERSION}"
        );
    }

    #[test]
    fn builds_and_profiles_the_mlp() {
        let spec = mlp_spec(Toolchain::Cpu);
        let e = build(&spec, &mlp_bytes()).unwrap();
        assert_eq!(
            e.batches.iter().map(|b| b.batch).collect::<Vec<_>>(),
            vec![1, 8, 16, 32]
        );
        assert!(e
            .batches
            .iter()
            .all(|b| b.median_us > 0.0 && b.min_us <= b.median_us && b.median_us <= b.max_us));
        assert!(e.startup.nnef_ms.is_some(), "{:?}", e.startup.note);
        // Whatever form won, it loads and computes [b, 10].
        let r = load_runnable(e.format, &e.bytes, &spec.inputs).unwrap();
        let out = r
            .run(sample_inputs(&spec.inputs, &["input".into()], 3).unwrap())
            .unwrap();
        assert_eq!(out[0].shape(), &[3, 10]);
    }

    #[test]
    fn nnef_form_is_deterministic_and_equivalent() {
        let spec = mlp_spec(Toolchain::Cpu);
        let typed = typed_from_onnx(&mlp_bytes(), &spec.inputs)
            .unwrap()
            .into_decluttered()
            .unwrap();
        let a = nnef()
            .write_to_tar_with_config(&typed, Vec::new(), false, true)
            .unwrap();
        let b = nnef()
            .write_to_tar_with_config(&typed, Vec::new(), false, true)
            .unwrap();
        assert_eq!(a, b);
        let x = sample_inputs(&spec.inputs, &["input".into()], 4).unwrap();
        let from_nnef = load_runnable(EngineFormat::TractNnefTar, &a, &spec.inputs)
            .unwrap()
            .run(x.clone())
            .unwrap();
        let from_onnx = load_runnable(EngineFormat::Onnx, &mlp_bytes(), &spec.inputs)
            .unwrap()
            .run(x)
            .unwrap();
        assert!(outputs_close(&from_nnef, &from_onnx));
    }

    #[test]
    fn declared_shapes_must_fit_the_model() {
        let mut spec = mlp_spec(Toolchain::Cpu);
        spec.inputs[0].shape = vec![-1, 65];
        assert!(build(&spec, &mlp_bytes()).is_err());
        let mut spec = mlp_spec(Toolchain::Cpu);
        spec.inputs[0].name = "x".into();
        let e = build(&spec, &mlp_bytes()).err().unwrap();
        assert_eq!(
            format!("{e}"),
            "the model input `input` is not declared in the recipe"
        );
        let mut spec = mlp_spec(Toolchain::Cpu);
        spec.inputs[0].datatype = DataType::Bytes;
        assert!(build(&spec, &mlp_bytes()).is_err());
    }
}
