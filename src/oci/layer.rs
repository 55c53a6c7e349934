//! The layer writer: one streaming pass from entries to a stored blob, and the build cache
//! that skips the pass when the inputs have not changed.
//!
//! ```text
//! entries ─▶ canonical tar, cut into fixed 1 MiB chunks ─┬─▶ thread A: sha256 → diff_id
//!                                                        └─▶ thread B: compressor → sha256 → digest
//!                                                                      → temp file → fsync → rename
//! ```
//! Chunks are shared (`Arc`), channels are bounded (4 chunks each), so memory stays flat
//! whatever the layer size. The compressor always sees the same sequence of 1 MiB writes, so
//! its output depends only on the tar bytes, never on read sizes or core count. For
//! uncompressed layers the digest is the diff_id and thread A is not needed.
//!
//! Cache ([`build_layer`]): first a *stat key* (layer recipe, compression, mtime, and for each
//! entry its path, mode and the source's path, size, mtime, ctime, inode, device, or the
//! sha256 of inline bytes): a hit costs a few `stat` calls. On a miss where the same paths and
//! sizes were seen before (a touched file), the tar is hashed without compressing and the
//! *diff key* (diff_id + compression) is looked up, so an unchanged layer is never compressed
//! twice. Otherwise the layer is written.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::Path;
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use serde_json::json;

use super::compress::Encoder;
use super::digest::{HashWriter, Hasher};
use super::store::{BlobStore, LayerRecord};
use super::tar::{self, Entry, Source};
use super::{cjson, Compression, Digest, Error, LAYER_RECIPE};

/// Size of the chunks the tar stream is cut into.
pub(crate) const CHUNK: usize = 1 << 20;

/// How to write a layer.
#[derive(Debug, Clone, Copy)]
pub struct LayerOptions {
    pub compression: Compression,
    /// Every entry's mtime (seconds since the epoch).
    pub mtime: u64,
    /// zstd worker threads; changes speed only, never bytes.
    pub zstd_workers: u32,
}

/// Whether the cache answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheHit {
    /// Nothing was read: the inputs' metadata matched.
    Stat,
    /// The inputs were re-read and hashed, but nothing was compressed.
    Content,
    /// The layer was written.
    Miss,
}

/// Write a layer (or find it in the cache).
pub(crate) fn build_layer(
    store: &BlobStore,
    entries: Vec<Entry>,
    opts: &LayerOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<(LayerRecord, CacheHit), Error> {
    let entries = tar::canonicalize(entries)?;
    let stat_key = fingerprint(&entries, opts, true)?;
    if let Some(r) = store.cache_get(&stat_key) {
        return Ok((r, CacheHit::Stat));
    }
    let hint_key = fingerprint(&entries, opts, false)?;
    if store.cache_get(&hint_key).is_some() {
        let (diff_id, _) = hash_tar(&entries, opts.mtime, progress)?;
        let diff_key = diff_key(&diff_id, opts.compression);
        if let Some(r) = store.cache_get(&diff_key) {
            store.cache_put(&stat_key, &r)?;
            return Ok((r, CacheHit::Content));
        }
    }
    let r = write_layer(store, &entries, opts, progress)?;
    store.cache_put(&diff_key(&r.diff_id, opts.compression), &r)?;
    store.cache_put(&hint_key, &r)?;
    store.cache_put(&stat_key, &r)?;
    Ok((r, CacheHit::Miss))
}

fn diff_key(diff_id: &Digest, c: Compression) -> Digest {
    let v = json!({"recipe": LAYER_RECIPE, "compression": c.id(), "diff_id": diff_id.as_str()});
    Digest::of(&cjson::value_to_vec(&v))
}

/// The cache key of a layer's inputs. With `stat`, file sources are identified by their full
/// metadata (the no-op check); without, by path and size only (the "seen before" hint).
fn fingerprint(entries: &[Entry], opts: &LayerOptions, stat: bool) -> Result<Digest, Error> {
    let mut list = Vec::with_capacity(entries.len());
    for e in entries {
        let src = match &e.source {
            Source::Dir => json!("dir"),
            Source::Bytes(b) => json!({"bytes": Digest::of(b).as_str()}),
            Source::File { path, size } => {
                let abs = std::path::absolute(path).map_err(Error::io("resolve", path))?;
                let mut f = json!({"path": abs.to_string_lossy(), "size": size});
                if stat {
                    f["stat"] = stat_of(path)?;
                }
                json!({ "file": f })
            }
        };
        list.push(json!({"path": e.path, "mode": e.mode, "source": src}));
    }
    let v = json!({
        "recipe": LAYER_RECIPE,
        "compression": opts.compression.id(),
        "mtime": opts.mtime,
        "stat": stat,
        "entries": list,
    });
    Ok(Digest::of(&cjson::value_to_vec(&v)))
}

/// What identifies a file's contents without reading it (size, mtime and ctime, inode,
/// device): the stat part of the layer cache's key, also the SBOM's file-digest cache key.
#[cfg(unix)]
pub(crate) fn stat_of(path: &Path) -> Result<serde_json::Value, Error> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).map_err(Error::io("stat", path))?;
    Ok(json!([
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec(),
        m.ino(),
        m.dev()
    ]))
}

#[cfg(not(unix))]
pub(crate) fn stat_of(path: &Path) -> Result<serde_json::Value, Error> {
    let m = std::fs::metadata(path).map_err(Error::io("stat", path))?;
    let t = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok());
    Ok(json!([m.len(), t.map(|t| t.as_nanos().to_string())]))
}

/// Hash the canonical tar of `entries` without storing anything: (diff_id, tar size).
pub(crate) fn hash_tar(
    entries: &[Entry],
    mtime: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(Digest, u64), Error> {
    let mut h = Hasher::new();
    produce(entries, mtime, progress, &mut |c: Arc<Vec<u8>>| {
        h.update(&c[..]);
        Ok(())
    })?;
    Ok(h.finish())
}

/// Write a layer blob in one pass (no cache lookup). `entries` must be canonical.
pub fn write_layer(
    store: &BlobStore,
    entries: &[Entry],
    opts: &LayerOptions,
    progress: &mut dyn FnMut(u64),
) -> Result<LayerRecord, Error> {
    let mut temp = store.temp()?;
    let temp_path = temp.path().to_path_buf();
    let file = temp.take_file();
    let compression = opts.compression;
    let need_diff = compression != Compression::None;
    let (tx_c, rx_c) = sync_channel::<Arc<Vec<u8>>>(4);
    let (tx_h, rx_h) = sync_channel::<Arc<Vec<u8>>>(4);
    let (tx_h, rx_h) = if need_diff {
        (Some(tx_h), Some(rx_h))
    } else {
        (None, None)
    };

    let (produced, compressed, hashed) = std::thread::scope(|s| {
        let tp = &temp_path;
        let workers = opts.zstd_workers;
        let comp = s.spawn(move || compress_thread(rx_c, file, compression, workers, tp));
        let hasher = rx_h.map(|rx| s.spawn(move || hash_thread(rx)));
        let mut tx_c = Some(tx_c);
        let mut tx_h = tx_h;
        let produced = produce(entries, opts.mtime, progress, &mut |c: Arc<Vec<u8>>| {
            if let Some(tx) = &tx_h {
                tx.send(c.clone())
                    .map_err(|_| Error::Pipeline("hashing thread stopped".into()))?;
            }
            match &tx_c {
                Some(tx) => tx
                    .send(c)
                    .map_err(|_| Error::Pipeline("compressing thread stopped".into())),
                None => Ok(()),
            }
        });
        tx_c.take();
        tx_h.take();
        let compressed = comp
            .join()
            .unwrap_or_else(|_| Err(Error::Pipeline("compressing thread panicked".into())));
        let hashed = hasher.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::Pipeline("hashing thread panicked".into())))
        });
        (produced, compressed, hashed)
    });
    // A failing thread makes the producer fail with "stopped": report the thread's own error.
    let (digest, size, file) = compressed?;
    let tar_size = produced?;
    let diff_id = match hashed {
        Some(h) => {
            let (d, n) = h?;
            if n != tar_size {
                return Err(Error::Pipeline(format!(
                    "hashed {n} of {tar_size} tar bytes"
                )));
            }
            d
        }
        None => digest.clone(),
    };
    temp.put_file(file);
    store.commit(temp, &digest)?;
    Ok(LayerRecord {
        digest,
        diff_id,
        size,
        media_type: compression.media_type().into(),
        tar_size,
    })
}

fn compress_thread(
    rx: Receiver<Arc<Vec<u8>>>,
    file: File,
    c: Compression,
    workers: u32,
    path: &Path,
) -> Result<(Digest, u64, File), Error> {
    let sink = HashWriter::new(BufWriter::with_capacity(1 << 20, file));
    let mut enc =
        Encoder::new(c, sink, workers).map_err(Error::io("start compressor for", path))?;
    for chunk in rx {
        enc.write_all(&chunk).map_err(Error::io("write", path))?;
    }
    let mut sink = enc.finish().map_err(Error::io("finish", path))?;
    sink.flush().map_err(Error::io("write", path))?;
    let (buffered, digest, n) = sink.into_parts();
    let file = buffered.into_inner().map_err(|e| Error::Io {
        op: "write",
        path: path.into(),
        source: e.into_error(),
    })?;
    Ok((digest, n, file))
}

fn hash_thread(rx: Receiver<Arc<Vec<u8>>>) -> Result<(Digest, u64), Error> {
    let mut h = Hasher::new();
    for chunk in rx {
        h.update(&chunk[..]);
    }
    Ok(h.finish())
}

/// Cuts the tar stream into fixed-size chunks and hands each full one to `emit`.
struct Chunker<'a> {
    buf: Vec<u8>,
    emit: &'a mut dyn FnMut(Arc<Vec<u8>>) -> Result<(), Error>,
    total: u64,
}

impl Chunker<'_> {
    fn push(&mut self, mut data: &[u8]) -> Result<(), Error> {
        while !data.is_empty() {
            let take = (CHUNK - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            self.flush_full()?;
        }
        Ok(())
    }

    fn flush_full(&mut self) -> Result<(), Error> {
        if self.buf.len() == CHUNK {
            self.send()?;
        }
        Ok(())
    }

    fn send(&mut self) -> Result<(), Error> {
        let full = std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK));
        self.total += full.len() as u64;
        (self.emit)(Arc::new(full))
    }

    /// Read exactly `size` bytes from `r` straight into chunks.
    fn read_from(
        &mut self,
        r: &mut dyn Read,
        size: u64,
        path: &Path,
        progress: &mut dyn FnMut(u64),
    ) -> Result<(), Error> {
        let mut left = size;
        while left > 0 {
            let start = self.buf.len();
            let want = ((CHUNK - start) as u64).min(left) as usize;
            self.buf.resize(start + want, 0);
            let k = match r.read(&mut self.buf[start..]) {
                Ok(k) => k,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => 0,
                Err(e) => {
                    return Err(Error::Io {
                        op: "read",
                        path: path.into(),
                        source: e,
                    })
                }
            };
            self.buf.truncate(start + k);
            if k == 0 && want > 0 {
                return Err(Error::ChangedWhileRead {
                    path: path.into(),
                    what: format!("it ended after {} of {size} bytes", size - left),
                });
            }
            left -= k as u64;
            progress(k as u64);
            self.flush_full()?;
        }
        Ok(())
    }
}

/// Generate the canonical tar of `entries` (already canonical) in chunks; returns its size.
fn produce(
    entries: &[Entry],
    mtime: u64,
    progress: &mut dyn FnMut(u64),
    emit: &mut dyn FnMut(Arc<Vec<u8>>) -> Result<(), Error>,
) -> Result<u64, Error> {
    let mut ch = Chunker {
        buf: Vec::with_capacity(CHUNK),
        emit,
        total: 0,
    };
    let zeros = [0u8; tar::BLOCK];
    for e in entries {
        ch.push(&tar::header(e, mtime)?)?;
        match &e.source {
            Source::Dir => {}
            Source::Bytes(b) => {
                ch.push(b)?;
                progress(b.len() as u64);
            }
            Source::File { path, size } => read_file(&mut ch, path, *size, progress)?,
        }
        ch.push(&zeros[..tar::padding(e.size())])?;
    }
    ch.push(&zeros)?;
    ch.push(&zeros)?;
    if !ch.buf.is_empty() {
        ch.send()?;
    }
    Ok(ch.total)
}

fn read_file(
    ch: &mut Chunker,
    path: &Path,
    size: u64,
    progress: &mut dyn FnMut(u64),
) -> Result<(), Error> {
    let mut f = File::open(path).map_err(Error::io("open", path))?;
    let before = f.metadata().map_err(Error::io("stat", path))?;
    if !before.is_file() {
        return Err(Error::NotAFile { path: path.into() });
    }
    if before.len() != size {
        return Err(Error::ChangedWhileRead {
            path: path.into(),
            what: format!(
                "its size went from {size} to {} bytes before it was read",
                before.len()
            ),
        });
    }
    ch.read_from(&mut f, size, path, progress)?;
    let mut extra = [0u8; 1];
    if f.read(&mut extra).map_err(Error::io("read", path))? != 0 {
        return Err(Error::ChangedWhileRead {
            path: path.into(),
            what: "it grew while it was read".into(),
        });
    }
    let after = f.metadata().map_err(Error::io("stat", path))?;
    if after.len() != before.len() || after.modified().ok() != before.modified().ok() {
        return Err(Error::ChangedWhileRead {
            path: path.into(),
            what: "its size or mtime changed while it was read".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;

    /// Fixed small inputs covering dirs, inline bytes, a file on disk, an executable, a name
    /// that needs the ustar prefix and one that needs PAX.
    fn golden_entries(dir: &Path) -> Vec<Entry> {
        let f = dir.join("weights.bin");
        let data: Vec<u8> = (0..200_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8)
            .collect();
        std::fs::write(&f, &data).unwrap();
        vec![
            Entry::bytes(
                "etc/infer/runtime.toml",
                0o644,
                b"[model]\nname = \"mlp\"\n".to_vec(),
            ),
            Entry::file("opt/infer/model/weights.bin", 0o644, f, data.len() as u64),
            Entry::bytes("usr/local/bin/infer-serve", 0o755, b"\x7fELF fake".to_vec()),
            Entry::bytes(
                &format!("{}/{}", "p".repeat(120), "n".repeat(90)),
                0o644,
                b"prefix".to_vec(),
            ),
            Entry::bytes(&format!("long/{}", "x".repeat(300)), 0o644, b"pax".to_vec()),
            Entry::dir("tmp", 0o1777),
        ]
    }

    fn write(c: Compression, mtime: u64, workers: u32) -> (tempfile::TempDir, LayerRecord) {
        let d = tempfile::tempdir().unwrap();
        let store = BlobStore::create(&d.path().join("layout")).unwrap();
        let entries = tar::canonicalize(golden_entries(d.path())).unwrap();
        let opts = LayerOptions {
            compression: c,
            mtime,
            zstd_workers: workers,
        };
        let r = write_layer(&store, &entries, &opts, &mut |_| {}).unwrap();
        (d, r)
    }

    /// Golden digests of the layer recipe. If one changes, the bytes of every image change:
    /// bump `LAYER_RECIPE` and update these together, on purpose.
    #[test]
    fn golden_digests_of_the_layer_recipe() {
        let diff_id = "sha256:7ed81ef76c305d7167ab06b927f50c280551a63ee10f4bcac5a8329d43ae63d4";
        let cases = [
            (
                Compression::Gzip,
                "sha256:6e8051931d1e686f40956588eaad575571fcb9b13790e71d6aab353cef4f5602",
            ),
            (
                Compression::GzipStored,
                "sha256:44b0a6c36f689222eebe700690cdf74dbf0938e1dffa42863dac5f47deda5b62",
            ),
            (
                Compression::Zstd,
                "sha256:d7dde56879d41a29954269664c7d21b0c8d2deb45c47b46f84003c5fce1eeda7",
            ),
            (Compression::None, diff_id),
        ];
        assert_eq!(LAYER_RECIPE, "infer-build.layer.v2");
        let mut got = Vec::new();
        for (c, _) in cases {
            let (_d, r) = write(c, 1_700_000_000, 2);
            assert_eq!(r.media_type, c.media_type());
            got.push((c, r.digest.to_string(), r.diff_id.to_string()));
        }
        let want: Vec<_> = cases
            .iter()
            .map(|(c, d)| (*c, d.to_string(), diff_id.to_string()))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn tar_is_readable_and_canonical() {
        let (d, r) = write(Compression::Gzip, 1_700_000_000, 1);
        let blob = d.path().join("layout/blobs/sha256").join(r.digest.hex());
        let bytes = std::fs::read(&blob).unwrap();
        assert_eq!(Digest::of(&bytes), r.digest);
        assert_eq!(bytes.len() as u64, r.size);
        let mut tarbytes = Vec::new();
        flate2::read::GzDecoder::new(&bytes[..])
            .read_to_end(&mut tarbytes)
            .unwrap();
        assert_eq!(Digest::of(&tarbytes), r.diff_id);
        assert_eq!(tarbytes.len() as u64, r.tar_size);
        let mut a = ::tar::Archive::new(&tarbytes[..]);
        let mut names = Vec::new();
        for e in a.entries().unwrap() {
            let e = e.unwrap();
            let h = e.header();
            assert_eq!(h.mtime().unwrap(), 1_700_000_000);
            assert_eq!((h.uid().unwrap(), h.gid().unwrap()), (0, 0));
            names.push((
                e.path().unwrap().to_string_lossy().into_owned(),
                h.mode().unwrap(),
            ));
        }
        let sorted = {
            let mut s = names.clone();
            s.sort_by(|a, b| {
                a.0.trim_end_matches('/')
                    .as_bytes()
                    .cmp(b.0.trim_end_matches('/').as_bytes())
            });
            s
        };
        assert_eq!(names, sorted);
        assert!(names.contains(&("usr/local/bin/infer-serve".into(), 0o755)));
        assert!(names.contains(&("tmp/".into(), 0o1777)));
        assert!(
            names.contains(&("usr/".into(), 0o755)),
            "parents are added: {names:?}"
        );
        assert!(
            names.iter().any(|(n, _)| n.len() > 300),
            "the PAX path is read back"
        );
        assert_eq!(
            std::fs::read_dir(d.path().join("layout/.infer-build/tmp"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn mtime_is_part_of_the_digest_and_workers_are_not() {
        let (_a, r1) = write(Compression::Zstd, 0, 1);
        let (_b, r2) = write(Compression::Zstd, 0, 4);
        let (_c, r3) = write(Compression::Zstd, 1, 1);
        assert_eq!(r1, r2);
        assert_ne!(r1.diff_id, r3.diff_id);
    }

    #[test]
    fn cache_skips_unchanged_and_touched_inputs() {
        let d = tempfile::tempdir().unwrap();
        let store = BlobStore::create(&d.path().join("layout")).unwrap();
        let opts = LayerOptions {
            compression: Compression::Gzip,
            mtime: 0,
            zstd_workers: 1,
        };
        let entries = golden_entries(d.path());
        let (r1, h1) = build_layer(&store, entries.clone(), &opts, &mut |_| {}).unwrap();
        let (r2, h2) = build_layer(&store, entries.clone(), &opts, &mut |_| {}).unwrap();
        assert_eq!((h1, h2), (CacheHit::Miss, CacheHit::Stat));
        assert_eq!(r1, r2);
        // Rewriting the same bytes changes mtime/ctime: re-hashed, not recompressed.
        let f = d.path().join("weights.bin");
        let data = std::fs::read(&f).unwrap();
        std::fs::write(&f, &data).unwrap();
        let (r3, h3) = build_layer(&store, entries.clone(), &opts, &mut |_| {}).unwrap();
        assert_eq!((h3, &r3), (CacheHit::Content, &r1));
        // Different content of the same size: written again.
        let mut changed = data.clone();
        changed[0] ^= 1;
        std::fs::write(&f, &changed).unwrap();
        let (r4, h4) = build_layer(&store, entries, &opts, &mut |_| {}).unwrap();
        assert_eq!(h4, CacheHit::Miss);
        assert_ne!(r4.diff_id, r1.diff_id);
    }

    #[test]
    fn a_file_changing_size_fails_the_build() {
        let d = tempfile::tempdir().unwrap();
        let store = BlobStore::create(&d.path().join("layout")).unwrap();
        let f = d.path().join("m.onnx");
        std::fs::write(&f, b"12345").unwrap();
        let opts = LayerOptions {
            compression: Compression::Gzip,
            mtime: 0,
            zstd_workers: 1,
        };
        // The plan recorded 4 bytes; the file now has 5.
        let e = build_layer(
            &store,
            vec![Entry::file("m.onnx", 0o644, f, 4)],
            &opts,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(matches!(e, Error::ChangedWhileRead { .. }), "{e}");
        assert_eq!(
            std::fs::read_dir(d.path().join("layout/blobs/sha256"))
                .unwrap()
                .count(),
            0
        );
        assert_eq!(
            std::fs::read_dir(d.path().join("layout/.infer-build/tmp"))
                .unwrap()
                .count(),
            0
        );
    }
}
