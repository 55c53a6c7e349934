//! Engine metadata: the compatibility tuple an engine was built for, the engine profile (measured
//! compute time per batch size), and the pure check the runtime runs at start.
//!
//! The builder writes [`EngineMeta`] next to every engine (`meta.json`), into the image
//! annotations and into the runtime config; `infer-serve` describes the node it runs on as a
//! [`Found`] and calls [`check_compat`] before loading anything. A mismatch is an error that names
//! both sides; there is no silent fallback.
//!
//! This module does no I/O: it parses, compares and (de)serialises values.

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Version of the metadata and profile documents. Bumped when a field changes meaning.
pub const META_SCHEMA: u32 = 1;

/// File name of the engine metadata stored next to an engine.
pub const META_FILE: &str = "meta.json";
/// File name of the engine profile stored next to an engine.
pub const PROFILE_FILE: &str = "profile.json";

/// Which backend runs the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// A tract model (ONNX or tract's NNEF form) run on the CPU.
    Tract,
    /// A serialized TensorRT plan.
    Tensorrt,
    /// An ONNX model run on the CPU by ONNX Runtime (a shared library loaded at start).
    Onnxruntime,
    /// An ONNX model compiled at start by OpenVINO's CPU plugin (a shared library loaded at
    /// start).
    Openvino,
}

/// Its [`name`](crate::engines::EngineDef::name).
impl fmt::Display for EngineKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.def().name)
    }
}

/// `engine.cpu` of a recipe: which engine a CPU target ships, or how it is chosen. Written into
/// the engine cache key and the engine profile's selection record in the same spelling (`auto`
/// or the engine's name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CpuEngine {
    /// Load the model in every CPU engine at hand, check they agree, ship the faster one that
    /// loads.
    Auto,
    /// This engine only (one whose [`EngineDef::cpu`](crate::engines::EngineDef::cpu) is set).
    Only(EngineKind),
}

impl CpuEngine {
    /// `engine.cpu = "tract"`.
    pub const TRACT: CpuEngine = CpuEngine::Only(EngineKind::Tract);
    /// `engine.cpu = "onnxruntime"`.
    pub const ONNXRUNTIME: CpuEngine = CpuEngine::Only(EngineKind::Onnxruntime);
    /// `engine.cpu = "openvino"`.
    pub const OPENVINO: CpuEngine = CpuEngine::Only(EngineKind::Openvino);

    /// The recipe's spelling, case-insensitive: `auto`, or a CPU engine's name or one of its
    /// aliases (`ort` and `onnx-runtime` for ONNX Runtime).
    pub fn parse(s: &str) -> Option<CpuEngine> {
        let s = s.trim().to_ascii_lowercase();
        if s == "auto" {
            return Some(CpuEngine::Auto);
        }
        EngineKind::cpu_engines()
            .find(|d| d.name == s || d.aliases.contains(&s.as_str()))
            .map(|d| CpuEngine::Only(d.kind))
    }

    /// The canonical spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            CpuEngine::Auto => "auto",
            CpuEngine::Only(kind) => kind.def().name,
        }
    }

    /// What a recipe may write: `auto` and every CPU engine's name, for errors.
    pub fn expected() -> String {
        let mut names = vec!["\"auto\"".to_owned()];
        names.extend(EngineKind::cpu_engines().map(|d| format!("\"{}\"", d.name)));
        names.join(", ")
    }
}

impl fmt::Display for CpuEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for CpuEngine {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// The canonical spelling only ([`CpuEngine::as_str`]), as it was written.
impl<'de> Deserialize<'de> for CpuEngine {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        CpuEngine::parse(&s)
            .filter(|c| c.as_str() == s)
            .ok_or_else(|| {
                serde::de::Error::custom(format!(
                    "unknown engine.cpu `{s}`: expected {}",
                    CpuEngine::expected()
                ))
            })
    }
}

/// What timed an engine profile's T(b).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimedBy {
    /// tract, in the builder's process.
    Tract,
    /// ONNX Runtime, in the builder's process.
    Onnxruntime,
    /// OpenVINO, in the builder's process.
    Openvino,
    /// trtexec's `--exportTimes` on the builder's GPU.
    Trtexec,
}

impl TimedBy {
    /// What times engines of `kind`: each backend times its own engines in the builder.
    pub fn of(kind: EngineKind) -> TimedBy {
        kind.def().timed_by
    }
}

impl fmt::Display for TimedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TimedBy::Tract => "tract",
            TimedBy::Onnxruntime => "onnxruntime",
            TimedBy::Openvino => "openvino",
            TimedBy::Trtexec => "trtexec",
        })
    }
}

/// On-disk format of the engine file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineFormat {
    /// The (validated) ONNX model itself; tract loads and optimises it at start.
    Onnx,
    /// tract's NNEF archive (`.nnef.tar`) with the tract core, ONNX and resource extensions.
    TractNnefTar,
    /// A TensorRT plan (`.plan`).
    TensorrtPlan,
}

/// The `[engine] kind` of `runtime.toml` that runs an engine of this kind and format; `None`
/// for a pair no backend runs (an inconsistent metadata document). The pairs are the engine's
/// [`formats`](crate::engines::EngineDef::formats): the builder writes `runtime.toml` with
/// them, [`EngineMeta::validate`] checks with them.
pub fn backend_kind(kind: EngineKind, format: EngineFormat) -> Option<crate::runtime::BackendKind> {
    kind.def()
        .formats
        .iter()
        .find(|&&(f, _)| f == format)
        .map(|&(_, b)| b)
}

impl EngineFormat {
    /// The file name the engine is stored under, inside its cache entry and inside images.
    pub fn file_name(self) -> &'static str {
        match self {
            EngineFormat::Onnx => "model.onnx",
            EngineFormat::TractNnefTar => "model.nnef.tar",
            EngineFormat::TensorrtPlan => "engine.plan",
        }
    }
}

/// A numeric precision: what a recipe asks an engine to compute in (`targets.precision`), what
/// a GPU's tensor cores support (the compatibility matrix), and what an engine was built at
/// (`engine.json`). One type for all three.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    /// TF32: how tensor cores compute FP32 (a GPU property; not something a recipe asks for).
    Tf32,
    Fp16,
    Bf16,
    Int8,
    /// FP8 E4M3 through Q/DQ nodes (explicit quantization; Ada sm_89, Hopper and newer).
    Fp8,
    Fp4,
}

impl Precision {
    pub const ALL: [Precision; 7] = [
        Precision::Fp32,
        Precision::Tf32,
        Precision::Fp16,
        Precision::Bf16,
        Precision::Int8,
        Precision::Fp8,
        Precision::Fp4,
    ];

    /// The precisions a recipe may ask for (`targets.precision`): all but TF32, which TensorRT
    /// uses for FP32 on its own.
    pub const REQUESTABLE: [Precision; 6] = [
        Precision::Fp32,
        Precision::Fp16,
        Precision::Bf16,
        Precision::Int8,
        Precision::Fp8,
        Precision::Fp4,
    ];

    /// The precisions of CPU targets (`targets.cpu`): FP32 on every CPU engine; BF16 on
    /// OpenVINO (its inference precision, on CPUs with AVX-512 BF16 or AMX); INT8 on OpenVINO,
    /// from the Q/DQ model infer-build quantises with calibration data.
    pub const CPU: [Precision; 3] = [Precision::Fp32, Precision::Bf16, Precision::Int8];

    /// True for the precisions the engine stage builds engines at (fp32, fp16, int8, fp8).
    pub const fn engine_buildable(self) -> bool {
        matches!(
            self,
            Precision::Fp32 | Precision::Fp16 | Precision::Int8 | Precision::Fp8
        )
    }

    pub const fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Tf32 => "tf32",
            Precision::Fp16 => "fp16",
            Precision::Bf16 => "bf16",
            Precision::Int8 => "int8",
            Precision::Fp8 => "fp8",
            Precision::Fp4 => "fp4",
        }
    }

    /// The precision named exactly `s` (lowercase, as written in recipes, the matrix and
    /// `engine.json`).
    pub fn parse(s: &str) -> Option<Precision> {
        Precision::ALL.into_iter().find(|p| p.as_str() == s)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Precision {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        Precision::parse(&s.trim().to_ascii_lowercase()).ok_or_else(|| {
            ParseError::new("precision", s, "fp32, tf32, fp16, bf16, int8, fp8 or fp4")
        })
    }
}

/// TensorRT hardware-compatibility level of a plan.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum HardwareCompat {
    /// Bound to the compute capability (and in practice the model) of the building GPU.
    #[default]
    None,
    /// `ampere+`: runs on any GPU of compute capability 8.0 or newer (TensorRT 8.6+).
    AmperePlus,
    /// `sameComputeCapability`: any GPU with the builder's compute capability (TensorRT 10.9+).
    SameComputeCapability,
}

/// As recipes write it: `none`, `ampere+`, `same-compute-capability`.
impl fmt::Display for HardwareCompat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HardwareCompat::None => "none",
            HardwareCompat::AmperePlus => "ampere+",
            HardwareCompat::SameComputeCapability => "same-compute-capability",
        })
    }
}

impl HardwareCompat {
    /// The value `trtexec --hardwareCompatibilityLevel=` takes.
    pub fn trtexec_value(self) -> &'static str {
        match self {
            HardwareCompat::None => "none",
            HardwareCompat::AmperePlus => "ampere+",
            HardwareCompat::SameComputeCapability => "sameComputeCapability",
        }
    }
}

impl FromStr for HardwareCompat {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        match s {
            "none" => Ok(HardwareCompat::None),
            "ampere+" | "ampere-plus" => Ok(HardwareCompat::AmperePlus),
            "sameComputeCapability" | "same-compute-capability" => {
                Ok(HardwareCompat::SameComputeCapability)
            }
            _ => Err(ParseError::new(
                "hardware compatibility level",
                s,
                "none, ampere+ or sameComputeCapability",
            )),
        }
    }
}

/// A value that could not be parsed: what it was meant to be, the text, what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} `{text}`: expected {expected}")]
pub struct ParseError {
    pub what: &'static str,
    pub text: String,
    pub expected: &'static str,
}

impl ParseError {
    fn new(what: &'static str, text: &str, expected: &'static str) -> Self {
        ParseError {
            what,
            text: text.to_string(),
            expected,
        }
    }
}

/// A CUDA compute capability, 8.9: the one type of the builder and the runtime.
///
/// It has two written forms, and no `Display`, so that every place that writes one says which:
/// [`dotted`](Self::dotted) `8.9` (NVIDIA's tables, `nvidia-smi`, the matrix, the plan, the
/// `gpu.compute_capability` annotation) and [`sm`](Self::sm) `sm_89` (the compiler's name, the
/// engine metadata and its compatibility key). Target ids use [`target_id`](Self::target_id)
/// `sm89`. Serialised as `"sm_89"`; both forms parse (`sm89` and `SM_90` too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComputeCapability {
    pub major: u32,
    pub minor: u32,
}

impl ComputeCapability {
    pub const fn new(major: u32, minor: u32) -> Self {
        ComputeCapability { major, minor }
    }

    /// `8.9`.
    pub fn dotted(self) -> impl fmt::Display {
        CcForm(self, "", ".")
    }

    /// `sm_89`.
    pub fn sm(self) -> impl fmt::Display {
        CcForm(self, "sm_", "")
    }

    /// `sm89`, as in target ids (`sm89-fp16`).
    pub fn target_id(self) -> impl fmt::Display {
        CcForm(self, "sm", "")
    }
}

/// One written form of a compute capability: prefix, major, separator, minor.
struct CcForm(ComputeCapability, &'static str, &'static str);

impl fmt::Display for CcForm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let CcForm(cc, prefix, sep) = self;
        write!(f, "{prefix}{}{sep}{}", cc.major, cc.minor)
    }
}

impl FromStr for ComputeCapability {
    type Err = ParseError;
    /// Accepts `sm_89`, `sm89`, `SM_90` and the dotted `8.9` that `nvidia-smi` prints. In the SM
    /// form the last digit is the minor version (`sm_100` is 10.0).
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let err = || {
            ParseError::new(
                "compute capability",
                s,
                "sm_XY or X.Y, such as sm_89 or 8.9",
            )
        };
        let number = |t: &str| -> Result<u32, ParseError> {
            if t.is_empty() || t.len() > 3 || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err());
            }
            t.parse().map_err(|_| err())
        };
        let t = s.trim();
        if let Some((a, b)) = t.split_once('.') {
            return Ok(ComputeCapability::new(number(a)?, number(b)?));
        }
        let lower = t.to_ascii_lowercase();
        let digits = lower
            .strip_prefix("sm_")
            .or_else(|| lower.strip_prefix("sm"))
            .ok_or_else(err)?;
        if digits.len() < 2 || digits.len() > 3 {
            return Err(err());
        }
        let (a, b) = digits.split_at(digits.len() - 1);
        Ok(ComputeCapability::new(number(a)?, number(b)?))
    }
}

impl Serialize for ComputeCapability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.sm())
    }
}

impl<'de> Deserialize<'de> for ComputeCapability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Serialise a compute capability in its dotted form (`#[serde(serialize_with = ...)]`), for
/// documents that have always written `"8.9"`.
pub fn serialize_dotted<S: serde::Serializer>(
    cc: &ComputeCapability,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_str(&cc.dotted())
}

/// A dotted numeric version (`10.8.0.43`, `12.8`, `570.124.06`). Compared component-wise as
/// numbers; the text is kept as written (driver versions keep their leading zeros).
#[derive(Debug, Clone, Eq)]
pub struct Version {
    text: String,
    parts: Vec<u64>,
}

impl Version {
    /// The numeric components.
    pub fn parts(&self) -> &[u64] {
        &self.parts
    }

    /// Component `i`, or 0 when absent.
    pub fn part(&self, i: usize) -> u64 {
        self.parts.get(i).copied().unwrap_or(0)
    }

    pub fn major(&self) -> u64 {
        self.part(0)
    }

    pub fn minor(&self) -> u64 {
        self.part(1)
    }

    /// True when `self` and `other` agree on the first `n` components (missing ones are 0).
    pub fn same_prefix(&self, other: &Version, n: usize) -> bool {
        (0..n).all(|i| self.part(i) == other.part(i))
    }

    /// True when `self` (`10`, `10.16`, `10.16.1`) names a prefix of `other` (`10.16.1`): every
    /// component `self` has is `other`'s.
    pub fn is_prefix_of(&self, other: &Version) -> bool {
        self.same_prefix(other, self.parts.len())
    }

    /// `major.minor`, as a version of its own.
    pub fn major_minor(&self) -> Version {
        Version {
            text: format!("{}.{}", self.major(), self.minor()),
            parts: vec![self.major(), self.minor()],
        }
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.parts.len().max(other.parts.len());
        (0..n)
            .map(|i| self.part(i).cmp(&other.part(i)))
            .find(|o| *o != Ordering::Equal)
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl FromStr for Version {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, ParseError> {
        let t = s.trim();
        let parts: Option<Vec<u64>> = t.split('.').map(|p| p.parse().ok()).collect();
        match parts {
            Some(parts) if !parts.is_empty() && parts.len() <= 6 => Ok(Version {
                text: t.to_string(),
                parts,
            }),
            _ => Err(ParseError::new(
                "version",
                s,
                "dotted numbers such as 10.8.0.43",
            )),
        }
    }
}

impl Serialize for Version {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for Version {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The min/opt/max shapes of one input in the engine's (single) optimisation profile.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputProfile {
    pub name: String,
    pub min: Vec<u64>,
    pub opt: Vec<u64>,
    pub max: Vec<u64>,
}

/// What a TensorRT engine is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuMeta {
    /// Compute capability of the target (and of the building GPU).
    pub sm: ComputeCapability,
    /// TensorRT version including the build number, e.g. `10.8.0.43`.
    pub tensorrt: Version,
    /// CUDA version of the TensorRT build, e.g. `12.8`.
    pub cuda: Version,
    /// Lowest driver version the engine's CUDA build runs on, e.g. `570.26`.
    pub driver_floor: Version,
    #[serde(default)]
    pub hardware_compat: HardwareCompat,
    /// Built with `--versionCompatible`: runs on newer TensorRT of the same major (and 8→10,
    /// 10→11), loaded through the lean or dispatch runtime.
    pub version_compatible: bool,
    /// Built with `--excludeLeanRuntime`: the lean runtime must be supplied by the image.
    pub exclude_lean_runtime: bool,
    /// Name of the GPU the engine was built on, as the driver reports it.
    pub builder_gpu: String,
}

/// What a CPU (tract or ONNX Runtime) engine is bound to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuMeta {
    /// Rust target architecture (`x86_64`, `aarch64`).
    pub arch: String,
    /// tract version that wrote the engine (and must read it).
    pub tract: Version,
    /// ONNX Runtime version the engine was measured with; required for an `onnxruntime`
    /// engine, whose runtime loads a library of the same major.minor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub onnxruntime: Option<Version>,
    /// OpenVINO version the engine was measured with; required for an `openvino` engine, whose
    /// runtime loads a library of the same major.minor (the C API's release).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openvino: Option<Version>,
    /// tract engines: the ONNX Runtime version whose constant folding (basic graph
    /// optimisation) rewrote the model before tract loaded it, when tract could not load the
    /// recipe's ONNX as it is. The engine is that folded model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub folded_by: Option<Version>,
    /// ONNX Runtime engines: the intra-op threads of one instance, when the engine stage
    /// measured fewer threads than the instance's share of the CPUs (`share`) to be faster.
    /// A hint (`runtime.toml`'s `[engine.measured]`): the runtime takes it only where an
    /// instance's share is the same, and gives an instance its share otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// The share of the builder's CPUs one instance had where `threads` was measured (the
    /// most threads tried); present with `threads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<u32>,
    /// CPU features the engine requires, sorted (empty: the architecture's baseline).
    pub required_features: Vec<String>,
    /// The instruction set of the CPU the engine was chosen and measured on (its T(b), the
    /// engine `auto` picked, the thread hint). Nothing requires it: a node without it runs the
    /// engine, slower than its profile says, and the runtime warns (`CpuIsa::missing_on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isa: Option<CpuIsa>,
    /// A CPU target of a precision beyond FP32 (`cpu-bf16`, `cpu-int8`): the accuracy gate's
    /// figures of the engine computing in it against the same engine on the FP32 model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateMeta>,
}

/// The accuracy gate of a CPU engine computing in a lower precision than the recipe's FP32
/// model (OpenVINO's BF16 inference precision, or its INT8 kernels on the Q/DQ model
/// infer-build made): what it was compared with, on what, and the figures.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GateMeta {
    /// The precision the engine computed in on the builder: for BF16, as OpenVINO reported it
    /// after compiling; for INT8, the Q/DQ model's.
    pub computed_in: Precision,
    /// The reference: the same engine and model in FP32.
    pub against: String,
    /// What the figures were measured on (`generated inputs, 8 batches of one row`,
    /// `data DIR, 3 batches`).
    pub evaluation: String,
    /// Per output: `max_abs=… max_rel=… [top1=…]`, as [`ConversionMeta::accuracy`].
    pub accuracy: std::collections::BTreeMap<String, String>,
    /// The limits it passed: `max_rel=… min_top1=… [max_abs=…]`.
    pub limits: String,
}

/// The instruction set a CPU engine's speed depends on: the x86-64 microarchitecture level
/// (the psABI's `x86-64-v2`, `-v3`, `-v4`) and the extensions CPU inference engines use for
/// BF16 and INT8 (`avx512-bf16`, `avx512-vnni`, `amx`); elsewhere the architecture alone.
/// Read from the kernel's CPU flags (`/proc/cpuinfo`), where every extension is listed only
/// when the kernel also enables it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuIsa {
    /// Rust target architecture (`x86_64`, `aarch64`).
    pub arch: String,
    /// The x86-64 level, 1 to 4; absent elsewhere or where the flags could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<u8>,
    /// The extensions beyond the level, in [`CpuIsa::EXTENSIONS`]' order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extensions: Vec<String>,
}

impl CpuIsa {
    /// The x86-64 levels: the kernel flags each adds to the one below (psABI 1.0, "Micro
    /// Architecture Levels"; `pni` is SSE3, `abm` brings LZCNT).
    const LEVELS: [&'static [&'static str]; 3] = [
        &[
            "cx16", "lahf_lm", "popcnt", "pni", "ssse3", "sse4_1", "sse4_2",
        ],
        &[
            "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave",
        ],
        &["avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"],
    ];

    /// The extensions recorded, by name, with the kernel flags each needs.
    pub const EXTENSIONS: [(&'static str, &'static [&'static str]); 3] = [
        ("avx512-vnni", &["avx512_vnni"]),
        ("avx512-bf16", &["avx512_bf16"]),
        ("amx", &["amx_tile", "amx_bf16", "amx_int8"]),
    ];

    /// The CPU this process runs on.
    pub fn detect() -> CpuIsa {
        let arch = std::env::consts::ARCH;
        let flags = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|text| {
                text.lines()
                    .find(|l| l.starts_with("flags"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, f)| f.split_whitespace().map(str::to_owned).collect::<Vec<_>>())
            });
        match flags {
            Some(f) => CpuIsa::from_flags(arch, &f),
            None => CpuIsa {
                arch: arch.into(),
                level: None,
                extensions: Vec::new(),
            },
        }
    }

    /// The instruction set of a CPU of architecture `arch` whose kernel flags are `flags`.
    pub fn from_flags<S: AsRef<str>>(arch: &str, flags: &[S]) -> CpuIsa {
        let has = |f: &str| flags.iter().any(|x| x.as_ref() == f);
        if arch != "x86_64" {
            return CpuIsa {
                arch: arch.into(),
                level: None,
                extensions: Vec::new(),
            };
        }
        let level = 1 + CpuIsa::LEVELS
            .iter()
            .take_while(|need| need.iter().all(|f| has(f)))
            .count() as u8;
        CpuIsa {
            arch: arch.into(),
            level: Some(level),
            extensions: CpuIsa::EXTENSIONS
                .iter()
                .filter(|(_, need)| need.iter().all(|f| has(f)))
                .map(|(name, _)| (*name).to_owned())
                .collect(),
        }
    }

    /// `x86-64-v4+avx512-vnni+avx512-bf16`, `aarch64`.
    pub fn name(&self) -> String {
        let mut s = match self.level {
            Some(1) => "x86-64".to_owned(),
            Some(l) => format!("x86-64-v{l}"),
            None => self.arch.clone(),
        };
        for e in &self.extensions {
            s.push('+');
            s.push_str(e);
        }
        s
    }

    /// What this instruction set has that `node`'s lacks: a higher level, extensions; empty
    /// when the node has all of it, or when either could not be read.
    pub fn missing_on(&self, node: &CpuIsa) -> Vec<String> {
        if self.arch != node.arch {
            return vec![self.arch.clone()];
        }
        let mut out = Vec::new();
        if let (Some(want), Some(have)) = (self.level, node.level) {
            if want > have {
                out.push(format!("x86-64-v{want}"));
            }
            out.extend(
                self.extensions
                    .iter()
                    .filter(|e| !node.extensions.contains(e))
                    .cloned(),
            );
        }
        out
    }
}

/// The compatibility tuple of one engine, plus the digests that identify it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineMeta {
    /// Always [`META_SCHEMA`] when written by this version.
    pub schema: u32,
    pub kind: EngineKind,
    pub format: EngineFormat,
    /// Target id from the plan, e.g. `sm89-fp16` or `cpu-fp32`.
    pub target: String,
    pub precision: Precision,
    /// Inputs with their min/opt/max shapes, in the model's input order.
    pub shape_profile: Vec<InputProfile>,
    /// `sha256:<hex>` of the ONNX bytes the engine was built from.
    pub onnx_digest: String,
    /// `sha256:<hex>` of the engine file.
    pub engine_digest: String,
    /// Size of the engine file in bytes.
    pub engine_size: u64,
    /// The engine cache key (hex) this engine was stored under.
    pub cache_key: String,
    /// Version of infer-build that built it.
    pub builder_version: String,
    /// Present for TensorRT engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuMeta>,
    /// Present for tract engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuMeta>,
    /// Present when infer-build converted the model's precision before the build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversion: Option<ConversionMeta>,
}

/// How infer-build converted the recipe's FP32 ONNX before the engine build, and what the
/// converted model kept against it (measured under ONNX Runtime on the CPU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConversionMeta {
    /// `sha256:<hex>` of the converted ONNX the engine was built from (`onnx_digest` is the
    /// recipe's FP32 model).
    pub converted_digest: String,
    /// `onnxconverter-common.float16` or `onnxruntime.quantization`.
    pub tool: String,
    /// Package versions of the converter environment (`onnx`, `onnxruntime`, …).
    pub versions: std::collections::BTreeMap<String, String>,
    /// The conversion cache key.
    pub cache_key: String,
    /// What the conversion did besides the tool's own pass, one line each: for FP16, the
    /// constant folding before it and the nodes kept FP32 with the reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<String>,
    /// What the figures were measured on.
    pub evaluation: String,
    /// Per output: `max_abs=… max_rel=… [top1=…]` against the FP32 model.
    pub accuracy: std::collections::BTreeMap<String, String>,
}

impl EngineMeta {
    /// Parse `meta.json` and check the schema.
    pub fn from_json(bytes: &[u8]) -> Result<EngineMeta, MetaError> {
        let meta: EngineMeta =
            serde_json::from_slice(bytes).map_err(|e| MetaError::Parse(e.to_string()))?;
        meta.validate()?;
        Ok(meta)
    }

    /// Canonical JSON (sorted keys, no insignificant whitespace, trailing newline).
    pub fn to_canonical_json(&self) -> Vec<u8> {
        canonical_json(self)
    }

    /// Structural checks: schema, the kind-specific part present and the other one absent.
    pub fn validate(&self) -> Result<(), MetaError> {
        if self.schema != META_SCHEMA {
            return Err(MetaError::Schema(self.schema));
        }
        let device = match self.kind {
            EngineKind::Tract => self.cpu.is_some() && self.gpu.is_none(),
            EngineKind::Onnxruntime => {
                self.cpu.as_ref().is_some_and(|c| c.onnxruntime.is_some()) && self.gpu.is_none()
            }
            EngineKind::Openvino => {
                self.cpu.as_ref().is_some_and(|c| c.openvino.is_some()) && self.gpu.is_none()
            }
            EngineKind::Tensorrt => self.gpu.is_some() && self.cpu.is_none(),
        };
        let ok = device && backend_kind(self.kind, self.format).is_some();
        if !ok {
            return Err(MetaError::Inconsistent(self.kind));
        }
        for d in [&self.onnx_digest, &self.engine_digest] {
            if !is_sha256_digest(d) {
                return Err(MetaError::Digest(d.clone()));
            }
        }
        Ok(())
    }

    /// The compatibility tuple as flat key/value pairs for image annotations (keys without the
    /// reverse-DNS prefix, sorted): `precision`, `engine.kind`, `engine.format`, `engine.digest`,
    /// `onnx.digest`, `shape_profile`, and `gpu.sm`, `gpu.builder`, `trt.version`, `cuda.version`,
    /// `driver.floor`, `trt.hardware_compat`, `trt.version_compatible`, `trt.lean_excluded` for
    /// TensorRT, or `cpu.arch`, `cpu.features`, `tract.version` (and `onnxruntime.version`,
    /// `openvino.version`, `cpu.isa`, and a gated precision's `gate.*`) for CPU
    /// engines.
    pub fn annotations(&self) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(k.to_string(), v);
        };
        put("precision", self.precision.to_string());
        put("engine.kind", self.kind.to_string());
        put("engine.format", self.format.file_name().to_string());
        put("engine.digest", self.engine_digest.clone());
        put("onnx.digest", self.onnx_digest.clone());
        let profile: Vec<String> = self
            .shape_profile
            .iter()
            .map(|p| {
                let d = |v: &[u64]| v.iter().map(u64::to_string).collect::<Vec<_>>().join("x");
                format!("{}:{}/{}/{}", p.name, d(&p.min), d(&p.opt), d(&p.max))
            })
            .collect();
        put("shape_profile", profile.join(","));
        if let Some(g) = &self.gpu {
            put("gpu.sm", g.sm.sm().to_string());
            put("gpu.builder", g.builder_gpu.clone());
            put("trt.version", g.tensorrt.to_string());
            put("cuda.version", g.cuda.to_string());
            put("driver.floor", g.driver_floor.to_string());
            put(
                "trt.hardware_compat",
                g.hardware_compat.trtexec_value().to_string(),
            );
            put("trt.version_compatible", g.version_compatible.to_string());
            put("trt.lean_excluded", g.exclude_lean_runtime.to_string());
        }
        if let Some(c) = &self.cpu {
            put("cpu.arch", c.arch.clone());
            put("cpu.features", c.required_features.join(","));
            put("tract.version", c.tract.to_string());
            if let Some(v) = &c.onnxruntime {
                put("onnxruntime.version", v.to_string());
            }
            if let Some(v) = &c.openvino {
                put("openvino.version", v.to_string());
            }
            if let Some(t) = c.threads {
                put("onnxruntime.threads", t.to_string());
            }
            if let Some(s) = c.share {
                put("onnxruntime.threads_share", s.to_string());
            }
            if let Some(isa) = &c.isa {
                put("cpu.isa", isa.name());
            }
            if let Some(g) = &c.gate {
                put("gate.computed_in", g.computed_in.to_string());
                put("gate.against", g.against.clone());
                put("gate.evaluation", g.evaluation.clone());
                put("gate.limits", g.limits.clone());
                for (output, figures) in &g.accuracy {
                    put(&format!("gate.accuracy.{output}"), figures.clone());
                }
            }
        }
        if let Some(c) = &self.conversion {
            put("conversion.tool", c.tool.clone());
            put("conversion.digest", c.converted_digest.clone());
            let versions: Vec<String> =
                c.versions.iter().map(|(k, v)| format!("{k}={v}")).collect();
            put("conversion.versions", versions.join(","));
            put("conversion.evaluation", c.evaluation.clone());
            if !c.steps.is_empty() {
                put("conversion.steps", c.steps.join("; "));
            }
            for (output, figures) in &c.accuracy {
                put(&format!("accuracy.{output}"), figures.clone());
            }
        }
        m
    }

    /// One line describing what the engine was built for, used on both sides of a mismatch.
    pub fn describe(&self) -> String {
        match (&self.gpu, &self.cpu) {
            (Some(g), _) => {
                let mut s = format!(
                    "{} with TensorRT {} (CUDA {}, driver >= {}",
                    g.sm.sm(),
                    g.tensorrt,
                    g.cuda,
                    g.driver_floor
                );
                if g.hardware_compat != HardwareCompat::None {
                    s.push_str(&format!(
                        ", hardware compatibility {}",
                        g.hardware_compat.trtexec_value()
                    ));
                }
                if g.version_compatible {
                    s.push_str(", version-compatible");
                }
                s.push(')');
                s
            }
            (None, Some(c)) => {
                let mut s = match (&c.onnxruntime, &c.openvino, self.kind) {
                    (Some(v), _, EngineKind::Onnxruntime) => {
                        format!("{} with ONNX Runtime {v}", c.arch)
                    }
                    (_, Some(v), EngineKind::Openvino) => {
                        format!("{} with OpenVINO {v}", c.arch)
                    }
                    _ => format!("{} with tract {}", c.arch, c.tract),
                };
                if !c.required_features.is_empty() {
                    s.push_str(&format!(
                        " (cpu features {})",
                        c.required_features.join(",")
                    ));
                }
                s
            }
            (None, None) => format!("{} engine", self.kind),
        }
    }
}

fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:").is_some_and(is_sha256_hex)
}

/// True for 64 lowercase hex digits: a sha256 as digests (`sha256:<hex>`), wheels' and
/// libraries' pins write it. The one check, shared with the builder (`oci::digest`).
pub fn is_sha256_hex(hex: &str) -> bool {
    hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// A metadata document that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    #[error("engine metadata is not valid json: {0}")]
    Parse(String),
    #[error(
        "engine metadata schema {0} is not supported (this version reads schema {META_SCHEMA})"
    )]
    Schema(u32),
    #[error("engine metadata of kind {0} lacks its device section or has the other kind's")]
    Inconsistent(EngineKind),
    #[error("engine metadata digest `{0}` is not sha256:<64 lowercase hex>")]
    Digest(String),
}

/// What the runtime found on the node it starts on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Found {
    /// The first visible GPU, if any.
    pub gpu: Option<FoundGpu>,
    /// Version of the TensorRT library that was loaded (`getInferLibVersion`), if any. It
    /// carries major.minor.patch; a build number, when known, is compared too.
    pub tensorrt: Option<Version>,
    /// Version of the ONNX Runtime library that was loaded (`GetVersionString`), if any.
    pub onnxruntime: Option<Version>,
    /// Release of the OpenVINO library that was loaded (`ov_get_openvino_version`), if any.
    pub openvino: Option<Version>,
    /// The CPU.
    pub cpu: FoundCpu,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundGpu {
    pub sm: ComputeCapability,
    pub driver: Version,
    pub name: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FoundCpu {
    /// Rust target architecture (`std::env::consts::ARCH`).
    pub arch: String,
    /// Features detected at run time (lowercase names as `is_x86_feature_detected!` spells them).
    pub features: Vec<String>,
    /// Its instruction set, to compare with what a CPU engine was measured on
    /// ([`CpuMeta::isa`]); `None` when not read.
    pub isa: Option<CpuIsa>,
}

impl Found {
    /// The CPU engine's library that was loaded, as (the engine's name, its version): ONNX
    /// Runtime's or OpenVINO's; `None` for engines without one.
    pub fn library(&self) -> Option<(&'static str, &Version)> {
        use crate::engine::EngineKind;
        let name = |k: EngineKind| k.def().name;
        self.onnxruntime
            .as_ref()
            .map(|v| (name(EngineKind::Onnxruntime), v))
            .or_else(|| {
                self.openvino
                    .as_ref()
                    .map(|v| (name(EngineKind::Openvino), v))
            })
    }
}

impl FoundCpu {
    /// The CPU this process runs on, as far as the standard library and the kernel's CPU
    /// flags can tell.
    pub fn detect() -> FoundCpu {
        FoundCpu {
            arch: std::env::consts::ARCH.to_string(),
            features: detect_cpu_features(),
            isa: Some(CpuIsa::detect()),
        }
    }
}

/// CPU features the builder may record as required, probed with the standard library.
pub fn detect_cpu_features() -> Vec<String> {
    #[allow(
        unused_mut,
        reason = "only x86_64 pushes; on other architectures the list stays empty"
    )]
    let mut v: Vec<String> = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $( if std::is_x86_feature_detected!($f) { v.push($f.to_string()); } )* };
        }
        probe!("sse4.1", "sse4.2", "avx", "avx2", "fma", "f16c", "avx512f");
    }
    #[cfg(target_arch = "aarch64")]
    {
        macro_rules! probe {
            ($($f:tt),*) => { $( if std::arch::is_aarch64_feature_detected!($f) { v.push($f.to_string()); } )* };
        }
        probe!("neon", "fp16", "dotprod");
    }
    v.sort();
    v
}

impl fmt::Display for Found {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.gpu {
            Some(g) => {
                write!(f, "{} ({}) with ", g.sm.sm(), g.name)?;
                match &self.tensorrt {
                    Some(t) => write!(f, "TensorRT {t}")?,
                    None => f.write_str("no TensorRT library")?,
                }
                write!(f, " and driver {}", g.driver)
            }
            None => {
                write!(f, "no GPU, cpu {}", self.cpu.arch)?;
                if !self.cpu.features.is_empty() {
                    write!(f, " (features {})", self.cpu.features.join(","))?;
                }
                match (&self.onnxruntime, &self.openvino) {
                    (Some(v), _) => write!(f, " with ONNX Runtime {v}"),
                    (None, Some(v)) => write!(f, " with OpenVINO {v}"),
                    (None, None) => Ok(()),
                }
            }
        }
    }
}

/// The engine cannot run on this node. The message names what the engine was built for, what
/// the node has, and which part differs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("engine for target {target} was built for {built}, this node has {found}: {reason}")]
pub struct Mismatch {
    pub target: String,
    pub built: String,
    pub found: String,
    pub reason: MismatchReason,
}

/// Which part of the tuple differs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MismatchReason {
    #[error("the metadata is unusable ({0})")]
    Meta(MetaError),
    #[error("no GPU is visible")]
    NoGpu,
    #[error("compute capability differs ({} != {}) and the engine has no hardware compatibility level", built.sm(), found.sm())]
    ComputeCapability {
        built: ComputeCapability,
        found: ComputeCapability,
    },
    #[error("compute capability {} is below {}, the minimum of hardware compatibility level ampere+", found.sm(), min.sm())]
    BelowAmpere {
        found: ComputeCapability,
        min: ComputeCapability,
    },
    #[error("driver {found} is older than the engine's floor {floor}")]
    Driver { found: Version, floor: Version },
    #[error("no TensorRT library was loaded")]
    NoTensorrt,
    #[error("TensorRT {found} differs from {built} and the engine is not version-compatible")]
    TensorrtExact { built: Version, found: Version },
    #[error("TensorRT {found} cannot run a version-compatible engine from TensorRT {built}")]
    TensorrtVersionCompat { built: Version, found: Version },
    #[error("TensorRT {found} is not the lean runtime of TensorRT {built}, which a version-compatible engine built without its lean runtime (--excludeLeanRuntime) needs exactly")]
    TensorrtLeanExact { built: Version, found: Version },
    #[error("cpu architecture {found} differs from {built}")]
    Arch { built: String, found: String },
    #[error("cpu lacks required features {0}")]
    CpuFeatures(String),
    #[error("no ONNX Runtime library was loaded")]
    NoOnnxruntime,
    #[error("ONNX Runtime {found} differs from {built} in major.minor")]
    OnnxruntimeVersion { built: Version, found: Version },
    #[error("no OpenVINO library was loaded")]
    NoOpenvino,
    #[error("OpenVINO {found} differs from {built} in major.minor")]
    OpenvinoVersion { built: Version, found: Version },
}

/// How an `infer-serve` built with TensorRT names, inside its binary, the release of the
/// TensorRT headers its backend was compiled against: this prefix, the release (`10.16.0`),
/// then `;`. `infer-build build` reads it to refuse, before an image is written, a GPU runtime
/// without the TensorRT backend or one whose TensorRT major differs from the target's (the
/// runtime would refuse the library at start: virtual-table layouts differ between majors).
pub const TENSORRT_HEADERS_MARKER: &str = "infer-serve/tensorrt-headers=";

/// The TensorRT headers release named by [`TENSORRT_HEADERS_MARKER`] in `binary`, if any.
pub fn tensorrt_headers_in(binary: &[u8]) -> Option<Version> {
    let m = TENSORRT_HEADERS_MARKER.as_bytes();
    let mut from = 0;
    while let Some(at) = binary.get(from..)?.windows(m.len()).position(|w| w == m) {
        let rest = &binary[from + at + m.len()..];
        let end = rest.iter().take(32).position(|&b| b == b';');
        if let Some(v) = end
            .and_then(|e| std::str::from_utf8(&rest[..e]).ok())
            .and_then(|t| t.parse().ok())
        {
            return Some(v);
        }
        from += at + 1;
    }
    None
}

/// Check that the engine described by `meta` can run on what the runtime `found`.
///
/// Rules:
/// - TensorRT engines need a GPU. Its compute capability must equal the engine's unless the
///   engine was built with `ampere+` (then anything ≥ 8.0 runs it). The driver must be at or
///   above the engine's floor. The loaded TensorRT must equal the build version (major, minor,
///   patch, and build when both sides know it), or, for a version-compatible engine, be the same
///   or a newer release of the same major, or one of the supported cross-major paths 8→10 and
///   10→11.
/// - CPU engines need the same CPU architecture and every recorded CPU feature.
/// - ONNX Runtime engines also need a loaded ONNX Runtime of the engine's major.minor (patch
///   releases fix bugs without changing operators or optimisations; a new minor can change
///   both, and with them the outputs and the measured T(b)).
#[allow(
    clippy::result_large_err,
    reason = "called once at start-up: the size of the error does not matter, its content does"
)]
pub fn check_compat(meta: &EngineMeta, found: &Found) -> Result<(), Mismatch> {
    let fail = |reason| Mismatch {
        target: meta.target.clone(),
        built: meta.describe(),
        found: found.to_string(),
        reason,
    };
    meta.validate().map_err(|e| fail(MismatchReason::Meta(e)))?;
    if let Some(g) = &meta.gpu {
        let node = found
            .gpu
            .as_ref()
            .ok_or_else(|| fail(MismatchReason::NoGpu))?;
        match g.hardware_compat {
            HardwareCompat::AmperePlus => {
                let min = ComputeCapability::new(8, 0);
                if node.sm < min {
                    return Err(fail(MismatchReason::BelowAmpere {
                        found: node.sm,
                        min,
                    }));
                }
            }
            HardwareCompat::None | HardwareCompat::SameComputeCapability => {
                if node.sm != g.sm {
                    return Err(fail(MismatchReason::ComputeCapability {
                        built: g.sm,
                        found: node.sm,
                    }));
                }
            }
        }
        if node.driver < g.driver_floor {
            return Err(fail(MismatchReason::Driver {
                found: node.driver.clone(),
                floor: g.driver_floor.clone(),
            }));
        }
        let trt = found
            .tensorrt
            .as_ref()
            .ok_or_else(|| fail(MismatchReason::NoTensorrt))?;
        if g.version_compatible && g.exclude_lean_runtime {
            // Such a plan carries no lean runtime of its own: it runs only on the lean runtime
            // of exactly the release that built it (NVIDIA's version-compatibility rules), which
            // the image ships beside it. A newer library or a major hop is refused.
            if !same_release(&g.tensorrt, trt) {
                return Err(fail(MismatchReason::TensorrtLeanExact {
                    built: g.tensorrt.clone(),
                    found: trt.clone(),
                }));
            }
        } else if g.version_compatible {
            if !version_compatible_runs(&g.tensorrt, trt) {
                return Err(fail(MismatchReason::TensorrtVersionCompat {
                    built: g.tensorrt.clone(),
                    found: trt.clone(),
                }));
            }
        } else if !same_release(&g.tensorrt, trt) {
            return Err(fail(MismatchReason::TensorrtExact {
                built: g.tensorrt.clone(),
                found: trt.clone(),
            }));
        }
    }
    if let Some(c) = &meta.cpu {
        if c.arch != found.cpu.arch {
            return Err(fail(MismatchReason::Arch {
                built: c.arch.clone(),
                found: found.cpu.arch.clone(),
            }));
        }
        let missing: Vec<&str> = c
            .required_features
            .iter()
            .filter(|f| !found.cpu.features.contains(f))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(fail(MismatchReason::CpuFeatures(missing.join(","))));
        }
        if meta.kind == EngineKind::Onnxruntime {
            // `validate` made sure the version is recorded.
            if let Some(built) = &c.onnxruntime {
                let found = found
                    .onnxruntime
                    .as_ref()
                    .ok_or_else(|| fail(MismatchReason::NoOnnxruntime))?;
                if !built.same_prefix(found, 2) {
                    return Err(fail(MismatchReason::OnnxruntimeVersion {
                        built: built.clone(),
                        found: found.clone(),
                    }));
                }
            }
        }
        if meta.kind == EngineKind::Openvino {
            // `validate` made sure the version is recorded.
            if let Some(built) = &c.openvino {
                let found = found
                    .openvino
                    .as_ref()
                    .ok_or_else(|| fail(MismatchReason::NoOpenvino))?;
                if !built.same_prefix(found, 2) {
                    return Err(fail(MismatchReason::OpenvinoVersion {
                        built: built.clone(),
                        found: found.clone(),
                    }));
                }
            }
        }
    }
    Ok(())
}

/// Whether `found` is the release `built`: as many components as both sides carry are equal,
/// at least major.minor.patch (the library reports major.minor.patch and, from TensorRT 10, the
/// build; the plan records the build too).
fn same_release(built: &Version, found: &Version) -> bool {
    let n = built.parts().len().min(found.parts().len()).max(3);
    built.same_prefix(found, n)
}

/// Whether a version-compatible plan built with TensorRT `built` loads on `found`.
fn version_compatible_runs(built: &Version, found: &Version) -> bool {
    match (built.major(), found.major()) {
        (b, f) if b == f => {
            // Compare the components both sides carry: the runtime library reports
            // major.minor.patch, the plan also has the build number.
            let n = built.parts().len().min(found.parts().len()).max(3);
            let cut = |v: &Version| (0..n).map(|i| v.part(i)).collect::<Vec<u64>>();
            cut(found) >= cut(built)
        }
        (8, 10) | (10, 11) => true,
        _ => false,
    }
}

/// Measured compute time for one batch size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchTiming {
    pub batch: u32,
    /// Median compute time of one batch, in microseconds.
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// Number of timed runs the median is taken over.
    pub runs: u32,
    /// The slowest layers (TensorRT `--exportProfile`), largest share first; empty for tract.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerTiming>,
}

/// Time spent in one engine layer, from a per-layer profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerTiming {
    pub name: String,
    /// Average time per run, in microseconds.
    pub average_us: f64,
    /// Share of the total engine time, in percent.
    pub percent: f64,
}

/// How an engine's start-up form was chosen (tract): the time to get a runnable model from
/// each candidate form, median of several loads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupMeasurement {
    pub onnx_ms: f64,
    /// Absent when the model could not be written as NNEF.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nnef_ms: Option<f64>,
    pub chosen: EngineFormat,
    pub runs: u32,
    /// Why NNEF was not used, when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The engine profile: compute time T(b) for every planned batch size, measured on the builder.
/// Stored next to the engine as `profile.json` (canonical JSON); read by the runtime, the deploy
/// generator and the batching report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineProfile {
    pub schema: u32,
    pub target: String,
    pub kind: EngineKind,
    /// `sha256:<hex>` of the engine file the numbers belong to.
    pub engine_digest: String,
    /// Where the numbers come from.
    pub source: TimedBy,
    /// The machine that measured: GPU name, or CPU architecture and thread count.
    pub measured_on: String,
    /// Sorted by batch size, one entry per planned batch size.
    pub batches: Vec<BatchTiming>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup: Option<StartupMeasurement>,
    /// How a CPU engine was chosen between tract and ONNX Runtime (`engine.cpu`), when
    /// ONNX Runtime was a candidate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selection: Option<EngineSelection>,
}

/// The measured choice of a CPU engine: each candidate's start-up and T(b) at the same batch
/// sizes and the thread count the runtime will use, whether the outputs agreed, and the rule
/// that decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSelection {
    /// `engine.cpu` of the recipe.
    pub policy: CpuEngine,
    pub chosen: EngineKind,
    /// Why, in words (the rule and the figures it compared).
    pub reason: String,
    pub candidates: Vec<CandidateMeasurement>,
    /// The outputs of both engines on the same inputs, when both loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agreement: Option<Agreement>,
}

/// One engine's measurement, or why it could not be measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CandidateMeasurement {
    pub kind: EngineKind,
    pub version: String,
    /// Intra-op threads of one instance (tract: 1).
    pub threads: u32,
    /// Bytes to a runnable model, median of several loads (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub batches: Vec<BatchTiming>,
    /// Why the engine did not load or run the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// How close two engines' outputs were on the same inputs: agreed when every element
/// satisfies `|a - b| <= atol + rtol * |b|`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Agreement {
    pub atol: f64,
    pub rtol: f64,
    pub max_abs: f64,
    pub max_rel: f64,
    pub agreed: bool,
    /// The inputs compared, in words (batch size and shapes).
    pub inputs: String,
}

impl EngineProfile {
    pub fn from_json(bytes: &[u8]) -> Result<EngineProfile, MetaError> {
        let p: EngineProfile =
            serde_json::from_slice(bytes).map_err(|e| MetaError::Parse(e.to_string()))?;
        if p.schema != META_SCHEMA {
            return Err(MetaError::Schema(p.schema));
        }
        Ok(p)
    }

    pub fn to_canonical_json(&self) -> Vec<u8> {
        canonical_json(self)
    }

    /// T(b) for a planned batch size.
    pub fn compute_us(&self, batch: u32) -> Option<f64> {
        self.batches
            .iter()
            .find(|t| t.batch == batch)
            .map(|t| t.median_us)
    }
}

/// Serialise `value` as canonical JSON: object keys sorted by their bytes, no whitespace, a
/// trailing newline. Independent of serde_json's `preserve_order` feature.
pub fn canonical_json<T: Serialize>(value: &T) -> Vec<u8> {
    // Serialising plain data types to a `Value` cannot fail (no maps with non-string keys here).
    let v = serde_json::to_value(value).unwrap_or(serde_json::Value::Null);
    let mut out = Vec::new();
    write_canonical(&v, &mut out);
    out.push(b'\n');
    out
}

/// Append `v` to `out` as canonical JSON (keys sorted by their bytes, no whitespace, strings
/// escaped as serde_json escapes them), without a trailing newline: the one canonical writer
/// of the workspace (the builder's OCI documents go through it too).
pub fn write_canonical(v: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push(b'{');
            for (i, (k, val)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(Value::String(k.clone()).to_string().as_bytes());
                out.push(b':');
                write_canonical(val, out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        other => out.extend_from_slice(other.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_kind_is_timed_by_its_own_backend_in_the_profile_spelling() {
        for (kind, wire) in [
            (EngineKind::Tract, "\"tract\""),
            (EngineKind::Onnxruntime, "\"onnxruntime\""),
            (EngineKind::Tensorrt, "\"trtexec\""),
        ] {
            let by = TimedBy::of(kind);
            assert_eq!(serde_json::to_string(&by).unwrap(), wire);
            assert_eq!(format!("\"{by}\""), wire);
        }
    }

    #[test]
    fn tensorrt_headers_marker_is_found_in_a_binary() {
        let mut bin = b"\x7fELF....".to_vec();
        // A prefix without a release first, as a binary may hold the bare prefix too.
        bin.extend_from_slice(TENSORRT_HEADERS_MARKER.as_bytes());
        bin.extend_from_slice(b"\0\0");
        bin.extend_from_slice(TENSORRT_HEADERS_MARKER.as_bytes());
        bin.extend_from_slice(b"10.16.0;\0more");
        assert_eq!(
            tensorrt_headers_in(&bin).map(|v| v.to_string()),
            Some("10.16.0".into())
        );
        assert_eq!(tensorrt_headers_in(b"\x7fELF no marker"), None);
        let unterminated = format!("{TENSORRT_HEADERS_MARKER}10.16.0");
        assert_eq!(tensorrt_headers_in(unterminated.as_bytes()), None);
        assert_eq!(tensorrt_headers_in(b""), None);
    }

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn v(s: &str) -> Version {
        s.parse().unwrap()
    }

    fn trt_meta(sm: ComputeCapability, trt: &str, hw: HardwareCompat, vc: bool) -> EngineMeta {
        EngineMeta {
            schema: META_SCHEMA,
            kind: EngineKind::Tensorrt,
            format: EngineFormat::TensorrtPlan,
            target: format!("{}-fp16", sm.target_id()),
            precision: Precision::Fp16,
            shape_profile: vec![InputProfile {
                name: "input".into(),
                min: vec![1, 64],
                opt: vec![16, 64],
                max: vec![32, 64],
            }],
            onnx_digest: D1.into(),
            engine_digest: D2.into(),
            engine_size: 123,
            cache_key: "k".into(),
            builder_version: "0.1.0".into(),
            gpu: Some(GpuMeta {
                sm,
                tensorrt: v(trt),
                cuda: v("12.8"),
                driver_floor: v("570.26"),
                hardware_compat: hw,
                version_compatible: vc,
                exclude_lean_runtime: false,
                builder_gpu: "NVIDIA L4".into(),
            }),
            cpu: None,
            conversion: None,
        }
    }

    #[test]
    fn conversion_goes_into_annotations_and_round_trips() {
        let mut m = trt_meta(
            ComputeCapability::new(8, 9),
            "11.4.0.106",
            HardwareCompat::None,
            false,
        );
        m.conversion = Some(ConversionMeta {
            converted_digest: D2.into(),
            tool: "onnxruntime.quantization.quantize_static".into(),
            versions: [("onnxruntime".to_string(), "1.32.0".to_string())].into(),
            cache_key: "c".into(),
            steps: vec!["folded first by onnxruntime 1.32.0 basic optimisation".into()],
            evaluation: "evaluation data, 16 batches".into(),
            accuracy: [(
                "prob".to_string(),
                "max_abs=1e-2 max_rel=1e-2 top1=1.0000".to_string(),
            )]
            .into(),
        });
        let a = m.annotations();
        assert_eq!(a["accuracy.prob"], "max_abs=1e-2 max_rel=1e-2 top1=1.0000");
        assert_eq!(a["conversion.versions"], "onnxruntime=1.32.0");
        assert_eq!(a["conversion.digest"], D2);
        assert_eq!(
            a["conversion.steps"],
            "folded first by onnxruntime 1.32.0 basic optimisation"
        );
        let back = EngineMeta::from_json(&m.to_canonical_json()).unwrap();
        assert_eq!(back, m);
        // Without a conversion, the JSON has no `conversion` key (older readers accept it).
        let plain = trt_meta(
            ComputeCapability::new(8, 9),
            "11.4.0.106",
            HardwareCompat::None,
            false,
        );
        assert!(!String::from_utf8(plain.to_canonical_json())
            .unwrap()
            .contains("conversion"));
    }

    fn cpu_meta(features: &[&str]) -> EngineMeta {
        EngineMeta {
            schema: META_SCHEMA,
            kind: EngineKind::Tract,
            format: EngineFormat::TractNnefTar,
            target: "cpu-fp32".into(),
            precision: Precision::Fp32,
            shape_profile: vec![],
            onnx_digest: D1.into(),
            engine_digest: D2.into(),
            engine_size: 1,
            cache_key: "k".into(),
            builder_version: "0.1.0".into(),
            gpu: None,
            cpu: Some(CpuMeta {
                arch: "x86_64".into(),
                tract: v("0.23.9"),
                onnxruntime: None,
                openvino: None,
                folded_by: None,
                threads: None,
                share: None,
                required_features: features.iter().map(|s| s.to_string()).collect(),
                isa: None,
                gate: None,
            }),
            conversion: None,
        }
    }

    fn gpu(sm: ComputeCapability, driver: &str, trt: Option<&str>) -> Found {
        Found {
            gpu: Some(FoundGpu {
                sm,
                driver: v(driver),
                name: "NVIDIA A100-SXM4-40GB".into(),
            }),
            tensorrt: trt.map(v),
            onnxruntime: None,
            openvino: None,
            cpu: FoundCpu {
                arch: "x86_64".into(),
                features: vec![],
                isa: None,
            },
        }
    }

    /// `None` expected means compatible; otherwise the full error message.
    fn check(meta: &EngineMeta, found: &Found, expected: Option<&str>) {
        let got = check_compat(meta, found).err().map(|e| e.to_string());
        assert_eq!(got.as_deref(), expected, "meta {meta:?}\nfound {found:?}");
    }

    #[test]
    fn gpu_rules() {
        let sm89 = ComputeCapability::new(8, 9);
        let sm80 = ComputeCapability::new(8, 0);
        let exact = trt_meta(sm89, "10.8.0.43", HardwareCompat::None, false);
        check(&exact, &gpu(sm89, "580.95.05", Some("10.8.0")), None);
        check(&exact, &gpu(sm89, "580.95.05", Some("10.8.0.43")), None);
        check(
            &exact,
            &gpu(sm80, "580.95.05", Some("10.8.0")),
            Some("engine for target sm89-fp16 was built for sm_89 with TensorRT 10.8.0.43 (CUDA 12.8, driver >= 570.26), this node has sm_80 (NVIDIA A100-SXM4-40GB) with TensorRT 10.8.0 and driver 580.95.05: compute capability differs (sm_89 != sm_80) and the engine has no hardware compatibility level"),
        );
        check(
            &exact,
            &gpu(sm89, "570.25", Some("10.8.0")),
            Some("engine for target sm89-fp16 was built for sm_89 with TensorRT 10.8.0.43 (CUDA 12.8, driver >= 570.26), this node has sm_89 (NVIDIA A100-SXM4-40GB) with TensorRT 10.8.0 and driver 570.25: driver 570.25 is older than the engine's floor 570.26"),
        );
        let e = check_compat(&exact, &gpu(sm89, "580", Some("10.9.0"))).unwrap_err();
        assert!(
            matches!(e.reason, MismatchReason::TensorrtExact { .. }),
            "{e}"
        );
        let e = check_compat(&exact, &gpu(sm89, "580", Some("10.8.0.44"))).unwrap_err();
        assert!(
            matches!(e.reason, MismatchReason::TensorrtExact { .. }),
            "{e}"
        );
        let e = check_compat(&exact, &gpu(sm89, "580", None)).unwrap_err();
        assert_eq!(e.reason, MismatchReason::NoTensorrt);
        let mut no_gpu = gpu(sm89, "580", None);
        no_gpu.gpu = None;
        let e = check_compat(&exact, &no_gpu).unwrap_err();
        assert_eq!(e.reason, MismatchReason::NoGpu);
        assert!(
            e.to_string().contains("this node has no GPU, cpu x86_64"),
            "{e}"
        );

        let ampere = trt_meta(sm80, "10.8.0.43", HardwareCompat::AmperePlus, false);
        check(
            &ampere,
            &gpu(ComputeCapability::new(9, 0), "580", Some("10.8.0")),
            None,
        );
        check(
            &ampere,
            &gpu(ComputeCapability::new(8, 6), "580", Some("10.8.0")),
            None,
        );
        let e = check_compat(
            &ampere,
            &gpu(ComputeCapability::new(7, 5), "580", Some("10.8.0")),
        )
        .unwrap_err();
        assert!(
            matches!(e.reason, MismatchReason::BelowAmpere { .. }),
            "{e}"
        );
        assert!(
            e.to_string().contains("hardware compatibility ampere+"),
            "{e}"
        );

        let same_cc = trt_meta(
            sm89,
            "10.9.0.34",
            HardwareCompat::SameComputeCapability,
            false,
        );
        check(&same_cc, &gpu(sm89, "580", Some("10.9.0")), None);
        assert!(check_compat(
            &same_cc,
            &gpu(ComputeCapability::new(8, 6), "580", Some("10.9.0"))
        )
        .is_err());
    }

    #[test]
    fn version_compatible_rules() {
        let sm = ComputeCapability::new(9, 0);
        let vc = trt_meta(sm, "10.8.0.43", HardwareCompat::None, true);
        for ok in ["10.8.0", "10.16.1", "11.0.0", "11.4.0.106"] {
            check(&vc, &gpu(sm, "580", Some(ok)), None);
        }
        for bad in ["10.7.0", "9.0.0", "12.0.0"] {
            let e = check_compat(&vc, &gpu(sm, "580", Some(bad))).unwrap_err();
            assert!(
                matches!(e.reason, MismatchReason::TensorrtVersionCompat { .. }),
                "{bad}: {e}"
            );
        }
        let vc86 = trt_meta(sm, "8.6.1.6", HardwareCompat::None, true);
        check(&vc86, &gpu(sm, "580", Some("10.0.1")), None);
        assert!(check_compat(&vc86, &gpu(sm, "580", Some("11.0.0"))).is_err());
    }

    #[test]
    fn a_plan_without_its_lean_runtime_needs_exactly_its_release() {
        // What `infer-build` builds by default: version-compatible, lean runtime excluded, the
        // lean library of the same release shipped beside it.
        let sm = ComputeCapability::new(9, 0);
        let mut m = trt_meta(sm, "10.16.1.11", HardwareCompat::None, true);
        m.gpu.as_mut().unwrap().exclude_lean_runtime = true;
        for ok in ["10.16.1", "10.16.1.11"] {
            check(&m, &gpu(sm, "580", Some(ok)), None);
        }
        for bad in ["10.16.2", "10.16.1.12", "10.17.0", "10.8.0", "11.0.0"] {
            let e = check_compat(&m, &gpu(sm, "580", Some(bad))).unwrap_err();
            assert!(
                matches!(e.reason, MismatchReason::TensorrtLeanExact { .. }),
                "{bad}: {e}"
            );
            assert!(e.to_string().contains("--excludeLeanRuntime"), "{e}");
        }
    }

    #[test]
    fn cpu_rules() {
        let m = cpu_meta(&["avx2", "fma"]);
        let mut f = Found {
            cpu: FoundCpu {
                arch: "x86_64".into(),
                features: vec!["avx".into(), "avx2".into(), "fma".into()],
                isa: None,
            },
            ..Found::default()
        };
        check(&m, &f, None);
        f.cpu.features = vec!["avx".into()];
        check(
            &m,
            &f,
            Some("engine for target cpu-fp32 was built for x86_64 with tract 0.23.9 (cpu features avx2,fma), this node has no GPU, cpu x86_64 (features avx): cpu lacks required features avx2,fma"),
        );
        f.cpu.arch = "aarch64".into();
        let e = check_compat(&m, &f).unwrap_err();
        assert!(matches!(e.reason, MismatchReason::Arch { .. }));
        // The runtime's own CPU passes a baseline engine.
        let f = Found {
            cpu: FoundCpu::detect(),
            ..Found::default()
        };
        let mut m = cpu_meta(&[]);
        m.cpu.as_mut().unwrap().arch = std::env::consts::ARCH.into();
        check(&m, &f, None);
    }

    #[test]
    fn onnxruntime_rules() {
        let mut m = cpu_meta(&[]);
        m.kind = EngineKind::Onnxruntime;
        m.format = EngineFormat::Onnx;
        m.cpu.as_mut().unwrap().onnxruntime = Some(v("1.31.0"));
        assert_eq!(
            backend_kind(m.kind, m.format),
            Some(crate::runtime::BackendKind::OnnxRuntime)
        );
        let mut f = Found {
            cpu: FoundCpu {
                arch: "x86_64".into(),
                features: vec![],
                isa: None,
            },
            onnxruntime: Some(v("1.31.2")),
            openvino: None,
            ..Found::default()
        };
        check(&m, &f, None);
        assert_eq!(m.describe(), "x86_64 with ONNX Runtime 1.31.0");
        assert_eq!(m.annotations()["onnxruntime.version"], "1.31.0");
        f.onnxruntime = Some(v("1.32.0"));
        check(
            &m,
            &f,
            Some("engine for target cpu-fp32 was built for x86_64 with ONNX Runtime 1.31.0, this node has no GPU, cpu x86_64 with ONNX Runtime 1.32.0: ONNX Runtime 1.32.0 differs from 1.31.0 in major.minor"),
        );
        f.onnxruntime = None;
        let e = check_compat(&m, &f).unwrap_err();
        assert_eq!(e.reason, MismatchReason::NoOnnxruntime);
        // The JSON round-trips; a tract engine's JSON does not mention ONNX Runtime.
        let back = EngineMeta::from_json(&m.to_canonical_json()).unwrap();
        assert_eq!(back, m);
        assert!(!String::from_utf8(cpu_meta(&[]).to_canonical_json())
            .unwrap()
            .contains("onnxruntime"));
        // Inconsistent documents: no version recorded, or a format ONNX Runtime does not run.
        let mut bad = m.clone();
        bad.cpu.as_mut().unwrap().onnxruntime = None;
        assert_eq!(
            bad.validate(),
            Err(MetaError::Inconsistent(EngineKind::Onnxruntime))
        );
        let mut bad = m.clone();
        bad.format = EngineFormat::TractNnefTar;
        assert!(bad.validate().is_err());
        assert_eq!(backend_kind(EngineKind::Tensorrt, EngineFormat::Onnx), None);
        assert_eq!(
            backend_kind(EngineKind::Tract, EngineFormat::TractNnefTar),
            Some(crate::runtime::BackendKind::TractNnef)
        );
    }

    #[test]
    fn tampered_metadata_is_refused() {
        let mut m = cpu_meta(&[]);
        m.schema = 99;
        let e = check_compat(&m, &Found::default()).unwrap_err();
        assert!(matches!(
            e.reason,
            MismatchReason::Meta(MetaError::Schema(99))
        ));
        let mut m = cpu_meta(&[]);
        m.gpu = trt_meta(
            ComputeCapability::new(8, 9),
            "10.8.0.43",
            HardwareCompat::None,
            false,
        )
        .gpu;
        assert!(m.validate().is_err());
        let mut m = cpu_meta(&[]);
        m.engine_digest = "sha256:XYZ".into();
        assert!(matches!(m.validate(), Err(MetaError::Digest(_))));
    }

    #[test]
    fn parse_values() {
        let cases = [
            ("sm_89", (8, 9)),
            ("sm90", (9, 0)),
            ("SM_100", (10, 0)),
            ("sm_120", (12, 0)),
            ("12.0", (12, 0)),
            (" 8.6 ", (8, 6)),
        ];
        for (s, (a, b)) in cases {
            assert_eq!(
                s.parse::<ComputeCapability>(),
                Ok(ComputeCapability::new(a, b)),
                "{s}"
            );
        }
        for bad in [
            "", "sm_", "sm_8", "8", "gpu", "sm_8x", "8.x", "sm_1000", ".9", "8.",
        ] {
            assert!(bad.parse::<ComputeCapability>().is_err(), "{bad}");
        }
        assert_eq!(ComputeCapability::new(12, 0).sm().to_string(), "sm_120");
        assert_eq!(ComputeCapability::new(12, 0).dotted().to_string(), "12.0");
        assert_eq!(
            ComputeCapability::new(12, 0).target_id().to_string(),
            "sm120"
        );
        assert!(v("570.124.06") > v("570.86.10"));
        assert!(v("10.16.1") > v("10.8.0.43"));
        assert_eq!(v("12.8"), v("12.8.0"));
        assert_eq!(v("570.124.06").to_string(), "570.124.06");
        for bad in ["", "1..2", "a.b", "1.2.3.4.5.6.7"] {
            assert!(bad.parse::<Version>().is_err(), "{bad}");
        }
    }

    #[test]
    fn json_round_trip_is_canonical() {
        let m = trt_meta(
            ComputeCapability::new(8, 9),
            "10.8.0.43",
            HardwareCompat::AmperePlus,
            true,
        );
        let bytes = m.to_canonical_json();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.starts_with(
                "{\"builder_version\":\"0.1.0\",\"cache_key\":\"k\",\"engine_digest\""
            ),
            "{text}"
        );
        assert!(text.contains("\"sm\":\"sm_89\""), "{text}");
        assert!(
            text.contains("\"hardware_compat\":\"ampere-plus\""),
            "{text}"
        );
        let a = m.annotations();
        assert_eq!(a["gpu.sm"], "sm_89");
        assert_eq!(a["trt.version"], "10.8.0.43");
        assert_eq!(a["trt.hardware_compat"], "ampere+");
        assert_eq!(a["shape_profile"], "input:1x64/16x64/32x64");
        assert!(!a.contains_key("cpu.arch"));
        let back = EngineMeta::from_json(&bytes).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.to_canonical_json(), bytes);
        assert!(EngineMeta::from_json(b"{\"schema\":1}").is_err());
        let unknown = text.replacen("{", "{\"extra\":1,", 1);
        assert!(EngineMeta::from_json(unknown.as_bytes()).is_err());
    }

    #[test]
    fn cpu_isa_levels_and_extensions_from_kernel_flags() {
        let v2 = "fpu cx16 lahf_lm popcnt pni ssse3 sse4_1 sse4_2";
        let v3 = format!("{v2} avx avx2 bmi1 bmi2 f16c fma abm movbe xsave");
        let v4 = format!("{v3} avx512f avx512bw avx512cd avx512dq avx512vl");
        let flags = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let isa = |s: &str| CpuIsa::from_flags("x86_64", &flags(s));
        assert_eq!(isa("fpu sse sse2").name(), "x86-64");
        assert_eq!(isa(v2).name(), "x86-64-v2");
        assert_eq!(isa(&v3).name(), "x86-64-v3");
        // A level needs every flag of the levels below: AVX-512 without v3's is v2.
        assert_eq!(
            isa(&format!("{v2} avx512f avx512bw avx512cd avx512dq avx512vl")).name(),
            "x86-64-v2"
        );
        // This project's test machines (AMD EPYC, Zen 4) and a Sapphire Rapids Xeon.
        let zen4 = isa(&format!("{v4} avx512_vnni avx512_bf16"));
        assert_eq!(zen4.name(), "x86-64-v4+avx512-vnni+avx512-bf16");
        let spr = isa(&format!(
            "{v4} avx512_vnni avx512_bf16 amx_tile amx_bf16 amx_int8"
        ));
        assert_eq!(spr.name(), "x86-64-v4+avx512-vnni+avx512-bf16+amx");
        // amx needs all three flags.
        assert_eq!(
            isa(&format!("{v4} amx_tile")).extensions,
            Vec::<String>::new()
        );
        // Measured on the Xeon, run on Zen 4: AMX is missing; the other way round nothing is.
        assert_eq!(spr.missing_on(&zen4), ["amx"]);
        assert!(zen4.missing_on(&spr).is_empty());
        assert_eq!(
            zen4.missing_on(&isa(&v3)),
            ["x86-64-v4", "avx512-vnni", "avx512-bf16"]
        );
        // Unknown flags on either side, or another architecture: nothing to compare by level.
        let unknown = CpuIsa {
            arch: "x86_64".into(),
            level: None,
            extensions: vec![],
        };
        assert!(spr.missing_on(&unknown).is_empty());
        let arm = CpuIsa::from_flags("aarch64", &flags("fp asimd"));
        assert_eq!(arm.name(), "aarch64");
        assert_eq!(zen4.missing_on(&arm), ["x86_64"]);
        // What the metadata stores reads back.
        let json = serde_json::to_string(&spr).unwrap();
        assert_eq!(serde_json::from_str::<CpuIsa>(&json).unwrap(), spr);
        assert_eq!(CpuIsa::detect().arch, std::env::consts::ARCH);
    }
}
