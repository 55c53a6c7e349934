//! `infer-build push`: an OCI layout pushed to a registry repository, the tags coming from the
//! layout (per-target tags and the index tag), with the warm-up artifacts and SBOMs attached.

use std::path::PathBuf;

use crate::error::Error;
use crate::registry::{self, PushOptions, PushReport, Reference};

/// What to push, and where.
#[derive(Clone)]
pub(crate) struct PushRequest {
    /// The OCI layout `build` wrote.
    pub layout: PathBuf,
    /// `REGISTRY[:PORT]/REPOSITORY`, without a tag: the tags come from the layout.
    pub to: String,
    /// The client, the parallelism, what to attach, the progress sink.
    pub options: PushOptions,
}

/// Push `req.layout` to `req.to`: a destination with a tag or digest is refused before any
/// connection.
pub(crate) fn push(req: &PushRequest) -> Result<PushReport, Error> {
    let target = Reference::parse(&req.to)?;
    if target.tag.is_some() || target.digest.is_some() {
        return Err(Error::Usage(format!(
            "--to {}: give REGISTRY/REPO without a tag; tags come from the layout",
            req.to
        )));
    }
    Ok(registry::push(&req.layout, &target, &req.options)?)
}
