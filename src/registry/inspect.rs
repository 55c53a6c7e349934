//! Describe an image in a registry without pulling its layers: the manifest or index a
//! reference names, each per-target manifest's layers, sizes and annotations, and (on request)
//! what is attached to each manifest through referrers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::client::{Client, ClientOptions};
use super::reference::Reference;
use super::referrers::{self, Referrer};
use super::{get_manifest, media, parse_document, Error, Result};
use crate::oci::image::{Descriptor, Document, Platform};
use crate::oci::Digest;

/// An image (or index) in a registry.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteImage {
    pub reference: String,
    pub digest: Digest,
    pub media_type: String,
    pub annotations: BTreeMap<String, String>,
    /// One entry for a plain manifest; one per child for an index.
    pub images: Vec<RemoteManifest>,
    /// Referrers of the index itself (with `--referrers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub referrers: Option<Vec<Referrer>>,
    /// For an index: what a plain `docker pull` / containerd pull of it gets on linux/amd64.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub plain_pull: Option<PlainPull>,
}

/// What a pull that selects by platform only (`docker pull`, containerd, kubelet) gets from an
/// index: among the entries for its platform, the first in index order. infer-build writes
/// every target as `linux/amd64`, CPU first, so such a pull never selects a GPU image by GPU:
/// GPU nodes must use the per-target tag or digest.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlainPull {
    pub platform: String,
    /// How many entries have that platform.
    pub candidates: usize,
    /// The entry a plain pull gets.
    pub digest: Digest,
    /// Its `dev.infer-build.target`, when it has one.
    pub target: Option<String>,
    /// One line for people.
    pub note: String,
}

/// [`PlainPull`] for an index's entries, on linux/amd64; `None` when no entry has that
/// platform.
pub(crate) fn plain_pull(entries: &[Descriptor]) -> Option<PlainPull> {
    let matching: Vec<&Descriptor> = entries
        .iter()
        .filter(|d| d.is_platform("linux", "amd64"))
        .collect();
    let first = matching.first()?;
    let target = first
        .annotations
        .get(&format!("{}target", crate::oci::ANNOTATION_PREFIX))
        .cloned();
    let note = if matching.len() > 1 {
        format!(
            "all {} linux/amd64 entries share one platform: `docker pull` / containerd of this tag gets the first, {}{}; GPU nodes must pull their per-target tag or digest",
            matching.len(),
            first.digest,
            target.as_deref().map(|t| format!(" (target {t})")).unwrap_or_default()
        )
    } else {
        format!(
            "`docker pull` / containerd of this tag on linux/amd64 gets {}{}",
            first.digest,
            target
                .as_deref()
                .map(|t| format!(" (target {t})"))
                .unwrap_or_default()
        )
    };
    Some(PlainPull {
        platform: "linux/amd64".into(),
        candidates: matching.len(),
        digest: first.digest.clone(),
        target,
        note,
    })
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RemoteManifest {
    pub digest: Digest,
    pub media_type: String,
    pub platform: Option<Platform>,
    pub artifact_type: Option<String>,
    /// The index entry's annotations merged with the manifest's own.
    pub annotations: BTreeMap<String, String>,
    pub config: Option<Descriptor>,
    pub layers: Vec<Descriptor>,
    pub total_size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub referrers: Option<Vec<Referrer>>,
}

/// Fetch what `reference` names; with `with_referrers`, list the referrers of every manifest.
pub fn inspect(
    reference: &Reference,
    opts: &ClientOptions,
    with_referrers: bool,
) -> Result<RemoteImage> {
    let client = Client::connect(reference.endpoint(), opts.clone())?;
    let scopes = vec![format!("repository:{}:pull", reference.repository)];
    let (bytes, media_type) = get_manifest(
        &client,
        reference,
        reference.manifest_ref(),
        &scopes,
        "reading",
    )?;
    let digest = Digest::of(&bytes);
    if let Some(want) = &reference.digest {
        if want != &digest {
            return Err(Error::DigestMismatch {
                what: format!("manifest of {reference}"),
                expected: want.to_string(),
                actual: digest.to_string(),
            });
        }
    }
    let top = parse_document(&bytes, digest.as_str())?;
    let refs_of = |d: &Digest| -> Result<Option<Vec<Referrer>>> {
        if !with_referrers {
            return Ok(None);
        }
        let r = Reference {
            digest: Some(d.clone()),
            tag: None,
            ..reference.clone()
        };
        Ok(Some(referrers::referrers_with(&client, &r, d)?))
    };
    let mut images = Vec::new();
    if media::is_index(&media_type) {
        for child in &top.manifests {
            let (b, mt) = get_manifest(
                &client,
                reference,
                child.digest.as_str(),
                &scopes,
                "reading",
            )?;
            let got = Digest::of(&b);
            if got != child.digest {
                return Err(Error::DigestMismatch {
                    what: format!("manifest listed by {reference}"),
                    expected: child.digest.to_string(),
                    actual: got.to_string(),
                });
            }
            let m = parse_document(&b, child.digest.as_str())?;
            let mut annotations = child.annotations.clone();
            annotations.extend(m.annotations.clone());
            images.push(describe(
                &child.digest,
                &mt,
                child.platform.clone(),
                annotations,
                &m,
                refs_of(&child.digest)?,
            ));
        }
    } else {
        images.push(describe(
            &digest,
            &media_type,
            None,
            top.annotations.clone(),
            &top,
            refs_of(&digest)?,
        ));
    }
    let plain_pull = if media::is_index(&media_type) {
        plain_pull(&top.manifests)
    } else {
        None
    };
    Ok(RemoteImage {
        plain_pull,
        reference: reference.to_string(),
        referrers: if media::is_index(&media_type) {
            refs_of(&digest)?
        } else {
            None
        },
        digest,
        media_type,
        annotations: top.annotations,
        images,
    })
}

fn describe(
    digest: &Digest,
    media_type: &str,
    platform: Option<Platform>,
    annotations: BTreeMap<String, String>,
    m: &Document,
    referrers: Option<Vec<Referrer>>,
) -> RemoteManifest {
    RemoteManifest {
        digest: digest.clone(),
        media_type: media_type.to_string(),
        platform,
        artifact_type: m.artifact_type.clone(),
        annotations,
        config: m.config.clone(),
        // Each size is at most `MAX_BLOB` and there are at most `MAX_LAYERS`: no overflow.
        total_size: m
            .layers
            .iter()
            .chain(m.config.as_ref())
            .fold(0u64, |t, d| t.saturating_add(d.size)),
        layers: m.layers.clone(),
        referrers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(digest: char, platform: Option<(&str, &str)>, target: &str) -> Descriptor {
        let hex = digest.to_string().repeat(64);
        let mut d = Descriptor::new(
            media::MANIFEST,
            Digest::parse(&format!("sha256:{hex}")).unwrap(),
            1,
        );
        d.platform = platform.map(|(os, arch)| Platform::new(os, arch));
        d.annotations = [("dev.infer-build.target".to_string(), target.to_string())]
            .into_iter()
            .collect();
        d
    }

    #[test]
    fn a_plain_pull_gets_the_first_entry_of_its_platform() {
        let all_amd64 = [
            entry('a', Some(("linux", "amd64")), "cpu-fp32"),
            entry('b', Some(("linux", "amd64")), "sm90-fp16"),
        ];
        let p = plain_pull(&all_amd64).unwrap();
        assert_eq!((p.candidates, p.target.as_deref()), (2, Some("cpu-fp32")));
        assert!(p.note.contains("GPU nodes must pull"), "{}", p.note);
        let mixed = [
            entry('c', Some(("linux", "arm64")), "sbsa"),
            entry('d', Some(("linux", "amd64")), "sm89-fp16"),
        ];
        let p = plain_pull(&mixed).unwrap();
        assert_eq!((p.candidates, &p.digest), (1, &mixed[1].digest));
        assert!(!p.note.contains("GPU nodes must pull"));
        assert!(plain_pull(&[entry('e', None, "x")]).is_none());
    }
}
