//! Every bound of the serving core against the binary, with hostile sizes: the texts and bytes
//! of one request, the memory the requests in flight hold (HTTP and gRPC bodies withheld
//! before their last byte), the response cache's bytes, ids past a model's table, an engine
//! that panics, tokenizers and configuration files that would cost the process its memory or
//! a core. Each test checks what the client gets (the status and the words naming the bound),
//! that `/v2/health/live` kept answering fast, and that the process's peak resident memory stayed
//! under `server.memory_budget_bytes`.
//!
//! The text model here is a synthetic one (the `synthetic` engine pools nothing: its one output
//! is a `[rows, 8]` vector starting at each row's first token id) behind a real word-level
//! `tokenizer.json`, so the tokenizer, the core and the batcher run as they do for a real model,
//! without a model file.

use super::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A word-level tokenizer: `[CLS]` before each text, words `w0`..`w199` (ids 3..202), and
/// `[UNK]` for anything else (whitespace-split, punctuation apart).
fn tokenizer() -> String {
    let mut vocab = serde_json::json!({"[PAD]": 0, "[CLS]": 1, "[UNK]": 2});
    for i in 0..200 {
        vocab[format!("w{i}")] = serde_json::json!(i + 3);
    }
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 1, "content": "[CLS]", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
    })
    .to_string()
}

/// The synthetic text model's `runtime.toml` (model `words`, 128 tokens at most, batches of up
/// to 32 texts within 25% padding), with `text` added to its `[text]` and `server` to its
/// `[server]` table.
fn words_config(text: &str, server: &str) -> String {
    format!(
        r#"[model]
name = "words"

[[inputs]]
name = "input_ids"
datatype = "INT64"
dims = [-1, -1]
profile = {{ min = [1], opt = [8], max = [128] }}
dim_names = ["sequence"]

[[inputs]]
name = "attention_mask"
datatype = "INT64"
dims = [-1, -1]
profile = {{ min = [1], opt = [8], max = [128] }}
dim_names = ["sequence"]

[[outputs]]
name = "embedding"
datatype = "FP32"
dims = [-1, 8]

[batching]
max_batch_size = 32
max_queue_delay_us = 20000
max_queue_size = 4096
default_timeout_ms = 5000

[engine]
kind = "synthetic"
synthetic = {{ base_ms = 2.0, per_row_ms = 0.0 }}

[warmup]
batch_sizes = [1]

[text]
tokenizer = "tokenizer.json"
max_length = 128
input_ids = "input_ids"
attention_mask = "attention_mask"
output = "embedding"
pooling = "none"
max_padding_percent = 25
{text}

[server]
host = "127.0.0.1"
port = 0
drain_delay_s = 0
{server}
"#
    )
}

/// Starts the synthetic text model with its tokenizer (`tokenizer_json`) beside the config.
fn words_server(config: &str, tokenizer_json: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("runtime.toml"), config).unwrap();
    std::fs::write(dir.path().join("tokenizer.json"), tokenizer_json).unwrap();
    let s = Server::start_in(dir, &[]);
    s.wait_log("\"ready\"", Duration::from_secs(60));
    s
}

/// `name` (`VmRSS`, `VmHWM`: the peak) of process `pid`, in bytes.
pub(super) fn memory(pid: u32, name: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"));
    let kb: u64 = line
        .trim_start_matches(name)
        .trim_start_matches(':')
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// Polls `/v2/health/live` every 20 ms until stopped; returns the slowest answer.
pub(super) struct Probe {
    stop: Arc<AtomicBool>,
    worst: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Probe {
    pub(super) fn start(addr: &str) -> Probe {
        let stop = Arc::new(AtomicBool::new(false));
        let worst = Arc::new(AtomicU64::new(0));
        let (s, w, addr) = (stop.clone(), worst.clone(), addr.to_owned());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = http(&addr, "GET", "/v2/health/live", &[], b"");
                assert_eq!(r.status, 200, "{}", r.text());
                w.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Probe {
            stop,
            worst,
            thread: Some(thread),
        }
    }

    /// Stops probing; the slowest liveness answer seen.
    pub(super) fn finish(mut self) -> Duration {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        Duration::from_micros(self.worst.load(Ordering::Relaxed))
    }
}

/// `n` texts of `words` words each, as a JSON list.
fn texts(n: usize, words: impl Fn(usize) -> usize) -> String {
    let list: Vec<String> = (0..n)
        .map(|i| {
            let t: Vec<String> = (0..words(i))
                .map(|w| format!("w{}", (i + w) % 200))
                .collect();
            format!("\"{}\"", t.join(" "))
        })
        .collect();
    format!("[{}]", list.join(","))
}

pub(super) fn assert_refused(r: &Reply, status: u16, says: &[&str]) {
    assert_eq!(r.status, status, "{}", r.text());
    let e = r.json()["error"].as_str().unwrap_or_default().to_owned();
    for s in says {
        assert!(e.contains(s), "{e:?} does not say {s:?}");
    }
}

/// One request's texts become items of the queue, each padded only to its batch's longest
/// within the padding bound: 32 texts of 4 to 126 tokens are computed as about their own 1,186
/// tokens, not as 32 x 126 = 4,032 (the request padded to its longest).
#[test]
fn a_requests_texts_are_batched_as_items_not_padded_to_their_longest() {
    let s = words_server(&words_config("", ""), &tokenizer());
    // 3 + 4i words + [CLS]: 4 to 128 tokens, shuffled.
    let lengths: Vec<usize> = (0..32)
        .map(|i| 3 + (i * 13 % 32) * 4 - (i * 13 % 32) / 11)
        .collect();
    let own: usize = lengths.iter().map(|l| l + 1).sum();
    let body = format!(r#"{{"inputs":{}}}"#, texts(32, |i| lengths[i]));
    let r = s.post("/embed", &[], body.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let vectors = r.json();
    assert_eq!(vectors.as_array().unwrap().len(), 32);
    // Each vector is its own text's (the synthetic engine's rows start at the row's first
    // token id, [CLS] here): answers come back in the request's order.
    assert_eq!(r.header("x-compute-tokens"), Some(own.to_string().as_str()));
    let m = s.get("/metrics").text();
    let l = "{model=\"words\",version=\"1\"}";
    let padded = metric(&m, &format!("infer_serve_batch_tokens_total{l}"));
    let held = metric(&m, &format!("infer_serve_sequence_tokens_total{l}"));
    assert_eq!(held as usize, own, "{m}");
    assert!(
        padded <= 1.25 * own as f64 + 128.0,
        "{padded} tokens computed for {own} of the texts' own:\n{m}"
    );
}

/// Texts per request, texts' bytes and the memory budget: each bound is a 413 naming its key
/// (never a 503 the client would retry), answered before the work, on every text route, and the
/// server's memory stays small while it refuses.
#[test]
fn text_bounds_are_413s_naming_their_key_before_any_work() {
    let mut s = words_server(
        &words_config("max_client_batch_size = 64", ""),
        &tokenizer(),
    );
    let many = format!("[{}]", vec!["\"w1\""; 100_000].join(","));
    for (path, body) in [
        ("/embed", format!(r#"{{"inputs":{many}}}"#)),
        (
            "/v1/embeddings",
            format!(r#"{{"model":"words","input":{many}}}"#),
        ),
        ("/tokenize", format!(r#"{{"inputs":{many}}}"#)),
        ("/predict", format!(r#"{{"inputs":{many}}}"#)),
    ] {
        let t = Instant::now();
        let r = s.post(path, &[], body.as_bytes());
        if path == "/predict" {
            // Not a classifier: it says so before reading the texts.
            assert_refused(&r, 400, &["call /embed"]);
            continue;
        }
        assert_refused(
            &r,
            413,
            &["more than 64 texts", "text.max_client_batch_size"],
        );
        assert!(
            r.header("retry-after").is_none(),
            "{path}: a 413 is not retried"
        );
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{path}: {:?}",
            t.elapsed()
        );
    }
    // A million one-letter texts (5 MB): refused while parsing, without a million strings;
    // three such /v1/embeddings at once leave liveness answering.
    let million = format!(r#"{{"inputs":[{}]}}"#, vec!["\"a\""; 1_000_000].join(","));
    let r = s.post("/tokenize", &[], million.as_bytes());
    assert_refused(&r, 413, &["text.max_client_batch_size"]);
    let probe = Probe::start(&s.addr);
    let openai = format!(
        r#"{{"model":"words","input":[{}]}}"#,
        vec!["\"a b\""; 1_000_000].join(",")
    );
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                let r = http(&s.addr, "POST", "/v1/embeddings", &[], openai.as_bytes());
                assert_refused(&r, 413, &["text.max_client_batch_size"]);
            });
        }
    });
    let worst = probe.finish();
    assert!(worst < Duration::from_secs(1), "liveness took {worst:?}");
    assert!(
        memory(s.child.id(), "VmHWM") < 400 << 20,
        "peak RSS {} bytes",
        memory(s.child.id(), "VmHWM")
    );
    drop(s);

    // Truncation off: a text longer than 128 bytes per token of max_length is refused before
    // it is tokenized.
    s = words_server(&words_config("truncate = false", ""), &tokenizer());
    let long = format!(r#"{{"inputs":"{}"}}"#, "w1 ".repeat(10_000));
    assert_refused(
        &s.post("/embed", &[], long.as_bytes()),
        413,
        &["text 0 is 30000 bytes", "text.truncate", "16384 bytes"],
    );
    assert_eq!(s.get("/v2/health/live").status, 200);
}

/// Texts far longer than the model reads: cut before they are tokenized (a 60 MiB text costs
/// about what its first tokens cost), tokenized off the connection threads (liveness answers
/// throughout), answered before their deadline; `/tokenize` shows what the model
/// computes on.
#[test]
fn huge_texts_are_cut_before_tokenizing_and_the_server_stays_live() {
    let budget: u64 = 1 << 30;
    let s = words_server(
        &words_config("", &format!("memory_budget_bytes = {budget}")),
        &tokenizer(),
    );
    let probe = Probe::start(&s.addr);
    // One 60 MiB text (under the 64 MiB body limit).
    let huge = format!(r#"{{"inputs":"{}"}}"#, "w7 w8 ".repeat(10 << 20));
    let t = Instant::now();
    let r = s.post("/embed", &[], huge.as_bytes());
    let took = t.elapsed();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.header("x-compute-tokens"),
        Some("128"),
        "truncated to max_length"
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    // Three 16 MiB /tokenize at once, and four 15 MB texts against the 5 s deadline.
    let addr = s.addr.clone();
    let clients: Vec<_> = (0..7)
        .map(|i| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let (path, text) = if i < 3 {
                    ("/tokenize", "w1 ".repeat((16 << 20) / 3))
                } else {
                    ("/embed", "w2 w3 w4 ".repeat(15_000_000 / 9))
                };
                let body = format!(r#"{{"inputs":"{text}"}}"#);
                let t = Instant::now();
                let r = http(&addr, "POST", path, &[], body.as_bytes());
                (path, r, t.elapsed())
            })
        })
        .collect();
    for c in clients {
        let (path, r, took) = c.join().unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert!(took < Duration::from_secs(6), "{path}: {took:?}");
        if path == "/tokenize" {
            let tokens = r.json();
            assert_eq!(tokens[0].as_array().unwrap().len(), 128, "{}", r.text());
            assert_eq!(tokens[0][1]["text"], "w1");
        }
    }
    // Within a second here, where the tests share two cores; docs/BENCHMARKS.md has the
    // liveness figures of a quiet machine.
    let worst = probe.finish();
    assert!(worst < Duration::from_secs(1), "liveness took {worst:?}");
    let peak = memory(s.child.id(), "VmHWM");
    assert!(peak < budget, "peak RSS {peak} over the budget {budget}");
}

/// Answers that say what they are: `/predict` of an embedding model points to `/embed`;
/// `/tokenize` gives each token's text and offsets; the empty text is refused and whitespace
/// is a text (TEI's rule); inputs that are not texts and `dimensions` out of range are 400s in
/// plain words, also when a cached answer exists for the same texts.
#[test]
fn answers_say_what_they_are() {
    let config = words_config("", "").replace(
        "\n[server]",
        "\n[response_cache]\nmax_bytes = 1048576\n\n[server]",
    );
    let s = words_server(&config, &tokenizer());
    assert_refused(
        &s.post("/predict", &[], br#"{"inputs":"w1 w2"}"#),
        400,
        &["makes embeddings, not predictions", "call /embed"],
    );
    let r = s.post("/tokenize", &[], r#"{"inputs":"w1  w12, zz"}"#.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        serde_json::json!([[
            {"id": 1, "text": "[CLS]", "special": true},
            {"id": 4, "text": "w1", "special": false, "start": 0, "stop": 2},
            {"id": 15, "text": "w12", "special": false, "start": 4, "stop": 7},
            {"id": 2, "text": ",", "special": false, "start": 7, "stop": 8},
            {"id": 2, "text": "zz", "special": false, "start": 9, "stop": 11}
        ]])
    );
    assert_refused(
        &s.post("/embed", &[], br#"{"inputs":["w1",""]}"#),
        400,
        &["text 1 is empty"],
    );
    for blank in [r#""   ""#, r#""\u200b""#, r#""\u0000""#] {
        let r = s.post("/embed", &[], format!(r#"{{"inputs":{blank}}}"#).as_bytes());
        assert_eq!(r.status, 200, "{blank}: {}", r.text());
    }
    for (body, says) in [
        (
            r#"{"inputs":null}"#,
            "expected a string or a list of strings",
        ),
        (r#"{"inputs":42}"#, "expected a string or a list of strings"),
        (
            r#"{"model":"words","input":null}"#,
            "expected a string or a list of strings",
        ),
    ] {
        let path = if body.contains("model") {
            "/v1/embeddings"
        } else {
            "/embed"
        };
        assert_refused(&s.post(path, &[], body.as_bytes()), 400, &[says]);
    }
    // A plain request cached first: the same texts with dimensions out of range are still 400.
    let plain = br#"{"model":"words","input":"w1 w2"}"#;
    assert_eq!(s.post("/v1/embeddings", &[], plain).status, 200);
    assert_eq!(s.post("/v1/embeddings", &[], plain).status, 200);
    for d in ["18446744073709551615", "9", "0", "-1"] {
        let body = format!(r#"{{"model":"words","input":"w1 w2","dimensions":{d}}}"#);
        let r = s.post("/v1/embeddings", &[], body.as_bytes());
        assert_eq!(r.status, 400, "dimensions {d}: {}", r.text());
        assert!(r.text().contains("dimensions"), "{}", r.text());
    }
    let r = s.post(
        "/v1/embeddings",
        &[],
        br#"{"model":"words","input":"w1 w2","dimensions":2}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["data"][0]["embedding"],
        serde_json::json!([1.0, 2.0])
    );
}

/// Bodies in flight count against the memory budget: clients that send most of a 60 MiB body
/// and withhold its last byte hold at most the budget, over HTTP/1.1 and gRPC alike; past it a
/// body is refused at once (503 with `Retry-After`, gRPC `RESOURCE_EXHAUSTED`) and nothing more
/// of it is read. Liveness answers throughout, and the peak resident memory stays under the
/// budget.
#[test]
fn bodies_in_flight_are_held_within_the_memory_budget() {
    let budget: u64 = 320 << 20;
    let config = synthetic(1, 8, 0, 0).replace(
        "port = 0\n",
        &format!(
            "port = 0\nmemory_budget_bytes = {budget}\nmax_body_bytes = 67108864\nbody_read_timeout_s = 120\n"
        ),
    );
    let s = Server::ready(&config);
    let probe = Probe::start(&s.addr);
    let body_len = 60usize << 20;
    // HTTP/1.1: each announces 60 MiB and sends all but its last byte.
    let mut held = Vec::new();
    let mut refused = 0;
    for _ in 0..8 {
        let mut c = TcpStream::connect(&s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(1500)))
            .unwrap();
        let head = format!(
            "POST /v2/models/synthetic/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {body_len}\r\n\r\n"
        );
        c.write_all(head.as_bytes()).unwrap();
        // The answer, if the server refuses the body before it comes.
        let chunk = vec![b' '; 1 << 20];
        let (mut sent, mut cut_off) = (0, false);
        while sent + chunk.len() < body_len {
            if c.write_all(&chunk).is_err() {
                cut_off = true;
                break;
            }
            sent += chunk.len();
        }
        if !cut_off {
            let _ = c.write_all(&chunk[..body_len - sent - 1]);
        }
        let mut answer = [0u8; 512];
        match c.read(&mut answer) {
            Ok(n) if n > 0 => {
                let text = String::from_utf8_lossy(&answer[..n]).into_owned();
                assert!(text.starts_with("HTTP/1.1 503"), "{text}");
                assert!(
                    text.to_ascii_lowercase().contains("retry-after: 1"),
                    "{text}"
                );
                assert!(text.contains("server.memory_budget_bytes"), "{text}");
                refused += 1;
            }
            _ => held.push(c),
        }
    }
    assert!(
        !held.is_empty() && refused > 0,
        "{} bodies held, {refused} refused",
        held.len()
    );
    let rss = memory(s.child.id(), "VmHWM");
    assert!(
        rss < budget,
        "peak RSS {rss} over the budget {budget} with {} bodies held",
        held.len()
    );
    drop(held);

    // gRPC: streams whose message is 60 MiB less a byte, withheld.
    let (held, refused) = grpc_withheld_streams(&s.grpc_addr, 8, body_len);
    assert!(
        held > 0 && refused > 0,
        "{held} streams held, {refused} refused"
    );
    let rss = memory(s.child.id(), "VmHWM");
    assert!(rss < budget, "peak RSS {rss} over the budget {budget}");
    let worst = probe.finish();
    assert!(worst < Duration::from_secs(1), "liveness took {worst:?}");
    let ok = s.post(
        "/v2/models/synthetic/infer",
        &[],
        f32_json(1, 4, 1.0).as_bytes(),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
}

/// Opens `n` gRPC calls on one HTTP/2 connection, each sending a message of `len` bytes but its
/// last; returns how many the server kept reading and how many it refused with
/// `RESOURCE_EXHAUSTED` naming the memory budget.
fn grpc_withheld_streams(addr: &str, n: usize, len: usize) -> (usize, usize) {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = addr.to_owned();
    rt.block_on(async move {
        let io = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(io),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let mut calls = Vec::new();
        let mut feeds = Vec::new();
        for _ in 0..n {
            let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(4);
            let req = hyper::Request::post(format!(
                "http://{addr}/inference.GRPCInferenceService/ModelInfer"
            ))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Chunks(rx))
            .unwrap();
            let mut sender = sender.clone();
            calls.push(tokio::spawn(async move {
                sender.ready().await.ok()?;
                sender.send_request(req).await.ok()
            }));
            // A 5-byte prefix announcing the message, then all of it but one byte.
            let feed = tokio::spawn(async move {
                let mut prefix = vec![0u8];
                prefix.extend_from_slice(&(len as u32).to_be_bytes());
                if tx.send(bytes::Bytes::from(prefix)).await.is_err() {
                    return;
                }
                let chunk = bytes::Bytes::from(vec![0u8; 1 << 20]);
                let mut sent = 0;
                while sent + chunk.len() < len {
                    if tx.send(chunk.clone()).await.is_err() {
                        return;
                    }
                    sent += chunk.len();
                }
                let _ = tx.send(chunk.slice(..len - sent - 1)).await;
                // Withheld: the sender stays open.
                tokio::time::sleep(Duration::from_secs(3600)).await;
            });
            feeds.push(feed);
        }
        tokio::time::sleep(Duration::from_secs(8)).await;
        let (mut held, mut refused) = (0, 0);
        for call in calls {
            if !call.is_finished() {
                held += 1;
                call.abort();
                continue;
            }
            let Some(resp) = call.await.ok().flatten() else {
                continue;
            };
            let status = resp
                .headers()
                .get("grpc-status")
                .map(|v| v.to_str().unwrap().to_owned());
            let message = resp
                .headers()
                .get("grpc-message")
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default();
            let _ = resp.into_body().collect().await;
            assert_eq!(status.as_deref(), Some("8"), "{message}");
            assert!(message.contains("server.memory_budget_bytes"), "{message}");
            refused += 1;
        }
        for f in feeds {
            f.abort();
        }
        (held, refused)
    })
}

/// A request body fed from a channel (the test decides when, and whether, it ends).
struct Chunks(tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl hyper::body::Body for Chunks {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<bytes::Bytes>, Self::Error>>> {
        self.get_mut()
            .0
            .poll_recv(cx)
            .map(|b| b.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

/// The response cache counts every byte it keeps alive: an answer that is one request's rows
/// of a batch is kept as its own copy, never as a view that keeps the whole batch's output
/// alive. Eight waves of eight requests each run as one batch of 16 MiB; after each wave the
/// first request of every wave so far is asked again (a hit, which keeps it), so the 32 MiB
/// cache ends holding answers from eight different batches: 32 MiB of copies, where views
/// would keep 128 MiB of batches.
#[test]
fn the_response_cache_keeps_no_more_than_its_bytes() {
    // 2 MiB per output row; one batch per wave (a strict 100 ms delay gathers it).
    let row = 2usize << 20;
    let config = support::synthetic_runtime_config(&format!(
        "[batching]\nmax_batch_size = 8\nmax_queue_delay_us = 100000\nqueue_delay = \"strict\"\ninstances = 1\n\
         [engine]\nkind = \"synthetic\"\nsynthetic = {{ base_ms = 1.0, per_row_ms = 0.0 }}\n\
         [warmup]\nbatch_sizes = [1]\n\
         [response_cache]\nmax_bytes = {}\n\
         [server]\nhost = \"127.0.0.1\"\nport = 0\n",
        16 * row + (64 << 10)
    ))
    .replace(
        "[[outputs]]\nname = \"y\"\ndatatype = \"FP32\"\ndims = [-1, 4]",
        &format!("[[outputs]]\nname = \"y\"\ndatatype = \"FP32\"\ndims = [-1, {}]", row / 4),
    );
    // The runtime's allocator policy gives freed buffers of 1 MiB and more back to the system at
    // once, so the resident set is what the server keeps.
    let s = Server::ready(&config);
    let before = memory(s.child.id(), "VmRSS");
    let ask = |wave: usize, j: usize| {
        // Binary output: the answer's 2 MiB as bytes, not JSON numbers.
        let body = f32_json(1, 4, (wave * 100 + j) as f32).replace(
            r#"]}]}"#,
            r#"]}],"parameters":{"binary_data_output":true}}"#,
        );
        let r = http(
            &s.addr,
            "POST",
            "/v2/models/synthetic/infer",
            &[],
            body.as_bytes(),
        );
        assert_eq!(
            r.status,
            200,
            "{}",
            String::from_utf8_lossy(&r.body[..r.body.len().min(200)])
        );
    };
    for wave in 0..8 {
        std::thread::scope(|scope| {
            for j in 0..8 {
                scope.spawn(move || ask(wave, j));
            }
        });
        for kept in 0..=wave {
            ask(kept, 0);
        }
    }
    let m = s.get("/metrics").text();
    let l = "{model=\"synthetic\",version=\"1\"";
    assert!(
        metric(&m, &format!("infer_serve_batch_size_count{l}")) <= 12.0,
        "each wave ran as about one batch:\n{m}"
    );
    assert!(
        metric(&m, &format!("nv_cache_num_hits_per_model{l}")) >= 30.0,
        "{m}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let grown = memory(s.child.id(), "VmRSS").saturating_sub(before);
    eprintln!(
        "the server grew by {} MiB holding a 32 MiB cache",
        grown >> 20
    );
    assert!(
        grown < 64 << 20,
        "the server grew by {grown} bytes holding a 32 MiB cache"
    );
}

/// An engine's panic fails the requests of its batch, no others and not the process: a batch
/// with the poisoned row and a good one is run again one by one (the good one answered), over
/// HTTP and gRPC; the server goes on serving and counts the panic.
#[test]
fn an_engine_panic_fails_only_its_request() {
    // A strict 50 ms delay: two requests sent together share a batch.
    let config = synthetic(30, 8, 0, 0).replace(
        "max_queue_size = 0",
        "max_queue_size = 0\nmax_queue_delay_us = 50000\nqueue_delay = \"strict\"",
    );
    let s = Server::start_env(&config, &[("INFER_SERVE_SYNTHETIC_FAULTS", "panic=7")]);
    s.wait_log("\"ready\"", Duration::from_secs(60));
    let addr = s.addr.clone();
    let poisoned = std::thread::spawn({
        let addr = addr.clone();
        move || {
            http(
                &addr,
                "POST",
                "/v2/models/synthetic/infer",
                &[],
                f32_json(1, 4, 7.0).as_bytes(),
            )
        }
    });
    let good = http(
        &addr,
        "POST",
        "/v2/models/synthetic/infer",
        &[],
        f32_json(1, 4, 1.0).as_bytes(),
    );
    let poisoned = poisoned.join().unwrap();
    assert_eq!(good.status, 200, "{}", good.text());
    assert_refused(&poisoned, 500, &["the engine panicked"]);
    assert_eq!(s.get("/v2/health/live").status, 200);
    assert_eq!(s.get("/v2/health/ready").status, 200);
    // gRPC: the poisoned row (7.0 in the raw contents).
    let mut msg = grpc_infer_message();
    let at = msg.len() - 16;
    msg[at..at + 4].copy_from_slice(&7.0f32.to_le_bytes());
    let (status, message) = grpc_status(&s.grpc_addr, &msg);
    assert_eq!(status, "13", "{message}");
    assert!(message.contains("the engine panicked"), "{message}");
    let ok = s.post(
        "/v2/models/synthetic/infer",
        &[],
        f32_json(2, 4, 2.0).as_bytes(),
    );
    assert_eq!(ok.status, 200, "{}", ok.text());
    let m = s.get("/metrics").text();
    assert!(
        metric(
            &m,
            "infer_serve_engine_panics_total{model=\"synthetic\",version=\"1\"}"
        ) >= 2.0,
        "{m}"
    );
}

/// A ModelInfer call with `message` (length-prefixed), through hyper's HTTP/2 client: the
/// `grpc-status` and (percent-decoded) `grpc-message` the server answers.
fn grpc_status(addr: &str, message: &[u8]) -> (String, String) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (addr, body) = (addr.to_owned(), bytes::Bytes::copy_from_slice(message));
    rt.block_on(async move {
        let io = tokio::net::TcpStream::connect(&addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http2::handshake(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(io),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let req = hyper::Request::post(format!(
            "http://{addr}/inference.GRPCInferenceService/ModelInfer"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(http_body_util::Full::new(body))
        .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let collected = http_body_util::BodyExt::collect(body).await.unwrap();
        let trailers = collected.trailers().cloned().unwrap_or_default();
        let get = |k: &str| {
            parts
                .headers
                .get(k)
                .or_else(|| trailers.get(k))
                .map(|v| v.to_str().unwrap().to_owned())
                .unwrap_or_default()
        };
        (get("grpc-status"), percent_decode(&get("grpc-message")))
    })
}

/// `grpc-message`'s percent-encoding undone.
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            if let Ok(v) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The stand-in all-MiniLM-L6-v2 graph (`recipes/models/minilm.onnx`, a word-embedding table
/// of 30522 rows) on tract: an id past the table is a 400 naming the input, the value and the
/// bound when `runtime.toml` says the input's `table_rows` (the builder writes it from the
/// graph), over HTTP and gRPC; without it, tract's panic on the read past the table fails only
/// that request (500), and the server goes on.
#[test]
fn ids_past_an_embedding_table_are_refused_and_a_tract_panic_is_contained() {
    let onnx = support::root().join("recipes/models/minilm.onnx");
    let config = |table: &str| {
        format!(
            "[model]\nname = \"minilm\"\n\
             [[inputs]]\nname = \"input_ids\"\ndatatype = \"INT64\"\ndims = [-1, -1]\n\
             profile = {{ min = [1], opt = [8], max = [64] }}\ndim_names = [\"sequence\"]\n{table}\n\
             [[inputs]]\nname = \"attention_mask\"\ndatatype = \"INT64\"\ndims = [-1, -1]\n\
             profile = {{ min = [1], opt = [8], max = [64] }}\ndim_names = [\"sequence\"]\n\
             [[outputs]]\nname = \"sentence_embedding\"\ndatatype = \"FP32\"\ndims = [-1, 384]\n\
             [batching]\nmax_batch_size = 4\n\
             [engine]\nkind = \"tract-onnx\"\npath = \"{}\"\n\
             [warmup]\nbatch_sizes = [1]\n\
             [server]\nhost = \"127.0.0.1\"\nport = 0\ndrain_delay_s = 0\n",
            onnx.display()
        )
    };
    let ids = |v: i64| {
        format!(
            r#"{{"inputs":[{{"name":"input_ids","shape":[1,3],"datatype":"INT64","data":[101,{v},102]}},{{"name":"attention_mask","shape":[1,3],"datatype":"INT64","data":[1,1,1]}}]}}"#
        )
    };
    let s = Server::ready(&config("table_rows = 30522"));
    let infer = "/v2/models/minilm/infer";
    assert_refused(
        &s.post(infer, &[], ids(30522).as_bytes()),
        400,
        &[
            "input \"input_ids\": value 30522",
            "table of 30522 rows",
            "-30522..=30521",
        ],
    );
    assert_eq!(s.post(infer, &[], ids(2000).as_bytes()).status, 200);
    // gRPC: INT64 contents [101, 30522, 102] and the mask.
    let msg = grpc_minilm_message(&[101, 30522, 102]);
    let (status, message) = grpc_status(&s.grpc_addr, &msg);
    assert_eq!(status, "3", "{message}");
    assert!(message.contains("value 30522"), "{message}");
    drop(s);

    let s = Server::ready(&config(""));
    assert_refused(
        &s.post(infer, &[], ids(30522).as_bytes()),
        500,
        &["the engine panicked"],
    );
    assert_eq!(s.get("/v2/health/live").status, 200);
    assert_eq!(s.post(infer, &[], ids(2000).as_bytes()).status, 200);
}

/// A length-prefixed ModelInferRequest for the minilm model: `input_ids` (`int64_contents`)
/// and an all-ones `attention_mask`, one row.
fn grpc_minilm_message(ids: &[i64]) -> Vec<u8> {
    fn varint(mut v: u64, out: &mut Vec<u8>) {
        loop {
            let b = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                out.push(b);
                return;
            }
            out.push(b | 0x80);
        }
    }
    let input = |name: &str, values: &[i64]| {
        let mut packed = Vec::new();
        for &v in values {
            varint(v as u64, &mut packed);
        }
        // InferTensorContents.int64_contents = 3 (packed).
        let mut contents = vec![0x1a];
        varint(packed.len() as u64, &mut contents);
        contents.extend_from_slice(&packed);
        let mut t = vec![0x0a, name.len() as u8];
        t.extend_from_slice(name.as_bytes());
        t.extend_from_slice(&[0x12, 5]);
        t.extend_from_slice(b"INT64");
        t.extend_from_slice(&[0x1a, 2, 1, values.len() as u8]);
        t.push(0x2a);
        varint(contents.len() as u64, &mut t);
        t.extend_from_slice(&contents);
        t
    };
    let mut msg = vec![0x0a, 6];
    msg.extend_from_slice(b"minilm");
    for t in [
        input("input_ids", ids),
        input("attention_mask", &vec![1; ids.len()]),
    ] {
        msg.push(0x2a);
        varint(t.len() as u64, &mut msg);
        msg.extend_from_slice(&t);
    }
    let mut framed = vec![0];
    framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    framed.extend_from_slice(&msg);
    framed
}

/// Tokenizers that would cost the process a core or its memory, and configuration files too
/// large to be one, are refused at start (exit 2) naming the key, without reading past the
/// bound: a WordPiece that looks up words of a trillion characters, a 1 GiB `tokenizer.json`,
/// a 1 GiB `runtime.toml`.
#[test]
fn unfit_tokenizers_and_oversized_files_stop_the_start_with_exit_2() {
    let wordpiece = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
        "normalizer": null, "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": null, "decoder": null,
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 1_000_000_000_000u64,
            "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "a": 3}}
    })
    .to_string();
    let run = |config: &str, tokenizer: Option<&[u8]>, sparse: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runtime.toml");
        std::fs::write(&path, config).unwrap();
        if let Some(t) = tokenizer {
            std::fs::write(dir.path().join("tokenizer.json"), t).unwrap();
        }
        if let Some(name) = sparse {
            let f = std::fs::File::create(dir.path().join(name)).unwrap();
            f.set_len(1 << 30).unwrap();
        }
        let t = Instant::now();
        let out = Command::new(binary())
            .arg("--config")
            .arg(&path)
            .output()
            .unwrap();
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, log) = run(&words_config("", ""), Some(wordpiece.as_bytes()), None);
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("max_input_chars_per_word"), "{log}");
    // A tokenizer with an id past the table its ids index (an added token after the 203 of
    // the vocabulary: id 203, for a table of 203 rows): a text holding it would read past it.
    let mut past: serde_json::Value = serde_json::from_str(&tokenizer()).unwrap();
    past["added_tokens"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"id": 500,
        "content": "<extra>", "single_word": false, "lstrip": false, "rstrip": false,
        "normalized": false, "special": true}));
    let table = words_config("", "").replacen(
        "dim_names = [\"sequence\"]\n",
        "dim_names = [\"sequence\"]\ntable_rows = 203\n",
        1,
    );
    let (code, log) = run(&table, Some(past.to_string().as_bytes()), None);
    assert_eq!(code, Some(2), "{log}");
    assert!(
        log.contains("largest id 203") && log.contains("table for \\\"input_ids\\\" of 203 rows"),
        "{log}"
    );
    let (code, log) = run(&words_config("", ""), None, Some("tokenizer.json"));
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("larger than 67108864 bytes"), "{log}");
    let (code, log) = run("", None, Some("runtime.toml"));
    assert_eq!(code, Some(2), "{log}");
    assert!(log.contains("larger than 1048576 bytes"), "{log}");
}
