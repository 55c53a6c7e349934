//! `infer-build build`: the project, then for each selected target its engine, runtime flavour,
//! base image and native libraries ([`super::prepare`]), then [`assemble::build`], the SBOMs and
//! the archive.

use std::path::Path;

use crate::assemble::{self, BuildOptions, BuildReport, Progress};
use crate::error::Error;
use crate::oci::{layout, store::BlobStore};
use crate::registry::pull::PulledImage;

use super::prepare::{nonempty, prepare_recipe, Bases, BuildRequest, Prepared};
use super::Notes;

/// What [`build`] wrote.
pub(crate) struct Built {
    pub report: BuildReport,
    pub sboms: Vec<crate::sbom::Written>,
    pub bases: Vec<PulledImage>,
}

/// Build every requested target into the OCI layout `out` (and the `oci-archive` file
/// `archive`), with an SBOM per image.
pub(crate) fn build(
    req: &BuildRequest,
    out: Option<&Path>,
    archive: Option<&Path>,
    opts: &BuildOptions,
    progress: &mut dyn Progress,
    note: &Notes,
) -> Result<Built, Error> {
    let p = prepare(req, note)?;
    let out = out.map_or_else(|| Path::new("out").join(&p.meta.name), Path::to_path_buf);
    let report = assemble::build(&out, &p.meta, &p.targets, opts, progress)?;
    let sboms = crate::sbom::write_for_build(&report, &p.meta, &p.targets, opts.epoch)?;
    if let Some(a) = archive {
        let store = BlobStore::open(&out)?;
        layout::write_archive(&store, a, opts.epoch)?;
    }
    Ok(Built {
        report,
        sboms,
        bases: p.bases,
    })
}

/// The image identity, one spec per target to build and the base images pulled for them:
/// everything [`assemble::build`] needs, from the request. The input is a recipe, or a bundle
/// file naming several ([`crate::recipe::bundle`]).
fn prepare(req: &BuildRequest, note: &Notes) -> Result<Prepared, Error> {
    if crate::recipe::bundle::is_bundle(&req.input) {
        if req.layout == Some(crate::recipe::ImageLayout::Split) {
            return Err(Error::Usage(format!(
                "--image-layout split: {} is a bundle file; a bundle's models share one combined image (build each recipe with --image-layout split for one runtime image and a model artifact each)",
                req.input.display()
            )));
        }
        return super::bundle::prepare(req, note);
    }
    let mut bases = Bases::new(req, note);
    let project = crate::plan::Project::load(&req.input, req.matrix.as_deref())?;
    let r = prepare_recipe(req, project, &mut bases, note)?;
    let split = req.layout.unwrap_or(r.recipe.image.layout) == crate::recipe::ImageLayout::Split;
    let specs = r
        .targets
        .into_iter()
        .map(|(t, files)| {
            if !split {
                return assemble::spec::target_spec(&r.recipe, &t, files);
            }
            // The same files, the model's directory with relative paths: what is mounted.
            let mounted = assemble::spec::target_spec_at(
                &r.recipe,
                &t,
                files.clone(),
                assemble::spec::Place::Bundled(&r.recipe.model.name),
            )?;
            let mut spec = assemble::spec::target_spec(&r.recipe, &t, files)?;
            spec.split = mounted
                .models
                .into_iter()
                .next()
                .map(|model| assemble::split::Split {
                    model,
                    precision: t.precision,
                });
            Ok(spec)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut meta = assemble::spec::image_meta(&r.recipe, &r.plan);
    meta.revision = nonempty(req.revision.as_deref());
    meta.source = nonempty(req.source.as_deref());
    Ok(Prepared {
        meta,
        targets: specs,
        bases: bases.into_pulled(),
    })
}
