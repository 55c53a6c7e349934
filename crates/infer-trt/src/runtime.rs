//! The Rust side of the TensorRT backend (feature `tensorrt`): `dlopen` of the runtime library,
//! calls into the C++ shim, device memory and streams through cudarc.

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut};
use infer_spec::engine::{Found, FoundCpu, FoundGpu, Sm, Version};

use crate::{
    decode_lib_version, parse_proc_driver_version, Error, IoTensor, LibraryKind, TrtDataType,
};

#[cfg(infer_trt_shim)]
mod ffi {
    use std::ffi::{c_char, c_void};
    extern "C" {
        pub fn itrt_last_error(buf: *mut c_char, cap: usize) -> usize;
        pub fn itrt_runtime_create(create_fn: *mut c_void) -> *mut c_void;
        pub fn itrt_runtime_destroy(rt: *mut c_void);
        pub fn itrt_runtime_set_host_code_allowed(rt: *mut c_void, allowed: bool);
        pub fn itrt_engine_deserialize(
            rt: *mut c_void,
            data: *const c_void,
            size: usize,
        ) -> *mut c_void;
        pub fn itrt_engine_destroy(e: *mut c_void);
        pub fn itrt_engine_num_io(e: *mut c_void) -> i32;
        pub fn itrt_engine_io_name(e: *mut c_void, i: i32) -> *const c_char;
        pub fn itrt_engine_io_mode(e: *mut c_void, name: *const c_char) -> i32;
        pub fn itrt_engine_io_dtype(e: *mut c_void, name: *const c_char) -> i32;
        pub fn itrt_engine_io_shape(
            e: *mut c_void,
            name: *const c_char,
            out: *mut i64,
            cap: i32,
        ) -> i32;
        pub fn itrt_engine_num_profiles(e: *mut c_void) -> i32;
        pub fn itrt_engine_profile_shape(
            e: *mut c_void,
            name: *const c_char,
            profile: i32,
            which: i32,
            out: *mut i64,
            cap: i32,
        ) -> i32;
        pub fn itrt_context_create(e: *mut c_void) -> *mut c_void;
        pub fn itrt_context_destroy(c: *mut c_void);
        pub fn itrt_context_set_input_shape(
            c: *mut c_void,
            name: *const c_char,
            dims: *const i64,
            n: i32,
        ) -> bool;
        pub fn itrt_context_tensor_shape(
            c: *mut c_void,
            name: *const c_char,
            out: *mut i64,
            cap: i32,
        ) -> i32;
        pub fn itrt_context_set_tensor_address(
            c: *mut c_void,
            name: *const c_char,
            ptr: *mut c_void,
        ) -> bool;
        pub fn itrt_context_enqueue_v3(c: *mut c_void, stream: *mut c_void) -> bool;
    }
}

/// Without the shim every entry point is unreachable: `TrtRuntime::load` fails first.
#[cfg(not(infer_trt_shim))]
#[allow(clippy::missing_safety_doc)]
mod ffi {
    use std::ffi::{c_char, c_void};
    use std::ptr::null_mut;
    pub unsafe fn itrt_last_error(_: *mut c_char, _: usize) -> usize {
        0
    }
    pub unsafe fn itrt_runtime_create(_: *mut c_void) -> *mut c_void {
        null_mut()
    }
    pub unsafe fn itrt_runtime_destroy(_: *mut c_void) {}
    pub unsafe fn itrt_runtime_set_host_code_allowed(_: *mut c_void, _: bool) {}
    pub unsafe fn itrt_engine_deserialize(
        _: *mut c_void,
        _: *const c_void,
        _: usize,
    ) -> *mut c_void {
        null_mut()
    }
    pub unsafe fn itrt_engine_destroy(_: *mut c_void) {}
    pub unsafe fn itrt_engine_num_io(_: *mut c_void) -> i32 {
        0
    }
    pub unsafe fn itrt_engine_io_name(_: *mut c_void, _: i32) -> *const c_char {
        std::ptr::null()
    }
    pub unsafe fn itrt_engine_io_mode(_: *mut c_void, _: *const c_char) -> i32 {
        0
    }
    pub unsafe fn itrt_engine_io_dtype(_: *mut c_void, _: *const c_char) -> i32 {
        -1
    }
    pub unsafe fn itrt_engine_io_shape(
        _: *mut c_void,
        _: *const c_char,
        _: *mut i64,
        _: i32,
    ) -> i32 {
        -1
    }
    pub unsafe fn itrt_engine_num_profiles(_: *mut c_void) -> i32 {
        0
    }
    pub unsafe fn itrt_engine_profile_shape(
        _: *mut c_void,
        _: *const c_char,
        _: i32,
        _: i32,
        _: *mut i64,
        _: i32,
    ) -> i32 {
        -1
    }
    pub unsafe fn itrt_context_create(_: *mut c_void) -> *mut c_void {
        null_mut()
    }
    pub unsafe fn itrt_context_destroy(_: *mut c_void) {}
    pub unsafe fn itrt_context_set_input_shape(
        _: *mut c_void,
        _: *const c_char,
        _: *const i64,
        _: i32,
    ) -> bool {
        false
    }
    pub unsafe fn itrt_context_tensor_shape(
        _: *mut c_void,
        _: *const c_char,
        _: *mut i64,
        _: i32,
    ) -> i32 {
        -1
    }
    pub unsafe fn itrt_context_set_tensor_address(
        _: *mut c_void,
        _: *const c_char,
        _: *mut c_void,
    ) -> bool {
        false
    }
    pub unsafe fn itrt_context_enqueue_v3(_: *mut c_void, _: *mut c_void) -> bool {
        false
    }
}

fn last_error() -> String {
    let mut buf = vec![0 as c_char; 1024];
    // SAFETY: the buffer is valid for `len` bytes; the shim writes at most len-1 plus a NUL.
    unsafe { ffi::itrt_last_error(buf.as_mut_ptr(), buf.len()) };
    // SAFETY: the shim NUL-terminates (the buffer is zeroed when it wrote nothing).
    unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn trt_err(what: &str) -> Error {
    Error::Tensorrt {
        what: what.into(),
        detail: last_error(),
    }
}

fn cuda_err(e: impl std::fmt::Debug) -> Error {
    Error::Cuda(format!("{e:?}"))
}

fn lib_version(lib: &libloading::Library) -> Option<Version> {
    // SAFETY: `getInferLibVersion` is exported by every TensorRT runtime library as
    // `int32_t getInferLibVersion() noexcept` (extern "C").
    let f: libloading::Symbol<unsafe extern "C" fn() -> i32> =
        unsafe { lib.get(b"getInferLibVersion\0") }.ok()?;
    decode_lib_version(unsafe { f() })
}

struct RuntimeInner {
    rt: *mut c_void,
    _lib: libloading::Library,
}

// SAFETY: IRuntime may be used from any thread; access is serialised by ownership here.
unsafe impl Send for RuntimeInner {}
unsafe impl Sync for RuntimeInner {}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        // SAFETY: `rt` came from itrt_runtime_create and is destroyed once, before the library
        // is unloaded (fields drop after this body).
        unsafe { ffi::itrt_runtime_destroy(self.rt) };
    }
}

/// Named tensors: (name, shape, host bytes).
pub type Tensors = Vec<(String, Vec<i64>, Vec<u8>)>;

/// A loaded TensorRT runtime library with an `IRuntime`.
pub struct TrtRuntime {
    inner: Arc<RuntimeInner>,
    version: Version,
}

impl TrtRuntime {
    /// `dlopen` the library of `kind` for TensorRT major `major` (found through the dynamic
    /// linker's search path) and create a runtime.
    pub fn load(kind: LibraryKind, major: u64) -> Result<TrtRuntime, Error> {
        Self::load_path(&kind.soname(major))
    }

    /// `dlopen` a runtime library by name or path and create a runtime.
    pub fn load_path(library: &str) -> Result<TrtRuntime, Error> {
        if !crate::SHIM_COMPILED {
            return Err(Error::NoShim);
        }
        let load_err = |reason: String| Error::Load {
            library: library.into(),
            reason,
        };
        // SAFETY: loading a TensorRT runtime library runs its initialisers, nothing else.
        let lib =
            unsafe { libloading::Library::new(library) }.map_err(|e| load_err(e.to_string()))?;
        let version = lib_version(&lib).ok_or_else(|| load_err("no getInferLibVersion".into()))?;
        // SAFETY: resolved as an opaque pointer and only called by the shim with the signature
        // the headers declare for it.
        let create: libloading::Symbol<*mut c_void> =
            unsafe { lib.get(b"createInferRuntime_INTERNAL\0") }
                .map_err(|e| load_err(e.to_string()))?;
        let rt = unsafe { ffi::itrt_runtime_create(*create) };
        if rt.is_null() {
            return Err(trt_err("createInferRuntime failed"));
        }
        Ok(TrtRuntime {
            inner: Arc::new(RuntimeInner { rt, _lib: lib }),
            version,
        })
    }

    /// The library's version (major.minor.patch).
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// Deserialize a plan on device 0 and create one execution context. `allow_host_code` is
    /// needed to run version-compatible plans with the full runtime.
    pub fn deserialize(&self, plan: &[u8], allow_host_code: bool) -> Result<TrtEngine, Error> {
        let cuda = CudaContext::new(0).map_err(cuda_err)?;
        let stream = cuda.new_stream().map_err(cuda_err)?;
        // SAFETY: rt is live; plan is a valid buffer for its length.
        let engine = unsafe {
            ffi::itrt_runtime_set_host_code_allowed(self.inner.rt, allow_host_code);
            ffi::itrt_engine_deserialize(self.inner.rt, plan.as_ptr().cast(), plan.len())
        };
        if engine.is_null() {
            return Err(trt_err("deserializing the engine failed"));
        }
        // SAFETY: engine is live.
        let ctx = unsafe { ffi::itrt_context_create(engine) };
        if ctx.is_null() {
            unsafe { ffi::itrt_engine_destroy(engine) };
            return Err(trt_err("creating an execution context failed"));
        }
        let mut e = TrtEngine {
            ctx,
            engine,
            io: Vec::new(),
            _cuda: cuda,
            stream,
            _rt: self.inner.clone(),
        };
        e.io = e.describe()?;
        Ok(e)
    }
}

/// A deserialized engine with one execution context and its own CUDA stream.
pub struct TrtEngine {
    ctx: *mut c_void,
    engine: *mut c_void,
    io: Vec<IoTensor>,
    _cuda: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _rt: Arc<RuntimeInner>,
}

// SAFETY: one execution context is used by one thread at a time (`&mut self` for inference).
unsafe impl Send for TrtEngine {}

impl Drop for TrtEngine {
    fn drop(&mut self) {
        // SAFETY: context before engine, each destroyed once; the runtime outlives both (Arc).
        unsafe {
            ffi::itrt_context_destroy(self.ctx);
            ffi::itrt_engine_destroy(self.engine);
        }
    }
}

fn dims(f: impl Fn(*mut i64, i32) -> i32) -> Option<Vec<i64>> {
    let mut buf = [0i64; 8];
    let n = f(buf.as_mut_ptr(), buf.len() as i32);
    (0..=8).contains(&n).then(|| buf[..n as usize].to_vec())
}

impl TrtEngine {
    fn describe(&self) -> Result<Vec<IoTensor>, Error> {
        // SAFETY: engine is live; names returned by TensorRT live as long as the engine, and
        // are copied before use.
        unsafe {
            let n = ffi::itrt_engine_num_io(self.engine);
            let profiles = ffi::itrt_engine_num_profiles(self.engine);
            let mut out = Vec::new();
            for i in 0..n {
                let p = ffi::itrt_engine_io_name(self.engine, i);
                if p.is_null() {
                    return Err(trt_err("an IO tensor has no name"));
                }
                let cname = CStr::from_ptr(p).to_owned();
                let name = cname.to_string_lossy().into_owned();
                let mode = ffi::itrt_engine_io_mode(self.engine, cname.as_ptr());
                let code = ffi::itrt_engine_io_dtype(self.engine, cname.as_ptr());
                let dtype = TrtDataType::from_code(code).ok_or_else(|| Error::Tensor {
                    name: name.clone(),
                    reason: format!("unknown TensorRT datatype code {code}"),
                })?;
                let shape =
                    dims(|b, c| ffi::itrt_engine_io_shape(self.engine, cname.as_ptr(), b, c))
                        .unwrap_or_default();
                let profile = if mode == 1 && profiles > 0 {
                    let sel = |w| {
                        dims(|b, c| {
                            ffi::itrt_engine_profile_shape(self.engine, cname.as_ptr(), 0, w, b, c)
                        })
                    };
                    match (sel(0), sel(1), sel(2)) {
                        (Some(a), Some(o), Some(m)) => Some([a, o, m]),
                        _ => None,
                    }
                } else {
                    None
                };
                out.push(IoTensor {
                    name,
                    input: mode == 1,
                    dtype,
                    shape,
                    profile,
                });
            }
            Ok(out)
        }
    }

    /// The engine's inputs and outputs.
    pub fn io(&self) -> &[IoTensor] {
        &self.io
    }

    /// Run one batch: `inputs` are (name, shape, host bytes) in any order; returns every output
    /// as (name, shape, host bytes). Copies in, `enqueueV3` on this engine's stream, copies out.
    pub fn infer(&mut self, inputs: &[(&str, &[i64], &[u8])]) -> Result<Tensors, Error> {
        let cstr = |s: &str| {
            CString::new(s).map_err(|_| Error::Tensor {
                name: s.into(),
                reason: "name contains NUL".into(),
            })
        };
        let mut buffers = Vec::new();
        for (name, shape, bytes) in inputs {
            let c = cstr(name)?;
            // SAFETY: ctx is live; shape is a valid slice.
            if !unsafe {
                ffi::itrt_context_set_input_shape(
                    self.ctx,
                    c.as_ptr(),
                    shape.as_ptr(),
                    shape.len() as i32,
                )
            } {
                return Err(trt_err(&format!("setInputShape({name}) failed")));
            }
            let dev = self.stream.clone_htod(*bytes).map_err(cuda_err)?;
            {
                let (ptr, _sync) = dev.device_ptr(&self.stream);
                // SAFETY: the device buffer outlives the enqueue below (kept in `buffers`).
                if !unsafe {
                    ffi::itrt_context_set_tensor_address(self.ctx, c.as_ptr(), ptr as *mut c_void)
                } {
                    return Err(trt_err(&format!("setTensorAddress({name}) failed")));
                }
            }
            buffers.push(dev);
        }
        let mut outputs = Vec::new();
        for t in self.io.iter().filter(|t| !t.input) {
            let c = cstr(&t.name)?;
            // SAFETY: ctx is live.
            let shape =
                dims(|b, n| unsafe { ffi::itrt_context_tensor_shape(self.ctx, c.as_ptr(), b, n) })
                    .ok_or_else(|| trt_err(&format!("output {} has no shape", t.name)))?;
            let count: i64 = shape.iter().product();
            let len = usize::try_from(count).map_err(|_| Error::Tensor {
                name: t.name.clone(),
                reason: format!("unresolved shape {shape:?}"),
            })? * t.dtype.size();
            let mut dev = self
                .stream
                .alloc_zeros::<u8>(len.max(1))
                .map_err(cuda_err)?;
            {
                let (ptr, _sync) = dev.device_ptr_mut(&self.stream);
                // SAFETY: as above.
                if !unsafe {
                    ffi::itrt_context_set_tensor_address(self.ctx, c.as_ptr(), ptr as *mut c_void)
                } {
                    return Err(trt_err(&format!("setTensorAddress({}) failed", t.name)));
                }
            }
            outputs.push((t.name.clone(), shape, len, dev));
        }
        // SAFETY: every IO address is set and the buffers live until after synchronize().
        if !unsafe {
            ffi::itrt_context_enqueue_v3(self.ctx, self.stream.cu_stream() as *mut c_void)
        } {
            return Err(trt_err("enqueueV3 failed"));
        }
        self.stream.synchronize().map_err(cuda_err)?;
        let mut result = Vec::with_capacity(outputs.len());
        for (name, shape, len, dev) in outputs {
            let mut host = self.stream.clone_dtoh(&dev).map_err(cuda_err)?;
            host.truncate(len);
            result.push((name, shape, host));
        }
        drop(buffers);
        Ok(result)
    }
}

/// Describe the node for `infer_spec::engine::check_compat`: GPU 0's compute capability and
/// name (cudarc), the driver version (`/proc/driver/nvidia/version`), the loaded TensorRT
/// library's version, and the CPU.
pub fn probe_node(runtime: Option<&TrtRuntime>) -> Result<Found, Error> {
    let cuda = CudaContext::new(0).map_err(cuda_err)?;
    let (major, minor) = cuda.compute_capability().map_err(cuda_err)?;
    let name = cuda.name().map_err(cuda_err)?;
    let driver_text = std::fs::read_to_string("/proc/driver/nvidia/version")
        .map_err(|e| Error::Cuda(format!("/proc/driver/nvidia/version: {e}")))?;
    let driver = parse_proc_driver_version(&driver_text).ok_or_else(|| {
        Error::Cuda("cannot read the driver version from /proc/driver/nvidia/version".into())
    })?;
    Ok(Found {
        gpu: Some(FoundGpu {
            sm: Sm::new(major.max(0) as u32, minor.max(0) as u32),
            driver,
            name,
        }),
        tensorrt: runtime.map(|r| r.version().clone()),
        cpu: FoundCpu::detect(),
    })
}
