//! `infer-serve`: the minimal batching runtime every image runs as its entrypoint.
//!
//! It reads `runtime.toml` ([`infer_spec::RuntimeConfig`], the only thing shared with the
//! builder), loads the engine once, warms it up with every planned batch size, and then
//! serves the KServe V2 / Open Inference Protocol over HTTP/1.1 (JSON tensors and Triton's
//! binary tensor data extension) and over gRPC (`inference.GRPCInferenceService`, its own port),
//! and for text models OpenAI's and TEI's text APIs; every route's requests go through one
//! inference core and each model's dynamic batcher.
//!
//! Code map (data flows top to bottom):
//! - [`args`]: the few flags and environment variables, parsed by hand (no CLI framework).
//! - [`start()`]: start-up as a library, from flags to a ready [`Running`] server or a
//!   [`StartError`] with its exit code; `main` only logs and exits.
//! - `server`: the `server::Server` (settings, drain, health, the model slots by name, the
//!   memory budget and the preparation workers) and the accept loop both protocols run.
//! - Transports, which only decode requests and encode answers: `http` (V2 over HTTP/1.1 and
//!   the text APIs' routes), `embed` (OpenAI's `/v1/embeddings`, TEI's `/embed`, `/rerank`,
//!   `/predict`, `/tokenize`), [`grpc`] (the gRPC service and `grpc.health.v1` on HTTP/2;
//!   [`grpc::codec`] its pure decoder), [`v2`] (the pure V2 decoder / encoder, fuzzed).
//! - `core`: the one inference path of every route: admission (bounds and the memory
//!   budget, `budget`), the response cache (`cache`), preparation on the bounded
//!   `core::Workers` (tokenizing, `text`), items in the batcher, finishing.
//! - `model`: one model slot (config, batcher, metrics, metadata; served and engine
//!   signatures). `signature`: a model's tensors and the one check of a request's tensors
//!   against them that both decoders run, and the table bounds the core checks.
//! - `conn`: slow and idle clients: each connection's watchdog (header and idle timeouts),
//!   the request-body reader with a minimum rate, charged to the memory budget.
//! - `batcher`: the queue and the backend instance threads that take turns owning it; the
//!   model's `batcher::Grouping` decides which items go together, its `batcher::Reduce`
//!   finishes each item on the backend thread; an engine's panic fails only its requests.
//! - `backend`: the synchronous `backend::Backend` trait; tract (feature `tract`), ONNX
//!   Runtime (`onnxruntime`), TensorRT (`tensorrt`) and a sleep-based `synthetic` engine
//!   (feature `synthetic`, tests and benchmarks only).
//! - `cpus`: the CPUs the process may use where it runs (affinity, the cgroup's CPU quota),
//!   which the models' threads are decided from at start.
//! - `warmup`, [`metrics`], [`log`], [`error`] (the one error → status mapping), [`tensor`].
//!
//! The library's surface is [`start()`], [`Running`] and [`StartError`], and the modules that
//! `main`, the examples, the benchmarks and the fuzz targets use ([`args`], [`log`], [`error`],
//! [`tensor`], [`v2`], [`grpc::codec`], [`metrics`], `fixtures`); every other module is private
//! to the crate, so `unreachable_pub` sees through it.
//!
//! Invariants: no builder, registry or CLI code is linked (the only workspace dependency is
//! `infer-spec`); models run only on backend threads, never on the async workers; tokenizing
//! and decoding large bodies run on the preparation workers, never on the async workers;
//! decoding never panics on any input; every client-visible failure goes through
//! [`error::ApiError`].
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_macros,
        clippy::disallowed_methods,
        reason = "tests start tools and print why they skip"
    )
)]

pub mod args;
pub(crate) mod backend;
pub(crate) mod batcher;
pub(crate) mod budget;
pub(crate) mod cache;
pub(crate) mod conn;
pub(crate) mod core;
pub(crate) mod cpus;
pub(crate) mod embed;
pub mod error;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod grpc;
pub(crate) mod http;
pub(crate) mod images;
pub mod log;
pub mod metrics;
pub(crate) mod model;
pub(crate) mod server;
pub(crate) mod signature;
pub(crate) mod start;
pub mod tensor;
pub(crate) mod text;
pub mod v2;
pub(crate) mod vision;
pub(crate) mod warmup;

pub use start::{start, Running, StartError};
