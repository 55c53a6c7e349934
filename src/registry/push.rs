//! Push an OCI layout: blobs (HEAD, mount, monolithic or chunked upload, resume), manifests,
//! per-target tags, the index tag and the artifacts the caller attaches to each image
//! ([`Attach`]: infer-build's warm-up manifests and SBOMs are `crate::attach`'s), then read
//! every tag back.
//!
//! Every digest is uploaded at most once per push, by a bounded pool of worker threads; blobs
//! stream from the layout's files. Manifests go up children first (registries check that
//! what a manifest references exists), and a tag whose digest is already right is left alone,
//! so an unchanged re-push sends no blob bytes and no manifests.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use ureq::http::Method;

use super::client::{
    downgrade_reason, header, is_timeout, parse_range, retry_after, status_error, with_query, Body,
    Client, ClientOptions, Req, Resp, ENV_MIN_RATE, ENV_RATE_WINDOW, MAX_TIMEOUTS,
};
use super::layout::Layout;
use super::reference::{valid_tag, Reference};
use super::referrers::{self, Artifact};
use super::{media, parse_document, Error, Result};
use crate::oci::annotation::REF_NAME;
use crate::oci::image::{Descriptor, Document, EMPTY_JSON};

/// What a push attaches to the images of its layout (nothing by default; `infer_build::attach`
/// sets infer-build's warm-up manifests and SBOMs).
#[derive(Clone, Default)]
pub struct Attacher(pub(crate) Option<Arc<dyn Attach>>);

/// What a push attaches to the images of its layout, as referrers (artifact manifests whose
/// `subject` is the image): the caller's choice. The push uploads them with their blobs, lists
/// each among its image's referrers (the API, else the fallback tag) and reports them by group.
pub(crate) trait Attach: Send + Sync {
    /// The report's groups, each present in the report even when nothing was attached.
    fn groups(&self) -> &'static [&'static str];
    /// The artifacts for `image` (a per-target image manifest of `layout`: its bytes and
    /// document), each with its group.
    fn artifacts(
        &self,
        layout: &Layout,
        image: &Descriptor,
        manifest_bytes: &[u8],
        m: &Document,
    ) -> Result<Vec<(&'static str, Artifact)>>;
}
use crate::oci::Digest;

/// What a push does beyond the defaults.
#[derive(Clone)]
pub struct PushOptions {
    pub client: ClientOptions,
    /// Parallel blob uploads.
    pub jobs: usize,
    /// Blobs larger than this are sent in chunks of this size (or the registry's
    /// `OCI-Chunk-Min-Length`, whichever is larger); smaller ones in one request.
    pub chunk_size: u64,
    /// What to attach to the layout's images (nothing by default); `crate::attach`'s
    /// `Attachments::onto` sets infer-build's.
    pub attach: Attacher,
    /// Repositories of the same registry to try mounting blobs from.
    pub mount_from: Vec<String>,
    /// The file that remembers which repositories hold which blobs (for mounts); `None` =
    /// the default cache location, `registry-locations.json`
    /// under the cache root (`crate::cache`).
    pub locations_file: Option<PathBuf>,
    /// Progress events (the CLI draws them).
    pub progress: Option<Arc<dyn Fn(Progress) + Send + Sync>>,
}

impl Default for PushOptions {
    fn default() -> Self {
        PushOptions {
            client: ClientOptions::default(),
            jobs: 4,
            chunk_size: 128 << 20,
            attach: Attacher::default(),
            mount_from: Vec::new(),
            locations_file: None,
            progress: None,
        }
    }
}

/// Progress of a push.
#[derive(Debug, Clone)]
pub enum Progress {
    /// The blob will be uploaded (`size` bytes).
    BlobStart { digest: Digest, size: u64 },
    /// `bytes` more of the blob went out (retried bytes count again).
    BlobBytes { digest: Digest, bytes: u64 },
    /// The blob is in the registry: how it got there.
    BlobDone {
        digest: Digest,
        size: u64,
        how: BlobOutcome,
    },
    /// A request failed and is being retried.
    Retry { what: String, reason: String },
    /// An interrupted upload continues from `offset`, where the registry says it stands.
    Resumed { digest: Digest, offset: u64 },
    /// A manifest or tag was written (or was already right).
    Manifest {
        reference: String,
        digest: Digest,
        written: bool,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BlobOutcome {
    Uploaded,
    Mounted,
    Skipped,
}

/// The result of a push (`--json` prints it).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PushReport {
    pub registry: String,
    pub repository: String,
    /// Every tag written, with the digest the registry reports for it.
    pub tags: Vec<TagReport>,
    pub blobs: Vec<BlobReport>,
    /// The artifacts attached to the layout's images, by the attacher's groups (infer-build's:
    /// `warmup`, the warm-up manifests, and `sbom`, the SBOMs).
    #[serde(flatten)]
    pub attached: BTreeMap<String, Vec<ArtifactReport>>,
    /// Manifests of the layout that name a subject (the split layout's ModelPack manifests),
    /// listed among their subject's referrers.
    pub referrers: Vec<ArtifactReport>,
    pub blobs_uploaded: usize,
    pub blobs_mounted: usize,
    pub blobs_skipped: usize,
    /// Sizes of the blobs uploaded.
    pub bytes_uploaded: u64,
    /// Sizes of the blobs that were already there or mounted.
    pub bytes_skipped: u64,
    /// Bytes sent over the wire for blobs, retried bytes included.
    pub bytes_sent: u64,
    pub manifests_written: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TagReport {
    pub tag: String,
    pub digest: Digest,
    pub media_type: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BlobReport {
    pub digest: Digest,
    pub size: u64,
    pub outcome: BlobOutcome,
}

/// An artifact attached to an image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ArtifactReport {
    /// The per-target image manifest it is attached to.
    pub subject: Digest,
    /// The artifact manifest.
    pub digest: Digest,
    /// `referrers-api` or `fallback-tag:sha256-…`.
    pub attached_via: String,
    /// Document fields that could not be filled (e.g. no measured warm-up timings).
    pub missing: Vec<String>,
}

/// Where a blob's bytes come from.
#[derive(Debug, Clone)]
enum Source {
    /// A blob of the layout's store: checked when the push is planned (a regular file of the
    /// descriptor's size, no link followed), opened again through the store's directory handle
    /// just before it is uploaded and hashed from that handle. The path is for messages.
    Store(PathBuf),
    Bytes(Arc<Vec<u8>>),
}

#[derive(Debug, Clone)]
struct Blob {
    digest: Digest,
    size: u64,
    source: Source,
}

#[derive(Debug, Clone)]
struct ManifestItem {
    digest: Digest,
    media_type: String,
    bytes: Vec<u8>,
    tags: Vec<String>,
    /// The manifest it refers to (`subject`: the split layout's ModelPack manifest): listed
    /// among that manifest's referrers once pushed.
    subject: Option<Digest>,
}

/// Everything a push sends, read from a layout (no network).
#[derive(Debug, Default)]
struct Plan {
    blobs: BTreeMap<Digest, Blob>,
    /// Children before the indexes that list them.
    manifests: Vec<ManifestItem>,
    /// Artifacts to attach, in layout order.
    artifacts: Vec<Attached>,
}

#[derive(Debug)]
struct Attached {
    /// The attacher's group.
    group: &'static str,
    subject: Digest,
    item: ManifestItem,
    missing: Vec<String>,
}

fn tag_of(desc: &Descriptor, layout: &Layout) -> Result<Option<String>> {
    let Some(name) = desc.annotations.get(REF_NAME) else {
        return Ok(None);
    };
    // Some tools write a whole reference as the name; the tag is what follows the last `:`
    // after the last `/`.
    let tail = name.rsplit('/').next().unwrap_or(name);
    let tag = tail.rsplit(':').next().unwrap_or(tail);
    if !valid_tag(tag) {
        return Err(Error::Layout {
            path: layout.root.clone(),
            reason: format!("`{REF_NAME}` value `{name}` is not a valid tag"),
        });
    }
    Ok(Some(tag.to_string()))
}

fn plan(layout: &Layout, attach: Option<&dyn Attach>) -> Result<Plan> {
    let mut plan = Plan::default();
    let entries = layout.index()?;
    if entries.is_empty() {
        return Err(Error::Layout {
            path: layout.root.clone(),
            reason: "index.json lists no manifests".into(),
        });
    }
    for desc in &entries {
        visit(layout, desc, &mut plan, attach, 0)?;
    }
    Ok(plan)
}

fn visit(
    layout: &Layout,
    desc: &Descriptor,
    plan: &mut Plan,
    attach: Option<&dyn Attach>,
    depth: u32,
) -> Result<()> {
    if depth > 8 {
        return Err(Error::Layout {
            path: layout.root.clone(),
            reason: "indexes nested more than 8 deep".into(),
        });
    }
    let tag = tag_of(desc, layout)?;
    if let Some(existing) = plan.manifests.iter_mut().find(|m| m.digest == desc.digest) {
        if let Some(t) = tag {
            if !existing.tags.contains(&t) {
                existing.tags.push(t);
            }
        }
        return Ok(());
    }
    // A document of the layout that is corrupt or does not parse is a bad layout (exit 2).
    let as_layout = |e: Error| Error::Layout {
        path: layout.root.clone(),
        reason: e.to_string(),
    };
    let bytes = layout.read_small(desc).map_err(|e| match e {
        e @ Error::DigestMismatch { .. } => as_layout(e),
        e => e,
    })?;
    let m = parse_document(&bytes, desc.digest.as_str()).map_err(as_layout)?;
    let media_type = m
        .media_type
        .clone()
        .unwrap_or_else(|| desc.media_type.clone());
    if media::is_index(&media_type) {
        for child in &m.manifests {
            visit(layout, child, plan, attach, depth + 1)?;
        }
    } else if media::is_manifest(&media_type) {
        m.check_bounds(desc.digest.as_str())
            .map_err(|reason| Error::Layout {
                path: layout.root.clone(),
                reason,
            })?;
        // An image config is a document of the layout too: one that is not JSON is refused
        // here, as `build` and `inspect` refuse it, not pushed.
        if let Some(c) = m
            .config
            .as_ref()
            .filter(|c| c.media_type == media::CONFIG || c.media_type == media::DOCKER_CONFIG)
        {
            let config = layout.read_small(c).map_err(|e| match e {
                e @ Error::DigestMismatch { .. } => as_layout(e),
                e => e,
            })?;
            serde_json::from_slice::<serde_json::Value>(&config).map_err(|e| Error::Layout {
                path: layout.root.clone(),
                reason: format!("config {} is malformed: {e}", c.digest),
            })?;
        }
        for blob in m.config.iter().chain(m.layers.iter()) {
            if plan.blobs.contains_key(&blob.digest) {
                continue;
            }
            let path = layout.check_blob(blob)?;
            plan.blobs.insert(
                blob.digest.clone(),
                Blob {
                    digest: blob.digest.clone(),
                    size: blob.size,
                    source: Source::Store(path),
                },
            );
        }
        let is_image = m.artifact_type.is_none()
            && m.subject.is_none()
            && m.config
                .as_ref()
                .is_some_and(|c| c.media_type != media::EMPTY);
        if let Some(attach) = attach.filter(|_| is_image) {
            for (group, a) in attach.artifacts(layout, desc, &bytes, &m)? {
                plan.attach(group, desc, a);
            }
        }
    } else {
        return Err(Error::Layout {
            path: layout.root.clone(),
            reason: format!("{} has unsupported media type `{media_type}`", desc.digest),
        });
    }
    plan.manifests.push(ManifestItem {
        digest: desc.digest.clone(),
        media_type,
        bytes,
        tags: tag.into_iter().collect(),
        subject: m.subject.map(|s| s.digest),
    });
    Ok(())
}

impl Plan {
    /// Queue `w` for attaching to the image `subject`, with its blobs.
    fn attach(&mut self, group: &'static str, subject: &Descriptor, w: Artifact) {
        for (digest, payload) in [
            (w.payload_digest.clone(), w.payload),
            (Digest::of(EMPTY_JSON), EMPTY_JSON.to_vec()),
        ] {
            self.blobs.entry(digest.clone()).or_insert(Blob {
                digest,
                size: payload.len() as u64,
                source: Source::Bytes(Arc::new(payload)),
            });
        }
        self.artifacts.push(Attached {
            group,
            subject: subject.digest.clone(),
            item: ManifestItem {
                digest: w.manifest_digest,
                media_type: media::MANIFEST.into(),
                bytes: w.manifest,
                tags: Vec::new(),
                subject: None,
            },
            missing: w.missing,
        });
    }
}

/// Hash an open blob (at most its descriptor's size plus one byte) and compare with its digest.
fn verify_blob(file: &File, path: &Path, root: &Path, digest: &Digest, size: u64) -> Result<()> {
    use std::os::unix::fs::FileExt as _;
    let mut hasher = crate::oci::digest::Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    loop {
        let want = buf.len().min((size + 1 - pos) as usize);
        if want == 0 {
            break;
        }
        let n = file
            .read_at(&mut buf[..want], pos)
            .map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        pos += n as u64;
    }
    let actual = hasher.digest();
    if pos != size || &actual != digest {
        return Err(Error::Layout {
            path: root.to_path_buf(),
            reason: format!(
                "blob {digest} ({}): its content ({pos} bytes) hashes to {actual}; nothing was uploaded",
                path.display()
            ),
        });
    }
    Ok(())
}

/// registry → digest → repositories known to hold it.
type Locations = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn read_locations(path: &Path) -> Locations {
    // A missing or damaged cache only costs mounts: never fail a push over it.
    std::fs::read(path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

fn save_locations(path: &Path, registry: &str, repo: &str, digests: &[String]) {
    let mut all = read_locations(path);
    let reg = all.entry(registry.to_string()).or_default();
    for d in digests {
        let repos = reg.entry(d.clone()).or_default();
        repos.retain(|r| r != repo);
        repos.insert(0, repo.to_string());
        repos.truncate(8);
    }
    if let Some(dir) = path.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    let bytes = serde_json::to_vec(&all).unwrap_or_default();
    let _ = super::layout::write_atomic(path, &bytes);
}

/// Push the layout at `layout_dir` to `target` (`registry/repository`; a tag or digest in it
/// is ignored: tags come from the layout).
pub fn push(layout_dir: &Path, target: &Reference, opts: &PushOptions) -> Result<PushReport> {
    let layout = Layout::open(layout_dir)?;
    let plan = plan(&layout, opts.attach.0.as_deref())?;
    let client = Client::connect(target.endpoint(), opts.client.clone())?;
    let pusher = Pusher {
        client: &client,
        repo: &target.repository,
        root: &layout.root,
        store: layout.store(),
        opts,
        sent: AtomicU64::new(0),
    };

    // Blobs, in parallel.
    let locations_file = crate::cache::path(
        crate::cache::Entry::RegistryLocations,
        opts.locations_file.as_deref(),
    );
    let known = locations_file
        .as_deref()
        .map(read_locations)
        .unwrap_or_default();
    let known = known
        .get(target.registry.as_str())
        .cloned()
        .unwrap_or_default();
    let blobs: Vec<&Blob> = plan.blobs.values().collect();
    let outcomes = pusher.push_blobs(&blobs, &known)?;

    // Manifests, children first, then the warm-up artifacts.
    let mut tags = Vec::new();
    let mut written = 0;
    for m in &plan.manifests {
        if m.tags.is_empty() && pusher.put_manifest(m, m.digest.as_str())? {
            written += 1;
        }
        for tag in &m.tags {
            if pusher.put_manifest(m, tag)? {
                written += 1;
            }
            tags.push(TagReport {
                tag: tag.clone(),
                digest: m.digest.clone(),
                media_type: m.media_type.clone(),
            });
        }
    }
    // A manifest of the layout that names a subject (the ModelPack manifest names the model
    // image): listed among the subject's referrers, through the API or the fallback tag.
    let mut referrers = Vec::new();
    for m in &plan.manifests {
        if let Some(subject) = &m.subject {
            let via = pusher.attach_referrer(subject, m)?;
            referrers.push(ArtifactReport {
                subject: subject.clone(),
                digest: m.digest.clone(),
                attached_via: via,
                missing: Vec::new(),
            });
        }
    }
    let mut attached: BTreeMap<String, Vec<ArtifactReport>> = opts
        .attach
        .0
        .iter()
        .flat_map(|a| a.groups())
        .map(|g| ((*g).to_string(), Vec::new()))
        .collect();
    for a in &plan.artifacts {
        if pusher.put_manifest(&a.item, a.item.digest.as_str())? {
            written += 1;
        }
        let via = pusher.attach_referrer(&a.subject, &a.item)?;
        let report = ArtifactReport {
            subject: a.subject.clone(),
            digest: a.item.digest.clone(),
            attached_via: via,
            missing: a.missing.clone(),
        };
        attached
            .entry(a.group.to_string())
            .or_default()
            .push(report);
    }

    // Read every tag back.
    for t in &tags {
        let got = pusher.remote_digest(&t.tag)?;
        if got.as_deref() != Some(t.digest.as_str()) {
            return Err(Error::DigestMismatch {
                what: format!(
                    "{}/{}:{} read back",
                    target.registry, target.repository, t.tag
                ),
                expected: t.digest.to_string(),
                actual: got.unwrap_or_else(|| "nothing".into()),
            });
        }
    }

    if let Some(path) = &locations_file {
        let digests: Vec<String> = plan.blobs.keys().map(Digest::to_string).collect();
        save_locations(path, target.registry.as_str(), &target.repository, &digests);
    }

    let mut report = PushReport {
        registry: target.registry.to_string(),
        repository: target.repository.clone(),
        tags,
        blobs: Vec::new(),
        attached,
        referrers,
        blobs_uploaded: 0,
        blobs_mounted: 0,
        blobs_skipped: 0,
        bytes_uploaded: 0,
        bytes_skipped: 0,
        bytes_sent: pusher.sent.load(Ordering::Relaxed),
        manifests_written: written,
    };
    for (blob, outcome) in blobs.iter().zip(outcomes) {
        match outcome {
            BlobOutcome::Uploaded => {
                report.blobs_uploaded += 1;
                report.bytes_uploaded += blob.size;
            }
            BlobOutcome::Mounted => {
                report.blobs_mounted += 1;
                report.bytes_skipped += blob.size;
            }
            BlobOutcome::Skipped => {
                report.blobs_skipped += 1;
                report.bytes_skipped += blob.size;
            }
        }
        report.blobs.push(BlobReport {
            digest: blob.digest.clone(),
            size: blob.size,
            outcome,
        });
    }
    Ok(report)
}

struct Pusher<'a> {
    client: &'a Client,
    repo: &'a str,
    root: &'a Path,
    store: &'a crate::oci::store::BlobStore,
    opts: &'a PushOptions,
    sent: AtomicU64,
}

/// Why one upload step failed, and whether trying again can help.
enum StepError {
    Retry {
        reason: String,
        wait: Option<std::time::Duration>,
        /// A deadline or the minimum rate ended the try (a stall or a trickle).
        slow: bool,
    },
    Restart {
        reason: String,
    },
    Fatal(Error),
}

impl Pusher<'_> {
    fn scopes(&self, extra_pull: Option<&str>) -> Vec<String> {
        let mut s = vec![format!("repository:{}:pull,push", self.repo)];
        if let Some(src) = extra_pull {
            s.push(format!("repository:{src}:pull"));
        }
        s
    }

    fn emit(&self, p: Progress) {
        if let Some(cb) = &self.opts.progress {
            cb(p);
        }
    }

    fn push_blobs(
        &self,
        blobs: &[&Blob],
        known: &BTreeMap<String, Vec<String>>,
    ) -> Result<Vec<BlobOutcome>> {
        let next = AtomicUsize::new(0);
        let abort = AtomicBool::new(false);
        let results: Mutex<Vec<Option<Result<BlobOutcome>>>> =
            Mutex::new((0..blobs.len()).map(|_| None).collect());
        let jobs = self.opts.jobs.clamp(1, 32).min(blobs.len().max(1));
        std::thread::scope(|s| {
            for _ in 0..jobs {
                s.spawn(|| loop {
                    if abort.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(blob) = blobs.get(i) else { break };
                    let mut candidates: Vec<String> = self.opts.mount_from.clone();
                    if let Some(repos) = known.get(blob.digest.as_str()) {
                        candidates.extend(repos.iter().cloned());
                    }
                    candidates.retain(|r| r != self.repo);
                    candidates.dedup();
                    let r = self.push_blob(blob, &candidates);
                    if r.is_err() {
                        abort.store(true, Ordering::Relaxed);
                    }
                    results.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(r);
                });
            }
        });
        let results = results.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(results.len());
        for r in results {
            match r {
                Some(Ok(o)) => out.push(o),
                Some(Err(e)) => return Err(e),
                None => {}
            }
        }
        if out.len() != blobs.len() {
            return Err(Error::Protocol {
                what: "push".into(),
                reason: "a blob upload stopped without a result".into(),
            });
        }
        Ok(out)
    }

    fn blob_exists(&self, digest: &Digest, scopes: &[String]) -> Result<bool> {
        let url = self.client.url(&format!("{}/blobs/{digest}", self.repo));
        let resp = self
            .client
            .send(&Req::new(Method::HEAD, url.clone()), scopes)?;
        match resp.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            401 | 403 => Err(self.unauthorized(resp.status().as_u16(), "checking a blob")),
            s => Err(status_error(&Method::HEAD, &url, s, resp)),
        }
    }

    fn unauthorized(&self, status: u16, what: &str) -> Error {
        let what = format!("{what} in {}", self.repo);
        Error::Unauthorized {
            registry: self.client.registry().to_string(),
            status,
            what: match self.client.missing_credentials_hint() {
                Some(hint) => format!("{what} ({hint})"),
                None => what,
            },
        }
    }

    fn push_blob(&self, blob: &Blob, mount_candidates: &[String]) -> Result<BlobOutcome> {
        let scopes = self.scopes(None);
        if self.blob_exists(&blob.digest, &scopes)? {
            self.emit(Progress::BlobDone {
                digest: blob.digest.clone(),
                size: blob.size,
                how: BlobOutcome::Skipped,
            });
            return Ok(BlobOutcome::Skipped);
        }
        // Cross-repository mount: 201 = done; 202 = the registry started an upload instead.
        let mut session = None;
        for from in mount_candidates.iter().take(3) {
            let scopes = self.scopes(Some(from));
            let url = self.client.url(&format!("{}/blobs/uploads/", self.repo));
            let url = with_query(
                &with_query(&url, "mount", blob.digest.as_str()),
                "from",
                from,
            );
            let resp = self.client.send(&Req::new(Method::POST, url), &scopes)?;
            match resp.status().as_u16() {
                201 => {
                    self.emit(Progress::BlobDone {
                        digest: blob.digest.clone(),
                        size: blob.size,
                        how: BlobOutcome::Mounted,
                    });
                    return Ok(BlobOutcome::Mounted);
                }
                202 => {
                    session = self.session_from(&resp);
                    break;
                }
                _ => continue,
            }
        }
        // A file is opened only now, and its bytes leave only if they hash to the digest.
        let opened;
        let payload = match &blob.source {
            Source::Store(path) => {
                opened =
                    self.store
                        .open_blob(&blob.digest, blob.size)
                        .map_err(|e| Error::Layout {
                            path: self.root.to_path_buf(),
                            reason: e.to_string(),
                        })?;
                verify_blob(&opened, path, self.root, &blob.digest, blob.size)?;
                Payload::File(&opened)
            }
            Source::Bytes(b) => Payload::Bytes(b),
        };
        self.emit(Progress::BlobStart {
            digest: blob.digest.clone(),
            size: blob.size,
        });
        self.upload(blob, payload, session, &scopes)?;
        self.emit(Progress::BlobDone {
            digest: blob.digest.clone(),
            size: blob.size,
            how: BlobOutcome::Uploaded,
        });
        Ok(BlobOutcome::Uploaded)
    }

    fn session_from(&self, resp: &Resp) -> Option<Session> {
        let location = header(resp, "location")?;
        let min_chunk = header(resp, "oci-chunk-min-length")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
        Some(Session {
            location: self.client.resolve(location),
            offset: 0,
            min_chunk,
        })
    }

    fn start_session(&self, scopes: &[String]) -> Result<Session> {
        let url = self.client.url(&format!("{}/blobs/uploads/", self.repo));
        let resp = self
            .client
            .send(&Req::new(Method::POST, url.clone()), scopes)?;
        match resp.status().as_u16() {
            202 => self.session_from(&resp).ok_or_else(|| Error::Protocol {
                what: format!("POST {url}"),
                reason: "202 without a Location header".into(),
            }),
            401 | 403 => Err(self.unauthorized(resp.status().as_u16(), "starting an upload")),
            s => Err(status_error(&Method::POST, &url, s, resp)),
        }
    }

    /// Upload one blob through `session` (or a new one), resuming after failures from the
    /// offset the registry reports.
    fn upload(
        &self,
        blob: &Blob,
        payload: Payload,
        session: Option<Session>,
        scopes: &[String],
    ) -> Result<()> {
        let mut session = session;
        let mut failures = 0;
        // Tries ended by a deadline or the minimum rate: a registry that stalls or trickles
        // gets `MAX_TIMEOUTS` of them per blob, not `max_attempts`.
        let mut slow_tries = 0;
        loop {
            let mut s = match session.take() {
                Some(s) => s,
                None => self.start_session(scopes)?,
            };
            let step = self.send_from(blob, payload, &mut s, scopes);
            let (reason, wait, restart) = match step {
                Ok(()) => return Ok(()),
                Err(StepError::Fatal(e)) => return Err(e),
                Err(StepError::Retry { reason, wait, slow }) => {
                    if slow {
                        slow_tries += 1;
                        if slow_tries >= MAX_TIMEOUTS {
                            let (rate, window) = self.client.min_rate();
                            return Err(Error::Protocol {
                                what: format!("upload of {}", blob.digest),
                                reason: format!(
                                    "the registry stalled or took the blob slower than {rate} bytes/s over {:.1} s ({ENV_MIN_RATE}, {ENV_RATE_WINDOW}) {slow_tries} times: {reason}",
                                    window.as_secs_f64()
                                ),
                            });
                        }
                    }
                    (reason, wait, false)
                }
                Err(StepError::Restart { reason }) => (reason, None, true),
            };
            failures += 1;
            if failures >= self.client.max_attempts() {
                return Err(Error::Protocol {
                    what: format!("upload of {}", blob.digest),
                    reason: format!("gave up after {failures} tries: {reason}"),
                });
            }
            self.emit(Progress::Retry {
                what: format!("upload of {}", blob.digest),
                reason: reason.clone(),
            });
            self.client.pause(failures, wait);
            // The commit may have gone through with only its answer lost.
            if self.blob_exists(&blob.digest, scopes)? {
                return Ok(());
            }
            if !restart {
                session = self.upload_status(&s, blob.size, scopes);
                if let Some(r) = session.as_ref().filter(|r| r.offset > 0) {
                    self.emit(Progress::Resumed {
                        digest: blob.digest.clone(),
                        offset: r.offset,
                    });
                }
            }
        }
    }

    /// Ask where an interrupted upload stands: `GET <location>` → 204 + `Range: 0-<last>`.
    fn upload_status(&self, s: &Session, size: u64, scopes: &[String]) -> Option<Session> {
        let resp = self
            .client
            .send(&Req::new(Method::GET, s.location.clone()), scopes)
            .ok()?;
        if resp.status().as_u16() != 204 {
            return None;
        }
        let location = header(&resp, "location")
            .map(|l| self.client.resolve(l))
            .unwrap_or_else(|| s.location.clone());
        let offset = match header(&resp, "range") {
            // "0-0" is ambiguous (docker-registry says it for 0 and for 1 byte): start over.
            // A range past the blob is a registry that does not know what it holds: start over.
            Some(r) => match parse_range(r) {
                Some(last) if last > 0 && last < size => last + 1,
                _ => return None,
            },
            None => 0,
        };
        Some(Session {
            location,
            offset,
            min_chunk: s.min_chunk,
        })
    }

    fn classify(&self, method: &Method, url: &str, resp: Resp) -> StepError {
        let status = resp.status().as_u16();
        match status {
            408 | 429 | 500 | 502 | 503 | 504 | 416 => StepError::Retry {
                reason: format!("HTTP {status}"),
                wait: retry_after(&resp),
                slow: false,
            },
            404 => StepError::Restart {
                reason: "the registry forgot the upload session (HTTP 404)".into(),
            },
            401 | 403 => StepError::Fatal(self.unauthorized(status, "uploading a blob")),
            _ => StepError::Fatal(status_error(method, url, status, resp)),
        }
    }

    /// Send the rest of the blob from `s.offset`: one `PUT` when it fits in a chunk and
    /// nothing was sent yet, else `PATCH` chunks and a closing `PUT`.
    fn send_from(
        &self,
        blob: &Blob,
        payload: Payload,
        s: &mut Session,
        scopes: &[String],
    ) -> std::result::Result<(), StepError> {
        let chunk = self.opts.chunk_size.max(s.min_chunk).max(1);
        let progress = |n: u64| {
            self.sent.fetch_add(n, Ordering::Relaxed);
            self.emit(Progress::BlobBytes {
                digest: blob.digest.clone(),
                bytes: n,
            });
        };
        let body = |offset: u64, len: u64| -> Body {
            match payload {
                Payload::File(file) => Body::File {
                    file,
                    offset,
                    len,
                    progress: Some(&progress),
                },
                Payload::Bytes(b) => Body::Bytes(&b[offset as usize..(offset + len) as usize]),
            }
        };
        let transport = |e: ureq::Error| match e {
            // A TLS registry's location on plain HTTP: refused, not retried.
            ureq::Error::RequireHttpsOnly(why) => StepError::Fatal(Error::Protocol {
                what: format!("upload of {}", blob.digest),
                reason: downgrade_reason(why),
            }),
            e => StepError::Retry {
                slow: match &e {
                    ureq::Error::Timeout(_) => true,
                    ureq::Error::Io(io) => is_timeout(io),
                    _ => false,
                },
                reason: e.to_string(),
                wait: None,
            },
        };
        if s.offset == 0 && blob.size <= chunk {
            let url = with_query(&s.location, "digest", blob.digest.as_str());
            let req = Req::new(Method::PUT, url.clone())
                .header("content-type", "application/octet-stream")
                .body(body(0, blob.size));
            let resp = self.client.attempt(&req, scopes).map_err(transport)?;
            if let Source::Bytes(b) = &blob.source {
                self.sent.fetch_add(b.len() as u64, Ordering::Relaxed);
            }
            return match resp.status().as_u16() {
                201 => Ok(()),
                _ => Err(self.classify(&Method::PUT, &url, resp)),
            };
        }
        while s.offset < blob.size {
            let len = chunk.min(blob.size - s.offset);
            let end = s.offset + len - 1;
            let req = Req::new(Method::PATCH, s.location.clone())
                .header("content-range", format!("{}-{end}", s.offset))
                .header("content-type", "application/octet-stream")
                .body(body(s.offset, len));
            let resp = self.client.attempt(&req, scopes).map_err(transport)?;
            if resp.status().as_u16() != 202 {
                return Err(self.classify(&Method::PATCH, &s.location, resp));
            }
            if let Some(l) = header(&resp, "location") {
                s.location = self.client.resolve(l);
            }
            // A 202 accepts the whole chunk: the registry's `Range` must end at its last byte.
            // Anything short of it would have the chunk resent for a byte's progress (a blob
            // sent once per byte), anything past it skip bytes: both are refused.
            if let Some(r) = header(&resp, "range") {
                if parse_range(r) != Some(end) {
                    return Err(StepError::Fatal(Error::Protocol {
                        what: format!("upload of {}", blob.digest),
                        reason: format!(
                            "after accepting bytes {}-{end} (HTTP 202) the registry answered `Range: {}`; it must be `0-{end}`, the whole chunk",
                            s.offset,
                            r.chars().take(64).collect::<String>()
                        ),
                    }));
                }
            }
            s.offset = end + 1;
        }
        let url = with_query(&s.location, "digest", blob.digest.as_str());
        let resp = self
            .client
            .attempt(&Req::new(Method::PUT, url.clone()), scopes)
            .map_err(transport)?;
        match resp.status().as_u16() {
            201 => Ok(()),
            _ => Err(self.classify(&Method::PUT, &url, resp)),
        }
    }

    /// The digest the registry holds for a tag or digest, or `None` when it has nothing.
    fn remote_digest(&self, reference: &str) -> Result<Option<String>> {
        let url = self
            .client
            .url(&format!("{}/manifests/{reference}", self.repo));
        let req = Req::new(Method::HEAD, url.clone()).header("accept", media::ACCEPT_MANIFESTS);
        let resp = self.client.send(&req, &self.scopes(None))?;
        match resp.status().as_u16() {
            200 => Ok(header(&resp, "docker-content-digest").map(str::to_string)),
            404 => Ok(None),
            401 | 403 => Err(self.unauthorized(resp.status().as_u16(), "reading a manifest")),
            s => Err(status_error(&Method::HEAD, &url, s, resp)),
        }
    }

    /// Put a manifest under `reference` unless it is already there; true when written.
    fn put_manifest(&self, m: &ManifestItem, reference: &str) -> Result<bool> {
        if self.remote_digest(reference)?.as_deref() == Some(m.digest.as_str()) {
            self.emit(Progress::Manifest {
                reference: reference.to_string(),
                digest: m.digest.clone(),
                written: false,
            });
            return Ok(false);
        }
        self.put_manifest_raw(&m.bytes, &m.media_type, &m.digest, reference)?;
        self.emit(Progress::Manifest {
            reference: reference.to_string(),
            digest: m.digest.clone(),
            written: true,
        });
        Ok(true)
    }

    fn put_manifest_raw(
        &self,
        bytes: &[u8],
        media_type: &str,
        digest: &Digest,
        reference: &str,
    ) -> Result<Resp> {
        let url = self
            .client
            .url(&format!("{}/manifests/{reference}", self.repo));
        let req = Req::new(Method::PUT, url.clone())
            .header("content-type", media_type)
            .body(Body::Bytes(bytes));
        let resp = self.client.send(&req, &self.scopes(None))?;
        match resp.status().as_u16() {
            201 => {
                if let Some(got) = header(&resp, "docker-content-digest") {
                    if got != digest.as_str() {
                        return Err(Error::DigestMismatch {
                            what: format!("manifest {reference} stored by the registry"),
                            expected: digest.to_string(),
                            actual: got.to_string(),
                        });
                    }
                }
                Ok(resp)
            }
            401 | 403 => Err(self.unauthorized(resp.status().as_u16(), "writing a manifest")),
            s => Err(status_error(&Method::PUT, &url, s, resp)),
        }
    }

    /// Make `artifact` findable as a referrer of `subject`: through the referrers API when the
    /// registry has one, else through the fallback tag `sha256-<hex>` index.
    fn attach_referrer(&self, subject: &Digest, artifact: &ManifestItem) -> Result<String> {
        let url = self
            .client
            .url(&format!("{}/referrers/{subject}", self.repo));
        let req = Req::new(Method::GET, url).header("accept", media::INDEX);
        let resp = self.client.send(&req, &self.scopes(None))?;
        let is_index = header(&resp, "content-type").is_some_and(|c| c.starts_with(media::INDEX));
        if resp.status().as_u16() == 200 && is_index {
            return Ok("referrers-api".into());
        }
        let tag = referrers::fallback_tag(subject.as_str());
        let existing = self.get_manifest_bytes(&tag)?;
        let desc = referrers::referrer_descriptor(&artifact.bytes, &artifact.digest)?;
        if let Some((bytes, digest)) = referrers::merge_fallback(existing.as_deref(), desc)? {
            self.put_manifest_raw(&bytes, media::INDEX, &digest, &tag)?;
        }
        Ok(format!("fallback-tag:{tag}"))
    }

    fn get_manifest_bytes(&self, reference: &str) -> Result<Option<Vec<u8>>> {
        let url = self
            .client
            .url(&format!("{}/manifests/{reference}", self.repo));
        let req = Req::new(Method::GET, url.clone()).header("accept", media::ACCEPT_MANIFESTS);
        let mut resp = self.client.send(&req, &self.scopes(None))?;
        match resp.status().as_u16() {
            200 => resp
                .body_mut()
                .with_config()
                .limit(4 << 20)
                .read_to_vec()
                .map(Some)
                .map_err(|e| Error::Transport {
                    method: "GET".into(),
                    url,
                    source: Box::new(e),
                }),
            404 => Ok(None),
            s => Err(status_error(&Method::GET, &url, s, resp)),
        }
    }
}

/// The bytes of a blob being uploaded: the verified open file, or bytes made here.
#[derive(Clone, Copy)]
enum Payload<'a> {
    File(&'a File),
    Bytes(&'a [u8]),
}

#[derive(Debug, Clone)]
struct Session {
    location: String,
    offset: u64,
    min_chunk: u64,
}
