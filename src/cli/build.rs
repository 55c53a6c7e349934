//! `infer-build build`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: BuildArgs) -> Result<(), Error> {
    Err(Error::Usage("`build` is not implemented yet".into()))
}
