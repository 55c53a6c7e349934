//! The build pipeline `infer-build build` runs: the project (recipe, matrix, lock, plan), then
//! for each selected target its engine (looked up under `--engines` or built by the engine
//! stage), its runtime flavour, its base image (pulled into the base cache, pinned in the lock
//! file) and its native libraries, then [`crate::assemble::build`], the SBOMs and the archive.
//!
//! It prints nothing: what a user should see on the way (a library downloaded, a base pulled,
//! the CPU engine chosen) goes to the [`Notes`] sink the caller gives; `cli::build` turns flags
//! into a [`BuildRequest`] and prints the [`Built`] result.
//!
//! One use-case a file: `build.rs` (`infer-build build`: the project, every selected target's
//! engine, runtime, base and libraries, the images), `engine.rs` (the engine-spec step
//! `build` and `infer-build engine` share, the engine cache lookup, the words for an engine
//! choice), `text.rs` (the tokenizer checks `build` and `check` share), `inspect.rs`
//! (`infer-build inspect` of a layout or archive) and `tune.rs` (what `bench --tune` sweeps from).

use std::sync::Arc;

mod build;
mod bundle;
mod engine;
mod inspect;
pub(crate) mod slim;
mod text;
mod tune;

pub(crate) use build::{build, BuildRequest};
pub(crate) use bundle::{bundle_plan, load_bundle, memory_needs};
pub(crate) use engine::{engine_spec, folded_line, selection_line};
pub(crate) use inspect::inspect;
pub(crate) use text::check_tokenizer;
pub(crate) use tune::tune_base;

/// Where the pipeline says what it did, one line at a time (the CLI writes them to standard
/// error). Shared, because the constant-folding fallback may fetch a library later, from
/// inside the engine stage.
pub(crate) type Notes = Arc<dyn Fn(&str) + Send + Sync>;
