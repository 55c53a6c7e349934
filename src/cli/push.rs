//! `infer-build push`.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The recipe (TOML) or other primary input.
    pub input: PathBuf,
}

pub fn run(_args: PushArgs) -> Result<(), Error> {
    Err(Error::Usage("`push` is not implemented yet".into()))
}
