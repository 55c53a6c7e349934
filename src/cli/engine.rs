//! `infer-build engine`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct EngineArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: EngineArgs) -> Result<(), Error> {
    Err(Error::Usage("`engine` is not implemented yet".into()))
}
