//! The OCI image model: image config, manifest, index, descriptors and platforms, for what
//! infer-build writes and for what it reads from layouts and registries. Own small serde
//! structs with `BTreeMap`s (never `HashMap`), always written through [`super::cjson`].
//!
//! Reading goes through the same structs: a [`Descriptor`] keeps the fields it does not model
//! (`urls`, extensions) in [`Descriptor::extra`], so one copied from a registry into a layout
//! is written back whole; a base image's config is read as `serde_json::Value` so nothing is
//! lost; a document whose kind is not known yet (what a registry answers to a manifest GET) is
//! read as a [`Document`]. Digests are typed ([`Digest`]): a descriptor naming anything but a
//! well-formed sha256 digest does not parse.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{cjson, media, Digest, Error};

/// An image's platform (image-spec `image-index.md`), every field the spec defines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(
        rename = "os.version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_version: Option<String>,
    #[serde(rename = "os.features", default, skip_serializing_if = "Vec::is_empty")]
    pub os_features: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
}

impl Platform {
    pub fn new(os: &str, architecture: &str) -> Platform {
        Platform {
            architecture: architecture.into(),
            os: os.into(),
            os_version: None,
            os_features: Vec::new(),
            variant: None,
            features: Vec::new(),
        }
    }

    /// Whether this is `os`/`architecture` (any variant).
    pub fn is(&self, os: &str, architecture: &str) -> bool {
        self.os == os && self.architecture == architecture
    }
}

/// An OCI content descriptor (image-spec `descriptor.md`).

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The content itself, base64 (the empty config of artifact manifests carries `e30=`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// Fields infer-build does not model (`urls`, extensions), kept as read.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

impl Descriptor {
    pub fn new(media_type: &str, digest: Digest, size: u64) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest,
            size,
            platform: None,
            annotations: BTreeMap::new(),
            artifact_type: None,
            data: None,
            extra: BTreeMap::new(),
        }
    }

    /// Whether the descriptor is for `os`/`architecture`.
    pub(crate) fn is_platform(&self, os: &str, architecture: &str) -> bool {
        self.platform
            .as_ref()
            .is_some_and(|p| p.is(os, architecture))
    }

    /// The `org.opencontainers.image.ref.name` it is tagged with in a layout's `index.json`.
    pub fn ref_name(&self) -> Option<&str> {
        self.annotations
            .get(super::annotation::REF_NAME)
            .map(String::as_str)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// The empty JSON object `{}`: the config blob of artifact manifests.
pub(crate) const EMPTY_JSON: &[u8] = b"{}";

impl Manifest {
    /// An OCI 1.1 artifact manifest attached to `subject`: `artifactType`, the empty config
    /// (its bytes inline), the one `layer` and `annotations`. The warm-up manifest and the SBOM
    /// are both made here.
    pub fn artifact(
        subject: &Descriptor,
        artifact_type: &str,
        layer: Descriptor,
        annotations: BTreeMap<String, String>,
    ) -> Manifest {
        let mut config = Descriptor::new(
            media::EMPTY,
            Digest::of(EMPTY_JSON),
            EMPTY_JSON.len() as u64,
        );
        config.data = Some("e30=".into());
        Manifest {
            schema_version: 2,
            media_type: media::MANIFEST.into(),
            artifact_type: Some(artifact_type.into()),
            config,
            layers: vec![layer],
            subject: Some(Descriptor::new(
                &subject.media_type,
                subject.digest.clone(),
                subject.size,
            )),
            annotations,
        }
    }
}

/// A manifest or an index read before its kind is known (what a registry answers to a
/// manifest GET, a blob a layout's `index.json` points at), parsed loosely: every field
/// optional, both kinds' lists. [`Document::check_bounds`] bounds what it lists before anyone
/// walks it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Document {
    #[serde(default)]
    pub media_type: Option<String>,
    #[serde(default)]
    pub artifact_type: Option<String>,
    #[serde(default)]
    pub config: Option<Descriptor>,
    #[serde(default)]
    pub layers: Vec<Descriptor>,
    #[serde(default)]
    pub manifests: Vec<Descriptor>,
    #[serde(default)]
    pub subject: Option<Descriptor>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

/// The most manifests an index may list.
pub(crate) const MAX_INDEX_ENTRIES: usize = 1000;
/// The largest blob a descriptor may claim (1 TiB).
pub(crate) const MAX_BLOB: u64 = 1 << 40;

impl Document {
    pub(crate) fn parse(bytes: &[u8]) -> Result<Document, serde_json::Error> {
        serde_json::from_slice(bytes)
    }

    /// Its media type: its own `mediaType`, else what its shape says (`mediaType` is optional
    /// in OCI documents: an index lists manifests, an image manifest has a config).
    pub(crate) fn kind(&self) -> Option<&str> {
        match (&self.media_type, &self.config) {
            (Some(m), _) => Some(m),
            (None, _) if !self.manifests.is_empty() => Some(media::INDEX),
            (None, Some(_)) => Some(media::MANIFEST),
            (None, None) => None,
        }
    }

    /// Check the counts and sizes it claims, before anything is fetched or added up: a hostile
    /// registry or layout cannot make us walk 100k layers or overflow a total. The reason
    /// names the bound; `what` names the document in it.
    pub(crate) fn check_bounds(&self, what: &str) -> Result<(), String> {
        let max_layers = super::layout::MAX_LAYERS;
        if self.layers.len() > max_layers {
            return Err(format!(
                "{what} lists {} layers, more than the {max_layers} accepted",
                self.layers.len()
            ));
        }
        if self.manifests.len() > MAX_INDEX_ENTRIES {
            return Err(format!(
                "{what} lists {} manifests, more than the {MAX_INDEX_ENTRIES} accepted",
                self.manifests.len()
            ));
        }
        for d in self
            .config
            .iter()
            .chain(&self.layers)
            .chain(&self.manifests)
        {
            if d.size > MAX_BLOB {
                return Err(format!(
                    "{what}: {} claims {} bytes, more than the {MAX_BLOB} accepted",
                    d.digest, d.size
                ));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub media_type: String,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Index {
    pub fn new(manifests: Vec<Descriptor>) -> Index {
        Index {
            schema_version: 2,
            media_type: media::INDEX.into(),
            manifests,
            annotations: BTreeMap::new(),
        }
    }
}

/// The runnable part of an image config (image-spec `config.md`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ContainerConfig {
    #[serde(rename = "User", default, skip_serializing_if = "String::is_empty")]
    pub user: String,
    #[serde(
        rename = "ExposedPorts",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub exposed_ports: BTreeMap<String, BTreeMap<String, String>>,
    #[serde(rename = "Env", default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(rename = "Entrypoint", default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(rename = "Cmd", default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    #[serde(
        rename = "WorkingDir",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub working_dir: String,
    #[serde(rename = "Labels", default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(
        rename = "StopSignal",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub stop_signal: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct History {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub empty_layer: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ImageConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    pub architecture: String,
    pub os: String,
    #[serde(default)]
    pub config: ContainerConfig,
    pub rootfs: RootFs,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<History>,
}

/// Canonical bytes of any of these objects.
pub(crate) fn encode<T: Serialize>(what: &str, v: &T) -> Result<Vec<u8>, Error> {
    cjson::to_vec(v).map_err(|source| Error::Json {
        what: what.into(),
        source,
    })
}

pub(crate) fn decode<'a, T: Deserialize<'a>>(what: &str, bytes: &'a [u8]) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|source| Error::Json {
        what: what.into(),
        source,
    })
}

/// Parse `what` (`index.json`, `manifest sha256:…`), a document read from the layout at
/// `layout`: one that does not parse is [`Error::Malformed`], bad input naming the layout.
/// JSON is UTF-8 throughout: a byte that is not is refused even in a field nobody reads.
pub(crate) fn decode_in<'a, T: Deserialize<'a>>(
    layout: &std::path::Path,
    what: &str,
    bytes: &'a [u8],
) -> Result<T, Error> {
    let malformed = |why: String| Error::Malformed {
        layout: layout.to_path_buf(),
        what: what.into(),
        why,
    };
    let text = std::str::from_utf8(bytes).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
    serde_json::from_str(text).map_err(|e| malformed(e.to_string()))
}

/// RFC 3339 UTC time of a Unix timestamp (`1970-01-01T00:00:00Z` for 0), without a clock or a
/// date crate: civil-from-days (H. Hinnant's algorithm).
pub(crate) fn rfc3339(epoch: u64) -> String {
    let days = (epoch / 86_400) as i64;
    let secs = epoch % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn a_descriptor_read_from_elsewhere_is_written_back_whole() {
        let read = format!(
            r#"{{"annotations":{{"a":"b"}},"digest":"{D}","io.example.ext":{{"k":[1,2]}},"mediaType":"application/vnd.oci.image.manifest.v1+json","platform":{{"architecture":"arm64","features":["f"],"os":"windows","os.features":["win32k"],"os.version":"10.0.17763.1040","variant":"v8"}},"size":0,"urls":["https://example.com/x"]}}"#
        );
        let d: Descriptor = decode("descriptor", read.as_bytes()).unwrap();
        assert_eq!(d.digest, D);
        let p = d.platform.as_ref().unwrap();
        assert!(p.is("windows", "arm64") && d.is_platform("windows", "arm64"));
        assert_eq!(p.os_version.as_deref(), Some("10.0.17763.1040"));
        assert_eq!(
            d.extra.keys().collect::<Vec<_>>(),
            ["io.example.ext", "urls"]
        );
        assert_eq!(String::from_utf8(encode("d", &d).unwrap()).unwrap(), read);
    }

    #[test]
    fn documents_name_their_kind_and_refuse_what_infer_build_cannot_address() {
        let index = format!(r#"{{"manifests":[{{"mediaType":"m","digest":"{D}","size":1}}]}}"#);
        assert_eq!(
            Document::parse(index.as_bytes()).unwrap().kind(),
            Some(media::INDEX)
        );
        let image = format!(r#"{{"config":{{"mediaType":"c","digest":"{D}","size":1}}}}"#);
        assert_eq!(
            Document::parse(image.as_bytes()).unwrap().kind(),
            Some(media::MANIFEST)
        );
        assert_eq!(Document::parse(b"{}").unwrap().kind(), None);
        // A digest that is not sha256 (or not well formed) would become a file name and a
        // URL path segment: the document does not parse.
        for bad in ["sha512:00", "sha256:../../etc/passwd", "sha256:ABC"] {
            let doc = format!(r#"{{"layers":[{{"mediaType":"l","digest":"{bad}","size":1}}]}}"#);
            let e = Document::parse(doc.as_bytes()).unwrap_err().to_string();
            assert!(e.contains("digest"), "{bad}: {e}");
        }
        let huge = format!(
            r#"{{"layers":[{{"mediaType":"l","digest":"{D}","size":{}}}]}}"#,
            MAX_BLOB + 1
        );
        let e = Document::parse(huge.as_bytes())
            .unwrap()
            .check_bounds("m")
            .unwrap_err();
        assert!(e.contains("more than the 1099511627776 accepted"), "{e}");
    }

    #[test]
    fn artifact_manifests_are_canonical_oci_1_1() {
        let subject = Descriptor {
            annotations: [("x".to_string(), "y".to_string())].into(),
            ..Descriptor::new(media::MANIFEST, Digest::of(b"image"), 5)
        };
        let layer = Descriptor::new("application/x", Digest::of(b"payload"), 7);
        let m = Manifest::artifact(
            &subject,
            "application/t",
            layer,
            [("k".to_string(), "v".to_string())].into(),
        );
        // The subject is referenced by type, digest and size only; the empty config carries
        // its bytes inline.
        assert_eq!(
            String::from_utf8(encode("artifact", &m).unwrap()).unwrap(),
            format!(
                r#"{{"annotations":{{"k":"v"}},"artifactType":"application/t","config":{{"data":"e30=","digest":"{}","mediaType":"application/vnd.oci.empty.v1+json","size":2}},"layers":[{{"digest":"{}","mediaType":"application/x","size":7}}],"mediaType":"application/vnd.oci.image.manifest.v1+json","schemaVersion":2,"subject":{{"digest":"{}","mediaType":"application/vnd.oci.image.manifest.v1+json","size":5}}}}"#,
                Digest::of(EMPTY_JSON),
                Digest::of(b"payload"),
                Digest::of(b"image")
            )
        );
    }

    #[test]
    fn rfc3339_dates() {
        for (t, s) in [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_700_000_000, "2023-11-14T22:13:20Z"),
            (4_102_444_799, "2099-12-31T23:59:59Z"),
        ] {
            assert_eq!(rfc3339(t), s);
        }
    }

    #[test]
    fn config_json_is_canonical() {
        let mut c = ContainerConfig {
            user: "65532".into(),
            ..Default::default()
        };
        c.exposed_ports.insert("8000/tcp".into(), BTreeMap::new());
        let cfg = ImageConfig {
            created: Some(rfc3339(0)),
            architecture: "amd64".into(),
            os: "linux".into(),
            config: c,
            rootfs: RootFs {
                kind: "layers".into(),
                diff_ids: vec![],
            },
            history: vec![],
        };
        assert_eq!(
            String::from_utf8(encode("config", &cfg).unwrap()).unwrap(),
            r#"{"architecture":"amd64","config":{"ExposedPorts":{"8000/tcp":{}},"User":"65532"},"created":"1970-01-01T00:00:00Z","os":"linux","rootfs":{"diff_ids":[],"type":"layers"}}"#
        );
    }
}
