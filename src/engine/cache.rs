//! The content-addressed engine cache on disk.
//!
//! Layout under the root (default `engines` under the cache root, see [`crate::cache`]):
//! ```text
//! v1/entries/<key>/     a complete entry: the engine file, meta.json, profile.json, build.log
//! v1/staging/<key>.<pid>.<n>/   an entry being built (renamed into entries/ when complete)
//! v1/locks/<key>.lock   held (exclusive) while an entry is built
//! v1/timing/<name>.cache        TensorRT timing caches (advisory, shared across keys)
//! ```
//! Invariants: an entry directory appears only by an atomic rename of a staging directory whose
//! files were written and synced first, so a reader sees a whole entry or none, even after
//! `kill -9`. Staging directories left by a killed build are removed by the next build of the
//! same key, under that key's lock. Entries are never modified after the rename.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use infer_spec::engine::{EngineMeta, EngineProfile, META_FILE, PROFILE_FILE};

use super::Error;

const LAYOUT: &str = "v1";

static STAGING_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An engine cache rooted at a directory.
#[derive(Debug, Clone)]
pub struct Cache {
    root: PathBuf,
}

/// A complete cache entry.
#[derive(Debug, Clone)]
pub struct Entry {
    pub dir: PathBuf,
    pub meta: EngineMeta,
    pub profile: EngineProfile,
}

impl Entry {
    /// The engine file inside the entry.
    pub(crate) fn engine_path(&self) -> PathBuf {
        self.dir.join(self.meta.format.file_name())
    }

    /// Read an entry directory: parse its metadata and profile and check that the engine file
    /// exists with the recorded size. Does not hash the engine (see [`Entry::verify_digest`]).
    pub fn read(dir: &Path) -> Result<Entry, Error> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        // Entries may come from elsewhere (`--engines DIR` of CI artifacts): regular files of
        // bounded size only, so a FIFO or a huge file cannot hang or exhaust the build.
        let read = |path: &Path| {
            crate::oci::dir::read_file(path, crate::oci::MAX_DOCUMENT, "engine metadata").map_err(
                |e| Error::Io {
                    path: path.to_path_buf(),
                    source: e.into_io(),
                },
            )
        };
        let meta_path = dir.join(META_FILE);
        let meta_bytes = read(&meta_path)?;
        let meta = EngineMeta::from_json(&meta_bytes).map_err(|source| Error::Meta {
            path: meta_path.clone(),
            source,
        })?;
        let profile_path = dir.join(PROFILE_FILE);
        let profile_bytes = read(&profile_path)?;
        let profile = EngineProfile::from_json(&profile_bytes).map_err(|source| Error::Meta {
            path: profile_path.clone(),
            source,
        })?;
        let entry = Entry {
            dir: dir.to_path_buf(),
            meta,
            profile,
        };
        let engine = entry.engine_path();
        let len = fs::metadata(&engine).map_err(io(&engine))?.len();
        if len != entry.meta.engine_size {
            return Err(Error::Corrupt {
                path: engine,
                reason: format!(
                    "size {len} differs from the recorded {}",
                    entry.meta.engine_size
                ),
            });
        }
        if entry.profile.engine_digest != entry.meta.engine_digest {
            return Err(Error::Corrupt {
                path: profile_path,
                reason: "the profile belongs to another engine".into(),
            });
        }
        Ok(entry)
    }

    /// Hash the engine file and compare with the recorded digest.
    pub fn verify_digest(&self) -> Result<(), Error> {
        let path = self.engine_path();
        let digest = digest_file(&path)?;
        if digest != self.meta.engine_digest {
            return Err(Error::Corrupt {
                path,
                reason: format!(
                    "digest {digest} differs from the recorded {}",
                    self.meta.engine_digest
                ),
            });
        }
        Ok(())
    }
}

/// `sha256:<hex>` of a file, streamed.
pub fn digest_file(path: &Path) -> Result<String, Error> {
    Ok(measure_file(path)?.0)
}

/// `sha256:<hex>` and size of a file, from one open and one read.
pub(crate) fn measure_file(path: &Path) -> Result<(String, u64), Error> {
    // A regular file only: a directory or FIFO given as an engine path gets a message saying
    // so (instead of an error from the first read, or a read that never returns).
    let (f, _) = crate::oci::dir::open_file(path).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e.into_io(),
    })?;
    let (digest, size) = crate::oci::Digest::of_reader(f).map_err(|source| Error::Io {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((digest.to_string(), size))
}

/// An exclusive lock on a file, released on drop (or when the process dies).
#[derive(Debug)]
pub struct FileLock {
    _file: File,
}

impl FileLock {
    pub(crate) fn acquire(path: &Path) -> Result<FileLock, Error> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .map_err(|source| Error::Io {
                path: path.to_path_buf(),
                source,
            })?;
        fs4::FileExt::lock(&file).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(FileLock { _file: file })
    }
}

/// A directory an entry is being built in. Removed on drop unless committed.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl Staging {
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Sync every file, then atomically rename the staging directory to the entry's place.
    pub fn commit(mut self) -> Result<PathBuf, Error> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Io { path, source }
        };
        for e in fs::read_dir(&self.dir).map_err(io(&self.dir))? {
            let p = e.map_err(io(&self.dir))?.path();
            if p.is_file() {
                File::open(&p).and_then(|f| f.sync_all()).map_err(io(&p))?;
            }
        }
        fs::rename(&self.dir, &self.target).map_err(io(&self.target))?;
        if let Some(parent) = self.target.parent() {
            // Persist the rename itself.
            let _ = File::open(parent).and_then(|f| f.sync_all());
        }
        self.committed = true;
        Ok(self.target.clone())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Make everything written under `dir` durable before it is renamed into place: `syncfs` on
/// the file system that holds it. For staging trees of many files (a Python environment),
/// where a sync per file would cost more than one sync of the file system.
pub(crate) fn sync_tree(dir: &Path) -> Result<(), Error> {
    let io = |source: std::io::Error| Error::Io {
        path: dir.to_path_buf(),
        source,
    };
    let d = File::open(dir).map_err(io)?;
    rustix::fs::syncfs(&d).map_err(|e| io(e.into()))
}

/// Write `bytes` to `path` through a temporary file in the same directory and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    crate::oci::write_atomic(path, bytes).map_err(|e| Error::Io {
        path: path.to_path_buf(),
        source: e.into_io(),
    })
}

impl Cache {
    /// Open (creating if needed) a cache at `root`.
    ///
    /// The root is the user's (a link there is followed); below it, `v1` and its four
    /// directories are opened without following links, so a cache whose `v1/staging` or
    /// `v1/entries` is a link to elsewhere is refused rather than written through.
    pub fn open(root: &Path) -> Result<Cache, Error> {
        let oci = |path: PathBuf| {
            move |e: crate::oci::Error| Error::Io {
                path,
                source: e.into_io(),
            }
        };
        let base = crate::oci::Dir::create(root)
            .and_then(|r| r.sub(LAYOUT, true))
            .map_err(oci(root.join(LAYOUT)))?;
        for sub in ["entries", "staging", "locks", "timing"] {
            base.sub(sub, true)
                .map_err(oci(root.join(LAYOUT).join(sub)))?;
        }
        Ok(Cache {
            root: root.to_path_buf(),
        })
    }

    /// True when `dir` looks like a cache root (has the layout directory).
    pub(crate) fn is_cache_root(dir: &Path) -> bool {
        dir.join(LAYOUT).join("entries").is_dir()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn base(&self) -> PathBuf {
        self.root.join(LAYOUT)
    }

    pub(crate) fn entry_dir(&self, key: &str) -> PathBuf {
        self.base().join("entries").join(key)
    }

    pub fn entries_dir(&self) -> PathBuf {
        self.base().join("entries")
    }

    /// The complete entry for `key`, if any. An entry that is present but unreadable is an
    /// error, not a miss: it is never silently rebuilt over.
    pub fn get(&self, key: &str) -> Result<Option<Entry>, Error> {
        let dir = self.entry_dir(key);
        if !dir.exists() {
            return Ok(None);
        }
        Entry::read(&dir).map(Some)
    }

    /// Take the build lock of `key` (blocks while another process builds it).
    pub fn lock(&self, key: &str) -> Result<FileLock, Error> {
        FileLock::acquire(&self.base().join("locks").join(format!("{key}.lock")))
    }

    /// Remove staging directories of `key` left by killed builds. Call with the key's lock held.
    pub(crate) fn clean_stale(&self, key: &str) -> Result<usize, Error> {
        let dir = self.base().join("staging");
        let prefix = format!("{key}.");
        let mut n = 0;
        let rd = fs::read_dir(&dir).map_err(|source| Error::Io {
            path: dir.clone(),
            source,
        })?;
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = fs::remove_dir_all(e.path());
                n += 1;
            }
        }
        Ok(n)
    }

    /// A fresh staging directory for `key`. Call with the key's lock held.
    pub fn stage(&self, key: &str) -> Result<Staging, Error> {
        let n = STAGING_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("{key}.{}.{n}", std::process::id());
        let staging = self.base().join("staging");
        let dir = staging.join(&name);
        // Created and opened below `staging` without following a link: a planted link of the
        // same name is refused, never built into.
        crate::oci::Dir::open(&staging)
            .and_then(|d| d.sub(&name, true))
            .map_err(|e| Error::Io {
                path: dir.clone(),
                source: e.into_io(),
            })?;
        Ok(Staging {
            dir,
            target: self.entry_dir(key),
            committed: false,
        })
    }

    /// Path of a TensorRT timing cache file (shared across keys of the same TensorRT build and
    /// GPU) and the lock guarding it.
    pub(crate) fn timing_cache(&self, name: &str) -> (PathBuf, PathBuf) {
        let safe: String = name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || ".-_".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        let d = self.base().join("timing");
        (
            d.join(format!("{safe}.cache")),
            d.join(format!("{safe}.lock")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linked_cache_directories_are_refused_not_written_through() {
        for linked in ["v1/staging", "v1/entries", "v1/locks", "v1"] {
            let tmp = tempfile::tempdir().unwrap();
            let outside = tmp.path().join("outside");
            fs::create_dir_all(&outside).unwrap();
            let root = tmp.path().join("cache");
            let link = root.join(linked);
            fs::create_dir_all(link.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(&outside, &link).unwrap();
            let e = Cache::open(&root).unwrap_err();
            // What the CLI shows: the error and its cause.
            let err = format!("{e}: {}", std::error::Error::source(&e).unwrap());
            assert!(err.contains("symbolic link"), "{linked}: {err}");
            assert_eq!(fs::read_dir(&outside).unwrap().count(), 0, "{linked}");
        }
    }

    #[test]
    fn a_planted_staging_link_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::open(&tmp.path().join("c")).unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir_all(&outside).unwrap();
        let n = STAGING_COUNTER.load(Ordering::Relaxed);
        // Plant links at the next few names this process would use.
        for k in n..n + 64 {
            let name = format!("abc.{}.{k}", std::process::id());
            std::os::unix::fs::symlink(&outside, cache.base().join("staging").join(name)).unwrap();
        }
        assert!(cache.stage("abc").is_err());
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn staging_is_removed_unless_committed() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::open(tmp.path()).unwrap();
        let s = cache.stage("abc").unwrap();
        let p = s.path().to_path_buf();
        fs::write(p.join("x"), b"1").unwrap();
        drop(s);
        assert!(!p.exists());
        let s = cache.stage("abc").unwrap();
        fs::write(s.path().join("x"), b"1").unwrap();
        let dir = s.commit().unwrap();
        assert_eq!(dir, cache.entry_dir("abc"));
        assert_eq!(fs::read(dir.join("x")).unwrap(), b"1");
    }

    #[test]
    fn stale_staging_is_cleaned_per_key() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = Cache::open(tmp.path()).unwrap();
        let staging = tmp.path().join("v1/staging");
        fs::create_dir_all(staging.join("abc.999.0")).unwrap();
        fs::create_dir_all(staging.join("abd.999.0")).unwrap();
        let _lock = cache.lock("abc").unwrap();
        assert_eq!(cache.clean_stale("abc").unwrap(), 1);
        assert!(staging.join("abd.999.0").exists());
    }

    #[test]
    fn atomic_write_replaces() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("f");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        assert_eq!(
            digest_file(&p).unwrap(),
            "sha256:3fc4ccfe745870e2c0d99f71f30ff0656c8dedd41cc1d7d3d376b0dbe685e2f3"
        );
    }
}
