//! The content-addressed blob store: an OCI image layout directory (`oci-layout`,
//! `blobs/sha256/<hex>`) plus infer-build's private state under `.infer-build/` (temp files,
//! the build-cache records and the lock file), which no OCI tool looks at and archives leave out.
//!
//! Invariants: a file under `blobs/sha256/` is always complete and fsynced and its name is the
//! sha256 of its content: blobs are written to `.infer-build/tmp/`, fsynced, then renamed into
//! place (atomic on one filesystem), and the directory is fsynced. Reads used to produce output
//! verify the digest. A build holds the exclusive lock for its whole duration, so two builds of
//! one layout run one after the other instead of interleaving `index.json` writes; blob writes
//! would be safe even without it.

use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::digest::Hasher;
use super::dir::{Dir, Kind};
use super::{cjson, Digest, Error, MAX_DOCUMENT};

const PRIVATE: &str = ".infer-build";
const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

/// An OCI layout used as a blob store. Its directories are opened once, when the store is
/// opened, and every read and write goes through those handles without following links
/// (see `super::dir`): a link planted at `blobs/sha256`, `.infer-build/tmp` or a blob is
/// refused, never followed.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
    top: Dir,
    /// `blobs/sha256`; `None` in a read-only layout that has no blobs yet.
    blobs: Option<Dir>,
    /// `.infer-build/tmp` and `.infer-build/cache`; `None` when opened read-only.
    tmp: Option<Dir>,
    cache: Option<Dir>,
}

/// Held for the duration of a build; dropping it releases the lock.
#[derive(Debug)]
pub struct Lock {
    _file: File,
}

/// What the build cache remembers about a layer it wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRecord {
    pub digest: Digest,
    pub diff_id: Digest,
    pub size: u64,
    pub media_type: String,
    pub tar_size: u64,
}

/// A blob being written: a temp file that becomes a blob on [`BlobStore::commit`], and is
/// removed if dropped before.
#[derive(Debug)]
pub struct TempBlob {
    dir: Dir,
    name: String,
    path: PathBuf,
    file: Option<File>,
    done: bool,
}

impl TempBlob {
    pub fn file(&mut self) -> &mut File {
        self.file
            .as_mut()
            .expect("temp blob file is open until commit")
    }
    pub(crate) fn take_file(&mut self) -> File {
        self.file
            .take()
            .expect("temp blob file is open until commit")
    }
    pub(crate) fn put_file(&mut self, f: File) {
        self.file = Some(f);
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.dir.remove(&self.name);
        }
    }
}

impl BlobStore {
    /// Open (creating if needed) a layout at `root`.
    pub fn create(root: &Path) -> Result<BlobStore, Error> {
        let top = Dir::create(root)?;
        let blobs = top.sub("blobs/sha256", true)?;
        let private = top.sub(PRIVATE, true)?;
        let tmp = private.sub("tmp", true)?;
        let cache = private.sub("cache", true)?;
        match top.stat("oci-layout")? {
            None => {
                // Not through the private `tmp` directory: this runs before the layout's lock
                // is taken, and taking the lock clears `tmp`, which deleted this temp file
                // under a second build creating the same layout at the same moment.
                top.write_atomic("oci-layout", OCI_LAYOUT, Some(&private))?;
            }
            Some(s) if s.kind == Kind::File => {}
            Some(s) if s.kind == Kind::Symlink => {
                return Err(Error::Symlink {
                    path: root.join("oci-layout"),
                })
            }
            Some(_) => {
                return Err(Error::NotAFile {
                    path: root.join("oci-layout"),
                })
            }
        }
        Ok(BlobStore {
            root: root.to_path_buf(),
            top,
            blobs: Some(blobs),
            tmp: Some(tmp),
            cache: Some(cache),
        })
    }

    /// Open an existing layout read-only (no private state is created).
    pub fn open(root: &Path) -> Result<BlobStore, Error> {
        let not_a_layout = |why: String| Error::NotALayout {
            path: root.into(),
            why,
        };
        let top = Dir::open(root).map_err(|e| not_a_layout(format!("{e}")))?;
        let text = top
            .read("oci-layout", 4096, "oci-layout")
            .map_err(|e| not_a_layout(format!("cannot read oci-layout: {e}")))?;
        let v: serde_json::Value = serde_json::from_slice(&text)
            .map_err(|e| not_a_layout(format!("oci-layout is not JSON: {e}")))?;
        if v.get("imageLayoutVersion")
            .and_then(|v| v.as_str())
            .is_none()
        {
            return Err(not_a_layout("oci-layout has no imageLayoutVersion".into()));
        }
        let blobs = top.sub_if_exists("blobs/sha256")?;
        Ok(BlobStore {
            root: root.to_path_buf(),
            top,
            blobs,
            tmp: None,
            cache: None,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The layout's top directory handle.
    pub fn dir(&self) -> &Dir {
        &self.top
    }

    /// The blob's path, for messages and for tools that read the layout themselves.
    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    fn blobs(&self, d: &Digest) -> Result<&Dir, Error> {
        self.blobs.as_ref().ok_or_else(|| Error::MissingBlob {
            layout: self.root.clone(),
            digest: d.clone(),
        })
    }

    fn private(&self, which: &'static str) -> Result<&Dir, Error> {
        let d = if which == "tmp" {
            &self.tmp
        } else {
            &self.cache
        };
        d.as_ref().ok_or_else(|| Error::NotALayout {
            path: self.root.clone(),
            why: format!("opened read-only, cannot write its {which}"),
        })
    }

    /// Take the layout's exclusive lock (waits for another build to finish), then remove temp
    /// files that a killed build left behind (links are removed as links, never followed).
    pub fn lock(&self) -> Result<Lock, Error> {
        let private = self.top.sub(PRIVATE, true)?;
        let file = private.open_lock("lock")?;
        let name = "lock";
        let path = private.path().join(name);
        fs4::FileExt::lock(&file).map_err(Error::io("lock", &path))?;
        self.private("tmp")?.clear()?;
        Ok(Lock { _file: file })
    }

    /// True when the blob is present as a regular file with the expected size (no re-hash:
    /// that is the no-op path; blobs only ever appear complete, by rename).
    pub fn has(&self, d: &Digest, size: u64) -> bool {
        let Some(b) = &self.blobs else { return false };
        matches!(b.stat(d.hex()), Ok(Some(s)) if s.kind == Kind::File && s.size == size)
    }

    /// A new temp file for a blob, created exclusively.
    pub fn temp(&self) -> Result<TempBlob, Error> {
        let dir = self.private("tmp")?.clone();
        let (name, file) = dir.create_temp("")?;
        Ok(TempBlob {
            path: dir.path().join(&name),
            dir,
            name,
            file: Some(file),
            done: false,
        })
    }

    /// fsync the temp file, rename it to its digest, fsync the directory.
    pub fn commit(&self, mut t: TempBlob, d: &Digest) -> Result<PathBuf, Error> {
        if let Some(f) = t.file.take() {
            f.sync_all().map_err(Error::io("fsync", &t.path))?;
        }
        let blobs = self.blobs(d)?;
        t.dir.rename(&t.name, blobs, d.hex())?;
        t.done = true;
        blobs.sync();
        Ok(self.blob_path(d))
    }

    /// Make the fsynced file `name` of `dir` (on the same filesystem) the blob `d`.
    pub(crate) fn adopt(&self, dir: &Dir, name: &str, d: &Digest) -> Result<(), Error> {
        let blobs = self.blobs(d)?;
        dir.rename(name, blobs, d.hex())?;
        blobs.sync();
        Ok(())
    }

    /// Store a small blob (JSON) and return its digest.
    pub fn put(&self, bytes: &[u8]) -> Result<Digest, Error> {
        let d = Digest::of(bytes);
        if self.has(&d, bytes.len() as u64) {
            return Ok(d);
        }
        let mut t = self.temp()?;
        let p = t.path.clone();
        t.file().write_all(bytes).map_err(Error::io("write", &p))?;
        self.commit(t, &d)?;
        Ok(d)
    }

    /// Open a blob for reading: a regular file (never through a link) whose size is `size`.
    /// The size is checked before any byte is read, so a descriptor cannot make a read
    /// unbounded.
    pub(crate) fn open_blob(&self, d: &Digest, size: u64) -> Result<File, Error> {
        let (f, st) = self.open_any(d)?;
        if st.size != size {
            return Err(Error::WrongSize {
                layout: self.root.clone(),
                digest: d.clone(),
                expected: size,
                actual: st.size,
            });
        }
        Ok(f)
    }

    fn open_any(&self, d: &Digest) -> Result<(File, super::dir::EntryStat), Error> {
        self.blobs(d)?.open_file(d.hex()).map_err(|e| match e {
            Error::Io { source, .. } if source.kind() == io::ErrorKind::NotFound => {
                Error::MissingBlob {
                    layout: self.root.clone(),
                    digest: d.clone(),
                }
            }
            e => e,
        })
    }

    /// Read a small blob (a JSON document, at most [`MAX_DOCUMENT`] bytes) whole, verifying
    /// its digest.
    pub fn read(&self, d: &Digest) -> Result<Vec<u8>, Error> {
        let (f, st) = self.open_any(d)?;
        if st.size > MAX_DOCUMENT {
            return Err(Error::TooBig {
                path: self.blob_path(d),
                what: "a manifest, index or config".into(),
                size: st.size,
                limit: MAX_DOCUMENT,
            });
        }
        let mut bytes = Vec::with_capacity(st.size as usize);
        f.take(MAX_DOCUMENT + 1)
            .read_to_end(&mut bytes)
            .map_err(Error::io("read", self.blob_path(d)))?;
        let actual = Digest::of(&bytes);
        if &actual != d {
            return Err(Error::Corrupt {
                layout: self.root.clone(),
                digest: d.clone(),
                actual,
            });
        }
        Ok(bytes)
    }

    /// Read a JSON document blob whole, checking it against its descriptor: a regular file of
    /// exactly `size` bytes (at most [`MAX_DOCUMENT`]) whose sha256 is `d`.
    pub(crate) fn read_exact(&self, d: &Digest, size: u64) -> Result<Vec<u8>, Error> {
        if size > MAX_DOCUMENT {
            return Err(Error::TooBig {
                path: self.blob_path(d),
                what: "a manifest, index or config".into(),
                size,
                limit: MAX_DOCUMENT,
            });
        }
        self.open_blob(d, size)?;
        self.read(d)
    }

    /// Stream a blob into `w`, verifying digest and size as it goes (never more than `size`
    /// bytes are read).
    pub(crate) fn copy_verified(
        &self,
        d: &Digest,
        size: u64,
        w: &mut dyn Write,
    ) -> Result<(), Error> {
        let p = self.blob_path(d);
        let f = self.open_blob(d, size)?;
        let mut r = BufReader::with_capacity(1 << 20, f.take(size));
        let mut h = Hasher::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let k = r.read(&mut buf).map_err(Error::io("read", &p))?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            w.write_all(&buf[..k])
                .map_err(Error::io("write blob", &p))?;
        }
        let (actual, n) = h.finish();
        if n != size {
            return Err(Error::WrongSize {
                layout: self.root.clone(),
                digest: d.clone(),
                expected: size,
                actual: n,
            });
        }
        if &actual != d {
            return Err(Error::Corrupt {
                layout: self.root.clone(),
                digest: d.clone(),
                actual,
            });
        }
        Ok(())
    }

    /// Hash a blob on disk and say whether it matches its name.
    pub fn verify(&self, d: &Digest, size: u64) -> Result<(), Error> {
        self.copy_verified(d, size, &mut io::sink())
    }

    /// Add the blob `d` of `src` to this store, verified (regular file, size, digest). With
    /// `link`, it is hard-linked when both are on one filesystem (the linked entry is checked to
    /// be the very file that was verified; the two layouts then share the file), else copied.
    pub fn import(&self, src: &BlobStore, d: &Digest, size: u64, link: bool) -> Result<(), Error> {
        if self.has(d, size) {
            return Ok(());
        }
        let (from, to) = (src.blobs(d)?, self.blobs(d)?);
        if link {
            src.verify(d, size)?;
        }
        let before = from.stat(d.hex())?;
        if link && from.link(d.hex(), to, d.hex()).is_ok() {
            let after = to.stat(d.hex())?;
            let same = match (before, after) {
                (Some(b), Some(a)) => {
                    a.kind == Kind::File && (b.ino, b.dev) == (a.ino, a.dev) && a.size == size
                }
                _ => false,
            };
            if same {
                to.sync();
                return Ok(());
            }
            let _ = to.remove(d.hex());
        }
        let mut t = self.temp()?;
        src.copy_verified(d, size, t.file())?;
        self.commit(t, d)?;
        Ok(())
    }

    /// Check that the uncompressed content of layer `d` (media type `media_type`) hashes to
    /// `diff_id`, as the image config claims. The answer is remembered in the build cache, so
    /// a base layer is decompressed once per layout, not once per build. `origin` is the layout
    /// the layer and its config came from (a base imported into this store): a wrong diff_id or
    /// a layer that does not decode names it, not this store.
    pub(crate) fn verify_diff_id(
        &self,
        d: &Digest,
        size: u64,
        media_type: &str,
        diff_id: &Digest,
        origin: &Path,
    ) -> Result<(), Error> {
        let mut key = Hasher::new();
        key.update(b"diff_id\0");
        key.update(d.as_str().as_bytes());
        key.update(b"\0");
        key.update(diff_id.as_str().as_bytes());
        let key = format!("diff-id-{}", key.digest().hex());
        if let Some(c) = &self.cache {
            if matches!(c.stat(&key), Ok(Some(s)) if s.kind == Kind::File) {
                return Ok(());
            }
        }
        // The blob itself was verified when it was imported into this store.
        let mut r =
            super::unpack::open_unverified(self, d, size, media_type).map_err(|e| match e {
                Error::UnsupportedLayer {
                    digest, media_type, ..
                } => Error::UnsupportedLayer {
                    layout: origin.into(),
                    digest,
                    media_type,
                },
                e => e,
            })?;
        let errors = r.errors().in_layout(origin);
        let (actual, _) = Digest::of_reader(&mut r).map_err(|e| errors.error("decompress", e))?;
        if &actual != diff_id {
            return Err(Error::WrongDiffId {
                layout: origin.into(),
                digest: d.clone(),
                diff_id: diff_id.clone(),
                actual,
            });
        }
        if let (Some(c), Some(t)) = (&self.cache, &self.tmp) {
            // Best effort: without the mark the next build only decompresses again.
            let _ = c.write_atomic(&key, b"", Some(t));
        }
        Ok(())
    }

    /// Look up a build-cache record; a record whose blob has gone is a miss.
    pub(crate) fn cache_get(&self, key: &Digest) -> Option<LayerRecord> {
        let bytes = self
            .cache
            .as_ref()?
            .read(key.hex(), 64 << 10, "cache record")
            .ok()?;
        let r: LayerRecord = serde_json::from_slice(&bytes).ok()?;
        self.has(&r.digest, r.size).then_some(r)
    }

    pub(crate) fn cache_put(&self, key: &Digest, r: &LayerRecord) -> Result<(), Error> {
        let bytes = cjson::to_vec(r).map_err(|source| Error::Json {
            what: "cache record".into(),
            source,
        })?;
        self.private("cache")?
            .write_atomic(key.hex(), &bytes, Some(self.private("tmp")?))
    }

    /// Write a top-level layout file (`index.json`) atomically.
    pub(crate) fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), Error> {
        self.top.write_atomic(name, bytes, self.tmp.as_ref())
    }

    /// Read a top-level layout file (`index.json`): a regular file of at most
    /// [`MAX_DOCUMENT`] bytes.
    pub(crate) fn read_file(&self, name: &str) -> Result<Vec<u8>, Error> {
        self.top.read(name, MAX_DOCUMENT, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_read_verify_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let s = BlobStore::create(dir.path()).unwrap();
        let d = s.put(b"{}").unwrap();
        assert_eq!(
            d.hex(),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(s.read(&d).unwrap(), b"{}");
        assert!(s.has(&d, 2));
        std::fs::write(s.blob_path(&d), b"[]").unwrap();
        assert!(matches!(s.read(&d), Err(Error::Corrupt { .. })));
        assert!(matches!(s.verify(&d, 2), Err(Error::Corrupt { .. })));
        let missing = Digest::of(b"nope");
        assert!(matches!(s.read(&missing), Err(Error::MissingBlob { .. })));
        assert_eq!(
            std::fs::read_dir(dir.path().join(".infer-build/tmp"))
                .unwrap()
                .count(),
            0
        );
    }
}
