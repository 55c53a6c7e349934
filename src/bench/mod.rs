//! `bench` measures V2 inference servers and tunes batching.
//!
//! What it owns: the load generator ([`load`]: closed-loop concurrency and open-loop fixed
//! rate over HTTP/1.1 keep-alive, JSON or binary tensors from [`v2`]), exact latency
//! statistics ([`stats`]), reading the server's `/metrics` before and after each step
//! ([`metrics`]), the CSV and HTML/SVG reports ([`report`]) and the batching sweep with its
//! capacity plan ([`tune`]).
//!
//! What it must not do: decide exit codes or print anything but progress lines (the CLI owns
//! the terminal); parse recipes itself (`pipeline::tune_base` hands it a runtime
//! configuration); hide client-side saturation (open-loop sends it cannot make are counted as
//! `client_overload` errors, never silently skipped). Every run is bounded in time and in
//! request count.

pub(crate) mod load;
pub(crate) mod metrics;
pub(crate) mod model;
pub(crate) mod report;
pub(crate) mod stats;
pub(crate) mod tune;
pub(crate) mod v2;

use std::time::Duration;

use load::{Arrival, Bounds, Endpoint, Load, Prepared, Requests};
use metrics::ServerDelta;
use stats::{ErrorCounts, Summary};
use v2::{Lengths, Protocol, Variant};

/// Errors of the `bench` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bench: bad url `{url}`: {why}")]
    BadUrl { url: String, why: String },
    #[error("bench: cannot connect to {url}")]
    Connect {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("bench: request to {url} failed: {what}")]
    Http { url: String, what: String },
    #[error("bench: {url} answered {status}: {body}")]
    Status {
        url: String,
        status: u16,
        body: String,
    },
    #[error("bench: model `{model}`: {why}")]
    Metadata { model: String, why: String },
    #[error("bench: {0}")]
    Options(String),
    #[error("bench: cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
    #[error("bench: cannot write {path}")]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bench: infer-serve for grid point {point}: {why}")]
    Serve { point: String, why: String },
    #[error("bench: tuning needs {0}")]
    TuneInput(String),
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Error::BadUrl { .. } | Error::Options(_) | Error::Metadata { .. } | Error::TuneInput(_)
        )
    }
}

/// Where a long run reports progress: one human line at a time, to a sink the caller gives
/// (the CLI writes them to stderr); none by default. The library itself never prints.
#[derive(Clone, Default)]
pub(crate) struct Progress(Option<Sink>);

type Sink = std::sync::Arc<dyn Fn(&str) + Send + Sync>;

impl Progress {
    pub(crate) fn to(sink: impl Fn(&str) + Send + Sync + 'static) -> Progress {
        Progress(Some(std::sync::Arc::new(sink)))
    }

    /// Reports the line `line` makes, made only when someone listens.
    pub(crate) fn line(&self, line: impl FnOnce() -> String) {
        if let Some(sink) = &self.0 {
            sink(&line());
        }
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Progress(on)"
        } else {
            "Progress(off)"
        })
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub url: String,
    pub model: String,
    pub protocol: Protocol,
    /// Rows per request.
    pub batch: u32,
    /// Text and padded models: the lengths of the requests' sequences (words of a text,
    /// tokens of a padded tensor), drawn per request; ignored for a model of fixed shapes.
    pub lengths: Lengths,
    /// The steps, run in order.
    pub loads: Vec<Load>,
    pub arrival: Arrival,
    pub bounds: Bounds,
    /// Seed for request data and Poisson arrivals.
    pub seed: u64,
    /// Where one progress line per step goes (the CLI prints them).
    pub progress: Progress,
}

/// The measured outcome of one step.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Step {
    pub load: Load,
    pub batch: u32,
    /// Requests sent in the measured window.
    pub sent: u64,
    pub ok: u64,
    pub errors: ErrorCounts,
    pub elapsed_s: f64,
    pub req_per_s: f64,
    pub infer_per_s: f64,
    pub latency: Summary,
    /// What the server reported at /metrics for this step, when it exports metrics.
    pub server: Option<ServerDelta>,
}

/// A build of the tokio runtime for the generator: all cores, since the client must not be
/// the bottleneck.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, Error> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(Error::Runtime)
}

/// Scrape `/metrics`, the series of `model` ([`metrics::of_model`]); `None` when the server
/// has none.
pub(crate) async fn scrape(ep: &Endpoint, model: &str) -> Option<Vec<metrics::Sample>> {
    let (status, body) = load::fetch(ep, &Prepared::get(ep, "/metrics")).await.ok()?;
    status
        .is_success()
        .then(|| metrics::of_model(metrics::parse(&String::from_utf8_lossy(&body)), model))
}

/// Fetch the model's metadata and build the requests a step sends in turn (one for a model of
/// fixed shapes; [`v2::VARIANTS`] of mixed lengths for a text or padded model), with what each
/// holds.
pub(crate) async fn prepare(
    ep: &Endpoint,
    opts: &Options,
) -> Result<(Requests, Vec<Variant>), Error> {
    let path = format!("/v2/models/{}", opts.model);
    let (status, body) = load::fetch(ep, &Prepared::get(ep, &path)).await?;
    if !status.is_success() {
        return Err(Error::Status {
            url: ep.url(&path),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).chars().take(300).collect(),
        });
    }
    let meta = v2::parse_metadata(&opts.model, &body)?;
    let variants = v2::infer_requests(
        ep,
        &meta,
        opts.batch,
        opts.protocol,
        opts.seed,
        opts.lengths,
    )?;
    let mut bodies = variants.iter().map(|v| v.request.clone());
    let first = bodies.next().ok_or_else(|| Error::Metadata {
        model: opts.model.clone(),
        why: "no request to send".into(),
    })?;
    // One request before measuring: a server that rejects it would only produce errors.
    let (status, body) = load::fetch(ep, &first).await?;
    if !status.is_success() {
        return Err(Error::Status {
            url: ep.url(&format!("/v2/models/{}/infer", opts.model)),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).chars().take(300).collect(),
        });
    }
    Ok((Requests::new(first, bodies.collect()), variants))
}

/// Run one step against a prepared endpoint.
pub(crate) async fn step(ep: &Endpoint, reqs: &Requests, opts: &Options, load: Load) -> Step {
    // Scrape when the measured window opens, so warm-up batches are not counted.
    let scrape_ep = ep.clone();
    let warmup = opts.bounds.warmup;
    let model = opts.model.clone();
    let before = tokio::spawn(async move {
        tokio::time::sleep(warmup).await;
        scrape(&scrape_ep, &model).await
    });
    let raw = match load {
        Load::Concurrency(c) => load::closed_loop(ep, reqs, c, opts.bounds).await,
        Load::Rate(r) => load::open_loop(ep, reqs, r, opts.arrival, opts.bounds, opts.seed).await,
    };
    let before = before.await.ok().flatten();
    let ok = raw.latencies.len() as u64;
    let mut after = scrape(ep, &opts.model).await;
    // The server counts a request once its response is on the wire, so the client can read the
    // last answers before their counts land: scrape again, briefly, until they have.
    for _ in 0..10 {
        match (&before, &after) {
            (Some(b), Some(a)) if metrics::server_delta(b, a).requests < ok => {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                after = scrape(ep, &opts.model).await;
            }
            _ => break,
        }
    }
    let server = match (before, after) {
        (Some(b), Some(a)) => Some(metrics::server_delta(&b, &a)),
        _ => None,
    };
    let elapsed = raw.elapsed_s.max(1e-9);
    let req_per_s = ok as f64 / elapsed;
    let s = Step {
        load,
        batch: opts.batch,
        sent: raw.sent,
        ok,
        errors: raw.errors,
        elapsed_s: raw.elapsed_s,
        req_per_s,
        infer_per_s: req_per_s * f64::from(opts.batch),
        latency: stats::summarize(raw.latencies),
        server,
    };
    opts.progress.line(|| progress_line(&s));
    s
}

/// One human line per step.
pub(crate) fn progress_line(s: &Step) -> String {
    let load = match s.load {
        Load::Concurrency(c) => format!("concurrency {c:>3}"),
        Load::Rate(r) => format!("rate {r} req/s"),
    };
    let errors: u64 = s.errors.values().sum();
    let batch = s
        .server
        .as_ref()
        .and_then(|d| d.mean_batch)
        .map(|b| format!(", server batch {b:.2}"))
        .unwrap_or_default();
    format!(
        "bench: {load}: {} ok in {:.1} s, {:.1} infer/s, p50 {:.2} ms, p99 {:.2} ms, errors {errors}{batch}",
        s.ok,
        s.elapsed_s,
        s.infer_per_s,
        s.latency.p50_us as f64 / 1000.0,
        s.latency.p99_us as f64 / 1000.0,
    )
}

/// The generator's runtime, once `opts` is known to describe a run.
fn checked_runtime(opts: &Options) -> Result<tokio::runtime::Runtime, Error> {
    if opts.loads.is_empty() {
        return Err(Error::Options(
            "no load steps (give --concurrency or --rate)".into(),
        ));
    }
    if opts.batch == 0 {
        return Err(Error::Options("--batch must be at least 1".into()));
    }
    runtime()
}

/// Run every step of `opts` against the server.
pub(crate) fn run(opts: &Options) -> Result<Vec<Step>, Error> {
    let rt = checked_runtime(opts)?;
    rt.block_on(async {
        let ep = Endpoint::resolve(&opts.url).await?;
        let (reqs, _) = prepare(&ep, opts).await?;
        let mut steps = Vec::new();
        for &l in &opts.loads {
            steps.push(step(&ep, &reqs, opts, l).await);
        }
        Ok(steps)
    })
}

/// A model of a mix and its weight: its share of each step's load.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub(crate) struct Share {
    pub model: String,
    pub weight: f64,
}

/// Parse `--model`: one name, or a mix `a=3,b=1` (weights positive numbers; a name alone
/// weighs 1).
pub(crate) fn parse_mix(s: &str) -> Result<Vec<Share>, String> {
    let mut out: Vec<Share> = Vec::new();
    for part in s.split(',').map(str::trim) {
        let (model, weight) = match part.split_once('=') {
            Some((m, w)) => {
                let w: f64 = w.trim().parse().map_err(|_| {
                    format!("`{part}`: the weight after `=` must be a number (a=3,b=1)")
                })?;
                (m.trim(), w)
            }
            None => (part, 1.0),
        };
        if model.is_empty() {
            return Err(format!("`{s}`: a model name is empty"));
        }
        if !(weight.is_finite() && weight > 0.0) {
            return Err(format!("`{part}`: the weight must be positive"));
        }
        if out.iter().any(|o| o.model == model) {
            return Err(format!("`{s}`: {model} is named twice"));
        }
        out.push(Share {
            model: model.to_string(),
            weight,
        });
    }
    Ok(out)
}

/// `load` split between the models of a mix by weight: a concurrency into whole workers
/// (at least one each), a rate into rates.
pub(crate) fn split(load: Load, mix: &[Share]) -> Vec<Load> {
    let total: f64 = mix.iter().map(|m| m.weight).sum();
    mix.iter()
        .map(|m| match load {
            Load::Concurrency(c) => {
                Load::Concurrency(((f64::from(c) * m.weight / total).round() as u32).max(1))
            }
            Load::Rate(r) => Load::Rate(r * m.weight / total),
        })
        .collect()
}

/// Run every step of `opts` against several models at once (a bundle's): each step's load
/// split between them by weight ([`split`]), every model's share driven at the same time;
/// per model its steps (the server's counts from its own series).
pub(crate) fn run_mix(opts: &Options, mix: &[Share]) -> Result<Vec<(String, Vec<Step>)>, Error> {
    let rt = checked_runtime(opts)?;
    rt.block_on(async {
        let ep = Endpoint::resolve(&opts.url).await?;
        let mut prepared = Vec::with_capacity(mix.len());
        for m in mix {
            // Each model's progress lines name it.
            let (parent, name) = (opts.progress.clone(), m.model.clone());
            let o = Options {
                model: m.model.clone(),
                progress: Progress::to(move |line| parent.line(|| format!("{name}: {line}"))),
                ..opts.clone()
            };
            let (reqs, _) = prepare(&ep, &o).await?;
            prepared.push((o, reqs));
        }
        let mut out: Vec<(String, Vec<Step>)> =
            mix.iter().map(|m| (m.model.clone(), Vec::new())).collect();
        for &l in &opts.loads {
            let mut set = tokio::task::JoinSet::new();
            for (i, ((o, req), share)) in prepared.iter().zip(split(l, mix)).enumerate() {
                let (ep, o, req) = (ep.clone(), o.clone(), req.clone());
                set.spawn(async move { (i, step(&ep, &req, &o, share).await) });
            }
            while let Some(done) = set.join_next().await {
                let (i, s) =
                    done.map_err(|e| Error::Options(format!("a model's step failed: {e}")))?;
                out[i].1.push(s);
            }
        }
        Ok(out)
    })
}

/// Parse a duration such as `500ms`, `2s`, `1.5s`, `1m`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => (&s[..i], &s[i..]),
        None => (s, "s"),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (examples: 500ms, 2s, 1m)"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" | "" => v,
        "m" | "min" => v * 60.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s or m)")),
    };
    if !(0.0..1e7).contains(&secs) {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mix_splits_each_step_by_weight() {
        let mix = parse_mix("det=3, rec=1").unwrap();
        assert_eq!(
            mix[0],
            Share {
                model: "det".into(),
                weight: 3.0
            }
        );
        assert_eq!(
            split(Load::Concurrency(8), &mix),
            [Load::Concurrency(6), Load::Concurrency(2)]
        );
        assert_eq!(
            split(Load::Concurrency(1), &mix),
            [Load::Concurrency(1), Load::Concurrency(1)]
        );
        assert_eq!(
            split(Load::Rate(100.0), &mix),
            [Load::Rate(75.0), Load::Rate(25.0)]
        );
        assert_eq!(
            parse_mix("mlp").unwrap(),
            [Share {
                model: "mlp".into(),
                weight: 1.0
            }]
        );
        for bad in ["a=0", "a=x", "a,a", "=2", "a=-1"] {
            assert!(parse_mix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("3h").is_err());
    }
}
