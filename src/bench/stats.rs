//! Latency statistics over exact samples: the sample count of a bounded run is small enough
//! (millions at most) to keep every sample, sort once and read exact nearest-rank percentiles.

use std::collections::BTreeMap;

/// Percentiles and moments of one run's successful request latencies, in microseconds.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub(crate) struct Summary {
    pub count: u64,
    pub mean_us: f64,
    pub min_us: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
}

/// Nearest-rank percentile of sorted samples: the smallest value with at least `q` of the
/// samples at or below it. `q` in (0, 1].
pub(crate) fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Summarise samples (any order).
pub(crate) fn summarize(mut samples: Vec<u64>) -> Summary {
    if samples.is_empty() {
        return Summary::default();
    }
    samples.sort_unstable();
    let sum: u128 = samples.iter().map(|&v| u128::from(v)).sum();
    Summary {
        count: samples.len() as u64,
        mean_us: sum as f64 / samples.len() as f64,
        min_us: samples[0],
        p50_us: percentile(&samples, 0.50),
        p90_us: percentile(&samples, 0.90),
        p95_us: percentile(&samples, 0.95),
        p99_us: percentile(&samples, 0.99),
        p999_us: percentile(&samples, 0.999),
        max_us: samples[samples.len() - 1],
    }
}

/// Errors counted by kind: an HTTP status (`"503"`) or a client-side reason (`"connect"`).
pub(crate) type ErrorCounts = BTreeMap<String, u64>;

/// Merge `b` into `a`.
pub(crate) fn merge_errors(a: &mut ErrorCounts, b: ErrorCounts) {
    for (k, v) in b {
        *a.entry(k).or_insert(0) += v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(samples: &[u64], q: f64, expected: u64) {
        let mut s = samples.to_vec();
        s.sort_unstable();
        assert_eq!(percentile(&s, q), expected, "q={q} of {samples:?}");
    }

    #[test]
    fn nearest_rank_percentiles() {
        let hundred: Vec<u64> = (1..=100).collect();
        check(&hundred, 0.5, 50);
        check(&hundred, 0.99, 99);
        check(&hundred, 0.999, 100);
        check(&hundred, 1.0, 100);
        check(&[7], 0.5, 7);
        check(&[], 0.5, 0);
        check(&[3, 1, 2], 0.5, 2);
    }

    #[test]
    fn summary_of_known_samples() {
        let s = summarize((1..=1000).rev().collect());
        assert_eq!((s.count, s.min_us, s.max_us), (1000, 1, 1000));
        assert_eq!(
            (s.p50_us, s.p90_us, s.p99_us, s.p999_us),
            (500, 900, 990, 999)
        );
        assert!((s.mean_us - 500.5).abs() < 1e-9);
        assert_eq!(summarize(vec![]), Summary::default());
    }
}
