//! The engines behind the batcher: a synchronous trait, one instance per backend thread.
//!
//! An [`Engine`] is loaded (and optimised) once at start; each batcher instance thread asks it
//! for its own [`Backend`], which runs one batch at a time. Backends never see HTTP, JSON or
//! the queue: they get one tensor per model input (rows concatenated along the batch
//! dimension, in the config's input order) and return one tensor per model output.

use crate::tensor::Tensor;
use infer_spec::RuntimeConfig;
use std::path::Path;
use std::sync::Arc;

#[cfg(feature = "onnxruntime")]
pub mod onnxruntime;
#[cfg(feature = "synthetic")]
pub mod synthetic;
#[cfg(feature = "tensorrt")]
pub mod tensorrt;
#[cfg(feature = "tract")]
pub mod tract;

/// A loaded engine, shared by every instance.
pub trait Engine: Send + Sync {
    /// A new instance (its own execution state) for one backend thread.
    fn instance(&self) -> Result<Box<dyn Backend>, String>;
}

/// One instance: executes one batch at a time on its own thread.
pub trait Backend: Send {
    /// Runs one batch; every input has the same number of rows, and every output must too.
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError>;

    /// Called after `execute` panicked: drop any state the panic may have left half-written
    /// (the next batch starts clean). Backends without state between batches need nothing.
    fn recover(&mut self) {}
}

/// Why a batch failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecError {
    /// This batch failed; the instance (and every other) runs the next one as usual.
    Batch(String),
    /// The device is unusable for the rest of the process (a sticky CUDA error such as an
    /// illegal address): every later batch on any instance would fail the same way. The
    /// batcher stops serving the model and readiness fails from then on.
    DeviceLost(String),
}

impl From<String> for ExecError {
    fn from(e: String) -> ExecError {
        ExecError::Batch(e)
    }
}

impl std::fmt::Display for ExecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExecError::Batch(e) => f.write_str(e),
            ExecError::DeviceLost(e) => write!(f, "the device is lost: {e}"),
        }
    }
}

impl From<ExecError> for String {
    fn from(e: ExecError) -> String {
        e.to_string()
    }
}

/// Loads the engine `cfg.engine` names; `base` is the directory `engine.path` is relative to.
pub fn load(cfg: &RuntimeConfig, base: &Path) -> Result<Arc<dyn Engine>, String> {
    let kind = cfg.engine.kind;
    #[cfg(feature = "tract")]
    if kind == infer_spec::BackendKind::TractOnnx {
        let path = cfg
            .engine
            .path
            .as_deref()
            .ok_or("engine.path is required for tract-onnx")?;
        return Ok(Arc::new(tract::TractEngine::load(cfg, &base.join(path))?));
    }
    #[cfg(feature = "tract")]
    if kind == infer_spec::BackendKind::TractNnef {
        let path = cfg
            .engine
            .path
            .as_deref()
            .ok_or("engine.path is required for tract-nnef")?;
        return Ok(Arc::new(tract::TractEngine::load_nnef(
            cfg,
            &base.join(path),
        )?));
    }
    #[cfg(feature = "tensorrt")]
    if kind == infer_spec::BackendKind::TensorRt {
        let path = cfg
            .engine
            .path
            .as_deref()
            .ok_or("engine.path is required for tensorrt")?;
        return Ok(Arc::new(tensorrt::TensorrtEngine::load(
            cfg,
            base,
            &base.join(path),
        )?));
    }
    #[cfg(feature = "onnxruntime")]
    if kind == infer_spec::BackendKind::OnnxRuntime {
        let path = cfg
            .engine
            .path
            .as_deref()
            .ok_or("engine.path is required for onnxruntime")?;
        let library = onnxruntime::probe(&onnxruntime::library_path(cfg, base)?)?;
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        return Ok(Arc::new(onnxruntime::OrtEngine::load(
            cfg,
            &base.join(path),
            library,
            cpus,
        )?));
    }
    #[cfg(feature = "synthetic")]
    if kind == infer_spec::BackendKind::Synthetic {
        return Ok(Arc::new(synthetic::SyntheticEngine::new(cfg)?));
    }
    let _ = base;
    Err(format!(
        "engine kind \"{}\" is not built into this infer-serve (backends: {})",
        kind.as_str(),
        built_features().join(", ")
    ))
}

/// What this node has for the configured engine, for the start-up compatibility check: for a
/// TensorRT engine, GPU 0 and the TensorRT library (an error when either is missing); for an
/// ONNX Runtime engine, the CPU and the library's version (an error when it cannot be loaded);
/// otherwise the CPU only.
pub fn node(cfg: &RuntimeConfig, base: &Path) -> Result<infer_spec::engine::Found, String> {
    #[cfg(feature = "tensorrt")]
    if cfg.engine.kind == infer_spec::BackendKind::TensorRt {
        return tensorrt::probe(cfg, base);
    }
    #[cfg(feature = "onnxruntime")]
    if cfg.engine.kind == infer_spec::BackendKind::OnnxRuntime {
        let lib = onnxruntime::probe(&onnxruntime::library_path(cfg, base)?)?;
        return Ok(infer_spec::engine::Found {
            gpu: None,
            tensorrt: None,
            onnxruntime: Some(lib.version),
            cpu: infer_spec::engine::FoundCpu::detect(),
        });
    }
    let _ = (cfg, base);
    Ok(infer_spec::engine::Found {
        gpu: None,
        tensorrt: None,
        onnxruntime: None,
        cpu: infer_spec::engine::FoundCpu::detect(),
    })
}

/// The backend features compiled in.
pub fn built_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if cfg!(feature = "tract") {
        f.push("tract-onnx");
        f.push("tract-nnef");
    }
    if cfg!(feature = "onnxruntime") {
        f.push("onnxruntime");
    }
    if cfg!(feature = "synthetic") {
        f.push("synthetic");
    }
    if cfg!(feature = "tensorrt") {
        f.push("tensorrt");
    }
    f
}
