//! The canonical tar format of infer-build layers (pure: values in, bytes out).
//!
//! Policy (part of [`super::LAYER_RECIPE`]):
//! - entries sorted by path bytes, every parent directory present (added with mode 0755),
//!   no duplicates, paths relative, `/`-separated, no `.`/`..` components, valid UTF-8;
//! - POSIX ustar headers: mtime = the build epoch (`SOURCE_DATE_EPOCH`, else 0), uid/gid 0
//!   (root owns the files; the image runs as 65532 and can read but not change them), empty
//!   uname/gname, devmajor/devminor 0, modes exactly as given (0755 dirs, 0644 files, 0755
//!   executables), directories named with a trailing `/`;
//! - a PAX extended header (`PaxHeaders.0/<name>`, keys sorted) only when a path does not fit
//!   ustar's 100+155 bytes or a file is 8 GiB or larger; never atime, ctime or xattrs;
//! - the archive ends with two zero blocks (no padding to a 10 KiB record).

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::Error;

pub(crate) const BLOCK: usize = 512;

/// What an entry is and where its bytes come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    Dir,
    /// A file's content given inline (small generated files: `runtime.toml`, warm-up data).
    /// Shared, so one warm-up file serves every target without a copy each.
    Bytes(std::sync::Arc<[u8]>),
    /// A regular file on disk, streamed when the layer is written; `size` is what it must still
    /// be while it is read.
    File {
        path: PathBuf,
        size: u64,
    },
}

/// One entry of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Path inside the image, relative (`usr/local/bin/infer-serve`).
    pub path: String,
    /// Permission bits (and sticky bit), e.g. 0o644.
    pub mode: u32,
    pub source: Source,
}

impl Entry {
    pub fn dir(path: &str, mode: u32) -> Entry {
        Entry {
            path: path.into(),
            mode,
            source: Source::Dir,
        }
    }
    pub fn bytes(path: &str, mode: u32, data: impl Into<std::sync::Arc<[u8]>>) -> Entry {
        Entry {
            path: path.into(),
            mode,
            source: Source::Bytes(data.into()),
        }
    }
    pub fn file(path: &str, mode: u32, src: PathBuf, size: u64) -> Entry {
        Entry {
            path: path.into(),
            mode,
            source: Source::File { path: src, size },
        }
    }
    pub fn size(&self) -> u64 {
        match &self.source {
            Source::Dir => 0,
            Source::Bytes(b) => b.len() as u64,
            Source::File { size, .. } => *size,
        }
    }
}

/// Check one path against what tar (and the policy) can represent.
pub(crate) fn check_path(path: &str) -> Result<(), Error> {
    let bad = |why| {
        Err(Error::BadEntryName {
            path: path.into(),
            why,
        })
    };
    if path.is_empty() {
        return bad("empty path");
    }
    if path.starts_with('/') {
        return bad("absolute path");
    }
    if path.contains('\0') {
        return bad("NUL byte in the name");
    }
    for c in path.split('/') {
        match c {
            "" => return bad("empty path component"),
            "." | ".." => return bad("`.` or `..` component"),
            _ => {}
        }
    }
    Ok(())
}

/// Sort, validate, and add the missing parent directories.
pub fn canonicalize(entries: Vec<Entry>) -> Result<Vec<Entry>, Error> {
    let mut map: BTreeMap<Vec<u8>, Entry> = BTreeMap::new();
    for e in entries {
        check_path(&e.path)?;
        let key = e.path.as_bytes().to_vec();
        if map.contains_key(&key) {
            return Err(Error::DuplicateEntry(e.path));
        }
        map.insert(key, e);
    }
    let mut parents = Vec::new();
    for k in map.keys() {
        let mut p = k.as_slice();
        while let Some(i) = p.iter().rposition(|&b| b == b'/') {
            p = &p[..i];
            parents.push(p.to_vec());
        }
    }
    for p in parents {
        match map.get(&p) {
            Some(Entry {
                source: Source::Dir,
                ..
            }) => {}
            Some(e) => {
                return Err(Error::DuplicateEntry(format!(
                    "{} (a file and a directory)",
                    e.path
                )))
            }
            None => {
                let path = String::from_utf8(p.clone()).unwrap_or_default();
                map.insert(p, Entry::dir(&path, 0o755));
            }
        }
    }
    Ok(map.into_values().collect())
}

/// The header block(s) for an entry: an optional PAX header (with its data) followed by the
/// ustar header. The entry's content and its padding follow in the stream.
pub(crate) fn header(entry: &Entry, mtime: u64) -> Result<Vec<u8>, Error> {
    check_path(&entry.path)?;
    let is_dir = matches!(entry.source, Source::Dir);
    let name = if is_dir {
        format!("{}/", entry.path)
    } else {
        entry.path.clone()
    };
    let size = entry.size();
    let mut pax: BTreeMap<&str, String> = BTreeMap::new();
    let split = split_ustar(&name);
    if split.is_none() {
        pax.insert("path", name.clone());
    }
    const MAX_OCTAL_11: u64 = 0o77777777777;
    if size > MAX_OCTAL_11 {
        pax.insert("size", size.to_string());
    }
    let mut out = Vec::with_capacity(3 * BLOCK);
    if !pax.is_empty() {
        let mut data = Vec::new();
        for (k, v) in &pax {
            data.extend_from_slice(pax_record(k, v).as_bytes());
        }
        let base = name.trim_end_matches('/').rsplit('/').next().unwrap_or("");
        let mut pname = format!("PaxHeaders.0/{base}");
        truncate_at_char(&mut pname, 99);
        let h = ustar(("", &pname), 0o644, data.len() as u64, mtime, b'x');
        out.extend_from_slice(&h);
        out.extend_from_slice(&data);
        out.resize(out.len() + padding(data.len() as u64), 0);
    }
    let (prefix, short) = match split {
        Some(s) => s,
        None => {
            // The real name is in the PAX record; the ustar fields get a truncated copy.
            let mut t = name.clone();
            truncate_at_char(&mut t, 100);
            (String::new(), t)
        }
    };
    let size_field = if size > MAX_OCTAL_11 { 0 } else { size };
    let typeflag = if is_dir { b'5' } else { b'0' };
    out.extend_from_slice(&ustar(
        (&prefix, &short),
        entry.mode,
        size_field,
        mtime,
        typeflag,
    ));
    Ok(out)
}

/// The zero padding after `len` bytes of content.
pub(crate) fn padding(len: u64) -> usize {
    let r = (len % BLOCK as u64) as usize;
    if r == 0 {
        0
    } else {
        BLOCK - r
    }
}

/// Split a name into ustar (prefix, name) fields, or `None` when it does not fit.
fn split_ustar(name: &str) -> Option<(String, String)> {
    if name.len() <= 100 {
        return Some((String::new(), name.into()));
    }
    // Split at a `/` so that prefix ≤ 155 and the rest ≤ 100 (a directory's trailing `/`
    // stays in the name part).
    let bytes = name.as_bytes();
    let body = name.strip_suffix('/').unwrap_or(name).len();
    for i in (0..body).rev() {
        if bytes[i] == b'/' && i <= 155 && name.len() - i - 1 <= 100 && i > 0 {
            return Some((name[..i].into(), name[i + 1..].into()));
        }
    }
    None
}

fn truncate_at_char(s: &mut String, max: usize) {
    if s.len() > max {
        let mut i = max;
        while !s.is_char_boundary(i) {
            i -= 1;
        }
        s.truncate(i);
    }
}

fn pax_record(key: &str, value: &str) -> String {
    // "%d %s=%s\n" where %d counts the whole record, its own digits included.
    let rest = key.len() + value.len() + 3;
    let mut n = rest + 1;
    while n != rest + n.to_string().len() {
        n = rest + n.to_string().len();
    }
    format!("{n} {key}={value}\n")
}

fn ustar(
    (prefix, name): (&str, &str),
    mode: u32,
    size: u64,
    mtime: u64,
    typeflag: u8,
) -> [u8; BLOCK] {
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], mode as u64);
    octal(&mut h[108..116], 0); // uid
    octal(&mut h[116..124], 0); // gid
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], mtime);
    h[156] = typeflag;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    octal(&mut h[329..337], 0); // devmajor
    octal(&mut h[337..345], 0); // devminor
    h[345..345 + prefix.len()].copy_from_slice(prefix.as_bytes());
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
    h
}

/// Zero-padded octal with a trailing NUL, filling the field. Values that do not fit (an
/// mtime after 2242) are clamped; sizes that do not fit go to PAX before this is called.
fn octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let max = (1u64 << (3 * digits as u32)) - 1;
    let s = format!("{:0width$o}", v.min(max), width = digits);
    field[..digits].copy_from_slice(s.as_bytes());
    field[digits] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pax_record_counts_itself() {
        assert_eq!(pax_record("path", "a"), "9 path=a\n");
        assert_eq!(pax_record("path", "abc"), "12 path=abc\n");
        let long = "x".repeat(95);
        let r = pax_record("path", &long);
        assert_eq!(r.len().to_string(), r.split(' ').next().unwrap());
    }

    #[test]
    fn canonical_order_and_parents() {
        let e = canonicalize(vec![
            Entry::bytes("b/c.txt", 0o644, b"x".to_vec()),
            Entry::bytes("a.txt", 0o644, vec![]),
            Entry::bytes("a/z", 0o644, vec![]),
        ])
        .unwrap();
        let paths: Vec<&str> = e.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(paths, ["a", "a.txt", "a/z", "b", "b/c.txt"]);
    }

    #[test]
    fn refuses_what_tar_cannot_hold() {
        for p in ["", "/abs", "a//b", "a/../b", "./a", "a\0b"] {
            assert!(
                matches!(check_path(p), Err(Error::BadEntryName { .. })),
                "{p:?}"
            );
        }
        let dup = canonicalize(vec![Entry::dir("a", 0o755), Entry::dir("a", 0o755)]);
        assert!(matches!(dup, Err(Error::DuplicateEntry(_))));
        let file_parent = canonicalize(vec![
            Entry::bytes("a", 0o644, vec![]),
            Entry::bytes("a/b", 0o644, vec![]),
        ]);
        assert!(file_parent.is_err());
    }

    #[test]
    fn long_names_use_prefix_then_pax() {
        let mid = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        let h = header(&Entry::bytes(&mid, 0o644, vec![]), 0).unwrap();
        assert_eq!(h.len(), BLOCK, "fits prefix+name: no PAX");
        let long = "x".repeat(300);
        let h = header(&Entry::bytes(&long, 0o644, vec![]), 0).unwrap();
        assert_eq!(h[156], b'x');
        assert!(h.len() > 2 * BLOCK);
    }
}
