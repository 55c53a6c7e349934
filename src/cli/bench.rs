//! `infer-build bench`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: BenchArgs) -> Result<(), Error> {
    Err(Error::Usage("`bench` is not implemented yet".into()))
}
