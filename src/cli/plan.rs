//! `infer-build plan`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: PlanArgs) -> Result<(), Error> {
    Err(Error::Usage("`plan` is not implemented yet".into()))
}
