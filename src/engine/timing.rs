//! How every engine is timed, in one place: the runs per measurement, the medians, the rounding
//! that keeps profiles free of float noise, and T(b) of one batch size for the CPU candidates
//! (tract, ONNX Runtime). An engine added beside them times itself with [`time_batch`] so the
//! build compares like with like.

use std::time::Instant;

use infer_spec::engine::BatchTiming;

/// Number of loads per form when measuring start-up.
pub(crate) const STARTUP_RUNS: usize = 5;
/// Timed runs per batch size (after warm-up), and the time budget that may cut them short.
pub(crate) const PROFILE_RUNS: usize = 25;
pub(crate) const PROFILE_BUDGET_S: f64 = 2.0;

/// Median of a sorted, non-empty slice.
pub(crate) fn median_sorted(v: &[f64]) -> f64 {
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Round to 3 decimals so profiles do not carry float noise.
pub(crate) fn round_us(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// Median of any non-empty list (sorted here).
pub(crate) fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    median_sorted(&v)
}

/// T(b) of one batch size: `run` (which prepares its inputs and returns the time of the run
/// alone) is timed up to [`PROFILE_RUNS`] times, at least 5, within [`PROFILE_BUDGET_S`]; the
/// median, minimum and maximum in µs. The one timing rule of every CPU engine candidate.
pub(crate) fn time_batch<E>(
    batch: u32,
    mut run: impl FnMut() -> Result<std::time::Duration, E>,
) -> Result<BatchTiming, E> {
    let mut us = Vec::with_capacity(PROFILE_RUNS);
    let start = Instant::now();
    while us.len() < PROFILE_RUNS
        && (us.len() < 5 || start.elapsed().as_secs_f64() < PROFILE_BUDGET_S)
    {
        us.push(run()?.as_secs_f64() * 1e6);
    }
    us.sort_by(f64::total_cmp);
    Ok(BatchTiming {
        batch,
        median_us: round_us(median_sorted(&us)),
        min_us: round_us(us[0]),
        max_us: round_us(us[us.len() - 1]),
        runs: us.len() as u32,
        layers: Vec::new(),
    })
}

/// What an engine that runs from a native library (ONNX Runtime, OpenVINO) measured in the
/// builder: start-up (median of [`STARTUP_RUNS`]), T(b) at every planned batch size, and the
/// outputs of the reference inputs when asked for.
pub(crate) struct Measured {
    pub startup_ms: f64,
    pub startup_runs: u32,
    pub batches: Vec<BatchTiming>,
    /// Outputs on the reference inputs, as (shape, values as f64, row-major).
    pub outputs: Option<Vec<(Vec<usize>, Vec<f64>)>>,
}
