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
/// The HTTP port when `[server] port` is not given (KServe's and Triton's).
pub const DEFAULT_HTTP_PORT: u16 = 8000;
/// The gRPC port when none is given (`--grpc-port`, `INFER_GRPC_PORT`; Triton's).
pub const DEFAULT_GRPC_PORT: u16 = 8001;

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
    /// Text in: the tokenizer in front of the engine and the pooling after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<crate::text::Text>,
    /// Images in: decoding, resizing and normalising in front of the engine, labels, boxes,
    /// vectors or text lines after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision: Option<crate::vision::Vision>,
    /// Identical requests answered from memory (opt-in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_cache: Option<ResponseCache>,
}

/// `[response_cache]`: a request identical to an earlier one (same inputs, same parameters
/// that change the answer) is answered from memory, least recently used entries evicted
/// first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponseCache {
    /// The most bytes the entries (keys and answers) hold.
    pub max_bytes: u64,
}

/// The largest response cache (`response_cache.max_bytes`): 64 GiB.
pub const MAX_RESPONSE_CACHE_BYTES: u64 = 64 << 30;

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

/// The output `name` of `outputs` that a pre- or post-processing section (`key`, such as
/// `text.output`) reads as floats: the problem when it is missing or neither FP32 nor FP16.
pub(crate) fn float_output<'a>(
    key: &str,
    name: &str,
    outputs: &'a [TensorSpec],
) -> Result<&'a TensorSpec, String> {
    match outputs.iter().find(|t| t.name == name) {
        None => Err(format!(
            "{key}: the engine has no output {name:?} (its outputs are {:?})",
            outputs.iter().map(|t| &t.name).collect::<Vec<_>>()
        )),
        Some(t) if t.datatype != DataType::F32 && t.datatype != DataType::F16 => Err(format!(
            "{key}: output {:?} is {}, not FP32 or FP16",
            t.name, t.datatype
        )),
        Some(t) => Ok(t),
    }
}

/// `[[inputs]]` / `[[outputs]]`: one tensor of the model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorSpec {
    /// The tensor name, as in the engine and in V2 requests.
    pub name: String,
    /// The V2 datatype (`"FP32"`, `"INT64"`, …).
    pub datatype: DataType,
    /// The full shape including the batch dimension, which comes first and is `-1`. A later
    /// dimension is fixed and positive, or `-1` (variable): an input's variable dimensions take
    /// their bounds from `profile`; an output's follow from the inputs.
    pub dims: Vec<i64>,
    /// The sizes a variable input dimension may take, one entry per dimension after the batch
    /// dimension (fixed dimensions repeat their size): requests stay within `min..=max`,
    /// warm-up runs `opt`, `min` and `max`. Required for an input with a `-1` after the batch
    /// dimension, refused otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<DimProfile>,
    /// Names of the dimensions after the batch dimension (the ONNX `dim_param`), `""` for an
    /// unnamed one; empty when none is named. Inputs whose variable dimensions share a name
    /// must agree on their size in a request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dim_names: Vec<String>,
    /// An input's padding value: requests whose inputs differ in length (the first dimension
    /// after the batch one) share a batch, each row padded to the batch's longest with it, and
    /// outputs whose first dimension after the batch one is variable are cut back to each
    /// request's own length. Every input of the model pads, or none; `INT32`/`INT64` inputs of
    /// dims `[-1, -1]` only (token ids and masks). Text models pad their own (`[text]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pad: Option<i64>,
    /// An integer input whose values index a table of this many rows inside the model (token
    /// ids into an embedding table: a `Gather` of a constant). The runtime refuses a request
    /// holding a value outside `-table_rows..table_rows` (ONNX's range for `Gather`) with 400
    /// naming the input, the value and the bound, before the engine sees it: engines read past
    /// the table's end otherwise (tract aborts the process). Written by the builder from the
    /// model's graph; `INT8` to `INT64` and `UINT8` to `UINT64` inputs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_rows: Option<u64>,
}

/// `profile = { min = [..], opt = [..], max = [..] }` of a tensor: per dimension after the
/// batch dimension, the smallest, the most common and the largest size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DimProfile {
    pub min: Vec<i64>,
    pub opt: Vec<i64>,
    pub max: Vec<i64>,
}

/// The largest size of one dimension `runtime.toml` accepts.
pub const MAX_DIM: i64 = 1 << 24;
/// The largest `max_batch_size`.
pub const MAX_BATCH_SIZE: u32 = 1 << 16;
/// The largest `instances` (it is further bounded by the CPUs at start, see `infer-serve`).
pub const MAX_INSTANCES: u32 = 256;
/// The largest `max_queue_delay_us`: 10 s.
pub const MAX_QUEUE_DELAY_US: u64 = 10_000_000;
/// The largest `default_timeout_ms`: 1 h.
pub const MAX_TIMEOUT_MS: u64 = 3_600_000;
/// The largest `drain_delay_s` and `exit_timeout_s`: 1 h each.
pub const MAX_SHUTDOWN_S: u64 = 3_600;
/// The largest `max_body_bytes`: 1 GiB.
pub const MAX_BODY_BYTES: u64 = 1 << 30;
/// The largest `engine.threads`.
pub const MAX_THREADS: u32 = 1024;
/// The default `server.memory_budget_bytes`: 4 GiB.
pub const DEFAULT_MEMORY_BUDGET: u64 = 4 << 30;

/// The name of padded inputs' shared length when the model does not name it.
pub const PADDED_LENGTH: &str = "length (padded)";

impl TensorSpec {
    /// The dimensions after the batch dimension at their largest: fixed ones as they are,
    /// variable ones at their profile's `max` (0 when unknown, as for an output).
    pub fn row_dims(&self) -> Vec<usize> {
        self.row_dims_at(|p| &p.max)
    }

    /// The dimensions after the batch dimension with variable ones at the profile's `min`.
    pub fn min_row_dims(&self) -> Vec<usize> {
        self.row_dims_at(|p| &p.min)
    }

    /// The dimensions after the batch dimension with variable ones at the profile's `opt`.
    pub fn opt_row_dims(&self) -> Vec<usize> {
        self.row_dims_at(|p| &p.opt)
    }

    fn row_dims_at(&self, pick: impl Fn(&DimProfile) -> &Vec<i64>) -> Vec<usize> {
        self.dims
            .iter()
            .skip(1)
            .enumerate()
            .map(|(i, &d)| {
                let d = if d == -1 {
                    self.profile
                        .as_ref()
                        .and_then(|p| pick(p).get(i).copied())
                        .unwrap_or(0)
                } else {
                    d
                };
                usize::try_from(d).unwrap_or(0)
            })
            .collect()
    }

    /// Elements in one row at its largest (the product of [`TensorSpec::row_dims`]).
    pub fn row_elements(&self) -> usize {
        self.row_dims()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .unwrap_or(usize::MAX)
    }

    /// True when a dimension after the batch dimension is variable.
    pub fn is_variable(&self) -> bool {
        self.dims.iter().skip(1).any(|&d| d == -1)
    }

    /// The name of dimension `axis` (counting the batch dimension as 0), when it has one. A
    /// padded input's length is shared by every input ([`TensorSpec::pad`]): unnamed, it is
    /// [`PADDED_LENGTH`].
    pub fn dim_name(&self, axis: usize) -> Option<&str> {
        let named = axis
            .checked_sub(1)
            .and_then(|i| self.dim_names.get(i))
            .map(String::as_str)
            .filter(|n| !n.is_empty());
        match named {
            None if axis == 1 && self.pad.is_some() => Some(PADDED_LENGTH),
            named => named,
        }
    }

    /// The bounds `(min, max)` of dimension `axis` (counting the batch dimension as 0, which
    /// has none here); a fixed dimension's bounds are its size.
    pub fn bounds(&self, axis: usize) -> Option<(i64, i64)> {
        let i = axis.checked_sub(1)?;
        match *self.dims.get(axis)? {
            -1 => {
                let p = self.profile.as_ref()?;
                Some((*p.min.get(i)?, *p.max.get(i)?))
            }
            d => Some((d, d)),
        }
    }

    /// Bytes of one row at its largest (`None` for `BYTES`, whose size is not fixed).
    pub fn max_row_bytes(&self) -> Option<u64> {
        let size = self.datatype.size()? as u64;
        self.row_dims()
            .iter()
            .try_fold(size, |a, &d| a.checked_mul(d as u64))
            .or(Some(u64::MAX))
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
    /// When the queue delay is waited: only while more requests can be expected (the default)
    /// or always (Triton's rule). Written only when not the default, so runtime.toml files of
    /// earlier builds and their digests stay as they were.
    #[serde(skip_serializing_if = "QueueDelay::is_adaptive")]
    pub queue_delay: QueueDelay,
}

/// When the batcher waits `max_queue_delay_us` for a batch to fill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueueDelay {
    /// Only while more requests can be expected within it, from the traffic the batcher
    /// measures (`infer_spec::batch::Arrivals`): a lone request at low load goes at once; under
    /// load batches form as with `Strict`.
    #[default]
    Adaptive,
    /// Always, as Triton does: a lone request waits the whole delay.
    Strict,
}

impl QueueDelay {
    pub fn is_adaptive(&self) -> bool {
        *self == QueueDelay::Adaptive
    }

    /// As recipes and runtime.toml write it.
    pub fn parse(s: &str) -> Option<QueueDelay> {
        match s {
            "adaptive" => Some(QueueDelay::Adaptive),
            "strict" => Some(QueueDelay::Strict),
            _ => None,
        }
    }
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
            queue_delay: QueueDelay::Adaptive,
        }
    }
}

impl Batching {
    /// Whether the batcher waits the delay only while more requests can be expected.
    pub fn adaptive_delay(&self) -> bool {
        self.queue_delay.is_adaptive()
    }

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

    /// The batch sizes warm-up runs when none are named: 1, every preferred size and
    /// `max_batch_size`, ascending (the sizes the batcher aims for, and both ends of the range).
    /// The one default: the recipe, the runtime and the warm-up manifest all use it.
    pub fn default_warmup_sizes(&self) -> Vec<u32> {
        let mut set: BTreeSet<u32> = self.preferred_batch_sizes.iter().copied().collect();
        set.insert(1);
        set.insert(self.max_batch_size);
        set.into_iter()
            .filter(|&s| (1..=self.max_batch_size.max(1)).contains(&s))
            .collect()
    }
}

/// `[engine] kind`: which of the runtime's backends loads the engine and runs batches. Not the
/// engine family ([`crate::engine::EngineKind`], what the builder made): one family may load
/// through more than one backend (tract reads ONNX or NNEF), and `synthetic` has no engine.
/// [`crate::engine::backend_kind`] maps one to the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BackendKind {
    /// An ONNX model run on CPU by tract.
    #[serde(rename = "tract-onnx")]
    TractOnnx,
    /// A tract NNEF archive run on CPU.
    #[serde(rename = "tract-nnef")]
    TractNnef,
    /// A serialized TensorRT engine.
    #[serde(rename = "tensorrt")]
    TensorRt,
    /// An ONNX model run on CPU by ONNX Runtime, loaded at start from `engine.library`.
    #[serde(rename = "onnxruntime")]
    OnnxRuntime,
    /// An ONNX model compiled at start by OpenVINO's CPU plugin, loaded from `engine.library`
    /// (`libopenvino_c.so.<N>`, with the rest of OpenVINO's CPU files beside it).
    #[serde(rename = "openvino")]
    OpenVino,
    /// A model-free engine that sleeps `base_ms + per_row_ms · rows` per batch and returns
    /// deterministic outputs; for tests and benchmarks of the batcher only.
    #[serde(rename = "synthetic")]
    Synthetic,
}

impl BackendKind {
    /// The spelling used in `runtime.toml`.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::TractOnnx => "tract-onnx",
            BackendKind::TractNnef => "tract-nnef",
            BackendKind::TensorRt => "tensorrt",
            BackendKind::OnnxRuntime => "onnxruntime",
            BackendKind::OpenVino => "openvino",
            BackendKind::Synthetic => "synthetic",
        }
    }

    /// The V2 metadata platform (`<project>_<format>`).
    pub fn platform(self) -> &'static str {
        match self {
            BackendKind::TractOnnx => "onnx_onnxv1",
            BackendKind::TractNnef => "tract_nnef",
            BackendKind::TensorRt => "tensorrt_plan",
            BackendKind::OnnxRuntime => "onnxruntime_onnx",
            BackendKind::OpenVino => "openvino",
            BackendKind::Synthetic => "synthetic",
        }
    }
}

/// `[engine]`: the engine file and how to run it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineSection {
    /// The engine kind.
    pub kind: BackendKind,
    /// The engine file, relative to the directory of `runtime.toml` (or absolute). Required
    /// for every kind except `synthetic`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The engine metadata file (compatibility tuple), relative like `path`; optional.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<String>,
    /// The shared library the backend loads at start (`dlopen`), relative like `path` (or
    /// absolute): required for `onnxruntime` (`libonnxruntime.so.<version>`), optional for
    /// `tensorrt`, refused for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub library: Option<String>,
    /// Threads one instance computes a batch with (ONNX Runtime's intra-op threads), set by
    /// the recipe's `[engine] threads` or by hand; absent, the runtime decides where it runs
    /// ([`RuntimeConfig::threads`]). Only for `onnxruntime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// What the build measured: fewer threads than an instance's share of the builder's CPUs
    /// ran the model faster. A hint, taken where an instance's share is the same. Only for
    /// `onnxruntime`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<MeasuredThreads>,
    /// The precision the engine computes in, for an engine that takes it as a setting at start
    /// (OpenVINO's inference precision: `fp32`, `bf16` where the CPU has it, `fp16`); inputs and
    /// outputs keep the model's types. Only for `openvino`; absent: `fp32`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<crate::engine::Precision>,
    /// Parameters of the `synthetic` engine; required for it, refused for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub synthetic: Option<Synthetic>,
}

/// `[engine.measured]`: the intra-op thread count the build measured fastest, and the share
/// of CPUs one instance had when it was measured (the most threads tried).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MeasuredThreads {
    /// The fastest count, fewer than `share`.
    pub threads: u32,
    /// The CPUs of one instance where it was measured.
    pub share: u32,
}

/// Where an instance's intra-op thread count came from ([`RuntimeConfig::threads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadsFrom {
    /// The runtime's `--threads` or `INFER_THREADS`.
    Given,
    /// `runtime.toml`'s `engine.threads` (the recipe's `[engine] threads`).
    Config,
    /// `[engine.measured]`: the build measured fewer threads faster on the same share.
    Measured,
    /// The CPUs the process may use over the instances.
    Share,
}

impl ThreadsFrom {
    /// How the start-up log names it.
    pub fn as_str(self) -> &'static str {
        match self {
            ThreadsFrom::Given => "--threads / INFER_THREADS",
            ThreadsFrom::Config => "engine.threads",
            ThreadsFrom::Measured => "engine.measured (the build's measurement, same share)",
            ThreadsFrom::Share => "cpus / instances",
        }
    }
}

/// `[engine.synthetic]`: a batch of `b` rows of (padded) length `l` takes
/// `base_ms + per_row_ms · b + per_token_ms · b · l` milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Synthetic {
    /// Fixed cost per execution, in ms.
    pub base_ms: f64,
    /// Cost per row, in ms.
    pub per_row_ms: f64,
    /// Cost per token computed, in ms: rows times the first input's second dimension (a
    /// padded model's sequence length). Absent: 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub per_token_ms: f64,
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

/// `[warmup]`: executions run on every instance before the server reports ready.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Warmup {
    /// Batch sizes to run; absent means [`Batching::default_warmup_sizes`] (1, the preferred
    /// sizes and `max_batch_size`). An empty list turns warm-up off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_sizes: Option<Vec<u32>>,
    /// Sample requests warm-up sends (`infer_spec::samples`: one V2 JSON request or an array
    /// of them), relative to this file's directory or absolute; synthetic data when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<String>,
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
    /// What the batches of all instances may hold at once: `instances × max_batch_size ×`
    /// the bytes of one input and output row at its largest shape must fit (the engine's own
    /// working memory comes on top).
    pub memory_budget_bytes: u64,
    /// Seconds a client has to send a request's headers, from its first byte (HTTP/1.1). A
    /// connection over it is closed without an answer.
    ///
    /// These five client bounds are written only when not the default, so the runtime.toml
    /// of earlier builds, and its digest, stay as they were.
    #[serde(skip_serializing_if = "is_default_header_read_timeout")]
    pub header_read_timeout_s: u64,
    /// Seconds a request body may take before [`Server::body_min_bytes_per_s`] counts: the
    /// body must have arrived by this plus one second per `body_min_bytes_per_s` bytes it has
    /// delivered (HTTP/1.1 and gRPC). Over it: 408 (gRPC `DEADLINE_EXCEEDED`).
    #[serde(skip_serializing_if = "is_default_body_read_timeout")]
    pub body_read_timeout_s: u64,
    /// The slowest request body accepted past [`Server::body_read_timeout_s`], in bytes per
    /// second on average; 0: the whole body must arrive within `body_read_timeout_s`.
    #[serde(skip_serializing_if = "is_default_body_rate")]
    pub body_min_bytes_per_s: u64,
    /// Seconds a connection may stay open without a request in progress (a keep-alive
    /// connection between requests, an HTTP/2 connection without a call) before it is closed
    /// (HTTP/2: GOAWAY first).
    #[serde(skip_serializing_if = "is_default_idle_timeout")]
    pub idle_timeout_s: u64,
    /// Open connections per listener (HTTP and gRPC each). At the cap a new connection closes
    /// the one idle the longest, or, when every one has a request in progress, is refused at
    /// once (HTTP/1.1: 503). Lowered at start to what the process's descriptor limit allows.
    #[serde(skip_serializing_if = "is_default_max_connections")]
    pub max_connections: u32,
}

/// The defaults of the client bounds in `[server]`.
pub const DEFAULT_HEADER_READ_TIMEOUT_S: u64 = 10;
pub const DEFAULT_BODY_READ_TIMEOUT_S: u64 = 30;
pub const DEFAULT_BODY_MIN_BYTES_PER_S: u64 = 64 << 10;
pub const DEFAULT_IDLE_TIMEOUT_S: u64 = 60;
pub const DEFAULT_MAX_CONNECTIONS: u32 = 4096;

fn is_default_header_read_timeout(v: &u64) -> bool {
    *v == DEFAULT_HEADER_READ_TIMEOUT_S
}
fn is_default_body_read_timeout(v: &u64) -> bool {
    *v == DEFAULT_BODY_READ_TIMEOUT_S
}
fn is_default_body_rate(v: &u64) -> bool {
    *v == DEFAULT_BODY_MIN_BYTES_PER_S
}
fn is_default_idle_timeout(v: &u64) -> bool {
    *v == DEFAULT_IDLE_TIMEOUT_S
}
fn is_default_max_connections(v: &u32) -> bool {
    *v == DEFAULT_MAX_CONNECTIONS
}

/// The largest `header_read_timeout_s`, `body_read_timeout_s` and `idle_timeout_s`: 1 h each.
pub const MAX_CLIENT_TIMEOUT_S: u64 = 3_600;
/// The largest `body_min_bytes_per_s`: 1 GiB/s.
pub const MAX_BODY_RATE: u64 = 1 << 30;
/// The largest `max_connections`.
pub const MAX_CONNECTIONS: u32 = 1 << 20;

impl Default for Server {
    fn default() -> Self {
        Server {
            host: "0.0.0.0".to_owned(),
            port: DEFAULT_HTTP_PORT,
            drain_delay_s: 5,
            exit_timeout_s: 30,
            max_body_bytes: 64 << 20,
            memory_budget_bytes: DEFAULT_MEMORY_BUDGET,
            header_read_timeout_s: DEFAULT_HEADER_READ_TIMEOUT_S,
            body_read_timeout_s: DEFAULT_BODY_READ_TIMEOUT_S,
            body_min_bytes_per_s: DEFAULT_BODY_MIN_BYTES_PER_S,
            idle_timeout_s: DEFAULT_IDLE_TIMEOUT_S,
            max_connections: DEFAULT_MAX_CONNECTIONS,
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

/// The threads one instance computes with when `engine.threads` is unset: the `cpus` the
/// process may use over `instances`, at least 1 (see [`RuntimeConfig::threads`]).
pub fn default_intra_op_threads(cpus: usize, instances: u32) -> usize {
    (cpus / instances.max(1) as usize).max(1)
}

impl RuntimeConfig {
    /// The bounds of a batch whose requests are padded to a common length, for a model that
    /// pads: a text model (`[text]`: its `token_budget`, by default `max_batch_size` rows of
    /// `max_length`, and its `max_padding_percent`), or a tensor model whose inputs all say
    /// their `pad` (`max_batch_size` rows of the profile's longest length). `None`: requests
    /// batch only with equal shapes. The runtime's batcher and the builder's replay of it
    /// both read them here.
    pub fn padded_bounds(&self) -> Option<crate::batch::Padded> {
        let rows = self.batching.max_batch_size as usize;
        if let Some(text) = &self.text {
            let token_budget = match text.token_budget {
                0 => rows * text.max_length as usize,
                b => b as usize,
            };
            return Some(crate::batch::Padded {
                token_budget,
                max_padding_percent: text.max_padding_percent,
            });
        }
        if self.inputs.is_empty() || self.inputs.iter().any(|i| i.pad.is_none()) {
            return None;
        }
        let longest = self
            .inputs
            .iter()
            .filter_map(|i| i.row_dims().first().copied())
            .max()
            .unwrap_or(0);
        Some(crate::batch::Padded {
            token_budget: if longest == 0 {
                usize::MAX
            } else {
                rows * longest
            },
            max_padding_percent: 0,
        })
    }

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
    #[allow(
        clippy::too_many_lines,
        reason = "one check per key in file order: a list that reads better whole than spread over helpers"
    )]
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
                if t.dims
                    .iter()
                    .skip(1)
                    .any(|&d| d != -1 && !(1..=MAX_DIM).contains(&d))
                {
                    p.push(format!(
                        "{at}: dims after the batch dimension must be -1 (variable) or in 1..={MAX_DIM}, got {:?}",
                        t.dims
                    ));
                }
                tensor_problems(&mut p, &at, section == "inputs", t);
            }
        }
        shared_dim_problems(&mut p, &self.inputs);
        padding_problems(&mut p, &self.inputs, self.text.is_some());
        if let Some(text) = &self.text {
            p.extend(text.problems(&self.inputs, &self.outputs));
        }
        if let Some(vision) = &self.vision {
            p.extend(vision.problems(&self.inputs, &self.outputs));
            if self.text.is_some() {
                p.push("a model takes text ([text]) or images ([vision]), not both".to_owned());
            }
        }
        if let Some(c) = &self.response_cache {
            if !(1..=MAX_RESPONSE_CACHE_BYTES).contains(&c.max_bytes) {
                p.push(format!(
                    "response_cache.max_bytes {} is outside 1..={MAX_RESPONSE_CACHE_BYTES}",
                    c.max_bytes
                ));
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
        if b.max_batch_size > MAX_BATCH_SIZE {
            p.push(format!(
                "batching.max_batch_size {} is more than {MAX_BATCH_SIZE}",
                b.max_batch_size
            ));
        }
        if b.instances > MAX_INSTANCES {
            p.push(format!(
                "batching.instances {} is more than {MAX_INSTANCES}",
                b.instances
            ));
        }
        if b.max_queue_delay_us > MAX_QUEUE_DELAY_US {
            p.push(format!(
                "batching.max_queue_delay_us {} is more than {MAX_QUEUE_DELAY_US} (10 s)",
                b.max_queue_delay_us
            ));
        }
        if b.default_timeout_ms > MAX_TIMEOUT_MS {
            p.push(format!(
                "batching.default_timeout_ms {} is more than {MAX_TIMEOUT_MS} (1 h)",
                b.default_timeout_ms
            ));
        }
        let e = &self.engine;
        match (e.kind, &e.path, &e.synthetic) {
            (BackendKind::Synthetic, _, None) => {
                p.push("engine.synthetic is required when engine.kind = \"synthetic\"".to_owned())
            }
            (BackendKind::Synthetic, _, Some(s)) => {
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
        let def = e.kind.engine();
        let library = def.and_then(|d| d.library);
        match (library, &e.library) {
            (Some(l), None) if l.required => p.push(format!(
                "engine.library is required when engine.kind = \"{}\" (the path of lib{})",
                e.kind.as_str(),
                l.name
            )),
            (Some(_), Some(l)) if l.is_empty() => {
                p.push("engine.library must be non-empty".to_owned())
            }
            (None, Some(_)) => p.push(format!(
                "engine.library is only for engine.kind = {}, not \"{}\"",
                crate::engines::backend_names(|d| d.library.is_some()),
                e.kind.as_str()
            )),
            _ => {}
        }
        match (def.is_some_and(|d| d.threads), e.threads) {
            (true, Some(t)) if !(1..=MAX_THREADS).contains(&t) => {
                p.push(format!("engine.threads {t} is outside 1..={MAX_THREADS}"))
            }
            (false, Some(_)) => p.push(format!(
                "engine.threads is only for engine.kind = {}, not \"{}\"",
                crate::engines::backend_names(|d| d.threads),
                e.kind.as_str()
            )),
            _ => {}
        }
        match (def.map_or(&[][..], |d| d.precisions), e.precision) {
            (_, None) => {}
            ([], Some(_)) => p.push(format!(
                "engine.precision is only for engine.kind = {}, not \"{}\"",
                crate::engines::backend_names(|d| !d.precisions.is_empty()),
                e.kind.as_str()
            )),
            (allowed, Some(x)) if !allowed.contains(&x) => p.push(format!(
                "engine.precision \"{x}\" is not one {} computes in: {}",
                e.kind.as_str(),
                allowed
                    .iter()
                    .map(|a| format!("\"{a}\""))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            _ => {}
        }
        match (def.is_some_and(|d| d.threads), e.measured) {
            (true, Some(m)) if !(1..=MAX_THREADS).contains(&m.share) || !(1..m.share).contains(&m.threads) => {
                p.push(format!(
                    "engine.measured: threads {} and share {}: a share is 1..={MAX_THREADS} and the threads fewer than it, at least 1",
                    m.threads, m.share
                ))
            }
            (false, Some(_)) => p.push(format!(
                "engine.measured is only for engine.kind = {}, not \"{}\"",
                crate::engines::backend_names(|d| d.threads),
                e.kind.as_str()
            )),
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
        let srv = &self.server;
        if srv.max_body_bytes == 0 {
            p.push("server.max_body_bytes must be at least 1".to_owned());
        }
        if srv.max_body_bytes > MAX_BODY_BYTES {
            p.push(format!(
                "server.max_body_bytes {} is more than {MAX_BODY_BYTES} (1 GiB)",
                srv.max_body_bytes
            ));
        }
        for (key, v) in [
            ("drain_delay_s", srv.drain_delay_s),
            ("exit_timeout_s", srv.exit_timeout_s),
        ] {
            if v > MAX_SHUTDOWN_S {
                p.push(format!(
                    "server.{key} {v} is more than {MAX_SHUTDOWN_S} (1 h)"
                ));
            }
        }
        for (key, v) in [
            ("header_read_timeout_s", srv.header_read_timeout_s),
            ("body_read_timeout_s", srv.body_read_timeout_s),
            ("idle_timeout_s", srv.idle_timeout_s),
        ] {
            if !(1..=MAX_CLIENT_TIMEOUT_S).contains(&v) {
                p.push(format!(
                    "server.{key} {v} is outside 1..={MAX_CLIENT_TIMEOUT_S} (1 s to 1 h)"
                ));
            }
        }
        if srv.body_min_bytes_per_s > MAX_BODY_RATE {
            p.push(format!(
                "server.body_min_bytes_per_s {} is more than {MAX_BODY_RATE} (1 GiB/s)",
                srv.body_min_bytes_per_s
            ));
        }
        if !(1..=MAX_CONNECTIONS).contains(&srv.max_connections) {
            p.push(format!(
                "server.max_connections {} is outside 1..={MAX_CONNECTIONS}",
                srv.max_connections
            ));
        }
        let row = |ts: &[TensorSpec]| {
            ts.iter()
                .filter_map(TensorSpec::max_row_bytes)
                .fold(0u64, u64::saturating_add)
        };
        let (in_row, out_row) = (row(&self.inputs), row(&self.outputs));
        if in_row > srv.max_body_bytes {
            p.push(format!(
                "one row of the inputs at their largest shape is {in_row} bytes, more than server.max_body_bytes {}: no request could carry it",
                srv.max_body_bytes
            ));
        }
        let batches = u64::from(b.instances)
            .saturating_mul(u64::from(b.max_batch_size))
            .saturating_mul(in_row.saturating_add(out_row));
        if batches > srv.memory_budget_bytes {
            p.push(format!(
                "batching.instances {} x max_batch_size {} x {} bytes per input and output row (largest shapes) = {batches} bytes, more than server.memory_budget_bytes {}",
                b.instances,
                b.max_batch_size,
                in_row.saturating_add(out_row),
                srv.memory_budget_bytes
            ));
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

    /// The threads one instance computes with where the model may use `cpus` CPUs, decided
    /// where the image runs, first that applies: `given` (the runtime's `--threads` or
    /// `INFER_THREADS`), `engine.threads`, `[engine.measured]` when an instance's share here
    /// (`cpus / batching.instances`, at least 1) is the share it was measured on, else that
    /// share, at most [`MAX_THREADS`]. The builder measures T(b) on the same share, so the
    /// profile matches what the image runs on a node like the builder.
    pub fn threads(&self, cpus: usize, given: Option<u32>) -> (usize, ThreadsFrom) {
        let share =
            default_intra_op_threads(cpus, self.batching.instances).min(MAX_THREADS as usize);
        match (given, self.engine.threads, self.engine.measured) {
            (Some(t), _, _) => (t as usize, ThreadsFrom::Given),
            (None, Some(t), _) => (t as usize, ThreadsFrom::Config),
            (None, None, Some(m)) if m.share as usize == share => {
                (m.threads as usize, ThreadsFrom::Measured)
            }
            _ => (share, ThreadsFrom::Share),
        }
    }

    /// The batch sizes warm-up runs, ascending and without repeats: `warmup.batch_sizes` when
    /// given, else [`Batching::default_warmup_sizes`].
    pub fn warmup_batch_sizes(&self) -> Vec<u32> {
        self.warmup.sizes(&self.batching)
    }
}

impl Warmup {
    /// The batch sizes this warm-up runs under `batching`, ascending and without repeats:
    /// `batch_sizes` when given (an empty list: none), else the batcher's default.
    pub fn sizes(&self, batching: &Batching) -> Vec<u32> {
        match &self.batch_sizes {
            Some(sizes) => {
                let set: BTreeSet<u32> = sizes.iter().copied().filter(|&s| s >= 1).collect();
                set.into_iter().collect()
            }
            None => batching.default_warmup_sizes(),
        }
    }
}

/// The problems of one tensor's `profile` and `dim_names`.
fn tensor_problems(p: &mut Vec<String>, at: &str, input: bool, t: &TensorSpec) {
    let rank = t.dims.len().saturating_sub(1);
    if let Some(rows) = t.table_rows {
        if !input || !t.datatype.is_integer() {
            p.push(format!(
                "{at}: table_rows is for integer inputs (the values index a table), this is {} {}",
                if input { "an input of" } else { "an output of" },
                t.datatype
            ));
        } else if rows == 0 {
            p.push(format!("{at}: table_rows must be at least 1"));
        }
    }
    if !t.dim_names.is_empty() && t.dim_names.len() != rank {
        p.push(format!(
            "{at}: dim_names has {} names, the dims after the batch dimension are {rank}",
            t.dim_names.len()
        ));
    }
    match (&t.profile, input && t.is_variable()) {
        (None, true) => p.push(format!(
            "{at}: dims {:?} are variable after the batch dimension: a profile (min, opt, max) is required",
            t.dims
        )),
        (Some(_), false) => p.push(format!(
            "{at}: a profile is only for inputs with variable (-1) dims after the batch dimension"
        )),
        (None, false) => {}
        (Some(prof), true) => {
            for (key, list) in [("min", &prof.min), ("opt", &prof.opt), ("max", &prof.max)] {
                if list.len() != rank {
                    p.push(format!(
                        "{at}: profile.{key} has {} sizes, the dims after the batch dimension are {rank}",
                        list.len()
                    ));
                    return;
                }
            }
            for (i, &d) in t.dims.iter().skip(1).enumerate() {
                let (min, opt, max) = (prof.min[i], prof.opt[i], prof.max[i]);
                if d != -1 {
                    if [min, opt, max].iter().any(|&v| v != d) {
                        p.push(format!(
                            "{at}: dimension {} is fixed at {d}, the profile must repeat it",
                            i + 1
                        ));
                    }
                } else if !(1 <= min && min <= opt && opt <= max && max <= MAX_DIM) {
                    p.push(format!(
                        "{at}: profile of dimension {} must have 1 <= min <= opt <= max <= {MAX_DIM}, got {min}, {opt}, {max}",
                        i + 1
                    ));
                }
            }
        }
    }
}

/// Why `pad` cannot be the padding value of an input of `datatype` and `dims`
/// ([`TensorSpec::pad`]), if it cannot: the one rule the recipe and `runtime.toml` check.
pub fn pad_misfit(datatype: DataType, dims: &[i64], pad: i64) -> Option<PadMisfit> {
    if dims != [-1, -1] || !matches!(datatype, DataType::I32 | DataType::I64) {
        Some(PadMisfit::NotTokenLike)
    } else if datatype == DataType::I32 && i32::try_from(pad).is_err() {
        Some(PadMisfit::OutOfRange)
    } else {
        None
    }
}

/// What [`pad_misfit`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PadMisfit {
    /// Padding is for token-like inputs only: `INT32`/`INT64` of dims `[-1, -1]`.
    NotTokenLike,
    /// The value does not fit the input's datatype.
    OutOfRange,
}

/// Padded inputs ([`TensorSpec::pad`]): all or none, token-like (`INT32`/`INT64`, dims
/// `[-1, -1]`), the value in the datatype's range, and not with `[text]`, which pads its own.
fn padding_problems(p: &mut Vec<String>, inputs: &[TensorSpec], text: bool) {
    if inputs.iter().all(|t| t.pad.is_none()) {
        return;
    }
    if text {
        p.push("inputs: pad is for tensor models; a [text] model pads its own inputs".to_owned());
    }
    for (i, t) in inputs.iter().enumerate() {
        let at = format!("inputs[{i}] ({:?})", t.name);
        let Some(v) = t.pad else {
            p.push(format!(
                "{at}: no pad, though other inputs have one: every input of a padded model says its padding value"
            ));
            continue;
        };
        match pad_misfit(t.datatype, &t.dims, v) {
            Some(PadMisfit::NotTokenLike) => p.push(format!(
                "{at}: pad is for INT32 or INT64 inputs of dims [-1, -1], this one is {} {:?}",
                t.datatype.as_str(),
                t.dims
            )),
            Some(PadMisfit::OutOfRange) => p.push(format!(
                "{at}: pad {v} does not fit {}",
                t.datatype.as_str()
            )),
            None => {}
        }
    }
}

/// Inputs whose variable dimensions share a name must be able to agree: their bounds overlap.
fn shared_dim_problems(p: &mut Vec<String>, inputs: &[TensorSpec]) {
    let mut seen: Vec<(&str, &str, (i64, i64))> = Vec::new();
    for t in inputs {
        for axis in 1..t.dims.len() {
            let (Some(name), Some(b)) = (t.dim_name(axis), t.bounds(axis)) else {
                continue;
            };
            match seen.iter().find(|(n, _, _)| *n == name) {
                Some((_, other, ob)) if ob.0.max(b.0) > ob.1.min(b.1) => p.push(format!(
                    "inputs {other:?} and {:?} share dimension {name:?} but their bounds {}..={} and {}..={} do not overlap",
                    t.name, ob.0, ob.1, b.0, b.1
                )),
                Some(_) => {}
                None => seen.push((name, &t.name, b)),
            }
        }
    }
}

/// A bundle's `runtime.toml`: one server for several models, each a directory with its own
/// `runtime.toml` (a whole [`RuntimeConfig`]; its engine, warm-up and tokenizer paths relative to
/// that directory). The bundle's `[server]` is the server's; the models' own `[server]` tables
/// are not used, except by a bundle of one model without a `[server]` table, which serves with
/// its model's (the runtime image of a split layout: the model, mounted, says how it drains).
///
/// ```toml
/// [server]
/// port = 8000
///
/// [[models]]
/// path = "models/detector"
///
/// [[models]]
/// path = "models/recogniser"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bundle {
    /// The HTTP server and its lifecycle, for every model; `None`: the model's own when the
    /// bundle has one model, else the defaults ([`Bundle::server_for`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<Server>,
    /// The models, in the order they are loaded.
    pub models: Vec<BundleModel>,
}

/// `[[models]]` of a bundle: where one model's directory is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleModel {
    /// The model's directory (holding its `runtime.toml`), relative to the bundle's file or
    /// absolute.
    pub path: String,
}

/// The most models one bundle serves.
pub const MAX_BUNDLE_MODELS: usize = 64;

/// The file name of a model's configuration inside its directory.
pub const MODEL_CONFIG_FILE: &str = "runtime.toml";

impl Bundle {
    /// The server of a bundle whose models' configurations are `models` (in order).
    pub fn server_for<'a>(
        &self,
        mut models: impl ExactSizeIterator<Item = &'a RuntimeConfig>,
    ) -> Server {
        match (&self.server, models.len()) {
            (Some(s), _) => s.clone(),
            (None, 1) => models.next().map(|m| m.server.clone()).unwrap_or_default(),
            (None, _) => Server::default(),
        }
    }

    /// Every validation problem; empty when the bundle is usable. Model names are checked
    /// once the models' own files are read ([`Bundle::duplicate_names`]).
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if self.models.is_empty() {
            p.push("models must list at least one model directory".to_owned());
        }
        if self.models.len() > MAX_BUNDLE_MODELS {
            p.push(format!(
                "models lists {} directories; at most {MAX_BUNDLE_MODELS}",
                self.models.len()
            ));
        }
        let mut seen = BTreeSet::new();
        for (i, m) in self.models.iter().enumerate() {
            if m.path.is_empty() || m.path.contains(char::is_control) {
                p.push(format!("models[{i}].path {:?} must be a directory", m.path));
            } else if !seen.insert(m.path.trim_end_matches('/')) {
                p.push(format!("models[{i}].path {:?} is listed twice", m.path));
            }
        }
        p
    }

    /// The names served by more than one of `models` (each a model's configuration), each
    /// once: a bundle must name its models apart.
    pub fn duplicate_names<'a>(models: impl IntoIterator<Item = &'a RuntimeConfig>) -> Vec<String> {
        let mut seen = BTreeSet::new();
        let mut twice = BTreeSet::new();
        for m in models {
            if !seen.insert(m.model.name.as_str()) {
                twice.insert(m.model.name.clone());
            }
        }
        twice.into_iter().collect()
    }

    /// The canonical TOML text.
    pub fn to_toml_string(&self) -> String {
        toml::to_string(self).unwrap_or_default()
    }
}

/// What a `runtime.toml` holds: one model, or a bundle of model directories (a file with a
/// `[[models]]` table).
#[derive(Debug, Clone, PartialEq)]
pub enum RuntimeFile {
    Model(Box<RuntimeConfig>),
    Bundle(Bundle),
}

impl RuntimeFile {
    /// Parses and validates either form, told apart by a top-level `models` key.
    pub fn from_toml_str(s: &str) -> Result<RuntimeFile, ConfigError> {
        let table: toml::Table =
            toml::from_str(s).map_err(|e| ConfigError::Parse(e.to_string().trim().to_owned()))?;
        if !table.contains_key("models") {
            return RuntimeConfig::from_toml_str(s).map(|c| RuntimeFile::Model(Box::new(c)));
        }
        let bundle: Bundle =
            toml::from_str(s).map_err(|e| ConfigError::Parse(e.to_string().trim().to_owned()))?;
        let problems = bundle.problems();
        if problems.is_empty() {
            Ok(RuntimeFile::Bundle(bundle))
        } else {
            Err(ConfigError::Invalid(problems))
        }
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

    /// The example MLP from the runtime's fixture, with these batching and engine tables.
    fn mlp() -> String {
        let fixture = include_str!("../../infer-serve/testdata/mlp.runtime.toml");
        let head = &fixture[..fixture.find("[batching]").unwrap()];
        format!("{head}{MLP_TAIL}")
    }

    const MLP_TAIL: &str = r#"
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

    /// The runtime's fixtures are whole configurations too, not only heads for tests' tables.
    #[test]
    fn the_runtime_fixtures_parse_whole() {
        for (name, text) in [
            (
                "mlp",
                include_str!("../../infer-serve/testdata/mlp.runtime.toml"),
            ),
            (
                "synthetic",
                include_str!("../../infer-serve/testdata/synthetic.runtime.toml"),
            ),
        ] {
            let c = RuntimeConfig::from_toml_str(text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(c.model.name, name);
        }
    }

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
    fn a_bundle_without_a_server_table_takes_its_one_models() {
        let model = |drain: u64| RuntimeConfig {
            server: Server {
                drain_delay_s: drain,
                ..Server::default()
            },
            ..RuntimeConfig::from_toml_str(&mlp()).unwrap()
        };
        let (a, b) = (model(7), model(9));
        let one = "[[models]]\npath = \"/mnt/models\"\n";
        let RuntimeFile::Bundle(bundle) = RuntimeFile::from_toml_str(one).unwrap() else {
            panic!("not a bundle")
        };
        assert_eq!(bundle.server, None);
        assert_eq!(bundle.server_for([&a].into_iter()).drain_delay_s, 7);
        // Several models and no table: the defaults, not the first model's.
        assert_eq!(bundle.server_for([&a, &b].into_iter()), Server::default());
        let with = Bundle {
            server: Some(model(3).server),
            ..bundle
        };
        assert_eq!(with.server_for([&a].into_iter()).drain_delay_s, 3);
    }

    #[test]
    fn a_file_with_models_is_a_bundle_and_is_checked_whole() {
        let bundle = "[server]\nport = 9000\n[[models]]\npath = \"models/a\"\n[[models]]\npath = \"/mnt/b\"\n";
        match RuntimeFile::from_toml_str(bundle).unwrap() {
            RuntimeFile::Bundle(b) => {
                assert_eq!(b.server.as_ref().map(|s| s.port), Some(9000));
                assert_eq!(b.models.len(), 2);
                assert_eq!(
                    RuntimeFile::from_toml_str(&b.to_toml_string()).unwrap(),
                    RuntimeFile::Bundle(b)
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            RuntimeFile::from_toml_str(&mlp()).unwrap(),
            RuntimeFile::Model(m) if m.model.name == "mlp"
        ));
        for (text, want) in [
            ("models = []\n", "at least one model directory"),
            (
                "[[models]]\npath = \"a\"\n[[models]]\npath = \"a/\"\n",
                "listed twice",
            ),
            ("[[models]]\npath = \"\"\n", "must be a directory"),
            ("[[models]]\ndir = \"a\"\n", "unknown field `dir`"),
            (
                "[model]\nname = \"m\"\n[[models]]\npath = \"a\"\n",
                "unknown field `model`",
            ),
        ] {
            let e = RuntimeFile::from_toml_str(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        let a = RuntimeConfig::from_toml_str(&mlp()).unwrap();
        let mut b = a.clone();
        assert_eq!(Bundle::duplicate_names([&a, &b]), vec!["mlp".to_owned()]);
        b.model.name = "other".into();
        assert!(Bundle::duplicate_names([&a, &b]).is_empty());
    }

    #[test]
    fn valid_and_defaults() {
        let cfg = RuntimeConfig::from_toml_str(&mlp()).unwrap();
        assert_eq!(cfg.server, Server::default());
        assert_eq!(cfg.server.port, 8000);
        assert_eq!(cfg.platform(), "onnx_onnxv1");
        assert_eq!(cfg.warmup_batch_sizes(), vec![1, 8, 16, 32]);
        assert_eq!(cfg.inputs[0].row_elements(), 64);
        check(&mlp(), Ok(()));
    }

    #[test]
    fn canonical_round_trip() {
        let cfg = RuntimeConfig::from_toml_str(&mlp()).unwrap();
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
            &mlp().replace("[-1, 64]", "[4, 0]")
                .replace("preferred_batch_sizes = [8, 16, 32]", "preferred_batch_sizes = [0, 64]")
                .replace("instances = 1", "instances = 0"),
            Err(&[
                "inputs[0] (\"input\"): dims must start with the batch dimension -1",
                "inputs[0] (\"input\"): dims after the batch dimension must be -1 (variable) or in 1..=16777216, got [4, 0]",
                "batching.preferred_batch_sizes: 0 is outside 1..=32",
                "batching.preferred_batch_sizes: 64 is outside 1..=32",
                "batching.instances must be at least 1",
            ]),
        );
        check(
            &mlp().replace(
                "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
                "kind = \"synthetic\"",
            ),
            Err(&["engine.synthetic is required when engine.kind = \"synthetic\""]),
        );
        check(
            &mlp().replace("path = \"mlp.onnx\"", ""),
            Err(&["engine.path is required when engine.kind = \"tract-onnx\""]),
        );
        check(
            &mlp().replace("name = \"mlp\"", "name = \"a/b\""),
            Err(&["model.name \"a/b\" must be non-empty without '/'"]),
        );
    }

    /// A tensor model whose inputs say their padding: every input, token-like, in range, not
    /// with `[text]`; an unnamed padded length is shared by every input.
    #[test]
    fn padded_inputs_are_all_token_like() {
        let tokens = |a: &str, b: &str| {
            mlp().replace(
                "[[outputs]]",
                &format!(
                    "[[inputs]]\nname = \"ids\"\ndatatype = \"INT64\"\ndims = [-1, -1]\n{a}\n\
                     profile = {{ min = [1], opt = [8], max = [64] }}\n\n\
                     [[inputs]]\nname = \"mask\"\ndatatype = \"INT32\"\ndims = [-1, -1]\n{b}\n\
                     profile = {{ min = [1], opt = [8], max = [64] }}\n\n[[outputs]]"
                ),
            )
        };
        // The fixture's own input is FP32 [-1, 64]: without it, the two token inputs.
        let only_tokens = |a: &str, b: &str| {
            let text = tokens(a, b);
            let start = text.find("[[inputs]]").unwrap();
            let end = text[start..].find("[[inputs]]\nname = \"ids\"").unwrap() + start;
            format!("{}{}", &text[..start], &text[end..])
        };
        let cfg = RuntimeConfig::from_toml_str(&only_tokens("pad = 0", "pad = 0")).unwrap();
        assert_eq!(cfg.inputs[0].pad, Some(0));
        assert_eq!(cfg.inputs[1].dim_name(1), Some(PADDED_LENGTH));
        assert_eq!(cfg.inputs[1].dim_name(0), None);
        let text = cfg.to_toml_string();
        assert!(text.contains("pad = 0"), "{text}");
        check(
            &only_tokens("pad = 0", ""),
            Err(&["inputs[1] (\"mask\"): no pad, though other inputs have one: every input of a padded model says its padding value"]),
        );
        check(
            &only_tokens("pad = 0", "pad = 3000000000"),
            Err(&["inputs[1] (\"mask\"): pad 3000000000 does not fit INT32"]),
        );
        check(
            &tokens("pad = 0", "pad = 0"),
            Err(&["inputs[0] (\"input\"): no pad, though other inputs have one: every input of a padded model says its padding value"]),
        );
        let fp32 = only_tokens("pad = 0", "pad = 0").replace("\"INT32\"", "\"FP32\"");
        check(
            &fp32,
            Err(&["inputs[1] (\"mask\"): pad is for INT32 or INT64 inputs of dims [-1, -1], this one is FP32 [-1, -1]"]),
        );
        // Unpadded, the same model has no shared length.
        let plain = RuntimeConfig::from_toml_str(&only_tokens("", "")).unwrap();
        assert_eq!(plain.inputs[1].dim_name(1), None);
    }

    #[test]
    fn strict_parsing() {
        check(
            &mlp().replace("instances = 1", "instances = 1\nbogus = 2"),
            Err(&["unknown field `bogus`"]),
        );
        check(
            &mlp().replace("\"FP32\"", "\"fp32\""),
            Err(&["unknown variant `fp32`"]),
        );
        check("[model", Err(&["unclosed table"]));
    }

    #[test]
    fn synthetic_engine() {
        let src = mlp().replace(
            "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
            "kind = \"synthetic\"\nsynthetic = { base_ms = 40.0, per_row_ms = 6.0 }",
        );
        let cfg = RuntimeConfig::from_toml_str(&src).unwrap();
        assert_eq!(
            cfg.engine.synthetic,
            Some(Synthetic {
                base_ms: 40.0,
                per_row_ms: 6.0,
                per_token_ms: 0.0,
            })
        );
        assert_eq!(
            RuntimeConfig::from_toml_str(&cfg.to_toml_string()).unwrap(),
            cfg
        );
    }

    const TEXT: &str = r#"
[model]
name = "minilm"

[[inputs]]
name = "input_ids"
datatype = "INT64"
dims = [-1, -1]
profile = { min = [1], opt = [128], max = [512] }
dim_names = ["sequence"]

[[inputs]]
name = "attention_mask"
datatype = "INT64"
dims = [-1, -1]
profile = { min = [1], opt = [128], max = [512] }
dim_names = ["sequence"]

[[outputs]]
name = "embedding"
datatype = "FP32"
dims = [-1, 384]

[batching]
max_batch_size = 128

[engine]
kind = "tract-onnx"
path = "minilm.onnx"
"#;

    #[test]
    fn variable_dims() {
        let cfg = RuntimeConfig::from_toml_str(TEXT).unwrap();
        let ids = &cfg.inputs[0];
        assert!(ids.is_variable());
        assert_eq!(ids.row_dims(), vec![512]);
        assert_eq!(ids.opt_row_dims(), vec![128]);
        assert_eq!(ids.min_row_dims(), vec![1]);
        assert_eq!(ids.bounds(1), Some((1, 512)));
        assert_eq!(ids.dim_name(1), Some("sequence"));
        assert_eq!(ids.max_row_bytes(), Some(512 * 8));
        assert_eq!(
            RuntimeConfig::from_toml_str(&cfg.to_toml_string()).unwrap(),
            cfg
        );
        check(
            &TEXT.replacen("profile = { min = [1], opt = [128], max = [512] }\n", "", 1),
            Err(&["inputs[0] (\"input_ids\"): dims [-1, -1] are variable after the batch dimension: a profile (min, opt, max) is required"]),
        );
        check(
            &TEXT.replacen("min = [1], opt = [128]", "min = [200], opt = [128]", 1),
            Err(&["inputs[0] (\"input_ids\"): profile of dimension 1 must have 1 <= min <= opt <= max <= 16777216, got 200, 128, 512"]),
        );
        check(
            &TEXT.replacen("opt = [128], max = [512]", "opt = [128, 1], max = [512]", 1),
            Err(&["inputs[0] (\"input_ids\"): profile.opt has 2 sizes, the dims after the batch dimension are 1"]),
        );
        check(
            &TEXT.replace("dims = [-1, 384]", "dims = [-1, 384]\nprofile = { min = [1], opt = [1], max = [1] }"),
            Err(&["outputs[0] (\"embedding\"): a profile is only for inputs with variable (-1) dims after the batch dimension"]),
        );
        let disjoint = TEXT.replacen(
            "min = [1], opt = [128], max = [512]",
            "min = [600], opt = [600], max = [700]",
            1,
        );
        check(
            &disjoint,
            Err(&["inputs \"input_ids\" and \"attention_mask\" share dimension \"sequence\" but their bounds 600..=700 and 1..=512 do not overlap"]),
        );
        // An output's variable dimension needs no profile.
        check(
            &TEXT.replace("dims = [-1, 384]", "dims = [-1, -1, 384]"),
            Ok(()),
        );
    }

    /// Bounds the server can honour: each hostile value is refused with its key.
    #[test]
    fn hostile_bounds() {
        check(
            &mlp().replace("max_batch_size = 32", "max_batch_size = 1000000000")
                .replace("preferred_batch_sizes = [8, 16, 32]", ""),
            Err(&[
                "batching.max_batch_size 1000000000 is more than 65536",
                "batching.instances 1 x max_batch_size 1000000000 x 296 bytes per input and output row (largest shapes) = 296000000000 bytes, more than server.memory_budget_bytes 4294967296",
            ]),
        );
        check(
            &mlp().replace("[-1, 64]", "[-1, 3, 224, 224000]"),
            Err(&[
                "one row of the inputs at their largest shape is 602112000 bytes, more than server.max_body_bytes 67108864: no request could carry it",
                "batching.instances 1 x max_batch_size 32 x 602112040 bytes per input and output row (largest shapes) = 19267585280 bytes, more than server.memory_budget_bytes 4294967296",
            ]),
        );
        check(
            &mlp().replace("instances = 1", "instances = 1000000"),
            Err(&[
                "batching.instances 1000000 is more than 256",
                "batching.instances 1000000 x max_batch_size 32 x 296 bytes per input and output row (largest shapes) = 9472000000 bytes, more than server.memory_budget_bytes 4294967296",
            ]),
        );
        check(
            &(mlp().replace("max_queue_delay_us = 500", "max_queue_delay_us = 9223372036854775807")
                .replace("default_timeout_ms = 1000", "default_timeout_ms = 9000000000")
                + "[server]\ndrain_delay_s = 100000\nexit_timeout_s = 3601\nmax_body_bytes = 2147483648\n"),
            Err(&[
                "batching.max_queue_delay_us 9223372036854775807 is more than 10000000 (10 s)",
                "batching.default_timeout_ms 9000000000 is more than 3600000 (1 h)",
                "server.max_body_bytes 2147483648 is more than 1073741824 (1 GiB)",
                "server.drain_delay_s 100000 is more than 3600 (1 h)",
                "server.exit_timeout_s 3601 is more than 3600 (1 h)",
            ]),
        );
    }

    /// The client timeouts and the connection cap: defaults that keep old files working, and
    /// bounds refused with their key.
    #[test]
    fn queue_delay_is_adaptive_unless_strict() {
        let cfg = RuntimeConfig::from_toml_str(&mlp()).unwrap();
        assert!(cfg.batching.adaptive_delay());
        // The default is not written: earlier builds' runtime.toml (and digest) stay as they were.
        assert!(!cfg.to_toml_string().contains("\nqueue_delay"));
        let strict = mlp().replace("[batching]\n", "[batching]\nqueue_delay = \"strict\"\n");
        let cfg = RuntimeConfig::from_toml_str(&strict).unwrap();
        assert_eq!(cfg.batching.queue_delay, QueueDelay::Strict);
        assert!(cfg.to_toml_string().contains("queue_delay = \"strict\""));
        let bad = mlp().replace("[batching]\n", "[batching]\nqueue_delay = \"sometimes\"\n");
        let e = RuntimeConfig::from_toml_str(&bad).unwrap_err().to_string();
        assert!(e.contains("queue_delay") || e.contains("sometimes"), "{e}");
    }

    #[test]
    fn client_timeouts_and_connection_cap() {
        let cfg = RuntimeConfig::from_toml_str(&mlp()).unwrap();
        let srv = &cfg.server;
        assert_eq!(
            (
                srv.header_read_timeout_s,
                srv.body_read_timeout_s,
                srv.body_min_bytes_per_s,
                srv.idle_timeout_s,
                srv.max_connections
            ),
            (10, 30, 65536, 60, 4096)
        );
        // Defaults are not written: earlier builds' runtime.toml (and digest) stay as they were.
        let text = cfg.to_toml_string();
        assert!(
            !text.contains("timeout_s = 10") && !text.contains("max_connections"),
            "{text}"
        );
        assert!(text.contains("drain_delay_s"), "{text}");
        let set = mlp()
            + "[server]\nheader_read_timeout_s = 2\nbody_read_timeout_s = 3\nbody_min_bytes_per_s = 0\nidle_timeout_s = 4\nmax_connections = 256\n";
        let cfg = RuntimeConfig::from_toml_str(&set).unwrap();
        assert_eq!(cfg.server.header_read_timeout_s, 2);
        assert_eq!(cfg.server.body_min_bytes_per_s, 0);
        assert_eq!(cfg.server.max_connections, 256);
        assert_eq!(
            RuntimeConfig::from_toml_str(&cfg.to_toml_string()).unwrap(),
            cfg
        );
        check(
            &(mlp()
                + "[server]\nheader_read_timeout_s = 0\nbody_read_timeout_s = 3601\nbody_min_bytes_per_s = 2147483648\nidle_timeout_s = 0\nmax_connections = 0\n"),
            Err(&[
                "server.header_read_timeout_s 0 is outside 1..=3600 (1 s to 1 h)",
                "server.body_read_timeout_s 3601 is outside 1..=3600 (1 s to 1 h)",
                "server.idle_timeout_s 0 is outside 1..=3600 (1 s to 1 h)",
                "server.body_min_bytes_per_s 2147483648 is more than 1073741824 (1 GiB/s)",
                "server.max_connections 0 is outside 1..=1048576",
            ]),
        );
    }

    #[test]
    fn openvino_engine_computes_in_the_precision_it_is_given() {
        let ov = mlp().replace(
            "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
            "kind = \"openvino\"\npath = \"mlp.onnx\"\nlibrary = \"lib/libopenvino_c.so.2641\"\nprecision = \"bf16\"",
        );
        let cfg = RuntimeConfig::from_toml_str(&ov).unwrap();
        assert_eq!(cfg.engine.kind, BackendKind::OpenVino);
        assert_eq!(cfg.platform(), "openvino");
        assert_eq!(cfg.engine.precision, Some(crate::engine::Precision::Bf16));
        assert_eq!(
            RuntimeConfig::from_toml_str(&cfg.to_toml_string()).unwrap(),
            cfg
        );
        check(
            &ov.replace("precision = \"bf16\"", "precision = \"int8\""),
            Err(&["engine.precision \"int8\" is not one openvino computes in: \"fp32\", \"bf16\", \"fp16\""]),
        );
        check(
            &mlp().replace(
                "path = \"mlp.onnx\"",
                "path = \"mlp.onnx\"\nprecision = \"bf16\"",
            ),
            Err(&["engine.precision is only for engine.kind = \"openvino\", not \"tract-onnx\""]),
        );
        check(
            &ov.replace("precision = \"bf16\"", "precision = \"bf17\""),
            Err(&["unknown variant `bf17`"]),
        );
    }

    #[test]
    fn onnxruntime_engine() {
        let ort = mlp().replace(
            "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
            "kind = \"onnxruntime\"\npath = \"mlp.onnx\"\nlibrary = \"lib/libonnxruntime.so.1.31.0\"\nthreads = 2",
        );
        let cfg = RuntimeConfig::from_toml_str(&ort).unwrap();
        assert_eq!(cfg.engine.kind, BackendKind::OnnxRuntime);
        assert_eq!(cfg.platform(), "onnxruntime_onnx");
        assert_eq!(
            cfg.engine.library.as_deref(),
            Some("lib/libonnxruntime.so.1.31.0")
        );
        assert_eq!(cfg.threads(16, None), (2, ThreadsFrom::Config));
        assert_eq!(
            RuntimeConfig::from_toml_str(&cfg.to_toml_string()).unwrap(),
            cfg
        );
        // The default divides the CPUs between the instances, at least one thread each.
        let mut d = cfg.clone();
        d.engine.threads = None;
        d.batching.instances = 3;
        assert_eq!(d.threads(16, None).0, 5);
        assert_eq!(d.threads(2, None).0, 1);
        d.batching.instances = 1;
        assert_eq!(d.threads(2, None).0, 2);
        check(
            &ort.replace("library = \"lib/libonnxruntime.so.1.31.0\"\n", ""),
            Err(&["engine.library is required when engine.kind = \"onnxruntime\" (the path of libonnxruntime)"]),
        );
        check(
            &ort.replace("threads = 2", "threads = 0"),
            Err(&["engine.threads 0 is outside 1..=1024"]),
        );
        check(
            &ort.replace("\"lib/libonnxruntime.so.1.31.0\"", "\"\""),
            Err(&["engine.library must be non-empty"]),
        );
        check(
            &mlp().replace(
                "path = \"mlp.onnx\"",
                "path = \"mlp.onnx\"\nlibrary = \"x.so\"\nthreads = 1",
            ),
            Err(&[
                "engine.library is only for engine.kind = \"onnxruntime\", \"openvino\" or \"tensorrt\", not \"tract-onnx\"",
                "engine.threads is only for engine.kind = \"onnxruntime\" or \"openvino\", not \"tract-onnx\"",
            ]),
        );
        // TensorRT may name its runtime library.
        check(
            &mlp().replace(
                "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
                "kind = \"tensorrt\"\npath = \"engine.plan\"\nlibrary = \"libnvinfer_lean.so.10\"",
            ),
            Ok(()),
        );
    }

    #[test]
    fn threads_are_decided_where_the_image_runs() {
        let ort = mlp().replace(
            "kind = \"tract-onnx\"\npath = \"mlp.onnx\"",
            "kind = \"onnxruntime\"\npath = \"mlp.onnx\"\nlibrary = \"lib/libonnxruntime.so.1.31.0\"\nmeasured = { threads = 1, share = 2 }",
        );
        let mut cfg = RuntimeConfig::from_toml_str(&ort).unwrap();
        assert_eq!(
            cfg.engine.measured,
            Some(MeasuredThreads {
                threads: 1,
                share: 2
            })
        );
        assert_eq!(
            RuntimeConfig::from_toml_str(&cfg.to_toml_string()).unwrap(),
            cfg
        );
        // (cpus, instances, given, engine.threads) -> threads, from where
        for (cpus, instances, given, threads, want) in [
            // The measurement applies where an instance has the share it was measured on...
            (2, 1, None, None, (1, ThreadsFrom::Measured)),
            (4, 2, None, None, (1, ThreadsFrom::Measured)),
            // ...and nowhere else: a larger or smaller share is the share.
            (16, 1, None, None, (16, ThreadsFrom::Share)),
            (1, 1, None, None, (1, ThreadsFrom::Share)),
            (16, 3, None, None, (5, ThreadsFrom::Share)),
            // engine.threads wins over both, the flag or environment over everything.
            (2, 1, None, Some(3), (3, ThreadsFrom::Config)),
            (16, 1, Some(2), Some(3), (2, ThreadsFrom::Given)),
            (2, 1, Some(2), None, (2, ThreadsFrom::Given)),
        ] {
            cfg.batching.instances = instances;
            cfg.engine.threads = threads;
            assert_eq!(
                cfg.threads(cpus, given),
                want,
                "{cpus} cpus, {instances} instances, {given:?}, {threads:?}"
            );
        }
        for (threads, share) in [(2, 2), (0, 2), (3, 2), (1, 2000)] {
            check(
                &ort.replace(
                    "threads = 1, share = 2",
                    &format!("threads = {threads}, share = {share}"),
                ),
                Err(&[&format!("engine.measured: threads {threads} and share {share}: a share is 1..=1024 and the threads fewer than it, at least 1")]),
            );
        }
        check(
            &mlp().replace(
                "path = \"mlp.onnx\"",
                "path = \"mlp.onnx\"\nmeasured = { threads = 1, share = 2 }",
            ),
            Err(&["engine.measured is only for engine.kind = \"onnxruntime\" or \"openvino\", not \"tract-onnx\""]),
        );
    }

    #[test]
    fn warmup_sizes() {
        let mut cfg = RuntimeConfig::from_toml_str(&mlp()).unwrap();
        cfg.batching.max_batch_size = 24;
        cfg.batching.preferred_batch_sizes = vec![6, 24];
        assert_eq!(cfg.warmup_batch_sizes(), vec![1, 6, 24]);
        cfg.batching.preferred_batch_sizes = vec![];
        assert_eq!(cfg.warmup_batch_sizes(), vec![1, 24]);
        cfg.batching.max_batch_size = 1;
        assert_eq!(cfg.warmup_batch_sizes(), vec![1]);
        cfg.warmup.batch_sizes = Some(vec![3, 1, 3]);
        assert_eq!(cfg.warmup_batch_sizes(), vec![1, 3]);
        cfg.warmup.batch_sizes = Some(vec![]);
        assert!(cfg.warmup_batch_sizes().is_empty());
    }
}
