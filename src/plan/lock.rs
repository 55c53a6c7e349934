//! The lock file beside a recipe (`resnet50.toml` → `resnet50.lock`): the digest each base
//! image resolved to at its first pull, so later builds pull exactly the same bytes, and the
//! wheel each native runtime library was taken from (`[[library]]`: URL and sha256), so a
//! newer infer-build does not move it silently.
//!
//! ```toml
//! # infer-build lock file: base image digests recorded at first pull. Commit it with the recipe.
//! version = 1
//!
//! [[image]]
//! reference = "docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04"
//! digest = "sha256:…"
//!
//! [[library]]
//! name = "onnxruntime"
//! platform = "x86_64"
//! version = "…"
//! url = "https://files.pythonhosted.org/packages/…/onnxruntime-….whl"
//! sha256 = "…"
//! ```
//!
//! The plan reads it ([`parse`]/[`read`]); pulling a base and fetching a native library pin
//! what they resolved through [`update`], the one writer of lock files (atomic and durable,
//! through [`crate::oci::write_atomic`]). [`render`] is canonical (sorted by reference, fixed
//! layout), so writing an unchanged lock rewrites identical bytes.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The lock format version this build reads and writes.
pub(crate) const VERSION: u32 = 1;

/// A parsed lock file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lock {
    /// Sorted by reference, one entry per reference.
    pub images: Vec<LockedImage>,
    /// Sorted by (name, platform), one entry per pair.
    pub libraries: Vec<LockedLibrary>,
}

/// One native runtime library and the wheel it was taken from.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedLibrary {
    pub name: String,
    pub platform: String,
    pub version: String,
    pub url: String,
    /// The wheel's sha256, hex.
    pub sha256: String,
}

/// One base image and the digest it resolved to.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedImage {
    pub reference: String,
    pub digest: String,
}

/// Errors reading or writing a lock file.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    #[error("cannot write lock file {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot read lock file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}:{line}:{col}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        line: usize,
        col: usize,
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    version: u32,
    #[serde(default)]
    image: Vec<toml::Spanned<LockedImage>>,
    #[serde(default)]
    library: Vec<toml::Spanned<LockedLibrary>>,
}

/// The lock file of `recipe`: the same path with the extension `.lock`.
pub(crate) fn path_for(recipe: &Path) -> PathBuf {
    recipe.with_extension("lock")
}

impl LockError {
    /// True when the user can fix this by changing the lock file (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, LockError::Invalid { .. })
    }
}

/// Read the lock file at `path` (an empty lock when there is none), change it with `change`
/// and write it back in canonical text, atomically and durably, keeping every entry `change`
/// leaves alone.
pub(crate) fn update(path: &Path, change: impl FnOnce(&mut Lock)) -> Result<(), LockError> {
    let mut lock = read(path)?.unwrap_or_default();
    change(&mut lock);
    crate::oci::write_atomic(path, render(&lock).as_bytes()).map_err(|e| LockError::Write {
        path: path.to_path_buf(),
        source: e.into_io(),
    })
}

impl Lock {
    /// The recorded digest of `reference`.
    pub fn digest(&self, reference: &str) -> Option<&str> {
        self.images
            .iter()
            .find(|i| i.reference == reference)
            .map(|i| i.digest.as_str())
    }

    /// The pinned wheel of library `name` on `platform`: of exactly `version` when given (a
    /// library with one pin per release, TensorRT's lean runtime), else the one pin of the
    /// name (ONNX Runtime).
    pub fn library(
        &self,
        name: &str,
        platform: &str,
        version: Option<&str>,
    ) -> Option<&LockedLibrary> {
        self.libraries.iter().find(|l| {
            l.name == name && l.platform == platform && version.is_none_or(|v| l.version == v)
        })
    }

    /// Record (or replace) a library pin, keeping the entries sorted by name, platform and
    /// version. `only`: the pin replaces every other version of the name on the platform
    /// (a library the matrix pins one version of); otherwise each version has its own pin.
    pub(crate) fn set_library(&mut self, lib: LockedLibrary, only: bool) {
        if only {
            self.libraries
                .retain(|l| !(l.name == lib.name && l.platform == lib.platform));
        }
        fn key(l: &LockedLibrary) -> (&str, &str, &str) {
            (&l.name, &l.platform, &l.version)
        }
        match self.libraries.binary_search_by(|l| key(l).cmp(&key(&lib))) {
            Ok(i) => self.libraries[i] = lib,
            Err(i) => self.libraries.insert(i, lib),
        }
    }

    /// Record (or replace) the digest of `reference`, keeping the entries sorted.
    pub fn set(&mut self, reference: &str, digest: &str) {
        match self
            .images
            .binary_search_by(|i| i.reference.as_str().cmp(reference))
        {
            Ok(i) => self.images[i].digest = digest.to_string(),
            Err(i) => self.images.insert(
                i,
                LockedImage {
                    reference: reference.to_string(),
                    digest: digest.to_string(),
                },
            ),
        }
    }
}

/// Parse a lock file's text; `path` names it in errors.
pub(crate) fn parse(text: &str, path: &Path) -> Result<Lock, LockError> {
    let invalid = |offset: usize, message: String| {
        let (line, col) = crate::matrix::line_col(text, offset);
        LockError::Invalid {
            path: path.to_path_buf(),
            line,
            col,
            message,
        }
    };
    let raw: Raw = toml::from_str(text).map_err(|e| {
        invalid(
            e.span().map_or(0, |s| s.start),
            e.message().trim().to_string(),
        )
    })?;
    if raw.version != VERSION {
        return Err(invalid(
            0,
            format!(
                "lock file version {} is not supported (this build reads version {VERSION})",
                raw.version
            ),
        ));
    }
    let mut lock = Lock::default();
    for s in raw.image {
        let at = s.span().start;
        let img = s.into_inner();
        if crate::oci::hex_of(&img.digest).is_none() {
            return Err(invalid(
                at,
                format!(
                    "image {}: digest \"{}\" is not sha256: followed by 64 lowercase hex digits",
                    img.reference, img.digest
                ),
            ));
        }
        if lock.digest(&img.reference).is_some() {
            return Err(invalid(
                at,
                format!("image {} is listed twice", img.reference),
            ));
        }
        lock.set(&img.reference, &img.digest);
    }
    for s in raw.library {
        let at = s.span().start;
        let lib = s.into_inner();
        if !crate::oci::digest::is_sha256_hex(&lib.sha256) {
            return Err(invalid(
                at,
                format!(
                    "library {}: sha256 \"{}\" is not 64 lowercase hex digits",
                    lib.name, lib.sha256
                ),
            ));
        }
        if lock
            .library(&lib.name, &lib.platform, Some(&lib.version))
            .is_some()
        {
            return Err(invalid(
                at,
                format!(
                    "library {} {} ({}) is listed twice",
                    lib.name, lib.version, lib.platform
                ),
            ));
        }
        lock.set_library(lib, false);
    }
    Ok(lock)
}

/// The canonical text of a lock file.
pub(crate) fn render(lock: &Lock) -> String {
    let mut images = lock.images.clone();
    images.sort_by(|a, b| a.reference.cmp(&b.reference));
    images.dedup_by(|a, b| a.reference == b.reference);
    let mut s = String::from(
        "# infer-build lock file: base image digests recorded at first pull. Commit it with the recipe.\n",
    );
    s.push_str(&format!("version = {VERSION}\n"));
    for i in &images {
        s.push_str("\n[[image]]\n");
        s.push_str(&format!("reference = {}\n", toml_string(&i.reference)));
        s.push_str(&format!("digest = {}\n", toml_string(&i.digest)));
    }
    let mut libs = lock.libraries.clone();
    libs.sort_by(|a, b| {
        (&a.name, &a.platform, &a.version).cmp(&(&b.name, &b.platform, &b.version))
    });
    for l in &libs {
        s.push_str("\n[[library]]\n");
        for (k, v) in [
            ("name", &l.name),
            ("platform", &l.platform),
            ("version", &l.version),
            ("url", &l.url),
            ("sha256", &l.sha256),
        ] {
            s.push_str(&format!("{k} = {}\n", toml_string(v)));
        }
    }
    s
}

fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\u{:04X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Read the lock file at `path`; `Ok(None)` when there is none yet.
pub fn read(path: &Path) -> Result<Option<Lock>, LockError> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse(&text, path).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(LockError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D1: &str = "sha256:29e5e3425e2e0f5a4e97c9fb4695ba4887cd78210a43cf94c3bcafc6ab01c5e6";
    const D2: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn render_is_canonical_and_round_trips() {
        let mut lock = Lock::default();
        lock.set("z/image:1", D2);
        lock.set("a/image:1", D1);
        lock.set("z/image:1", D1);
        let text = render(&lock);
        assert_eq!(
            text,
            format!("# infer-build lock file: base image digests recorded at first pull. Commit it with the recipe.\nversion = 1\n\n[[image]]\nreference = \"a/image:1\"\ndigest = \"{D1}\"\n\n[[image]]\nreference = \"z/image:1\"\ndigest = \"{D1}\"\n")
        );
        let back = parse(&text, Path::new("r.lock")).unwrap();
        assert_eq!(back, lock);
        assert_eq!(render(&back), text);
        assert_eq!(back.digest("a/image:1"), Some(D1));
        assert_eq!(back.digest("b"), None);
    }

    #[test]
    fn bad_lock_files_name_the_place() {
        let check = |text: &str, want: &str| {
            let e = parse(text, Path::new("r.lock")).unwrap_err().to_string();
            assert!(e.contains(want), "{e} does not contain {want}");
        };
        check(
            "version = 2\n",
            "r.lock:1:1: lock file version 2 is not supported",
        );
        check(
            "version = 1\n[[image]]\nreference = \"a\"\ndigest = \"sha256:12\"\n",
            "r.lock:2:1: image a: digest",
        );
        check(
            "version = 1\n[[image]]\nreference = \"a\"\n",
            "missing field `digest`",
        );
        check("version = 1\nextra = 3\n", "r.lock:2:1");
        check(&format!("version = 1\n[[image]]\nreference = \"a\"\ndigest = \"{D1}\"\n[[image]]\nreference = \"a\"\ndigest = \"{D1}\"\n"), "listed twice");
    }

    #[test]
    fn libraries_round_trip_after_images() {
        let mut lock = Lock::default();
        lock.set("a/image:1", D1);
        let lib = |p: &str| LockedLibrary {
            name: "onnxruntime".into(),
            platform: p.into(),
            version: "1.2.3".into(),
            url: "https://files.pythonhosted.org/packages/x/o.whl".into(),
            sha256: "b".repeat(64),
        };
        lock.set_library(lib("x86_64"), true);
        lock.set_library(lib("sbsa"), true);
        lock.set_library(lib("x86_64"), true);
        assert_eq!(lock.libraries.len(), 2);
        let text = render(&lock);
        assert!(text.contains("\n[[library]]\nname = \"onnxruntime\"\nplatform = \"sbsa\"\n"));
        let back = parse(&text, Path::new("r.lock")).unwrap();
        assert_eq!(back, lock);
        assert_eq!(
            back.library("onnxruntime", "x86_64", None),
            Some(&lib("x86_64"))
        );
        let bad = text.replace(&"b".repeat(64), "xyz");
        let e = parse(&bad, Path::new("r.lock")).unwrap_err().to_string();
        assert!(
            e.contains("r.lock:") && e.contains("library onnxruntime: sha256"),
            "{e}"
        );
    }

    #[test]
    fn lock_path_sits_beside_the_recipe() {
        assert_eq!(
            path_for(Path::new("recipes/resnet50.toml")),
            PathBuf::from("recipes/resnet50.lock")
        );
        assert_eq!(path_for(Path::new("r")), PathBuf::from("r.lock"));
    }

    #[test]
    fn missing_lock_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(&dir.path().join("x.lock")).unwrap(), None);
        std::fs::write(
            dir.path().join("y.lock"),
            format!("version = 1\n[[image]]\nreference = \"a\"\ndigest = \"{D1}\"\n"),
        )
        .unwrap();
        assert_eq!(
            read(&dir.path().join("y.lock"))
                .unwrap()
                .unwrap()
                .images
                .len(),
            1
        );
    }
}
