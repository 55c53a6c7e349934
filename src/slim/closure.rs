//! File selection and the shared-library closure (pure: two [`Tree`]s and a definition in, a
//! [`SlimPlan`] out).
//!
//! The closure follows what glibc's loader does in the final image: for each `DT_NEEDED` name of
//! an object, search `DT_RPATH` of the object and of its loaders (only when the object has no
//! `DT_RUNPATH`), the definition's `search_dirs` (they become the image's `LD_LIBRARY_PATH`),
//! `DT_RUNPATH`, the directories of the base image's `/etc/ld.so.conf` (its `ld.so.cache` was
//! built from them), then the default directories; `$ORIGIN` expands to the directory of the
//! object; the first candidate that is an ELF object of the same class and machine wins. Each
//! candidate is looked up in both images: a file only in the base is used from there, a file
//! only in the builder is copied with every symlink on its way, a file in both with different
//! content is a conflict that the selection's `on_conflict` must settle.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use globset::{Glob, GlobBuilder, GlobSet, GlobSetBuilder};

use super::def::{ClosureSpec, Selection, Winner, TOOLKIT_INJECTED};
use super::elf::ElfInfo;
use super::tree::{self, File, Node, Source, Tree};
use super::Error;

/// Compile one glob: `*` and `?` never cross `/`, `**` does.
pub(crate) fn glob(pattern: &str) -> Result<Glob, String> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .build()
        .map_err(|e| e.kind().to_string())
}

fn glob_set<'a>(patterns: impl IntoIterator<Item = &'a str>) -> Result<GlobSet, Error> {
    let mut b = GlobSetBuilder::new();
    for p in patterns {
        b.add(glob(p).map_err(|message| Error::Glob {
            pattern: p.to_string(),
            message,
        })?);
    }
    b.build().map_err(|e| Error::Glob {
        pattern: "(set)".into(),
        message: e.to_string(),
    })
}

/// Which image an object of the closure is used from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Origin {
    /// Already in the base: nothing to copy.
    Base,
    /// Copied from the builder into the slim layer.
    Builder,
}

/// One entry of the slim layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyItem {
    /// Its path in the builder image.
    pub from: String,
    /// A regular file or a symlink, as in the builder.
    pub node: Node,
}

/// A library that is needed but deliberately not copied (an entry of `slim --json`'s
/// `excluded`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct Excluded {
    /// The `DT_NEEDED` name, or the selected path.
    pub name: String,
    /// Who needs it: the selected root first (empty for a selected file).
    pub needed_by: Vec<String>,
    pub reason: String,
}

/// Why it is not copied, for the build output.
pub(crate) const REASON_TOOLKIT: &str = "injected at run time by the NVIDIA container toolkit";
pub(crate) const REASON_EXCLUDE: &str = "excluded by the definition (closure.exclude)";
pub(crate) const REASON_DROP: &str = "dropped by the definition (closure.drop)";

/// What a slim build copies, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlimPlan {
    /// The slim layer: destination path (placed through the base's symlinks) → what to write.
    pub copy: BTreeMap<String, CopyItem>,
    /// Every ELF object of the closure (path where it was found) and the image it is used from.
    pub objects: BTreeMap<String, Origin>,
    /// Needed libraries and selected files left out on purpose, sorted.
    pub excluded: Vec<Excluded>,
    /// Paths present in both images with different content where the base was kept.
    pub kept_base: Vec<String>,
}

/// One reason a closure cannot be built. All of them are reported together.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Problem {
    /// `chain` ends with the name that could not be found.
    Missing {
        chain: Vec<String>,
        searched: Vec<String>,
    },
    /// A file copied from the builder differs from the base's and no one said who wins.
    Conflict { path: String, chain: Vec<String> },
    /// A selection glob that matches nothing in the builder.
    Unmatched { pattern: String },
    /// A dependency that resolves to a path the definition drops.
    Dropped { path: String, chain: Vec<String> },
    /// A file with the ELF magic that could not be parsed.
    BadElf { path: String, reason: String },
    /// A symlink chain that loops or runs through a file.
    BadPath { path: String, chain: Vec<String> },
    /// A selected symlink whose target exists in neither image.
    Dangling { path: String, target: String },
}

fn arrow(chain: &[String]) -> String {
    chain.join(" → ")
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Problem::Missing { chain, searched } if searched.is_empty() => {
                write!(f, "{}: not found in the combined image", arrow(chain))
            }
            Problem::Missing { chain, searched } => write!(
                f,
                "{}: not found in the combined image (searched {})",
                arrow(chain),
                searched.join(":")
            ),
            Problem::Conflict { path, chain } => write!(
                f,
                "/{path} (reached by {}) differs between the base and the builder; say which wins with `on_conflict = \"base\" | \"builder\"` on its selection",
                arrow(chain)
            ),
            Problem::Unmatched { pattern } => {
                write!(f, "selection `{pattern}` matches no file in the builder image")
            }
            Problem::Dropped { path, chain } => write!(
                f,
                "{} resolves to /{path}, which the definition drops (closure.drop)",
                arrow(chain)
            ),
            Problem::BadElf { path, reason } => {
                write!(f, "/{path} looks like ELF but cannot be parsed: {reason}")
            }
            Problem::BadPath { path, chain } => {
                write!(f, "{}: /{path} is a symlink loop or runs through a file", arrow(chain))
            }
            Problem::Dangling { path, target } => write!(
                f,
                "/{path} is a dangling symlink: its target `{target}` is in neither image"
            ),
        }
    }
}

/// The inputs of a closure computation: the applicable selections and the closure settings.
#[derive(Clone, Copy, Debug)]
pub struct Spec<'a> {
    pub selections: &'a [&'a Selection],
    pub closure: &'a ClosureSpec,
}

/// The paths of `tree` a selection pattern names, as written (through directory symlinks): the
/// literal leading directories are resolved through the tree's symlinks
/// (`/usr/local/cuda/lib64/libcublas.so.*` finds the files under `cuda-12.9/targets/…/lib`), the
/// rest is matched against the entries below. Directories themselves are never matched.
pub(crate) fn expand(tree: &Tree, pattern: &str) -> Result<Vec<String>, Error> {
    let norm = tree::normalize(pattern);
    let comps: Vec<&str> = norm.split('/').collect();
    let Some(k) = comps.iter().position(|c| c.contains(['*', '?', '[', '{'])) else {
        let found = tree
            .resolve(&norm, false)
            .ok()
            .filter(|r| !matches!(tree.get(&r.path), Some(Node::Dir { .. }) | None));
        return Ok(found.map(|_| norm).into_iter().collect());
    };
    let m = glob(&format!("/{norm}"))
        .map_err(|message| Error::Glob {
            pattern: pattern.to_string(),
            message,
        })?
        .compile_matcher();
    let prefix = comps[..k].join("/");
    let real = if prefix.is_empty() {
        String::new()
    } else {
        match tree.resolve(&prefix, true) {
            Ok(r) if matches!(tree.get(&r.path), Some(Node::Dir { .. })) => r.path,
            _ => return Ok(Vec::new()),
        }
    };
    let under = if real.is_empty() {
        String::new()
    } else {
        format!("{real}/")
    };
    Ok(tree
        .iter()
        .filter(|(p, n)| !matches!(n, Node::Dir { .. }) && p.starts_with(&under))
        .map(|(p, _)| tree::join(&prefix, &p[under.len()..]))
        .filter(|cand| m.is_match(format!("/{cand}")))
        .collect())
}

/// The directories listed by `/etc/ld.so.conf` of `tree` (following `include` globs), in order.
/// Only files whose bytes are held in memory are read: the image reader keeps `etc/ld.so.conf*`
/// inline.
pub(crate) fn ld_so_conf_dirs(tree: &Tree) -> Vec<String> {
    fn read(tree: &Tree, path: &str, depth: usize, out: &mut Vec<String>) {
        if depth > 8 {
            return;
        }
        let Some((
            _,
            File {
                source: Source::Inline(bytes),
                ..
            },
        )) = tree.file(path)
        else {
            return;
        };
        let text = String::from_utf8_lossy(bytes);
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or("").trim();
            if let Some(pattern) = line
                .strip_prefix("include")
                .filter(|r| r.starts_with([' ', '\t']))
            {
                for pat in pattern.split_whitespace() {
                    let abs = if pat.starts_with('/') {
                        pat.to_string()
                    } else {
                        format!("/etc/{pat}")
                    };
                    let Ok(g) = glob(&abs) else { continue };
                    let m = g.compile_matcher();
                    let files: Vec<String> = tree
                        .iter()
                        .filter(|(p, n)| {
                            !matches!(n, Node::Dir { .. }) && m.is_match(format!("/{p}"))
                        })
                        .map(|(p, _)| p.clone())
                        .collect();
                    for f in files {
                        read(tree, &f, depth + 1, out);
                    }
                }
            } else {
                for d in line
                    .split([' ', '\t', ',', ':'])
                    .filter(|d| d.starts_with('/'))
                {
                    if !out.iter().any(|o| o == d) {
                        out.push(d.to_string());
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    read(tree, "etc/ld.so.conf", 0, &mut out);
    out
}

/// An ELF object waiting for its dependencies to be resolved.
struct Work {
    /// The path it was reached by (for `$ORIGIN`).
    reached: String,
    info: ElfInfo,
    chain: Vec<String>,
    winner: Option<Winner>,
    /// `DT_RPATH` directories of its loaders, already expanded.
    loader_rpath: Vec<String>,
}

struct Walk<'a> {
    base: &'a Tree,
    builder: &'a Tree,
    spec: Spec<'a>,
    toolkit: GlobSet,
    exclude: GlobSet,
    drop: GlobSet,
    ld_conf: Vec<String>,
    plan: SlimPlan,
    problems: BTreeSet<Problem>,
    visited: BTreeSet<(Origin, String)>,
    queue: VecDeque<Work>,
}

/// Compute what to copy from `builder` onto `base`: the selections, the closure of their ELF
/// objects, the conflicts. Every problem found is reported at once.
pub fn compute(base: &Tree, builder: &Tree, spec: Spec<'_>) -> Result<SlimPlan, Error> {
    let mut w = Walk {
        base,
        builder,
        spec,
        toolkit: glob_set(TOOLKIT_INJECTED.iter().copied())?,
        exclude: glob_set(spec.closure.exclude.iter().map(String::as_str))?,
        drop: glob_set(spec.closure.drop.iter().map(String::as_str))?,
        ld_conf: ld_so_conf_dirs(base),
        plan: SlimPlan::default(),
        problems: BTreeSet::new(),
        visited: BTreeSet::new(),
        queue: VecDeque::new(),
    };
    for sel in spec.selections {
        for pattern in &sel.paths {
            let matched = expand(builder, pattern)?;
            if matched.is_empty() {
                w.problems.insert(Problem::Unmatched {
                    pattern: pattern.clone(),
                });
            }
            for p in matched {
                w.select(&p, sel.winner());
            }
        }
    }
    while let Some(work) = w.queue.pop_front() {
        w.walk(work);
    }
    if !w.problems.is_empty() {
        return Err(Error::Closure {
            problems: w.problems.into_iter().collect(),
        });
    }
    w.plan.excluded.sort();
    w.plan.excluded.dedup();
    w.plan.kept_base.sort();
    w.plan.kept_base.dedup();
    Ok(w.plan)
}

impl Selection {
    fn winner(&self) -> Option<Winner> {
        self.on_conflict
    }
}

impl Walk<'_> {
    fn excluded_name(&self, name: &str) -> Option<&'static str> {
        if self.toolkit.is_match(name) {
            Some(REASON_TOOLKIT)
        } else if self.exclude.is_match(name) {
            Some(REASON_EXCLUDE)
        } else {
            None
        }
    }

    /// A path matched by a selection.
    fn select(&mut self, path: &str, winner: Option<Winner>) {
        let shown = format!("/{path}");
        if let Some(reason) = self.excluded_name(tree::file_name(path)) {
            self.plan.excluded.push(Excluded {
                name: shown,
                needed_by: vec![],
                reason: reason.into(),
            });
            return;
        }
        if self.drop.is_match(&shown) {
            self.plan.excluded.push(Excluded {
                name: shown,
                needed_by: vec![],
                reason: REASON_DROP.into(),
            });
            return;
        }
        let Ok(me) = self.builder.resolve(path, false) else {
            return;
        };
        if self.drop.is_match(format!("/{}", me.path)) {
            self.plan.excluded.push(Excluded {
                name: shown,
                needed_by: vec![],
                reason: REASON_DROP.into(),
            });
            return;
        }
        let chain = vec![shown];
        // Directory symlinks on the way (`/usr/local/cuda -> cuda-12.9`) come along, so the
        // path written in the definition also works in the slim image.
        for link in &me.links {
            self.copy_entry(link, &chain, winner);
        }
        match self.builder.get(&me.path) {
            // A selected symlink is copied as a symlink even when its target is in the base.
            Some(Node::Symlink { target }) => {
                // A loop, a chain through a file, or a link to nothing in either image would be
                // copied as a broken link: refused, as for dependencies.
                let target = target.clone();
                // Where the link points, looked up in the base too: the slim image has both.
                let pointed = tree::join(tree::parent(&me.path), &target);
                match (
                    self.builder.resolve(path, true),
                    self.base.resolve(&pointed, true),
                ) {
                    (Ok(_), _) | (Err(tree::ResolveError::NotFound), Ok(_)) => {}
                    (Err(tree::ResolveError::NotFound), Err(tree::ResolveError::NotFound)) => {
                        self.problems.insert(Problem::Dangling {
                            path: me.path.clone(),
                            target,
                        });
                        return;
                    }
                    _ => {
                        self.problems.insert(Problem::BadPath {
                            path: me.path.clone(),
                            chain,
                        });
                        return;
                    }
                }
                self.copy_entry(&me.path, &chain, winner);
                if self.builder.file(path).is_some() {
                    self.take(path, chain, winner, Vec::new(), true);
                }
            }
            Some(Node::File(_)) => self.take(path, chain, winner, Vec::new(), true),
            _ => {}
        }
    }

    /// Copy one builder entry (a file or a symlink, not followed) to its placed destination,
    /// checking it against the base.
    fn copy_entry(&mut self, from: &str, chain: &[String], winner: Option<Winner>) {
        let Some(node) = self.builder.get(from).cloned() else {
            return;
        };
        let dest = self.base.place(from);
        if let Some(existing) = self.base.get(&dest) {
            let same = match (existing, &node) {
                (Node::File(a), Node::File(b)) => a.sha256 == b.sha256,
                (Node::Symlink { target: a }, Node::Symlink { target: b }) => a == b,
                _ => false,
            };
            if same {
                return;
            }
            match winner {
                Some(Winner::Base) => {
                    self.plan.kept_base.push(format!("/{dest}"));
                    return;
                }
                Some(Winner::Builder) => {}
                None => {
                    self.problems.insert(Problem::Conflict {
                        path: dest,
                        chain: chain.to_vec(),
                    });
                    return;
                }
            }
        }
        self.plan.copy.insert(
            dest,
            CopyItem {
                from: from.to_string(),
                node,
            },
        );
    }

    /// Bring the file reached by `path` into the result (from the base or the builder) and queue
    /// it for the dependency walk when it is an ELF object. `root` marks a selected file, whose
    /// `$ORIGIN` is its resolved directory (the kernel resolves the executable's path).
    fn take(
        &mut self,
        path: &str,
        chain: Vec<String>,
        winner: Option<Winner>,
        loader_rpath: Vec<String>,
        root: bool,
    ) {
        let in_base = self.base.file(path);
        let in_builder = self.builder.file(path);
        let origin = match (&in_base, &in_builder) {
            (Some((_, a)), Some((_, b))) if a.sha256 != b.sha256 => match winner {
                Some(Winner::Base) => {
                    self.plan
                        .kept_base
                        .push(format!("/{}", tree::normalize(path)));
                    Origin::Base
                }
                Some(Winner::Builder) => Origin::Builder,
                None => {
                    self.problems.insert(Problem::Conflict {
                        path: tree::normalize(path),
                        chain,
                    });
                    return;
                }
            },
            (Some(_), _) => Origin::Base,
            (None, Some(_)) => Origin::Builder,
            (None, None) => {
                let broken = |t: &Tree| {
                    matches!(
                        t.resolve(path, true),
                        Err(tree::ResolveError::Loop | tree::ResolveError::NotADirectory(_))
                    )
                };
                if broken(self.base) || broken(self.builder) {
                    self.problems.insert(Problem::BadPath {
                        path: tree::normalize(path),
                        chain,
                    });
                }
                return;
            }
        };
        let (resolved, file) = match origin {
            Origin::Base => in_base,
            Origin::Builder => in_builder,
        }
        .expect("the side chosen above holds the file");
        if origin == Origin::Builder {
            if self.drop.is_match(format!("/{}", resolved.path)) {
                self.problems.insert(Problem::Dropped {
                    path: resolved.path.clone(),
                    chain,
                });
                return;
            }
            for link in resolved.links.iter().chain([&resolved.path]) {
                self.copy_entry(link, &chain, winner);
            }
        }
        let info = match &file.elf {
            None => return,
            Some(Err(reason)) => {
                self.problems.insert(Problem::BadElf {
                    path: resolved.path.clone(),
                    reason: reason.clone(),
                });
                return;
            }
            Some(Ok(info)) => info.clone(),
        };
        self.plan
            .objects
            .entry(format!("/{}", resolved.path))
            .or_insert(origin);
        if !self.visited.insert((origin, resolved.path.clone())) {
            return;
        }
        let reached = if root {
            resolved.path.clone()
        } else {
            tree::normalize(path)
        };
        self.queue.push_back(Work {
            reached,
            info,
            chain,
            winner,
            loader_rpath,
        });
    }

    /// Is there a loadable object for `obj` at `path`, in either image?
    fn loadable(&self, path: &str, obj: &ElfInfo) -> bool {
        [self.base, self.builder].iter().any(|t| {
            t.file(path)
                .and_then(|(_, f)| f.elf().map(|e| obj.compatible(e)))
                .unwrap_or(false)
        })
    }

    fn walk(&mut self, work: Work) {
        let origin_dir = format!("/{}", tree::parent(&work.reached));
        let expand = |dirs: &[String]| -> Vec<String> {
            dirs.iter()
                .map(|d| {
                    d.replace("${ORIGIN}", &origin_dir)
                        .replace("$ORIGIN", &origin_dir)
                })
                // `$LIB` and `$PLATFORM` depend on the CPU the image runs on: not searched.
                .filter(|d| !d.contains('$'))
                .map(|d| format!("/{}", tree::normalize(&d)))
                .collect()
        };
        let own_rpath = if work.info.runpath.is_empty() {
            expand(&work.info.rpath)
        } else {
            Vec::new()
        };
        let mut child_rpath = own_rpath.clone();
        child_rpath.extend(work.loader_rpath.iter().cloned());
        let mut dirs: Vec<String> = Vec::new();
        if work.info.runpath.is_empty() {
            dirs.extend(own_rpath);
            dirs.extend(work.loader_rpath.iter().cloned());
        }
        dirs.extend(
            self.spec
                .closure
                .search_dirs
                .iter()
                .map(|d| format!("/{}", tree::normalize(d))),
        );
        dirs.extend(expand(&work.info.runpath));
        dirs.extend(self.ld_conf.iter().cloned());
        dirs.extend(work.info.default_dirs().into_iter().map(str::to_string));
        let mut seen = BTreeSet::new();
        dirs.retain(|d| seen.insert(d.clone()));

        let mut needs: Vec<String> = work.info.interpreter.iter().cloned().collect();
        needs.extend(work.info.needed.iter().cloned());
        for name in needs {
            let mut chain = work.chain.clone();
            chain.push(name.clone());
            if let Some(reason) = self.excluded_name(tree::file_name(&name)) {
                self.plan.excluded.push(Excluded {
                    name: name.clone(),
                    needed_by: work.chain.clone(),
                    reason: reason.into(),
                });
                continue;
            }
            let candidates: Vec<String> = if name.contains('/') {
                vec![tree::normalize(&name)]
            } else {
                dirs.iter().map(|d| tree::join(d, &name)).collect()
            };
            match candidates
                .into_iter()
                .find(|c| self.loadable(c, &work.info))
            {
                Some(c) => self.take(&c, chain, work.winner, child_rpath.clone(), false),
                None => {
                    let searched = if name.contains('/') {
                        vec![]
                    } else {
                        dirs.clone()
                    };
                    self.problems.insert(Problem::Missing { chain, searched });
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "closure_tests.rs"]
mod tests;
