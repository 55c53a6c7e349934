//! `infer-build deploy`: Kubernetes YAML per target (Deployment, Service, HPA, pre-pull
//! DaemonSet), one file per target in `--out` (default `./k8s/<model>`).

use std::path::{Path, PathBuf};

use clap::Args;

use super::MatrixArgs;
use crate::deploy::{self, from_plan, Error as DeployError};
use crate::error::Error;
use crate::plan::TargetPlan;

#[derive(Debug, Args)]
pub(crate) struct DeployArgs {
    /// The recipe (TOML).
    pub input: PathBuf,
    /// Only this target (repeatable); default every target of the plan.
    #[arg(long = "target", value_name = "ID")]
    pub targets: Vec<String>,
    /// Write the YAML files here (default ./k8s/<model>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Pin images by digest from this OCI layout (what `infer-build build` wrote).
    #[arg(long, value_name = "DIR")]
    pub layout: Option<PathBuf>,
    /// The image to run, `REPO@sha256:...` or `REPO:TAG` (one target only).
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// An engine profile (`profile.json` from `infer-build engine`; repeatable, matched to
    /// targets by its `target`): its measured start-up sizes the startupProbe.
    #[arg(long = "profile", value_name = "FILE")]
    pub profiles: Vec<PathBuf>,
    /// The measured start-up time in seconds (engine load + warm-up to ready), when it was
    /// measured outside the engine profile; overrides the profile.
    #[arg(long, value_name = "SECONDS")]
    pub startup_seconds: Option<f64>,
    /// How each replica of a GPU target gets its GPU: `whole` (default), `mig` (the smallest
    /// MIG slice that holds the model's estimated memory), `time-sliced` or `mps` (a shared
    /// GPU; the YAML's comments say what each isolates).
    #[arg(long, value_name = "SHARE", default_value = "whole", value_parser = ["whole", "mig", "time-sliced", "mps"])]
    pub gpu_share: String,
    /// Probe readiness with gRPC health (`grpc.health.v1`, port 8001) instead of HTTP
    /// `/v2/health/ready` (Kubernetes 1.27 or later).
    #[arg(long)]
    pub grpc_probe: bool,
    /// `split`: the container runs the runtime image and the model image is mounted as an
    /// image volume (Kubernetes 1.35+); `combined`: the image with the model, for any cluster.
    /// Default: the recipe's `[image] layout`.
    #[arg(long, value_name = "LAYOUT", value_parser = super::build::parse_image_layout)]
    pub image_layout: Option<crate::recipe::ImageLayout>,
    #[command(flatten)]
    pub matrix: MatrixArgs,
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

pub(super) fn run(a: DeployArgs) -> Result<(), Error> {
    let matrix = a.matrix.matrix.as_deref();
    // A bundle's pod: one image per target holding every model, sized by the bundle file.
    // Per CPU target of a bundle, the pod memory its models need, when the bundle sets none.
    let mut cpu_memory: std::collections::BTreeMap<String, String> = Default::default();
    // Per target, the models' estimated memory together (a MIG slice must hold it).
    let mut need: std::collections::BTreeMap<String, u64> = Default::default();
    let matrix_rows: crate::matrix::Matrix;
    let is_bundle = crate::recipe::bundle::is_bundle(&a.input);
    let (recipe, targets): (crate::recipe::Recipe, Vec<TargetPlan>) = if is_bundle {
        let (bundle, projects) = crate::pipeline::load_bundle(&a.input, matrix, &a.targets)?;
        let plan = crate::pipeline::bundle_plan(&bundle, &projects)?;
        let plans: Vec<TargetPlan> = plan.select(&a.targets)?.into_iter().cloned().collect();
        let recipes: Vec<&crate::recipe::Recipe> = projects.iter().map(|p| &p.recipe).collect();
        let recipe = from_plan::bundle_recipe(&bundle, &recipes);
        for t in &plans {
            let needs = crate::pipeline::memory_needs(&projects, t);
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
                    eprintln!("deploy: {}: the bundle's models need about {mib} MiB together (an estimate); the pod asks for that", t.id);
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
            let one = crate::pipeline::memory_needs(std::slice::from_ref(&project), t);
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
            found.gpu_share = match a.gpu_share.as_str() {
                "mig" => {
                    from_plan::mig_share(&matrix_rows, t, need.get(&t.id).copied().unwrap_or(0))
                        .map_err(Error::Usage)?
                }
                "time-sliced" => deploy::GpuShare::TimeSliced,
                "mps" => deploy::GpuShare::Mps,
                _ => deploy::GpuShare::Whole,
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
        eprintln!("deploy: {} -> {}", t.id, path.display());
    }
    Ok(())
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
