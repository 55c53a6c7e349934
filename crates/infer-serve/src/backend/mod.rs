//! The engines behind the batcher: a synchronous trait, one instance per backend thread.
//!
//! An [`Engine`] is loaded (and optimised) once at start; each batcher instance thread asks it
//! for its own [`Backend`], which runs one batch at a time. Backends never see HTTP, JSON or
//! the queue: they get one tensor per model input (rows concatenated along the batch
//! dimension, in the config's input order) and return one tensor per model output.

use crate::tensor::Tensor;
use infer_spec::engine::Found;
use infer_spec::{BackendKind, RuntimeConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[cfg(feature = "onnxruntime")]
pub(crate) mod onnxruntime;
#[cfg(feature = "openvino")]
pub(crate) mod openvino;
#[cfg(feature = "synthetic")]
pub(crate) mod synthetic;
#[cfg(feature = "tensorrt")]
pub(crate) mod tensorrt;
#[cfg(feature = "tract")]
pub(crate) mod tract;

/// A loaded engine, shared by every instance.
pub(crate) trait Engine: Send + Sync {
    /// A new instance (its own execution state) for one backend thread.
    fn instance(&self) -> Result<Box<dyn Backend>, Error>;
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

/// A backend compiled into this build: the `runtime.toml` kind it runs (one of an engine's
/// [`EngineDef::formats`](infer_spec::engines::EngineDef::formats)), how it loads an engine
/// and what it reports of the node. [`COMPILED`] lists them; [`load`], [`node`] and
/// [`built_features`] read the list and nothing else.
struct Compiled {
    kind: BackendKind,
    /// Loads the engine at `path` (`engine.path` resolved against `base`).
    load: fn(&RuntimeConfig, &Path, &Path) -> Loaded,
    /// What the node has for it (a library's version, a GPU), for the compatibility check.
    node: fn(&RuntimeConfig, &Path) -> Result<Found, Error>,
}

/// The backends of this build, each behind its feature.
const COMPILED: &[Compiled] = &[
    #[cfg(feature = "tract")]
    Compiled {
        kind: BackendKind::TractOnnx,
        load: |cfg, _, path| Ok(Arc::new(tract::TractEngine::load(cfg, path)?)),
        node: cpu_only,
    },
    #[cfg(feature = "tract")]
    Compiled {
        kind: BackendKind::TractNnef,
        load: |cfg, _, path| Ok(Arc::new(tract::TractEngine::load_nnef(cfg, path)?)),
        node: cpu_only,
    },
    #[cfg(feature = "onnxruntime")]
    Compiled {
        kind: BackendKind::OnnxRuntime,
        load: |cfg, base, path| {
            let library = onnxruntime::probe(&onnxruntime::library_path(cfg, base)?)?;
            Ok(Arc::new(onnxruntime::OrtEngine::load(cfg, path, library)?))
        },
        node: |cfg, base| {
            let lib = onnxruntime::probe(&onnxruntime::library_path(cfg, base)?)?;
            Ok(Found {
                onnxruntime: Some(lib.version),
                ..cpu_only(cfg, base)?
            })
        },
    },
    #[cfg(feature = "openvino")]
    Compiled {
        kind: BackendKind::OpenVino,
        load: |cfg, base, path| {
            let (lib, _) = openvino::library(cfg, base)?;
            Ok(Arc::new(openvino::OvEngine::load(cfg, path, lib)?))
        },
        node: |cfg, base| {
            let (_, version) = openvino::library(cfg, base)?;
            Ok(Found {
                openvino: Some(version),
                ..cpu_only(cfg, base)?
            })
        },
    },
    #[cfg(feature = "synthetic")]
    Compiled {
        kind: BackendKind::Synthetic,
        load: |cfg, _, _| Ok(Arc::new(synthetic::SyntheticEngine::new(cfg)?)),
        node: cpu_only,
    },
    #[cfg(feature = "tensorrt")]
    Compiled {
        kind: BackendKind::TensorRt,
        load: |cfg, base, path| Ok(Arc::new(tensorrt::TensorrtEngine::load(cfg, base, path)?)),
        node: tensorrt::probe,
    },
];

/// This node's CPU, for engines that need nothing else.
fn cpu_only(_: &RuntimeConfig, _: &Path) -> Result<Found, Error> {
    Ok(Found {
        gpu: None,
        tensorrt: None,
        onnxruntime: None,
        openvino: None,
        cpu: infer_spec::engine::FoundCpu::detect(),
    })
}

fn compiled(kind: BackendKind) -> Result<&'static Compiled, Error> {
    COMPILED
        .iter()
        .find(|c| c.kind == kind)
        .ok_or_else(|| Error::NotBuilt {
            kind,
            built: built_features(),
        })
}

/// Why the engine `runtime.toml` names cannot be loaded, an instance of it made, or this node
/// described for it. The variant says what failed; the text is the backend's own words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[cfg_attr(
    not(feature = "tensorrt"),
    allow(
        dead_code,
        reason = "TensorRT's backend makes them all; the CPU ones only some"
    )
)]
pub(crate) enum Error {
    /// `engine.kind` names a backend this build of infer-serve lacks.
    #[error("engine kind \"{}\" is not built into this infer-serve (backends: {})", kind.as_str(), built.join(", "))]
    NotBuilt {
        kind: BackendKind,
        built: Vec<&'static str>,
    },
    /// `engine.path` is missing for a backend that loads a file.
    #[error("engine.path is required for {}", .0.as_str())]
    NoPath(BackendKind),
    /// The library the backend opens (`engine.library`, TensorRT's runtime) is missing, cannot
    /// be opened, or is not one this build can use.
    #[error("{0}")]
    Library(String),
    /// This node lacks what the engine needs (a GPU, a driver).
    #[error("{0}")]
    Node(String),
    /// The engine file, or its metadata, cannot be read or loaded, or does not match
    /// `runtime.toml`'s tensors.
    #[error("{0}")]
    Engine(String),
    /// A loaded engine could not make another instance (its execution state).
    #[error("{0}")]
    Instance(String),
}

/// `Ok` when the model at `model` has as many inputs and outputs as `runtime.toml` lists.
#[cfg(any(feature = "onnxruntime", feature = "openvino"))]
pub(crate) fn check_counts(
    cfg: &RuntimeConfig,
    model: &Path,
    inputs: usize,
    outputs: usize,
) -> Result<(), Error> {
    if inputs != cfg.inputs.len() || outputs != cfg.outputs.len() {
        return Err(Error::Engine(format!(
            "{}: the model has {inputs} inputs and {outputs} outputs, runtime.toml lists {} and {}",
            model.display(),
            cfg.inputs.len(),
            cfg.outputs.len()
        )));
    }
    Ok(())
}

/// What a backend's loader returns.
type Loaded = Result<Arc<dyn Engine>, Error>;

/// Loads the engine `cfg.engine` names; `base` is the directory `engine.path` is relative to.
pub(crate) fn load(cfg: &RuntimeConfig, base: &Path) -> Loaded {
    let kind = cfg.engine.kind;
    let backend = compiled(kind)?;
    let path = match (&cfg.engine.path, kind) {
        (Some(p), _) => base.join(p),
        (None, BackendKind::Synthetic) => PathBuf::new(),
        (None, _) => return Err(Error::NoPath(kind)),
    };
    (backend.load)(cfg, base, &path)
}

/// What this node has for the configured engine, for the start-up compatibility check: for a
/// TensorRT engine, GPU 0 and the TensorRT library (an error when either is missing); for an
/// engine that loads a library (ONNX Runtime), the CPU and the library's version (an error when
/// it cannot be loaded); otherwise the CPU only.
pub(crate) fn node(cfg: &RuntimeConfig, base: &Path) -> Result<Found, Error> {
    match compiled(cfg.engine.kind) {
        Ok(backend) => (backend.node)(cfg, base),
        // `load` says that the backend is missing.
        Err(_) => cpu_only(cfg, base),
    }
}

/// The backend kinds compiled in (`runtime.toml` spellings).
pub(crate) fn built_features() -> Vec<&'static str> {
    COMPILED.iter().map(|c| c.kind.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each `runtime.toml` kind has at most one backend, and every backend's kind is one of an
    /// engine's formats in the catalog (or `synthetic`, which runs none).
    #[test]
    fn each_kind_has_one_backend_of_one_engine() {
        let kinds: Vec<BackendKind> = COMPILED.iter().map(|c| c.kind).collect();
        for k in &kinds {
            assert_eq!(
                kinds.iter().filter(|x| *x == k).count(),
                1,
                "{}",
                k.as_str()
            );
        }
        for c in COMPILED {
            assert!(
                c.kind == BackendKind::Synthetic || c.kind.engine().is_some(),
                "{}",
                c.kind.as_str()
            );
        }
        assert_eq!(
            built_features(),
            kinds.iter().map(|k| k.as_str()).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_kind_this_build_lacks_is_named_with_the_ones_it_has() {
        if cfg!(feature = "tensorrt") {
            return;
        }
        let mut cfg = crate::fixtures::decoder_model("INT64", false);
        cfg.engine.kind = BackendKind::TensorRt;
        let e = load(&cfg, Path::new("/")).err().unwrap();
        assert!(
            matches!(
                e,
                Error::NotBuilt {
                    kind: BackendKind::TensorRt,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(
            e.to_string().contains("is not built into this infer-serve"),
            "{e}"
        );
    }
}
