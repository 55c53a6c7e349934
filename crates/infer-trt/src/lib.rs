//! TensorRT runtime backend for `infer-serve`: deserialize a plan, describe its IO tensors and
//! run it with `enqueueV3`, through a small C++ shim over TensorRT's public C++ API.
//!
//! Layers, from always-built to most conditional:
//! - Pure helpers (always built, tested in CI): which library to `dlopen` for an engine
//!   ([`LibraryKind`]), decoding `getInferLibVersion`, TensorRT datatype codes, and reading the
//!   driver version from `/proc/driver/nvidia/version` for the start-up compatibility check.
//! - Feature `tensorrt`: the Rust side — `dlopen` of libnvinfer / lean / dispatch
//!   (`libloading`), device memory and streams (`cudarc`), [`TrtEngine`]. Builds without TensorRT
//!   or CUDA installed; every call then fails with [`Error::NoShim`] unless…
//! - …`TENSORRT_ROOT` pointed at TensorRT headers at build time: then `build.rs` compiled
//!   `shim/shim.cpp` (cfg `infer_trt_shim`) and the calls go to TensorRT.
//!
//! Nothing here has run on a GPU yet (see `docs/engines.md`, "What is verified").
//!
//! Must not: link TensorRT or CUDA at build time; be needed by the default workspace build.

use infer_spec::engine::Version;

/// True when the C++ shim was compiled in (feature `tensorrt` and `TENSORRT_ROOT` headers).
pub const SHIM_COMPILED: bool = cfg!(infer_trt_shim);

/// Errors of the TensorRT backend.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("infer-trt was built without the TensorRT shim (enable feature `tensorrt` and set TENSORRT_ROOT to TensorRT's headers at build time)")]
    NoShim,
    #[error("cannot load {library}: {reason}")]
    Load { library: String, reason: String },
    #[error("cuda: {0}")]
    Cuda(String),
    #[error("tensorrt: {what}{}", if detail.is_empty() { String::new() } else { format!(": {detail}") })]
    Tensorrt { what: String, detail: String },
    #[error("tensor `{name}`: {reason}")]
    Tensor { name: String, reason: String },
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

    /// The soname for TensorRT major version `major`.
    pub fn soname(self, major: u64) -> String {
        match self {
            LibraryKind::Full => format!("libnvinfer.so.{major}"),
            LibraryKind::Lean => format!("libnvinfer_lean.so.{major}"),
            LibraryKind::Dispatch => format!("libnvinfer_dispatch.so.{major}"),
        }
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
            _ => return None,
        })
    }

    /// The V2 datatype a tensor of this type is exchanged as (FP8/INT4 have none).
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
            TrtDataType::Fp8 | TrtDataType::Int4 => return None,
        })
    }

    /// Bytes per element (INT4 packs two per byte: reported as 1 and refused by callers).
    pub fn size(self) -> usize {
        match self {
            TrtDataType::Float | TrtDataType::Int32 => 4,
            TrtDataType::Half | TrtDataType::Bf16 => 2,
            TrtDataType::Int8
            | TrtDataType::Bool
            | TrtDataType::Uint8
            | TrtDataType::Fp8
            | TrtDataType::Int4 => 1,
            TrtDataType::Int64 => 8,
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
}

#[cfg(feature = "tensorrt")]
mod runtime;
#[cfg(feature = "tensorrt")]
pub use runtime::{probe_node, Tensors, TrtEngine, TrtRuntime};

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(TrtDataType::Int64.size(), 8);
    }

    #[cfg(all(feature = "tensorrt", not(infer_trt_shim)))]
    #[test]
    fn loading_without_the_shim_says_how_to_get_it() {
        let e = TrtRuntime::load(LibraryKind::Dispatch, 10).err().unwrap();
        assert!(matches!(e, Error::NoShim), "{e}");
        assert!(e.to_string().contains("TENSORRT_ROOT"));
    }
}
