//! Directory handles that never follow a symbolic link: the one way infer-build writes into an
//! output or cache directory and reads files out of a layout it did not write.
//!
//! A [`Dir`] is an open directory descriptor. The directory the user names (`--output`, a
//! cache root, `--base-layout`) is opened once, following links in the path the user typed;
//! everything below it is reached with `openat` and `O_NOFOLLOW`, one component at a time, so a
//! symbolic link planted inside (`blobs/sha256`, `.infer-build/tmp`, `sbom`, a blob) is refused
//! instead of sending a write, a delete or a read somewhere else. Temp files are created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` (never through an existing name), renamed with `renameat`
//! (which replaces a link rather than writing through it), and files opened for reading must be
//! regular files (`O_NONBLOCK` on open, so a FIFO cannot block the open itself).
//!
//! Built on `rustix` (already in the dependency tree through `tempfile`): thin safe wrappers over
//! the `*at` system calls, maintained by the Bytecode Alliance. `cap-std` was not used: it allows
//! links that stay inside the directory, and the rule here is simpler, no link at all.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, CWD};

use super::Error;

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// An open directory; paths passed to its methods are single names or relative paths resolved
/// without following links. Cloning shares the descriptor.
#[derive(Debug, Clone)]
pub struct Dir {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

/// Metadata of a directory entry, read without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryStat {
    pub kind: Kind,
    pub size: u64,
    pub ino: u64,
    pub dev: u64,
}

/// What a directory entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    /// FIFO, socket or device.
    Other,
}

fn kind_of(mode: u32) -> Kind {
    match FileType::from_raw_mode(mode as _) {
        FileType::RegularFile => Kind::File,
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Symlink,
        _ => Kind::Other,
    }
}

// The `stat` field types differ between platforms (32-bit targets, macOS): the casts are
// no-ops on x86_64 Linux only.
#[allow(
    clippy::unnecessary_cast,
    reason = "the casts are needed where the stat field types differ"
)]
fn stat_of(st: &rustix::fs::Stat) -> EntryStat {
    EntryStat {
        kind: kind_of(st.st_mode as u32),
        size: st.st_size as u64,
        ino: st.st_ino as u64,
        dev: st.st_dev as u64,
    }
}

impl Dir {
    /// Open the directory the user named (links in `path` itself are followed: it is theirs).
    pub fn open(path: &Path) -> Result<Dir, Error> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io("open directory", path)(e.into()))?;
        Ok(Dir {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
        })
    }

    /// Create `path` (and its parents) if needed, then open it.
    pub fn create(path: &Path) -> Result<Dir, Error> {
        std::fs::create_dir_all(path).map_err(Error::io("create directory", path))?;
        Dir::open(path)
    }

    /// The path this handle was opened at (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Open the subdirectory `rel` (one or more normal components), refusing links; with
    /// `create`, missing components are created.
    pub fn sub(&self, rel: &str, create: bool) -> Result<Dir, Error> {
        let mut cur = self.clone();
        for c in Path::new(rel).components() {
            let Component::Normal(name) = c else {
                return Err(Error::NotALayout {
                    path: self.path.join(rel),
                    why: "path is not a plain relative path".into(),
                });
            };
            let path = cur.path.join(name);
            if create {
                match rustix::fs::mkdirat(&*cur.fd, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(Error::io("create directory", &path)(e.into())),
                }
            }
            let fd = rustix::fs::openat(
                &*cur.fd,
                name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| cur.refusal(name, "open directory", e))?;
            cur = Dir {
                fd: Arc::new(fd),
                path,
            };
        }
        Ok(cur)
    }

    /// Like [`Dir::sub`] without `create`, but `None` when the directory does not exist.
    pub(crate) fn sub_if_exists(&self, rel: &str) -> Result<Option<Dir>, Error> {
        match self.sub(rel, false) {
            Ok(d) => Ok(Some(d)),
            Err(Error::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Explain why opening `name` failed: a link or a non-directory gets its own message.
    fn refusal(&self, name: &OsStr, op: &'static str, e: rustix::io::Errno) -> Error {
        let path = self.path.join(name);
        match self.stat(name) {
            Ok(Some(s)) if s.kind == Kind::Symlink => Error::Symlink { path },
            Ok(Some(s)) if s.kind == Kind::Other => Error::NotAFile { path },
            _ => Error::io(op, path)(e.into()),
        }
    }

    /// `lstat` of an entry; `None` when it does not exist.
    pub fn stat(&self, name: impl AsRef<OsStr>) -> Result<Option<EntryStat>, Error> {
        let name = name.as_ref();
        match rustix::fs::statat(&*self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(stat_of(&st))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(Error::io("stat", self.path.join(name))(e.into())),
        }
    }

    /// Open a regular file for reading. A link, FIFO, device or directory is refused with a
    /// message naming the path; a FIFO cannot block (the open is non-blocking and the file
    /// is refused before any read).
    pub(crate) fn open_file(&self, name: impl AsRef<OsStr>) -> Result<(File, EntryStat), Error> {
        let name = name.as_ref();
        let path = self.path.join(name);
        let fd = rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => Error::Symlink { path: path.clone() },
            e => Error::io("open", &path)(e.into()),
        })?;
        let st = stat_of(&rustix::fs::fstat(&fd).map_err(|e| Error::io("stat", &path)(e.into()))?);
        match st.kind {
            Kind::File => {}
            Kind::Symlink => return Err(Error::Symlink { path }),
            _ => return Err(Error::NotAFile { path }),
        }
        // Back to blocking reads (a regular file never blocks anyway).
        let _ = rustix::fs::fcntl_setfl(&fd, OFlags::empty());
        Ok((File::from(fd), st))
    }

    /// Read a regular file whole, refusing one over `limit` bytes (checked before and while
    /// reading, so a file that grows cannot make the read unbounded).
    pub fn read(&self, name: impl AsRef<OsStr>, limit: u64, what: &str) -> Result<Vec<u8>, Error> {
        let name = name.as_ref();
        let path = self.path.join(name);
        let (f, st) = self.open_file(name)?;
        read_bounded(f, st.size, limit, &path, what)
    }

    /// Create a new file exclusively (never through an existing name or link); returns its
    /// name in this directory and the open file.
    pub(crate) fn create_temp(&self, prefix: &str) -> Result<(String, File), Error> {
        loop {
            let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
            let name = format!("{prefix}{}-{n}", std::process::id());
            match rustix::fs::openat(
                &*self.fd,
                name.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o644),
            ) {
                Ok(fd) => return Ok((name, File::from(fd))),
                // A leftover of an earlier process with the same pid: take the next number.
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => {
                    return Err(Error::io("create temp file", self.path.join(&name))(
                        e.into(),
                    ))
                }
            }
        }
    }

    /// Open (creating if needed) a lock file for writing; a link at `name` is refused.
    pub(crate) fn open_lock(&self, name: &str) -> Result<File, Error> {
        let fd = rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o644),
        )
        .map_err(|e| self.refusal(OsStr::new(name), "open lock file", e))?;
        Ok(File::from(fd))
    }

    /// Rename `from` in this directory to `to` in `dest` (replacing `to`, even a link, never
    /// writing through it).
    pub fn rename(&self, from: &str, dest: &Dir, to: impl AsRef<OsStr>) -> Result<(), Error> {
        let to = to.as_ref();
        rustix::fs::renameat(&*self.fd, from, &*dest.fd, to)
            .map_err(|e| Error::io("rename into", dest.path.join(to))(e.into()))
    }

    /// Hard-link `from` in this directory as `to` in `dest`; a link is linked as itself by
    /// `linkat`, so callers check that `from` is a regular file first.
    pub fn link(&self, from: &str, dest: &Dir, to: &str) -> io::Result<()> {
        rustix::fs::linkat(&*self.fd, from, &*dest.fd, to, AtFlags::empty()).map_err(Into::into)
    }

    /// Remove an entry that is not a directory (a link is removed, never its target).
    pub fn remove(&self, name: impl AsRef<OsStr>) -> Result<(), Error> {
        let name = name.as_ref();
        match rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(Error::io("remove", self.path.join(name))(e.into())),
        }
    }

    /// Remove an empty subdirectory (a link at `name` is not a directory: refused).
    pub(crate) fn remove_dir(&self, name: impl AsRef<OsStr>) -> Result<(), Error> {
        let name = name.as_ref();
        match rustix::fs::unlinkat(&*self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(Error::io("remove directory", self.path.join(name))(
                e.into(),
            )),
        }
    }

    /// Names of the entries (not `.` and `..`), as bytes: nothing is converted lossily.
    pub fn names(&self) -> Result<Vec<Vec<u8>>, Error> {
        let fd = rustix::fs::openat(
            &*self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| Error::io("read directory", &self.path)(e.into()))?;
        let dir = rustix::fs::Dir::new(fd)
            .map_err(|e| Error::io("read directory", &self.path)(e.into()))?;
        let mut out = Vec::new();
        for e in dir {
            let e = e.map_err(|e| Error::io("read directory", &self.path)(e.into()))?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                out.push(n.to_vec());
            }
        }
        Ok(out)
    }

    /// Remove every non-directory entry (links included, never what they point at).
    pub fn clear(&self) -> Result<(), Error> {
        for n in self.names()? {
            let name = OsStr::from_bytes(&n);
            if self.stat(name)?.is_some_and(|s| s.kind != Kind::Dir) {
                self.remove(name)?;
            }
        }
        Ok(())
    }

    /// fsync the directory (makes renames into it durable). Best effort: not every filesystem
    /// supports it.
    pub fn sync(&self) {
        let _ = rustix::fs::fsync(&*self.fd);
    }

    /// Write `bytes` as `name` atomically and durably: an exclusive temp file in `tmp` (this
    /// directory when `None`), fsync, `renameat` into place, fsync of this directory.
    pub fn write_atomic(
        &self,
        name: impl AsRef<OsStr>,
        bytes: &[u8],
        tmp: Option<&Dir>,
    ) -> Result<(), Error> {
        let name = name.as_ref();
        let tmp = tmp.unwrap_or(self);
        let prefix = format!(".{}.tmp-", name.to_string_lossy());
        let (tmp_name, mut f) = tmp.create_temp(&prefix)?;
        let res = f
            .write_all(bytes)
            .and_then(|_| f.sync_all())
            .map_err(Error::io("write", tmp.path.join(&tmp_name)))
            .and_then(|_| tmp.rename(&tmp_name, self, name));
        if res.is_err() {
            let _ = tmp.remove(&tmp_name);
        }
        self.sync();
        res
    }
}

/// Write `bytes` to `path` atomically and durably (temp file created exclusively next to it,
/// fsync, rename, fsync of the directory). The one atomic writer for files outside a blob
/// store: SBOMs, engine cache entries, lock files, layout files written by `registry`.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), Error> {
    let (dir, name) = split(path)?;
    Dir::open(&dir)?.write_atomic(name, bytes, None)
}

/// Read the regular file at `path` whole, refusing links in its last component, FIFOs,
/// devices, directories, and files over `limit` bytes, each with a message naming the path.
/// For files the user names (`--definition`, `--engine-meta`, engine files): links in the
/// directories above are theirs to use.
pub(crate) fn read_file(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>, Error> {
    let (f, size) = open_file(path)?;
    read_bounded(f, size, limit, path, what)
}

/// Open a regular file the user named (following links, refusing anything that is not a
/// regular file before a read can block); returns it with its size.
pub(crate) fn open_file(path: &Path) -> Result<(File, u64), Error> {
    let fd = rustix::fs::openat(
        CWD,
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open", path)(e.into()))?;
    let st = stat_of(&rustix::fs::fstat(&fd).map_err(|e| Error::io("stat", path)(e.into()))?);
    if st.kind != Kind::File {
        return Err(Error::NotAFile { path: path.into() });
    }
    let _ = rustix::fs::fcntl_setfl(&fd, OFlags::empty());
    Ok((File::from(fd), st.size))
}

fn read_bounded(f: File, size: u64, limit: u64, path: &Path, what: &str) -> Result<Vec<u8>, Error> {
    let too_big = |size| Error::TooBig {
        path: path.into(),
        what: what.into(),
        size,
        limit,
    };
    if size > limit {
        return Err(too_big(size));
    }
    let mut out = Vec::with_capacity(size as usize);
    f.take(limit + 1)
        .read_to_end(&mut out)
        .map_err(Error::io("read", path))?;
    if out.len() as u64 > limit {
        return Err(too_big(out.len() as u64));
    }
    Ok(out)
}

/// `path` as (parent directory, file name); the parent of a bare name is `.`.
fn split(path: &Path) -> Result<(PathBuf, &OsStr), Error> {
    let name = path
        .file_name()
        .ok_or_else(|| Error::NotAFile { path: path.into() })?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((dir, name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_are_refused_and_never_written_through() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"keep").unwrap();
        let root = Dir::create(&t.path().join("root")).unwrap();
        symlink(&outside, t.path().join("root/linked")).unwrap();
        assert!(matches!(
            root.sub("linked", true),
            Err(Error::Symlink { .. })
        ));
        assert!(matches!(
            root.sub("linked/x", true),
            Err(Error::Symlink { .. })
        ));
        symlink(outside.join("keep"), t.path().join("root/f")).unwrap();
        assert!(matches!(root.open_file("f"), Err(Error::Symlink { .. })));
        // Replacing a link renames over it: the target keeps its content.
        root.write_atomic("f", b"new", None).unwrap();
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"keep");
        assert_eq!(root.read("f", 10, "test").unwrap(), b"new");
        assert!(matches!(
            root.read("f", 2, "test"),
            Err(Error::TooBig { .. })
        ));
        symlink(&outside, t.path().join("root/l2")).unwrap();
        root.clear().unwrap();
        assert!(outside.join("keep").exists());
        assert!(root.stat("l2").unwrap().is_none());
    }
}
