//! `runtime.toml`: what the builder writes into every image and `infer-serve` reads at start.
//!
//! The format is a contract between build time and run time, so it only grows: new fields
//! get defaults, existing fields keep their meaning. Parsing is strict (`deny_unknown_fields`)
//! so that a typo in a hand-edited file fails loudly instead of being ignored, and
//! [`RuntimeConfig::from_toml_str`] validates the whole file and reports every problem at once.
//! [`RuntimeConfig::to_toml_string`] is canonical: fields in declaration order, tensors in the
//! order given, so the same config always gives the same bytes (the file is part of an image
//! layer, whose digest must be reproducible).
//!
//! ```toml
//! [model]
//! name = "mlp"
//! version = "1"
//!
//! [[inputs]]
//! name = "input"
//! datatype = "FP32"
//! dims = [-1, 64]
//!
//! [[outputs]]
//! name = "output"
//! datatype = "FP32"
//! dims = [-1, 10]
//!
//! [batching]
//! max_batch_size = 32
//! preferred_batch_sizes = [8, 16, 32]
//! max_queue_delay_us = 500
//!
//! [engine]
//! kind = "tract-onnx"
//! path = "model.onnx"
//! ```

use crate::DataType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::fmt;

/// The default location of the runtime configuration inside an image.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/infer/runtime.toml";

/// The whole `runtime.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    /// The served model's identity.
    pub model: ModelSection,
    /// The model's inputs, in the engine's input order.
    pub inputs: Vec<TensorSpec>,
    /// The model's outputs, in the engine's output order.
    pub outputs: Vec<TensorSpec>,
    /// The dynamic batcher.
    #[serde(default)]
    pub batching: Batching,
    /// The engine that executes batches.
    pub engine: EngineSection,
    /// The warm-up run before the server reports ready.
    #[serde(default)]
    pub warmup: Warmup,
    /// The HTTP server and its lifecycle.
    #[serde(default)]
    pub server: Server,
}

/// `[model]`: name and version as clients address them (`/v2/models/{name}/versions/{version}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// The model name in V2 URLs; non-empty, no `/`.
    pub name: String,
    /// The version in V2 URLs and metadata (Triton uses integers; any string without `/` works).
    #[serde(default = "default_version")]
    pub version: String,
    /// The V2 metadata `platform`; derived from the engine kind when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<String>,
}

fn default_version() -> String {
    "1".to_owned()
}

/// `[[inputs]]` / `[[outputs]]`: one tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// The tensor name, as in the engine and in V2 requests.
    pub name: String,
    /// The V2 datatype (`"FP32"`, `"INT64"`, …).
    pub datatype: DataType,
    /// The full shape including the batch dimension, which comes first and is `-1`; every
    /// other dimension is fixed and positive (text models use fixed sequence buckets).
    pub dims: Vec<i64>,
}

impl TensorSpec {
    /// The fixed dimensions after the batch dimension.
    pub fn row_dims(&self) -> Vec<usize> {
        self.dims
            .iter()
            .skip(1)
            .map(|&d| usize::try_from(d).unwrap_or(0))
            .collect()
    }

    /// Elements in one row (the product of the non-batch dimensions).
    pub fn row_elements(&self) -> usize {
        self.row_dims().iter().product()
    }
}

/// `[batching]`: the dynamic batcher, with Triton's semantics.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Batching {
    /// The most rows (sum of the batch dimension over requests) in one execution; ≥ 1.
    pub max_batch_size: u32,
    /// Batch sizes that are sent at once when reached; empty means `[max_batch_size]`.
    pub preferred_batch_sizes: Vec<u32>,
    /// How long the oldest waiting request may wait for others to join its batch, in µs.
    pub max_queue_delay_us: u64,
    /// The most requests waiting in the queue; a request beyond it gets 503. 0 = unbounded.
    pub max_queue_size: u32,
    /// Default deadline per request, covering queue and execution, in ms; 0 = none. A request
    /// may ask for a shorter one with its `timeout` parameter (µs, as in Triton).
    pub default_timeout_ms: u64,
    /// Backend instances, each a thread with one batch in flight; ≥ 1.
    pub instances: u32,
}

impl Default for Batching {
    fn default() -> Self {
        Batching {
            max_batch_size: 1,
            preferred_batch_sizes: Vec::new(),
            max_queue_delay_us: 0,
            max_queue_size: 0,
            default_timeout_ms: 0,
            instances: 1,
        }
    }
}

impl Batching {
    /// The preferred sizes after normalisation: sorted, deduplicated, and `[max_batch_size]`
    /// when none are given (as Triton normalises an empty list).
    pub fn preferred(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self.preferred_batch_sizes.iter().copied().collect();
        if set.is_empty() {
            vec![self.max_batch_size]
        } else {
            set.into_iter().collect()
        }
    }
}

/// Which engine runs batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EngineKind {
    /// An ONNX model run on CPU by tract.
    #[serde(rename = "tract-onnx")]
    TractOnnx,
    /// A tract NNEF archive run on CPU.
    #[serde(rename = "tract-nnef")]
    TractNnef,
    /// A serialized TensorRT engine.
    #[serde(rename = "tensorrt")]
    TensorRt,
    /// A model-free engine that sleeps `base_ms + per_row_ms · rows` per batch and returns
    /// deterministic outputs; for tests and benchmarks of the batcher only.
    #[serde(rename = "synthetic")]
    Synthetic,
}

impl EngineKind {
    /// The spelling used in `runtime.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::TractOnnx => "tract-onnx",
            EngineKind::TractNnef => "tract-nnef",
            EngineKind::TensorRt => "tensorrt",
            EngineKind::Synthetic => "synthetic",
        }
    }

    /// The V2 metadata platform (`<project>_<format>`).
    pub fn platform(self) -> &'static str {
        match self {
            EngineKind::TractOnnx => "onnx_onnxv1",
            EngineKind::TractNnef => "tract_nnef",
            EngineKind::TensorRt => "tensorrt_plan",
            EngineKind::Synthetic => "synthetic",
        }
    }
}

/// `[engine]`: the engine file and how to run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    /// The engine kind.
    pub kind: EngineKind,
    /// The engine file, relative to the directory of `runtime.toml` (or absolute). Required
    /// for every kind except `synthetic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The engine metadata file (compatibility tuple), relative like `path`; optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
    /// Parameters of the `synthetic` engine; required for it, refused for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<Synthetic>,
}

/// `[engine.synthetic]`: a batch of `b` rows takes `base_ms + per_row_ms · b` milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Synthetic {
    /// Fixed cost per execution, in ms.
    pub base_ms: f64,
    /// Cost per row, in ms.
    pub per_row_ms: f64,
}

/// `[warmup]`: executions run on every instance before the server reports ready.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Warmup {
    /// Batch sizes to run; absent means preferred sizes ∪ powers of two ≤ `max_batch_size`.
    /// An empty list turns warm-up off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_sizes: Option<Vec<u32>>,
}

/// `[server]`: the HTTP listener and the shutdown sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Server {
    /// The address to bind (`INFER_HOST` overrides it).
    pub host: String,
    /// The HTTP port (`INFER_PORT` overrides it; 0 picks a free one).
    pub port: u16,
    /// After SIGTERM: seconds to keep serving while readiness says 503, so load balancers
    /// notice before connections are refused.
    pub drain_delay_s: u64,
    /// After the drain delay: seconds to finish in-flight requests before exiting non-zero.
    pub exit_timeout_s: u64,
    /// The largest request body accepted; larger gets 413.
    pub max_body_bytes: u64,
}

impl Default for Server {
    fn default() -> Self {
        Server {
            host: "0.0.0.0".to_owned(),
            port: 8000,
            drain_delay_s: 5,
            exit_timeout_s: 30,
            max_body_bytes: 64 << 20,
        }
    }
}

/// A `runtime.toml` that cannot be used: the TOML error, or every validation problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not TOML, or not this schema (unknown key, wrong type).
    #[error("invalid runtime config: {0}")]
    Parse(String),
    /// Parsed, but inconsistent; one message per problem, each naming its key.
    #[error("invalid runtime config: {}", .0.join("; "))]
    Invalid(Vec<String>),
}

impl RuntimeConfig {
    /// Parses and validates a `runtime.toml`. Pure: no file system access (engine paths are
    /// checked by whoever opens them).
    pub fn from_toml_str(s: &str) -> Result<RuntimeConfig, ConfigError> {
        let cfg: RuntimeConfig =
            toml::from_str(s).map_err(|e| ConfigError::Parse(e.to_string().trim().to_owned()))?;
        let problems = cfg.problems();
        if problems.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError::Invalid(problems))
        }
    }

    /// The canonical TOML text: the same config always gives the same bytes.
    pub fn to_toml_string(&self) -> String {
        // Serialising plain structs, strings and numbers cannot fail; the fallback keeps the
        // function total without a panic path.
        toml::to_string(self).unwrap_or_default()
    }

    /// Every validation problem, in file order; empty when the config is usable.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let name_ok = |s: &str| !s.is_empty() && !s.contains('/') && !s.contains(char::is_control);
        if !name_ok(&self.model.name) {
            p.push(format!(
                "model.name {:?} must be non-empty without '/'",
                self.model.name
            ));
        }
        if !name_ok(&self.model.version) {
            p.push(format!(
                "model.version {:?} must be non-empty without '/'",
                self.model.version
            ));
        }
        for (section, tensors) in [("inputs", &self.inputs), ("outputs", &self.outputs)] {
            if tensors.is_empty() {
                p.push(format!("{section} must list at least one tensor"));
            }
            let mut seen = BTreeSet::new();
            for (i, t) in tensors.iter().enumerate() {
                let at = format!("{section}[{i}] ({:?})", t.name);
                if t.name.is_empty() {
                    p.push(format!("{at}: name must be non-empty"));
                }
                if !seen.insert(t.name.as_str()) {
                    p.push(format!("{at}: duplicate tensor name"));
                }
                match t.dims.first() {
                    Some(-1) => {}
                    _ => p.push(format!("{at}: dims must start with the batch dimension -1")),
                }
                if t.dims.iter().skip(1).any(|&d| d <= 0) {
                    p.push(format!(
                        "{at}: dims after the batch dimension must be fixed and positive, got {:?}",
                        t.dims
                    ));
                }
            }
        }
        let b = &self.batching;
        if b.max_batch_size == 0 {
            p.push("batching.max_batch_size must be at least 1".to_owned());
        }
        for &s in &b.preferred_batch_sizes {
            if s == 0 || s > b.max_batch_size {
                p.push(format!(
                    "batching.preferred_batch_sizes: {s} is outside 1..={}",
                    b.max_batch_size
                ));
            }
        }
        if b.instances == 0 {
            p.push("batching.instances must be at least 1".to_owned());
        }
        let e = &self.engine;
        match (e.kind, &e.path, &e.synthetic) {
            (EngineKind::Synthetic, _, None) => {
                p.push("engine.synthetic is required when engine.kind = \"synthetic\"".to_owned())
            }
            (EngineKind::Synthetic, _, Some(s)) => {
                let ok = |v: f64| v.is_finite() && v >= 0.0;
                if !ok(s.base_ms) || !ok(s.per_row_ms) {
                    p.push(
                        "engine.synthetic: base_ms and per_row_ms must be finite and >= 0"
                            .to_owned(),
                    );
                }
            }
            (k, None, _) => p.push(format!(
                "engine.path is required when engine.kind = \"{}\"",
                k.as_str()
            )),
            (k, Some(_), Some(_)) => p.push(format!(
                "engine.synthetic is only for engine.kind = \"synthetic\", not \"{}\"",
                k.as_str()
            )),
            (_, Some(path), None) if path.is_empty() => {
                p.push("engine.path must be non-empty".to_owned())
            }
            _ => {}
        }
        if let Some(sizes) = &self.warmup.batch_sizes {
            for &s in sizes {
                if s == 0 || s > b.max_batch_size {
                    p.push(format!(
                        "warmup.batch_sizes: {s} is outside 1..={}",
                        b.max_batch_size
                    ));
                }
            }
        }
        if self.server.max_body_bytes == 0 {
            p.push("server.max_body_bytes must be at least 1".to_owned());
        }
        p
    }

    /// The V2 metadata platform: `model.platform`, else derived from the engine kind.
    pub fn platform(&self) -> &str {
        self.model
            .platform
            .as_deref()
            .unwrap_or_else(|| self.engine.kind.platform())
    }

    /// The batch sizes warm-up runs, ascending: `warmup.batch_sizes` when given, else the
    /// preferred sizes ∪ powers of two ≤ `max_batch_size`.
    pub fn warmup_batch_sizes(&self) -> Vec<u32> {
        let mut set = BTreeSet::new();
        match &self.warmup.batch_sizes {
            Some(sizes) => set.extend(sizes.iter().copied()),
            None => {
                let max = self.batching.max_batch_size;
                set.extend(self.batching.preferred());
                let mut p = 1u32;
                while p <= max {
                    set.insert(p);
                    p = match p.checked_mul(2) {
                        Some(n) => n,
                        None => break,
                    };
                }
            }
        }
        set.into_iter().filter(|&s| s >= 1).collect()
    }
}

impl fmt::Display for RuntimeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_toml_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLP: &str = r#"
[model]
name = "mlp"
version = "1"

[[inputs]]
name = "input"
datatype = "FP32"
dims = [-1, 64]

[[outputs]]
name = "output"
datatype = "FP32"
dims = [-1, 10]

[batching]
max_batch_size = 32
preferred_batch_sizes = [8, 16, 32]
max_queue_delay_us = 500
max_queue_size = 1024
default_timeout_ms = 1000
instances = 1

[engine]
kind = "tract-onnx"
path = "mlp.onnx"
"#;

    fn check(src: &str, expected: Result<(), &[&str]>) {
        match (RuntimeConfig::from_toml_str(src), expected) {
            (Ok(_), Ok(())) => {}
            (Err(ConfigError::Invalid(got)), Err(want)) => assert_eq!(got, want),
            (Err(ConfigError::Parse(got)), Err(want)) => {
                assert!(
                    want.len() == 1 && got.contains(want[0]),
                    "{got:?} lacks {want:?}"
                )
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn valid_and_defaults() {
        let cfg = RuntimeConfig::from_toml_str(MLP).unwrap();
        assert_eq!(cfg.server, Server::default());
        assert_eq!(cfg.server.port, 8000);
        assert_eq!(cfg.platform(), "onnx_onnxv1");
        assert_eq!(cfg.warmup_batch_sizes(), vec![1, 2, 4, 8, 16, 32]);
        assert_eq!(cfg.inputs[0].row_elements(), 64);
        check(MLP, Ok(()));
    }

    #[test]
    fn canonical_round_trip() {
        let cfg = RuntimeConfig::from_toml_str(MLP).unwrap();
        let text = cfg.to_toml_string();
        let again = RuntimeConfig::from_toml_str(&text).unwrap();
        assert_eq!(cfg, again);
        assert_eq!(text, again.to_toml_string());
        // Sections in declaration order, defaults written out.
        let order: Vec<usize> = [
            "[model]",
            "[[inputs]]",
            "[[outputs]]",
            "[batching]",
            "[engine]",
            "[server]",
        ]
        .iter()
        .map(|s| {
            text.find(s)
                .unwrap_or_else(|| panic!("{s} missing in {text}"))
        })
        .collect();
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
    }

    #[test]
    fn problems_are_all_reported() {
        check(
            &MLP.replace("[-1, 64]", "[4, 0]")
                .replace("preferred_batch_sizes = [8, 16, 32]", "preferred_batch_sizes = [0, 64]")
                .replace("instances = 1", "instances = 0"),
            Err(&[
                "inputs[0] (\"input\"): dims must start with the batch dimension -1",
                "inputs[0] (\"input\"): dims after the batch dimension must be fixed and positive, got [4, 0]",
                "batching.preferred_batch_sizes: 0 is outside 1..=32",
                "batching.preferred_batch_sizes: 64 is outside 1..=32",
                "batching.instances must be at least 1",
            ]),
        );
        check(
            &MLP.replace(
                "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
                "kind = \"synthetic\"",
            ),
            Err(&["engine.synthetic is required when engine.kind = \"synthetic\""]),
        );
        check(
            &MLP.replace("path = \"mlp.onnx\"", ""),
            Err(&["engine.path is required when engine.kind = \"tract-onnx\""]),
        );
        check(
            &MLP.replace("name = \"mlp\"", "name = \"a/b\""),
            Err(&["model.name \"a/b\" must be non-empty without '/'"]),
        );
    }

    #[test]
    fn strict_parsing() {
        check(
            &MLP.replace("instances = 1", "instances = 1\nbogus = 2"),
            Err(&["unknown field `bogus`"]),
        );
        check(
            &MLP.replace("\"FP32\"", "\"fp32\""),
            Err(&["unknown variant `fp32`"]),
        );
        check("[model", Err(&["unclosed table"]));
    }

    #[test]
    fn synthetic_engine() {
        let src = MLP.replace(
            "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
            "kind = \"synthetic\"\nsynthetic = { base_ms = 40.0, per_row_ms = 6.0 }",
        );
        let cfg = RuntimeConfig::from_toml_str(&src).unwrap();
        assert_eq!(
            cfg.engine.synthetic,
            Some(Synthetic {
                base_ms: 40.0,
                per_row_ms: 6.0
            })
        );
        assert_eq!(
            RuntimeConfig::from_toml_str(&cfg.to_toml_string()).unwrap(),
            cfg
        );
    }

    #[test]
    fn warmup_sizes() {
        let mut cfg = RuntimeConfig::from_toml_str(MLP).unwrap();
        cfg.batching.max_batch_size = 24;
        cfg.batching.preferred_batch_sizes = vec![6, 24];
        assert_eq!(cfg.warmup_batch_sizes(), vec![1, 2, 4, 6, 8, 16, 24]);
        cfg.warmup.batch_sizes = Some(vec![3, 1, 3]);
        assert_eq!(cfg.warmup_batch_sizes(), vec![1, 3]);
        cfg.warmup.batch_sizes = Some(vec![]);
        assert!(cfg.warmup_batch_sizes().is_empty());
    }
}
