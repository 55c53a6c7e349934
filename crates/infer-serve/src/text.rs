//! Text in: the tokenizer in front of a model's engine and the pooling after it, as
//! `runtime.toml`'s `[text]` says ([`infer_spec::text::Text`]).
//!
//! A text model serves one `text` input (`BYTES`) instead of its engine's token tensors. Each
//! text (or pair) becomes one item of the batcher's queue ([`crate::core`]): [`TextModel::encode`]
//! turns it into the engine's inputs (ids, attention mask, token type ids; `[1, tokens]`), the
//! batcher pads items of different lengths into one batch, and on the backend thread
//! [`TextModel`]'s [`crate::batcher::Reduce`] pools each item's rows back into one vector
//! (mean under its own tokens, first or last token, or the model's own pooled output), so a
//! batch's padded hidden states never leave the backend thread. [`TextModel::finish`] then
//! applies a request's options (fewer dimensions, L2 normalisation) and the activation.
//!
//! **Long texts are cut before they are tokenized.** Tokenizing costs time and about a hundred
//! bytes of memory per byte of text, and a model reads at most `max_length` tokens. With
//! truncation on, a text longer than [`SHORT_BYTES_PER_TOKEN`] `x max_length` bytes is cut
//! there (at the last whitespace before it, so no word is split) and tokenized; when that cut
//! holds fewer than `max_length` tokens (a text of very long words or much whitespace), it is
//! cut at [`LONG_BYTES_PER_TOKEN`] `x max_length` bytes instead. The tokens the model gets are
//! those of the whole text truncated to `max_length` whenever the cut holds at least
//! `max_length` tokens (tokenizers split at whitespace, so the words before a cut tokenize as
//! in the whole text). With truncation off, a text longer than the long bound is refused with
//! 413 before tokenizing. The Rust `tokenizers` crate with its pure-Rust regex engine (no
//! oniguruma: the runtime stays a static binary).

use crate::error::ApiError;
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::text::{Activation, Pooling, Text};
use infer_spec::{DataType, RuntimeConfig, TensorSpec};
use tokenizers::{Encoding, Tokenizer, TruncationParams};

/// Bytes of text per token of `max_length` a text is first cut at (truncation on).
pub(crate) const SHORT_BYTES_PER_TOKEN: usize = 16;
/// Bytes of text per token of `max_length` a text is cut at when the first cut holds too few
/// tokens; with truncation off, the longest text taken.
pub(crate) const LONG_BYTES_PER_TOKEN: usize = 128;

/// Bytes of memory tokenizing one byte of text takes at its peak (the normalised copy, its
/// alignments, the pre-tokenized splits and the tokens), measured on all-MiniLM-L6-v2's
/// WordPiece and WordLlama's BPE (about 77 and 60); what admission charges for it.
pub(crate) const TOKENIZE_BYTES_PER_BYTE: u64 = 96;

/// What an engine input receives from the tokenizer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    Ids,
    Mask,
    TypeIds,
}

/// A loaded `[text]` section: the tokenizer and where its tensors go.
pub struct TextModel {
    cfg: Text,
    /// The tokenizer with the section's truncation: adds the special tokens and truncates.
    tokenizer: Tokenizer,
    /// The same without truncation: tokenizes a (cut) text into all its tokens.
    counter: Tokenizer,
    /// The id padding positions get (the tokenizer's pad token, else 0; the mask hides them).
    pad_id: i64,
    /// Per engine input, in the engine's order: what it receives and its integer type.
    fills: Vec<(Fill, DataType)>,
    /// The engine output the answer comes from.
    output: usize,
    /// The output's last dimension.
    hidden: usize,
    served_inputs: Vec<TensorSpec>,
    served_outputs: Vec<TensorSpec>,
}

/// One text (or pair) as the engine takes it: one row.
#[derive(Debug)]
pub struct Encoded {
    /// The engine's inputs, `[1, tokens]`.
    pub inputs: Vec<Tensor>,
    /// Its tokens (the row's length).
    pub tokens: usize,
}

/// Per-request choices of the embedding APIs that change the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PoolOptions {
    /// Keep only the first this many dimensions (Matryoshka-trained models), before
    /// normalising.
    pub dimensions: Option<u32>,
    /// Override `[text] normalize`.
    pub normalize: Option<bool>,
    /// Leave out `[text] activation`: the logits as they are (TEI's `raw_scores`).
    pub raw: bool,
}

/// One token as `/tokenize` shows it (TEI's shape): a special token's own string, else the
/// text it covers, with its character offsets.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Token {
    pub id: u32,
    pub text: String,
    pub special: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<usize>,
}

impl TextModel {
    /// Loads the tokenizer `[text]` names (relative to `base`, the config's directory; read
    /// up to [`infer_spec::text::MAX_TOKENIZER_BYTES`]) and checks the section against the
    /// engine's tensors. `Ok(None)`: the model takes tensors.
    pub fn load(
        cfg: &RuntimeConfig,
        base: &std::path::Path,
    ) -> Result<Option<TextModel>, LoadError> {
        let Some(text) = &cfg.text else {
            return Ok(None);
        };
        let path = base.join(&text.tokenizer);
        let bytes = match read_bounded(&path, infer_spec::text::MAX_TOKENIZER_BYTES) {
            Ok(b) => b,
            Err(Bounded::TooLarge(e)) => {
                return Err(LoadError::Refused(format!("{}: {e}", path.display())))
            }
            Err(Bounded::Io(e)) => return Err(LoadError::Read(format!("{}: {e}", path.display()))),
        };
        TextModel::new(cfg, text, &bytes)
            .map(Some)
            .map_err(|e| LoadError::Refused(format!("{}: {e}", path.display())))
    }

    /// A text model from the tokenizer's JSON: refused when tokenizing with it could cost
    /// more than linear time ([`infer_spec::text::tokenizer_problems`]) or when one of its ids
    /// is past the table the ids input indexes (`table_rows`).
    pub fn new(cfg: &RuntimeConfig, text: &Text, tokenizer: &[u8]) -> Result<TextModel, String> {
        let problems = text.problems(&cfg.inputs, &cfg.outputs);
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let json: serde_json::Value = serde_json::from_slice(tokenizer)
            .map_err(|e| format!("not a tokenizer.json this runtime reads: {e}"))?;
        let unfit = infer_spec::text::tokenizer_problems(&json);
        if !unfit.is_empty() {
            return Err(format!("refused: {}", unfit.join("; ")));
        }
        drop(json);
        let mut counter = Tokenizer::from_bytes(tokenizer)
            .map_err(|e| format!("not a tokenizer.json this runtime reads: {e}"))?;
        let pad_id = counter.get_padding().map_or(0, |p| i64::from(p.pad_id));
        counter.with_padding(None);
        counter
            .with_truncation(None)
            .map_err(|e| format!("no truncation: {e}"))?;
        if let Some(rows) = cfg
            .inputs
            .iter()
            .find(|t| t.name == text.input_ids)
            .and_then(|t| t.table_rows)
        {
            let vocab = counter.get_vocab(true);
            if let Some((token, &id)) = vocab.iter().max_by_key(|(_, &id)| id) {
                if u64::from(id) >= rows {
                    return Err(format!(
                        "its largest id {id} (token {token:?}) is past the model's table for {:?} of {rows} rows (another model's tokenizer?)",
                        text.input_ids
                    ));
                }
            }
        }
        let mut truncating = counter.clone();
        let truncation = text.truncate.then(|| TruncationParams {
            max_length: text.max_length as usize,
            ..TruncationParams::default()
        });
        truncating
            .with_truncation(truncation)
            .map_err(|e| format!("truncation to {} tokens: {e}", text.max_length))?;
        let fills = cfg
            .inputs
            .iter()
            .map(|t| {
                let fill = if t.name == text.input_ids {
                    Fill::Ids
                } else if text.attention_mask.as_deref() == Some(t.name.as_str()) {
                    Fill::Mask
                } else {
                    Fill::TypeIds
                };
                (fill, t.datatype)
            })
            .collect();
        let output = cfg
            .outputs
            .iter()
            .position(|t| t.name == text.output)
            .ok_or("no such output")?;
        let (served_inputs, served_outputs) = text.served(&cfg.outputs).ok_or("no such output")?;
        let hidden = served_outputs[0].dims[1] as usize;
        Ok(TextModel {
            cfg: text.clone(),
            tokenizer: truncating,
            counter,
            pad_id,
            fills,
            output,
            hidden,
            served_inputs,
            served_outputs,
        })
    }

    pub fn config(&self) -> &Text {
        &self.cfg
    }

    /// The served inputs (`text`).
    pub fn served_inputs(&self) -> &[TensorSpec] {
        &self.served_inputs
    }

    /// The served outputs (the pooled vector).
    pub fn served_outputs(&self) -> &[TensorSpec] {
        &self.served_outputs
    }

    /// The value padding positions of each engine input get.
    pub fn pad_values(&self) -> Vec<i64> {
        self.fills.iter().map(|&(f, _)| self.pad(f)).collect()
    }

    /// The value padding positions of an input get: the pad id for ids, 0 for masks and type
    /// ids.
    fn pad(&self, fill: Fill) -> i64 {
        if fill == Fill::Ids {
            self.pad_id
        } else {
            0
        }
    }

    /// The served vector's length.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The most tokens one text becomes (`max_length`).
    pub fn max_length(&self) -> usize {
        self.cfg.max_length as usize
    }

    /// The most bytes of one text that are tokenized: the long cut with truncation on (see the
    /// module docs), the longest text taken with truncation off.
    pub fn max_text_bytes(&self) -> usize {
        LONG_BYTES_PER_TOKEN.saturating_mul(self.max_length())
    }

    /// The engine inputs' bytes per token (what one token of a queued item holds).
    pub fn bytes_per_token(&self) -> usize {
        self.fills.iter().map(|&(_, d)| d.size().unwrap_or(8)).sum()
    }

    /// The texts of a `text` tensor (`BYTES`, one per row) named `name`: each must be UTF-8.
    pub fn texts<'t>(t: &'t Tensor, name: &str) -> Result<Vec<&'t str>, ApiError> {
        crate::tensor::BytesElements::new(&t.data)
            .enumerate()
            .map(|(i, element)| {
                let element = element.map_err(|_| {
                    ApiError::BadRequest(format!("input {name:?}: a truncated BYTES element"))
                })?;
                std::str::from_utf8(element).map_err(|e| {
                    ApiError::BadRequest(format!("input {name:?}: element {i} is not UTF-8 ({e})"))
                })
            })
            .collect()
    }

    /// Whether the model takes pairs, checked against what a request sends: single texts
    /// (`pairs` false) or pairs (true).
    pub fn check_pairs(&self, pairs: bool) -> Result<(), ApiError> {
        match (self.cfg.pairs, pairs) {
            (true, false) => Err(ApiError::BadRequest(
                "this model scores pairs of texts (a query and a passage): send text and text_pair"
                    .into(),
            )),
            (false, true) => Err(ApiError::BadRequest(
                "this model takes single texts, not pairs (its recipe's text.pairs is false)"
                    .into(),
            )),
            _ => Ok(()),
        }
    }

    /// The part of `text` (text `i` of its request) that is tokenized: all of it when short,
    /// else cut as the module docs say; with truncation off a text over the long bound is a
    /// 413. `offsets`: the tokens carry character offsets (for `/tokenize`).
    fn content(&self, i: usize, text: &str, offsets: bool) -> Result<Encoding, ApiError> {
        let max = self.max_length();
        let short = SHORT_BYTES_PER_TOKEN.saturating_mul(max);
        let long = self.max_text_bytes();
        let tokenize = |t: &str| -> Result<Encoding, ApiError> {
            let prefixed: std::borrow::Cow<'_, str> = if self.cfg.prefix.is_empty() {
                t.into()
            } else {
                format!("{}{t}", self.cfg.prefix).into()
            };
            let e = if offsets {
                self.counter.encode_char_offsets(prefixed.as_ref(), false)
            } else {
                self.counter.encode_fast(prefixed.as_ref(), false)
            };
            e.map_err(|e| ApiError::BadRequest(format!("text {i}: cannot tokenize: {e}")))
        };
        if text.len() <= short {
            return tokenize(text);
        }
        if !self.cfg.truncate {
            if text.len() > long {
                return Err(ApiError::TooLarge(format!(
                    "text {i} is {} bytes; with truncation off (text.truncate) a text may have at most {long} bytes ({LONG_BYTES_PER_TOKEN} per token of text.max_length {max})",
                    text.len()
                )));
            }
            return tokenize(text);
        }
        let first = tokenize(cut(text, short))?;
        if first.len() >= max {
            return Ok(first);
        }
        tokenize(cut(text, long))
    }

    /// Tokenizes text `i` of a request (and its pair) into the engine's inputs, one row. An
    /// empty text is refused (TEI's rule: any other text, whitespace only included, is
    /// tokenized), as is one that becomes no tokens, or more than `max_length` with truncation
    /// off.
    pub fn encode(&self, i: usize, text: &str, pair: Option<&str>) -> Result<Encoded, ApiError> {
        let e = self.encoding(i, text, pair, false)?;
        let n = e.get_ids().len();
        let inputs = self
            .fills
            .iter()
            .map(|&(fill, dtype)| {
                let values: &[u32] = match fill {
                    Fill::Ids => e.get_ids(),
                    Fill::Mask => e.get_attention_mask(),
                    Fill::TypeIds => e.get_type_ids(),
                };
                let mut data = Vec::with_capacity(n * dtype.size().unwrap_or(8));
                for &v in values {
                    match dtype {
                        DataType::I32 => data.extend_from_slice(&(v as i32).to_le_bytes()),
                        _ => data.extend_from_slice(&i64::from(v).to_le_bytes()),
                    }
                }
                Tensor {
                    dtype,
                    shape: vec![1, n],
                    data: Bytes::from(data),
                }
            })
            .collect();
        Ok(Encoded { inputs, tokens: n })
    }

    /// The tokens of text `i` (and its pair) as the engine gets them: cut, special tokens
    /// added, truncated to `max_length`.
    fn encoding(
        &self,
        i: usize,
        text: &str,
        pair: Option<&str>,
        offsets: bool,
    ) -> Result<Encoding, ApiError> {
        if text.is_empty() || pair == Some("") {
            return Err(ApiError::BadRequest(format!("text {i} is empty")));
        }
        let first = self.content(i, text, offsets)?;
        let second = pair.map(|p| self.content(i, p, offsets)).transpose()?;
        let e = self
            .tokenizer
            .post_process(first, second, self.cfg.special_tokens)
            .map_err(|e| ApiError::BadRequest(format!("text {i}: cannot tokenize: {e}")))?;
        let n = e.get_ids().len();
        if n == 0 {
            return Err(ApiError::BadRequest(format!("text {i} has no tokens")));
        }
        if n > self.max_length() {
            return Err(ApiError::BadRequest(format!(
                "text {i} is {n} tokens, more than the model's {} (truncation is off)",
                self.cfg.max_length
            )));
        }
        Ok(e)
    }

    /// The tokens of text `i` as `/tokenize` shows them (TEI's shape): the tokens the model
    /// computes on, each special one with its own string, the others with the text they
    /// cover and its character offsets.
    pub fn tokens(&self, i: usize, text: &str) -> Result<Vec<Token>, ApiError> {
        let e = self.encoding(i, text, None, true)?;
        let shown: std::borrow::Cow<'_, str> = if self.cfg.prefix.is_empty() {
            text.into()
        } else {
            format!("{}{text}", self.cfg.prefix).into()
        };
        // Character offsets to byte offsets, once.
        let starts: Vec<usize> = shown
            .char_indices()
            .map(|(b, _)| b)
            .chain(std::iter::once(shown.len()))
            .collect();
        let byte = |c: usize| starts.get(c).copied().unwrap_or(shown.len());
        Ok(e.get_ids()
            .iter()
            .zip(e.get_offsets())
            .zip(e.get_special_tokens_mask())
            .zip(e.get_tokens())
            .map(|(((&id, &(start, stop)), &special), token)| {
                if special == 1 {
                    Token {
                        id,
                        text: token.clone(),
                        special: true,
                        start: None,
                        stop: None,
                    }
                } else {
                    Token {
                        id,
                        text: shown
                            .get(byte(start)..byte(stop))
                            .unwrap_or_default()
                            .to_owned(),
                        special: false,
                        start: Some(start),
                        stop: Some(stop),
                    }
                }
            })
            .collect())
    }

    /// Checks a request's options against the model before any work: `dimensions` at least 1
    /// and at most the model's.
    pub fn check_options(&self, opts: PoolOptions) -> Result<(), ApiError> {
        match opts.dimensions {
            Some(0) => Err(ApiError::BadRequest("dimensions must be at least 1".into())),
            Some(d) if d as usize > self.hidden => Err(ApiError::BadRequest(format!(
                "dimensions {d} is more than the model's {}",
                self.hidden
            ))),
            _ => Ok(()),
        }
    }

    /// One text's pooled vector (the backend thread's [`crate::batcher::Reduce`]) as a request
    /// wants it: cut to its `dimensions`, normalised (its `normalize`, else the recipe's), and
    /// the activation applied unless it asks for raw scores.
    pub fn finish(&self, mut v: Vec<f32>, opts: PoolOptions) -> Vec<f32> {
        if let Some(d) = opts.dimensions {
            v.truncate(d as usize);
        }
        if opts.normalize.unwrap_or(self.cfg.normalize) {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
            v.iter_mut().for_each(|x| *x /= norm);
        }
        if !opts.raw {
            activate(self.cfg.activation, &mut v);
        }
        v
    }

    /// Pools the engine's rows of one queued item (`length` tokens of its own; the rows may be
    /// padded past it by the batch) into one FP32 vector per row, `[rows, hidden]`.
    fn pool_rows(&self, outputs: &[Tensor], length: usize) -> Result<Tensor, ApiError> {
        let out = outputs
            .get(self.output)
            .ok_or_else(|| ApiError::Internal("the engine returned too few outputs".to_owned()))?;
        let hidden = self.hidden;
        let rows = out.rows();
        let (per_row, seq) = match (self.cfg.pooling, out.shape.as_slice()) {
            (Pooling::None, [_, h]) if *h == hidden => (hidden, 1),
            (_, [_, s, h]) if *h == hidden => (s * hidden, *s),
            (_, shape) => {
                return Err(ApiError::Internal(format!(
                "the engine's output {:?} has shape {shape:?}, not [rows, (sequence,) {hidden}]",
                self.cfg.output
            )))
            }
        };
        let len = length.clamp(1, seq.max(1));
        let mut data = Vec::with_capacity(rows * hidden * 4);
        for r in 0..rows {
            // Only the values a pooling reads are decoded: the row's own tokens.
            let row = r * per_row;
            let v: Vec<f32> = match self.cfg.pooling {
                Pooling::None | Pooling::Cls => out.floats(row..row + hidden)?,
                Pooling::Last => out.floats(row + (len - 1) * hidden..row + len * hidden)?,
                Pooling::Mean => {
                    let mut sum = vec![0f32; hidden];
                    for token in out.floats(row..row + len * hidden)?.chunks_exact(hidden) {
                        for (s, x) in sum.iter_mut().zip(token) {
                            *s += x;
                        }
                    }
                    let n = len as f32;
                    sum.iter_mut().for_each(|s| *s /= n);
                    sum
                }
            };
            for x in v {
                data.extend_from_slice(&x.to_le_bytes());
            }
        }
        Ok(Tensor {
            dtype: DataType::F32,
            shape: vec![rows, hidden],
            data: Bytes::from(data),
        })
    }

    /// Vectors as the served output tensor (`[texts, dims]`, FP32).
    pub fn pooled_tensor(vectors: &[Vec<f32>]) -> Tensor {
        let dims = vectors.first().map_or(0, Vec::len);
        let mut data = Vec::with_capacity(vectors.len() * dims * 4);
        for v in vectors {
            for x in v {
                data.extend_from_slice(&x.to_le_bytes());
            }
        }
        Tensor {
            dtype: DataType::F32,
            shape: vec![vectors.len(), dims],
            data: Bytes::from(data),
        }
    }

    /// A pooled `[rows, hidden]` FP32 tensor's rows as vectors.
    pub fn vectors(t: &Tensor) -> Result<Vec<Vec<f32>>, ApiError> {
        let hidden = t.shape.get(1).copied().unwrap_or(0).max(1);
        let all = t.floats(0..t.elements())?;
        Ok(all.chunks(hidden).map(<[f32]>::to_vec).collect())
    }
}

impl crate::batcher::Reduce for TextModel {
    fn reduce(&self, outputs: Vec<Tensor>, length: usize) -> Result<Vec<Tensor>, ApiError> {
        Ok(vec![self.pool_rows(&outputs, length)?])
    }
}

/// `text` cut to at most `max` bytes: at the last whitespace before the bound when there is
/// one in the bound's second half (the whitespace dropped), else at the last character
/// boundary. Tokenizers split at whitespace, so the words kept tokenize as in the whole text.
fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    if text[end..].starts_with(char::is_whitespace) {
        return head.trim_end();
    }
    match head.rfind(char::is_whitespace) {
        Some(i) if i >= end / 2 => head[..i].trim_end(),
        _ => head,
    }
}

/// Why a tokenizer did not load: it could not be read (exit 1: a file or volume missing), or
/// it was read and refused (exit 2: a bad config).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    Read(String),
    Refused(String),
}

/// Why [`read_bounded`] read nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Bounded {
    /// Larger than the bound.
    TooLarge(String),
    /// It could not be opened or read.
    Io(String),
}

impl std::fmt::Display for Bounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bounded::TooLarge(e) | Bounded::Io(e) => f.write_str(e),
        }
    }
}

/// Reads at most `limit` bytes of the file at `path`; a larger file is refused without
/// reading past the bound.
pub(crate) fn read_bounded(path: &std::path::Path, limit: u64) -> Result<Vec<u8>, Bounded> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| Bounded::Io(e.to_string()))?;
    let mut bytes = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Bounded::Io(e.to_string()))?;
    if bytes.len() as u64 > limit {
        return Err(Bounded::TooLarge(format!(
            "larger than {limit} bytes, the most this runtime reads"
        )));
    }
    Ok(bytes)
}

/// Scores from logits, in place.
fn activate(a: Activation, v: &mut [f32]) {
    match a {
        Activation::None => {}
        Activation::Sigmoid => v.iter_mut().for_each(|x| *x = 1.0 / (1.0 + (-*x).exp())),
        Activation::Softmax => {
            let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            v.iter_mut().for_each(|x| *x = (*x - max).exp());
            let sum: f32 = v.iter().sum();
            v.iter_mut().for_each(|x| *x /= sum);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level tokenizer: enough to check the tensors and the pooling without a file.
    const TOKENIZER: &str = r#"{
      "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
      "normalizer": null,
      "pre_tokenizer": {"type": "Whitespace"},
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [1], "tokens": ["[CLS]"]}}},
      "decoder": null,
      "model": {"type": "WordLevel", "vocab": {"[PAD]": 0, "[CLS]": 1, "a": 2, "dog": 3, "runs": 4, "[UNK]": 5}, "unk_token": "[UNK]"}
    }"#;

    fn cfg(pooling: &str, output_dims: &str, extra: &str) -> RuntimeConfig {
        RuntimeConfig::from_toml_str(&format!(
            "[model]\nname = \"m\"\n\
             [[inputs]]\nname = \"input_ids\"\ndatatype = \"INT64\"\ndims = [-1, -1]\n\
             profile = {{ min = [1], opt = [4], max = [4] }}\n\
             [[inputs]]\nname = \"attention_mask\"\ndatatype = \"INT32\"\ndims = [-1, -1]\n\
             profile = {{ min = [1], opt = [4], max = [4] }}\n\
             [[outputs]]\nname = \"h\"\ndatatype = \"FP32\"\ndims = {output_dims}\n\
             [engine]\nkind = \"tract-onnx\"\npath = \"m.onnx\"\n\
             [text]\ntokenizer = \"t.json\"\nmax_length = 4\ninput_ids = \"input_ids\"\n\
             attention_mask = \"attention_mask\"\noutput = \"h\"\npooling = \"{pooling}\"\n{extra}"
        ))
        .unwrap()
    }

    fn model(pooling: &str, output_dims: &str, extra: &str) -> TextModel {
        let c = cfg(pooling, output_dims, extra);
        TextModel::new(&c, c.text.as_ref().unwrap(), TOKENIZER.as_bytes()).unwrap()
    }

    fn ints(t: &Tensor) -> Vec<i64> {
        match t.dtype {
            DataType::I32 => t
                .data
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes(b.try_into().unwrap())))
                .collect(),
            _ => t
                .data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
                .collect(),
        }
    }

    #[test]
    fn a_text_becomes_one_row_of_ids_and_masks_in_the_engine_types() {
        let m = model("mean", "[-1, -1, 2]", "");
        assert_eq!(m.served_inputs()[0].name, "text");
        assert_eq!(m.served_outputs()[0].dims, [-1, 2]);
        let e = m.encode(0, "a dog runs", None).unwrap();
        assert_eq!(e.tokens, 4);
        assert_eq!(e.inputs[0].shape, [1, 4]);
        assert_eq!(ints(&e.inputs[0]), [1, 2, 3, 4]);
        assert_eq!(e.inputs[1].dtype, DataType::I32);
        assert_eq!(ints(&e.inputs[1]), [1, 1, 1, 1]);
        // Truncation is on by default: four tokens at most.
        assert_eq!(m.encode(0, "a dog runs a dog", None).unwrap().tokens, 4);
        let strict = model("mean", "[-1, -1, 2]", "truncate = false\n");
        let e = strict.encode(1, "a dog runs a dog", None).err().unwrap();
        assert!(
            e.to_string()
                .contains("text 1 is 6 tokens, more than the model's 4"),
            "{e}"
        );
        let prefixed = model(
            "mean",
            "[-1, -1, 2]",
            "prefix = \"a \"\nspecial_tokens = false\n",
        );
        assert_eq!(
            ints(&prefixed.encode(0, "dog", None).unwrap().inputs[0]),
            [2, 3]
        );
    }

    /// TEI's rule: only the empty text is refused; whitespace (and any other character) is
    /// tokenized like any text. A text that becomes no token at all is refused as such.
    #[test]
    fn only_the_empty_text_is_refused() {
        let m = model("mean", "[-1, -1, 2]", "");
        let e = m.encode(3, "", None).err().unwrap();
        assert_eq!(e.to_string(), "text 3 is empty");
        for blank in ["   ", "\u{200b}", "\u{0}"] {
            assert!(m.encode(0, blank, None).is_ok(), "{blank:?}");
        }
        let bare = model("mean", "[-1, -1, 2]", "special_tokens = false\n");
        let e = bare.encode(0, "   ", None).err().unwrap();
        assert_eq!(e.to_string(), "text 0 has no tokens");
    }

    /// A text far longer than the model reads is cut before it is tokenized, and the model
    /// gets the tokens of the whole text truncated; with truncation off it is refused first.
    #[test]
    fn long_texts_are_cut_before_tokenizing_with_the_tokens_of_the_whole_text() {
        let m = model("mean", "[-1, -1, 2]", "");
        // 4 tokens at most: the short cut is 64 bytes, the long 512.
        let long = "a dog runs ".repeat(10_000);
        let whole = m.tokenizer.encode_fast(long.as_str(), true).unwrap();
        let e = m.encode(0, &long, None).unwrap();
        assert_eq!(
            ints(&e.inputs[0]),
            whole
                .get_ids()
                .iter()
                .map(|&i| i64::from(i))
                .collect::<Vec<_>>()
        );
        // Words longer than the short cut: the long one holds the tokens.
        let sparse = format!("{}a dog", " ".repeat(100));
        assert_eq!(
            ints(&m.encode(0, &sparse, None).unwrap().inputs[0]),
            [1, 2, 3]
        );
        assert_eq!(cut("a dog runs", 7), "a dog");
        assert_eq!(cut("a dog runs", 5), "a dog");
        assert_eq!(cut("abcdefgh", 5), "abcde");
        assert_eq!(cut("é", 1), "");
        let strict = model("mean", "[-1, -1, 2]", "truncate = false\n");
        let e = strict.encode(2, &long, None).err().unwrap();
        assert!(matches!(e, ApiError::TooLarge(_)), "{e:?}");
        assert!(e.to_string().contains("text 2 is 110000 bytes"), "{e}");
    }

    #[test]
    fn tokenize_shows_each_tokens_text_and_offsets() {
        let m = model("mean", "[-1, -1, 2]", "");
        let t = m.tokens(0, "a  dög").unwrap();
        let shown: Vec<(u32, &str, bool, Option<usize>)> = t
            .iter()
            .map(|t| (t.id, t.text.as_str(), t.special, t.start))
            .collect();
        assert_eq!(
            shown,
            [
                (1, "[CLS]", true, None),
                (2, "a", false, Some(0)),
                (5, "dög", false, Some(3))
            ]
        );
        assert_eq!(t[2].stop, Some(6));
    }

    fn hidden(rows: &[&[[f32; 2]]]) -> Tensor {
        let seq = rows[0].len();
        let data: Vec<u8> = rows
            .iter()
            .flat_map(|r| r.iter().flatten().flat_map(|x| x.to_le_bytes()))
            .collect();
        Tensor {
            dtype: DataType::F32,
            shape: vec![rows.len(), seq, 2],
            data: Bytes::from(data),
        }
    }

    #[test]
    fn pooling_reads_only_each_items_own_tokens() {
        // An item of 2 tokens, padded by the batch to 3 (the padding holds garbage).
        let out = hidden(&[&[[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]]]);
        let pool = |p: &str| {
            let t = model(p, "[-1, -1, 2]", "")
                .pool_rows(std::slice::from_ref(&out), 2)
                .unwrap();
            TextModel::vectors(&t).unwrap()
        };
        assert_eq!(pool("mean"), [vec![2.0, 4.0]]);
        assert_eq!(pool("cls"), [vec![1.0, 2.0]]);
        assert_eq!(pool("last"), [vec![3.0, 6.0]]);
        let m = model("mean", "[-1, -1, 2]", "");
        let unit = m.finish(
            vec![2.0, 4.0],
            PoolOptions {
                normalize: Some(true),
                dimensions: None,
                raw: false,
            },
        );
        assert!((unit[0] - 1.0 / 5f32.sqrt()).abs() < 1e-6);
        // Fewer dimensions are cut before normalising.
        let cut = m.finish(
            vec![2.0, 4.0],
            PoolOptions {
                normalize: Some(true),
                dimensions: Some(1),
                raw: false,
            },
        );
        assert_eq!(cut, [1.0]);
        assert!(m
            .check_options(PoolOptions {
                dimensions: Some(3),
                normalize: None,
                raw: false,
            })
            .is_err());
        // A model that pools itself: its rows as they are.
        let pooled = Tensor {
            dtype: DataType::F32,
            shape: vec![1, 2],
            data: Bytes::from(
                [3f32, 4.0]
                    .iter()
                    .flat_map(|x| x.to_le_bytes())
                    .collect::<Vec<u8>>(),
            ),
        };
        let m = model("none", "[-1, 2]", "normalize = true\n");
        let t = m.pool_rows(&[pooled], 5).unwrap();
        let v = TextModel::vectors(&t).unwrap().pop().unwrap();
        assert_eq!(m.finish(v, PoolOptions::default()), [0.6, 0.8]);
    }

    #[test]
    fn pairs_are_encoded_together_and_logits_become_scores() {
        let m = model(
            "none",
            "[-1, 1]",
            "pairs = true\nactivation = \"sigmoid\"\nnormalize = false\n",
        );
        assert_eq!(m.served_inputs().len(), 2);
        assert_eq!(m.served_inputs()[1].name, "text_pair");
        let e = m.encode(0, "a dog", Some("runs")).unwrap();
        // The pair template: A then B, no special tokens between (this tokenizer's).
        assert_eq!(ints(&e.inputs[0]), [2, 3, 4]);
        assert!(m.check_pairs(false).is_err());
        let single = model("mean", "[-1, -1, 2]", "");
        let e = single.check_pairs(true).err().unwrap();
        assert!(e.to_string().contains("not pairs"), "{e}");
        assert_eq!(m.finish(vec![0.0], PoolOptions::default()), [0.5]);
        let raw = PoolOptions {
            raw: true,
            ..PoolOptions::default()
        };
        assert_eq!(m.finish(vec![0.0], raw), [0.0]);
        let mut v = vec![1.0f32, 1.0];
        activate(Activation::Softmax, &mut v);
        assert_eq!(v, [0.5, 0.5]);
    }

    #[test]
    fn unfit_tokenizers_are_refused_at_start() {
        let c = cfg("mean", "[-1, -1, 2]", "");
        let mut wide: serde_json::Value = serde_json::from_str(TOKENIZER).unwrap();
        wide["model"] = serde_json::json!({"type": "WordPiece", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]", "max_input_chars_per_word": 1_000_000_000_000u64});
        let e = TextModel::new(&c, c.text.as_ref().unwrap(), wide.to_string().as_bytes())
            .err()
            .unwrap();
        assert!(e.contains("max_input_chars_per_word"), "{e}");
        // An id past the table the ids input indexes.
        let mut c = cfg("mean", "[-1, -1, 2]", "");
        c.inputs[0].table_rows = Some(5);
        let e = TextModel::new(&c, c.text.as_ref().unwrap(), TOKENIZER.as_bytes())
            .err()
            .unwrap();
        assert!(
            e.contains("largest id 5 (token \"[UNK]\") is past the model's table for \"input_ids\" of 5 rows"),
            "{e}"
        );
        c.inputs[0].table_rows = Some(6);
        assert!(TextModel::new(&c, c.text.as_ref().unwrap(), TOKENIZER.as_bytes()).is_ok());
    }

    #[test]
    fn bytes_tensors_must_hold_utf8() {
        let mut data = Vec::new();
        for s in [&b"a dog"[..], &[0xff, 0xfe][..]] {
            data.extend_from_slice(&(s.len() as u32).to_le_bytes());
            data.extend_from_slice(s);
        }
        let t = Tensor {
            dtype: DataType::Bytes,
            shape: vec![2, 1],
            data: Bytes::from(data),
        };
        let e = TextModel::texts(&t, "text").err().unwrap();
        assert!(e.to_string().contains("element 1 is not UTF-8"), "{e}");
    }
}
