//! The server: its settings, the served models by name, health and readiness, the drain on
//! SIGTERM, the memory budget of the requests in flight and the preparation workers; and the
//! accept loop both protocols' listeners run (connection cap, slow and idle clients, the
//! graceful stop). Transports ([`crate::http`], [`crate::grpc`]) resolve models here and hand
//! requests to [`crate::core`]; nothing here decodes a request or runs a model.

use crate::batcher::Batcher;
use crate::budget::Budget;
use crate::conn::{Closed, Conn};
use crate::core::Workers;
use crate::error::{ApiError, Rejection};
use crate::log;
use crate::metrics::Metrics;
use crate::model::Model;
use bytes::Bytes;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The server: its listeners' settings, the drain and health state, and the served models,
/// each in its slot ([`Model`]) keyed by name. Routes of both protocols resolve a model
/// through [`Server::model`].
pub struct Server {
    /// `[server]` of the image's `runtime.toml` (with `--host` and `--port` applied).
    pub settings: infer_spec::runtime::Server,
    /// The connection counters and the server-wide series `/metrics` renders: one model's
    /// [`Metrics`] (its slot holds the same), or a bundle's own, sharing the models'
    /// server-wide series.
    pub metrics: Arc<Metrics>,
    models: Models,
    /// SIGTERM/SIGINT received: readiness says 503 (shared with the gRPC connections' guards).
    pub draining: Arc<AtomicBool>,
    /// The drain delay is over and the listeners are closed. Requests that reached the server
    /// before are still answered (a connection the kernel had accepted, a request already
    /// sent): only `exit_timeout_s` bounds them.
    pub stopping: AtomicBool,
    /// Turns true with `draining`, for the connections that act on it (see [`Server::drain`]).
    draining_tx: tokio::sync::watch::Sender<bool>,
    /// How long a lone request's handler polls for its answer before parking (see
    /// [`Batcher::poll_briefly`]); zero turns polling off.
    pub busy_poll: Duration,
    /// Open connections per listener: `server.max_connections`, lowered at start to what the
    /// descriptor limit allows.
    pub max_connections: usize,
    pub(crate) server_metadata: Bytes,
    /// The JSON `GET /v2` answers, from which the gRPC surface builds its message.
    pub(crate) server_metadata_json: serde_json::Value,
    /// The memory the requests in flight may hold ([`crate::budget`]).
    pub budget: Arc<Budget>,
    /// The preparation workers (tokenizing, decoding large bodies) every model shares
    /// ([`crate::core::Workers`]); `None` until start sets them.
    pub(crate) workers: Option<Workers>,
}

/// One model in the repository index ([`Server::repository_index`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IndexEntry<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub state: &'static str,
    pub reason: String,
}

/// The model slots by name, with a fast path for the one model an image carries.
struct Models {
    by_name: BTreeMap<String, Model>,
    /// Set when there is exactly one: its name is compared, no map is searched.
    only: Option<String>,
}

impl Models {
    fn get(&self, name: &str) -> Option<&Model> {
        match &self.only {
            Some(only) if only == name => self.by_name.values().next(),
            Some(_) => None,
            None => self.by_name.get(name),
        }
    }
}

impl Server {
    /// A server for `models` (at least one; a later one of the same name replaces an earlier
    /// one), with the `[server]` settings and server-wide `metrics`.
    pub fn new(
        settings: infer_spec::runtime::Server,
        metrics: Arc<Metrics>,
        models: Vec<Model>,
    ) -> Server {
        let server_metadata = json!({
            "name": "infer-serve",
            "version": env!("CARGO_PKG_VERSION"),
            "extensions": ["binary_tensor_data", "classification", "model_configuration", "statistics", "model_repository"],
        });
        let by_name: BTreeMap<String, Model> = models
            .into_iter()
            .map(|m| (m.name().to_owned(), m))
            .collect();
        let only = match by_name.keys().collect::<Vec<_>>().as_slice() {
            [one] => Some((*one).clone()),
            _ => None,
        };
        Server {
            metrics,
            models: Models { by_name, only },
            draining: Arc::new(AtomicBool::new(false)),
            stopping: AtomicBool::new(false),
            draining_tx: tokio::sync::watch::channel(false).0,
            busy_poll: Duration::ZERO,
            max_connections: settings.max_connections as usize,
            server_metadata: Bytes::from(server_metadata.to_string()),
            server_metadata_json: server_metadata,
            budget: Budget::new(settings.memory_budget_bytes),
            workers: None,
            settings,
        }
    }

    /// The model served under `name`, or the 404 (gRPC `NOT_FOUND`) that names it and the
    /// models served.
    pub fn model(&self, name: &str) -> Result<&Model, ApiError> {
        self.models.get(name).ok_or_else(|| {
            let served: Vec<&str> = self.models.by_name.keys().map(String::as_str).collect();
            ApiError::NotFound(format!(
                "unknown model {name:?} (this server serves {served:?})"
            ))
        })
    }

    /// The model `name` at `version` (empty: any), or the 404 that says which is unknown.
    pub fn model_version(&self, name: &str, version: &str) -> Result<&Model, ApiError> {
        let model = self.model(name)?;
        model.served().check_model(name, version)?;
        Ok(model)
    }

    /// Every served model, by name.
    pub fn models(&self) -> impl Iterator<Item = &Model> {
        self.models.by_name.values()
    }

    /// Gives the server its preparation workers (start does, once).
    pub fn set_workers(&mut self, workers: Workers) {
        self.workers = Some(workers);
    }

    /// SIGTERM/SIGINT: readiness turns 503, HTTP responses say `Connection: close` and HTTP/2
    /// connections get GOAWAY; requests are still served until the drain delay is over.
    pub fn drain(&self) {
        self.draining.store(true, Relaxed);
        for m in self.models() {
            m.metrics.ready.store(0, Relaxed);
        }
        self.metrics.ready.store(0, Relaxed);
        self.draining_tx.send_replace(true);
    }

    /// Ready: every model warmed up with its device usable, and not draining.
    pub fn is_ready(&self) -> bool {
        self.models().all(Model::serving) && !self.draining.load(Relaxed)
    }

    /// One model ready: warmed up, its device usable, and the server not draining.
    pub fn is_model_ready(&self, model: &Model) -> bool {
        model.serving() && !self.draining.load(Relaxed)
    }

    /// Why the server can no longer serve at all (a model's device is lost), if it cannot.
    pub(crate) fn device_lost(&self) -> Option<String> {
        self.models()
            .find_map(|m| m.batcher()?.device_lost())
            .map(str::to_owned)
    }

    pub(crate) fn not_ready(&self) -> ApiError {
        if self.draining.load(Relaxed) {
            ApiError::Rejected(Rejection::ShuttingDown)
        } else if let Some(why) = self.models().find_map(|m| m.batcher()?.device_lost()) {
            ApiError::DeviceLost(why.to_owned())
        } else {
            ApiError::NotReady
        }
    }

    /// Every model has its batcher (warm-up done); else why not.
    pub(crate) fn started(&self) -> Result<(), ApiError> {
        if self.models().all(|m| m.batcher().is_some()) {
            Ok(())
        } else {
            Err(self.not_ready())
        }
    }

    /// `/metrics`: one model's series as they always were; a bundle's with a series per model
    /// and the server's own once.
    pub fn render_metrics(&self) -> String {
        let models: Vec<&Metrics> = self.models().map(|m| &*m.metrics).collect();
        match models.as_slice() {
            [one] => one.render(),
            _ => Metrics::render_bundle(&models),
        }
    }

    /// The V2 model repository index: every served model with its state (`READY`, `LOADING`
    /// before its warm-up is done, `UNAVAILABLE` with the reason), only the ready ones when
    /// `ready_only`.
    pub fn repository_index(&self, ready_only: bool) -> Vec<IndexEntry<'_>> {
        self.models()
            .map(|m| {
                let (state, reason) = if self.is_model_ready(m) {
                    ("READY", String::new())
                } else if self.draining.load(Relaxed) {
                    ("UNAVAILABLE", "the server is shutting down".to_owned())
                } else if let Some(why) = m.batcher().and_then(Batcher::device_lost) {
                    ("UNAVAILABLE", format!("device lost: {why}"))
                } else {
                    ("LOADING", "loading the engine and warming up".to_owned())
                };
                IndexEntry {
                    name: m.name(),
                    version: &m.cfg.model.version,
                    state,
                    reason,
                }
            })
            .filter(|e| !ready_only || e.state == "READY")
            .collect()
    }

    /// Triton's statistics body for every model (`GET /v2/models/stats`).
    pub(crate) fn stats_json(&self) -> serde_json::Value {
        let mut all = Vec::new();
        for m in self.models() {
            let mut s = m
                .metrics
                .stats_json(&m.cfg.model.name, &m.cfg.model.version);
            if let Some(list) = s.get_mut("model_stats").and_then(|v| v.as_array_mut()) {
                all.append(list);
            }
        }
        json!({ "model_stats": all })
    }
}

/// When a connection is asked to wind down (finish what it has, then close).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindDown {
    /// From SIGTERM on: HTTP/2's GOAWAY makes the client open its next streams on a new
    /// connection while the streams in flight finish. A connection that has not sent a request
    /// yet (opened during the drain) gets it once its first request arrives, or after
    /// [`FIRST_REQUEST_GRACE`]: hyper would close one still in its handshake without a word.
    OnDrain,
    /// When the listener closes. HTTP/1.1 responses say `Connection: close` from SIGTERM on,
    /// so busy connections have closed themselves by then; this ends the idle ones, after
    /// [`FIRST_REQUEST_GRACE`] for a request that may already be on its way.
    OnStop,
}

/// How long a connection may take to send its first request before it is wound down (an
/// HTTP/1.1 connection still open when the listener closes, an HTTP/2 one opened during the
/// drain).
const FIRST_REQUEST_GRACE: Duration = Duration::from_millis(250);

/// What an HTTP/1.1 client gets when every connection slot has a request in progress.
const REFUSED_HTTP1: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 62\r\n\r\n{\"error\":\"too many open connections (server.max_connections)\"}";

/// How long a connection closed for idleness may take to say goodbye (HTTP/2's GOAWAY).
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);

/// The longest the accept loop waits for evicted connections to close before accepting again.
const EVICTION_WAIT: Duration = Duration::from_millis(100);

/// The accept loop of both protocols. Accepts until `stop` fires, then takes the connections
/// already queued in the kernel's backlog (so a client whose connect just succeeded is served,
/// not reset), closes the listener, and waits up to `exit_timeout` for every connection to
/// finish. Returns true when they all did.
///
/// Slow and idle clients: each connection has a watchdog ([`Conn::watchdog`]) that closes it
/// when a request's headers take longer than `server.header_read_timeout_s` (HTTP/1.1) or no
/// request is in progress for `server.idle_timeout_s`. At most [`Server::max_connections`] are
/// open: at the cap a new connection closes the one idle the longest (a half-open or idle
/// client, not a request in progress), or is refused at once when every one has a request in
/// progress (HTTP/1.1: a 503), so the health endpoints keep answering while a client holds
/// connections open.
pub(crate) async fn accept_loop<C, E>(
    app: &Server,
    protocol: &'static str,
    listener: tokio::net::TcpListener,
    mut stop: tokio::sync::watch::Receiver<bool>,
    exit_timeout: Duration,
    wind_down: WindDown,
    mut serve: impl FnMut(hyper_util::rt::TokioIo<tokio::net::TcpStream>, Arc<Conn>) -> C,
) -> bool
where
    C: hyper_util::server::graceful::GracefulConnection<Error = E> + Send + 'static,
    E: Send,
{
    let (open_tx, mut open_rx) = tokio::sync::watch::channel(0usize);
    let open_tx = Arc::new(open_tx);
    let stop_seen = stop.clone();
    // HTTP/1.1 has request heads to time and a 503 to refuse with; HTTP/2 neither.
    let http1 = protocol == "http";
    let header = Duration::from_secs(app.settings.header_read_timeout_s);
    let idle = Duration::from_secs(app.settings.idle_timeout_s);
    let cap = app.max_connections.max(1);
    // The open connections by accept order; the accept loop makes room among them at the cap.
    let conns: Arc<Mutex<BTreeMap<u64, Arc<Conn>>>> = Arc::default();
    let mut next_id = 0u64;
    let mut spawn = |stream: tokio::net::TcpStream| {
        let counts = app.metrics.connections(protocol);
        {
            let mut open = conns.lock().unwrap_or_else(|e| e.into_inner());
            if open.len() >= cap {
                let victim = open
                    .iter()
                    .filter(|(_, c)| c.is_idle())
                    .min_by_key(|(_, c)| c.idle_since())
                    .map(|(&id, _)| id);
                match victim.and_then(|id| open.remove(&id)) {
                    Some(c) => c.evict(),
                    None => {
                        drop(open);
                        counts.refused.add(1);
                        if http1 {
                            // Best effort, without waiting: the socket closes right after.
                            let _ = stream.try_write(REFUSED_HTTP1);
                        }
                        return;
                    }
                }
            }
        }
        let _ = stream.set_nodelay(true);
        let state = Arc::new(Conn::new(http1));
        next_id += 1;
        let id = next_id;
        conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, state.clone());
        counts.open.fetch_add(1, Relaxed);
        let conn = serve(hyper_util::rt::TokioIo::new(stream), state.clone());
        let open = open_tx.clone();
        let conns = conns.clone();
        let metrics = app.metrics.clone();
        let mut draining = app.draining_tx.subscribe();
        let mut stopped = stop_seen.clone();
        open.send_modify(|n| *n += 1);
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let signal = async {
                match wind_down {
                    WindDown::OnDrain => {
                        let _ = draining.wait_for(|d| *d).await;
                        let _ =
                            tokio::time::timeout(FIRST_REQUEST_GRACE, state.seen.notified()).await;
                    }
                    WindDown::OnStop => {
                        let _ = stopped.wait_for(|s| *s).await;
                        tokio::time::sleep(FIRST_REQUEST_GRACE).await;
                    }
                }
            };
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = signal => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
                why = state.watchdog(header, idle) => {
                    metrics.connections(protocol).record_closed(why);
                    if why == Closed::IdleTimeout {
                        // Nothing in progress: HTTP/2 says GOAWAY, HTTP/1.1 just closes.
                        conn.as_mut().graceful_shutdown();
                        let _ = tokio::time::timeout(IDLE_CLOSE_GRACE, conn).await;
                    }
                }
            }
            conns.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
            metrics.connections(protocol).open.fetch_sub(1, Relaxed);
            open.send_modify(|n| *n -= 1);
        });
    };
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    spawn(stream);
                    // An evicted connection closes on its own task: let it before accepting
                    // more, so that a flood of connects cannot outrun the closes and hold more
                    // than the cap (plus the one just accepted) open. Bounded: a close that
                    // lags does not stop the listener.
                    let _ = tokio::time::timeout(
                        EVICTION_WAIT,
                        async { open_rx.wait_for(|n| *n <= cap).await.is_ok() },
                    )
                    .await;
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    log::error("accept failed", &[("error", json!(e.to_string()))]);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            // `wait_for`'s guard is not Send: drop it inside.
            _ = async { stop.wait_for(|s| *s).await.is_ok() } => break,
        }
    }
    // Connections the kernel completed before the listener closes would be reset with it.
    while let Ok(Ok((stream, _))) = tokio::time::timeout(Duration::ZERO, listener.accept()).await {
        spawn(stream);
    }
    drop(listener);
    app.stopping.store(true, Relaxed);
    log::info(
        "stopped accepting connections; finishing in-flight requests",
        &[
            ("protocol", json!(protocol)),
            ("in_flight", json!(app.metrics.in_flight().load(Relaxed))),
            ("exit_timeout_s", json!(exit_timeout.as_secs_f64())),
        ],
    );
    let finished = tokio::time::timeout(exit_timeout, open_rx.wait_for(|n| *n == 0))
        .await
        .is_ok();
    finished
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn the_http1_refusal_is_a_complete_503() {
        let text = std::str::from_utf8(REFUSED_HTTP1).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert!(v["error"].is_string());
    }
}
