//! The text APIs their users already have clients for, over the same batcher, metrics and
//! errors as V2: OpenAI's `POST /v1/embeddings`, and Hugging Face text-embeddings-inference's
//! `POST /embed`, `POST /rerank`, `POST /predict` and `POST /tokenize`.
//!
//! A request's texts are tokenized ([`crate::text::TextModel::encode`]) and queued in pieces
//! of at most `max_batch_size` texts, all at once, so a client batch larger than the model's
//! batch is split and reassembled in order rather than refused; each piece is pooled with the
//! request's own options (`dimensions`, `normalize`).

use crate::error::ApiError;
use crate::http::{self, Counting, Server};
use crate::model::Model;
use crate::text::{PoolOptions, TextModel};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;
use std::time::Instant;

/// Where a text request's time went, for TEI's response headers (`x-tokenization-time`,
/// `x-queue-time`, `x-inference-time`, in milliseconds, and `x-compute-tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Timing {
    pub tokenization: std::time::Duration,
    pub queue: std::time::Duration,
    pub inference: std::time::Duration,
    pub tokens: usize,
}

/// A text API's answer: the body and its timing.
#[derive(Debug, Clone)]
pub struct Reply {
    pub body: Bytes,
    pub timing: Timing,
}

/// One text or several, as both APIs take them.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Input {
    One(String),
    Many(Vec<String>),
}

impl Input {
    fn texts(&self) -> Vec<&str> {
        match self {
            Input::One(s) => vec![s.as_str()],
            Input::Many(v) => v.iter().map(String::as_str).collect(),
        }
    }
}

/// `POST /v1/embeddings` (OpenAI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenAiRequest {
    pub input: Input,
    pub model: String,
    #[serde(default)]
    pub dimensions: Option<usize>,
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Accepted and ignored, as OpenAI does.
    #[serde(default)]
    pub user: Option<String>,
}

/// `POST /embed` (TEI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TeiRequest {
    pub inputs: Input,
    #[serde(default)]
    pub normalize: Option<bool>,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<String>,
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(default)]
    pub dimensions: Option<usize>,
}

/// `POST /tokenize` (TEI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeRequest {
    pub inputs: Input,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
}

fn parse<T: for<'de> Deserialize<'de>>(body: &[u8], what: &str) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("malformed {what} request: {e}")))
}

/// The vectors of `texts` and their token count: tokenized, queued in pieces of at most
/// `max_batch_size`, pooled with `opts`.
pub async fn embed(
    app: &Server,
    model: &Model,
    texts: &[&str],
    opts: PoolOptions,
    start: Instant,
    timing: &mut Timing,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    if model.text_model()?.config().pairs {
        return Err(ApiError::BadRequest(format!(
            "model {:?} scores pairs of texts (a reranker), it makes no embeddings: call /rerank, \
             or V2 with text and text_pair",
            model.name()
        )));
    }
    let items = texts.iter().map(|t| (*t, None)).collect();
    run(app, model, items, opts, start, timing).await
}

/// [`embed`] of single texts or pairs (`None` second: a single text).
pub async fn run(
    app: &Server,
    model: &Model,
    items: Vec<(&str, Option<&str>)>,
    opts: PoolOptions,
    start: Instant,
    timing: &mut Timing,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let text = model.text_model()?;
    if items.is_empty() {
        return Err(ApiError::BadRequest("no texts to embed".into()));
    }
    // The cache sits in front of tokenization; its key holds every text and every option
    // that changes the vectors.
    let key = model.cache().map(|_| {
        let mut k = crate::cache::Key::new("text", model.name(), &model.cfg.model.version);
        k.u64(opts.dimensions.map_or(0, |d| d as u64 + 1))
            .u64(opts.normalize.map_or(0, |n| 1 + u64::from(n)))
            .u64(u64::from(opts.raw))
            .u64(items.len() as u64);
        for (a, b) in &items {
            k.str(a);
            match b {
                Some(b) => k.u64(1).str(b),
                None => k.u64(0),
            };
        }
        k.finish()
    });
    if let Some(crate::cache::Cached::Vectors(v, tokens)) =
        key.as_ref().and_then(|k| model.cached(k))
    {
        return Ok(((*v).clone(), tokens));
    }
    let piece = (model.cfg.batching.max_batch_size as usize).max(1);
    let mut queued = Vec::new();
    let mut tokens = 0;
    for (i, chunk) in items.chunks(piece).enumerate() {
        let t = Instant::now();
        let encoded = model
            .encode_async(chunk.to_vec())
            .await
            .map_err(|e| match e {
                // Name the text by its place in the whole request.
                ApiError::BadRequest(m) if i > 0 => ApiError::BadRequest(format!(
                    "{m} (counting from text {} of the request)",
                    i * piece
                )),
                e => e,
            })?;
        timing.tokenization += t.elapsed();
        tokens += encoded.tokens();
        let pending = http::submit(app, model, encoded.inputs, chunk.len(), None, start)?;
        queued.push((pending, encoded.lengths));
    }
    let mut vectors = Vec::with_capacity(items.len());
    let waiting = Instant::now();
    for (pending, lengths) in queued {
        let answer = pending.wait(app, start).await?;
        timing.inference += answer.compute;
        model
            .metrics
            .overhead_hist
            .observe_duration(start.elapsed().saturating_sub(answer.compute));
        vectors.extend(text.pool(&answer.outputs, &lengths, opts)?);
    }
    timing.queue = waiting.elapsed().saturating_sub(timing.inference);
    timing.tokens = tokens;
    if let Some(k) = key {
        model.remember(
            k,
            crate::cache::Cached::Vectors(std::sync::Arc::new(vectors.clone()), tokens),
        );
    }
    Ok((vectors, tokens))
}

/// `POST /v1/embeddings`: OpenAI's request and response shapes.
pub(crate) async fn openai<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: &[u8],
    start: Instant,
) -> Result<Reply, ApiError> {
    let mut timing = Timing::default();
    let req: OpenAiRequest = parse(body, "embeddings")?;
    let model = counting.for_model(app.model(&req.model)?);
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::BadRequest(format!(
                "encoding_format {other:?} is not one of \"float\", \"base64\""
            )))
        }
    };
    let texts = req.input.texts();
    let opts = PoolOptions {
        dimensions: req.dimensions,
        ..PoolOptions::default()
    };
    let (vectors, tokens) = embed(app, model, &texts, opts, start, &mut timing).await?;
    let data: Vec<serde_json::Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(encode_base64(&bytes))
            } else {
                json!(v)
            };
            json!({ "object": "embedding", "index": i, "embedding": embedding })
        })
        .collect();
    let out = json!({
        "object": "list",
        "data": data,
        "model": model.name(),
        "usage": { "prompt_tokens": tokens, "total_tokens": tokens },
    });
    Ok(Reply {
        body: Bytes::from(out.to_string()),
        timing,
    })
}

/// The one model the TEI routes serve: TEI serves one model per server.
fn tei_model(app: &Server) -> Result<(&Model, &TextModel), ApiError> {
    let mut text = app.models().filter_map(|m| Some((m, m.text()?)));
    match (text.next(), text.next()) {
        (Some(one), None) => Ok(one),
        (None, _) => Err(ApiError::NotFound(
            "no model here takes text (its recipe has no [text] table)".into(),
        )),
        (Some(_), Some(_)) => Err(ApiError::BadRequest(
            "several text models are served here: use /v1/embeddings with \"model\"".into(),
        )),
    }
}

/// `POST /embed`: TEI's request and response shapes (a list of vectors).
pub(crate) async fn tei_embed<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: &[u8],
    start: Instant,
) -> Result<Reply, ApiError> {
    let mut timing = Timing::default();
    let req: TeiRequest = parse(body, "embed")?;
    let (model, text) = tei_model(app)?;
    counting.for_model(model);
    if req.prompt_name.is_some() {
        return Err(ApiError::BadRequest(
            "prompt_name is not supported: the recipe's [text] prefix applies to every text".into(),
        ));
    }
    check_truncation(text, req.truncate, req.truncation_direction.as_deref())?;
    let opts = PoolOptions {
        dimensions: req.dimensions,
        normalize: req.normalize,
        raw: false,
    };
    let (vectors, _) = embed(app, model, &req.inputs.texts(), opts, start, &mut timing).await?;
    Ok(Reply {
        body: Bytes::from(json!(vectors).to_string()),
        timing,
    })
}

/// `POST /rerank` (TEI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RerankRequest {
    pub query: String,
    pub texts: Vec<String>,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub return_text: bool,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<String>,
}

/// `POST /rerank`: every text scored against the query by a cross-encoder, sorted by score
/// (TEI's shape: `[{"index", "score", "text"?}]`).
pub(crate) async fn tei_rerank<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: &[u8],
    start: Instant,
) -> Result<Reply, ApiError> {
    let mut timing = Timing::default();
    let req: RerankRequest = parse(body, "rerank")?;
    let (model, text) = tei_model(app)?;
    counting.for_model(model);
    check_truncation(text, req.truncate, req.truncation_direction.as_deref())?;
    let width = text.hidden();
    if width != 1 {
        return Err(ApiError::BadRequest(format!(
            "model {:?} is not a reranker: /rerank needs one relevance score per pair, it gives {width} values",
            model.name()
        )));
    }
    if req.query.trim().is_empty() {
        return Err(ApiError::BadRequest("query is empty".into()));
    }
    if req.texts.is_empty() {
        return Err(ApiError::BadRequest("texts is empty".into()));
    }
    let items = req
        .texts
        .iter()
        .map(|t| (req.query.as_str(), Some(t.as_str())))
        .collect();
    let opts = PoolOptions {
        raw: req.raw_scores,
        ..PoolOptions::default()
    };
    let (scores, _) = run(app, model, items, opts, start, &mut timing).await?;
    let mut ranked: Vec<(usize, f32)> = scores
        .iter()
        .enumerate()
        .map(|(i, v)| (i, v.first().copied().unwrap_or(f32::NAN)))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let out: Vec<serde_json::Value> = ranked
        .into_iter()
        .map(|(index, score)| {
            let mut v = json!({ "index": index, "score": score });
            if req.return_text {
                v["text"] = json!(req.texts[index]);
            }
            v
        })
        .collect();
    Ok(Reply {
        body: Bytes::from(json!(out).to_string()),
        timing,
    })
}

/// `POST /predict`: a classifier's scores per label, sorted (TEI's shape). `inputs` is one
/// text, one pair `[a, b]` (a pair model), a list of texts, or a list of pairs; one input
/// gets `[{"score", "label"}, …]`, a list gets one such list per input.
pub(crate) async fn tei_predict<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: &[u8],
    start: Instant,
) -> Result<Reply, ApiError> {
    let mut timing = Timing::default();
    let req: serde_json::Value = parse(body, "predict")?;
    let (model, text) = tei_model(app)?;
    counting.for_model(model);
    let pairs = text.config().pairs;
    let bad = || {
        ApiError::BadRequest(if pairs {
            "inputs must be a pair [\"text\", \"text_pair\"] or a list of pairs".into()
        } else {
            "inputs must be a text or a list of texts".into()
        })
    };
    let obj = req.as_object().ok_or_else(bad)?;
    if let Some(k) = obj.keys().find(|k| {
        !["inputs", "raw_scores", "truncate", "truncation_direction"].contains(&k.as_str())
    }) {
        return Err(ApiError::BadRequest(format!(
            "malformed predict request: unknown field `{k}`"
        )));
    }
    let raw = obj
        .get("raw_scores")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    check_truncation(
        text,
        obj.get("truncate").and_then(serde_json::Value::as_bool),
        obj.get("truncation_direction")
            .and_then(serde_json::Value::as_str),
    )?;
    let pair = |v: &serde_json::Value| -> Option<(String, Option<String>)> {
        match v {
            serde_json::Value::String(s) if !pairs => Some((s.clone(), None)),
            serde_json::Value::Array(a) if pairs && a.len() == 2 => {
                Some((a[0].as_str()?.to_owned(), Some(a[1].as_str()?.to_owned())))
            }
            _ => None,
        }
    };
    let inputs = obj.get("inputs").ok_or_else(bad)?;
    let (one, items) = match pair(inputs) {
        Some(p) => (true, vec![p]),
        None => {
            let list = inputs.as_array().ok_or_else(bad)?;
            (
                false,
                list.iter()
                    .map(pair)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(bad)?,
            )
        }
    };
    let borrowed = items
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_deref()))
        .collect();
    let opts = PoolOptions {
        raw,
        ..PoolOptions::default()
    };
    let (scores, _) = run(app, model, borrowed, opts, start, &mut timing).await?;
    let labels = &text.config().labels;
    let ranked: Vec<serde_json::Value> = scores
        .iter()
        .map(|v| {
            let mut by: Vec<(usize, f32)> = v.iter().copied().enumerate().collect();
            by.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            json!(by
                .into_iter()
                .map(|(i, score)| {
                    let label = labels
                        .get(i)
                        .cloned()
                        .unwrap_or_else(|| format!("LABEL_{i}"));
                    json!({ "score": score, "label": label })
                })
                .collect::<Vec<_>>())
        })
        .collect();
    let out = if one {
        ranked[0].clone()
    } else {
        json!(ranked)
    };
    Ok(Reply {
        body: Bytes::from(out.to_string()),
        timing,
    })
}

/// TEI's `truncate` and `truncation_direction`: accepted when they ask for what the recipe
/// serves.
fn check_truncation(
    text: &TextModel,
    truncate: Option<bool>,
    direction: Option<&str>,
) -> Result<(), ApiError> {
    if let Some(d) = direction {
        if !d.eq_ignore_ascii_case("right") {
            return Err(ApiError::BadRequest(format!(
                "truncation_direction {d:?}: only \"Right\" is supported"
            )));
        }
    }
    if let Some(want) = truncate {
        if want != text.config().truncate {
            return Err(ApiError::BadRequest(format!(
                "truncate = {want}: this model is served with truncation {} (the recipe's text.truncate)",
                if text.config().truncate { "on" } else { "off" }
            )));
        }
    }
    Ok(())
}

/// `POST /tokenize`: TEI's shape, one list of tokens per text.
pub fn tei_tokenize(app: &Server, body: &[u8]) -> Result<Reply, ApiError> {
    let req: TokenizeRequest = parse(body, "tokenize")?;
    let (_, text) = tei_model(app)?;
    if req.add_special_tokens == Some(!text.config().special_tokens) {
        return Err(ApiError::BadRequest(format!(
            "add_special_tokens = {}: this model is served with special tokens {}",
            !text.config().special_tokens,
            if text.config().special_tokens {
                "on"
            } else {
                "off"
            }
        )));
    }
    let mut out = Vec::new();
    for t in req.inputs.texts() {
        let tokens = text.tokens(t)?;
        let special: Vec<serde_json::Value> = tokens
            .iter()
            .map(|(id, s, special)| json!({ "id": id, "text": s, "special": special }))
            .collect();
        out.push(special);
    }
    Ok(Reply {
        body: Bytes::from(json!(out).to_string()),
        timing: Timing::default(),
    })
}

/// Standard base64 with padding (RFC 4648), as OpenAI's `encoding_format = "base64"`.
fn encode_base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(ALPHABET[((n >> shift) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_rfc_4648() {
        for (raw, want) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foobar", "Zm9vYmFy"),
            (&[0xff, 0xfe, 0xfd, 0x00][..], "//79AA=="),
        ] {
            assert_eq!(encode_base64(raw), want);
        }
    }

    #[test]
    fn requests_take_one_text_or_a_list_and_refuse_unknown_fields() {
        let r: OpenAiRequest = parse(br#"{"input":"a","model":"m"}"#, "embeddings").unwrap();
        assert_eq!(r.input.texts(), ["a"]);
        let r: TeiRequest = parse(br#"{"inputs":["a","b"],"normalize":false}"#, "embed").unwrap();
        assert_eq!(r.inputs.texts(), ["a", "b"]);
        let e = parse::<OpenAiRequest>(br#"{"input":[1,2],"model":"m"}"#, "embeddings")
            .err()
            .unwrap();
        assert!(
            e.to_string().contains("malformed embeddings request"),
            "{e}"
        );
        let e = parse::<TeiRequest>(br#"{"inputs":"a","pooling":"max"}"#, "embed")
            .err()
            .unwrap();
        assert!(e.to_string().contains("unknown field `pooling`"), "{e}");
    }
}
