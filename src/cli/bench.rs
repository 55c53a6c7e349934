//! `infer-build bench`: load-test a V2 server, or sweep batching settings with `--tune`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::bench::load::{Arrival, Bounds, Load};
use crate::bench::report::{self, Labels, Section, Series};
use crate::bench::tune::{self, SweepOptions, SweepResult};
use crate::bench::v2::Protocol;
use crate::bench::{self, parse_duration, Error as BenchError, Options, Step};
use crate::error::Error;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ProtocolArg {
    /// KServe V2 JSON tensors.
    Json,
    /// The binary tensor data extension (what tritonclient and perf_analyzer send).
    Binary,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ArrivalArg {
    /// Evenly spaced sends.
    Constant,
    /// Exponential gaps (a Poisson process), seeded.
    Poisson,
}

/// The arguments, boxed: the command enum stays small whatever bench grows.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub inner: Box<BenchOpts>,
}

#[derive(Debug, Args)]
pub struct BenchOpts {
    /// The server, e.g. http://127.0.0.1:8000 (not with --tune).
    pub url: Option<String>,
    /// The model to send requests to.
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
    /// Tuning: replace the engine with the synthetic one, T(b) = BASE + PER_ROW x b ms
    /// (needs infer-serve built with the `synthetic` feature; for tests and benchmarks).
    #[arg(long, value_name = "BASE_MS,PER_ROW_MS")]
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

pub fn run(a: BenchArgs) -> Result<(), Error> {
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

/// What a recipe gives a sweep: the runtime config `build` would put in its CPU image (tract on
/// the ONNX model, the recipe's batching), the p99 budget and the peak rate.
struct FromRecipe {
    config: infer_spec::RuntimeConfig,
    slo_ms: Option<f64>,
    peak_qps: Option<f64>,
}

fn from_recipe(path: &Path, synthetic: bool) -> Result<FromRecipe, Error> {
    let recipe = crate::recipe::load(path)?;
    if !recipe.targets.cpu && !synthetic {
        return Err(BenchError::TuneInput(format!(
            "a CPU target in {}: tuning runs its ONNX model on tract here (set `cpu = true` under [targets], or pass --synthetic)",
            path.display()
        ))
        .into());
    }
    let (model, _) = crate::assemble::safe_input(&recipe.dir, &recipe.model.onnx.value)?;
    let config = crate::assemble::spec::runtime_config(
        &recipe,
        infer_spec::EngineKind::TractOnnx,
        &model.to_string_lossy(),
        None,
    )?;
    Ok(FromRecipe {
        config,
        slo_ms: recipe.deploy.latency_slo_ms.map(f64::from),
        peak_qps: recipe.deploy.peak_qps,
    })
}

fn run_tune(a: BenchOpts) -> Result<(), Error> {
    let path = a.tune.clone().unwrap_or_default();
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::Usage(format!("cannot read {}: {e}", path.display())))?;
    let kind = tune::input_kind(&text);
    let (mut base, recipe_slo, recipe_peak) = match kind {
        tune::InputKind::Recipe => {
            let r = from_recipe(&path, a.synthetic.is_some())?;
            (r.config, r.slo_ms, r.peak_qps)
        }
        tune::InputKind::RuntimeConfig => (
            infer_spec::RuntimeConfig::from_toml_str(&text).map_err(|e| {
                Error::from(BenchError::TuneInput(format!(
                    "a valid runtime.toml or recipe: {}: {e}",
                    path.display()
                )))
            })?,
            None,
            None,
        ),
    };
    if let Some(spec) = &a.synthetic {
        let parts: Vec<f64> = spec
            .split(',')
            .map(|p| p.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| {
                Error::Usage(format!("--synthetic `{spec}` must be BASE_MS,PER_ROW_MS"))
            })?;
        let [base_ms, per_row_ms] = parts[..] else {
            return Err(Error::Usage(format!(
                "--synthetic `{spec}` must be BASE_MS,PER_ROW_MS"
            )));
        };
        base.engine = infer_spec::EngineSection {
            kind: infer_spec::EngineKind::Synthetic,
            path: None,
            metadata: None,
            library: None,
            threads: None,
            synthetic: Some(infer_spec::Synthetic {
                base_ms,
                per_row_ms,
            }),
        };
    }
    let (budget_ms, budget_from) = a
        .budget_ms
        .map(|b| (b, "--budget-ms"))
        .or_else(|| recipe_slo.map(|b| (b, "deploy.latency_slo_ms")))
        .ok_or_else(|| {
            Error::from(BenchError::TuneInput(
                "a p99 budget (--budget-ms, or deploy.latency_slo_ms in a recipe)".into(),
            ))
        })?;
    let (peak, peak_from) = a
        .peak_qps
        .map(|p| (p, "--peak-qps"))
        .or_else(|| a.rate.first().map(|r| (*r, "--rate")))
        .or_else(|| recipe_peak.map(|p| (p, "deploy.peak_qps")))
        .ok_or_else(|| {
            Error::from(BenchError::TuneInput(
                "a peak rate (--peak-qps or --rate, or deploy.peak_qps in a recipe)".into(),
            ))
        })?;
    if !(budget_ms.is_finite() && budget_ms > 0.0) {
        return Err(Error::Usage(format!(
            "the p99 budget {budget_ms} ms must be a positive number"
        )));
    }
    if !(peak.is_finite() && peak > 0.0) {
        return Err(Error::Usage(format!(
            "the peak rate {peak} req/s must be a positive number"
        )));
    }
    let rate = a.rate.first().copied().unwrap_or(peak);
    if !(1.0..=2.0).contains(&a.headroom) {
        return Err(Error::Usage(format!(
            "--headroom {} is outside 1.0-2.0 (the usual is 1.2-1.5)",
            a.headroom
        )));
    }
    let delays: Vec<f64> = if a.delays_ms.is_empty() {
        (0..=6).map(|i| f64::from(i) * 10.0).collect()
    } else {
        a.delays_ms.clone()
    };
    if delays.iter().any(|d| !(d.is_finite() && *d >= 0.0)) {
        return Err(Error::Usage(
            "--delays-ms values must be zero or positive".into(),
        ));
    }
    let max_batches = if a.max_batch.is_empty() {
        vec![base.batching.max_batch_size]
    } else {
        a.max_batch.clone()
    };
    if max_batches.contains(&0) {
        return Err(Error::Usage("--max-batch values must be at least 1".into()));
    }
    let opts = SweepOptions {
        base_dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
        base,
        serve: find_serve(a.serve.clone()),
        max_batches,
        delays_us: delays.iter().map(|d| (d * 1000.0).round() as u64).collect(),
        rate,
        arrival: arrival(a.arrival),
        warmup: a.warmup,
        duration: a.duration,
        budget_ms,
        min_gain: a.min_gain,
        headroom: a.headroom,
        ready_timeout: Duration::from_secs(60),
        progress: bench::Progress::to(|line| eprintln!("{line}")),
        seed: a.seed,
    };
    eprintln!(
        "tune: {} {}: p99 budget {budget_ms} ms ({budget_from}), peak {peak} req/s ({peak_from}), driven at {rate} req/s",
        match kind {
            tune::InputKind::Recipe => "recipe",
            tune::InputKind::RuntimeConfig => "runtime config",
        },
        path.display()
    );
    let mut result = tune::sweep(&opts)?;
    result.input = Some(tune::InputSummary {
        kind,
        file: path.clone(),
        budget_ms_from: budget_from.into(),
        peak_qps: peak,
        peak_qps_from: peak_from.into(),
    });
    // The capacity plan is for the peak, which may differ from the rate points were driven at.
    if let Some(r) = &result.recommendation {
        result.capacity = Some(tune::capacity_plan(peak, r.capacity_rps, a.headroom));
    }
    let model = opts.base.model.name.clone();
    let labeled: Vec<(Labels, Step)> = result
        .results
        .iter()
        .map(|m| {
            (
                vec![
                    ("Max Batch Size".to_string(), m.point.max_batch.to_string()),
                    (
                        "Max Queue Delay (us)".to_string(),
                        m.point.delay_us.to_string(),
                    ),
                    (
                        "Capacity (rows/s)".to_string(),
                        m.capacity_rps.map_or(String::new(), |c| format!("{c:.1}")),
                    ),
                    (
                        "Replayed Capacity (rows/s)".to_string(),
                        m.predicted
                            .map_or(String::new(), |p| format!("{:.1}", p.capacity_rps)),
                    ),
                    (
                        "Replayed Mean Latency (usec)".to_string(),
                        m.predicted
                            .map_or(String::new(), |p| format!("{:.0}", p.mean_us)),
                    ),
                ],
                m.step.clone(),
            )
        })
        .collect();
    let csv_path = a
        .csv
        .unwrap_or_else(|| PathBuf::from(format!("tune-{model}.csv")));
    let html_path = a
        .report
        .unwrap_or_else(|| PathBuf::from(format!("tune-{model}.html")));
    write(&csv_path, &report::csv(&labeled))?;
    write(&html_path, &tune_html(&model, &result, &labeled))?;
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
            "tune: no grid point kept p99 within {budget_ms} ms without errors; lower the rate or widen the grid"
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
            "a grid point within the {budget_ms} ms p99 budget; none was"
        ))));
    }
    Ok(())
}

/// The tuning report: p99 and capacity against delay per max batch, latency against capacity.
fn tune_html(model: &str, r: &SweepResult, labeled: &[(Labels, Step)]) -> String {
    let mut batches: Vec<u32> = r.results.iter().map(|m| m.point.max_batch).collect();
    batches.sort_unstable();
    batches.dedup();
    let per_batch = |f: &dyn Fn(&tune::Measured) -> Option<(f64, f64)>| -> Vec<Series> {
        batches
            .iter()
            .map(|b| Series {
                name: format!("max batch {b}"),
                points: r
                    .results
                    .iter()
                    .filter(|m| m.point.max_batch == *b)
                    .filter_map(f)
                    .collect(),
            })
            .collect()
    };
    let p99 = per_batch(&|m| Some((m.point.delay_us as f64 / 1000.0, m.p99_ms)));
    let cap = per_batch(&|m| {
        m.capacity_rps
            .map(|c| (m.point.delay_us as f64 / 1000.0, c))
    });
    let knee = per_batch(&|m| m.capacity_rps.map(|c| (c, m.p99_ms)));
    let budget = vec![(r.budget_ms, format!("p99 budget {} ms", r.budget_ms))];
    let mut sections = vec![Section::Paragraph(format!(
        "Each point: infer-serve started with that max batch size and max queue delay, driven open-loop at {} req/s. Capacity = rows per batch / compute time per batch, from the server's metrics.",
        r.rate
    ))];
    sections.push(Section::Paragraph(match (&r.model, &r.model_refused) {
        (Some(m), _) => format!(
            "Cost model fitted to all points: T(b) = {:.2} + {:.3} x b ms per batch (within {:.1}% of every point). Each point was replayed against it with {} arrivals; the capacity gain and mean-latency cost of each step are read from the replay, which the short measured samples are too noisy to rank. The p99 budget and errors are judged on the measurements.",
            m.fixed_us / 1000.0,
            m.per_row_us / 1000.0,
            m.max_rel_error * 100.0,
            tune::REPLAY_ARRIVALS
        ),
        (None, Some(why)) => format!("No cost model: {why}. Gains and costs are read from the measurements."),
        (None, None) => "No cost model.".to_string(),
    }));
    match (&r.recommendation, &r.capacity) {
        (Some(rec), Some(c)) => {
            sections.push(Section::Heading("Recommendation".into()));
            sections.push(Section::Paragraph(format!(
                "max_batch_size = {}, max_queue_delay_us = {}: p99 {:.1} ms, {:.1} rows/s per replica. {}; scale out at {:.1} req/s per replica (70% of its limit).",
                rec.point.max_batch, rec.point.delay_us, rec.p99_ms, rec.capacity_rps, c.formula, c.scale_out_qps
            )));
            for reason in &rec.reasons {
                sections.push(Section::Paragraph(reason.clone()));
            }
        }
        _ => sections.push(Section::Paragraph(format!(
            "No point kept p99 within {} ms without errors.",
            r.budget_ms
        ))),
    }
    sections.push(Section::Heading("Sweep".into()));
    sections.push(Section::Svg(report::line_chart(
        "p99 latency vs max queue delay",
        "max queue delay (ms)",
        "p99 latency (ms)",
        &p99,
        &budget,
    )));
    sections.push(Section::Svg(report::line_chart(
        "Capacity vs max queue delay",
        "max queue delay (ms)",
        "capacity (rows/s per replica)",
        &cap,
        &[],
    )));
    sections.push(Section::Svg(report::line_chart(
        "Latency vs throughput (the knee)",
        "capacity (rows/s per replica)",
        "p99 latency (ms)",
        &knee,
        &budget,
    )));
    sections.push(Section::Heading("Results".into()));
    sections.push(report::steps_table(labeled));
    sections.push(Section::Heading("Batch sizes formed by the server".into()));
    for m in &r.results {
        if let Some(d) = m.step.server.as_ref().filter(|d| !d.batch_sizes.is_empty()) {
            let bars: Vec<(String, f64)> = d
                .batch_sizes
                .iter()
                .map(|(l, n)| (l.clone(), *n as f64))
                .collect();
            sections.push(Section::Svg(report::bar_chart(
                &format!("Batch sizes, {}", m.point),
                "rows per batch",
                "batches",
                &bars,
            )));
        }
    }
    report::html(&format!("infer-build bench --tune: {model}"), &sections)
}
