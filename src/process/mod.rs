//! TODO(module owner): what `process` owns and what it must not do.

/// Errors of the `process` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("process: not implemented yet")]
    NotImplemented,
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        false
    }
}
