//! Pull a base image into an OCI layout: a tag resolves through its index to linux/amd64,
//! every blob is verified by digest while it streams to disk, and the resolved digest can be
//! pinned in a lock file so the next build uses exactly the same bytes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use sha2::Digest as _;
use ureq::http::Method;

use super::client::{header, status_error, Client, ClientOptions, Req};
use super::layout::{Descriptor, Layout, Manifest};
use super::reference::Reference;
use super::{lock, media, sha256_digest, Error, Result};

/// Options of a pull.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    pub client: ClientOptions,
    /// The lock file: a pinned digest is used instead of the tag, and a resolved one recorded.
    pub lock: Option<PathBuf>,
    /// Re-resolve the tag even when the lock file pins it (`--update-lock`).
    pub update_lock: bool,
    /// The platform to pick from an index (default linux/amd64).
    pub platform: Option<(String, String)>,
}

/// The result of a pull.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PulledImage {
    pub reference: String,
    /// The platform image manifest's digest (what the lock file pins).
    pub digest: String,
    /// The index the tag pointed at, when it was one.
    pub index_digest: Option<String>,
    /// The layout holding the image, under `ref_name`.
    pub layout: PathBuf,
    pub ref_name: String,
    pub bytes_downloaded: u64,
    pub blobs_reused: usize,
}

/// Pull `reference` into the layout `dest` (created when missing), with default options.
pub fn pull(reference: &str, dest: &Path) -> Result<PulledImage> {
    pull_with(reference, dest, &PullOptions::default())
}

pub fn pull_with(reference: &str, dest: &Path, opts: &PullOptions) -> Result<PulledImage> {
    let mut r = Reference::parse(reference)?;
    if r.digest.is_none() && !opts.update_lock {
        if let Some(lock_path) = &opts.lock {
            r.digest = lock::lookup(lock_path, reference)?;
        }
    }
    let layout = Layout::open_or_create(dest)?;
    let client = Client::connect(&r.registry, opts.client.clone())?;
    let scopes = vec![format!("repository:{}:pull", r.repository)];
    let (os, arch) = opts
        .platform
        .clone()
        .unwrap_or_else(|| ("linux".to_string(), "amd64".to_string()));

    let (mut bytes, mut media_type) = get_manifest(&client, &r, r.manifest_ref(), &scopes)?;
    let first_digest = sha256_digest(&bytes);
    if let Some(want) = &r.digest {
        if &first_digest != want {
            return Err(Error::DigestMismatch {
                what: format!("manifest of {r}"),
                expected: want.clone(),
                actual: first_digest,
            });
        }
    }
    let mut index_digest = None;
    if media::is_index(&media_type) {
        let index = Manifest::parse(&bytes, &first_digest)?;
        let pick = index
            .manifests
            .iter()
            .find(|d| platform_is(d, &os, &arch))
            .ok_or_else(|| Error::NotFound {
                reference: r.to_string(),
                reason: format!("the index lists no {os}/{arch} image"),
            })?;
        let want = pick.digest.clone();
        let (b, mt) = get_manifest(&client, &r, &want, &scopes)?;
        let got = sha256_digest(&b);
        if got != want {
            return Err(Error::DigestMismatch {
                what: format!("{os}/{arch} manifest of {r}"),
                expected: want,
                actual: got,
            });
        }
        index_digest = Some(first_digest.clone());
        bytes = b;
        media_type = mt;
    }
    if !media::is_manifest(&media_type) {
        return Err(Error::Protocol {
            what: r.to_string(),
            reason: format!("unsupported manifest media type `{media_type}`"),
        });
    }
    let digest = sha256_digest(&bytes);
    let manifest = Manifest::parse(&bytes, &digest)?;
    let mut downloaded = 0;
    let mut reused = 0;
    for blob in manifest.config.iter().chain(manifest.layers.iter()) {
        if layout.check_blob(blob).is_ok() {
            reused += 1;
            continue;
        }
        downloaded += fetch_blob(&client, &r, blob, &layout, &scopes)?;
    }
    layout.put_bytes(&bytes)?;
    let ref_name = r
        .tag
        .clone()
        .unwrap_or_else(|| super::warmup::fallback_tag(&digest));
    layout.set_ref(
        &ref_name,
        Descriptor {
            media_type: media_type.clone(),
            digest: digest.clone(),
            size: bytes.len() as u64,
            artifact_type: None,
            platform: Some(serde_json::json!({"os": os, "architecture": arch})),
            annotations: [(
                "org.opencontainers.image.base.name".to_string(),
                reference.to_string(),
            )]
            .into_iter()
            .collect(),
            extra: Default::default(),
        },
    )?;
    if let Some(lock_path) = &opts.lock {
        lock::record(lock_path, reference, &digest)?;
    }
    Ok(PulledImage {
        reference: reference.to_string(),
        digest,
        index_digest,
        layout: dest.to_path_buf(),
        ref_name,
        bytes_downloaded: downloaded,
        blobs_reused: reused,
    })
}

fn platform_is(d: &Descriptor, os: &str, arch: &str) -> bool {
    let p = d.platform.as_ref();
    let get = |k: &str| p.and_then(|p| p.get(k)).and_then(|v| v.as_str());
    get("os") == Some(os) && get("architecture") == Some(arch)
}

fn get_manifest(
    client: &Client,
    r: &Reference,
    reference: &str,
    scopes: &[String],
) -> Result<(Vec<u8>, String)> {
    let url = client.url(&format!("{}/manifests/{reference}", r.repository));
    let req = Req::new(Method::GET, url.clone()).header("accept", media::ACCEPT_MANIFESTS);
    let mut resp = client.send(&req, scopes)?;
    match resp.status().as_u16() {
        200 => {
            let ct = header(&resp, "content-type")
                .unwrap_or("")
                .split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            let bytes = resp
                .body_mut()
                .with_config()
                .limit(4 << 20)
                .read_to_vec()
                .map_err(|e| Error::Transport {
                    method: "GET".into(),
                    url: url.clone(),
                    source: Box::new(e),
                })?;
            // Trust the document's own mediaType over the header when it has one.
            let mt = Manifest::parse(&bytes, reference)?.media_type.unwrap_or(ct);
            Ok((bytes, mt))
        }
        404 => Err(Error::NotFound {
            reference: format!("{}/{}:{reference}", r.registry, r.repository),
            reason: "no such manifest in the registry".into(),
        }),
        401 | 403 => Err(Error::Unauthorized {
            registry: r.registry.clone(),
            status: resp.status().as_u16(),
            what: format!("pulling {}", r.repository),
        }),
        s => Err(status_error(&Method::GET, &url, s, resp)),
    }
}

/// Stream a blob to a temporary file next to its final place, hashing as it goes; rename
/// only when the digest and size match. Retries the whole blob on a broken stream.
fn fetch_blob(
    client: &Client,
    r: &Reference,
    blob: &Descriptor,
    layout: &Layout,
    scopes: &[String],
) -> Result<u64> {
    let dest = layout.blob_path(&blob.digest)?;
    let dir = dest.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let url = client.url(&format!("{}/blobs/{}", r.repository, blob.digest));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut resp = client.send(&Req::new(Method::GET, url.clone()), scopes)?;
        if resp.status().as_u16() != 200 {
            return Err(status_error(
                &Method::GET,
                &url,
                resp.status().as_u16(),
                resp,
            ));
        }
        let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| Error::io(dir, e))?;
        let mut hasher = sha2::Sha256::new();
        let mut reader = resp
            .body_mut()
            .with_config()
            .limit(blob.size.saturating_add(1))
            .reader();
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        let streamed: std::io::Result<()> = loop {
            match reader.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => {
                    hasher.update(&buf[..n]);
                    total += n as u64;
                    if let Err(e) = tmp.write_all(&buf[..n]) {
                        return Err(Error::io(tmp.path(), e));
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = streamed {
            if attempt < client.max_attempts() {
                client.pause(attempt, None);
                continue;
            }
            return Err(Error::Transport {
                method: "GET".into(),
                url,
                source: Box::new(ureq::Error::Io(e)),
            });
        }
        let actual = format!("sha256:{}", hex::encode(hasher.finalize()));
        if actual != blob.digest || total != blob.size {
            return Err(Error::DigestMismatch {
                what: format!("blob of {r} ({total} bytes, expected {})", blob.size),
                expected: blob.digest.clone(),
                actual,
            });
        }
        tmp.persist(&dest).map_err(|e| Error::io(&dest, e.error))?;
        return Ok(total);
    }
}
