//! `infer-build deploy`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: DeployArgs) -> Result<(), Error> {
    Err(Error::Usage("`deploy` is not implemented yet".into()))
}
