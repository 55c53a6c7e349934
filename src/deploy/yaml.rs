//! A tiny, deterministic YAML writer for the manifests `deploy` emits.
//!
//! Kubernetes YAML is a tree of maps, sequences and scalars; what a serializer cannot give us
//! is comments, and the comments are the point: every derived number (probe budget, grace
//! period) carries its arithmetic. Keys keep their insertion order, strings are always written
//! double-quoted with JSON escapes (a subset of YAML's), so nothing is ever re-typed by a YAML
//! parser (`"on"`, `"1.0"`, `"0755"` stay strings).

use std::fmt::Write as _;

/// One YAML value.
#[derive(Debug, Clone, PartialEq)]
pub enum Node {
    Str(String),
    Int(i64),
    Bool(bool),
    Map(Vec<Entry>),
    Seq(Vec<Node>),
}

/// One key of a map, with comment lines written just above it.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub key: String,
    pub value: Node,
    pub comments: Vec<String>,
}

impl Node {
    pub fn str(s: impl Into<String>) -> Node {
        Node::Str(s.into())
    }
}

impl From<&str> for Node {
    fn from(s: &str) -> Node {
        Node::Str(s.to_string())
    }
}
impl From<String> for Node {
    fn from(s: String) -> Node {
        Node::Str(s)
    }
}
impl From<i64> for Node {
    fn from(v: i64) -> Node {
        Node::Int(v)
    }
}
impl From<u64> for Node {
    fn from(v: u64) -> Node {
        Node::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}
impl From<u32> for Node {
    fn from(v: u32) -> Node {
        Node::Int(i64::from(v))
    }
}
impl From<bool> for Node {
    fn from(v: bool) -> Node {
        Node::Bool(v)
    }
}
impl From<Vec<Node>> for Node {
    fn from(v: Vec<Node>) -> Node {
        Node::Seq(v)
    }
}
impl From<Map> for Node {
    fn from(m: Map) -> Node {
        Node::Map(m.0)
    }
}

/// A builder for map nodes that keeps insertion order.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Map(pub Vec<Entry>);

impl Map {
    pub(crate) fn new() -> Map {
        Map(Vec::new())
    }

    /// Add `key: value`.
    pub(crate) fn kv(mut self, key: &str, value: impl Into<Node>) -> Map {
        self.0.push(Entry {
            key: key.to_string(),
            value: value.into(),
            comments: Vec::new(),
        });
        self
    }

    /// Add `key: value` preceded by comment lines (each written as `# line`).
    pub(crate) fn kv_c(mut self, comments: &[String], key: &str, value: impl Into<Node>) -> Map {
        self.0.push(Entry {
            key: key.to_string(),
            value: value.into(),
            comments: comments.to_vec(),
        });
        self
    }

    /// Add `key: value` when `value` is some.
    pub(crate) fn opt(self, key: &str, value: Option<impl Into<Node>>) -> Map {
        match value {
            Some(v) => self.kv(key, v),
            None => self,
        }
    }
}

/// Render one YAML document (without the `---` separator).
pub(crate) fn render(node: &Node) -> String {
    let mut out = String::new();
    match node {
        Node::Map(entries) if !entries.is_empty() => write_map(&mut out, entries, 0),
        Node::Seq(items) if !items.is_empty() => write_seq(&mut out, items, 0),
        other => {
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
    out
}

fn pad(out: &mut String, indent: usize) {
    for _ in 0..indent {
        out.push(' ');
    }
}

fn write_comments(out: &mut String, comments: &[String], indent: usize) {
    for c in comments {
        for line in c.lines() {
            pad(out, indent);
            if line.is_empty() {
                out.push_str("#\n");
            } else {
                let _ = writeln!(out, "# {line}");
            }
        }
    }
}

fn is_block(node: &Node) -> bool {
    match node {
        Node::Map(m) => !m.is_empty(),
        Node::Seq(s) => !s.is_empty(),
        _ => false,
    }
}

fn write_map(out: &mut String, entries: &[Entry], indent: usize) {
    for e in entries {
        write_comments(out, &e.comments, indent);
        pad(out, indent);
        write_entry(out, e, indent);
    }
}

/// Write `key: value` assuming the cursor is already at the key's column.
fn write_entry(out: &mut String, e: &Entry, indent: usize) {
    out.push_str(&key(&e.key));
    out.push(':');
    match &e.value {
        Node::Map(m) if !m.is_empty() => {
            out.push('\n');
            write_map(out, m, indent + 2);
        }
        Node::Seq(s) if !s.is_empty() => {
            out.push('\n');
            // Sequences under a key are indented by two, as kubectl writes them.
            write_seq(out, s, indent + 2);
        }
        other => {
            out.push(' ');
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn write_seq(out: &mut String, items: &[Node], indent: usize) {
    for item in items {
        match item {
            Node::Map(m) if !m.is_empty() => {
                // Comments of the first key go above the dash.
                write_comments(out, &m[0].comments, indent);
                pad(out, indent);
                out.push_str("- ");
                write_entry(out, &m[0], indent + 2);
                write_map(out, &m[1..], indent + 2);
            }
            Node::Seq(s) if !s.is_empty() => {
                pad(out, indent);
                out.push_str("-\n");
                write_seq(out, s, indent + 2);
            }
            other => {
                debug_assert!(!is_block(other));
                pad(out, indent);
                out.push_str("- ");
                out.push_str(&scalar(other));
                out.push('\n');
            }
        }
    }
}

fn scalar(node: &Node) -> String {
    match node {
        Node::Str(s) => quote(s),
        Node::Int(v) => v.to_string(),
        Node::Bool(b) => b.to_string(),
        Node::Map(_) => "{}".to_string(),
        Node::Seq(_) => "[]".to_string(),
    }
}

/// A double-quoted YAML string: JSON's escapes are all valid YAML escapes.
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

fn key(k: &str) -> String {
    let plain = !k.is_empty()
        && k
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))
        && k.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        // YAML 1.1 readers turn these into booleans or null.
        && !matches!(
            k.to_ascii_lowercase().as_str(),
            "y" | "n" | "yes" | "no" | "on" | "off" | "true" | "false" | "null"
        );
    if plain {
        k.to_string()
    } else {
        quote(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(node: Node, expected: &str) {
        assert_eq!(render(&node), expected);
    }

    #[test]
    fn maps_sequences_and_comments() {
        let doc = Map::new()
            .kv("apiVersion", "v1")
            .kv_c(&["why this number".into()], "replicas", 3i64)
            .kv(
                "items",
                vec![
                    Map::new()
                        .kv_c(&["first".into()], "name", "a")
                        .kv("on", true)
                        .into(),
                    Node::str("0755"),
                ],
            )
            .kv("empty", Map::new())
            .kv("nested", Map::new().kv("k", Vec::<Node>::new()));
        check(
            doc.into(),
            "apiVersion: \"v1\"\n# why this number\nreplicas: 3\nitems:\n  # first\n  - name: \"a\"\n    \"on\": true\n  - \"0755\"\nempty: {}\nnested:\n  k: []\n",
        );
    }

    #[test]
    fn odd_keys_and_strings_are_quoted() {
        check(
            Map::new()
                .kv("nvidia.com/gpu", "1")
                .kv("a b", "x\"y\n")
                .into(),
            "nvidia.com/gpu: \"1\"\n\"a b\": \"x\\\"y\\n\"\n",
        );
    }
}
