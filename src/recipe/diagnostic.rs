//! Source positions and diagnostics: what every recipe problem (and every later refusal that
//! points back into a recipe, such as the plan's compatibility checks) is reported as.
//!
//! A [`Span`] is computed once, while parsing, from the byte range the TOML parser reports, so
//! later stages can name `file:line:col` without keeping the source text around.

use std::fmt;
use std::path::{Path, PathBuf};

/// Where something is in the recipe's source: a byte range plus its 1-based line and column
/// (columns count characters, not bytes, so they match what an editor shows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Span {
    /// 1-based line of the first byte.
    pub line: u32,
    /// 1-based column (in characters) of the first byte.
    pub col: u32,
    /// Byte offset of the first byte.
    pub start: usize,
    /// Byte offset one past the last byte.
    pub end: usize,
}

impl Span {
    /// The start of the file (1:1), used for problems that belong to no particular place, such
    /// as a missing required table.
    pub(crate) const START: Span = Span {
        line: 1,
        col: 1,
        start: 0,
        end: 0,
    };
}

/// A value together with where it was written in the recipe and its dotted key, so that later
/// stages (the plan's matrix checks) can point at it: `recipe.toml:14:9: targets.gpus[1]: …`.
///
/// For a value the recipe leaves to its default, `span` points at the table that would hold it
/// (or at 1:1 when the table is absent too), which is where the user would write it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located<T> {
    pub value: T,
    pub span: Span,
    /// The dotted key, such as `targets.gpus[1]` or `image.tag`.
    pub key: String,
}

impl<T> Located<T> {
    pub fn new(value: T, span: Span, key: impl Into<String>) -> Self {
        Located {
            value,
            span,
            key: key.into(),
        }
    }

    /// A diagnostic about this value in `file` (the recipe's path, [`super::Recipe::file`]).
    pub fn diagnostic(&self, file: &Path, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(file, self.span, self.key.clone(), message)
    }

    /// The same location with another value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Located<U> {
        Located {
            value: f(self.value),
            span: self.span,
            key: self.key,
        }
    }
}

impl<T> std::ops::Deref for Located<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// One problem with a recipe: where it is, which key, what is wrong, and what to do about it.
///
/// Rendered as
/// ```text
/// recipe.toml:12:18: batching.max_batch_size: expected a positive integer, found string "eight"
///   hint: write a number without quotes, such as `max_batch_size = 8`
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The recipe's path as the user gave it.
    pub file: PathBuf,
    /// 1-based line.
    pub line: u32,
    /// 1-based column, in characters.
    pub col: u32,
    /// The dotted key (`batching.max_batch_size`, `targets.gpus[1]`); empty for problems with the
    /// document as a whole (a TOML syntax error, invalid UTF-8).
    pub key: String,
    /// What is wrong: lowercase, no trailing period.
    pub message: String,
    /// What to do about it, when there is something useful to say.
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(
        file: &Path,
        span: Span,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Diagnostic {
            file: file.to_path_buf(),
            line: span.line,
            col: span.col,
            key: key.into(),
            message: message.into(),
            hint: None,
        }
    }

    /// The same diagnostic with a hint line.
    pub(crate) fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file.display(), self.line, self.col)?;
        if !self.key.is_empty() {
            write!(f, "{}: ", self.key)?;
        }
        f.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// Render diagnostics one after the other, each on its own line(s), in the order given.
pub fn render(diagnostics: &[Diagnostic]) -> String {
    let mut out = String::new();
    for (i, d) in diagnostics.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&d.to_string());
    }
    out
}

/// Sort diagnostics by position (then key and message) and drop exact duplicates, so the output
/// reads top to bottom like the file and does not depend on the order checks ran in.
pub fn sort(diagnostics: &mut Vec<Diagnostic>) {
    diagnostics.sort_by(|a, b| {
        (&a.file, a.line, a.col, &a.key, &a.message)
            .cmp(&(&b.file, b.line, b.col, &b.key, &b.message))
    });
    diagnostics.dedup();
}

/// Maps byte offsets of one source text to 1-based line and column.
pub(crate) struct LineIndex<'s> {
    source: &'s str,
    /// Byte offset at which each line starts.
    starts: Vec<usize>,
}

impl<'s> LineIndex<'s> {
    pub(crate) fn new(source: &'s str) -> Self {
        let mut starts = vec![0];
        starts.extend(source.match_indices('\n').map(|(i, _)| i + 1));
        LineIndex { source, starts }
    }

    /// The span of `range`, clamped to the source and to character boundaries so that any
    /// range (even one from a confused parser) gives an answer instead of a panic.
    pub(crate) fn span(&self, range: std::ops::Range<usize>) -> Span {
        let mut start = range.start.min(self.source.len());
        while !self.source.is_char_boundary(start) {
            start -= 1;
        }
        let end = range.end.clamp(start, self.source.len());
        let line_idx = match self.starts.binary_search(&start) {
            Ok(i) => i,
            Err(i) => i.saturating_sub(1),
        };
        let line_start = self.starts.get(line_idx).copied().unwrap_or(0);
        let col = self
            .source
            .get(line_start..start)
            .map(|s| s.chars().count())
            .unwrap_or(0);
        Span {
            line: u32::try_from(line_idx + 1).unwrap_or(u32::MAX),
            col: u32::try_from(col + 1).unwrap_or(u32::MAX),
            start,
            end,
        }
    }
}

/// Line and column (1-based, column in bytes since the text is not UTF-8) of byte `offset` in
/// `bytes`, for reporting invalid UTF-8.
pub(crate) fn byte_position(bytes: &[u8], offset: usize) -> (u32, u32) {
    let before = &bytes[..offset.min(bytes.len())];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map(|i| i + 1)
        .unwrap_or(0);
    let col = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (
        u32::try_from(line).unwrap_or(u32::MAX),
        u32::try_from(col).unwrap_or(u32::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_count_lines_and_characters() {
        let src = "a = 1\né = \"x\"\n";
        let ix = LineIndex::new(src);
        assert_eq!((ix.span(0..1).line, ix.span(0..1).col), (1, 1));
        let at = src.find('=').unwrap();
        assert_eq!((ix.span(at..at).line, ix.span(at..at).col), (1, 3));
        let at = src.rfind('=').unwrap();
        // `é` is two bytes but one column.
        assert_eq!((ix.span(at..at).line, ix.span(at..at).col), (2, 3));
        // Out-of-range and mid-character offsets are clamped, not a panic.
        let s = ix.span(7..1000);
        assert_eq!((s.line, s.col), (2, 1));
        let s = ix.span(10_000..10_001);
        assert_eq!(s.line, 3);
    }

    #[test]
    fn renders_with_and_without_key_and_hint() {
        let d = Diagnostic::new(
            Path::new("r.toml"),
            Span {
                line: 3,
                col: 7,
                start: 0,
                end: 0,
            },
            "batching.instances",
            "expected a positive integer, found integer 0",
        )
        .with_hint("use 1 or more");
        assert_eq!(
            d.to_string(),
            "r.toml:3:7: batching.instances: expected a positive integer, found integer 0\n  hint: use 1 or more"
        );
        let d = Diagnostic::new(Path::new("r.toml"), Span::START, "", "bad");
        assert_eq!(d.to_string(), "r.toml:1:1: bad");
    }

    #[test]
    fn invalid_utf8_positions() {
        assert_eq!(byte_position(b"ab\ncd\xff", 5), (2, 3));
        assert_eq!(byte_position(b"\xff", 0), (1, 1));
    }
}
