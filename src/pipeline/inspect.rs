//! `infer-build inspect LAYOUT`: what a layout (or an `oci-archive`) holds, as a
//! [`crate::report::Inspection`]. Every blob read is verified against its digest; a layer
//! that is missing or corrupt fails the inspection, since the summary would otherwise
//! describe an image that cannot be loaded.

use std::collections::BTreeMap;
use std::path::Path;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::Error;
use crate::oci::layout::{self, ref_name};
use crate::oci::store::BlobStore;
use crate::report::{
    ConfigSummary, IndexMember, InspectedImage, InspectedIndex, InspectedLayer, Inspection, OsArch,
};

/// The inspection of a layout, or of an `oci-archive` (the tar of one, as `build --output
/// oci-archive:FILE` writes it and `docker load` reads it), unpacked into a temporary
/// directory first.
pub(crate) fn inspect(path: &Path) -> Result<Inspection, Error> {
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

fn inspect_layout(path: &Path) -> Result<Inspection, Error> {
    let store = BlobStore::open(path)?;
    let idx = layout::read_index(&store)?;
    let (images, indexes) = layout::walk(&store)?;
    let mut tags: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in &idx.manifests {
        if let Some(n) = ref_name(d) {
            tags.entry(d.digest.to_string()).or_default().push(n);
        }
    }
    let tags_of = |d: &crate::oci::Digest| tags.get(d.as_str()).cloned().unwrap_or_default();
    let mut out_images = Vec::new();
    let mut grand = 0u64;
    for img in &images {
        for l in &img.manifest.layers {
            store.verify(&l.digest, l.size)?;
        }
        let image = inspect_image(img, tags_of(&img.descriptor.digest));
        grand = grand.saturating_add(image.total_size);
        out_images.push(image);
    }
    let out_indexes = indexes
        .iter()
        .map(|d| InspectedIndex {
            tags: tags_of(&d.digest),
            digest: d.digest.clone(),
            manifests: store
                .read_exact(&d.digest, d.size)
                .ok()
                .and_then(|b| {
                    crate::oci::image::decode::<crate::oci::image::Index>("index", &b).ok()
                })
                .map(|i| {
                    i.manifests
                        .into_iter()
                        .map(|m| IndexMember {
                            digest: m.digest,
                            annotations: m.annotations,
                            platform: m.platform,
                        })
                        .collect()
                })
                .unwrap_or_default(),
        })
        .collect();
    Ok(Inspection {
        layout: path.display().to_string(),
        indexes: out_indexes,
        images: out_images,
        total_size: grand,
    })
}

/// One image of the walk, its config summarised: a config key holding what the image spec
/// does not allow there is shown as absent.
fn inspect_image(img: &layout::FoundImage, tags: Vec<String>) -> InspectedImage {
    let m = &img.manifest;
    let layers = m
        .layers
        .iter()
        .map(|l| InspectedLayer {
            digest: l.digest.clone(),
            media_type: l.media_type.clone(),
            size: l.size,
            role: l.annotations.get("dev.infer-build.layer").cloned(),
        })
        .collect();
    let total = m
        .layers
        .iter()
        .fold(m.config.size, |t, l| t.saturating_add(l.size));
    let c = img.config.get("config").unwrap_or(&Value::Null);
    // A bundle lists its models; a one-model image is titled after its model.
    let models: Vec<String> = match m.annotations.get("dev.infer-build.models") {
        Some(list) => list.split(',').map(str::to_string).collect(),
        None => m
            .annotations
            .get(crate::oci::annotation::TITLE)
            .cloned()
            .into_iter()
            .collect(),
    };
    // The split layout: which part this is, and what it pairs with.
    let part = m
        .annotations
        .get(crate::assemble::split::PART_ANNOTATION)
        .cloned();
    let pairs_with = match (&m.subject, part.as_deref()) {
        (Some(s), _) => Some(s.digest.to_string()),
        (None, Some("model")) => m
            .annotations
            .get(crate::assemble::split::RUNTIME_ANNOTATION)
            .cloned(),
        _ => None,
    };
    InspectedImage {
        tags,
        manifest_digest: img.descriptor.digest.clone(),
        manifest_size: img.descriptor.size,
        platform: OsArch {
            os: pick(&img.config, "os"),
            architecture: pick(&img.config, "architecture"),
        },
        annotations: m.annotations.clone(),
        artifact_type: m.artifact_type.clone(),
        part,
        pairs_with,
        models,
        config: ConfigSummary {
            digest: m.config.digest.clone(),
            size: m.config.size,
            created: pick(&img.config, "created"),
            user: pick(c, "User"),
            entrypoint: pick(c, "Entrypoint"),
            cmd: pick(c, "Cmd"),
            env: pick(c, "Env"),
            exposed_ports: pick(c, "ExposedPorts"),
            working_dir: pick(c, "WorkingDir"),
            stop_signal: pick(c, "StopSignal"),
            labels: pick(c, "Labels"),
        },
        layers,
        total_size: total,
        // A slim base, or an image built on one, carries its size report in annotations.
        slim_report: crate::slim::image::report_from_manifest(m),
    }
}

/// `key` of a JSON object, when present and of the type asked for.
fn pick<T: DeserializeOwned>(v: &Value, key: &str) -> Option<T> {
    v.get(key).and_then(|x| T::deserialize(x).ok())
}
