//! ARCHITECTURE.md's "Vocabulary" table, checked against the sources: each concept it lists has
//! one type, defined once in the workspace, in the file the table names.

use std::path::{Path, PathBuf};

/// `(type, file)` for each row of the table under `## Vocabulary`.
fn table(architecture: &str) -> Vec<(String, String)> {
    let section = architecture
        .split("\n## Vocabulary\n")
        .nth(1)
        .expect("ARCHITECTURE.md has a `## Vocabulary` section")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| Concept"))
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let unquote = |c: &str| c.trim_matches('`').to_string();
            (unquote(cells[2]), unquote(cells[3]))
        })
        .collect()
}

/// Every Rust source of the workspace's libraries and binaries, relative to the root.
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.join("src")];
    for e in std::fs::read_dir(root.join("crates")).unwrap() {
        dirs.push(e.unwrap().path().join("src"));
    }
    super::support::rust_sources(&dirs)
}

/// Whether `line` defines a type, trait or alias called `name`.
fn defines(line: &str, name: &str) -> bool {
    let mut rest = line.trim_start();
    if let Some(r) = rest.strip_prefix("pub") {
        rest = match r.strip_prefix('(') {
            Some(r) => r.split_once(')').map_or(r, |(_, r)| r),
            None => r,
        }
        .trim_start();
    }
    ["enum ", "struct ", "trait ", "type "].iter().any(|kw| {
        rest.strip_prefix(kw).is_some_and(|r| {
            r.strip_prefix(name)
                .is_some_and(|after| !after.starts_with(|c: char| c.is_alphanumeric() || c == '_'))
        })
    })
}

#[test]
fn each_concept_of_the_vocabulary_has_one_type() {
    let root = super::support::root();
    let rows = table(&std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap());
    assert!(rows.len() >= 10, "the table lost rows: {rows:?}");
    let files: Vec<(PathBuf, String)> = sources(&root)
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(root.join(&p)).unwrap();
            (p, text)
        })
        .collect();
    let mut wrong = Vec::new();
    for (name, file) in &rows {
        let found: Vec<String> = files
            .iter()
            .flat_map(|(p, text)| {
                text.lines()
                    .enumerate()
                    .filter(|(_, l)| defines(l, name))
                    .map(move |(n, _)| format!("{}:{}", p.display(), n + 1))
            })
            .collect();
        let in_file = found.iter().any(|f| f.starts_with(&format!("{file}:")));
        if found.len() != 1 || !in_file {
            wrong.push(format!("`{name}` (table: {file}) defined at {found:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "one type per concept:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn a_target_says_its_kind_not_whether_it_is_a_gpu() {
    let root = super::support::root();
    let found: Vec<String> = sources(&root)
        .iter()
        .flat_map(|p| {
            let text = std::fs::read_to_string(root.join(p)).unwrap();
            text.lines()
                .enumerate()
                .filter(|(_, l)| {
                    l.trim_start()
                        .trim_start_matches("pub ")
                        .starts_with("gpu: bool")
                })
                .map(|(n, _)| format!("{}:{}", p.display(), n + 1))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        found.is_empty(),
        "use plan::TargetKind:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_definition_scan_sees_every_form() {
    for line in [
        "pub enum EngineKind {",
        "pub(crate) struct EngineKind(u8);",
        "    enum EngineKind {",
        "pub(in crate::x) trait EngineKind",
        "type EngineKind = u8;",
    ] {
        assert!(defines(line, "EngineKind"), "{line}");
    }
    for line in [
        "pub enum EngineKinds {",
        "use x::EngineKind;",
        "// enum EngineKind",
    ] {
        assert!(!defines(line, "EngineKind"), "{line}");
    }
}
