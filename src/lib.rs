//! `infer-build` compiles a recipe (an ONNX model, target GPUs, precision, batching and deploy
//! settings) into slim, reproducible OCI images, one per GPU architecture.
//!
//! See `ARCHITECTURE.md` at the repository root for the code map and invariants.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_macros,
        clippy::disallowed_methods,
        reason = "tests start tools and print why they skip"
    )
)]

pub mod assemble;
pub mod attach;
pub(crate) mod bench;
pub(crate) mod cache;
pub(crate) mod cli;
pub mod deploy;
pub mod engine;
pub(crate) mod error;
pub mod matrix;
pub(crate) mod native;
pub mod oci;
pub(crate) mod pipeline;
pub mod plan;
pub mod process;
pub mod recipe;
pub mod registry;
pub mod report;
pub(crate) mod sbom;
pub mod slim;

pub use cli::main as run_cli;
pub use error::Error;
