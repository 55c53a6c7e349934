//! SBOMs end to end: `build` of the example recipe writes `<layout>/sbom/<target>.spdx.json`
//! (SPDX 2.3, checked field by field and, with spdx-tools installed, by its validator); `push`
//! attaches it to its image as an `application/spdx+json` referrer that `inspect --referrers`
//! and the fallback tag show; a stale SBOM is refused.

use std::path::{Path, PathBuf};

use infer_build::report::BuildOutput;
use serde_json::Value;

use super::image::tiny_static_elf;
use super::registry_support::Registry;
use super::support::{
    build_output, infer_build, python, root, sha256, sha256_file, stderr, stdout,
};

const SPDX: &str = "application/spdx+json";

/// The example recipe and model copied to a temp dir, with a stand-in runtime.
fn example() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("recipe");
    std::fs::create_dir(&r).unwrap();
    for f in ["recipe.toml", "mlp.onnx"] {
        std::fs::copy(root().join("examples/mlp").join(f), r.join(f)).unwrap();
    }
    let serve = dir.path().join("infer-serve");
    tiny_static_elf(&serve);
    (dir, r.join("recipe.toml"), serve)
}

fn build(recipe: &Path, serve: &Path, out: &Path, epoch: &str) -> BuildOutput {
    let o = infer_build()
        .arg("build")
        .arg(recipe)
        .arg("--out")
        .arg(out)
        .arg("--runtime")
        .arg(serve)
        .arg("--json")
        .env("SOURCE_DATE_EPOCH", epoch)
        .output()
        .unwrap();
    build_output(&o)
}

fn package<'a>(doc: &'a Value, id: &str) -> &'a Value {
    doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["SPDXID"] == id)
        .unwrap_or_else(|| panic!("no package {id}"))
}

/// The SPDX 2.3 fields every document, package and relationship must have, and that every
/// relationship names an element of the document.
fn check_spdx_structure(doc: &Value) {
    assert_eq!(doc["spdxVersion"], "SPDX-2.3");
    assert_eq!(doc["dataLicense"], "CC0-1.0");
    assert_eq!(doc["SPDXID"], "SPDXRef-DOCUMENT");
    assert!(!doc["name"].as_str().unwrap().is_empty());
    let ns = doc["documentNamespace"].as_str().unwrap();
    assert!(ns.starts_with("https://") && !ns.contains('#'), "{ns}");
    let created = doc["creationInfo"]["created"].as_str().unwrap();
    assert_eq!(created.len(), 20, "{created}");
    assert!(created.ends_with('Z'));
    assert!(doc["creationInfo"]["creators"][0]
        .as_str()
        .unwrap()
        .starts_with("Tool: infer-build-"));
    let id_ok = |id: &str| {
        id.strip_prefix("SPDXRef-").is_some_and(|r| {
            !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
        })
    };
    let mut ids = vec!["SPDXRef-DOCUMENT".to_string()];
    for p in doc["packages"].as_array().unwrap() {
        let id = p["SPDXID"].as_str().unwrap();
        assert!(id_ok(id), "{id}");
        assert!(!p["name"].as_str().unwrap().is_empty(), "{p}");
        assert!(p["downloadLocation"].is_string(), "{p}");
        assert_eq!(p["filesAnalyzed"], false, "{p}");
        for c in p["checksums"].as_array().into_iter().flatten() {
            assert_eq!(c["algorithm"], "SHA256");
            let v = c["checksumValue"].as_str().unwrap();
            assert!(
                v.len() == 64 && v.bytes().all(|b| b.is_ascii_hexdigit()),
                "{v}"
            );
        }
        ids.push(id.to_string());
    }
    let mut sorted = ids[1..].to_vec();
    sorted.sort();
    assert_eq!(ids[1..], sorted[..], "packages sorted by SPDXID");
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len() - 1, "SPDXIDs unique");
    let rels = doc["relationships"].as_array().unwrap();
    assert!(rels.iter().any(|r| r["spdxElementId"] == "SPDXRef-DOCUMENT"
        && r["relationshipType"] == "DESCRIBES"
        && r["relatedSpdxElement"] == "SPDXRef-Image"));
    for r in rels {
        for k in ["spdxElementId", "relatedSpdxElement"] {
            let id = r[k].as_str().unwrap();
            assert!(ids.iter().any(|x| x == id), "{k} {id} names nothing");
        }
        assert!(r["relationshipType"].is_string());
    }
}

#[test]
fn build_writes_a_deterministic_spdx_sbom_per_target() {
    let (dir, recipe, serve) = example();
    let a = build(&recipe, &serve, &dir.path().join("a"), "1700000000");
    let (targets, sboms) = (&a.targets, &a.sbom);
    assert_eq!(sboms.len(), targets.len());
    let target = &targets[0].id;
    let path = dir.path().join(format!("a/sbom/{target}.spdx.json"));
    assert_eq!(sboms[0].path, path);
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(sboms[0].digest.as_str(), sha256(&bytes));
    let doc: Value = serde_json::from_slice(&bytes).unwrap();
    check_spdx_structure(&doc);
    assert_eq!(doc["creationInfo"]["created"], "2023-11-14T22:13:20Z");

    // What it describes: the image by manifest digest, the runtime and model by content.
    let manifest = targets[0].manifest_digest.as_str();
    let image = package(&doc, "SPDXRef-Image");
    assert_eq!(image["checksums"][0]["checksumValue"], manifest[7..]);
    assert_eq!(image["primaryPackagePurpose"], "CONTAINER");
    let runtime = package(&doc, "SPDXRef-Runtime");
    assert_eq!(
        runtime["checksums"][0]["checksumValue"],
        sha256_file(&serve)
    );
    assert_eq!(runtime["packageFileName"], "/usr/local/bin/infer-serve");
    let model = package(&doc, "SPDXRef-Model");
    assert_eq!(
        model["checksums"][0]["checksumValue"],
        sha256_file(&recipe.with_file_name("mlp.onnx"))
    );
    // The CPU target went through the engine stage: the image ships its engine, which
    // replaces the model (recorded by content, not as a file of the image).
    assert!(model["packageFileName"].is_null(), "{model}");
    let engine = package(&doc, "SPDXRef-Engine");
    let file = engine["packageFileName"].as_str().unwrap();
    assert!(
        file == "/opt/infer/model/model.onnx" || file == "/opt/infer/model/model.nnef.tar",
        "{file}"
    );
    // A CPU image has no base.
    assert!(!doc["packages"].to_string().contains("SPDXRef-Base"));

    // The runtime's crates, not the builder's.
    let crates: Vec<&str> = doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["primaryPackagePurpose"] == "LIBRARY")
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for linked in ["tokio", "hyper", "serde_json", "infer-spec", "tract-onnx"] {
        assert!(crates.contains(&linked), "{linked} missing: {crates:?}");
    }
    for builder in ["clap", "ureq", "indicatif", "goblin", "infer-build"] {
        assert!(!crates.contains(&builder), "{builder} is builder-only");
    }
    let tokio = doc["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "tokio")
        .unwrap();
    assert!(tokio["externalRefs"][0]["referenceLocator"]
        .as_str()
        .unwrap()
        .starts_with("pkg:cargo/tokio@"));
    assert_eq!(tokio["checksums"][0]["algorithm"], "SHA256");

    // Same inputs, same bytes; another SOURCE_DATE_EPOCH changes `created` and the
    // namespace and nothing else.
    build(&recipe, &serve, &dir.path().join("b"), "1700000000");
    assert_eq!(
        bytes,
        std::fs::read(dir.path().join(format!("b/sbom/{target}.spdx.json"))).unwrap()
    );
    build(&recipe, &serve, &dir.path().join("c"), "1800000000");
    let mut c: Value = serde_json::from_slice(
        &std::fs::read(dir.path().join(format!("c/sbom/{target}.spdx.json"))).unwrap(),
    )
    .unwrap();
    assert_eq!(c["creationInfo"]["created"], "2027-01-15T08:00:00Z");
    assert_ne!(c["documentNamespace"], doc["documentNamespace"]);
    let mut d = doc.clone();
    for v in [&mut c, &mut d] {
        v["creationInfo"]["created"] = Value::Null;
        v["documentNamespace"] = Value::Null;
        // The image manifest carries the creation time too, so its digest changes.
        v["packages"] = Value::Array(
            v["packages"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| p["SPDXID"] != "SPDXRef-Image")
                .cloned()
                .collect(),
        );
    }
    assert_eq!(c, d);
}

/// spdx-tools (tests/requirements.txt) parses and validates the document as SPDX 2.3.
#[test]
fn py_sbom_validates_with_spdx_tools() {
    let test = "py_sbom_validates_with_spdx_tools";
    let py = python();
    let has = std::process::Command::new(&py)
        .args(["-c", "import spdx_tools"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has {
        eprintln!(
            "skipping {test}: {} has no spdx_tools (pip install -r tests/requirements.txt)",
            py.display()
        );
        return;
    }
    let (dir, recipe, serve) = example();
    let v = build(&recipe, &serve, &dir.path().join("out"), "0");
    let path = v.sbom[0].path.to_str().unwrap().to_string();
    let script = r#"
import sys
from spdx_tools.spdx.parser.parse_anything import parse_file
from spdx_tools.spdx.validation.document_validator import validate_full_spdx_document
doc = parse_file(sys.argv[1])
msgs = validate_full_spdx_document(doc, "SPDX-2.3")
for m in msgs:
    print(m.validation_message)
print(len(doc.packages), len(doc.relationships))
sys.exit(1 if msgs else 0)
"#;
    let o = std::process::Command::new(&py)
        .args(["-c", script, &path])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "spdx-tools refused {path}:\n{}{}",
        stdout(&o),
        stderr(&o)
    );
    let counts: Vec<usize> = stdout(&o)
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(counts[0] > 20 && counts[1] > counts[0], "{counts:?}");
}

#[test]
fn registry_push_attaches_the_sbom_as_a_referrer() {
    let test = "registry_push_attaches_the_sbom_as_a_referrer";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let (dir, recipe, serve) = example();
    let layout = dir.path().join("out");
    let built = build(&recipe, &serve, &layout, "0");
    let target = built.targets[0].id.clone();
    let index_tag = built.index.tag.clone();
    let image = built.targets[0].manifest_digest.to_string();
    let sbom_bytes = std::fs::read(layout.join(format!("sbom/{target}.spdx.json"))).unwrap();
    let to = format!("{}/ml/mlp", reg.addr);
    let cache = dir.path().join("cache");
    let push = |layout: &Path| {
        infer_build()
            .arg("push")
            .arg(layout)
            .args(["--to", &to, "--insecure", "--json"])
            .env("INFER_BUILD_CACHE_DIR", &cache)
            .env("DOCKER_CONFIG", cache.join("docker"))
            .env_remove("INFER_BUILD_REGISTRY")
            .env_remove("INFER_BUILD_REGISTRY_USER")
            .env_remove("INFER_BUILD_REGISTRY_PASSWORD")
            .output()
            .unwrap()
    };
    let o = push(&layout);
    assert!(o.status.success(), "{}\n{}", stderr(&o), reg.log());
    let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let sbom = report["sbom"].as_array().unwrap();
    assert_eq!(sbom.len(), 1, "{report}");
    assert_eq!(sbom[0]["subject"], image.as_str());
    assert!(
        sbom[0]["attached_via"]
            .as_str()
            .unwrap()
            .starts_with("fallback-tag"),
        "{report}"
    );
    assert_eq!(report["warmup"].as_array().unwrap().len(), 1);

    // `inspect REF --referrers` lists both artifacts, found through the fallback tag.
    let o = infer_build()
        .args([
            "inspect",
            &format!("{to}:{index_tag}"),
            "--referrers",
            "--insecure",
            "--json",
        ])
        .env("DOCKER_CONFIG", cache.join("docker"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let refs = v["images"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["digest"] == image.as_str())
        .and_then(|m| m["referrers"].as_array())
        .unwrap_or_else(|| panic!("no referrers of {image} in {v}"));
    let types: Vec<&str> = refs
        .iter()
        .map(|r| r["artifact_type"].as_str().unwrap())
        .collect();
    assert!(types.contains(&SPDX), "{v}");
    assert!(
        types.contains(&"application/vnd.infer-build.warmup.v1+json"),
        "{v}"
    );
    let art = refs.iter().find(|r| r["artifact_type"] == SPDX).unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();

    // The artifact: subject = the image, one layer = the SBOM's bytes.
    let fallback = format!("sha256-{}", &image[7..]);
    let index: Value = serde_json::from_slice(
        &reg.stored_blob(&manifest_digest_of_tag(&reg, "ml/mlp", &fallback))
            .unwrap(),
    )
    .unwrap();
    assert!(index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["digest"] == art.as_str() && m["artifactType"] == SPDX));
    let m: Value = serde_json::from_slice(&reg.stored_blob(&art).unwrap()).unwrap();
    assert_eq!(m["artifactType"], SPDX);
    assert_eq!(m["subject"]["digest"], image.as_str());
    assert_eq!(m["layers"][0]["mediaType"], SPDX);
    let layer = reg
        .stored_blob(m["layers"][0]["digest"].as_str().unwrap())
        .unwrap();
    assert_eq!(layer, sbom_bytes);

    // An SBOM that describes another image is refused before anything is sent.
    let stale = String::from_utf8(sbom_bytes)
        .unwrap()
        .replace(&image[7..], &"0".repeat(64));
    std::fs::write(layout.join(format!("sbom/{target}.spdx.json")), stale).unwrap();
    let o = push(&layout);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("rebuild the layout"), "{}", stderr(&o));
}

/// The digest a tag points at, from the registry's storage (`_manifests/tags/TAG/current/link`).
fn manifest_digest_of_tag(reg: &Registry, repo: &str, tag: &str) -> String {
    let link = reg
        .dir
        .path()
        .join("data/docker/registry/v2/repositories")
        .join(repo)
        .join("_manifests/tags")
        .join(tag)
        .join("current/link");
    std::fs::read_to_string(&link)
        .unwrap_or_else(|e| panic!("{}: {e}", link.display()))
        .trim()
        .to_string()
}
