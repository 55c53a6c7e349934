//! The text APIs their users already have clients for: OpenAI's `POST /v1/embeddings`, and
//! Hugging Face text-embeddings-inference's `POST /embed`, `POST /rerank`, `POST /predict` and
//! `POST /tokenize`. A transport only: each route decodes its request (the texts bounded while
//! they are parsed, [`Texts`]), hands the work to [`crate::core`], the path V2 requests take
//! too, and encodes the answer in the API's shape.

use crate::budget::Reservation;
use crate::core::{self, Counting, Item, Output, Request, Timing, Work};
use crate::error::ApiError;
use crate::model::Model;
use crate::server::Server;
use crate::text::{PoolOptions, TextModel};
use bytes::Bytes;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Instant;

/// A text API's answer: the body, its timing, and the request's charge against the memory
/// budget (held until the answer is on its way).
#[derive(Debug)]
pub(crate) struct Reply {
    pub body: Bytes,
    pub timing: Timing,
    #[allow(
        dead_code,
        reason = "held, not read: dropping it returns the request's bytes to the budget"
    )]
    pub charge: Option<Reservation>,
}

thread_local! {
    /// The most texts a [`Texts`] being parsed on this thread takes, and whether a request
    /// had more (set around one parse by [`parse`]).
    static PARSE_LIMIT: Cell<usize> = const { Cell::new(usize::MAX) };
    static PARSE_EXCEEDED: Cell<bool> = const { Cell::new(false) };
}

/// One text or a list of texts, as the text APIs take them. Parsing stops at the first text
/// past the route's bound (`text.max_client_batch_size`), so a request of a million texts
/// costs no more than one at the bound; anything but a string or a list of strings is refused
/// in plain words.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Texts(pub Vec<String>);

impl<'de> Deserialize<'de> for Texts {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Texts, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Texts;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string or a list of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Texts, E> {
                Ok(Texts(vec![s.to_owned()]))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Texts, E> {
                Ok(Texts(vec![s]))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Texts, A::Error> {
                let limit = PARSE_LIMIT.with(Cell::get);
                let mut v = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(limit).min(1024));
                while let Some(s) = seq.next_element::<String>()? {
                    if v.len() == limit {
                        PARSE_EXCEEDED.with(|e| e.set(true));
                        return Err(de::Error::custom("too many texts"));
                    }
                    v.push(s);
                }
                Ok(Texts(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// `/predict`'s `inputs`: a text, a list of texts, a pair `[a, b]` or a list of pairs; which
/// of a list's shapes it is depends on the model (`PredictInputs::items`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PredictInputs {
    One(String),
    List(Vec<Texts>),
}

impl<'de> Deserialize<'de> for PredictInputs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PredictInputs, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PredictInputs;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a text, a list of texts, a pair [text, text_pair] or a list of pairs")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PredictInputs, E> {
                Ok(PredictInputs::One(s.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PredictInputs, A::Error> {
                let limit = PARSE_LIMIT.with(Cell::get);
                let mut v = Vec::new();
                while let Some(t) = seq.next_element::<Texts>()? {
                    if v.len() == limit {
                        PARSE_EXCEEDED.with(|e| e.set(true));
                        return Err(de::Error::custom("too many texts"));
                    }
                    v.push(t);
                }
                Ok(PredictInputs::List(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl PredictInputs {
    /// The items to score, and whether the request sent one input (answered with one list of
    /// scores, not a list of them): for a pair model `[a, b]` is one pair and a list holds
    /// pairs; for another, a list holds texts.
    fn items(self, pairs: bool) -> Result<(bool, Vec<Item>), ApiError> {
        let bad = || {
            ApiError::BadRequest(if pairs {
                "inputs must be a pair [\"text\", \"text_pair\"] or a list of pairs".into()
            } else {
                "inputs must be a text or a list of texts".into()
            })
        };
        let pair = |t: Texts| match <[String; 2]>::try_from(t.0) {
            Ok([a, b]) => Ok((a, Some(b))),
            Err(_) => Err(bad()),
        };
        match self {
            PredictInputs::One(s) if !pairs => Ok((true, vec![(s, None)])),
            PredictInputs::One(_) => Err(bad()),
            PredictInputs::List(list) if pairs => {
                // One pair: two strings. A list of pairs: lists of two.
                if list.len() == 2 && list.iter().all(|t| t.0.len() == 1) {
                    let mut it = list.into_iter().flat_map(|t| t.0);
                    return match (it.next(), it.next()) {
                        (Some(a), Some(b)) => Ok((true, vec![(a, Some(b))])),
                        _ => Err(bad()),
                    };
                }
                Ok((false, list.into_iter().map(pair).collect::<Result<_, _>>()?))
            }
            PredictInputs::List(list) => {
                let mut items = Vec::with_capacity(list.len());
                for t in list {
                    match <[String; 1]>::try_from(t.0) {
                        Ok([s]) => items.push((s, None)),
                        Err(_) => return Err(bad()),
                    }
                }
                Ok((false, items))
            }
        }
    }
}

/// `dimensions`: a whole number of dimensions (checked against the model's vector length
/// later), `null` for none; anything else refused naming the key and the value.
fn dimensions<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => Err(de::Error::custom(format!(
                "dimensions {v} is not a number of dimensions (a whole number from 1 to the model's vector length)"
            ))),
        },
    }
}

/// `POST /v1/embeddings` (OpenAI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OpenAiRequest {
    pub input: Texts,
    pub model: String,
    #[serde(default, deserialize_with = "dimensions")]
    pub dimensions: Option<u32>,
    #[serde(default)]
    pub encoding_format: Option<String>,
    /// Accepted and ignored, as OpenAI does.
    #[serde(default)]
    #[allow(dead_code, reason = "accepted and ignored, as OpenAI does")]
    pub user: Option<String>,
}

/// `POST /embed` (TEI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TeiRequest {
    pub inputs: Texts,
    #[serde(default)]
    pub normalize: Option<bool>,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<String>,
    #[serde(default)]
    pub prompt_name: Option<String>,
    #[serde(default, deserialize_with = "dimensions")]
    pub dimensions: Option<u32>,
}

/// `POST /tokenize` (TEI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenizeRequest {
    pub inputs: Texts,
    #[serde(default)]
    pub add_special_tokens: Option<bool>,
}

/// `POST /rerank` (TEI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RerankRequest {
    pub query: String,
    pub texts: Texts,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub return_text: bool,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<String>,
}

/// `POST /predict` (TEI).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PredictRequest {
    pub inputs: PredictInputs,
    #[serde(default)]
    pub raw_scores: bool,
    #[serde(default)]
    pub truncate: Option<bool>,
    #[serde(default)]
    pub truncation_direction: Option<String>,
}

/// Parses a text API's request, at most `limit` texts: past it a 413 naming
/// `text.max_client_batch_size`, before the rest is parsed; a malformed body a 400 saying what
/// was wrong.
pub(crate) fn parse<T: for<'de> Deserialize<'de>>(
    body: &[u8],
    what: &str,
    limit: usize,
) -> Result<T, ApiError> {
    PARSE_LIMIT.with(|l| l.set(limit));
    PARSE_EXCEEDED.with(|e| e.set(false));
    let parsed = serde_json::from_slice(body);
    let exceeded = PARSE_EXCEEDED.with(Cell::take);
    PARSE_LIMIT.with(|l| l.set(usize::MAX));
    parsed.map_err(|e| {
        if exceeded {
            ApiError::TooLarge(format!(
                "more than {limit} texts in one request, the most the model takes (text.max_client_batch_size): send them in several requests"
            ))
        } else {
            ApiError::BadRequest(format!("malformed {what} request: {e}"))
        }
    })
}

/// Decodes a body on the server's workers when it is large ([`core::decode`]).
async fn decode<T: for<'de> Deserialize<'de> + Send + 'static>(
    app: &Server,
    body: Bytes,
    what: &'static str,
    limit: usize,
) -> Result<T, ApiError> {
    core::decode(app, body, move |b| parse(b, what, limit)).await
}

/// The most texts any text model here takes in one request (OpenAI's route names its model in
/// the body, after the texts perhaps).
fn largest_limit(app: &Server) -> usize {
    app.models()
        .filter_map(Model::text)
        .map(|t| t.config().max_client_batch_size as usize)
        .max()
        .unwrap_or(1)
}

/// A text route's request for the core.
fn texts_request(
    model: &Model,
    items: Vec<Item>,
    opts: PoolOptions,
    start: Instant,
    charge: Reservation,
) -> Request<'_> {
    Request {
        model,
        work: Work::Texts { items, opts },
        timeout_us: None,
        start,
        charge,
    }
}

/// The vectors of a text route's request.
async fn vectors(
    app: &Server,
    req: Request<'_>,
) -> Result<(Arc<Vec<Vec<f32>>>, Timing, Reservation), ApiError> {
    let answer = core::infer(app, req).await?;
    match answer.output {
        Output::Vectors(v) => Ok((v, answer.timing, answer.charge)),
        Output::Tensors(_) | Output::Found(_) => Err(ApiError::Internal(
            "the core answered a text request with tensors".into(),
        )),
    }
}

/// The 400 of an embedding route on a pair model (a reranker).
fn no_embeddings(model: &Model) -> ApiError {
    ApiError::BadRequest(format!(
        "model {:?} scores pairs of texts (a reranker), it makes no embeddings: call /rerank, or V2 with text and text_pair",
        model.name()
    ))
}

/// One embedding of OpenAI's answer.
#[derive(Serialize)]
struct OpenAiEmbedding<'a> {
    object: &'static str,
    index: usize,
    embedding: Embedding<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Embedding<'a> {
    Floats(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
struct OpenAiUsage {
    prompt_tokens: usize,
    total_tokens: usize,
}

#[derive(Serialize)]
struct OpenAiResponse<'a> {
    object: &'static str,
    data: Vec<OpenAiEmbedding<'a>>,
    model: &'a str,
    usage: OpenAiUsage,
}

fn to_json(v: &impl Serialize) -> Result<Bytes, ApiError> {
    serde_json::to_vec(v)
        .map(Bytes::from)
        .map_err(|e| ApiError::Internal(format!("encoding the answer: {e}")))
}

/// `POST /v1/embeddings`: OpenAI's request and response shapes.
pub(crate) async fn openai<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: Bytes,
    start: Instant,
    charge: Reservation,
) -> Result<Reply, ApiError> {
    let req: OpenAiRequest = decode(app, body, "embeddings", largest_limit(app)).await?;
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
    if model.text_model()?.config().pairs {
        return Err(no_embeddings(model));
    }
    let opts = PoolOptions {
        dimensions: req.dimensions,
        ..PoolOptions::default()
    };
    let items = req.input.0.into_iter().map(|t| (t, None)).collect();
    let (vectors, timing, charge) =
        vectors(app, texts_request(model, items, opts, start, charge)).await?;
    let data = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| OpenAiEmbedding {
            object: "embedding",
            index,
            embedding: if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                Embedding::Base64(encode_base64(&bytes))
            } else {
                Embedding::Floats(v)
            },
        })
        .collect();
    let body = to_json(&OpenAiResponse {
        object: "list",
        data,
        model: model.name(),
        usage: OpenAiUsage {
            prompt_tokens: timing.tokens,
            total_tokens: timing.tokens,
        },
    })?;
    Ok(Reply {
        body,
        timing,
        charge: Some(charge),
    })
}

/// The one model the TEI routes serve: TEI serves one model per server.
pub(crate) fn tei_model(app: &Server) -> Result<(&Model, &TextModel), ApiError> {
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
    body: Bytes,
    start: Instant,
    charge: Reservation,
) -> Result<Reply, ApiError> {
    let (model, text) = tei_model(app)?;
    counting.for_model(model);
    let limit = text.config().max_client_batch_size as usize;
    let req: TeiRequest = decode(app, body, "embed", limit).await?;
    if req.prompt_name.is_some() {
        return Err(ApiError::BadRequest(
            "prompt_name is not supported: the recipe's [text] prefix applies to every text".into(),
        ));
    }
    if text.config().pairs {
        return Err(no_embeddings(model));
    }
    check_truncation(text, req.truncate, req.truncation_direction.as_deref())?;
    let opts = PoolOptions {
        dimensions: req.dimensions,
        normalize: req.normalize,
        raw: false,
    };
    let items = req.inputs.0.into_iter().map(|t| (t, None)).collect();
    let (vectors, timing, charge) =
        vectors(app, texts_request(model, items, opts, start, charge)).await?;
    Ok(Reply {
        body: to_json(&*vectors)?,
        timing,
        charge: Some(charge),
    })
}

#[derive(Serialize)]
struct Rank<'a> {
    index: usize,
    score: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    text: Option<&'a str>,
}

/// `POST /rerank`: every text scored against the query by a cross-encoder, sorted by score
/// (TEI's shape: `[{"index", "score", "text"?}]`).
pub(crate) async fn tei_rerank<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: Bytes,
    start: Instant,
    charge: Reservation,
) -> Result<Reply, ApiError> {
    let (model, text) = tei_model(app)?;
    counting.for_model(model);
    let limit = text.config().max_client_batch_size as usize;
    let req: RerankRequest = decode(app, body, "rerank", limit).await?;
    check_truncation(text, req.truncate, req.truncation_direction.as_deref())?;
    let width = text.hidden();
    if !text.config().pairs || width != 1 {
        return Err(ApiError::BadRequest(format!(
            "model {:?} is not a reranker: /rerank needs a pair model (text.pairs) with one relevance score per pair, it gives {width} values{}",
            model.name(),
            if text.config().pairs { "" } else { " for single texts: call /embed" }
        )));
    }
    if req.query.is_empty() {
        return Err(ApiError::BadRequest("query is empty".into()));
    }
    if req.texts.0.is_empty() {
        return Err(ApiError::BadRequest("texts is empty".into()));
    }
    let items = req
        .texts
        .0
        .iter()
        .map(|t| (req.query.clone(), Some(t.clone())))
        .collect();
    let opts = PoolOptions {
        raw: req.raw_scores,
        ..PoolOptions::default()
    };
    let (scores, timing, charge) =
        vectors(app, texts_request(model, items, opts, start, charge)).await?;
    let mut ranked: Vec<(usize, f32)> = scores
        .iter()
        .enumerate()
        .map(|(i, v)| (i, v.first().copied().unwrap_or(f32::NAN)))
        .collect();
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let out: Vec<Rank<'_>> = ranked
        .into_iter()
        .map(|(index, score)| Rank {
            index,
            score,
            text: req.return_text.then(|| req.texts.0[index].as_str()),
        })
        .collect();
    Ok(Reply {
        body: to_json(&out)?,
        timing,
        charge: Some(charge),
    })
}

#[derive(Serialize)]
struct Prediction<'a> {
    score: f32,
    label: std::borrow::Cow<'a, str>,
}

/// `POST /predict`: a classifier's scores per label, sorted (TEI's shape). `inputs` is one
/// text, one pair `[a, b]` (a pair model), a list of texts, or a list of pairs; one input
/// gets `[{"score", "label"}, …]`, a list gets one such list per input. A model without an
/// activation or labels makes embeddings, not predictions: 400 pointing to `/embed`.
pub(crate) async fn tei_predict<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: Bytes,
    start: Instant,
    charge: Reservation,
) -> Result<Reply, ApiError> {
    let (model, text) = tei_model(app)?;
    counting.for_model(model);
    let cfg = text.config();
    if cfg.activation == infer_spec::text::Activation::None && cfg.labels.is_empty() {
        return Err(ApiError::BadRequest(format!(
            "model {:?} makes embeddings, not predictions (its recipe's [text] has no activation and no labels): call /embed",
            model.name()
        )));
    }
    let limit = cfg.max_client_batch_size as usize;
    let req: PredictRequest = decode(app, body, "predict", limit).await?;
    check_truncation(text, req.truncate, req.truncation_direction.as_deref())?;
    let (one, items) = req.inputs.items(cfg.pairs)?;
    let opts = PoolOptions {
        raw: req.raw_scores,
        ..PoolOptions::default()
    };
    let (scores, timing, charge) =
        vectors(app, texts_request(model, items, opts, start, charge)).await?;
    let labels = &cfg.labels;
    let ranked: Vec<Vec<Prediction<'_>>> = scores
        .iter()
        .map(|v| {
            let mut by: Vec<(usize, f32)> = v.iter().copied().enumerate().collect();
            by.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            by.into_iter()
                .map(|(i, score)| Prediction {
                    score,
                    label: labels
                        .get(i)
                        .map(|l| l.as_str().into())
                        .unwrap_or_else(|| format!("LABEL_{i}").into()),
                })
                .collect()
        })
        .collect();
    let body = if one {
        to_json(&ranked[0])?
    } else {
        to_json(&ranked)?
    };
    Ok(Reply {
        body,
        timing,
        charge: Some(charge),
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

/// `POST /tokenize`: TEI's shape, one list of tokens per text, each with the text it covers.
pub(crate) async fn tei_tokenize<'a>(
    app: &'a Server,
    counting: &Counting<'a>,
    body: Bytes,
    start: Instant,
    charge: Reservation,
) -> Result<Reply, ApiError> {
    let (model, text) = tei_model(app)?;
    counting.for_model(model);
    let limit = text.config().max_client_batch_size as usize;
    let req: TokenizeRequest = decode(app, body, "tokenize", limit).await?;
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
    let t = Instant::now();
    let (tokens, charge) = core::tokenize(app, model, req.inputs.0, start, charge).await?;
    Ok(Reply {
        body: to_json(&tokens)?,
        timing: Timing {
            tokenization: t.elapsed(),
            tokens: tokens.iter().map(Vec::len).sum(),
            ..Timing::default()
        },
        charge: Some(charge),
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
    fn requests_take_one_text_or_a_list_and_refuse_unknown_fields_in_plain_words() {
        let r: OpenAiRequest = parse(br#"{"input":"a","model":"m"}"#, "embeddings", 8).unwrap();
        assert_eq!(r.input.0, ["a"]);
        let r: TeiRequest =
            parse(br#"{"inputs":["a","b"],"normalize":false}"#, "embed", 8).unwrap();
        assert_eq!(r.inputs.0, ["a", "b"]);
        for (body, says) in [
            (&br#"{"input":[1,2],"model":"m"}"#[..], "expected a string"),
            (
                br#"{"input":null,"model":"m"}"#,
                "expected a string or a list of strings",
            ),
            (
                br#"{"input":7,"model":"m"}"#,
                "expected a string or a list of strings",
            ),
            (
                br#"{"input":"a","model":"m","dimensions":18446744073709551615}"#,
                "dimensions",
            ),
            (
                br#"{"input":"a","model":"m","dimensions":-1}"#,
                "dimensions",
            ),
        ] {
            let e = parse::<OpenAiRequest>(body, "embeddings", 8).err().unwrap();
            assert!(
                matches!(e, ApiError::BadRequest(_)) && e.to_string().contains(says),
                "{e}"
            );
            assert!(!e.to_string().contains("untagged"), "{e}");
        }
        let e = parse::<TeiRequest>(br#"{"inputs":"a","pooling":"max"}"#, "embed", 8)
            .err()
            .unwrap();
        assert!(e.to_string().contains("unknown field `pooling`"), "{e}");
    }

    #[test]
    fn parsing_stops_at_the_first_text_past_the_bound() {
        let body = format!("{{\"inputs\":[{}]}}", vec!["\"a\""; 100_000].join(","));
        let e = parse::<TeiRequest>(body.as_bytes(), "embed", 32)
            .err()
            .unwrap();
        assert!(matches!(e, ApiError::TooLarge(_)), "{e:?}");
        assert!(
            e.to_string().contains("more than 32 texts")
                && e.to_string().contains("text.max_client_batch_size"),
            "{e}"
        );
        // The bound is the parse's own: the next parse on this thread is not bounded by it.
        assert!(parse::<TeiRequest>(br#"{"inputs":["a","b"]}"#, "embed", 1000).is_ok());
    }

    #[test]
    fn predict_inputs_are_read_by_the_model_they_are_for() {
        let p = |body: &str| parse::<PredictRequest>(body.as_bytes(), "predict", 8).unwrap();
        let one = p(r#"{"inputs":"a"}"#).inputs;
        assert_eq!(
            one.clone().items(false).unwrap(),
            (true, vec![("a".into(), None)])
        );
        assert!(one.items(true).is_err());
        let pair = p(r#"{"inputs":["q","d"]}"#).inputs;
        assert_eq!(
            pair.clone().items(true).unwrap(),
            (true, vec![("q".into(), Some("d".into()))])
        );
        assert_eq!(pair.items(false).unwrap().1.len(), 2);
        let pairs = p(r#"{"inputs":[["q","d"],["q","e"]]}"#).inputs;
        assert_eq!(pairs.clone().items(true).unwrap().1.len(), 2);
        assert!(pairs.items(false).is_err());
    }
}
