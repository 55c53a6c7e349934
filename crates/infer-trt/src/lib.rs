//! TensorRT runtime backend for `infer-serve`: deserialize a plan, describe its IO tensors and
//! run it with `enqueueV3`, through a small C++ shim over TensorRT's public C++ API.
//!
//! Layers, from always-built to most conditional:
//! - Pure helpers (always built, tested in CI): which library to `dlopen` for an engine
//!   ([`LibraryKind`]), decoding `getInferLibVersion`, the header/library version check, TensorRT
//!   datatype codes, buffer sizes that refuse unresolved dimensions, the checks of a batch's
//!   inputs, and reading the driver version from `/proc/driver/nvidia/version`.
//! - Feature `tensorrt`: the Rust side — `dlopen` of libnvinfer / lean / dispatch and of the
//!   CUDA driver and NVML (`libloading`; a missing driver is an error, never a panic),
//!   `TrtLibrary`, `TrtRuntime`, `TrtPlan` (one deserialized engine per process), `TrtEngine`
//!   (an execution context per instance). Builds without TensorRT or CUDA installed;
//!   creating a runtime then fails with [`Error::NoShim`] unless…
//! - …`TENSORRT_ROOT` pointed at TensorRT headers at build time: then `build.rs` compiled
//!   `shim/shim.cpp` (cfg `infer_trt_shim`) and the calls go to TensorRT.
//!
//! What has run where is in `docs/engines.md` ("What verified where"): nothing here has run on
//! a GPU.
//!
//! Must not: link TensorRT or CUDA at build time; be needed by the default workspace build.
#![allow(
    unsafe_code,
    reason = "dlopen of TensorRT and the CUDA driver, and calls into the C++ shim, are FFI"
)]
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_macros,
        clippy::disallowed_methods,
        reason = "tests start tools and print why they skip"
    )
)]

use infer_spec::engine::Version;

/// True when the C++ shim was compiled in (feature `tensorrt` and `TENSORRT_ROOT` headers).
pub const SHIM_COMPILED: bool = cfg!(infer_trt_shim);

/// The marker `infer-build` looks for in a GPU runtime ([`infer_spec::engine::TENSORRT_HEADERS_MARKER`],
/// the headers' release, `;`); empty without the shim.
#[cfg(infer_trt_shim)]
const HEADERS_MARK: &str = concat!(
    "infer-serve/tensorrt-headers=",
    env!("INFER_TRT_HEADERS"),
    ";"
);
#[cfg(not(infer_trt_shim))]
const HEADERS_MARK: &str = "";

/// The release of the TensorRT headers the shim was compiled against (`10.16.0`); `None`
/// without the shim. Read through the whole marker, which keeps the marker in the binary.
pub fn headers_release() -> Option<&'static str> {
    std::hint::black_box(HEADERS_MARK)
        .strip_prefix(infer_spec::engine::TENSORRT_HEADERS_MARKER)?
        .strip_suffix(';')
}

/// Errors of the TensorRT backend.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    #[error("infer-trt was built without the TensorRT shim (enable feature `tensorrt` and set TENSORRT_ROOT to TensorRT's headers at build time)")]
    NoShim,
    #[error("cannot load {library}: {reason}")]
    Load { library: String, reason: String },
    #[error("nvidia driver: {0}")]
    Driver(String),
    /// A CUDA driver API call returned `code` (a `CUresult`); [`Error::device_lost`] says
    /// whether the device is unusable from now on.
    #[error("nvidia driver: {call} failed: CUDA error {code} ({text})")]
    Cuda {
        call: String,
        code: i32,
        text: String,
    },
    #[error("tensorrt: {what}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Tensorrt { what: String, detail: String },
    #[error("tensor `{name}`: {reason}")]
    Tensor { name: String, reason: String },
}

/// The `CUresult` codes after which the CUDA context is unusable for the rest of the process:
/// CUDA's documentation says of each that "any further CUDA work will return the same error"
/// or that the device cannot be used again, and that the process must be relaunched (an
/// uncorrectable ECC error and a destroyed context leave it as unusable).
pub const STICKY_CUDA_ERRORS: [(i32, &str); 11] = [
    (214, "CUDA_ERROR_ECC_UNCORRECTABLE"),
    (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    (702, "CUDA_ERROR_LAUNCH_TIMEOUT"),
    (709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"),
    (710, "CUDA_ERROR_ASSERT"),
    (714, "CUDA_ERROR_HARDWARE_STACK_ERROR"),
    (715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"),
    (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
    (717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"),
    (718, "CUDA_ERROR_INVALID_PC"),
    (719, "CUDA_ERROR_LAUNCH_FAILED"),
];

impl Error {
    /// True when the error leaves the CUDA context unusable (a sticky error, see
    /// [`STICKY_CUDA_ERRORS`]): every later call on this process's context fails the same way,
    /// so the server must stop serving rather than fail request after request. An ordinary
    /// failure (a bad shape, TensorRT refusing one batch, out of memory) is not.
    pub fn device_lost(&self) -> bool {
        matches!(self, Error::Cuda { code, .. } if STICKY_CUDA_ERRORS.iter().any(|(c, _)| c == code))
    }
}

/// The error to report when a step and the stream synchronisation after it may both have
/// failed: a sticky CUDA error from either wins (the caller must see that the device is lost,
/// whatever TensorRT said first), else the step's own error, else the synchronisation's.
pub fn after_sync(step: Result<(), Error>, synced: Result<(), Error>) -> Error {
    match (step, synced) {
        (_, Err(s)) if s.device_lost() => s,
        (Err(e), _) => e,
        (Ok(()), Err(s)) => s,
        (Ok(()), Ok(())) => Error::Tensorrt {
            what: "inference failed".into(),
            detail: "no step reported why".into(),
        },
    }
}

/// Which TensorRT runtime library loads an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LibraryKind {
    /// `libnvinfer.so.N`: any plan (version-compatible ones need host code allowed).
    Full,
    /// `libnvinfer_lean.so.N`: version-compatible plans only.
    Lean,
    /// `libnvinfer_dispatch.so.N`: version-compatible plans, running the lean runtime the plan
    /// embeds (or the one supplied when the plan excludes it).
    Dispatch,
}

impl LibraryKind {
    /// The library for an engine: version-compatible engines built with the lean runtime
    /// excluded run on the lean library shipped in the image; other version-compatible ones on
    /// the dispatch library; the rest need the full runtime.
    pub fn for_engine(version_compatible: bool, exclude_lean_runtime: bool) -> LibraryKind {
        match (version_compatible, exclude_lean_runtime) {
            (true, true) => LibraryKind::Lean,
            (true, false) => LibraryKind::Dispatch,
            (false, _) => LibraryKind::Full,
        }
    }

    /// The kind of a runtime library, from its file name (`…/libnvinfer_lean.so.10` is lean).
    pub fn of_name(library: &str) -> LibraryKind {
        let file = library.rsplit('/').next().unwrap_or(library);
        if file.starts_with("libnvinfer_lean") {
            LibraryKind::Lean
        } else if file.starts_with("libnvinfer_dispatch") {
            LibraryKind::Dispatch
        } else {
            LibraryKind::Full
        }
    }

    /// The soname for TensorRT major version `major`.
    pub fn soname(self, major: u64) -> String {
        match self {
            LibraryKind::Full => format!("libnvinfer.so.{major}"),
            LibraryKind::Lean => format!("libnvinfer_lean.so.{major}"),
            LibraryKind::Dispatch => format!("libnvinfer_dispatch.so.{major}"),
        }
    }
}

/// The TensorRT plugin library a runtime library of `kind` registers (`libnvinfer_plugin.so.N`
/// for the full runtime, the version-compatible `libnvinfer_vc_plugin.so.N` for lean and
/// dispatch), beside `library` when that is a path, else by soname.
pub fn plugin_library_path(kind: LibraryKind, major: u64, library: &str) -> String {
    let file = match kind {
        LibraryKind::Full => format!("libnvinfer_plugin.so.{major}"),
        LibraryKind::Lean | LibraryKind::Dispatch => format!("libnvinfer_vc_plugin.so.{major}"),
    };
    match library.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/{file}"),
        None => file,
    }
}

/// Decode `getInferLibVersion()`: `8601` → 8.6.1 (8.x), `100800` → 10.8.0 (10.x and later).
pub fn decode_lib_version(n: i32) -> Option<Version> {
    let n = u64::try_from(n).ok()?;
    let (major, minor, patch) = if n >= 100_000 {
        (n / 10_000, (n / 100) % 100, n % 100)
    } else if n >= 1_000 {
        (n / 1_000, (n / 100) % 10, n % 100)
    } else {
        return None;
    };
    format!("{major}.{minor}.{patch}").parse().ok()
}

/// The kernel driver version from `/proc/driver/nvidia/version`
/// (`NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.10  Thu …`).
pub fn parse_proc_driver_version(text: &str) -> Option<Version> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    line.split_whitespace()
        .find(|w| w.contains('.') && w.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .and_then(|w| w.parse().ok())
}

/// TensorRT `nvinfer1::DataType` codes, as the shim returns them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrtDataType {
    Float,
    Half,
    Int8,
    Int32,
    Bool,
    Uint8,
    Fp8,
    Bf16,
    Int64,
    Int4,
    Fp4,
    E8m0,
}

impl TrtDataType {
    pub fn from_code(code: i32) -> Option<TrtDataType> {
        Some(match code {
            0 => TrtDataType::Float,
            1 => TrtDataType::Half,
            2 => TrtDataType::Int8,
            3 => TrtDataType::Int32,
            4 => TrtDataType::Bool,
            5 => TrtDataType::Uint8,
            6 => TrtDataType::Fp8,
            7 => TrtDataType::Bf16,
            8 => TrtDataType::Int64,
            9 => TrtDataType::Int4,
            10 => TrtDataType::Fp4,
            11 => TrtDataType::E8m0,
            _ => return None,
        })
    }

    /// The V2 datatype a tensor of this type is exchanged as (FP8, INT4, FP4 and E8M0 have none:
    /// an engine may use them inside, not on its inputs and outputs).
    pub fn v2(self) -> Option<infer_spec::DataType> {
        use infer_spec::DataType as D;
        Some(match self {
            TrtDataType::Float => D::F32,
            TrtDataType::Half => D::F16,
            TrtDataType::Int8 => D::I8,
            TrtDataType::Int32 => D::I32,
            TrtDataType::Bool => D::Bool,
            TrtDataType::Uint8 => D::U8,
            TrtDataType::Bf16 => D::BF16,
            TrtDataType::Int64 => D::I64,
            TrtDataType::Fp8 | TrtDataType::Int4 | TrtDataType::Fp4 | TrtDataType::E8m0 => {
                return None
            }
        })
    }

    /// Bits per element (INT4 and FP4 pack two elements per byte).
    pub fn bits(self) -> usize {
        match self {
            TrtDataType::Float | TrtDataType::Int32 => 32,
            TrtDataType::Half | TrtDataType::Bf16 => 16,
            TrtDataType::Int8
            | TrtDataType::Bool
            | TrtDataType::Uint8
            | TrtDataType::Fp8
            | TrtDataType::E8m0 => 8,
            TrtDataType::Int64 => 64,
            TrtDataType::Int4 | TrtDataType::Fp4 => 4,
        }
    }
}

/// One IO tensor of an engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IoTensor {
    pub name: String,
    pub input: bool,
    pub dtype: TrtDataType,
    /// `-1` for dynamic dimensions.
    pub shape: Vec<i64>,
    /// Inputs: min/opt/max of optimisation profile 0.
    pub profile: Option<[Vec<i64>; 3]>,
    /// The tensor lives in host memory (a shape tensor): it gets a host address, not a device one.
    pub host: bool,
}

fn tensor_err(name: &str, reason: String) -> Error {
    Error::Tensor {
        name: name.into(),
        reason,
    }
}

/// The bytes a tensor of `shape` and `dtype` takes; refuses unresolved (`-1`) dimensions and
/// overflow, so two `-1`s can never multiply into a plausible size.
pub fn byte_len(name: &str, shape: &[i64], dtype: TrtDataType) -> Result<usize, Error> {
    let mut elements: usize = 1;
    for &d in shape {
        let d = usize::try_from(d).map_err(|_| {
            tensor_err(name, format!("shape {shape:?} has an unresolved dimension"))
        })?;
        elements = elements
            .checked_mul(d)
            .ok_or_else(|| tensor_err(name, format!("shape {shape:?} overflows")))?;
    }
    elements
        .checked_mul(dtype.bits())
        .map(|bits| bits.div_ceil(8))
        .ok_or_else(|| tensor_err(name, format!("shape {shape:?} overflows")))
}

impl IoTensor {
    /// The largest shape this input takes: optimisation profile 0's maximum, or the engine's
    /// shape when it is fully static. Refuses a shape that still has a `-1`.
    pub fn max_input_shape(&self) -> Result<Vec<i64>, Error> {
        let shape = match &self.profile {
            Some([_, _, max]) => max.clone(),
            None => self.shape.clone(),
        };
        if shape.iter().any(|&d| d < 0) {
            return Err(tensor_err(
                &self.name,
                format!("no optimisation profile bounds the dynamic shape {shape:?}"),
            ));
        }
        Ok(shape)
    }

    /// Whether `shape` is one this input accepts: the engine's rank and static dimensions, and
    /// within profile 0's min..=max.
    pub fn accepts(&self, shape: &[i64]) -> Result<(), Error> {
        let bad = |why: String| Err(tensor_err(&self.name, why));
        if shape.len() != self.shape.len() {
            return bad(format!(
                "shape {shape:?} has rank {}, the engine expects {:?}",
                shape.len(),
                self.shape
            ));
        }
        for (i, (&got, &want)) in shape.iter().zip(&self.shape).enumerate() {
            if got < 0 || (want >= 0 && got != want) {
                return bad(format!(
                    "dimension {i} is {got}, the engine expects {:?}",
                    self.shape
                ));
            }
        }
        if let Some([min, _, max]) = &self.profile {
            let within = shape
                .iter()
                .zip(min.iter().zip(max))
                .all(|(d, (lo, hi))| lo <= d && d <= hi);
            if !within {
                return bad(format!(
                    "shape {shape:?} is outside the engine's profile {min:?}..={max:?}"
                ));
            }
        }
        Ok(())
    }
}

/// Refuses a tensor whose layout is not TensorRT's linear one (`TensorFormat::kLINEAR`, 0):
/// vectorized and channel-last formats (kCHW4, kHWC8, …) would need a conversion infer-serve
/// does not make, and read as linear they give wrong answers silently.
pub fn check_linear(name: &str, format: i32) -> Result<(), Error> {
    if format == 0 {
        return Ok(());
    }
    Err(tensor_err(
        name,
        format!(
            "uses TensorRT tensor format {format}, not the linear one infer-serve exchanges \
             (build the engine with linear IO formats, e.g. trtexec's default \
             --inputIOFormats/--outputIOFormats)"
        ),
    ))
}

/// The error for an output whose shape stays unresolved once every input's shape and values are
/// set: its size depends on the data (NonZero, NMS), which needs an output allocator.
pub fn data_dependent(name: &str, shape: &[i64]) -> Error {
    tensor_err(
        name,
        format!(
            "has a data-dependent shape {shape:?} (from an operator such as NonZero or NMS); \
             infer-serve sizes outputs before a batch runs, so such an engine is not served"
        ),
    )
}

/// Refuses an output shape that does not fit the `capacity` bytes bound for it, before anything
/// is enqueued (a shape tensor's values can make an output larger than at allocation).
pub fn check_fits(
    name: &str,
    shape: &[i64],
    dtype: TrtDataType,
    capacity: usize,
) -> Result<(), Error> {
    let need = byte_len(name, shape, dtype)?;
    if need <= capacity {
        return Ok(());
    }
    Err(tensor_err(
        name,
        format!(
            "this batch's shape {shape:?} needs {need} bytes, more than the {capacity} bound for \
             the profile's largest shapes"
        ),
    ))
}

/// The host bytes of a shape tensor holding `values` (native-endian INT32 or INT64, as TensorRT
/// reads them), exactly `len` bytes long.
pub fn shape_values_bytes(
    name: &str,
    values: &[i64],
    dtype: TrtDataType,
    len: usize,
) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(len);
    for &v in values {
        match dtype {
            TrtDataType::Int32 => {
                let v = i32::try_from(v)
                    .map_err(|_| tensor_err(name, format!("shape value {v} does not fit INT32")))?;
                out.extend_from_slice(&v.to_ne_bytes());
            }
            TrtDataType::Int64 => out.extend_from_slice(&v.to_ne_bytes()),
            other => {
                return Err(tensor_err(
                    name,
                    format!("is a shape tensor of {other:?}; TensorRT's are INT32 or INT64"),
                ))
            }
        }
    }
    if out.len() != len {
        return Err(tensor_err(
            name,
            format!(
                "{} profile values make {} bytes, its shape needs {len}",
                values.len(),
                out.len()
            ),
        ));
    }
    Ok(out)
}

/// Checks one batch's inputs `(name, shape, byte length)` against the engine's IO tensors: every
/// input given exactly once, no unknown or output name, each shape accepted and each byte length
/// equal to shape × element size.
pub fn check_inputs(io: &[IoTensor], inputs: &[(&str, &[i64], usize)]) -> Result<(), Error> {
    for (i, (name, shape, len)) in inputs.iter().enumerate() {
        let t = io
            .iter()
            .find(|t| t.name == *name)
            .ok_or_else(|| tensor_err(name, "the engine has no tensor of this name".into()))?;
        if !t.input {
            return Err(tensor_err(
                name,
                "is an output of the engine, not an input".into(),
            ));
        }
        if inputs[..i].iter().any(|(n, _, _)| n == name) {
            return Err(tensor_err(name, "given twice".into()));
        }
        t.accepts(shape)?;
        let want = byte_len(name, shape, t.dtype)?;
        if *len != want {
            return Err(tensor_err(
                name,
                format!(
                    "{len} bytes given, shape {shape:?} of {:?} needs {want}",
                    t.dtype
                ),
            ));
        }
    }
    if let Some(missing) = io
        .iter()
        .find(|t| t.input && !inputs.iter().any(|(n, _, _)| *n == t.name))
    {
        return Err(tensor_err(&missing.name, "input missing".into()));
    }
    Ok(())
}

/// The optimisation profile the execution context of instance `instance` (0, 1, …) runs, for a
/// plan of `profiles` profiles on TensorRT `major`. Every instance shares one deserialized
/// engine. From TensorRT 10 each context may run profile 0; TensorRT 8.6 requires each context
/// of an engine to have a profile of its own, so instance *i* gets profile *i* and an instance
/// beyond the plan's profiles is refused, saying what to change.
pub fn context_profile(major: i32, instance: usize, profiles: i32) -> Result<i32, Error> {
    if profiles < 1 {
        return Err(Error::Tensorrt {
            what: "the plan has no optimisation profile".into(),
            detail: String::new(),
        });
    }
    if major >= 10 {
        return Ok(0);
    }
    match i32::try_from(instance) {
        Ok(i) if i < profiles => Ok(i),
        _ => Err(Error::Tensorrt {
            what: format!(
                "instance {} needs an optimisation profile of its own on TensorRT {major}.x, and \
                 the plan has {profiles}",
                instance + 1
            ),
            detail: format!(
                "run at most {profiles} instances (the recipe's instance count), or build the plan \
                 with one profile per instance"
            ),
        }),
    }
}

/// The major version in a `getInferLibVersion()` / `NV_TENSORRT_VERSION` value.
pub fn version_major(n: i32) -> i32 {
    if n >= 100_000 {
        n / 10_000
    } else {
        n / 1_000
    }
}

/// The minor version in a `getInferLibVersion()` / `NV_TENSORRT_VERSION` value.
pub fn version_minor(n: i32) -> i32 {
    if n >= 100_000 {
        (n / 100) % 100
    } else {
        (n / 100) % 10
    }
}

/// Refuses a library the shim cannot use safely: one of another major than the headers it was
/// compiled against (virtual-table layouts differ between majors), or an older release of the
/// same major. NVIDIA promises compatibility from older headers to newer libraries only: a
/// method the newer headers declare may be missing from an older library's tables, and
/// `createInferRuntime_INTERNAL` is given the headers' version. Refused at start, clearly,
/// rather than guessed at (NGC images often carry 10.9 to 10.13 while the shim is compiled
/// against 10.16).
pub fn check_library(library: &str, header_version: i32, lib_version: i32) -> Result<(), Error> {
    let (h, l) = (version_major(header_version), version_major(lib_version));
    if h != l {
        return Err(Error::Load {
            library: library.into(),
            reason: format!(
                "it is TensorRT {l}.x (getInferLibVersion {lib_version}) but this infer-serve was \
                 built against TensorRT {h}.x headers ({header_version}); virtual-table layouts \
                 differ between majors, so it is not used"
            ),
        });
    }
    let (hm, lm) = (version_minor(header_version), version_minor(lib_version));
    if lm < hm {
        return Err(Error::Load {
            library: library.into(),
            reason: format!(
                "it is TensorRT {l}.{lm} (getInferLibVersion {lib_version}), older than the \
                 TensorRT {h}.{hm} headers this infer-serve was built against \
                 ({header_version}); TensorRT is compatible only from older headers to newer \
                 libraries, so it is not used (build infer-serve against headers of {l}.{lm} \
                 or older, or run a TensorRT {h}.{hm} or newer library)"
            ),
        });
    }
    Ok(())
}

#[cfg(feature = "tensorrt")]
mod cuda;
#[cfg(feature = "tensorrt")]
mod runtime;
#[cfg(feature = "tensorrt")]
pub use runtime::{header_version, probe_gpu, Tensors, TrtEngine, TrtLibrary, TrtPlan, TrtRuntime};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_marker_names_the_shims_headers() {
        let release = headers_release();
        assert_eq!(release.is_some(), SHIM_COMPILED, "{HEADERS_MARK:?}");
        match release {
            Some(r) => {
                let v: Version = r.parse().unwrap();
                assert_eq!(
                    infer_spec::engine::tensorrt_headers_in(HEADERS_MARK.as_bytes()),
                    Some(v.clone())
                );
                #[cfg(feature = "tensorrt")]
                assert_eq!(
                    v.major() as i32,
                    version_major(header_version().unwrap()),
                    "the marker and NV_TENSORRT_VERSION agree"
                );
            }
            None => assert_eq!(HEADERS_MARK, ""),
        }
    }

    #[test]
    fn library_choice() {
        assert_eq!(
            LibraryKind::for_engine(true, true).soname(10),
            "libnvinfer_lean.so.10"
        );
        assert_eq!(
            LibraryKind::for_engine(true, false).soname(11),
            "libnvinfer_dispatch.so.11"
        );
        assert_eq!(
            LibraryKind::for_engine(false, false).soname(8),
            "libnvinfer.so.8"
        );
    }

    #[test]
    fn plugin_library_beside_the_runtime_library() {
        let cases = [
            ("libnvinfer.so.10", "libnvinfer_plugin.so.10"),
            (
                "/opt/trt/lib/libnvinfer.so.10",
                "/opt/trt/lib/libnvinfer_plugin.so.10",
            ),
            ("libnvinfer_lean.so.10", "libnvinfer_vc_plugin.so.10"),
            (
                "/app/trt/libnvinfer_lean.so.11",
                "/app/trt/libnvinfer_vc_plugin.so.11",
            ),
            ("libnvinfer_dispatch.so.10", "libnvinfer_vc_plugin.so.10"),
        ];
        for (library, plugin) in cases {
            let kind = LibraryKind::of_name(library);
            let major = library.rsplit('.').next().unwrap().parse().unwrap();
            assert_eq!(
                plugin_library_path(kind, major, library),
                plugin,
                "{library}"
            );
        }
    }

    #[test]
    fn lib_versions() {
        let d = |n| decode_lib_version(n).map(|v| v.to_string());
        assert_eq!(d(8601).as_deref(), Some("8.6.1"));
        assert_eq!(d(100800).as_deref(), Some("10.8.0"));
        assert_eq!(d(110400).as_deref(), Some("11.4.0"));
        assert_eq!(d(-1), None);
        assert_eq!(d(7), None);
    }

    #[test]
    fn proc_driver_version() {
        let text = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.10  Thu Dec 26 19:33:26 UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
        assert_eq!(
            parse_proc_driver_version(text).unwrap().to_string(),
            "570.86.10"
        );
        let open = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 2025\n";
        assert_eq!(
            parse_proc_driver_version(open).unwrap().to_string(),
            "580.95.05"
        );
        assert_eq!(parse_proc_driver_version("garbage"), None);
    }

    #[test]
    fn datatypes() {
        assert_eq!(
            TrtDataType::from_code(1).and_then(TrtDataType::v2),
            Some(infer_spec::DataType::F16)
        );
        assert_eq!(TrtDataType::from_code(6).and_then(TrtDataType::v2), None);
        assert_eq!(TrtDataType::from_code(42), None);
        assert_eq!(TrtDataType::Int64.bits(), 64);
        // FP4 and E8M0 (TensorRT 10.8+) are known types: an engine using them inside loads.
        assert_eq!(TrtDataType::from_code(10), Some(TrtDataType::Fp4));
        assert_eq!(TrtDataType::from_code(11), Some(TrtDataType::E8m0));
        assert_eq!(TrtDataType::Fp4.v2(), None);
        assert_eq!(byte_len("x", &[3], TrtDataType::Fp4).unwrap(), 2);
    }

    fn input(name: &str, shape: &[i64], profile: Option<[&[i64]; 3]>) -> IoTensor {
        IoTensor {
            name: name.into(),
            input: true,
            dtype: TrtDataType::Float,
            shape: shape.to_vec(),
            profile: profile.map(|[a, b, c]| [a.to_vec(), b.to_vec(), c.to_vec()]),
            host: false,
        }
    }

    #[test]
    fn unresolved_shapes_never_size_a_buffer() {
        // Two -1s multiply to a positive count: the old sizing accepted them.
        let e = byte_len("y", &[-1, -1, 4], TrtDataType::Float).unwrap_err();
        assert!(e.to_string().contains("unresolved"), "{e}");
        assert_eq!(byte_len("y", &[8, 4], TrtDataType::Float).unwrap(), 128);
        assert!(byte_len("y", &[i64::MAX, i64::MAX], TrtDataType::Float).is_err());
        let x = input("x", &[-1, 4], Some([&[1, 4], &[4, 4], &[8, 4]]));
        assert_eq!(x.max_input_shape().unwrap(), vec![8, 4]);
        let unbounded = input("x", &[-1, 4], None);
        assert!(unbounded.max_input_shape().is_err());
        assert_eq!(
            input("s", &[2, 4], None).max_input_shape().unwrap(),
            vec![2, 4]
        );
    }

    #[test]
    fn one_engine_and_a_context_per_instance() {
        // TensorRT 10 and 11: every context on profile 0.
        for instance in [0, 1, 7] {
            assert_eq!(context_profile(10, instance, 1).unwrap(), 0);
            assert_eq!(context_profile(11, instance, 2).unwrap(), 0);
        }
        // TensorRT 8.6: a profile per context, as many instances as profiles.
        assert_eq!(context_profile(8, 0, 2).unwrap(), 0);
        assert_eq!(context_profile(8, 1, 2).unwrap(), 1);
        let e = context_profile(8, 2, 2).unwrap_err().to_string();
        assert!(e.contains("instance 3") && e.contains("has 2"), "{e}");
        assert!(e.contains("at most 2 instances"), "{e}");
        assert!(context_profile(10, 0, 0).is_err());
    }

    #[test]
    fn a_sticky_cuda_error_is_a_lost_device_and_wins_over_the_step_that_saw_it() {
        let cuda = |code: i32, text: &str| Error::Cuda {
            call: "cuStreamSynchronize".into(),
            code,
            text: text.into(),
        };
        let illegal = cuda(700, "an illegal memory access was encountered");
        assert!(illegal.device_lost());
        assert_eq!(
            illegal.to_string(),
            "nvidia driver: cuStreamSynchronize failed: CUDA error 700 (an illegal memory access was encountered)"
        );
        for (code, _) in STICKY_CUDA_ERRORS {
            assert!(cuda(code, "x").device_lost(), "{code}");
        }
        // Ordinary failures: out of memory, an invalid value, TensorRT refusing one batch, a
        // bad tensor, a missing driver.
        assert!(!cuda(2, "out of memory").device_lost());
        assert!(!cuda(1, "invalid argument").device_lost());
        let refused = Error::Tensorrt {
            what: "enqueueV3 failed".into(),
            detail: "bad shape".into(),
        };
        assert!(!refused.device_lost());
        assert!(!tensor_err("x", "too big".into()).device_lost());
        assert!(!Error::Driver("cannot load libcuda.so.1".into()).device_lost());
        // The step failed and the synchronisation after it found the context lost: lost wins.
        let e = after_sync(Err(refused.clone()), Err(illegal.clone()));
        assert!(e.device_lost(), "{e}");
        // The step succeeded, the synchronisation found it lost.
        assert!(after_sync(Ok(()), Err(illegal)).device_lost());
        // An ordinary synchronisation failure does not hide the step's own error.
        let e = after_sync(Err(refused.clone()), Err(cuda(1, "invalid argument")));
        assert_eq!(e.to_string(), refused.to_string());
        assert!(!after_sync(Err(refused), Ok(())).device_lost());
    }

    #[test]
    fn shape_tensors_outputs_and_formats() {
        // A shape tensor of 2 INT32 values is filled with the profile's largest values, not zeros.
        let b = shape_values_bytes("s", &[8, 640], TrtDataType::Int32, 8).unwrap();
        assert_eq!(b, [8i32.to_ne_bytes(), 640i32.to_ne_bytes()].concat());
        let b = shape_values_bytes("s", &[3], TrtDataType::Int64, 8).unwrap();
        assert_eq!(b, 3i64.to_ne_bytes());
        let e = |r: Result<Vec<u8>, Error>| r.unwrap_err().to_string();
        assert!(e(shape_values_bytes("s", &[1 << 40], TrtDataType::Int32, 4)).contains("INT32"));
        assert!(e(shape_values_bytes("s", &[1], TrtDataType::Float, 4)).contains("shape tensor"));
        assert!(e(shape_values_bytes("s", &[1], TrtDataType::Int32, 8)).contains("needs 8"));
        // An output a batch's shapes make larger than its buffer is refused before the enqueue.
        check_fits("y", &[8, 4], TrtDataType::Float, 128).unwrap();
        let msg = check_fits("y", &[9, 4], TrtDataType::Float, 128)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("144 bytes") && msg.contains("128"), "{msg}");
        assert!(check_fits("y", &[-1, 4], TrtDataType::Float, 128).is_err());
        let msg = data_dependent("boxes", &[-1, 4]).to_string();
        assert!(msg.contains("`boxes`") && msg.contains("NonZero"), "{msg}");
        check_linear("x", 0).unwrap();
        let msg = check_linear("x", 4).unwrap_err().to_string();
        assert!(msg.contains("format 4") && msg.contains("linear"), "{msg}");
    }

    #[test]
    fn inputs_are_checked_by_name_completeness_shape_and_bytes() {
        let io = vec![
            input("a", &[-1, 4], Some([&[1, 4], &[4, 4], &[8, 4]])),
            input("b", &[-1, 2], Some([&[1, 2], &[4, 2], &[8, 2]])),
            IoTensor {
                name: "y".into(),
                input: false,
                dtype: TrtDataType::Float,
                shape: vec![-1, 1],
                profile: None,
                host: false,
            },
        ];
        let ok: [(&str, &[i64], usize); 2] = [("a", &[2, 4], 32), ("b", &[2, 2], 16)];
        check_inputs(&io, &ok).unwrap();
        let err =
            |inputs: &[(&str, &[i64], usize)]| check_inputs(&io, inputs).unwrap_err().to_string();
        assert!(err(&[("a", &[2, 4], 32)]).contains("`b`: input missing"));
        assert!(err(&[("a", &[2, 4], 32), ("b", &[2, 2], 16), ("c", &[1], 4)]).contains("`c`"));
        assert!(err(&[("a", &[2, 4], 32), ("y", &[2, 1], 8)]).contains("output"));
        assert!(err(&[("a", &[2, 4], 32), ("a", &[2, 4], 32)]).contains("twice"));
        assert!(err(&[("a", &[2, 4], 31), ("b", &[2, 2], 16)]).contains("31 bytes"));
        assert!(err(&[("a", &[9, 4], 144), ("b", &[2, 2], 16)]).contains("outside"));
        assert!(err(&[("a", &[2, 5], 40), ("b", &[2, 2], 16)]).contains("dimension 1"));
        assert!(err(&[("a", &[8], 32), ("b", &[2, 2], 16)]).contains("rank"));
    }

    #[test]
    fn a_library_of_another_major_or_an_older_minor_is_refused() {
        check_library("libnvinfer_lean.so.10", 101600, 101611).unwrap();
        check_library("libnvinfer_lean.so.10", 101600, 101600).unwrap();
        check_library("libnvinfer_lean.so.10", 101600, 101700).unwrap();
        check_library("libnvinfer.so.8", 8601, 8602).unwrap();
        let e = check_library("libnvinfer_lean.so.11", 101600, 110400)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("TensorRT 11.x") && e.contains("TensorRT 10.x headers"),
            "{e}"
        );
        assert!(check_library("libnvinfer.so.8", 110100, 8601).is_err());
        // Older minors of the same major: NGC's 10.9 library under 10.16 headers.
        for (headers, lib) in [
            (101600, 100900),
            (101600, 101300),
            (110100, 110000),
            (8601, 8501),
        ] {
            let e = check_library("libnvinfer.so", headers, lib)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("older than the TensorRT"),
                "{headers} {lib}: {e}"
            );
        }
        assert_eq!(version_minor(101600), 16);
        assert_eq!(version_minor(8601), 6);
    }

    #[cfg(all(feature = "tensorrt", not(infer_trt_shim)))]
    #[test]
    fn loading_without_the_shim_says_how_to_get_it() {
        let e = TrtRuntime::load_path("libnvinfer_dispatch.so.10")
            .err()
            .unwrap();
        assert!(matches!(e, Error::NoShim), "{e}");
        assert!(e.to_string().contains("TENSORRT_ROOT"));
    }
}
