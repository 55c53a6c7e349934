//! Artifacts attached to a manifest (OCI 1.1 referrers): how one is made ([`artifact`]), the
//! fallback tag and index of registries without the referrers API, and listing what is
//! attached. What to attach is the caller's ([`super::push::Attach`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use ureq::http::Method;

use super::client::{header, status_error, Client, ClientOptions, Req};
use super::reference::Reference;
use super::{media, parse_document, Error, Result};
use crate::oci::image::{Descriptor, Manifest};
use crate::oci::Digest;

/// An artifact ready to attach to an image: its manifest (whose `subject` is the image) and
/// its one layer's payload.
#[derive(Debug, Clone)]
pub(crate) struct Artifact {
    pub payload: Vec<u8>,
    pub payload_digest: Digest,
    pub manifest: Vec<u8>,
    pub manifest_digest: Digest,
    /// What the artifact could not say (e.g. fields the image does not carry), for the report.
    pub missing: Vec<String>,
}

/// Pure: the OCI 1.1 artifact manifest ([`Manifest::artifact`]) attached to the image
/// `subject`, whose one layer holds `payload` (of `layer_media_type`).
pub(crate) fn artifact(
    subject: &Descriptor,
    artifact_type: &str,
    layer_media_type: &str,
    payload: Vec<u8>,
    annotations: BTreeMap<String, String>,
    missing: Vec<String>,
) -> Artifact {
    let payload_digest = Digest::of(&payload);
    let layer = Descriptor::new(
        layer_media_type,
        payload_digest.clone(),
        payload.len() as u64,
    );
    let manifest = Manifest::artifact(subject, artifact_type, layer, annotations);
    // Plain strings and numbers in a struct of our own: serializing cannot fail.
    let manifest = crate::oci::image::encode("artifact manifest", &manifest).unwrap_or_default();
    Artifact {
        manifest_digest: Digest::of(&manifest),
        payload,
        payload_digest,
        manifest,
        missing,
    }
}

/// The referrers fallback tag of a digest: `sha256-<hex>`.
pub(crate) fn fallback_tag(digest: &str) -> String {
    match digest.split_once(':') {
        // By characters, not bytes: a digest read from elsewhere may not be ASCII.
        Some((alg, hex)) => format!(
            "{}-{}",
            alg.chars().take(32).collect::<String>(),
            hex.chars().take(64).collect::<String>()
        ),
        None => digest.to_string(),
    }
}

/// The descriptor of an artifact manifest as it appears in a referrers list: `artifactType`
/// and annotations copied from the manifest.
pub(crate) fn referrer_descriptor(manifest: &[u8], digest: &Digest) -> Result<Descriptor> {
    let m = parse_document(manifest, digest.as_str())?;
    let mut desc = Descriptor::new(
        m.media_type.as_deref().unwrap_or(media::MANIFEST),
        digest.clone(),
        manifest.len() as u64,
    );
    desc.artifact_type = m.artifact_type.or_else(|| m.config.map(|c| c.media_type));
    desc.annotations = m.annotations;
    Ok(desc)
}

/// Add `desc` to the fallback index `existing` (or a new one). `None` when it is already
/// listed; else the new index bytes and digest. Entries are sorted by digest so the index is
/// the same whatever order artifacts were attached in.
pub(crate) fn merge_fallback(
    existing: Option<&[u8]>,
    desc: Descriptor,
) -> Result<Option<(Vec<u8>, Digest)>> {
    let mut index: Value = match existing {
        Some(b) => serde_json::from_slice(b).map_err(|e| Error::Protocol {
            what: "referrers fallback index".into(),
            reason: format!("not JSON: {e}"),
        })?,
        None => json!({"schemaVersion": 2, "mediaType": media::INDEX, "manifests": []}),
    };
    let list = index
        .get_mut("manifests")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| Error::Protocol {
            what: "referrers fallback index".into(),
            reason: "no `manifests` list".into(),
        })?;
    if list
        .iter()
        .any(|d| d.get("digest").and_then(Value::as_str) == Some(desc.digest.as_str()))
    {
        return Ok(None);
    }
    list.push(serde_json::to_value(&desc).unwrap_or(Value::Null));
    list.sort_by(|a, b| {
        let d = |v: &Value| {
            v.get("digest")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        d(a).cmp(&d(b))
    });
    let bytes = crate::oci::cjson::value_to_vec(&index);
    let digest = Digest::of(&bytes);
    Ok(Some((bytes, digest)))
}

/// One thing attached to a manifest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Referrer {
    pub digest: Digest,
    pub media_type: String,
    pub artifact_type: Option<String>,
    pub size: u64,
    pub annotations: BTreeMap<String, String>,
    /// `referrers-api` or `fallback-tag`.
    pub source: String,
}

/// What is attached to `reference` (a tag is resolved to its digest first): the referrers
/// API when the registry has it, else the `sha256-<hex>` fallback tag.
pub fn referrers(reference: &Reference, opts: &ClientOptions) -> Result<(Digest, Vec<Referrer>)> {
    let client = Client::connect(reference.endpoint(), opts.clone())?;
    let scopes = vec![format!("repository:{}:pull", reference.repository)];
    let digest = match &reference.digest {
        Some(d) => d.clone(),
        None => {
            let url = client.url(&format!(
                "{}/manifests/{}",
                reference.repository,
                reference.manifest_ref()
            ));
            let req = Req::new(Method::HEAD, url.clone()).header("accept", media::ACCEPT_MANIFESTS);
            let resp = client.send(&req, &scopes)?;
            match resp.status().as_u16() {
                200 => header(&resp, "docker-content-digest")
                    .and_then(|d| Digest::parse(d).ok())
                    .ok_or_else(|| Error::Protocol {
                        what: format!("HEAD {url}"),
                        reason: "no Docker-Content-Digest header".into(),
                    })?,
                404 => {
                    return Err(Error::NotFound {
                        reference: reference.to_string(),
                        reason: "no such manifest in the registry".into(),
                    })
                }
                s => return Err(status_error(&Method::HEAD, &url, s, resp)),
            }
        }
    };
    let list = referrers_with(&client, reference, &digest)?;
    Ok((digest, list))
}

/// The referrers of `digest` in `reference`'s repository, through an existing client.
pub(crate) fn referrers_with(
    client: &Client,
    reference: &Reference,
    digest: &Digest,
) -> Result<Vec<Referrer>> {
    let scopes = vec![format!("repository:{}:pull", reference.repository)];
    let url = client.url(&format!("{}/referrers/{digest}", reference.repository));
    let req = Req::new(Method::GET, url).header("accept", media::INDEX);
    let mut resp = client.send(&req, &scopes)?;
    let is_index = header(&resp, "content-type").is_some_and(|c| c.starts_with(media::INDEX));
    let (bytes, source) = if resp.status().as_u16() == 200 && is_index {
        (
            resp.body_mut()
                .with_config()
                .limit(4 << 20)
                .read_to_vec()
                .unwrap_or_default(),
            "referrers-api",
        )
    } else {
        let tag = fallback_tag(digest.as_str());
        let url = client.url(&format!("{}/manifests/{tag}", reference.repository));
        let req = Req::new(Method::GET, url.clone()).header("accept", media::INDEX);
        let mut resp = client.send(&req, &scopes)?;
        match resp.status().as_u16() {
            200 => (
                resp.body_mut()
                    .with_config()
                    .limit(4 << 20)
                    .read_to_vec()
                    .map_err(|e| Error::Transport {
                        method: "GET".into(),
                        url: url.clone(),
                        source: Box::new(e),
                    })?,
                "fallback-tag",
            ),
            404 => return Ok(Vec::new()),
            s => return Err(status_error(&Method::GET, &url, s, resp)),
        }
    };
    let index = parse_document(&bytes, "referrers index")?;
    let list = index
        .manifests
        .into_iter()
        .map(|d| Referrer {
            digest: d.digest,
            media_type: d.media_type,
            artifact_type: d.artifact_type,
            size: d.size,
            annotations: d.annotations,
            source: source.to_string(),
        })
        .collect();
    Ok(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARTIFACT_TYPE: &str = "application/vnd.example.artifact.v1+json";

    fn desc(digest: &str) -> Descriptor {
        let mut d = Descriptor::new(media::MANIFEST, Digest::parse(digest).unwrap(), 10);
        d.artifact_type = Some(ARTIFACT_TYPE.into());
        d
    }

    #[test]
    fn fallback_tag_schema() {
        let hex = "ab".repeat(32);
        assert_eq!(
            fallback_tag(&format!("sha256:{hex}")),
            format!("sha256-{hex}")
        );
    }

    #[test]
    fn merge_fallback_appends_once_and_sorts() {
        let b = format!("sha256:{}", "b".repeat(64));
        let a = format!("sha256:{}", "a".repeat(64));
        let (one, _) = merge_fallback(None, desc(&b)).unwrap().unwrap();
        let (two, d2) = merge_fallback(Some(&one), desc(&a)).unwrap().unwrap();
        assert!(merge_fallback(Some(&two), desc(&b)).unwrap().is_none());
        let v: Value = serde_json::from_slice(&two).unwrap();
        assert_eq!(v["manifests"][0]["digest"], json!(a));
        assert_eq!(v["manifests"][1]["artifactType"], json!(ARTIFACT_TYPE));
        // Same set, other order: same bytes.
        let (x, _) = merge_fallback(None, desc(&a)).unwrap().unwrap();
        let (_, dx) = merge_fallback(Some(&x), desc(&b)).unwrap().unwrap();
        assert_eq!(d2, dx);
    }
}
