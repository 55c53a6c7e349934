//! Resolution: a validated recipe + the compatibility matrix (+ the lock file, when there is
//! one) → a [`BuildPlan`] with one [`TargetPlan`] per image to build. Each GPU × precision (and
//! the CPU target) resolves to a TensorRT release and build, CUDA, cuDNN, a driver floor, a base
//! image pinned by digest (or marked to be pinned by the lock file), a stable id and a tag.
//! Several products with the same SM and platform collapse into one target that lists them:
//! engines bind to the SM, not the product.
//!
//! Impossible combinations are refused here, before anything is built, all at once, each with
//! the rule it breaks (`[rule: tensorrt-min-sm]`), a way out (`hint:`) and the recipe's
//! `file:line:col` (the recipe module's [`Diagnostic`]).
//!
//! Pure: no filesystem, network, environment or clock; the CLI reads the recipe, the matrix and
//! the lock file and passes values in. The exceptions are the edge functions that load for
//! callers: [`lock::read`] (a lock file) and [`Project::load`] (recipe, matrix, lock, plan). This module must not build, pull or push anything.

pub(crate) mod lock;
pub(crate) mod memory;
pub(crate) mod project;
mod resolve;
mod rules;
pub(crate) mod tag;
mod types;

use std::path::PathBuf;

pub use lock::{read as read_lock, Lock};
pub use project::Project;
pub use resolve::resolve;
pub use types::*;

use crate::recipe::Diagnostic;

/// Errors of the `plan` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Recipe(#[from] crate::recipe::Error),
    #[error(transparent)]
    Matrix(#[from] crate::matrix::Error),
    #[error(transparent)]
    Lock(#[from] lock::LockError),
    #[error("unknown target `{target}`; the plan has: {available}")]
    UnknownTarget { target: String, available: String },
    /// Targets the matrix says cannot work; every one found, in recipe order.
    #[error("{}", render_refused(file, diagnostics))]
    Refused {
        file: PathBuf,
        diagnostics: Vec<Diagnostic>,
    },
}

fn render_refused(file: &std::path::Path, diagnostics: &[Diagnostic]) -> String {
    match diagnostics.len() {
        1 => crate::recipe::render(diagnostics),
        n => format!(
            "{n} targets of {} cannot be built\n{}",
            file.display(),
            crate::recipe::render(diagnostics)
        ),
    }
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Recipe(e) => e.is_bad_input(),
            Error::Matrix(e) => e.is_bad_input(),
            Error::Lock(e) => e.is_bad_input(),
            Error::Refused { .. } | Error::UnknownTarget { .. } => true,
        }
    }

    /// The refusals (empty for other errors).
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            Error::Refused { diagnostics, .. } => diagnostics,
            _ => &[],
        }
    }
}

#[cfg(test)]
mod tests;
