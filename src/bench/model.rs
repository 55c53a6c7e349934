//! The backend's cost per batch, fitted from a sweep's own measurements, and a replay of
//! infer-serve's batching rule against it.
//!
//! Why it exists: at a fixed offered rate the differences between neighbouring delays are a
//! few percent of capacity and of mean latency, while a short open-loop sample (160 requests
//! in 8 s at 20 req/s) varies by more than that from run to run: queueing makes consecutive
//! latencies strongly correlated, so the sample is worth far fewer than 160 independent
//! draws. Two runs of the same sweep then disagree on which step stops paying. The cost of a
//! batch, on the other hand, is measured precisely at every point (compute time and rows per
//! batch from the server's metrics). Fitting `T(b) = fixed + per_row × b` to all points at
//! once and replaying the batcher against a long seeded arrival sequence gives each point's
//! mean latency and capacity without the sampling noise. The measured points stay the judge
//! of the p99 budget and of the fit itself: a fit that does not reproduce them is not used.
//!
//! Everything here is pure and deterministic: the same measurements and seed give the same
//! predictions.

use super::load::{schedule, Arrival};
use super::tune::Measured;

/// The backend's time for one batch: `fixed_us` + `per_row_us` × its rows, or, for a model
/// whose requests are padded to a common length (text, padded tensors), `fixed_us` +
/// `per_token_us` × its tokens (rows × its longest sequence): there a batch's cost grows with
/// the padding its mix of lengths brings, not with its rows. One of the two slopes is fitted,
/// the other is 0.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct CostModel {
    pub fixed_us: f64,
    pub per_row_us: f64,
    pub per_token_us: f64,
    /// The largest relative difference between a point's measured mean time per batch and
    /// the model's, over the points it was fitted to.
    pub max_rel_error: f64,
}

impl CostModel {
    /// The time of a batch of `rows` rows and `tokens` tokens computed (0 where the model is
    /// not padded).
    pub(crate) fn batch_us(&self, rows: usize, tokens: usize) -> f64 {
        self.fixed_us + self.per_row_us * rows as f64 + self.per_token_us * tokens as f64
    }

    /// Whether the cost is per token (a padded model's).
    pub(crate) fn per_token(&self) -> bool {
        self.per_token_us > 0.0
    }
}

/// Why no model was fitted.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NoFit {
    /// Fewer than two points carry the server's batch metrics.
    TooFewPoints,
    /// The points' mean batch sizes are too close to tell the fixed cost from the per-row cost.
    NoSpread { min: f64, max: f64 },
    /// The fitted line misses a measured point by more than the tolerance.
    NotLinear { rel_error: f64 },
    /// Some points report the tokens their batches computed and others do not.
    MixedUnits,
}

impl std::fmt::Display for NoFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoFit::TooFewPoints => write!(f, "fewer than two points report batch metrics"),
            NoFit::NoSpread { min, max } => write!(
                f,
                "mean batch sizes span only {min:.2} to {max:.2} rows, too little to separate the fixed cost from the per-row cost"
            ),
            NoFit::MixedUnits => write!(
                f,
                "only some points report the tokens their batches computed (infer_serve_batch_tokens_total)"
            ),
            NoFit::NotLinear { rel_error } => write!(
                f,
                "the time per batch is not linear in its rows (a straight line misses a point by {:.0}%)",
                rel_error * 100.0
            ),
        }
    }
}

/// The least spread of mean batch sizes (rows) that separates the two costs.
const MIN_SPREAD: f64 = 0.15;
/// A fit that misses a point by more than this is not used.
const MAX_REL_ERROR: f64 = 0.10;

/// Fit T(b) by least squares of each point's mean time per batch against its mean batch
/// size (rows; tokens computed where the server reports them, a padded model's), weighted by
/// the batches it executed. Negative coefficients are clamped (a backend neither gets faster
/// with more work nor has negative overhead) and refitted.
pub(crate) fn fit(results: &[Measured]) -> Result<CostModel, NoFit> {
    // (mean rows per batch, mean tokens per batch, mean time per batch in µs, weight)
    let pts: Vec<(f64, Option<f64>, f64, f64)> = results
        .iter()
        .filter_map(|m| {
            let d = m.step.server.as_ref()?;
            let total = d.compute_total_us?;
            (d.batches > 0 && d.rows > 0 && total > 0.0).then(|| {
                let b = d.batches as f64;
                let tokens = d.batch_tokens.map(|t| t as f64 / b);
                (d.rows as f64 / b, tokens, total / b, b)
            })
        })
        .collect();
    if pts.len() < 2 {
        return Err(NoFit::TooFewPoints);
    }
    let per_token = match pts.iter().filter(|p| p.1.is_some()).count() {
        0 => false,
        n if n == pts.len() => true,
        _ => return Err(NoFit::MixedUnits),
    };
    let rows: Vec<(f64, f64, f64)> = pts.iter().map(|p| (p.0, p.2, p.3)).collect();
    // The rows' spread decides whether the slope can be told from the fixed cost, in either
    // unit: a batch's tokens spread with its rows and its mix of lengths.
    let min = rows.iter().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let max = rows.iter().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    if max - min < MIN_SPREAD {
        return Err(NoFit::NoSpread { min, max });
    }
    let xs: Vec<(f64, f64, f64)> = if per_token {
        pts.iter().map(|p| (p.1.unwrap_or(0.0), p.2, p.3)).collect()
    } else {
        rows
    };
    let (fixed, slope, max_rel_error) = line(&xs);
    if max_rel_error > MAX_REL_ERROR {
        return Err(NoFit::NotLinear {
            rel_error: max_rel_error,
        });
    }
    let (per_row_us, per_token_us) = if per_token {
        (0.0, slope)
    } else {
        (slope, 0.0)
    };
    Ok(CostModel {
        fixed_us: fixed,
        per_row_us,
        per_token_us,
        max_rel_error,
    })
}

/// The weighted least-squares line `y = fixed + slope × x` through `(x, y, weight)` points,
/// with neither coefficient negative, and its largest relative miss.
fn line(pts: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    let w: f64 = pts.iter().map(|p| p.2).sum();
    let mx = pts.iter().map(|p| p.0 * p.2).sum::<f64>() / w;
    let my = pts.iter().map(|p| p.1 * p.2).sum::<f64>() / w;
    let sxx: f64 = pts.iter().map(|p| p.2 * (p.0 - mx).powi(2)).sum();
    let sxy: f64 = pts.iter().map(|p| p.2 * (p.0 - mx) * (p.1 - my)).sum();
    let mut slope = sxy / sxx;
    let mut fixed = my - slope * mx;
    if slope < 0.0 {
        slope = 0.0;
        fixed = my;
    } else if fixed < 0.0 {
        // Through the origin: T = slope × x.
        fixed = 0.0;
        slope = pts.iter().map(|p| p.2 * p.0 * p.1).sum::<f64>()
            / pts.iter().map(|p| p.2 * p.0 * p.0).sum::<f64>();
    }
    let max_rel_error = pts
        .iter()
        .map(|p| ((fixed + slope * p.0) - p.1).abs() / p.1)
        .fold(0.0, f64::max);
    (fixed, slope, max_rel_error)
}

/// What the replay predicts for one point (times in µs, as the measurements).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) struct Predicted {
    pub mean_us: f64,
    pub p99_us: f64,
    pub mean_batch: f64,
    /// Rows per second one replica sustains with these batches (same definition as the
    /// measured capacity: rows over the compute time they took, times the instances).
    pub capacity_rps: f64,
}

/// The batching policy replayed; one row per request, as the sweep sends them.
#[derive(Debug, Clone)]
pub(crate) struct Policy {
    pub max_batch: u32,
    pub delay_us: u64,
    pub preferred: Vec<u32>,
    pub instances: u32,
    /// The adaptive queue delay (the runtime's default): wait only while more requests can be
    /// expected, as [`infer_spec::batch::Arrivals`] judges from the arrivals so far.
    pub adaptive: bool,
    /// A padded model: its batches' bounds, and the sequence length of each request sent in
    /// turn (arrival `k` has `lengths[k % len]`, as the sweep's open loop sends them).
    pub padding: Option<(infer_spec::batch::Padded, Vec<usize>)>,
}

/// Arrivals replayed per point; the first tenth warms the queue up and is not counted.
pub(crate) const REPLAY_ARRIVALS: usize = 50_000;

/// Replay infer-serve's batcher (a batch is formed only when an instance is idle, cut by the
/// runtime's own rule, [`infer_spec::batch::cut_padded`], with the adaptive delay judged by the
/// runtime's own [`infer_spec::batch::Arrivals`]) against `n` arrivals at `rate` requests per
/// second.
pub(crate) fn replay(
    model: &CostModel,
    policy: &Policy,
    rate: f64,
    arrival: Arrival,
    n: usize,
    seed: u64,
) -> Option<Predicted> {
    if !(rate.is_finite() && rate > 0.0) || n < 10 {
        return None;
    }
    let horizon = std::time::Duration::from_secs_f64(n as f64 / rate * 1.5 + 1.0);
    let arr: Vec<f64> = schedule(rate, arrival, horizon, seed)
        .into_iter()
        .take(n)
        .map(|d| d.as_secs_f64() * 1e6)
        .collect();
    let n = arr.len();
    let warm = n / 10;
    let mb = policy.max_batch.max(1) as usize;
    let delay = policy.delay_us as f64;
    let preferred: Vec<usize> = policy.preferred.iter().map(|&p| p as usize).collect();
    let (bounds, lengths) = match &policy.padding {
        Some((bounds, lengths)) if !lengths.is_empty() => (*bounds, lengths.as_slice()),
        _ => (infer_spec::batch::Padded::NONE, &[][..]),
    };
    let length = |k: usize| lengths.get(k % lengths.len().max(1)).copied().unwrap_or(0);
    let mut free = vec![0.0f64; policy.instances.max(1) as usize];
    let mut arrivals = infer_spec::batch::Arrivals::default();
    let mut observed = 0;
    let ns = |us: f64| (us.max(0.0) * 1000.0) as u64;
    let mut lat: Vec<f64> = Vec::with_capacity(n);
    let (mut rows, mut batches, mut busy) = (0usize, 0usize, 0.0f64);
    let mut i = 0;
    while i < n {
        let (slot, t_free) = free
            .iter()
            .copied()
            .enumerate()
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or((0, 0.0));
        let due = arr[i] + delay;
        // The leader decides when an instance is free and a request waits, and again at each
        // arrival or when the delay ends, as the runtime's does.
        let mut now = t_free.max(arr[i]);
        let cut = loop {
            while observed < n && arr[observed] <= now {
                // Alone: nothing queued (every earlier request is in a batch) and no batch
                // running. Every batch dispatched so far started before this arrival (it is
                // observed before any batch starting after it), so `free` says which still run.
                let alone = observed <= i && free.iter().all(|&f| f <= arr[observed]);
                arrivals.observe(ns(arr[observed]), alone);
                observed += 1;
            }
            let queued = arr[i..].iter().take(mb).take_while(|&&a| a <= now).count();
            let expect_more = !policy.adaptive
                || arrivals.expect_within(ns(now), ns(due).saturating_sub(ns(now)));
            match infer_spec::batch::cut_padded(
                (i..i + queued).map(|k| (1, length(k))),
                mb,
                bounds,
                &preferred,
                now >= due,
                expect_more,
            ) {
                infer_spec::batch::Cut::Take(c) => break c.max(1),
                infer_spec::batch::Cut::Wait => {
                    // The next event: an arrival, or the delay's end.
                    now = arr
                        .get(i + queued)
                        .copied()
                        .unwrap_or(f64::INFINITY)
                        .min(due);
                }
            }
        };
        let start = now;
        let tokens = cut * (i..i + cut).map(length).max().unwrap_or(0);
        let t = model.batch_us(cut, tokens);
        let end = start + t;
        free[slot] = end;
        if i >= warm {
            rows += cut;
            batches += 1;
            busy += t;
        }
        for &a in &arr[i..i + cut] {
            if i >= warm {
                lat.push(end - a);
            }
        }
        i += cut;
    }
    if lat.is_empty() || batches == 0 || busy <= 0.0 {
        return None;
    }
    lat.sort_by(f64::total_cmp);
    let p99 = lat[((lat.len() as f64 * 0.99).ceil() as usize).clamp(1, lat.len()) - 1];
    Some(Predicted {
        mean_us: lat.iter().sum::<f64>() / lat.len() as f64,
        p99_us: p99,
        mean_batch: rows as f64 / batches as f64,
        capacity_rps: rows as f64 * f64::from(policy.instances.max(1)) / (busy / 1e6),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(mb: u32, delay_ms: u64) -> Policy {
        Policy {
            max_batch: mb,
            delay_us: delay_ms * 1000,
            preferred: vec![],
            instances: 1,
            // These tests check Triton's rule; the adaptive delay has its own.
            adaptive: false,
            padding: None,
        }
    }

    const FIELD: CostModel = CostModel {
        fixed_us: 40_000.0,
        per_row_us: 6_000.0,
        per_token_us: 0.0,
        max_rel_error: 0.0,
    };

    #[test]
    fn replay_is_deterministic() {
        let a = replay(&FIELD, &policy(8, 10), 20.0, Arrival::Poisson, 5000, 7);
        let b = replay(&FIELD, &policy(8, 10), 20.0, Arrival::Poisson, 5000, 7);
        assert_eq!(a, b);
    }

    /// Without queueing the arithmetic is exact: evenly spaced arrivals far apart each wait
    /// the delay, then run alone.
    #[test]
    fn replay_without_contention_is_delay_plus_service() {
        let p = replay(&FIELD, &policy(8, 5), 5.0, Arrival::Constant, 1000, 1).unwrap();
        assert!((p.mean_batch - 1.0).abs() < 1e-12);
        assert!((p.mean_us - 51_000.0).abs() < 1e-6, "{p:?}");
        assert!((p.p99_us - 51_000.0).abs() < 1e-6, "{p:?}");
        assert!((p.capacity_rps - 1e6 / 46_000.0).abs() < 1e-6, "{p:?}");
    }

    /// The adaptive delay (the runtime's default): requests far apart never wait for company;
    /// under load the batches are those of the strict rule.
    #[test]
    fn replay_adaptive_delay_waits_only_when_company_can_come() {
        let adaptive = |mb, delay_ms| Policy {
            adaptive: true,
            ..policy(mb, delay_ms)
        };
        let p = replay(&FIELD, &adaptive(8, 5), 5.0, Arrival::Constant, 1000, 1).unwrap();
        assert!((p.mean_batch - 1.0).abs() < 1e-12, "{p:?}");
        assert!((p.mean_us - 46_000.0).abs() < 1e-6, "{p:?}");
        // Near the knee (80 req/s against a 40 ms + 6 ms/row engine, which does about 91/s
        // at batch 8) the queue never empties: the batches, and so the capacity, are the strict
        // rule's.
        let strict = replay(&FIELD, &policy(8, 100), 80.0, Arrival::Poisson, 20_000, 3).unwrap();
        let adapt = replay(&FIELD, &adaptive(8, 100), 80.0, Arrival::Poisson, 20_000, 3).unwrap();
        assert!(
            (adapt.mean_batch / strict.mean_batch - 1.0).abs() < 0.05,
            "{adapt:?} vs {strict:?}"
        );
        // Below it (20 req/s), waiting for company that comes late costs more than it saves:
        // the adaptive delay is never slower on average.
        let strict = replay(&FIELD, &policy(8, 100), 20.0, Arrival::Poisson, 20_000, 3).unwrap();
        let adapt = replay(&FIELD, &adaptive(8, 100), 20.0, Arrival::Poisson, 20_000, 3).unwrap();
        assert!(adapt.mean_us <= strict.mean_us, "{adapt:?} vs {strict:?}");
    }

    /// The field notes' worked example: batches grow with the delay; a full batch goes at
    /// once; a preferred size cuts before the delay.
    #[test]
    fn replay_batches_grow_with_the_delay_and_respect_limits() {
        let mut prev = 0.0;
        for d in [0, 20, 50, 100] {
            let p = replay(&FIELD, &policy(8, d), 20.0, Arrival::Poisson, 20_000, 3).unwrap();
            assert!(p.mean_batch > prev, "delay {d}: {p:?}");
            assert!(p.mean_batch <= 8.0);
            prev = p.mean_batch;
        }
        // Overload: 200 req/s needs batches of 8 (8 / 88 ms = 91 rows/s per instance is not
        // enough; 3 instances are): every batch is full.
        let mut pol = policy(8, 1000);
        pol.instances = 3;
        let p = replay(&FIELD, &pol, 200.0, Arrival::Constant, 5000, 1).unwrap();
        assert!((p.mean_batch - 8.0).abs() < 0.05, "{p:?}");
        // A preferred size of 2 sends pairs long before a 1 s delay.
        let mut pol = policy(8, 1000);
        pol.preferred = vec![2];
        let p = replay(&FIELD, &pol, 10.0, Arrival::Constant, 2000, 1).unwrap();
        assert!((p.mean_batch - 2.0).abs() < 1e-9, "{p:?}");
        // Waits for its partner (100 ms) and runs 52 ms: 152 and 52 ms.
        assert!((p.mean_us - 102_000.0).abs() < 1.0, "{p:?}");
    }

    /// A padded model: the batch's cost follows its tokens (rows x longest), which the fit
    /// finds from the server's token counts, and the replay cuts batches by the runtime's
    /// padded rule: with a padding bound, mixed lengths form smaller batches that cost less
    /// per row.
    #[test]
    fn a_padded_model_is_fitted_per_token_and_replayed_with_its_lengths() {
        // T = 2 ms + 0.05 ms per token; batches of mean 1.2 to 3 rows, 20 tokens per row
        // padded to 26.
        let t = |tokens: f64| 2_000.0 + 50.0 * tokens;
        let pts: Vec<Measured> = [1.2, 1.6, 2.2, 3.0]
            .iter()
            .map(|&b| {
                let mut m = point(b, 100, t(26.0 * b));
                let d = m.step.server.as_mut().unwrap();
                d.batch_tokens = Some((26.0 * b * 100.0).round() as u64);
                m
            })
            .collect();
        let m = fit(&pts).unwrap();
        assert!(m.per_token(), "{m:?}");
        assert!((m.fixed_us - 2_000.0).abs() < 20.0, "{m:?}");
        assert!((m.per_token_us - 50.0).abs() < 1.0, "{m:?}");
        assert_eq!(m.per_row_us, 0.0);
        let mut mixed = pts.clone();
        mixed[0].step.server.as_mut().unwrap().batch_tokens = None;
        assert_eq!(fit(&mixed), Err(NoFit::MixedUnits));

        // Lengths 4 and 40 in turn, under load: with a 25% padding bound the short and the
        // long never share a batch (each runs alone: 2.2 and 4 ms); unbounded, every batch
        // pads its rows to 40 tokens (at most 2 ms + 2 ms a row), which at this fixed cost
        // still pays.
        let lengths = vec![4, 40];
        let padded = |pct| Policy {
            padding: Some((
                infer_spec::batch::Padded {
                    token_budget: usize::MAX,
                    max_padding_percent: pct,
                },
                lengths.clone(),
            )),
            ..policy(8, 20)
        };
        let free = replay(&m, &padded(0), 150.0, Arrival::Poisson, 20_000, 3).unwrap();
        let bound = replay(&m, &padded(25), 150.0, Arrival::Poisson, 20_000, 3).unwrap();
        assert_eq!(bound.mean_batch, 1.0, "{bound:?}");
        assert!(
            (bound.capacity_rps - 1e6 / 3_100.0).abs() < 1.0,
            "{bound:?}"
        );
        assert!(free.mean_batch > 3.0, "{free:?}");
        let all_padded = 1e6 * free.mean_batch / (2_000.0 + 2_000.0 * free.mean_batch);
        assert!(
            (free.capacity_rps / all_padded - 1.0).abs() < 0.02,
            "{free:?}"
        );
        assert!(
            free.capacity_rps > bound.capacity_rps,
            "{free:?} vs {bound:?}"
        );
        // Alone, a request costs its own tokens: 2 + 0.05 x 4 and 2 + 0.05 x 40 ms.
        let alone = replay(&m, &padded(25), 1.0, Arrival::Constant, 1000, 1).unwrap();
        assert!(
            (alone.mean_us - 20_000.0 - (2_200.0 + 4_000.0) / 2.0).abs() < 100.0,
            "{alone:?}"
        );
    }

    fn point(mean_batch: f64, batches: u64, per_batch_us: f64) -> Measured {
        use crate::bench::metrics::ServerDelta;
        use crate::bench::stats::Summary;
        use crate::bench::tune::Point;
        use crate::bench::{Load, Step};
        let rows = (mean_batch * batches as f64).round() as u64;
        let step = Step {
            load: Load::Rate(20.0),
            batch: 1,
            sent: rows,
            ok: rows,
            errors: Default::default(),
            elapsed_s: 8.0,
            req_per_s: 20.0,
            infer_per_s: 20.0,
            latency: Summary::default(),
            server: Some(ServerDelta {
                batches,
                rows,
                compute_total_us: Some(per_batch_us * batches as f64),
                ..ServerDelta::default()
            }),
        };
        Measured {
            point: Point {
                max_batch: 8,
                delay_us: 0,
            },
            step,
            p99_ms: 0.0,
            mean_batch: Some(mean_batch),
            capacity_rps: None,
            served_rps: 20.0,
            predicted: None,
            remeasured_p99_ms: None,
        }
    }

    #[test]
    fn fit_recovers_the_cost_and_refuses_what_it_cannot_tell() {
        let t = |b: f64| 40_000.0 + 6_000.0 * b + 300.0; // sleep overshoot included
        let pts: Vec<Measured> = [1.35, 1.43, 1.57, 1.69, 1.82, 2.04]
            .iter()
            .map(|&b| point(b, 100, t(b)))
            .collect();
        let m = fit(&pts).unwrap();
        assert!((m.fixed_us - 40_300.0).abs() < 50.0, "{m:?}");
        assert!((m.per_row_us - 6_000.0).abs() < 50.0, "{m:?}");
        assert!(m.max_rel_error < 0.01);

        assert_eq!(fit(&pts[..1]), Err(NoFit::TooFewPoints));
        let flat = [point(1.0, 100, 500.0), point(1.05, 100, 510.0)];
        assert!(matches!(fit(&flat), Err(NoFit::NoSpread { .. })));
        let curved = [
            point(1.0, 100, 1000.0),
            point(2.0, 100, 1000.0),
            point(3.0, 100, 9000.0),
        ];
        assert!(matches!(fit(&curved), Err(NoFit::NotLinear { .. })));
        // Faster with more rows is clamped to a constant cost.
        let down = [point(1.0, 100, 1000.0), point(2.0, 100, 950.0)];
        let m = fit(&down).unwrap();
        assert_eq!(m.per_row_us, 0.0);
        assert!((m.fixed_us - 975.0).abs() < 1e-9);
    }
}
