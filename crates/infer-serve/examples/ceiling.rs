//! The benchmark ceiling for `infer-serve`: the same HTTP stack (tokio + hyper, same settings)
//! and the same V2 decode and encode, but no batcher and no model: every request is answered
//! at once with zero-filled outputs of the right shape. `bench/runtime.sh` compares the
//! runtime's throughput against this.
//!
//! usage: ceiling RUNTIME_TOML PORT
#![allow(
    clippy::disallowed_macros,
    reason = "a measurement program: its report is its output"
)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Request, Response};
use infer_serve::tensor::Tensor;
use infer_serve::v2;
use infer_spec::RuntimeConfig;
use std::sync::Arc;

async fn answer(
    cfg: Arc<RuntimeConfig>,
    req: Request<hyper::body::Incoming>,
) -> Response<Full<Bytes>> {
    if req.method() == hyper::Method::GET {
        // Readiness for the benchmark driver.
        return Response::new(Full::new(Bytes::from_static(b"{\"ready\":true}")));
    }
    let header = req
        .headers()
        .get(v2::HEADER_LENGTH)
        .and_then(|v| v2::parse_header_length(v.as_bytes()).ok());
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Response::new(Full::new(Bytes::new())),
    };
    let request = match v2::decode_request(&*cfg, header, &body) {
        Ok(r) => r,
        Err(e) => {
            let mut r = Response::new(Full::new(Bytes::from(e.body())));
            *r.status_mut() = e.status();
            return r;
        }
    };
    let outputs: Vec<Tensor> = cfg
        .outputs
        .iter()
        .map(|spec| {
            let mut shape = vec![request.rows];
            shape.extend(spec.row_dims());
            let bytes = shape.iter().product::<usize>() * spec.datatype.size().unwrap_or(4);
            Tensor {
                dtype: spec.datatype,
                shape,
                data: Bytes::from(vec![0u8; bytes]),
            }
        })
        .collect();
    let selected: Vec<_> = request
        .outputs
        .iter()
        .filter_map(|r| outputs.get(r.index).map(|t| (*r, t)))
        .collect();
    let (body, header) = v2::encode_response(&*cfg, request.id.as_deref(), &selected);
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
    r
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(path), Some(port)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: ceiling RUNTIME_TOML PORT");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let cfg =
        Arc::new(RuntimeConfig::from_toml_str(&text).unwrap_or_else(|e| panic!("{path}: {e}")));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio");
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{port}"))
            .await
            .expect("bind");
        println!("listening on 127.0.0.1:{port}");
        let http = hyper::server::conn::http1::Builder::new();
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let cfg = cfg.clone();
            let conn = http.serve_connection(
                hyper_util::rt::TokioIo::new(stream),
                hyper::service::service_fn(move |req| {
                    let cfg = cfg.clone();
                    async move { Ok::<_, std::convert::Infallible>(answer(cfg, req).await) }
                }),
            );
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    });
}
