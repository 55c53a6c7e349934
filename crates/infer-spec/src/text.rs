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
}

fn is_false(v: &bool) -> bool {
    !*v
}

impl Text {
    /// How text becomes tensors and tensors answers, as flat key/value pairs for image
    /// annotations (keys without the reverse-DNS prefix, sorted), so `inspect` shows them:
    /// `text.tokenizer`, `text.max_length`, `text.truncate`, `text.special_tokens`,
    /// `text.pooling`, `text.normalize`, and `text.prefix`, `text.token_budget`, `text.pairs`,
    /// `text.activation`, `text.labels` when set.
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
        match outputs.iter().find(|t| t.name == self.output) {
            None => p.push(format!(
                "text.output: the engine has no output {:?} (its outputs are {:?})",
                self.output,
                outputs.iter().map(|t| &t.name).collect::<Vec<_>>()
            )),
            Some(t) if t.datatype != DataType::F32 && t.datatype != DataType::F16 => {
                p.push(format!(
                    "text.output: output {:?} is {}, not FP32 or FP16",
                    t.name, t.datatype
                ))
            }
            Some(t) if t.dims.len() != self.pooling.output_rank() => {
                p.push(format!(
                "text.output: pooling {:?} reads a [batch{}, hidden] output; {:?} has dims {:?}",
                self.pooling.as_str(),
                if self.pooling == Pooling::None { "" } else { ", sequence" },
                t.name,
                t.dims
            ))
            }
            Some(t) if t.dims.last().is_none_or(|&d| d < 1) => p.push(format!(
                "text.output: {:?} must have a fixed last (hidden) dimension, has dims {:?}",
                t.name, t.dims
            )),
            Some(t) => {
                let width = t.dims.last().copied().unwrap_or(0);
                if !self.labels.is_empty() && self.labels.len() as i64 != width {
                    p.push(format!(
                        "text.labels: {} labels for an output of {width} columns",
                        self.labels.len()
                    ));
                }
            }
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
        }
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
        let a = t.annotations();
        assert_eq!(a["text.prefix"], "query: ");
        assert_eq!(a["text.activation"], "sigmoid");
        assert_eq!(a["text.labels"], "no,yes");
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
