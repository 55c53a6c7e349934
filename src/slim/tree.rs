//! An in-memory view of an image's flattened file tree: path → directory, regular file
//! (size, sha256, ELF facts and where its bytes are) or symlink. Pure: paths are resolved inside
//! the tree, never on the host.
//!
//! Paths are stored relative to the image root, `/`-separated, without `.`/`..` components
//! (`usr/lib/x86_64-linux-gnu/libz.so.1`); the root itself is the empty path.
//!
//! A tree of a builder image can be large and comes from elsewhere, so it is compact (a
//! directory or a symlink costs its path, its target and a few words; a file's facts are
//! boxed) and it counts what it holds ([`Tree::weight`]) for the reader to bound.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::elf::ElfInfo;

/// How many symlinks one resolution may follow before it is called a loop (Linux's limit).
pub(crate) const MAX_SYMLINKS: usize = 40;

/// Where the bytes of a regular file are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Held in memory (tests, small generated files).
    Inline(Arc<[u8]>),
    /// Member `member` (normalized path) of layer number `layer` of the image it came from.
    Layer { layer: usize, member: String },
}

/// A regular file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct File {
    /// Permission bits.
    pub mode: u32,
    pub size: u64,
    /// Lowercase hex sha256 of the content: equal digests mean equal files.
    pub sha256: String,
    /// The ELF facts when the file is an ELF object; `Err` when it starts with the ELF magic but
    /// could not be parsed (or was too large to parse), with the reason.
    pub elf: Option<Result<ElfInfo, String>>,
    pub source: Source,
}

/// One entry of the tree. A file's facts are boxed, so that the directories and symlinks
/// that make up most of an image cost a few words each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Node {
    Dir { mode: u32 },
    File(Box<File>),
    Symlink { target: String },
}

impl From<File> for Node {
    fn from(f: File) -> Node {
        Node::File(Box::new(f))
    }
}

impl Node {
    /// The bytes this entry holds besides its path (a link's target, a file's facts).
    pub fn heap_bytes(&self) -> u64 {
        match self {
            Node::Dir { .. } => 0,
            Node::Symlink { target } => target.len() as u64,
            Node::File(f) => f.heap_bytes(),
        }
    }
}

/// The flattened file tree of one image.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tree {
    nodes: BTreeMap<String, Node>,
    /// The bytes of every path held plus each entry's [`Node::heap_bytes`].
    bytes: u64,
}

/// The per-entry cost counted besides its bytes: a map slot, a path and a node header.
pub(crate) const ENTRY_OVERHEAD: u64 =
    (std::mem::size_of::<String>() + std::mem::size_of::<Node>() + 16) as u64;

/// Why a path could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// Some component does not exist.
    NotFound,
    /// A component other than the last is a regular file.
    NotADirectory(String),
    /// More than [`MAX_SYMLINKS`] symlinks on the way.
    Loop,
}

/// The result of following a path through the symlinks of a tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// Every symlink followed, in order (their own paths, normalized).
    pub links: Vec<String>,
    /// The path of the entry finally reached.
    pub path: String,
}

/// Normalize a path inside an image: absolute or relative to the root, `.` dropped, `..` going
/// up (never above the root), duplicate slashes removed.
pub(crate) fn normalize(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join("/")
}

/// The directory part of a normalized path ("" for a top-level entry).
pub(crate) fn parent(path: &str) -> &str {
    path.rsplit_once('/').map(|(d, _)| d).unwrap_or("")
}

/// The last component of a path.
pub(crate) fn file_name(path: &str) -> &str {
    path.rsplit_once('/').map(|(_, f)| f).unwrap_or(path)
}

/// Join a directory and a name, both inside the image, and normalize.
pub(crate) fn join(dir: &str, name: &str) -> String {
    if name.starts_with('/') {
        normalize(name)
    } else {
        normalize(&format!("{dir}/{name}"))
    }
}

impl File {
    /// A file held in memory; its digest and ELF facts are computed from `bytes`.
    pub fn inline(mode: u32, bytes: &[u8]) -> File {
        File {
            mode,
            size: bytes.len() as u64,
            sha256: crate::oci::Digest::of(bytes).hex().to_string(),
            elf: ElfInfo::is_elf(bytes).then(|| ElfInfo::parse(bytes)),
            source: Source::Inline(Arc::from(bytes)),
        }
    }

    /// The bytes this file's entry holds: its boxed facts, digest, member name, ELF strings.
    pub fn heap_bytes(&self) -> u64 {
        let strings = |v: &[String]| v.iter().map(|s| s.len() as u64 + 24).sum::<u64>();
        let elf = match &self.elf {
            None => 0,
            Some(Err(why)) => why.len() as u64,
            Some(Ok(e)) => {
                strings(&e.needed)
                    + strings(&e.rpath)
                    + strings(&e.runpath)
                    + e.soname.as_ref().map_or(0, |s| s.len() as u64)
                    + e.interpreter.as_ref().map_or(0, |s| s.len() as u64)
                    + std::mem::size_of::<ElfInfo>() as u64
            }
        };
        let source = match &self.source {
            Source::Inline(b) => b.len() as u64,
            Source::Layer { member, .. } => member.len() as u64,
        };
        std::mem::size_of::<File>() as u64 + self.sha256.len() as u64 + elf + source
    }

    /// The ELF facts, when this is a valid ELF object.
    pub fn elf(&self) -> Option<&ElfInfo> {
        match &self.elf {
            Some(Ok(info)) => Some(info),
            _ => None,
        }
    }
}

impl Tree {
    pub fn new() -> Tree {
        Tree::default()
    }

    /// Every entry, sorted by path.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &Node)> {
        self.nodes.iter()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// What the tree holds: its number of entries and the bytes of their paths, link targets
    /// and file facts (see [`Node::heap_bytes`]; `ENTRY_OVERHEAD` per entry not included).
    pub fn weight(&self) -> (usize, u64) {
        (self.nodes.len(), self.bytes)
    }

    /// Store `node` at the normalized `path`, keeping the byte count.
    fn put(&mut self, path: String, node: Node) {
        let add = path.len() as u64 + node.heap_bytes();
        if let Some(old) = self.nodes.get(&path) {
            self.bytes -= path.len() as u64 + old.heap_bytes();
        }
        self.bytes += add;
        self.nodes.insert(path, node);
    }

    /// Remove the entry at exactly `path`, keeping the byte count.
    fn take(&mut self, path: &str) -> Option<Node> {
        let node = self.nodes.remove(path)?;
        self.bytes -= path.len() as u64 + node.heap_bytes();
        Some(node)
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The entry stored at exactly `path` (no symlink following).
    pub fn get(&self, path: &str) -> Option<&Node> {
        self.nodes.get(&normalize(path))
    }

    /// Insert an entry, creating missing parent directories (mode 0755). An entry that replaces
    /// a directory with something else takes the directory's subtree with it, as a layer does.
    pub fn insert(&mut self, path: &str, node: Node) {
        let path = normalize(path);
        if path.is_empty() {
            return;
        }
        if !matches!(node, Node::Dir { .. }) {
            if let Some(Node::Dir { .. }) = self.nodes.get(&path) {
                self.remove(&path);
            }
        }
        let mut dir = parent(&path);
        let mut missing = Vec::new();
        while !dir.is_empty() {
            match self.nodes.get(dir) {
                Some(Node::Dir { .. }) | Some(Node::Symlink { .. }) => break,
                _ => missing.push(dir.to_string()),
            }
            dir = parent(dir);
        }
        for d in missing {
            self.put(d, Node::Dir { mode: 0o755 });
        }
        self.put(path, node);
    }

    #[cfg(test)]
    /// Insert a file held in memory (see [`File::inline`]).
    pub(crate) fn insert_bytes(&mut self, path: &str, mode: u32, bytes: &[u8]) {
        self.insert(path, File::inline(mode, bytes).into());
    }

    /// Insert a symlink.
    pub fn insert_symlink(&mut self, path: &str, target: &str) {
        self.insert(
            path,
            Node::Symlink {
                target: target.to_string(),
            },
        );
    }

    /// Remove an entry and everything under it (a whiteout).
    pub fn remove(&mut self, path: &str) {
        let path = normalize(path);
        self.take(&path);
        let prefix = format!("{path}/");
        let under: Vec<String> = self
            .nodes
            .range(prefix.clone()..)
            .take_while(|(k, _)| k.starts_with(&prefix))
            .map(|(k, _)| k.clone())
            .collect();
        for k in under {
            self.take(&k);
        }
    }

    /// Remove everything under `dir` but keep `dir` (an opaque-directory whiteout).
    pub(crate) fn clear_dir(&mut self, dir: &str) {
        let dir = normalize(dir);
        let keep = self.nodes.get(&dir).cloned();
        self.remove(&dir);
        if let Some(node) = keep {
            self.put(dir, node);
        }
    }

    /// Follow `path` through the symlinks of this tree, as the kernel would inside a container
    /// whose root is this tree: absolute targets restart at the image root, relative ones at
    /// the link's directory. With `follow_last = false` a final symlink is returned itself.
    pub fn resolve(&self, path: &str, follow_last: bool) -> Result<Resolved, ResolveError> {
        let mut links = Vec::new();
        // Components still to walk, last first, so targets can be pushed in front.
        let mut todo: Vec<String> = normalize(path)
            .split('/')
            .rev()
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        let mut cur = String::new();
        while let Some(c) = todo.pop() {
            let next = if c == ".." {
                parent(&cur).to_string()
            } else if c == "." {
                cur.clone()
            } else if cur.is_empty() {
                c.clone()
            } else {
                format!("{cur}/{c}")
            };
            if c == ".." || c == "." {
                cur = next;
                continue;
            }
            let last = todo.is_empty();
            match self.nodes.get(&next) {
                None => return Err(ResolveError::NotFound),
                Some(Node::Symlink { target }) if !last || follow_last => {
                    links.push(next.clone());
                    if links.len() > MAX_SYMLINKS {
                        return Err(ResolveError::Loop);
                    }
                    if target.starts_with('/') {
                        cur = String::new();
                    }
                    for t in target.split('/').rev().filter(|t| !t.is_empty()) {
                        todo.push(t.to_string());
                    }
                }
                Some(Node::File(_)) if !last => return Err(ResolveError::NotADirectory(next)),
                Some(_) => cur = next,
            }
        }
        Ok(Resolved { links, path: cur })
    }

    /// The regular file reached from `path` (symlinks followed), with the resolution.
    pub fn file(&self, path: &str) -> Option<(Resolved, &File)> {
        let r = self.resolve(path, true).ok()?;
        match self.nodes.get(&r.path) {
            Some(Node::File(f)) => Some((r, &**f)),
            _ => None,
        }
    }

    /// Where `path` would land in this tree when its parent directories are followed through
    /// this tree's symlinks (a merged-`/usr` base has `lib -> usr/lib`: a builder file at
    /// `lib/x/libfoo.so` must be written to `usr/lib/x/libfoo.so`, or the layer would replace
    /// the base's symlink with a directory). Parents that do not exist are kept as they are.
    pub fn place(&self, path: &str) -> String {
        let path = normalize(path);
        let (dir, name) = match path.rsplit_once('/') {
            Some((d, n)) => (d, n),
            None => return path,
        };
        let mut placed = String::new();
        let comps: Vec<&str> = dir.split('/').collect();
        for (i, c) in comps.iter().enumerate() {
            let candidate = if placed.is_empty() {
                c.to_string()
            } else {
                format!("{placed}/{c}")
            };
            match self.resolve(&candidate, true) {
                Ok(r) if matches!(self.nodes.get(&r.path), Some(Node::Dir { .. })) => {
                    placed = r.path
                }
                _ => {
                    let rest = comps[i..].join("/");
                    placed = if placed.is_empty() {
                        rest
                    } else {
                        format!("{placed}/{rest}")
                    };
                    break;
                }
            }
        }
        if placed.is_empty() {
            name.to_string()
        } else {
            format!("{placed}/{name}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Tree {
        let mut t = Tree::new();
        t.insert_symlink("lib", "usr/lib");
        t.insert_bytes("usr/lib/x86_64-linux-gnu/libz.so.1.2.13", 0o644, b"z");
        t.insert_symlink("usr/lib/x86_64-linux-gnu/libz.so.1", "libz.so.1.2.13");
        t.insert_symlink(
            "usr/lib/x86_64-linux-gnu/libz.so",
            "/lib/x86_64-linux-gnu/libz.so.1",
        );
        t.insert_symlink("loop/a", "b");
        t.insert_symlink("loop/b", "a");
        t.insert_symlink("up", "../../../usr");
        t
    }

    fn check(path: &str, follow_last: bool, expected: Result<(&[&str], &str), ResolveError>) {
        let got = tree().resolve(path, follow_last);
        let expected = expected.map(|(links, path)| Resolved {
            links: links.iter().map(|s| s.to_string()).collect(),
            path: path.to_string(),
        });
        assert_eq!(got, expected, "resolving {path}");
    }

    #[test]
    fn resolves_symlink_chains_inside_the_image() {
        let dir = "usr/lib/x86_64-linux-gnu";
        check(
            "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13",
            true,
            Ok((&[], "usr/lib/x86_64-linux-gnu/libz.so.1.2.13")),
        );
        check(
            "/usr/lib/x86_64-linux-gnu/libz.so",
            true,
            Ok((
                &[
                    "usr/lib/x86_64-linux-gnu/libz.so",
                    "lib",
                    "usr/lib/x86_64-linux-gnu/libz.so.1",
                ],
                "usr/lib/x86_64-linux-gnu/libz.so.1.2.13",
            )),
        );
        check(
            "/lib/x86_64-linux-gnu/libz.so.1",
            false,
            Ok((&["lib"], "usr/lib/x86_64-linux-gnu/libz.so.1")),
        );
        check("/up/lib", true, Ok((&["up"], "usr/lib")));
        check("/loop/a", true, Err(ResolveError::Loop));
        check("/lib/nothing", true, Err(ResolveError::NotFound));
        check(
            "/usr/lib/x86_64-linux-gnu/libz.so.1.2.13/x",
            true,
            Err(ResolveError::NotADirectory(format!("{dir}/libz.so.1.2.13"))),
        );
    }

    #[test]
    fn normalizes_paths() {
        assert_eq!(normalize("/usr//lib/./x/../y"), "usr/lib/y");
        assert_eq!(normalize("/../.."), "");
        assert_eq!(join("usr/lib", "../bin/x"), "usr/bin/x");
        assert_eq!(join("usr/lib", "/etc/x"), "etc/x");
    }

    #[test]
    fn places_paths_through_the_base_symlinks() {
        let t = tree();
        assert_eq!(
            t.place("/lib/x86_64-linux-gnu/libnew.so.1"),
            "usr/lib/x86_64-linux-gnu/libnew.so.1"
        );
        assert_eq!(t.place("/opt/trt/lib/libx.so"), "opt/trt/lib/libx.so");
        assert_eq!(t.place("/lib/newdir/sub/f"), "usr/lib/newdir/sub/f");
        assert_eq!(t.place("top"), "top");
    }

    #[test]
    fn whiteouts_remove_subtrees() {
        let mut t = tree();
        t.remove("usr/lib");
        assert!(t.get("usr/lib/x86_64-linux-gnu/libz.so.1").is_none());
        assert!(t.get("usr").is_some());
        let mut t = tree();
        t.clear_dir("loop");
        assert!(t.get("loop").is_some());
        assert!(t.get("loop/a").is_none());
    }

    #[test]
    fn the_weight_follows_inserts_replacements_and_removals() {
        let mut t = Tree::new();
        assert_eq!(t.weight(), (0, 0));
        t.insert_symlink("a/b", "target");
        // `a` (1 byte), `a/b` (3) and the target (6).
        assert_eq!(t.weight(), (2, 10));
        t.insert_symlink("a/b", "t");
        assert_eq!(t.weight(), (2, 5));
        t.insert_bytes("a/c", 0o644, b"xyz");
        let (n, bytes) = t.weight();
        assert_eq!(n, 3);
        assert!(bytes > 5 + 3 + 64, "{bytes}");
        t.remove("a");
        assert_eq!(t.weight(), (0, 0));
        t.insert("d/e", Node::Dir { mode: 0o700 });
        t.clear_dir("d");
        assert_eq!(t.weight(), (1, 1));
        // A directory costs a few words besides its path.
        assert!(
            std::mem::size_of::<Node>() <= 32,
            "{}",
            std::mem::size_of::<Node>()
        );
    }
}
