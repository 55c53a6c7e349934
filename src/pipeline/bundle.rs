//! `infer-build build BUNDLE`: several recipes in one image per target. Each recipe is
//! prepared as for a one-model image (its plan, engine through the engine cache, runtime,
//! base, libraries); then per target the models' specs are joined into one image
//! ([`assemble::spec::bundle_spec`]): one runtime and base, one layer per model under
//! `/opt/infer/models/<name>/`, a bundle `runtime.toml` naming them.

use std::collections::BTreeMap;
use std::path::Path;

use crate::assemble::{self, spec::Place};
use crate::error::Error;
use crate::plan::{Project, TargetPlan};
use crate::recipe::bundle::Bundle;
use crate::recipe::{Diagnostic, Span};

use super::prepare::{nonempty, prepare_recipe, Bases, BuildRequest, Prepared, RecipeBuild};
use super::Notes;

/// A bundle file and its recipes' projects, checked to make one image per target before any
/// engine is built: the models are named apart and every model plans each target `targets`
/// selects (every target when empty), the same for all. What `check` and `build` both run.
pub(crate) fn load_bundle(
    path: &Path,
    matrix: Option<&Path>,
    targets: &[String],
) -> Result<(Bundle, Vec<Project>), Error> {
    let bundle = crate::recipe::bundle::load(path)?;
    let mut projects: Vec<Project> = Vec::with_capacity(bundle.models.len());
    let mut first: Vec<String> = Vec::new();
    for (i, m) in bundle.models.iter().enumerate() {
        let project = Project::load(&bundle.dir.join(&m.value), matrix)?;
        let refuse =
            |message: String| Error::Usage(m.diagnostic(&bundle.file, message).to_string());
        if let Some(other) = projects
            .iter()
            .find(|o| o.recipe.model.name == project.recipe.model.name)
        {
            return Err(refuse(format!(
                "{} and {} both name their model {:?}; the models of a bundle need names of their own (`[model] name`)",
                other.recipe.file.display(),
                project.recipe.file.display(),
                project.recipe.model.name
            )));
        }
        let ids: Vec<String> = project
            .plan
            .select(targets)?
            .iter()
            .map(|t| t.id.clone())
            .collect();
        if i == 0 {
            first = ids;
        } else if ids != first {
            return Err(refuse(format!(
                "this model's targets are [{}], the first model's [{}]; every model of a bundle needs each target built (give their recipes the same [targets], or pick shared ones with --target)",
                ids.join(", "),
                first.join(", ")
            )));
        }
        projects.push(project);
    }
    check_memory(&bundle, &projects, targets)?;
    Ok((bundle, projects))
}

/// Each model's estimated memory on target `t` ([`crate::plan::memory::model_need`]), named.
pub(crate) fn memory_needs(projects: &[Project], t: &TargetPlan) -> Vec<(String, u64)> {
    projects
        .iter()
        .filter_map(|p| {
            let theirs = p.plan.target(&t.id)?;
            let onnx = p.recipe.resolve(&p.recipe.model.onnx.value);
            let size = std::fs::metadata(&onnx).map_or(0, |m| m.len());
            Some((
                p.recipe.model.name.clone(),
                crate::plan::memory::model_need(&p.recipe, theirs, size),
            ))
        })
        .collect()
}

/// Refuses a bundle whose models, together, would not fit one of its targets (an estimate,
/// [`crate::plan::memory`]): the GPU's memory, or on CPU the pod memory the bundle's
/// `[deploy]` sets (without one, `deploy` sizes the pod from the estimate instead).
fn check_memory(bundle: &Bundle, projects: &[Project], targets: &[String]) -> Result<(), Error> {
    let Some(first) = projects.first() else {
        return Ok(());
    };
    for t in first.plan.select(targets)? {
        let gpu = t.kind == crate::plan::TargetKind::Gpu;
        let pod_mib = match &bundle.deploy.resources.memory {
            Some(q) => crate::deploy::from_plan::memory_mib(q).unwrap_or(0),
            None if gpu => crate::deploy::from_plan::DEFAULT_GPU_MEMORY_MIB,
            None => continue,
        };
        let needs = memory_needs(projects, t);
        if let Some(why) = crate::plan::memory::refusal(&first.matrix, t, pod_mib, &needs) {
            // At the models list (its first entry's place): the models together are the problem.
            let span = bundle.models.first().map_or(Span::START, |m| m.span);
            return Err(Error::Usage(
                Diagnostic::new(&bundle.file, span, "bundle.models", why).to_string(),
            ));
        }
    }
    Ok(())
}

/// The plan of a bundle's images: its first model's targets (every model plans the same,
/// [`load_bundle`]), named, versioned and tagged as the bundle: what `plan`, `check` and
/// `deploy` show and CI fans out over.
pub(crate) fn bundle_plan(
    bundle: &Bundle,
    projects: &[Project],
) -> Result<crate::plan::BuildPlan, Error> {
    let Some(first) = projects.first() else {
        return Err(Error::Usage(format!(
            "{}: no models",
            bundle.file.display()
        )));
    };
    let mut plan = first.plan.clone();
    plan.recipe = bundle.file.clone();
    plan.model = bundle.name.clone();
    plan.version = bundle.version.clone();
    plan.repository = bundle.repository.clone();
    crate::plan::tag::apply_bundle(bundle, &first.recipe, &mut plan.targets)?;
    Ok(plan)
}

/// The bundle file `req.input`, each of its recipes prepared, the images composed.
pub(super) fn prepare(req: &BuildRequest, note: &Notes) -> Result<Prepared, Error> {
    let (bundle, projects) = load_bundle(&req.input, req.matrix.as_deref(), &req.targets)?;
    let plan = bundle_plan(&bundle, &projects)?;
    let plans: Vec<TargetPlan> = plan.select(&req.targets)?.into_iter().cloned().collect();
    let mut bases = Bases::new(req, note);
    let mut models: Vec<RecipeBuild> = Vec::with_capacity(projects.len());
    let count = projects.len();
    for (i, project) in projects.into_iter().enumerate() {
        note(&format!(
            "bundle {}: model {} of {count}: {}",
            bundle.name,
            i + 1,
            project.recipe.file.display()
        ));
        models.push(prepare_recipe(req, project, &mut bases, note)?);
    }

    let mut per_target: BTreeMap<String, Vec<assemble::TargetSpec>> = BTreeMap::new();
    for r in models {
        let name = r.recipe.model.name.clone();
        for (t, files) in r.targets {
            let spec = assemble::spec::target_spec_at(&r.recipe, &t, files, Place::Bundled(&name))?;
            per_target.entry(t.id.clone()).or_default().push(spec);
        }
    }
    let mut targets = Vec::with_capacity(plans.len());
    for t in &plans {
        let parts = per_target.remove(&t.id).unwrap_or_default();
        targets.push(assemble::spec::bundle_spec(
            &t.tag,
            bundle.deploy.drain_delay_s,
            parts,
        )?);
    }
    let meta = assemble::ImageMeta {
        name: bundle.name.clone(),
        version: bundle.version.clone(),
        revision: nonempty(req.revision.as_deref()),
        source: nonempty(req.source.as_deref()),
        repository: bundle.repository.clone(),
        index_tag: bundle.version.clone(),
        labels: bundle.labels.clone(),
        user: Some(bundle.user),
    };
    Ok(Prepared {
        meta,
        targets,
        bases: bases.into_pulled(),
    })
}
