//! The V2 gRPC surface: `inference.GRPCInferenceService` (KServe's V2 RPCs plus Triton's
//! `ModelConfig` and `ModelStatistics`) and `grpc.health.v1.Health`, on their own port, over
//! hyper's HTTP/2.
//!
//! Unary calls only, written directly on HTTP/2 (a gRPC unary call is one POST whose body is
//! one length-prefixed message, answered by one message and a `grpc-status` trailer): no
//! gRPC framework, so the size limit, malformed messages and every other failure map to
//! statuses through [`ApiError::grpc_code`], like HTTP statuses, and the accept loop and drain
//! are the server's (`server::accept_loop`, with GOAWAY from SIGTERM on). A transport only:
//! inference goes through `core`, the path HTTP requests take, with the same
//! admission, memory budget and batcher; [`codec`] decodes with the HTTP decoder's checks.
//! Owns no model. Streaming RPCs (`ModelStreamInfer`, health `Watch`) and the
//! repository, shared-memory, trace and log RPCs answer `UNIMPLEMENTED`.

pub mod codec;
mod goaway_guard;
pub mod pb;

use crate::core::{self, Output, Work};
use crate::error::{ApiError, GrpcCode};
use crate::model::Model;
use crate::server::{accept_loop, Server, WindDown};
use crate::v2;
use bytes::Bytes;
use hyper::body::{Frame, Incoming};
use hyper::header::{HeaderMap, HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response};
use pb::health::health_check_response::ServingStatus;
use pb::inference as ipb;
use serde_json::Value;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The gRPC service names, as they appear in request paths.
pub const INFERENCE_SERVICE: &str = "inference.GRPCInferenceService";
pub const HEALTH_SERVICE: &str = "grpc.health.v1.Health";

/// The answers that do not change while the server runs, encoded once.
struct Grpc {
    app: Arc<Server>,
    server_metadata: Bytes,
    /// Each model's `ModelMetadata` and `ModelConfig` answers, by name.
    models: BTreeMap<String, Answers>,
}

struct Answers {
    metadata: Bytes,
    config: Bytes,
}

impl Grpc {
    /// The answers of a model [`Server::model_version`] found.
    fn answers(&self, model: &Model) -> Result<&Answers, ApiError> {
        self.models
            .get(model.name())
            .ok_or_else(|| ApiError::NotFound(format!("unknown model {:?}", model.name())))
    }
}

/// Serves gRPC until `stop` fires; the same lifecycle as `http::serve`, except that
/// connections get GOAWAY as soon as the drain starts. Returns true when every call finished
/// within `exit_timeout`.
pub async fn serve(
    app: Arc<Server>,
    listener: tokio::net::TcpListener,
    stop: tokio::sync::watch::Receiver<bool>,
    exit_timeout: Duration,
) -> bool {
    let grpc = Arc::new(Grpc {
        server_metadata: codec::frame(&server_metadata(&app.server_metadata_json)),
        models: app
            .models()
            .map(|m| {
                let answers = Answers {
                    metadata: codec::frame(&model_metadata(&m.metadata_json)),
                    config: codec::frame(&ipb::ModelConfigResponse {
                        config: Some(model_config(&m.config_json)),
                    }),
                };
                (m.name().to_owned(), answers)
            })
            .collect(),
        app: app.clone(),
    });
    let mut h2 = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new());
    // Flow-control windows that grow with the connection's bandwidth-delay product, so large
    // raw tensors are not throttled by the 64 KiB default window.
    h2.adaptive_window(true);
    let draining = app.draining.clone();
    accept_loop(
        &app,
        "grpc",
        listener,
        stop,
        exit_timeout,
        WindDown::OnDrain,
        move |io, conn: Arc<crate::conn::Conn>| {
            let grpc = grpc.clone();
            // h2 would answer a late stream's WINDOW_UPDATE during the drain with
            // GOAWAY(PROTOCOL_ERROR), losing the calls in flight: see `goaway_guard`.
            let io = hyper_util::rt::TokioIo::new(goaway_guard::GoawayGuard::new(
                io.into_inner(),
                draining.clone(),
            ));
            let service = hyper::service::service_fn(move |req| {
                let busy = conn.request();
                let grpc = grpc.clone();
                async move {
                    let r = grpc.handle(req).await;
                    drop(busy);
                    Ok::<_, Infallible>(r)
                }
            });
            h2.serve_connection(io, service)
        },
    )
    .await
}

impl Grpc {
    async fn handle(&self, req: Request<Incoming>) -> Response<GrpcBody> {
        let start = Instant::now();
        let is_grpc = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"));
        if !is_grpc {
            // The gRPC spec's answer to a request that is not gRPC: an HTTP status, no
            // grpc-status (the client is not speaking gRPC).
            let ct = req
                .headers()
                .get(CONTENT_TYPE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default();
            let mut r = Response::new(GrpcBody::empty());
            *r.status_mut() = ApiError::NotGrpc(ct).status();
            return r;
        }
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| parse_timeout(v.as_bytes()));
        let path = req.uri().path().to_owned();
        let body = req.into_body();
        match self.call(&path, body, start, timeout).await {
            Ok(msg) => ok_response(msg),
            Err(e) => status_response(&e),
        }
    }

    async fn call(
        &self,
        path: &str,
        body: Incoming,
        start: Instant,
        timeout: Option<Duration>,
    ) -> Result<Bytes, ApiError> {
        let app = &*self.app;
        let srv = &app.settings;
        let (service, method) = path
            .strip_prefix('/')
            .and_then(|p| p.split_once('/'))
            .unwrap_or(("", path));
        match (service, method) {
            (INFERENCE_SERVICE, "ModelInfer") => {
                let counting = core::Counting::default();
                let work = async {
                    app.started()?;
                    let mut charge = app.budget.reservation();
                    let msg = read_message(body, srv.max_body_bytes, srv, &mut charge).await?;
                    let req: ipb::ModelInferRequest =
                        core::decode(app, msg, |m| codec::decode(m.clone(), "ModelInferRequest"))
                            .await?;
                    let model = counting.for_model(app.model(&req.model_name)?);
                    let request = codec::infer_request(model.served(), req)?;
                    let timeout_us = match (request.timeout_us.filter(|&t| t > 0), timeout) {
                        (Some(t), Some(d)) => Some(t.min(d.as_micros() as u64)),
                        (t, d) => t.or(d.map(|d| d.as_micros().max(1) as u64)),
                    };
                    let answer = core::infer(
                        app,
                        core::Request {
                            model,
                            work: Work::Tensors {
                                inputs: request.inputs,
                                rows: request.rows,
                            },
                            timeout_us,
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
                    let selected =
                        v2::select_outputs(&request.outputs, &outputs, |i| model.labels(i));
                    let selected: Vec<_> = selected.iter().map(|(r, t)| (*r, t.as_ref())).collect();
                    let out = codec::frame(&codec::encode_infer(
                        model.served(),
                        request.id.as_deref(),
                        &selected,
                    ));
                    model
                        .metrics
                        .overhead_hist
                        .observe_duration(start.elapsed().saturating_sub(answer.timing.inference));
                    Ok(out)
                };
                core::counted(app, start, &counting, work).await
            }
            (INFERENCE_SERVICE, "ServerLive") => {
                read::<ipb::ServerLiveRequest>(body, app).await?;
                Ok(codec::frame(&ipb::ServerLiveResponse {
                    live: app.device_lost().is_none(),
                }))
            }
            (INFERENCE_SERVICE, "ServerReady") => {
                read::<ipb::ServerReadyRequest>(body, app).await?;
                Ok(codec::frame(&ipb::ServerReadyResponse {
                    ready: app.is_ready(),
                }))
            }
            (INFERENCE_SERVICE, "ModelReady") => {
                let r: ipb::ModelReadyRequest = read(body, app).await?;
                let model = app.model_version(&r.name, &r.version)?;
                Ok(codec::frame(&ipb::ModelReadyResponse {
                    ready: app.is_model_ready(model),
                }))
            }
            (INFERENCE_SERVICE, "ServerMetadata") => {
                read::<ipb::ServerMetadataRequest>(body, app).await?;
                Ok(self.server_metadata.clone())
            }
            (INFERENCE_SERVICE, "ModelMetadata") => {
                let r: ipb::ModelMetadataRequest = read(body, app).await?;
                let model = app.model_version(&r.name, &r.version)?;
                Ok(self.answers(model)?.metadata.clone())
            }
            (INFERENCE_SERVICE, "ModelConfig") => {
                let r: ipb::ModelConfigRequest = read(body, app).await?;
                let model = app.model_version(&r.name, &r.version)?;
                Ok(self.answers(model)?.config.clone())
            }
            (INFERENCE_SERVICE, "ModelStatistics") => {
                let r: ipb::ModelStatisticsRequest = read(body, app).await?;
                // An empty name asks for every model, as on Triton.
                let stats = if !r.name.is_empty() || !r.version.is_empty() {
                    let m = app.model_version(&r.name, &r.version)?;
                    m.metrics
                        .stats_json(&m.cfg.model.name, &m.cfg.model.version)
                } else {
                    app.stats_json()
                };
                Ok(codec::frame(&statistics(&stats)))
            }
            (INFERENCE_SERVICE, "RepositoryIndex") => {
                let r: ipb::RepositoryIndexRequest = read(body, app).await?;
                let models = app
                    .repository_index(r.ready)
                    .into_iter()
                    .map(|e| ipb::repository_index_response::ModelIndex {
                        name: e.name.to_owned(),
                        version: e.version.to_owned(),
                        state: e.state.to_owned(),
                        reason: e.reason,
                    })
                    .collect();
                Ok(codec::frame(&ipb::RepositoryIndexResponse { models }))
            }
            (HEALTH_SERVICE, "Check") => {
                let r: pb::health::HealthCheckRequest = read(body, app).await?;
                if !r.service.is_empty() && r.service != INFERENCE_SERVICE {
                    return Err(ApiError::NotFound(format!(
                        "unknown service {:?} (this server reports \"\" and {INFERENCE_SERVICE:?})",
                        r.service
                    )));
                }
                let status = if app.is_ready() {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                Ok(codec::frame(&pb::health::HealthCheckResponse {
                    status: status as i32,
                }))
            }
            _ => Err(ApiError::Unimplemented(format!(
                "method {path} is not implemented by this server"
            ))),
        }
    }
}

/// Reads the request body (at most `limit` bytes of message, charged to the memory budget as
/// it arrives) and returns its one message.
async fn read_message(
    body: Incoming,
    limit: u64,
    srv: &infer_spec::runtime::Server,
    charge: &mut crate::budget::Reservation,
) -> Result<Bytes, ApiError> {
    let cap = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_add(codec::PREFIX);
    let body = match crate::conn::read_body(body, cap, srv, charge, crate::conn::Size::GrpcMessage)
        .await
    {
        Err(ApiError::PayloadTooLarge { .. }) => return Err(ApiError::PayloadTooLarge { limit }),
        other => other?,
    };
    codec::unframe(&body)
}

async fn read<M: prost::Message + Default>(body: Incoming, app: &Server) -> Result<M, ApiError> {
    let srv = &app.settings;
    let mut charge = app.budget.reservation();
    let msg = read_message(body, srv.max_body_bytes, srv, &mut charge).await?;
    let name = std::any::type_name::<M>()
        .rsplit("::")
        .next()
        .unwrap_or("request");
    codec::decode(msg, name)
}

/// `grpc-timeout`: up to 8 digits and a unit (H, M, S, m, u, n).
fn parse_timeout(v: &[u8]) -> Option<Duration> {
    let (unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

fn grpc_headers(r: &mut Response<GrpcBody>) {
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
}

fn ok_response(msg: Bytes) -> Response<GrpcBody> {
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from_static("0"));
    let mut r = Response::new(GrpcBody {
        data: Some(msg),
        trailers: Some(trailers),
    });
    grpc_headers(&mut r);
    r
}

/// A failed call: "trailers-only", the status in the response headers and no body.
fn status_response(e: &ApiError) -> Response<GrpcBody> {
    let mut r = Response::new(GrpcBody::empty());
    grpc_headers(&mut r);
    let code = e.grpc_code();
    debug_assert_ne!(code, GrpcCode::Ok);
    let h = r.headers_mut();
    h.insert("grpc-status", HeaderValue::from(code as u16));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(&e.to_string())) {
        h.insert("grpc-message", v);
    }
    r
}

/// `grpc-message` encoding: bytes outside printable ASCII, and `%`, as `%XX`.
fn percent_encode(s: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(s.len());
    for &b in s.as_bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// A unary response body: at most one data frame, then the trailers.
pub struct GrpcBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl GrpcBody {
    fn empty() -> GrpcBody {
        GrpcBody {
            data: None,
            trailers: None,
        }
    }
}

impl hyper::body::Body for GrpcBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(d) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(d))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

// The messages below are built from the JSON the HTTP routes answer, so both protocols say the
// same thing.

fn str_of(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_owned()
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_default()
}

fn list<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> {
    v[key]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
}

fn server_metadata(v: &Value) -> ipb::ServerMetadataResponse {
    ipb::ServerMetadataResponse {
        name: str_of(v, "name"),
        version: str_of(v, "version"),
        extensions: list(v, "extensions")
            .filter_map(|e| e.as_str().map(str::to_owned))
            .collect(),
    }
}

fn model_metadata(v: &Value) -> ipb::ModelMetadataResponse {
    let tensors = |key| {
        list(v, key)
            .map(|t| ipb::model_metadata_response::TensorMetadata {
                name: str_of(t, "name"),
                datatype: str_of(t, "datatype"),
                shape: list(t, "shape").filter_map(Value::as_i64).collect(),
            })
            .collect()
    };
    ipb::ModelMetadataResponse {
        name: str_of(v, "name"),
        versions: list(v, "versions")
            .filter_map(|e| e.as_str().map(str::to_owned))
            .collect(),
        platform: str_of(v, "platform"),
        inputs: tensors("inputs"),
        outputs: tensors("outputs"),
    }
}

fn model_config(v: &Value) -> ipb::ModelConfig {
    use ipb::{model_config::SchedulingChoice, model_version_policy::PolicyChoice};
    let dtype = |t: &Value| {
        ipb::DataType::from_str_name(t["data_type"].as_str().unwrap_or_default())
            .unwrap_or(ipb::DataType::TypeInvalid) as i32
    };
    let dims = |t: &Value| list(t, "dims").filter_map(Value::as_i64).collect();
    let db = &v["dynamic_batching"];
    let qp = &db["default_queue_policy"];
    ipb::ModelConfig {
        name: str_of(v, "name"),
        platform: str_of(v, "platform"),
        backend: str_of(v, "backend"),
        version_policy: Some(ipb::ModelVersionPolicy {
            policy_choice: Some(PolicyChoice::Latest(ipb::model_version_policy::Latest {
                num_versions: u64_of(&v["version_policy"]["latest"], "num_versions") as u32,
            })),
        }),
        max_batch_size: u64_of(v, "max_batch_size") as i32,
        input: list(v, "input")
            .map(|t| ipb::ModelInput {
                name: str_of(t, "name"),
                data_type: dtype(t),
                dims: dims(t),
                ..Default::default()
            })
            .collect(),
        output: list(v, "output")
            .map(|t| ipb::ModelOutput {
                name: str_of(t, "name"),
                data_type: dtype(t),
                dims: dims(t),
                ..Default::default()
            })
            .collect(),
        scheduling_choice: Some(SchedulingChoice::DynamicBatching(
            ipb::ModelDynamicBatching {
                preferred_batch_size: list(db, "preferred_batch_size")
                    .filter_map(Value::as_i64)
                    .map(|n| n as i32)
                    .collect(),
                max_queue_delay_microseconds: u64_of(db, "max_queue_delay_microseconds"),
                preserve_ordering: false,
                priority_levels: 0,
                default_priority_level: 0,
                default_queue_policy: Some(ipb::ModelQueuePolicy {
                    timeout_action: ipb::model_queue_policy::TimeoutAction::Reject as i32,
                    default_timeout_microseconds: u64_of(qp, "default_timeout_microseconds"),
                    allow_timeout_override: qp["allow_timeout_override"].as_bool() == Some(true),
                    max_queue_size: u64_of(qp, "max_queue_size") as u32,
                }),
            },
        )),
        instance_group: list(v, "instance_group")
            .map(|g| ipb::ModelInstanceGroup {
                name: str_of(g, "name"),
                kind: ipb::model_instance_group::Kind::from_str_name(
                    g["kind"].as_str().unwrap_or_default(),
                )
                .unwrap_or(ipb::model_instance_group::Kind::Auto) as i32,
                count: u64_of(g, "count") as i32,
                ..Default::default()
            })
            .collect(),
        default_model_filename: str_of(v, "default_model_filename"),
        parameters: Default::default(),
        model_transaction_policy: Some(ipb::ModelTransactionPolicy { decoupled: false }),
        response_cache: Some(ipb::ModelResponseCache { enable: false }),
    }
}

fn statistics(v: &Value) -> ipb::ModelStatisticsResponse {
    let d = |s: &Value| {
        Some(ipb::StatisticDuration {
            count: u64_of(s, "count"),
            ns: u64_of(s, "ns"),
        })
    };
    ipb::ModelStatisticsResponse {
        model_stats: list(v, "model_stats")
            .map(|m| {
                let s = &m["inference_stats"];
                ipb::ModelStatistics {
                    name: str_of(m, "name"),
                    version: str_of(m, "version"),
                    last_inference: u64_of(m, "last_inference"),
                    inference_count: u64_of(m, "inference_count"),
                    execution_count: u64_of(m, "execution_count"),
                    inference_stats: Some(ipb::InferStatistics {
                        success: d(&s["success"]),
                        fail: d(&s["fail"]),
                        queue: d(&s["queue"]),
                        compute_input: d(&s["compute_input"]),
                        compute_infer: d(&s["compute_infer"]),
                        compute_output: d(&s["compute_output"]),
                        cache_hit: d(&s["cache_hit"]),
                        cache_miss: d(&s["cache_miss"]),
                    }),
                    batch_stats: list(m, "batch_stats")
                        .map(|b| ipb::InferBatchStatistics {
                            batch_size: u64_of(b, "batch_size"),
                            compute_input: d(&b["compute_input"]),
                            compute_infer: d(&b["compute_infer"]),
                            compute_output: d(&b["compute_output"]),
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_and_messages() {
        assert_eq!(parse_timeout(b"100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_timeout(b"2S"), Some(Duration::from_secs(2)));
        assert_eq!(parse_timeout(b"123456789n"), None);
        assert_eq!(parse_timeout(b"m"), None);
        assert_eq!(parse_timeout(b"5x"), None);
        assert_eq!(
            percent_encode("input \"x\": 5% ünits"),
            "input \"x\": 5%25 %C3%BCnits"
        );
    }

    #[test]
    fn config_and_stats_say_what_the_http_routes_say() {
        let cfg = infer_spec::RuntimeConfig::from_toml_str(
            "[model]\nname = \"m\"\n[[inputs]]\nname = \"x\"\ndatatype = \"FP32\"\ndims = [-1, 3]\n[[outputs]]\nname = \"y\"\ndatatype = \"INT64\"\ndims = [-1, 1]\n[batching]\nmax_batch_size = 8\nmax_queue_size = 5\n[engine]\nkind = \"tract-onnx\"\npath = \"m.onnx\"\n",
        )
        .unwrap();
        let metrics = Arc::new(crate::metrics::Metrics::new("m", "1", 8));
        let model = Model::new(cfg, metrics.clone());
        let c = model_config(&model.config_json);
        assert_eq!((c.name.as_str(), c.max_batch_size), ("m", 8));
        assert_eq!(c.input[0].dims, [3]);
        assert_eq!(c.input[0].data_type, ipb::DataType::TypeFp32 as i32);
        assert_eq!(c.output[0].data_type, ipb::DataType::TypeInt64 as i32);
        let Some(ipb::model_config::SchedulingChoice::DynamicBatching(db)) = c.scheduling_choice
        else {
            panic!("no dynamic batching")
        };
        assert_eq!(db.default_queue_policy.unwrap().max_queue_size, 5);
        assert_eq!(
            c.instance_group[0].kind,
            ipb::model_instance_group::Kind::Cpu as i32
        );
        let m = model_metadata(&model.metadata_json);
        assert_eq!(m.inputs[0].shape, [-1, 3]);
        assert_eq!(m.outputs[0].datatype, "INT64");
        metrics.record_batch(2, Duration::from_micros(30));
        let s = statistics(&metrics.stats_json("m", "1"));
        assert_eq!(s.model_stats[0].name, "m");
        assert_eq!(s.model_stats[0].batch_stats[0].batch_size, 2);
        assert_eq!(s.model_stats[0].execution_count, 1);
    }
}
