//! `infer-build deploy`: Kubernetes YAML per target (Deployment, Service, HPA, pre-pull
//! DaemonSet), one file per target, for a recipe or a bundle: the images pinned from a layout or
//! named, the start-up probe sized from engine profiles, a GPU's share chosen (a MIG slice sized
//! from the models' estimated memory), a bundle's CPU pod sized from its models.

use std::path::{Path, PathBuf};

use crate::deploy::{self, from_plan, Error as DeployError};
use crate::error::Error;
use crate::plan::TargetPlan;

use super::Notes;

/// How each replica of a GPU target gets its GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum GpuShareChoice {
    /// A whole GPU.
    #[default]
    Whole,
    /// The smallest MIG slice that holds the models' estimated memory.
    Mig,
    /// A GPU shared by time slicing.
    TimeSliced,
    /// A GPU shared through MPS.
    Mps,
}

/// What to deploy: the recipe or bundle and the choices of `infer-build deploy`'s flags.
#[derive(Debug, Clone, Default)]
pub(crate) struct DeployRequest {
    /// The recipe or bundle file (TOML).
    pub input: PathBuf,
    /// `--matrix DIR`, else the embedded matrix.
    pub matrix: Option<PathBuf>,
    /// Only these targets; empty: every target of the plan.
    pub targets: Vec<String>,
    /// Where the YAML files go (default `./k8s/<model>`).
    pub out: Option<PathBuf>,
    /// An OCI layout to pin each target's image by digest from.
    pub layout: Option<PathBuf>,
    /// One image to run, `REPO@sha256:...` or `REPO:TAG` (one target only).
    pub image: Option<String>,
    /// Engine profiles (`profile.json`), matched to targets by their `target`.
    pub profiles: Vec<PathBuf>,
    /// A start-up time measured elsewhere, in seconds; overrides the profiles.
    pub startup_seconds: Option<f64>,
    pub gpu_share: GpuShareChoice,
    /// Readiness by gRPC health instead of HTTP.
    pub grpc_probe: bool,
    /// Overrides the recipe's `[image] layout`.
    pub image_layout: Option<crate::recipe::ImageLayout>,
}

/// What [`deploy`] wrote: per target, its YAML file.
pub(crate) struct Deployed {
    pub files: Vec<(String, PathBuf)>,
}

/// Split `REPO@sha256:HEX` or `REPO:TAG` (a port in the registry host is not a tag).
fn split_image(r: &str) -> (String, Option<String>, Option<String>) {
    if let Some((repo, digest)) = r.split_once('@') {
        return (repo.to_string(), Some(digest.to_string()), None);
    }
    match r.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => (repo.to_string(), None, Some(tag.to_string())),
        _ => (r.to_string(), None, None),
    }
}

/// The manifest digest of `t` in an OCI layout, found by its tag.
fn layout_digest(layout: &Path, t: &TargetPlan) -> Result<String, Error> {
    let store = crate::oci::store::BlobStore::open(layout)?;
    let d = crate::oci::layout::resolve(&store, &t.tag)
        .or_else(|_| crate::oci::layout::resolve(&store, &t.image))?;
    Ok(d.digest.to_string())
}

/// The split layout's runtime and model image digests of `t` in an OCI layout.
fn layout_split(layout: &Path, t: &TargetPlan) -> Result<deploy::SplitImages, Error> {
    let store = crate::oci::store::BlobStore::open(layout)?;
    let [runtime, model, _] = crate::assemble::split::tags(&t.tag);
    let digest = |tag: &str| -> Result<String, Error> {
        crate::oci::layout::resolve(&store, tag)
            .map(|d| d.digest.to_string())
            .map_err(|_| {
                Error::Usage(format!(
                    "{}: no image tagged {tag}: build with --image-layout split (or [image] layout = \"split\") first, or deploy with --image-layout combined",
                    layout.display()
                ))
            })
    };
    Ok(deploy::SplitImages {
        runtime_digest: Some(digest(&runtime)?),
        model_digest: Some(digest(&model)?),
    })
}

/// Write the YAML of every target `req` selects, one file each (returned, per target); says on
/// `note` the memory a bundle's CPU pod asks for where the bundle sets none.
#[allow(
    clippy::too_many_lines,
    reason = "the targets of a recipe or a bundle, the flags checked, then one file per target"
)]
pub(crate) fn deploy(a: &DeployRequest, note: &Notes) -> Result<Deployed, Error> {
    let matrix = a.matrix.as_deref();
    // A bundle's pod: one image per target holding every model, sized by the bundle file.
    // Per CPU target of a bundle, the pod memory its models need, when the bundle sets none.
    let mut cpu_memory: std::collections::BTreeMap<String, String> = Default::default();
    // Per target, the models' estimated memory together (a MIG slice must hold it).
    let mut need: std::collections::BTreeMap<String, u64> = Default::default();
    let matrix_rows: crate::matrix::Matrix;
    let is_bundle = crate::recipe::bundle::is_bundle(&a.input);
    let (recipe, targets): (crate::recipe::Recipe, Vec<TargetPlan>) = if is_bundle {
        let (bundle, projects) = super::load_bundle(&a.input, matrix, &a.targets)?;
        let plan = super::bundle_plan(&bundle, &projects)?;
        let plans: Vec<TargetPlan> = plan.select(&a.targets)?.into_iter().cloned().collect();
        let recipes: Vec<&crate::recipe::Recipe> = projects.iter().map(|p| &p.recipe).collect();
        let recipe = from_plan::bundle_recipe(&bundle, &recipes);
        for t in &plans {
            let needs = super::memory_needs(&projects, t);
            need.insert(t.id.clone(), crate::plan::memory::total(t, &needs));
        }
        matrix_rows = projects[0].matrix.clone();
        // A CPU pod without a stated memory is sized to hold its models (estimated), at
        // least the default.
        if recipe.deploy.resources.memory.is_none() {
            for t in plans
                .iter()
                .filter(|t| t.kind == crate::plan::TargetKind::Cpu)
            {
                let mib = crate::plan::memory::pod_mib_for(need[&t.id]);
                if mib > from_plan::DEFAULT_CPU_MEMORY_MIB {
                    note(&format!("deploy: {}: the bundle's models need about {mib} MiB together (an estimate); the pod asks for that", t.id));
                    cpu_memory.insert(t.id.clone(), format!("{mib}Mi"));
                }
            }
        }
        (recipe, plans)
    } else {
        let project = crate::plan::Project::load(&a.input, matrix)?;
        let targets: Vec<TargetPlan> = project
            .plan
            .select(&a.targets)?
            .into_iter()
            .cloned()
            .collect();
        for t in &targets {
            let one = super::memory_needs(std::slice::from_ref(&project), t);
            need.insert(t.id.clone(), crate::plan::memory::total(t, &one));
        }
        matrix_rows = project.matrix;
        (project.recipe, targets)
    };
    let split = a.image_layout.unwrap_or(recipe.image.layout) == crate::recipe::ImageLayout::Split;
    if split && is_bundle {
        return Err(Error::Usage(format!(
            "--image-layout split: {} is a bundle file, served from one combined image",
            a.input.display()
        )));
    }
    if split && a.image.is_some() {
        return Err(Error::Usage(
            "--image names one image; the split layout runs two (the runtime and the model image): pin them with --layout DIR, or deploy with --image-layout combined".into(),
        ));
    }
    if a.image.is_some() && targets.len() != 1 {
        return Err(Error::Usage(format!(
            "--image names one image but the plan has {} targets: add --target ID",
            targets.len()
        )));
    }
    if let Some(s) = a.startup_seconds {
        if !(s.is_finite() && s >= 0.0) {
            return Err(Error::Usage(format!(
                "--startup-seconds {s} must be zero or positive"
            )));
        }
    }
    let mut profiles = Vec::new();
    for p in &a.profiles {
        let bytes = std::fs::read(p).map_err(|e| {
            Error::Usage(format!("cannot read engine profile {}: {e}", p.display()))
        })?;
        let profile = infer_spec::engine::EngineProfile::from_json(&bytes).map_err(|e| {
            DeployError::Input(format!("{} is not an engine profile: {e}", p.display()))
        })?;
        profiles.push(profile);
    }
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| Path::new("k8s").join(&recipe.model.name));
    std::fs::create_dir_all(&out).map_err(|e| DeployError::Write {
        path: out.clone(),
        source: e,
    })?;
    let mut files = Vec::with_capacity(targets.len());
    for t in &targets {
        let mut found = from_plan::Found::default();
        if let Some(r) = &a.image {
            let (repo, digest, tag) = split_image(r);
            found.repository = Some(repo);
            found.digest = digest;
            found.tag = tag;
        } else if let Some(layout) = &a.layout {
            if split {
                found.split = Some(layout_split(layout, t)?);
            } else {
                found.digest = Some(layout_digest(layout, t)?);
            }
        }
        if split && found.split.is_none() {
            found.split = Some(deploy::SplitImages::default());
        }
        found.startup = match a.startup_seconds {
            Some(s) => Some(deploy::StartupMeasurement {
                seconds: s,
                source: "--startup-seconds".into(),
            }),
            // A bundle's models load in turn: their profiles for the target add up; a
            // recipe's target takes its first.
            None => from_plan::startup_of_all(
                profiles
                    .iter()
                    .filter(|p| p.target == t.id)
                    .take(if is_bundle { usize::MAX } else { 1 })
                    .filter_map(from_plan::startup_from_profile),
            ),
        };
        if t.kind == crate::plan::TargetKind::Gpu {
            found.gpu_share = match a.gpu_share {
                GpuShareChoice::Mig => {
                    from_plan::mig_share(&matrix_rows, t, need.get(&t.id).copied().unwrap_or(0))
                        .map_err(Error::Usage)?
                }
                GpuShareChoice::TimeSliced => deploy::GpuShare::TimeSliced,
                GpuShareChoice::Mps => deploy::GpuShare::Mps,
                GpuShareChoice::Whole => deploy::GpuShare::Whole,
            };
        }
        let mut spec = match cpu_memory.get(&t.id) {
            Some(m) => {
                let mut sized = recipe.clone();
                sized.deploy.resources.memory = Some(m.clone());
                from_plan::spec(&sized, t, &found)?
            }
            None => from_plan::spec(&recipe, t, &found)?,
        };
        spec.grpc_readiness = a.grpc_probe;
        let yaml = deploy::render(&spec)?;
        let path = out.join(format!("{}.yaml", spec.name()));
        // Atomic, and a link planted at the name is replaced, never written through.
        crate::oci::write_atomic(&path, yaml.as_bytes()).map_err(|e| DeployError::Write {
            path: path.clone(),
            source: e.into_io(),
        })?;
        files.push((t.id.clone(), path));
    }
    Ok(Deployed { files })
}

#[cfg(test)]
mod tests {
    use super::split_image;

    #[test]
    fn image_references() {
        let d = format!("sha256:{}", "a".repeat(64));
        assert_eq!(
            split_image(&format!("r.io:5000/m/x@{d}")),
            ("r.io:5000/m/x".into(), Some(d), None)
        );
        assert_eq!(
            split_image("r.io:5000/m/x:1.0"),
            ("r.io:5000/m/x".into(), None, Some("1.0".into()))
        );
        assert_eq!(
            split_image("r.io:5000/m/x"),
            ("r.io:5000/m/x".into(), None, None)
        );
    }
}
