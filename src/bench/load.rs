//! The load generator: KServe V2 `infer` requests over HTTP/1.1 keep-alive connections
//! (tokio + hyper's connection-level client, no pool machinery in the hot path), either
//! closed-loop (N workers, each sends its next request when the previous one answers) or
//! open-loop (requests sent on a fixed schedule whatever the server does; latency counted
//! from the scheduled send time, so a slow server cannot hide its queue: no coordinated
//! omission).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::stats::ErrorCounts;
use super::Error;

/// Where the server is: a resolved address plus the `Host` header and a path prefix.
#[derive(Debug, Clone)]
pub(crate) struct Endpoint {
    pub addr: SocketAddr,
    pub host: String,
    /// Path prefix without a trailing slash (usually empty).
    pub base: String,
}

/// Parse `http://host:port[/prefix]` (the scheme may be left out).
pub(crate) fn parse_url(url: &str) -> Result<(String, u16, String), Error> {
    let bad = |why: &str| Error::BadUrl {
        url: url.to_string(),
        why: why.to_string(),
    };
    let rest = if let Some(r) = url.strip_prefix("http://") {
        r
    } else if url.starts_with("https://") {
        return Err(bad("https is not supported; bench a plain-HTTP endpoint"));
    } else if url.contains("://") {
        return Err(bad("only http:// URLs are supported"));
    } else {
        url
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || h.starts_with('[') => {
            let port = p
                .parse::<u16>()
                .map_err(|_| bad("the port is not a number"))?;
            (h, port)
        }
        _ => (authority, 80),
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    Ok((
        host.to_string(),
        port,
        path.trim_end_matches('/').to_string(),
    ))
}

impl Endpoint {
    pub(crate) async fn resolve(url: &str) -> Result<Endpoint, Error> {
        let (host, port, base) = parse_url(url)?;
        let lookup = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let addr = tokio::net::lookup_host((lookup.as_str(), port))
            .await
            .map_err(|e| Error::Connect {
                url: url.to_string(),
                source: e,
            })?
            .next()
            .ok_or_else(|| Error::BadUrl {
                url: url.to_string(),
                why: "the host resolves to no address".into(),
            })?;
        Ok(Endpoint {
            addr,
            host: format!("{host}:{port}"),
            base,
        })
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://{}{}{}", self.host, self.base, path)
    }
}

/// One HTTP/1.1 connection.
pub(crate) type Conn = http1::SendRequest<Full<Bytes>>;

pub(crate) async fn connect(ep: &Endpoint) -> std::io::Result<Conn> {
    let stream = TcpStream::connect(ep.addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(std::io::Error::other)?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// A prepared request: method, path, headers and body, cloned cheaply per send.
#[derive(Debug, Clone)]
pub(crate) struct Prepared {
    pub method: hyper::Method,
    pub path: String,
    pub content_type: &'static str,
    pub header_len: Option<usize>,
    pub body: Bytes,
}

impl Prepared {
    pub(crate) fn get(ep: &Endpoint, path: &str) -> Prepared {
        Prepared {
            method: hyper::Method::GET,
            path: format!("{}{}", ep.base, path),
            content_type: "text/plain",
            header_len: None,
            body: Bytes::new(),
        }
    }

    fn build(&self, host: &str) -> Request<Full<Bytes>> {
        let mut b = Request::builder()
            .method(self.method.clone())
            .uri(self.path.as_str())
            .header(hyper::header::HOST, host);
        if self.method == hyper::Method::POST {
            b = b.header(hyper::header::CONTENT_TYPE, self.content_type);
        }
        if let Some(n) = self.header_len {
            b = b.header("Inference-Header-Content-Length", n);
        }
        // The parts are fixed strings and a path we built: this cannot fail, but a failure
        // must not panic, so fall back to an empty request that the server will reject.
        b.body(Full::new(self.body.clone()))
            .unwrap_or_else(|_| Request::new(Full::new(Bytes::new())))
    }
}

/// The requests a step sends, in turn: one body for a model of fixed shapes, one per
/// sequence length for a text or padded model (`v2::infer_requests`). An open loop's `k`th
/// scheduled send carries body `k` modulo their count, so a replay of the schedule knows each
/// arrival's length.
#[derive(Debug, Clone)]
pub(crate) struct Requests {
    bodies: Arc<[Prepared]>,
    next: Arc<AtomicUsize>,
}

impl Requests {
    /// `first`, then `rest`, in turn.
    pub(crate) fn new(first: Prepared, rest: Vec<Prepared>) -> Requests {
        let mut bodies = vec![first];
        bodies.extend(rest);
        Requests {
            bodies: bodies.into(),
            next: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Body `k` (modulo their count).
    pub(crate) fn get(&self, k: usize) -> &Prepared {
        &self.bodies[k % self.bodies.len()]
    }

    /// The next body in turn (closed loops: whichever worker asks first).
    fn next(&self) -> &Prepared {
        self.get(self.next.fetch_add(1, Ordering::Relaxed))
    }
}

/// Send one request on `conn` and read the whole response.
pub(crate) async fn send(
    conn: &mut Conn,
    host: &str,
    req: &Prepared,
) -> Result<(StatusCode, Bytes), hyper::Error> {
    conn.ready().await?;
    let resp = conn.send_request(req.build(host)).await?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, body))
}

/// One request on a fresh connection (set-up calls: metadata, metrics, health).
pub(crate) async fn fetch(ep: &Endpoint, req: &Prepared) -> Result<(StatusCode, Bytes), Error> {
    let url = ep.url(&req.path[ep.base.len()..]);
    let mut conn = connect(ep).await.map_err(|e| Error::Connect {
        url: url.clone(),
        source: e,
    })?;
    send(&mut conn, &ep.host, req)
        .await
        .map_err(|e| Error::Http {
            url,
            what: e.to_string(),
        })
}

/// How the load is offered.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub(crate) enum Load {
    /// Closed loop with this many concurrent requests.
    Concurrency(u32),
    /// Open loop at this many requests per second.
    Rate(f64),
}

/// Open-loop inter-arrival times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub(crate) enum Arrival {
    /// Evenly spaced sends.
    Constant,
    /// Exponential inter-arrival times (a Poisson process), seeded: the same run twice sends
    /// on the same schedule.
    Poisson,
}

/// Limits of one measured step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Unmeasured time before the window (connections open, server warms its caches).
    pub warmup: Duration,
    /// The measured window.
    pub duration: Duration,
    /// At most this many measured requests.
    pub max_requests: u64,
    /// Open loop: at most this many requests in flight; beyond, sends are dropped and
    /// counted as `client_overload` (the client, not the server, would be the bottleneck).
    pub max_inflight: usize,
}

/// Raw outcome of one step.
#[derive(Debug, Clone, Default)]
pub(crate) struct Raw {
    /// Latencies (µs) of successful requests sent in the measured window.
    pub latencies: Vec<u64>,
    pub errors: ErrorCounts,
    /// Requests sent in the measured window (successful or not).
    pub sent: u64,
    /// Seconds from the window's start to the last answer of a measured request.
    pub elapsed_s: f64,
}

struct Shared {
    ep: Endpoint,
    reqs: Requests,
}

fn error_key(e: &hyper::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_closed() || e.is_incomplete_message() || e.is_canceled() {
        "closed".into()
    } else {
        "http".into()
    }
}

/// Run a closed-loop step with `concurrency` workers.
pub(crate) async fn closed_loop(
    ep: &Endpoint,
    reqs: &Requests,
    concurrency: u32,
    bounds: Bounds,
) -> Raw {
    let shared = Arc::new(Shared {
        ep: ep.clone(),
        reqs: reqs.clone(),
    });
    let start = Instant::now();
    let window = start + bounds.warmup;
    let end = window + bounds.duration;
    let issued = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency.max(1) {
        let shared = shared.clone();
        let issued = issued.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Raw::default();
            let mut last = window;
            let mut conn: Option<Conn> = None;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let measured = t0 >= window;
                if measured && issued.fetch_add(1, Ordering::Relaxed) >= bounds.max_requests {
                    break;
                }
                let c = match conn.as_mut() {
                    Some(c) => c,
                    None => match connect(&shared.ep).await {
                        Ok(c) => conn.insert(c),
                        Err(_) => {
                            if measured {
                                out.sent += 1;
                                *out.errors.entry("connect".into()).or_insert(0) += 1;
                            }
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                let r = send(c, &shared.ep.host, shared.reqs.next()).await;
                let t1 = Instant::now();
                if !measured {
                    if r.is_err() {
                        conn = None;
                    }
                    continue;
                }
                out.sent += 1;
                last = last.max(t1);
                match r {
                    Ok((s, _)) if s.is_success() => {
                        out.latencies.push((t1 - t0).as_micros() as u64);
                    }
                    Ok((s, _)) => {
                        *out.errors.entry(s.as_u16().to_string()).or_insert(0) += 1;
                    }
                    Err(e) => {
                        *out.errors.entry(error_key(&e)).or_insert(0) += 1;
                        conn = None;
                    }
                }
            }
            out.elapsed_s = last.saturating_duration_since(window).as_secs_f64();
            out
        }));
    }
    let mut all = Raw::default();
    for t in tasks {
        if let Ok(r) = t.await {
            all.latencies.extend(r.latencies);
            super::stats::merge_errors(&mut all.errors, r.errors);
            all.sent += r.sent;
            all.elapsed_s = all.elapsed_s.max(r.elapsed_s);
        }
    }
    all
}

/// A tiny seeded PRNG (xorshift64*) for Poisson arrivals and request data.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }
    pub(crate) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The send schedule of an open-loop step: offsets from its start.
pub(crate) fn schedule(rate: f64, arrival: Arrival, horizon: Duration, seed: u64) -> Vec<Duration> {
    let mut out = Vec::new();
    if !(rate.is_finite() && rate > 0.0) {
        return out;
    }
    let mut rng = Rng::new(seed);
    let mut t = 0.0f64;
    let h = horizon.as_secs_f64();
    loop {
        let gap = match arrival {
            Arrival::Constant => 1.0 / rate,
            Arrival::Poisson => -(1.0 - rng.next_f64()).ln() / rate,
        };
        t += gap;
        if t >= h {
            break;
        }
        out.push(Duration::from_secs_f64(t));
    }
    out
}

/// Run an open-loop step at `rate` requests per second.
pub(crate) async fn open_loop(
    ep: &Endpoint,
    reqs: &Requests,
    rate: f64,
    arrival: Arrival,
    bounds: Bounds,
    seed: u64,
) -> Raw {
    let shared = Arc::new(Shared {
        ep: ep.clone(),
        reqs: reqs.clone(),
    });
    let pool: Arc<Mutex<Vec<Conn>>> = Arc::new(Mutex::new(Vec::new()));
    let inflight = Arc::new(tokio::sync::Semaphore::new(bounds.max_inflight.max(1)));
    let start = tokio::time::Instant::now();
    let window = start + bounds.warmup;
    let plan = schedule(rate, arrival, bounds.warmup + bounds.duration, seed);
    let results: Arc<Mutex<Raw>> = Arc::new(Mutex::new(Raw::default()));
    let mut measured_sent = 0u64;
    let mut tasks = tokio::task::JoinSet::new();
    for (k, offset) in plan.into_iter().enumerate() {
        let at = start + offset;
        let measured = at >= window;
        if measured {
            if measured_sent >= bounds.max_requests {
                break;
            }
            measured_sent += 1;
        }
        tokio::time::sleep_until(at).await;
        let permit = match inflight.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                if measured {
                    if let Ok(mut r) = results.lock() {
                        r.sent += 1;
                        *r.errors.entry("client_overload".into()).or_insert(0) += 1;
                    }
                }
                continue;
            }
        };
        let shared = shared.clone();
        let pool = pool.clone();
        let results = results.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let taken = pool.lock().ok().and_then(|mut p| p.pop());
            let mut conn = match taken {
                Some(c) => Some(c),
                None => connect(&shared.ep).await.ok(),
            };
            let outcome = match conn.as_mut() {
                Some(c) => Some(send(c, &shared.ep.host, shared.reqs.get(k)).await),
                None => None,
            };
            let done = tokio::time::Instant::now();
            let reuse = matches!(outcome, Some(Ok(_)));
            if measured {
                if let Ok(mut r) = results.lock() {
                    r.sent += 1;
                    r.elapsed_s = r
                        .elapsed_s
                        .max(done.saturating_duration_since(window).as_secs_f64());
                    match outcome {
                        Some(Ok((s, _))) if s.is_success() => {
                            r.latencies
                                .push(done.saturating_duration_since(at).as_micros() as u64);
                        }
                        Some(Ok((s, _))) => {
                            *r.errors.entry(s.as_u16().to_string()).or_insert(0) += 1;
                        }
                        Some(Err(e)) => {
                            *r.errors.entry(error_key(&e)).or_insert(0) += 1;
                        }
                        None => {
                            *r.errors.entry("connect".into()).or_insert(0) += 1;
                        }
                    }
                }
            }
            if reuse {
                if let (Some(c), Ok(mut p)) = (conn, pool.lock()) {
                    p.push(c);
                }
            }
        });
        // Reap finished tasks as we go so the set does not grow with the run.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let mut out = results.lock().map(|r| r.clone()).unwrap_or_default();
    // Elapsed for an open loop is the scheduled window, not the last answer: the offered
    // rate defines the window, and answers trickling in after it do not stretch it.
    let window_s = bounds.duration.as_secs_f64();
    if out.elapsed_s < window_s {
        out.elapsed_s = window_s;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_url(url: &str, expected: Result<(&str, u16, &str), &str>) {
        match (parse_url(url), expected) {
            (Ok((h, p, b)), Ok((eh, ep, eb))) => {
                assert_eq!((h.as_str(), p, b.as_str()), (eh, ep, eb))
            }
            (Err(e), Err(frag)) => assert!(e.to_string().contains(frag), "{e}"),
            (got, want) => panic!("{url}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn urls() {
        check_url("http://127.0.0.1:8000", Ok(("127.0.0.1", 8000, "")));
        check_url("127.0.0.1:8000/", Ok(("127.0.0.1", 8000, "")));
        check_url("http://localhost/prefix/", Ok(("localhost", 80, "/prefix")));
        check_url("http://[::1]:9000", Ok(("[::1]", 9000, "")));
        check_url("https://x", Err("https is not supported"));
        check_url("http://x:port", Err("port is not a number"));
        check_url("http://:80", Err("no host"));
    }

    #[test]
    fn schedules_are_bounded_and_seeded() {
        let c = schedule(20.0, Arrival::Constant, Duration::from_secs(2), 1);
        assert_eq!(c.len(), 39);
        assert_eq!(c[0], Duration::from_millis(50));
        let p1 = schedule(20.0, Arrival::Poisson, Duration::from_secs(100), 7);
        let p2 = schedule(20.0, Arrival::Poisson, Duration::from_secs(100), 7);
        assert_eq!(p1, p2);
        // ~2000 arrivals expected; a Poisson count is within 5 sigma (~224) of that.
        assert!((p1.len() as i64 - 2000).abs() < 224, "{}", p1.len());
        assert!(schedule(0.0, Arrival::Constant, Duration::from_secs(1), 1).is_empty());
    }
}
