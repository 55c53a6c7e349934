//! The runtime's crates: a walk of `Cargo.lock`'s dependency graph from one package.
//!
//! Pure: text in, crates out. The lock file records, per package, every dependency any
//! feature or platform may need (and, for workspace members only, dev-dependencies); it does
//! not say which are optional, platform-specific or build-time only. So the walk gives a
//! superset of what the binary links: dev-dependencies of workspace members are removed using
//! their `Cargo.toml` (see [`dev_dependencies`]); the rest is kept and said so in the SBOM.

use std::collections::{BTreeMap, BTreeSet};

use super::Error;

/// One package of the lock file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Crate {
    pub name: String,
    pub version: String,
    /// `registry+https://github.com/rust-lang/crates.io-index`, `git+…`; `None` for path
    /// dependencies (workspace members).
    pub source: Option<String>,
    /// sha256 (hex) of the `.crate` file, for registry packages.
    pub checksum: Option<String>,
    /// The packages it depends on, as `(name, version)`, sorted.
    pub deps: Vec<(String, String)>,
}

impl Crate {
    pub(crate) fn key(&self) -> (String, String) {
        (self.name.clone(), self.version.clone())
    }

    /// True for crates from crates.io.
    pub(crate) fn is_from_crates_io(&self) -> bool {
        self.source
            .as_deref()
            .is_some_and(|s| s == "registry+https://github.com/rust-lang/crates.io-index")
    }
}

/// The root package and every package reachable from it, root first, the rest sorted by
/// (name, version). `remove_edges` lists, per package name, dependencies to ignore (dev-
/// dependencies of workspace members).
pub(crate) fn closure(
    lock_text: &str,
    root: &str,
    remove_edges: &BTreeMap<String, BTreeSet<String>>,
) -> Result<Vec<Crate>, Error> {
    let all = parse(lock_text)?;
    let mut by_key: BTreeMap<(String, String), Crate> = BTreeMap::new();
    for c in all {
        by_key.insert(c.key(), c);
    }
    let roots: Vec<&Crate> = by_key.values().filter(|c| c.name == root).collect();
    let root_key = match roots.as_slice() {
        [one] => one.key(),
        [] => {
            return Err(Error::Lock(format!(
                "package `{root}` is not in the lock file"
            )))
        }
        _ => {
            return Err(Error::Lock(format!(
                "package `{root}` appears in several versions"
            )))
        }
    };
    let mut seen: BTreeSet<(String, String)> = BTreeSet::new();
    let mut stack = vec![root_key.clone()];
    while let Some(k) = stack.pop() {
        if !seen.insert(k.clone()) {
            continue;
        }
        let Some(c) = by_key.get_mut(&k) else {
            continue;
        };
        if let Some(drop) = remove_edges.get(&c.name) {
            c.deps.retain(|(n, _)| !drop.contains(n));
        }
        stack.extend(c.deps.iter().cloned());
    }
    let mut out: Vec<Crate> = Vec::new();
    if let Some(r) = by_key.get(&root_key) {
        out.push(r.clone());
    }
    out.extend(
        seen.iter()
            .filter(|k| **k != root_key)
            .filter_map(|k| by_key.get(k).cloned()),
    );
    Ok(out)
}

/// Every `[[package]]` of a version 3 or 4 lock file, with dependency references resolved to
/// `(name, version)`.
pub(crate) fn parse(lock_text: &str) -> Result<Vec<Crate>, Error> {
    let doc: toml::Table =
        toml::from_str(lock_text).map_err(|e| Error::Lock(format!("not TOML: {}", e.message())))?;
    let packages = doc
        .get("package")
        .and_then(toml::Value::as_array)
        .ok_or_else(|| Error::Lock("no [[package]] entries".into()))?;
    struct Raw {
        name: String,
        version: String,
        source: Option<String>,
        checksum: Option<String>,
        deps: Vec<String>,
    }
    let mut raw = Vec::new();
    for (i, p) in packages.iter().enumerate() {
        let s = |k: &str| p.get(k).and_then(toml::Value::as_str).map(str::to_string);
        let (Some(name), Some(version)) = (s("name"), s("version")) else {
            return Err(Error::Lock(format!(
                "package #{} has no name or version",
                i + 1
            )));
        };
        let deps = p
            .get("dependencies")
            .and_then(toml::Value::as_array)
            .map(|l| {
                l.iter()
                    .filter_map(toml::Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        raw.push(Raw {
            name,
            version,
            source: s("source"),
            checksum: s("checksum"),
            deps,
        });
    }
    let mut versions: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for r in &raw {
        versions.entry(&r.name).or_default().push(&r.version);
    }
    let mut out = Vec::new();
    for r in &raw {
        let mut deps = Vec::new();
        for d in &r.deps {
            // `name`, `name version` or `name version (source)`.
            let mut parts = d.split_whitespace();
            let name = parts.next().unwrap_or_default();
            let version = match parts.next() {
                Some(v) => v.to_string(),
                None => match versions.get(name).map(Vec::as_slice) {
                    Some([one]) => one.to_string(),
                    _ => {
                        return Err(Error::Lock(format!(
                            "`{}` depends on `{d}`, which names no single package",
                            r.name
                        )))
                    }
                },
            };
            deps.push((name.to_string(), version));
        }
        deps.sort();
        deps.dedup();
        out.push(Crate {
            name: r.name.clone(),
            version: r.version.clone(),
            source: r.source.clone(),
            checksum: r.checksum.clone(),
            deps,
        });
    }
    out.sort();
    Ok(out)
}

/// The names under `[dev-dependencies]` (and `[target.*.dev-dependencies]`) of a
/// `Cargo.toml` that are not also normal or build dependencies.
pub(crate) fn dev_dependencies(manifest_text: &str) -> Result<BTreeSet<String>, Error> {
    let doc: toml::Table = toml::from_str(manifest_text)
        .map_err(|e| Error::Lock(format!("Cargo.toml: not TOML: {}", e.message())))?;
    let mut tables: Vec<&toml::Table> = vec![&doc];
    if let Some(t) = doc.get("target").and_then(toml::Value::as_table) {
        tables.extend(t.values().filter_map(toml::Value::as_table));
    }
    let names = |key: &str| -> BTreeSet<String> {
        tables
            .iter()
            .filter_map(|t| t.get(key).and_then(toml::Value::as_table))
            .flat_map(|deps| {
                deps.iter().map(|(k, v)| {
                    // `alias = { package = "real" }`: the lock names the real package.
                    v.get("package")
                        .and_then(toml::Value::as_str)
                        .unwrap_or(k)
                        .to_string()
                })
            })
            .collect()
    };
    let normal: BTreeSet<String> = names("dependencies")
        .into_iter()
        .chain(names("build-dependencies"))
        .collect();
    Ok(names("dev-dependencies")
        .into_iter()
        .filter(|n| !normal.contains(n))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCK: &str = r#"
version = 4

[[package]]
name = "app"
version = "0.1.0"
dependencies = ["lib", "dup 2.0.0", "testonly"]

[[package]]
name = "lib"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "aa"
dependencies = ["dup 1.0.0"]

[[package]]
name = "dup"
version = "1.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "dup"
version = "2.0.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "testonly"
version = "0.3.0"
source = "registry+https://github.com/rust-lang/crates.io-index"

[[package]]
name = "other"
version = "9.0.0"
dependencies = ["lib"]
"#;

    #[test]
    fn walk_follows_versions_and_drops_removed_edges() {
        let all = closure(LOCK, "app", &BTreeMap::new()).unwrap();
        let names: Vec<String> = all
            .iter()
            .map(|c| format!("{}@{}", c.name, c.version))
            .collect();
        assert_eq!(
            names,
            [
                "app@0.1.0",
                "dup@1.0.0",
                "dup@2.0.0",
                "lib@1.0.0",
                "testonly@0.3.0"
            ]
        );
        let mut drop = BTreeMap::new();
        drop.insert("app".to_string(), BTreeSet::from(["testonly".to_string()]));
        let all = closure(LOCK, "app", &drop).unwrap();
        assert!(all
            .iter()
            .all(|c| c.name != "testonly" && c.name != "other"));
        assert_eq!(all[0].deps.len(), 2);
        assert!(all
            .iter()
            .find(|c| c.name == "lib")
            .unwrap()
            .is_from_crates_io());
    }

    #[test]
    fn bad_locks_are_errors_not_panics() {
        for bad in [
            "",
            "not = [toml",
            "[[package]]\nname = \"a\"\n",
            "[[package]]\nname = \"a\"\nversion = \"1\"\ndependencies = [\"b\"]\n",
        ] {
            let r = parse(bad).and_then(|_| closure(bad, "a", &BTreeMap::new()));
            assert!(r.is_err(), "{bad:?}");
        }
        assert!(closure(LOCK, "absent", &BTreeMap::new()).is_err());
    }

    #[test]
    fn dev_dependencies_exclude_normal_ones() {
        let toml = "[dependencies]\na = \"1\"\n[dev-dependencies]\na = \"1\"\nb = \"1\"\nc = { package = \"real-c\", version = \"1\" }\n[target.'cfg(unix)'.dev-dependencies]\nd = \"1\"\n";
        let d = dev_dependencies(toml).unwrap();
        assert_eq!(d.into_iter().collect::<Vec<_>>(), ["b", "d", "real-c"]);
    }
}
