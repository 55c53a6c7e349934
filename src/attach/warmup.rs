//! The warm-up artifact attached to every per-target image.
//!
//! The artifact is an OCI 1.1 image manifest with `artifactType`
//! `application/vnd.infer-build.warmup.v1+json`, the empty config descriptor and `subject` =
//! the per-target image manifest. Its one layer is a JSON document (schema
//! `infer-build.warmup/v1`) with the image digest, the warm-up requests (from the image's
//! `/etc/infer/runtime.toml`), start-up timings measured at build time (from
//! `dev.infer-build.startup.*` annotations, when the build recorded them), the compatibility
//! tuple (the image's `dev.infer-build.*` annotations), a node selector for pre-pulling and
//! the ports the server answers on (HTTP and gRPC).
//! Building it is pure apart from reading the layout; every byte is canonical JSON.

use std::collections::BTreeMap;
use std::io::Read;

use serde_json::{json, Value};

use super::media;
use crate::oci::image::{Descriptor, Document};
use crate::oci::ANNOTATION_PREFIX;
use crate::registry::layout::Layout;
use crate::registry::referrers::{artifact, Artifact};
use crate::registry::{Error, Result};

/// Where the runtime configuration lives in an image.
pub(crate) const RUNTIME_CONFIG_PATH: &str = "etc/infer/runtime.toml";
/// Annotations under this prefix are start-up timings measured at build time (milliseconds).
pub(crate) const STARTUP_PREFIX: &str = "dev.infer-build.startup.";
/// Layers bigger than this are not searched for `runtime.toml` (it sits in a small top layer).
const MAX_SCAN_LAYER: u64 = 64 << 20;

/// Build the warm-up artifact for the image manifest `desc` (bytes `manifest_bytes`).
pub(crate) fn for_image(
    layout: &Layout,
    desc: &Descriptor,
    manifest_bytes: &[u8],
    m: &Document,
) -> Result<Artifact> {
    let config: Value = match &m.config {
        Some(c) => serde_json::from_slice(&layout.read_small(c)?).unwrap_or(Value::Null),
        None => Value::Null,
    };
    // A split layout's model image carries its model's `runtime.toml` at its root.
    let part = m.annotations.get(crate::assemble::split::PART_ANNOTATION);
    let path = match part.map(String::as_str) {
        Some("model") => infer_spec::runtime::MODEL_CONFIG_FILE,
        _ => RUNTIME_CONFIG_PATH,
    };
    let runtime = find_runtime_config(layout, m, path)?;
    let models = match runtime.as_deref().and_then(bundle_dirs) {
        Some(dirs) => find_model_configs(layout, m, &dirs)?,
        None => Vec::new(),
    };
    Ok(build(
        desc,
        manifest_bytes,
        m,
        &config,
        runtime.as_deref(),
        &models,
    ))
}

/// The model directories a bundle's `runtime.toml` names (without the leading `/`); `None`
/// for a one-model config (or one that does not parse: its requests say why).
fn bundle_dirs(text: &str) -> Option<Vec<String>> {
    let v: toml::Value = toml::from_str(text).ok()?;
    let models = v.get("models")?.as_array()?;
    Some(
        models
            .iter()
            .filter_map(|m| m.get("path")?.as_str())
            .map(|p| p.trim_start_matches('/').trim_end_matches('/').to_string())
            .collect(),
    )
}

/// Pure: the warm-up document and its artifact manifest. `models` is a bundle's: each model
/// directory named by `runtime_toml` with its own `runtime.toml` when the image has it (empty
/// for a one-model image).
pub(crate) fn build(
    desc: &Descriptor,
    manifest_bytes: &[u8],
    m: &Document,
    config: &Value,
    runtime_toml: Option<&str>,
    models: &[(String, Option<String>)],
) -> Artifact {
    let mut missing = Vec::new();
    // The tuple: the image's own annotations, then the index entry's, then config labels.
    let mut annotations: BTreeMap<String, String> = BTreeMap::new();
    if let Some(labels) = config.pointer("/config/Labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Some(s) = v.as_str() {
                annotations.insert(k.clone(), s.to_string());
            }
        }
    }
    annotations.extend(desc.annotations.clone());
    annotations.extend(m.annotations.clone());
    let tuple: BTreeMap<&String, &String> = annotations
        .iter()
        .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX) && !k.starts_with(STARTUP_PREFIX))
        .collect();
    let timings: BTreeMap<String, Value> = annotations
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix(STARTUP_PREFIX)?;
            let n = v.parse::<f64>().ok()?;
            Some((name.to_string(), json!(n)))
        })
        .collect();
    if timings.is_empty() {
        missing.push(format!(
            "startup_timings: the image has no `{STARTUP_PREFIX}*` annotations (not measured at build time)"
        ));
    }
    if tuple.is_empty() {
        missing.push(format!(
            "compatibility: the image has no `{ANNOTATION_PREFIX}*` annotations"
        ));
    }

    let requests = match runtime_toml.map(warmup_requests) {
        // A bundle: one request set per model, in the order the server loads them.
        Some(_) if !models.is_empty() => Value::Array(
            models
                .iter()
                .map(|(dir, text)| match text.as_deref().map(warmup_requests) {
                    Some(Ok(r)) => r,
                    Some(Err(reason)) => {
                        missing.push(format!("requests: /{dir}/runtime.toml: {reason}"));
                        Value::Null
                    }
                    None => {
                        missing.push(format!("requests: the image has no /{dir}/runtime.toml"));
                        Value::Null
                    }
                })
                .collect(),
        ),
        Some(Ok(r)) => r,
        Some(Err(reason)) => {
            missing.push(format!("requests: /{RUNTIME_CONFIG_PATH}: {reason}"));
            Value::Null
        }
        None => {
            missing.push(format!("requests: the image has no /{RUNTIME_CONFIG_PATH}"));
            Value::Null
        }
    };

    let doc = json!({
        "schema": "infer-build.warmup/v1",
        "image": {"digest": desc.digest, "mediaType": desc.media_type, "size": manifest_bytes.len()},
        "requests": requests,
        "startup_timings_ms": if timings.is_empty() { Value::Null } else { json!(timings) },
        "compatibility": tuple,
        "node_selector": node_selector(config, &annotations),
        "ports": ports(runtime_toml),
        "missing": missing,
    });
    let payload = crate::oci::cjson::value_to_vec(&doc);
    let annotations = BTreeMap::from([
        (
            crate::oci::annotation::TITLE.to_string(),
            "warm-up manifest".to_string(),
        ),
        (
            "dev.infer-build.warmup.subject".to_string(),
            desc.digest.to_string(),
        ),
    ]);
    artifact(
        desc,
        media::WARMUP_ARTIFACT,
        media::WARMUP_LAYER,
        payload,
        annotations,
        missing,
    )
}

/// The ports infer-serve answers on in the image: HTTP (`[server] port` of its `runtime.toml`,
/// 8000 by default) and gRPC (8001 unless the deployment sets `INFER_GRPC_PORT`).
fn ports(runtime_toml: Option<&str>) -> Value {
    let http = runtime_toml
        .and_then(|t| toml::from_str::<toml::Value>(t).ok())
        .and_then(|v| v.get("server")?.get("port")?.as_integer())
        .and_then(|p| u16::try_from(p).ok())
        .unwrap_or(infer_spec::runtime::DEFAULT_HTTP_PORT);
    json!({"http": http, "grpc": infer_spec::runtime::DEFAULT_GRPC_PORT})
}

/// The warm-up requests from `runtime.toml`: the model, its inputs and the batch sizes that
/// warm-up runs, by the runtime's own rule ([`infer_spec::Warmup::sizes`]). The file is read
/// loosely (only the keys used here), so an image from another version still gets a manifest.
fn warmup_requests(text: &str) -> std::result::Result<Value, String> {
    let v: toml::Value =
        toml::from_str(text).map_err(|e| format!("not valid TOML: {}", e.message()))?;
    let v = serde_json::to_value(v).map_err(|e| e.to_string())?;
    let u32s = |ptr: &str| -> Option<Vec<u32>> {
        let list = v.pointer(ptr)?.as_array()?;
        Some(
            list.iter()
                .filter_map(|x| u32::try_from(x.as_u64()?).ok())
                .collect(),
        )
    };
    let batching = infer_spec::Batching {
        max_batch_size: v
            .pointer("/batching/max_batch_size")
            .and_then(Value::as_u64)
            .and_then(|m| u32::try_from(m).ok())
            .unwrap_or(1)
            .max(1),
        preferred_batch_sizes: u32s("/batching/preferred_batch_sizes").unwrap_or_default(),
        ..infer_spec::Batching::default()
    };
    let warmup = infer_spec::Warmup {
        batch_sizes: u32s("/warmup/batch_sizes"),
        samples: None,
    };
    let sizes = warmup.sizes(&batching);
    Ok(json!({
        "model": v.get("model").cloned().unwrap_or(Value::Null),
        "inputs": v.get("inputs").cloned().unwrap_or(Value::Null),
        "batch_sizes": sizes,
    }))
}

/// Kubernetes node labels a pre-pull DaemonSet selects on: OS/arch from the config, GPU
/// compute capability from a `dev.infer-build.sm` annotation (`90`, `sm_90`, `sm90`, `8.9`).
fn node_selector(
    config: &Value,
    annotations: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut sel = BTreeMap::new();
    if let Some(os) = config.get("os").and_then(Value::as_str) {
        sel.insert("kubernetes.io/os".to_string(), os.to_string());
    }
    if let Some(arch) = config.get("architecture").and_then(Value::as_str) {
        sel.insert("kubernetes.io/arch".to_string(), arch.to_string());
    }
    let sm = annotations
        .iter()
        .find(|(k, _)| {
            k.starts_with(ANNOTATION_PREFIX)
                && (k.ends_with(".sm") || k.ends_with(".compute-capability"))
        })
        .map(|(_, v)| {
            v.trim()
                .trim_start_matches("sm_")
                .trim_start_matches("sm")
                .to_string()
        });
    if let Some(sm) = sm {
        let (major, minor) = match sm.split_once('.') {
            Some((a, b)) => (a.to_string(), b.to_string()),
            None if sm.len() >= 2 => (
                sm[..sm.len() - 1].to_string(),
                sm[sm.len() - 1..].to_string(),
            ),
            None => (String::new(), String::new()),
        };
        if !major.is_empty()
            && major.bytes().all(|b| b.is_ascii_digit())
            && minor.bytes().all(|b| b.is_ascii_digit())
        {
            sel.insert("nvidia.com/gpu.compute.major".into(), major);
            sel.insert("nvidia.com/gpu.compute.minor".into(), minor);
        }
    }
    sel
}

/// Each bundle model's `runtime.toml` (`dirs`: the model directories, in order), from the
/// model layers (`model:<name>` or `engine:<name>`, read in full: a model's config sits after
/// its weights), `None` where the image has none.
fn find_model_configs(
    layout: &Layout,
    m: &Document,
    dirs: &[String],
) -> Result<Vec<(String, Option<String>)>> {
    let mut found: BTreeMap<String, String> = BTreeMap::new();
    for layer in &m.layers {
        let role = layer
            .annotations
            .get("dev.infer-build.layer")
            .map_or("", String::as_str);
        if !(role.starts_with("model:") || role.starts_with("engine:")) {
            continue;
        }
        let hit = text_in_layer(layout, layer, |name| {
            let dir = name.strip_suffix("/runtime.toml")?;
            (dirs.iter().any(|d| d == dir) && !found.contains_key(dir)).then(|| dir.to_string())
        })?;
        if let Some((dir, text)) = hit {
            found.insert(dir, text);
        }
    }
    Ok(dirs.iter().map(|d| (d.clone(), found.remove(d))).collect())
}

/// Look for `path` (a `runtime.toml`) in the image's small layers, top layer first.
fn find_runtime_config(layout: &Layout, m: &Document, path: &str) -> Result<Option<String>> {
    for layer in m.layers.iter().rev() {
        if layer.size > MAX_SCAN_LAYER {
            continue;
        }
        let hit = text_in_layer(layout, layer, |name| (name == path).then_some(()))?;
        if let Some(((), text)) = hit {
            return Ok(Some(text));
        }
    }
    Ok(None)
}

/// The first file of `layer` that `wanted` picks (given its path without a leading `./` or
/// `/`), read as text (at most 1 MiB), with what `wanted` said of it; `None` when the layer
/// has none or is not a tar layer this reads.
fn text_in_layer<T>(
    layout: &Layout,
    layer: &Descriptor,
    mut wanted: impl FnMut(&str) -> Option<T>,
) -> Result<Option<(T, String)>> {
    if crate::oci::unpack::Encoding::of(&layer.media_type).is_none() {
        return Ok(None);
    }
    let reader =
        crate::oci::unpack::open(layout.store(), &layer.digest, layer.size, &layer.media_type)
            .map_err(|e| Error::Layout {
                path: layout.root.clone(),
                reason: e.to_string(),
            })?;
    let mut archive = tar::Archive::new(reader);
    let Ok(entries) = archive.entries() else {
        return Ok(None);
    };
    for entry in entries {
        let Ok(mut entry) = entry else { break };
        let name = entry
            .path()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(what) = wanted(name.trim_start_matches("./").trim_start_matches('/')) else {
            continue;
        };
        let mut text = String::new();
        if entry
            .by_ref()
            .take(1 << 20)
            .read_to_string(&mut text)
            .is_ok()
        {
            return Ok(Some((what, text)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oci::Digest;

    fn desc(digest: &str) -> Descriptor {
        let mut d = Descriptor::new(
            crate::oci::media::MANIFEST,
            Digest::parse(digest).unwrap(),
            10,
        );
        d.artifact_type = Some(media::WARMUP_ARTIFACT.into());
        d
    }

    #[test]
    fn warmup_document() {
        let image = desc(&format!("sha256:{}", "c".repeat(64)));
        let mut m = Document::default();
        m.annotations
            .insert("dev.infer-build.sm".into(), "89".into());
        m.annotations
            .insert("dev.infer-build.precision".into(), "fp16".into());
        m.annotations.insert(
            "dev.infer-build.startup.engine-load-ms".into(),
            "812".into(),
        );
        m.annotations
            .insert("org.opencontainers.image.version".into(), "1".into());
        let config = json!({"os": "linux", "architecture": "amd64"});
        let runtime = "[model]\nname = \"mlp\"\n[[inputs]]\nname = \"input\"\ndatatype = \"FP32\"\ndims = [-1, 64]\n[batching]\nmax_batch_size = 8\npreferred_batch_sizes = [6]\n";
        let w = build(&image, b"0123456789", &m, &config, Some(runtime), &[]);
        let doc: Value = serde_json::from_slice(&w.payload).unwrap();
        assert_eq!(doc["requests"]["batch_sizes"], json!([1, 6, 8]));
        assert_eq!(doc["requests"]["model"]["name"], json!("mlp"));
        assert_eq!(doc["startup_timings_ms"]["engine-load-ms"], json!(812.0));
        assert_eq!(
            doc["compatibility"],
            json!({"dev.infer-build.precision": "fp16", "dev.infer-build.sm": "89"})
        );
        assert_eq!(
            doc["node_selector"],
            json!({"kubernetes.io/arch": "amd64", "kubernetes.io/os": "linux", "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.compute.minor": "9"})
        );
        assert_eq!(doc["missing"], json!([]));
        assert_eq!(doc["ports"], json!({"http": 8000, "grpc": 8001}));
        let man: Value = serde_json::from_slice(&w.manifest).unwrap();
        assert_eq!(man["subject"]["digest"], json!(image.digest));
        assert_eq!(
            man["config"]["digest"],
            json!(Digest::of(b"{}").to_string())
        );
        assert_eq!(man["artifactType"], json!(media::WARMUP_ARTIFACT));
        // Deterministic.
        assert_eq!(
            build(&image, b"0123456789", &m, &config, Some(runtime), &[]).manifest_digest,
            w.manifest_digest
        );
        // Without timings or runtime config, says so.
        let bare = build(&image, b"x", &Document::default(), &json!({}), None, &[]);
        let doc: Value = serde_json::from_slice(&bare.payload).unwrap();
        assert_eq!(doc["startup_timings_ms"], Value::Null);
        assert_eq!(bare.missing.len(), 3);
    }

    #[test]
    fn a_bundles_requests_are_one_per_model_in_order() {
        let image = desc(&format!("sha256:{}", "d".repeat(64)));
        let bundle = "[server]\nport = 9000\n\n[[models]]\npath = \"/opt/infer/models/b\"\n\n[[models]]\npath = \"/opt/infer/models/a\"\n";
        let dirs = bundle_dirs(bundle).unwrap();
        assert_eq!(dirs, ["opt/infer/models/b", "opt/infer/models/a"]);
        assert_eq!(bundle_dirs("[model]\nname = \"x\"\n"), None);
        let model = |name: &str, max: u32| {
            format!("[model]\nname = \"{name}\"\n[[inputs]]\nname = \"x\"\ndatatype = \"FP32\"\ndims = [-1, 4]\n[batching]\nmax_batch_size = {max}\n")
        };
        let models = vec![
            (dirs[0].clone(), Some(model("b", 2))),
            (dirs[1].clone(), None),
        ];
        let w = build(
            &image,
            b"x",
            &Document::default(),
            &json!({}),
            Some(bundle),
            &models,
        );
        let doc: Value = serde_json::from_slice(&w.payload).unwrap();
        assert_eq!(doc["requests"][0]["model"]["name"], json!("b"));
        assert_eq!(doc["requests"][0]["batch_sizes"], json!([1, 2]));
        assert_eq!(doc["requests"][1], Value::Null);
        assert!(
            w.missing
                .iter()
                .any(|m| m == "requests: the image has no /opt/infer/models/a/runtime.toml"),
            "{:?}",
            w.missing
        );
        assert_eq!(doc["ports"]["http"], json!(9000));
    }
}
