//! The GPU backend: a TensorRT plan run through `infer-trt` (feature `tensorrt`).
//!
//! At start-up [`probe`] opens the TensorRT runtime library (`dlopen`; only its version entry
//! points are called) and asks the NVIDIA driver for GPU 0, so the compatibility check compares
//! the engine with what the node really has. [`TensorrtEngine::load`] reads the plan and
//! deserializes it once per process (its weights sit in GPU memory once); each instance gets its
//! own execution context and CUDA stream, with device buffers sized once for the largest shapes
//! of its optimisation profile and reused.
//! A batch smaller than a static batch dimension is padded with zeros and its outputs trimmed
//! back to the batch's rows.

use super::{Backend, Engine, Error, ExecError};
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::engine::{EngineMeta, Found, FoundCpu, GpuMeta};
use infer_spec::{DataType, RuntimeConfig, TensorSpec};
use infer_trt::{
    header_version, probe_gpu, version_major, IoTensor, LibraryKind, TrtLibrary, TrtPlan,
};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Environment variable naming the TensorRT runtime library to `dlopen` (a soname or a path),
/// overriding the choice made from the engine's metadata.
pub(crate) const LIBRARY_ENV: &str = "INFER_TRT_LIBRARY";

/// The runtime library for this engine: `INFER_TRT_LIBRARY`, else `engine.library` (the lean
/// runtime a GPU image ships, resolved against the directory of `runtime.toml`), else the
/// library the engine's metadata calls for (lean for version-compatible plans that exclude the
/// lean runtime, dispatch for other version-compatible ones, the full runtime otherwise), else
/// the full one, by soname (without metadata nothing says the plan is version-compatible, and
/// only the full runtime runs an ordinary plan); the major is that of the headers infer-serve
/// was built against.
fn library_name(cfg: &RuntimeConfig, base: &Path) -> Result<(String, Option<EngineMeta>), Error> {
    let meta = match &cfg.engine.metadata {
        Some(m) => {
            let p = base.join(m);
            let bytes = std::fs::read(&p)
                .map_err(|e| Error::Engine(format!("cannot read {}: {e}", p.display())))?;
            Some(
                EngineMeta::from_json(&bytes)
                    .map_err(|e| Error::Engine(format!("{}: {e}", p.display())))?,
            )
        }
        None => None,
    };
    if let Ok(l) = std::env::var(LIBRARY_ENV) {
        return Ok((l, meta));
    }
    if let Some(rel) = cfg.engine.library.as_deref() {
        // dlopen searches the library path for a bare name; a path with a directory is used
        // as is, so a relative one is made absolute against runtime.toml's directory.
        let p = if rel.contains('/') {
            base.join(rel).to_string_lossy().into_owned()
        } else {
            rel.to_owned()
        };
        return Ok((p, meta));
    }
    let major = header_version()
        .map(version_major)
        .ok_or_else(|| Error::Library(infer_trt::Error::NoShim.to_string()))?;
    let kind = library_kind(meta.as_ref().and_then(|m| m.gpu.as_ref()));
    Ok((kind.soname(major as u64), meta))
}

/// The library the engine's metadata calls for; the full runtime without metadata.
fn library_kind(gpu: Option<&GpuMeta>) -> LibraryKind {
    match gpu {
        Some(g) => LibraryKind::for_engine(g.version_compatible, g.exclude_lean_runtime),
        None => LibraryKind::Full,
    }
}

/// What this node has for a TensorRT engine: the runtime library's version and GPU 0 (compute
/// capability, name, driver). Fails, naming what is missing, when the library cannot be opened
/// or no driver or GPU is visible.
pub(crate) fn probe(cfg: &RuntimeConfig, base: &Path) -> Result<Found, Error> {
    let (name, _) = library_name(cfg, base)?;
    let lib = TrtLibrary::open(&name).map_err(|e| {
        Error::Library(format!(
            "no TensorRT runtime library: {e} (this infer-serve's TensorRT backend is compiled against TensorRT {} headers)",
            infer_trt::headers_release().unwrap_or("no")
        ))
    })?;
    lib.check_headers()
        .map_err(|e| Error::Library(e.to_string()))?;
    let gpu = probe_gpu().map_err(|e| {
        Error::Node(format!(
            "no usable GPU (TensorRT library {name} {} was found): {e}",
            lib.version()
        ))
    })?;
    Ok(Found {
        gpu: Some(gpu),
        tensorrt: Some(lib.version().clone()),
        onnxruntime: None,
        openvino: None,
        cpu: FoundCpu::detect(),
    })
}

/// The plan, deserialized once: every instance shares its engine (the weights sit in GPU memory
/// once) and gets an execution context of its own.
pub(crate) struct TensorrtEngine {
    plan: TrtPlan,
    /// Instances created so far: the next one's index (TensorRT 8.6 gives each its own profile).
    instances: AtomicUsize,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
}

impl TensorrtEngine {
    pub(crate) fn load(
        cfg: &RuntimeConfig,
        base: &Path,
        path: &Path,
    ) -> Result<TensorrtEngine, Error> {
        let (name, meta) = library_name(cfg, base)?;
        let plan = std::fs::read(path)
            .map_err(|e| Error::Engine(format!("cannot read {}: {e}", path.display())))?;
        let lib = TrtLibrary::open(&name).map_err(|e| Error::Library(e.to_string()))?;
        let runtime = lib.runtime().map_err(|e| Error::Library(e.to_string()))?;
        let allow_host_code = allow_host_code(meta.as_ref().and_then(|m| m.gpu.as_ref()));
        let plan = runtime
            .deserialize(&plan, allow_host_code)
            .map_err(|e| Error::Engine(e.to_string()))?;
        check_io(plan.io(), &cfg.inputs, &cfg.outputs)?;
        Ok(TensorrtEngine {
            plan,
            instances: AtomicUsize::new(0),
            inputs: cfg.inputs.clone(),
            outputs: cfg.outputs.clone(),
        })
    }
}

/// Whether deserializing is allowed to run the plan's host code: for every version-compatible
/// plan, on whichever library opens it, as trtexec and Polygraphy do
/// (`setEngineHostCodeAllowed(true)`). A plan that embeds its lean runtime, opened through
/// `libnvinfer_dispatch`, fails to deserialize without it.
fn allow_host_code(gpu: Option<&GpuMeta>) -> bool {
    gpu.is_some_and(|g| g.version_compatible)
}

/// Checks the engine's IO tensors against runtime.toml: the same names, each with a datatype
/// the V2 protocol can carry and equal to the configured one.
pub(crate) fn check_io(
    io: &[IoTensor],
    inputs: &[TensorSpec],
    outputs: &[TensorSpec],
) -> Result<(), Error> {
    for (specs, input) in [(inputs, true), (outputs, false)] {
        let side = if input { "input" } else { "output" };
        let engine: Vec<&IoTensor> = io.iter().filter(|t| t.input == input).collect();
        for t in &engine {
            let spec = specs.iter().find(|s| s.name == t.name).ok_or_else(|| {
                Error::Engine(format!(
                    "the engine's {side} `{}` is not in runtime.toml's {side}s",
                    t.name
                ))
            })?;
            let v2 = t.dtype.v2().ok_or_else(|| {
                Error::Engine(format!(
                    "the engine's {side} `{}` is {:?}, which the V2 protocol cannot carry",
                    t.name, t.dtype
                ))
            })?;
            if v2 != spec.datatype {
                return Err(Error::Engine(format!(
                    "{side} `{}`: the engine's datatype is {v2}, runtime.toml says {}",
                    t.name, spec.datatype
                )));
            }
        }
        if let Some(s) = specs
            .iter()
            .find(|s| !engine.iter().any(|t| t.name == s.name))
        {
            return Err(Error::Engine(format!(
                "runtime.toml's {side} `{}` is not an {side} of the engine",
                s.name
            )));
        }
    }
    Ok(())
}

impl Engine for TensorrtEngine {
    fn instance(&self) -> Result<Box<dyn Backend>, Error> {
        let n = self.instances.fetch_add(1, Ordering::Relaxed);
        let engine = self
            .plan
            .context(n)
            .map_err(|e| Error::Instance(e.to_string()))?;
        Ok(Box::new(TensorrtBackend {
            engine,
            inputs: self.inputs.iter().map(|s| s.name.clone()).collect(),
            outputs: self
                .outputs
                .iter()
                .map(|s| (s.name.clone(), s.datatype))
                .collect(),
        }))
    }
}

struct TensorrtBackend {
    engine: infer_trt::TrtEngine,
    inputs: Vec<String>,
    outputs: Vec<(String, DataType)>,
}

/// The rows to run a batch of `rows` at: `rows`, or the engine's static batch when its first
/// dimension is fixed and larger (the batch is padded with zeros).
fn run_rows(t: &IoTensor, rows: usize) -> usize {
    match t.shape.first() {
        Some(&d) if d > 0 && (d as usize) > rows => d as usize,
        _ => rows,
    }
}

/// A failure of the TensorRT library as the batcher sees it: a sticky CUDA error leaves the
/// device unusable for the process ([`infer_trt::Error::device_lost`]), anything else failed
/// this batch only.
fn exec_error(e: infer_trt::Error) -> ExecError {
    if e.device_lost() {
        ExecError::DeviceLost(e.to_string())
    } else {
        ExecError::Batch(e.to_string())
    }
}

impl Backend for TensorrtBackend {
    fn execute(&mut self, inputs: &[Tensor]) -> Result<Vec<Tensor>, ExecError> {
        let rows = inputs.first().map_or(0, Tensor::rows);
        let mut owned: Vec<(String, Vec<i64>, Vec<u8>)> = Vec::with_capacity(inputs.len());
        for (name, t) in self.inputs.iter().zip(inputs) {
            let io = self
                .engine
                .io()
                .iter()
                .find(|i| i.input && &i.name == name)
                .ok_or_else(|| format!("the engine has no input `{name}`"))?;
            let run = run_rows(io, rows);
            let mut shape: Vec<i64> = t.shape.iter().map(|&d| d as i64).collect();
            let mut data = t.data.to_vec();
            if run > rows && rows > 0 {
                data.resize(data.len() / rows * run, 0);
            }
            if let Some(d) = shape.first_mut() {
                *d = run as i64;
            }
            owned.push((name.clone(), shape, data));
        }
        let borrowed: Vec<(&str, &[i64], &[u8])> = owned
            .iter()
            .map(|(n, s, d)| (n.as_str(), s.as_slice(), d.as_slice()))
            .collect();
        let out = self.engine.infer(&borrowed).map_err(exec_error)?;
        let mut result = Vec::with_capacity(self.outputs.len());
        for (name, dtype) in &self.outputs {
            let (_, shape, data) = out
                .iter()
                .find(|(n, _, _)| n == name)
                .ok_or_else(|| format!("the engine produced no output `{name}`"))?;
            let mut shape: Vec<usize> = shape.iter().map(|&d| d.max(0) as usize).collect();
            let mut data = Bytes::from(data.clone());
            // Trim a padded batch back to its rows.
            if let Some(first) = shape.first_mut() {
                if *first > rows && rows > 0 {
                    let row = data.len() / *first;
                    data = data.slice(..row * rows);
                    *first = rows;
                }
            }
            result.push(Tensor {
                dtype: *dtype,
                shape,
                data,
            });
        }
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use infer_trt::TrtDataType;

    fn io(name: &str, input: bool, dtype: TrtDataType, shape: &[i64]) -> IoTensor {
        IoTensor {
            name: name.into(),
            input,
            dtype,
            shape: shape.to_vec(),
            profile: None,
            host: false,
        }
    }

    fn spec(name: &str, datatype: DataType) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            datatype,
            dims: vec![-1, 4],
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        }
    }

    fn gpu(version_compatible: bool, exclude_lean_runtime: bool) -> GpuMeta {
        GpuMeta {
            sm: infer_spec::engine::ComputeCapability::new(8, 9),
            tensorrt: "10.16.1.11".parse().unwrap(),
            cuda: "12.9".parse().unwrap(),
            driver_floor: "575.57".parse().unwrap(),
            hardware_compat: infer_spec::engine::HardwareCompat::None,
            version_compatible,
            exclude_lean_runtime,
            builder_gpu: "NVIDIA L4".into(),
        }
    }

    #[test]
    fn library_and_host_code_follow_the_metadata() {
        // (metadata, library, host code allowed): what trtexec does for each kind of plan.
        let cases = [
            // What infer-build builds by default: the lean library shipped beside the plan.
            (Some(gpu(true, true)), LibraryKind::Lean, true),
            // A plan embedding its lean runtime: the dispatch library, which must run host code.
            (Some(gpu(true, false)), LibraryKind::Dispatch, true),
            (Some(gpu(false, false)), LibraryKind::Full, false),
            // Nothing says the plan is version-compatible: only the full runtime runs any plan.
            (None, LibraryKind::Full, false),
        ];
        for (meta, library, host) in cases {
            assert_eq!(library_kind(meta.as_ref()), library, "{meta:?}");
            assert_eq!(allow_host_code(meta.as_ref()), host, "{meta:?}");
        }
    }

    #[test]
    fn engine_io_must_match_the_config_and_be_carriable() {
        let inputs = [spec("x", DataType::F32)];
        let outputs = [spec("y", DataType::F32)];
        let ok = [
            io("x", true, TrtDataType::Float, &[-1, 4]),
            io("y", false, TrtDataType::Float, &[-1, 4]),
        ];
        check_io(&ok, &inputs, &outputs).unwrap();
        // An FP4 output cannot be carried: refused, naming the tensor.
        let fp4 = [
            io("x", true, TrtDataType::Float, &[-1, 4]),
            io("y", false, TrtDataType::Fp4, &[-1, 4]),
        ];
        let e = check_io(&fp4, &inputs, &outputs).unwrap_err().to_string();
        assert!(e.contains("`y`") && e.contains("Fp4"), "{e}");
        let half = [
            io("x", true, TrtDataType::Half, &[-1, 4]),
            io("y", false, TrtDataType::Float, &[-1, 4]),
        ];
        assert!(check_io(&half, &inputs, &outputs)
            .unwrap_err()
            .to_string()
            .contains("FP16"));
        let renamed = [
            io("z", true, TrtDataType::Float, &[-1, 4]),
            io("y", false, TrtDataType::Float, &[-1, 4]),
        ];
        assert!(check_io(&renamed, &inputs, &outputs)
            .unwrap_err()
            .to_string()
            .contains("`z`"));
    }

    #[test]
    fn a_sticky_cuda_error_loses_the_device_an_ordinary_one_fails_the_batch() {
        let sticky = infer_trt::Error::Cuda {
            call: "cuStreamSynchronize".into(),
            code: 700,
            text: "an illegal memory access was encountered".into(),
        };
        match exec_error(sticky) {
            ExecError::DeviceLost(m) => assert!(m.contains("CUDA error 700"), "{m}"),
            other => panic!("{other:?}"),
        }
        let oom = infer_trt::Error::Cuda {
            call: "cuMemcpyHtoDAsync".into(),
            code: 2,
            text: "out of memory".into(),
        };
        assert!(matches!(exec_error(oom), ExecError::Batch(_)));
        let refused = infer_trt::Error::Tensorrt {
            what: "enqueueV3 failed".into(),
            detail: String::new(),
        };
        assert!(matches!(exec_error(refused), ExecError::Batch(_)));
    }

    #[test]
    fn a_static_batch_is_padded() {
        assert_eq!(run_rows(&io("x", true, TrtDataType::Float, &[8, 4]), 3), 8);
        assert_eq!(run_rows(&io("x", true, TrtDataType::Float, &[-1, 4]), 3), 3);
    }
}
