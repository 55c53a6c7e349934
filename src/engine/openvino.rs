//! The OpenVINO candidate of a CPU target: compile the model with OpenVINO's CPU plugin (the
//! pinned wheel's libraries from the library cache, opened at run time through
//! `infer-openvino`), measure start-up (read and compile) and T(b) with the threads the runtime
//! will use, and run the same inputs as tract to compare outputs. [`super::select`] decides.
//!
//! The model is compiled as infer-serve's OpenVINO backend compiles it for one instance: one
//! stream of `threads` threads, latency hint, the target's precision as the inference precision
//! (FP32; BF16 for a `cpu-bf16` target, which [`gate`] checks against FP32 on the same inputs).

use std::path::Path;
use std::time::Instant;

use infer_openvino::{Compiled, Config, Element, Input, Precision};
use tract_onnx::prelude::{DatumType, TValue, TVec, Tensor};

use super::convert::OutputFigures;
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
    /// The evaluation data cannot be read or does not fit the model's inputs.
    #[error("{0}")]
    Evaluation(String),
    /// The CPU plugin compiled the model in another precision than asked (BF16 on a CPU
    /// without AVX-512 BF16 or AMX).
    #[error("OpenVINO compiles the model in {got} on this machine's CPU ({isa}), not {asked}: {asked} needs AVX-512 BF16 or AMX; build this target on a CPU that has them, as a GPU target is built on its GPU")]
    Precision {
        asked: Precision,
        got: String,
        isa: String,
    },
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

/// The model compiled for one instance of `threads` threads in `precision`; refused when the
/// CPU plugin computes in another.
fn compile(
    lib: &'static infer_openvino::Library,
    model: &Path,
    threads: usize,
    precision: Precision,
) -> Result<Compiled, OvError> {
    let config = Config {
        streams: 1,
        threads,
        precision,
        cache_dir: None,
    };
    let compiled = lib
        .core()
        .and_then(|core| core.compile(model, &config))
        .map_err(|e| OvError::Load(e.to_string()))?;
    if precision != Precision::Fp32 {
        let got = compiled
            .inference_precision()
            .map_err(|e| OvError::Load(e.to_string()))?;
        if got != Some(precision) {
            return Err(OvError::Precision {
                asked: precision,
                got: got.map_or_else(|| "another precision".to_owned(), |p| p.to_string()),
                isa: infer_spec::engine::CpuIsa::detect().name(),
            });
        }
    }
    Ok(compiled)
}

/// The inference precision OpenVINO is asked for on a target of precision `p`: BF16 (and
/// FP16) are a setting of the FP32 model; an INT8 target's model is Q/DQ, computed with FP32 as
/// the precision of what is not quantised.
pub(crate) fn hint(p: Precision) -> Precision {
    infer_spec::engine::EngineKind::Openvino
        .def()
        .setting(p)
        .unwrap_or(Precision::Fp32)
}

/// `bytes` in a fresh private directory as `model.onnx` (OpenVINO reads a model from a file).
fn model_file(bytes: &[u8]) -> Result<(tempfile::TempDir, std::path::PathBuf), OvError> {
    let dir =
        tempfile::tempdir().map_err(|e| OvError::Load(format!("a temporary directory: {e}")))?;
    let model = dir.path().join("model.onnx");
    crate::oci::Dir::open(dir.path())
        .and_then(|d| d.write_atomic("model.onnx", bytes, None))
        .map_err(|e| OvError::Load(format!("{}: {e}", model.display())))?;
    Ok((dir, model))
}

/// The accuracy gate's figures of the engine at `spec`'s precision (`bytes`: the model it runs,
/// FP32 or Q/DQ, compiled with [`hint`]) against `fp32` (the recipe's model) in FP32, both
/// compiled by OpenVINO with `threads` threads, on the evaluation batches (in the model's input
/// order); one per output, by the converter's rules (`max_abs`, `max_rel` over the FP32
/// output's largest magnitude, top-1 agreement of `[N, C]` outputs with C ≥ 2).
pub(crate) fn gate(
    spec: &EngineSpec,
    c: &LibraryCandidate,
    (fp32, bytes): (&[u8], &[u8]),
    threads: usize,
    evaluation: Option<&Path>,
) -> Result<(Vec<OutputFigures>, String), OvError> {
    let lib =
        infer_openvino::Library::open(&c.library).map_err(|e| OvError::Library(e.to_string()))?;
    let (_dir, model) = model_file(bytes)?;
    let (_fp32_dir, fp32_model) = model_file(fp32)?;
    let reference = compile(lib, &fp32_model, threads, Precision::Fp32)?;
    let reduced = compile(lib, &model, threads, hint(spec.precision))?;
    let (ins, outs) = reference
        .ports()
        .map_err(|e| OvError::Load(e.to_string()))?;
    let names: Vec<String> = ins.into_iter().map(|p| p.name).collect();
    let out_names: Vec<String> = outs.into_iter().map(|p| p.name).collect();
    let (batches, text) = super::evaluation::batches(&spec.inputs, &names, evaluation)
        .map_err(OvError::Evaluation)?;
    let mut want_req = reference
        .request()
        .map_err(|e| OvError::Load(e.to_string()))?;
    let mut got_req = reduced
        .request()
        .map_err(|e| OvError::Load(e.to_string()))?;
    let mut figures = Figures::new(&out_names);
    for batch in &batches {
        let want = run(&mut want_req, &names, &out_names, batch)?;
        let got = run(&mut got_req, &names, &out_names, batch)?;
        figures.add(&want, &got)?;
    }
    Ok((figures.finish(), text))
}

/// Running figures of each output over the evaluation batches.
struct Figures {
    names: Vec<String>,
    stats: Vec<Stats>,
}

/// One output's figures so far.
#[derive(Clone, Copy)]
struct Stats {
    /// Largest |got - want| (infinite once `got` is not finite).
    max_abs: f64,
    /// Largest |want|.
    ref_max: f64,
    /// Rows compared for top-1, and those whose arg-max agrees.
    rows: u64,
    agree: u64,
    /// `[N, C]` with C ≥ 2 in every batch.
    classification: bool,
}

impl Figures {
    fn new(names: &[String]) -> Figures {
        Figures {
            names: names.to_vec(),
            stats: vec![
                Stats {
                    max_abs: 0.0,
                    ref_max: 0.0,
                    rows: 0,
                    agree: 0,
                    classification: true,
                };
                names.len()
            ],
        }
    }

    fn add(&mut self, want: &[Output], got: &[Output]) -> Result<(), OvError> {
        for ((name, s), ((ws, w), (gs, g))) in self
            .names
            .iter()
            .zip(&mut self.stats)
            .zip(want.iter().zip(got))
        {
            if ws != gs || w.len() != g.len() {
                return Err(OvError::Run(format!(
                    "output {name}: shape {gs:?} in the reduced precision, {ws:?} in FP32"
                )));
            }
            for (&a, &b) in g.iter().zip(w) {
                let d = if a.is_finite() {
                    (a - b).abs()
                } else {
                    f64::INFINITY
                };
                s.max_abs = s.max_abs.max(d);
                s.ref_max = s.ref_max.max(b.abs());
            }
            let classification = ws.len() == 2 && ws[1] >= 2;
            s.classification &= classification;
            if classification {
                let cols = ws[1];
                for (wr, gr) in w.chunks_exact(cols).zip(g.chunks_exact(cols)) {
                    s.rows += 1;
                    s.agree += u64::from(argmax(wr) == argmax(gr));
                }
            }
        }
        Ok(())
    }

    fn finish(self) -> Vec<OutputFigures> {
        self.names
            .into_iter()
            .zip(self.stats)
            .map(|(name, s)| {
                let Stats {
                    max_abs,
                    ref_max,
                    rows,
                    agree,
                    classification: cls,
                } = s;
                let rel = if ref_max > 0.0 {
                    max_abs / ref_max
                } else if max_abs == 0.0 {
                    0.0
                } else {
                    f64::INFINITY
                };
                OutputFigures {
                    name,
                    max_abs: max_abs.is_finite().then_some(max_abs),
                    max_rel: (max_abs.is_finite() && rel.is_finite()).then_some(rel),
                    top1_agreement: cls.then(|| {
                        if rows == 0 {
                            1.0
                        } else {
                            agree as f64 / rows as f64
                        }
                    }),
                    rows: cls.then_some(rows),
                }
            })
            .collect()
    }
}

/// The index of a row's largest value (the first of equals), as numpy's `argmax`.
fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
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
    let (_dir, model) = model_file(bytes)?;
    let mut ms = Vec::with_capacity(STARTUP_RUNS);
    let mut compiled = None;
    for _ in 0..STARTUP_RUNS {
        let t = Instant::now();
        let made = compile(lib, &model, threads, hint(spec.precision))?;
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
