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
//! - [`http`]: routes, handlers, the accept loop and the drain on SIGTERM; owns no model.
//! - [`conn`]: slow and idle clients: each connection's watchdog (header and idle timeouts),
//!   the request-body reader with a minimum rate; the cap on connections is `http`'s accept loop.
//! - [`grpc`]: the gRPC service and `grpc.health.v1` on HTTP/2, sharing `http`'s accept loop,
//!   drain and inference path; [`grpc::codec`] is its pure decoder (fuzzed like `v2`).
//! - [`v2`]: pure request decoder / response encoder; the fuzz target drives it.
//! - [`batcher`]: the queue and the backend instance threads that take turns owning it.
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
pub mod conn;
pub mod error;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod grpc;
pub mod http;
pub mod log;
pub mod metrics;
pub mod tensor;
pub mod v2;
pub mod warmup;
