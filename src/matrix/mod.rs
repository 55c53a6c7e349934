//! The compatibility matrix: which TensorRT release runs on which GPU, with which CUDA toolkit,
//! on which minimum driver, in which base image. The facts live in data files
//! (`matrix/tensorrt.toml`, `matrix/cuda.toml`, `matrix/gpus.toml`, `base-images/images.toml`),
//! each row with its public source; they are embedded into the binary at compile time and can
//! be replaced with `--matrix DIR`.
//!
//! This module owns typed loading of that data (errors name the file, line, column and key) and
//! the cross-table checks (every TensorRT CUDA build has a driver floor, every base image's
//! CUDA/TensorRT exists, …). It makes no decisions: choosing a release for a target is
//! [`crate::plan`]'s job. Everything here is pure except [`load_dir`], which reads the files.

mod check;
mod version;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use version::{ComputeCapability, Version};

// The data files, relative to the matrix root (`--matrix DIR` or the repository root).
pub(crate) const TENSORRT_FILE: &str = "matrix/tensorrt.toml";
pub(crate) const CUDA_FILE: &str = "matrix/cuda.toml";
pub(crate) const GPUS_FILE: &str = "matrix/gpus.toml";
pub(crate) const IMAGES_FILE: &str = "base-images/images.toml";
/// Native runtime libraries taken from pinned wheels. Optional in a `--matrix DIR` (absent: no
/// library rows, so no engine that needs one is offered).
pub(crate) const LIBRARIES_FILE: &str = "matrix/runtime-libraries.toml";
/// CPU instruction-set features of CPU targets. Optional in a `--matrix DIR` (absent: no rows,
/// so plans name no feature and deployments prefer no node).
pub(crate) const CPUS_FILE: &str = "matrix/cpus.toml";

const EMBEDDED: [(&str, &str); 4] = [
    (TENSORRT_FILE, include_str!("../../matrix/tensorrt.toml")),
    (CUDA_FILE, include_str!("../../matrix/cuda.toml")),
    (GPUS_FILE, include_str!("../../matrix/gpus.toml")),
    (IMAGES_FILE, include_str!("../../base-images/images.toml")),
];
const EMBEDDED_LIBRARIES: &str = include_str!("../../matrix/runtime-libraries.toml");
const EMBEDDED_CPUS: &str = include_str!("../../matrix/cpus.toml");

/// Where a piece of data came from: file (as shown to users) and 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Origin {
    pub file: String,
    pub line: usize,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)
    }
}

/// Errors of the `matrix` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A data file could not be read (only with `--matrix DIR`).
    #[error("cannot read matrix file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// One or more problems in the data: malformed rows or tables that disagree.
    #[error("{}", render_problems(problems))]
    Invalid { problems: Vec<Problem> },
}

/// One problem in the data, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: String,
    pub line: usize,
    pub column: usize,
    /// The key the problem is about, when known (`min_cc`, `cuda_builds`).
    pub key: Option<String>,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if let Some(k) = &self.key {
            write!(f, "key `{k}`: ")?;
        }
        f.write_str(&self.message)
    }
}

fn render_problems(problems: &[Problem]) -> String {
    let n = problems.len();
    let mut s = format!(
        "invalid compatibility matrix ({n} problem{})",
        if n == 1 { "" } else { "s" }
    );
    for p in problems {
        s.push_str("\n  ");
        s.push_str(&p.to_string());
    }
    s
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2): the data of a
    /// `--matrix DIR` is input; the embedded data is checked by unit tests.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Read { source, .. } => source.kind() == std::io::ErrorKind::NotFound,
            Error::Invalid { .. } => true,
        }
    }
}

/// A platform a TensorRT build and a base image exist for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Platform {
    /// Linux x86_64.
    X86_64,
    /// Linux aarch64 servers (GH200, GB200).
    Sbsa,
    /// NVIDIA Jetson (JetPack).
    Jetson,
}

impl Platform {
    pub fn as_str(&self) -> &'static str {
        match self {
            Platform::X86_64 => "x86_64",
            Platform::Sbsa => "sbsa",
            Platform::Jetson => "jetson",
        }
    }

    /// The OCI platform of images for this platform (Jetson is linux/arm64 too).
    pub fn oci(&self) -> &'static str {
        match self {
            Platform::X86_64 => "linux/amd64",
            Platform::Sbsa | Platform::Jetson => "linux/arm64",
        }
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A numeric precision (supported by tensor cores, or of a target): the one type shared with
/// recipes and engines.
pub use infer_spec::engine::Precision;

/// How a TensorRT release learns an engine's precision.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrecisionApi {
    /// Builder flags (`--fp16`, `--int8`) and INT8 calibrators exist (TensorRT <= 10.x).
    BuilderFlags,
    /// Strongly typed networks only: precision comes from the ONNX (TensorRT 11.x).
    StronglyTyped,
}

/// Whether a release needs cuDNN at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CudnnNeed {
    Required,
    Optional,
}

/// A TensorRT hardware-compatibility level (engine portability across GPUs): the one type,
/// written `ampere-plus` / `same-compute-capability` in `tensorrt.toml`.
pub use infer_spec::engine::HardwareCompat;

/// One TensorRT release (`matrix/tensorrt.toml`, `[[release]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Release {
    pub version: Version,
    pub build: String,
    pub cuda_builds: Vec<Version>,
    pub cuda_compatible: String,
    pub cudnn: CudnnNeed,
    pub cudnn_version: String,
    pub min_cc: ComputeCapability,
    pub max_cc: ComputeCapability,
    #[serde(default)]
    pub glibc_min: Option<Version>,
    pub platforms: Vec<Platform>,
    pub precision_api: PrecisionApi,
    pub precisions: Vec<Precision>,
    pub version_compatible: bool,
    pub lean_runtime: bool,
    #[serde(default)]
    pub hardware_compat: Vec<HardwareCompat>,
    pub source: Vec<String>,
    pub confirmed: bool,
    /// Set when facts needed to build are unknown: the row is listed but never selected.
    #[serde(default)]
    pub incomplete: Option<String>,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(skip)]
    pub origin: Option<Origin>,
}

/// One CUDA major (`matrix/cuda.toml`, `[[major]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CudaMajor {
    pub major: u64,
    /// Driver floor of CUDA minor-version compatibility inside this major.
    pub minor_compat_driver: Version,
    pub min_cc: ComputeCapability,
    pub max_cc: ComputeCapability,
    pub source: Vec<String>,
    pub confirmed: bool,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(skip)]
    pub origin: Option<Origin>,
}

/// One CUDA toolkit release and its minimum Linux driver (`matrix/cuda.toml`, `[[toolkit]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toolkit {
    pub version: Version,
    pub min_driver: Version,
    #[serde(default)]
    pub bundled_driver: Option<Version>,
    pub source: Vec<String>,
    pub confirmed: bool,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(skip)]
    pub origin: Option<Origin>,
}

/// One GPU product (`matrix/gpus.toml`, `[[gpu]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    pub name: String,
    #[serde(default)]
    pub aliases: Vec<String>,
    pub cc: ComputeCapability,
    pub arch: String,
    pub platform: Platform,
    pub tensor_cores: Vec<Precision>,
    /// Maximum MIG instances; 0 = no MIG.
    pub mig: u32,
    /// GPU memory of the smallest variant, in GB (10^9 bytes) as the datasheet states it;
    /// `None` in a `--matrix` directory that does not say.
    #[serde(default)]
    pub memory_gb: Option<f64>,
    /// The MIG profiles of that variant (`1g.10gb`), smallest first; empty when unknown.
    #[serde(default)]
    pub mig_profiles: Vec<String>,
    pub source: Vec<String>,
    pub confirmed: bool,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(skip)]
    pub origin: Option<Origin>,
}

/// What a base image is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageRole {
    /// Base of a GPU target's image.
    Runtime,
    /// Image with trtexec and the full TensorRT, to build engines in.
    Builder,
    /// Base of the CPU target's image.
    Cpu,
}

/// One base image (`base-images/images.toml`, `[[image]]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BaseImage {
    pub reference: String,
    pub role: ImageRole,
    #[serde(default)]
    pub default: bool,
    pub platforms: Vec<Platform>,
    #[serde(default)]
    pub cuda: Option<Version>,
    #[serde(default)]
    pub cudnn: Option<Version>,
    #[serde(default)]
    pub tensorrt: Option<Version>,
    #[serde(default)]
    pub os: Option<String>,
    #[serde(default)]
    pub glibc: Option<Version>,
    /// `sha256:…`, only where a public source (named in `digest_source`) gives it.
    #[serde(default)]
    pub digest: Option<String>,
    #[serde(default)]
    pub digest_source: Option<String>,
    pub source: Vec<String>,
    pub confirmed: bool,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(skip)]
    pub origin: Option<Origin>,
}

/// One native runtime library taken from a wheel on the Python package registry
/// (`matrix/runtime-libraries.toml`, `[[library]]`): the wheel is pinned by its file URL and
/// sha256, and only the named members are extracted, into `install_dir` of the image.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeLibrary {
    /// What needs it (`onnxruntime`, `tensorrt-lean`): an engine asks for its library by name.
    pub name: String,
    /// The library's own version (what the engine checks at start).
    pub version: Version,
    pub platform: Platform,
    /// The wheel's project on the Python package registry.
    pub package: String,
    /// `https://files.pythonhosted.org/packages/…/<file>.whl`.
    pub url: String,
    /// The wheel file's sha256, 64 lowercase hex digits (as PyPI's JSON API gives it).
    pub sha256: String,
    /// The wheel file's size in bytes.
    pub size: u64,
    /// Wheel members to extract (`onnxruntime/capi/libonnxruntime.so.1.23.2`); each lands in
    /// `install_dir` under its base name.
    pub files: Vec<String>,
    /// The member the engine loads (one of `files`).
    pub load: String,
    /// Absolute directory inside the image (`/opt/onnxruntime/lib`).
    pub install_dir: String,
    /// Minimum glibc of the image (the wheel's manylinux tag).
    #[serde(default)]
    pub glibc_min: Option<Version>,
    pub source: Vec<String>,
    pub confirmed: bool,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(skip)]
    pub origin: Option<Origin>,
}

impl RuntimeLibrary {
    /// The path inside the image of the library the engine loads.
    pub(crate) fn load_path(&self) -> String {
        let base = self.load.rsplit('/').next().unwrap_or(&self.load);
        format!("{}/{base}", self.install_dir.trim_end_matches('/'))
    }
}

/// A CPU instruction-set feature (`matrix/cpus.toml`, `[[feature]]`): what a CPU target's
/// engine computes fast with, how the kernel lists it and how Node Feature Discovery labels it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuFeature {
    /// The name of [`infer_spec::engine::CpuIsa::EXTENSIONS`] (`avx512-bf16`, `amx`).
    pub name: String,
    pub platform: Platform,
    /// The kernel's CPU flags, all present where the CPU has it.
    pub kernel_flags: Vec<String>,
    /// Node Feature Discovery's label (`feature.node.kubernetes.io/cpu-cpuid.AVX512BF16`).
    pub nfd_label: String,
    /// The CPU target precisions it computes at speed.
    pub computes: Vec<Precision>,
    /// Which CPUs have it, in words.
    pub cpus: String,
    pub source: Vec<String>,
    pub confirmed: bool,
    #[serde(default)]
    pub notes: Option<String>,
    #[serde(skip)]
    pub origin: Option<Origin>,
}

/// The whole compatibility matrix.
#[derive(Debug, Clone)]
pub struct Matrix {
    /// TensorRT releases, newest first.
    pub releases: Vec<Release>,
    pub cuda_majors: Vec<CudaMajor>,
    /// CUDA toolkits, newest first.
    pub toolkits: Vec<Toolkit>,
    pub gpus: Vec<Gpu>,
    pub images: Vec<BaseImage>,
    /// Native runtime libraries from pinned wheels.
    pub libraries: Vec<RuntimeLibrary>,
    /// CPU instruction-set features of CPU targets.
    pub cpu_features: Vec<CpuFeature>,
    /// Where the data came from: `embedded` or the `--matrix` directory.
    pub origin: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TensorRtFile {
    release: Vec<toml::Spanned<Release>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CudaFile {
    major: Vec<toml::Spanned<CudaMajor>>,
    toolkit: Vec<toml::Spanned<Toolkit>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GpusFile {
    gpu: Vec<toml::Spanned<Gpu>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LibrariesFile {
    #[serde(default)]
    library: Vec<toml::Spanned<RuntimeLibrary>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CpusFile {
    #[serde(default)]
    feature: Vec<toml::Spanned<CpuFeature>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ImagesFile {
    image: Vec<toml::Spanned<BaseImage>>,
}

/// 1-based line and column of a byte offset.
pub(crate) fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let offset = offset.min(text.len());
    let before = &text.as_bytes()[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

/// The key assigned on the line at `offset` (`min_cc = "x"` → `min_cc`), if any.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let line = &text[start..end];
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    (!key.is_empty() && !key.starts_with('#') && !key.starts_with('['))
        .then(|| key.trim_matches('"').to_string())
}

fn parse_file<T: serde::de::DeserializeOwned>(file: &str, text: &str) -> Result<T, Problem> {
    toml::from_str::<T>(text).map_err(|e| {
        let offset = e.span().map_or(0, |s| s.start);
        let (line, column) = line_col(text, offset);
        Problem {
            file: file.to_string(),
            line,
            column,
            key: e.span().and_then(|s| key_at(text, s.start)),
            message: e.message().trim().to_string(),
        }
    })
}

fn unspan<T>(
    file: &str,
    text: &str,
    rows: Vec<toml::Spanned<T>>,
    set: impl Fn(&mut T, Origin),
) -> Vec<T> {
    rows.into_iter()
        .map(|s| {
            let (line, _) = line_col(text, s.span().start);
            let mut row = s.into_inner();
            set(
                &mut row,
                Origin {
                    file: file.to_string(),
                    line,
                },
            );
            row
        })
        .collect()
}

/// The data files' texts, one field per file (`TENSORRT_FILE`, `CUDA_FILE`, …).
pub struct Sources<'a> {
    pub tensorrt: &'a str,
    pub cuda: &'a str,
    pub gpus: &'a str,
    pub images: &'a str,
    /// `matrix/runtime-libraries.toml` (empty text: no rows).
    pub libraries: &'a str,
    /// `matrix/cpus.toml` (empty text: no rows).
    pub cpus: &'a str,
    /// Prefix shown before file names in messages (the `--matrix` directory), or empty.
    pub root: String,
}

impl Matrix {
    /// The matrix built into this binary.
    pub fn embedded() -> Result<Matrix, Error> {
        Matrix::from_sources(&Sources {
            tensorrt: EMBEDDED[0].1,
            cuda: EMBEDDED[1].1,
            gpus: EMBEDDED[2].1,
            images: EMBEDDED[3].1,
            libraries: EMBEDDED_LIBRARIES,
            cpus: EMBEDDED_CPUS,
            root: String::new(),
        })
    }

    /// Parse and cross-check the four data files. Reports every problem at once.
    pub(crate) fn from_sources(src: &Sources<'_>) -> Result<Matrix, Error> {
        let name = |f: &str| {
            if src.root.is_empty() {
                f.to_string()
            } else {
                format!("{}/{}", src.root.trim_end_matches('/'), f)
            }
        };
        let (trt_name, cuda_name, gpus_name, images_name, libs_name, cpus_name) = (
            name(TENSORRT_FILE),
            name(CUDA_FILE),
            name(GPUS_FILE),
            name(IMAGES_FILE),
            name(LIBRARIES_FILE),
            name(CPUS_FILE),
        );
        let mut problems = Vec::new();

        let trt = parse_file::<TensorRtFile>(&trt_name, src.tensorrt).map_err(|p| problems.push(p));
        let cuda = parse_file::<CudaFile>(&cuda_name, src.cuda).map_err(|p| problems.push(p));
        let gpus = parse_file::<GpusFile>(&gpus_name, src.gpus).map_err(|p| problems.push(p));
        let images =
            parse_file::<ImagesFile>(&images_name, src.images).map_err(|p| problems.push(p));
        let libs =
            parse_file::<LibrariesFile>(&libs_name, src.libraries).map_err(|p| problems.push(p));
        let cpus = parse_file::<CpusFile>(&cpus_name, src.cpus).map_err(|p| problems.push(p));
        let (Ok(trt), Ok(cuda), Ok(gpus), Ok(images), Ok(libs), Ok(cpus)) =
            (trt, cuda, gpus, images, libs, cpus)
        else {
            return Err(Error::Invalid { problems });
        };

        let mut releases = unspan(&trt_name, src.tensorrt, trt.release, |r, o| {
            r.origin = Some(o)
        });
        let cuda_majors = unspan(&cuda_name, src.cuda, cuda.major, |r, o| r.origin = Some(o));
        let mut toolkits = unspan(&cuda_name, src.cuda, cuda.toolkit, |r, o| {
            r.origin = Some(o)
        });
        let gpus = unspan(&gpus_name, src.gpus, gpus.gpu, |r, o| r.origin = Some(o));
        let images = unspan(&images_name, src.images, images.image, |r, o| {
            r.origin = Some(o)
        });
        let libraries = unspan(&libs_name, src.libraries, libs.library, |r, o| {
            r.origin = Some(o)
        });
        let cpu_features = unspan(&cpus_name, src.cpus, cpus.feature, |r, o| {
            r.origin = Some(o)
        });
        // Newest first: resolution walks these in order and takes the first that fits.
        releases.sort_by(|a, b| b.version.cmp(&a.version));
        toolkits.sort_by(|a, b| b.version.cmp(&a.version));

        let matrix = Matrix {
            releases,
            cuda_majors,
            toolkits,
            gpus,
            images,
            libraries,
            cpu_features,
            origin: if src.root.is_empty() {
                "embedded".into()
            } else {
                src.root.clone()
            },
        };
        problems.extend(check::check(&matrix));
        if problems.is_empty() {
            Ok(matrix)
        } else {
            Err(Error::Invalid { problems })
        }
    }

    /// The GPU product named `name` (case, spaces, dashes and a leading "NVIDIA" ignored).
    pub fn gpu(&self, name: &str) -> Option<&Gpu> {
        let want = normalize(name);
        self.gpus
            .iter()
            .find(|g| normalize(&g.name) == want || g.aliases.iter().any(|a| normalize(a) == want))
    }

    /// Products with compute capability `cc`, in table order.
    pub(crate) fn gpus_with_cc(&self, cc: ComputeCapability) -> impl Iterator<Item = &Gpu> {
        self.gpus.iter().filter(move |g| g.cc == cc)
    }

    /// Up to three known product names closest to `name`, for "did you mean" hints.
    pub(crate) fn closest_gpus(&self, name: &str) -> Vec<&str> {
        let want = normalize(name);
        let mut scored: Vec<(usize, &str)> = self
            .gpus
            .iter()
            .map(|g| (levenshtein(&normalize(&g.name), &want), g.name.as_str()))
            .collect();
        scored.sort();
        let limit = want.len().max(2) / 2 + 1;
        scored
            .into_iter()
            .filter(|(d, _)| *d <= limit)
            .take(3)
            .map(|(_, n)| n)
            .collect()
    }

    pub fn release(&self, version: &Version) -> Option<&Release> {
        self.releases.iter().find(|r| &r.version == version)
    }

    pub(crate) fn cuda_major(&self, major: u64) -> Option<&CudaMajor> {
        self.cuda_majors.iter().find(|m| m.major == major)
    }

    /// The toolkit row of exactly this CUDA version.
    pub fn toolkit(&self, version: &Version) -> Option<&Toolkit> {
        self.toolkits.iter().find(|t| &t.version == version)
    }

    /// The library row `name` for `platform`: of exactly `version` when given (TensorRT's lean
    /// runtime has one row per release), else the first (ONNX Runtime has one).
    pub fn library(
        &self,
        name: &str,
        platform: Platform,
        version: Option<&Version>,
    ) -> Option<&RuntimeLibrary> {
        self.libraries.iter().find(|l| {
            l.name == name && l.platform == platform && version.is_none_or(|v| &l.version == v)
        })
    }

    /// The CPU features on `platform` that compute `precision` at speed, in the file's order
    /// (any one of them will do); empty for FP32.
    pub fn cpu_features_for(&self, precision: Precision, platform: Platform) -> Vec<&CpuFeature> {
        self.cpu_features
            .iter()
            .filter(|f| f.platform == platform && f.computes.contains(&precision))
            .collect()
    }

    /// The default glibc-based CPU base image (for engines that need a dynamic runtime).
    pub(crate) fn glibc_cpu_base(&self) -> Option<&BaseImage> {
        self.images
            .iter()
            .find(|i| i.role == ImageRole::Cpu && i.default && i.glibc.is_some())
    }

    /// The image row with this reference.
    pub fn image(&self, reference: &str) -> Option<&BaseImage> {
        self.images.iter().find(|i| i.reference == reference)
    }
}

fn normalize(s: &str) -> String {
    let lower = s.trim().to_ascii_lowercase();
    let lower = lower.strip_prefix("nvidia").unwrap_or(&lower).to_string();
    lower
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect()
}

fn levenshtein(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur.push((prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

/// Read the data files from `dir` (holding `matrix/` and `base-images/`) and load them. The
/// only function of this module that touches the filesystem.
pub fn load_dir(dir: &Path) -> Result<Matrix, Error> {
    let read = |f: &str| {
        let path = dir.join(f);
        std::fs::read_to_string(&path).map_err(|source| Error::Read { path, source })
    };
    let (tensorrt, cuda, gpus, images) = (
        read(TENSORRT_FILE)?,
        read(CUDA_FILE)?,
        read(GPUS_FILE)?,
        read(IMAGES_FILE)?,
    );
    let optional = |f: &str| match read(f) {
        Ok(t) => Ok(t),
        Err(Error::Read { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            Ok(String::new())
        }
        Err(e) => Err(e),
    };
    let libraries = optional(LIBRARIES_FILE)?;
    let cpus = optional(CPUS_FILE)?;
    Matrix::from_sources(&Sources {
        tensorrt: &tensorrt,
        cuda: &cuda,
        gpus: &gpus,
        images: &images,
        libraries: &libraries,
        cpus: &cpus,
        root: dir.display().to_string(),
    })
}

/// The embedded matrix, or the one in `dir` when given (`--matrix DIR`).
pub fn load(dir: Option<&Path>) -> Result<Matrix, Error> {
    match dir {
        Some(d) => load_dir(d),
        None => Matrix::embedded(),
    }
}

#[cfg(test)]
mod tests;
