//! What a user asks a sweep for, resolved into [`SweepOptions`]: where the p99 budget and the
//! peak rate come from (a flag, else the recipe's `deploy` section), the default grid, the
//! synthetic engine, and every number checked before a server starts. Pure: the caller reads
//! the input file (a recipe is turned into its CPU image's runtime configuration by
//! `pipeline::tune_base`) and finds the `infer-serve` binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use infer_spec::RuntimeConfig;

use super::{capacity_plan, sweep, InputKind, InputSummary, SweepOptions, SweepResult};
use crate::bench::load::Arrival;
use crate::bench::{Error, Progress};

/// The max queue delays a sweep tries when none are given: 0 to 60 ms in 10 ms steps.
pub(crate) const DEFAULT_DELAYS_MS: [f64; 7] = [0.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0];

/// What a sweep starts from: the runtime configuration and, from a recipe, its budget and peak.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    pub kind: InputKind,
    /// The file it was read from; relative engine paths are relative to its directory.
    pub file: PathBuf,
    pub config: RuntimeConfig,
    /// `deploy.latency_slo_ms` of a recipe.
    pub slo_ms: Option<f64>,
    /// `deploy.peak_qps` of a recipe.
    pub peak_qps: Option<f64>,
}

/// A sweep as asked for; `None` and empty lists take the defaults [`Request::resolve`] names.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub base: Base,
    /// `BASE_MS,PER_ROW_MS[,PER_TOKEN_MS]`: replace the engine with the synthetic one.
    pub synthetic: Option<String>,
    pub budget_ms: Option<f64>,
    pub peak_qps: Option<f64>,
    /// The rate each point is driven at (default: the peak).
    pub rate: Option<f64>,
    pub delays_ms: Vec<f64>,
    /// Max batch sizes to try (default: the base configuration's).
    pub max_batches: Vec<u32>,
    pub headroom: f64,
    pub min_gain: f64,
    pub arrival: Arrival,
    pub warmup: Duration,
    pub duration: Duration,
    pub seed: u64,
    /// Text and padded models: the lengths of the requests sent.
    pub lengths: crate::bench::v2::Lengths,
    /// The `infer-serve` binary each point starts.
    pub serve: PathBuf,
    pub progress: Progress,
}

/// A request with every default applied and every number checked.
#[derive(Debug, Clone)]
pub(crate) struct Resolved {
    pub options: SweepOptions,
    pub input: InputSummary,
}

impl Resolved {
    /// One line saying what is swept and where its budget and peak came from.
    pub(crate) fn describe(&self) -> String {
        let i = &self.input;
        format!(
            "{} {}: p99 budget {} ms ({}), peak {} req/s ({}), driven at {} req/s",
            match i.kind {
                InputKind::Recipe => "recipe",
                InputKind::RuntimeConfig => "runtime config",
            },
            i.file.display(),
            self.options.budget_ms,
            i.budget_ms_from,
            i.peak_qps,
            i.peak_qps_from,
            self.options.rate
        )
    }

    /// Run the grid, then plan capacity for the peak (which may differ from the rate points
    /// were driven at).
    pub(crate) fn run(self) -> Result<SweepResult, Error> {
        let mut result = sweep(&self.options)?;
        if let Some(r) = &result.recommendation {
            result.capacity = Some(capacity_plan(
                self.input.peak_qps,
                r.capacity_rps,
                self.options.headroom,
            ));
        }
        result.input = Some(self.input);
        Ok(result)
    }
}

/// `BASE_MS,PER_ROW_MS[,PER_TOKEN_MS]` as the synthetic engine, T(b) = BASE + PER_ROW x b
/// (+ PER_TOKEN x the batch's padded tokens) ms.
pub(crate) fn parse_synthetic(spec: &str) -> Result<infer_spec::Synthetic, Error> {
    let bad = || {
        Error::Options(format!(
            "--synthetic `{spec}` must be BASE_MS,PER_ROW_MS[,PER_TOKEN_MS] (numbers, at least 0)"
        ))
    };
    let parts: Vec<f64> = spec
        .split(',')
        .map(|p| p.trim().parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    if parts.iter().any(|v| !(v.is_finite() && *v >= 0.0)) {
        return Err(bad());
    }
    match parts[..] {
        [base_ms, per_row_ms] => Ok(infer_spec::Synthetic {
            base_ms,
            per_row_ms,
            per_token_ms: 0.0,
        }),
        [base_ms, per_row_ms, per_token_ms] => Ok(infer_spec::Synthetic {
            base_ms,
            per_row_ms,
            per_token_ms,
        }),
        _ => Err(bad()),
    }
}

fn positive(v: f64) -> bool {
    v.is_finite() && v > 0.0
}

impl Request {
    /// Apply the defaults and check every number: a flag wins over the recipe (`--rate`
    /// stands in for a missing `--peak-qps`), the grid defaults to [`DEFAULT_DELAYS_MS`] × the
    /// configuration's max batch size. Every refusal is bad input.
    pub(crate) fn resolve(self) -> Result<Resolved, Error> {
        let Request {
            base,
            synthetic,
            budget_ms,
            peak_qps,
            rate,
            delays_ms,
            max_batches,
            headroom,
            min_gain,
            arrival,
            warmup,
            duration,
            seed,
            lengths,
            serve,
            progress,
        } = self;
        let mut config = base.config;
        if let Some(spec) = &synthetic {
            config.engine = infer_spec::EngineSection {
                kind: infer_spec::BackendKind::Synthetic,
                path: None,
                metadata: None,
                library: None,
                threads: None,
                measured: None,
                precision: None,
                synthetic: Some(parse_synthetic(spec)?),
            };
        }
        let (budget_ms, budget_from) = budget_ms
            .map(|b| (b, "--budget-ms"))
            .or_else(|| base.slo_ms.map(|b| (b, "deploy.latency_slo_ms")))
            .ok_or_else(|| {
                Error::TuneInput(
                    "a p99 budget (--budget-ms, or deploy.latency_slo_ms in a recipe)".into(),
                )
            })?;
        let (peak, peak_from) = peak_qps
            .map(|p| (p, "--peak-qps"))
            .or_else(|| rate.map(|r| (r, "--rate")))
            .or_else(|| base.peak_qps.map(|p| (p, "deploy.peak_qps")))
            .ok_or_else(|| {
                Error::TuneInput(
                    "a peak rate (--peak-qps or --rate, or deploy.peak_qps in a recipe)".into(),
                )
            })?;
        if !positive(budget_ms) {
            return Err(Error::Options(format!(
                "the p99 budget {budget_ms} ms must be a positive number"
            )));
        }
        if !positive(peak) {
            return Err(Error::Options(format!(
                "the peak rate {peak} req/s must be a positive number"
            )));
        }
        let rate = rate.unwrap_or(peak);
        if !positive(rate) {
            return Err(Error::Options(format!(
                "--rate {rate} must be a positive number"
            )));
        }
        if !(1.0..=2.0).contains(&headroom) {
            return Err(Error::Options(format!(
                "--headroom {headroom} is outside 1.0-2.0 (the usual is 1.2-1.5)"
            )));
        }
        if !(min_gain.is_finite() && min_gain >= 0.0) {
            return Err(Error::Options(format!(
                "--min-gain {min_gain} must be zero or positive"
            )));
        }
        let delays = if delays_ms.is_empty() {
            DEFAULT_DELAYS_MS.to_vec()
        } else {
            delays_ms
        };
        if delays.iter().any(|d| !(d.is_finite() && *d >= 0.0)) {
            return Err(Error::Options(
                "--delays-ms values must be zero or positive".into(),
            ));
        }
        let max_batches = if max_batches.is_empty() {
            vec![config.batching.max_batch_size]
        } else {
            max_batches
        };
        if max_batches.contains(&0) {
            return Err(Error::Options(
                "--max-batch values must be at least 1".into(),
            ));
        }
        let options = SweepOptions {
            base_dir: base
                .file
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
            base: config,
            serve,
            max_batches,
            delays_us: delays.iter().map(|d| (d * 1000.0).round() as u64).collect(),
            rate,
            arrival,
            warmup,
            duration,
            budget_ms,
            min_gain,
            headroom,
            ready_timeout: Duration::from_secs(60),
            progress,
            seed,
            lengths,
        };
        Ok(Resolved {
            options,
            input: InputSummary {
                kind: base.kind,
                file: base.file,
                budget_ms_from: budget_from.into(),
                peak_qps: peak,
                peak_qps_from: peak_from.into(),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MLP: &str = include_str!("../../../crates/infer-serve/testdata/mlp.runtime.toml");

    fn request(slo_ms: Option<f64>, peak_qps: Option<f64>) -> Request {
        Request {
            base: Base {
                kind: InputKind::Recipe,
                file: PathBuf::from("dir/recipe.toml"),
                config: RuntimeConfig::from_toml_str(MLP).unwrap(),
                slo_ms,
                peak_qps,
            },
            synthetic: None,
            budget_ms: None,
            peak_qps: None,
            rate: None,
            delays_ms: Vec::new(),
            max_batches: Vec::new(),
            headroom: 1.3,
            min_gain: 0.02,
            arrival: Arrival::Poisson,
            warmup: Duration::from_secs(1),
            duration: Duration::from_secs(5),
            seed: 1,
            lengths: crate::bench::v2::Lengths::DEFAULT,
            serve: PathBuf::from("infer-serve"),
            progress: Progress::default(),
        }
    }

    #[test]
    fn flags_win_over_the_recipe_and_defaults_fill_the_grid() {
        let r = request(Some(50.0), Some(200.0)).resolve().unwrap();
        assert_eq!(r.options.budget_ms, 50.0);
        assert_eq!(r.input.budget_ms_from, "deploy.latency_slo_ms");
        assert_eq!((r.input.peak_qps, r.options.rate), (200.0, 200.0));
        assert_eq!(r.input.peak_qps_from, "deploy.peak_qps");
        assert_eq!(
            r.options.delays_us,
            [0, 10_000, 20_000, 30_000, 40_000, 50_000, 60_000]
        );
        let max = RuntimeConfig::from_toml_str(MLP)
            .unwrap()
            .batching
            .max_batch_size;
        assert_eq!(r.options.max_batches, [max]);
        assert_eq!(r.options.base_dir, Path::new("dir"));
        assert_eq!(
            r.describe(),
            "recipe dir/recipe.toml: p99 budget 50 ms (deploy.latency_slo_ms), peak 200 req/s (deploy.peak_qps), driven at 200 req/s"
        );

        let mut q = request(Some(50.0), Some(200.0));
        q.budget_ms = Some(20.0);
        q.rate = Some(80.0);
        q.delays_ms = vec![0.5];
        let r = q.resolve().unwrap();
        assert_eq!(
            (r.options.budget_ms, r.input.budget_ms_from.as_str()),
            (20.0, "--budget-ms")
        );
        // A flag wins over the recipe: the rate stands in for the peak.
        assert_eq!((r.input.peak_qps, r.options.rate), (80.0, 80.0));
        assert_eq!(r.input.peak_qps_from, "--rate");
        assert_eq!(r.options.delays_us, [500]);

        // With both, points are driven at the rate and capacity is planned for the peak.
        let mut q = request(Some(50.0), Some(200.0));
        q.peak_qps = Some(300.0);
        q.rate = Some(80.0);
        let r = q.resolve().unwrap();
        assert_eq!((r.input.peak_qps, r.options.rate), (300.0, 80.0));
        assert_eq!(r.input.peak_qps_from, "--peak-qps");
    }

    #[test]
    fn the_synthetic_engine_replaces_the_model() {
        let mut q = request(Some(50.0), Some(10.0));
        q.synthetic = Some("40, 6".into());
        let r = q.clone().resolve().unwrap();
        assert_eq!(
            r.options.base.engine.kind,
            infer_spec::BackendKind::Synthetic
        );
        let s = r.options.base.engine.synthetic.unwrap();
        assert_eq!((s.base_ms, s.per_row_ms, s.per_token_ms), (40.0, 6.0, 0.0));
        assert_eq!(r.options.base.engine.path, None);
        q.synthetic = Some("1,0,0.05".into());
        let s = q.resolve().unwrap().options.base.engine.synthetic.unwrap();
        assert_eq!((s.base_ms, s.per_row_ms, s.per_token_ms), (1.0, 0.0, 0.05));
    }

    #[test]
    fn every_refusal_is_bad_input_and_names_the_value() {
        type Edit = fn(&mut Request);
        let cases: &[(&str, Option<f64>, Option<f64>, Edit)] = &[
            ("a p99 budget (--budget-ms", None, Some(10.0), |_| {}),
            (
                "a peak rate (--peak-qps or --rate",
                Some(50.0),
                None,
                |_| {},
            ),
            (
                "the p99 budget -1 ms must be a positive number",
                Some(-1.0),
                Some(10.0),
                |_| {},
            ),
            ("the peak rate NaN req/s", Some(50.0), Some(10.0), |q| {
                q.peak_qps = Some(f64::NAN)
            }),
            (
                "--rate 0 must be a positive number",
                Some(50.0),
                Some(10.0),
                |q| {
                    q.peak_qps = Some(10.0);
                    q.rate = Some(0.0)
                },
            ),
            (
                "--headroom 3 is outside 1.0-2.0",
                Some(50.0),
                Some(10.0),
                |q| q.headroom = 3.0,
            ),
            (
                "--min-gain -0.1 must be zero",
                Some(50.0),
                Some(10.0),
                |q| q.min_gain = -0.1,
            ),
            (
                "--delays-ms values must be zero or positive",
                Some(50.0),
                Some(10.0),
                |q| q.delays_ms = vec![10.0, -1.0],
            ),
            (
                "--max-batch values must be at least 1",
                Some(50.0),
                Some(10.0),
                |q| q.max_batches = vec![4, 0],
            ),
            (
                "--synthetic `40` must be BASE_MS,PER_ROW_MS",
                Some(50.0),
                Some(10.0),
                |q| q.synthetic = Some("40".into()),
            ),
            ("--synthetic `a,b` must be", Some(50.0), Some(10.0), |q| {
                q.synthetic = Some("a,b".into())
            }),
            ("--synthetic `1,-2` must be", Some(50.0), Some(10.0), |q| {
                q.synthetic = Some("1,-2".into())
            }),
            (
                "--synthetic `1,2,3,4` must be",
                Some(50.0),
                Some(10.0),
                |q| q.synthetic = Some("1,2,3,4".into()),
            ),
        ];
        for (want, slo, peak, edit) in cases {
            let mut q = request(*slo, *peak);
            edit(&mut q);
            let e = q.resolve().expect_err(want);
            assert!(e.is_bad_input(), "{want}: {e}");
            assert!(e.to_string().contains(want), "{want}: got {e}");
        }
    }
}
