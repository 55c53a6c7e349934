//! Counters, gauges and histograms, rendered as Prometheus text at `/metrics` and as Triton's
//! statistics JSON at `/v2/models/{m}/stats`.
//!
//! Names: Triton's `nv_inference_*` (so existing dashboards keep working) plus
//! `infer_serve_*` histograms (request, queue, compute and overhead time, batch size), gauges
//! (queue depth, in-flight requests, readiness, engine load and warm-up time) and rejections by
//! reason.
//!
//! Counters and histograms are sharded: each thread adds to its own 128-byte-aligned cells
//! (one relaxed add per event, on a cache line no other thread writes) and a read sums the
//! shards. A single shared atomic would bounce between cores on every request, which costs
//! more than the arithmetic. Gauges the server reads to decide (queue depth, in-flight
//! requests, readiness) stay single atomics.

use crate::conn::Closed;
use crate::error::Rejection;
use std::cell::Cell;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Upper bounds (seconds) of the latency histograms' buckets: fine below 100 µs, where the
/// server's own overhead and a small model's compute live, so their quantiles are read to a
/// few µs rather than guessed inside a wide bucket.
const LATENCY_BOUNDS: [f64; 27] = [
    0.000_005, 0.000_01, 0.000_015, 0.000_02, 0.000_025, 0.000_03, 0.000_04, 0.000_05, 0.000_075,
    0.000_1, 0.000_15, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Shards per counter or histogram. Threads beyond this many share shards (still correct,
/// adds are atomic); the server runs one thread per core plus one per backend instance.
const SHARDS: usize = 16;

/// One cache line pair (adjacent-line prefetch pulls lines in twos) of cells.
#[repr(align(128))]
struct Line([AtomicU64; 16]);

impl Line {
    fn new() -> Line {
        Line(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// An atomic on a cache line of its own: the gauges written on every request must not share
/// a line with the fields every counter update reads (the shards' addresses).
#[repr(align(128))]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn new(v: u64) -> Gauge {
        Gauge(AtomicU64::new(v))
    }
}

impl std::ops::Deref for Gauge {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

/// The calling thread's shard, assigned round-robin on first use.
fn shard() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    }
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Relaxed) % SHARDS);
        }
        s.get()
    })
}

/// `cells` u64 cells per shard, each shard on lines of its own.
struct Cells {
    lines_per_shard: usize,
    lines: Box<[Line]>,
}

impl Cells {
    fn new(cells: usize) -> Cells {
        let lines_per_shard = cells.div_ceil(16);
        Cells {
            lines_per_shard,
            lines: (0..lines_per_shard * SHARDS).map(|_| Line::new()).collect(),
        }
    }

    fn cell(&self, shard: usize, i: usize) -> &AtomicU64 {
        &self.lines[shard * self.lines_per_shard + i / 16].0[i % 16]
    }

    fn add(&self, shard: usize, i: usize, v: u64) {
        self.cell(shard, i).fetch_add(v, Relaxed);
    }

    fn sum(&self, i: usize) -> u64 {
        (0..SHARDS).fold(0u64, |acc, s| {
            acc.wrapping_add(self.cell(s, i).load(Relaxed))
        })
    }
}

/// A monotonic counter.
pub struct Counter(Cells);

impl Counter {
    fn new() -> Counter {
        Counter(Cells::new(1))
    }

    pub fn add(&self, v: u64) {
        self.0.add(shard(), 0, v);
    }

    pub fn get(&self) -> u64 {
        self.0.sum(0)
    }
}

/// A fixed-bucket histogram; buckets are stored per bucket and summed when rendered.
pub struct Histogram {
    bounds: Vec<f64>,
    /// Per shard: one cell per bucket (the last is `+Inf`), then the sum (µs, or the value
    /// × 1e6 for unitless histograms).
    cells: Cells,
}

impl Histogram {
    fn new(bounds: Vec<f64>) -> Histogram {
        let cells = Cells::new(bounds.len() + 2);
        Histogram { bounds, cells }
    }

    /// Records a value in the histogram's unit (seconds for latencies, rows for batch size).
    pub fn observe(&self, v: f64) {
        let i = self
            .bounds
            .iter()
            .position(|&b| v <= b)
            .unwrap_or(self.bounds.len());
        let n = self.bounds.len();
        let s = shard();
        self.cells.add(s, i, 1);
        self.cells.add(s, n + 1, (v * 1e6).round() as u64);
    }

    /// Records a duration in seconds.
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// `(upper bound, cumulative count)` pairs, ending with `+Inf`.
    pub fn cumulative(&self) -> Vec<(f64, u64)> {
        let mut acc = 0;
        (0..=self.bounds.len())
            .map(|i| {
                acc += self.cells.sum(i);
                (self.bounds.get(i).copied().unwrap_or(f64::INFINITY), acc)
            })
            .collect()
    }

    /// Sum of the observed values in millionths of the unit (µs for latencies).
    pub fn sum_micros(&self) -> u64 {
        self.cells.sum(self.bounds.len() + 1)
    }

    pub fn count(&self) -> u64 {
        self.cumulative().last().map_or(0, |&(_, n)| n)
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let cumulative = self.cumulative();
        for &(le, n) in &cumulative {
            let le = if le.is_infinite() {
                "+Inf".to_owned()
            } else {
                le.to_string()
            };
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {n}");
        }
        let sum = self.sum_micros() as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {}",
            cumulative.last().map_or(0, |&(_, n)| n)
        );
    }
}

/// Per batch size: executions and compute time (for Triton's `batch_stats`).
struct BatchStat {
    count: AtomicU64,
    compute_ns: AtomicU64,
}

/// Everything the runtime counts.
pub struct Metrics {
    labels: String,
    pub success: Counter,
    pub success_ns: Counter,
    pub failure_rejected: Counter,
    pub failure_cancelled: Counter,
    pub failure_backend: Counter,
    pub failure_other: Counter,
    pub failure_ns: Counter,
    pub inference_count: Counter,
    pub exec_count: Counter,
    pub request_us: Counter,
    pub queue_us: Counter,
    pub compute_us: Counter,
    pub queue_count: Counter,
    pub last_inference_ms: AtomicU64,
    pub request_hist: Histogram,
    pub queue_hist: Histogram,
    pub compute_hist: Histogram,
    pub batch_hist: Histogram,
    pub overhead_hist: Histogram,
    batch_stats: Vec<BatchStat>,
    rejections: [Counter; 4],
    pub queue_depth: Gauge,
    pub ready: AtomicU64,
    /// Times the device was found lost (a sticky CUDA error): 0 or 1 in a process's life.
    pub device_lost: Counter,
    /// Batches on which the engine panicked (each failed its requests; the server went on).
    pub engine_panics: Counter,
    /// The response cache (`[response_cache]`): lookups answered, lookups not, entries evicted.
    pub cache_hits: Counter,
    pub cache_misses: Counter,
    pub cache_evictions: Counter,
    /// Text models: the texts tokenized, and the time their requests spent tokenizing (the
    /// wait for a tokenizer worker included), in µs.
    pub tokenized_texts: Counter,
    pub tokenization_us: Counter,
    /// Image models: the images prepared, and the time spent decoding them, resizing and
    /// normalising them, and turning the engine's outputs into answers (labels, boxes), in µs.
    pub images: Counter,
    pub decode_us: Counter,
    pub resize_us: Counter,
    pub postprocess_us: Counter,
    /// Models whose requests are padded to a common length (text models, padded tensor
    /// models): the tokens their batches computed (rows x the batch's longest sequence) and
    /// the tokens the requests held; the difference is padding.
    pub padded_tokens: Counter,
    pub sequence_tokens: Counter,
    pub engine_load_us: AtomicU64,
    pub warmup_us: AtomicU64,
    /// What the whole server counts: requests in flight, overlaps, connections. Shared by
    /// every model of a bundle ([`Metrics::sharing`]), so a request to one model is seen by the
    /// others' batchers deciding whether to poll.
    server: Arc<ServerWide>,
}

/// The server's own series, whichever model a request is for.
pub struct ServerWide {
    /// Infer requests being handled (every model).
    pub in_flight: Gauge,
    /// When two infer requests last overlapped: ms since `epoch`, plus one (0: never). On a
    /// line of its own: read on every request, written at most once per millisecond.
    overlapped_ms: Gauge,
    epoch: Instant,
    /// Per listener, in [`PROTOCOLS`] order: open connections, those refused at
    /// `max_connections`, those the watchdog closed.
    pub connections: [Connections; 2],
}

impl ServerWide {
    fn new() -> ServerWide {
        ServerWide {
            in_flight: Gauge::new(0),
            overlapped_ms: Gauge::new(0),
            epoch: Instant::now(),
            connections: std::array::from_fn(|_| Connections::new()),
        }
    }
}

/// The listeners, as the `protocol` label names them.
pub const PROTOCOLS: [&str; 2] = ["http", "grpc"];

/// One listener's connections.
pub struct Connections {
    pub open: Gauge,
    /// Refused at `max_connections` (every open one had a request in progress).
    pub refused: Counter,
    /// Closed by the watchdog, by `Closed` reason.
    pub closed: [Counter; 3],
}

impl Connections {
    fn new() -> Connections {
        Connections {
            open: Gauge::new(0),
            refused: Counter::new(),
            closed: std::array::from_fn(|_| Counter::new()),
        }
    }

    /// Counts a connection the watchdog closed.
    pub fn record_closed(&self, why: Closed) {
        let i = Closed::ALL.iter().position(|&x| x == why).unwrap_or(0);
        self.closed[i].add(1);
    }
}

impl Metrics {
    /// The counters of the listener `protocol` names (`http` or `grpc`).
    pub fn connections(&self, protocol: &str) -> &Connections {
        let i = PROTOCOLS.iter().position(|&p| p == protocol).unwrap_or(0);
        &self.server.connections[i]
    }

    /// Infer requests being handled by the server (every model).
    pub fn in_flight(&self) -> &Gauge {
        &self.server.in_flight
    }

    /// A model's metrics with a server of its own (a one-model server).
    pub fn new(model: &str, version: &str, max_batch_size: u32) -> Metrics {
        Metrics::with_server(model, version, max_batch_size, Arc::new(ServerWide::new()))
    }

    /// A model's metrics sharing `other`'s server-wide series (a bundle's second model on).
    pub fn sharing(model: &str, version: &str, max_batch_size: u32, other: &Metrics) -> Metrics {
        Metrics::with_server(model, version, max_batch_size, other.server.clone())
    }

    fn with_server(
        model: &str,
        version: &str,
        max_batch_size: u32,
        server: Arc<ServerWide>,
    ) -> Metrics {
        let esc = |s: &str| {
            s.replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n")
        };
        let mut batch_bounds = Vec::new();
        let mut b = 1u32;
        while b < max_batch_size {
            batch_bounds.push(f64::from(b));
            b = b.saturating_mul(2);
        }
        batch_bounds.push(f64::from(max_batch_size));
        let z = || AtomicU64::new(0);
        Metrics {
            labels: format!("model=\"{}\",version=\"{}\"", esc(model), esc(version)),
            success: Counter::new(),
            success_ns: Counter::new(),
            failure_rejected: Counter::new(),
            failure_cancelled: Counter::new(),
            failure_backend: Counter::new(),
            failure_other: Counter::new(),
            failure_ns: Counter::new(),
            inference_count: Counter::new(),
            exec_count: Counter::new(),
            request_us: Counter::new(),
            queue_us: Counter::new(),
            compute_us: Counter::new(),
            queue_count: Counter::new(),
            last_inference_ms: z(),
            request_hist: Histogram::new(LATENCY_BOUNDS.to_vec()),
            queue_hist: Histogram::new(LATENCY_BOUNDS.to_vec()),
            compute_hist: Histogram::new(LATENCY_BOUNDS.to_vec()),
            batch_hist: Histogram::new(batch_bounds),
            overhead_hist: Histogram::new(LATENCY_BOUNDS.to_vec()),
            batch_stats: (0..=max_batch_size as usize)
                .map(|_| BatchStat {
                    count: z(),
                    compute_ns: z(),
                })
                .collect(),
            rejections: std::array::from_fn(|_| Counter::new()),
            queue_depth: Gauge::new(0),
            ready: z(),
            device_lost: Counter::new(),
            engine_panics: Counter::new(),
            cache_hits: Counter::new(),
            cache_misses: Counter::new(),
            cache_evictions: Counter::new(),
            tokenized_texts: Counter::new(),
            tokenization_us: Counter::new(),
            images: Counter::new(),
            decode_us: Counter::new(),
            resize_us: Counter::new(),
            postprocess_us: Counter::new(),
            padded_tokens: Counter::new(),
            sequence_tokens: Counter::new(),
            engine_load_us: z(),
            warmup_us: z(),
            server,
        }
    }

    /// An infer request came in (the in-flight gauge goes up; `InFlight`'s drop takes it
    /// down). Notes when it overlaps another, at most once per millisecond, so the line stays
    /// shared between cores under load.
    pub fn request_started(&self, now: Instant) {
        let s = &*self.server;
        if s.in_flight.fetch_add(1, Relaxed) > 0 {
            let ms = self.ms(now);
            if s.overlapped_ms.load(Relaxed) != ms {
                s.overlapped_ms.store(ms, Relaxed);
            }
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.server.epoch).as_millis() as u64 + 1
    }

    /// Requests come one at a time: none overlapped another in the last 50 ms. Busy polling
    /// (handler and leader) is for this case only; under load a polling thread holds up work.
    pub fn sequential(&self, now: Instant) -> bool {
        let last = self.server.overlapped_ms.load(Relaxed);
        last == 0 || self.ms(now).saturating_sub(last) > 50
    }

    /// A request that got its outputs.
    pub fn record_success(&self, total: Duration) {
        self.success.add(1);
        self.success_ns.add(total.as_nanos() as u64);
        self.request_us.add(total.as_micros() as u64);
        self.request_hist.observe_duration(total);
    }

    /// A request that failed with a 4xx/5xx after reaching the infer endpoint.
    pub fn record_failure(&self, total: Duration, rejection: Option<Rejection>, backend: bool) {
        let counter = match rejection {
            Some(Rejection::Cancelled) => &self.failure_cancelled,
            Some(_) => &self.failure_rejected,
            None if backend => &self.failure_backend,
            None => &self.failure_other,
        };
        counter.add(1);
        self.failure_ns.add(total.as_nanos() as u64);
        if let Some(r) = rejection {
            self.record_rejection(r);
        }
    }

    /// Counts a rejection by reason (`cancelled` is counted here, not via `record_failure`,
    /// when the client is already gone).
    pub fn record_rejection(&self, r: Rejection) {
        let i = Rejection::ALL.iter().position(|&x| x == r).unwrap_or(0);
        self.rejections[i].add(1);
    }

    /// One executed batch of `rows` rows.
    pub fn record_batch(&self, rows: usize, compute: Duration) {
        self.exec_count.add(1);
        self.inference_count.add(rows as u64);
        self.compute_us.add(compute.as_micros() as u64);
        self.compute_hist.observe_duration(compute);
        self.batch_hist.observe(rows as f64);
        if let Some(s) = self.batch_stats.get(rows) {
            s.count.fetch_add(1, Relaxed);
            s.compute_ns.fetch_add(compute.as_nanos() as u64, Relaxed);
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as u64;
        // Written once per millisecond at most: a store per batch would pull the line away
        // from the other instances' cores every time.
        if self.last_inference_ms.load(Relaxed) != now {
            self.last_inference_ms.store(now, Relaxed);
        }
    }

    /// The time one request spent queued.
    pub fn record_queue(&self, queued: Duration) {
        self.queue_count.add(1);
        self.queue_us.add(queued.as_micros() as u64);
        self.queue_hist.observe_duration(queued);
    }

    /// Prometheus text exposition of a one-model server: the model's series and the server's,
    /// all labelled with the model.
    pub fn render(&self) -> String {
        let mut o = String::with_capacity(8192);
        self.render_model(&mut o);
        self.render_server(&mut o, &self.labels);
        o
    }

    /// Prometheus text exposition of a bundle (`models` sharing one server): each family once,
    /// with one series per model; the server's series without a model label.
    pub fn render_bundle(models: &[&Metrics]) -> String {
        let mut texts: Vec<String> = models
            .iter()
            .map(|m| {
                let mut o = String::with_capacity(8192);
                m.render_model(&mut o);
                o
            })
            .collect();
        if let Some(first) = models.first() {
            let mut o = String::with_capacity(2048);
            first.render_server(&mut o, "");
            texts.push(o);
        }
        merge_families(&texts)
    }

    /// The model's own series, labelled with it.
    #[allow(
        clippy::too_many_lines,
        reason = "one model's exposition in output order, each series beside its HELP and TYPE lines"
    )]
    fn render_model(&self, o: &mut String) {
        let l = &self.labels;
        let counter = |o: &mut String, name: &str, help: &str, v: u64| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{{l}}} {v}"
            );
        };
        counter(
            o,
            "nv_inference_request_success",
            "Number of successful inference requests",
            self.success.get(),
        );
        let _ = writeln!(o, "# HELP nv_inference_request_failure Number of failed inference requests\n# TYPE nv_inference_request_failure counter");
        for (reason, v) in [
            ("REJECTED", &self.failure_rejected),
            ("CANCELED", &self.failure_cancelled),
            ("BACKEND", &self.failure_backend),
            ("OTHER", &self.failure_other),
        ] {
            let _ = writeln!(
                o,
                "nv_inference_request_failure{{{l},reason=\"{reason}\"}} {}",
                v.get()
            );
        }
        counter(
            o,
            "nv_inference_count",
            "Number of inferences performed (rows)",
            self.inference_count.get(),
        );
        counter(
            o,
            "nv_inference_exec_count",
            "Number of model executions (batches)",
            self.exec_count.get(),
        );
        counter(
            o,
            "nv_inference_request_duration_us",
            "Cumulative inference request duration in microseconds",
            self.request_us.get(),
        );
        counter(
            o,
            "nv_inference_queue_duration_us",
            "Cumulative inference queuing duration in microseconds",
            self.queue_us.get(),
        );
        counter(
            o,
            "nv_inference_compute_infer_duration_us",
            "Cumulative compute inference duration in microseconds",
            self.compute_us.get(),
        );
        let gauge = |o: &mut String, name: &str, help: &str, v: String| {
            let _ = writeln!(
                o,
                "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{l}}} {v}"
            );
        };
        gauge(
            o,
            "nv_inference_pending_request_count",
            "Requests waiting in the queue",
            self.queue_depth.load(Relaxed).to_string(),
        );
        gauge(
            o,
            "nv_model_load_duration_secs",
            "Engine load time in seconds",
            (self.engine_load_us.load(Relaxed) as f64 / 1e6).to_string(),
        );
        self.request_hist.render(
            o,
            "infer_serve_request_duration_seconds",
            "End-to-end infer request time (decode, queue, compute, encode)",
            l,
        );
        self.queue_hist.render(
            o,
            "infer_serve_queue_duration_seconds",
            "Time a request waited in the batching queue",
            l,
        );
        self.compute_hist.render(
            o,
            "infer_serve_compute_duration_seconds",
            "Time one batch spent in the engine",
            l,
        );
        self.overhead_hist.render(
            o,
            "infer_serve_overhead_seconds",
            "Per successful request: request time minus compute time (decode, queue, hand-offs, encode)",
            l,
        );
        self.batch_hist
            .render(o, "infer_serve_batch_size", "Rows per executed batch", l);
        gauge(
            o,
            "infer_serve_queue_depth",
            "Requests waiting in the batching queue",
            self.queue_depth.load(Relaxed).to_string(),
        );
        gauge(
            o,
            "infer_serve_ready",
            "1 when the model is ready to serve",
            self.ready.load(Relaxed).to_string(),
        );
        let _ = writeln!(
            o,
            "# HELP infer_serve_device_lost_total Sticky device errors (the GPU is unusable until the process restarts; the server is not ready from the first)\n# TYPE infer_serve_device_lost_total counter\ninfer_serve_device_lost_total{{{l}}} {}",
            self.device_lost.get()
        );
        counter(
            o,
            "infer_serve_engine_panics_total",
            "Batches on which the engine panicked: their requests failed with 500, the server went on",
            self.engine_panics.get(),
        );
        // Triton's names for its response cache.
        counter(
            o,
            "nv_cache_num_hits_per_model",
            "Requests answered from the response cache",
            self.cache_hits.get(),
        );
        counter(
            o,
            "nv_cache_num_misses_per_model",
            "Response cache lookups that found nothing",
            self.cache_misses.get(),
        );
        counter(
            o,
            "infer_serve_cache_evictions_total",
            "Response cache entries evicted to stay within max_bytes",
            self.cache_evictions.get(),
        );
        counter(
            o,
            "infer_serve_tokenized_texts_total",
            "Texts tokenized by a text model (request rows, pairs counting once)",
            self.tokenized_texts.get(),
        );
        counter(
            o,
            "infer_serve_tokenization_duration_us",
            "Cumulative time text requests spent tokenizing, the wait for a tokenizer worker included",
            self.tokenization_us.get(),
        );
        counter(
            o,
            "infer_serve_images_total",
            "Images decoded and resized by an image model",
            self.images.get(),
        );
        counter(
            o,
            "infer_serve_image_decode_duration_us",
            "Cumulative time image requests spent decoding their images",
            self.decode_us.get(),
        );
        counter(
            o,
            "infer_serve_image_resize_duration_us",
            "Cumulative time image requests spent resizing and normalising their images",
            self.resize_us.get(),
        );
        counter(
            o,
            "infer_serve_postprocess_duration_us",
            "Cumulative time image requests spent turning the engine's outputs into labels, boxes or vectors",
            self.postprocess_us.get(),
        );
        counter(
            o,
            "infer_serve_batch_tokens_total",
            "Padded models: tokens the executed batches computed, rows x each batch's longest sequence",
            self.padded_tokens.get(),
        );
        counter(
            o,
            "infer_serve_sequence_tokens_total",
            "Padded models: tokens the batched requests held (the rest of infer_serve_batch_tokens_total is padding)",
            self.sequence_tokens.get(),
        );
        gauge(
            o,
            "infer_serve_engine_load_seconds",
            "Time to load and optimise the engine",
            (self.engine_load_us.load(Relaxed) as f64 / 1e6).to_string(),
        );
        gauge(
            o,
            "infer_serve_warmup_seconds",
            "Time to run every warm-up sample",
            (self.warmup_us.load(Relaxed) as f64 / 1e6).to_string(),
        );
        let _ = writeln!(o, "# HELP infer_serve_rejected_requests_total Requests refused with 503, by reason\n# TYPE infer_serve_rejected_requests_total counter");
        for (r, v) in Rejection::ALL.iter().zip(&self.rejections) {
            let _ = writeln!(
                o,
                "infer_serve_rejected_requests_total{{{l},reason=\"{}\"}} {}",
                r.as_str(),
                v.get()
            );
        }
    }

    /// The server's series (requests in flight, connections), with `labels` (a one-model
    /// server's model labels, or none).
    fn render_server(&self, o: &mut String, labels: &str) {
        let l = if labels.is_empty() {
            String::new()
        } else {
            format!("{labels},")
        };
        let _ = writeln!(
            o,
            "# HELP infer_serve_in_flight_requests Infer requests being handled\n# TYPE infer_serve_in_flight_requests gauge\ninfer_serve_in_flight_requests{{{}}} {}",
            labels,
            self.server.in_flight.load(Relaxed)
        );
        let _ = writeln!(o, "# HELP infer_serve_open_connections Open client connections, by listener\n# TYPE infer_serve_open_connections gauge");
        for (p, c) in PROTOCOLS.iter().zip(&self.server.connections) {
            let _ = writeln!(
                o,
                "infer_serve_open_connections{{{l}protocol=\"{p}\"}} {}",
                c.open.load(Relaxed)
            );
        }
        let _ = writeln!(o, "# HELP infer_serve_refused_connections_total Connections refused at server.max_connections, every open one having a request in progress\n# TYPE infer_serve_refused_connections_total counter");
        for (p, c) in PROTOCOLS.iter().zip(&self.server.connections) {
            let _ = writeln!(
                o,
                "infer_serve_refused_connections_total{{{l}protocol=\"{p}\"}} {}",
                c.refused.get()
            );
        }
        let _ = writeln!(o, "# HELP infer_serve_closed_connections_total Connections the server closed: headers too slow, idle too long, or the longest idle one at server.max_connections\n# TYPE infer_serve_closed_connections_total counter");
        for (p, c) in PROTOCOLS.iter().zip(&self.server.connections) {
            for (why, v) in Closed::ALL.iter().zip(&c.closed) {
                let _ = writeln!(
                    o,
                    "infer_serve_closed_connections_total{{{l}protocol=\"{p}\",reason=\"{}\"}} {}",
                    why.as_str(),
                    v.get()
                );
            }
        }
    }

    /// Triton's `GET /v2/models/{m}/stats` body.
    pub fn stats_json(&self, name: &str, version: &str) -> serde_json::Value {
        use serde_json::json;
        let d = |count: u64, ns: u64| json!({ "count": count, "ns": ns });
        let fail = self.failure_rejected.get()
            + self.failure_cancelled.get()
            + self.failure_backend.get()
            + self.failure_other.get();
        let exec = self.exec_count.get();
        let compute_ns = self.compute_us.get() * 1000;
        let batch_stats: Vec<serde_json::Value> = self
            .batch_stats
            .iter()
            .enumerate()
            .filter(|(_, s)| s.count.load(Relaxed) > 0)
            .map(|(size, s)| {
                let n = s.count.load(Relaxed);
                json!({
                    "batch_size": size,
                    "compute_input": d(n, 0),
                    "compute_infer": d(n, s.compute_ns.load(Relaxed)),
                    "compute_output": d(n, 0),
                })
            })
            .collect();
        json!({ "model_stats": [{
            "name": name,
            "version": version,
            "last_inference": self.last_inference_ms.load(Relaxed),
            "inference_count": self.inference_count.get(),
            "execution_count": exec,
            "inference_stats": {
                "success": d(self.success.get(), self.success_ns.get()),
                "fail": d(fail, self.failure_ns.get()),
                "queue": d(self.queue_count.get(), self.queue_us.get() * 1000),
                "compute_input": d(self.queue_count.get(), 0),
                "compute_infer": d(self.queue_count.get(), compute_ns),
                "compute_output": d(self.queue_count.get(), 0),
                "cache_hit": d(0, 0),
                "cache_miss": d(0, 0),
            },
            "batch_stats": batch_stats,
            "memory_usage": [],
        }]})
    }
}

/// Prometheus text of several exposition texts, each family's `# HELP` and `# TYPE` once and
/// its series together (the format requires both), families in the order first seen.
fn merge_families(texts: &[String]) -> String {
    let mut order: Vec<&str> = Vec::new();
    let mut families: std::collections::HashMap<&str, (Vec<&str>, Vec<&str>)> =
        std::collections::HashMap::new();
    for text in texts {
        let mut family = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                family = rest.split(' ').next().unwrap_or("");
            }
            let entry = families.entry(family).or_insert_with(|| {
                order.push(family);
                (Vec::new(), Vec::new())
            });
            if line.starts_with('#') {
                if !entry.0.contains(&line) {
                    entry.0.push(line);
                }
            } else {
                entry.1.push(line);
            }
        }
    }
    let mut out = String::with_capacity(texts.iter().map(String::len).sum());
    for f in order {
        let (head, series) = &families[f];
        for line in head.iter().chain(series) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::new("m", "1", 32);
        for rows in [1, 1, 3, 32, 16] {
            m.record_batch(rows, Duration::from_micros(30));
        }
        let b = m.batch_hist.cumulative();
        assert_eq!(b.first(), Some(&(1.0, 2)));
        assert_eq!(b.iter().find(|(le, _)| *le == 4.0), Some(&(4.0, 3)));
        assert_eq!(b.last(), Some(&(f64::INFINITY, 5)));
        let text = m.render();
        assert!(
            text.contains("nv_inference_exec_count{model=\"m\",version=\"1\"} 5"),
            "{text}"
        );
        assert!(text.contains("nv_inference_count{model=\"m\",version=\"1\"} 53"));
        assert!(
            text.contains("infer_serve_batch_size_bucket{model=\"m\",version=\"1\",le=\"32\"} 5")
        );
        assert!(text.contains("infer_serve_compute_duration_seconds_bucket{model=\"m\",version=\"1\",le=\"0.00005\"} 5"));
        m.record_rejection(Rejection::QueueFull);
        assert!(m.render().contains("infer_serve_rejected_requests_total{model=\"m\",version=\"1\",reason=\"queue_full\"} 1"));
        let s = m.stats_json("m", "1");
        assert_eq!(s["model_stats"][0]["execution_count"], 5);
        assert_eq!(s["model_stats"][0]["batch_stats"][0]["batch_size"], 1);
    }

    #[test]
    fn overlapping_requests_end_sequential_mode_for_a_while() {
        let m = Metrics::new("m", "1", 8);
        let t0 = Instant::now();
        assert!(m.sequential(t0));
        m.request_started(t0);
        assert!(m.sequential(t0), "a lone request is not an overlap");
        m.in_flight().fetch_sub(1, Relaxed);
        m.request_started(t0);
        m.request_started(t0);
        assert_eq!(m.in_flight().load(Relaxed), 2);
        assert!(!m.sequential(t0));
        assert!(!m.sequential(t0 + Duration::from_millis(40)));
        assert!(m.sequential(t0 + Duration::from_millis(60)));
    }

    #[test]
    fn a_bundle_renders_each_family_once_with_a_series_per_model() {
        let a = Metrics::new("a", "1", 8);
        let b = Metrics::sharing("b", "2", 4, &a);
        assert!(Arc::ptr_eq(&a.server, &b.server), "one server-wide set");
        a.record_batch(3, Duration::from_micros(30));
        b.request_started(Instant::now());
        b.connections("grpc").open.fetch_add(2, Relaxed);
        let text = Metrics::render_bundle(&[&a, &b]);
        for family in [
            "nv_inference_count",
            "infer_serve_batch_size",
            "infer_serve_open_connections",
        ] {
            let help = format!("# HELP {family} ");
            assert_eq!(text.matches(&help).count(), 1, "{family}: {text}");
            assert_eq!(
                text.matches(&format!("# TYPE {family} ")).count(),
                1,
                "{family}"
            );
        }
        assert!(
            text.contains("nv_inference_count{model=\"a\",version=\"1\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("nv_inference_count{model=\"b\",version=\"2\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("infer_serve_in_flight_requests{} 1"),
            "{text}"
        );
        assert!(
            text.contains("infer_serve_open_connections{protocol=\"grpc\"} 2"),
            "{text}"
        );
        // A family's series follow its header, with no other family's lines between them.
        let lines: Vec<&str> = text.lines().collect();
        let at = |needle: &str| lines.iter().position(|l| l.starts_with(needle)).unwrap();
        let head = at("# TYPE nv_inference_count ");
        assert_eq!(
            lines[head + 1],
            "nv_inference_count{model=\"a\",version=\"1\"} 3"
        );
        assert_eq!(
            lines[head + 2],
            "nv_inference_count{model=\"b\",version=\"2\"} 0"
        );
        // One model alone renders as before, its labels on the server's series too.
        assert!(Metrics::new("m", "1", 8).render().contains(
            "infer_serve_open_connections{model=\"m\",version=\"1\",protocol=\"http\"} 0"
        ));
    }

    #[test]
    fn shards_add_up_across_threads() {
        let m = std::sync::Arc::new(Metrics::new("m", "1", 8));
        // More threads than shards, so some share one.
        let threads: Vec<_> = (0..SHARDS + 3)
            .map(|t| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for i in 0..1000u64 {
                        m.record_success(Duration::from_micros(1 + (i + t as u64) % 3));
                        m.record_batch(1 + (i % 8) as usize, Duration::from_micros(7));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let n = (SHARDS as u64 + 3) * 1000;
        assert_eq!(m.success.get(), n);
        assert_eq!(m.exec_count.get(), n);
        assert_eq!(m.inference_count.get(), n / 8 * 36);
        assert_eq!(m.request_hist.count(), n);
        let micros: u64 = (0..SHARDS as u64 + 3)
            .flat_map(|t| (0..1000u64).map(move |i| 1 + (i + t) % 3))
            .sum();
        assert_eq!(m.request_hist.sum_micros(), micros);
        assert_eq!(
            m.compute_hist.cumulative().last(),
            Some(&(f64::INFINITY, n))
        );
        assert_eq!(m.batch_hist.cumulative()[0], (1.0, n / 8));
    }
}
