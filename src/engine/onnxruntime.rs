//! The ONNX Runtime candidate of a CPU target: load the model in `libonnxruntime` (the pinned
//! wheel's library from the library cache, opened at run time through the `ort` crate's
//! `load-dynamic`), measure start-up and T(b) with the thread count the runtime will use, and
//! run the same inputs as tract to compare outputs. [`super::select`] decides.
//!
//! The session is made as infer-serve's ONNX Runtime backend makes it: all graph optimisations,
//! `threads` intra-op threads, one inter-op thread.
//!
//! [`fold`] is the constant-folding pass tract is retried on: ONNX Runtime's basic graph
//! optimisation (constant folding and the rewrites that keep the graph portable ONNX), written
//! back out as ONNX.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use infer_spec::engine::Version;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{DynValue, Tensor as OrtTensor, TensorElementType, ValueType};
use tract_onnx::prelude::{TValue, TVec, Tensor};

use super::spec::{EngineSpec, LibraryCandidate};

/// Why ONNX Runtime could not measure or fold a model. The text is ONNX Runtime's own words
/// with what was being done; the variant says which step failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OrtError {
    /// The library could not be fetched, found, loaded or given an environment.
    #[error("{0}")]
    Library(String),
    /// The model does not load into a session.
    #[error("{0}")]
    Load(String),
    /// The model loads but fails on the inputs, or returns what cannot be compared.
    #[error("{0}")]
    Run(String),
    /// The folded model could not be written or read back.
    #[error("{0}")]
    Fold(String),
}

/// A session builder's error (each step has its own error type) as a load failure.
fn load(e: impl std::fmt::Display) -> OrtError {
    OrtError::Load(e.to_string())
}
use super::timing::{median_sorted, round_us, time_batch, Measured, STARTUP_RUNS};
use super::tract::sample_inputs;

/// ONNX Runtime for constant folding only (`engine.cpu = "tract"`): its version (part of the
/// engine key) and how to get its library, called only when tract cannot load a model as it
/// is, so a recipe whose model tract loads never fetches it.
#[derive(Clone)]
pub struct Folding {
    pub version: Version,
    fetch: Arc<dyn Fn() -> Result<PathBuf, OrtError> + Send + Sync>,
}

impl Folding {
    pub fn new(
        version: Version,
        fetch: impl Fn() -> Result<PathBuf, OrtError> + Send + Sync + 'static,
    ) -> Folding {
        Folding {
            version,
            fetch: Arc::new(fetch),
        }
    }

    /// The library, fetched into the library cache if needed.
    pub(crate) fn library(&self) -> Result<PathBuf, OrtError> {
        (self.fetch)()
    }
}

impl std::fmt::Debug for Folding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Folding(onnxruntime {})", self.version)
    }
}

impl PartialEq for Folding {
    fn eq(&self, other: &Folding) -> bool {
        self.version == other.version
    }
}

/// `bytes` after ONNX Runtime's basic graph optimisation (level 1: constant folding, shape
/// computations of known dimensions, redundant-node elimination; no fused or
/// hardware-specific operators), as ONNX. The same library and model give the same bytes.
pub(crate) fn fold(library: &Path, bytes: &[u8]) -> Result<Vec<u8>, OrtError> {
    let env = environment_at(library)?;
    let dir =
        tempfile::tempdir().map_err(|e| OrtError::Fold(format!("a temporary directory: {e}")))?;
    let out = dir.path().join("folded.onnx");
    Session::builder(&env)
        .map_err(load)?
        .with_optimization_level(GraphOptimizationLevel::Level1)
        .map_err(load)?
        .with_intra_threads(1)
        .map_err(load)?
        .with_optimized_model_path(&out)
        .map_err(load)?
        .commit_from_memory(bytes)
        .map_err(load)?;
    std::fs::read(&out).map_err(|e| OrtError::Fold(format!("reading the folded model: {e}")))
}

/// An output as its shape and its elements widened to f64 (row-major), for the comparison.
pub(crate) type Output = (Vec<usize>, Vec<f64>);

/// What ONNX Runtime measured.
/// The process's ONNX Runtime environment, from `library`. ONNX Runtime allows one environment
/// per process, so the first call creates it and later calls share it; a later call for another
/// library is refused.
fn environment_at(library: &Path) -> Result<ort::environment::Environment, OrtError> {
    static ENV: std::sync::Mutex<Option<(PathBuf, ort::environment::Environment)>> =
        std::sync::Mutex::new(None);
    let mut env = ENV.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((loaded, e)) = env.as_ref() {
        if loaded == library {
            return Ok(e.clone());
        }
        return Err(OrtError::Library(format!(
            "ONNX Runtime is already loaded from {} in this process; {} cannot be loaded too",
            loaded.display(),
            library.display()
        )));
    }
    if !library.is_file() {
        return Err(OrtError::Library(format!(
            "the ONNX Runtime library {} is missing",
            library.display()
        )));
    }
    let made = ort::init_from(library)
        .map_err(|e| {
            OrtError::Library(format!(
                "cannot load ONNX Runtime from {}: {e}",
                library.display()
            ))
        })?
        .with_name("infer-build")
        .with_telemetry(false)
        .build()
        .map_err(|e| {
            OrtError::Library(format!("cannot create the ONNX Runtime environment: {e}"))
        })?;
    *env = Some((library.to_path_buf(), made.clone()));
    Ok(made)
}

fn session(
    env: &ort::environment::Environment,
    bytes: &[u8],
    threads: usize,
) -> Result<Session, OrtError> {
    Session::builder(env)
        .map_err(load)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(load)?
        .with_intra_threads(threads)
        .map_err(load)?
        .with_inter_threads(1)
        .map_err(load)?
        .commit_from_memory(bytes)
        .map_err(load)
}

/// A tract tensor as an ONNX Runtime value of the same type and shape.
fn to_ort(t: &Tensor) -> Result<DynValue, OrtError> {
    use tract_onnx::prelude::DatumType as D;
    let shape: Vec<i64> = t.shape().iter().map(|&d| d as i64).collect();
    macro_rules! conv {
        ($ty:ty) => {
            OrtTensor::from_array((
                shape,
                t.to_plain_array_view::<$ty>()
                    .map_err(|e| OrtError::Run(e.to_string()))?
                    .iter()
                    .cloned()
                    .collect::<Vec<$ty>>(),
            ))
            .map(|v| v.into_dyn())
            .map_err(|e| OrtError::Run(e.to_string()))
        };
    }
    match t.datum_type() {
        D::F32 => conv!(f32),
        D::F64 => conv!(f64),
        D::I64 => conv!(i64),
        D::I32 => conv!(i32),
        D::I16 => conv!(i16),
        D::I8 => conv!(i8),
        D::U8 => conv!(u8),
        D::Bool => conv!(bool),
        other => Err(OrtError::Run(format!(
            "datatype {other:?} is not measured with ONNX Runtime"
        ))),
    }
}

/// An output value as (shape, elements as f64).
fn from_ort(v: &DynValue) -> Result<Output, OrtError> {
    let ty = match v.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        other => return Err(OrtError::Run(format!("an output is {other}, not a tensor"))),
    };
    macro_rules! ext {
        ($ty:ty) => {{
            let (shape, data) = v
                .try_extract_tensor::<$ty>()
                .map_err(|e| OrtError::Run(e.to_string()))?;
            (
                shape.iter().map(|&d| d.max(0) as usize).collect(),
                data.iter().map(|&x| x as f64).collect(),
            )
        }};
    }
    Ok(match ty {
        TensorElementType::Float32 => ext!(f32),
        TensorElementType::Float64 => ext!(f64),
        TensorElementType::Int64 => ext!(i64),
        TensorElementType::Int32 => ext!(i32),
        TensorElementType::Int16 => ext!(i16),
        TensorElementType::Int8 => ext!(i8),
        TensorElementType::Uint8 => ext!(u8),
        TensorElementType::Bool => {
            let (shape, data) = v
                .try_extract_tensor::<bool>()
                .map_err(|e| OrtError::Run(e.to_string()))?;
            (
                shape.iter().map(|&d| d.max(0) as usize).collect(),
                data.iter().map(|&x| f64::from(u8::from(x))).collect(),
            )
        }
        other => {
            return Err(OrtError::Run(format!(
                "output type {other} is not compared"
            )))
        }
    })
}

fn feed(names: &[String], inputs: &TVec<TValue>) -> Result<Vec<(String, DynValue)>, OrtError> {
    names
        .iter()
        .zip(inputs.iter())
        .map(|(name, t)| Ok((name.clone(), to_ort(t)?)))
        .collect()
}

fn run(s: &mut Session, names: &[String], inputs: &TVec<TValue>) -> Result<Vec<Output>, OrtError> {
    let feed = feed(names, inputs)?;
    let outputs: Vec<String> = s.outputs().iter().map(|o| o.name().to_owned()).collect();
    let out = s.run(feed).map_err(|e| OrtError::Run(e.to_string()))?;
    outputs
        .iter()
        .map(|n| {
            out.get(n.as_str())
                .ok_or_else(|| OrtError::Run(format!("ONNX Runtime returned no output {n:?}")))
                .and_then(from_ort)
        })
        .collect()
}

/// Load `bytes` in ONNX Runtime and measure it for `spec` with `threads` intra-op threads;
/// `reference` are the inputs (in the model's input order) whose outputs are returned for the
/// comparison with tract.
pub(crate) fn measure(
    spec: &EngineSpec,
    c: &LibraryCandidate,
    bytes: &[u8],
    threads: usize,
    reference: Option<&TVec<TValue>>,
) -> Result<Measured, OrtError> {
    let env = environment_at(&c.library)?;
    let mut ms = Vec::with_capacity(STARTUP_RUNS);
    let mut s = None;
    for _ in 0..STARTUP_RUNS {
        let t = Instant::now();
        let made = session(&env, bytes, threads)?;
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        s = Some(made);
    }
    let mut s = s.ok_or_else(|| OrtError::Load("no session".to_owned()))?;
    ms.sort_by(f64::total_cmp);
    let names: Vec<String> = s.inputs().iter().map(|o| o.name().to_owned()).collect();
    let outputs = match reference {
        Some(r) => Some(run(&mut s, &names, r)?),
        None => None,
    };
    let mut batches = Vec::new();
    for b in spec.planned_batches() {
        let inputs = sample_inputs(&spec.inputs, &names, b as usize)
            .map_err(|e| OrtError::Run(format!("{e:#}")))?;
        for _ in 0..3 {
            run(&mut s, &names, &inputs)?;
        }
        batches.push(time_batch(b, || {
            // As tract's timing: the inputs are made before the clock starts.
            let f = feed(&names, &inputs)?;
            let t = Instant::now();
            s.run(f).map_err(|e| OrtError::Run(e.to_string()))?;
            Ok::<_, OrtError>(t.elapsed())
        })?);
    }
    Ok(Measured {
        startup_ms: round_us(median_sorted(&ms)),
        startup_runs: STARTUP_RUNS as u32,
        batches,
        outputs,
    })
}
