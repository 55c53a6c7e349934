//! ARCHITECTURE.md names only what exists, and stays short enough to be read whole.
//!
//! Every code span of the document (outside fenced blocks) that looks like a repository path
//! must exist: relative to the repository root, or to a directory its `###` section's heading
//! names (`src/grpc/` under `crates/infer-serve/`); a bare file name (`check.rs`) must be in
//! one of those directories, or anywhere in the sources where the heading names none. Every
//! span that names a Rust item by path (`core::infer`, `Batcher::submit_all`,
//! `report::{BuildOutput, Inspection}`) must name something defined in the workspace: its last
//! identifier appears as an item (`fn`, `struct`, `enum`, `trait`, `mod`, `type`, `const`,
//! `static`), a field or an enum variant in a `.rs` file of `src/`, `crates/` or `tests/`. A
//! rename that leaves the document behind fails here, with every stale name listed at once.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The most words (whitespace-separated tokens) the document may have.
const MAX_WORDS: usize = 4000;

/// Path roots of other crates and tools, whose items are not ours to find.
const FOREIGN: &[&str] = &["std", "clippy", "toml", "serde", "tokio", "hyper", "ort"];

/// File endings that make a span a file path.
const FILE_ENDINGS: &[&str] = &[".rs", ".toml", ".md", ".sh", ".py"];

/// Where bare file names and defined items are looked for.
const SOURCE_DIRS: &[&str] = &["src", "crates", "tests", "fuzz", "scripts"];

/// What a code span names.
#[derive(Debug)]
enum Name {
    /// A path in the repository (a file, or a directory ending in `/`).
    Path(String),
    /// A bare file name (`check.rs`).
    File(String),
    /// The identifiers a Rust path ends in (one, or the members of a `{…}` group).
    Items(Vec<String>),
}

fn is_ident(s: &str) -> bool {
    s.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// What `span` names, or `None` for anything else (a key, a value, a command, a type alone).
fn classify(span: &str) -> Option<Name> {
    let pathlike = !span.is_empty()
        && !span.starts_with('/')
        && span
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-/".contains(c));
    let file = FILE_ENDINGS.iter().any(|e| span.ends_with(e));
    if pathlike && span.contains('/') && (file || span.ends_with('/')) {
        return Some(Name::Path(span.to_string()));
    }
    if pathlike
        && file
        && !span.contains('/')
        && [".rs", ".py", ".sh"].iter().any(|e| span.ends_with(e))
    {
        return Some(Name::File(span.to_string()));
    }
    let span = span.strip_suffix("()").unwrap_or(span);
    if let Some((path, group)) = span.split_once("::{") {
        let members = group.strip_suffix('}')?;
        let path: Vec<&str> = path.split("::").collect();
        let members: Vec<String> = members.split(',').map(|m| m.trim().to_string()).collect();
        let idents_ok = path
            .iter()
            .copied()
            .chain(members.iter().map(String::as_str))
            .all(is_ident);
        return (idents_ok && !FOREIGN.contains(&path[0])).then_some(Name::Items(members));
    }
    let parts: Vec<&str> = span.split("::").collect();
    (parts.len() > 1 && parts.iter().copied().all(is_ident) && !FOREIGN.contains(&parts[0]))
        .then(|| Name::Items(vec![parts[parts.len() - 1].to_string()]))
}

/// Each code span of `doc` outside fenced blocks, with the directories its `###` heading names.
fn spans(doc: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut dirs: Vec<String> = Vec::new();
    for line in doc.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let pieces = line.split('`').skip(1).step_by(2).map(str::to_string);
        if line.starts_with('#') {
            dirs = if line.starts_with("### ") {
                pieces.filter(|p| p.ends_with('/')).collect()
            } else {
                Vec::new()
            };
            continue;
        }
        out.extend(pieces.map(|p| (p, dirs.clone())));
    }
    out
}

/// Every file under `dirs` (relative to `root`), recursively.
fn files(root: &Path, dirs: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo: Vec<PathBuf> = dirs.iter().map(|d| root.join(d)).collect();
    while let Some(d) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The identifier `line` defines: an item after its keyword, a field (`name:`) or an enum
/// variant (`Name,`, `Name(`, `Name {`).
fn defined(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub(") {
        rest = r.split_once(')').map_or(r, |(_, r)| r).trim_start();
    } else if let Some(r) = rest.strip_prefix("pub ") {
        rest = r.trim_start();
    }
    for qualifier in ["async ", "unsafe ", "extern \"C\" "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    let ident_end = |s: &str| s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'));
    for kw in [
        "fn ", "struct ", "enum ", "trait ", "mod ", "type ", "const ", "static ",
    ] {
        if let Some(r) = rest.strip_prefix(kw) {
            let r = r.trim_start_matches("fn ").trim_start_matches("mut ");
            return Some(&r[..ident_end(r).unwrap_or(r.len())]).filter(|n| is_ident(n));
        }
    }
    let end = ident_end(rest)?;
    let (name, after) = rest.split_at(end);
    let after = after.trim_start();
    let field = after.starts_with(':') && !after.starts_with("::");
    let variant = name.starts_with(|c: char| c.is_ascii_uppercase())
        && (after.starts_with('(') || after.starts_with('{') || after.starts_with(','));
    (is_ident(name) && (field || variant)).then_some(name)
}

/// Every identifier the workspace's Rust sources define.
fn definitions(root: &Path) -> BTreeSet<String> {
    files(root, &["src", "crates", "tests"])
        .iter()
        .filter(|p| p.extension().is_some_and(|x| x == "rs"))
        .flat_map(|p| {
            let text = std::fs::read_to_string(p).unwrap();
            text.lines()
                .filter_map(|l| defined(l).map(str::to_string))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// What in `doc` names nothing in the repository at `root`, one line per stale name, and how
/// many paths and items were checked.
fn stale(doc: &str, root: &Path) -> (Vec<String>, usize) {
    let defs = definitions(root);
    let file_names: BTreeSet<String> = files(root, SOURCE_DIRS)
        .iter()
        .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
        .collect();
    let under = |dirs: &[String], name: &str| {
        dirs.iter().any(|d| {
            root.join(d).join(name).exists() || root.join(d).join("src").join(name).exists()
        })
    };
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (span, dirs) in spans(doc) {
        let ok = match classify(&span) {
            None => continue,
            Some(Name::Path(p)) => root.join(&p).exists() || under(&dirs, &p),
            Some(Name::File(f)) if dirs.is_empty() => file_names.contains(&f),
            Some(Name::File(f)) => under(&dirs, &f),
            Some(Name::Items(names)) => names.iter().all(|n| defs.contains(n)),
        };
        checked += 1;
        if !ok {
            wrong.push(format!("`{span}` (section directories: {dirs:?})"));
        }
    }
    (wrong, checked)
}

#[test]
fn architecture_names_only_what_exists() {
    let root = super::support::root();
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let words = doc.split_whitespace().count();
    assert!(
        words <= MAX_WORDS,
        "ARCHITECTURE.md has {words} words, at most {MAX_WORDS}: link to docs/ for detail"
    );
    let (wrong, checked) = stale(&doc, &root);
    assert!(
        checked >= 200,
        "only {checked} names checked: is the span scan broken?"
    );
    assert!(
        wrong.is_empty(),
        "ARCHITECTURE.md names what does not exist (rename it there, or remove it):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_architecture_scan_reports_made_up_names() {
    let root = super::support::root();
    let doc = "### `src/recipe/`\n\
               `check.rs`, `missing.rs`, `src/nowhere/`, `crates/infer-serve/src/core.rs`,\n\
               `core::infer`, `Batcher::submit_all`, `Document::check_bounds`,\n\
               `core::no_such_function`, `report::{BuildOutput, NoSuchReport}`,\n\
               `std::no_such_thing`, `engine.cpu`, `--json`\n\
               ```\n`src/fenced/`\n```\n";
    let (wrong, checked) = stale(doc, &root);
    assert_eq!(checked, 9, "{wrong:?}");
    let names: Vec<&str> = wrong.iter().map(|w| w.split('`').nth(1).unwrap()).collect();
    assert_eq!(
        names,
        [
            "missing.rs",
            "src/nowhere/",
            "core::no_such_function",
            "report::{BuildOutput, NoSuchReport}"
        ]
    );
}

#[test]
fn the_definition_scan_sees_items_fields_and_variants() {
    for (line, name) in [
        ("pub async fn infer(app: &Server) {", "infer"),
        ("pub(crate) const fn new() -> Self {", "new"),
        ("    pub(crate) struct Checker<'a> {", "Checker"),
        ("static ENV: Mutex<()> = Mutex::new(());", "ENV"),
        ("    pub onnxruntime: Option<LibraryPin>,", "onnxruntime"),
        ("    Onnxruntime,", "Onnxruntime"),
        ("    Download { url: String },", "Download"),
        ("    Usage(String),", "Usage"),
        ("    public: bool,", "public"),
    ] {
        assert_eq!(defined(line), Some(name), "{line}");
    }
    for line in [
        "    check_lock(row, version)?;",
        "use crate::core::infer;",
        "    std::process::exit(1);",
        "// fn infer",
    ] {
        assert_eq!(defined(line), None, "{line}");
    }
}

/// Why a function may return `Result<_, String>` (ARCHITECTURE.md, "One error type per
/// module"): its text is never the error a module hands on, but a reason its caller puts into
/// a typed error with context, or a batch's failure inside a backend.
#[derive(Debug, Clone, Copy, PartialEq)]
enum StringError {
    /// Parses a file or document; the caller's typed error adds the file (and line).
    Parser,
    /// A clap `value_parser`: clap prints the text after the flag's name, with exit 2.
    Flag,
    /// A check or step whose text the caller wraps in its own typed error's `reason`.
    Reason,
    /// One batch's failure inside a backend, carried by `ExecError::Batch`.
    Batch,
}

/// Every function of the sources that returns `Result<_, String>`, by file and name, and
/// why. The decision per function: anything else returns its module's error type.
const STRING_ERRORS: &[(&str, &str, StringError)] = {
    use StringError::*;
    &[
        ("crates/infer-serve/src/args.rs", "parse", Flag),
        (
            "crates/infer-serve/src/backend/onnxruntime.rs",
            "value",
            Batch,
        ),
        (
            "crates/infer-serve/src/backend/onnxruntime.rs",
            "run",
            Batch,
        ),
        (
            "crates/infer-serve/src/backend/synthetic.rs",
            "parse",
            Parser,
        ),
        ("crates/infer-serve/src/backend/tract.rs", "plan", Batch),
        ("crates/infer-serve/src/backend/tract.rs", "state", Batch),
        ("crates/infer-serve/src/backend/tract.rs", "to_tract", Batch),
        ("crates/infer-serve/src/backend/tract.rs", "run", Batch),
        (
            "crates/infer-serve/src/grpc/codec.rs",
            "contents_bytes",
            Reason,
        ),
        ("crates/infer-serve/src/signature.rs", "check_shape", Reason),
        ("crates/infer-serve/src/start.rs", "regular_file", Reason),
        ("crates/infer-serve/src/text.rs", "new", Reason),
        ("crates/infer-serve/src/v2.rs", "check_binary", Reason),
        ("crates/infer-serve/src/vision/mod.rs", "new", Reason),
        ("crates/infer-spec/src/runtime.rs", "float_output", Reason),
        ("crates/infer-spec/src/samples.rs", "requests", Parser),
        ("crates/infer-spec/src/samples.rs", "check", Reason),
        ("src/attach/warmup.rs", "warmup_requests", Parser),
        ("src/bench/mod.rs", "parse_duration", Flag),
        ("src/bench/mod.rs", "parse_mix", Flag),
        ("src/bench/v2.rs", "parse", Flag),
        ("src/cli/build.rs", "parse_image_layout", Flag),
        ("src/deploy/from_plan.rs", "mig_share", Reason),
        ("src/deploy/from_plan.rs", "requested_cpu_millis", Reason),
        ("src/engine/evaluation.rs", "batches", Reason),
        ("src/engine/evaluation.rs", "datum", Reason),
        ("src/engine/evaluation.rs", "generated", Reason),
        ("src/engine/evaluation.rs", "npy", Parser),
        ("src/engine/evaluation.rs", "npz", Parser),
        ("src/engine/evaluation.rs", "read_dir", Reason),
        ("src/engine/evaluation.rs", "spec", Reason),
        ("src/engine/gpu.rs", "parse_query", Parser),
        ("src/engine/onnx.rs", "from_bytes", Parser),
        ("src/engine/pyenv.rs", "last_json", Parser),
        ("src/engine/select.rs", "measure_at", Reason),
        ("src/engine/select.rs", "measure_library", Reason),
        ("src/engine/select.rs", "tract_build", Reason),
        ("src/engine/trtexec.rs", "parse_layer_profile", Parser),
        ("src/engine/trtexec.rs", "parse_times", Parser),
        ("src/oci/image.rs", "check_bounds", Reason),
        ("src/plan/tag.rs", "render", Reason),
        ("src/recipe/vision.rs", "read_labels", Parser),
        ("src/registry/auth.rs", "parse_docker_config", Parser),
        ("src/registry/auth.rs", "read_credentials_file", Parser),
        ("src/registry/auth.rs", "run_helper", Reason),
        ("src/registry/auth.rs", "source_for", Reason),
        ("src/registry/sources.rs", "host_path", Parser),
        ("src/registry/sources.rs", "wildcard", Parser),
        ("src/slim/closure.rs", "glob", Parser),
        ("src/slim/elf.rs", "parse", Parser),
    ]
};

/// The name of every function in `text` whose signature (over one or more lines, up to its
/// body or `;`) returns `Result<…, String>`.
fn string_error_fns(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        let Some(at) = code.find("fn ") else {
            continue;
        };
        if at > 0 && !code[..at].ends_with(' ') {
            continue;
        }
        let name: String = code[at + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        let mut sig = String::new();
        for l in &lines[i..] {
            let l = l.split("//").next().unwrap_or_default();
            match l.find(['{', ';']) {
                Some(end) => {
                    sig.push_str(&l[..end]);
                    break;
                }
                None => {
                    sig.push_str(l);
                    sig.push(' ');
                }
            }
        }
        let ret = sig.rsplit_once("->").map(|(_, r)| r).unwrap_or_default();
        let ret = ret.split(" where").next().unwrap_or_default();
        let ret: String = ret
            .split_whitespace()
            .collect::<String>()
            .replace(",>", ">");
        if ret.contains("Result<") && ret.ends_with(",String>") {
            out.push(name);
        }
    }
    out
}

/// Every `Result<_, String>` in the sources is in [`STRING_ERRORS`], with its reason, and
/// every entry there still exists: a new one is a decision, not an accident.
#[test]
fn string_errors_are_only_where_the_architecture_allows_them() {
    let root = super::support::root();
    let mut crate_srcs = vec!["src".to_string()];
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        crate_srcs.push(format!(
            "crates/{}/src",
            e.unwrap().file_name().to_string_lossy()
        ));
    }
    let dirs: Vec<&str> = crate_srcs.iter().map(String::as_str).collect();
    let mut found = BTreeSet::new();
    for f in files(&root, &dirs) {
        if f.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = f.strip_prefix(&root).unwrap().to_string_lossy().to_string();
        for name in string_error_fns(&std::fs::read_to_string(&f).unwrap()) {
            found.insert((rel.clone(), name));
        }
    }
    let listed: BTreeSet<(String, String)> = STRING_ERRORS
        .iter()
        .map(|(f, n, _)| (f.to_string(), n.to_string()))
        .collect();
    let new: Vec<_> = found.difference(&listed).collect();
    let gone: Vec<_> = listed.difference(&found).collect();
    assert!(
        new.is_empty(),
        "these functions return Result<_, String>: give them their module's error type, or \
         list them in STRING_ERRORS with the reason their text is not an error of its own:\n{new:?}"
    );
    assert!(
        gone.is_empty(),
        "STRING_ERRORS lists functions that no longer return Result<_, String>: remove them:\n{gone:?}"
    );
}

#[test]
fn the_string_error_scan_sees_one_and_several_line_signatures() {
    let text = "pub(crate) fn a(s: &str) -> Result<u8, String> {\n\
                fn b(\n    s: &str,\n) -> std::result::Result<\n    Vec<u8>,\n    String,\n> {\n\
                fn c() -> Result<u8, Error> {\n\
                fn d() -> Result<String, Error> {\n\
                // fn e() -> Result<u8, String> {\n\
                fn f<T>() -> Result<T, String>\nwhere\n    T: Copy,\n{\n\
                let g = |x| -> Result<u8, String> { 1 };\n";
    assert_eq!(string_error_fns(text), ["a", "b", "f"]);
}
