//! `infer-serve`: the image entrypoint. See the crate docs in `lib.rs`.
//!
//! Start-up order: parse flags → read `runtime.toml` → bind the HTTP and gRPC ports and serve
//! (live at once, ready later) → load the engine → warm up every instance → start the batcher
//! → ready. SIGTERM/SIGINT: readiness 503 at once, HTTP responses say `Connection: close` and
//! gRPC connections get GOAWAY, keep serving for `drain_delay_s` (a second signal cuts it
//! short), stop accepting, finish in-flight requests within `exit_timeout_s`, exit 0 (1 when
//! the timeout forced the exit). Exit 2: bad flags or config; 1: the engine failed to
//! load or warm up.
#![cfg_attr(
    test,
    allow(
        clippy::disallowed_macros,
        clippy::disallowed_methods,
        reason = "tests start tools and print why they skip"
    )
)]

use infer_serve::args::{self, Command};
use infer_serve::batcher::{Batcher, Policy};
use infer_serve::http::{self, App};
use infer_serve::metrics::Metrics;
use infer_serve::{backend, grpc, log, warmup};
use infer_spec::engine::{check_compat, EngineMeta};
use infer_spec::RuntimeConfig;
use serde_json::json;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Backend instances allowed per CPU: more only make the instances take turns on the cores.
const MAX_INSTANCES_PER_CPU: u64 = 4;

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

/// Descriptors kept for everything but client connections (the listeners, the engine's files
/// and libraries, the runtime's own) when the connection cap is derived from the limit.
const FD_HEADROOM: u64 = 256;

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

fn fail(code: i32, msg: &str, fields: &[(&str, serde_json::Value)]) -> ! {
    log::error(msg, fields);
    std::process::exit(code);
}

#[allow(
    clippy::disallowed_macros,
    reason = "the runtime's own command line: --help, --version and usage errors; logs go through `log`"
)]
fn main() {
    let started = Instant::now();
    let args = match args::parse(std::env::args().skip(1), |k| std::env::var(k).ok()) {
        Ok(Command::Run(a)) => a,
        Ok(Command::Help) => {
            print!("{}", args::USAGE);
            return;
        }
        Ok(Command::Version) => {
            println!("infer-serve {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Err(e) => {
            eprint!("infer-serve: {e}\n{}", args::USAGE);
            std::process::exit(2);
        }
    };
    let path = args.config.display().to_string();
    if let Err(e) = regular_file(&args.config) {
        fail(
            2,
            "cannot read the runtime config",
            &[("path", json!(path)), ("error", json!(e))],
        )
    }
    let text = std::fs::read_to_string(&args.config).unwrap_or_else(|e| {
        fail(
            2,
            "cannot read the runtime config",
            &[("path", json!(path)), ("error", json!(e.to_string()))],
        )
    });
    let mut cfg = RuntimeConfig::from_toml_str(&text).unwrap_or_else(|e| {
        fail(
            2,
            "bad runtime config",
            &[("path", json!(path)), ("error", json!(e.to_string()))],
        )
    });
    if let Some(h) = args.host {
        cfg.server.host = h;
    }
    if let Some(p) = args.port {
        cfg.server.port = p;
    }
    let base = args.config.parent().unwrap_or(Path::new(".")).to_path_buf();
    // Bounds that depend on this machine (the rest are in `RuntimeConfig::problems`).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let most = MAX_INSTANCES_PER_CPU * cpus as u64;
    if u64::from(cfg.batching.instances) > most {
        fail(
            2,
            "bad runtime config",
            &[
                ("path", json!(path)),
                (
                    "error",
                    json!(format!(
                        "batching.instances {} is more than {MAX_INSTANCES_PER_CPU} per CPU ({cpus} CPUs here: at most {most})",
                        cfg.batching.instances
                    )),
                ),
            ],
        )
    }
    // Files the config names must be regular files: a FIFO or a device would block the start
    // or feed it without end, a directory gives an obscure error.
    for (key, rel) in [
        ("engine.path", cfg.engine.path.as_deref()),
        ("engine.metadata", cfg.engine.metadata.as_deref()),
        ("engine.library", cfg.engine.library.as_deref()),
        ("warmup.samples", cfg.warmup.samples.as_deref()),
    ] {
        let Some(rel) = rel else { continue };
        let p = base.join(rel);
        if let Err(e) = regular_file(&p) {
            fail(
                2,
                "bad runtime config",
                &[
                    ("path", json!(path)),
                    ("error", json!(format!("{key}: {e}"))),
                ],
            )
        }
    }

    // The warm-up samples are read now, from the open file (a FIFO or a device put there after
    // the check above is refused too, and a file over the bound is not read past it); they are
    // decoded at warm-up.
    let sizes = cfg.warmup_batch_sizes();
    let samples_text = match &cfg.warmup.samples {
        Some(rel) if !sizes.is_empty() => {
            let p = base.join(rel);
            match warmup::read_samples(&p) {
                Ok(text) => Some((p, text)),
                Err(warmup::ReadError::Refused(e)) => fail(
                    2,
                    "bad runtime config",
                    &[
                        ("path", json!(path)),
                        ("error", json!(format!("warmup.samples: {e}"))),
                    ],
                ),
                Err(warmup::ReadError::Io(e)) => fail(
                    1,
                    "cannot read the warm-up samples",
                    &[("error", json!(format!("warm-up samples {e}")))],
                ),
            }
        }
        _ => None,
    };

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| {
            fail(
                1,
                "cannot start the async runtime",
                &[("error", json!(e.to_string()))],
            )
        });
    // What this node has for the engine (GPU, driver, TensorRT library for a TensorRT engine),
    // read before anything else: a node without them fails here, exit 1, naming what is missing.
    let found = backend::node(&cfg, &base).unwrap_or_else(|e| {
        fail(
            1,
            "this node cannot run the engine; not starting",
            &[
                ("engine", json!(cfg.engine.kind.as_str())),
                ("error", json!(e)),
            ],
        )
    });
    if let Some(v) = &found.onnxruntime {
        let threads = cfg.intra_op_threads(cpus);
        let instances = cfg.batching.instances as usize;
        log::info(
            "node",
            &[
                ("engine", json!(cfg.engine.kind.as_str())),
                ("onnxruntime", json!(v.to_string())),
                ("library", json!(cfg.engine.library)),
                ("threads_per_instance", json!(threads)),
                ("instances", json!(instances)),
                ("cpus", json!(cpus)),
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
    let metrics = Arc::new(Metrics::new(
        &cfg.model.name,
        &cfg.model.version,
        cfg.batching.max_batch_size,
    ));
    let mut app = App::new(cfg.clone(), metrics.clone());
    app.set_node(&found);
    app.busy_poll = Duration::from_micros(
        args.busy_poll_us
            .unwrap_or_else(|| args::default_busy_poll_us(cpus)),
    );
    // Connections are descriptors: the soft limit goes up to the hard one, and the cap per
    // listener comes down to what the limit holds beside the server's own files.
    let open_files = raise_open_files_limit();
    let listeners = 1 + u64::from(args::grpc_port(args.grpc_port, cfg.server.port).is_some());
    if let Some(limit) = open_files {
        let fits = (limit.saturating_sub(FD_HEADROOM) / listeners).max(1);
        if (app.max_connections as u64) > fits {
            log::log(
                "warn",
                "server.max_connections is more than the open-files limit allows: lowered",
                &[
                    ("max_connections", json!(app.max_connections)),
                    ("lowered_to", json!(fits)),
                    ("open_files_limit", json!(limit)),
                    ("listeners", json!(listeners)),
                ],
            );
            app.max_connections = fits as usize;
        }
    }
    let app = Arc::new(app);

    let addr = format!("{}:{}", cfg.server.host, cfg.server.port);
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(&addr))
        .unwrap_or_else(|e| {
            fail(
                1,
                "cannot bind",
                &[("addr", json!(addr)), ("error", json!(e.to_string()))],
            )
        });
    let local = listener.local_addr().map(|a| a.to_string()).unwrap_or(addr);
    let grpc_listener = args::grpc_port(args.grpc_port, cfg.server.port).map(|port| {
        let addr = format!("{}:{port}", cfg.server.host);
        rt.block_on(tokio::net::TcpListener::bind(&addr))
            .unwrap_or_else(|e| {
                fail(
                    1,
                    "cannot bind the gRPC port",
                    &[("addr", json!(addr)), ("error", json!(e.to_string()))],
                )
            })
    });
    let grpc_local = grpc_listener
        .as_ref()
        .and_then(|l| l.local_addr().ok())
        .map(|a| a.to_string());
    log::info(
        "listening",
        &[
            ("addr", json!(local)),
            ("grpc_addr", json!(grpc_local)),
            ("model", json!(cfg.model.name)),
            ("version", json!(cfg.model.version)),
            ("engine", json!(cfg.engine.kind.as_str())),
            ("config", json!(path)),
            ("busy_poll_us", json!(app.busy_poll.as_micros() as u64)),
            ("max_connections", json!(app.max_connections)),
            ("open_files_limit", json!(open_files)),
        ],
    );

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    rt.spawn(lifecycle(app.clone(), stop_tx));
    let exit_timeout = Duration::from_secs(cfg.server.exit_timeout_s);
    let grpc_server =
        grpc_listener.map(|l| rt.spawn(grpc::serve(app.clone(), l, stop_rx.clone(), exit_timeout)));
    let server = rt.spawn(http::serve(app.clone(), listener, stop_rx, exit_timeout));

    // The engine's compatibility tuple, when the image carries one: refuse to start on a node
    // it was not built for instead of failing (or silently slowing down) later.
    if let Some(meta) = &cfg.engine.metadata {
        let p = base.join(meta);
        let shown = json!(p.display().to_string());
        let bytes = std::fs::read(&p).unwrap_or_else(|e| {
            fail(
                1,
                "cannot read the engine metadata",
                &[("path", shown.clone()), ("error", json!(e.to_string()))],
            )
        });
        let meta = EngineMeta::from_json(&bytes).unwrap_or_else(|e| {
            fail(
                1,
                "bad engine metadata",
                &[("path", shown.clone()), ("error", json!(e.to_string()))],
            )
        });
        if let Err(e) = check_compat(&meta, &found) {
            fail(
                1,
                "the engine does not match this node; not starting",
                &[("path", shown), ("error", json!(e.to_string()))],
            );
        }
        log::info(
            "engine matches this node",
            &[("engine", json!(meta.describe()))],
        );
    }

    // Engine load and warm-up run here, on the main thread, while the server already answers
    // liveness (and says not ready).
    let t = Instant::now();
    let engine = backend::load(&cfg, &base)
        .unwrap_or_else(|e| fail(1, "cannot load the engine", &[("error", json!(e))]));
    let load = t.elapsed();
    metrics
        .engine_load_us
        .store(load.as_micros() as u64, Relaxed);
    log::info(
        "engine loaded",
        &[("engine_load_seconds", json!(load.as_secs_f64()))],
    );

    let t = Instant::now();
    let runs = warmup::runs(&cfg);
    // Sample requests (`[warmup] samples`) are decoded as requests are; a bad one stops here.
    let samples = match samples_text {
        Some((p, text)) => warmup::Samples::decode(&cfg, &p, &text)
            .unwrap_or_else(|e| fail(1, "cannot read the warm-up samples", &[("error", json!(e))])),
        None => warmup::Samples::default(),
    };
    let mut backends = Vec::new();
    for instance in 0..cfg.batching.instances {
        let mut b = engine.instance().unwrap_or_else(|e| {
            fail(
                1,
                "cannot create a backend instance",
                &[("instance", json!(instance)), ("error", json!(e))],
            )
        });
        for (i, inputs) in samples.requests().iter().enumerate() {
            if let Err(e) = warmup::run_sample(&cfg, b.as_mut(), inputs) {
                fail(
                    1,
                    "warm-up failed on a sample request; not starting",
                    &[
                        ("instance", json!(instance)),
                        ("sample", json!(i)),
                        ("error", json!(e)),
                    ],
                );
            }
        }
        for (rows, shapes) in &runs {
            if let Err(e) = warmup::run_at(&cfg, b.as_mut(), &samples, *rows, shapes) {
                fail(
                    1,
                    "warm-up failed; not starting",
                    &[
                        ("instance", json!(instance)),
                        ("batch_size", json!(rows)),
                        ("shapes", json!(shapes)),
                        ("error", json!(e)),
                    ],
                );
            }
        }
        backends.push(b);
    }
    let warm = t.elapsed();
    metrics.warmup_us.store(warm.as_micros() as u64, Relaxed);
    let policy = Policy {
        busy_poll: app.busy_poll,
        ..Policy::from_config(&cfg)
    };
    let batcher = Batcher::start(policy, backends, metrics.clone()).unwrap_or_else(|e| {
        fail(
            1,
            "cannot start the batcher",
            &[("error", json!(e.to_string()))],
        )
    });
    let _ = app.batcher.set(batcher);
    if !app.draining.load(Relaxed) {
        metrics.ready.store(1, Relaxed);
    }
    log::info(
        "ready",
        &[
            ("warmup_seconds", json!(warm.as_secs_f64())),
            ("warmup_batch_sizes", json!(sizes)),
            ("warmup_samples", json!(samples.len())),
            ("instances", json!(cfg.batching.instances)),
            (
                "start_to_ready_seconds",
                json!(started.elapsed().as_secs_f64()),
            ),
        ],
    );

    let clean = rt.block_on(async {
        let http_clean = server.await.unwrap_or(false);
        let grpc_clean = match grpc_server {
            Some(g) => g.await.unwrap_or(false),
            None => true,
        };
        http_clean && grpc_clean
    });
    if clean {
        log::info("exiting", &[("code", json!(0))]);
        std::process::exit(0);
    }
    fail(
        1,
        "exit timeout reached with requests still in flight",
        &[("code", json!(1))],
    );
}

/// Waits for SIGTERM or SIGINT, then runs the drain sequence. As PID 1 in a container the
/// kernel ignores signals without a handler, so installing these is what makes `docker stop`
/// and Kubernetes work.
async fn lifecycle(app: Arc<App>, stop: tokio::sync::watch::Sender<bool>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        _ => fail(1, "cannot install signal handlers", &[]),
    };
    let name = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    app.drain();
    let drain = Duration::from_secs(app.cfg.server.drain_delay_s);
    log::info(
        "draining: readiness now 503, still serving",
        &[
            ("signal", json!(name)),
            ("drain_delay_s", json!(drain.as_secs_f64())),
            ("in_flight", json!(app.metrics.in_flight.load(Relaxed))),
        ],
    );
    tokio::select! {
        _ = tokio::time::sleep(drain) => {}
        _ = term.recv() => log::info("second signal: ending the drain delay early", &[]),
        _ = int.recv() => log::info("second signal: ending the drain delay early", &[]),
    }
    let _ = stop.send(true);
}
