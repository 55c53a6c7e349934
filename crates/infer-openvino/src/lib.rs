//! OpenVINO's C API, opened at run time: the CPU engine `infer-serve` serves (feature `openvino`)
//! and `infer-build` measures beside tract and ONNX Runtime.
//!
//! Nothing of OpenVINO is linked. [`Library::open`] takes `libopenvino_c.so.<N>` from the pinned
//! wheel's files (`matrix/runtime-libraries.toml`) and opens what it needs from the same
//! directory first (`libtbb.so.12`, `libopenvino.so.<N>`: the wheel's libraries carry no
//! `RUNPATH`); OpenVINO itself finds its CPU plugin and ONNX frontend beside `libopenvino.so`.
//! The declarations follow the C header of one release ([`RELEASE`]): the element type codes of
//! `ov_element_type_e` moved between releases (2026.x dropped `UNDEFINED`, so every code shifted
//! by one), so a library of another release is refused at open rather than fed wrong types.
//!
//! [`Compiled`] is one compiled model for all of a model's instances: `NUM_STREAMS` is the
//! instance count and `INFERENCE_NUM_THREADS` their threads together, so each instance's
//! [`Request`] runs on a stream of its own, in parallel, sharing the weights.
//!
//! Must not: link OpenVINO at build time; close a library once opened (its thread pools outlive
//! every handle).
#![allow(
    unsafe_code,
    reason = "dlopen of OpenVINO's C library and calls through its C API are FFI"
)]

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use infer_spec::engine::Precision;

/// The OpenVINO release whose C header (`openvino/c/*.h`, shipped in the wheel) these
/// declarations follow; [`Library::open`] refuses another.
pub const RELEASE: &str = "2026.4";

/// Why OpenVINO could not be opened or run a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A library file is missing or does not load.
    #[error("cannot open OpenVINO's library {path}: {reason}")]
    Open { path: PathBuf, reason: String },
    /// The library is another release than [`RELEASE`].
    #[error(
        "OpenVINO {found} is not the release this build speaks ({RELEASE}.x): its C API's element \
         type codes differ between releases"
    )]
    Release { found: String },
    /// A call failed: what was being done, and OpenVINO's own words.
    #[error("{what}: {reason}")]
    Call { what: String, reason: String },
    /// A tensor OpenVINO cannot be handed or gave back something this crate does not read.
    #[error("{0}")]
    Tensor(String),
}

/// A tensor's element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Element {
    Bool,
    Bf16,
    F16,
    F32,
    F64,
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
}

impl Element {
    /// `ov_element_type_e` of [`RELEASE`]'s `ov_common.h`: `DYNAMIC = 0U, BOOLEAN, BF16, F16,
    /// F32, F64, I4, I8, I16, I32, I64, U1, U2, U3, U4, U6, U8, U16, U32, U64, ...`.
    const CODES: [(Element, u32); 13] = [
        (Element::Bool, 1),
        (Element::Bf16, 2),
        (Element::F16, 3),
        (Element::F32, 4),
        (Element::F64, 5),
        (Element::I8, 7),
        (Element::I16, 8),
        (Element::I32, 9),
        (Element::I64, 10),
        (Element::U8, 16),
        (Element::U16, 17),
        (Element::U32, 18),
        (Element::U64, 19),
    ];

    fn code(self) -> u32 {
        Self::CODES
            .iter()
            .find(|(e, _)| *e == self)
            .map_or(0, |&(_, c)| c)
    }

    fn from_code(code: u32) -> Option<Element> {
        Self::CODES
            .iter()
            .find(|&&(_, c)| c == code)
            .map(|&(e, _)| e)
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Element::Bool | Element::I8 | Element::U8 => 1,
            Element::Bf16 | Element::F16 | Element::I16 | Element::U16 => 2,
            Element::F32 | Element::I32 | Element::U32 => 4,
            Element::F64 | Element::I64 | Element::U64 => 8,
        }
    }
}

/// OpenVINO's `INFERENCE_PRECISION_HINT` for `p`: the precision the CPU plugin computes in (inputs
/// and outputs keep the model's types either way); `None` for one it does not take as a hint.
fn hint(p: Precision) -> Option<&'static str> {
    match p {
        Precision::Fp32 => Some("f32"),
        // BF16 where the CPU has it (AVX-512 BF16, AMX); OpenVINO computes FP32 on one without.
        Precision::Bf16 => Some("bf16"),
        Precision::Fp16 => Some("f16"),
        Precision::Tf32 | Precision::Int8 | Precision::Fp8 | Precision::Fp4 => None,
    }
}

/// How a model is compiled for the CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Instances that run requests at the same time: one stream each.
    pub streams: usize,
    /// Threads per stream.
    pub threads: usize,
    pub precision: Precision,
    /// Where OpenVINO keeps compiled models between starts (`CACHE_DIR`); none: no cache.
    pub cache_dir: Option<PathBuf>,
}

type Status = i32;

#[repr(C)]
struct Shape {
    rank: i64,
    dims: *mut i64,
}

#[repr(C)]
struct Version {
    build_number: *const c_char,
    description: *const c_char,
}

#[repr(C)]
struct Property {
    key: *const c_char,
    value: *const c_void,
}

enum Opaque {}

/// The C functions used, resolved once.
struct Api {
    get_openvino_version: unsafe extern "C" fn(*mut Version) -> Status,
    version_free: unsafe extern "C" fn(*mut Version),
    get_error_info: unsafe extern "C" fn(Status) -> *const c_char,
    get_last_err_msg: unsafe extern "C" fn() -> *const c_char,
    free: unsafe extern "C" fn(*const c_char),
    core_create: unsafe extern "C" fn(*mut *mut Opaque) -> Status,
    core_free: unsafe extern "C" fn(*mut Opaque),
    core_read_model: unsafe extern "C" fn(
        *const Opaque,
        *const c_char,
        *const c_char,
        *mut *mut Opaque,
    ) -> Status,
    model_free: unsafe extern "C" fn(*mut Opaque),
    core_compile_model_props: unsafe extern "C" fn(
        *const Opaque,
        *const Opaque,
        *const c_char,
        usize,
        *const Property,
        *mut *mut Opaque,
    ) -> Status,
    compiled_model_free: unsafe extern "C" fn(*mut Opaque),
    compiled_model_get_property:
        unsafe extern "C" fn(*const Opaque, *const c_char, *mut *mut c_char) -> Status,
    compiled_model_inputs_size: unsafe extern "C" fn(*const Opaque, *mut usize) -> Status,
    compiled_model_outputs_size: unsafe extern "C" fn(*const Opaque, *mut usize) -> Status,
    compiled_model_input_by_index:
        unsafe extern "C" fn(*const Opaque, usize, *mut *mut Opaque) -> Status,
    compiled_model_output_by_index:
        unsafe extern "C" fn(*const Opaque, usize, *mut *mut Opaque) -> Status,
    port_get_any_name: unsafe extern "C" fn(*const Opaque, *mut *mut c_char) -> Status,
    port_get_element_type: unsafe extern "C" fn(*const Opaque, *mut u32) -> Status,
    output_const_port_free: unsafe extern "C" fn(*mut Opaque),
    compiled_model_create_infer_request:
        unsafe extern "C" fn(*const Opaque, *mut *mut Opaque) -> Status,
    infer_request_free: unsafe extern "C" fn(*mut Opaque),
    infer_request_set_tensor:
        unsafe extern "C" fn(*mut Opaque, *const c_char, *const Opaque) -> Status,
    infer_request_get_tensor:
        unsafe extern "C" fn(*const Opaque, *const c_char, *mut *mut Opaque) -> Status,
    infer_request_infer: unsafe extern "C" fn(*mut Opaque) -> Status,
    tensor_create: unsafe extern "C" fn(u32, Shape, *mut *mut Opaque) -> Status,
    tensor_free: unsafe extern "C" fn(*mut Opaque),
    tensor_get_shape: unsafe extern "C" fn(*const Opaque, *mut Shape) -> Status,
    tensor_get_element_type: unsafe extern "C" fn(*const Opaque, *mut u32) -> Status,
    tensor_get_byte_size: unsafe extern "C" fn(*const Opaque, *mut usize) -> Status,
    tensor_data: unsafe extern "C" fn(*const Opaque, *mut *mut c_void) -> Status,
    shape_create: unsafe extern "C" fn(i64, *const i64, *mut Shape) -> Status,
    shape_free: unsafe extern "C" fn(*mut Shape) -> Status,
}

/// OpenVINO's C library, opened once per path and never closed.
pub struct Library {
    api: Api,
    version: String,
    path: PathBuf,
}

static OPENED: Mutex<Vec<&'static Library>> = Mutex::new(Vec::new());

fn open_one(path: &Path) -> Result<libloading::Library, Error> {
    use libloading::os::unix::{Library as Unix, RTLD_GLOBAL, RTLD_NOW};
    // SAFETY: loading a library runs its initialisers; these are OpenVINO's and TBB's own, from
    // the pinned wheel.
    unsafe { Unix::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map(libloading::Library::from)
        .map_err(|e| Error::Open {
            path: path.to_owned(),
            reason: std::error::Error::source(&e)
                .map_or_else(|| e.to_string(), ToString::to_string),
        })
}

impl Library {
    /// Opens `libopenvino_c.so[.N]` at `path`, with `libtbb.so.12` and `libopenvino.so[.N]` from
    /// its directory first, and checks its release. The same path twice gives the same library.
    pub fn open(path: &Path) -> Result<&'static Library, Error> {
        let mut opened = OPENED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(l) = opened.iter().find(|l| l.path == path) {
            return Ok(l);
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let suffix = name
            .strip_prefix("libopenvino_c.so")
            .ok_or_else(|| Error::Open {
                path: path.to_owned(),
                reason: "not libopenvino_c.so or libopenvino_c.so.<N>".into(),
            })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        for dep in ["libtbb.so.12".to_owned(), format!("libopenvino.so{suffix}")] {
            let dep = dir.join(dep);
            if !dep.is_file() {
                return Err(Error::Open {
                    path: dep,
                    reason: format!("missing: it must lie beside {name}"),
                });
            }
            std::mem::forget(open_one(&dep)?);
        }
        let lib = open_one(path)?;
        let api = Api::resolve(&lib, path)?;
        std::mem::forget(lib);
        let version = api.version()?;
        if !version.starts_with(&format!("{RELEASE}.")) {
            return Err(Error::Release { found: version });
        }
        let lib: &'static Library = Box::leak(Box::new(Library {
            api,
            version,
            path: path.to_owned(),
        }));
        opened.push(lib);
        Ok(lib)
    }

    /// The library's version, as OpenVINO reports it (`2026.4.1-22982-...`).
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The release part of [`Library::version`]: `2026.4.1`.
    pub fn release(&self) -> &str {
        self.version.split('-').next().unwrap_or(&self.version)
    }

    /// A new OpenVINO core (its plugins load on first use).
    pub fn core(&'static self) -> Result<Core, Error> {
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is written by the call on success.
        self.api
            .check(unsafe { (self.api.core_create)(&mut ptr) }, || {
                "creating OpenVINO's core".into()
            })?;
        Ok(Core { lib: self, ptr })
    }
}

impl Api {
    fn resolve(lib: &libloading::Library, path: &Path) -> Result<Api, Error> {
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: each symbol's type is its declaration in RELEASE's header.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| Error::Open {
                    path: path.to_owned(),
                    reason: format!("no {} ({e})", $name),
                })?
            };
        }
        Ok(Api {
            get_openvino_version: sym!("ov_get_openvino_version"),
            version_free: sym!("ov_version_free"),
            get_error_info: sym!("ov_get_error_info"),
            get_last_err_msg: sym!("ov_get_last_err_msg"),
            free: sym!("ov_free"),
            core_create: sym!("ov_core_create"),
            core_free: sym!("ov_core_free"),
            core_read_model: sym!("ov_core_read_model"),
            model_free: sym!("ov_model_free"),
            core_compile_model_props: sym!("ov_core_compile_model_props"),
            compiled_model_free: sym!("ov_compiled_model_free"),
            compiled_model_get_property: sym!("ov_compiled_model_get_property"),
            compiled_model_inputs_size: sym!("ov_compiled_model_inputs_size"),
            compiled_model_outputs_size: sym!("ov_compiled_model_outputs_size"),
            compiled_model_input_by_index: sym!("ov_compiled_model_input_by_index"),
            compiled_model_output_by_index: sym!("ov_compiled_model_output_by_index"),
            port_get_any_name: sym!("ov_port_get_any_name"),
            port_get_element_type: sym!("ov_port_get_element_type"),
            output_const_port_free: sym!("ov_output_const_port_free"),
            compiled_model_create_infer_request: sym!("ov_compiled_model_create_infer_request"),
            infer_request_free: sym!("ov_infer_request_free"),
            infer_request_set_tensor: sym!("ov_infer_request_set_tensor"),
            infer_request_get_tensor: sym!("ov_infer_request_get_tensor"),
            infer_request_infer: sym!("ov_infer_request_infer"),
            tensor_create: sym!("ov_tensor_create"),
            tensor_free: sym!("ov_tensor_free"),
            tensor_get_shape: sym!("ov_tensor_get_shape"),
            tensor_get_element_type: sym!("ov_tensor_get_element_type"),
            tensor_get_byte_size: sym!("ov_tensor_get_byte_size"),
            tensor_data: sym!("ov_tensor_data"),
            shape_create: sym!("ov_shape_create"),
            shape_free: sym!("ov_shape_free"),
        })
    }

    /// `Ok` for status 0, else the error OpenVINO recorded, with `what` was being done.
    fn check(&self, status: Status, what: impl FnOnce() -> String) -> Result<(), Error> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: the message is a copy OpenVINO allocated for the caller (freed with ov_free);
        // the status text is static.
        let reason = unsafe {
            let msg = (self.get_last_err_msg)();
            let text = if msg.is_null() {
                String::new()
            } else {
                let t = CStr::from_ptr(msg).to_string_lossy().trim().to_owned();
                (self.free)(msg);
                t
            };
            let info = (self.get_error_info)(status);
            let info = if info.is_null() {
                format!("status {status}")
            } else {
                CStr::from_ptr(info).to_string_lossy().into_owned()
            };
            if text.is_empty() {
                info
            } else {
                format!("{info}: {text}")
            }
        };
        Err(Error::Call {
            what: what(),
            reason,
        })
    }

    fn version(&self) -> Result<String, Error> {
        let mut v = Version {
            build_number: std::ptr::null(),
            description: std::ptr::null(),
        };
        // SAFETY: `v` is filled by the call and freed by ov_version_free.
        unsafe {
            self.check((self.get_openvino_version)(&mut v), || {
                "reading OpenVINO's version".into()
            })?;
            let s = if v.build_number.is_null() {
                String::new()
            } else {
                CStr::from_ptr(v.build_number)
                    .to_string_lossy()
                    .into_owned()
            };
            (self.version_free)(&mut v);
            Ok(s)
        }
    }
}

fn c_string(s: &str, what: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::Tensor(format!("{what} {s:?} holds a NUL byte")))
}

/// An OpenVINO core.
pub struct Core {
    lib: &'static Library,
    ptr: *mut Opaque,
}

// SAFETY: ov::Core is thread-safe (OpenVINO's documentation: one core may be shared).
unsafe impl Send for Core {}
// SAFETY: as above.
unsafe impl Sync for Core {}

impl Drop for Core {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from ov_core_create and is freed once.
        unsafe { (self.lib.api.core_free)(self.ptr) }
    }
}

impl Core {
    /// Reads the model at `model` (ONNX, or OpenVINO's IR) and compiles it for the CPU.
    pub fn compile(&self, model: &Path, config: &Config) -> Result<Compiled, Error> {
        let api = &self.lib.api;
        let path = c_string(&model.to_string_lossy(), "the model path")?;
        let mut m = std::ptr::null_mut();
        // SAFETY: `m` is written on success and freed below; a null weights path reads ONNX
        // (and IR's .bin beside its .xml).
        api.check(
            unsafe { (api.core_read_model)(self.ptr, path.as_ptr(), std::ptr::null(), &mut m) },
            || format!("reading {} into OpenVINO", model.display()),
        )?;
        let mut pairs: Vec<(CString, CString)> = vec![
            (c"PERFORMANCE_HINT".into(), c"LATENCY".into()),
            (
                c"NUM_STREAMS".into(),
                c_string(&config.streams.max(1).to_string(), "")?,
            ),
            (
                c"INFERENCE_NUM_THREADS".into(),
                c_string(
                    &(config.streams.max(1) * config.threads.max(1)).to_string(),
                    "",
                )?,
            ),
            (
                c"INFERENCE_PRECISION_HINT".into(),
                c_string(
                    hint(config.precision).ok_or_else(|| {
                        Error::Tensor(format!(
                            "OpenVINO's CPU plugin does not compute in {}",
                            config.precision
                        ))
                    })?,
                    "",
                )?,
            ),
        ];
        if let Some(dir) = &config.cache_dir {
            pairs.push((
                c"CACHE_DIR".into(),
                c_string(&dir.to_string_lossy(), "the cache path")?,
            ));
        }
        let props: Vec<Property> = pairs
            .iter()
            .map(|(k, v)| Property {
                key: k.as_ptr(),
                value: v.as_ptr().cast(),
            })
            .collect();
        let mut c = std::ptr::null_mut();
        // SAFETY: the properties point into `pairs`, alive for the call; `c` is written on
        // success; the model is freed after (the compiled model keeps what it needs).
        let status = unsafe {
            (api.core_compile_model_props)(
                self.ptr,
                m,
                c"CPU".as_ptr(),
                props.len(),
                props.as_ptr(),
                &mut c,
            )
        };
        // SAFETY: `m` came from ov_core_read_model.
        unsafe { (api.model_free)(m) };
        api.check(status, || {
            format!("compiling {} for OpenVINO's CPU plugin", model.display())
        })?;
        Ok(Compiled {
            lib: self.lib,
            ptr: c,
        })
    }
}

/// A model compiled for the CPU; every instance takes a [`Request`] of it.
pub struct Compiled {
    lib: &'static Library,
    ptr: *mut Opaque,
}

// SAFETY: ov::CompiledModel is thread-safe; requests are made from any thread.
unsafe impl Send for Compiled {}
// SAFETY: as above.
unsafe impl Sync for Compiled {}

impl Drop for Compiled {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from compiling and is freed once.
        unsafe { (self.lib.api.compiled_model_free)(self.ptr) }
    }
}

/// One of a compiled model's inputs or outputs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// Its tensor name (the ONNX graph's input or output name).
    pub name: String,
    /// Its element type; `None` for one this crate does not read.
    pub element: Option<Element>,
}

impl Compiled {
    /// A property of the compiled model as OpenVINO prints it (`INFERENCE_PRECISION_HINT`:
    /// `f32`, `bf16`).
    pub fn property(&self, key: &str) -> Result<String, Error> {
        let api = &self.lib.api;
        let k = c_string(key, "property")?;
        let mut value: *mut c_char = std::ptr::null_mut();
        // SAFETY: `value` is written on success, OpenVINO's copy freed with ov_free.
        unsafe {
            api.check(
                (api.compiled_model_get_property)(self.ptr, k.as_ptr(), &mut value),
                || format!("the compiled model's {key}"),
            )?;
            if value.is_null() {
                return Ok(String::new());
            }
            let text = CStr::from_ptr(value).to_string_lossy().into_owned();
            (api.free)(value);
            Ok(text)
        }
    }

    /// The precision the CPU plugin computes in, as it decided at compile time: the requested
    /// one where the CPU has it, else what it fell back to (BF16 on a CPU without AVX-512 BF16
    /// or AMX computes in FP32). `None` for a value this crate does not name.
    pub fn inference_precision(&self) -> Result<Option<Precision>, Error> {
        let v = self.property("INFERENCE_PRECISION_HINT")?;
        Ok(match v.trim().to_ascii_lowercase().as_str() {
            "f32" => Some(Precision::Fp32),
            "bf16" => Some(Precision::Bf16),
            "f16" => Some(Precision::Fp16),
            _ => None,
        })
    }

    /// The model's inputs and outputs, in the graph's order.
    pub fn ports(&self) -> Result<(Vec<Port>, Vec<Port>), Error> {
        Ok((self.side(true)?, self.side(false)?))
    }

    fn side(&self, inputs: bool) -> Result<Vec<Port>, Error> {
        let api = &self.lib.api;
        let what = if inputs { "inputs" } else { "outputs" };
        let (size_of, by_index) = if inputs {
            (
                api.compiled_model_inputs_size,
                api.compiled_model_input_by_index,
            )
        } else {
            (
                api.compiled_model_outputs_size,
                api.compiled_model_output_by_index,
            )
        };
        let mut n = 0usize;
        // SAFETY: `n` is written on success.
        api.check(unsafe { size_of(self.ptr, &mut n) }, || {
            format!("counting the model's {what}")
        })?;
        let mut ports = Vec::with_capacity(n);
        for i in 0..n {
            let mut port = std::ptr::null_mut();
            // SAFETY: `port` is written on success and freed below; the name is OpenVINO's copy,
            // freed with ov_free.
            unsafe {
                api.check(by_index(self.ptr, i, &mut port), || {
                    format!("the model's {what} {i}")
                })?;
                let mut name: *mut c_char = std::ptr::null_mut();
                let mut code = 0u32;
                let named = api.check((api.port_get_any_name)(port, &mut name), || {
                    format!("the name of the model's {what} {i}")
                });
                let typed = api.check((api.port_get_element_type)(port, &mut code), || {
                    format!("the type of the model's {what} {i}")
                });
                (api.output_const_port_free)(port);
                named?;
                typed?;
                let text = if name.is_null() {
                    String::new()
                } else {
                    let t = CStr::from_ptr(name).to_string_lossy().into_owned();
                    (api.free)(name);
                    t
                };
                ports.push(Port {
                    name: text,
                    element: Element::from_code(code),
                });
            }
        }
        Ok(ports)
    }

    /// A request of its own for one instance.
    pub fn request(&self) -> Result<Request, Error> {
        let api = &self.lib.api;
        let mut r = std::ptr::null_mut();
        // SAFETY: `r` is written on success.
        api.check(
            unsafe { (api.compiled_model_create_infer_request)(self.ptr, &mut r) },
            || "creating an OpenVINO infer request".into(),
        )?;
        Ok(Request {
            lib: self.lib,
            ptr: r,
        })
    }
}

/// One instance's infer request: runs one batch at a time.
pub struct Request {
    lib: &'static Library,
    ptr: *mut Opaque,
}

// SAFETY: an ov::InferRequest may move between threads; `&mut self` keeps it to one at a time.
unsafe impl Send for Request {}

impl Drop for Request {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from ov_compiled_model_create_infer_request and is freed once.
        unsafe { (self.lib.api.infer_request_free)(self.ptr) }
    }
}

/// An input of a batch: its tensor name, type, shape and bytes (C order, native endianness).
pub struct Input<'a> {
    pub name: &'a str,
    pub element: Element,
    pub shape: &'a [i64],
    pub data: &'a [u8],
}

/// An output of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Output {
    pub element: Element,
    pub shape: Vec<i64>,
    pub data: Vec<u8>,
}

/// A tensor handle freed on drop.
struct OwnedTensor<'l> {
    api: &'l Api,
    ptr: *mut Opaque,
}

impl Drop for OwnedTensor<'_> {
    fn drop(&mut self) {
        // SAFETY: `ptr` came from ov_tensor_create or ov_infer_request_get_tensor.
        unsafe { (self.api.tensor_free)(self.ptr) }
    }
}

impl Request {
    /// Runs one batch: sets `inputs` by tensor name, infers, and copies out `outputs` by name.
    pub fn infer(&mut self, inputs: &[Input<'_>], outputs: &[&str]) -> Result<Vec<Output>, Error> {
        let api = &self.lib.api;
        for input in inputs {
            let t = self.tensor_for(input)?;
            let name = c_string(input.name, "the input name")?;
            // SAFETY: the request copies the tensor's handle (shared storage): `t` may be freed
            // after the call.
            api.check(
                unsafe { (api.infer_request_set_tensor)(self.ptr, name.as_ptr(), t.ptr) },
                || format!("setting input {:?}", input.name),
            )?;
        }
        // SAFETY: every input is set; the call blocks until the outputs are written.
        api.check(unsafe { (api.infer_request_infer)(self.ptr) }, || {
            "inferring".into()
        })?;
        outputs.iter().map(|name| self.output(name)).collect()
    }

    fn tensor_for(&self, input: &Input<'_>) -> Result<OwnedTensor<'static>, Error> {
        let api = &self.lib.api;
        let elements = input.shape.iter().try_fold(1usize, |n, &d| {
            usize::try_from(d).ok().and_then(|d| n.checked_mul(d))
        });
        if elements.and_then(|n| n.checked_mul(input.element.size())) != Some(input.data.len()) {
            return Err(Error::Tensor(format!(
                "input {:?}: {} bytes do not fill shape {:?} of {:?}",
                input.name,
                input.data.len(),
                input.shape,
                input.element
            )));
        }
        let mut shape = Shape {
            rank: 0,
            dims: std::ptr::null_mut(),
        };
        // SAFETY: `dims` holds `rank` values; the shape is freed below (the tensor copies it).
        api.check(
            unsafe {
                (api.shape_create)(input.shape.len() as i64, input.shape.as_ptr(), &mut shape)
            },
            || format!("input {:?}: shape {:?}", input.name, input.shape),
        )?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `shape` is valid; `ptr` is written on success.
        let status = unsafe {
            (api.tensor_create)(
                input.element.code(),
                Shape {
                    rank: shape.rank,
                    dims: shape.dims,
                },
                &mut ptr,
            )
        };
        // SAFETY: `shape` came from ov_shape_create.
        unsafe { (api.shape_free)(&mut shape) };
        api.check(status, || {
            format!("input {:?}: allocating its tensor", input.name)
        })?;
        let t = OwnedTensor { api, ptr };
        let mut data = std::ptr::null_mut();
        let mut size = 0usize;
        // SAFETY: the tensor owns `size` bytes at `data`, which the copy fills exactly.
        unsafe {
            api.check((api.tensor_get_byte_size)(t.ptr, &mut size), || {
                "a tensor's size".into()
            })?;
            api.check((api.tensor_data)(t.ptr, &mut data), || {
                "a tensor's data".into()
            })?;
            if size != input.data.len() || (data.is_null() && size > 0) {
                return Err(Error::Tensor(format!(
                    "input {:?}: OpenVINO allocated {size} bytes for {} ",
                    input.name,
                    input.data.len()
                )));
            }
            if size > 0 {
                std::ptr::copy_nonoverlapping(input.data.as_ptr(), data.cast::<u8>(), size);
            }
        }
        Ok(t)
    }

    fn output(&self, name: &str) -> Result<Output, Error> {
        let api = &self.lib.api;
        let cname = c_string(name, "the output name")?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is written on success and freed by the guard.
        api.check(
            unsafe { (api.infer_request_get_tensor)(self.ptr, cname.as_ptr(), &mut ptr) },
            || format!("reading output {name:?}"),
        )?;
        let t = OwnedTensor { api, ptr };
        let mut code = 0u32;
        let mut shape = Shape {
            rank: 0,
            dims: std::ptr::null_mut(),
        };
        let mut size = 0usize;
        let mut data = std::ptr::null_mut();
        // SAFETY: each call writes its out-parameter; the shape is copied and freed; the data is
        // `size` bytes owned by the tensor, copied before it is freed.
        unsafe {
            api.check((api.tensor_get_element_type)(t.ptr, &mut code), || {
                format!("output {name:?}: its type")
            })?;
            api.check((api.tensor_get_shape)(t.ptr, &mut shape), || {
                format!("output {name:?}: its shape")
            })?;
            let dims = if shape.rank > 0 && !shape.dims.is_null() {
                std::slice::from_raw_parts(shape.dims, shape.rank as usize).to_vec()
            } else {
                Vec::new()
            };
            (api.shape_free)(&mut shape);
            let element = Element::from_code(code).ok_or_else(|| {
                Error::Tensor(format!(
                    "output {name:?} has element type code {code}, which infer-serve does not read"
                ))
            })?;
            api.check((api.tensor_get_byte_size)(t.ptr, &mut size), || {
                format!("output {name:?}: its size")
            })?;
            api.check((api.tensor_data)(t.ptr, &mut data), || {
                format!("output {name:?}: its data")
            })?;
            let bytes = if size == 0 || data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(data.cast::<u8>(), size).to_vec()
            };
            Ok(Output {
                element,
                shape: dims,
                data: bytes,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn element_codes_are_distinct_and_round_trip() {
        for &(e, c) in &Element::CODES {
            assert_eq!(Element::from_code(c), Some(e));
            assert_eq!(e.code(), c);
        }
        assert_eq!(Element::from_code(0), None, "DYNAMIC is no tensor's type");
        assert_eq!(Element::from_code(6), None, "I4 is not read");
    }

    #[test]
    fn a_library_that_is_not_openvino_c_is_refused_by_name() {
        let e = match Library::open(Path::new("/nonexistent/libonnxruntime.so.1.31.0")) {
            Err(e) => e,
            Ok(_) => panic!("opened"),
        };
        assert!(e.to_string().contains("not libopenvino_c.so"), "{e}");
        let e = match Library::open(Path::new("/nonexistent/libopenvino_c.so.2641")) {
            Err(e) => e,
            Ok(_) => panic!("opened"),
        };
        assert!(e.to_string().contains("libtbb.so.12"), "{e}");
        assert!(e.to_string().contains("missing"), "{e}");
    }
}
