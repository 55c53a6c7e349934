//! The first stage: reading the spanned TOML tree ([`toml::de::DeTable`], which keeps a byte
//! range for every key and value) with typed accessors that report instead of failing.
//!
//! Every accessor records a [`Diagnostic`] and returns `None` (or a default) on a problem, so
//! one pass over the tree collects every problem in the file. Unknown keys are found per table
//! against the list of keys that table allows, with the closest one suggested.

use std::path::Path;

use toml::de::{DeArray, DeTable, DeValue};
use toml::Spanned;

use super::diagnostic::{Diagnostic, LineIndex, Located, Span};

pub(crate) type Value<'i> = Spanned<DeValue<'i>>;

/// A table being read: its contents, its dotted key and where it is (the span of its key in the
/// header, or 1:1 for the document root).
#[derive(Clone)]
pub(crate) struct Table<'a, 'i> {
    pub(crate) inner: &'a DeTable<'i>,
    pub(crate) key: String,
    pub(crate) span: Span,
}

/// Collects diagnostics while reading one recipe.
pub(crate) struct Checker<'s> {
    pub(crate) file: &'s Path,
    /// The top-level tables, to explain a top-level key written below another table's header.
    pub(crate) root_keys: &'static [&'static str],
    lines: LineIndex<'s>,
    pub(crate) diagnostics: Vec<Diagnostic>,
}

/// Join a dotted key, quoting the new part when it is not a bare TOML key.
pub(crate) fn join(parent: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let part = if bare {
        key.to_string()
    } else {
        format!("{key:?}")
    };
    if parent.is_empty() {
        part
    } else {
        format!("{parent}.{part}")
    }
}

/// The `[section]` spelling of a dotted table key, for messages (`the document` for the root).
pub(crate) fn table_name(key: &str) -> String {
    if key.is_empty() {
        "the top level".to_string()
    } else {
        format!("[{key}]")
    }
}

/// How a value reads in "found …": `string "eight"`, `integer 8`, `array`…
pub(crate) fn describe(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => {
            let mut shown: String = s.chars().take(40).collect();
            if s.chars().count() > 40 {
                shown.push('…');
            }
            format!("string {shown:?}")
        }
        DeValue::Integer(i) => format!("integer {}", shorten(&i.to_string())),
        DeValue::Float(f) => format!("float {}", shorten(f.as_str())),
        DeValue::Boolean(b) => format!("boolean {b}"),
        DeValue::Datetime(d) => format!("datetime {d}"),
        DeValue::Array(_) => "an array".to_string(),
        DeValue::Table(_) => "a table".to_string(),
    }
}

fn shorten(s: &str) -> String {
    if s.chars().count() > 24 {
        let head: String = s.chars().take(20).collect();
        format!("{head}…")
    } else {
        s.to_string()
    }
}

/// Edit distance counting insertions, deletions, substitutions and swaps of neighbours
/// (optimal string alignment), for "did you mean" suggestions: `fp61` is one swap from `fp16`.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    // d[i][j]: distance between a[..i] and b[..j].
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// The candidate closest to `word`, when it is close enough to be what the user meant.
/// Case and `-`/`_` differences are ignored first (`max-batch-size`, `Max_Batch_Size`).
pub(crate) fn closest<'c>(word: &str, candidates: &[&'c str]) -> Option<&'c str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('-', "_");
    let w = norm(word);
    if let Some(c) = candidates.iter().find(|c| norm(c) == w) {
        return Some(c);
    }
    // Comparing at most 64 characters keeps this cheap on absurd input.
    let w: String = w.chars().take(64).collect();
    // A word that is a prefix of a key, or has one as its prefix, is a likely abbreviation or
    // extension (`batch` for `batching`, `deployment` for `deploy`).
    if w.chars().count() >= 4 {
        if let Some(c) = candidates.iter().find(|c| {
            let c = norm(c);
            c.starts_with(&w) || w.starts_with(&c)
        }) {
            return Some(c);
        }
    }
    let limit = (w.chars().count() / 3).clamp(1, 3);
    candidates
        .iter()
        .map(|c| (edit_distance(&w, &norm(c)), *c))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c)
}

impl<'s> Checker<'s> {
    pub(crate) fn new(file: &'s Path, source: &'s str) -> Self {
        Checker {
            file,
            root_keys: &[],
            lines: LineIndex::new(source),
            diagnostics: Vec::new(),
        }
    }

    pub(crate) fn span(&self, range: std::ops::Range<usize>) -> Span {
        self.lines.span(range)
    }

    pub(crate) fn span_of<T>(&self, v: &Spanned<T>) -> Span {
        self.lines.span(v.span())
    }

    /// Record a problem; returns it so the caller can add a hint with [`Checker::hint`].
    pub(crate) fn error(&mut self, span: Span, key: &str, message: impl Into<String>) {
        self.diagnostics
            .push(Diagnostic::new(self.file, span, key, message));
    }

    /// Record a problem with a hint.
    pub(crate) fn error_hint(
        &mut self,
        span: Span,
        key: &str,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.diagnostics
            .push(Diagnostic::new(self.file, span, key, message).with_hint(hint));
    }

    /// The root table of a document.
    pub(crate) fn root<'a, 'i>(&self, table: &'a DeTable<'i>) -> Table<'a, 'i> {
        Table {
            inner: table,
            key: String::new(),
            span: Span::START,
        }
    }

    /// Report every key of `table` that is not in `allowed`, suggesting the closest allowed key.
    pub(crate) fn unknown_keys(&mut self, table: &Table<'_, '_>, allowed: &[&str]) {
        for (k, v) in table.inner.iter() {
            let full: &str = k.get_ref();
            if allowed.contains(&full) {
                continue;
            }
            // A key is quoted back shortened: a recipe of long junk keys cannot turn into
            // messages many times its size.
            let short = shorten(full);
            let name: &str = &short;
            let key = join(&table.key, name);
            let span = self.span_of(k);
            let is_table = matches!(v.get_ref(), DeValue::Table(_));
            let mut message = if table.key.is_empty() && is_table {
                format!("unknown table [{name}]")
            } else {
                format!("unknown key `{name}` in {}", table_name(&table.key))
            };
            if let Some(c) = closest(name, allowed) {
                if table.key.is_empty() && is_table {
                    message.push_str(&format!("; did you mean [{c}]?"));
                } else {
                    message.push_str(&format!("; did you mean `{c}`?"));
                }
            }
            let hint = if !table.key.is_empty() && self.root_keys.contains(&name) {
                format!(
                    "`{name}` is a top-level table, but here it falls under {}: keys belong to the last [header] above them; write `[{name}]` on its own line",
                    table_name(&table.key)
                )
            } else if table.key.is_empty() {
                format!(
                    "a recipe has the tables {}",
                    allowed
                        .iter()
                        .map(|a| format!("[{a}]"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            } else {
                format!(
                    "valid keys in {}: {}",
                    table_name(&table.key),
                    allowed.join(", ")
                )
            };
            self.error_hint(span, &key, message, hint);
        }
    }

    /// The value at `name` in `table`, with its dotted key, when present.
    pub(crate) fn get<'a, 'i>(
        &self,
        table: &Table<'a, 'i>,
        name: &str,
    ) -> Option<(&'a Value<'i>, String, Span)> {
        table
            .inner
            .get(name)
            .map(|v| (v, join(&table.key, name), self.span_of(v)))
    }

    /// Record that a required key is missing from `table`.
    pub(crate) fn missing(&mut self, table: &Table<'_, '_>, name: &str, example: &str) {
        let key = join(&table.key, name);
        let where_ = table_name(&table.key);
        self.error_hint(
            table.span,
            &key,
            format!("missing required key `{name}` in {where_}"),
            format!("add `{name} = {example}` to {where_}"),
        );
    }

    /// Record a wrong type or out-of-range value: "expected …, found …".
    pub(crate) fn expected(&mut self, v: &Value<'_>, key: &str, what: &str) {
        let span = self.span_of(v);
        let found = describe(v.get_ref());
        self.error(span, key, format!("expected {what}, found {found}"));
    }

    pub(crate) fn expected_hint(&mut self, v: &Value<'_>, key: &str, what: &str, hint: &str) {
        let span = self.span_of(v);
        let found = describe(v.get_ref());
        self.error_hint(span, key, format!("expected {what}, found {found}"), hint);
    }

    /// A sub-table, or `None` (with a diagnostic when the key holds something else).
    pub(crate) fn table<'a, 'i>(
        &mut self,
        parent: &Table<'a, 'i>,
        name: &str,
    ) -> Option<Table<'a, 'i>> {
        let (k, v) = parent.inner.get_key_value(name)?;
        let key = join(&parent.key, name);
        match v.get_ref() {
            DeValue::Table(t) => Some(Table {
                inner: t,
                span: self.span_of(k),
                key,
            }),
            _ => {
                let hint = format!("write it as a table: `[{key}]` followed by its keys");
                self.expected_hint(v, &key, "a table", &hint);
                None
            }
        }
    }

    /// A string value; wrong types are reported.
    pub(crate) fn string(&mut self, table: &Table<'_, '_>, name: &str) -> Option<Located<String>> {
        let (v, key, span) = self.get(table, name)?;
        match v.get_ref() {
            DeValue::String(s) => Some(Located::new(s.to_string(), span, key)),
            DeValue::Integer(_) | DeValue::Float(_) => {
                let raw = describe(v.get_ref());
                let number = raw.split_once(' ').map(|(_, n)| n).unwrap_or("");
                let hint = format!("quote it: `{name} = \"{number}\"`");
                self.expected_hint(v, &key, "a string", &hint);
                None
            }
            _ => {
                self.expected(v, &key, "a string");
                None
            }
        }
    }

    /// A required string value.
    pub(crate) fn required_string(
        &mut self,
        table: &Table<'_, '_>,
        name: &str,
        example: &str,
    ) -> Option<Located<String>> {
        if table.inner.get(name).is_none() {
            self.missing(table, name, example);
            return None;
        }
        self.string(table, name)
    }

    /// A boolean value.
    pub(crate) fn bool(&mut self, table: &Table<'_, '_>, name: &str) -> Option<Located<bool>> {
        let (v, key, span) = self.get(table, name)?;
        match v.get_ref() {
            DeValue::Boolean(b) => Some(Located::new(*b, span, key)),
            DeValue::String(s) if s.as_ref() == "true" || s.as_ref() == "false" => {
                let hint = format!("drop the quotes: `{name} = {s}`");
                self.expected_hint(v, &key, "a boolean", &hint);
                None
            }
            _ => {
                self.expected(v, &key, "a boolean (true or false)");
                None
            }
        }
    }

    /// An integer within `min..=max` read from one value; `what` names the expectation
    /// ("a positive integer").
    pub(crate) fn int_value(
        &mut self,
        v: &Value<'_>,
        key: &str,
        min: i64,
        max: i64,
        what: &str,
    ) -> Option<i64> {
        match v.get_ref() {
            DeValue::Integer(i) => {
                let n = i128::from_str_radix(i.as_str(), i.radix()).ok();
                match n.and_then(|n| i64::try_from(n).ok()) {
                    Some(n) if (min..=max).contains(&n) => Some(n),
                    Some(_) => {
                        self.expected(v, key, what);
                        None
                    }
                    None => {
                        self.expected_hint(
                            v,
                            key,
                            what,
                            &format!("the largest value allowed here is {max}"),
                        );
                        None
                    }
                }
            }
            DeValue::String(s) if s.trim().parse::<i64>().is_ok() => {
                let hint = format!("drop the quotes: `{} = {}`", last_key(key), s.trim());
                self.expected_hint(v, key, what, &hint);
                None
            }
            DeValue::String(_) => {
                self.expected_hint(v, key, what, "write a number without quotes");
                None
            }
            DeValue::Float(_) => {
                self.expected_hint(v, key, what, "write a whole number");
                None
            }
            _ => {
                self.expected(v, key, what);
                None
            }
        }
    }

    /// An integer key within `min..=max`.
    pub(crate) fn int(
        &mut self,
        table: &Table<'_, '_>,
        name: &str,
        min: i64,
        max: i64,
        what: &str,
    ) -> Option<Located<i64>> {
        let (v, key, span) = self.get(table, name)?;
        let n = self.int_value(v, &key, min, max, what)?;
        Some(Located::new(n, span, key))
    }

    /// An array; wrong types are reported. Returns the items with their dotted keys.
    pub(crate) fn array<'a, 'i>(
        &mut self,
        table: &Table<'a, 'i>,
        name: &str,
        what: &str,
        example: &str,
    ) -> Option<(&'a DeArray<'i>, String, Span)> {
        let (v, key, span) = self.get(table, name)?;
        match v.get_ref() {
            DeValue::Array(a) => Some((a, key, span)),
            _ => {
                let hint = format!("write a list: `{name} = {example}`");
                self.expected_hint(v, &key, what, &hint);
                None
            }
        }
    }

    /// An array of integers each within `min..=max`. `None` when any item is wrong (all
    /// wrong items are reported).
    pub(crate) fn int_array(
        &mut self,
        table: &Table<'_, '_>,
        name: &str,
        min: i64,
        max: i64,
        what_item: &str,
        example: &str,
    ) -> Option<Located<Vec<Located<i64>>>> {
        let (arr, key, span) =
            self.array(table, name, &format!("an array of {what_item}s"), example)?;
        self.int_items(arr, &key, span, min, max, what_item)
    }

    /// Like [`Checker::int_array`], but keeps the valid items when some are wrong, for lists
    /// whose remaining items are still worth checking against other keys.
    pub(crate) fn int_array_valid(
        &mut self,
        table: &Table<'_, '_>,
        name: &str,
        min: i64,
        max: i64,
        what_item: &str,
        example: &str,
    ) -> Option<Located<Vec<Located<i64>>>> {
        let (arr, key, span) =
            self.array(table, name, &format!("an array of {what_item}s"), example)?;
        Some(self.int_items_all(arr, &key, span, min, max, what_item).0)
    }

    pub(crate) fn int_items(
        &mut self,
        arr: &DeArray<'_>,
        key: &str,
        span: Span,
        min: i64,
        max: i64,
        what_item: &str,
    ) -> Option<Located<Vec<Located<i64>>>> {
        let (list, ok) = self.int_items_all(arr, key, span, min, max, what_item);
        ok.then_some(list)
    }

    /// The valid items of an integer array, and whether all of them were valid.
    fn int_items_all(
        &mut self,
        arr: &DeArray<'_>,
        key: &str,
        span: Span,
        min: i64,
        max: i64,
        what_item: &str,
    ) -> (Located<Vec<Located<i64>>>, bool) {
        let mut out = Vec::with_capacity(arr.len().min(64));
        let mut ok = true;
        for (i, item) in arr.iter().enumerate() {
            let item_key = format!("{key}[{i}]");
            match self.int_value(item, &item_key, min, max, &format!("a {what_item}")) {
                Some(n) => out.push(Located::new(n, self.span_of(item), item_key)),
                None => ok = false,
            }
        }
        (Located::new(out, span, key), ok)
    }
}

/// The last component of a dotted key (`max_batch_size` of `batching.max_batch_size`), for
/// hints that show a line to write.
pub(crate) fn last_key(key: &str) -> &str {
    let key = key.split('[').next().unwrap_or(key);
    key.rsplit('.').next().unwrap_or(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suggestions() {
        let keys = ["max_batch_size", "preferred_batch_sizes", "instances"];
        assert_eq!(closest("max_batchsize", &keys), Some("max_batch_size"));
        assert_eq!(closest("max-batch-size", &keys), Some("max_batch_size"));
        assert_eq!(closest("instance", &keys), Some("instances"));
        assert_eq!(closest("colour", &keys), None);
        assert_eq!(closest("", &keys), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn dotted_keys_quote_what_is_not_bare() {
        assert_eq!(join("", "model"), "model");
        assert_eq!(join("model.inputs", "input.1"), "model.inputs.\"input.1\"");
        assert_eq!(last_key("targets.gpus[2]"), "gpus");
    }
}
