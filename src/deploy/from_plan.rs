//! From a validated recipe and one resolved target to a [`DeploySpec`]: where each number
//! comes from (recipe, plan, engine profile, or a stated default) is decided here, and
//! nowhere else. Pure.

use crate::matrix::HardwareCompat;
use crate::plan::{TargetKind, TargetPlan};
use crate::recipe::Recipe;

use super::{
    Autoscale, DeploySpec, Error, GpuSelector, StartupMeasurement, DEFAULT_STARTUP_SAFETY,
};

/// CPU for a target when the recipe gives none, in millicores.
pub(crate) const DEFAULT_CPU_MILLIS: u64 = 2000;
/// Memory when the recipe gives none: the field notes' 2–4 GiB host reserve for a GPU
/// service, plus its /dev/shm.
pub(crate) const DEFAULT_GPU_MEMORY_MIB: u64 = 8192;
pub(crate) const DEFAULT_CPU_MEMORY_MIB: u64 = 2048;
/// The longest request when the recipe sets no deadline (`default_timeout_ms = 0`).
pub(crate) const NO_DEADLINE_ASSUMED_MS: u64 = 30_000;
/// GPU utilisation at which to scale out: ~70% of a replica's limit.
pub(crate) const GPU_UTIL_TARGET: u32 = 70;

/// Parse a Kubernetes CPU quantity (`"2"`, `"500m"`, `"1.5"`) into millicores.
pub(crate) fn cpu_millis(q: &str) -> Option<u64> {
    let q = q.trim();
    let v = if let Some(m) = q.strip_suffix('m') {
        m.parse::<f64>().ok()?
    } else {
        q.parse::<f64>().ok()? * 1000.0
    };
    (v.is_finite() && v >= 1.0).then(|| v.round() as u64)
}

/// The CPU one replica requests, in millicores: `deploy.resources.cpu`, else
/// [`DEFAULT_CPU_MILLIS`]; `Err` naming the value when it is not a CPU quantity.
pub(crate) fn requested_cpu_millis(recipe: &Recipe) -> Result<u64, String> {
    match &recipe.deploy.resources.cpu {
        Some(q) => {
            cpu_millis(q).ok_or_else(|| format!("deploy.resources.cpu `{q}` is not a CPU quantity"))
        }
        None => Ok(DEFAULT_CPU_MILLIS),
    }
}

/// Parse a Kubernetes memory quantity (`"4Gi"`, `"512Mi"`, `"4G"`, bytes) into MiB, rounded up.
pub(crate) fn memory_mib(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let v: f64 = num.parse().ok()?;
    let mul: f64 = match unit {
        "" => 1.0,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return None,
    };
    let mib = (v * mul / (1024.0 * 1024.0)).ceil();
    (mib.is_finite() && mib >= 1.0).then_some(mib as u64)
}

/// What the CLI found outside the recipe and the plan.
#[derive(Debug, Clone, Default)]
pub(crate) struct Found {
    /// The image manifest digest of this target, when built or given with `--image`.
    pub digest: Option<String>,
    /// A repository override from `--image`.
    pub repository: Option<String>,
    /// A tag override from `--image REPO:TAG`.
    pub tag: Option<String>,
    /// The start-up time measured by the engine stage.
    pub startup: Option<StartupMeasurement>,
    /// How a replica gets its GPU (`--gpu-share`).
    pub gpu_share: super::GpuShare,
    /// The split layout's pair (`[image] layout = "split"`), with the digests found.
    pub split: Option<super::SplitImages>,
}

/// The MIG slice for a model that needs `need` bytes (an estimate) on GPU target `t`: the
/// smallest profile, among those the matrix lists for the target's products (the first
/// product that has any), whose memory holds the need with 10% free. The error says why
/// there is none.
pub(crate) fn mig_share(
    matrix: &crate::matrix::Matrix,
    t: &TargetPlan,
    need: u64,
) -> Result<super::GpuShare, String> {
    let products = t
        .gpu
        .as_ref()
        .map(|g| g.products.clone())
        .unwrap_or_default();
    let rows: Vec<&crate::matrix::Gpu> = products
        .iter()
        .filter_map(|p| matrix.gpus.iter().find(|g| &g.name == p))
        .collect();
    let Some(row) = rows
        .iter()
        .find(|g| g.mig > 0 && !g.mig_profiles.is_empty())
    else {
        let with_mig: Vec<&str> = rows
            .iter()
            .filter(|g| g.mig > 0)
            .map(|g| g.name.as_str())
            .collect();
        return Err(if with_mig.is_empty() {
            format!(
                "target {}: none of its GPUs ({}) has MIG; use --gpu-share time-sliced or mps",
                t.id,
                products.join(", ")
            )
        } else {
            format!(
                "target {}: the matrix lists no MIG profiles for {}; add mig_profiles to matrix/gpus.toml (--matrix DIR)",
                t.id,
                with_mig.join(", ")
            )
        });
    };
    let need_gb = need as f64 / 1e9;
    let fits = row.mig_profiles.iter().find(|p| {
        p.split_once('.')
            .and_then(|(_, m)| m.strip_suffix("gb"))
            .and_then(|m| m.parse::<f64>().ok())
            .is_some_and(|gb| gb * 0.9 >= need_gb)
    });
    match fits {
        Some(profile) => Ok(super::GpuShare::Mig {
            profile: profile.clone(),
            product: row.name.clone(),
            need_gb,
        }),
        None => Err(format!(
            "target {}: the model needs about {need_gb:.1} GB (an estimate), more than the largest MIG profile of {} ({}) holds with 10% free; use a whole GPU",
            t.id,
            row.name,
            row.mig_profiles.last().map_or("", String::as_str)
        )),
    }
}

/// Build the spec for `target`.
pub(crate) fn spec(
    recipe: &Recipe,
    target: &TargetPlan,
    found: &Found,
) -> Result<DeploySpec, Error> {
    let gpu_target = target.kind == TargetKind::Gpu;
    let bad = |what: String| Error::Invalid {
        target: target.id.clone(),
        what,
    };
    let res = &recipe.deploy.resources;
    let cpu = requested_cpu_millis(recipe).map_err(bad)?;
    let memory = match &res.memory {
        Some(q) => memory_mib(q).ok_or_else(|| {
            bad(format!(
                "deploy.resources.memory `{q}` is not a memory quantity"
            ))
        })?,
        None if gpu_target => DEFAULT_GPU_MEMORY_MIB,
        None => DEFAULT_CPU_MEMORY_MIB,
    };
    // /dev/shm counts against the memory limit: a quarter of it, at most 2 GiB on GPU targets
    // (the field notes' size) and 512 MiB on CPU targets.
    let shm = (memory / 4).clamp(64, if gpu_target { 2048 } else { 512 });
    let gpu = match (&target.gpu, gpu_target) {
        (Some(g), true) => Some(
            match target.tensorrt.as_ref().and_then(|t| t.hardware_compat) {
                Some(HardwareCompat::AmperePlus) => GpuSelector::ComputeAtLeast { major: 8 },
                _ => GpuSelector::Compute {
                    major: g.compute_capability.major,
                    minor: g.compute_capability.minor,
                },
            },
        ),
        _ => None,
    };
    let delay_ms = recipe.batching.max_queue_delay_us as f64 / 1000.0;
    let autoscale = if gpu_target {
        Autoscale::GpuUtilisation {
            metric: "DCGM_FI_DEV_GPU_UTIL".into(),
            target_percent: GPU_UTIL_TARGET,
        }
    } else {
        Autoscale::QueueTime {
            metric: "infer_queue_time_seconds".into(),
            // Queue time beyond the batching delay is time spent waiting for a busy backend:
            // scale out once the average is half again the delay (at least 1 ms).
            target_ms: (delay_ms * 1.5).max(1.0),
        }
    };
    let deadline = match recipe.batching.default_timeout_ms {
        0 => NO_DEADLINE_ASSUMED_MS,
        d => d,
    };
    let (repository, digest) = (
        found
            .repository
            .clone()
            .unwrap_or_else(|| recipe.image.repository.value.clone()),
        found.digest.clone(),
    );
    Ok(DeploySpec {
        model: recipe.model.name.clone(),
        model_version: recipe.model.version.clone(),
        target: target.id.clone(),
        repository,
        tag: found.tag.clone().unwrap_or_else(|| target.tag.clone()),
        digest,
        gpu,
        cpu_prefers: target
            .cpu
            .as_ref()
            .map(|c| c.features.clone())
            .unwrap_or_default(),
        gpu_count: u32::from(gpu_target),
        gpu_share: found.gpu_share.clone(),
        cpu_millis: cpu,
        memory_mib: memory,
        shm_mib: shm,
        run_as_user: i64::from(recipe.image.user),
        replicas_min: recipe.deploy.replicas.min,
        replicas_max: recipe.deploy.replicas.max,
        startup: found.startup.clone(),
        startup_safety: DEFAULT_STARTUP_SAFETY,
        prestop_s: u64::from(recipe.deploy.drain_delay_s),
        runtime_drain_s: u64::from(recipe.deploy.drain_delay_s),
        longest_deadline_ms: deadline,
        deadline_assumed: recipe.batching.default_timeout_ms == 0,
        autoscale,
        grpc_readiness: false,
        split: found.split.clone(),
    })
}

/// The start-up time an engine profile measured: loading the chosen engine form, plus one
/// warm-up execution of every profiled batch size (the runtime warms up each planned size
/// before it reports ready). `None` when the profile has no start-up measurement.
pub(crate) fn startup_from_profile(
    p: &infer_spec::engine::EngineProfile,
) -> Option<StartupMeasurement> {
    let s = p.startup.as_ref()?;
    let (form, load_ms) = match s.chosen {
        infer_spec::engine::EngineFormat::TractNnefTar => ("nnef", s.nnef_ms.unwrap_or(s.onnx_ms)),
        _ => ("onnx", s.onnx_ms),
    };
    let warm_ms: f64 = p.batches.iter().map(|b| b.median_us / 1000.0).sum();
    let total_s = (load_ms + warm_ms) / 1000.0;
    Some(StartupMeasurement {
        seconds: total_s,
        source: format!(
            "engine profile on {}: load {load_ms:.0} ms ({form}) + warm-up of {} batch sizes {warm_ms:.0} ms",
            p.measured_on,
            p.batches.len()
        ),
    })
}

/// The start-up of several engines loaded one after the other (a bundle's models): the sum,
/// each source named; `None` when there is none.
pub(crate) fn startup_of_all(
    all: impl Iterator<Item = StartupMeasurement>,
) -> Option<StartupMeasurement> {
    all.reduce(|a, b| StartupMeasurement {
        seconds: a.seconds + b.seconds,
        source: format!("{}; {}", a.source, b.source),
    })
}

/// The recipe a bundle's pod is sized from: the first model's, named, versioned, imaged and
/// deployed as the bundle file says (`[bundle]`, `[image]`, `[deploy]`); its batching bounds
/// those of every model: the longest queue delay (the queue-time autoscaling target) and the
/// longest deadline (none when any model has none), which the drain must cover.
pub(crate) fn bundle_recipe(bundle: &crate::recipe::bundle::Bundle, recipes: &[&Recipe]) -> Recipe {
    let mut r = bundle.as_recipe(recipes[0]);
    r.batching.max_queue_delay_us = recipes
        .iter()
        .map(|m| m.batching.max_queue_delay_us)
        .max()
        .unwrap_or(0);
    r.batching.default_timeout_ms = if recipes.iter().any(|m| m.batching.default_timeout_ms == 0) {
        0
    } else {
        recipes
            .iter()
            .map(|m| m.batching.default_timeout_ms)
            .max()
            .unwrap_or(0)
    };
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        for (q, m) in [
            ("2", Some(2000)),
            ("500m", Some(500)),
            ("1.5", Some(1500)),
            ("x", None),
            ("0", None),
        ] {
            assert_eq!(cpu_millis(q), m, "{q}");
        }
        for (q, m) in [
            ("4Gi", Some(4096)),
            ("512Mi", Some(512)),
            ("1G", Some(954)),
            ("1048576", Some(1)),
            ("3Xi", None),
            ("", None),
        ] {
            assert_eq!(memory_mib(q), m, "{q}");
        }
    }
}
