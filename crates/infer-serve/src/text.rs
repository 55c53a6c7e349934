//! Text in: the tokenizer in front of a model's engine and the pooling after it, as
//! `runtime.toml`'s `[text]` says ([`infer_spec::text::Text`]).
//!
//! A text model serves one `text` input (`BYTES`) instead of its engine's token tensors:
//! [`TextModel::encode`] turns a request's texts into the engine's inputs (ids, attention
//! mask, token type ids; padded to the request's longest text), and [`TextModel::pool`] turns
//! the rows the engine returned for them into one vector per text (mean under the mask, first
//! or last token, or the model's own pooled output; then an optional truncation to fewer
//! dimensions and L2 normalisation). The batcher pads requests of different lengths to the
//! batch's longest ([`crate::batcher::Padding`]): every pooling here reads only the tokens of
//! its own text, so padding never changes an answer.
//!
//! A request of more than [`INLINE_BYTES`] of text is tokenized on the model's [`Pool`] of
//! workers, a shorter one on the thread that decoded it. The Rust `tokenizers` crate with its
//! pure-Rust regex engine (no oniguruma: the runtime stays a static binary).

use crate::error::ApiError;
use crate::tensor::Tensor;
use bytes::Bytes;
use infer_spec::text::{Activation, Pooling, Text};
use infer_spec::{DataType, RuntimeConfig, TensorSpec};
use tokenizers::{EncodeInput, Tokenizer, TruncationParams};

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
    tokenizer: Tokenizer,
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

/// A request's texts as the engine takes them.
pub struct Encoded {
    /// The engine's inputs, `[texts, longest]`.
    pub inputs: Vec<Tensor>,
    /// Tokens per text (before padding).
    pub lengths: Vec<usize>,
}

impl Encoded {
    /// Tokens in all (what usage reports count).
    pub fn tokens(&self) -> usize {
        self.lengths.iter().sum()
    }
}

/// Per-request choices of the embedding APIs that change the answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct PoolOptions {
    /// Keep only the first this many dimensions (Matryoshka-trained models), before
    /// normalising.
    pub dimensions: Option<usize>,
    /// Override `[text] normalize`.
    pub normalize: Option<bool>,
    /// Leave out `[text] activation`: the logits as they are (TEI's `raw_scores`).
    pub raw: bool,
}

impl TextModel {
    /// Loads the tokenizer `[text]` names (relative to `base`, the config's directory) and
    /// checks the section against the engine's tensors. `Ok(None)`: the model takes tensors.
    pub fn load(cfg: &RuntimeConfig, base: &std::path::Path) -> Result<Option<TextModel>, String> {
        let Some(text) = &cfg.text else {
            return Ok(None);
        };
        let path = base.join(&text.tokenizer);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        TextModel::new(cfg, text, &bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A text model from the tokenizer's JSON.
    pub fn new(cfg: &RuntimeConfig, text: &Text, tokenizer: &[u8]) -> Result<TextModel, String> {
        let problems = text.problems(&cfg.inputs, &cfg.outputs);
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        let mut tokenizer = Tokenizer::from_bytes(tokenizer)
            .map_err(|e| format!("not a tokenizer.json this runtime reads: {e}"))?;
        let pad_id = tokenizer.get_padding().map_or(0, |p| i64::from(p.pad_id));
        tokenizer.with_padding(None);
        let truncation = text.truncate.then(|| TruncationParams {
            max_length: text.max_length as usize,
            ..TruncationParams::default()
        });
        tokenizer
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
            tokenizer,
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

    /// Tokenizes `texts` into the engine's inputs, padded to the longest. An empty text, or
    /// one over `max_length` tokens with truncation off, is refused naming its index.
    pub fn encode(&self, texts: &[&str]) -> Result<Encoded, ApiError> {
        self.encode_items(texts.iter().map(|t| (*t, None)).collect())
    }

    /// Tokenizes single texts (`None` second) or pairs (a cross-encoder's query and passage),
    /// as the model takes them.
    pub fn encode_items(&self, items: Vec<(&str, Option<&str>)>) -> Result<Encoded, ApiError> {
        match (self.cfg.pairs, items.iter().any(|(_, p)| p.is_some())) {
            (true, _) if items.iter().any(|(_, p)| p.is_none()) => {
                return Err(ApiError::BadRequest(
                    "this model scores pairs of texts (a query and a passage): send text and text_pair"
                        .into(),
                ))
            }
            (false, true) => {
                return Err(ApiError::BadRequest(
                    "this model takes single texts, not pairs (its recipe's text.pairs is false)"
                        .into(),
                ))
            }
            _ => {}
        }
        self.tokenize(items)
    }

    fn tokenize(&self, items: Vec<(&str, Option<&str>)>) -> Result<Encoded, ApiError> {
        if items.is_empty() {
            return Err(ApiError::BadRequest("no texts to embed".into()));
        }
        let mut encodings = Vec::with_capacity(items.len());
        for (i, (text, pair)) in items.iter().enumerate() {
            if text.trim().is_empty() || pair.is_some_and(|p| p.trim().is_empty()) {
                return Err(ApiError::BadRequest(format!("text {i} is empty")));
            }
            let first: std::borrow::Cow<'_, str> = if self.cfg.prefix.is_empty() {
                (*text).into()
            } else {
                format!("{}{text}", self.cfg.prefix).into()
            };
            let input: EncodeInput = match pair {
                None => first.into(),
                Some(p) => (first, *p).into(),
            };
            let e = self
                .tokenizer
                .encode_fast(input, self.cfg.special_tokens)
                .map_err(|e| ApiError::BadRequest(format!("text {i}: cannot tokenize: {e}")))?;
            let n = e.get_ids().len();
            if n == 0 {
                return Err(ApiError::BadRequest(format!("text {i} has no tokens")));
            }
            if n > self.cfg.max_length as usize {
                return Err(ApiError::BadRequest(format!(
                    "text {i} is {n} tokens, more than the model's {} (truncation is off)",
                    self.cfg.max_length
                )));
            }
            encodings.push(e);
        }
        let lengths: Vec<usize> = encodings.iter().map(|e| e.get_ids().len()).collect();
        let longest = lengths.iter().copied().max().unwrap_or(0);
        let rows = encodings.len();
        let inputs = self
            .fills
            .iter()
            .map(|&(fill, dtype)| {
                let pad = self.pad(fill);
                let width = dtype.size().unwrap_or(8);
                let mut data = Vec::with_capacity(rows * longest * width);
                for e in &encodings {
                    let values: &[u32] = match fill {
                        Fill::Ids => e.get_ids(),
                        Fill::Mask => e.get_attention_mask(),
                        Fill::TypeIds => e.get_type_ids(),
                    };
                    let padded = values
                        .iter()
                        .map(|&v| i64::from(v))
                        .chain(std::iter::repeat(pad))
                        .take(longest);
                    for v in padded {
                        match dtype {
                            DataType::I32 => data.extend_from_slice(&(v as i32).to_le_bytes()),
                            _ => data.extend_from_slice(&v.to_le_bytes()),
                        }
                    }
                }
                Tensor {
                    dtype,
                    shape: vec![rows, longest],
                    data: Bytes::from(data),
                }
            })
            .collect();
        Ok(Encoded { inputs, lengths })
    }

    /// The token ids and strings of one text, and whether each is a special token, as
    /// `/tokenize` shows them.
    pub fn tokens(&self, text: &str) -> Result<Vec<(u32, String, bool)>, ApiError> {
        let e = self
            .tokenizer
            .encode_fast(text, self.cfg.special_tokens)
            .map_err(|e| ApiError::BadRequest(format!("cannot tokenize: {e}")))?;
        Ok(e.get_ids()
            .iter()
            .zip(e.get_tokens())
            .zip(e.get_special_tokens_mask())
            .map(|((&id, t), &special)| (id, t.clone(), special == 1))
            .collect())
    }

    /// One vector per text from the engine's outputs for this request's rows (`lengths` from
    /// [`TextModel::encode`]; the rows may be padded past them by the batch).
    pub fn pool(
        &self,
        outputs: &[Tensor],
        lengths: &[usize],
        opts: PoolOptions,
    ) -> Result<Vec<Vec<f32>>, ApiError> {
        let out = outputs
            .get(self.output)
            .ok_or_else(|| ApiError::Internal("the engine returned too few outputs".into()))?;
        let rows = lengths.len();
        let hidden = self.hidden;
        let (per_row, seq) = match (self.cfg.pooling, out.shape.as_slice()) {
            (Pooling::None, [n, h]) if *n == rows && *h == hidden => (hidden, 1),
            (_, [n, s, h]) if *n == rows && *h == hidden => (s * hidden, *s),
            (_, shape) => {
                return Err(ApiError::Internal(format!(
                    "the engine's output {:?} has shape {shape:?} for {rows} texts",
                    self.cfg.output
                )))
            }
        };
        let dims = match opts.dimensions {
            None => hidden,
            Some(0) => {
                return Err(ApiError::BadRequest("dimensions must be at least 1".into()));
            }
            Some(d) if d > hidden => {
                return Err(ApiError::BadRequest(format!(
                    "dimensions {d} is more than the model's {hidden}"
                )))
            }
            Some(d) => d,
        };
        let normalize = opts.normalize.unwrap_or(self.cfg.normalize);
        let mut answers = Vec::with_capacity(rows);
        for (r, &len) in lengths.iter().enumerate() {
            // Only the values a pooling reads are decoded: a text's own tokens, not the
            // batch's padding.
            let row = r * per_row;
            let len = len.clamp(1, seq.max(1));
            let mut v: Vec<f32> = match self.cfg.pooling {
                Pooling::None | Pooling::Cls => floats(out, row..row + hidden)?,
                Pooling::Last => floats(out, row + (len - 1) * hidden..row + len * hidden)?,
                Pooling::Mean => {
                    let mut sum = vec![0f32; hidden];
                    for token in floats(out, row..row + len * hidden)?.chunks_exact(hidden) {
                        for (s, x) in sum.iter_mut().zip(token) {
                            *s += x;
                        }
                    }
                    let n = len as f32;
                    sum.iter_mut().for_each(|s| *s /= n);
                    sum
                }
            };
            v.truncate(dims);
            if normalize {
                let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                v.iter_mut().for_each(|x| *x /= norm);
            }
            if !opts.raw {
                activate(self.cfg.activation, &mut v);
            }
            answers.push(v);
        }
        Ok(answers)
    }

    /// [`TextModel::pool`] as the served output tensor (`[texts, dims]`, FP32).
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
}

/// Requests holding fewer text bytes than this are tokenized on the thread that read them:
/// for a few short texts the hand-off to a worker costs more than the tokenizing.
pub const INLINE_BYTES: usize = 2048;

/// Tokenizing off the I/O threads: worker threads take jobs from a bounded queue, and a full
/// queue refuses the request at once (503 `queue_full`, like the batcher's), so a burst of
/// long texts can neither stall the connections' threads nor grow without bound. Cloning shares
/// the workers and the queue (a bundle's text models share one pool).
#[derive(Clone)]
pub struct Pool {
    tx: std::sync::mpsc::SyncSender<Box<dyn FnOnce() + Send>>,
}

impl Pool {
    /// `threads` workers sharing a queue of `capacity` jobs.
    pub fn start(threads: usize, capacity: usize) -> std::io::Result<Pool> {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Box<dyn FnOnce() + Send>>(capacity.max(1));
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("tokenize-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })?;
        }
        Ok(Pool { tx })
    }

    /// Queues `f` for a worker; its result arrives on the receiver. A full queue refuses
    /// it here.
    pub fn submit<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<tokio::sync::oneshot::Receiver<T>, ApiError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: Box<dyn FnOnce() + Send> = Box::new(move || {
            let _ = tx.send(f());
        });
        self.tx.try_send(job).map_err(|e| match e {
            std::sync::mpsc::TrySendError::Full(_) => {
                ApiError::Rejected(crate::error::Rejection::QueueFull)
            }
            std::sync::mpsc::TrySendError::Disconnected(_) => {
                ApiError::Internal("the tokenizer workers are gone".into())
            }
        })?;
        Ok(rx)
    }

    /// Runs `f` on a worker and waits for its result without blocking this thread.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, ApiError> {
        self.submit(f)?
            .await
            .map_err(|_| ApiError::Internal("a tokenizer worker dropped the request".into()))
    }
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

/// Elements `range` of an FP32 or FP16 tensor, as f32.
fn floats(t: &Tensor, range: std::ops::Range<usize>) -> Result<Vec<f32>, ApiError> {
    let size = match t.dtype {
        DataType::F32 | DataType::F16 => t.dtype.size().unwrap_or(4),
        other => {
            return Err(ApiError::Internal(format!(
                "the engine's output is {other}, not FP32 or FP16"
            )))
        }
    };
    let bytes = t
        .data
        .get(range.start * size..range.end * size)
        .ok_or_else(|| {
            ApiError::Internal("the engine's output is shorter than its shape".into())
        })?;
    Ok(match t.dtype {
        DataType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        _ => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
    })
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
    fn texts_become_padded_ids_and_masks_in_the_engine_types() {
        let m = model("mean", "[-1, -1, 2]", "");
        assert_eq!(m.served_inputs()[0].name, "text");
        assert_eq!(m.served_outputs()[0].dims, [-1, 2]);
        let e = m.encode(&["a dog runs", "dog"]).unwrap();
        assert_eq!(e.lengths, [4, 2]);
        assert_eq!(e.tokens(), 6);
        assert_eq!(e.inputs[0].shape, [2, 4]);
        assert_eq!(ints(&e.inputs[0]), [1, 2, 3, 4, 1, 3, 0, 0]);
        assert_eq!(e.inputs[1].dtype, DataType::I32);
        assert_eq!(ints(&e.inputs[1]), [1, 1, 1, 1, 1, 1, 0, 0]);
        // Truncation is on by default: four tokens at most.
        assert_eq!(m.encode(&["a dog runs a dog"]).unwrap().lengths, [4]);
        let strict = model("mean", "[-1, -1, 2]", "truncate = false\n");
        let e = strict.encode(&["dog", "a dog runs a dog"]).err().unwrap();
        assert!(
            e.to_string()
                .contains("text 1 is 6 tokens, more than the model's 4"),
            "{e}"
        );
        let e = m.encode(&["dog", " "]).err().unwrap();
        assert!(e.to_string().contains("text 1 is empty"), "{e}");
        let prefixed = model(
            "mean",
            "[-1, -1, 2]",
            "prefix = \"a \"\nspecial_tokens = false\n",
        );
        assert_eq!(ints(&prefixed.encode(&["dog"]).unwrap().inputs[0]), [2, 3]);
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
    fn pooling_reads_only_each_texts_own_tokens() {
        // Two texts of 2 and 1 tokens, padded by the batch to 3 (the padding holds garbage).
        let out = hidden(&[
            &[[1.0, 2.0], [3.0, 6.0], [100.0, 100.0]],
            &[[4.0, 0.0], [100.0, 100.0], [100.0, 100.0]],
        ]);
        let pool = |p: &str, opts| {
            model(p, "[-1, -1, 2]", "")
                .pool(std::slice::from_ref(&out), &[2, 1], opts)
                .unwrap()
        };
        assert_eq!(
            pool("mean", PoolOptions::default()),
            [vec![2.0, 4.0], vec![4.0, 0.0]]
        );
        assert_eq!(
            pool("cls", PoolOptions::default()),
            [vec![1.0, 2.0], vec![4.0, 0.0]]
        );
        assert_eq!(
            pool("last", PoolOptions::default()),
            [vec![3.0, 6.0], vec![4.0, 0.0]]
        );
        let unit = pool(
            "mean",
            PoolOptions {
                normalize: Some(true),
                dimensions: None,
                raw: false,
            },
        );
        assert!((unit[0][0] - 1.0 / 5f32.sqrt()).abs() < 1e-6 && (unit[1][0] - 1.0).abs() < 1e-6);
        // Fewer dimensions are cut before normalising.
        let cut = pool(
            "mean",
            PoolOptions {
                normalize: Some(true),
                dimensions: Some(1),
                raw: false,
            },
        );
        assert_eq!(cut, [vec![1.0], vec![1.0]]);
        let m = model("mean", "[-1, -1, 2]", "");
        assert!(m
            .pool(
                std::slice::from_ref(&out),
                &[2, 1],
                PoolOptions {
                    dimensions: Some(3),
                    normalize: None,
                    raw: false,
                }
            )
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
        assert_eq!(
            m.pool(&[pooled], &[5], PoolOptions::default()).unwrap(),
            [vec![0.6, 0.8]]
        );
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
        let e = m.encode_items(vec![("a dog", Some("runs"))]).unwrap();
        // The pair template: A then B, no special tokens between (this tokenizer's).
        assert_eq!(ints(&e.inputs[0]), [2, 3, 4]);
        let e = m.encode(&["a dog"]).err().unwrap();
        assert!(e.to_string().contains("send text and text_pair"), "{e}");
        let single = model("mean", "[-1, -1, 2]", "");
        let e = single.encode_items(vec![("a", Some("dog"))]).err().unwrap();
        assert!(e.to_string().contains("not pairs"), "{e}");
        let logit = Tensor {
            dtype: DataType::F32,
            shape: vec![1, 1],
            data: Bytes::from(0f32.to_le_bytes().to_vec()),
        };
        assert_eq!(
            m.pool(std::slice::from_ref(&logit), &[3], PoolOptions::default())
                .unwrap(),
            [vec![0.5]]
        );
        let raw = PoolOptions {
            raw: true,
            ..PoolOptions::default()
        };
        assert_eq!(m.pool(&[logit], &[3], raw).unwrap(), [vec![0.0]]);
        let mut v = vec![1.0f32, 1.0];
        activate(Activation::Softmax, &mut v);
        assert_eq!(v, [0.5, 0.5]);
    }

    #[test]
    fn the_pool_runs_jobs_and_refuses_when_its_queue_is_full() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let pool = Pool::start(1, 1).unwrap();
        assert_eq!(rt.block_on(pool.run(|| 6 * 7)).unwrap(), 42);
        // The one worker held, one job queued: the next is refused at once.
        let (hold, release) = std::sync::mpsc::channel::<()>();
        let (started_tx, started) = std::sync::mpsc::channel::<()>();
        let busy = pool
            .submit(move || {
                started_tx.send(()).unwrap();
                release.recv().unwrap();
                0
            })
            .unwrap();
        started.recv().unwrap();
        let queued = pool.submit(|| 1).unwrap();
        let refused = pool.submit(|| 2).err().unwrap();
        assert_eq!(
            refused,
            ApiError::Rejected(crate::error::Rejection::QueueFull)
        );
        hold.send(()).unwrap();
        assert_eq!(rt.block_on(busy).unwrap(), 0);
        assert_eq!(rt.block_on(queued).unwrap(), 1);
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
