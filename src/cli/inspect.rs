//! `infer-build inspect`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: InspectArgs) -> Result<(), Error> {
    Err(Error::Usage("`inspect` is not implemented yet".into()))
}
