//! The Rust side of the TensorRT backend (feature `tensorrt`): `dlopen` of the runtime library,
//! calls into the C++ shim, device memory and streams through the CUDA driver API (`cuda.rs`).

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::Arc;

use infer_spec::engine::{FoundGpu, Version};

use crate::cuda::{kernel_driver_version, DeviceBuffer, Driver, Gpu, Stream};
use crate::{
    after_sync, byte_len, check_fits, check_inputs, check_library, check_linear, data_dependent,
    decode_lib_version, shape_values_bytes, Error, IoTensor, LibraryKind, TrtDataType,
};

#[cfg(infer_trt_shim)]
mod ffi {
    use std::ffi::{c_char, c_void};
    extern "C" {
        pub(super) fn itrt_header_version() -> i32;
        pub(super) fn itrt_runtime_create(
            create_fn: *mut c_void,
            version_fn: *mut c_void,
            err: *mut c_char,
            cap: usize,
        ) -> *mut c_void;
        pub(super) fn itrt_runtime_destroy(rt: *mut c_void);
        pub(super) fn itrt_init_plugins(init_fn: *mut c_void, err: *mut c_char, cap: usize)
            -> bool;
        pub(super) fn itrt_runtime_load_plugin_library(
            rt: *mut c_void,
            path: *const c_char,
            err: *mut c_char,
            cap: usize,
        ) -> bool;
        pub(super) fn itrt_engine_deserialize(
            rt: *mut c_void,
            data: *const c_void,
            size: usize,
            allow_host_code: bool,
            err: *mut c_char,
            cap: usize,
        ) -> *mut c_void;
        pub(super) fn itrt_engine_destroy(e: *mut c_void);
        pub(super) fn itrt_engine_num_io(e: *mut c_void) -> i32;
        pub(super) fn itrt_engine_io_name(e: *mut c_void, i: i32) -> *const c_char;
        pub(super) fn itrt_engine_io_mode(e: *mut c_void, name: *const c_char) -> i32;
        pub(super) fn itrt_engine_io_location(e: *mut c_void, name: *const c_char) -> i32;
        pub(super) fn itrt_engine_io_dtype(e: *mut c_void, name: *const c_char) -> i32;
        pub(super) fn itrt_engine_io_shape(
            e: *mut c_void,
            name: *const c_char,
            out: *mut i64,
            cap: i32,
        ) -> i32;
        pub(super) fn itrt_engine_io_format(e: *mut c_void, name: *const c_char) -> i32;
        pub(super) fn itrt_engine_profile_values(
            e: *mut c_void,
            name: *const c_char,
            profile: i32,
            which: i32,
            out: *mut i64,
            cap: i32,
        ) -> i32;
        pub(super) fn itrt_engine_num_profiles(e: *mut c_void) -> i32;
        pub(super) fn itrt_engine_profile_shape(
            e: *mut c_void,
            name: *const c_char,
            profile: i32,
            which: i32,
            out: *mut i64,
            cap: i32,
        ) -> i32;
        pub(super) fn itrt_context_create(
            e: *mut c_void,
            err: *mut c_char,
            cap: usize,
        ) -> *mut c_void;
        pub(super) fn itrt_context_destroy(c: *mut c_void);
        pub(super) fn itrt_context_set_profile(
            c: *mut c_void,
            profile: i32,
            stream: *mut c_void,
            err: *mut c_char,
            cap: usize,
        ) -> bool;
        pub(super) fn itrt_context_set_input_shape(
            c: *mut c_void,
            name: *const c_char,
            dims: *const i64,
            n: i32,
            err: *mut c_char,
            cap: usize,
        ) -> bool;
        pub(super) fn itrt_context_tensor_shape(
            c: *mut c_void,
            name: *const c_char,
            out: *mut i64,
            cap: i32,
        ) -> i32;
        pub(super) fn itrt_context_set_tensor_address(
            c: *mut c_void,
            name: *const c_char,
            ptr: *mut c_void,
            err: *mut c_char,
            cap: usize,
        ) -> bool;
        pub(super) fn itrt_context_enqueue_v3(
            c: *mut c_void,
            stream: *mut c_void,
            err: *mut c_char,
            cap: usize,
        ) -> bool;
    }
}

/// Without the shim no entry point is reachable: `TrtLibrary::runtime` fails first with
/// `Error::NoShim`. These stand-ins only keep the callers compiling.
#[cfg(not(infer_trt_shim))]
#[allow(clippy::missing_safety_doc)]
mod ffi {
    use std::ffi::{c_char, c_void};
    use std::ptr::{null, null_mut};
    type P = *mut c_void;
    type S = *const c_char;
    pub unsafe fn itrt_header_version() -> i32 {
        0
    }
    pub unsafe fn itrt_runtime_create(_: P, _: P, _: *mut c_char, _: usize) -> P {
        null_mut()
    }
    pub unsafe fn itrt_runtime_destroy(_: P) {}
    pub unsafe fn itrt_init_plugins(_: P, _: *mut c_char, _: usize) -> bool {
        false
    }
    pub unsafe fn itrt_runtime_load_plugin_library(_: P, _: S, _: *mut c_char, _: usize) -> bool {
        false
    }
    pub unsafe fn itrt_engine_deserialize(
        _: P,
        _: *const c_void,
        _: usize,
        _: bool,
        _: *mut c_char,
        _: usize,
    ) -> P {
        null_mut()
    }
    pub unsafe fn itrt_engine_destroy(_: P) {}
    pub unsafe fn itrt_engine_num_io(_: P) -> i32 {
        0
    }
    pub unsafe fn itrt_engine_io_name(_: P, _: i32) -> S {
        null()
    }
    pub unsafe fn itrt_engine_io_mode(_: P, _: S) -> i32 {
        0
    }
    pub unsafe fn itrt_engine_io_location(_: P, _: S) -> i32 {
        0
    }
    pub unsafe fn itrt_engine_io_dtype(_: P, _: S) -> i32 {
        -1
    }
    pub unsafe fn itrt_engine_io_shape(_: P, _: S, _: *mut i64, _: i32) -> i32 {
        -1
    }
    pub unsafe fn itrt_engine_io_format(_: P, _: S) -> i32 {
        -1
    }
    pub unsafe fn itrt_engine_profile_values(
        _: P,
        _: S,
        _: i32,
        _: i32,
        _: *mut i64,
        _: i32,
    ) -> i32 {
        -1
    }
    pub unsafe fn itrt_engine_num_profiles(_: P) -> i32 {
        0
    }
    pub unsafe fn itrt_engine_profile_shape(
        _: P,
        _: S,
        _: i32,
        _: i32,
        _: *mut i64,
        _: i32,
    ) -> i32 {
        -1
    }
    pub unsafe fn itrt_context_create(_: P, _: *mut c_char, _: usize) -> P {
        null_mut()
    }
    pub unsafe fn itrt_context_destroy(_: P) {}
    pub unsafe fn itrt_context_set_profile(_: P, _: i32, _: P, _: *mut c_char, _: usize) -> bool {
        false
    }
    pub unsafe fn itrt_context_set_input_shape(
        _: P,
        _: S,
        _: *const i64,
        _: i32,
        _: *mut c_char,
        _: usize,
    ) -> bool {
        false
    }
    pub unsafe fn itrt_context_tensor_shape(_: P, _: S, _: *mut i64, _: i32) -> i32 {
        -1
    }
    pub unsafe fn itrt_context_set_tensor_address(
        _: P,
        _: S,
        _: P,
        _: *mut c_char,
        _: usize,
    ) -> bool {
        false
    }
    pub unsafe fn itrt_context_enqueue_v3(_: P, _: P, _: *mut c_char, _: usize) -> bool {
        false
    }
}

/// A buffer for the shim's error text of one call.
struct ErrBuf([c_char; 2048]);

impl ErrBuf {
    fn new() -> ErrBuf {
        ErrBuf([0; 2048])
    }
    fn ptr(&mut self) -> *mut c_char {
        self.0.as_mut_ptr()
    }
    fn error(&self, what: &str) -> Error {
        // SAFETY: the shim always NUL-terminates within the buffer (it is zeroed beforehand).
        let detail = unsafe { CStr::from_ptr(self.0.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Error::Tensorrt {
            what: what.into(),
            detail,
        }
    }
}

/// `NV_TENSORRT_VERSION` of the headers the shim was compiled against; `None` without the shim.
pub fn header_version() -> Option<i32> {
    // SAFETY: returns a constant.
    crate::SHIM_COMPILED.then(|| unsafe { ffi::itrt_header_version() })
}

/// Describes GPU 0 for `infer_spec::engine::check_compat`: compute capability and name through
/// the CUDA driver API, the kernel driver's version through NVML (or `/proc`). Fails, without
/// panicking, when no driver or no GPU is visible.
pub fn probe_gpu() -> Result<FoundGpu, Error> {
    let driver = Driver::get()?;
    let (_, sm, name) = driver.device(0)?;
    let driver = kernel_driver_version()?;
    Ok(FoundGpu { sm, driver, name })
}

/// A TensorRT runtime library, opened with `dlopen`; only its version entry points are called.
pub struct TrtLibrary {
    name: String,
    lib: libloading::Library,
    code: i32,
    version: Version,
}

impl TrtLibrary {
    /// `dlopen` a runtime library by soname (the dynamic linker's search path) or path and read
    /// its version (`getInferLibVersion`, plus `getInferLibBuildVersion` where it exists).
    pub fn open(library: &str) -> Result<TrtLibrary, Error> {
        let load_err = |reason: String| Error::Load {
            library: library.into(),
            reason,
        };
        // SAFETY: loading a TensorRT runtime library runs its initialisers, nothing else.
        let lib =
            unsafe { libloading::Library::new(library) }.map_err(|e| load_err(e.to_string()))?;
        // SAFETY: `int32_t getInferLibVersion() noexcept`, extern "C", in every TensorRT library.
        let code = unsafe {
            let f = lib
                .get::<unsafe extern "C" fn() -> i32>(b"getInferLibVersion\0")
                .map_err(|e| load_err(e.to_string()))?;
            f()
        };
        let base = decode_lib_version(code)
            .ok_or_else(|| load_err(format!("getInferLibVersion gave {code}")))?;
        // SAFETY: `int32_t getInferLibBuildVersion() noexcept` (TensorRT 10 and later).
        let build =
            unsafe { lib.get::<unsafe extern "C" fn() -> i32>(b"getInferLibBuildVersion\0") }
                .ok()
                .map(|f| unsafe { f() });
        let version = match build {
            Some(b) if b >= 0 => format!("{base}.{b}").parse().unwrap_or(base),
            _ => base,
        };
        Ok(TrtLibrary {
            name: library.into(),
            lib,
            code,
            version,
        })
    }

    /// The library's version (major.minor.patch, and the build where the library reports it).
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// Refuses the library when its major differs from the headers the shim was compiled
    /// against, when it is an older release of that major (or when there is no shim).
    pub fn check_headers(&self) -> Result<(), Error> {
        let header = header_version().ok_or(Error::NoShim)?;
        check_library(&self.name, header, self.code)
    }

    /// Creates a runtime. Refused, before any call into the library other than its version
    /// entry point, when the library's major differs from the shim's headers or it is an older
    /// release of that major ([`check_library`]); refused when
    /// TensorRT logged an error during creation (no usable CUDA driver, for one).
    pub fn runtime(self) -> Result<TrtRuntime, Error> {
        self.check_headers()?;
        let get = |name: &[u8]| -> Result<*mut c_void, Error> {
            // SAFETY: resolved as an opaque pointer and only called by the shim with the
            // signature the headers declare for it.
            unsafe { self.lib.get::<*mut c_void>(name) }
                .map(|s| *s)
                .map_err(|e| Error::Load {
                    library: self.name.clone(),
                    reason: e.to_string(),
                })
        };
        let create = get(b"createInferRuntime_INTERNAL\0")?;
        let version_fn = get(b"getInferLibVersion\0")?;
        let mut err = ErrBuf::new();
        // SAFETY: both pointers come from the library, which stays loaded in the runtime.
        let rt = unsafe { ffi::itrt_runtime_create(create, version_fn, err.ptr(), 2048) };
        if rt.is_null() {
            return Err(err.error(&format!("creating a runtime from {} failed", self.name)));
        }
        let mut inner = RuntimeInner {
            rt,
            _lib: self.lib,
            _plugins: None,
        };
        let plugins = load_plugins(&mut inner, &self.name)?;
        Ok(TrtRuntime {
            inner: Arc::new(inner),
            version: self.version,
            plugins,
        })
    }
}

/// Registers TensorRT's plugins with a new runtime, as trtexec does, so a plan whose ONNX import
/// used one (EfficientNMS_TRT, say) deserializes: on the full runtime `libnvinfer_plugin.so.N`
/// and its `initLibNvInferPlugins`; on the lean and dispatch runtimes the version-compatible
/// `libnvinfer_vc_plugin.so.N` through the runtime's plugin registry. Each is looked for beside
/// the runtime library when that was named by path, else by soname; absent, nothing is
/// registered (a plan without plugins needs none). Returns the plugin library loaded.
fn load_plugins(inner: &mut RuntimeInner, library: &str) -> Result<Option<String>, Error> {
    let kind = LibraryKind::of_name(library);
    let Some(major) = header_version().map(crate::version_major) else {
        return Ok(None);
    };
    let path = crate::plugin_library_path(kind, major as u64, library);
    // SAFETY: loading TensorRT's plugin library runs its initialisers, nothing else.
    let Ok(lib) = (unsafe { libloading::Library::new(&path) }) else {
        return Ok(None);
    };
    let mut err = ErrBuf::new();
    let loaded = match kind {
        LibraryKind::Full => {
            // SAFETY: resolved as an opaque pointer and called by the shim with the signature
            // NvInferPlugin.h declares: `bool initLibNvInferPlugins(void*, char const*)`.
            let init = unsafe { lib.get::<*mut c_void>(b"initLibNvInferPlugins\0") }
                .map(|f| *f)
                .map_err(|e| Error::Load {
                    library: path.clone(),
                    reason: e.to_string(),
                })?;
            // SAFETY: `init` comes from the loaded library, which stays loaded in `inner`.
            unsafe { ffi::itrt_init_plugins(init, err.ptr(), 2048) }
        }
        LibraryKind::Lean | LibraryKind::Dispatch => {
            let c = cname(&path)?;
            // SAFETY: rt is live; the path is NUL-terminated.
            unsafe { ffi::itrt_runtime_load_plugin_library(inner.rt, c.as_ptr(), err.ptr(), 2048) }
        }
    };
    if !loaded {
        return Err(err.error(&format!("registering the plugins of {path} failed")));
    }
    inner._plugins = Some(lib);
    Ok(Some(path))
}

struct RuntimeInner {
    rt: *mut c_void,
    _lib: libloading::Library,
    /// TensorRT's plugin library, when one was loaded (unloaded after the runtime is destroyed).
    _plugins: Option<libloading::Library>,
}

// SAFETY: IRuntime may be used from any thread; the shim serialises deserialization.
unsafe impl Send for RuntimeInner {}
unsafe impl Sync for RuntimeInner {}

impl Drop for RuntimeInner {
    fn drop(&mut self) {
        // SAFETY: `rt` came from a successful itrt_runtime_create and is destroyed once, before
        // the library is unloaded (fields drop after this body).
        unsafe { ffi::itrt_runtime_destroy(self.rt) };
    }
}

/// Named tensors: (name, shape, host bytes).
pub type Tensors = Vec<(String, Vec<i64>, Vec<u8>)>;

/// A loaded TensorRT runtime library with an `IRuntime`.
pub struct TrtRuntime {
    inner: Arc<RuntimeInner>,
    version: Version,
    plugins: Option<String>,
}

impl TrtRuntime {
    /// `dlopen` a runtime library by name or path and create a runtime.
    pub fn load_path(library: &str) -> Result<TrtRuntime, Error> {
        if !crate::SHIM_COMPILED {
            return Err(Error::NoShim);
        }
        TrtLibrary::open(library)?.runtime()
    }

    /// The library's version.
    pub fn version(&self) -> &Version {
        &self.version
    }

    /// The TensorRT plugin library registered with this runtime, if one was found.
    pub fn plugins(&self) -> Option<&str> {
        self.plugins.as_deref()
    }

    /// Deserializes a plan on GPU 0, once per process: its weights sit in GPU memory once,
    /// whatever the number of instances ([`TrtPlan::context`] gives each its own execution
    /// context). `allow_host_code` lets a version-compatible plan run its host code.
    pub fn deserialize(&self, plan: &[u8], allow_host_code: bool) -> Result<TrtPlan, Error> {
        let gpu = Gpu::open(0)?;
        gpu.bind()?;
        let mut err = ErrBuf::new();
        // SAFETY: rt is live; plan is a valid buffer for its length.
        let engine = unsafe {
            ffi::itrt_engine_deserialize(
                self.inner.rt,
                plan.as_ptr().cast(),
                plan.len(),
                allow_host_code,
                err.ptr(),
                2048,
            )
        };
        if engine.is_null() {
            return Err(err.error("deserializing the engine failed"));
        }
        let inner = PlanInner {
            engine,
            gpu,
            _rt: self.inner.clone(),
        };
        // SAFETY: engine is live.
        let profiles = unsafe { ffi::itrt_engine_num_profiles(engine) };
        let major = crate::version_major(header_version().unwrap_or(0));
        let io = describe(engine, 0)?;
        Ok(TrtPlan {
            inner: Arc::new(inner),
            io,
            profiles,
            major,
        })
    }
}

struct PlanInner {
    engine: *mut c_void,
    gpu: Gpu,
    _rt: Arc<RuntimeInner>,
}

// SAFETY: an ICudaEngine may be shared between threads; each context is used by one at a time.
unsafe impl Send for PlanInner {}
unsafe impl Sync for PlanInner {}

impl Drop for PlanInner {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // SAFETY: destroyed once, after every context (each holds an Arc to this) and before the
        // runtime (fields drop after this body).
        unsafe { ffi::itrt_engine_destroy(self.engine) };
    }
}

/// A deserialized plan, shared by every instance of the process.
pub struct TrtPlan {
    inner: Arc<PlanInner>,
    io: Vec<IoTensor>,
    profiles: i32,
    major: i32,
}

impl TrtPlan {
    /// The engine's inputs and outputs (shapes of optimisation profile 0).
    pub fn io(&self) -> &[IoTensor] {
        &self.io
    }

    /// An execution context for instance `instance` (0, 1, …) on its own stream, with device
    /// buffers for the largest shapes of the profile it gets ([`crate::context_profile`]).
    pub fn context(&self, instance: usize) -> Result<TrtEngine, Error> {
        let profile = crate::context_profile(self.major, instance, self.profiles)?;
        let gpu = Gpu::open(0)?;
        gpu.bind()?;
        let stream = gpu.stream()?;
        let engine = self.inner.engine;
        let mut err = ErrBuf::new();
        // SAFETY: engine is live (held by `inner`).
        let ctx = unsafe { ffi::itrt_context_create(engine, err.ptr(), 2048) };
        if ctx.is_null() {
            return Err(err.error("creating an execution context failed"));
        }
        let io = if profile == 0 {
            Ok(self.io.clone())
        } else {
            describe(engine, profile)
        };
        let mut e = TrtEngine {
            ctx,
            io: Vec::new(),
            buffers: Vec::new(),
            stream,
            gpu,
            plan: self.inner.clone(),
            profile,
        };
        e.io = io?;
        if profile != 0 {
            let mut err = ErrBuf::new();
            // SAFETY: ctx is live; the stream is this context's.
            let ok = unsafe {
                ffi::itrt_context_set_profile(ctx, profile, e.stream.raw(), err.ptr(), 2048)
            };
            e.stream.synchronize()?;
            if !ok {
                return Err(err.error(&format!("selecting optimisation profile {profile} failed")));
            }
        }
        e.allocate()?;
        Ok(e)
    }
}

/// Where one IO tensor's bytes live between batches (sized for the largest shape).
enum Buffer {
    Device(DeviceBuffer),
    Host(Vec<u8>),
}

/// One execution context of a shared plan, with its own CUDA stream and its IO buffers.
pub struct TrtEngine {
    ctx: *mut c_void,
    io: Vec<IoTensor>,
    /// One per `io` entry, same order.
    buffers: Vec<Buffer>,
    stream: Stream,
    gpu: Gpu,
    plan: Arc<PlanInner>,
    /// The optimisation profile this context runs.
    profile: i32,
}

// SAFETY: one execution context is used by one thread at a time (`&mut self` for inference);
// the CUDA context is made current on the calling thread before each use.
unsafe impl Send for TrtEngine {}

impl Drop for TrtEngine {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        // No work may be in flight on the stream when its context and buffers go.
        let _ = self.stream.synchronize();
        // SAFETY: destroyed once; the plan outlives it (Arc); buffers, stream and GPU context
        // drop after this body.
        unsafe { ffi::itrt_context_destroy(self.ctx) };
    }
}

fn dims(f: impl Fn(*mut i64, i32) -> i32) -> Option<Vec<i64>> {
    let mut buf = [0i64; 8];
    let n = f(buf.as_mut_ptr(), buf.len() as i32);
    (0..=8).contains(&n).then(|| buf[..n as usize].to_vec())
}

fn cname(s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::Tensor {
        name: s.into(),
        reason: "name contains NUL".into(),
    })
}

/// The IO tensors of `engine`, inputs with optimisation profile `profile`'s shapes.
fn describe(engine: *mut c_void, profile: i32) -> Result<Vec<IoTensor>, Error> {
    // SAFETY: engine is live; names returned by TensorRT live as long as the engine, and
    // are copied before use.
    unsafe {
        let n = ffi::itrt_engine_num_io(engine);
        let profiles = ffi::itrt_engine_num_profiles(engine);
        let mut out = Vec::new();
        for i in 0..n {
            let p = ffi::itrt_engine_io_name(engine, i);
            if p.is_null() {
                return Err(Error::Tensorrt {
                    what: format!("IO tensor {i} has no name"),
                    detail: String::new(),
                });
            }
            let cname = CStr::from_ptr(p).to_owned();
            let name = cname.to_string_lossy().into_owned();
            let mode = ffi::itrt_engine_io_mode(engine, cname.as_ptr());
            let code = ffi::itrt_engine_io_dtype(engine, cname.as_ptr());
            let dtype = TrtDataType::from_code(code).ok_or_else(|| Error::Tensor {
                name: name.clone(),
                reason: format!("unknown TensorRT datatype code {code}"),
            })?;
            let shape = dims(|b, c| ffi::itrt_engine_io_shape(engine, cname.as_ptr(), b, c))
                .ok_or_else(|| Error::Tensor {
                    name: name.clone(),
                    reason: "the engine gives no shape".into(),
                })?;
            let bounds = if mode == 1 && profiles > 0 {
                let sel = |w| {
                    dims(|b, c| {
                        ffi::itrt_engine_profile_shape(engine, cname.as_ptr(), profile, w, b, c)
                    })
                };
                match (sel(0), sel(1), sel(2)) {
                    (Some(a), Some(o), Some(m)) if a.len() == shape.len() => Some([a, o, m]),
                    _ => None,
                }
            } else {
                None
            };
            check_linear(&name, ffi::itrt_engine_io_format(engine, cname.as_ptr()))?;
            let host = ffi::itrt_engine_io_location(engine, cname.as_ptr()) == 1;
            out.push(IoTensor {
                name,
                input: mode == 1,
                dtype,
                shape,
                profile: bounds,
                host,
            });
        }
        Ok(out)
    }
}

impl TrtEngine {
    fn set_input_shape(&mut self, name: &CStr, shape: &[i64]) -> Result<(), Error> {
        let mut err = ErrBuf::new();
        // SAFETY: ctx is live; shape is a valid slice.
        if unsafe {
            ffi::itrt_context_set_input_shape(
                self.ctx,
                name.as_ptr(),
                shape.as_ptr(),
                shape.len() as i32,
                err.ptr(),
                2048,
            )
        } {
            return Ok(());
        }
        Err(err.error(&format!(
            "setInputShape({}, {shape:?}) failed",
            name.to_string_lossy()
        )))
    }

    fn context_shape(&self, name: &CStr) -> Result<Vec<i64>, Error> {
        // SAFETY: ctx is live.
        dims(|b, n| unsafe { ffi::itrt_context_tensor_shape(self.ctx, name.as_ptr(), b, n) })
            .ok_or_else(|| Error::Tensor {
                name: name.to_string_lossy().into_owned(),
                reason: "the context gives no shape".into(),
            })
    }

    /// The values this context's profile allows at most for the shape tensor input `t` (one per
    /// element of its shape).
    fn profile_max_values(&self, t: &IoTensor) -> Result<Vec<i64>, Error> {
        let c = cname(&t.name)?;
        let mut buf = [0i64; 64];
        // SAFETY: engine is live; writes at most `buf.len()` values.
        let n = unsafe {
            ffi::itrt_engine_profile_values(
                self.plan.engine,
                c.as_ptr(),
                self.profile,
                2,
                buf.as_mut_ptr(),
                64,
            )
        };
        match usize::try_from(n) {
            Ok(n) if n <= buf.len() => Ok(buf[..n].to_vec()),
            _ => Err(Error::Tensor {
                name: t.name.clone(),
                reason: format!(
                    "a shape tensor whose profile values TensorRT does not give (count {n})"
                ),
            }),
        }
    }

    /// Binds `buffer` as the address of tensor `name`.
    fn bind_buffer(&self, name: &str, buffer: &mut Buffer) -> Result<(), Error> {
        let c = cname(name)?;
        let addr = match buffer {
            Buffer::Device(d) => d.addr(),
            Buffer::Host(h) => h.as_mut_ptr().cast(),
        };
        let mut err = ErrBuf::new();
        // SAFETY: the caller keeps the buffer in `self.buffers` as long as the context (a Vec's
        // heap block does not move when the Vec is moved into the list).
        if !unsafe {
            ffi::itrt_context_set_tensor_address(self.ctx, c.as_ptr(), addr, err.ptr(), 2048)
        } {
            return Err(err.error(&format!("setTensorAddress({name}) failed")));
        }
        Ok(())
    }

    /// Sizes every buffer once, inputs first: each input at its profile's maximum shape, and a
    /// shape tensor input (host memory) filled with the profile's maximum *values*; then each
    /// output at the shape TensorRT resolves for those (no `-1` may remain: a data-dependent
    /// output is refused by name). Sized from a zero-filled shape tensor instead, an output
    /// buffer could be empty and a real batch would write past it on the device.
    fn allocate(&mut self) -> Result<(), Error> {
        self.gpu.bind()?;
        let io = self.io.clone();
        let mut slots: Vec<Option<Buffer>> = io.iter().map(|_| None).collect();
        for (i, t) in io.iter().enumerate().filter(|(_, t)| t.input) {
            let shape = t.max_input_shape()?;
            self.set_input_shape(&cname(&t.name)?, &shape)?;
            let len = byte_len(&t.name, &shape, t.dtype)?;
            let mut buffer = if t.host {
                let values = self.profile_max_values(t)?;
                Buffer::Host(shape_values_bytes(&t.name, &values, t.dtype, len)?)
            } else {
                Buffer::Device(self.gpu.alloc(len)?)
            };
            self.bind_buffer(&t.name, &mut buffer)?;
            slots[i] = Some(buffer);
        }
        // Every input is bound (shape tensors holding their values) before an output's shape is
        // asked for.
        for (i, t) in io.iter().enumerate().filter(|(_, t)| !t.input) {
            let shape = self.context_shape(&cname(&t.name)?)?;
            if shape.iter().any(|&d| d < 0) {
                return Err(data_dependent(&t.name, &shape));
            }
            let len = byte_len(&t.name, &shape, t.dtype)?;
            let mut buffer = if t.host {
                Buffer::Host(vec![0; len.max(1)])
            } else {
                Buffer::Device(self.gpu.alloc(len)?)
            };
            self.bind_buffer(&t.name, &mut buffer)?;
            slots[i] = Some(buffer);
        }
        // One buffer per `io` entry, in its order.
        self.buffers = slots.into_iter().flatten().collect();
        Ok(())
    }

    /// The engine's inputs and outputs.
    pub fn io(&self) -> &[IoTensor] {
        &self.io
    }

    /// Runs one batch: `inputs` are (name, shape, host bytes), every input of the engine exactly
    /// once, in any order; returns every output as (name, shape, host bytes). Copies into the
    /// preallocated buffers, `enqueueV3` on this engine's stream, copies out what the batch's
    /// shapes take.
    pub fn infer(&mut self, inputs: &[(&str, &[i64], &[u8])]) -> Result<Tensors, Error> {
        let checked: Vec<(&str, &[i64], usize)> =
            inputs.iter().map(|(n, s, b)| (*n, *s, b.len())).collect();
        check_inputs(&self.io, &checked)?;
        self.gpu.bind()?;
        for (name, shape, bytes) in inputs {
            let i = self
                .io
                .iter()
                .position(|t| t.name == *name)
                .unwrap_or_default();
            self.set_input_shape(&cname(name)?, shape)?;
            match &mut self.buffers[i] {
                Buffer::Device(d) => self.stream.upload(d, bytes)?,
                Buffer::Host(h) => h
                    .get_mut(..bytes.len())
                    .ok_or_else(|| Error::Tensor {
                        name: name.to_string(),
                        reason: format!("{} bytes exceed its buffer", bytes.len()),
                    })?
                    .copy_from_slice(bytes),
            }
        }
        // The shapes and shape-tensor values of this batch decide the outputs' shapes: each must
        // still fit the buffer bound for it before anything is enqueued.
        for (t, b) in self.io.iter().zip(&self.buffers).filter(|(t, _)| !t.input) {
            let shape = self.context_shape(&cname(&t.name)?)?;
            if shape.iter().any(|&d| d < 0) {
                return Err(data_dependent(&t.name, &shape));
            }
            check_fits(&t.name, &shape, t.dtype, b.len())?;
        }
        let mut err = ErrBuf::new();
        // SAFETY: every IO address is bound to a live buffer the checks above found large enough.
        if !unsafe { ffi::itrt_context_enqueue_v3(self.ctx, self.stream.raw(), err.ptr(), 2048) } {
            let failed = err.error("enqueueV3 failed");
            return Err(after_sync(Err(failed), self.stream.synchronize()));
        }
        let out = self.collect_outputs();
        // Whatever happened after the enqueue, no work of this batch is left in flight when
        // inference returns (the input bytes it reads are the caller's).
        let synced = self.stream.synchronize();
        match (out, synced) {
            (Ok(out), Ok(())) => Ok(out),
            (out, synced) => Err(after_sync(out.map(|_| ()), synced)),
        }
    }

    /// Copies every output of the batch just enqueued to the host.
    fn collect_outputs(&mut self) -> Result<Tensors, Error> {
        let mut out = Vec::new();
        for (t, b) in self.io.iter().zip(&self.buffers).filter(|(t, _)| !t.input) {
            let shape = self.context_shape(&cname(&t.name)?)?;
            let mut host = vec![0u8; byte_len(&t.name, &shape, t.dtype)?];
            match b {
                Buffer::Device(d) => self.stream.download(&mut host, d)?,
                Buffer::Host(h) => {
                    self.stream.synchronize()?;
                    let src = h.get(..host.len()).ok_or_else(|| Error::Tensor {
                        name: t.name.clone(),
                        reason: format!("shape {shape:?} exceeds its buffer"),
                    })?;
                    host.copy_from_slice(src);
                }
            }
            out.push((t.name.clone(), shape, host));
        }
        Ok(out)
    }
}

impl Buffer {
    fn len(&self) -> usize {
        match self {
            Buffer::Device(d) => d.len(),
            Buffer::Host(h) => h.len(),
        }
    }
}
