//! The runtime's dependency policy, checked over `cargo metadata` (every feature, x86_64
//! Linux): `infer-serve` links nothing of the builder, each of its direct dependencies is listed
//! in `dependencies.toml` with the reason it is there, and every crate it links is on that
//! file's allow-list. Growing the runtime is a reviewed change to that file, not a side effect.
#![allow(clippy::disallowed_methods, reason = "the test runs `cargo metadata`")]

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Policy {
    /// Direct (normal) dependencies: name → why.
    direct: BTreeMap<String, String>,
    /// Every crate the runtime may link, direct ones included.
    allowed: BTreeSet<String>,
    /// Crates the runtime must never link (the builder's own).
    forbidden: BTreeSet<String>,
}

/// The dependency graph of the workspace: package id → (name, [(dependency id, kinds)]).
struct Graph {
    names: BTreeMap<String, String>,
    deps: BTreeMap<String, Vec<(String, Vec<String>)>>,
}

fn metadata() -> Graph {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--locked",
            "--all-features",
        ])
        .args([
            "--filter-platform",
            "x86_64-unknown-linux-gnu",
            "--manifest-path",
            manifest,
        ])
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names = v["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let deps = v["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            let deps = n["deps"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| {
                    let kinds = d["dep_kinds"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|k| k["kind"].as_str().unwrap_or("normal").to_owned())
                        .collect();
                    (d["pkg"].as_str().unwrap().to_owned(), kinds)
                })
                .collect();
            (n["id"].as_str().unwrap().to_owned(), deps)
        })
        .collect();
    Graph { names, deps }
}

impl Graph {
    fn id(&self, name: &str) -> String {
        let ids: Vec<_> = self.names.iter().filter(|(_, n)| *n == name).collect();
        assert_eq!(ids.len(), 1, "one package named {name}");
        ids[0].0.clone()
    }

    /// Names reachable from `root` through dependencies of the given kinds (`dev` never
    /// follows past the root: only the root's own tests use them).
    fn reachable(&self, root: &str, kinds: &[&str]) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![root.to_owned()];
        while let Some(id) = todo.pop() {
            for (dep, dep_kinds) in self.deps.get(&id).into_iter().flatten() {
                if dep_kinds.iter().any(|k| kinds.contains(&k.as_str())) && seen.insert(dep.clone())
                {
                    todo.push(dep.clone());
                }
            }
        }
        seen.iter().map(|id| self.names[id].clone()).collect()
    }

    fn direct(&self, root: &str) -> BTreeSet<String> {
        self.deps[root]
            .iter()
            .filter(|(_, kinds)| kinds.iter().any(|k| k == "normal"))
            .map(|(id, _)| self.names[id].clone())
            .collect()
    }
}

fn policy() -> Policy {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/dependencies.toml");
    toml::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_runtime_links_only_allowed_crates_and_nothing_of_the_builder() {
    let g = metadata();
    let p = policy();
    let serve = g.id("infer-serve");
    let linked = g.reachable(&serve, &["normal"]);
    let built = g.reachable(&serve, &["normal", "build"]);

    assert!(
        !built.contains("infer-build"),
        "infer-serve reaches the builder, at least at build time"
    );
    let forbidden: Vec<_> = linked.intersection(&p.forbidden).collect();
    assert!(forbidden.is_empty(), "infer-serve would link {forbidden:?}");

    let direct = g.direct(&serve);
    let unexplained: Vec<_> = direct
        .iter()
        .filter(|d| p.direct.get(*d).is_none_or(|why| why.trim().is_empty()))
        .collect();
    assert!(
        unexplained.is_empty(),
        "direct dependencies of infer-serve without a reason in dependencies.toml [direct]: {unexplained:?}"
    );

    let unlisted: Vec<_> = linked
        .iter()
        .filter(|c| !p.allowed.contains(*c) && !p.direct.contains_key(*c))
        .collect();
    assert!(
        unlisted.is_empty(),
        "infer-serve would link crates not on dependencies.toml's allow-list: {unlisted:?}"
    );
}

#[test]
fn the_policy_names_the_builder_as_forbidden() {
    let p = policy();
    for name in ["infer-build", "ureq", "clap", "indicatif"] {
        assert!(p.forbidden.contains(name), "{name} should be forbidden");
    }
    assert!(p.forbidden.is_disjoint(&p.allowed));
}
