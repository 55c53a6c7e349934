//! The top-level error: one variant per module error, and the single place where errors are
//! mapped to process exit codes (0 ok, 1 failure, 2 bad input or usage).
//!
//! Every module error exposes `is_bad_input()`: true when the user can fix it by changing
//! what they passed (a recipe, a flag, a path), false for failures of the environment.

/// Exit code for success.
pub(crate) const EXIT_OK: i32 = 0;
/// Exit code for a failure that is not the user's input (I/O, network, a tool that crashed).
pub(crate) const EXIT_FAILURE: i32 = 1;
/// Exit code for bad input: a recipe error, a bad flag, an impossible target.
pub(crate) const EXIT_BAD_INPUT: i32 = 2;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Recipe(#[from] crate::recipe::Error),
    #[error(transparent)]
    Matrix(#[from] crate::matrix::Error),
    #[error(transparent)]
    Plan(#[from] crate::plan::Error),
    #[error(transparent)]
    Oci(#[from] crate::oci::Error),
    #[error(transparent)]
    Build(#[from] crate::assemble::Error),
    #[error(transparent)]
    Engine(#[from] crate::engine::Error),
    #[error(transparent)]
    Registry(#[from] crate::registry::Error),
    #[error(transparent)]
    Deploy(#[from] crate::deploy::Error),
    #[error(transparent)]
    Bench(#[from] crate::bench::Error),
    #[error(transparent)]
    Process(#[from] crate::process::Error),
    #[error(transparent)]
    Slim(#[from] crate::slim::Error),
    #[error(transparent)]
    Sbom(#[from] crate::sbom::Error),
    #[error(transparent)]
    Native(#[from] crate::native::Error),
    /// A usage error found by the CLI itself (conflicting flags and the like).
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// The process exit code for this error. The only place exit codes are decided.
    pub fn exit_code(&self) -> i32 {
        let bad_input = match self {
            Error::Recipe(e) => e.is_bad_input(),
            Error::Matrix(e) => e.is_bad_input(),
            Error::Plan(e) => e.is_bad_input(),
            Error::Oci(e) => e.is_bad_input(),
            Error::Build(e) => e.is_bad_input(),
            Error::Engine(e) => e.is_bad_input(),
            Error::Registry(e) => e.is_bad_input(),
            Error::Deploy(e) => e.is_bad_input(),
            Error::Bench(e) => e.is_bad_input(),
            Error::Process(e) => e.is_bad_input(),
            Error::Slim(e) => e.is_bad_input(),
            Error::Sbom(e) => e.is_bad_input(),
            Error::Native(e) => e.is_bad_input(),
            Error::Usage(_) => true,
        };
        if bad_input {
            EXIT_BAD_INPUT
        } else {
            EXIT_FAILURE
        }
    }
}
