//! The few CUDA driver API and NVML calls the backend needs, through `dlopen` of
//! `libcuda.so.1` and `libnvidia-ml.so.1` (both come from the node's driver, injected into the
//! container by the NVIDIA container toolkit; never shipped in an image). A missing or too-old
//! driver is an [`Error::Driver`], never a panic.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};
use std::sync::OnceLock;

use infer_spec::engine::{ComputeCapability, Version};

use crate::{parse_proc_driver_version, Error};

type CuResult = c_int;
type CuDevice = c_int;
type CuContext = *mut c_void;
pub(crate) type CuStream = *mut c_void;
type CuDevicePtr = u64;

const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;
/// `CU_STREAM_NON_BLOCKING`: no implicit synchronisation with the legacy default stream.
const STREAM_NON_BLOCKING: c_uint = 1;

/// Function pointers resolved from `libcuda.so.1`; the library stays loaded with them.
pub(crate) struct Driver {
    _lib: libloading::Library,
    init: unsafe extern "C" fn(c_uint) -> CuResult,
    device_get_count: unsafe extern "C" fn(*mut c_int) -> CuResult,
    device_get: unsafe extern "C" fn(*mut CuDevice, c_int) -> CuResult,
    device_get_attribute: unsafe extern "C" fn(*mut c_int, c_int, CuDevice) -> CuResult,
    device_get_name: unsafe extern "C" fn(*mut c_char, c_int, CuDevice) -> CuResult,
    primary_ctx_retain: unsafe extern "C" fn(*mut CuContext, CuDevice) -> CuResult,
    primary_ctx_release: unsafe extern "C" fn(CuDevice) -> CuResult,
    ctx_set_current: unsafe extern "C" fn(CuContext) -> CuResult,
    stream_create: unsafe extern "C" fn(*mut CuStream, c_uint) -> CuResult,
    stream_destroy: unsafe extern "C" fn(CuStream) -> CuResult,
    stream_synchronize: unsafe extern "C" fn(CuStream) -> CuResult,
    mem_alloc: unsafe extern "C" fn(*mut CuDevicePtr, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(CuDevicePtr) -> CuResult,
    memcpy_htod_async:
        unsafe extern "C" fn(CuDevicePtr, *const c_void, usize, CuStream) -> CuResult,
    memcpy_dtoh_async: unsafe extern "C" fn(*mut c_void, CuDevicePtr, usize, CuStream) -> CuResult,
    get_error_string: unsafe extern "C" fn(CuResult, *mut *const c_char) -> CuResult,
}

/// The soname of the CUDA driver library.
pub(crate) const LIBCUDA: &str = "libcuda.so.1";

fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, Error> {
    symbol_in(lib, LIBCUDA, name)
}

fn symbol_in<T: Copy>(lib: &libloading::Library, soname: &str, name: &str) -> Result<T, Error> {
    let mut z = name.as_bytes().to_vec();
    z.push(0);
    // SAFETY: each name is looked up with the signature its header declares for it (cuda.h,
    // with the `_v2` entry points where the plain name is a macro; nvml.h); the pointer is only
    // used while `lib` stays loaded.
    unsafe { lib.get::<T>(&z) }
        .map(|s| *s)
        .map_err(|e| Error::Driver(format!("{soname} has no {name}: {e}")))
}

impl Driver {
    /// The process's driver, loaded and initialised (`cuInit`) once; the error, when there is
    /// one, names the missing driver or GPU and is returned on every call.
    pub(crate) fn get() -> Result<&'static Driver, Error> {
        static DRIVER: OnceLock<Result<Driver, String>> = OnceLock::new();
        DRIVER
            .get_or_init(|| Driver::load().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| Error::Driver(e.strip_prefix("nvidia driver: ").unwrap_or(e).into()))
    }

    fn load() -> Result<Driver, Error> {
        // SAFETY: loading the driver library runs its initialisers, nothing else.
        let lib = unsafe { libloading::Library::new(LIBCUDA) }.map_err(|e| {
            Error::Driver(format!(
                "cannot load {LIBCUDA} ({e}): no NVIDIA driver is visible to this process \
                 (on a GPU node, run the container with the NVIDIA container toolkit, e.g. \
                 `docker run --gpus all`)"
            ))
        })?;
        let d = Driver {
            init: symbol(&lib, "cuInit")?,
            device_get_count: symbol(&lib, "cuDeviceGetCount")?,
            device_get: symbol(&lib, "cuDeviceGet")?,
            device_get_attribute: symbol(&lib, "cuDeviceGetAttribute")?,
            device_get_name: symbol(&lib, "cuDeviceGetName")?,
            primary_ctx_retain: symbol(&lib, "cuDevicePrimaryCtxRetain")?,
            primary_ctx_release: symbol(&lib, "cuDevicePrimaryCtxRelease_v2")?,
            ctx_set_current: symbol(&lib, "cuCtxSetCurrent")?,
            stream_create: symbol(&lib, "cuStreamCreate")?,
            stream_destroy: symbol(&lib, "cuStreamDestroy_v2")?,
            stream_synchronize: symbol(&lib, "cuStreamSynchronize")?,
            mem_alloc: symbol(&lib, "cuMemAlloc_v2")?,
            mem_free: symbol(&lib, "cuMemFree_v2")?,
            memcpy_htod_async: symbol(&lib, "cuMemcpyHtoDAsync_v2")?,
            memcpy_dtoh_async: symbol(&lib, "cuMemcpyDtoHAsync_v2")?,
            get_error_string: symbol(&lib, "cuGetErrorString")?,
            _lib: lib,
        };
        // SAFETY: cuInit takes flags (must be 0).
        d.check(unsafe { (d.init)(0) }, "cuInit")?;
        Ok(d)
    }

    fn check(&self, r: CuResult, what: &str) -> Result<(), Error> {
        if r == 0 {
            return Ok(());
        }
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: cuGetErrorString writes a pointer to a static string (or leaves it null).
        let text = if unsafe { (self.get_error_string)(r, &mut p) } == 0 && !p.is_null() {
            // SAFETY: a NUL-terminated static string owned by the driver.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        } else {
            "unknown error".into()
        };
        Err(Error::Cuda {
            call: what.to_owned(),
            code: r,
            text,
        })
    }

    /// GPU `ordinal`'s compute capability and name.
    pub(crate) fn device(
        &self,
        ordinal: i32,
    ) -> Result<(CuDevice, ComputeCapability, String), Error> {
        let mut count = 0;
        // SAFETY: writes one int.
        self.check(
            unsafe { (self.device_get_count)(&mut count) },
            "cuDeviceGetCount",
        )?;
        if count <= ordinal {
            return Err(Error::Driver(format!(
                "the NVIDIA driver sees {count} GPU(s); GPU {ordinal} is not visible \
                 (check NVIDIA_VISIBLE_DEVICES / `docker run --gpus`)"
            )));
        }
        let mut dev = 0;
        // SAFETY: writes one device handle.
        self.check(
            unsafe { (self.device_get)(&mut dev, ordinal) },
            "cuDeviceGet",
        )?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: each writes one int.
        unsafe {
            self.check(
                (self.device_get_attribute)(&mut major, ATTR_CC_MAJOR, dev),
                "cuDeviceGetAttribute",
            )?;
            self.check(
                (self.device_get_attribute)(&mut minor, ATTR_CC_MINOR, dev),
                "cuDeviceGetAttribute",
            )?;
        }
        let mut name = [0 as c_char; 256];
        // SAFETY: writes at most len bytes, NUL-terminated.
        self.check(
            unsafe { (self.device_get_name)(name.as_mut_ptr(), name.len() as c_int, dev) },
            "cuDeviceGetName",
        )?;
        // SAFETY: NUL-terminated within the buffer (zeroed beforehand).
        let name = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        Ok((
            dev,
            ComputeCapability::new(major.max(0) as u32, minor.max(0) as u32),
            name,
        ))
    }
}

/// The primary context of one GPU, retained while this lives.
pub(crate) struct Gpu {
    driver: &'static Driver,
    dev: CuDevice,
    ctx: CuContext,
}

// SAFETY: a CUDA context may be made current on any thread; `bind` does so before each use.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

impl Gpu {
    pub(crate) fn open(ordinal: i32) -> Result<Gpu, Error> {
        let driver = Driver::get()?;
        let (dev, _, _) = driver.device(ordinal)?;
        let mut ctx = std::ptr::null_mut();
        // SAFETY: writes one context handle.
        driver.check(
            unsafe { (driver.primary_ctx_retain)(&mut ctx, dev) },
            "cuDevicePrimaryCtxRetain",
        )?;
        Ok(Gpu { driver, dev, ctx })
    }

    /// Makes the context current on the calling thread (cheap when it already is).
    pub(crate) fn bind(&self) -> Result<(), Error> {
        // SAFETY: ctx is retained.
        self.driver.check(
            unsafe { (self.driver.ctx_set_current)(self.ctx) },
            "cuCtxSetCurrent",
        )
    }

    pub(crate) fn stream(&self) -> Result<Stream, Error> {
        self.bind()?;
        let mut s = std::ptr::null_mut();
        // SAFETY: writes one stream handle.
        self.driver.check(
            unsafe { (self.driver.stream_create)(&mut s, STREAM_NON_BLOCKING) },
            "cuStreamCreate",
        )?;
        Ok(Stream {
            driver: self.driver,
            raw: s,
        })
    }

    pub(crate) fn alloc(&self, len: usize) -> Result<DeviceBuffer, Error> {
        self.bind()?;
        let mut p = 0;
        // SAFETY: writes one device pointer; at least one byte so every tensor gets an address.
        self.driver.check(
            unsafe { (self.driver.mem_alloc)(&mut p, len.max(1)) },
            "cuMemAlloc",
        )?;
        Ok(DeviceBuffer {
            driver: self.driver,
            ptr: p,
            len,
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: releases the retain taken in `open`, once.
        unsafe { (self.driver.primary_ctx_release)(self.dev) };
    }
}

/// A CUDA stream.
pub(crate) struct Stream {
    driver: &'static Driver,
    raw: CuStream,
}

impl Stream {
    pub(crate) fn raw(&self) -> CuStream {
        self.raw
    }

    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        // SAFETY: the stream is live.
        self.driver.check(
            unsafe { (self.driver.stream_synchronize)(self.raw) },
            "cuStreamSynchronize",
        )
    }

    /// Copies `src` into the start of `dst` (which must be at least as long).
    pub(crate) fn upload(&self, dst: &DeviceBuffer, src: &[u8]) -> Result<(), Error> {
        if src.len() > dst.len {
            return Err(Error::Driver(format!(
                "{} bytes do not fit a {}-byte buffer",
                src.len(),
                dst.len
            )));
        }
        // SAFETY: dst holds at least src.len() bytes; src is valid until the caller
        // synchronizes the stream (it does before returning from inference).
        self.driver.check(
            unsafe {
                (self.driver.memcpy_htod_async)(dst.ptr, src.as_ptr().cast(), src.len(), self.raw)
            },
            "cuMemcpyHtoDAsync",
        )
    }

    /// Copies the first `dst.len()` bytes of `src` into `dst`.
    pub(crate) fn download(&self, dst: &mut [u8], src: &DeviceBuffer) -> Result<(), Error> {
        if dst.len() > src.len {
            return Err(Error::Driver(format!(
                "{} bytes requested from a {}-byte buffer",
                dst.len(),
                src.len
            )));
        }
        // SAFETY: as in `upload`.
        self.driver.check(
            unsafe {
                (self.driver.memcpy_dtoh_async)(
                    dst.as_mut_ptr().cast(),
                    src.ptr,
                    dst.len(),
                    self.raw,
                )
            },
            "cuMemcpyDtoHAsync",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: destroyed once.
        unsafe { (self.driver.stream_destroy)(self.raw) };
    }
}

/// Device memory, freed on drop (the owner keeps the context current / alive).
pub(crate) struct DeviceBuffer {
    driver: &'static Driver,
    ptr: CuDevicePtr,
    len: usize,
}

impl DeviceBuffer {
    pub(crate) fn addr(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: freed once.
        unsafe { (self.driver.mem_free)(self.ptr) };
    }
}

/// The kernel driver's version (`570.86.10`): NVML's `nvmlSystemGetDriverVersion` through
/// `dlopen`, else `/proc/driver/nvidia/version`.
pub(crate) fn kernel_driver_version() -> Result<Version, Error> {
    let nvml = nvml_driver_version();
    if let Ok(v) = &nvml {
        return Ok(v.clone());
    }
    let proc = std::fs::read_to_string("/proc/driver/nvidia/version")
        .ok()
        .and_then(|t| parse_proc_driver_version(&t));
    proc.ok_or_else(|| {
        Error::Driver(format!(
            "cannot read the NVIDIA driver version ({}; /proc/driver/nvidia/version is absent or unreadable)",
            nvml.err().map(|e| e.to_string()).unwrap_or_default()
        ))
    })
}

fn nvml_driver_version() -> Result<Version, Error> {
    const LIB: &str = "libnvidia-ml.so.1";
    // SAFETY: loading NVML runs its initialisers, nothing else.
    let lib = unsafe { libloading::Library::new(LIB) }
        .map_err(|e| Error::Driver(format!("cannot load {LIB}: {e}")))?;
    type Init = unsafe extern "C" fn() -> c_int;
    type GetVersion = unsafe extern "C" fn(*mut c_char, c_uint) -> c_int;
    // Signatures from nvml.h: `nvmlReturn_t nvmlInit_v2(void)`,
    // `nvmlSystemGetDriverVersion(char*, unsigned int)`, `nvmlShutdown(void)`.
    let init: Init = symbol_in(&lib, LIB, "nvmlInit_v2")?;
    let get: GetVersion = symbol_in(&lib, LIB, "nvmlSystemGetDriverVersion")?;
    let shutdown: Init = symbol_in(&lib, LIB, "nvmlShutdown")?;
    // SAFETY: called with the signatures above while `lib` is loaded.
    let r = unsafe { init() };
    if r != 0 {
        return Err(Error::Driver(format!("nvmlInit failed: NVML error {r}")));
    }
    let mut buf = [0 as c_char; 96];
    // SAFETY: writes at most len bytes, NUL-terminated.
    let r = unsafe { get(buf.as_mut_ptr(), buf.len() as c_uint) };
    // SAFETY: pairs the successful nvmlInit.
    unsafe { shutdown() };
    if r != 0 {
        return Err(Error::Driver(format!(
            "nvmlSystemGetDriverVersion failed: NVML error {r}"
        )));
    }
    // SAFETY: NUL-terminated within the buffer (zeroed beforehand).
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    text.trim()
        .parse()
        .map_err(|_| Error::Driver(format!("NVML gave driver version {text:?}")))
}
