//! Where infer-build keeps what it caches between runs: the one rule for the cache root and the
//! names of what lives under it.
//!
//! Precedence, first that applies wins:
//! 1. a command-line flag naming the entry's location (`engine --cache DIR`, `pull --out DIR`,
//!    `build --base-layout DIR`): used as given;
//! 2. `$INFER_BUILD_CACHE_DIR/<entry>`;
//! 3. `$XDG_CACHE_HOME/infer-build/<entry>`;
//! 4. `$HOME/.cache/infer-build/<entry>`.
//!
//! An empty variable counts as unset. Entries under the root: `engines` (the engine cache, with
//! its converted models and Python environments), `bases` (pulled base images, one OCI layout), `libraries`
//! (native runtime libraries from pinned wheels) and `registry-locations.json` (which repositories hold which blobs, for cross-repository mounts).
//! Reads the environment only; touches no filesystem.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Something infer-build keeps under the cache root.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The engine cache (`engine::Cache`).
    Engines,
    /// Pulled base images, one OCI layout (`registry::pull`).
    Bases,
    /// Blob locations per registry, for cross-repository mounts (`registry::push`).
    RegistryLocations,
    /// Native runtime libraries from pinned wheels (`native`).
    Libraries,
}

impl Entry {
    /// The entry's name under the cache root.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Entry::Engines => "engines",
            Entry::Bases => "bases",
            Entry::RegistryLocations => "registry-locations.json",
            Entry::Libraries => "libraries",
        }
    }
}

/// No flag was given and none of the variables the root is derived from is set.
#[derive(Debug, thiserror::Error)]
#[error("no cache directory: set INFER_BUILD_CACHE_DIR, XDG_CACHE_HOME or HOME, or pass {flag}")]
pub struct NoCacheDir {
    /// The flag that names the location instead (e.g. `--cache DIR`).
    pub flag: &'static str,
}

/// The values of the variables the root is derived from (empty values already dropped).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Env {
    pub infer_build_cache_dir: Option<PathBuf>,
    pub xdg_cache_home: Option<PathBuf>,
    pub home: Option<PathBuf>,
}

impl Env {
    /// This process's environment.
    pub(crate) fn current() -> Env {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v: &OsString| !v.is_empty())
                .map(PathBuf::from)
        };
        Env {
            infer_build_cache_dir: var("INFER_BUILD_CACHE_DIR"),
            xdg_cache_home: var("XDG_CACHE_HOME"),
            home: var("HOME"),
        }
    }

    /// The cache root, `None` when no variable is set.
    pub(crate) fn root(&self) -> Option<PathBuf> {
        self.infer_build_cache_dir
            .clone()
            .or_else(|| self.xdg_cache_home.as_ref().map(|d| d.join("infer-build")))
            .or_else(|| {
                self.home
                    .as_ref()
                    .map(|h| h.join(".cache").join("infer-build"))
            })
    }

    /// Where `entry` lives: `flag` when given, else under [`Env::root`].
    pub(crate) fn path(&self, entry: Entry, flag: Option<&Path>) -> Option<PathBuf> {
        match flag {
            Some(p) => Some(p.to_path_buf()),
            None => self.root().map(|r| r.join(entry.name())),
        }
    }
}

/// Where `entry` lives for this process (see the module docs), `None` when nothing says.
pub(crate) fn path(entry: Entry, flag: Option<&Path>) -> Option<PathBuf> {
    Env::current().path(entry, flag)
}

/// [`path`], or the one error naming `flag_name`, the flag that would have said.
pub(crate) fn require(
    entry: Entry,
    flag: Option<&Path>,
    flag_name: &'static str,
) -> Result<PathBuf, NoCacheDir> {
    path(entry, flag).ok_or(NoCacheDir { flag: flag_name })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precedence() {
        let p = |s: &str| Some(PathBuf::from(s));
        let env = |c: &str, x: &str, h: &str| Env {
            infer_build_cache_dir: (!c.is_empty()).then(|| c.into()),
            xdg_cache_home: (!x.is_empty()).then(|| x.into()),
            home: (!h.is_empty()).then(|| h.into()),
        };
        /// (flag, INFER_BUILD_CACHE_DIR, XDG_CACHE_HOME, HOME, entry, expected)
        type Case = (
            Option<&'static str>,
            &'static str,
            &'static str,
            &'static str,
            Entry,
            Option<PathBuf>,
        );
        let cases: &[Case] = &[
            (Some("/f"), "/c", "/x", "/h", Entry::Engines, p("/f")),
            (Some("/f"), "", "", "", Entry::Bases, p("/f")),
            (None, "/c", "/x", "/h", Entry::Engines, p("/c/engines")),
            (None, "/c", "/x", "/h", Entry::Bases, p("/c/bases")),
            (
                None,
                "/c",
                "",
                "",
                Entry::RegistryLocations,
                p("/c/registry-locations.json"),
            ),
            (
                None,
                "",
                "/x",
                "/h",
                Entry::Engines,
                p("/x/infer-build/engines"),
            ),
            (None, "", "/x", "", Entry::Bases, p("/x/infer-build/bases")),
            (
                None,
                "",
                "",
                "/h",
                Entry::Engines,
                p("/h/.cache/infer-build/engines"),
            ),
            (
                None,
                "",
                "",
                "/h",
                Entry::RegistryLocations,
                p("/h/.cache/infer-build/registry-locations.json"),
            ),
            (None, "", "", "", Entry::Engines, None),
        ];
        for (flag, c, x, h, entry, want) in cases {
            let got = env(c, x, h).path(*entry, flag.map(Path::new));
            assert_eq!(
                &got, want,
                "flag {flag:?}, env ({c:?}, {x:?}, {h:?}), {entry:?}"
            );
        }
    }

    #[test]
    fn the_error_names_the_variables_and_the_flag() {
        let msg = NoCacheDir {
            flag: "--cache DIR",
        }
        .to_string();
        for w in [
            "INFER_BUILD_CACHE_DIR",
            "XDG_CACHE_HOME",
            "HOME",
            "--cache DIR",
        ] {
            assert!(msg.contains(w), "{msg}");
        }
    }
}
