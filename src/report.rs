//! The documents `infer-build build --json`, `inspect --json` and `slim --json` print, as types: what the
//! CLI serializes and what scripts (and this crate's tests) read back. Keys are the wire
//! spelling; fields only ever get added.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::assemble::split::SplitReport;
use crate::assemble::TargetReport;
use crate::oci::image::Platform;
use crate::oci::Digest;
use crate::registry::pull::PulledImage;
pub use crate::sbom::Written as SbomWritten;
use crate::slim::{Excluded, SizeReport};

/// `infer-build build --json`: where the images went and what each target's image holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BuildOutput {
    /// The OCI layout written (a temporary one when only an archive was asked for).
    pub layout: String,
    /// The `oci-archive` written, with `--output oci-archive:FILE`.
    pub archive: Option<String>,
    /// The layout's index: its tag and digest.
    pub index: IndexRef,
    pub targets: Vec<TargetReport>,
    /// The split layout's images, per target that has one (empty otherwise).
    #[serde(default)]
    pub split: Vec<SplitReport>,
    /// The base images the targets were built on, as pulled (or found pinned).
    pub bases: Vec<PulledImage>,
    /// One SPDX document per target.
    pub sbom: Vec<SbomWritten>,
}

/// A tag and the digest it names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IndexRef {
    pub tag: String,
    pub digest: Digest,
}

/// `infer-build inspect LAYOUT --json`: every index and image of a layout.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Inspection {
    pub layout: String,
    pub indexes: Vec<InspectedIndex>,
    pub images: Vec<InspectedImage>,
    /// Every image's layers and config, summed.
    pub total_size: u64,
}

/// An image index of the layout and its members.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InspectedIndex {
    /// The layout's tags (`ref.name`) for it.
    pub tags: Vec<String>,
    pub digest: Digest,
    pub manifests: Vec<IndexMember>,
}

/// One manifest an index lists.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct IndexMember {
    pub digest: Digest,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub platform: Option<Platform>,
}

/// An image (or artifact) manifest of the layout, its config summarised, its layers listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InspectedImage {
    pub tags: Vec<String>,
    pub manifest_digest: Digest,
    pub manifest_size: u64,
    pub platform: OsArch,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    pub artifact_type: Option<String>,
    /// The split layout's part: `runtime` or `model`.
    pub part: Option<String>,
    /// The split layout: the manifest this one pairs with (the runtime image of a model
    /// image, the model image of a ModelPack manifest).
    pub pairs_with: Option<String>,
    /// The models it serves: a bundle's list, else the image's title.
    pub models: Vec<String>,
    pub config: ConfigSummary,
    pub layers: Vec<InspectedLayer>,
    /// The layers and the config, in bytes.
    pub total_size: u64,
    /// A slim base's size report, or that of an image built on one.
    pub slim_report: Option<SizeReport>,
}

/// The platform an image config names.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OsArch {
    pub os: Option<String>,
    pub architecture: Option<String>,
}

/// The image config: its blob and the run settings a user checks. A field the config lacks,
/// or holds in a form the image spec does not allow, is `null`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ConfigSummary {
    pub digest: Digest,
    pub size: u64,
    pub created: Option<String>,
    #[serde(rename = "User")]
    pub user: Option<String>,
    #[serde(rename = "Entrypoint")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(rename = "Cmd")]
    pub cmd: Option<Vec<String>>,
    #[serde(rename = "Env")]
    pub env: Option<Vec<String>>,
    #[serde(rename = "ExposedPorts")]
    pub exposed_ports: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(rename = "WorkingDir")]
    pub working_dir: Option<String>,
    #[serde(rename = "StopSignal")]
    pub stop_signal: Option<String>,
    #[serde(rename = "Labels")]
    pub labels: Option<BTreeMap<String, String>>,
}

/// A layer of an image.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InspectedLayer {
    pub digest: Digest,
    pub media_type: String,
    pub size: u64,
    /// `dev.infer-build.layer`: what infer-build put in it (`runtime`, `model`, …).
    pub role: Option<String>,
}

/// `infer-build slim --json`: the slim base built, the images it was cut from, what went in
/// and what was left out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SlimOutput {
    /// The definition's name; also the tag in the layout.
    pub definition: String,
    /// The engine kind the definition serves (`version-compatible`, …).
    pub engine: String,
    /// With `--engine-meta`: the engine the definition was chosen for.
    pub chosen_for: Option<SlimChoice>,
    /// The `--tactic` libraries asked for (`cudnn`, `cublas`, `cublaslt`).
    pub tactics: Vec<String>,
    pub base: SlimSource,
    pub builder: SlimSource,
    /// The OCI layout written.
    pub layout: String,
    pub tag: String,
    pub manifest_digest: Digest,
    /// Paths copied from the builder image, absolute.
    pub copied: Vec<String>,
    /// Paths present in both images where the base's file was kept.
    pub kept_base: Vec<String>,
    /// Libraries the closure left out, and why.
    pub excluded: Vec<Excluded>,
    /// Sizes against the full builder image.
    pub report: SizeReport,
}

/// The engine `slim --engine-meta` chose a definition for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlimChoice {
    /// The engine metadata file read.
    pub engine_meta: String,
    pub target: String,
    /// The engine kind it needs.
    pub kind: String,
    /// The TensorRT version it was built with.
    pub tensorrt: String,
}

/// One of the two images a slim base is cut from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlimSource {
    pub reference: String,
    pub digest: String,
    /// `layout` (given with `--base-layout`/`--builder-layout`) or `pull`.
    pub source: String,
    /// Where its layout is.
    pub layout: String,
    /// Bytes pulled for it this run; `None` when it came from a given layout.
    pub bytes_downloaded: Option<u64>,
}
