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

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use super::{cjson, Digest, Error};

const PRIVATE: &str = ".infer-build";
const OCI_LAYOUT: &[u8] = br#"{"imageLayoutVersion":"1.0.0"}"#;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An OCI layout used as a blob store.
#[derive(Debug, Clone)]
pub struct BlobStore {
    root: PathBuf,
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
    path: PathBuf,
    file: Option<File>,
}

impl TempBlob {
    pub fn file(&mut self) -> &mut File {
        self.file
            .as_mut()
            .expect("temp blob file is open until commit")
    }
    pub fn take_file(&mut self) -> File {
        self.file
            .take()
            .expect("temp blob file is open until commit")
    }
    pub fn put_file(&mut self, f: File) {
        self.file = Some(f);
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempBlob {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

impl BlobStore {
    /// Open (creating if needed) a layout at `root`.
    pub fn create(root: &Path) -> Result<BlobStore, Error> {
        for d in [
            root.join("blobs/sha256"),
            root.join(PRIVATE).join("tmp"),
            root.join(PRIVATE).join("cache"),
        ] {
            fs::create_dir_all(&d).map_err(Error::io("create directory", &d))?;
        }
        let layout = root.join("oci-layout");
        if !layout.exists() {
            // Not through the private `tmp` directory: this runs before the layout's lock is
            // taken, and taking the lock clears `tmp`, which deleted this temp file under a
            // second build creating the same layout at the same moment.
            write_atomic(&layout, OCI_LAYOUT, &root.join(PRIVATE))?;
        }
        Ok(BlobStore {
            root: root.to_path_buf(),
        })
    }

    /// Open an existing layout read-only (no private state is created).
    pub fn open(root: &Path) -> Result<BlobStore, Error> {
        let layout = root.join("oci-layout");
        let text = fs::read(&layout).map_err(|e| Error::NotALayout {
            path: root.into(),
            why: format!("cannot read oci-layout: {e}"),
        })?;
        let v: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| Error::NotALayout {
                path: root.into(),
                why: format!("oci-layout is not JSON: {e}"),
            })?;
        if v.get("imageLayoutVersion")
            .and_then(|v| v.as_str())
            .is_none()
        {
            return Err(Error::NotALayout {
                path: root.into(),
                why: "oci-layout has no imageLayoutVersion".into(),
            });
        }
        Ok(BlobStore {
            root: root.to_path_buf(),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    /// Take the layout's exclusive lock (waits for another build to finish), then remove temp
    /// files that a killed build left behind.
    pub fn lock(&self) -> Result<Lock, Error> {
        let path = self.root.join(PRIVATE).join("lock");
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(Error::io("open lock file", &path))?;
        fs4::FileExt::lock(&file).map_err(Error::io("lock", &path))?;
        let tmp = self.root.join(PRIVATE).join("tmp");
        if let Ok(rd) = fs::read_dir(&tmp) {
            for e in rd.flatten() {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(Lock { _file: file })
    }

    /// True when the blob is present with the expected size (no re-hash: that is the no-op
    /// path; blobs only ever appear complete, by rename).
    pub fn has(&self, d: &Digest, size: u64) -> bool {
        fs::metadata(self.blob_path(d))
            .map(|m| m.is_file() && m.len() == size)
            .unwrap_or(false)
    }

    /// A new temp file for a blob.
    pub fn temp(&self) -> Result<TempBlob, Error> {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = self
            .root
            .join(PRIVATE)
            .join("tmp")
            .join(format!("{}-{n}", std::process::id()));
        let file = OpenOptions::new()
            .create_new(true)
            .write(true)
            .open(&path)
            .map_err(Error::io("create temp file", &path))?;
        Ok(TempBlob {
            path,
            file: Some(file),
        })
    }

    /// fsync the temp file, rename it to its digest, fsync the directory.
    pub fn commit(&self, mut t: TempBlob, d: &Digest) -> Result<PathBuf, Error> {
        if let Some(f) = t.file.take() {
            f.sync_all().map_err(Error::io("fsync", &t.path))?;
        }
        let dest = self.blob_path(d);
        fs::rename(&t.path, &dest).map_err(Error::io("rename blob into", &dest))?;
        t.path = PathBuf::new();
        sync_dir(&self.root.join("blobs/sha256"));
        Ok(dest)
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

    /// Read a small blob whole, verifying its digest.
    pub fn read(&self, d: &Digest) -> Result<Vec<u8>, Error> {
        let p = self.blob_path(d);
        let bytes = fs::read(&p).map_err(|e| self.missing_or(d, &p, e))?;
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

    /// Stream a blob into `w`, verifying digest and size as it goes.
    pub fn copy_verified(&self, d: &Digest, size: u64, w: &mut dyn Write) -> Result<(), Error> {
        let p = self.blob_path(d);
        let f = File::open(&p).map_err(|e| self.missing_or(d, &p, e))?;
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut h = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        loop {
            let k = r.read(&mut buf).map_err(Error::io("read", &p))?;
            if k == 0 {
                break;
            }
            h.update(&buf[..k]);
            n += k as u64;
            w.write_all(&buf[..k])
                .map_err(Error::io("write blob", &p))?;
        }
        let actual = Digest::from_hasher(h);
        if &actual != d || n != size {
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

    fn missing_or(&self, d: &Digest, p: &Path, e: io::Error) -> Error {
        if e.kind() == io::ErrorKind::NotFound {
            Error::MissingBlob {
                layout: self.root.clone(),
                digest: d.clone(),
            }
        } else {
            Error::Io {
                op: "read",
                path: p.into(),
                source: e,
            }
        }
    }

    /// Look up a build-cache record; a record whose blob has gone is a miss.
    pub fn cache_get(&self, key: &Digest) -> Option<LayerRecord> {
        let p = self.root.join(PRIVATE).join("cache").join(key.hex());
        let bytes = fs::read(p).ok()?;
        let r: LayerRecord = serde_json::from_slice(&bytes).ok()?;
        self.has(&r.digest, r.size).then_some(r)
    }

    pub fn cache_put(&self, key: &Digest, r: &LayerRecord) -> Result<(), Error> {
        let bytes = cjson::to_vec(r).map_err(|source| Error::Json {
            what: "cache record".into(),
            source,
        })?;
        let p = self.root.join(PRIVATE).join("cache").join(key.hex());
        write_atomic(&p, &bytes, &self.root.join(PRIVATE).join("tmp"))
    }

    /// Write a top-level layout file (`index.json`) atomically.
    pub fn write_file(&self, name: &str, bytes: &[u8]) -> Result<(), Error> {
        write_atomic(
            &self.root.join(name),
            bytes,
            &self.root.join(PRIVATE).join("tmp"),
        )
    }
}

/// Write `bytes` to `dest` through a temp file in `tmp_dir` + fsync + rename.
pub fn write_atomic(dest: &Path, bytes: &[u8], tmp_dir: &Path) -> Result<(), Error> {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let tmp = tmp_dir.join(format!("{}-{n}", std::process::id()));
    let mut f = File::create(&tmp).map_err(Error::io("create", &tmp))?;
    let res = f
        .write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(Error::io("write", &tmp))
        .and_then(|_| fs::rename(&tmp, dest).map_err(Error::io("rename into", dest)));
    if res.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    if let Some(parent) = dest.parent() {
        sync_dir(parent);
    }
    res
}

fn sync_dir(dir: &Path) {
    // Best effort: makes the rename durable on Linux; not supported everywhere.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
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
        fs::write(s.blob_path(&d), b"[]").unwrap();
        assert!(matches!(s.read(&d), Err(Error::Corrupt { .. })));
        assert!(matches!(s.verify(&d, 2), Err(Error::Corrupt { .. })));
        let missing = Digest::of(b"nope");
        assert!(matches!(s.read(&missing), Err(Error::MissingBlob { .. })));
        assert_eq!(
            fs::read_dir(dir.path().join(".infer-build/tmp"))
                .unwrap()
                .count(),
            0
        );
    }
}
