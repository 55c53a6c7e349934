//! The V2 HTTP/1.1 surface and the text APIs' routes: routing, decoding requests and encoding
//! answers. A transport only: every inference goes to [`crate::core`] (the path gRPC requests
//! take too), the server's state is [`crate::server::Server`]'s, and every failure is an
//! [`ApiError`]. Routes: `/v2/health/{live,ready}`, `/v2`, `/v2/models/{m}[/versions/{v}]` with
//! `/ready`, `/config`, `/stats`, `/infer`, `/v2/models/stats`, `/v2/repository/...`,
//! `/metrics`, and the text APIs (`/v1/embeddings`, `/embed`, `/rerank`, `/predict`,
//! `/tokenize`, [`crate::embed`]) and the image route (`/predictions/{m}`, [`crate::images`]). From SIGTERM on every response says `Connection: close`, so
//! keep-alive clients reconnect (elsewhere, once the endpoint is gone) instead of sending on a
//! connection that is about to close.

use crate::budget::Reservation;
use crate::conn::{Conn, Watched};
use crate::core::{self, Counting, Output, Work};
use crate::error::ApiError;
use crate::model::Model;
use crate::server::{accept_loop, Server, WindDown};
use crate::v2::{self, RequestedOutput};
use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{
    HeaderValue, CONNECTION, CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER,
};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::json;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

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

type Resp = Response<Full<Bytes>>;

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
pub(crate) async fn handle(app: Arc<Server>, req: Request<Incoming>) -> Resp {
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
            text_route(app, segs[0], req).await
        }
        ["predictions", name] => {
            allow(Method::POST)?;
            image_route(app, name, req).await
        }
        ["v2", "repository", "index"] => {
            allow(Method::POST)?;
            let (body, _charge) = read_body(app, req).await?;
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

async fn infer(app: &Arc<Server>, model: &Model, req: Request<Incoming>) -> Resp {
    let start = Instant::now();
    let counting = Counting::default();
    counting.for_model(model);
    match core::counted(app, start, &counting, infer_inner(app, model, req, start)).await {
        Ok(r) => r,
        Err(e) => error_response(&e),
    }
}

/// One of the text APIs' routes (`which`: the path's first segment), with TEI's timing
/// headers on its answer.
async fn text_route(app: &Server, which: &str, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let start = Instant::now();
    let counting = Counting::default();
    let work = async {
        app.started()?;
        let (body, charge) = read_body(app, req).await?;
        match which {
            "v1" => crate::embed::openai(app, &counting, body, start, charge).await,
            "embed" => crate::embed::tei_embed(app, &counting, body, start, charge).await,
            "rerank" => crate::embed::tei_rerank(app, &counting, body, start, charge).await,
            "predict" => crate::embed::tei_predict(app, &counting, body, start, charge).await,
            _ => crate::embed::tei_tokenize(app, &counting, body, start, charge).await,
        }
    };
    let reply = core::counted(app, start, &counting, work).await?;
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

/// `POST /predictions/{model}` ([`crate::images`]), with where the time went in
/// `Server-Timing` (milliseconds).
async fn image_route(app: &Server, name: &str, req: Request<Incoming>) -> Result<Resp, ApiError> {
    let start = Instant::now();
    let counting = Counting::default();
    let work = async {
        let model = counting.for_model(app.model(name)?);
        core::batcher(app, model)?;
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let (body, charge) = read_body(app, req).await?;
        crate::images::predictions(app, model, content_type.as_deref(), body, start, charge).await
    };
    let reply = core::counted(app, start, &counting, work).await?;
    let mut r = json_response(StatusCode::OK, reply.body);
    let t = reply.timing;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let timing = format!(
        "decode;dur={:.3}, resize;dur={:.3}, queue;dur={:.3}, inference;dur={:.3}, postprocess;dur={:.3}, total;dur={:.3}",
        ms(t.decode),
        ms(t.resize),
        ms(t.queue),
        ms(t.inference),
        ms(t.postprocess),
        ms(start.elapsed())
    );
    if let Ok(v) = HeaderValue::from_str(&timing) {
        r.headers_mut().insert("server-timing", v);
    }
    Ok(r)
}

/// Refuses, before any of the body is read, one announced over `max_body_bytes` (413) or one
/// sent compressed (400), and charges an announced length to the memory budget at once (503
/// when the requests in flight hold it): the checks every request body goes through.
fn check_body_headers(
    app: &Server,
    headers: &hyper::HeaderMap,
) -> Result<(Reservation, crate::conn::Size), ApiError> {
    let limit = app.settings.max_body_bytes;
    let mut charge = app.budget.reservation();
    let mut size = crate::conn::Size::Unknown;
    if let Some(len) = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
    {
        if len > limit {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        charge.grow(len, "the request body")?;
        size = crate::conn::Size::Known(len as usize);
    }
    if let Some(enc) = headers.get(CONTENT_ENCODING) {
        if enc.as_bytes() != b"identity" {
            return Err(ApiError::BadRequest(format!(
                "content-encoding {:?} is not supported; send the body uncompressed",
                String::from_utf8_lossy(enc.as_bytes())
            )));
        }
    }
    Ok((charge, size))
}

/// A request's body, checked as every body is, within `max_body_bytes` (413 past it), at the
/// connection's minimum rate, charged to the memory budget as it arrives.
async fn read_body(app: &Server, req: Request<Incoming>) -> Result<(Bytes, Reservation), ApiError> {
    let (mut charge, size) = check_body_headers(app, req.headers())?;
    let limit = usize::try_from(app.settings.max_body_bytes).unwrap_or(usize::MAX);
    let body =
        crate::conn::read_body(req.into_body(), limit, &app.settings, &mut charge, size).await?;
    Ok((body, charge))
}

async fn infer_inner(
    app: &Arc<Server>,
    model: &Model,
    req: Request<Incoming>,
    start: Instant,
) -> Result<Resp, ApiError> {
    core::batcher(app, model)?;
    let header_length = req
        .headers()
        .get(v2::HEADER_LENGTH)
        .map(|v| v2::parse_header_length(v.as_bytes()))
        .transpose()?;
    let (body, charge) = read_body(app, req).await?;
    let served = app.clone();
    let name = model.name().to_owned();
    let request = core::decode(app, body, move |body| {
        let model = served.model(&name)?;
        v2::decode_request(model.served(), header_length, body)
    })
    .await?;
    let answer = core::infer(
        app,
        core::Request {
            model,
            work: Work::Tensors {
                inputs: request.inputs,
                rows: request.rows,
            },
            timeout_us: request.timeout_us,
            start,
            charge,
        },
    )
    .await?;
    let Output::Tensors(outputs) = answer.output else {
        return Err(ApiError::Internal(
            "the core answered a V2 request with vectors".into(),
        ));
    };
    let selected = v2::select_outputs(&request.outputs, &outputs, |i| model.labels(i));
    let selected: Vec<(RequestedOutput, &crate::tensor::Tensor)> =
        selected.iter().map(|(r, t)| (*r, t.as_ref())).collect();
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
        .observe_duration(start.elapsed().saturating_sub(answer.timing.inference));
    Ok(r)
}

/// Accepts HTTP/1.1 connections until `stop` fires, then stops accepting and lets in-flight
/// requests finish within `exit_timeout`. Returns true when everything finished in time.
pub(crate) async fn serve(
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
