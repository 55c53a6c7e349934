//! The validated recipe: plain values, every default applied, every cross-field rule checked.
//! Nothing here can be built except by [`super::parse`] / [`super::load`] (or by tests), so a
//! `Recipe` in hand is a recipe that passed validation.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use super::diagnostic::Located;

/// A validated recipe.
#[derive(Debug, Clone, PartialEq)]
pub struct Recipe {
    /// The recipe's path as given to [`super::load`] / [`super::parse`]; diagnostics name it.
    pub file: PathBuf,
    /// The directory relative paths in the recipe are resolved against (the recipe file's
    /// parent; empty when the recipe is in the current directory).
    pub dir: PathBuf,
    pub model: Model,
    pub targets: Targets,
    /// Present when the recipe has an `[int8]` table.
    pub int8: Option<Int8>,
    /// Present when the recipe has an `[fp8]` table.
    pub fp8: Option<Fp8>,
    /// `[accuracy]`: the accuracy gate of converted models (defaults when absent).
    pub accuracy: Accuracy,
    pub batching: Batching,
    pub warmup: Warmup,
    pub image: Image,
    pub deploy: Deploy,
    /// `[engine]`: which engine the CPU target ships.
    pub engine: Engine,
    /// `[text]`: the model takes text (tokenizer in front, pooling after), when present.
    pub text: Option<Text>,
    /// `[vision]`: the model takes images (decoding and resizing in front, labels, boxes,
    /// vectors or text lines after), when present.
    pub vision: Option<Vision>,
    /// `[response_cache] max_bytes`: identical requests answered from memory, when present.
    pub response_cache: Option<u64>,
}

/// `[text]`: how the served text becomes the model's token tensors and its output one vector
/// per text. Written into `runtime.toml` as [`infer_spec::text::Text`] once the model's
/// outputs are known (the defaults of `output` and `pooling` depend on them).
#[derive(Debug, Clone, PartialEq)]
pub struct Text {
    /// `text.tokenizer`: a Hugging Face `tokenizer.json`, relative to the recipe's directory.
    pub tokenizer: Located<PathBuf>,
    /// `text.max_length` (default: the ids input's profile max, else 512).
    pub max_length: u32,
    pub truncate: bool,
    pub special_tokens: bool,
    pub prefix: String,
    pub input_ids: String,
    pub attention_mask: Option<String>,
    pub token_type_ids: Option<String>,
    /// `text.output` (default: the model's first output).
    pub output: Option<Located<String>>,
    /// `text.pooling` (default: `mean` for a `[batch, sequence, hidden]` output, `none` for
    /// `[batch, hidden]`).
    pub pooling: Option<infer_spec::text::Pooling>,
    pub normalize: bool,
    pub token_budget: u32,
    /// `text.max_padding_percent` (default: by target, see
    /// `assemble::spec::DEFAULT_CPU_MAX_PADDING_PERCENT`; 0: no bound).
    pub max_padding_percent: Option<u32>,
    /// `text.pairs`: each row is a (query, passage) pair (cross-encoders).
    pub pairs: bool,
    /// `text.activation`: logits to scores (classifiers and rerankers).
    pub activation: infer_spec::text::Activation,
    /// `text.labels`: a classifier's label per output column.
    pub labels: Vec<String>,
    /// `text.max_client_batch_size`: the most texts (or pairs) one request may carry
    /// (default `infer_spec::text::DEFAULT_MAX_CLIENT_BATCH_SIZE`).
    pub max_client_batch_size: u32,
    /// The table, for errors found once the model's outputs are known.
    pub at: Located<()>,
}

/// `[vision]`: how an encoded image becomes the model's pixel tensor and its output an answer.
/// Written into `runtime.toml` as [`infer_spec::vision::Vision`] once the model's outputs are
/// known (the default `output` and the label count depend on them).
#[derive(Debug, Clone, PartialEq)]
pub struct Vision {
    /// The section with every default the recipe alone decides applied; `output` empty when
    /// the recipe leaves it to the model (its first output), `labels` empty until [`super::load`]
    /// reads `labels_file`.
    pub section: infer_spec::vision::Vision,
    /// `vision.output` as written.
    pub output: Option<Located<String>>,
    /// `vision.labels` naming a file beside the recipe (one label per line).
    pub labels_file: Option<Located<PathBuf>>,
    /// The table, for errors found once the model's outputs are known.
    pub at: Located<()>,
}

/// `[engine]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// `engine.cpu`: the CPU target's engine (default `auto`; span: the table, or the start
    /// when there is none).
    pub cpu: Located<CpuEngine>,
    /// `engine.convert`: the tool that makes the FP16 / INT8 / FP8 model of GPU targets
    /// (default `builtin`; span: the key, the table, or the start).
    pub convert: Located<ConvertTool>,
    /// `engine.threads`: the intra-op threads of each instance of an engine with threads of
    /// its own (ONNX Runtime), pinned in `runtime.toml`; absent, the runtime decides where it
    /// runs.
    pub threads: Option<Located<u32>>,
}

/// `engine.convert`: which tool converts an FP32 ONNX to the precision a GPU target asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConvertTool {
    /// The pinned environment infer-build creates: onnxconverter-common (FP16), ONNX Runtime's
    /// quantiser (INT8), infer-build's own Q/DQ insertion (FP8). Runs anywhere, no torch.
    #[default]
    Builtin,
    /// NVIDIA's Model Optimizer (AutoCast for FP16, `modelopt.onnx.quantization` for INT8 and
    /// FP8), from a Python that has it and torch (NVIDIA's TensorRT containers do).
    ModelOpt,
}

impl ConvertTool {
    pub fn parse(s: &str) -> Option<ConvertTool> {
        match s.trim().to_ascii_lowercase().as_str() {
            "builtin" => Some(ConvertTool::Builtin),
            "modelopt" | "model-optimizer" | "nvidia-modelopt" => Some(ConvertTool::ModelOpt),
            _ => None,
        }
    }

    /// The calibration methods this tool takes for INT8 (`fp8 = false`) or FP8.
    pub(crate) fn methods(self, fp8: bool) -> &'static [&'static str] {
        match (self, fp8) {
            (ConvertTool::Builtin, false) => &CALIBRATION_METHODS,
            (ConvertTool::Builtin, true) => &FP8_CALIBRATION_METHODS,
            // ModelOpt's `max` and `entropy` (int8 and fp8 alike).
            (ConvertTool::ModelOpt, _) => &MODELOPT_CALIBRATION_METHODS,
        }
    }

    /// The calibration method when `[int8] method` / `[fp8] method` is not given.
    pub(crate) fn default_method(self) -> &'static str {
        match self {
            // Percentile (99.999th) clips rare outliers; on the PaddleOCR classifier it kept
            // top-1 agreement where min-max and entropy did not (docs/engines.md).
            ConvertTool::Builtin => "percentile",
            // ModelOpt's own default for INT8 and FP8.
            ConvertTool::ModelOpt => "entropy",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ConvertTool::Builtin => "builtin",
            ConvertTool::ModelOpt => "modelopt",
        }
    }
}

impl fmt::Display for ConvertTool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

pub use infer_spec::engine::CpuEngine;

impl Recipe {
    /// The ONNX model's path: `dir` joined with `model.onnx`.
    pub fn model_path(&self) -> PathBuf {
        self.dir.join(&self.model.onnx.value)
    }

    /// Resolve a path written in the recipe (relative to the recipe's directory).
    pub fn resolve(&self, relative: &Path) -> PathBuf {
        self.dir.join(relative)
    }

    /// The batch sizes warm-up runs: `[warmup] batch_sizes` when given, else 1, every preferred
    /// batch size and `max_batch_size`, sorted and without duplicates.
    pub fn warmup_batch_sizes(&self) -> Vec<u32> {
        match &self.warmup.batch_sizes {
            Some(sizes) => sizes.clone(),
            None => self.batching.default_warmup_sizes(),
        }
    }

    /// How many targets the recipe asks for: one per GPU × precision, plus one per CPU precision.
    /// (The plan may merge GPUs that share an SM into one target; this counts what is written.)
    pub fn requested_target_count(&self) -> usize {
        self.targets.gpus.len() * self.targets.precision.len() + self.targets.cpu.len()
    }
}

/// `[model]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// Model name as served (`/v2/models/{name}`): `[a-z0-9][a-z0-9._-]*`, at most 63 characters.
    pub name: String,
    /// Model version string, free-form but tag-safe (`[A-Za-z0-9._-]+`).
    pub version: String,
    /// The ONNX file, relative to the recipe's directory (see [`Recipe::model_path`]).
    pub onnx: Located<PathBuf>,
    pub description: Option<String>,
    /// `[model.inputs.NAME]` in name order (TOML tables have no order a user could rely on).
    pub inputs: Vec<Tensor>,
    /// `[model.outputs.NAME]` in name order; empty when the recipe leaves outputs to the model.
    pub outputs: Vec<Tensor>,
}

/// One model input or output.
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    /// Dimensions including the batch dimension first; `-1` is dynamic. Always at least one
    /// dimension; the first is `-1` (dynamic batch) or `1` with `max_batch_size = 1`.
    pub shape: Vec<i64>,
    /// Ranges for the dynamic non-batch dimensions (inputs only).
    pub profile: Option<ShapeProfile>,
    /// The padding value of a token-like input (`pad`): requests of different lengths share a
    /// batch, padded (`infer_spec::TensorSpec::pad`).
    pub pad: Option<i64>,
}

/// Shape profile of one input: for each dimension after the batch dimension the smallest,
/// the most common (what engines are tuned for) and the largest size. Fixed dimensions repeat
/// their size. The batch dimension's range comes from `[batching]` (1, the largest preferred
/// batch size, `max_batch_size`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeProfile {
    pub min: Vec<i64>,
    pub opt: Vec<i64>,
    pub max: Vec<i64>,
}

/// Tensor element types: the one datatype type, spelled lower case in recipes
/// ([`DataType::recipe_name`]).
pub use infer_spec::DataType;

/// `[targets]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Targets {
    /// GPUs to build for, as written (products or SM names), in recipe order, no duplicates.
    pub gpus: Vec<Located<Gpu>>,
    /// Precisions to build for each GPU, in recipe order, no duplicates. Defaults to `["fp16"]`
    /// when there are GPUs (span: the `[targets]` table).
    pub precision: Vec<Located<Precision>>,
    /// The CPU targets' precisions, in recipe order, no duplicates, each one of
    /// [`Precision::CPU`]: `cpu = true` is `["fp32"]`, `false` none. Defaults to `["fp32"]` when
    /// `gpus` is empty.
    pub cpu: Vec<Located<Precision>>,
    /// TensorRT version pin (`"10"`, `"10.8"`, `"10.8.0"`): newest matching release.
    pub tensorrt: Option<Located<Version>>,
    /// CUDA version pin (`"12"`, `"12.8"`).
    pub cuda: Option<Located<Version>>,
    /// Build version-compatible engines (run by the lean runtime of a later TensorRT). Unset:
    /// version-compatible with a lean image wherever the release and the matrix allow one,
    /// ordinary engines on the full runtime elsewhere; `true` insists (a release that cannot
    /// is refused), `false` declines.
    pub version_compatible: Option<Located<bool>>,
    /// Hardware-compatible engines: one engine for several GPU architectures.
    pub hardware_compatibility: Option<Located<HardwareCompat>>,
}

/// A GPU as named in `targets.gpus`. Product names are not checked here (the recipe module
/// knows no GPUs); the plan looks them up in the matrix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Gpu {
    /// A product name as written, such as `"L4"`, `"H100"`, `"RTX 4090"`.
    Product(String),
    /// A compute capability written as an SM name (`"sm_86"`, `"sm86"`, `"sm_100"`).
    Sm(ComputeCapability),
}

impl fmt::Display for Gpu {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Gpu::Product(p) => f.write_str(p),
            Gpu::Sm(cc) => write!(f, "{}", cc.sm()),
        }
    }
}

/// A precision of `targets.precision` and `[accuracy.<precision>]`: the one type shared with
/// the matrix and engines (a recipe may ask for [`Precision::REQUESTABLE`]).
pub use infer_spec::engine::Precision;

/// A CUDA compute capability: the one type of the recipe, the matrix and the runtime.
pub use infer_spec::engine::ComputeCapability;

/// `[batching]`: the runtime's dynamic batcher, the one type the recipe validates and the
/// image's `runtime.toml` carries. Batch sizes count rows (the first dimension); the queue
/// limit counts requests. After validation `preferred_batch_sizes` is sorted, without
/// duplicates, each at most `max_batch_size` (empty: any size).
pub use infer_spec::{Batching, QueueDelay};

/// `targets.hardware_compatibility`: TensorRT's hardware-compatibility levels, the one type of
/// the recipe, the matrix, plans and engine metadata (the recipe stores `none` as no level).
pub use infer_spec::engine::HardwareCompat;

/// A dotted numeric version (`"10.8"`, `"550.54.15"`, `"535.104.05"`): the one version type
/// of the recipe, the matrix, plans and engines. Compares numerically; displays as written
/// (driver versions keep their leading zeros).
pub use infer_spec::engine::Version;

/// A version as a recipe may write it: 1 to 4 dot-separated decimal components of at most 9
/// digits each, nothing around them (stricter than [`Version`]'s own parser, which also reads
/// the matrix's longer build numbers).
pub(crate) fn parse_version(s: &str) -> Option<Version> {
    let parts: Vec<&str> = s.split('.').collect();
    let ok = (1..=4).contains(&parts.len())
        && parts
            .iter()
            .all(|p| (1..=9).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit()));
    if ok {
        s.parse().ok()
    } else {
        None
    }
}

/// `[int8]`: how INT8 engines get their scales.
#[derive(Debug, Clone, PartialEq)]
pub struct Int8 {
    /// Calibration data directory or a TensorRT calibration cache file, relative to the
    /// recipe's directory. Used by TensorRT ≤ 10 implicit quantization.
    pub calibration: Option<Located<PathBuf>>,
    /// The model already carries Q/DQ nodes (explicit quantization); no calibration needed.
    /// Span: the key, or the `[int8]` table when defaulted.
    pub qdq: Located<bool>,
    /// How infer-build's INT8 quantisation picks activation ranges from the calibration data:
    /// one of [`CALIBRATION_METHODS`]; `None` for the default (`percentile`).
    pub method: Option<Located<String>>,
    /// Whether `calibration` is a file (a TensorRT calibration cache) rather than a directory
    /// of batches: set by [`super::load`], which looks; `None` after [`super::parse`].
    pub calibration_is_cache: Option<bool>,
}

/// Calibration methods `[int8] method` accepts (ONNX Runtime's static quantisation).
pub const CALIBRATION_METHODS: [&str; 3] = ["minmax", "entropy", "percentile"];

/// `[fp8]`: how infer-build quantizes the model to FP8 (E4M3) Q/DQ.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8 {
    /// Calibration data directory (`*.npy` / `*.npz` batches), relative to the recipe's
    /// directory. TensorRT has no FP8 calibrator: the Q/DQ model is always made from data.
    pub calibration: Option<Located<PathBuf>>,
    /// How activation ranges are taken from the calibration data: one of
    /// [`FP8_CALIBRATION_METHODS`]; `None` for the default (`percentile`).
    pub method: Option<Located<String>>,
}

/// Calibration methods `[int8] method` and `[fp8] method` accept under `engine.convert =
/// "modelopt"` (ModelOpt's `max`, spelled `minmax` here as for the builtin tools, and `entropy`).
pub(crate) const MODELOPT_CALIBRATION_METHODS: [&str; 2] = ["minmax", "entropy"];

/// Calibration methods `[fp8] method` accepts (infer-build's FP8 quantiser: the largest
/// magnitude, or its 99.999th percentile).
pub const FP8_CALIBRATION_METHODS: [&str; 2] = ["minmax", "percentile"];

/// `[accuracy]`: what a converted (FP16, INT8) model must keep against the FP32 model.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Accuracy {
    /// A directory of evaluation batches (`*.npy` / `*.npz`, like calibration data); default:
    /// the calibration data, else generated inputs.
    pub data: Option<Located<PathBuf>>,
    /// Per-precision limits (`[accuracy.fp16]`, `[accuracy.int8]`); unset ones keep the
    /// defaults.
    pub limits: BTreeMap<Precision, AccuracyLimits>,
}

/// Limits of one precision; `None` keeps the default.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct AccuracyLimits {
    /// Largest absolute difference of any output element.
    pub max_abs: Option<f64>,
    /// Largest difference relative to the FP32 output's largest magnitude.
    pub max_rel: Option<f64>,
    /// Smallest fraction of rows whose arg-max agrees (classification-shaped outputs).
    pub min_top1: Option<f64>,
}

/// `[warmup]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Warmup {
    pub enabled: bool,
    /// Explicit warm-up batch sizes; `None` means the default of [`Recipe::warmup_batch_sizes`].
    pub batch_sizes: Option<Vec<u32>>,
    /// A file of sample requests (V2 JSON), relative to the recipe's directory; warm-up makes
    /// dtype-valid synthetic data when absent.
    pub samples: Option<Located<PathBuf>>,
}

/// `[image]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    /// Repository the images are named after (`registry.example.com/ml/resnet50`). Defaults to
    /// `localhost/infer-build/{model.name}` (span: the `[image]` table).
    pub repository: Located<String>,
    /// Tag template; placeholder names are checked here, the rendered tag by the plan.
    pub tag: Located<String>,
    /// Base image override (a reference, ideally pinned `@sha256:…`).
    pub base: Option<Located<String>>,
    /// Numeric user id the image runs as (never 0).
    pub user: u32,
    /// Extra image labels (sorted by key).
    pub labels: BTreeMap<String, String>,
    /// `[image] layout`: what a build writes per target (default [`ImageLayout::Combined`]).
    pub layout: ImageLayout,
}

/// What a build writes per target: the image that carries its model, or that image and beside
/// it the split pair (a runtime image shared by models, and the model as an artifact to mount).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ImageLayout {
    /// One image per target: runtime, base and model together.
    #[default]
    Combined,
    /// The combined image, plus a runtime image without the model and the model as an OCI
    /// artifact that a Kubernetes image volume mounts into it (`docs/image-format.md`).
    Split,
}

impl ImageLayout {
    pub const NAMES: [&'static str; 2] = ["combined", "split"];

    pub fn parse(s: &str) -> Option<ImageLayout> {
        match s {
            "combined" => Some(ImageLayout::Combined),
            "split" => Some(ImageLayout::Split),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ImageLayout::Combined => "combined",
            ImageLayout::Split => "split",
        }
    }
}

/// The placeholders a tag template may use.
pub(crate) const TAG_PLACEHOLDERS: [&str; 8] = [
    "model",
    "version",
    "target",
    "sm",
    "gpu",
    "precision",
    "tensorrt",
    "cuda",
];

/// `[deploy]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Deploy {
    /// The fleet's NVIDIA driver version (`"550.54.15"`); resolution picks builds this driver
    /// runs and refuses pins it cannot.
    pub node_driver: Option<Located<Version>>,
    pub replicas: Replicas,
    pub resources: Resources,
    /// p99 latency budget in milliseconds.
    pub latency_slo_ms: Option<u32>,
    /// Expected peak requests per second across all replicas.
    pub peak_qps: Option<f64>,
    /// Seconds the runtime keeps serving after SIGTERM while endpoints drain.
    pub drain_delay_s: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicas {
    pub min: u32,
    pub max: u32,
}

/// Kubernetes resource requests, as Kubernetes quantities (`"2"`, `"500m"`, `"4Gi"`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Resources {
    pub cpu: Option<String>,
    pub memory: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_numerically_and_match_as_pins() {
        let v = |s| parse_version(s).unwrap();
        assert!(v("10.10") > v("10.9"));
        assert_eq!(v("10.8"), v("10.8.0"));
        assert!(v("10.8").is_prefix_of(&v("10.8.0.43")));
        assert!(!v("10.8").is_prefix_of(&v("10.9.0")));
        assert!(!v("10.8.1").is_prefix_of(&v("10.8")));
        assert_eq!(v("535.104.05").to_string(), "535.104.05");
        for bad in [
            "",
            "10.",
            ".1",
            "1.2.3.4.5",
            "a",
            "10.x",
            "9999999999",
            "-1",
            " 10.8",
            "+1",
        ] {
            assert!(parse_version(bad).is_none(), "{bad}");
        }
    }
}
