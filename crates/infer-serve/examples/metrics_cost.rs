//! The cost of infer-serve's metrics on the request path, for `docs/BENCHMARKS.md`.
//!
//! Every metric a successful one-row request touches, in the order the server touches them
//! (in-flight gauge and overlap note, queue time, one batch of one row, overhead, success;
//! plus the clock reads they need), run by two threads at once on one shared `Metrics` so
//! shared atomics bounce between cores as they do under load: the worst case, a batch per
//! request. Prints nanoseconds of
//! CPU per request; `bench/runtime.sh` sets it against the measured CPU time per request
//! (cores / inferences per second) of the same run.
//!
//!   cargo run --release -p infer-serve --example metrics_cost [-- REQUESTS_PER_THREAD]
#![allow(
    clippy::disallowed_macros,
    reason = "a measurement program: its report is its output"
)]

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infer_serve::metrics::Metrics;

fn one_request(m: &Metrics) {
    let start = Instant::now();
    m.request_started(start);
    // The queue-depth gauge is the batcher's count of waiting requests: up on submit, down
    // when the batch takes the request.
    m.queue_depth.fetch_add(1, Relaxed);
    let enqueued = Instant::now();
    m.queue_depth.fetch_sub(1, Relaxed);
    m.record_queue(enqueued.elapsed());
    let t = Instant::now();
    m.record_batch(1, t.elapsed());
    m.overhead_hist
        .observe_duration(start.elapsed().saturating_sub(Duration::from_nanos(1)));
    m.record_success(start.elapsed());
    m.in_flight().fetch_sub(1, Relaxed);
}

/// A request's clock reads alone (what remains if metrics were gone but deadlines stayed).
fn clocks_only(sink: &mut u64) {
    let a = Instant::now();
    let b = Instant::now();
    *sink = sink.wrapping_add((b - a).as_nanos() as u64);
}

fn per_request_ns(threads: usize, n: u64, f: impl Fn() + Send + Sync + 'static) -> f64 {
    let f = Arc::new(f);
    let t0 = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || {
                for _ in 0..n {
                    f();
                }
            })
        })
        .collect();
    for h in hs {
        h.join().expect("bench thread");
    }
    // Wall time × threads = CPU time when each thread has its own core.
    t0.elapsed().as_nanos() as f64 * threads as f64 / (n as f64 * threads as f64)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let m = Arc::new(Metrics::new("m", "1", 32));
    let mut with = Vec::new();
    let mut clocks = Vec::new();
    for _ in 0..5 {
        let mm = m.clone();
        with.push(per_request_ns(2, n, move || one_request(&mm)));
        clocks.push(per_request_ns(2, n, || {
            let mut s = 0;
            clocks_only(&mut s);
            std::hint::black_box(s);
        }));
    }
    let (w, c) = (median(with), median(clocks));
    println!(
        "{{\"metrics_ns_per_request\":{w:.1},\"clock_reads_ns_per_request\":{c:.1},\"threads\":2,\"requests_per_thread\":{n},\"runs\":5}}"
    );
}
