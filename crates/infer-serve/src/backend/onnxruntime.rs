//! The ONNX Runtime backend (feature `onnxruntime`): an ONNX model run on the CPU by
//! `libonnxruntime`, which is not linked but opened at start (`dlopen`) from `engine.library`.
//!
//! Start: [`probe`] opens the library itself, reads its version and checks that it serves the
//! C API version the `ort` crate asks for, so a missing, foreign or too old library is a clear
//! error (exit 1) before `ort` touches it (`ort` panics on some of these, and the runtime
//! aborts on panics). [`OrtEngine::load`] then creates the one ONNX Runtime environment of the
//! process (or, for a bundle's later models, shares it) and a first session, which checks the
//! model against `runtime.toml` (tensors by name, datatypes); each further instance gets its
//! own session of the same file, with its own intra-op thread pool of `engine.threads`
//! threads, which start-up decides on the node ([`RuntimeConfig::threads`]).
//!
//! ONNX Runtime handles variable dimensions itself: batches of any shape within the profile
//! run on the same session. Inputs are fed and outputs read by name; when the names in
//! `runtime.toml` do not all match the model's, by position (as for tract).
#![allow(
    unsafe_code,
    reason = "FFI: the library is opened with dlopen and its C API version read before `ort` uses it; \
              tensors are copied between ONNX Runtime's buffers and the batcher's"
)]

use super::{Backend, Engine, Error, ExecError};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::engine::Version;
use infer_spec::{DataType, RuntimeConfig};
use ort::logging::LogLevel;
use ort::memory::Allocator;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{DynTensor, DynTensorValueType, TensorElementType, ValueType};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The ONNX Runtime library `runtime.toml` names, opened and identified.
#[derive(Debug, Clone)]
pub(crate) struct Library {
    pub path: PathBuf,
    pub version: Version,
}

/// `engine.library` resolved against the directory of `runtime.toml`.
pub(crate) fn library_path(cfg: &RuntimeConfig, base: &Path) -> Result<PathBuf, Error> {
    let rel =
        cfg.engine.library.as_deref().ok_or_else(|| {
            Error::Library("engine.library is required for onnxruntime".to_owned())
        })?;
    let p = base.join(rel);
    // dlopen searches the library path for a bare name; a path with a directory is used as is.
    Ok(if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    })
}

/// Opens the library at `path` and reads its version, without letting `ort` near it: every
/// way it can be unusable is an `Err` that names the path.
pub(crate) fn probe(path: &Path) -> Result<Library, Error> {
    let shown = path.display();
    if !path.exists() {
        return Err(Error::Library(format!(
            "the ONNX Runtime library {shown} does not exist"
        )));
    }
    // SAFETY: opening a shared library runs its initialisers; the path is the one the image
    // (or the operator) configured as ONNX Runtime, which is the point of this backend.
    let lib = unsafe { libloading::Library::new(path) }.map_err(|e| {
        // libloading says "dlopen failed" and keeps the loader's reason as the source.
        let why = std::error::Error::source(&e).map_or(String::new(), |s| format!(": {s}"));
        Error::Library(format!(
            "cannot load the ONNX Runtime library {shown}: {e}{why}"
        ))
    })?;
    type GetApiBase = unsafe extern "C" fn() -> *const ort::sys::OrtApiBase;
    // SAFETY: `OrtGetApiBase` has this signature in every ONNX Runtime release.
    let get_base = unsafe { lib.get::<GetApiBase>(b"OrtGetApiBase") }.map_err(|_| {
        Error::Library(format!(
            "{shown} is not an ONNX Runtime library: it does not export OrtGetApiBase"
        ))
    })?;
    // SAFETY: a function without arguments returning a pointer to a static struct.
    let base = unsafe { get_base() };
    if base.is_null() {
        return Err(Error::Library(format!(
            "{shown}: OrtGetApiBase returned nothing"
        )));
    }
    // SAFETY: `base` points to the library's static `OrtApiBase`; the version string is a
    // static NUL-terminated string owned by the library.
    let text = unsafe {
        let s = ((*base).GetVersionString)();
        if s.is_null() {
            return Err(Error::Library(format!(
                "{shown}: the library reports no version"
            )));
        }
        std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned()
    };
    let version: Version = text.parse().map_err(|_| {
        Error::Library(format!(
            "{shown}: the library reports the malformed version {text:?}"
        ))
    })?;
    // SAFETY: as above; `GetApi` returns null for an API version the library does not serve.
    let api = unsafe { ((*base).GetApi)(ort::MINOR_VERSION) };
    if version.major() != 1 || api.is_null() {
        return Err(Error::Library(format!(
            "{shown} is ONNX Runtime {version}; this runtime needs 1.{} or newer (it was built with ort {}, for ONNX Runtime {})",
            ort::MINOR_VERSION,
            ORT_CRATE,
            TARGET_ONNXRUNTIME
        )));
    }
    // `lib` is closed here; `ort` opens the same file again (the loader shares the mapping).
    Ok(Library {
        path: path.to_owned(),
        version,
    })
}

/// The `ort` crate this backend is built with, and the ONNX Runtime release it targets.
pub(crate) const ORT_CRATE: &str = "2.0.0-rc.15";
pub(crate) const TARGET_ONNXRUNTIME: &str = "1.31";

fn element(dt: DataType) -> Result<TensorElementType, Error> {
    Ok(match dt {
        DataType::Bool => TensorElementType::Bool,
        DataType::U8 => TensorElementType::Uint8,
        DataType::U16 => TensorElementType::Uint16,
        DataType::U32 => TensorElementType::Uint32,
        DataType::U64 => TensorElementType::Uint64,
        DataType::I8 => TensorElementType::Int8,
        DataType::I16 => TensorElementType::Int16,
        DataType::I32 => TensorElementType::Int32,
        DataType::I64 => TensorElementType::Int64,
        DataType::F16 => TensorElementType::Float16,
        DataType::BF16 => TensorElementType::Bfloat16,
        DataType::F32 => TensorElementType::Float32,
        DataType::F64 => TensorElementType::Float64,
        DataType::Bytes => {
            return Err(Error::Engine(format!(
                "datatype {dt} is not supported by the onnxruntime backend"
            )))
        }
    })
}

/// The loaded engine: the environment, the model's tensor names, and a first session.
pub(crate) struct OrtEngine {
    env: ort::environment::Environment,
    path: PathBuf,
    threads: usize,
    library: Library,
    /// Per runtime.toml input, the model input name it feeds, and its element type.
    inputs: Vec<(String, TensorElementType)>,
    /// Per runtime.toml output, the model output name it is, and its datatype.
    outputs: Vec<(String, DataType)>,
    /// The session made while loading, handed to the first instance.
    first: Mutex<Option<Session>>,
}

impl OrtEngine {
    /// Loads `model` with the library [`probe`] identified, each instance on `engine.threads`
    /// intra-op threads (decided at start; a config that reaches here without them gets the
    /// rule's count on the CPUs this process may use).
    pub(crate) fn load(
        cfg: &RuntimeConfig,
        model: &Path,
        library: Library,
    ) -> Result<OrtEngine, Error> {
        let env = environment(&library)?;
        let threads = match cfg.engine.threads {
            Some(t) => t as usize,
            None => cfg.threads(crate::cpus::detect().count, None).0,
        };
        let session = new_session(&env, model, threads, &library)?;
        let names = |outlets: &[ort::value::Outlet]| -> Vec<String> {
            outlets.iter().map(|o| o.name().to_owned()).collect()
        };
        let (model_in, model_out) = (names(session.inputs()), names(session.outputs()));
        super::check_counts(cfg, model, model_in.len(), model_out.len())?;
        let in_names = match_names(&model_in, cfg.inputs.iter().map(|s| s.name.as_str()));
        let out_names = match_names(&model_out, cfg.outputs.iter().map(|s| s.name.as_str()));
        let type_of = |outlets: &[ort::value::Outlet], name: &str| {
            outlets
                .iter()
                .find(|o| o.name() == name)
                .map(|o| o.dtype().clone())
        };
        let mut inputs = Vec::new();
        for (spec, name) in cfg.inputs.iter().zip(in_names) {
            let want = element(spec.datatype)?;
            check_type(model, "input", name, type_of(session.inputs(), name), want)?;
            inputs.push((name.to_owned(), want));
        }
        let mut outputs = Vec::new();
        for (spec, name) in cfg.outputs.iter().zip(out_names) {
            let want = element(spec.datatype)?;
            check_type(
                model,
                "output",
                name,
                type_of(session.outputs(), name),
                want,
            )?;
            outputs.push((name.to_owned(), spec.datatype));
        }
        Ok(OrtEngine {
            env,
            path: model.to_owned(),
            threads,
            library,
            inputs,
            outputs,
            first: Mutex::new(Some(session)),
        })
    }
}

/// The process's one ONNX Runtime environment (ONNX Runtime allows one per process), created
/// from `library` by the first model that loads and shared by every later one (a bundle's
/// models). A later model naming another library is refused: the process has one ONNX Runtime.
fn environment(library: &Library) -> Result<ort::environment::Environment, Error> {
    static ENV: Mutex<Option<(PathBuf, ort::environment::Environment)>> = Mutex::new(None);
    let mut env = ENV
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let same = |a: &Path, b: &Path| {
        a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    };
    if let Some((path, e)) = &*env {
        if same(path, &library.path) {
            return Ok(e.clone());
        }
        return Err(Error::Library(format!(
            "engine.library {}: this process already runs ONNX Runtime from {}, and one process has one ONNX Runtime; every model of a bundle must name the same library",
            library.path.display(),
            path.display()
        )));
    }
    let e = ort::init_from(&library.path)
        .map_err(|e| Error::Library(format!("cannot load ONNX Runtime: {e}")))?
        .with_name("infer-serve")
        .with_telemetry(false)
        .with_logger(Arc::new(log_line))
        .build()
        .map_err(|e| Error::Library(format!("cannot create the ONNX Runtime environment: {e}")))?;
    // The logger above receives every level: let ONNX Runtime drop the chatter itself.
    e.set_log_level(LogLevel::Warning);
    *env = Some((library.path.clone(), e.clone()));
    Ok(e)
}

/// ONNX Runtime's own messages, as the runtime's JSON log lines.
fn log_line(level: LogLevel, category: &str, _id: &str, location: &str, message: &str) {
    let level = match level {
        LogLevel::Verbose | LogLevel::Info => return,
        LogLevel::Warning => "warn",
        LogLevel::Error | LogLevel::Fatal => "error",
    };
    crate::log::log(
        level,
        "onnxruntime",
        &[
            ("category", serde_json::json!(category)),
            ("location", serde_json::json!(location)),
            ("message", serde_json::json!(message)),
        ],
    );
}

fn new_session(
    env: &ort::environment::Environment,
    model: &Path,
    threads: usize,
    library: &Library,
) -> Result<Session, Error> {
    let ctx = |e: String| {
        Error::Engine(format!(
            "ONNX Runtime {} cannot load the model {}: {e}",
            library.version,
            model.display()
        ))
    };
    Session::builder(env)
        .map_err(|e| ctx(e.to_string()))?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(|e| ctx(e.to_string()))?
        .with_intra_threads(threads)
        .map_err(|e| ctx(e.to_string()))?
        .with_inter_threads(1)
        .map_err(|e| ctx(e.to_string()))?
        .commit_from_file(model)
        .map_err(|e| ctx(e.to_string()))
}

/// Per wanted name, the model name it is: itself when every wanted name is the model's, else
/// the model's name at the same position.
fn match_names<'a>(model: &'a [String], want: impl Iterator<Item = &'a str>) -> Vec<&'a str> {
    let want: Vec<&str> = want.collect();
    if want.iter().all(|w| model.iter().any(|m| m == w)) {
        want
    } else {
        model.iter().map(String::as_str).collect()
    }
}

fn check_type(
    model: &Path,
    what: &str,
    name: &str,
    found: Option<ValueType>,
    want: TensorElementType,
) -> Result<(), Error> {
    match found {
        Some(ValueType::Tensor { ty, .. }) if ty == want => Ok(()),
        Some(ValueType::Tensor { ty, .. }) => Err(Error::Engine(format!(
            "{}: {what} {name:?} is a tensor of {ty} in the model, runtime.toml says {want}",
            model.display()
        ))),
        Some(other) => Err(Error::Engine(format!(
            "{}: {what} {name:?} is {other}, not a tensor",
            model.display()
        ))),
        None => Err(Error::Engine(format!(
            "{}: the model has no {what} {name:?}",
            model.display()
        ))),
    }
}

impl Engine for OrtEngine {
    fn instance(&self) -> Result<Box<dyn Backend>, Error> {
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).take();
        let session = match first {
            Some(s) => s,
            None => new_session(&self.env, &self.path, self.threads, &self.library)?,
        };
        Ok(Box::new(OrtBackend {
            session,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            allocator: Allocator::default(),
        }))
    }
}

struct OrtBackend {
    session: Session,
    inputs: Vec<(String, TensorElementType)>,
    outputs: Vec<(String, DataType)>,
    allocator: Allocator,
}

impl OrtBackend {
    /// A tensor owned by ONNX Runtime's CPU allocator holding a copy of `t`'s bytes.
    fn value(&self, t: &Tensor, ty: TensorElementType) -> Result<DynTensor, String> {
        let shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
        let mut value = DynTensor::new(&self.allocator, ty, shape).map_err(|e| e.to_string())?;
        let len = ty.byte_size(t.elements()).unwrap_or(usize::MAX);
        if len != t.data.len() {
            return Err(format!(
                "tensor of shape {:?} has {} bytes, {ty} needs {len}",
                t.shape,
                t.data.len()
            ));
        }
        if len > 0 {
            let dst = value.data_ptr_mut().cast::<u8>();
            if dst.is_null() {
                return Err("ONNX Runtime allocated no memory for an input".to_owned());
            }
            // SAFETY: ONNX Runtime allocated `len` bytes of CPU memory for this shape and type
            // (checked above against the source), and the regions cannot overlap.
            unsafe { std::ptr::copy_nonoverlapping(t.data.as_ptr(), dst, len) };
        }
        Ok(value)
    }
}

impl Backend for OrtBackend {
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError> {
        self.run(inputs).map_err(ExecError::Batch)
    }
}

impl OrtBackend {
    fn run(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, String> {
        let mut feed = Vec::with_capacity(inputs.len());
        for (t, (name, ty)) in inputs.iter().zip(&self.inputs) {
            feed.push((name.as_str(), self.value(t, *ty)?));
        }
        let mut outs = self.session.run(feed).map_err(|e| e.to_string())?;
        let mut result = Vec::with_capacity(self.outputs.len());
        for (name, dtype) in &self.outputs {
            let value = outs
                .remove(name.as_str())
                .ok_or_else(|| format!("ONNX Runtime returned no output {name:?}"))?
                .downcast::<DynTensorValueType>()
                .map_err(|e| format!("output {name:?}: {e}"))?;
            let shape: Vec<usize> = value
                .shape()
                .iter()
                .map(|&d| usize::try_from(d).unwrap_or(0))
                .collect();
            let elements: usize = shape.iter().product();
            let len = value.data_type().byte_size(elements).unwrap_or(0);
            let data = if len == 0 {
                Bytes::new()
            } else {
                let src = value.data_ptr().cast::<u8>();
                if src.is_null() {
                    return Err(format!("output {name:?} has no data"));
                }
                // SAFETY: a CPU tensor of `elements` elements of its type holds `len` bytes;
                // they are copied before `value` is dropped.
                Bytes::copy_from_slice(unsafe { std::slice::from_raw_parts(src, len) })
            };
            result.push(Tensor {
                dtype: *dtype,
                shape,
                data,
            });
        }
        Ok(result)
    }
}
