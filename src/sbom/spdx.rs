//! Pure SPDX 2.3 JSON rendering: values in, canonical bytes out. No clock (the caller passes
//! `created`, from `SOURCE_DATE_EPOCH`), no filesystem.
//!
//! Packages, all with `filesAnalyzed: false` (files are described as packages of purpose
//! `FILE`, so no SHA-1 is needed, only the SHA-256 the image already uses):
//!
//! | SPDXID | what | purpose |
//! |---|---|---|
//! | `SPDXRef-Image` | the per-target image, checksum = manifest digest | `CONTAINER` |
//! | `SPDXRef-Runtime` | `/usr/local/bin/infer-serve`, checksum of the binary | `APPLICATION` |
//! | `SPDXRef-Model` | the ONNX model (in the image unless an engine replaces it) | `FILE` |
//! | `SPDXRef-Engine` | the engine file, when the target ships one | `FILE` |
//! | `SPDXRef-Base` | the base image of GPU targets, checksum = its manifest digest | `CONTAINER` |
//! | `SPDXRef-Crate-<name>-<version>` | each crate of the runtime (Cargo.lock walk) | `LIBRARY` |
//!
//! Relationships: the document `DESCRIBES` the image; the image `CONTAINS` the runtime and the
//! model or engine and is `DESCENDANT_OF` the base; the engine is `GENERATED_FROM` the model;
//! the runtime and each crate `DEPENDS_ON` their lock-file dependencies. Packages are sorted by
//! SPDXID, relationships by (element, type, related element). `documentNamespace` ends in the
//! sha256 of the document rendered without it, so the same content gives the same namespace
//! and different content a different one.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::lock::Crate;
use crate::oci::Digest;

/// The SPDXID of the image package; [`super::described_image`] looks for it.
pub(crate) const IMAGE_ID: &str = "SPDXRef-Image";
const NOASSERTION: &str = "NOASSERTION";

/// The image an SBOM describes.
#[derive(Debug, Clone)]
pub(crate) struct ImageInfo {
    /// The model name (document name when there is no repository).
    pub model: String,
    pub version: String,
    pub target: String,
    /// `registry.example.com/ml/resnet50`; may be empty.
    pub repository: String,
    pub tag: String,
    /// The image manifest's digest.
    pub manifest_digest: Digest,
    pub os: String,
    pub architecture: String,
}

/// A file the image carries (or was made from).
#[derive(Debug, Clone)]
pub(crate) struct FileInfo {
    pub name: String,
    /// Path inside the image (`/opt/infer/model/model.onnx`); `None` when not in the image.
    pub path_in_image: Option<String>,
    /// Lowercase hex sha256 of its bytes.
    pub sha256: String,
    pub size: u64,
}

/// A base image: its name as recorded at build time and its manifest digest.
#[derive(Debug, Clone)]
pub(crate) struct BaseInfo {
    pub name: String,
    pub digest: Digest,
}

/// One model of the image.
#[derive(Debug, Clone)]
pub(crate) struct ModelInfo {
    /// The model's name in a bundle (its packages are `SPDXRef-Model-<name>`,
    /// `SPDXRef-Engine-<name>`); `None` for the one model of an image (`SPDXRef-Model`).
    pub bundled: Option<String>,
    pub model: FileInfo,
    /// The engine, for targets that ship one (then the model is not in the image).
    pub engine: Option<(FileInfo, String)>,
    /// Python packages that converted the model's precision before the engine build (name,
    /// version), from the engine metadata; empty when nothing was converted.
    pub converter: Vec<(String, String)>,
}

/// Everything one target's SBOM says.
#[derive(Debug, Clone)]
pub(crate) struct SbomInput {
    pub image: ImageInfo,
    pub runtime: FileInfo,
    /// The image's models: one, or a bundle's in its order.
    pub models: Vec<ModelInfo>,
    pub base: Option<BaseInfo>,
    /// The runtime's root package first, then its dependencies (see [`super::lock::closure`]).
    pub crates: Vec<Crate>,
    /// RFC 3339, seconds, `Z`.
    pub created: String,
    /// `infer-build-<version>`.
    pub tool: String,
    /// The namespace prefix (a URI); the target and a content digest are appended.
    pub namespace_base: String,
}

/// `[A-Za-z0-9.-]` only, as SPDXIDs require.
fn id_part(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

fn purl_oci(repository_or_name: &str, digest: &Digest, quals: &[(&str, &str)]) -> String {
    // The name is the last path segment, without tag or digest, lowercase.
    let last = repository_or_name
        .rsplit('/')
        .next()
        .unwrap_or(repository_or_name);
    let last = last.split('@').next().unwrap_or(last);
    let last = last.split(':').next().unwrap_or(last).to_ascii_lowercase();
    let mut q: Vec<String> = quals
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", v.replace('%', "%25").replace(' ', "%20")))
        .collect();
    q.sort();
    let mut s = format!(
        "pkg:oci/{}@sha256%3A{}",
        if last.is_empty() { "image" } else { &last },
        digest.hex()
    );
    if !q.is_empty() {
        s.push('?');
        s.push_str(&q.join("&"));
    }
    s
}

fn purl_ref(locator: String) -> Value {
    json!([{"referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": locator}])
}

fn sha256(hex: &str) -> Value {
    json!([{"algorithm": "SHA256", "checksumValue": hex}])
}

fn package(
    id: &str,
    name: &str,
    version: Option<&str>,
    purpose: &str,
) -> serde_json::Map<String, Value> {
    let mut p = serde_json::Map::new();
    p.insert("SPDXID".into(), json!(id));
    p.insert("name".into(), json!(name));
    if let Some(v) = version {
        p.insert("versionInfo".into(), json!(v));
    }
    p.insert("downloadLocation".into(), json!(NOASSERTION));
    p.insert("filesAnalyzed".into(), json!(false));
    p.insert("licenseConcluded".into(), json!(NOASSERTION));
    p.insert("licenseDeclared".into(), json!(NOASSERTION));
    p.insert("copyrightText".into(), json!(NOASSERTION));
    p.insert("primaryPackagePurpose".into(), json!(purpose));
    p
}

fn file_package(id: &str, f: &FileInfo, version: &str, comment: &str) -> Value {
    let mut p = package(id, &f.name, Some(version), "FILE");
    p.insert("checksums".into(), sha256(&f.sha256));
    if let Some(path) = &f.path_in_image {
        p.insert("packageFileName".into(), json!(path));
    }
    p.insert(
        "comment".into(),
        json!(format!("{comment}; {} bytes", f.size)),
    );
    Value::Object(p)
}

/// The SPDXIDs of the crates, unique even if two crate names map to the same ID text.
fn crate_ids(crates: &[Crate]) -> BTreeMap<(String, String), String> {
    let mut ids = BTreeMap::new();
    let mut used: BTreeMap<String, u32> = BTreeMap::new();
    for c in crates.iter().skip(1) {
        let base = format!("SPDXRef-Crate-{}-{}", id_part(&c.name), id_part(&c.version));
        let n = used.entry(base.clone()).or_insert(0);
        *n += 1;
        let id = if *n == 1 { base } else { format!("{base}-{n}") };
        ids.insert(c.key(), id);
    }
    if let Some(root) = crates.first() {
        ids.insert(root.key(), "SPDXRef-Runtime".to_string());
    }
    ids
}

/// The SPDX document as a JSON value (namespace included).
#[allow(
    clippy::too_many_lines,
    reason = "one SPDX document, written in the order of its JSON"
)]
pub(crate) fn render(input: &SbomInput) -> Value {
    let img = &input.image;
    let image_name = if img.repository.is_empty() {
        format!("{}:{}", img.model, img.tag)
    } else {
        format!("{}:{}", img.repository, img.tag)
    };
    let mut packages: Vec<Value> = Vec::new();
    let mut rels: Vec<(String, &'static str, String)> = Vec::new();

    let mut p = package(
        IMAGE_ID,
        &image_name,
        Some(img.version.as_str()),
        "CONTAINER",
    );
    p.insert("checksums".into(), sha256(img.manifest_digest.hex()));
    let repo = if img.repository.is_empty() {
        img.model.as_str()
    } else {
        img.repository.as_str()
    };
    p.insert(
        "externalRefs".into(),
        purl_ref(purl_oci(
            repo,
            &img.manifest_digest,
            &[
                ("arch", img.architecture.as_str()),
                ("os", img.os.as_str()),
                ("repository_url", img.repository.as_str()),
                ("tag", img.tag.as_str()),
            ],
        )),
    );
    p.insert(
        "comment".into(),
        json!(format!("infer-build target `{}`", img.target)),
    );
    packages.push(Value::Object(p));
    rels.push(("SPDXRef-DOCUMENT".into(), "DESCRIBES", IMAGE_ID.into()));

    // The runtime: the lock file's root package, with the binary's checksum.
    let ids = crate_ids(&input.crates);
    let runtime_version = input
        .crates
        .first()
        .map(|c| c.version.clone())
        .unwrap_or_else(|| NOASSERTION.into());
    let mut p = package(
        "SPDXRef-Runtime",
        &input.runtime.name,
        Some(runtime_version.as_str()),
        "APPLICATION",
    );
    p.insert("checksums".into(), sha256(&input.runtime.sha256));
    if let Some(path) = &input.runtime.path_in_image {
        p.insert("packageFileName".into(), json!(path));
    }
    p.insert(
        "externalRefs".into(),
        purl_ref(format!(
            "pkg:cargo/{}@{}",
            input.runtime.name, runtime_version
        )),
    );
    p.insert(
        "comment".into(),
        json!(format!(
            "the inference server every image starts; {} bytes",
            input.runtime.size
        )),
    );
    packages.push(Value::Object(p));
    rels.push((IMAGE_ID.into(), "CONTAINS", "SPDXRef-Runtime".into()));

    let mut converters = std::collections::BTreeSet::new();
    for m in &input.models {
        let (model_id, engine_id) = match &m.bundled {
            None => ("SPDXRef-Model".to_string(), "SPDXRef-Engine".to_string()),
            Some(name) => (
                format!("SPDXRef-Model-{}", id_part(name)),
                format!("SPDXRef-Engine-{}", id_part(name)),
            ),
        };
        packages.push(file_package(
            &model_id,
            &m.model,
            &img.version,
            "ONNX model",
        ));
        match &m.engine {
            Some((engine, kind)) => {
                packages.push(file_package(
                    &engine_id,
                    engine,
                    &img.version,
                    &format!("{kind} engine built from the ONNX model"),
                ));
                rels.push((IMAGE_ID.into(), "CONTAINS", engine_id.clone()));
                rels.push((engine_id.clone(), "GENERATED_FROM", model_id.clone()));
            }
            None => rels.push((IMAGE_ID.into(), "CONTAINS", model_id.clone())),
        }
        for (name, version) in &m.converter {
            let id = format!("SPDXRef-Converter-{}", id_part(name));
            // Models of a bundle converted by the same package share its one package.
            if converters.insert(id.clone()) {
                let mut p = package(&id, name, Some(version), "APPLICATION");
                p.insert(
                    "externalRefs".into(),
                    purl_ref(format!(
                        "pkg:pypi/{}@{}",
                        name.to_ascii_lowercase(),
                        version
                    )),
                );
                p.insert(
                    "comment".into(),
                    json!("converted the model's precision before the engine build (not in the image)"),
                );
                packages.push(Value::Object(p));
            }
            let of = if m.engine.is_some() {
                &engine_id
            } else {
                &model_id
            };
            rels.push((id, "BUILD_TOOL_OF", of.clone()));
        }
    }

    if let Some(b) = &input.base {
        let mut p = package("SPDXRef-Base", &b.name, None, "CONTAINER");
        p.insert("checksums".into(), sha256(b.digest.hex()));
        p.insert(
            "externalRefs".into(),
            purl_ref(purl_oci(&b.name, &b.digest, &[])),
        );
        p.insert("comment".into(), json!("the base image of this target"));
        packages.push(Value::Object(p));
        rels.push((IMAGE_ID.into(), "DESCENDANT_OF", "SPDXRef-Base".into()));
    }

    for c in &input.crates {
        let Some(id) = ids.get(&c.key()) else {
            continue;
        };
        for d in &c.deps {
            if let Some(to) = ids.get(d) {
                rels.push((id.clone(), "DEPENDS_ON", to.clone()));
            }
        }
        if id == "SPDXRef-Runtime" {
            continue;
        }
        let mut p = package(id, &c.name, Some(c.version.as_str()), "LIBRARY");
        if c.is_from_crates_io() {
            p.insert(
                "downloadLocation".into(),
                json!(format!(
                    "https://crates.io/api/v1/crates/{}/{}/download",
                    c.name, c.version
                )),
            );
        }
        if let Some(sum) = c
            .checksum
            .as_deref()
            .filter(|s| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            p.insert("checksums".into(), sha256(&sum.to_ascii_lowercase()));
        }
        p.insert(
            "externalRefs".into(),
            purl_ref(format!("pkg:cargo/{}@{}", c.name, c.version)),
        );
        packages.push(Value::Object(p));
    }

    packages.sort_by(|a, b| a["SPDXID"].as_str().cmp(&b["SPDXID"].as_str()));
    rels.sort();
    rels.dedup();
    let relationships: Vec<Value> = rels
        .iter()
        .map(
            |(a, t, b)| json!({"spdxElementId": a, "relationshipType": t, "relatedSpdxElement": b}),
        )
        .collect();

    let mut doc = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": image_name,
        "creationInfo": {
            "created": input.created,
            "creators": [format!("Tool: {}", input.tool)],
        },
        "comment": "Crates: the runtime's Cargo.lock dependency graph walked from the infer-serve package, workspace dev-dependencies removed. A lock file lists dependencies for every feature and platform, so this is a superset of what the binary links (e.g. crates for other operating systems and build scripts). Licenses are not asserted.",
        "packages": packages,
        "relationships": relationships,
    });
    let digest = crate::oci::Digest::of(&crate::oci::cjson::value_to_vec(&doc))
        .hex()
        .to_string();
    doc["documentNamespace"] = json!(format!(
        "{}/{}/{}-{digest}",
        input.namespace_base.trim_end_matches('/'),
        id_part(&img.model),
        id_part(&img.target)
    ));
    doc
}

/// The document's bytes: canonical JSON (sorted keys, no insignificant whitespace).
pub(crate) fn to_bytes(input: &SbomInput) -> Vec<u8> {
    crate::oci::cjson::value_to_vec(&render(input))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input() -> SbomInput {
        let c = |n: &str, v: &str, deps: &[(&str, &str)]| Crate {
            name: n.into(),
            version: v.into(),
            source: Some("registry+https://github.com/rust-lang/crates.io-index".into()),
            checksum: Some("ab".repeat(32)),
            deps: deps
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        };
        let mut root = c(
            "infer-serve",
            "0.1.0",
            &[("tokio", "1.0.0"), ("foo_bar", "2.0.0")],
        );
        root.source = None;
        root.checksum = None;
        SbomInput {
            image: ImageInfo {
                model: "mlp".into(),
                version: "1.0.0".into(),
                target: "cpu".into(),
                repository: "localhost/infer-build/mlp".into(),
                tag: "1.0.0-cpu".into(),
                manifest_digest: Digest::parse(&format!("sha256:{}", "c".repeat(64))).unwrap(),
                os: "linux".into(),
                architecture: "amd64".into(),
            },
            runtime: FileInfo {
                name: "infer-serve".into(),
                path_in_image: Some("/usr/local/bin/infer-serve".into()),
                sha256: "d".repeat(64),
                size: 10,
            },
            models: vec![ModelInfo {
                bundled: None,
                model: FileInfo {
                    name: "mlp.onnx".into(),
                    path_in_image: Some("/opt/infer/model/model.onnx".into()),
                    sha256: "e".repeat(64),
                    size: 5,
                },
                engine: None,
                converter: vec![],
            }],
            base: None,
            crates: vec![
                root,
                c("foo_bar", "2.0.0", &[]),
                c("tokio", "1.0.0", &[("foo_bar", "2.0.0")]),
            ],
            created: "1970-01-01T00:00:00Z".into(),
            tool: "infer-build-0.1.0".into(),
            namespace_base: "https://example.com/spdx".into(),
        }
    }

    fn ids(doc: &Value) -> Vec<String> {
        doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["SPDXID"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn structure_of_a_cpu_image() {
        let doc = render(&input());
        assert_eq!(doc["spdxVersion"], "SPDX-2.3");
        assert_eq!(doc["dataLicense"], "CC0-1.0");
        assert_eq!(doc["SPDXID"], "SPDXRef-DOCUMENT");
        assert_eq!(doc["creationInfo"]["created"], "1970-01-01T00:00:00Z");
        assert_eq!(
            ids(&doc),
            [
                "SPDXRef-Crate-foo-bar-2.0.0",
                "SPDXRef-Crate-tokio-1.0.0",
                "SPDXRef-Image",
                "SPDXRef-Model",
                "SPDXRef-Runtime"
            ]
        );
        let rels: Vec<String> = doc["relationships"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{} {} {}",
                    r["spdxElementId"].as_str().unwrap(),
                    r["relationshipType"].as_str().unwrap(),
                    r["relatedSpdxElement"].as_str().unwrap()
                )
            })
            .collect();
        let mut sorted = rels.clone();
        sorted.sort();
        assert_eq!(rels, sorted);
        for want in [
            "SPDXRef-DOCUMENT DESCRIBES SPDXRef-Image",
            "SPDXRef-Image CONTAINS SPDXRef-Model",
            "SPDXRef-Image CONTAINS SPDXRef-Runtime",
            "SPDXRef-Runtime DEPENDS_ON SPDXRef-Crate-tokio-1.0.0",
            "SPDXRef-Crate-tokio-1.0.0 DEPENDS_ON SPDXRef-Crate-foo-bar-2.0.0",
        ] {
            assert!(rels.iter().any(|r| r == want), "{want} not in {rels:?}");
        }
        // Every relationship names packages that exist.
        let all = ids(&doc);
        for r in doc["relationships"].as_array().unwrap() {
            for k in ["spdxElementId", "relatedSpdxElement"] {
                let id = r[k].as_str().unwrap();
                assert!(
                    id == "SPDXRef-DOCUMENT" || all.iter().any(|x| x == id),
                    "{id}"
                );
            }
        }
        let image = &doc["packages"][2];
        assert_eq!(image["checksums"][0]["checksumValue"], "c".repeat(64));
        assert_eq!(
            image["externalRefs"][0]["referenceLocator"],
            format!(
                "pkg:oci/mlp@sha256%3A{}?arch=amd64&os=linux&repository_url=localhost/infer-build/mlp&tag=1.0.0-cpu",
                "c".repeat(64)
            )
        );
        let tokio = &doc["packages"][1];
        assert_eq!(
            tokio["externalRefs"][0]["referenceLocator"],
            "pkg:cargo/tokio@1.0.0"
        );
        assert_eq!(
            tokio["downloadLocation"],
            "https://crates.io/api/v1/crates/tokio/1.0.0/download"
        );
        assert_eq!(
            doc["packages"][4]["checksums"][0]["checksumValue"],
            "d".repeat(64)
        );
        assert!(doc["documentNamespace"]
            .as_str()
            .unwrap()
            .starts_with("https://example.com/spdx/mlp/cpu-"));
    }

    #[test]
    fn deterministic_and_content_addressed() {
        let a = to_bytes(&input());
        assert_eq!(a, to_bytes(&input()));
        // Shuffled crate order (root still first) gives the same bytes.
        let mut shuffled = input();
        shuffled.crates.swap(1, 2);
        assert_eq!(a, to_bytes(&shuffled));
        // Another model digest: another namespace.
        let mut other = input();
        other.models[0].model.sha256 = "f".repeat(64);
        let ns = |b: &[u8]| {
            serde_json::from_slice::<Value>(b).unwrap()["documentNamespace"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_ne!(ns(&a), ns(&to_bytes(&other)));
        // Only SOURCE_DATE_EPOCH's value changes `created`.
        let mut later = input();
        later.created = "2024-01-01T00:00:00Z".into();
        assert_ne!(a, to_bytes(&later));
    }

    #[test]
    fn gpu_image_with_engine_and_base() {
        let mut i = input();
        i.models[0].model.path_in_image = None;
        i.models[0].engine = Some((
            FileInfo {
                name: "engine.plan".into(),
                path_in_image: Some("/opt/infer/model/engine.plan".into()),
                sha256: "1".repeat(64),
                size: 7,
            },
            "TensorRT".into(),
        ));
        i.base = Some(BaseInfo {
            name: "nvcr.io/nvidia/cuda:12.8.0-runtime-ubuntu24.04".into(),
            digest: Digest::parse(&format!("sha256:{}", "2".repeat(64))).unwrap(),
        });
        let doc = render(&i);
        let rels = doc["relationships"].to_string();
        assert!(rels.contains(r#""relatedSpdxElement":"SPDXRef-Base","relationshipType":"DESCENDANT_OF","spdxElementId":"SPDXRef-Image""#), "{rels}");
        assert!(rels.contains(r#""relatedSpdxElement":"SPDXRef-Model","relationshipType":"GENERATED_FROM","spdxElementId":"SPDXRef-Engine""#));
        assert!(
            !rels.contains(r#""relatedSpdxElement":"SPDXRef-Model","relationshipType":"CONTAINS""#)
        );
        let base = doc["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["SPDXID"] == "SPDXRef-Base")
            .unwrap();
        assert_eq!(
            base["externalRefs"][0]["referenceLocator"],
            format!("pkg:oci/cuda@sha256%3A{}", "2".repeat(64))
        );
    }

    #[test]
    fn converter_packages_are_build_tools_of_the_model() {
        let mut i = input();
        i.models[0].converter = vec![
            ("onnxruntime".into(), "1.32.0".into()),
            ("onnxconverter-common".into(), "1.16.0".into()),
        ];
        let doc = render(&i);
        let ids = ids(&doc);
        assert!(
            ids.contains(&"SPDXRef-Converter-onnxruntime".to_string()),
            "{ids:?}"
        );
        let rels = doc["relationships"].to_string();
        assert!(
            rels.contains("\"spdxElementId\":\"SPDXRef-Converter-onnxconverter-common\"")
                && rels.contains("BUILD_TOOL_OF"),
            "{rels}"
        );
        assert!(doc.to_string().contains("pkg:pypi/onnxruntime@1.32.0"));
        // Without a conversion the document is unchanged.
        assert_eq!(
            render(&input()),
            render(&{
                let mut j = input();
                j.models[0].converter.clear();
                j
            })
        );
    }
}
