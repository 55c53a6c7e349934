//! `infer-build deploy`: Kubernetes YAML per target (Deployment, Service, HPA, pre-pull
//! DaemonSet), one file per target in `--out` (default `./k8s/<model>`): the flags as a
//! [`DeployRequest`] for [`crate::pipeline::deploy`](fn@crate::pipeline::deploy).

use std::path::PathBuf;

use clap::Args;

use super::MatrixArgs;
use crate::error::Error;
use crate::pipeline::{DeployRequest, GpuShareChoice};
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

pub(super) fn run(a: DeployArgs) -> Result<(), Error> {
    let req = DeployRequest {
        input: a.input,
        matrix: a.matrix.matrix,
        targets: a.targets,
        out: a.out,
        layout: a.layout,
        image: a.image,
        profiles: a.profiles,
        startup_seconds: a.startup_seconds,
        gpu_share: match a.gpu_share.as_str() {
            "mig" => GpuShareChoice::Mig,
            "time-sliced" => GpuShareChoice::TimeSliced,
            "mps" => GpuShareChoice::Mps,
            _ => GpuShareChoice::Whole,
        },
        grpc_probe: a.grpc_probe,
        image_layout: a.image_layout,
    };
    let deployed = crate::pipeline::deploy(&req, &super::stderr_notes())?;
    for (target, path) in &deployed.files {
        eprintln!("deploy: {target} -> {}", path.display());
    }
    Ok(())
}
