//! The SBOM artifact of a per-target image.

use std::collections::BTreeMap;

use super::media;
use crate::oci::image::{Descriptor, Document};
use crate::oci::{Digest, ANNOTATION_PREFIX};
use crate::registry::layout::Layout;
use crate::registry::referrers::{self, Artifact};
use crate::registry::{Error, Result};

/// The SBOM artifact of a per-target image: `sbom/<target>.spdx.json` next to the layout's
/// `index.json` (target from the `dev.infer-build.target` annotation). `None` when the image
/// has no SBOM; an error when the SBOM describes another image (a stale file).
pub(super) fn artifact(
    layout: &Layout,
    desc: &Descriptor,
    m: &Document,
) -> Result<Option<Artifact>> {
    let key = format!("{ANNOTATION_PREFIX}target");
    let Some(target) = m
        .annotations
        .get(&key)
        .or_else(|| desc.annotations.get(&key))
    else {
        return Ok(None);
    };
    let Ok(path) = crate::sbom::path_in_layout(&layout.root, target) else {
        return Ok(None);
    };
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(&path, e)),
    };
    let described = crate::sbom::described_image(&bytes);
    if described.as_ref() != Some(&desc.digest) {
        return Err(Error::Layout {
            path,
            reason: format!(
                "this SBOM describes {}, not the layout's image {} for target `{target}`: rebuild the layout with `infer-build build`",
                described.as_ref().map_or("no image", Digest::as_str),
                desc.digest
            ),
        });
    }
    let annotations = BTreeMap::from([
        (
            crate::oci::annotation::TITLE.to_string(),
            format!("{target}.spdx.json"),
        ),
        (
            "dev.infer-build.sbom.subject".to_string(),
            desc.digest.to_string(),
        ),
    ]);
    Ok(Some(referrers::artifact(
        desc,
        media::SBOM_ARTIFACT,
        media::SBOM_ARTIFACT,
        bytes,
        annotations,
        Vec::new(),
    )))
}
