//! The OCI JSON objects infer-build writes: image config, manifest, index and descriptors.
//! Own small serde structs with `BTreeMap`s (never `HashMap`), always written through
//! [`super::cjson`]. Reading goes through the same structs (unknown fields are ignored) or,
//! for a base image's config, through `serde_json::Value` so nothing is lost.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{cjson, media, Digest, Error};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Platform {
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
}

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
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    #[serde(default)]
    pub media_type: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
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
pub struct ContainerConfig {
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
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<Digest>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
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
pub struct ImageConfig {
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
pub fn encode<T: Serialize>(what: &str, v: &T) -> Result<Vec<u8>, Error> {
    cjson::to_vec(v).map_err(|source| Error::Json {
        what: what.into(),
        source,
    })
}

pub fn decode<'a, T: Deserialize<'a>>(what: &str, bytes: &'a [u8]) -> Result<T, Error> {
    serde_json::from_slice(bytes).map_err(|source| Error::Json {
        what: what.into(),
        source,
    })
}

/// RFC 3339 UTC time of a Unix timestamp (`1970-01-01T00:00:00Z` for 0), without a clock or a
/// date crate: civil-from-days (H. Hinnant's algorithm).
pub fn rfc3339(epoch: u64) -> String {
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
