//! The build plan: what every later stage (engine build, image assembly, registry, deploy)
//! consumes. One [`TargetPlan`] per image. Plain data, serialized in field order (no maps), so
//! `infer-build plan --json` is deterministic.

use std::path::PathBuf;

use crate::oci::Digest;
use serde::{Deserialize, Serialize};

use crate::matrix::{
    ComputeCapability, CudnnNeed, HardwareCompat, Platform, Precision, PrecisionApi, Version,
};

/// The resolved plan of one recipe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuildPlan {
    /// The recipe's path as given.
    pub recipe: PathBuf,
    /// The model's name (`[model] name`).
    pub model: String,
    /// The model's version (`[model] version`).
    pub version: String,
    /// Image repository every target is tagged in.
    pub repository: String,
    /// Where the compatibility data came from: `embedded` or the `--matrix` directory.
    pub matrix: String,
    /// The lock file beside the recipe that records base-image digests (it may not exist yet).
    pub lock_file: PathBuf,
    /// Targets: the CPU target first, then GPU targets by SM, platform and precision.
    pub targets: Vec<TargetPlan>,
}

impl BuildPlan {
    /// The target with this id.
    pub fn target(&self, id: &str) -> Option<&TargetPlan> {
        self.targets.iter().find(|t| t.id == id)
    }

    /// The target `id`, or bad input naming the targets the plan has.
    pub fn require(&self, id: &str) -> Result<&TargetPlan, super::Error> {
        self.target(id).ok_or_else(|| super::Error::UnknownTarget {
            target: id.to_string(),
            available: self
                .targets
                .iter()
                .map(|t| t.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// The targets named by `ids`, in that order (every target when `ids` is empty); an id the
    /// plan does not have is bad input naming the ones it has.
    pub fn select(&self, ids: &[String]) -> Result<Vec<&TargetPlan>, super::Error> {
        if ids.is_empty() {
            return Ok(self.targets.iter().collect());
        }
        ids.iter().map(|id| self.require(id)).collect()
    }

    /// Base images that still need their digest recorded in the lock file (first pull).
    pub(crate) fn unpinned_images(&self) -> Vec<&ImagePin> {
        let mut v: Vec<&ImagePin> = self
            .targets
            .iter()
            .flat_map(|t| {
                std::iter::once(&t.base)
                    .chain(t.builder.as_ref())
                    .chain(t.cpu.as_ref().and_then(|c| c.glibc_base.as_ref()))
            })
            .filter(|p| p.needs_lock())
            .collect();
        v.sort_by(|a, b| a.reference.cmp(&b.reference));
        v.dedup_by(|a, b| a.reference == b.reference);
        v
    }
}

/// CPU or GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetKind {
    Cpu,
    Gpu,
}

/// One image to build: a GPU architecture (SM) × precision × platform, or the CPU target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetPlan {
    /// Stable id: `cpu-fp32`, `sm90-fp16`, `sm89-int8`; `sm90-sbsa-fp16` and
    /// `sm87-jetson-fp16` for the aarch64 platforms.
    pub id: String,
    pub kind: TargetKind,
    pub precision: Precision,
    pub platform: Platform,
    /// The OCI platform of the image (`linux/amd64`, `linux/arm64`).
    pub oci_platform: String,
    /// GPU targets: the architecture and the products it stands for.
    pub gpu: Option<GpuPlan>,
    /// GPU targets: the TensorRT release and how the engine is built.
    pub tensorrt: Option<TensorRtPlan>,
    /// GPU targets: the CUDA toolkit of the base image.
    pub cuda: Option<Version>,
    /// GPU targets: the cuDNN the TensorRT release was tested with, and whether it is needed.
    pub cudnn: Option<CudnnPlan>,
    /// GPU targets on x86_64/SBSA: the minimum Linux driver the image runs on.
    /// `None` for CPU targets and Jetson (its driver comes with the L4T BSP).
    pub driver_floor: Option<Version>,
    /// The image the target's image is built on.
    pub base: ImagePin,
    /// GPU targets: an image holding trtexec of exactly this TensorRT, when the matrix knows one.
    pub builder: Option<ImagePin>,
    /// The CPU target: which engines it may ship and what an ONNX Runtime image needs.
    pub cpu: Option<CpuPlan>,
    /// The rendered tag (valid OCI tag, at most 128 characters).
    pub tag: String,
    /// `repository:tag`.
    pub image: String,
    /// Things worth knowing about this target (sanitized tag, unconfirmed data, …).
    pub notes: Vec<String>,
}

/// The CPU side of a target: tract ships on `base` (static runtime, FROM scratch by default);
/// ONNX Runtime on `glibc_base` with the dynamic runtime and its library from a pinned wheel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuPlan {
    /// `engine.cpu` of the recipe: `auto` measures both at build time.
    pub engine: crate::recipe::CpuEngine,
    /// The base of an ONNX Runtime image; `None` when the matrix has none (then only tract).
    pub glibc_base: Option<ImagePin>,
    /// The ONNX Runtime library from the matrix; `None` when it has no row for the platform.
    pub onnxruntime: Option<LibraryPin>,
    /// The OpenVINO library from the matrix; `None` when it has no row for the platform or the
    /// glibc base is older than it needs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openvino: Option<LibraryPin>,
    /// A precision beyond FP32: the CPU features (`matrix/cpus.toml`) it computes at speed
    /// with, any one of them; empty for FP32.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<CpuFeaturePin>,
}

/// A CPU feature a CPU target's engine computes fast with (`matrix/cpus.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuFeaturePin {
    /// `avx512-bf16`, `amx` (the engine metadata's `cpu.isa` names).
    pub name: String,
    /// Node Feature Discovery's label of nodes that have it.
    pub nfd_label: String,
}

impl CpuPlan {
    /// The pinned library of CPU engine `kind`; `None` for tract and where the matrix has none.
    pub(crate) fn library(&self, kind: infer_spec::engine::EngineKind) -> Option<&LibraryPin> {
        use infer_spec::engine::EngineKind;
        match kind {
            EngineKind::Onnxruntime => self.onnxruntime.as_ref(),
            EngineKind::Openvino => self.openvino.as_ref(),
            EngineKind::Tract | EngineKind::Tensorrt => None,
        }
    }

    /// True when engine `kind` (one that loads a library) is a candidate: forced by
    /// `engine.cpu`, or under `auto`, with its base and library known.
    pub(crate) fn possible(&self, kind: infer_spec::engine::EngineKind) -> bool {
        use crate::recipe::CpuEngine;
        (self.engine == CpuEngine::Auto || self.engine == CpuEngine::Only(kind))
            && self.glibc_base.is_some()
            && self.library(kind).is_some()
    }
}

/// A native library from a pinned wheel (`matrix/runtime-libraries.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LibraryPin {
    pub name: String,
    pub version: Version,
    /// The wheel's sha256 (hex).
    pub sha256: String,
    /// Where the library is loaded from inside the image.
    pub path: String,
}

/// The GPU side of a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPlan {
    /// `sm90`.
    pub sm: String,
    /// `9.0`.
    #[serde(serialize_with = "infer_spec::engine::serialize_dotted")]
    pub compute_capability: ComputeCapability,
    /// Products the engine serves (all share the SM and platform), as named in the matrix.
    pub products: Vec<String>,
    /// What the recipe wrote for this target (`H100`, `sm_90`), in recipe order.
    pub requested: Vec<String>,
    pub arch: String,
    /// Precisions with tensor-core support on this SM.
    pub tensor_cores: Vec<Precision>,
    /// Largest MIG instance count among the products (0 = no MIG).
    pub mig: u32,
}

/// The TensorRT side of a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorRtPlan {
    /// `10.16.1`.
    pub version: Version,
    /// The GA build engines are bound to, `10.16.1.11`.
    pub build: String,
    /// The CUDA toolkit (major.minor) of the TensorRT build used.
    pub cuda_build: Version,
    pub precision_api: PrecisionApi,
    /// How the engine step gets this target's precision.
    pub precision_mode: PrecisionMode,
    /// Build a version-compatible engine (runs on later runtimes; lean/dispatch runtime).
    pub version_compatible: bool,
    /// Hardware-compatibility level, when the recipe asks for one.
    pub hardware_compat: Option<HardwareCompat>,
    /// False when a value of the release's matrix row was not confirmed from a primary source.
    pub confirmed: bool,
    /// Version-compatible engines: TensorRT's lean runtime from its pinned wheel, shipped in the
    /// image (then `base` is the glibc base, not a CUDA image). `None`: the engine needs the full
    /// runtime of its CUDA base (not version-compatible, or the matrix has no lean wheel for it).
    pub lean: Option<LibraryPin>,
}

/// How the engine build obtains the target precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrecisionMode {
    /// FP32: nothing to do.
    Native,
    /// A builder flag (`--fp16`, `--bf16`, `--int8`, `--fp8`) on TensorRT ≤ 10.x.
    BuilderFlag,
    /// INT8 with a TensorRT calibration cache (`[int8] calibration` naming a file, TensorRT ≤ 10.x).
    Calibration,
    /// The model carries Q/DQ nodes (explicit quantization, `[int8] qdq = true`).
    Qdq,
    /// TensorRT 11.x: the ONNX carries its precision (only FP32 reaches this today).
    StronglyTyped,
    /// infer-build converts the FP32 ONNX and gates it on accuracy before the build: FP16 for
    /// TensorRT 11.x, Q/DQ INT8 from `[int8] calibration` data and FP8 Q/DQ from `[fp8]
    /// calibration` data for every TensorRT.
    Convert,
}

/// cuDNN of a target.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CudnnPlan {
    pub version: String,
    pub need: CudnnNeed,
}

/// A base (or builder) image and how its digest is pinned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImagePin {
    /// `docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04`, or `scratch`.
    pub reference: String,
    /// The digest when known; `None` until the first pull records it in the lock file.
    pub digest: Option<Digest>,
    pub pinned_by: PinnedBy,
}

impl ImagePin {
    /// True when the digest is still to be recorded in the lock file at first pull.
    pub(crate) fn needs_lock(&self) -> bool {
        self.digest.is_none() && self.pinned_by == PinnedBy::Lock
    }

    /// What to pull: `reference@digest` when pinned, else the reference.
    pub(crate) fn pull_reference(&self) -> String {
        match &self.digest {
            Some(d) => format!("{}@{}", self.reference, d),
            None => self.reference.clone(),
        }
    }
}

/// Who pins an image's digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PinnedBy {
    /// The matrix row gives the digest (with its public source).
    Matrix,
    /// The recipe's `image.base` names `…@sha256:…`.
    Recipe,
    /// The lock file beside the recipe: `digest` is set once the first pull recorded it.
    Lock,
    /// Nothing to pin: `scratch`.
    None,
}
