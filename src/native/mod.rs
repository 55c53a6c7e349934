//! Native runtime libraries from pinned wheels: the shared library an engine loads at run time
//! (ONNX Runtime's `libonnxruntime.so`, later TensorRT's lean runtime) taken from a wheel on the
//! Python package registry, pinned in the matrix (`matrix/runtime-libraries.toml`: file URL and
//! sha256) and in the recipe's lock file.
//!
//! [`ensure`] gives the library's files on disk: from the cache when they are there (no
//! connection is made, so a pinned library builds offline), else the wheel is downloaded
//! ([`fetch`]: TLS only, no redirect followed, no credentials sent, size and sha256 checked
//! while streaming), and only the named members are extracted. The cache (`…/infer-build/
//! libraries`, beside the base and engine caches) is content-addressed:
//!
//! ```text
//! wheels/<sha256>.whl       the verified wheel
//! files/<sha256>            each extracted member, named by its own digest
//! index/<wheel sha256>.json member → digest and size, written last
//! dirs/<wheel sha256>/      the members under their own names (hard links of files/), where
//!                           the builder loads the library from
//! tmp/                      downloads and extractions in progress
//! ```
//!
//! Every file is written to `tmp/` and renamed into place only once complete and verified
//! (`oci::Dir`, `oci::write_atomic`), so an interrupted download or extraction leaves nothing
//! under a final name; every cached file is hashed again when used, so a cache changed
//! behind infer-build's back is repaired, never shipped.

pub(crate) mod fetch;
mod wheel;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::matrix::{Platform, RuntimeLibrary};
use crate::oci::Dir;
use crate::plan::lock::{Lock, LockedLibrary};

/// The largest wheel downloaded (the lean TensorRT wheels are a few hundred MB).
pub(crate) const MAX_WHEEL: u64 = 2 << 30;
/// The largest member extracted from a wheel.
pub(crate) const MAX_MEMBER: u64 = 2 << 30;

/// Errors of the `native` module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Oci(#[from] crate::oci::Error),
    #[error("cannot download {url}: {why}")]
    Download { url: String, why: String },
    #[error("{url}: sha256 is {got}, but the pin says {want}")]
    Digest {
        url: String,
        got: String,
        want: String,
    },
    #[error("wheel {wheel}: {why}")]
    Wheel { wheel: String, why: String },
    #[error("the compatibility matrix has no {name} library for {platform}\nhint: add a row to matrix/runtime-libraries.toml and pass --matrix DIR")]
    NoRow { name: String, platform: String },
    #[error("{lock}: pins {name} {locked} for {platform}, but this infer-build ships {matrix}\nhint: rebuild with --update-lock to move the pin")]
    LockMismatch {
        lock: String,
        name: String,
        platform: String,
        locked: String,
        matrix: String,
    },
    #[error("cannot write lock file {path}: {why}")]
    Lock { path: PathBuf, why: String },
}

impl Error {
    /// True when the user can fix this by changing their input (exit code 2).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Oci(e) => e.is_bad_input(),
            Error::NoRow { .. } | Error::LockMismatch { .. } => true,
            Error::Download { .. } | Error::Digest { .. } | Error::Wheel { .. } => false,
            Error::Lock { .. } => false,
        }
    }
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// A library ready to ship: its files in the cache and where each goes in the image.
#[derive(Debug, Clone)]
pub(crate) struct Library {
    /// (cached file, absolute path inside the image), in the row's order.
    pub files: Vec<(PathBuf, String)>,
    /// The member the engine loads, in `dirs/<wheel sha256>/` beside the row's other members
    /// under their own names (what the builder itself dlopens: a library that opens its
    /// neighbours by name, as OpenVINO does its plugins, finds them there).
    pub load: PathBuf,
    /// True when nothing was downloaded.
    pub offline: bool,
    pub bytes_downloaded: u64,
}

/// The library cache: `$INFER_BUILD_CACHE_DIR/libraries`, else
/// `$XDG_CACHE_HOME/infer-build/libraries`, else `~/.cache/infer-build/libraries`.
pub(crate) fn default_cache_dir() -> Option<PathBuf> {
    crate::cache::path(crate::cache::Entry::Libraries, None)
}

/// The matrix row of library `name` for `platform` (of exactly `version` when given: TensorRT's
/// lean runtime has one row per release), unless the lock file pins another wheel for it and
/// the pin is not being moved (`update_lock`).
pub(crate) fn resolve<'m>(
    matrix: &'m crate::matrix::Matrix,
    name: &str,
    platform: Platform,
    version: Option<&crate::matrix::Version>,
    lock: Option<(&Path, &Lock)>,
    update_lock: bool,
) -> Result<&'m RuntimeLibrary> {
    let row = matrix
        .library(name, platform, version)
        .ok_or_else(|| Error::NoRow {
            name: match version {
                Some(v) => format!("{name} {v}"),
                None => name.into(),
            },
            platform: platform.to_string(),
        })?;
    check_lock(row, version, lock, update_lock)?;
    Ok(row)
}

/// The lock file's pin of `row`'s library (of `version` when one was asked for) must be `row`'s,
/// unless the lock is being updated.
pub(crate) fn check_lock(
    row: &RuntimeLibrary,
    version: Option<&crate::matrix::Version>,
    lock: Option<(&Path, &Lock)>,
    update_lock: bool,
) -> Result<()> {
    if let (Some((path, lock)), false) = (lock, update_lock) {
        let pinned = version.map(|_| row.version.to_string());
        if let Some(l) = lock.library(&row.name, row.platform.as_str(), pinned.as_deref()) {
            if l != &locked(row) {
                return Err(Error::LockMismatch {
                    lock: path.display().to_string(),
                    name: row.name.clone(),
                    platform: row.platform.to_string(),
                    locked: format!("{} ({}, sha256 {})", l.version, l.url, l.sha256),
                    matrix: format!("{} ({}, sha256 {})", row.version, row.url, row.sha256),
                });
            }
        }
    }
    Ok(())
}

/// The lock entry of a row.
pub(crate) fn locked(row: &RuntimeLibrary) -> LockedLibrary {
    LockedLibrary {
        name: row.name.clone(),
        platform: row.platform.as_str().into(),
        version: row.version.to_string(),
        url: row.url.clone(),
        sha256: row.sha256.clone(),
    }
}

/// Record `row`'s pin in the lock file at `path` (atomically, canonical text), keeping every
/// other entry; `only`: it replaces the pins of other versions of its name and platform (see
/// [`Lock::set_library`]). Unchanged pins rewrite identical bytes.
pub(crate) fn record(path: &Path, row: &RuntimeLibrary, only: bool) -> Result<()> {
    let err = |why: String| Error::Lock {
        path: path.into(),
        why,
    };
    crate::plan::lock::update(path, |lock| lock.set_library(locked(row), only))
        .map_err(|e| err(e.to_string()))
}

/// The library of `row` in the cache at `cache`, downloading and extracting it when missing.
pub(crate) fn ensure(row: &RuntimeLibrary, cache: &Path, opts: &fetch::Options) -> Result<Library> {
    let root = Dir::create(cache)?;
    // One process fills the cache at a time; readers of complete entries need no lock.
    let lock_file = root.open_lock(".lock")?;
    fs4::FileExt::lock(&lock_file)
        .map_err(|e| crate::oci::Error::io("lock", cache.join(".lock"))(e))?;
    let tmp = root.sub("tmp", true)?;
    let wheels = root.sub("wheels", true)?;
    let files = root.sub("files", true)?;
    let index = root.sub("index", true)?;
    let index_name = format!("{}.json", row.sha256);

    // 1. Complete index and every member verified: nothing to fetch.
    if let Some(lib) = from_index(row, &index, &index_name, &files)? {
        return named(row, &root, lib);
    }
    // 2. The wheel, verified, from the cache or the network.
    let wheel_name = format!("{}.whl", row.sha256);
    let mut bytes_downloaded = 0;
    let have_wheel = match wheels.stat(&wheel_name)? {
        Some(st) if st.kind == crate::oci::dir::Kind::File => {
            let (f, _) = wheels.open_file(&wheel_name)?;
            hash_reader(f)?.0 == row.sha256
        }
        _ => false,
    };
    if !have_wheel {
        wheels.remove(&wheel_name)?;
        bytes_downloaded = fetch::download(
            &row.url,
            &row.sha256,
            Some(row.size),
            &tmp,
            &wheels,
            &wheel_name,
            opts,
        )?;
    }
    // 3. The members, each into files/<sha256>, then the index.
    let (wf, _) = wheels.open_file(&wheel_name)?;
    let mut entries = BTreeMap::new();
    let mut archive = wheel::open(wf, &row.url)?;
    for member in &row.files {
        let (digest, size) = wheel::extract(&mut archive, member, &row.url, &tmp, &files)?;
        entries.insert(member.clone(), (digest, size));
    }
    let doc = serde_json::json!({
        "wheel": row.url,
        "sha256": row.sha256,
        "members": entries
            .iter()
            .map(|(m, (d, s))| (m.clone(), serde_json::json!({"sha256": d, "size": s})))
            .collect::<serde_json::Map<_, _>>(),
    });
    index.write_atomic(
        &index_name,
        &crate::oci::cjson::value_to_vec(&doc),
        Some(&tmp),
    )?;
    let mut lib = from_index(row, &index, &index_name, &files)?.ok_or_else(|| Error::Wheel {
        wheel: row.url.clone(),
        why: "extracted files are not in the cache after extraction".into(),
    })?;
    lib.offline = bytes_downloaded == 0;
    lib.bytes_downloaded = bytes_downloaded;
    named(row, &root, lib)
}

/// `lib` with `load` in `dirs/<wheel sha256>/`, where every member lies under its own name: a
/// hard link of its verified file in `files/` (a copy where the file system has no links).
/// The directory is kept while each name is still the verified file itself (a regular file, the
/// same inode), and otherwise made again in `tmp/` and renamed into place, every step through a
/// directory handle; the caller holds the cache lock.
fn named(row: &RuntimeLibrary, root: &Dir, mut lib: Library) -> Result<Library> {
    use std::os::unix::fs::MetadataExt;
    let files = root.sub("files", true)?;
    let dirs = root.sub("dirs", true)?;
    let tmp = root.sub("tmp", true)?;
    let base = |image_path: &str| {
        image_path
            .rsplit('/')
            .next()
            .unwrap_or(image_path)
            .to_owned()
    };
    let same = |a: &Path, b: &Path| match (std::fs::metadata(a), std::fs::symlink_metadata(b)) {
        (Ok(a), Ok(b)) => b.is_file() && a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    };
    let complete = match dirs.sub_if_exists(&row.sha256) {
        Ok(Some(d)) => lib
            .files
            .iter()
            .all(|(file, dest)| same(file, &d.path().join(base(dest)))),
        _ => false,
    };
    if !complete {
        let name = format!("dir-{}-{}", row.sha256, std::process::id());
        if let Some(old) = tmp.sub_if_exists(&name)? {
            old.clear()?;
            tmp.remove_dir(&name)?;
        }
        let stage = tmp.sub(&name, true)?;
        for (file, dest) in &lib.files {
            let hex = file
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default();
            let to = base(dest);
            if files.link(hex, &stage, &to).is_err() {
                let bytes = files.read(hex, MAX_MEMBER, "a library file")?;
                stage.write_atomic(&to, &bytes, None)?;
            }
        }
        if let Ok(Some(old)) = dirs.sub_if_exists(&row.sha256) {
            old.clear()?;
            dirs.remove_dir(&row.sha256)?;
        } else {
            // A non-directory at the name (a link, a file) goes too.
            dirs.remove(&row.sha256)?;
        }
        tmp.rename(&name, &dirs, &row.sha256)?;
        dirs.sync();
    }
    let load = row
        .files
        .iter()
        .zip(&lib.files)
        .find(|(member, _)| **member == row.load)
        .map(|(_, (_, dest))| dirs.path().join(&row.sha256).join(base(dest)))
        .ok_or_else(|| Error::Wheel {
            wheel: row.url.clone(),
            why: format!("{} is not one of the row's files", row.load),
        })?;
    lib.load = load;
    Ok(lib)
}

/// The library from a complete cache index whose files all hash to their names.
fn from_index(
    row: &RuntimeLibrary,
    index: &Dir,
    name: &str,
    files: &Dir,
) -> Result<Option<Library>> {
    let Some(st) = index.stat(name)? else {
        return Ok(None);
    };
    if st.kind != crate::oci::dir::Kind::File {
        index.remove(name)?;
        return Ok(None);
    }
    let doc: serde_json::Value =
        match serde_json::from_slice(&index.read(name, 1 << 20, "library index")?) {
            Ok(v) => v,
            Err(_) => return Ok(None),
        };
    let mut out = Vec::new();
    let mut load = None;
    for member in &row.files {
        let Some(hex) = doc["members"][member]["sha256"].as_str() else {
            return Ok(None);
        };
        if !crate::oci::digest::is_sha256_hex(hex) {
            return Ok(None);
        }
        match files.stat(hex)? {
            Some(st) if st.kind == crate::oci::dir::Kind::File => {}
            _ => return Ok(None),
        }
        let (f, _) = files.open_file(hex)?;
        if hash_reader(f)?.0 != hex {
            files.remove(hex)?;
            return Ok(None);
        }
        let base = member.rsplit('/').next().unwrap_or(member);
        let dest = format!("{}/{base}", row.install_dir.trim_end_matches('/'));
        let path = files.path().join(hex);
        if *member == row.load {
            load = Some(path.clone());
        }
        out.push((path, dest));
    }
    let Some(load) = load else {
        return Ok(None);
    };
    Ok(Some(Library {
        files: out,
        load,
        offline: true,
        bytes_downloaded: 0,
    }))
}

/// sha256 (hex) and length of everything `r` yields.
pub(crate) fn hash_reader(r: impl Read) -> Result<(String, u64)> {
    let (digest, n) = crate::oci::Digest::of_reader(r)
        .map_err(|e| crate::oci::Error::io("read", PathBuf::from("library cache"))(e))?;
    Ok((digest.hex().to_string(), n))
}

/// Copy `r` into a new temp file in `tmp` (at most `limit` bytes), hashing it; returns the temp
/// name, the sha256 hex and the length. The file is fsynced; the caller renames or removes it.
pub(crate) fn spool(
    mut r: impl Read,
    tmp: &Dir,
    prefix: &str,
    limit: u64,
    mut progress: impl FnMut(u64),
) -> std::result::Result<(String, String, u64), (Option<String>, String)> {
    let (name, mut f) = tmp.create_temp(prefix).map_err(|e| (None, e.to_string()))?;
    let fail = |why: String| (Some(name.clone()), why);
    let mut h = crate::oci::digest::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let k = r.read(&mut buf).map_err(|e| fail(e.to_string()))?;
        if k == 0 {
            break;
        }
        if h.count() + k as u64 > limit {
            return Err(fail(format!("more than {limit} bytes")));
        }
        h.update(&buf[..k]);
        f.write_all(&buf[..k]).map_err(|e| fail(e.to_string()))?;
        progress(k as u64);
    }
    f.sync_all().map_err(|e| fail(e.to_string()))?;
    let (digest, n) = h.finish();
    Ok((name, digest.hex().to_string(), n))
}

#[cfg(test)]
mod tests;
