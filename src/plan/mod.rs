//! Resolution: a validated recipe + the compatibility matrix (+ the lock file, when there is
//! one) → a [`BuildPlan`] with one [`TargetPlan`] per image to build. Each GPU × precision (and
//! the CPU target) resolves to a TensorRT release and build, CUDA, cuDNN, a driver floor, a base
//! image pinned by digest (or marked to be pinned by the lock file), a stable id and a tag.
//!
//! Impossible combinations are refused here, before anything is built, all at once, each with
//! the rule it breaks, a way out and the recipe's `file:line:col`.
//!
//! Pure: no filesystem, network, environment or clock; the CLI reads the recipe, the matrix and
//! the lock file and passes values in. (The one exception is [`lock::read`], the edge function
//! that loads a lock file for callers.)

pub mod lock;
mod types;

pub use types::*;

/// Errors of the `plan` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Lock(#[from] lock::LockError),
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Lock(lock::LockError::Read { .. }) => false,
            Error::Lock(lock::LockError::Invalid { .. }) => true,
        }
    }
}
