//! The second stage: the schema. Reads each table of the spanned tree through [`Checker`],
//! applies defaults, and checks the rules that span several keys (batch sizes against
//! `max_batch_size`, shape profiles against shapes, the tag template against the targets).
//!
//! Pure: no filesystem. The paths a recipe names are checked lexically here (relative, not
//! escaping the recipe's directory) and handed back as [`FileRef`]s for [`super::load`] to
//! check on disk.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use toml::de::{DeTable, DeValue};

use super::check::{closest, join, Checker, Table};
use super::diagnostic::{Located, Span};
use super::types::*;
use infer_spec::runtime::PadMisfit;

/// A file the recipe names, for [`super::load`] to check on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FileRef {
    pub(crate) path: Located<PathBuf>,
    pub(crate) kind: FileKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// `model.onnx`: a regular file.
    Model,
    /// `int8.calibration`: a directory or a regular file (a calibration cache).
    Calibration,
    /// `warmup.samples`: a regular file.
    Samples,
    /// `accuracy.data`: a directory.
    Evaluation,
    /// `text.tokenizer`: a regular file.
    Tokenizer,
    /// `fp8.calibration`: a directory of batches.
    CalibrationBatches,
    /// `vision.labels`: a regular file, one label per line.
    Labels,
}

const ROOT_KEYS: [&str; 13] = [
    "model",
    "targets",
    "engine",
    "int8",
    "fp8",
    "accuracy",
    "batching",
    "warmup",
    "image",
    "deploy",
    "text",
    "vision",
    "response_cache",
];
const TEXT_KEYS: [&str; 17] = [
    "tokenizer",
    "max_length",
    "truncate",
    "special_tokens",
    "prefix",
    "input_ids",
    "attention_mask",
    "token_type_ids",
    "output",
    "pooling",
    "normalize",
    "token_budget",
    "max_padding_percent",
    "pairs",
    "activation",
    "labels",
    "max_client_batch_size",
];
const ENGINE_KEYS: [&str; 3] = ["cpu", "convert", "threads"];
const MODEL_KEYS: [&str; 6] = [
    "name",
    "version",
    "onnx",
    "description",
    "inputs",
    "outputs",
];
const INPUT_KEYS: [&str; 4] = ["datatype", "shape", "profile", "pad"];
const OUTPUT_KEYS: [&str; 2] = ["datatype", "shape"];
const PROFILE_KEYS: [&str; 3] = ["min", "opt", "max"];
const TARGETS_KEYS: [&str; 7] = [
    "gpus",
    "precision",
    "cpu",
    "tensorrt",
    "cuda",
    "version_compatible",
    "hardware_compatibility",
];
const INT8_KEYS: [&str; 3] = ["calibration", "qdq", "method"];
const FP8_KEYS: [&str; 2] = ["calibration", "method"];
const ACCURACY_KEYS: [&str; 5] = ["data", "fp16", "int8", "fp8", "bf16"];
const LIMIT_KEYS: [&str; 3] = ["max_abs", "max_rel", "min_top1"];
const BATCHING_KEYS: [&str; 7] = [
    "max_batch_size",
    "preferred_batch_sizes",
    "max_queue_delay_us",
    "queue_delay",
    "max_queue_size",
    "default_timeout_ms",
    "instances",
];
const WARMUP_KEYS: [&str; 3] = ["enabled", "batch_sizes", "samples"];
const IMAGE_KEYS: [&str; 6] = ["repository", "tag", "base", "user", "labels", "layout"];
const DEPLOY_KEYS: [&str; 6] = [
    "node_driver",
    "replicas",
    "resources",
    "latency_slo_ms",
    "peak_qps",
    "drain_delay_s",
];
const REPLICAS_KEYS: [&str; 2] = ["min", "max"];
const RESOURCES_KEYS: [&str; 2] = ["cpu", "memory"];

/// Defaults, documented key by key in `docs/recipe.md`.
pub const DEFAULT_MAX_BATCH_SIZE: u32 = 8;
pub const DEFAULT_MAX_QUEUE_DELAY_US: u64 = 1_000;
pub const DEFAULT_MIN_QUEUE_SIZE: u32 = 1_024;
pub const DEFAULT_TIMEOUT_MS: u64 = 5_000;
pub const DEFAULT_USER: u32 = 65_532;
pub const DEFAULT_DRAIN_DELAY_S: u32 = 5;
pub const DEFAULT_TAG: &str = "{version}-{target}";

/// Largest values accepted, so that nothing downstream multiplies its way into an overflow.
const MAX_BATCH: i64 = 4_096;
const MAX_DIM: i64 = 1 << 31;
const MAX_RANK: usize = 8;

/// What validation found: the recipe when there were no problems, and the files it names
/// (even when there were problems, so `load` can report a missing model alongside them).
pub(crate) struct Outcome {
    pub(crate) recipe: Option<Recipe>,
    pub(crate) files: Vec<FileRef>,
}

pub(crate) fn validate(cx: &mut Checker<'_>, doc: &DeTable<'_>, file: &Path) -> Outcome {
    cx.root_keys = &ROOT_KEYS;
    let root = cx.root(doc);
    cx.unknown_keys(&root, &ROOT_KEYS);
    let mut files = Vec::new();

    // Targets and batching first: the model's shapes are checked against them.
    let targets_table = cx.table(&root, "targets");
    let targets = targets(cx, targets_table.as_ref());
    let batching_table = cx.table(&root, "batching");
    let batching = batching(cx, batching_table.as_ref());
    let model = match cx.table(&root, "model") {
        Some(t) => model(cx, &t, &batching, &targets, &mut files),
        None => {
            if doc.get("model").is_none() {
                cx.error_hint(
                    Span::START,
                    "model",
                    "missing required table [model]",
                    "start the recipe with `[model]` and its `name`, `version`, `onnx` and inputs",
                );
            }
            None
        }
    };
    let engine_table = cx.table(&root, "engine");
    let engine = engine(cx, engine_table.as_ref());
    check_cpu_precisions(cx, &targets, &engine);
    let tool = engine.convert.value;
    let int8_table = cx.table(&root, "int8");
    let int8 = int8_table.as_ref().map(|t| int8(cx, t, tool, &mut files));
    check_int8_needed(cx, &targets, int8_table.as_ref(), int8.as_ref());
    let fp8_table = cx.table(&root, "fp8");
    let fp8 = fp8_table.as_ref().map(|t| fp8(cx, t, tool, &mut files));
    check_fp8_needed(cx, &targets, fp8_table.as_ref());
    let accuracy_table = cx.table(&root, "accuracy");
    let accuracy = accuracy_table
        .as_ref()
        .map(|t| accuracy(cx, t, &mut files))
        .unwrap_or_default();
    let warmup_table = cx.table(&root, "warmup");
    let warmup = warmup(cx, warmup_table.as_ref(), &batching, &mut files);
    let image_table = cx.table(&root, "image");
    let model_name = model.as_ref().map(|m| m.name.as_str()).unwrap_or("model");
    let image = image(cx, image_table.as_ref(), model_name, &targets);
    let deploy_table = cx.table(&root, "deploy");
    let deploy = deploy(cx, deploy_table.as_ref(), &batching);
    let cache_table = cx.table(&root, "response_cache");
    let response_cache = cache_table.as_ref().and_then(|t| {
        cx.unknown_keys(t, &["max_bytes"]);
        if t.inner.get("max_bytes").is_none() {
            cx.missing(t, "max_bytes", "67108864");
            return None;
        }
        cx.int(
            t,
            "max_bytes",
            1,
            infer_spec::runtime::MAX_RESPONSE_CACHE_BYTES as i64,
            "byte count",
        )
        .map(|b| b.value as u64)
    });
    let text_table = cx.table(&root, "text");
    if let (Some(t), Some(m)) = (text_table.as_ref(), model.as_ref()) {
        if let Some(padded) = m.inputs.iter().find(|i| i.pad.is_some()) {
            cx.error_hint(
                t.span,
                &t.key,
                format!(
                    "input {:?} has a pad, and a [text] model pads its own inputs",
                    padded.name
                ),
                "remove `pad` from the inputs: the tokenizer's padding applies",
            );
        }
    }
    let text = match (text_table.as_ref(), model.as_ref()) {
        (Some(t), Some(m)) => text(cx, t, m, &mut files),
        _ => None,
    };
    let vision_table = cx.table(&root, "vision");
    let vision = match (vision_table.as_ref(), model.as_ref()) {
        (Some(v), Some(m)) => {
            if let Some(t) = &text_table {
                cx.error_hint(
                    v.span,
                    &v.key,
                    "a model takes text ([text]) or images ([vision]), not both",
                    format!("remove [{}] or [{}]", t.key, v.key),
                );
            }
            super::vision::vision(cx, v, m, &mut files)
        }
        _ => None,
    };

    let recipe = match (cx.diagnostics.is_empty(), model) {
        (true, Some(model)) => Some(Recipe {
            file: file.to_path_buf(),
            dir: file.parent().map(Path::to_path_buf).unwrap_or_default(),
            model,
            targets,
            int8,
            fp8,
            accuracy,
            batching,
            warmup,
            image,
            deploy,
            engine,
            text,
            vision,
            response_cache,
        }),
        _ => None,
    };
    Outcome { recipe, files }
}

// ---------------------------------------------------------------------------------------------
// [text]

/// A string key naming one of a set (`parse` says which), or `unknown KEY "value"` with `hint`.
pub(super) fn one_of<T>(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    key: &str,
    parse: impl Fn(&str) -> Option<T>,
    hint: &str,
) -> Option<T> {
    let v = cx.string(t, key)?;
    let parsed = parse(&v.value);
    if parsed.is_none() {
        cx.error_hint(v.span, &v.key, format!("unknown {key} {:?}", v.value), hint);
    }
    parsed
}

/// The token length when neither `max_length` nor the ids input's profile says one.
const DEFAULT_MAX_LENGTH: u32 = 512;

#[allow(
    clippy::too_many_lines,
    reason = "the `[text]` keys in file order, like every table of the recipe: a list of checks"
)]
fn text(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    model: &Model,
    files: &mut Vec<FileRef>,
) -> Option<Text> {
    use infer_spec::text::Pooling;
    cx.unknown_keys(t, &TEXT_KEYS);
    let tokenizer = cx
        .required_string(t, "tokenizer", "\"tokenizer.json\"")
        .and_then(|p| relative_path(cx, p, "the tokenizer"));
    if let Some(p) = &tokenizer {
        files.push(FileRef {
            path: p.clone(),
            kind: FileKind::Tokenizer,
        });
    }
    // An input the tokenizer fills: named explicitly (it must exist and take integers), or
    // by the usual name when the model has one.
    let input = |cx: &mut Checker<'_>, key: &str, required: bool| -> Option<String> {
        let named = cx.string(t, key);
        let name = named.as_ref().map(|n| n.value.clone()).or_else(|| {
            model
                .inputs
                .iter()
                .any(|i| i.name == key)
                .then(|| key.to_owned())
        });
        let Some(name) = name else {
            if required {
                cx.error_hint(
                    span_or(Some(t)),
                    &format!("text.{key}"),
                    format!("the model has no input named {key:?}"),
                    format!("name the input that takes the token ids: `{key} = \"...\"`"),
                );
            }
            return None;
        };
        let at = named.as_ref().map_or(span_or(Some(t)), |n| n.span);
        match model.inputs.iter().find(|i| i.name == name) {
            None => cx.error_hint(
                at,
                &format!("text.{key}"),
                format!("the model has no input {name:?}"),
                format!(
                    "the model's inputs are {:?}",
                    model.inputs.iter().map(|i| &i.name).collect::<Vec<_>>()
                ),
            ),
            Some(i)
                if !matches!(i.datatype, DataType::I64 | DataType::I32) || i.shape.len() != 2 =>
            {
                cx.error_hint(
                    at,
                    &format!("text.{key}"),
                    format!("input {name:?} is not [batch, sequence] int64 or int32"),
                    "point it at the input that takes token ids, attention mask or token type ids",
                )
            }
            Some(_) => {}
        }
        Some(name)
    };
    let input_ids = input(cx, "input_ids", true);
    let attention_mask = input(cx, "attention_mask", false);
    let token_type_ids = input(cx, "token_type_ids", false);
    let named = [&input_ids, &attention_mask, &token_type_ids];
    let mut seen: Vec<&String> = named.iter().filter_map(|n| n.as_ref()).collect();
    let filled = seen.len();
    seen.sort_unstable();
    seen.dedup();
    if seen.len() != filled {
        cx.error_hint(
            span_or(Some(t)),
            "text",
            "input_ids, attention_mask and token_type_ids name the same input",
            "give each the model input it fills",
        );
    } else if let Some(other) = model.inputs.iter().find(|i| !seen.contains(&&i.name)) {
        cx.error_hint(
            span_or(Some(t)),
            "text",
            format!(
                "the model input {:?} is not one the tokenizer fills",
                other.name
            ),
            "name it as input_ids, attention_mask or token_type_ids",
        );
    }
    let profile_max = input_ids.as_ref().and_then(|n| {
        let i = model.inputs.iter().find(|i| &i.name == n)?;
        match i.shape.get(1) {
            Some(-1) => i.profile.as_ref()?.max.first().map(|&m| m as u32),
            Some(&d) => Some(d as u32),
            None => None,
        }
    });
    let max_length = match cx.int(
        t,
        "max_length",
        1,
        i64::from(infer_spec::text::MAX_LENGTH),
        "token count",
    ) {
        Some(m) => {
            if let Some(limit) = profile_max.filter(|&l| m.value as u32 > l) {
                cx.error_hint(
                    m.span,
                    &m.key,
                    format!(
                        "max_length {} is more than the model's sequence length {limit}",
                        m.value
                    ),
                    "raise the input's profile max, or lower max_length",
                );
            }
            m.value as u32
        }
        None => profile_max.unwrap_or(DEFAULT_MAX_LENGTH),
    };
    let pooling = one_of(
        cx,
        t,
        "pooling",
        Pooling::parse,
        "use \"mean\", \"cls\", \"last\" or \"none\" (the model pools itself)",
    );
    let flag = |cx: &mut Checker<'_>, key: &str, default: bool| {
        cx.bool(t, key).map_or(default, |b| b.value)
    };
    let truncate = flag(cx, "truncate", true);
    let special_tokens = flag(cx, "special_tokens", true);
    let pairs = flag(cx, "pairs", false);
    let activation = one_of(
        cx,
        t,
        "activation",
        infer_spec::text::Activation::parse,
        "use \"sigmoid\" (a reranker, multi-label), \"softmax\" (single-label classifier) or \"none\"",
    )
    .unwrap_or_default();
    // Scores are not normalised; embeddings are by default.
    let normalize = flag(
        cx,
        "normalize",
        activation == infer_spec::text::Activation::None,
    );
    let labels = match cx.array(
        t,
        "labels",
        "a list of label names",
        "[\"negative\", \"positive\"]",
    ) {
        Some((list, key, _)) => {
            let mut labels = Vec::new();
            for (i, v) in list.iter().enumerate() {
                match v.get_ref().as_str() {
                    Some(s) => labels.push(s.to_owned()),
                    None => cx.expected(v, &format!("{key}[{i}]"), "a string (a label name)"),
                }
            }
            labels
        }
        None => Vec::new(),
    };
    let prefix = cx.string(t, "prefix").map(|p| p.value).unwrap_or_default();
    let token_budget = cx
        .int(t, "token_budget", 1, i64::from(u32::MAX), "token count")
        .map_or(0, |b| b.value as u32);
    let max_padding_percent = cx
        .int(
            t,
            "max_padding_percent",
            0,
            10_000,
            "0 to 10000 (a percent of the batch's own tokens)",
        )
        .map(|p| p.value as u32);
    let max_client_batch_size = cx
        .int(
            t,
            "max_client_batch_size",
            1,
            i64::from(infer_spec::text::MAX_CLIENT_BATCH_SIZE),
            &format!(
                "1 to {} (texts in one request)",
                infer_spec::text::MAX_CLIENT_BATCH_SIZE
            ),
        )
        .map_or(infer_spec::text::DEFAULT_MAX_CLIENT_BATCH_SIZE, |m| {
            m.value as u32
        });
    let output = output_key(cx, t, model);
    Some(Text {
        tokenizer: tokenizer?,
        max_length,
        truncate,
        special_tokens,
        prefix,
        input_ids: input_ids?,
        attention_mask,
        token_type_ids,
        output,
        pooling,
        normalize,
        token_budget,
        max_padding_percent,
        pairs,
        activation,
        labels,
        max_client_batch_size,
        at: Located::new((), span_or(Some(t)), "text"),
    })
}

/// `output` of a pre-processing table (`[text]`, `[vision]`): a string naming one of the model's
/// declared outputs (any name when the recipe declares none).
pub(super) fn output_key(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    model: &Model,
) -> Option<Located<String>> {
    let output = cx.string(t, "output");
    if let (Some(o), false) = (&output, model.outputs.is_empty()) {
        if !model.outputs.iter().any(|m| m.name == o.value) {
            cx.error_hint(
                o.span,
                &o.key,
                format!("the model has no output {:?}", o.value),
                format!(
                    "the model's outputs are {:?}",
                    model.outputs.iter().map(|m| &m.name).collect::<Vec<_>>()
                ),
            );
        }
    }
    output
}

// ---------------------------------------------------------------------------------------------
// [engine]

fn engine(cx: &mut Checker<'_>, t: Option<&Table<'_, '_>>) -> Engine {
    let mut out = Engine {
        cpu: Located::new(CpuEngine::Auto, span_or(t), "engine.cpu"),
        convert: Located::new(ConvertTool::Builtin, span_or(t), "engine.convert"),
        threads: None,
    };
    let Some(t) = t else {
        return out;
    };
    cx.unknown_keys(t, &ENGINE_KEYS);
    if let Some(v) = cx.string(t, "cpu") {
        match CpuEngine::parse(&v.value) {
            Some(e) => out.cpu = Located::new(e, v.span, v.key.clone()),
            None => cx.error_hint(
                v.span,
                &v.key,
                format!("unknown CPU engine {:?}", v.value),
                format!(
                    "engines: {} (\"auto\" measures each and ships the faster)",
                    CpuEngine::expected()
                ),
            ),
        }
    }
    if let Some(v) = cx.int(
        t,
        "threads",
        1,
        i64::from(infer_spec::runtime::MAX_THREADS),
        "an integer from 1 to 1024",
    ) {
        if out.cpu.value == CpuEngine::TRACT {
            cx.error_hint(
                v.span,
                &v.key,
                "engine.threads is for engines with threads of their own (ONNX Runtime, OpenVINO); tract computes each batch on its instance's thread",
                "remove it (more instances give tract more cores: [batching] instances), or use engine.cpu = \"auto\", \"onnxruntime\" or \"openvino\"",
            );
        }
        out.threads = Some(Located::new(v.value as u32, v.span, v.key.clone()));
    }
    if let Some(v) = cx.string(t, "convert") {
        match ConvertTool::parse(&v.value) {
            Some(c) => out.convert = Located::new(c, v.span, v.key.clone()),
            None => cx.error_hint(
                v.span,
                &v.key,
                format!("unknown precision converter {:?}", v.value),
                "converters: \"builtin\" (the pinned environment infer-build creates, no torch), \"modelopt\" (NVIDIA Model Optimizer, from a Python with it and torch)",
            ),
        }
    }
    out
}

/// A CPU precision other than FP32 needs an engine that computes in it: `engine.cpu` may not
/// force one that does not.
fn check_cpu_precisions(cx: &mut Checker<'_>, targets: &Targets, engine: &Engine) {
    let CpuEngine::Only(kind) = engine.cpu.value else {
        return;
    };
    let def = kind.def();
    for p in targets.cpu.iter().filter(|p| !def.computes(p.value)) {
        let able: Vec<&str> = infer_spec::engine::EngineKind::cpu_engines()
            .filter(|d| d.computes(p.value))
            .map(|d| d.name)
            .collect();
        cx.error_hint(
            p.span,
            &p.key,
            format!(
                "{} computes in fp32 only (engine.cpu = {:?} at line {}), and this CPU target asks for {}",
                def.title,
                engine.cpu.value.as_str(),
                engine.cpu.span.line,
                p.value
            ),
            format!(
                "use engine.cpu = \"auto\" or {}, or remove {:?} from `cpu`",
                able.iter()
                    .map(|n| format!("\"{n}\""))
                    .collect::<Vec<_>>()
                    .join(" or "),
                p.value.as_str()
            ),
        );
    }
}

/// A located value's span, or the table's (where a defaulted key would be written).
pub(super) fn span_or(table: Option<&Table<'_, '_>>) -> Span {
    table.map(|t| t.span).unwrap_or(Span::START)
}

// ---------------------------------------------------------------------------------------------
// [model]

fn model(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    b: &Batching,
    targets: &Targets,
    files: &mut Vec<FileRef>,
) -> Option<Model> {
    cx.unknown_keys(t, &MODEL_KEYS);
    let name = cx.required_string(t, "name", "\"resnet50\"");
    let name = name.and_then(|n| {
        if valid_model_name(&n.value) {
            Some(n.value)
        } else {
            cx.error_hint(
                n.span,
                &n.key,
                format!("invalid model name {:?}", n.value),
                "use 1 to 63 lowercase letters, digits, `.`, `_` or `-`, starting with a letter or digit (the name is used in URLs, image names and Kubernetes objects)",
            );
            None
        }
    });
    let version = cx.required_string(t, "version", "\"1.0.0\"");
    let version = version.and_then(|v| {
        if valid_version(&v.value) {
            Some(v.value)
        } else {
            cx.error_hint(
                v.span,
                &v.key,
                format!("invalid model version {:?}", v.value),
                "use 1 to 64 letters, digits, `.`, `_` or `-`, starting with a letter or digit (the version can appear in image tags)",
            );
            None
        }
    });
    let onnx = cx.required_string(t, "onnx", "\"model.onnx\"");
    let onnx = onnx.and_then(|p| relative_path(cx, p, "the ONNX model"));
    if let Some(p) = &onnx {
        files.push(FileRef {
            path: p.clone(),
            kind: FileKind::Model,
        });
    }
    let description = cx.string(t, "description").map(|d| d.value);

    let inputs = match cx.table(t, "inputs") {
        Some(inputs) => {
            let list = tensors(cx, &inputs, true, b, targets);
            if inputs.inner.is_empty() {
                cx.error_hint(
                    inputs.span,
                    &inputs.key,
                    "the model has no inputs",
                    "declare each input as `[model.inputs.NAME]` with `datatype` and `shape`",
                );
            }
            list
        }
        None => {
            if t.inner.get("inputs").is_none() {
                cx.error_hint(
                    t.span,
                    &join(&t.key, "inputs"),
                    "missing required table [model.inputs.NAME]",
                    "declare each input: `[model.inputs.input]` with `datatype = \"fp32\"` and `shape = [-1, 3, 224, 224]`",
                );
            }
            None
        }
    };
    let outputs = match cx.table(t, "outputs") {
        Some(outputs) => tensors(cx, &outputs, false, b, targets),
        None => Some(Vec::new()),
    };
    Some(Model {
        name: name?,
        version: version?,
        onnx: onnx?,
        description,
        inputs: inputs?,
        outputs: outputs?,
    })
}

pub(super) fn valid_model_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && (b[0].is_ascii_lowercase() || b[0].is_ascii_digit())
        && b.iter().all(|&c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        })
}

pub(super) fn valid_version(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 64
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// Lexical checks of a path the recipe names: relative, not leaving the recipe's directory.
/// (`load` repeats the containment check on disk, where symbolic links are resolved.)
pub(super) fn relative_path(
    cx: &mut Checker<'_>,
    p: Located<String>,
    what: &str,
) -> Option<Located<PathBuf>> {
    let s = p.value.as_str();
    let problem = if s.is_empty() {
        Some("is empty")
    } else if s.contains('\0') {
        Some("contains a NUL character")
    } else if Path::new(s).is_absolute() || s.starts_with('/') || s.starts_with('\\') {
        Some("is absolute")
    } else {
        let mut depth: i64 = 0;
        let mut escapes = false;
        for c in Path::new(s).components() {
            match c {
                Component::ParentDir => depth -= 1,
                Component::Normal(_) => depth += 1,
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => escapes = true,
            }
            if depth < 0 {
                escapes = true;
            }
        }
        escapes.then_some("leaves the recipe's directory")
    };
    match problem {
        Some(problem) => {
            cx.error_hint(
                p.span,
                &p.key,
                format!("path {s:?} to {what} {problem}"),
                "write a path relative to the recipe's directory that stays inside it, such as \"models/model.onnx\"; copy or link the file there",
            );
            None
        }
        None => Some(p.map(PathBuf::from)),
    }
}

/// `[model.inputs.*]` or `[model.outputs.*]`: every entry, `None` when any is wrong.
fn tensors(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    inputs: bool,
    b: &Batching,
    targets: &Targets,
) -> Option<Vec<Tensor>> {
    let mut out = Vec::new();
    let mut spans = Vec::new();
    let mut ok = true;
    for (k, v) in t.inner.iter() {
        let name: &str = k.get_ref();
        let key = join(&t.key, name);
        let DeValue::Table(inner) = v.get_ref() else {
            cx.expected_hint(
                v,
                &key,
                "a table with `datatype` and `shape`",
                &format!("write a `[{key}]` header followed by `datatype = \"fp32\"` and `shape = [-1, ...]`"),
            );
            ok = false;
            continue;
        };
        let table = Table {
            inner,
            key,
            span: cx.span_of(k),
        };
        match tensor(cx, &table, name, inputs, b, targets) {
            Some(tensor) => {
                spans.push((table.span, table.key.clone()));
                out.push(tensor);
            }
            None => ok = false,
        }
    }
    // Padding is the model's batching rule: every input says its value, or none does.
    if let Some(padded) = out.iter().find(|i| i.pad.is_some()) {
        for (t, (span, key)) in out.iter().zip(&spans) {
            if t.pad.is_none() {
                cx.error_hint(
                    *span,
                    key,
                    format!(
                        "no `pad`, though input {:?} has one: requests of different lengths are padded on every input",
                        padded.name
                    ),
                    "add `pad = 0` (or this input's padding value), or remove `pad` from every input",
                );
                ok = false;
            }
        }
    }
    ok.then_some(out)
}

fn tensor(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    name: &str,
    input: bool,
    b: &Batching,
    targets: &Targets,
) -> Option<Tensor> {
    cx.unknown_keys(t, if input { &INPUT_KEYS } else { &OUTPUT_KEYS });
    if name.is_empty() || name.chars().count() > 256 || name.chars().any(char::is_control) {
        cx.error_hint(
            t.span,
            &t.key,
            "invalid tensor name",
            "use the tensor's name in the ONNX graph (1 to 256 printable characters)",
        );
    }
    let datatype = match cx.required_string(t, "datatype", "\"fp32\"") {
        Some(d) => match DataType::parse_recipe(&d.value) {
            Some(dt) => Some(dt),
            None => {
                let names: Vec<&str> = DataType::ALL.iter().map(|d| d.recipe_name()).collect();
                let mut message = format!("unknown datatype {:?}", d.value);
                let lower = d.value.to_ascii_lowercase();
                let guess = match lower.as_str() {
                    "float" | "float32" | "f32" => Some("fp32"),
                    "half" | "float16" | "f16" => Some("fp16"),
                    "double" | "float64" | "f64" => Some("fp64"),
                    "bfloat16" => Some("bf16"),
                    "long" | "i64" => Some("int64"),
                    "int" | "i32" => Some("int32"),
                    "string" | "str" => Some("bytes"),
                    "boolean" => Some("bool"),
                    _ => closest(&d.value, &names),
                };
                if let Some(g) = guess {
                    message.push_str(&format!("; did you mean `{g}`?"));
                }
                cx.error_hint(
                    d.span,
                    &d.key,
                    message,
                    format!("datatypes: {}", names.join(", ")),
                );
                None
            }
        },
        None => None,
    };
    let shape = match t.inner.get("shape") {
        None => {
            cx.missing(t, "shape", "[-1, 3, 224, 224]");
            None
        }
        Some(_) => cx.int_array(
            t,
            "shape",
            -1,
            MAX_DIM,
            "dimension (-1 for dynamic, else a positive size)",
            "[-1, 3, 224, 224]",
        ),
    };
    let shape = shape.and_then(|s| {
        let mut ok = true;
        for d in &s.value {
            if d.value == 0 {
                cx.error_hint(
                    d.span,
                    &d.key,
                    "a dimension cannot be 0",
                    "write -1 for a dynamic dimension or its fixed size",
                );
                ok = false;
            }
        }
        if s.value.is_empty() || s.value.len() > MAX_RANK {
            cx.error_hint(
                s.span,
                &s.key,
                format!(
                    "expected 1 to {MAX_RANK} dimensions, found {}",
                    s.value.len()
                ),
                "the first dimension is the batch: shape = [-1, ...]",
            );
            ok = false;
        }
        if let Some(first) = s.value.first() {
            if first.value != -1 && !(first.value == 1 && b.max_batch_size == 1) {
                cx.error_hint(
                    first.span,
                    &first.key,
                    format!(
                        "the first dimension is the batch dimension and must be -1 (dynamic), found {}",
                        first.value
                    ),
                    "write -1 first; a model that only takes batches of 1 can say 1 with `max_batch_size = 1`",
                );
                ok = false;
            }
        }
        ok.then_some(s)
    });
    if let (Some(shape), true, false) = (&shape, input, t.inner.contains_key("profile")) {
        if let Some(d) = shape.value.iter().skip(1).find(|d| d.value == -1) {
            let why = if targets.gpus.is_empty() {
                "this dimension is dynamic, and the runtime needs its bounds to check requests: the input has no profile"
            } else {
                "this dimension is dynamic, and TensorRT engines need its range: the input has no profile"
            };
            cx.error_hint(
                d.span,
                &d.key,
                why,
                "add `profile = { min = [...], opt = [...], max = [...] }` with one size per dimension after the batch dimension",
            );
        }
    }
    let profile = if input {
        match (cx.table(t, "profile"), &shape) {
            (Some(p), Some(shape)) => profile(cx, &p, shape).map(Some),
            (Some(p), None) => {
                cx.unknown_keys(&p, &PROFILE_KEYS);
                None
            }
            (None, _) => Some(None),
        }
    } else {
        Some(None)
    };
    let pad = if input {
        pad(cx, t, datatype, shape.as_ref())
    } else {
        Some(None)
    };
    Some(Tensor {
        name: name.to_string(),
        datatype: datatype?,
        shape: shape?.value.into_iter().map(|d| d.value).collect(),
        profile: profile?,
        pad: pad?,
    })
}

/// An input's `pad`: the value padding positions get when requests of different lengths share
/// a batch; for token-like inputs (`int32`/`int64`, shape `[-1, -1]`).
fn pad(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    datatype: Option<DataType>,
    shape: Option<&Located<Vec<Located<i64>>>>,
) -> Option<Option<i64>> {
    if t.inner.get("pad").is_none() {
        return Some(None);
    }
    let v = cx.int(
        t,
        "pad",
        i64::MIN,
        i64::MAX,
        "padding value (a whole number)",
    )?;
    let dims: Option<Vec<i64>> = shape.map(|s| s.value.iter().map(|d| d.value).collect());
    let (Some(datatype), Some(dims)) = (datatype, dims) else {
        return None;
    };
    match infer_spec::runtime::pad_misfit(datatype, &dims, v.value) {
        Some(PadMisfit::NotTokenLike) => {
            cx.error_hint(
                v.span,
                &v.key,
                format!(
                    "`pad` is for int32 or int64 inputs of shape [-1, -1] (token ids, masks), this one is {} {dims:?}",
                    datatype.recipe_name()
                ),
                "remove `pad`: only token-like inputs are padded, and a model with other inputs batches requests of equal shapes",
            );
            return None;
        }
        Some(PadMisfit::OutOfRange) => {
            cx.error(
                v.span,
                &v.key,
                format!("pad {} does not fit {}", v.value, datatype.recipe_name()),
            );
            return None;
        }
        None => {}
    }
    Some(Some(v.value))
}

/// `profile = { min = [...], opt = [...], max = [...] }`: one entry per dimension after the
/// batch dimension; fixed dimensions repeat their size; dynamic ones need
/// `1 <= min <= opt <= max`.
fn profile(
    cx: &mut Checker<'_>,
    p: &Table<'_, '_>,
    shape: &Located<Vec<Located<i64>>>,
) -> Option<ShapeProfile> {
    cx.unknown_keys(p, &PROFILE_KEYS);
    let dims = &shape.value[1..];
    let example = format!(
        "[{}]",
        dims.iter()
            .map(|d| if d.value == -1 {
                "128".to_string()
            } else {
                d.value.to_string()
            })
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !dims.iter().any(|d| d.value == -1) {
        cx.error_hint(
            p.span,
            &p.key,
            "a profile is only for inputs with dynamic dimensions after the batch dimension, and this shape has none",
            "remove the profile, or write -1 for the dimensions that vary",
        );
        return None;
    }
    let mut parts = Vec::new();
    for name in PROFILE_KEYS {
        if p.inner.get(name).is_none() {
            cx.missing(p, name, &example);
            continue;
        }
        let Some(list) = cx.int_array(p, name, 1, MAX_DIM, "positive size", &example) else {
            continue;
        };
        if list.value.len() != dims.len() {
            cx.error_hint(
                list.span,
                &list.key,
                format!(
                    "expected {} sizes (one per dimension after the batch dimension of shape {}), found {}",
                    dims.len(),
                    show_dims(&shape.value),
                    list.value.len()
                ),
                format!("write `{name} = {example}`; the batch range comes from [batching]"),
            );
            continue;
        }
        parts.push((name, list));
    }
    if parts.len() != 3 {
        return None;
    }
    let mut ok = true;
    for (i, dim) in dims.iter().enumerate() {
        let [min, opt, max] = [
            &parts[0].1.value[i],
            &parts[1].1.value[i],
            &parts[2].1.value[i],
        ];
        if dim.value != -1 {
            for v in [min, opt, max] {
                if v.value != dim.value {
                    cx.error_hint(
                        v.span,
                        &v.key,
                        format!(
                            "dimension {} of the shape is fixed at {}, but the profile says {}",
                            i + 1,
                            dim.value,
                            v.value
                        ),
                        format!("repeat the fixed size {} here", dim.value),
                    );
                    ok = false;
                }
            }
        } else {
            for (a, b, an, bn) in [(min, opt, "min", "opt"), (opt, max, "opt", "max")] {
                if a.value > b.value {
                    cx.error_hint(
                        a.span,
                        &a.key,
                        format!(
                            "profile {an} ({}) is larger than {bn} ({})",
                            a.value, b.value
                        ),
                        "a profile needs min <= opt <= max for every dimension",
                    );
                    ok = false;
                }
            }
        }
    }
    let take = |i: usize| parts[i].1.value.iter().map(|d| d.value).collect::<Vec<_>>();
    ok.then(|| ShapeProfile {
        min: take(0),
        opt: take(1),
        max: take(2),
    })
}

fn show_dims(d: &[Located<i64>]) -> String {
    format!(
        "[{}]",
        d.iter()
            .map(|d| d.value.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

// ---------------------------------------------------------------------------------------------
// [targets]

/// A list of precisions at `t.key` (each one of `allowed`, none twice) into `out`; the list's
/// span when the key is present.
fn precision_list(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    key: &str,
    allowed: &[Precision],
    example: &str,
    out: &mut Vec<Located<Precision>>,
) -> Option<Span> {
    let (arr, key, span) = cx.array(t, key, "an array of precisions", example)?;
    let names: Vec<&str> = allowed.iter().map(|p| p.as_str()).collect();
    for (i, item) in arr.iter().enumerate() {
        let item_key = format!("{key}[{i}]");
        let item_span = cx.span_of(item);
        let DeValue::String(s) = item.get_ref() else {
            cx.expected(
                item,
                &item_key,
                &format!("a precision ({})", names.join(", ")),
            );
            continue;
        };
        let Some(p) = Precision::parse(s).filter(|p| allowed.contains(p)) else {
            let mut message = match Precision::parse(s) {
                Some(p) if key == "targets.cpu" => {
                    format!("precision {p} is not built for the CPU target")
                }
                _ => format!("unknown precision {s:?}"),
            };
            if let Some(c) = closest(s, &names).filter(|c| !c.eq_ignore_ascii_case(s)) {
                message.push_str(&format!("; did you mean `{c}`?"));
            }
            cx.error_hint(
                item_span,
                &item_key,
                message,
                format!("precisions: {}", names.join(", ")),
            );
            continue;
        };
        if out.iter().any(|q| q.value == p) {
            cx.error_hint(
                item_span,
                &item_key,
                format!("precision {s:?} is listed twice"),
                "remove the duplicate",
            );
            continue;
        }
        out.push(Located::new(p, item_span, item_key));
    }
    if arr.is_empty() && key == "targets.precision" {
        cx.error_hint(
            span,
            &key,
            "the precision list is empty",
            "list at least one, such as [\"fp16\"]",
        );
    }
    Some(span)
}

#[allow(
    clippy::too_many_lines,
    reason = "the `[targets]` keys in file order, like every table of the recipe: a list of checks"
)]
fn targets(cx: &mut Checker<'_>, t: Option<&Table<'_, '_>>) -> Targets {
    let mut out = Targets {
        gpus: Vec::new(),
        precision: Vec::new(),
        cpu: vec![Located::new(Precision::Fp32, Span::START, "targets.cpu")],
        tensorrt: None,
        cuda: None,
        version_compatible: None,
        hardware_compatibility: None,
    };
    let Some(t) = t else {
        return out;
    };
    cx.unknown_keys(t, &TARGETS_KEYS);
    if let Some((arr, key, _)) = cx.array(t, "gpus", "an array of GPU names", "[\"L4\", \"H100\"]")
    {
        for (i, item) in arr.iter().enumerate() {
            let item_key = format!("{key}[{i}]");
            let span = cx.span_of(item);
            let DeValue::String(s) = item.get_ref() else {
                cx.expected(
                    item,
                    &item_key,
                    "a GPU name such as \"L4\" or an SM name such as \"sm_89\"",
                );
                continue;
            };
            let Some(gpu) = parse_gpu(s) else {
                cx.error_hint(
                    span,
                    &item_key,
                    format!("invalid GPU name {s:?}"),
                    "write a product name such as \"L4\", \"H100\", \"RTX 4090\" or an SM name such as \"sm_89\"",
                );
                continue;
            };
            if out.gpus.iter().any(|g| g.value == gpu) {
                cx.error_hint(
                    span,
                    &item_key,
                    format!("GPU {s:?} is listed twice"),
                    "remove the duplicate",
                );
                continue;
            }
            out.gpus.push(Located::new(gpu, span, item_key));
        }
    }
    let gpus_written = t
        .inner
        .get("gpus")
        .and_then(|g| g.get_ref().as_array())
        .map_or(0, |a| a.len());
    let precision_given = precision_list(
        cx,
        t,
        "precision",
        &Precision::REQUESTABLE,
        "[\"fp16\", \"int8\"]",
        &mut out.precision,
    );
    if let Some(span) = precision_given {
        if gpus_written == 0 {
            cx.error_hint(
                span,
                "targets.precision",
                "precision applies to GPU targets, and `gpus` lists none",
                "add `gpus = [...]`, or remove `precision` (the CPU target's precisions are `cpu = [\"fp32\", \"bf16\"]`)",
            );
        }
    } else if !out.gpus.is_empty() {
        out.precision
            .push(Located::new(Precision::Fp16, t.span, "targets.precision"));
    }
    // `cpu`: true / false, or the CPU target's precisions (`["fp32", "bf16"]`).
    let cpu_is_list = t
        .inner
        .get("cpu")
        .is_some_and(|v| matches!(v.get_ref(), DeValue::Array(_)));
    if cpu_is_list {
        let mut list = Vec::new();
        if let Some(span) = precision_list(
            cx,
            t,
            "cpu",
            &Precision::CPU,
            "[\"fp32\", \"bf16\"]",
            &mut list,
        ) {
            if list.is_empty() && gpus_written == 0 {
                cx.error_hint(
                    span,
                    "targets.cpu",
                    "no targets: `gpus` lists none and `cpu` lists no precision",
                    "add GPUs (`gpus = [\"L4\"]`) or a CPU precision (`cpu = [\"fp32\"]`)",
                );
            }
        }
        out.cpu = list;
    } else {
        let cpu = match t.inner.get("cpu").map(|v| (v, v.get_ref())) {
            Some((v, other))
                if !matches!(other, DeValue::Boolean(_))
                    && !matches!(other, DeValue::String(s) if s.as_ref() == "true" || s.as_ref() == "false") =>
            {
                cx.expected(
                    v,
                    "targets.cpu",
                    "true, false or a list of CPU precisions such as [\"fp32\", \"bf16\"]",
                );
                None
            }
            _ => cx.bool(t, "cpu"),
        };
        let on = cpu.as_ref().map(|c| c.value).unwrap_or(out.gpus.is_empty());
        out.cpu = match (&cpu, on) {
            (_, false) => Vec::new(),
            (Some(c), true) => vec![Located::new(Precision::Fp32, c.span, c.key.clone())],
            (None, true) => vec![Located::new(Precision::Fp32, t.span, "targets.cpu")],
        };
        if let Some(cpu) = &cpu {
            if !cpu.value && gpus_written == 0 {
                cx.error_hint(
                    cpu.span,
                    &cpu.key,
                    "no targets: `gpus` lists none and `cpu = false`",
                    "add GPUs (`gpus = [\"L4\"]`) or set `cpu = true`",
                );
            }
        }
    }
    for name in ["tensorrt", "cuda"] {
        let Some(v) = version(
            cx,
            t,
            name,
            if name == "tensorrt" { "10.8" } else { "12.8" },
        ) else {
            continue;
        };
        if gpus_written == 0 {
            cx.error_hint(
                v.span,
                &v.key,
                format!("`{name}` pins a GPU toolchain, and `gpus` lists none"),
                format!("add `gpus = [...]`, or remove `{name}`"),
            );
        }
        if name == "tensorrt" {
            out.tensorrt = Some(v);
        } else {
            out.cuda = Some(v);
        }
    }
    out.version_compatible = cx.bool(t, "version_compatible");
    if let Some(h) = cx.string(t, "hardware_compatibility") {
        let level = match h.value.to_ascii_lowercase().as_str() {
            "none" => Some(None),
            "ampere+" | "ampere_plus" | "ampere-plus" => Some(Some(HardwareCompat::AmperePlus)),
            "same-compute-capability" | "same_compute_capability" | "same-cc" => {
                Some(Some(HardwareCompat::SameComputeCapability))
            }
            _ => None,
        };
        match level {
            Some(level) => {
                out.hardware_compatibility = level.map(|l| Located::new(l, h.span, h.key.clone()));
            }
            None => cx.error_hint(
                h.span,
                &h.key,
                format!("unknown hardware compatibility level {:?}", h.value),
                "levels: \"none\", \"ampere+\" (one engine for Ampere and later), \"same-compute-capability\"",
            ),
        }
    }
    out
}

/// `"sm_86"`, `"sm86"`, `"SM_86"` → `Sm(8.6)` (majors 1 to 19); anything else that looks like
/// a product name → `Product`.
fn parse_gpu(s: &str) -> Option<Gpu> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    if let Some(rest) = lower.strip_prefix("sm") {
        let digits = rest.strip_prefix('_').unwrap_or(rest);
        if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
            return match t.parse::<ComputeCapability>() {
                Ok(cc) if (1..=19).contains(&cc.major) => Some(Gpu::Sm(cc)),
                _ => None,
            };
        }
    }
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '-' | '_' | '.'));
    ok.then(|| Gpu::Product(t.to_string()))
}

fn version(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    name: &str,
    example: &str,
) -> Option<Located<Version>> {
    let (v, key, span) = cx.get(t, name)?;
    match v.get_ref() {
        DeValue::String(s) => match parse_version(s) {
            Some(ver) => Some(Located::new(ver, span, key)),
            None => {
                cx.error_hint(
                    span,
                    &key,
                    format!("invalid version {s:?}"),
                    format!("write dotted numbers, such as `{name} = \"{example}\"`"),
                );
                None
            }
        },
        DeValue::Integer(_) | DeValue::Float(_) => {
            let written = super::check::describe(v.get_ref());
            let number = written.split_once(' ').map(|(_, n)| n).unwrap_or(example);
            cx.expected_hint(
                v,
                &key,
                "a version string",
                &format!(
                    "quote it: `{name} = \"{number}\"` (as a number, 10.10 would read as 10.1)"
                ),
            );
            None
        }
        _ => {
            cx.expected(v, &key, "a version string such as \"10.8\"");
            None
        }
    }
}

// ---------------------------------------------------------------------------------------------
// [int8]

/// `[int8] method` / `[fp8] method`: one the converter (`engine.convert`) has.
fn check_method(cx: &mut Checker<'_>, m: &Located<String>, tool: ConvertTool, fp8: bool) {
    let methods = tool.methods(fp8);
    if methods.contains(&m.value.as_str()) {
        return;
    }
    let what = if fp8 {
        "fp8 calibration method"
    } else {
        "calibration method"
    };
    let known = ConvertTool::Builtin
        .methods(fp8)
        .iter()
        .chain(ConvertTool::ModelOpt.methods(fp8))
        .any(|k| *k == m.value);
    let message = if known {
        format!(
            "the {tool} converter (engine.convert) has no {what} `{}`",
            m.value
        )
    } else {
        format!("unknown {what} `{}`", m.value)
    };
    cx.error_hint(
        m.span,
        &m.key,
        message,
        format!("use one of {}", methods.join(", ")),
    );
}

fn int8(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    tool: ConvertTool,
    files: &mut Vec<FileRef>,
) -> Int8 {
    cx.unknown_keys(t, &INT8_KEYS);
    let calibration = cx
        .string(t, "calibration")
        .and_then(|p| relative_path(cx, p, "the calibration data"));
    if let Some(p) = &calibration {
        files.push(FileRef {
            path: p.clone(),
            kind: FileKind::Calibration,
        });
    }
    let qdq = cx
        .bool(t, "qdq")
        .unwrap_or_else(|| Located::new(false, t.span, "int8.qdq"));
    if let (Some(c), true) = (&calibration, qdq.value) {
        cx.error_hint(
            c.span,
            &c.key,
            "`calibration` and `qdq = true` exclude each other: a Q/DQ model carries its own scales",
            "remove `calibration` for a Q/DQ model, or set `qdq = false` to calibrate a plain model",
        );
    }
    if calibration.is_none() && !qdq.value && t.inner.get("calibration").is_none() {
        cx.error_hint(
            t.span,
            "int8",
            "[int8] needs `calibration` (a data directory or cache) or `qdq = true`",
            "add `calibration = \"calibration/\"`, or `qdq = true` when the model has Q/DQ nodes",
        );
    }
    let method = cx.string(t, "method");
    if let Some(m) = &method {
        check_method(cx, m, tool, false);
        if qdq.value {
            cx.error_hint(
                m.span,
                &m.key,
                "`method` picks how infer-build quantizes, and `qdq = true` says the model is already quantized",
                "remove `method`, or set `qdq = false`",
            );
        }
    }
    Int8 {
        calibration,
        qdq,
        method,
        calibration_is_cache: None,
    }
}

// ---------------------------------------------------------------------------------------------
// [fp8]

fn fp8(
    cx: &mut Checker<'_>,
    t: &Table<'_, '_>,
    tool: ConvertTool,
    files: &mut Vec<FileRef>,
) -> Fp8 {
    cx.unknown_keys(t, &FP8_KEYS);
    let calibration = cx
        .string(t, "calibration")
        .and_then(|p| relative_path(cx, p, "the calibration data"));
    match &calibration {
        Some(p) => files.push(FileRef {
            path: p.clone(),
            kind: FileKind::CalibrationBatches,
        }),
        None if t.inner.get("calibration").is_none() => cx.error_hint(
            t.span,
            "fp8",
            "[fp8] needs `calibration`: a directory of calibration batches",
            "add `calibration = \"calibration/\"` (*.npy / *.npz batches of the model's inputs)",
        ),
        None => {}
    }
    let method = cx.string(t, "method");
    if let Some(m) = &method {
        check_method(cx, m, tool, true);
    }
    Fp8 {
        calibration,
        method,
    }
}

fn check_fp8_needed(cx: &mut Checker<'_>, targets: &Targets, table: Option<&Table<'_, '_>>) {
    let Some(p) = targets.precision.iter().find(|p| p.value == Precision::Fp8) else {
        return;
    };
    if table.is_none() {
        cx.error_hint(
            p.span,
            &p.key,
            "fp8 engines need an FP8 Q/DQ model, which infer-build makes from calibration data, and the recipe has no [fp8] table",
            "add `[fp8]` with `calibration = \"calibration/\"`",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// [accuracy]

fn accuracy(cx: &mut Checker<'_>, t: &Table<'_, '_>, files: &mut Vec<FileRef>) -> Accuracy {
    cx.unknown_keys(t, &ACCURACY_KEYS);
    let data = cx
        .string(t, "data")
        .and_then(|p| relative_path(cx, p, "the evaluation data"));
    if let Some(p) = &data {
        files.push(FileRef {
            path: p.clone(),
            kind: FileKind::Evaluation,
        });
    }
    let mut limits = BTreeMap::new();
    for (name, precision) in [
        ("fp16", Precision::Fp16),
        ("int8", Precision::Int8),
        ("fp8", Precision::Fp8),
        ("bf16", Precision::Bf16),
    ] {
        let Some(lt) = cx.table(t, name) else {
            continue;
        };
        cx.unknown_keys(&lt, &LIMIT_KEYS);
        let mut l = AccuracyLimits::default();
        for k in LIMIT_KEYS {
            let Some((v, key, _)) = cx.get(&lt, k) else {
                continue;
            };
            let x = match v.get_ref() {
                DeValue::Integer(i) => i.as_str().parse::<f64>().ok().filter(|_| i.radix() == 10),
                DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
                _ => None,
            };
            let ok = |x: f64| x.is_finite() && x >= 0.0 && (k != "min_top1" || x <= 1.0);
            match x {
                Some(x) if ok(x) => match k {
                    "max_abs" => l.max_abs = Some(x),
                    "max_rel" => l.max_rel = Some(x),
                    _ => l.min_top1 = Some(x),
                },
                _ if k == "min_top1" => cx.expected(v, &key, "a fraction from 0 to 1"),
                _ => cx.expected(v, &key, "a non-negative number"),
            }
        }
        limits.insert(precision, l);
    }
    Accuracy { data, limits }
}

/// INT8 targets need `[int8]`: calibration data or a Q/DQ model for GPU targets, calibration
/// data for a `cpu-int8` target (which quantises a plain model).
fn check_int8_needed(
    cx: &mut Checker<'_>,
    targets: &Targets,
    table: Option<&Table<'_, '_>>,
    int8: Option<&Int8>,
) {
    if let Some(p) = targets.cpu.iter().find(|p| p.value == Precision::Int8) {
        if table.is_none() {
            cx.error_hint(
                p.span,
                &p.key,
                "a cpu-int8 target is quantised from calibration data, and the recipe has no [int8] table",
                "add `[int8]` with `calibration = \"calibration/\"` (a directory of *.npy / *.npz batches)",
            );
        }
        if let Some(i) = int8.filter(|i| i.qdq.value) {
            cx.error_hint(
                i.qdq.span,
                &i.qdq.key,
                format!(
                    "a cpu-int8 target (targets.cpu at line {}) quantises a plain model from calibration data; a Q/DQ model is not taken for it yet",
                    p.span.line
                ),
                "set `qdq = false` with `calibration = \"calibration/\"`, or remove \"int8\" from targets.cpu",
            );
        }
    }
    let Some(p) = targets
        .precision
        .iter()
        .find(|p| p.value == Precision::Int8)
    else {
        return;
    };
    if table.is_none() {
        cx.error_hint(
            p.span,
            &p.key,
            "int8 engines need calibration data or a Q/DQ model, and the recipe has no [int8] table",
            "add `[int8]` with `calibration = \"calibration/\"` (TensorRT 10 and earlier) or `qdq = true` (a Q/DQ model)",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// [batching]

fn batching(cx: &mut Checker<'_>, t: Option<&Table<'_, '_>>) -> Batching {
    let mut b = Batching {
        max_batch_size: DEFAULT_MAX_BATCH_SIZE,
        preferred_batch_sizes: Vec::new(),
        max_queue_delay_us: DEFAULT_MAX_QUEUE_DELAY_US,
        max_queue_size: DEFAULT_MIN_QUEUE_SIZE,
        default_timeout_ms: DEFAULT_TIMEOUT_MS,
        instances: 1,
        queue_delay: QueueDelay::Adaptive,
    };
    let Some(t) = t else {
        return b;
    };
    cx.unknown_keys(t, &BATCHING_KEYS);
    if let Some(v) = cx.string(t, "queue_delay") {
        match QueueDelay::parse(&v.value) {
            Some(q) => b.queue_delay = q,
            None => cx.error_hint(
                v.span,
                &v.key,
                format!("unknown queue delay {:?}", v.value),
                "\"adaptive\" (wait only while more requests can come: the default) or \"strict\" (always wait, as Triton does)",
            ),
        }
    }
    let max = cx.int(
        t,
        "max_batch_size",
        1,
        MAX_BATCH,
        &format!("a positive integer up to {MAX_BATCH}"),
    );
    if let Some(m) = &max {
        b.max_batch_size = m.value as u32;
    }
    b.max_queue_size = b.max_queue_size.max(b.max_batch_size);
    if let Some(list) = cx.int_array_valid(
        t,
        "preferred_batch_sizes",
        1,
        MAX_BATCH,
        "positive batch size",
        "[4, 8]",
    ) {
        let mut seen = Vec::new();
        for s in &list.value {
            if s.value as u32 > b.max_batch_size {
                cx.error_hint(
                    s.span,
                    &s.key,
                    format!(
                        "preferred batch size {} is larger than max_batch_size ({})",
                        s.value, b.max_batch_size
                    ),
                    "raise `max_batch_size` or drop this size",
                );
            } else if seen.contains(&(s.value as u32)) {
                cx.error_hint(
                    s.span,
                    &s.key,
                    format!("batch size {} is listed twice", s.value),
                    "remove the duplicate",
                );
            } else {
                seen.push(s.value as u32);
            }
        }
        seen.sort_unstable();
        b.preferred_batch_sizes = seen;
    }
    let delay = cx.int(
        t,
        "max_queue_delay_us",
        0,
        10_000_000,
        "an integer from 0 to 10000000 (10 s)",
    );
    if let Some(d) = &delay {
        b.max_queue_delay_us = d.value as u64;
    }
    if let Some(q) = cx.int(
        t,
        "max_queue_size",
        1,
        1_000_000,
        "a positive integer up to 1000000",
    ) {
        b.max_queue_size = q.value as u32;
        if b.max_queue_size < b.max_batch_size {
            cx.error_hint(
                q.span,
                &q.key,
                format!(
                    "max_queue_size ({}) is smaller than max_batch_size ({}), so a full batch can never queue",
                    q.value, b.max_batch_size
                ),
                "make `max_queue_size` at least `max_batch_size` (it counts rows, not requests)",
            );
        }
    }
    let timeout = cx.int(
        t,
        "default_timeout_ms",
        1,
        3_600_000,
        "a positive integer up to 3600000 (1 h)",
    );
    if let Some(to) = &timeout {
        b.default_timeout_ms = to.value as u64;
    }
    if b.max_queue_delay_us >= b.default_timeout_ms.saturating_mul(1000) {
        let (span, key) = match (&delay, &timeout) {
            (Some(d), _) => (d.span, d.key.clone()),
            (None, Some(to)) => (to.span, to.key.clone()),
            (None, None) => (t.span, "batching.max_queue_delay_us".to_string()),
        };
        cx.error_hint(
            span,
            &key,
            format!(
                "max_queue_delay_us ({} µs) is not shorter than default_timeout_ms ({} ms): requests would time out while waiting for a batch",
                b.max_queue_delay_us, b.default_timeout_ms
            ),
            "keep the queue delay well below the request timeout",
        );
    }
    if let Some(i) = cx.int(t, "instances", 1, 64, "an integer from 1 to 64") {
        b.instances = i.value as u32;
    }
    b
}

// ---------------------------------------------------------------------------------------------
// [warmup]

fn warmup(
    cx: &mut Checker<'_>,
    t: Option<&Table<'_, '_>>,
    b: &Batching,
    files: &mut Vec<FileRef>,
) -> Warmup {
    let mut w = Warmup {
        enabled: true,
        batch_sizes: None,
        samples: None,
    };
    let Some(t) = t else {
        return w;
    };
    cx.unknown_keys(t, &WARMUP_KEYS);
    if let Some(e) = cx.bool(t, "enabled") {
        w.enabled = e.value;
    }
    if let Some(list) = cx.int_array_valid(
        t,
        "batch_sizes",
        1,
        MAX_BATCH,
        "positive batch size",
        "[1, 8]",
    ) {
        let mut sizes = Vec::new();
        for s in &list.value {
            if s.value as u32 > b.max_batch_size {
                cx.error_hint(
                    s.span,
                    &s.key,
                    format!(
                        "warm-up batch size {} is larger than max_batch_size ({})",
                        s.value, b.max_batch_size
                    ),
                    "warm up only batch sizes the server can form",
                );
            } else if !sizes.contains(&(s.value as u32)) {
                sizes.push(s.value as u32);
            }
        }
        if list.value.is_empty() {
            cx.error_hint(
                list.span,
                &list.key,
                "the list of warm-up batch sizes is empty",
                "remove it for the default, or set `enabled = false`",
            );
        }
        sizes.sort_unstable();
        w.batch_sizes = Some(sizes);
    }
    w.samples = cx
        .string(t, "samples")
        .and_then(|p| relative_path(cx, p, "the warm-up samples"));
    if let Some(p) = &w.samples {
        files.push(FileRef {
            path: p.clone(),
            kind: FileKind::Samples,
        });
    }
    w
}

// ---------------------------------------------------------------------------------------------
// [image]

fn image(
    cx: &mut Checker<'_>,
    t: Option<&Table<'_, '_>>,
    model_name: &str,
    targets: &Targets,
) -> Image {
    let span = span_or(t);
    let mut img = Image {
        repository: Located::new(
            format!("localhost/infer-build/{model_name}"),
            span,
            "image.repository",
        ),
        tag: Located::new(DEFAULT_TAG.to_string(), span, "image.tag"),
        base: None,
        user: DEFAULT_USER,
        labels: BTreeMap::new(),
        layout: ImageLayout::default(),
    };
    let Some(t) = t else {
        return img;
    };
    cx.unknown_keys(t, &IMAGE_KEYS);
    if let Some(l) = one_of(
        cx,
        t,
        "layout",
        ImageLayout::parse,
        "use \"combined\" (one image per target) or \"split\" (also a runtime image and the model as an artifact to mount)",
    ) {
        img.layout = l;
    }
    if let Some(r) = cx.string(t, "repository") {
        if let Some(problem) = repository_problem(&r.value) {
            cx.error_hint(
                r.span,
                &r.key,
                format!("invalid repository {:?}: {problem}", r.value),
                "write [HOST[:PORT]/]PATH with lowercase letters, digits and `.`, `_`, `-` separators, such as \"registry.example.com/ml/resnet50\"",
            );
        } else {
            img.repository = r;
        }
    }
    if let Some(tag) = cx.string(t, "tag") {
        if check_tag_template(cx, &tag, targets) {
            img.tag = tag;
        }
    }
    if let Some(base) = cx.string(t, "base") {
        match base_problem(&base.value) {
            Some(problem) => cx.error_hint(
                base.span,
                &base.key,
                format!("invalid base image {:?}: {problem}", base.value),
                "write a reference such as \"nvcr.io/nvidia/tensorrt:24.12-py3@sha256:<64 hex digits>\"",
            ),
            None => img.base = Some(base),
        }
    }
    if let Some(u) = cx.int(t, "user", 0, i64::from(i32::MAX), "a numeric user id") {
        if u.value == 0 {
            cx.error_hint(
                u.span,
                &u.key,
                "images must not run as root (user 0)",
                format!(
                    "remove `user` for the default ({DEFAULT_USER}) or pick another non-zero id"
                ),
            );
        } else {
            img.user = u.value as u32;
        }
    }
    if let Some(labels) = cx.table(t, "labels") {
        for (k, v) in labels.inner.iter() {
            let name: &str = k.get_ref();
            let key = join(&labels.key, name);
            if name.is_empty()
                || name.len() > 256
                || name.chars().any(|c| c.is_control() || c.is_whitespace())
            {
                cx.error_hint(
                    cx.span_of(k),
                    &key,
                    format!("invalid label name {name:?}"),
                    "use a reverse-DNS name such as \"org.example.team\"",
                );
                continue;
            }
            match v.get_ref() {
                DeValue::String(s) => {
                    img.labels.insert(name.to_string(), s.to_string());
                }
                _ => cx.expected(v, &key, "a string"),
            }
        }
    }
    img
}

pub(super) fn repository_problem(r: &str) -> Option<&'static str> {
    if r.is_empty() {
        return Some("it is empty");
    }
    if r.len() > 255 {
        return Some("it is longer than 255 characters");
    }
    let mut parts: Vec<&str> = r.split('/').collect();
    // A first part with a `.` or `:`, or `localhost`, is a registry host.
    if parts.len() > 1
        && (parts[0].contains('.') || parts[0].contains(':') || parts[0] == "localhost")
    {
        let host = parts.remove(0);
        let (name, port) = host.split_once(':').unwrap_or((host, ""));
        let name_ok = !name.is_empty()
            && name.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        let port_ok = port.is_empty() && !host.ends_with(':')
            || !port.is_empty() && port.len() <= 5 && port.bytes().all(|b| b.is_ascii_digit());
        if !name_ok || !port_ok {
            return Some("the registry host is not valid");
        }
    }
    for part in parts {
        if part.is_empty() {
            return Some("it has an empty path component");
        }
        if part.bytes().any(|b| b.is_ascii_uppercase()) {
            return Some("repository names are lowercase");
        }
        let b = part.as_bytes();
        let ok_chars = b.iter().all(|&c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, b'.' | b'_' | b'-')
        });
        let ends_ok = b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric);
        if !ok_chars
            || !ends_ok
            || part.contains("..")
            || part.contains("___")
            || part.contains("._")
            || part.contains("_.")
        {
            return Some("a path component has characters a registry refuses");
        }
    }
    None
}

fn base_problem(r: &str) -> Option<&'static str> {
    if r == "scratch" {
        return None;
    }
    let (name_tag, digest) = match r.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (r, None),
    };
    if let Some(d) = digest {
        if crate::oci::hex_of(d).is_none() {
            return Some("the digest must be sha256: and 64 lowercase hex digits");
        }
    }
    // The tag is after the last `:` that follows the last `/` (a `:` before it is a port).
    let last_slash = name_tag.rfind('/').map(|i| i + 1).unwrap_or(0);
    let (name, tag) = match name_tag[last_slash..].rfind(':') {
        Some(i) => (
            &name_tag[..last_slash + i],
            Some(&name_tag[last_slash + i + 1..]),
        ),
        None => (name_tag, None),
    };
    if let Some(tag) = tag {
        let b = tag.as_bytes();
        if b.is_empty()
            || b.len() > 128
            || !(b[0].is_ascii_alphanumeric() || b[0] == b'_')
            || !b
                .iter()
                .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
        {
            return Some("the tag is not a valid OCI tag");
        }
    }
    repository_problem(name)
}

/// Check a tag template's placeholders and literal characters, and that it tells the targets
/// apart. Returns whether it is usable.
fn check_tag_template(cx: &mut Checker<'_>, tag: &Located<String>, targets: &Targets) -> bool {
    let mut ok = true;
    let mut used = Vec::new();
    let mut literal_len = 0usize;
    let mut rest = tag.value.as_str();
    let bad_hint = "tags may contain letters, digits, `_`, `.` and `-`, and placeholders {model} {version} {target} {sm} {gpu} {precision} {tensorrt} {cuda}";
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('{') {
            let Some(close) = after.find('}') else {
                cx.error_hint(
                    tag.span,
                    &tag.key,
                    format!("unclosed `{{` in tag template {:?}", tag.value),
                    bad_hint,
                );
                return false;
            };
            let name = &after[..close];
            if TAG_PLACEHOLDERS.contains(&name) {
                used.push(name);
            } else {
                let mut message = format!("unknown placeholder `{{{name}}}` in tag template");
                if let Some(c) = closest(name, &TAG_PLACEHOLDERS) {
                    message.push_str(&format!("; did you mean `{{{c}}}`?"));
                }
                cx.error_hint(tag.span, &tag.key, message, bad_hint);
                ok = false;
            }
            rest = &after[close + 1..];
        } else {
            let c = rest.chars().next().unwrap_or('_');
            if !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-')) {
                cx.error_hint(
                    tag.span,
                    &tag.key,
                    format!("character {c:?} is not allowed in a tag"),
                    bad_hint,
                );
                return false;
            }
            if literal_len == 0 && used.is_empty() && matches!(c, '.' | '-') {
                cx.error_hint(
                    tag.span,
                    &tag.key,
                    "a tag cannot start with `.` or `-`",
                    bad_hint,
                );
                ok = false;
            }
            literal_len += 1;
            rest = &rest[c.len_utf8()..];
        }
    }
    if tag.value.is_empty() {
        cx.error_hint(
            tag.span,
            &tag.key,
            "the tag template is empty",
            format!("remove it for the default {DEFAULT_TAG:?}"),
        );
        return false;
    }
    if literal_len > 128 {
        cx.error_hint(
            tag.span,
            &tag.key,
            "the tag template is longer than a tag may be (128 characters)",
            "shorten it",
        );
        return false;
    }
    if ok
        && !used.contains(&"target")
        && targets.gpus.len() * targets.precision.len() + targets.cpu.len() > 1
    {
        let gpu_targets = targets.gpus.len() + usize::from(!targets.cpu.is_empty());
        let needs_gpu = gpu_targets > 1 && !used.contains(&"sm") && !used.contains(&"gpu");
        let needs_precision = ((!targets.gpus.is_empty() && targets.precision.len() > 1)
            || targets.cpu.len() > 1)
            && !used.contains(&"precision");
        if needs_gpu || needs_precision {
            cx.error_hint(
                tag.span,
                &tag.key,
                "the tag template gives every target the same tag",
                "include {target}, or {sm} (or {gpu}) and {precision}, such as \"{version}-{target}\"",
            );
            ok = false;
        }
    }
    ok
}

// ---------------------------------------------------------------------------------------------
// [deploy]

pub(super) fn deploy(cx: &mut Checker<'_>, t: Option<&Table<'_, '_>>, b: &Batching) -> Deploy {
    let mut d = Deploy {
        node_driver: None,
        replicas: Replicas { min: 1, max: 1 },
        resources: Resources::default(),
        latency_slo_ms: None,
        peak_qps: None,
        drain_delay_s: DEFAULT_DRAIN_DELAY_S,
    };
    let Some(t) = t else {
        return d;
    };
    cx.unknown_keys(t, &DEPLOY_KEYS);
    d.node_driver = version(cx, t, "node_driver", "550.54.15");
    if let Some((v, key, span)) = cx.get(t, "replicas") {
        match v.get_ref() {
            DeValue::Integer(_) => {
                if let Some(n) = cx.int_value(v, &key, 1, 10_000, "a positive number of replicas") {
                    d.replicas = Replicas {
                        min: n as u32,
                        max: n as u32,
                    };
                }
            }
            DeValue::Table(inner) => {
                let rt = Table {
                    inner,
                    key: key.clone(),
                    span,
                };
                cx.unknown_keys(&rt, &REPLICAS_KEYS);
                let min = cx.int(&rt, "min", 1, 10_000, "a positive number of replicas");
                let max = cx.int(&rt, "max", 1, 10_000, "a positive number of replicas");
                let minv = min.as_ref().map(|m| m.value as u32).unwrap_or(1);
                let maxv = max.as_ref().map(|m| m.value as u32).unwrap_or(minv);
                if let Some(m) = &max {
                    if maxv < minv {
                        cx.error_hint(
                            m.span,
                            &m.key,
                            format!("max ({maxv}) is smaller than min ({minv})"),
                            "make `max` at least `min`",
                        );
                    }
                }
                d.replicas = Replicas {
                    min: minv,
                    max: maxv.max(minv),
                };
            }
            _ => cx.expected_hint(
                v,
                &key,
                "a table or an integer",
                "write `replicas = { min = 2, max = 8 }`",
            ),
        }
    }
    if let Some(rt) = cx.table(t, "resources") {
        cx.unknown_keys(&rt, &RESOURCES_KEYS);
        if let Some((v, key, span)) = cx.get(&rt, "cpu") {
            let q = match v.get_ref() {
                DeValue::String(s) => Some(s.to_string()),
                DeValue::Integer(i) => Some(i.to_string()),
                DeValue::Float(f) => Some(f.as_str().to_string()),
                _ => None,
            };
            match q {
                Some(q) if valid_cpu_quantity(&q) => d.resources.cpu = Some(q),
                _ => cx.error_hint(
                    span,
                    &key,
                    format!(
                        "expected a CPU quantity, found {}",
                        super::check::describe(v.get_ref())
                    ),
                    "write cores (`cpu = 2`, `cpu = \"1.5\"`) or millicores (`cpu = \"500m\"`)",
                ),
            }
        }
        if let Some((v, key, span)) = cx.get(&rt, "memory") {
            let q = match v.get_ref() {
                DeValue::String(s) => Some(s.to_string()),
                _ => None,
            };
            match q {
                Some(q) if valid_memory_quantity(&q) => d.resources.memory = Some(q),
                _ => cx.error_hint(
                    span,
                    &key,
                    format!(
                        "expected a memory quantity, found {}",
                        super::check::describe(v.get_ref())
                    ),
                    "write a Kubernetes quantity such as \"4Gi\" or \"512Mi\"",
                ),
            }
        }
    }
    if let Some(slo) = cx.int(
        t,
        "latency_slo_ms",
        1,
        600_000,
        "a positive number of milliseconds up to 600000",
    ) {
        d.latency_slo_ms = Some(slo.value as u32);
        if b.max_queue_delay_us >= (slo.value as u64).saturating_mul(1000) {
            cx.error_hint(
                slo.span,
                &slo.key,
                format!(
                    "the p99 budget ({} ms) is used up by batching.max_queue_delay_us ({} µs) alone",
                    slo.value, b.max_queue_delay_us
                ),
                "lower `max_queue_delay_us` well below the latency budget",
            );
        }
    }
    if let Some((v, key, _)) = cx.get(t, "peak_qps") {
        let q = match v.get_ref() {
            DeValue::Integer(i) => i.as_str().parse::<f64>().ok().filter(|_| i.radix() == 10),
            DeValue::Float(f) => f.as_str().parse::<f64>().ok(),
            _ => None,
        };
        match q {
            Some(q) if q.is_finite() && q > 0.0 && q <= 1e9 => d.peak_qps = Some(q),
            _ => cx.expected(v, &key, "a positive number of requests per second"),
        }
    }
    if let Some(dd) = cx.int(t, "drain_delay_s", 0, 3_600, "an integer from 0 to 3600") {
        d.drain_delay_s = dd.value as u32;
    }
    d
}

fn valid_cpu_quantity(q: &str) -> bool {
    let digits = q.strip_suffix('m').unwrap_or(q);
    let mut parts = digits.splitn(2, '.');
    let whole = parts.next().unwrap_or("");
    let frac = parts.next();
    let num_ok = |s: &str| !s.is_empty() && s.len() <= 12 && s.bytes().all(|b| b.is_ascii_digit());
    num_ok(whole) && frac.is_none_or(num_ok) && q.bytes().any(|b| b != b'0' && b.is_ascii_digit())
}

fn valid_memory_quantity(q: &str) -> bool {
    let suffixes = [
        "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "k", "M", "G", "T", "P", "E", "",
    ];
    suffixes.iter().any(|s| {
        q.strip_suffix(s).is_some_and(|n| {
            let mut parts = n.splitn(2, '.');
            let whole = parts.next().unwrap_or("");
            let frac = parts.next();
            let num_ok =
                |s: &str| !s.is_empty() && s.len() <= 15 && s.bytes().all(|b| b.is_ascii_digit());
            num_ok(whole)
                && frac.is_none_or(num_ok)
                && n.bytes().any(|b| b != b'0' && b.is_ascii_digit())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_names() {
        let sm = |major, minor| Some(Gpu::Sm(ComputeCapability::new(major, minor)));
        assert_eq!(parse_gpu("sm_86"), sm(8, 6));
        assert_eq!(parse_gpu("SM90"), sm(9, 0));
        assert_eq!(parse_gpu("sm_100"), sm(10, 0));
        assert_eq!(parse_gpu("sm_5"), None);
        assert_eq!(parse_gpu("sm_99999999999999999999"), None);
        assert_eq!(parse_gpu("RTX 4090"), Some(Gpu::Product("RTX 4090".into())));
        assert_eq!(parse_gpu(""), None);
        assert_eq!(parse_gpu("L4;rm"), None);
    }

    #[test]
    fn repositories_and_bases() {
        assert_eq!(repository_problem("registry.example.com/ml/resnet50"), None);
        assert_eq!(repository_problem("localhost:5000/a/b"), None);
        assert_eq!(repository_problem("resnet50"), None);
        assert!(repository_problem("Registry/ML").is_some());
        assert!(repository_problem("a//b").is_some());
        assert!(repository_problem("a/-b").is_some());
        assert_eq!(base_problem("nvcr.io/nvidia/tensorrt:24.12-py3"), None);
        assert_eq!(base_problem("localhost:5000/base"), None);
        assert_eq!(
            base_problem(&format!("ubuntu:24.04@sha256:{}", "a".repeat(64))),
            None
        );
        assert!(base_problem("ubuntu@sha256:abc").is_some());
        assert!(base_problem("ubuntu:").is_some());
    }

    #[test]
    fn quantities() {
        for ok in ["2", "1.5", "500m", "0.5"] {
            assert!(valid_cpu_quantity(ok), "{ok}");
        }
        for bad in ["", "0", "two", "1.5.1", "m", "-1"] {
            assert!(!valid_cpu_quantity(bad), "{bad}");
        }
        for ok in ["4Gi", "512Mi", "1G", "1048576", "1.5Gi"] {
            assert!(valid_memory_quantity(ok), "{ok}");
        }
        for bad in ["", "4GB", "0Gi", "Gi", "-1Gi"] {
            assert!(!valid_memory_quantity(bad), "{bad}");
        }
    }
}
