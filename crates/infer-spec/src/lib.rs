//! Types shared between the builder (`infer-build`) and the runtime (`infer-serve`).
//!
//! This crate owns the on-disk contracts between build time and run time: the runtime
//! configuration (`runtime.toml`, [`RuntimeConfig`]), the V2 datatypes ([`DataType`]), the engine
//! compatibility tuple and the warm-up description.
//! It must stay free of I/O beyond (de)serialisation, and must not depend on anything
//! builder-side (recipe parsing, OCI, registry, CLI).
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_macros,
        clippy::disallowed_methods,
        reason = "tests start tools and print why they skip"
    )
)]

pub mod batch;
pub mod dtype;
pub mod engine;
pub mod engines;
pub mod runtime;
pub mod samples;
pub mod text;
pub mod vision;

pub use dtype::DataType;
pub use runtime::{
    BackendKind, Batching, Bundle, BundleModel, ConfigError, DimProfile, EngineSection,
    MeasuredThreads, ModelSection, QueueDelay, RuntimeConfig, RuntimeFile, Server, Synthetic,
    TensorSpec, ThreadsFrom, Warmup, DEFAULT_CONFIG_PATH,
};
