//! Start-up, as a library: [`start`] takes the parsed flags to a serving [`Running`] server or
//! a [`StartError`] that says which exit code and why; `main` only logs and exits.
//!
//! Steps, in order (each a function below, so a new one goes between two of them):
//! 1. [`read_config`]: `runtime.toml` (one model, or a bundle and each model's own file) with
//!    the flags applied, and the bounds that depend on this machine (instances per CPU, files
//!    that must be regular; a bundle's CPU share per model) — exit 2;
//! 2. [`read_samples`], per model: the warm-up samples' text, read now from the open file;
//! 3. the async runtime, then [`probe_node`], per model: what this node has for the engine
//!    (GPU, driver, TensorRT or ONNX Runtime library) — exit 1;
//! 4. the [`Server`] with its model slots ([`Model`]), the open-files limit, the listeners and
//!    the signal handlers: from here the server answers liveness (and says not ready);
//! 5. `load_model`, per model slot in order: the engine's compatibility tuple, the engine,
//!    warm-up of every instance, the batcher — exit 1. A model's extra load step (a
//!    tokenizer's files) goes here, before its batcher is set;
//! 6. ready (every model).

use crate::args::{self, Args};
use crate::backend::{self, Backend};
use crate::batcher::{AnyLength, Batcher, Padding, Policy, SameShapes};
use crate::cpus::Cpus;
use crate::http;
use crate::log;
use crate::metrics::Metrics;
use crate::model::Model;
use crate::server::Server;
use crate::text::TextModel;
use crate::warmup;
use infer_spec::engine::{check_compat, EngineMeta, Found};
use infer_spec::runtime::MODEL_CONFIG_FILE;
use infer_spec::{Bundle, RuntimeConfig, RuntimeFile, ThreadsFrom};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Backend instances allowed per CPU: more only make the instances take turns on the cores.
pub(crate) const MAX_INSTANCES_PER_CPU: u64 = 4;

/// Descriptors kept for everything but client connections (the listeners, the engine's files
/// and libraries, the runtime's own) when the connection cap is derived from the limit.
const FD_HEADROOM: u64 = 256;

/// Why the server did not start: the exit code (2 bad flags or config, 1 anything else), the
/// log message and its fields, as `main` logs them.
#[derive(Debug)]
pub struct StartError {
    pub code: i32,
    pub msg: &'static str,
    pub fields: Vec<(&'static str, Value)>,
}

impl StartError {
    fn new(code: i32, msg: &'static str, fields: Vec<(&'static str, Value)>) -> StartError {
        StartError { code, msg, fields }
    }

    /// Exit 2, `bad runtime config`, naming the config file and the problem.
    fn bad_config(path: &str, error: impl Into<Value>) -> StartError {
        StartError::new(
            2,
            "bad runtime config",
            vec![("path", json!(path)), ("error", error.into())],
        )
    }

    /// The `error` field, when there is one.
    pub fn error(&self) -> Option<&Value> {
        self.fields
            .iter()
            .find(|(k, _)| *k == "error")
            .map(|(_, v)| v)
    }
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.msg)?;
        for (k, v) in &self.fields {
            write!(f, "; {k}: {v}")?;
        }
        Ok(())
    }
}

impl std::error::Error for StartError {}

/// A started server: serving, warmed up and ready (or draining, when a signal came during
/// start-up).
pub struct Running {
    rt: tokio::runtime::Runtime,
    server: Arc<Server>,
    addr: String,
    grpc_addr: Option<String>,
    http: tokio::task::JoinHandle<bool>,
    grpc: Option<tokio::task::JoinHandle<bool>>,
    drain: Arc<tokio::sync::Notify>,
}

impl Running {
    /// The bound HTTP address.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The bound gRPC address, `None` when gRPC is off.
    pub fn grpc_addr(&self) -> Option<&str> {
        self.grpc_addr.as_deref()
    }

    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }

    /// Starts the drain, as SIGTERM does.
    pub fn drain(&self) {
        self.drain.notify_one();
    }

    /// Serves until the drain (a signal, or [`Running::drain`]) is over and the listeners are
    /// closed; true when every request finished within `exit_timeout_s`.
    pub fn wait(self) -> bool {
        let Running { rt, http, grpc, .. } = self;
        let clean = rt.block_on(async {
            let http_clean = http.await.unwrap_or(false);
            let grpc_clean = match grpc {
                Some(g) => g.await.unwrap_or(false),
                None => true,
            };
            http_clean && grpc_clean
        });
        // Requests still in flight after the exit timeout are abandoned, as the process exit
        // that follows abandons them: no waiting for their tasks.
        rt.shutdown_background();
        clean
    }
}

/// `Err` naming the path when `p` exists (after symbolic links) and is not a regular file;
/// a missing file is left to whoever opens it.
fn regular_file(p: &Path) -> Result<(), String> {
    let Ok(m) = std::fs::metadata(p) else {
        return Ok(());
    };
    match warmup::not_regular(m.file_type()) {
        None => Ok(()),
        Some(what) => Err(format!("{} is {what}, not a regular file", p.display())),
    }
}

/// Raises the soft limit on open files to the hard one (connections are descriptors); returns
/// the soft limit in force, `None` when it cannot be read.
#[allow(
    unsafe_code,
    reason = "getrlimit/setrlimit on a local struct: the runtime's one direct libc call"
)]
fn raise_open_files_limit() -> Option<u64> {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid, writable rlimit for the call's duration.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return None;
    }
    if r.rlim_cur < r.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; failure (a hard limit the kernel caps lower)
        // leaves the soft limit as it was.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r.rlim_cur = r.rlim_max;
        }
    }
    Some(r.rlim_cur)
}

/// The allocator's policy, so that the resident set follows what the server holds: buffers of
/// 1 MiB and more (request bodies, batches, long texts' tokenizing) are mapped on their own and
/// given back to the system when freed, instead of glibc's threshold rising past them after the
/// first is freed and keeping them in its heap; and as many arenas as CPUs, not eight per CPU,
/// so memory freed by one thread is reused by the others. Without it, memory a burst of large
/// requests once used stays resident, and the memory budget (which counts what requests hold)
/// could not bound the process. glibc only; elsewhere nothing changes.
#[allow(
    unsafe_code,
    reason = "mallopt on two integer parameters: the runtime's allocator policy, at start, before other threads"
)]
fn allocator_policy(cpus: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let arenas = libc::c_int::try_from(cpus.max(1)).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt takes two integers and changes only the allocator's parameters; it is
        // called once, at start, before any thread of ours allocates.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
            libc::mallopt(libc::M_ARENA_MAX, arenas);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = cpus;
}

/// One model's config as read: the config, the directory its paths are relative to, and its
/// path as the logs show it.
pub(crate) struct Loaded {
    pub cfg: RuntimeConfig,
    pub base: PathBuf,
    pub path: String,
    /// Where `cfg.engine.threads` came from, for an engine with threads of its own (set by
    /// [`read_config`], which decides the count on this machine).
    pub threads_from: Option<ThreadsFrom>,
}

/// What `runtime.toml` says to serve: the server's settings (with the flags applied) and its
/// models, one, or a bundle's in the bundle's order.
pub(crate) struct Config {
    pub server: infer_spec::Server,
    pub models: Vec<Loaded>,
    /// The file read, as the logs show it.
    pub path: String,
}

/// Reads the text of the config file at `p` (a regular file), or the error for it.
fn read_text(p: &Path) -> Result<String, StartError> {
    let unreadable = |e: String| {
        StartError::new(
            2,
            "cannot read the runtime config",
            vec![
                ("path", json!(p.display().to_string())),
                ("error", json!(e)),
            ],
        )
    };
    regular_file(p).map_err(unreadable)?;
    let bytes =
        crate::text::read_bounded(p, MAX_CONFIG_BYTES).map_err(|e| unreadable(e.to_string()))?;
    String::from_utf8(bytes).map_err(|e| unreadable(format!("not UTF-8: {e}")))
}

/// The most bytes a `runtime.toml` (one model's, or a bundle's) may have: the largest the
/// builder writes are a few kilobytes (a classifier's labels).
pub(crate) const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Step 1: reads `runtime.toml` (one model, or a bundle and each of its models' own file),
/// applies `--host`, `--port` and `--threads`, decides each model's threads on this machine,
/// and checks what depends on it (the rest is `RuntimeConfig::problems` and
/// `Bundle::problems`). A bundle's models divide the CPUs: each decides its threads
/// ([`RuntimeConfig::threads`]) on its share.
pub(crate) fn read_config(args: &Args, cpus: usize) -> Result<Config, StartError> {
    let path = args.config.display().to_string();
    let text = read_text(&args.config)?;
    let dir = args.config.parent().unwrap_or(Path::new(".")).to_path_buf();
    let file = RuntimeFile::from_toml_str(&text)
        .map_err(|e| StartError::bad_config(&path, e.to_string()))?;
    let (mut server, mut models) = match file {
        RuntimeFile::Model(cfg) => {
            let cfg = *cfg;
            (
                cfg.server.clone(),
                vec![Loaded {
                    cfg,
                    base: dir,
                    path: path.clone(),
                    threads_from: None,
                }],
            )
        }
        RuntimeFile::Bundle(bundle) => {
            let mut models = Vec::with_capacity(bundle.models.len());
            for (i, m) in bundle.models.iter().enumerate() {
                let base = dir.join(&m.path);
                let p = base.join(MODEL_CONFIG_FILE);
                let shown = p.display().to_string();
                // A model directory that is not there, or holds no runtime.toml, is a
                // deployment's problem (a volume not mounted, or another artifact mounted), not
                // a bad config: exit 1, naming the path.
                let missing = |what: String| {
                    StartError::new(
                        1,
                        "a model directory is missing",
                        vec![
                            ("path", json!(base.display().to_string())),
                            ("error", json!(format!("models[{i}].path {:?}: {what}; a model's directory holds its {MODEL_CONFIG_FILE} (mounted as an image volume, is the volume there?)", m.path))),
                        ],
                    )
                };
                if !base.is_dir() {
                    return Err(missing(format!("{} is not a directory", base.display())));
                }
                if !p.exists() {
                    return Err(missing(format!(
                        "{} has no {MODEL_CONFIG_FILE}",
                        base.display()
                    )));
                }
                let text = read_text(&p)?;
                let cfg = RuntimeConfig::from_toml_str(&text)
                    .map_err(|e| StartError::bad_config(&shown, e.to_string()))?;
                models.push(Loaded {
                    cfg,
                    base,
                    path: shown,
                    threads_from: None,
                });
            }
            let twice = Bundle::duplicate_names(models.iter().map(|m| &m.cfg));
            if !twice.is_empty() {
                return Err(StartError::bad_config(
                    &path,
                    format!("models: more than one model is named {twice:?}; a bundle's models need names of their own"),
                ));
            }
            (bundle.server_for(models.iter().map(|m| &m.cfg)), models)
        }
    };
    if let Some(h) = &args.host {
        server.host = h.clone();
    }
    if let Some(p) = args.port {
        server.port = p;
    }
    let per_model = (cpus / models.len().max(1)).max(1);
    for m in &mut models {
        if m.cfg.engine.kind.engine().is_some_and(|d| d.threads) {
            let (threads, from) = m.cfg.threads(per_model, args.threads);
            m.cfg.engine.threads = Some(threads as u32);
            m.threads_from = Some(from);
        }
    }
    if args.threads.is_some() && models.iter().all(|m| m.threads_from.is_none()) {
        log::log(
            "warn",
            "--threads / INFER_THREADS is set, but no model's engine has threads of its own: it changes nothing",
            &[(
                "engines",
                json!(models
                    .iter()
                    .map(|m| m.cfg.engine.kind.as_str())
                    .collect::<Vec<_>>()),
            )],
        );
    }
    for m in &mut models {
        if m.cfg.server != server {
            // A bundle's server bounds (body size, memory budget) must hold for every model.
            m.cfg.server = server.clone();
            let problems = m.cfg.problems();
            if !problems.is_empty() {
                return Err(StartError::bad_config(
                    &m.path,
                    format!(
                        "under the bundle's [server] ({path}): {}",
                        problems.join("; ")
                    ),
                ));
            }
        }
        check_model_files(m, cpus)?;
    }
    Ok(Config {
        server,
        models,
        path,
    })
}

/// The bounds of one model's config that depend on this machine: its instances per CPU, and
/// the files it names being regular files.
fn check_model_files(m: &Loaded, cpus: usize) -> Result<(), StartError> {
    let (cfg, base, path) = (&m.cfg, &m.base, &m.path);
    let most = MAX_INSTANCES_PER_CPU * cpus as u64;
    if u64::from(cfg.batching.instances) > most {
        return Err(StartError::bad_config(
            path,
            format!(
                "batching.instances {} is more than {MAX_INSTANCES_PER_CPU} per CPU ({cpus} CPUs here: at most {most})",
                cfg.batching.instances
            ),
        ));
    }
    // Files the config names must be regular files: a FIFO or a device would block the start
    // or feed it without end, a directory gives an obscure error.
    for (key, rel) in [
        ("engine.path", cfg.engine.path.as_deref()),
        ("engine.metadata", cfg.engine.metadata.as_deref()),
        ("engine.library", cfg.engine.library.as_deref()),
        ("warmup.samples", cfg.warmup.samples.as_deref()),
        (
            "text.tokenizer",
            cfg.text.as_ref().map(|t| t.tokenizer.as_str()),
        ),
    ] {
        let Some(rel) = rel else { continue };
        regular_file(&base.join(rel))
            .map_err(|e| StartError::bad_config(path, format!("{key}: {e}")))?;
    }
    Ok(())
}

/// Step 2: the warm-up samples, read now from the open file (a FIFO or a device put there
/// after [`read_config`]'s check is refused too, and a file over the bound is not read past
/// it); they are decoded at warm-up. `None` when there are none or warm-up is off.
pub(crate) fn read_samples(c: &Loaded) -> Result<Option<(PathBuf, String)>, StartError> {
    let Some(rel) = &c.cfg.warmup.samples else {
        return Ok(None);
    };
    if c.cfg.warmup_batch_sizes().is_empty() {
        return Ok(None);
    }
    let p = c.base.join(rel);
    match warmup::read_samples(&p) {
        Ok(text) => Ok(Some((p, text))),
        Err(warmup::Error::Refused(e)) => Err(StartError::bad_config(
            &c.path,
            format!("warmup.samples: {e}"),
        )),
        Err(warmup::Error::Io(e)) => Err(StartError::new(
            1,
            "cannot read the warm-up samples",
            vec![("error", json!(format!("warm-up samples {e}")))],
        )),
        // `read_samples` reads; it neither decodes nor runs.
        Err(e) => Err(StartError::new(
            1,
            "cannot read the warm-up samples",
            vec![("error", json!(e.to_string()))],
        )),
    }
}

/// Step 3: what this node has for the engine (GPU, driver, TensorRT library for a TensorRT
/// engine), read before anything else: a node without them fails here, naming what is
/// missing.
pub(crate) fn probe_node(c: &Loaded, cpus: &Cpus) -> Result<Found, StartError> {
    let cfg = &c.cfg;
    let found = backend::node(cfg, &c.base).map_err(|e| {
        StartError::new(
            1,
            "this node cannot run the engine; not starting",
            vec![
                ("engine", json!(cfg.engine.kind.as_str())),
                ("error", json!(e.to_string())),
            ],
        )
    })?;
    if let Some((engine, v)) = found.library() {
        let (cpus_quota, cpus_allowed) = (cpus.quota, cpus.allowed);
        let cpus = cpus.count;
        let threads = cfg.threads(cpus, None).0;
        let instances = cfg.batching.instances as usize;
        log::info(
            "node",
            &[
                ("model", json!(cfg.model.name)),
                ("engine", json!(cfg.engine.kind.as_str())),
                (engine, json!(v.to_string())),
                ("library", json!(cfg.engine.library)),
                (
                    "precision",
                    json!(cfg.engine.precision.map(|p| p.to_string())),
                ),
                ("threads_per_instance", json!(threads)),
                (
                    "threads_from",
                    json!(c.threads_from.map(ThreadsFrom::as_str)),
                ),
                ("instances", json!(instances)),
                ("cpus", json!(cpus)),
                ("cpu_quota", json!(cpus_quota)),
                ("cpus_allowed", json!(cpus_allowed)),
            ],
        );
        if threads.saturating_mul(instances) > cpus {
            log::log(
                "warn",
                "instances x engine.threads is more than the CPUs: the instances will take turns on the cores",
                &[
                    ("threads_per_instance", json!(threads)),
                    ("instances", json!(instances)),
                    ("cpus", json!(cpus)),
                ],
            );
        }
    }
    if let Some(g) = &found.gpu {
        log::info(
            "node",
            &[
                ("gpu", json!(g.name)),
                ("compute_capability", json!(g.sm.sm().to_string())),
                ("driver", json!(g.driver.to_string())),
                (
                    "tensorrt",
                    json!(found.tensorrt.as_ref().map(|v| v.to_string())),
                ),
            ],
        );
    }
    Ok(found)
}

/// The engine's compatibility tuple, when the image carries one: refuse to start on a node it
/// was not built for instead of failing (or silently slowing down) later.
fn check_engine_metadata(c: &Loaded, found: &Found) -> Result<(), StartError> {
    let Some(meta) = &c.cfg.engine.metadata else {
        return Ok(());
    };
    let p = c.base.join(meta);
    let shown = json!(p.display().to_string());
    let fail = |msg, e: String| {
        StartError::new(1, msg, vec![("path", shown.clone()), ("error", json!(e))])
    };
    let bytes =
        std::fs::read(&p).map_err(|e| fail("cannot read the engine metadata", e.to_string()))?;
    let meta =
        EngineMeta::from_json(&bytes).map_err(|e| fail("bad engine metadata", e.to_string()))?;
    check_compat(&meta, found).map_err(|e| {
        fail(
            "the engine does not match this node; not starting",
            e.to_string(),
        )
    })?;
    log::info(
        "engine matches this node",
        &[("engine", json!(meta.describe()))],
    );
    // What the engine was measured on is no requirement (its required features are, above):
    // a node without it runs the engine, slower than the profile the batching plan rests on.
    if let (Some(measured), Some(node)) = (
        meta.cpu.as_ref().and_then(|c| c.isa.as_ref()),
        found.cpu.isa.as_ref(),
    ) {
        let missing = measured.missing_on(node);
        if !missing.is_empty() {
            log::log(
                "warn",
                "this node's CPU lacks what the engine was measured on: it runs, slower than its profile (T(b), the batching plan, the engine auto chose)",
                &[
                    ("model", json!(c.cfg.model.name)),
                    ("measured_on", json!(measured.name())),
                    ("node", json!(node.name())),
                    ("missing", json!(missing)),
                ],
            );
        }
    }
    Ok(())
}

/// What [`load_model`] reports for the `ready` line.
struct Loadout {
    warm: Duration,
    samples: usize,
}

/// Step 5, for one model slot: checks the engine against the node, loads it, warms up every
/// instance (sample requests, then every planned batch size and shape) and starts the batcher
/// with the model's grouping. Runs on the calling thread while the server answers liveness.
fn load_model(
    c: &Loaded,
    found: &Found,
    samples_text: Option<(PathBuf, String)>,
    model: &Model,
    busy_poll: Duration,
) -> Result<Loadout, StartError> {
    let cfg = &c.cfg;
    check_engine_metadata(c, found)?;
    let t = Instant::now();
    let engine = backend::load(cfg, &c.base).map_err(|e| {
        StartError::new(
            1,
            "cannot load the engine",
            vec![("error", json!(e.to_string()))],
        )
    })?;
    let load = t.elapsed();
    model
        .metrics
        .engine_load_us
        .store(load.as_micros() as u64, Relaxed);
    log::info(
        "engine loaded",
        &[
            ("model", json!(cfg.model.name)),
            ("engine", json!(cfg.engine.kind.as_str())),
            ("engine_load_seconds", json!(load.as_secs_f64())),
        ],
    );

    let t = Instant::now();
    let runs = warmup::runs(cfg);
    // Sample requests (`[warmup] samples`) are decoded as requests are; a bad one stops here.
    let samples = match samples_text {
        Some((p, text)) => warmup::Samples::decode(cfg, &p, &text).map_err(|e| {
            StartError::new(
                1,
                "cannot read the warm-up samples",
                vec![("error", json!(e.to_string()))],
            )
        })?,
        None => warmup::Samples::default(),
    };
    let mut backends: Vec<Box<dyn Backend>> = Vec::new();
    for instance in 0..cfg.batching.instances {
        let mut b = engine.instance().map_err(|e| {
            StartError::new(
                1,
                "cannot create a backend instance",
                vec![
                    ("instance", json!(instance)),
                    ("error", json!(e.to_string())),
                ],
            )
        })?;
        for (i, inputs) in samples.requests().iter().enumerate() {
            warmup::run_sample(cfg, b.as_mut(), inputs).map_err(|e| {
                StartError::new(
                    1,
                    "warm-up failed on a sample request; not starting",
                    vec![
                        ("instance", json!(instance)),
                        ("sample", json!(i)),
                        ("error", json!(e.to_string())),
                    ],
                )
            })?;
        }
        for (rows, shapes) in &runs {
            warmup::run_at(cfg, b.as_mut(), &samples, *rows, shapes).map_err(|e| {
                StartError::new(
                    1,
                    "warm-up failed; not starting",
                    vec![
                        ("instance", json!(instance)),
                        ("batch_size", json!(rows)),
                        ("shapes", json!(shapes)),
                        ("error", json!(e.to_string())),
                    ],
                )
            })?;
        }
        backends.push(b);
    }
    let warm = t.elapsed();
    model
        .metrics
        .warmup_us
        .store(warm.as_micros() as u64, Relaxed);
    let mut policy = Policy {
        busy_poll,
        ..Policy::from_config(cfg)
    };
    // The model's grouping: a text model, or a tensor model whose inputs say their padding
    // values, pads requests of different lengths into one batch, within its token budget;
    // other models batch only equal shapes.
    policy.padding = padding(cfg, model);
    // A text model pools each item's rows on the backend thread.
    if let Ok(text) = model.text_arc() {
        policy.reduce = Some(text.clone());
    }
    let started = match policy.padding {
        Some(_) => Batcher::start_grouped(policy, AnyLength, backends, model.metrics.clone()),
        None => Batcher::start_grouped(policy, SameShapes, backends, model.metrics.clone()),
    };
    let batcher = started.map_err(|e| {
        StartError::new(
            1,
            "cannot start the batcher",
            vec![("error", json!(e.to_string()))],
        )
    })?;
    let _ = model.batcher.set(batcher);
    Ok(Loadout {
        warm,
        samples: samples.len(),
    })
}

/// Binds `addr`; `what` names the port in the error.
fn bind(
    rt: &tokio::runtime::Runtime,
    addr: String,
    what: &'static str,
) -> Result<tokio::net::TcpListener, StartError> {
    rt.block_on(tokio::net::TcpListener::bind(&addr))
        .map_err(|e| {
            StartError::new(
                1,
                what,
                vec![("addr", json!(addr)), ("error", json!(e.to_string()))],
            )
        })
}

/// Starts the server `args` describe and returns once it is ready: every step of the module
/// docs, in order (steps 2, 3 and 5 per model). Errors carry their exit code; nothing here
/// exits the process.
#[allow(
    clippy::too_many_lines,
    reason = "the start-up steps of the module docs in order, each a call to its own function: split, the order would no longer read in one place"
)]
pub fn start(args: Args) -> Result<Running, StartError> {
    let started = Instant::now();
    let node_cpus = crate::cpus::detect();
    let cpus = node_cpus.count;
    allocator_policy(cpus);
    let config = read_config(&args, cpus)?;
    let samples: Vec<_> = config
        .models
        .iter()
        .map(read_samples)
        .collect::<Result<_, _>>()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            StartError::new(
                1,
                "cannot start the async runtime",
                vec![("error", json!(e.to_string()))],
            )
        })?;
    let found: Vec<Found> = config
        .models
        .iter()
        .map(|c| probe_node(c, &node_cpus))
        .collect::<Result<_, _>>()?;
    let settings = &config.server;
    if config.models.len() > 1 {
        // Each model's own check is in `probe_node`; together they can still oversubscribe.
        let threads: usize = config
            .models
            .iter()
            .filter(|m| m.cfg.engine.kind.engine().is_some_and(|d| d.threads))
            .map(|m| m.cfg.threads(cpus, None).0 * m.cfg.batching.instances as usize)
            .sum();
        if threads > cpus {
            log::log(
                "warn",
                "the bundle's models together compute with more threads than CPUs: they will take turns on the cores",
                &[("threads", json!(threads)), ("cpus", json!(cpus))],
            );
        }
    }

    // As many preparation workers as CPUs (tokenizing, decoding large bodies), shared by every
    // model of a bundle, queueing as many requests as the models' batchers together.
    let queue: u64 = config
        .models
        .iter()
        .map(|m| u64::from(m.cfg.batching.max_queue_size.max(64)))
        .sum();
    let workers = crate::core::Workers::start(cpus, queue as usize).map_err(|e| {
        StartError::new(
            1,
            "cannot start the preparation workers",
            vec![("error", json!(e.to_string()))],
        )
    })?;

    // One server-wide set of series (in flight, connections): the first model's, shared by
    // every later model's metrics.
    let mut slots: Vec<Model> = Vec::with_capacity(config.models.len());
    for (c, found) in config.models.iter().zip(&found) {
        let cfg = &c.cfg;
        let (name, version, most) = (
            &cfg.model.name,
            &cfg.model.version,
            cfg.batching.max_batch_size,
        );
        let metrics = Arc::new(match slots.first() {
            None => Metrics::new(name, version, most),
            Some(f) => Metrics::sharing(name, version, most, &f.metrics),
        });
        let text = TextModel::load(cfg, &c.base).map_err(|e| match e {
            crate::text::LoadError::Read(e) => StartError::new(
                1,
                "cannot load the tokenizer",
                vec![("model", json!(name)), ("error", json!(e))],
            ),
            crate::text::LoadError::Refused(e) => {
                StartError::bad_config(&c.path, format!("text.tokenizer: {e}"))
            }
        })?;
        let mut model = Model::with_text(cfg.clone(), metrics, text);
        model.set_node(found);
        slots.push(model);
    }
    // One model: the server's series are the model's (as they always were). A bundle: the
    // server's own, whose model series nothing renders.
    let server_metrics = match slots.as_slice() {
        [] => return Err(StartError::bad_config(&config.path, "no model to serve")),
        [one] => one.metrics.clone(),
        [first, ..] => Arc::new(Metrics::sharing("", "", 1, &first.metrics)),
    };
    let names: Vec<String> = slots.iter().map(|m| m.name().to_owned()).collect();
    let set_aside =
        set_aside(&config).saturating_add(crate::budget::headroom(settings.memory_budget_bytes));
    let mut server = Server::new(settings.clone(), server_metrics, slots);
    server.set_workers(workers);
    server
        .budget
        .set_limit(settings.memory_budget_bytes.saturating_sub(set_aside));
    server.busy_poll = Duration::from_micros(
        args.busy_poll_us
            .unwrap_or_else(|| args::default_busy_poll_us(cpus)),
    );
    // Connections are descriptors: the soft limit goes up to the hard one, and the cap per
    // listener comes down to what the limit holds beside the server's own files.
    let open_files = raise_open_files_limit();
    let grpc_port = args::grpc_port(args.grpc_port, settings.port);
    let listeners = 1 + u64::from(grpc_port.is_some());
    if let Some(limit) = open_files {
        let fits = (limit.saturating_sub(FD_HEADROOM) / listeners).max(1);
        if (server.max_connections as u64) > fits {
            log::log(
                "warn",
                "server.max_connections is more than the open-files limit allows: lowered",
                &[
                    ("max_connections", json!(server.max_connections)),
                    ("lowered_to", json!(fits)),
                    ("open_files_limit", json!(limit)),
                    ("listeners", json!(listeners)),
                ],
            );
            server.max_connections = fits as usize;
        }
    }
    let server = Arc::new(server);

    let addr = format!("{}:{}", settings.host, settings.port);
    let listener = bind(&rt, addr.clone(), "cannot bind")?;
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
    let grpc_listener = grpc_port
        .map(|port| {
            bind(
                &rt,
                format!("{}:{port}", settings.host),
                "cannot bind the gRPC port",
            )
        })
        .transpose()?;
    let grpc_local = grpc_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string());
    let one = &config.models[0].cfg;
    let mut fields = vec![("addr", json!(local)), ("grpc_addr", json!(grpc_local))];
    if names.len() == 1 {
        fields.extend([
            ("model", json!(one.model.name)),
            ("version", json!(one.model.version)),
            ("engine", json!(one.engine.kind.as_str())),
        ]);
    } else {
        fields.push(("models", json!(names)));
    }
    fields.extend([
        ("config", json!(config.path)),
        ("busy_poll_us", json!(server.busy_poll.as_micros() as u64)),
        ("max_connections", json!(server.max_connections)),
        ("open_files_limit", json!(open_files)),
    ]);
    log::info("listening", &fields);

    // As PID 1 in a container the kernel ignores signals without a handler, so installing
    // these is what makes `docker stop` and Kubernetes work.
    let signals = {
        let _in_rt = rt.enter();
        (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        )
    };
    let (Ok(term), Ok(int)) = signals else {
        return Err(StartError::new(1, "cannot install signal handlers", vec![]));
    };
    let drain = Arc::new(tokio::sync::Notify::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    rt.spawn(lifecycle(server.clone(), stop_tx, term, int, drain.clone()));
    let exit_timeout = Duration::from_secs(settings.exit_timeout_s);
    let grpc = grpc_listener.map(|l| {
        rt.spawn(crate::grpc::serve(
            server.clone(),
            l,
            stop_rx.clone(),
            exit_timeout,
        ))
    });
    let http = rt.spawn(http::serve(server.clone(), listener, stop_rx, exit_timeout));

    // Each model in turn: a model's warm-up has the machine to itself, as its timings
    // (and the engine's own tuning) assume.
    let mut warm = Duration::ZERO;
    let mut warmup_samples = 0;
    for ((c, found), samples) in config.models.iter().zip(&found).zip(samples) {
        let slot = server.model(&c.cfg.model.name).map_err(|e| {
            StartError::new(
                1,
                "the model has no slot",
                vec![("error", json!(e.to_string()))],
            )
        })?;
        let loaded = load_model(c, found, samples, slot, server.busy_poll)?;
        if names.len() > 1 && !server.draining.load(Relaxed) {
            slot.metrics.ready.store(1, Relaxed);
            log::info(
                "model ready",
                &[
                    ("model", json!(c.cfg.model.name)),
                    ("warmup_seconds", json!(loaded.warm.as_secs_f64())),
                    ("warmup_samples", json!(loaded.samples)),
                ],
            );
        }
        warm += loaded.warm;
        warmup_samples += loaded.samples;
    }
    // What the process holds now (the runtime, the engines, their arenas after the warm-up)
    // is no longer the requests' to hold; from now on the limit follows the resident set.
    server
        .budget
        .follow(settings.memory_budget_bytes.saturating_sub(set_aside));
    let resident = crate::budget::resident_bytes().unwrap_or(0);
    let requests = server.budget.limit();
    let budget = server.budget.clone();
    rt.spawn(async move {
        let mut tick = tokio::time::interval(crate::budget::FOLLOW_EVERY);
        loop {
            tick.tick().await;
            budget.refresh();
        }
    });
    if requests < settings.memory_budget_bytes / 8 {
        log::log(
            "warn",
            "server.memory_budget_bytes leaves little for requests in flight once the models are loaded: large requests will be refused (413) and concurrent ones shed (503)",
            &[
                ("memory_budget_bytes", json!(settings.memory_budget_bytes)),
                ("resident_bytes", json!(resident)),
                ("batches_and_caches_bytes", json!(set_aside)),
                ("requests_bytes", json!(requests)),
            ],
        );
    }
    if !server.draining.load(Relaxed) {
        server.metrics.ready.store(1, Relaxed);
    }
    log::info(
        "ready",
        &[
            ("warmup_seconds", json!(warm.as_secs_f64())),
            ("warmup_batch_sizes", json!(one.warmup_batch_sizes())),
            ("warmup_samples", json!(warmup_samples)),
            ("instances", json!(one.batching.instances)),
            ("models", json!(names.len())),
            ("requests_memory_bytes", json!(requests)),
            (
                "start_to_ready_seconds",
                json!(started.elapsed().as_secs_f64()),
            ),
        ],
    );
    Ok(Running {
        rt,
        server,
        addr: local,
        grpc_addr: grpc_local,
        http,
        grpc,
        drain,
    })
}

/// Waits for SIGTERM or SIGINT (or [`Running::drain`]), then runs the drain sequence.
async fn lifecycle(
    app: Arc<Server>,
    stop: tokio::sync::watch::Sender<bool>,
    mut term: Signal,
    mut int: Signal,
    drain: Arc<tokio::sync::Notify>,
) {
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = drain.notified() => "drain",
    };
    app.drain();
    let delay = Duration::from_secs(app.settings.drain_delay_s);
    log::info(
        "draining: readiness now 503, still serving",
        &[
            ("signal", json!(name)),
            ("drain_delay_s", json!(delay.as_secs_f64())),
            ("in_flight", json!(app.metrics.in_flight().load(Relaxed))),
        ],
    );
    tokio::select! {
        _ = tokio::time::sleep(delay) => {}
        _ = term.recv() => log::info("second signal: ending the drain delay early", &[]),
        _ = int.recv() => log::info("second signal: ending the drain delay early", &[]),
        _ = drain.notified() => log::info("second signal: ending the drain delay early", &[]),
    }
    let _ = stop.send(true);
}

/// The memory set aside from `server.memory_budget_bytes` before requests get theirs: every
/// model's batches at their largest (`instances x max_batch_size x` a row's input and output
/// bytes) and its response cache's bound.
fn set_aside(config: &Config) -> u64 {
    config
        .models
        .iter()
        .map(|m| {
            let c = &m.cfg;
            let row: u64 = c
                .inputs
                .iter()
                .chain(&c.outputs)
                .filter_map(infer_spec::TensorSpec::max_row_bytes)
                .fold(0, u64::saturating_add);
            let batches = u64::from(c.batching.instances)
                .saturating_mul(u64::from(c.batching.max_batch_size))
                .saturating_mul(row);
            let cache = c.response_cache.as_ref().map_or(0, |r| r.max_bytes);
            batches.saturating_add(cache)
        })
        .fold(0, u64::saturating_add)
}

/// How a model pads requests of different lengths into one batch, if it does: a text model
/// with its tokenizer's padding and `[text]` bounds (outputs left padded for its pooling); a
/// tensor model whose inputs say their `pad` (`TensorSpec::pad`), within rows x the profile's
/// longest length, each request's per-token outputs cut back to its own length.
fn padding(cfg: &RuntimeConfig, model: &crate::model::Model) -> Option<Padding> {
    let bounds = cfg.padded_bounds()?;
    if let Some(text) = model.text() {
        return Some(Padding {
            values: text.pad_values(),
            cut_outputs: Vec::new(),
            bounds,
        });
    }
    Some(Padding {
        values: cfg.inputs.iter().map(|i| i.pad).collect::<Option<_>>()?,
        cut_outputs: cfg
            .outputs
            .iter()
            .map(|o| o.dims.get(1) == Some(&-1))
            .collect(),
        bounds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYNTHETIC: &str = include_str!("../testdata/synthetic.runtime.toml");

    fn args(config: &Path) -> Args {
        Args {
            config: config.to_owned(),
            host: Some("127.0.0.1".to_owned()),
            port: Some(0),
            grpc_port: Some(0),
            busy_poll_us: None,
            threads: None,
        }
    }

    fn config(dir: &tempfile::TempDir, text: &str) -> PathBuf {
        let p = dir.path().join("runtime.toml");
        std::fs::write(&p, text).unwrap();
        p
    }

    /// The synthetic model served by tract from the ONNX file at `path`.
    fn onnx(text: &str, path: &str) -> String {
        let text = text
            .replace(
                "kind = \"synthetic\"",
                &format!("kind = \"tract-onnx\"\npath = \"{path}\""),
            )
            .replace("[engine.synthetic]\nbase_ms = 1.0\nper_row_ms = 0.0\n", "");
        assert!(
            text.contains(path) && !text.contains("synthetic]"),
            "{text}"
        );
        text
    }

    fn refused(args: Args) -> StartError {
        match start(args) {
            Ok(_) => panic!("started"),
            Err(e) => e,
        }
    }

    fn error_text(e: &StartError) -> String {
        e.error().map(|v| v.to_string()).unwrap_or_default()
    }

    /// Each model's threads are decided on this machine: the flag or environment, else
    /// `engine.threads`, else the build's hint on the same share, else the share.
    #[test]
    fn threads_are_decided_on_this_machine() {
        let dir = tempfile::tempdir().unwrap();
        for f in ["model.onnx", "libonnxruntime.so.1.31.0"] {
            std::fs::write(dir.path().join(f), b"").unwrap();
        }
        let ort = |engine: &str| {
            SYNTHETIC.replace(
                "kind = \"synthetic\"\n\n[engine.synthetic]\nbase_ms = 1.0\nper_row_ms = 0.0\n",
                &format!("kind = \"onnxruntime\"\npath = \"model.onnx\"\nlibrary = \"libonnxruntime.so.1.31.0\"\n{engine}"),
            )
        };
        // (engine keys, cpus, --threads) -> (threads, from)
        for (engine, cpus, given, want) in [
            ("", 16, None, (16, ThreadsFrom::Share)),
            ("", 2, Some(3), (3, ThreadsFrom::Given)),
            ("threads = 4\n", 2, None, (4, ThreadsFrom::Config)),
            ("threads = 4\n", 2, Some(1), (1, ThreadsFrom::Given)),
            (
                "measured = { threads = 1, share = 2 }\n",
                2,
                None,
                (1, ThreadsFrom::Measured),
            ),
            (
                "measured = { threads = 1, share = 2 }\n",
                8,
                None,
                (8, ThreadsFrom::Share),
            ),
        ] {
            let text = ort(engine);
            assert!(text.contains("onnxruntime"), "{text}");
            let mut a = args(&config(&dir, &text));
            a.threads = given;
            let c = read_config(&a, cpus).unwrap_or_else(|e| panic!("{engine:?}: {e}"));
            let m = &c.models[0];
            assert_eq!(
                (m.cfg.engine.threads, m.threads_from),
                (Some(want.0), Some(want.1)),
                "{engine:?} on {cpus} CPUs, --threads {given:?}"
            );
        }
        // An engine without threads of its own is left alone, with or without the flag.
        let mut a = args(&config(&dir, SYNTHETIC));
        a.threads = Some(3);
        let c = read_config(&a, 4).unwrap();
        assert_eq!(
            (c.models[0].cfg.engine.threads, c.models[0].threads_from),
            (None, None)
        );
    }

    #[test]
    fn a_config_that_cannot_be_read_is_exit_2() {
        let dir = tempfile::tempdir().unwrap();
        let e = refused(args(&dir.path().join("missing.toml")));
        assert_eq!((e.code, e.msg), (2, "cannot read the runtime config"));
        let e = refused(args(dir.path()));
        assert_eq!((e.code, e.msg), (2, "cannot read the runtime config"));
        assert!(error_text(&e).contains("not a regular file"), "{e}");
    }

    #[test]
    fn a_bad_config_is_exit_2_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let e = refused(args(&config(&dir, "[model]\nname = 1\n")));
        assert_eq!((e.code, e.msg), (2, "bad runtime config"));

        // More instances than this machine has CPUs for.
        let text = SYNTHETIC.replace("max_batch_size = 8", "max_batch_size = 8\ninstances = 5");
        let e = read_config(&args(&config(&dir, &text)), 1).err().unwrap();
        assert_eq!((e.code, e.msg), (2, "bad runtime config"));
        assert!(error_text(&e).contains("more than 4 per CPU"), "{e}");

        // A file the config names is a directory.
        std::fs::create_dir(dir.path().join("engine.onnx")).unwrap();
        let text = onnx(SYNTHETIC, "engine.onnx");
        let e = refused(args(&config(&dir, &text)));
        assert_eq!((e.code, e.msg), (2, "bad runtime config"));
        assert!(error_text(&e).contains("engine.path"), "{e}");
    }

    #[cfg(feature = "tract")]
    #[test]
    fn an_engine_that_does_not_load_is_exit_1() {
        let dir = tempfile::tempdir().unwrap();
        let text = onnx(SYNTHETIC, "missing.onnx");
        let e = refused(args(&config(&dir, &text)));
        assert_eq!((e.code, e.msg), (1, "cannot load the engine"), "{e}");
    }

    #[cfg(feature = "synthetic")]
    #[test]
    fn a_started_server_is_ready_and_drains() {
        let dir = tempfile::tempdir().unwrap();
        let text = format!("{SYNTHETIC}\n[server]\ndrain_delay_s = 0\n");
        let running = start(args(&config(&dir, &text))).unwrap();
        assert!(running.addr().starts_with("127.0.0.1:"));
        assert!(running.grpc_addr().is_none(), "--grpc-port 0 is no gRPC");
        let server = running.server().clone();
        assert!(server.is_ready());
        assert!(server.model("synthetic").unwrap().batcher().is_some());
        running.drain();
        assert!(running.wait(), "nothing in flight: a clean exit");
        assert!(!server.is_ready());
    }
}
