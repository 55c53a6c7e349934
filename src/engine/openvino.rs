//! The OpenVINO candidate of a CPU target: compile the model with OpenVINO's CPU plugin (the
//! pinned wheel's libraries from the library cache, opened at run time through
//! `infer-openvino`), measure start-up (read and compile) and T(b) with the threads the runtime
//! will use, and run the same inputs as tract to compare outputs. [`super::select`] decides.
//!
//! The model is compiled as infer-serve's OpenVINO backend compiles it for one instance: one
//! stream of `threads` threads, FP32 inference precision, latency hint.

use std::path::Path;
use std::time::Instant;

use infer_openvino::{Compiled, Config, Element, Input, Precision};
use tract_onnx::prelude::{DatumType, TValue, TVec, Tensor};

use super::onnxruntime::Output;
use super::spec::{EngineSpec, LibraryCandidate};
use super::timing::{median_sorted, round_us, time_batch, Measured, STARTUP_RUNS};
use super::tract::sample_inputs;

/// Why OpenVINO could not measure a model: OpenVINO's own words with what was being done; the
/// variant says which step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OvError {
    /// The library could not be opened or is another release.
    #[error("{0}")]
    Library(String),
    /// The model does not read or compile.
    #[error("{0}")]
    Load(String),
    /// The model compiles but fails on the inputs, or returns what cannot be compared.
    #[error("{0}")]
    Run(String),
}

/// A tract tensor as OpenVINO's element type and its bytes (native endianness).
fn element(t: &Tensor) -> Result<Element, OvError> {
    Ok(match t.datum_type() {
        DatumType::F32 => Element::F32,
        DatumType::F64 => Element::F64,
        DatumType::I64 => Element::I64,
        DatumType::I32 => Element::I32,
        DatumType::I16 => Element::I16,
        DatumType::I8 => Element::I8,
        DatumType::U8 => Element::U8,
        DatumType::Bool => Element::Bool,
        other => {
            return Err(OvError::Run(format!(
                "datatype {other:?} is not measured with OpenVINO"
            )))
        }
    })
}

/// Runs `inputs` (in `names`' order) and returns every output as (shape, f64 values).
fn run(
    request: &mut infer_openvino::Request,
    names: &[String],
    outputs: &[String],
    inputs: &TVec<TValue>,
) -> Result<Vec<Output>, OvError> {
    let shapes: Vec<Vec<i64>> = inputs
        .iter()
        .map(|t| t.shape().iter().map(|&d| d as i64).collect())
        .collect();
    let feed = inputs
        .iter()
        .zip(names)
        .zip(&shapes)
        .map(|((t, name), shape)| {
            Ok(Input {
                name,
                element: element(t)?,
                shape,
                data: t.as_bytes(),
            })
        })
        .collect::<Result<Vec<_>, OvError>>()?;
    let want: Vec<&str> = outputs.iter().map(String::as_str).collect();
    let out = request
        .infer(&feed, &want)
        .map_err(|e| OvError::Run(e.to_string()))?;
    out.into_iter().map(to_f64).collect()
}

fn to_f64(o: infer_openvino::Output) -> Result<Output, OvError> {
    let shape: Vec<usize> = o.shape.iter().map(|&d| d.max(0) as usize).collect();
    macro_rules! read {
        ($ty:ty) => {
            o.data
                .chunks_exact(std::mem::size_of::<$ty>())
                .map(|c| <$ty>::from_ne_bytes(c.try_into().unwrap_or_default()) as f64)
                .collect()
        };
    }
    let values: Vec<f64> = match o.element {
        Element::F32 => read!(f32),
        Element::F64 => read!(f64),
        Element::I64 => read!(i64),
        Element::I32 => read!(i32),
        Element::I16 => read!(i16),
        Element::I8 => read!(i8),
        Element::U8 => read!(u8),
        Element::Bool => o
            .data
            .iter()
            .map(|&b| f64::from(u8::from(b != 0)))
            .collect(),
        other => {
            return Err(OvError::Run(format!(
                "output type {other:?} is not compared"
            )))
        }
    };
    Ok((shape, values))
}

/// The model compiled for one instance of `threads` threads.
fn compile(
    lib: &'static infer_openvino::Library,
    model: &Path,
    threads: usize,
) -> Result<Compiled, OvError> {
    let config = Config {
        streams: 1,
        threads,
        precision: Precision::Fp32,
        cache_dir: None,
    };
    lib.core()
        .and_then(|core| core.compile(model, &config))
        .map_err(|e| OvError::Load(e.to_string()))
}

/// Compile `bytes` with OpenVINO and measure it for `spec` with `threads` threads; `reference`
/// are the inputs (in the model's input order) whose outputs are returned for the comparison
/// with tract.
pub(crate) fn measure(
    spec: &EngineSpec,
    c: &LibraryCandidate,
    bytes: &[u8],
    threads: usize,
    reference: Option<&TVec<TValue>>,
) -> Result<Measured, OvError> {
    let lib =
        infer_openvino::Library::open(&c.library).map_err(|e| OvError::Library(e.to_string()))?;
    let dir =
        tempfile::tempdir().map_err(|e| OvError::Load(format!("a temporary directory: {e}")))?;
    // OpenVINO reads a model from a file: the bytes go into a fresh private directory.
    let model = dir.path().join("model.onnx");
    crate::oci::Dir::open(dir.path())
        .and_then(|d| d.write_atomic("model.onnx", bytes, None))
        .map_err(|e| OvError::Load(format!("{}: {e}", model.display())))?;
    let mut ms = Vec::with_capacity(STARTUP_RUNS);
    let mut compiled = None;
    for _ in 0..STARTUP_RUNS {
        let t = Instant::now();
        let made = compile(lib, &model, threads)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        compiled = Some(made);
    }
    let compiled = compiled.ok_or_else(|| OvError::Load("no compiled model".to_owned()))?;
    ms.sort_by(f64::total_cmp);
    let (ins, outs) = compiled.ports().map_err(|e| OvError::Load(e.to_string()))?;
    let names: Vec<String> = ins.into_iter().map(|p| p.name).collect();
    let out_names: Vec<String> = outs.into_iter().map(|p| p.name).collect();
    let mut request = compiled
        .request()
        .map_err(|e| OvError::Load(e.to_string()))?;
    let outputs = match reference {
        Some(r) => Some(run(&mut request, &names, &out_names, r)?),
        None => None,
    };
    let mut batches = Vec::new();
    for b in spec.planned_batches() {
        let inputs = sample_inputs(&spec.inputs, &names, b as usize)
            .map_err(|e| OvError::Run(format!("{e:#}")))?;
        for _ in 0..3 {
            run(&mut request, &names, &out_names, &inputs)?;
        }
        batches.push(time_batch(b, || {
            let t = Instant::now();
            run(&mut request, &names, &out_names, &inputs)?;
            Ok::<_, OvError>(t.elapsed())
        })?);
    }
    Ok(Measured {
        startup_ms: round_us(median_sorted(&ms)),
        startup_runs: STARTUP_RUNS as u32,
        batches,
        outputs,
    })
}
