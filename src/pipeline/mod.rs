//! The use-cases of `infer-build`, one a file; the CLI turns flags into a request, calls one of
//! them, and renders what it returns. Each prints nothing: what a user should see on the way (a
//! library downloaded, a base pulled, the CPU engine chosen, a file written) goes to the
//! [`Notes`] sink the caller gives.
//!
//! - `build.rs`: `infer-build build` ([`BuildRequest`]): the project (recipe, matrix, lock,
//!   plan), each selected target prepared, then [`crate::assemble::build`], the SBOMs and the
//!   archive.
//! - `prepare.rs`: what `build` and a bundle's build share: one recipe's targets with their
//!   engine (looked up under `--engines` or built by the engine stage), runtime flavour, base
//!   image (pulled into the base cache, pinned in the lock file) and native libraries.
//! - `bundle.rs`: a bundle file's recipes checked to make one image per target, its plan, its
//!   images composed.
//! - `engine.rs`: `infer-build engine` ([`EngineRequest`]), the engine-spec step it shares with
//!   `build`, the engine cache lookup, the words for an engine choice.
//! - `deploy.rs`: `infer-build deploy` ([`DeployRequest`]): Kubernetes YAML per target.
//! - `push.rs` and `pull.rs`: `infer-build push` ([`PushRequest`]) and `pull`
//!   ([`PullRequest`]) over the registry client.
//! - `slim.rs`: `infer-build slim`; `inspect.rs`: `infer-build inspect` of a layout or archive;
//!   `text.rs`: the tokenizer checks `build` and `check` share; `tune.rs`: what `bench --tune`
//!   sweeps from.
//!
//! The files depend on each other one way: `build` on `bundle` and `prepare`, `bundle` on
//! `prepare`, `prepare` on `engine` and `text`, `deploy` on `bundle`.

use std::sync::Arc;

mod build;
mod bundle;
mod deploy;
mod engine;
mod inspect;
mod prepare;
mod pull;
mod push;
pub(crate) mod slim;
mod text;
mod tune;

pub(crate) use build::build;
pub(crate) use bundle::{bundle_plan, load_bundle, memory_needs};
pub(crate) use deploy::{deploy, DeployRequest, GpuShareChoice};
pub(crate) use engine::{engine, folded_line, selection_line, EngineBuilt, EngineRequest};
pub(crate) use inspect::inspect;
pub(crate) use prepare::BuildRequest;
pub(crate) use pull::{pull, PullRequest};
pub(crate) use push::{push, PushRequest};
pub(crate) use text::check_tokenizer;
pub(crate) use tune::tune_base;

/// Where the pipeline says what it did, one line at a time (the CLI writes them to standard
/// error). Shared, because the constant-folding fallback may fetch a library later, from
/// inside the engine stage.
pub(crate) type Notes = Arc<dyn Fn(&str) + Send + Sync>;
