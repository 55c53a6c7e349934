//! `[text]` of `runtime.toml`: how the runtime turns text into the engine's token tensors and
//! the engine's outputs into answers (embeddings).
//!
//! The recipe's `[text]` table says the same in the builder's words; the builder checks it
//! against the ONNX and the tokenizer and writes this section. The runtime then serves a
//! `text` input (V2 `BYTES`, and the embedding APIs) instead of the engine's token tensors.
//!
//! ```toml
//! [text]
//! tokenizer = "/etc/infer/text/tokenizer.json"
//! max_length = 256
//! input_ids = "input_ids"
//! attention_mask = "attention_mask"
//! output = "last_hidden_state"
//! pooling = "mean"
//! normalize = true
//! ```

use crate::{DataType, TensorSpec};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The most tokens one text may become (`max_length`); the largest BERT-family context is 8192.
pub const MAX_LENGTH: u32 = 32_768;

/// The served input that carries texts (V2 `BYTES`, one text per row).
pub const TEXT_INPUT: &str = "text";

/// `[text]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Text {
    /// The Hugging Face `tokenizer.json` inside the image.
    pub tokenizer: String,
    /// The most tokens a text becomes, special tokens included.
    pub max_length: u32,
    /// A longer text is cut to `max_length` (`true`) or refused with 400 (`false`).
    #[serde(default = "yes")]
    pub truncate: bool,
    /// Whether the tokenizer adds its special tokens (`[CLS]`, `[SEP]`, …).
    #[serde(default = "yes")]
    pub special_tokens: bool,
    /// Put before every text (an instruction such as `"query: "`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub prefix: String,
    /// The engine input that takes the token ids.
    pub input_ids: String,
    /// The engine input that takes the attention mask, if the model has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_mask: Option<String>,
    /// The engine input that takes the token type ids, if the model has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_type_ids: Option<String>,
    /// The engine output the answer comes from.
    pub output: String,
    /// How the output becomes one vector per text.
    pub pooling: Pooling,
    /// L2-normalise the vector.
    #[serde(default)]
    pub normalize: bool,
    /// The most tokens (rows x the batch's longest text) one batch may hold; 0: no bound
    /// beyond `max_batch_size` rows of `max_length`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub token_budget: u32,
    /// The most padding a batch may hold, in percent of its texts' own tokens; 0: no bound
    /// (see [`crate::batch::Padded`]).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_padding_percent: u32,
    /// Each row is a pair of texts (a cross-encoder's query and passage): a second served
    /// input, `text_pair`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pairs: bool,
    /// What turns the output into scores (classifiers and rerankers); `none`: as it is.
    #[serde(default, skip_serializing_if = "Activation::is_none")]
    pub activation: Activation,
    /// A classifier's label per output column (empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub labels: Vec<String>,
    /// The most texts (or pairs) one request may carry, on every route (TEI's
    /// `--max-client-batch-size`); more is refused with 413 naming this key. Written only when
    /// not the default, so the `runtime.toml` of earlier builds keeps its bytes.
    #[serde(
        default = "default_max_client_batch_size",
        skip_serializing_if = "is_default_max_client_batch_size"
    )]
    pub max_client_batch_size: u32,
}

/// The default `max_client_batch_size`: as many texts as the default queue holds
/// (`max_queue_size` 1024), so a request within it can always be queued; LangChain's OpenAI
/// embeddings send 1,000 at a time. (OpenAI itself takes up to 2,048: raise both for clients
/// that send more.)
pub const DEFAULT_MAX_CLIENT_BATCH_SIZE: u32 = 1024;
/// The largest `max_client_batch_size`.
pub const MAX_CLIENT_BATCH_SIZE: u32 = 1 << 16;

fn default_max_client_batch_size() -> u32 {
    DEFAULT_MAX_CLIENT_BATCH_SIZE
}

fn is_default_max_client_batch_size(v: &u32) -> bool {
    *v == DEFAULT_MAX_CLIENT_BATCH_SIZE
}

/// The most bytes a `tokenizer.json` may have: the builder refuses a larger one and the runtime
/// reads no further (large multilingual vocabularies are about 20 MB).
pub const MAX_TOKENIZER_BYTES: u64 = 64 << 20;

/// The longest word WordPiece may look up (`model.max_input_chars_per_word`; BERT's is 100): its
/// greedy longest-match costs the cube of a word's length, so a tokenizer that allows words of
/// thousands of characters lets one request hold a core for minutes.
pub const MAX_WORDPIECE_WORD_CHARS: u64 = 200;

/// What makes a `tokenizer.json` unfit to serve, whatever the model: settings under which
/// tokenizing one text costs more than linear time in its length (a WordPiece model that looks
/// up words longer than [`MAX_WORDPIECE_WORD_CHARS`], a regular expression with a quantified
/// group that holds a quantifier, or a back-reference, which backtrack exponentially), each
/// as one sentence naming the key. The builder (`check` and `build`) and the runtime (at start)
/// run the same check.
pub fn tokenizer_problems(tokenizer: &serde_json::Value) -> Vec<String> {
    let mut p = Vec::new();
    let model = &tokenizer["model"];
    if model["type"].as_str() == Some("WordPiece") {
        match &model["max_input_chars_per_word"] {
            serde_json::Value::Null => {}
            v => match v.as_u64() {
                Some(n) if n <= MAX_WORDPIECE_WORD_CHARS => {}
                _ => p.push(format!(
                    "model.max_input_chars_per_word {v} is more than {MAX_WORDPIECE_WORD_CHARS}: WordPiece's cost grows with the cube of a word's length, so one long word would hold a core for seconds to minutes (BERT's tokenizers use 100)"
                )),
            },
        }
    }
    let mut patterns = Vec::new();
    for key in ["normalizer", "pre_tokenizer", "post_processor", "decoder"] {
        regexes(&tokenizer[key], key, &mut patterns);
    }
    for (at, pattern) in patterns {
        if let Some(why) = backtracking(&pattern) {
            p.push(format!(
                "{at}: the regular expression {pattern:?} {why}, which can take exponential time on some texts"
            ));
        }
    }
    p
}

/// Every regular expression under `v` (`{"Regex": "..."}`, as `Split` and `Replace` hold
/// them), with the path to it.
fn regexes(v: &serde_json::Value, at: &str, out: &mut Vec<(String, String)>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("Regex", serde_json::Value::String(r)) => out.push((at.to_owned(), r.clone())),
                    _ => regexes(v, &format!("{at}.{k}"), out),
                }
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                regexes(v, &format!("{at}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Why a regular expression may backtrack exponentially, if it may: a group holding a
/// quantifier that is itself repeated without bound (`(a+)+`, `(\s*x)*`, `(a|ab){2,}`), or a
/// back-reference. A structural check, without a regex library: escapes and character classes
/// are skipped.
fn backtracking(pattern: &str) -> Option<&'static str> {
    // Per open group: whether it holds a quantifier.
    let mut groups: Vec<bool> = Vec::new();
    // The last atom just closed was a group holding a quantifier.
    let mut closed_quantified = false;
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        let was_group = std::mem::take(&mut closed_quantified);
        match c {
            '\\' => match chars.next() {
                Some('1'..='9') | Some('k') => return Some("has a back-reference"),
                _ => {}
            },
            '[' => {
                // A character class: up to its closing bracket (a leading `]` or `^]` is literal).
                let mut first = true;
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '^' if first => continue,
                        ']' if !first => break,
                        _ => {}
                    }
                    first = false;
                }
            }
            '(' => {
                groups.push(false);
                // `(?:`, `(?i:`, `(?=`, `(?!`, `(?<=`, `(?<!`, `(?P<name>`, `(?<name>`: the
                // group's kind, not a quantifier.
                if chars.peek() == Some(&'?') {
                    chars.next();
                    match chars.peek() {
                        Some('=' | '!') => {
                            chars.next();
                        }
                        Some('<' | 'P') => {
                            let c = chars.next();
                            if c == Some('P') {
                                chars.next();
                            }
                            if matches!(chars.peek(), Some('=' | '!')) {
                                chars.next();
                            } else {
                                for c in chars.by_ref() {
                                    if c == '>' {
                                        break;
                                    }
                                }
                            }
                        }
                        _ => {
                            // Flags: `(?i:` opens a group, `(?i)` sets them and closes.
                            while let Some(&c) = chars.peek() {
                                if c == ':' {
                                    chars.next();
                                    break;
                                }
                                if c == ')' {
                                    break;
                                }
                                chars.next();
                            }
                        }
                    }
                }
            }
            ')' => {
                let inner = groups.pop().unwrap_or(false);
                closed_quantified = inner;
                // The group itself counts as a quantified atom for the group around it when
                // it is repeated; noted below when its quantifier comes.
                if inner {
                    if let Some(outer) = groups.last_mut() {
                        *outer = true;
                    }
                }
            }
            '*' | '+' | '?' | '{' => {
                let unbounded = match c {
                    '*' | '+' => true,
                    '{' => {
                        let mut spec = String::new();
                        for c in chars.by_ref() {
                            if c == '}' {
                                break;
                            }
                            spec.push(c);
                        }
                        spec.ends_with(',')
                    }
                    _ => false,
                };
                // A lazy or possessive suffix is not another quantifier.
                if matches!(chars.peek(), Some('?') | Some('+')) {
                    chars.next();
                }
                if was_group && unbounded {
                    return Some("repeats a group that holds a quantifier");
                }
                if let Some(g) = groups.last_mut() {
                    *g = true;
                }
            }
            _ => {}
        }
    }
    None
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl Text {
    /// How text becomes tensors and tensors answers, as flat key/value pairs for image
    /// annotations (keys without the reverse-DNS prefix, sorted), so `inspect` shows them:
    /// `text.tokenizer`, `text.max_length`, `text.truncate`, `text.special_tokens`,
    /// `text.pooling`, `text.normalize`, and `text.prefix`, `text.token_budget`, `text.pairs`,
    /// `text.activation`, `text.labels` when set, `text.max_client_batch_size` when not the
    /// default.
    pub fn annotations(&self) -> std::collections::BTreeMap<String, String> {
        let mut m = std::collections::BTreeMap::new();
        let mut put = |k: &str, v: String| {
            m.insert(format!("text.{k}"), v);
        };
        put("tokenizer", self.tokenizer.clone());
        put("max_length", self.max_length.to_string());
        put("truncate", self.truncate.to_string());
        put("special_tokens", self.special_tokens.to_string());
        put("pooling", self.pooling.as_str().into());
        put("normalize", self.normalize.to_string());
        if !self.prefix.is_empty() {
            put("prefix", self.prefix.clone());
        }
        if self.token_budget > 0 {
            put("token_budget", self.token_budget.to_string());
        }
        if self.max_padding_percent > 0 {
            put("max_padding_percent", self.max_padding_percent.to_string());
        }
        if self.pairs {
            put("pairs", "true".into());
        }
        if self.activation != Activation::None {
            put("activation", self.activation.as_str().into());
        }
        if !self.labels.is_empty() {
            put("labels", self.labels.join(","));
        }
        if self.max_client_batch_size != DEFAULT_MAX_CLIENT_BATCH_SIZE {
            put(
                "max_client_batch_size",
                self.max_client_batch_size.to_string(),
            );
        }
        m
    }
}

/// What turns a classifier's or reranker's logits into scores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// The output as it is (an embedding, or raw logits).
    #[default]
    None,
    /// 1 / (1 + e^-x) per value (a reranker's relevance, multi-label classifiers).
    Sigmoid,
    /// Over each row (single-label classifiers).
    Softmax,
}

impl Activation {
    pub const ALL: [Activation; 3] = [Activation::None, Activation::Sigmoid, Activation::Softmax];

    pub fn as_str(self) -> &'static str {
        match self {
            Activation::None => "none",
            Activation::Sigmoid => "sigmoid",
            Activation::Softmax => "softmax",
        }
    }

    pub fn parse(s: &str) -> Option<Activation> {
        Activation::ALL.into_iter().find(|a| a.as_str() == s)
    }

    fn is_none(&self) -> bool {
        *self == Activation::None
    }
}

/// The served input that carries a pair's second text.
pub const TEXT_PAIR_INPUT: &str = "text_pair";

fn yes() -> bool {
    true
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// How a model's per-token output becomes one vector per text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pooling {
    /// The mean of the token vectors the attention mask keeps (sentence-transformers' default).
    Mean,
    /// The first token's vector (`[CLS]`).
    Cls,
    /// The last kept token's vector (decoder-style embedding models).
    Last,
    /// None: the output already has one vector per text (the model pools itself).
    None,
}

impl Pooling {
    pub const ALL: [Pooling; 4] = [Pooling::Mean, Pooling::Cls, Pooling::Last, Pooling::None];

    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Last => "last",
            Pooling::None => "none",
        }
    }

    pub fn parse(s: &str) -> Option<Pooling> {
        Pooling::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// The rank of the engine output it reads: `[batch, sequence, hidden]` to pool, or
    /// `[batch, hidden]` already pooled.
    pub fn output_rank(self) -> usize {
        match self {
            Pooling::None => 2,
            _ => 3,
        }
    }
}

impl fmt::Display for Pooling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Text {
    /// The engine inputs it fills, in the order ids, mask, type ids.
    pub fn engine_inputs(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.input_ids.as_str())
            .chain(self.attention_mask.as_deref())
            .chain(self.token_type_ids.as_deref())
    }

    /// What the runtime serves in place of the engine's tensors: one `text` input (`BYTES`,
    /// `[-1, 1]`, Triton's convention for one string per row) and the pooled output
    /// (`FP32`, `[-1, hidden]`). `None` when the config's output is not there (see
    /// [`Text::problems`]).
    pub fn served(&self, outputs: &[TensorSpec]) -> Option<(Vec<TensorSpec>, Vec<TensorSpec>)> {
        let out = outputs.iter().find(|t| t.name == self.output)?;
        let hidden = *out.dims.last()?;
        let input = |name: &str| TensorSpec {
            name: name.to_owned(),
            datatype: DataType::Bytes,
            dims: vec![-1, 1],
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        };
        let mut inputs = vec![input(TEXT_INPUT)];
        if self.pairs {
            inputs.push(input(TEXT_PAIR_INPUT));
        }
        let output = TensorSpec {
            name: self.output.clone(),
            datatype: DataType::F32,
            dims: vec![-1, hidden],
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        };
        Some((inputs, vec![output]))
    }

    /// Everything wrong with the section against the engine's tensors, each as one sentence.
    pub fn problems(&self, inputs: &[TensorSpec], outputs: &[TensorSpec]) -> Vec<String> {
        let mut p = Vec::new();
        if self.tokenizer.is_empty() {
            p.push("text.tokenizer must be non-empty".to_owned());
        }
        if !(1..=MAX_LENGTH).contains(&self.max_length) {
            p.push(format!(
                "text.max_length {} is outside 1..={MAX_LENGTH}",
                self.max_length
            ));
        }
        let keys = [
            ("input_ids", Some(&self.input_ids)),
            ("attention_mask", self.attention_mask.as_ref()),
            ("token_type_ids", self.token_type_ids.as_ref()),
        ];
        for (key, name) in keys {
            let Some(name) = name else { continue };
            match inputs.iter().find(|t| &t.name == name) {
                None => p.push(format!(
                    "text.{key}: the engine has no input {name:?} (its inputs are {:?})",
                    inputs.iter().map(|t| &t.name).collect::<Vec<_>>()
                )),
                Some(t) if !matches!(t.datatype, DataType::I64 | DataType::I32) => p.push(format!(
                    "text.{key}: input {name:?} is {}, not INT64 or INT32",
                    t.datatype
                )),
                Some(t) if t.dims.len() != 2 => p.push(format!(
                    "text.{key}: input {name:?} has dims {:?}, not [batch, sequence]",
                    t.dims
                )),
                Some(_) => {}
            }
        }
        let mut named: Vec<&str> = self.engine_inputs().collect();
        named.sort_unstable();
        named.dedup();
        if named.len() != self.engine_inputs().count() {
            p.push(
                "text: input_ids, attention_mask and token_type_ids must name different inputs"
                    .to_owned(),
            );
        }
        if let Some(other) = inputs.iter().find(|t| !named.contains(&t.name.as_str())) {
            p.push(format!(
                "text: the engine input {:?} is not one the tokenizer fills (name it as input_ids, attention_mask or token_type_ids)",
                other.name
            ));
        }
        match crate::runtime::float_output("text.output", &self.output, outputs) {
            Err(problem) => p.push(problem),
            Ok(t) if t.dims.len() != self.pooling.output_rank() => {
                p.push(format!(
                "text.output: pooling {:?} reads a [batch{}, hidden] output; {:?} has dims {:?}",
                self.pooling.as_str(),
                if self.pooling == Pooling::None { "" } else { ", sequence" },
                t.name,
                t.dims
            ))
            }
            Ok(t) if t.dims.last().is_none_or(|&d| d < 1) => p.push(format!(
                "text.output: {:?} must have a fixed last (hidden) dimension, has dims {:?}",
                t.name, t.dims
            )),
            Ok(t) => {
                let width = t.dims.last().copied().unwrap_or(0);
                if !self.labels.is_empty() && self.labels.len() as i64 != width {
                    p.push(format!(
                        "text.labels: {} labels for an output of {width} columns",
                        self.labels.len()
                    ));
                }
            }
        }
        if !(1..=MAX_CLIENT_BATCH_SIZE).contains(&self.max_client_batch_size) {
            p.push(format!(
                "text.max_client_batch_size {} is outside 1..={MAX_CLIENT_BATCH_SIZE}",
                self.max_client_batch_size
            ));
        }
        if self.activation != Activation::None && self.normalize {
            p.push(format!(
                "text: activation {:?} gives scores; normalize is for embeddings (set it false)",
                self.activation.as_str()
            ));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, datatype: DataType, dims: &[i64]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            datatype,
            dims: dims.to_vec(),
            profile: None,
            dim_names: Vec::new(),
            pad: None,
            table_rows: None,
        }
    }

    fn text() -> Text {
        Text {
            tokenizer: "/etc/infer/text/tokenizer.json".into(),
            max_length: 128,
            truncate: true,
            special_tokens: true,
            prefix: String::new(),
            input_ids: "input_ids".into(),
            attention_mask: Some("attention_mask".into()),
            token_type_ids: None,
            output: "last_hidden_state".into(),
            pooling: Pooling::Mean,
            normalize: true,
            token_budget: 0,
            max_padding_percent: 0,
            pairs: false,
            activation: Activation::None,
            labels: Vec::new(),
            max_client_batch_size: DEFAULT_MAX_CLIENT_BATCH_SIZE,
        }
    }

    #[test]
    fn tokenizers_that_tokenize_in_more_than_linear_time_are_refused() {
        let bert = serde_json::json!({
            "normalizer": {"type": "BertNormalizer"},
            "pre_tokenizer": {"type": "BertPreTokenizer"},
            "model": {"type": "WordPiece", "max_input_chars_per_word": 100, "vocab": {}},
        });
        assert_eq!(tokenizer_problems(&bert), Vec::<String>::new());
        let mut wide = bert.clone();
        wide["model"]["max_input_chars_per_word"] = serde_json::json!(1_000_000_000_000u64);
        let p = tokenizer_problems(&wide);
        assert!(
            p.len() == 1 && p[0].starts_with("model.max_input_chars_per_word 1000000000000"),
            "{p:?}"
        );
        // The pre-tokenizers of GPT-2, Llama 3 and a flags group: linear.
        for ok in [
            r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+",
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            r"(?i)(?:ab)+[(+]*",
            r"(?P<w>\w)+",
        ] {
            assert_eq!(backtracking(ok), None, "{ok}");
        }
        for bad in [
            r"(a+)+$",
            r"(\s*x)*",
            r"((ab)*c){2,}",
            r"(\w)\1",
            r"(?:a|a?)+",
        ] {
            assert!(backtracking(bad).is_some(), "{bad}");
        }
        let split = serde_json::json!({
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated"}
            ]},
            "model": {"type": "BPE", "vocab": {}, "merges": []},
        });
        let p = tokenizer_problems(&split);
        assert!(
            p.len() == 1 && p[0].starts_with("pre_tokenizer.pretokenizers[0].pattern:"),
            "{p:?}"
        );
    }

    #[test]
    fn annotations_name_what_changes_an_answer_and_only_what_is_set() {
        let a = text().annotations();
        let keys: Vec<&str> = a.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "text.max_length",
                "text.normalize",
                "text.pooling",
                "text.special_tokens",
                "text.tokenizer",
                "text.truncate"
            ]
        );
        assert_eq!(a["text.pooling"], "mean");
        let mut t = text();
        t.prefix = "query: ".into();
        t.activation = Activation::Sigmoid;
        t.labels = vec!["no".into(), "yes".into()];
        t.max_client_batch_size = 32;
        let a = t.annotations();
        assert_eq!(a["text.prefix"], "query: ");
        assert_eq!(a["text.activation"], "sigmoid");
        assert_eq!(a["text.labels"], "no,yes");
        assert_eq!(a["text.max_client_batch_size"], "32");
    }

    #[test]
    fn a_section_is_checked_against_the_engine_tensors() {
        let ids = tensor("input_ids", DataType::I64, &[-1, -1]);
        let mask = tensor("attention_mask", DataType::I64, &[-1, -1]);
        let hidden = tensor("last_hidden_state", DataType::F32, &[-1, -1, 384]);
        let pooled = tensor("last_hidden_state", DataType::F32, &[-1, 384]);
        let ok = text();
        assert_eq!(
            ok.problems(&[ids.clone(), mask.clone()], std::slice::from_ref(&hidden)),
            Vec::<String>::new()
        );
        let (served_in, served_out) = ok.served(std::slice::from_ref(&hidden)).unwrap();
        assert_eq!(served_in[0].dims, [-1, 1]);
        assert_eq!(served_in[0].datatype, DataType::Bytes);
        assert_eq!(served_out[0].dims, [-1, 384]);

        let cases: Vec<(Text, Vec<TensorSpec>, Vec<TensorSpec>, &str)> = vec![
            (
                Text {
                    input_ids: "ids".into(),
                    ..text()
                },
                vec![ids.clone(), mask.clone()],
                vec![hidden.clone()],
                "no input \"ids\"",
            ),
            (
                text(),
                vec![tensor("input_ids", DataType::F32, &[-1, -1]), mask.clone()],
                vec![hidden.clone()],
                "not INT64",
            ),
            (
                text(),
                vec![
                    ids.clone(),
                    mask.clone(),
                    tensor("token_type_ids", DataType::I64, &[-1, -1]),
                ],
                vec![hidden.clone()],
                "\"token_type_ids\" is not one the tokenizer fills",
            ),
            (
                text(),
                vec![ids.clone(), mask.clone()],
                vec![pooled.clone()],
                "reads a [batch, sequence, hidden] output",
            ),
            (
                Text {
                    pooling: Pooling::None,
                    ..text()
                },
                vec![ids.clone(), mask.clone()],
                vec![hidden.clone()],
                "reads a [batch, hidden] output",
            ),
            (
                Text {
                    output: "y".into(),
                    ..text()
                },
                vec![ids.clone(), mask.clone()],
                vec![hidden.clone()],
                "no output \"y\"",
            ),
            (
                Text {
                    max_length: 0,
                    ..text()
                },
                vec![ids.clone(), mask.clone()],
                vec![hidden.clone()],
                "max_length 0",
            ),
            (
                Text {
                    attention_mask: Some("input_ids".into()),
                    ..text()
                },
                vec![ids.clone()],
                vec![hidden.clone()],
                "different inputs",
            ),
        ];
        for (t, inputs, outputs, want) in cases {
            let p = t.problems(&inputs, &outputs).join("; ");
            assert!(p.contains(want), "{want:?} not in {p:?}");
        }
    }

    #[test]
    fn pooling_names_round_trip() {
        for p in Pooling::ALL {
            assert_eq!(Pooling::parse(p.as_str()), Some(p));
        }
        assert_eq!(Pooling::parse("max"), None);
        for a in Activation::ALL {
            assert_eq!(Activation::parse(a.as_str()), Some(a));
        }
    }
}
