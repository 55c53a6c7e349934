//! The checks of a text model's tokenizer (`[text] tokenizer`) that `build` and `check` share,
//! so that `check` refuses every tokenizer `build` would, at the same `file:line:col` in the
//! same words: the file is read bounded ([`infer_spec::text::MAX_TOKENIZER_BYTES`]), parsed by
//! the tokenizer library the runtime uses, free of settings that make tokenizing superlinear
//! ([`infer_spec::text::tokenizer_problems`], which the runtime runs at start too), and gives no
//! id past the model's embedding table for the ids input (the table's rows from the ONNX
//! graph, [`OnnxSummary::embedding_rows`]).
//!
//! Reads files; the recipe itself stays as `recipe::parse` made it.

use std::path::Path;
use std::sync::Arc;

use crate::assemble;
use crate::engine::onnx::OnnxSummary;
use crate::error::Error;
use crate::recipe::{Recipe, Text};

/// The most problems one refusal lists; the rest are counted. A tokenizer is foreign input,
/// and error output is bounded.
const MAX_PROBLEMS: usize = 10;

/// The most characters of one problem or token a refusal shows: every sentence
/// `tokenizer_problems` writes fits, unless the regular expression it quotes is itself longer.
const MAX_SHOWN_CHARS: usize = 1000;

/// The summary of the ONNX model at `model`, or `None` when it cannot be read or parsed: the
/// engine stage refuses such a model, with the parser's reason.
pub(crate) fn model_summary(model: &Path) -> Option<OnnxSummary> {
    std::fs::read(model)
        .ok()
        .and_then(|b| OnnxSummary::from_bytes(&b).ok())
}

/// `check`'s part: the recipe's tokenizer, when it has `[text]`, checked as `build` checks it
/// (the model summarised for its embedding table).
pub(crate) fn check_tokenizer(recipe: &Recipe) -> Result<(), Error> {
    let Some(t) = &recipe.text else {
        return Ok(());
    };
    let (model, _) = assemble::safe_input(&recipe.dir, &recipe.model.onnx.value)?;
    read_tokenizer(recipe, t, model_summary(&model).as_ref()).map(drop)
}

/// The tokenizer `[text]` names, read (bounded) and parsed by the tokenizer library the
/// runtime uses, so that no image ships one its runtime would refuse at start or that would
/// hold a core for minutes on one request.
///
/// Its largest id (added tokens included) must be inside the model's embedding table for the
/// ids input (when the model's ids index one): a larger id would read past the table's end.
/// The count of tokens is not enough: ids need not be dense.
pub(crate) fn read_tokenizer(
    recipe: &Recipe,
    t: &Text,
    summary: Option<&OnnxSummary>,
) -> Result<Arc<[u8]>, Error> {
    let (p, _) = assemble::safe_input(&recipe.dir, &t.tokenizer.value)?;
    let refuse = |message: String| {
        Error::Usage(
            t.tokenizer
                .diagnostic(&recipe.file, format!("{}: {message}", p.display()))
                .to_string(),
        )
    };
    let bytes =
        match crate::oci::dir::read_file(&p, infer_spec::text::MAX_TOKENIZER_BYTES, "tokenizer") {
            Ok(b) => b,
            Err(crate::oci::Error::TooBig { size, limit, .. }) => {
                return Err(refuse(format!(
                    "the file has {size} bytes, more than a tokenizer.json may have ({limit})"
                )))
            }
            Err(e) => return Err(e.into()),
        };
    let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| refuse(format!("not a tokenizer.json the runtime reads: {e}")))?;
    // The library read it, so it is JSON.
    let json: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| refuse(format!("not a tokenizer.json the runtime reads: {e}")))?;
    let mut problems = infer_spec::text::tokenizer_problems(&json);
    let rows = summary.and_then(|s| {
        s.embedding_rows
            .iter()
            .filter(|(input, _)| *input == t.input_ids)
            .map(|&(_, rows)| rows)
            .min()
    });
    if let Some(rows) = rows {
        let vocab = tokenizer.get_vocab(true);
        problems.extend(largest_id_problem(
            vocab.iter().map(|(token, &id)| (token.as_str(), id)),
            &t.input_ids,
            rows,
        ));
    }
    if problems.is_empty() {
        Ok(bytes.into())
    } else {
        Err(refuse(listed(&problems)))
    }
}

/// The sentence refusing a tokenizer whose largest id is past the table of `rows` rows that
/// `input_ids` indexes, if it is (`vocab`: every token and its id, in any order).
fn largest_id_problem<'a>(
    vocab: impl Iterator<Item = (&'a str, u32)>,
    input_ids: &str,
    rows: i64,
) -> Option<String> {
    // The largest id, and of the tokens sharing it the greatest, whatever the order given.
    let (token, id) = vocab.max_by(|a, b| (a.1, a.0).cmp(&(b.1, b.0)))?;
    (i64::from(id) >= rows).then(|| {
        format!(
            "the tokenizer's largest id {id} (token {:?}) is past the model's embedding table for {input_ids:?} of {rows} rows",
            shortened(token)
        )
    })
}

/// `problems` as one message: `; `-separated, at most [`MAX_PROBLEMS`] of them, each cut to
/// [`MAX_SHOWN_CHARS`].
fn listed(problems: &[String]) -> String {
    let mut shown: Vec<String> = problems
        .iter()
        .take(MAX_PROBLEMS)
        .map(|p| shortened(p))
        .collect();
    if problems.len() > MAX_PROBLEMS {
        shown.push(format!(
            "and {} more problems",
            problems.len() - MAX_PROBLEMS
        ));
    }
    shown.join("; ")
}

/// `s` cut to [`MAX_SHOWN_CHARS`] characters, `…` marking a cut.
fn shortened(s: &str) -> String {
    match s.char_indices().nth(MAX_SHOWN_CHARS) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_id_not_the_count_is_held_to_the_table() {
        // Three tokens, well under 30522, but one of them has id 40000.
        let vocab = [("[UNK]", 0), ("[BIG]", 40000), ("a", 1)];
        assert_eq!(
            largest_id_problem(vocab.iter().copied(), "input_ids", 30522).as_deref(),
            Some(
                "the tokenizer's largest id 40000 (token \"[BIG]\") is past the model's embedding table for \"input_ids\" of 30522 rows"
            )
        );
        // The last row is an id the table holds; the one after it is not.
        assert_eq!(
            largest_id_problem(vocab.iter().copied(), "input_ids", 40001),
            None
        );
        assert!(largest_id_problem(vocab.iter().copied(), "ids", 40000).is_some());
        // Whatever order the vocabulary comes in, the same token is named.
        let shared = [("b", 7), ("a", 7)];
        let named = |v: &[(&str, u32)]| largest_id_problem(v.iter().copied(), "ids", 3);
        assert!(named(&shared).unwrap().contains("(token \"b\")"));
        assert_eq!(named(&shared), named(&[shared[1], shared[0]]));
        assert_eq!(largest_id_problem(std::iter::empty(), "ids", 3), None);
    }

    #[test]
    fn refusals_are_bounded() {
        let long = "x".repeat(10 * MAX_SHOWN_CHARS);
        let many: Vec<String> = (0..MAX_PROBLEMS + 3).map(|_| long.clone()).collect();
        let m = listed(&many);
        assert!(m.ends_with("; and 3 more problems"), "{m}");
        assert!(
            m.chars().count() < (MAX_PROBLEMS + 1) * (MAX_SHOWN_CHARS + 3),
            "{}",
            m.len()
        );
        assert_eq!(shortened("ünïcode"), "ünïcode");
        assert_eq!(
            shortened(&"é".repeat(MAX_SHOWN_CHARS + 1)),
            format!("{}…", "é".repeat(MAX_SHOWN_CHARS))
        );
    }
}
