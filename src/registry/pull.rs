//! Pull an image into an OCI layout: a tag resolves through its index to linux/amd64 (or the
//! platform asked for), every blob is verified by digest while it streams to disk. The caller
//! may pin the reference to a digest ([`Pin`], from its lock file: `pipeline::pull` reads and
//! records lock files, this module never does).
//!
//! An image whose digest is already known (named in the reference or pinned) and complete in
//! the destination layout is not fetched again: no connection is made, so a pinned base builds
//! offline from the shared base cache (`bases` under the cache root, [`crate::cache`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ureq::http::Method;

use super::client::{header, status_error, Client, ClientOptions, Req};
use super::layout::Layout;
use super::reference::Reference;
use super::sources::{Registries, Source};
use super::{get_manifest, media, parse_document, Error, Result};
use crate::oci::image::{Descriptor, Document, Platform};
use crate::oci::Digest;

/// A digest the caller pins a reference to (its lock file's): pulled instead of whatever the
/// tag names now.
#[derive(Debug, Clone)]
pub struct Pin {
    pub digest: Digest,
    /// Where the pin comes from (`lock file recipe.lock`), named when the registry no longer
    /// has the digest.
    pub source: String,
}

/// Options of a pull.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    pub client: ClientOptions,
    /// The digest to pull for a reference without one.
    pub pin: Option<Pin>,
    /// The platform to pick from an index (default linux/amd64).
    pub platform: Option<(String, String)>,
    /// Name the image in the layout `REFERENCE@DIGEST` (the shared base cache's naming, unique
    /// per reference and digest) instead of by its tag.
    pub name_by_digest: bool,
    /// Mirrors and remapped locations; `None` reads the registries.conf files of the
    /// environment ([`Registries::load`]).
    pub registries: Option<std::sync::Arc<Registries>>,
}

/// The time a pull gives its registries.conf mirrors, all of them together: a mirror still
/// unanswered then is stopped, the ones after it are not tried, and the registry itself is
/// asked. A mirror that answered in time serves the whole pull.
pub(crate) const MIRROR_BUDGET: Duration = Duration::from_secs(30);

/// The result of a pull.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct PulledImage {
    pub reference: String,
    /// The platform image manifest's digest (what the lock file pins).
    pub digest: Digest,
    /// The index the tag pointed at, when it was one.
    pub index_digest: Option<Digest>,
    /// The layout holding the image, under `ref_name`.
    pub layout: PathBuf,
    pub ref_name: String,
    pub bytes_downloaded: u64,
    pub blobs_reused: usize,
    /// True when the layout already held the pinned image and no registry was contacted.
    pub offline: bool,
    /// Where it came from (`None` when no registry was contacted).
    pub served_by: Option<Served>,
}

/// The name of an image in the shared base cache: the reference without any digest, then
/// `@` and the platform manifest's digest.
pub(crate) fn cache_ref_name(reference: &str, digest: &Digest) -> String {
    let name = reference.split_once('@').map_or(reference, |(n, _)| n);
    format!("{name}@{digest}")
}

/// Pull `reference` into the layout `dest` (created when missing), with default options.
pub fn pull(reference: &str, dest: &Path) -> Result<PulledImage> {
    pull_with(reference, dest, &PullOptions::default())
}

#[allow(
    clippy::too_many_lines,
    reason = "the pull protocol in order (sources, manifest, platform, config, layers), each verified as it arrives"
)]
pub fn pull_with(reference: &str, dest: &Path, opts: &PullOptions) -> Result<PulledImage> {
    let mut r = Reference::parse(reference)?;
    let mut pinned_by = None;
    if r.digest.is_none() {
        if let Some(pin) = &opts.pin {
            r.digest = Some(pin.digest.clone());
            pinned_by = Some(pin.source.as_str());
        }
    }
    let layout = Layout::open_or_create(dest)?;
    // One pull at a time per layout: `index.json` is read, changed and written back.
    let _guard = lock_layout(&layout)?;
    let (os, arch) = opts
        .platform
        .clone()
        .unwrap_or_else(|| ("linux".to_string(), "amd64".to_string()));
    let ref_name_for = |digest: &Digest| {
        if opts.name_by_digest {
            cache_ref_name(reference, digest)
        } else {
            r.tag
                .clone()
                .unwrap_or_else(|| super::referrers::fallback_tag(digest.as_str()))
        }
    };

    // Every pull ends here: the image named in the layout.
    let named = |desc: Descriptor,
                 index_digest: Option<Digest>,
                 bytes_downloaded: u64,
                 blobs_reused: usize,
                 served_by: Option<Served>| {
        let ref_name = ref_name_for(&desc.digest);
        let digest = desc.digest.clone();
        layout.set_ref(&ref_name, base_descriptor(desc, reference, &os, &arch))?;
        Ok(PulledImage {
            reference: reference.to_string(),
            digest,
            index_digest,
            layout: dest.to_path_buf(),
            ref_name,
            bytes_downloaded,
            blobs_reused,
            offline: served_by.is_none(),
            served_by,
        })
    };
    if let Some(want) = &r.digest {
        if let Some((desc, index_digest, blobs)) = local_image(&layout, want, &os, &arch) {
            return named(desc, index_digest, 0, blobs, None);
        }
    }

    let registries = match &opts.registries {
        Some(r) => r.clone(),
        None => std::sync::Arc::new(Registries::load(None, &super::env_var)?),
    };
    let sources = registries.sources(&r)?;
    let open = |src: &Source, deadline: Option<Instant>| {
        open_source(&r, src, opts, &layout, (&os, &arch), pinned_by, deadline)
    };
    // A mirror that fails is passed over, and said; the primary's error is the answer. The
    // mirrors share one deadline, so dead ones cannot hold the pull for long.
    let mut tried = Vec::new();
    let mut found = None;
    let deadline = Instant::now() + MIRROR_BUDGET;
    for src in &sources.mirrors {
        if Instant::now() >= deadline {
            tried.push(format!(
                "{}: not tried: the mirrors' time ({:.0} s) was spent",
                src.place(),
                MIRROR_BUDGET.as_secs_f64()
            ));
            continue;
        }
        match open(src, Some(deadline)) {
            Ok(opened) => {
                found = Some((src, opened));
                break;
            }
            Err(e) => tried.push(format!("{}: {e}", src.place())),
        }
    }
    let (src, opened) = match found {
        Some(found) => found,
        None => match open(&sources.primary, None) {
            Ok(opened) => (&sources.primary, opened),
            Err(e) if tried.is_empty() => return Err(e),
            Err(e) => {
                return Err(Error::Sources {
                    tried: tried.join("; "),
                    source: Box::new(e),
                })
            }
        },
    };
    let served_by = Served {
        place: src.place(),
        mirror: src.mirror,
        mirrors_failed: tried,
    };
    let Opened {
        client,
        mut bytes,
        mut media_type,
        known,
    } = opened;
    if let Some((desc, index_digest, blobs)) = known {
        // The tag's digest (learnt with a HEAD) names an image the layout already holds.
        return named(desc, index_digest, 0, blobs, Some(served_by));
    }
    let r_logical = &r;
    let r = &src.reference;
    let scopes = vec![format!("repository:{}:pull", r.repository)];
    let first_digest = Digest::of(&bytes);
    let mut index_digest = None;
    let mut index_bytes = None;
    if media::is_index(&media_type) {
        let index = parse_document(&bytes, first_digest.as_str())?;
        let pick = index
            .manifests
            .iter()
            .find(|d| d.is_platform(&os, &arch))
            .ok_or_else(|| Error::NotFound {
                reference: r.to_string(),
                reason: format!("the index lists no {os}/{arch} image"),
            })?;
        let want = pick.digest.clone();
        let (b, mt) = get_manifest(&client, r, want.as_str(), &scopes, "pulling")?;
        let got = Digest::of(&b);
        if got != want {
            return Err(Error::DigestMismatch {
                what: format!("{os}/{arch} manifest of {r_logical} from {}", src.place()),
                expected: want.to_string(),
                actual: got.to_string(),
            });
        }
        index_digest = Some(first_digest);
        // Kept beside the image, so the next pull of this tag finds the digest its HEAD
        // names in the layout and downloads nothing.
        index_bytes = Some(std::mem::take(&mut bytes));
        bytes = b;
        media_type = mt;
    }
    if !media::is_manifest(&media_type) {
        return Err(Error::Protocol {
            what: r.to_string(),
            reason: format!("unsupported manifest media type `{media_type}`"),
        });
    }
    let digest = Digest::of(&bytes);
    let manifest = parse_document(&bytes, digest.as_str())?;
    let dirs = PullDirs::open(&layout)?;
    let mut downloaded = 0;
    let mut reused = 0;
    for blob in manifest.config.iter().chain(manifest.layers.iter()) {
        if layout.check_blob(blob).is_ok() {
            reused += 1;
            continue;
        }
        downloaded += fetch_blob(&client, r, blob, &dirs, &scopes)?;
    }
    store_blob(&dirs, &bytes)?;
    if let Some(index) = &index_bytes {
        store_blob(&dirs, index)?;
    }
    dirs.finish();
    let desc = Descriptor::new(&media_type, digest, bytes.len() as u64);
    named(desc, index_digest, downloaded, reused, Some(served_by))
}

/// Where a pulled image came from.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Served {
    /// `host/repository` that served the manifest and blobs.
    pub place: String,
    /// True when that is a registries.conf mirror.
    pub mirror: bool,
    /// The mirrors tried before it, each with why it was passed over.
    pub mirrors_failed: Vec<String>,
}

/// A source that answered for the reference: its client and the first manifest (or index),
/// its digest checked against the one the reference pins. `known` is set instead when a HEAD
/// named a digest the layout already holds whole (no GET was made).
struct Opened {
    client: Client,
    bytes: Vec<u8>,
    media_type: String,
    known: Option<Known>,
}

/// An image complete in the layout: its platform manifest's descriptor, the index digest
/// when it was reached through one, and the number of its blobs.
type Known = (Descriptor, Option<Digest>, usize);

/// Connect to one source and read the reference's manifest there. A tag is resolved with a
/// HEAD first (registries such as Docker Hub count GETs of manifests against a rate limit,
/// not HEADs): when the digest it names is already complete in the layout, nothing is
/// downloaded; else the manifest is fetched by that digest and verified against it.
///
/// `deadline` (the mirrors' shared one) bounds everything until the manifest is in; a source
/// that answered serves the blobs under the usual deadlines.
fn open_source(
    logical: &Reference,
    src: &Source,
    opts: &PullOptions,
    layout: &Layout,
    (os, arch): (&str, &str),
    pinned_by: Option<&str>,
    deadline: Option<Instant>,
) -> Result<Opened> {
    let mut client_opts = opts.client.clone();
    client_opts.insecure |= src.insecure;
    if src.mirror {
        // A mirror is a shortcut: an unreachable one is passed over quickly.
        client_opts.max_attempts = client_opts.max_attempts.min(3);
    }
    client_opts.deadline = deadline;
    let r = &src.reference;
    let mut client = Client::connect(r.endpoint(), client_opts)?;
    let scopes = vec![format!("repository:{}:pull", r.repository)];
    let mut want = r.digest.clone();
    if want.is_none() {
        if let Some(d) = super::head_manifest(&client, r, r.manifest_ref(), &scopes)? {
            if let Some(known) = local_image(layout, &d, os, arch) {
                client.lift_deadline();
                return Ok(Opened {
                    client,
                    bytes: Vec::new(),
                    media_type: String::new(),
                    known: Some(known),
                });
            }
            want = Some(d);
        }
    }
    let at = want.as_ref().map_or(r.manifest_ref(), |d| d.as_str());
    let (bytes, media_type) = match get_manifest(&client, r, at, &scopes, "pulling") {
        Err(Error::NotFound {
            reference: what, ..
        }) if pinned_by.is_some() => {
            return Err(Error::NotFound {
                reference: what,
                reason: format!(
                    "the registry no longer has the digest pinned by {} (the image was deleted \
                     or garbage-collected); re-resolve the tag on purpose with --update-lock, or \
                     restore the image",
                    pinned_by.unwrap_or_default()
                ),
            });
        }
        other => other?,
    };
    let got = Digest::of(&bytes);
    if let Some(want) = &want {
        if &got != want {
            return Err(Error::DigestMismatch {
                what: format!("manifest of {logical} from {}", src.place()),
                expected: want.to_string(),
                actual: got.to_string(),
            });
        }
    }
    client.lift_deadline();
    Ok(Opened {
        client,
        bytes,
        media_type,
        known: None,
    })
}

/// The `index.json` entry of a pulled image: its platform and the reference it came from.
fn base_descriptor(mut desc: Descriptor, reference: &str, os: &str, arch: &str) -> Descriptor {
    desc.platform = Some(Platform::new(os, arch));
    desc.artifact_type = None;
    desc.annotations = [(
        "org.opencontainers.image.base.name".to_string(),
        reference.to_string(),
    )]
    .into_iter()
    .collect();
    desc
}

/// The image `digest` names when the layout already holds it completely: its platform
/// manifest's descriptor, the index digest when `digest` names an index, and the number of
/// blobs (config and layers) found. Manifests are read with their digest verified; config and
/// layers are checked by size (the build verifies every layer's digest as it imports it).
fn local_image(layout: &Layout, digest: &Digest, os: &str, arch: &str) -> Option<Known> {
    let read = |digest: &Digest| -> Option<(Descriptor, Document)> {
        let size = std::fs::metadata(layout.blob_path(digest)).ok()?.len();
        let mut desc = Descriptor::new("", digest.clone(), size);
        let bytes = layout.read_small(&desc).ok()?;
        let m = Document::parse(&bytes).ok()?;
        desc.media_type = m.kind()?.to_string();
        Some((desc, m))
    };
    let (mut desc, mut manifest) = read(digest)?;
    let mut index_digest = None;
    if media::is_index(&desc.media_type) {
        let pick = manifest
            .manifests
            .iter()
            .find(|d| d.is_platform(os, arch))?
            .digest
            .clone();
        index_digest = Some(desc.digest.clone());
        (desc, manifest) = read(&pick)?;
    }
    if !media::is_manifest(&desc.media_type) {
        return None;
    }
    let mut blobs = 0;
    for b in manifest.config.iter().chain(manifest.layers.iter()) {
        layout.check_blob(b).ok()?;
        blobs += 1;
    }
    Some((desc, index_digest, blobs))
}

/// Where a pull writes, opened once through [`crate::oci::Dir`] like the blob store (no link
/// followed below the layout's root, temp files created exclusively): `blobs/sha256`, and
/// `.infer-build/pull-tmp`, the directory blobs are streamed into before they are renamed
/// among the blobs. `pull-tmp` is emptied at the start of every pull (under the pull lock), so
/// a killed pull never leaves partial files among the blobs and its leftovers go with the next
/// pull; a link or file planted at its name is removed (never followed), a linked
/// `.infer-build` or `blobs/sha256` refused.
struct PullDirs {
    blobs: crate::oci::Dir,
    tmp: crate::oci::Dir,
    infer: crate::oci::Dir,
}

const PULL_TMP: &str = "pull-tmp";

impl PullDirs {
    fn open(layout: &Layout) -> Result<PullDirs> {
        use crate::oci::dir::Kind;
        let fail = |e: crate::oci::Error| dir_error(layout, e);
        let root = crate::oci::Dir::open(&layout.root).map_err(fail)?;
        let blobs = root.sub("blobs/sha256", true).map_err(fail)?;
        let infer = root.sub(".infer-build", true).map_err(fail)?;
        match infer.stat(PULL_TMP).map_err(fail)?.map(|s| s.kind) {
            Some(Kind::Dir) => {}
            Some(_) => infer.remove(PULL_TMP).map_err(fail)?,
            None => {}
        }
        let tmp = infer.sub(PULL_TMP, true).map_err(fail)?;
        tmp.clear().map_err(fail)?;
        Ok(PullDirs { blobs, tmp, infer })
    }

    /// Moves the verified temp file `name` into the blobs as `digest`, durably.
    fn commit(&self, name: &str, digest: &Digest) -> Result<()> {
        let hex = digest.hex();
        let res = self.tmp.rename(name, &self.blobs, hex);
        if res.is_err() {
            let _ = self.tmp.remove(name);
        }
        res.map_err(|e| Error::io(self.blobs.path().join(hex), e.into_io()))?;
        self.blobs.sync();
        Ok(())
    }

    /// Removes the (now empty) temp directory.
    fn finish(self) {
        let _ = self.tmp.clear();
        let _ = self.infer.remove_dir(PULL_TMP);
    }
}

/// A refused link or non-directory inside the layout is the layout's problem (bad input);
/// anything else is an I/O error.
fn dir_error(layout: &Layout, e: crate::oci::Error) -> Error {
    if e.is_bad_input() {
        Error::Layout {
            path: layout.root.clone(),
            reason: e.to_string(),
        }
    } else {
        Error::io(&layout.root, e.into_io())
    }
}

/// Store small bytes (a manifest) as a blob through the pull's temporary directory.
fn store_blob(dirs: &PullDirs, bytes: &[u8]) -> Result<Digest> {
    let digest = Digest::of(bytes);
    let hex = digest.hex();
    if dirs
        .blobs
        .stat(hex)
        .ok()
        .flatten()
        .is_some_and(|s| s.kind == crate::oci::dir::Kind::File)
    {
        return Ok(digest);
    }
    dirs.blobs
        .write_atomic(hex, bytes, Some(&dirs.tmp))
        .map_err(|e| Error::io(dirs.blobs.path().join(hex), e.into_io()))?;
    Ok(digest)
}

/// An exclusive lock on the layout for one pull (`.infer-build/pull.lock`, released on drop).
/// Opened like the pull's other files: a link at `.infer-build` or `pull.lock` is refused.
fn lock_layout(layout: &Layout) -> Result<std::fs::File> {
    let file = crate::oci::Dir::open(&layout.root)
        .and_then(|root| root.sub(".infer-build", true))
        .and_then(|dir| dir.open_lock("pull.lock"))
        .map_err(|e| dir_error(layout, e))?;
    let path = layout.root.join(".infer-build/pull.lock");
    fs4::FileExt::lock(&file).map_err(|e| Error::io(&path, e))?;
    Ok(file)
}

/// Stream a blob to a temporary file in `tmp_dir`, hashing as it goes; rename it into the
/// layout only when the digest and size match. A broken stream is retried; a registry that
/// sends more bytes than the descriptor says, or other bytes, is not (no second download of a
/// body that cannot be right).
fn fetch_blob(
    client: &Client,
    r: &Reference,
    blob: &Descriptor,
    dirs: &PullDirs,
    scopes: &[String],
) -> Result<u64> {
    let url = client.url(&format!("{}/blobs/{}", r.repository, blob.digest));
    let too_long = |got: String| Error::Protocol {
        what: format!("blob {} of {r}", blob.digest),
        reason: format!(
            "the registry sent {got} bytes, its descriptor says {}",
            blob.size
        ),
    };
    let mut attempt = 0;
    let mut timeouts = 0;
    loop {
        attempt += 1;
        let req = Req::new(Method::GET, url.clone()).expect_bytes(blob.size);
        let mut resp = client.send(&req, scopes)?;
        if resp.status().as_u16() != 200 {
            return Err(status_error(
                &Method::GET,
                &url,
                resp.status().as_u16(),
                resp,
            ));
        }
        if let Some(n) = header(&resp, "content-length").and_then(|v| v.trim().parse::<u64>().ok())
        {
            if n != blob.size {
                return Err(too_long(format!("a Content-Length of {n}")));
            }
        }
        let (tmp_name, mut tmp) = dirs
            .tmp
            .create_temp("blob-")
            .map_err(|e| Error::io(dirs.tmp.path(), e.into_io()))?;
        // Removed on every way out but the rename into the blobs.
        let temp = TempName(&dirs.tmp, &tmp_name);
        let mut hasher = crate::oci::digest::Hasher::new();
        // A body slower than the minimum rate over a window is cut off (a timeout).
        let mut reader = super::client::Guarded {
            inner: resp.body_mut().with_config().limit(u64::MAX).reader(),
            guard: client.rate_guard(),
        };
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        let streamed: std::io::Result<()> = loop {
            // Never ask for more than one byte past the descriptor's size.
            let want = buf
                .len()
                .min(blob.size.saturating_sub(total).saturating_add(1) as usize);
            match reader.read(&mut buf[..want]) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    total += n as u64;
                    if total > blob.size {
                        return Err(too_long("more than that".into()));
                    }
                    hasher.update(&buf[..n]);
                    if let Err(e) = tmp.write_all(&buf[..n]) {
                        return Err(Error::io(dirs.tmp.path().join(&tmp_name), e));
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = streamed {
            if super::client::is_timeout(&e) {
                timeouts += 1;
            }
            if attempt < client.max_attempts() && timeouts < super::client::MAX_TIMEOUTS {
                client.pause(attempt, None);
                continue;
            }
            return Err(Error::Transport {
                method: "GET".into(),
                url,
                source: Box::new(ureq::Error::Io(e)),
            });
        }
        let actual = hasher.digest();
        if actual != blob.digest || total != blob.size {
            return Err(Error::DigestMismatch {
                what: format!("blob of {r} ({total} bytes, expected {})", blob.size),
                expected: blob.digest.to_string(),
                actual: actual.to_string(),
            });
        }
        tmp.sync_all()
            .map_err(|e| Error::io(dirs.tmp.path().join(&tmp_name), e))?;
        drop(tmp);
        std::mem::forget(temp);
        dirs.commit(&tmp_name, &blob.digest)?;
        return Ok(total);
    }
}

/// A temp file's name, removed from its directory when dropped.
struct TempName<'a>(&'a crate::oci::Dir, &'a str);

impl Drop for TempName<'_> {
    fn drop(&mut self) {
        let _ = self.0.remove(self.1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_names_and_directory() {
        let d = Digest::parse(&format!("sha256:{}", "c".repeat(64))).unwrap();
        assert_eq!(
            cache_ref_name("127.0.0.1:5000/b/cuda:12", &d),
            format!("127.0.0.1:5000/b/cuda:12@{d}")
        );
        let other = format!("sha256:{}", "e".repeat(64));
        assert_eq!(
            cache_ref_name(&format!("r.io/b/cuda:12@{other}"), &d),
            format!("r.io/b/cuda:12@{d}")
        );
    }

    #[test]
    fn a_complete_pinned_image_needs_no_registry() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::open_or_create(dir.path()).unwrap();
        let (layer_bytes, config_bytes) = (
            b"layer bytes".as_slice(),
            br#"{"architecture":"amd64","os":"linux"}"#.as_slice(),
        );
        let layer = layout.put_bytes(layer_bytes).unwrap();
        let config = layout.put_bytes(config_bytes).unwrap();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "config": {"mediaType": media::CONFIG, "digest": config, "size": config_bytes.len()},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": layer_bytes.len()}],
        });
        let m = layout
            .put_bytes(&crate::oci::cjson::value_to_vec(&manifest))
            .unwrap();
        // The registry address does not answer: only the layout can satisfy this pull.
        let reference = "127.0.0.1:9/bases/cuda:12";
        let opts = PullOptions {
            pin: Some(Pin {
                digest: m.clone(),
                source: "lock file r.lock".into(),
            }),
            name_by_digest: true,
            ..PullOptions::default()
        };
        let p = pull_with(reference, dir.path(), &opts).unwrap();
        assert!(p.offline);
        assert_eq!(p.digest, m);
        assert_eq!(p.blobs_reused, 2);
        assert_eq!(p.ref_name, format!("{reference}@{m}"));
        let named = layout.index().unwrap();
        assert_eq!(named.len(), 1);
        assert_eq!(named[0].digest, m);

        // A missing layer sends the pull to the registry, which is not there.
        std::fs::remove_file(layout.blob_path(&layer)).unwrap();
        let opts = PullOptions {
            client: ClientOptions {
                insecure: true,
                max_attempts: 1,
                ..ClientOptions::default()
            },
            ..opts
        };
        assert!(!pull_with(reference, dir.path(), &opts).is_ok_and(|p| p.offline));
    }
}
