//! The V2 HTTP/1.1 surface: routing, handlers, and the server's lifecycle (drain on SIGTERM),
//! whose accept loop and inference path (`execute`) the gRPC surface shares.
//!
//! Handlers turn requests into [`crate::v2`] decodes and [`Batcher`] submissions and every
//! failure into an [`ApiError`]; they never run a model. Routes: `/v2/health/{live,ready}`,
//! `/v2`, `/v2/models/{m}[/versions/{v}]` with `/ready`, `/config`, `/stats`, `/infer`,
//! `/v2/models/stats`, and `/metrics`. From SIGTERM on every response says
//! `Connection: close`, so keep-alive clients reconnect (elsewhere, once the endpoint is gone)
//! instead of sending on a connection that is about to close.

use crate::batcher::Batcher;
use crate::conn::{Closed, Conn, Watched};
use crate::error::{ApiError, Rejection};
use crate::log;
use crate::metrics::Metrics;
use crate::model::Model;
use crate::v2::{self, RequestedOutput};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    server_metadata: Bytes,
    /// The JSON `GET /v2` answers, from which the gRPC surface builds its message.
    pub(crate) server_metadata_json: serde_json::Value,
}

/// One model in the repository index ([`Server::repository_index`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct IndexEntry<'a> {
    pub name: &'a str,
    pub version: &'a str,
    pub state: &'static str,
    pub reason: String,
}

/// The body of `POST /v2/repository/index` (optional; Triton's fields).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct IndexRequest {
    #[serde(default)]
    ready: bool,
    #[serde(default)]
    #[allow(
        dead_code,
        reason = "accepted as Triton accepts it; one repository here"
    )]
    repository_name: Option<String>,
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

type Resp = Response<Full<Bytes>>;

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
            "extensions": ["binary_tensor_data", "model_configuration", "statistics", "model_repository"],
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

fn json_response(status: StatusCode, body: impl Into<Bytes>) -> Resp {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error_response(e: &ApiError) -> Resp {
    let mut r = json_response(e.status(), e.body());
    if let Some(s) = e.retry_after() {
        r.headers_mut().insert(RETRY_AFTER, HeaderValue::from(s));
    }
    r
}

/// Routes one request.
pub async fn handle(app: Arc<Server>, req: Request<Incoming>) -> Resp {
    let mut r = match route(&app, req).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    };
    if app.draining.load(Relaxed) {
        r.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}

async fn route(app: &Arc<Server>, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let path = req.uri().path().to_owned();
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = req.method().clone();
    let allow = |m: Method| -> Result<(), ApiError> {
        if method == m || (m == Method::GET && method == Method::HEAD) {
            Ok(())
        } else {
            Err(ApiError::MethodNotAllowed {
                method: method.to_string(),
                path: path.clone(),
            })
        }
    };
    match segs.as_slice() {
        ["v2", "health", "live"] => {
            allow(Method::GET)?;
            // A lost device never comes back in this process: liveness fails so the
            // orchestrator restarts it (the probe `deploy` writes is this route).
            match app.device_lost() {
                None => Ok(json_response(StatusCode::OK, r#"{"live":true}"#)),
                Some(why) => Err(ApiError::DeviceLost(why)),
            }
        }
        ["v2", "health", "ready"] => {
            allow(Method::GET)?;
            if app.is_ready() {
                Ok(json_response(StatusCode::OK, r#"{"ready":true}"#))
            } else {
                Err(app.not_ready())
            }
        }
        ["v2"] => {
            allow(Method::GET)?;
            Ok(json_response(StatusCode::OK, app.server_metadata.clone()))
        }
        ["metrics"] => {
            allow(Method::GET)?;
            let mut r = json_response(StatusCode::OK, app.render_metrics());
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            Ok(r)
        }
        ["v1", "embeddings"] | ["embed"] | ["rerank"] | ["predict"] | ["tokenize"] => {
            allow(Method::POST)?;
            let start = Instant::now();
            let which = segs[0];
            let counting = Counting::default();
            let work = async {
                app.started()?;
                let body = read_json(app, req).await?;
                match which {
                    "v1" => crate::embed::openai(app, &counting, &body, start).await,
                    "embed" => crate::embed::tei_embed(app, &counting, &body, start).await,
                    "rerank" => crate::embed::tei_rerank(app, &counting, &body, start).await,
                    "predict" => crate::embed::tei_predict(app, &counting, &body, start).await,
                    _ => crate::embed::tei_tokenize(app, &body),
                }
            };
            let reply = counted(app, start, &counting, work).await?;
            let mut r = json_response(StatusCode::OK, reply.body);
            let t = reply.timing;
            let headers = r.headers_mut();
            // TEI's timing headers, in milliseconds.
            for (name, d) in [
                ("x-tokenization-time", t.tokenization),
                ("x-queue-time", t.queue),
                ("x-inference-time", t.inference),
                ("x-total-time", start.elapsed()),
            ] {
                headers.insert(name, HeaderValue::from(d.as_millis() as u64));
            }
            headers.insert("x-compute-tokens", HeaderValue::from(t.tokens as u64));
            Ok(r)
        }
        ["v2", "repository", "index"] => {
            allow(Method::POST)?;
            let body = read_json(app, req).await?;
            let ask: IndexRequest = if body.iter().all(u8::is_ascii_whitespace) {
                IndexRequest::default()
            } else {
                serde_json::from_slice(&body).map_err(|e| {
                    ApiError::BadRequest(format!("bad repository index request: {e}"))
                })?
            };
            let index = app.repository_index(ask.ready);
            Ok(json_response(StatusCode::OK, json!(index).to_string()))
        }
        ["v2", "repository", "models", name, action @ ("load" | "unload")] => {
            allow(Method::POST)?;
            app.model(name)?;
            Err(ApiError::Unimplemented(format!(
                "{action}: the models of this server are fixed when it starts (its runtime.toml); there is no model control"
            )))
        }
        ["v2", "models", "stats"] => {
            allow(Method::GET)?;
            Ok(json_response(StatusCode::OK, app.stats_json().to_string()))
        }
        ["v2", "models", name, rest @ ..] => {
            let model = app.model(name)?;
            let rest = match rest {
                ["versions", v, rest @ ..] => {
                    if *v != model.cfg.model.version {
                        return Err(ApiError::NotFound(format!(
                            "unknown version {v:?} of model {name:?}"
                        )));
                    }
                    rest
                }
                rest => rest,
            };
            match rest {
                [] => {
                    allow(Method::GET)?;
                    Ok(json_response(StatusCode::OK, model.metadata()))
                }
                ["ready"] => {
                    allow(Method::GET)?;
                    if app.is_model_ready(model) {
                        let body = json!({ "name": model.name(), "ready": true }).to_string();
                        Ok(json_response(StatusCode::OK, body))
                    } else {
                        Err(app.not_ready())
                    }
                }
                ["config"] => {
                    allow(Method::GET)?;
                    Ok(json_response(StatusCode::OK, model.config()))
                }
                ["stats"] => {
                    allow(Method::GET)?;
                    Ok(json_response(
                        StatusCode::OK,
                        model
                            .metrics
                            .stats_json(&model.cfg.model.name, &model.cfg.model.version)
                            .to_string(),
                    ))
                }
                ["infer"] => {
                    allow(Method::POST)?;
                    Ok(infer(app, model, req).await)
                }
                _ => Err(ApiError::NotFound(format!("no route for {path}"))),
            }
        }
        _ => Err(ApiError::NotFound(format!("no route for {path}"))),
    }
}

/// Counts an infer request in flight for as long as it lives (also when its client goes away
/// and the handler future is dropped).
struct InFlight<'a>(&'a Metrics);

impl<'a> InFlight<'a> {
    fn new(m: &'a Metrics, now: Instant) -> Self {
        m.request_started(now);
        InFlight(m)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight().fetch_sub(1, Relaxed);
    }
}

async fn infer(app: &Server, model: &Model, req: Request<Incoming>) -> Resp {
    let start = Instant::now();
    let counting = Counting::default();
    counting.for_model(model);
    match counted(app, start, &counting, infer_inner(app, model, req, start)).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// The model an infer request turned out to be for, told to [`counted`] by the work once it
/// knows (a gRPC request and the text APIs name it in the body): its series count the outcome.
#[derive(Default)]
pub(crate) struct Counting<'a>(std::sync::OnceLock<&'a Metrics>);

impl<'a> Counting<'a> {
    /// The request is for `model`; returns it.
    pub(crate) fn for_model(&self, model: &'a Model) -> &'a Model {
        let _ = self.0.set(&model.metrics);
        model
    }
}

/// Runs one infer request of either protocol (`work`, started at `start`): counts it in flight
/// on the server while it lives and records its outcome on the metrics of the model it was
/// for (`counting`), else the server's (one model: the same; a bundle: not rendered, as
/// requests naming no served model belong to none).
pub(crate) async fn counted<'a, T>(
    app: &'a Server,
    start: Instant,
    counting: &Counting<'a>,
    work: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    let _guard = InFlight::new(&app.metrics, start);
    let result = work.await;
    let m = counting.0.get().copied().unwrap_or(&app.metrics);
    match &result {
        Ok(_) => m.record_success(start.elapsed()),
        Err(e) => {
            let rejection = match e {
                ApiError::Rejected(r) => Some(*r),
                _ => None,
            };
            m.record_failure(
                start.elapsed(),
                rejection,
                matches!(e, ApiError::Internal(_) | ApiError::DeviceLost(_)),
            );
        }
    }
    result
}

/// The model's batcher, once warm-up is done.
pub(crate) fn batcher<'a>(app: &Server, model: &'a Model) -> Result<&'a Batcher, ApiError> {
    model.batcher().ok_or_else(|| app.not_ready())
}

/// Refuses, before any of the body is read, one announced over `max_body_bytes` (413) or one
/// sent compressed (400): the checks every request body goes through.
fn check_body_headers(app: &Server, headers: &hyper::HeaderMap) -> Result<(), ApiError> {
    let limit = app.settings.max_body_bytes;
    if let Some(len) = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        if len > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
    }
    if let Some(enc) = headers.get(CONTENT_ENCODING) {
        if enc.as_bytes() != b"identity" {
            return Err(ApiError::BadRequest(format!(
                "content-encoding {:?} is not supported; send the body uncompressed",
                String::from_utf8_lossy(enc.as_bytes())
            )));
        }
    }
    Ok(())
}

/// A request's body, within `max_body_bytes` (413 past it), at the connection's minimum rate.
async fn read_limited(app: &Server, body: Incoming) -> Result<Bytes, ApiError> {
    let limit = usize::try_from(app.settings.max_body_bytes).unwrap_or(usize::MAX);
    crate::conn::read_body(body, limit, &app.settings).await
}

/// A JSON request's body (the text APIs), checked as every body is.
async fn read_json(app: &Server, req: Request<Incoming>) -> Result<Bytes, ApiError> {
    check_body_headers(app, req.headers())?;
    read_limited(app, req.into_body()).await
}

async fn infer_inner(
    app: &Server,
    model: &Model,
    req: Request<Incoming>,
    start: Instant,
) -> Result<Resp, ApiError> {
    batcher(app, model)?;
    let headers = req.headers();
    check_body_headers(app, headers)?;
    let header_length = headers
        .get(v2::HEADER_LENGTH)
        .map(|v| v2::parse_header_length(v.as_bytes()))
        .transpose()?;
    let body = read_limited(app, req.into_body()).await?;
    let request = v2::decode_request(model.served(), header_length, &body)?;
    drop(body);
    let answer = execute(
        app,
        model,
        request.inputs,
        request.rows,
        request.timeout_us,
        start,
    )
    .await?;
    let outputs = &answer.outputs;
    let selected: Vec<(RequestedOutput, &crate::tensor::Tensor)> = request
        .outputs
        .iter()
        .filter_map(|r| outputs.get(r.index).map(|t| (*r, t)))
        .collect();
    let (body, header) = v2::encode_response(model.served(), request.id.as_deref(), &selected);
    let mut r = Response::new(Full::new(Bytes::from(body)));
    match header {
        Some(h) => {
            r.headers_mut().insert(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            r.headers_mut()
                .insert(v2::HEADER_LENGTH, HeaderValue::from(h));
        }
        None => {
            r.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    model
        .metrics
        .overhead_hist
        .observe_duration(start.elapsed().saturating_sub(answer.compute));
    Ok(r)
}

/// Runs a decoded request's inputs (in the model's served signature) through the model:
/// [`Model::prepare`], the batcher, [`Model::finish`]. The inference path both protocols
/// share. `timeout_us` is the request's own timeout (0 or `None`: none), bounded by
/// `default_timeout_ms`.
pub(crate) async fn execute(
    app: &Server,
    model: &Model,
    inputs: Vec<crate::tensor::Tensor>,
    rows: usize,
    timeout_us: Option<u64>,
    start: Instant,
) -> Result<crate::batcher::Answer, ApiError> {
    // The cache sits in front of everything, tokenization included.
    let key = model.cache().map(|_| {
        let mut k = crate::cache::Key::new("v2", model.name(), &model.cfg.model.version);
        for (spec, t) in model.served().inputs.iter().zip(&inputs) {
            k.tensor(&spec.name, t);
        }
        k.finish()
    });
    if let Some(crate::cache::Cached::Outputs(outputs)) = key.as_ref().and_then(|k| model.cached(k))
    {
        return Ok(crate::batcher::Answer {
            outputs,
            compute: Duration::ZERO,
        });
    }
    let prepared = model.prepare_async(inputs, rows).await?;
    let pending = submit(
        app,
        model,
        prepared.inputs,
        prepared.rows,
        timeout_us,
        start,
    )?;
    let mut answer = pending.wait(app, start).await?;
    answer.outputs = model.finish(answer.outputs, prepared.lengths.as_deref())?;
    if let Some(k) = key {
        model.remember(k, crate::cache::Cached::Outputs(answer.outputs.clone()));
    }
    Ok(answer)
}

/// A request in the batcher's queue.
pub(crate) struct Pending<'a> {
    batcher: &'a Batcher,
    rx: tokio::sync::oneshot::Receiver<crate::batcher::Outcome>,
    deadline: Option<Instant>,
}

/// Queues engine inputs (as [`Model::prepare`] returns them) in the model's batcher, with the
/// request's deadline.
pub(crate) fn submit<'a>(
    app: &Server,
    model: &'a Model,
    inputs: Vec<crate::tensor::Tensor>,
    rows: usize,
    timeout_us: Option<u64>,
    start: Instant,
) -> Result<Pending<'a>, ApiError> {
    let batcher = batcher(app, model)?;
    let default = model.cfg.batching.default_timeout_ms * 1000;
    let timeout_us = match (default, timeout_us.filter(|&t| t > 0)) {
        (0, t) => t,
        (d, None) => Some(d),
        (d, Some(t)) => Some(t.min(d)),
    };
    let deadline = timeout_us.map(|us| start + Duration::from_micros(us));
    let rx = batcher.submit(inputs, rows, deadline)?;
    Ok(Pending {
        batcher,
        rx,
        deadline,
    })
}

impl Pending<'_> {
    /// Waits for the engine's answer.
    pub(crate) async fn wait(
        mut self,
        app: &Server,
        start: Instant,
    ) -> Result<crate::batcher::Answer, ApiError> {
        // Alone on a server that sees one request at a time: poll for the answer on this
        // (otherwise idle) core rather than park. Not when requests overlap: this worker
        // would hold up the connections it serves.
        // Requests in flight are the server's: a request to another model takes a core too.
        let metrics = &app.metrics;
        let polled = if metrics.in_flight().load(Relaxed) == 1 && metrics.sequential(start) {
            let window = match self.deadline {
                Some(d) => app
                    .busy_poll
                    .min(d.saturating_duration_since(Instant::now())),
                None => app.busy_poll,
            };
            self.batcher.poll_briefly(&mut self.rx, window)
        } else {
            None
        };
        let outcome = match (polled, self.deadline) {
            (Some(outcome), _) => Ok(outcome),
            (None, Some(d)) => match tokio::time::timeout_at(d.into(), self.rx).await {
                Ok(r) => r,
                Err(_) => return Err(ApiError::Rejected(Rejection::Timeout)),
            },
            (None, None) => self.rx.await,
        };
        outcome.map_err(|_| ApiError::Internal("the batcher dropped the request".to_owned()))?
    }
}

/// Accepts HTTP/1.1 connections until `stop` fires, then stops accepting and lets in-flight
/// requests finish within `exit_timeout`. Returns true when everything finished in time.
pub async fn serve(
    app: Arc<Server>,
    listener: tokio::net::TcpListener,
    stop: tokio::sync::watch::Receiver<bool>,
    exit_timeout: Duration,
) -> bool {
    let http = hyper::server::conn::http1::Builder::new();
    let service_app = app.clone();
    accept_loop(
        &app,
        "http",
        listener,
        stop,
        exit_timeout,
        WindDown::OnStop,
        move |io, conn: Arc<Conn>| {
            let app = service_app.clone();
            let watched = conn.clone();
            let service = hyper::service::service_fn(move |req| {
                let app = app.clone();
                let busy = conn.request();
                async move {
                    let r = handle(app, req).await;
                    drop(busy);
                    Ok::<_, std::convert::Infallible>(r)
                }
            });
            let io = hyper_util::rt::TokioIo::new(Watched::new(io.into_inner(), watched));
            http.serve_connection(io, service)
        },
    )
    .await
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
