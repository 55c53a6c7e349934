//! The batching sweep: start `infer-serve` locally once per grid point (max batch size ×
//! max queue delay), drive it open-loop at the peak rate, and pick the knee under the p99
//! budget; then turn the best point into a capacity plan.
//!
//! The method is the field notes': fix the max batch size, sweep the delay in even steps, plot
//! latency against throughput, take the knee. "Throughput" here is what a replica could
//! sustain with the batches this setting forms: measured rows per batch over measured compute
//! time per batch, read from the server's own `/metrics` during the run (at a fixed offered
//! rate the *served* rate is the offered rate at every point, so it cannot rank settings).
//!
//! The pure part ([`recommend`], [`capacity_plan`]) takes measurements and returns decisions;
//! [`sweep`] is the effectful edge that starts servers (through [`crate::process::Background`]).
//! Every server is a child of this process, bound to 127.0.0.1, killed when its point is measured.
//! [`request`] turns what a user asked for into [`SweepOptions`]; [`html`] writes the report.

pub(crate) mod html;
pub(crate) mod request;

use std::path::{Path, PathBuf};

use crate::process::{Background, Cmd};
use std::time::{Duration, Instant};

use infer_spec::RuntimeConfig;

use super::load::{Arrival, Bounds, Endpoint, Load, Prepared};
pub(crate) use super::model::REPLAY_ARRIVALS;
use super::model::{self, CostModel, Policy, Predicted};
use super::v2::{Lengths, Protocol, Variant};
use super::{Error, Options, Progress, Step};
pub(crate) use request::{Base, Request};

/// One grid point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub(crate) struct Point {
    pub max_batch: u32,
    pub delay_us: u64,
}

impl std::fmt::Display for Point {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "max batch {}, delay {} ms",
            self.max_batch,
            fmt_ms(self.delay_us as f64 / 1000.0)
        )
    }
}

fn fmt_ms(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// What was measured at one point.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Measured {
    pub point: Point,
    pub step: Step,
    /// p99 latency, ms (client-side, from the scheduled send).
    pub p99_ms: f64,
    /// Mean rows per executed batch, from the server's metrics.
    pub mean_batch: Option<f64>,
    /// Rows per second one replica sustains with these batches (see the module docs).
    pub capacity_rps: Option<f64>,
    /// Served rows per second during the run.
    pub served_rps: f64,
    /// The same point replayed against the cost model fitted to the whole sweep (see
    /// [`super::model`]): queue and compute time, the part of the latency the setting changes;
    /// `None` when no model fits.
    pub predicted: Option<Predicted>,
    /// Set when the first run of this point was over budget or failing and it was measured
    /// again: that first run's p99 (ms). The fields above are the better run's.
    pub remeasured_p99_ms: Option<f64>,
}

/// Turn a measured step into a [`Measured`] (capacity from the server's metrics).
pub(crate) fn measured(point: Point, step: Step, instances: u32) -> Measured {
    let mean_batch = step.server.as_ref().and_then(|d| d.mean_batch);
    // Rows per second of busy backend: the rows inferred over the compute time they took
    // (infer-serve adds each batch's execution time once), times the instances that run
    // batches in parallel.
    let capacity_rps = step.server.as_ref().and_then(|d| match d.compute_total_us {
        Some(t) if t > 0.0 && d.rows > 0 => {
            Some(d.rows as f64 * f64::from(instances.max(1)) / (t / 1e6))
        }
        _ => None,
    });
    Measured {
        point,
        p99_ms: step.latency.p99_us as f64 / 1000.0,
        mean_batch,
        capacity_rps,
        served_rps: step.infer_per_s,
        step,
        predicted: None,
        remeasured_p99_ms: None,
    }
}

/// The recommendation and why.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Recommendation {
    pub point: Point,
    pub p99_ms: f64,
    pub capacity_rps: f64,
    /// One sentence per decision, in order.
    pub reasons: Vec<String>,
}

/// Pick the knee. For each max batch size, walk the delays upwards from the smallest whose
/// p99 is within the budget. Take the next delay only if it stays within the budget, has no
/// errors, and its capacity gain pays for the latency it adds: the relative capacity gain must
/// be positive, at least `min_gain`, and at least the relative increase of the mean latency
/// (the field notes: batching that gives little speed-up is worth less than the latency it
/// adds). Stop before the first step that fails. Across max batch sizes the highest capacity
/// wins (ties: the smaller batch).
///
/// The budget and errors are judged on what was measured. Gain and cost are read from the
/// replay against the fitted cost model where both points have one ([`Measured::predicted`]):
/// neighbouring points differ by less than a short sample's noise, and the replay removes
/// it; otherwise from the measurements (the mean, not p99, prices the latency: over a few
/// hundred requests the mean is steadier than the p99, which is one or two samples).
pub(crate) fn recommend(
    results: &[Measured],
    budget_ms: f64,
    min_gain: f64,
) -> Option<Recommendation> {
    let mut batches: Vec<u32> = results.iter().map(|m| m.point.max_batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let ok = |m: &Measured| within(m, budget_ms);
    let mut best: Option<Recommendation> = None;
    for b in batches {
        let mut row: Vec<&Measured> = results.iter().filter(|m| m.point.max_batch == b).collect();
        row.sort_by_key(|m| m.point.delay_us);
        let Some(start) = row.iter().position(|m| ok(m)) else {
            continue;
        };
        let mut cur = row[start];
        let mut reasons = vec![format!(
            "max batch {b}: delay {} ms is the first within the {} ms p99 budget (p99 {:.1} ms)",
            fmt_ms(cur.point.delay_us as f64 / 1000.0),
            fmt_ms(budget_ms),
            cur.p99_ms
        )];
        for next in &row[start + 1..] {
            let d = fmt_ms(next.point.delay_us as f64 / 1000.0);
            if !ok(next) {
                let errors: u64 = next.step.errors.values().sum();
                reasons.push(if errors > 0 {
                    format!("delay {d} ms had {errors} errors: stop")
                } else {
                    format!(
                        "delay {d} ms is over budget (p99 {:.1} ms > {} ms): stop",
                        next.p99_ms,
                        fmt_ms(budget_ms)
                    )
                });
                break;
            }
            let (gain, cost, source) = step_gain_cost(cur, next);
            if gain <= 0.0 || gain < min_gain {
                reasons.push(format!(
                    "delay {d} ms gains {:+.1}% capacity ({source}; needs > {:.0}%): no throughput gain, stop",
                    gain * 100.0,
                    min_gain * 100.0
                ));
                break;
            }
            if gain < cost {
                reasons.push(format!(
                    "delay {d} ms gains {:+.1}% capacity for {:+.1}% mean latency ({source}): not worth the latency, stop",
                    gain * 100.0,
                    cost * 100.0
                ));
                break;
            }
            reasons.push(format!(
                "delay {d} ms: p99 {:.1} ms within budget, capacity {:+.1}% for {:+.1}% mean latency ({source}): take it",
                next.p99_ms,
                gain * 100.0,
                cost * 100.0
            ));
            cur = next;
        }
        let cap = cur.capacity_rps.unwrap_or(cur.served_rps);
        let better = match &best {
            None => true,
            Some(bst) => cap > bst.capacity_rps * (1.0 + 1e-9),
        };
        if better {
            best = Some(Recommendation {
                point: cur.point,
                p99_ms: cur.p99_ms,
                capacity_rps: cap,
                reasons,
            });
        }
    }
    best
}

/// Relative capacity gain and mean-latency cost of going from `cur` to `next`, and where
/// they were read: the replay when both points have one, else the measurements.
fn step_gain_cost(cur: &Measured, next: &Measured) -> (f64, f64, &'static str) {
    let rel = |a: f64, b: f64| if a > 0.0 { b / a - 1.0 } else { 0.0 };
    if let (Some(a), Some(b)) = (cur.predicted, next.predicted) {
        return (
            rel(a.capacity_rps, b.capacity_rps),
            rel(a.mean_us, b.mean_us),
            "replayed",
        );
    }
    let gain = match (cur.capacity_rps, next.capacity_rps) {
        (Some(a), Some(n)) => rel(a, n),
        _ => 0.0,
    };
    (
        gain,
        rel(cur.step.latency.mean_us, next.step.latency.mean_us),
        "measured",
    )
}

/// Fit the cost model to the sweep and fill in every point's [`Measured::predicted`]
/// (server-side times: queue and compute). Returns the model, or why there is none (then nothing is
/// predicted and the recommendation rests on the measurements alone).
pub(crate) fn predict(
    results: &mut [Measured],
    rate: f64,
    arrival: Arrival,
    base: &RuntimeConfig,
    lengths: &[usize],
    seed: u64,
) -> Result<CostModel, model::NoFit> {
    let cost = model::fit(results)?;
    let batching = &base.batching;
    for m in results.iter_mut() {
        // The point's own bounds: a padded model's default token budget grows with its rows.
        let mut at = base.clone();
        at.batching.max_batch_size = m.point.max_batch;
        let padding = at.padded_bounds().map(|b| (b, lengths.to_vec()));
        let policy = Policy {
            max_batch: m.point.max_batch,
            delay_us: m.point.delay_us,
            preferred: batching
                .preferred_batch_sizes
                .iter()
                .copied()
                .filter(|&p| p <= m.point.max_batch)
                .collect(),
            instances: batching.instances,
            adaptive: batching.adaptive_delay(),
            padding,
        };
        m.predicted = model::replay(&cost, &policy, rate, arrival, model::REPLAY_ARRIVALS, seed);
    }
    Ok(cost)
}

/// The sequence length, in tokens, of each request `variants` sends in turn: a padded tensor
/// model's as sent; a text model's as the server tokenizes it (TEI's `POST /tokenize`, one
/// call per request; a request's length is its longest row, a pair's the two texts' tokens
/// together); none for a model of fixed shapes.
async fn request_lengths(ep: &Endpoint, variants: &[Variant]) -> Result<Vec<usize>, Error> {
    let mut out = Vec::with_capacity(variants.len());
    for v in variants {
        if let Some(l) = v.length {
            out.push(l as usize);
            continue;
        }
        let Some(first) = v.texts.first() else {
            return Ok(Vec::new());
        };
        let mut rows = vec![0usize; first.len()];
        for texts in &v.texts {
            let body = serde_json::json!({ "inputs": texts }).to_string();
            let req = Prepared {
                method: hyper::Method::POST,
                path: format!("{}/tokenize", ep.base),
                content_type: "application/json",
                header_len: None,
                body: body.into(),
            };
            let (status, answer) = super::load::fetch(ep, &req).await?;
            let tokens: Option<Vec<Vec<serde_json::Value>>> = status
                .is_success()
                .then(|| serde_json::from_slice(&answer).ok())
                .flatten();
            let Some(tokens) = tokens.filter(|t| t.len() == rows.len()) else {
                return Err(Error::Status {
                    url: ep.url("/tokenize"),
                    status: status.as_u16(),
                    body: String::from_utf8_lossy(&answer).chars().take(300).collect(),
                });
            };
            for (row, t) in rows.iter_mut().zip(&tokens) {
                *row += t.len();
            }
        }
        out.push(rows.into_iter().max().unwrap_or(0));
    }
    Ok(out)
}

/// `T(b)` in ms as a reader writes it: per row, or per token computed for a padded model.
pub(crate) fn cost_formula(m: &CostModel) -> String {
    if m.per_token() {
        format!(
            "{:.2} + {:.4} x tokens ms (tokens = rows x the batch's longest sequence)",
            m.fixed_us / 1000.0,
            m.per_token_us / 1000.0
        )
    } else {
        format!(
            "{:.2} + {:.3} x b ms",
            m.fixed_us / 1000.0,
            m.per_row_us / 1000.0
        )
    }
}

/// How many replicas and when to scale out.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct CapacityPlan {
    pub peak_qps: f64,
    pub per_replica_qps: f64,
    pub headroom: f64,
    /// ceil(peak / per replica × headroom).
    pub replicas: u32,
    /// Scale out when a replica serves this many requests per second (70% of its limit).
    pub scale_out_qps: f64,
    pub formula: String,
}

/// Fraction of a replica's limit at which to scale out.
pub(crate) const SCALE_OUT_FRACTION: f64 = 0.7;

/// replicas = ceil(peak QPS / best QPS per replica × headroom), at least 1.
pub(crate) fn capacity_plan(peak_qps: f64, per_replica_qps: f64, headroom: f64) -> CapacityPlan {
    let raw = if per_replica_qps > 0.0 {
        peak_qps / per_replica_qps * headroom
    } else {
        f64::INFINITY
    };
    // Guard against 2.0000000001 becoming 3 from float noise.
    let replicas = if raw.is_finite() {
        ((raw - 1e-9).ceil().max(1.0)) as u32
    } else {
        u32::MAX
    };
    CapacityPlan {
        peak_qps,
        per_replica_qps,
        headroom,
        replicas,
        scale_out_qps: per_replica_qps * SCALE_OUT_FRACTION,
        formula: format!(
            "replicas = ceil({peak_qps:.1} / {per_replica_qps:.1} x {headroom}) = ceil({raw:.2}) = {replicas}"
        ),
    }
}

/// The settings of a sweep.
#[derive(Debug, Clone)]
pub(crate) struct SweepOptions {
    /// The runtime configuration to start from; its batching is overridden per point.
    pub base: RuntimeConfig,
    /// Directory `base`'s relative engine path is relative to.
    pub base_dir: PathBuf,
    /// The `infer-serve` binary.
    pub serve: PathBuf,
    pub max_batches: Vec<u32>,
    pub delays_us: Vec<u64>,
    pub rate: f64,
    pub arrival: Arrival,
    pub warmup: Duration,
    pub duration: Duration,
    pub budget_ms: f64,
    pub min_gain: f64,
    pub headroom: f64,
    pub ready_timeout: Duration,
    /// Where a line per measured point goes.
    pub progress: Progress,
    pub seed: u64,
    /// Text and padded models: the lengths of the requests sent (`bench::Options::lengths`).
    pub lengths: Lengths,
}

/// Everything a sweep produced.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct SweepResult {
    pub budget_ms: f64,
    pub rate: f64,
    pub results: Vec<Measured>,
    /// The backend's cost per batch fitted to the sweep; `None` with the reason in
    /// `model_refused` when the measurements do not support one.
    pub model: Option<CostModel>,
    pub model_refused: Option<String>,
    pub recommendation: Option<Recommendation>,
    pub capacity: Option<CapacityPlan>,
    /// What the sweep was given and where its budget and peak came from (set by [`Resolved::run`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<InputSummary>,
}

/// What `bench --tune FILE` was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum InputKind {
    /// A recipe: batching, SLO and peak rate from it, tract on its ONNX model.
    Recipe,
    /// A `runtime.toml` as images carry.
    RuntimeConfig,
}

/// Pure: which kind of file `text` is, by content. A recipe has `[model] onnx` or a
/// `targets` key (`[targets]` or `[[targets]]`); anything else, unparsable text included, is
/// read as a runtime configuration (whose parser then says what is wrong).
pub(crate) fn input_kind(text: &str) -> InputKind {
    let Ok(doc) = toml::from_str::<toml::Table>(text) else {
        return InputKind::RuntimeConfig;
    };
    let onnx = doc
        .get("model")
        .and_then(toml::Value::as_table)
        .is_some_and(|m| m.contains_key("onnx"));
    if onnx || doc.contains_key("targets") {
        InputKind::Recipe
    } else {
        InputKind::RuntimeConfig
    }
}

/// The input of a sweep and the origin of its budget and peak rate (`--budget-ms`,
/// `deploy.latency_slo_ms`, `--peak-qps`, `--rate`, `deploy.peak_qps`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct InputSummary {
    pub kind: InputKind,
    pub file: PathBuf,
    pub budget_ms_from: String,
    pub peak_qps: f64,
    pub peak_qps_from: String,
}

/// A free loopback port (the OS picks; closed again before the server binds it).
fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A server started for one point (stopped when dropped) and its log.
struct Server {
    process: Background,
    log: PathBuf,
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

/// The runtime configuration for one point: the base with this point's batching, a loopback
/// listener, an absolute engine path, and quick shutdown.
pub(crate) fn point_config(
    base: &RuntimeConfig,
    base_dir: &Path,
    p: Point,
    port: u16,
) -> RuntimeConfig {
    let mut c = base.clone();
    c.batching.max_batch_size = p.max_batch;
    c.batching.max_queue_delay_us = p.delay_us;
    c.batching
        .preferred_batch_sizes
        .retain(|&s| s <= p.max_batch);
    if let Some(path) = &c.engine.path {
        let pb = Path::new(path);
        if pb.is_relative() {
            c.engine.path = Some(base_dir.join(pb).to_string_lossy().into_owned());
        }
    }
    if let Some(path) = &c.engine.metadata {
        let pb = Path::new(path);
        if pb.is_relative() {
            c.engine.metadata = Some(base_dir.join(pb).to_string_lossy().into_owned());
        }
    }
    c.server.host = "127.0.0.1".into();
    c.server.port = port;
    c.server.drain_delay_s = 0;
    c
}

fn start(opts: &SweepOptions, p: Point, dir: &Path) -> Result<(Server, String), Error> {
    let fail = |why: String| Error::Serve {
        point: p.to_string(),
        why,
    };
    let port = free_port().map_err(|e| fail(format!("no free port: {e}")))?;
    let cfg = point_config(&opts.base, &opts.base_dir, p, port);
    let cfg_path = dir.join(format!("runtime-b{}-d{}.toml", p.max_batch, p.delay_us));
    std::fs::write(&cfg_path, cfg.to_toml_string()).map_err(|e| Error::Write {
        path: cfg_path.clone(),
        source: e,
    })?;
    let log = dir.join(format!("serve-b{}-d{}.log", p.max_batch, p.delay_us));
    let out = std::fs::File::create(&log).map_err(|e| Error::Write {
        path: log.clone(),
        source: e,
    })?;
    let cmd = Cmd::new(opts.serve.to_string_lossy())
        .arg("--config")
        .arg(cfg_path.to_string_lossy())
        .env("INFER_HOST", "127.0.0.1")
        .env("INFER_PORT", port.to_string())
        // Tuning measures HTTP; no gRPC port to collide with other servers on this host.
        .env("INFER_GRPC_PORT", "0");
    let process = Background::start(&cmd, &out).map_err(|e| {
        let cause = std::error::Error::source(&e).map(|s| format!(": {s}"));
        fail(format!("{e}{}", cause.unwrap_or_default()))
    })?;
    Ok((Server { process, log }, format!("http://127.0.0.1:{port}")))
}

async fn wait_ready(
    server: &mut Server,
    ep: &Endpoint,
    timeout: Duration,
    p: Point,
) -> Result<(), Error> {
    let t0 = Instant::now();
    let probe = Prepared::get(ep, "/v2/health/ready");
    loop {
        if let Some(status) = server.process.exited() {
            return Err(Error::Serve {
                point: p.to_string(),
                why: format!(
                    "exited with {status} before ready; log:\n{}",
                    log_tail(&server.log)
                ),
            });
        }
        if let Ok((s, _)) = super::load::fetch(ep, &probe).await {
            if s.is_success() {
                return Ok(());
            }
        }
        if t0.elapsed() > timeout {
            return Err(Error::Serve {
                point: p.to_string(),
                why: format!(
                    "not ready after {:.0} s; log:\n{}",
                    timeout.as_secs_f64(),
                    log_tail(&server.log)
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn within(m: &Measured, budget_ms: f64) -> bool {
    m.p99_ms <= budget_ms && m.step.errors.values().sum::<u64>() == 0 && m.step.ok > 0
}

/// Start a server with this point's batching, drive it for one measured step, stop it. The
/// first call (with `lengths` empty) also reads the length of each request sent in turn.
fn measure_point(
    opts: &SweepOptions,
    rt: &tokio::runtime::Runtime,
    p: Point,
    dir: &Path,
    lengths: &mut Option<Vec<usize>>,
) -> Result<Measured, Error> {
    let (mut server, url) = start(opts, p, dir)?;
    let bench = Options {
        url: url.clone(),
        model: opts.base.model.name.clone(),
        protocol: Protocol::Binary,
        batch: 1,
        lengths: opts.lengths,
        loads: vec![Load::Rate(opts.rate)],
        arrival: opts.arrival,
        bounds: Bounds {
            warmup: opts.warmup,
            duration: opts.duration,
            max_requests: (opts.rate * opts.duration.as_secs_f64() * 2.0).ceil() as u64 + 10,
            max_inflight: 4096,
        },
        seed: opts.seed,
        progress: Progress::default(),
    };
    let step = rt.block_on(async {
        let ep = Endpoint::resolve(&url).await?;
        wait_ready(&mut server, &ep, opts.ready_timeout, p).await?;
        let (reqs, variants) = super::prepare(&ep, &bench).await?;
        if lengths.is_none() {
            *lengths = Some(request_lengths(&ep, &variants).await?);
        }
        Ok::<Step, Error>(super::step(&ep, &reqs, &bench, Load::Rate(opts.rate)).await)
    })?;
    drop(server);
    Ok(measured(p, step, opts.base.batching.instances))
}

/// Run the whole grid.
pub(crate) fn sweep(opts: &SweepOptions) -> Result<SweepResult, Error> {
    if opts.max_batches.is_empty() || opts.delays_us.is_empty() {
        return Err(Error::Options(
            "the grid is empty (give --max-batch and --delays-ms)".into(),
        ));
    }
    if !(opts.rate.is_finite() && opts.rate > 0.0) {
        return Err(Error::TuneInput(
            "a positive request rate (the recipe's deploy peak QPS, or --rate)".into(),
        ));
    }
    let dir = tempfile::tempdir().map_err(|e| Error::Write {
        path: std::env::temp_dir(),
        source: e,
    })?;
    let rt = super::runtime()?;
    let mut grid = Vec::new();
    for &b in &opts.max_batches {
        for &d in &opts.delays_us {
            grid.push(Point {
                max_batch: b,
                delay_us: d,
            });
        }
    }
    grid.sort();
    grid.dedup();
    let mut lengths = None;
    let mut results = Vec::new();
    for (i, &p) in grid.iter().enumerate() {
        let mut m = measure_point(opts, &rt, p, dir.path(), &mut lengths)?;
        // One sample of a few hundred requests on a shared machine can catch a stall that is
        // not the setting's: a point over budget or with errors is measured once more, and
        // counts as over only when both runs say so (the better run is kept, both reported).
        if !within(&m, opts.budget_ms) {
            let again = measure_point(opts, &rt, p, dir.path(), &mut lengths)?;
            opts.progress.line(|| {
                format!(
                    "tune [{}/{}] {p}: p99 {:.1} ms, errors {}: over budget or failing, measured again: p99 {:.1} ms, errors {}",
                    i + 1,
                    grid.len(),
                    m.p99_ms,
                    m.step.errors.values().sum::<u64>(),
                    again.p99_ms,
                    again.step.errors.values().sum::<u64>()
                )
            });
            let first_p99 = m.p99_ms;
            if within(&again, opts.budget_ms) || again.p99_ms < m.p99_ms {
                m = again;
            }
            m.remeasured_p99_ms = Some(first_p99);
        }
        opts.progress.line(|| {
            format!(
                "tune [{}/{}] {p}: p99 {:.1} ms, batch {}, capacity {} rows/s, errors {}",
                i + 1,
                grid.len(),
                m.p99_ms,
                m.mean_batch.map_or("-".into(), |b| format!("{b:.2}")),
                m.capacity_rps.map_or("-".into(), |c| format!("{c:.1}")),
                m.step.errors.values().sum::<u64>()
            )
        });
        results.push(m);
    }
    let fitted = predict(
        &mut results,
        opts.rate,
        opts.arrival,
        &opts.base,
        lengths.as_deref().unwrap_or_default(),
        opts.seed,
    );
    opts.progress.line(|| match &fitted {
        Ok(m) => format!(
            "tune: cost model T(b) = {} (fits every point within {:.1}%); gains and costs are read from its replay",
            cost_formula(m),
            m.max_rel_error * 100.0
        ),
        Err(why) => format!(
            "tune: no cost model ({why}); gains and costs are read from the measurements"
        ),
    });
    let recommendation = recommend(&results, opts.budget_ms, opts.min_gain);
    let capacity = recommendation
        .as_ref()
        .map(|r| capacity_plan(opts.rate, r.capacity_rps, opts.headroom));
    Ok(SweepResult {
        budget_ms: opts.budget_ms,
        rate: opts.rate,
        results,
        model_refused: fitted.as_ref().err().map(ToString::to_string),
        model: fitted.ok(),
        recommendation,
        capacity,
        input: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::metrics::ServerDelta;
    use crate::bench::stats::Summary;

    #[test]
    fn input_kind_by_content() {
        let recipe = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mlp/recipe.toml"),
        )
        .unwrap();
        assert_eq!(input_kind(&recipe), InputKind::Recipe);
        assert_eq!(
            input_kind("[model]\nname = \"m\"\n[[targets]]\ngpu = \"L4\"\n"),
            InputKind::Recipe
        );
        let runtime = "[model]\nname = \"m\"\n[engine]\nkind = \"tract-onnx\"\npath = \"m.onnx\"\n";
        assert_eq!(input_kind(runtime), InputKind::RuntimeConfig);
        assert_eq!(input_kind("not [toml"), InputKind::RuntimeConfig);
        assert_eq!(input_kind(""), InputKind::RuntimeConfig);
    }

    /// A measured point with p99 and capacity given directly.
    fn m(b: u32, delay_ms: u64, p99_ms: f64, cap: f64, errors: u64) -> Measured {
        let mut errs = std::collections::BTreeMap::new();
        if errors > 0 {
            errs.insert("503".to_string(), errors);
        }
        let step = Step {
            load: Load::Rate(20.0),
            batch: 1,
            sent: 100,
            ok: 100 - errors,
            errors: errs,
            elapsed_s: 5.0,
            req_per_s: 20.0,
            infer_per_s: 20.0,
            latency: Summary {
                p99_us: (p99_ms * 1000.0) as u64,
                mean_us: p99_ms * 700.0,
                ..Summary::default()
            },
            server: Some(ServerDelta::default()),
        };
        Measured {
            point: Point {
                max_batch: b,
                delay_us: delay_ms * 1000,
            },
            p99_ms,
            mean_batch: None,
            capacity_rps: Some(cap),
            served_rps: 20.0,
            step,
            predicted: None,
            remeasured_p99_ms: None,
        }
    }

    fn check(results: &[Measured], budget: f64, expected: Option<(u32, u64)>, why: &str) {
        let r = recommend(results, budget, 0.05);
        assert_eq!(
            r.as_ref()
                .map(|r| (r.point.max_batch, r.point.delay_us / 1000)),
            expected,
            "{r:?}"
        );
        if let Some(r) = r {
            assert!(r.reasons.last().unwrap().contains(why), "{:?}", r.reasons);
        }
    }

    #[test]
    fn the_field_table_gives_thirty_ms() {
        // The field notes' worked example: T(b) = 40 + 6b ms, 200 ms budget.
        let cap = |b: f64| b / (40.0 + 6.0 * b) * 1000.0;
        let table = [
            m(8, 0, 120.0, cap(1.0), 0),
            m(8, 10, 150.0, cap(2.0), 0),
            m(8, 20, 165.0, cap(3.0), 0),
            m(8, 30, 180.0, cap(4.0), 0),
            m(8, 40, 201.0, cap(5.0), 0),
            m(8, 50, 220.0, cap(6.0), 0),
        ];
        check(&table, 200.0, Some((8, 30)), "over budget");
    }

    /// The same example as it really queues (Poisson arrivals at 20 req/s form batches of
    /// only 1.3 to 2 rows over these delays, not the table's 1 to 6): the measured steps are
    /// too noisy to rank, the replayed ones are not, and their knee is the table's ~30 ms.
    #[test]
    fn the_replayed_field_example_gives_about_thirty_ms() {
        let cost = CostModel {
            fixed_us: 40_000.0,
            per_row_us: 6_000.0,
            per_token_us: 0.0,
            max_rel_error: 0.0,
        };
        // Measured values deliberately misleading: flat capacity, so the measurements alone
        // would stop at 0 ms.
        let mut points: Vec<Measured> = (0..=5).map(|i| m(8, i * 10, 130.0, 30.0, 0)).collect();
        for p in &mut points {
            let policy = Policy {
                max_batch: 8,
                delay_us: p.point.delay_us,
                preferred: vec![],
                instances: 1,
                adaptive: false,
                padding: None,
            };
            p.predicted = model::replay(&cost, &policy, 20.0, Arrival::Poisson, 50_000, 1);
        }
        let r = recommend(&points, 200.0, 0.02).unwrap();
        assert!((20..=40).contains(&(r.point.delay_us / 1000)), "{r:?}");
        assert!(
            r.reasons.iter().skip(1).all(|s| s.contains("replayed")),
            "{r:?}"
        );
        // Without predictions the same points fall back to the measurements.
        for p in &mut points {
            p.predicted = None;
        }
        let r = recommend(&points, 200.0, 0.02).unwrap();
        assert_eq!(r.point.delay_us, 0);
        assert!(r.reasons[1].contains("measured"), "{r:?}");
    }

    #[test]
    fn no_gain_stops_the_walk_and_errors_disqualify() {
        let flat = [
            m(8, 0, 50.0, 100.0, 0),
            m(8, 10, 60.0, 130.0, 0),
            m(8, 20, 70.0, 143.0, 0),
            m(8, 30, 80.0, 200.0, 0),
        ];
        check(&flat, 200.0, Some((8, 10)), "not worth the latency");
        let no_gain = [m(8, 0, 50.0, 100.0, 0), m(8, 10, 40.0, 99.0, 0)];
        check(&no_gain, 200.0, Some((8, 0)), "no throughput gain");
        let errs = [m(8, 0, 50.0, 100.0, 0), m(8, 10, 60.0, 130.0, 3)];
        check(&errs, 200.0, Some((8, 0)), "errors");
        check(&[m(8, 0, 250.0, 100.0, 0)], 200.0, None, "");
    }

    #[test]
    fn best_max_batch_wins() {
        let r = [
            m(4, 0, 100.0, 50.0, 0),
            m(4, 10, 120.0, 60.0, 0),
            m(8, 0, 100.0, 50.0, 0),
            m(8, 10, 130.0, 70.0, 0),
        ];
        check(&r, 200.0, Some((8, 10)), "take it");
    }

    #[test]
    fn replicas_follow_the_formula() {
        let p = capacity_plan(1000.0, 250.0, 1.3);
        assert_eq!(p.replicas, 6); // 1000 / 250 x 1.3 = 5.2 -> 6
        assert!((p.scale_out_qps - 175.0).abs() < 1e-9);
        assert!(p.formula.contains("= 6"), "{}", p.formula);
        assert_eq!(capacity_plan(500.0, 250.0, 1.0).replicas, 2);
        assert_eq!(capacity_plan(1.0, 250.0, 1.5).replicas, 1);
        assert_eq!(capacity_plan(1.0, 0.0, 1.5).replicas, u32::MAX);
    }
}
