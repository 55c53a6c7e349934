//! What `infer-build push` attaches to the images of a layout, as OCI 1.1 referrers: a warm-up
//! manifest per per-target image (`warmup.rs`: the requests, start-up timings, compatibility
//! tuple, node selector and ports a cluster needs to pre-pull and warm it) and its SBOM
//! (`sbom.rs`: `sbom/<target>.spdx.json` beside the layout's `index.json`, written by `build`).
//! The registry client pushes what [`Attachments`] hands it and knows none of this.

use crate::oci::image::{Descriptor, Document};
use crate::registry::layout::Layout;
use crate::registry::push::Attach;
use crate::registry::referrers::Artifact;

mod sbom;
pub(crate) mod warmup;

/// Media types of infer-build's artifacts.
pub(crate) mod media {
    /// The `artifactType` of the warm-up manifest.
    pub(crate) const WARMUP_ARTIFACT: &str = "application/vnd.infer-build.warmup.v1+json";
    /// The media type of the warm-up manifest's one layer (the JSON document).
    pub(crate) const WARMUP_LAYER: &str = "application/vnd.infer-build.warmup.v1+json";
    /// The `artifactType` of the SBOM manifest and the media type of its one layer.
    pub(crate) const SBOM_ARTIFACT: &str = crate::sbom::MEDIA_TYPE;
}

/// The report group of warm-up manifests (`warmup` in `push --json`).
pub const WARMUP: &str = "warmup";
/// The report group of SBOMs (`sbom` in `push --json`).
pub const SBOM: &str = "sbom";

/// Which of infer-build's artifacts a push attaches (both by default).
#[derive(Debug, Clone, Copy)]
pub struct Attachments {
    /// A warm-up manifest to every image that serves a model.
    pub warmup: bool,
    /// Its SBOM to every image the layout has one for.
    pub sbom: bool,
}

impl Default for Attachments {
    fn default() -> Self {
        Attachments {
            warmup: true,
            sbom: true,
        }
    }
}

impl Attachments {
    /// `opts`, attaching these to the pushed images.
    pub fn onto(self, mut opts: crate::registry::PushOptions) -> crate::registry::PushOptions {
        opts.attach = crate::registry::Attacher(Some(std::sync::Arc::new(self)));
        opts
    }
}

impl Attach for Attachments {
    fn groups(&self) -> &'static [&'static str] {
        &[WARMUP, SBOM]
    }

    fn artifacts(
        &self,
        layout: &Layout,
        image: &Descriptor,
        manifest_bytes: &[u8],
        m: &Document,
    ) -> crate::registry::Result<Vec<(&'static str, Artifact)>> {
        let mut out = Vec::new();
        // The split layout's parts: a runtime image serves no model of its own (no warm-up);
        // the model image's warm-up names it; the SBOM describes the combined image.
        let part = m.annotations.get(crate::assemble::split::PART_ANNOTATION);
        if self.warmup && part.is_none_or(|p| p != "runtime") {
            out.push((WARMUP, warmup::for_image(layout, image, manifest_bytes, m)?));
        }
        if self.sbom && part.is_none() {
            if let Some(a) = sbom::artifact(layout, image, m)? {
                out.push((SBOM, a));
            }
        }
        Ok(out)
    }
}
