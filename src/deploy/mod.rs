//! Kubernetes manifests for one built target: a Deployment, a Service, a HorizontalPodAutoscaler
//! and a pre-pull DaemonSet, written as one multi-document YAML file per target.
//!
//! `deploy` owns the translation from *measured and declared numbers* (engine start-up time,
//! drain delay, request deadlines, recipe resources) into Kubernetes settings, and writes the
//! arithmetic next to every derived value as a YAML comment, so a reviewer can check it.
//!
//! It does not read files, talk to a cluster or look at the clock: [`render`] takes a
//! [`DeploySpec`] (plain values gathered by the CLI from the recipe, the build plan and the
//! engine profile) and returns bytes. Same spec, same bytes.
//!
//! Invariants: every workload gets Guaranteed QoS (requests equal limits for every resource),
//! runs non-root on a read-only root filesystem without privilege escalation or capabilities,
//! and has a memory-backed `/dev/shm`; GPU targets request `nvidia.com/gpu` and are pinned to
//! nodes by GPU feature discovery labels.

pub(crate) mod from_plan;
pub(crate) mod yaml;

use yaml::{Map, Node};

/// Errors of the `deploy` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A value in the spec cannot be expressed in a valid manifest.
    #[error("deploy: {what} for target `{target}`")]
    Invalid { target: String, what: String },
    #[error("deploy: cannot write {path}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("deploy: {0}")]
    Input(String),
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, Error::Write { .. })
    }
}

/// The port `infer-serve` listens on (8000 by default).
pub(crate) const SERVE_PORT: u16 = infer_spec::runtime::DEFAULT_HTTP_PORT;
/// The port `infer-serve` answers gRPC on (`--grpc-port`; 8001 by default, as Triton).
pub(crate) const GRPC_PORT: u16 = infer_spec::runtime::DEFAULT_GRPC_PORT;
/// Safety factor applied to a measured start-up time for the startupProbe budget.
pub(crate) const DEFAULT_STARTUP_SAFETY: f64 = 3.0;
/// Start-up budget used when no start-up time has been measured (the field notes' 30 × 10 s).
pub(crate) const DEFAULT_STARTUP_BUDGET_S: u64 = 300;
/// Lower bound of a startup budget derived from a measurement: a fast local measurement says
/// little about a cold node (image layers, page cache), so never go under this.
pub(crate) const MIN_STARTUP_BUDGET_S: u64 = 30;
/// startupProbe period.
pub(crate) const STARTUP_PERIOD_S: u64 = 5;
/// Slack added to the termination grace period on top of drain and the slowest request.
pub(crate) const GRACE_SLACK_S: u64 = 5;
/// The pause image the pre-pull DaemonSet keeps running once the image is on the node.
pub(crate) const PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

/// Which GPUs a target runs on, as GPU feature discovery labels them.
#[derive(Debug, Clone, PartialEq)]
pub enum GpuSelector {
    /// Any GPU of at least this compute capability major (hardware-compatible engines,
    /// TensorRT's `ampere+` level).
    ComputeAtLeast { major: u32 },
    /// Any GPU of this compute capability (`nvidia.com/gpu.compute.major/minor`): an engine is
    /// bound to the SM architecture, not to the product.
    Compute { major: u32, minor: u32 },
    /// Only these products (`nvidia.com/gpu.product`), e.g. when the engine was built for one
    /// product's hardware-compatibility level.
    Products(Vec<String>),
}

/// How a replica gets its GPU.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum GpuShare {
    /// A whole GPU (`nvidia.com/gpu`).
    #[default]
    Whole,
    /// A MIG slice of `product` (`nvidia.com/mig-<profile>`, the device plugin's `mixed`
    /// strategy), the smallest profile holding `need_gb` with the headroom.
    Mig {
        profile: String,
        product: String,
        need_gb: f64,
    },
    /// A time-sliced share (`nvidia.com/gpu.shared`: the device plugin's time-slicing with
    /// `renameByDefault`).
    TimeSliced,
    /// An MPS share (`nvidia.com/gpu.shared`: the device plugin's MPS sharing).
    Mps,
}

impl GpuShare {
    /// The extended resource a replica asks for.
    pub fn resource(&self) -> String {
        match self {
            GpuShare::Whole => "nvidia.com/gpu".into(),
            GpuShare::Mig { profile, .. } => format!("nvidia.com/mig-{profile}"),
            GpuShare::TimeSliced | GpuShare::Mps => "nvidia.com/gpu.shared".into(),
        }
    }

    /// What the share needs on the cluster and does not isolate, for the YAML's comments.
    pub fn caveats(&self) -> Vec<String> {
        match self {
            GpuShare::Whole => Vec::new(),
            GpuShare::Mig { profile, product, need_gb } => vec![
                format!("GPU: a MIG slice {profile} of a {product}, the smallest holding the model's estimated {need_gb:.1} GB with 10% free; MIG isolates memory, compute and faults between slices"),
                "needs nodes with MIG enabled in that profile and the NVIDIA device plugin's `mixed` MIG strategy (one resource per profile); with the `single` strategy ask for nvidia.com/gpu instead".into(),
            ],
            GpuShare::TimeSliced => vec![
                "GPU: a time-sliced share; the NVIDIA device plugin must advertise nvidia.com/gpu.shared (sharing.timeSlicing with renameByDefault: true)".into(),
                "time-slicing isolates nothing: replicas on one GPU share its memory (one can take it all and fail the others) and take turns on its compute, so latency grows with every neighbour".into(),
            ],
            GpuShare::Mps => vec![
                "GPU: an MPS share; the NVIDIA device plugin must advertise nvidia.com/gpu.shared (sharing.mps with renameByDefault: true)".into(),
                "MPS runs clients side by side with a memory limit each, but a fatal GPU fault in one client can take down the others on that GPU".into(),
            ],
        }
    }
}

/// The metric the HPA scales on.
#[derive(Debug, Clone, PartialEq)]
pub enum Autoscale {
    /// Average queue time per request (seconds) exported by `infer-serve` and exposed to the
    /// HPA by prometheus-adapter as the per-pod custom metric `metric`.
    QueueTime { metric: String, target_ms: f64 },
    /// GPU utilisation (percent) from the DCGM exporter, exposed by prometheus-adapter.
    GpuUtilisation { metric: String, target_percent: u32 },
}

/// A start-up time measured by the engine stage, with where it comes from.
#[derive(Debug, Clone, PartialEq)]
pub struct StartupMeasurement {
    pub seconds: f64,
    /// Shown in the comment, e.g. "engine profile: load 2.1 s + warm-up 0.4 s".
    pub source: String,
}

/// Everything `render` needs for one target.
#[derive(Debug, Clone, PartialEq)]
pub struct DeploySpec {
    pub model: String,
    pub model_version: String,
    pub target: String,
    /// Image repository, e.g. `registry.example.com/ml/resnet50`.
    pub repository: String,
    /// The target's tag.
    pub tag: String,
    /// The manifest digest (`sha256:…`) when the image has been built.
    pub digest: Option<String>,
    /// `None` for CPU targets.
    pub gpu: Option<GpuSelector>,
    /// CPU targets: the CPU features the engine computes fastest with, any one of them
    /// (`cpu-bf16`: `avx512-bf16`, `amx`; the plan's, from `matrix/cpus.toml`); nodes that have
    /// one are preferred, none required (the runtime runs slower elsewhere).
    pub cpu_prefers: Vec<crate::plan::CpuFeaturePin>,
    pub gpu_count: u32,
    /// How each replica gets its GPU (GPU targets).
    pub gpu_share: GpuShare,
    /// CPU in millicores (requests = limits).
    pub cpu_millis: u64,
    /// Memory in MiB (requests = limits); includes the /dev/shm size, which counts against it.
    pub memory_mib: u64,
    /// Size of the memory-backed /dev/shm in MiB.
    pub shm_mib: u64,
    /// The non-root user id the image runs as.
    pub run_as_user: i64,
    pub replicas_min: u32,
    pub replicas_max: u32,
    pub startup: Option<StartupMeasurement>,
    pub startup_safety: f64,
    /// preStop sleep: time for endpoints to drop the pod before SIGTERM.
    pub prestop_s: u64,
    /// The runtime's own drain delay after SIGTERM (serving while unready).
    pub runtime_drain_s: u64,
    /// The longest deadline a request can have (recipe default timeout or its maximum), ms.
    pub longest_deadline_ms: u64,
    /// True when no deadline is configured and `longest_deadline_ms` is an assumption.
    pub deadline_assumed: bool,
    pub autoscale: Autoscale,
    /// The readinessProbe asks gRPC health (`grpc.health.v1`) instead of `/v2/health/ready`.
    pub grpc_readiness: bool,
    /// The split layout: the container runs the runtime image and the model is an image
    /// volume; `None`: the combined image.
    pub split: Option<SplitImages>,
}

/// The manifest digests of a target's split pair, when built (tags `<tag>-runtime` and
/// `<tag>-model`, `crate::assemble::split::tags`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitImages {
    pub runtime_digest: Option<String>,
    pub model_digest: Option<String>,
}

/// Image volumes as the YAML's comment states them: the Kubernetes and container-runtime
/// versions that mount one.
pub(crate) const IMAGE_VOLUME_NEEDS: &str = "a Kubernetes image volume: beta and on by default since Kubernetes 1.35 (1.33-1.34: feature gate ImageVolume), GA in 1.36; containerd 2.1+ or CRI-O 1.31+. Older clusters: `infer-build deploy --image-layout combined` runs the combined image instead";

impl DeploySpec {
    /// The DNS-1123 name of this target's objects: `<model>-<target>`, at most 63 characters.
    pub fn name(&self) -> String {
        dns_label(&format!("{}-{}", self.model, self.target))
    }

    /// The image reference: by digest when known, else by tag.
    pub fn image(&self) -> String {
        self.reference(&self.tag, self.digest.as_deref())
    }

    /// The image the container runs: the combined image, or the split layout's runtime image.
    pub(crate) fn container_image(&self) -> (String, Option<&str>) {
        match &self.split {
            None => (self.image(), self.digest.as_deref()),
            Some(s) => {
                let [runtime, _, _] = crate::assemble::split::tags(&self.tag);
                (
                    self.reference(&runtime, s.runtime_digest.as_deref()),
                    s.runtime_digest.as_deref(),
                )
            }
        }
    }

    /// The split layout's model image (what the image volume mounts).
    pub(crate) fn model_image(&self) -> Option<(String, Option<&str>)> {
        let s = self.split.as_ref()?;
        let [_, model, _] = crate::assemble::split::tags(&self.tag);
        Some((
            self.reference(&model, s.model_digest.as_deref()),
            s.model_digest.as_deref(),
        ))
    }

    fn reference(&self, tag: &str, digest: Option<&str>) -> String {
        match digest {
            Some(d) => format!("{}@{}", self.repository, d),
            None => format!("{}:{}", self.repository, tag),
        }
    }
}

/// The image volume holding the split layout's model, mounted read-only where the runtime
/// image looks: `(volume, mount)`.
fn model_volume(spec: &DeploySpec) -> Option<(Node, Node)> {
    let (reference, digest) = spec.model_image()?;
    let pinned = match digest {
        Some(_) => "the model image, pinned by digest".to_string(),
        None => {
            "the model image by tag: no digest known yet; pass --layout DIR (the build's) to pin it"
                .to_string()
        }
    };
    let volume = Map::new()
        .kv_c(&[pinned, IMAGE_VOLUME_NEEDS.to_string()], "name", "model")
        .kv(
            "image",
            Map::new()
                .kv("reference", reference)
                .kv("pullPolicy", "IfNotPresent"),
        )
        .into();
    let mount = Map::new()
        .kv("name", "model")
        .kv("mountPath", crate::assemble::split::MOUNT)
        .kv("readOnly", true)
        .into();
    Some((volume, mount))
}

/// Lowercase, `[a-z0-9-]`, no leading/trailing dash, at most 63 characters.
pub(crate) fn dns_label(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    let mut out: String = out.trim_matches('-').chars().take(63).collect();
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        "infer".to_string()
    } else {
        out
    }
}

/// The startupProbe numbers and the sentence that explains them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StartupBudget {
    pub period_s: u64,
    pub failure_threshold: u64,
    pub explanation: Vec<String>,
}

/// Derive the startupProbe from a measured start-up time × safety factor, or a stated default.
pub(crate) fn startup_budget(m: Option<&StartupMeasurement>, safety: f64) -> StartupBudget {
    let period = STARTUP_PERIOD_S;
    match m {
        Some(m) if m.seconds.is_finite() && m.seconds >= 0.0 => {
            let raw = m.seconds * safety;
            let budget = (raw.ceil() as u64).max(MIN_STARTUP_BUDGET_S);
            let threshold = budget.div_ceil(period);
            let floor = if (raw.ceil() as u64) < MIN_STARTUP_BUDGET_S {
                format!(", raised to the {MIN_STARTUP_BUDGET_S} s floor")
            } else {
                String::new()
            };
            StartupBudget {
                period_s: period,
                failure_threshold: threshold,
                explanation: vec![
                    format!(
                        "start-up budget: measured {:.1} s ({}) x safety {} = {:.1} s{floor}",
                        m.seconds, m.source, safety, raw
                    ),
                    format!(
                        "-> failureThreshold {threshold} x periodSeconds {period} = {} s",
                        threshold * period
                    ),
                ],
            }
        }
        _ => {
            let threshold = DEFAULT_STARTUP_BUDGET_S.div_ceil(period);
            StartupBudget {
                period_s: period,
                failure_threshold: threshold,
                explanation: vec![
                    "start-up budget: no start-up time measured in the engine profile;".to_string(),
                    format!(
                        "default {DEFAULT_STARTUP_BUDGET_S} s -> failureThreshold {threshold} x periodSeconds {period} = {} s",
                        threshold * period
                    ),
                    "build the engine (`infer-build engine`) to size this from a measurement".to_string(),
                ],
            }
        }
    }
}

/// terminationGracePeriodSeconds and its explanation.
pub(crate) fn grace_period(spec: &DeploySpec) -> (u64, Vec<String>) {
    let slowest = spec.longest_deadline_ms.div_ceil(1000);
    let total = spec.prestop_s + spec.runtime_drain_s + slowest + GRACE_SLACK_S;
    let mut why = Vec::new();
    if spec.deadline_assumed {
        why.push(format!(
            "the recipe sets no request deadline (batching.default_timeout_ms = 0): {} ms assumed",
            spec.longest_deadline_ms
        ));
    }
    (
        total,
        [why, vec![
            format!(
                "grace period: preStop {} s + runtime drain {} s + slowest request {} s (deadline {} ms) + slack {} s = {} s",
                spec.prestop_s, spec.runtime_drain_s, slowest, spec.longest_deadline_ms, GRACE_SLACK_S, total
            ),
        ]].concat(),
    )
}

fn labels(spec: &DeploySpec) -> Map {
    Map::new()
        .kv("app.kubernetes.io/name", dns_label(&spec.model))
        .kv("app.kubernetes.io/instance", spec.name())
        .kv("app.kubernetes.io/component", "inference")
        .kv("app.kubernetes.io/managed-by", "infer-build")
        .kv("infer-build.dev/target", dns_label(&spec.target))
}

fn selector_labels(spec: &DeploySpec) -> Map {
    Map::new()
        .kv("app.kubernetes.io/name", dns_label(&spec.model))
        .kv("app.kubernetes.io/instance", spec.name())
}

fn metadata(spec: &DeploySpec, name: &str) -> Map {
    Map::new().kv("name", name).kv(
        "labels",
        labels(spec).kv(
            "app.kubernetes.io/version",
            label_value(&spec.model_version),
        ),
    )
}

/// A label value: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn label_value(s: &str) -> String {
    let v: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

fn node_affinity(gpu: &GpuSelector) -> Node {
    let exprs: Vec<Node> = match gpu {
        GpuSelector::Compute { major, minor } => vec![
            Map::new()
                .kv("key", "nvidia.com/gpu.compute.major")
                .kv("operator", "In")
                .kv("values", vec![Node::str(major.to_string())])
                .into(),
            Map::new()
                .kv("key", "nvidia.com/gpu.compute.minor")
                .kv("operator", "In")
                .kv("values", vec![Node::str(minor.to_string())])
                .into(),
        ],
        GpuSelector::ComputeAtLeast { major } => vec![Map::new()
            .kv("key", "nvidia.com/gpu.compute.major")
            .kv("operator", "Gt")
            .kv(
                "values",
                vec![Node::str(major.saturating_sub(1).to_string())],
            )
            .into()],
        GpuSelector::Products(products) => {
            let mut p = products.clone();
            p.sort();
            p.dedup();
            vec![Map::new()
                .kv("key", "nvidia.com/gpu.product")
                .kv("operator", "In")
                .kv("values", p.into_iter().map(Node::Str).collect::<Vec<_>>())
                .into()]
        }
    };
    let why = match gpu {
        GpuSelector::Compute { major, minor } => format!(
            "the engine is built for compute capability {major}.{minor} (sm_{major}{minor}); GPU feature discovery labels the nodes"
        ),
        GpuSelector::ComputeAtLeast { major } => format!(
            "the engine is hardware-compatible: any GPU of compute capability {major}.0 or newer"
        ),
        GpuSelector::Products(_) => {
            "the engine is built for these GPU products; GPU feature discovery labels the nodes"
                .to_string()
        }
    };
    Map::new()
        .kv_c(
            &[why],
            "nodeAffinity",
            Map::new().kv(
                "requiredDuringSchedulingIgnoredDuringExecution",
                Map::new().kv(
                    "nodeSelectorTerms",
                    vec![Map::new().kv("matchExpressions", exprs).into()],
                ),
            ),
        )
        .into()
}

/// A preference for nodes with any of `features` (their Node Feature Discovery labels): one
/// term each, equal weights.
fn cpu_affinity(features: &[crate::plan::CpuFeaturePin]) -> Option<Node> {
    if features.is_empty() {
        return None;
    }
    let terms: Vec<Node> = features
        .iter()
        .map(|f| {
            Map::new()
                .kv("weight", 100u32)
                .kv(
                    "preference",
                    Map::new().kv(
                        "matchExpressions",
                        vec![Map::new()
                            .kv("key", f.nfd_label.as_str())
                            .kv("operator", "In")
                            .kv("values", vec![Node::str("true")])
                            .into()],
                    ),
                )
                .into()
        })
        .collect();
    let names: Vec<&str> = features.iter().map(|f| f.name.as_str()).collect();
    let why = format!(
        "the engine computes fastest on CPUs with {}: preferred, not required (elsewhere it runs, slower, and the runtime warns); Node Feature Discovery labels the nodes",
        names.join(" or ")
    );
    Some(
        Map::new()
            .kv_c(
                &[why],
                "nodeAffinity",
                Map::new().kv("preferredDuringSchedulingIgnoredDuringExecution", terms),
            )
            .into(),
    )
}

fn gpu_tolerations() -> Node {
    vec![Map::new()
        .kv("key", "nvidia.com/gpu")
        .kv("operator", "Exists")
        .kv("effect", "NoSchedule")
        .into()]
    .into()
}

fn resources(spec: &DeploySpec) -> Node {
    let mut m = Map::new()
        .kv("cpu", format!("{}m", spec.cpu_millis))
        .kv("memory", format!("{}Mi", spec.memory_mib));
    if spec.gpu.is_some() {
        m = m.kv(&spec.gpu_share.resource(), spec.gpu_count.to_string());
    }
    Map::new().kv("requests", m.clone()).kv("limits", m).into()
}

fn http_probe(path: &str, period: u64, threshold: u64, timeout: u64) -> Map {
    Map::new()
        .kv("httpGet", Map::new().kv("path", path).kv("port", "http"))
        .kv("periodSeconds", period)
        .kv("timeoutSeconds", timeout)
        .kv("failureThreshold", threshold)
}

/// A probe on gRPC health (`grpc.health.v1.Health/Check`, service ""), Kubernetes ≥ 1.27.
fn grpc_probe(period: u64, threshold: u64, timeout: u64) -> Map {
    Map::new()
        .kv("grpc", Map::new().kv("port", u32::from(GRPC_PORT)))
        .kv("periodSeconds", period)
        .kv("timeoutSeconds", timeout)
        .kv("failureThreshold", threshold)
}

fn container_security() -> Node {
    Map::new()
        .kv("allowPrivilegeEscalation", false)
        .kv("privileged", false)
        .kv("readOnlyRootFilesystem", true)
        .kv("runAsNonRoot", true)
        .kv(
            "capabilities",
            Map::new().kv("drop", vec![Node::str("ALL")]),
        )
        .into()
}

fn pod_security(uid: i64) -> Node {
    Map::new()
        .kv("runAsNonRoot", true)
        .kv("runAsUser", uid)
        .kv("runAsGroup", uid)
        .kv("fsGroup", uid)
        .kv("seccompProfile", Map::new().kv("type", "RuntimeDefault"))
        .into()
}

/// The Deployment.
#[allow(
    clippy::too_many_lines,
    reason = "one Kubernetes object, written in the order of its YAML"
)]
pub fn deployment(spec: &DeploySpec) -> Node {
    let name = spec.name();
    let startup = startup_budget(spec.startup.as_ref(), spec.startup_safety);
    let (grace, grace_why) = grace_period(spec);
    let (image, digest) = spec.container_image();
    let what = if spec.split.is_some() {
        "the runtime image (no model: it serves the one mounted at /mnt/models)"
    } else {
        "the image"
    };
    let image_comment = match digest {
        Some(_) => format!("{what}, pinned by digest (tag {})", spec.tag),
        None => format!(
            "{what} by tag: no digest known yet; pass --image REPO@sha256:... or --layout DIR (or build first) to pin {}",
            spec.tag
        ),
    };
    let volume = model_volume(spec);
    let container = Map::new()
        .kv("name", "infer-serve")
        .kv_c(&[image_comment], "image", image)
        .kv("imagePullPolicy", "IfNotPresent")
        .kv(
            "ports",
            vec![
                Map::new()
                    .kv("name", "http")
                    .kv("containerPort", u32::from(SERVE_PORT))
                    .kv("protocol", "TCP")
                    .into(),
                Map::new()
                    .kv("name", "grpc")
                    .kv("containerPort", u32::from(GRPC_PORT))
                    .kv("protocol", "TCP")
                    .into(),
            ],
        )
        .kv_c(
            &[format!(
                "Guaranteed QoS: requests = limits for every resource (no CPU throttling jitter from Burstable); memory includes the {} Mi /dev/shm",
                spec.shm_mib
            )]
            .into_iter()
            .chain(if spec.gpu.is_some() {
                spec.gpu_share.caveats()
            } else {
                Vec::new()
            })
            .collect::<Vec<_>>(),
            "resources",
            resources(spec),
        )
        .kv_c(&startup.explanation, "startupProbe", http_probe("/v2/health/ready", startup.period_s, startup.failure_threshold, 2))
        .kv_c(
            &[if spec.grpc_readiness {
                "ready = engine loaded and warm-up done; gRPC health says NOT_SERVING while draining"
                    .to_string()
            } else {
                "ready = engine loaded and warm-up done; 503 while draining".to_string()
            }],
            "readinessProbe",
            if spec.grpc_readiness {
                grpc_probe(5, 2, 2)
            } else {
                http_probe("/v2/health/ready", 5, 2, 2)
            },
        )
        .kv_c(
            &["live = the process answers; never depends on the model".to_string()],
            "livenessProbe",
            http_probe("/v2/health/live", 10, 3, 2),
        )
        .kv_c(
            &[format!(
                "keep serving {} s after the pod leaves the endpoints, before SIGTERM (sleep action: the image has no shell; Kubernetes >= 1.30)",
                spec.prestop_s
            )],
            "lifecycle",
            Map::new().kv(
                "preStop",
                Map::new().kv("sleep", Map::new().kv("seconds", spec.prestop_s)),
            ),
        )
        .kv("securityContext", container_security())
        .kv(
            "volumeMounts",
            [
                Map::new().kv("name", "dshm").kv("mountPath", "/dev/shm").into(),
                Map::new().kv("name", "tmp").kv("mountPath", "/tmp").into(),
            ]
            .into_iter()
            .chain(volume.as_ref().map(|(_, mount)| mount.clone()))
            .collect::<Vec<Node>>(),
        );

    let mut pod_spec = Map::new();
    if let Some(gpu) = &spec.gpu {
        pod_spec = pod_spec
            .kv("affinity", node_affinity(gpu))
            .kv("tolerations", gpu_tolerations());
    } else if let Some(a) = cpu_affinity(&spec.cpu_prefers) {
        pod_spec = pod_spec.kv("affinity", a);
    }
    pod_spec = pod_spec
        .kv_c(&grace_why, "terminationGracePeriodSeconds", grace)
        .kv("automountServiceAccountToken", false)
        .kv("enableServiceLinks", false)
        .kv("securityContext", pod_security(spec.run_as_user))
        .kv("containers", vec![container.into()])
        .kv(
            "volumes",
            vec![
                Map::new()
                    .kv_c(
                        &["memory-backed /dev/shm: the container default is 64 MB (\"Bus error\")".to_string()],
                        "name",
                        "dshm",
                    )
                    .kv(
                        "emptyDir",
                        Map::new()
                            .kv("medium", "Memory")
                            .kv("sizeLimit", format!("{}Mi", spec.shm_mib)),
                    )
                    .into(),
                Map::new()
                    .kv_c(
                        &["writable scratch on a read-only root filesystem".to_string()],
                        "name",
                        "tmp",
                    )
                    .kv("emptyDir", Map::new().kv("sizeLimit", "64Mi"))
                    .into(),
            ]
            .into_iter()
            .chain(volume.map(|(v, _)| v))
            .collect::<Vec<Node>>(),
        );

    Map::new()
        .kv("apiVersion", "apps/v1")
        .kv("kind", "Deployment")
        .kv("metadata", metadata(spec, &name))
        .kv(
            "spec",
            Map::new()
                .kv_c(
                    &[
                        "the HorizontalPodAutoscaler owns the count from here; this is the floor"
                            .to_string(),
                    ],
                    "replicas",
                    spec.replicas_min,
                )
                .kv("revisionHistoryLimit", 3i64)
                .kv(
                    "selector",
                    Map::new().kv("matchLabels", selector_labels(spec)),
                )
                .kv(
                    "strategy",
                    Map::new().kv("type", "RollingUpdate").kv(
                        "rollingUpdate",
                        Map::new().kv("maxSurge", 1i64).kv("maxUnavailable", 0i64),
                    ),
                )
                .kv(
                    "template",
                    Map::new()
                        .kv(
                            "metadata",
                            Map::new().kv("labels", labels(spec)).kv(
                                "annotations",
                                Map::new()
                                    .kv("prometheus.io/scrape", "true")
                                    .kv("prometheus.io/port", SERVE_PORT.to_string())
                                    .kv("prometheus.io/path", "/metrics"),
                            ),
                        )
                        .kv("spec", pod_spec),
                ),
        )
        .into()
}

/// The Service.
pub fn service(spec: &DeploySpec) -> Node {
    Map::new()
        .kv("apiVersion", "v1")
        .kv("kind", "Service")
        .kv("metadata", metadata(spec, &spec.name()))
        .kv(
            "spec",
            Map::new()
                .kv("type", "ClusterIP")
                .kv("selector", selector_labels(spec))
                .kv(
                    "ports",
                    vec![
                        Map::new()
                            .kv("name", "http")
                            .kv("port", u32::from(SERVE_PORT))
                            .kv("targetPort", "http")
                            .kv("protocol", "TCP")
                            .into(),
                        Map::new()
                            .kv("name", "grpc")
                            .kv("port", u32::from(GRPC_PORT))
                            .kv("targetPort", "grpc")
                            .kv("protocol", "TCP")
                            // Cleartext HTTP/2, for proxies and meshes that pick a protocol.
                            .kv("appProtocol", "kubernetes.io/h2c")
                            .into(),
                    ],
                ),
        )
        .into()
}

/// The HorizontalPodAutoscaler (autoscaling/v2) on a Prometheus metric.
pub(crate) fn hpa(spec: &DeploySpec) -> Node {
    let (metric, why) = match &spec.autoscale {
        Autoscale::QueueTime { metric, target_ms } => {
            let target_us = (target_ms * 1000.0).round().max(1.0) as u64;
            (
                Map::new().kv("type", "Pods").kv(
                    "pods",
                    Map::new()
                        .kv("metric", Map::new().kv("name", metric.as_str()))
                        .kv(
                            "target",
                            Map::new()
                                .kv("type", "AverageValue")
                                .kv("averageValue", format!("{target_us}u")),
                        ),
                ),
                vec![
                    format!(
                        "scale on queue time per request (seconds), a prometheus-adapter rule over infer-serve's nv_inference_queue_duration_us / nv_inference_request_success rates; target {target_ms} ms"
                    ),
                    "GPU-bound services must not scale on CPU".to_string(),
                ],
            )
        }
        Autoscale::GpuUtilisation {
            metric,
            target_percent,
        } => (
            Map::new().kv("type", "Pods").kv(
                "pods",
                Map::new()
                    .kv("metric", Map::new().kv("name", metric.as_str()))
                    .kv(
                        "target",
                        Map::new()
                            .kv("type", "AverageValue")
                            .kv("averageValue", target_percent.to_string()),
                    ),
            ),
            vec![
                format!(
                    "scale on GPU utilisation (DCGM exporter via prometheus-adapter): out at {target_percent}% of a replica's limit"
                ),
                "GPU-bound services must not scale on CPU".to_string(),
            ],
        ),
    };
    let policy = |window: u64, kind: &str, value: i64, period: i64| -> Node {
        Map::new()
            .kv("stabilizationWindowSeconds", window)
            .kv(
                "policies",
                vec![Map::new()
                    .kv("type", kind)
                    .kv("value", value)
                    .kv("periodSeconds", period)
                    .into()],
            )
            .into()
    };
    Map::new()
        .kv("apiVersion", "autoscaling/v2")
        .kv("kind", "HorizontalPodAutoscaler")
        .kv("metadata", metadata(spec, &spec.name()))
        .kv(
            "spec",
            Map::new()
                .kv(
                    "scaleTargetRef",
                    Map::new()
                        .kv("apiVersion", "apps/v1")
                        .kv("kind", "Deployment")
                        .kv("name", spec.name()),
                )
                .kv("minReplicas", spec.replicas_min)
                .kv("maxReplicas", spec.replicas_max)
                .kv_c(&why, "metrics", vec![metric.into()])
                .kv_c(
                    &["react within a minute, give capacity back slowly (5 minutes)".to_string()],
                    "behavior",
                    Map::new()
                        .kv("scaleUp", policy(60, "Pods", 2, 60))
                        .kv("scaleDown", policy(300, "Pods", 1, 60)),
                ),
        )
        .into()
}

/// The pre-pull DaemonSet: pulls the image on every node the target can run on, so scale-out
/// does not wait for a multi-gigabyte pull.
pub(crate) fn prepull(spec: &DeploySpec) -> Node {
    let name = dns_label(&format!("{}-prepull", spec.name()));
    let sel = Map::new()
        .kv("app.kubernetes.io/name", dns_label(&spec.model))
        .kv("app.kubernetes.io/instance", name.clone());
    let volume = model_volume(spec);
    let tiny = Map::new().kv("cpu", "10m").kv("memory", "16Mi");
    let tiny_res: Node = Map::new()
        .kv("requests", tiny.clone())
        .kv("limits", tiny)
        .into();
    let mut pod_spec = Map::new();
    if let Some(gpu) = &spec.gpu {
        pod_spec = pod_spec
            .kv("affinity", node_affinity(gpu))
            .kv("tolerations", gpu_tolerations());
    }
    // A CPU preference places nothing: the pre-pull runs on every node that may serve.
    pod_spec = pod_spec
        .kv("automountServiceAccountToken", false)
        .kv("securityContext", pod_security(spec.run_as_user))
        .kv(
            "initContainers",
            vec![Map::new()
                .kv("name", "prepull")
                .kv_c(
                    &["pulling is the point; the image's entrypoint only prints its version and exits".to_string()],
                    "image",
                    spec.container_image().0,
                )
                .kv("imagePullPolicy", "IfNotPresent")
                .kv("args", vec![Node::str("--version")])
                .kv("resources", tiny_res.clone())
                .kv("securityContext", container_security())
                .into()],
        )
        .kv(
            "containers",
            vec![Map::new()
                .kv("name", "pause")
                .kv("image", PAUSE_IMAGE)
                .kv("resources", tiny_res)
                .kv("securityContext", container_security())
                .opt(
                    "volumeMounts",
                    volume.as_ref().map(|(_, m)| vec![m.clone()]),
                )
                .into()],
        );
    // The split layout: mounting the model image is what pulls it onto the node.
    if let Some((v, _)) = volume {
        pod_spec = pod_spec.kv("volumes", vec![v]);
    }
    Map::new()
        .kv("apiVersion", "apps/v1")
        .kv("kind", "DaemonSet")
        .kv("metadata", metadata(spec, &name))
        .kv(
            "spec",
            Map::new()
                .kv("selector", Map::new().kv("matchLabels", sel.clone()))
                .kv(
                    "template",
                    Map::new()
                        .kv(
                            "metadata",
                            Map::new()
                                .kv("labels", sel.kv("app.kubernetes.io/component", "prepull")),
                        )
                        .kv("spec", pod_spec),
                ),
        )
        .into()
}

/// Validate a spec: what Kubernetes would refuse, refused here with the target named.
pub fn validate(spec: &DeploySpec) -> Result<(), Error> {
    let bad = |what: String| {
        Err(Error::Invalid {
            target: spec.target.clone(),
            what,
        })
    };
    if spec.run_as_user <= 0 {
        return bad(format!(
            "the image user {} must be a non-root uid",
            spec.run_as_user
        ));
    }
    if spec.replicas_min == 0 || spec.replicas_min > spec.replicas_max {
        return bad(format!(
            "replicas min {} must be at least 1 and at most max {}",
            spec.replicas_min, spec.replicas_max
        ));
    }
    if spec.cpu_millis == 0 || spec.memory_mib == 0 {
        return bad("cpu and memory must be positive".into());
    }
    if spec.shm_mib >= spec.memory_mib {
        return bad(format!(
            "/dev/shm ({} Mi) must be smaller than the memory limit ({} Mi) it counts against",
            spec.shm_mib, spec.memory_mib
        ));
    }
    if spec.gpu.is_some() && spec.gpu_count == 0 {
        return bad("a GPU target needs at least one GPU".into());
    }
    if !(spec.startup_safety.is_finite() && spec.startup_safety >= 1.0) {
        return bad(format!(
            "startup safety factor {} must be at least 1",
            spec.startup_safety
        ));
    }
    let split = spec.split.as_ref();
    let digests = [
        spec.digest.as_ref(),
        split.and_then(|s| s.runtime_digest.as_ref()),
        split.and_then(|s| s.model_digest.as_ref()),
    ];
    for d in digests.into_iter().flatten() {
        if crate::oci::hex_of(d).is_none() {
            return bad(format!(
                "image digest `{d}` is not sha256:<64 lowercase hex>"
            ));
        }
    }
    Ok(())
}

/// The multi-document YAML for one target: Deployment, Service, HPA, pre-pull DaemonSet.
pub fn render(spec: &DeploySpec) -> Result<String, Error> {
    validate(spec)?;
    let mut out = format!(
        "# Generated by infer-build deploy for model {} {}, target {}.\n# Apply with: kubectl apply -f {}.yaml\n",
        spec.model,
        spec.model_version,
        spec.target,
        spec.name()
    );
    for doc in [deployment(spec), service(spec), hpa(spec), prepull(spec)] {
        out.push_str("---\n");
        out.push_str(&yaml::render(&doc));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn spec() -> DeploySpec {
        DeploySpec {
            model: "ResNet50".into(),
            model_version: "1.4.0".into(),
            target: "sm89-fp16".into(),
            repository: "registry.example.com/ml/resnet50".into(),
            tag: "1.4.0-sm89-fp16".into(),
            digest: None,
            gpu: Some(GpuSelector::Compute { major: 8, minor: 9 }),
            cpu_prefers: Vec::new(),
            gpu_count: 1,
            gpu_share: GpuShare::Whole,
            cpu_millis: 4000,
            memory_mib: 8192,
            shm_mib: 2048,
            replicas_min: 2,
            replicas_max: 8,
            startup: Some(StartupMeasurement {
                seconds: 21.4,
                source: "engine profile".into(),
            }),
            run_as_user: 65532,
            startup_safety: 3.0,
            prestop_s: 10,
            runtime_drain_s: 5,
            longest_deadline_ms: 1500,
            deadline_assumed: false,
            autoscale: Autoscale::GpuUtilisation {
                metric: "DCGM_FI_DEV_GPU_UTIL".into(),
                target_percent: 70,
            },
            grpc_readiness: false,
            split: None,
        }
    }

    fn check_startup(seconds: Option<f64>, safety: f64, threshold: u64, first_line: &str) {
        let m = seconds.map(|s| StartupMeasurement {
            seconds: s,
            source: "test".into(),
        });
        let b = startup_budget(m.as_ref(), safety);
        assert_eq!(b.failure_threshold, threshold, "{b:?}");
        assert!(b.explanation[0].contains(first_line), "{b:?}");
    }

    #[test]
    fn startup_budget_comes_from_the_measurement() {
        // 21.4 s x 3 = 64.2 s -> 65 s -> 13 periods of 5 s.
        check_startup(
            Some(21.4),
            3.0,
            13,
            "measured 21.4 s (test) x safety 3 = 64.2 s",
        );
        // A fast start still gets the 30 s floor.
        check_startup(Some(0.4), 3.0, 6, "raised to the 30 s floor");
        // No measurement: the stated default, 300 s.
        check_startup(None, 3.0, 60, "no start-up time measured");
    }

    #[test]
    fn a_bf16_cpu_target_prefers_nodes_that_compute_in_bf16() {
        let cpu = |prefers: &[(&str, &str)]| DeploySpec {
            target: "cpu-bf16".into(),
            gpu: None,
            gpu_count: 0,
            cpu_prefers: prefers
                .iter()
                .map(|(n, l)| crate::plan::CpuFeaturePin {
                    name: (*n).to_owned(),
                    nfd_label: (*l).to_owned(),
                })
                .collect(),
            ..spec()
        };
        let yaml = render(&cpu(&[
            (
                "avx512-bf16",
                "feature.node.kubernetes.io/cpu-cpuid.AVX512BF16",
            ),
            ("amx", "feature.node.kubernetes.io/cpu-cpuid.AMXBF16"),
        ]))
        .unwrap();
        let at = yaml
            .find("preferredDuringSchedulingIgnoredDuringExecution")
            .unwrap();
        let after = &yaml[at..];
        let avx = after
            .find("key: \"feature.node.kubernetes.io/cpu-cpuid.AVX512BF16\"")
            .unwrap();
        let amx = after
            .find("key: \"feature.node.kubernetes.io/cpu-cpuid.AMXBF16\"")
            .unwrap();
        assert!(avx < amx, "{yaml}");
        // The Deployment prefers; the pre-pull DaemonSet places nothing.
        assert_eq!(yaml.matches("weight: 100").count(), 2, "{yaml}");
        assert_eq!(yaml.matches("affinity:").count(), 1, "{yaml}");
        assert!(
            yaml.contains("avx512-bf16 or amx: preferred, not required"),
            "{yaml}"
        );
        assert!(!yaml.contains("requiredDuringScheduling"), "{yaml}");
        assert!(!yaml.contains("nvidia.com/gpu"), "{yaml}");
        // An FP32 CPU target prefers nothing: no affinity at all.
        assert!(!render(&cpu(&[])).unwrap().contains("affinity"));
    }

    #[test]
    fn grace_covers_prestop_drain_and_the_slowest_request() {
        let (g, why) = grace_period(&spec());
        assert_eq!(g, 10 + 5 + 2 + 5);
        assert!(why[0].contains("= 22 s"), "{why:?}");
    }

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(dns_label("ResNet50-sm89_fp16"), "resnet50-sm89-fp16");
        assert_eq!(dns_label("--"), "infer");
        assert_eq!(dns_label(&"a".repeat(80)).len(), 63);
        assert_eq!(label_value("1.4.0+build/7"), "1.4.0_build_7");
    }

    #[test]
    fn output_is_deterministic_and_has_the_pieces() {
        let a = render(&spec()).unwrap();
        assert_eq!(a, render(&spec()).unwrap());
        for needle in [
            "kind: \"Deployment\"",
            "kind: \"Service\"",
            "kind: \"HorizontalPodAutoscaler\"",
            "kind: \"DaemonSet\"",
            "nvidia.com/gpu: \"1\"",
            "key: \"nvidia.com/gpu.compute.major\"",
            "path: \"/v2/health/ready\"",
            "path: \"/v2/health/live\"",
            "medium: \"Memory\"",
            "readOnlyRootFilesystem: true",
            "stabilizationWindowSeconds: 300",
            "terminationGracePeriodSeconds: 22",
            "failureThreshold: 13",
        ] {
            assert!(a.contains(needle), "missing {needle}\n{a}");
        }
        // Guaranteed QoS: the requests block equals the limits block.
        let req = a
            .split("requests:")
            .nth(1)
            .unwrap()
            .split("limits:")
            .next()
            .unwrap();
        let lim = a
            .split("limits:")
            .nth(1)
            .unwrap()
            .split("startupProbe")
            .next()
            .unwrap();
        assert!(
            lim.starts_with(req.trim_end_matches(' ')) || lim.contains(req.trim()),
            "{req} vs {lim}"
        );
    }

    #[test]
    fn grpc_port_is_exposed_and_its_probe_is_an_option() {
        let a = render(&spec()).unwrap();
        assert!(a.contains("name: \"grpc\"\n"), "{a}");
        assert!(a.contains("containerPort: 8001"), "{a}");
        assert!(a.contains("appProtocol: \"kubernetes.io/h2c\""), "{a}");
        assert!(!a.contains("grpc:\n"), "{a}");
        let mut s = spec();
        s.grpc_readiness = true;
        let g = render(&s).unwrap();
        let ready = g.split("readinessProbe:").nth(1).unwrap();
        let ready = ready.split("livenessProbe:").next().unwrap();
        assert!(
            ready.contains("grpc:") && ready.contains("port: 8001"),
            "{ready}"
        );
        assert!(!ready.contains("httpGet"), "{ready}");
        // The startup and liveness probes stay on HTTP.
        assert!(g.contains("path: \"/v2/health/live\""), "{g}");
    }

    #[test]
    fn cpu_target_has_no_gpu_and_digest_pins_the_image() {
        let mut s = spec();
        s.gpu = None;
        s.target = "cpu-fp32".into();
        s.digest = Some(format!("sha256:{}", "a".repeat(64)));
        let y = render(&s).unwrap();
        assert!(!y.contains("nvidia.com/gpu"), "{y}");
        assert!(y.contains(&format!(
            "image: \"registry.example.com/ml/resnet50@sha256:{}\"",
            "a".repeat(64)
        )));
    }

    #[test]
    fn bad_specs_are_refused_with_the_target_named() {
        let mut s = spec();
        s.shm_mib = 9000;
        let e = render(&s).unwrap_err().to_string();
        assert!(e.contains("sm89-fp16") && e.contains("/dev/shm"), "{e}");
        let mut s = spec();
        s.digest = Some("sha256:xyz".into());
        assert!(render(&s).unwrap_err().is_bad_input());
    }
}
