//! `infer-build check`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: CheckArgs) -> Result<(), Error> {
    Err(Error::Usage("`check` is not implemented yet".into()))
}
