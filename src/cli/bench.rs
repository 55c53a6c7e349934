//! `infer-build bench`: load-test a V2 server, or sweep batching settings with `--tune`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::bench::load::{Arrival, Bounds, Load};
use crate::bench::report::{self, Labels};
use crate::bench::tune;
use crate::bench::v2::{Lengths, Protocol};
use crate::bench::{self, parse_duration, Error as BenchError, Options, Step};
use crate::error::Error;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ProtocolArg {
    /// KServe V2 JSON tensors.
    Json,
    /// The binary tensor data extension (what tritonclient and perf_analyzer send).
    Binary,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum ArrivalArg {
    /// Evenly spaced sends.
    Constant,
    /// Exponential gaps (a Poisson process), seeded.
    Poisson,
}

/// The arguments, boxed: the command enum stays small whatever bench grows.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    #[command(flatten)]
    pub inner: Box<BenchOpts>,
}

#[derive(Debug, Args)]
pub(crate) struct BenchOpts {
    /// The server, e.g. http://127.0.0.1:8000 (not with --tune).
    pub url: Option<String>,
    /// The model to send requests to, or a mix of a bundle's models by weight
    /// (`det=3,rec=1`): each step's load is split between them, driven at once, and each is
    /// reported on its own.
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Closed loop: a comma-separated list of concurrencies, one step each (e.g. 1,2,4,8).
    #[arg(long, value_delimiter = ',', conflicts_with = "rate")]
    pub concurrency: Vec<u32>,
    /// Open loop: a comma-separated list of request rates (requests/s), one step each.
    #[arg(long, value_delimiter = ',')]
    pub rate: Vec<f64>,
    /// Open-loop arrivals.
    #[arg(long, value_enum, default_value = "poisson")]
    pub arrival: ArrivalArg,
    /// Measured time per step (e.g. 5s, 500ms).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured warm-up before each step's window.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// At most this many measured requests per step.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Rows per request.
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Request encoding.
    #[arg(long, value_enum, default_value = "binary")]
    pub protocol: ProtocolArg,
    /// Open loop: most requests in flight before sends are counted as `client_overload`.
    #[arg(long, default_value_t = 4096)]
    pub max_inflight: usize,
    /// Write the CSV here (default: bench-<model>.csv, or tune-<model>.csv with --tune).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the HTML report here (default: bench-<model>.html, or tune-<model>.html).
    #[arg(long, value_name = "FILE.html")]
    pub report: Option<PathBuf>,
    /// Print the results as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
    /// Seed for request data and Poisson arrivals.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Text and padded models: the lengths of the requests' sequences, drawn per request
    /// (words per text for a text model, tokens for a padded tensor model), MIN-MAX or one
    /// length.
    #[arg(long, default_value_t = Lengths::DEFAULT, value_name = "MIN-MAX", value_parser = Lengths::parse)]
    pub lengths: Lengths,

    /// Sweep batching: start infer-serve per grid point from this runtime.toml or recipe,
    /// drive it open-loop and recommend max batch size and queue delay under the p99 budget.
    /// A recipe (told apart by content) gives the batching, tract on its ONNX model, and
    /// `deploy.latency_slo_ms` / `deploy.peak_qps` as the budget and peak; flags override.
    #[arg(long, value_name = "RUNTIME_TOML|RECIPE")]
    pub tune: Option<PathBuf>,
    /// Tuning: max queue delays to try, in ms (default 0,10,20,...,60).
    #[arg(long, value_delimiter = ',', value_name = "MS")]
    pub delays_ms: Vec<f64>,
    /// Tuning: max batch sizes to try (default: the config's).
    #[arg(long, value_delimiter = ',')]
    pub max_batch: Vec<u32>,
    /// Tuning: the p99 latency budget in ms (default: a recipe's deploy.latency_slo_ms).
    #[arg(long)]
    pub budget_ms: Option<f64>,
    /// Tuning: peak requests/s for the capacity plan (also the rate each point is driven at
    /// unless --rate is given; default: a recipe's deploy.peak_qps).
    #[arg(long)]
    pub peak_qps: Option<f64>,
    /// Tuning: capacity headroom factor (1.2-1.5).
    #[arg(long, default_value_t = 1.3)]
    pub headroom: f64,
    /// Tuning: the least relative capacity gain that counts as a gain (the measurement's noise
    /// floor); a step must also gain more capacity than it adds mean latency.
    #[arg(long, default_value_t = 0.02)]
    pub min_gain: f64,
    /// Tuning: replace the engine with the synthetic one, T(b) = BASE + PER_ROW x b ms, plus
    /// PER_TOKEN for each token of a padded batch (needs infer-serve built with the
    /// `synthetic` feature; for tests and benchmarks).
    #[arg(long, value_name = "BASE_MS,PER_ROW_MS[,PER_TOKEN_MS]")]
    pub synthetic: Option<String>,
    /// Tuning: the infer-serve binary (default: $INFER_SERVE, else next to this binary,
    /// else on PATH).
    #[arg(long, value_name = "PATH")]
    pub serve: Option<PathBuf>,
}

fn write(path: &Path, text: &str) -> Result<(), Error> {
    std::fs::write(path, text).map_err(|e| {
        Error::from(BenchError::Write {
            path: path.to_path_buf(),
            source: e,
        })
    })
}

pub(super) fn run(a: BenchArgs) -> Result<(), Error> {
    let a = *a.inner;
    if a.tune.is_some() {
        return run_tune(a);
    }
    let url = a
        .url
        .clone()
        .ok_or_else(|| Error::Usage("bench needs a URL (or --tune RUNTIME_TOML|RECIPE)".into()))?;
    let model = a
        .model
        .clone()
        .ok_or_else(|| Error::Usage("bench needs --model NAME".into()))?;
    let loads: Vec<Load> = if !a.rate.is_empty() {
        for r in &a.rate {
            if !(r.is_finite() && *r > 0.0) {
                return Err(Error::Usage(format!(
                    "--rate {r} must be a positive number"
                )));
            }
        }
        a.rate.iter().map(|&r| Load::Rate(r)).collect()
    } else if !a.concurrency.is_empty() {
        if a.concurrency.contains(&0) {
            return Err(Error::Usage(
                "--concurrency values must be at least 1".into(),
            ));
        }
        a.concurrency
            .iter()
            .map(|&c| Load::Concurrency(c))
            .collect()
    } else {
        [1, 2, 4, 8, 16]
            .iter()
            .map(|&c| Load::Concurrency(c))
            .collect()
    };
    let opts = Options {
        url: url.clone(),
        model: model.clone(),
        protocol: match a.protocol {
            ProtocolArg::Json => Protocol::Json,
            ProtocolArg::Binary => Protocol::Binary,
        },
        batch: a.batch,
        lengths: a.lengths,
        loads,
        arrival: arrival(a.arrival),
        bounds: Bounds {
            warmup: a.warmup,
            duration: a.duration,
            max_requests: a.requests,
            max_inflight: a.max_inflight,
        },
        seed: a.seed,
        progress: bench::Progress::to(|line| eprintln!("{line}")),
    };
    let mix = bench::parse_mix(&model).map_err(|e| Error::Usage(format!("--model {e}")))?;
    if mix.len() > 1 {
        return run_mix(&a, &opts, &mix);
    }
    let steps = bench::run(&opts)?;
    let labeled: Vec<(Labels, Step)> = steps.iter().map(|s| (Vec::new(), s.clone())).collect();
    let csv_path = a
        .csv
        .unwrap_or_else(|| PathBuf::from(format!("bench-{model}.csv")));
    let html_path = a
        .report
        .unwrap_or_else(|| PathBuf::from(format!("bench-{model}.html")));
    write(&csv_path, &report::csv(&labeled))?;
    write(&html_path, &report::bench_html(&url, &model, &labeled))?;
    eprintln!(
        "bench: wrote {} and {}",
        csv_path.display(),
        html_path.display()
    );
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "url": url, "model": model, "steps": steps })
            )
            .unwrap_or_default()
        );
    }
    Ok(())
}

/// `bench URL --model a=3,b=1`: every step split between the models and driven at once; the
/// CSV and report carry one series per model (labelled `model`), the JSON per model.
fn run_mix(a: &BenchOpts, opts: &Options, mix: &[bench::Share]) -> Result<(), Error> {
    let name = mix
        .iter()
        .map(|m| m.model.as_str())
        .collect::<Vec<_>>()
        .join("+");
    let per_model = bench::run_mix(opts, mix)?;
    let mut labeled: Vec<(Labels, Step)> = Vec::new();
    for (model, steps) in &per_model {
        for s in steps {
            labeled.push((vec![("model".into(), model.clone())], s.clone()));
        }
    }
    for (i, l) in opts.loads.iter().enumerate() {
        let ok: u64 = per_model
            .iter()
            .filter_map(|(_, s)| s.get(i))
            .map(|s| s.ok)
            .sum();
        let rate: f64 = per_model
            .iter()
            .filter_map(|(_, s)| s.get(i))
            .map(|s| s.infer_per_s)
            .sum();
        eprintln!("bench: {l:?} over the mix: {ok} ok, {rate:.1} infer/s in all");
    }
    let csv_path = a
        .csv
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-{name}.csv")));
    let html_path = a
        .report
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-{name}.html")));
    write(&csv_path, &report::csv(&labeled))?;
    write(&html_path, &report::bench_html(&opts.url, &name, &labeled))?;
    eprintln!(
        "bench: wrote {} and {}",
        csv_path.display(),
        html_path.display()
    );
    if a.json {
        let models: serde_json::Map<String, serde_json::Value> = per_model
            .iter()
            .map(|(m, steps)| (m.clone(), serde_json::json!(steps)))
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "url": opts.url, "mix": mix, "models": models })
            )
            .unwrap_or_default()
        );
    }
    Ok(())
}

fn arrival(a: ArrivalArg) -> Arrival {
    match a {
        ArrivalArg::Constant => Arrival::Constant,
        ArrivalArg::Poisson => Arrival::Poisson,
    }
}

/// The infer-serve binary: --serve, $INFER_SERVE, next to this executable, else PATH.
fn find_serve(flag: Option<PathBuf>) -> PathBuf {
    if let Some(p) = flag {
        return p;
    }
    if let Some(p) = std::env::var_os("INFER_SERVE") {
        return PathBuf::from(p);
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            let sibling = dir.join("infer-serve");
            if sibling.exists() {
                return sibling;
            }
        }
    }
    PathBuf::from("infer-serve")
}

fn run_tune(a: BenchOpts) -> Result<(), Error> {
    let file = a.tune.unwrap_or_default();
    let base = crate::pipeline::tune_base(&file, a.synthetic.is_some())?;
    let resolved = tune::Request {
        base,
        synthetic: a.synthetic,
        budget_ms: a.budget_ms,
        peak_qps: a.peak_qps,
        rate: a.rate.first().copied(),
        delays_ms: a.delays_ms,
        max_batches: a.max_batch,
        headroom: a.headroom,
        min_gain: a.min_gain,
        arrival: arrival(a.arrival),
        warmup: a.warmup,
        duration: a.duration,
        seed: a.seed,
        lengths: a.lengths,
        serve: find_serve(a.serve),
        progress: bench::Progress::to(|line| eprintln!("{line}")),
    }
    .resolve()?;
    eprintln!("tune: {}", resolved.describe());
    let model = resolved.options.base.model.name.clone();
    let result = resolved.run()?;
    let labeled = tune::html::rows(&result);
    let csv_path = a
        .csv
        .unwrap_or_else(|| PathBuf::from(format!("tune-{model}.csv")));
    let html_path = a
        .report
        .unwrap_or_else(|| PathBuf::from(format!("tune-{model}.html")));
    write(&csv_path, &report::csv(&labeled))?;
    write(&html_path, &tune::html::html(&model, &result, &labeled))?;
    match (&result.recommendation, &result.capacity) {
        (Some(r), Some(c)) => {
            for reason in &r.reasons {
                eprintln!("tune: {reason}");
            }
            eprintln!(
                "tune: recommend max_batch_size = {}, max_queue_delay_us = {} (p99 {:.1} ms, {:.1} rows/s per replica)",
                r.point.max_batch, r.point.delay_us, r.p99_ms, r.capacity_rps
            );
            eprintln!(
                "tune: capacity: {}; scale out at {:.1} req/s per replica (70% of its limit)",
                c.formula, c.scale_out_qps
            );
        }
        _ => eprintln!(
            "tune: no grid point kept p99 within {} ms without errors; lower the rate or widen the grid",
            result.budget_ms
        ),
    }
    eprintln!(
        "tune: wrote {} and {}",
        csv_path.display(),
        html_path.display()
    );
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        );
    }
    if result.recommendation.is_none() {
        return Err(Error::from(BenchError::TuneInput(format!(
            "a grid point within the {} ms p99 budget; none was",
            result.budget_ms
        ))));
    }
    Ok(())
}
