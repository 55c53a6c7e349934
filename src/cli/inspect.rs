//! `infer-build inspect LAYOUT [--json]`: the images of an OCI layout, per target: tag,
//! platform, manifest digest, layers (media type, size, digest), annotations, config summary
//! and totals. Every blob read is verified against its digest.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Args;
use serde_json::{json, Value};

use crate::error::Error;
use crate::oci::cjson;
use crate::oci::layout::{self, ref_name};
use crate::oci::store::BlobStore;

// `inspect REF`: images in a registry (owned by the registry engineer, kept apart).
mod remote;

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// An OCI image layout directory (as written by `infer-build build`), an `oci-archive`
    /// file (`build --output oci-archive:FILE`), or a registry reference
    /// `REGISTRY/REPO[:TAG|@DIGEST]`.
    pub input: PathBuf,
    /// Print one JSON document to stdout instead of the human summary on stderr.
    #[arg(long)]
    pub json: bool,
    /// Registry reference only: list what is attached to each manifest (warm-up manifests).
    #[arg(long)]
    pub referrers: bool,
    /// Registry reference only: plain HTTP instead of TLS.
    #[arg(long)]
    pub insecure: bool,
    /// Registry reference only: trust the CA certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
}

pub fn run(args: InspectArgs) -> Result<(), Error> {
    if let Some(reference) = args.input.to_str().filter(|s| remote::is_reference(s)) {
        return remote::run(reference, &args);
    }
    if args.referrers || args.insecure || args.ca_cert.is_some() {
        return Err(Error::Usage(format!(
            "--referrers, --insecure and --ca-cert need a registry reference; {} is a local path",
            args.input.display()
        )));
    }
    let doc = inspect(&args.input)?;
    if args.json {
        let bytes = cjson::value_to_vec(&doc);
        println!("{}", String::from_utf8_lossy(&bytes));
    } else {
        eprint!("{}", render(&doc));
    }
    Ok(())
}

/// The inspection document of a layout, or of an `oci-archive` (the tar of one, as `build
/// --output oci-archive:FILE` writes it and `docker load` reads it), unpacked into a temporary
/// directory first.
pub fn inspect(path: &std::path::Path) -> Result<Value, Error> {
    if !path.is_file() {
        return inspect_layout(path);
    }
    use crate::oci::Error as OciError;
    let dir = tempfile::tempdir().map_err(OciError::io(
        "creating a directory in",
        std::env::temp_dir(),
    ))?;
    let file = std::fs::File::open(path).map_err(OciError::io("opening", path.to_path_buf()))?;
    tar::Archive::new(std::io::BufReader::new(file))
        .unpack(dir.path())
        .map_err(OciError::io(
            "unpacking the oci-archive",
            path.to_path_buf(),
        ))?;
    inspect_layout(dir.path())
}

fn inspect_layout(path: &std::path::Path) -> Result<Value, Error> {
    let store = BlobStore::open(path)?;
    let idx = layout::read_index(&store)?;
    let (images, indexes) = layout::walk(&store)?;
    let mut tags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in &idx.manifests {
        if let Some(n) = ref_name(d) {
            tags.entry(d.digest.to_string()).or_default().push(n);
        }
    }
    let mut out_images = Vec::new();
    let mut grand = 0u64;
    for img in &images {
        // Every layer blob is checked (regular file, size, digest): a missing or corrupt layer
        // makes `inspect` fail, as the summary would otherwise describe an image that cannot
        // be loaded.
        for l in &img.manifest.layers {
            store.verify(&l.digest, l.size)?;
        }
        let layers: Vec<Value> = img
            .manifest
            .layers
            .iter()
            .map(|l| {
                let role = l.annotations.get("dev.infer-build.layer").cloned();
                json!({"digest": l.digest, "mediaType": l.media_type, "size": l.size, "role": role})
            })
            .collect();
        let total = img
            .manifest
            .layers
            .iter()
            .fold(img.manifest.config.size, |t, l| t.saturating_add(l.size));
        grand = grand.saturating_add(total);
        // A slim base, or an image built on one, carries its size report in annotations.
        let slim = crate::slim::image::report_from_manifest(&img.manifest)
            .and_then(|r| serde_json::to_value(r).ok())
            .unwrap_or(Value::Null);
        let c = img.config.get("config").cloned().unwrap_or(Value::Null);
        // A bundle lists its models; a one-model image is titled after its model.
        let models: Vec<String> = match img.manifest.annotations.get("dev.infer-build.models") {
            Some(list) => list.split(',').map(str::to_string).collect(),
            None => img
                .manifest
                .annotations
                .get(crate::oci::annotation::TITLE)
                .cloned()
                .into_iter()
                .collect(),
        };
        let pick = |k: &str| c.get(k).cloned().unwrap_or(Value::Null);
        // The split layout: which part this is, and what it pairs with.
        let part = img
            .manifest
            .annotations
            .get(crate::assemble::split::PART_ANNOTATION)
            .cloned();
        let pairs_with = match (&img.manifest.subject, part.as_deref()) {
            (Some(s), _) => Some(s.digest.to_string()),
            (None, Some("model")) => img
                .manifest
                .annotations
                .get(crate::assemble::split::RUNTIME_ANNOTATION)
                .cloned(),
            _ => None,
        };
        out_images.push(json!({
            "tags": tags.get(img.descriptor.digest.as_str()).cloned().unwrap_or_default(),
            "manifestDigest": img.descriptor.digest,
            "manifestSize": img.descriptor.size,
            "platform": {
                "os": img.config.get("os").cloned().unwrap_or(Value::Null),
                "architecture": img.config.get("architecture").cloned().unwrap_or(Value::Null),
            },
            "annotations": img.manifest.annotations,
            "artifactType": img.manifest.artifact_type,
            "part": part,
            "pairsWith": pairs_with,
            "models": models,
            "config": {
                "digest": img.manifest.config.digest,
                "size": img.manifest.config.size,
                "created": img.config.get("created").cloned().unwrap_or(Value::Null),
                "User": pick("User"),
                "Entrypoint": pick("Entrypoint"),
                "Cmd": pick("Cmd"),
                "Env": pick("Env"),
                "ExposedPorts": pick("ExposedPorts"),
                "WorkingDir": pick("WorkingDir"),
                "StopSignal": pick("StopSignal"),
                "Labels": pick("Labels"),
            },
            "layers": layers,
            "totalSize": total,
            "slimReport": slim,
        }));
    }
    let out_indexes: Vec<Value> = indexes
        .iter()
        .map(|d| {
            let members = store
                .read_exact(&d.digest, d.size)
                .ok()
                .and_then(|b| crate::oci::image::decode::<crate::oci::image::Index>("index", &b).ok())
                .map(|i| i.manifests.iter().map(|m| json!({"digest": m.digest, "annotations": m.annotations, "platform": m.platform})).collect::<Vec<_>>())
                .unwrap_or_default();
            json!({
                "tags": tags.get(d.digest.as_str()).cloned().unwrap_or_default(),
                "digest": d.digest,
                "manifests": members,
            })
        })
        .collect();
    Ok(json!({
        "layout": path.display().to_string(),
        "indexes": out_indexes,
        "images": out_images,
        "totalSize": grand,
    }))
}

fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `s` with every control character (C0, DEL, C1: terminal escapes, carriage returns,
/// newlines) written as an escape, so text from a layout cannot drive the terminal or forge
/// lines of the summary.
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// The summary, every line cleaned of control characters.
fn render(doc: &Value) -> String {
    render_raw(doc).lines().map(|l| clean(l) + "\n").collect()
}

fn render_raw(doc: &Value) -> String {
    let mut s = format!("layout {}\n", clean(doc["layout"].as_str().unwrap_or("")));
    let empty = Vec::new();
    for i in doc["indexes"].as_array().unwrap_or(&empty) {
        s += &format!(
            "index {} {}\n",
            join(&i["tags"]),
            i["digest"].as_str().unwrap_or("")
        );
        for m in i["manifests"].as_array().unwrap_or(&empty) {
            let target = m["annotations"]["dev.infer-build.target"]
                .as_str()
                .unwrap_or("?");
            s += &format!(
                "  {:<16} {}\n",
                clean(target),
                m["digest"].as_str().unwrap_or("")
            );
        }
    }
    for img in doc["images"].as_array().unwrap_or(&empty) {
        let p = &img["platform"];
        // An artifact (the split layout's ModelPack manifest) has a type, not a platform.
        let kind = match img["artifactType"].as_str() {
            Some(t) => format!("artifact {t}"),
            None => format!(
                "{}/{}",
                p["os"].as_str().unwrap_or("?"),
                p["architecture"].as_str().unwrap_or("?")
            ),
        };
        s += &format!(
            "\nimage {} ({kind})\n  manifest {}\n  config   {} ({})\n",
            join(&img["tags"]),
            img["manifestDigest"].as_str().unwrap_or(""),
            img["config"]["digest"].as_str().unwrap_or(""),
            human(img["config"]["size"].as_u64().unwrap_or(0)),
        );
        s += &format!(
            "  entrypoint {}  user {}  ports {}\n",
            img["config"]["Entrypoint"],
            img["config"]["User"],
            img["config"]["ExposedPorts"]
                .as_object()
                .map(|o| o.keys().cloned().collect::<Vec<_>>().join(","))
                .unwrap_or_default()
        );
        let pairs = img["pairsWith"].as_str().unwrap_or("?");
        match (img["part"].as_str(), img["artifactType"].as_str()) {
            (_, Some(t)) if t == crate::assemble::split::modelpack::ARTIFACT_TYPE => {
                s += &format!(
                    "  ModelPack manifest of the model image {pairs} (same layer blobs)\n"
                );
            }
            (Some("runtime"), _) => {
                s += &format!(
                    "  runtime image: serves the model mounted at {}\n",
                    crate::assemble::split::MOUNT
                );
            }
            (Some("model"), _) => {
                s += &format!(
                    "  model image: mount at {} in the runtime image {pairs}\n",
                    crate::assemble::split::MOUNT
                );
            }
            _ => {}
        }
        if img["annotations"]["dev.infer-build.models"].is_string() {
            let names: Vec<&str> = img["models"]
                .as_array()
                .unwrap_or(&empty)
                .iter()
                .filter_map(Value::as_str)
                .collect();
            s += &format!("  models {}\n", names.join(", "));
        }
        s += "  layers:\n";
        for l in img["layers"].as_array().unwrap_or(&empty) {
            let mt = l["mediaType"].as_str().unwrap_or("");
            s += &format!(
                "    {:>10}  {:<42} {}{}\n",
                human(l["size"].as_u64().unwrap_or(0)),
                clean(mt.trim_start_matches("application/vnd.oci.image.")),
                l["digest"].as_str().unwrap_or(""),
                l["role"]
                    .as_str()
                    .map_or(String::new(), |r| format!("  {r}"))
            );
        }
        s += &format!(
            "    {:>10}  total (layers + config)\n",
            human(img["totalSize"].as_u64().unwrap_or(0))
        );
        if let Ok(r) = serde_json::from_value::<crate::slim::SizeReport>(img["slimReport"].clone())
        {
            s += "  slim size report:\n";
            for line in r.render().lines() {
                s += &format!("    {line}\n");
            }
        }
        if let Some(a) = img["annotations"].as_object() {
            s += "  annotations:\n";
            for (k, v) in a {
                s += &format!("    {} = {}\n", clean(k), clean(v.as_str().unwrap_or("")));
            }
        }
    }
    s += &format!(
        "\ntotal {}\n",
        human(doc["totalSize"].as_u64().unwrap_or(0))
    );
    s
}

fn join(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str())
                .map(clean)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}
