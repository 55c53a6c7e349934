//! `infer-build check`: validate a recipe and resolve every target against the compatibility
//! matrix, and check a text model's tokenizer as `build` does, without building anything. A
//! short summary on stderr; exit 0, or 2 with every problem named at `file:line:col`.

use std::path::{Path, PathBuf};

use clap::Args;

use super::MatrixArgs;
use crate::error::Error;
use crate::plan::BuildPlan;

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The recipe (TOML).
    pub input: PathBuf,
    #[command(flatten)]
    pub matrix: MatrixArgs,
}

/// Load the recipe, the matrix and the lock file beside the recipe, and resolve the plan: what
/// `plan` prints (`check` loads the same, and checks the tokenizer too).
pub(super) fn load_plan(recipe: &Path, matrix: Option<&Path>) -> Result<BuildPlan, Error> {
    if crate::recipe::bundle::is_bundle(recipe) {
        let (bundle, projects) = crate::pipeline::load_bundle(recipe, matrix, &[])?;
        return crate::pipeline::bundle_plan(&bundle, &projects);
    }
    Ok(crate::plan::Project::load(recipe, matrix)?.plan)
}

pub(super) fn run(args: CheckArgs) -> Result<(), Error> {
    if crate::recipe::bundle::is_bundle(&args.input) {
        return check_bundle(&args.input, args.matrix.matrix.as_deref());
    }
    let project = crate::plan::Project::load(&args.input, args.matrix.matrix.as_deref())?;
    crate::pipeline::check_tokenizer(&project.recipe)?;
    let plan = project.plan;
    let ids: Vec<&str> = plan.targets.iter().map(|t| t.id.as_str()).collect();
    eprintln!(
        "ok: {}: {} target{} ({})",
        plan.recipe.display(),
        ids.len(),
        if ids.len() == 1 { "" } else { "s" },
        ids.join(", ")
    );
    let unpinned = plan.unpinned_images();
    if !unpinned.is_empty() {
        eprintln!(
            "  {} base image{} to be pinned in {} at first pull",
            unpinned.len(),
            if unpinned.len() == 1 { "" } else { "s" },
            plan.lock_file.display()
        );
    }
    Ok(())
}

/// A bundle file: the file itself, then each recipe it names, planned and checked to make one
/// image per target ([`crate::pipeline::load_bundle`]), its tokenizer checked.
fn check_bundle(path: &Path, matrix: Option<&Path>) -> Result<(), Error> {
    let (bundle, projects) = crate::pipeline::load_bundle(path, matrix, &[])?;
    for p in &projects {
        crate::pipeline::check_tokenizer(&p.recipe)?;
    }
    let names: Vec<&str> = projects.iter().map(|p| p.plan.model.as_str()).collect();
    let ids: Vec<&str> = projects
        .first()
        .map(|p| p.plan.targets.iter().map(|t| t.id.as_str()).collect())
        .unwrap_or_default();
    eprintln!(
        "ok: {}: bundle {} of {} model{} ({}), {} target{} ({})",
        bundle.file.display(),
        bundle.name,
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        names.join(", "),
        ids.len(),
        if ids.len() == 1 { "" } else { "s" },
        ids.join(", ")
    );
    Ok(())
}
