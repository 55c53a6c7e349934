//! `infer-serve`: the minimal batching runtime every image runs as its entrypoint.
//!
//! It reads `runtime.toml` ([`infer_spec::RuntimeConfig`], the only thing shared with the
//! builder), loads the engine once, warms it up with every planned batch size, and then
//! serves the KServe V2 / Open Inference Protocol over HTTP/1.1 (JSON tensors and Triton's
//! binary tensor data extension) and over gRPC (`inference.GRPCInferenceService`, its own port)
//! through one dynamic batcher with Triton's semantics.
//!
//! Code map (data flows top to bottom):
//! - [`args`]: the few flags and environment variables, parsed by hand (no CLI framework).
//! - [`start()`]: start-up as a library, from flags to a ready [`Running`] server or a
//!   [`StartError`] with its exit code; `main` only logs and exits.
//! - [`http`]: the [`http::Server`] (settings, drain, health and the model slots by name),
//!   routes, handlers, the accept loop and the drain on SIGTERM.
//! - [`model`]: one model slot (config, batcher, metrics, metadata; served and engine
//!   signatures, and [`model::Model::prepare`] between them).
//! - [`text`]: text in (`[text]`): the tokenizer before the engine, the pooling after it.
//! - [`embed`]: the embedding APIs (OpenAI's `/v1/embeddings`, TEI's `/embed`, `/tokenize`)
//!   over the same batcher.
//! - [`cache`]: the response cache (`[response_cache]`): exact request keys, bounded LRU.
//! - [`signature`]: a model's tensors, and the one check of a request's tensors against them
//!   that both protocols' decoders run.
//! - [`conn`]: slow and idle clients: each connection's watchdog (header and idle timeouts),
//!   the request-body reader with a minimum rate; the cap on connections is `http`'s accept loop.
//! - [`grpc`]: the gRPC service and `grpc.health.v1` on HTTP/2, sharing `http`'s accept loop,
//!   drain and inference path; [`grpc::codec`] is its pure decoder (fuzzed like `v2`).
//! - [`v2`]: pure request decoder / response encoder; the fuzz target drives it.
//! - [`batcher`]: the queue and the backend instance threads that take turns owning it; the
//!   model's [`batcher::Grouping`] decides which requests go together.
//! - [`backend`]: the synchronous [`backend::Backend`] trait; tract (default feature `tract`)
//!   and a sleep-based `synthetic` engine (feature `synthetic`, tests and benchmarks only).
//! - [`warmup`], [`metrics`], [`log`], [`error`] (the one error → status mapping), [`tensor`].
//!
//! Invariants: no builder, registry or CLI code is linked (the only workspace dependency is
//! `infer-spec`); models run only on backend threads, never on the async workers; decoding
//! never panics on any input; every client-visible failure goes through [`error::ApiError`].
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_macros,
        clippy::disallowed_methods,
        reason = "tests start tools and print why they skip"
    )
)]

pub mod args;
pub mod backend;
pub mod batcher;
pub mod cache;
pub mod conn;
pub mod embed;
pub mod error;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod grpc;
pub mod http;
pub mod log;
pub mod metrics;
pub mod model;
pub mod signature;
pub mod start;
pub mod tensor;
pub mod text;
pub mod v2;
pub mod warmup;

pub use start::{start, Running, StartError};
