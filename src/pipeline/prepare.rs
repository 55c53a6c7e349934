//! What `build` and a bundle's build share: the request, and one recipe prepared for its
//! images (its plan, and per selected target the engine, runtime, base and libraries its image
//! ships), the base images pulled once per reference and platform.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::assemble;
use crate::error::Error;
use crate::oci::image::Platform;
use crate::plan::{TargetKind, TargetPlan};
use crate::registry::pull::{PullOptions, PulledImage};
use crate::registry::ClientOptions;

use super::engine::{cached_engine, engine_spec, ensure_library};
use super::Notes;

/// What to build: the recipe and the choices of `infer-build build`'s flags.
#[derive(Debug, Clone, Default)]
pub(crate) struct BuildRequest {
    /// The recipe (TOML).
    pub input: PathBuf,
    /// `--matrix DIR`, else the embedded matrix.
    pub matrix: Option<PathBuf>,
    /// Only these targets; empty: every target of the plan.
    pub targets: Vec<String>,
    /// Engines (an engine cache) to look each target's engine up in.
    pub engines: Option<PathBuf>,
    /// The three runtime flavours, when given explicitly (else the environment, else next to
    /// the running executable: [`assemble::locate`]).
    pub runtime: Option<PathBuf>,
    pub runtime_dynamic: Option<PathBuf>,
    pub runtime_gpu: Option<PathBuf>,
    /// An OCI layout holding the GPU targets' base, instead of pulling it; and its tag.
    pub base_layout: Option<PathBuf>,
    pub base_tag: Option<String>,
    /// Re-resolve lock-pinned tags and record the new digests.
    pub update_lock: bool,
    /// Pull bases over plain HTTP.
    pub insecure: bool,
    /// `org.opencontainers.image.revision` and `.source` of every image.
    pub revision: Option<String>,
    pub source: Option<String>,
    /// `--image-layout`: overrides the recipe's `[image] layout`.
    pub layout: Option<crate::recipe::ImageLayout>,
}

/// What a build prepares: the image identity, one spec per target, the bases pulled.
pub(super) struct Prepared {
    pub meta: assemble::ImageMeta,
    pub targets: Vec<assemble::TargetSpec>,
    /// The base images pulled for them, in a fixed order.
    pub bases: Vec<PulledImage>,
}

/// One recipe's part of a build: its plan, and per selected target what its image ships.
pub(super) struct RecipeBuild {
    pub recipe: crate::recipe::Recipe,
    pub plan: crate::plan::BuildPlan,
    pub targets: Vec<(TargetPlan, assemble::spec::Files)>,
}

/// A loaded recipe (its project: plan and lock file) and, for each target `req` selects, its
/// engine, runtime, base and libraries: the files of its image.
#[allow(
    clippy::too_many_lines,
    reason = "each selected target's inputs in order: engine, runtime, base, libraries, each a call"
)]
pub(super) fn prepare_recipe(
    req: &BuildRequest,
    project: crate::plan::Project,
    bases: &mut Bases<'_>,
    note: &Notes,
) -> Result<RecipeBuild, Error> {
    let crate::plan::Project {
        mut recipe,
        matrix,
        lock_path,
        plan,
        ..
    } = project;
    let selected: Vec<TargetPlan> = plan.select(&req.targets)?.into_iter().cloned().collect();
    bases.lock_path = lock_path.clone();

    // Each runtime flavour is looked for only when a target needs it.
    let exe = std::env::current_exe().ok();
    let runtime = |flavour: assemble::RuntimeFlavour| {
        let (_, env_name, _) = assemble::flavour_names(flavour);
        let env = std::env::var(env_name).ok();
        let flag = match flavour {
            assemble::RuntimeFlavour::Static => req.runtime.as_deref(),
            assemble::RuntimeFlavour::Dynamic => req.runtime_dynamic.as_deref(),
            assemble::RuntimeFlavour::Gpu => req.runtime_gpu.as_deref(),
        };
        assemble::locate(flavour, flag, env.as_deref(), exe.as_deref())
    };
    let (model, _) = assemble::safe_input(&recipe.dir, &recipe.model.onnx.value)?;
    // The model's dimension names, for the runtime's check that inputs sharing a variable
    // dimension agree, the tables its inputs index, for the runtime's bound on their values,
    // and its outputs when the recipe leaves them to the model; a model that does not parse is
    // refused later, by the engine stage.
    let summary = super::text::model_summary(&model);
    let dim_names = summary
        .as_ref()
        .map(|s| s.input_dim_names.clone())
        .unwrap_or_default();
    let table_rows = summary
        .as_ref()
        .map(|s| s.embedding_rows.clone())
        .unwrap_or_default();
    if recipe.model.outputs.is_empty() {
        if let Some(s) = &summary {
            recipe.model.outputs = model_outputs(s);
        }
    }
    let samples = match &recipe.warmup.samples {
        Some(s) => {
            let (p, _) = assemble::safe_input(&recipe.dir, &s.value)?;
            // Read once (a regular file, bounded) and shared by every target's layer.
            Some(std::sync::Arc::<[u8]>::from(crate::oci::dir::read_file(
                &p,
                infer_spec::samples::MAX_BYTES,
                "warm-up samples",
            )?))
        }
        None => None,
    };
    let tokenizer = match &recipe.text {
        Some(t) => Some(super::text::read_tokenizer(&recipe, t, summary.as_ref())?),
        None => None,
    };

    let mut targets = Vec::new();
    // The GPU runtime and the TensorRT headers it names.
    let mut gpu_headers: Option<(PathBuf, Option<crate::matrix::Version>)> = None;
    for t in &selected {
        let gpu = t.kind == TargetKind::Gpu;
        let platform = assemble::spec::platform(t);
        let (spec, mut libraries) =
            engine_spec(&matrix, &lock_path, req.update_lock, &recipe, t, note)?;
        let measured = !libraries.is_empty();
        let engine = cached_engine(req.engines.as_deref(), spec, t, note)?;
        if let (Some(e), true) = (&engine, measured) {
            if let Some(line) = &e.selection {
                note(&format!("target {}: {line}", t.id));
            }
        }
        if let Some(line) = engine.as_ref().and_then(|e| e.folded.as_ref()) {
            note(&format!("target {}: {line}", t.id));
        }
        let engine_def = engine.as_ref().map(|e| e.kind.def());
        // A CPU engine that loads a library (ONNX Runtime, OpenVINO) ships it beside it, from
        // the plan's pinned wheel.
        let cpu_library = match engine_def {
            Some(d) if !gpu && d.library.is_some() => libraries
                .iter()
                .position(|(k, _)| *k == d.kind)
                .map(|i| (d, libraries.swap_remove(i).1)),
            _ => None,
        };
        // The runtime build that serves the engine (`EngineDef::runtime`): every GPU image the
        // dynamically linked one with the TensorRT backend (a static binary cannot dlopen
        // TensorRT and the driver), whether TensorRT comes from the image's base (full) or the
        // lean library layer; a CPU image the static one unless its engine loads a library.
        let flavour = match engine_def {
            Some(d) if gpu || cpu_library.is_some() => d.runtime,
            _ if gpu => assemble::RuntimeFlavour::Gpu,
            _ => assemble::RuntimeFlavour::Static,
        };
        let (engine, engine_profile) = match engine {
            Some(e) => (Some((e.file, e.meta_json)), Some(e.profile)),
            None => (None, None),
        };
        let serve = runtime(flavour)?;
        assemble::check_runtime_binary(&serve, &platform.architecture, flavour)?;
        let lean = t.tensorrt.as_ref().and_then(|trt| trt.lean.as_ref());
        if let Some(trt) = &t.tensorrt {
            // Read once per runtime binary, not once per GPU target.
            if gpu_headers.as_ref().is_none_or(|(p, _)| *p != serve) {
                gpu_headers = Some((serve.clone(), assemble::runtime_tensorrt_headers(&serve)?));
            }
            let headers = gpu_headers.as_ref().and_then(|(_, h)| h.as_ref());
            assemble::check_gpu_runtime_headers(&serve, headers, &t.id, &trt.version)?;
            // The library the image runs on: the lean one from its pinned wheel, else the base's.
            let library = lean.map_or(&trt.version, |pin| &pin.version);
            if let Some(warning) = headers.and_then(|h| assemble::headers_newer(h, library, &t.id))
            {
                note(&warning);
            }
        }
        let (base, library) = match cpu_library {
            Some((def, lib)) => {
                let Some(pin) = t.cpu.as_ref().and_then(|c| c.glibc_base.as_ref()) else {
                    return Err(Error::Usage(format!(
                        "target {}: the compatibility matrix has no glibc base image for {}",
                        t.id, def.title
                    )));
                };
                (Some(bases.get_pin(t, pin, &platform)?), Some(lib))
            }
            None => {
                let library = match lean {
                    Some(pin) => {
                        if engine.is_none() {
                            return Err(Error::Usage(format!(
                                "target {}: an image on TensorRT's lean runtime serves a TensorRT engine; \
                                 pass --engines DIR holding the engine `infer-build engine` built for it",
                                t.id
                            )));
                        }
                        Some(library_files(req, &matrix, &lock_path, t, pin, note)?)
                    }
                    None => None,
                };
                let base = match (&req.base_layout, gpu) {
                    (_, false) => None,
                    // An explicit layout wins over pulling.
                    (Some(layout), true) => Some(assemble::BaseRef {
                        layout: layout.clone(),
                        tag: req.base_tag.clone(),
                    }),
                    (None, true) => Some(bases.get(t, &platform)?),
                };
                (base, library)
            }
        };
        let files = assemble::spec::Files {
            serve_bin: serve,
            model: model.clone(),
            engine,
            engine_profile,
            warmup_samples: samples.clone(),
            tokenizer: tokenizer.clone(),
            dim_names: dim_names.clone(),
            table_rows: table_rows.clone(),
            base,
            library,
        };
        targets.push((t.clone(), files));
    }
    Ok(RecipeBuild {
        recipe,
        plan,
        targets,
    })
}

/// TensorRT's lean runtime of a version-compatible target (`pin`, from the plan), from its
/// pinned wheel through the library cache, pinned in the lock file.
fn library_files(
    req: &BuildRequest,
    matrix: &crate::matrix::Matrix,
    lock_path: &Path,
    t: &TargetPlan,
    pin: &crate::plan::LibraryPin,
    note: &Notes,
) -> Result<assemble::spec::LibraryFiles, Error> {
    let lock = crate::plan::lock::read(lock_path).map_err(crate::plan::Error::from)?;
    let row = crate::native::resolve(
        matrix,
        &pin.name,
        t.platform,
        Some(&pin.version),
        lock.as_ref().map(|l| (lock_path, l)),
        req.update_lock,
    )?;
    Ok(ensure_library(t, row, lock_path, false, note)?.1)
}

/// The outputs the ONNX file declares, as recipe tensors (batch first, `-1` where the file has
/// a symbol), for a recipe that leaves them to the model. Outputs of a type the runtime does
/// not serve, or without a declared shape, are left out: the runtime config then says which
/// are missing.
fn model_outputs(s: &crate::engine::onnx::OnnxSummary) -> Vec<crate::recipe::Tensor> {
    s.outputs
        .iter()
        .filter_map(|(name, elem, dims)| {
            let datatype = crate::engine::onnx::datatype(*elem)?;
            let mut shape = dims.clone();
            match shape.first_mut() {
                Some(d) => *d = -1,
                None => return None,
            }
            Some(crate::recipe::Tensor {
                name: name.clone(),
                datatype,
                shape,
                profile: None,
                pad: None,
            })
        })
        .collect()
}

/// Base images of GPU targets, pulled into the shared base cache once per reference and
/// platform, pinned in the lock file of the recipe being prepared (`lock_path`).
pub(super) struct Bases<'a> {
    req: &'a BuildRequest,
    note: &'a Notes,
    lock_path: PathBuf,
    /// (pull reference, os, architecture) → the pulled image, in a fixed order.
    pulled: BTreeMap<(String, String, String), PulledImage>,
}

impl<'a> Bases<'a> {
    pub(super) fn new(req: &'a BuildRequest, note: &'a Notes) -> Bases<'a> {
        Bases {
            req,
            note,
            lock_path: PathBuf::new(),
            pulled: BTreeMap::new(),
        }
    }

    /// The images pulled, in a fixed order.
    pub(super) fn into_pulled(self) -> Vec<PulledImage> {
        self.pulled.into_values().collect()
    }

    fn get(&mut self, t: &TargetPlan, platform: &Platform) -> Result<assemble::BaseRef, Error> {
        self.get_pin(t, &t.base, platform)
    }

    /// Pull `pin` (the target's base, or the glibc base of its ONNX Runtime image).
    fn get_pin(
        &mut self,
        t: &TargetPlan,
        pin: &crate::plan::ImagePin,
        platform: &Platform,
    ) -> Result<assemble::BaseRef, Error> {
        let Some((reference, pinned_by_lock)) = super::pull::base_request(pin) else {
            return Err(assemble::Error::NeedBaseLayout {
                target: t.id.clone(),
            }
            .into());
        };
        let key = (
            reference.clone(),
            platform.os.clone(),
            platform.architecture.clone(),
        );
        if let Some(other) = self
            .pulled
            .keys()
            .find(|k| pinned_by_lock && k.0 == key.0 && k != &&key)
        {
            return Err(Error::Usage(format!(
                "target {}: base {reference} is needed for {}/{} and {}/{}, but the lock file pins \
                 one digest per reference; build each platform's targets with --base-layout DIR",
                t.id, other.1, other.2, key.1, key.2
            )));
        }
        if !self.pulled.contains_key(&key) {
            let cache =
                crate::cache::require(crate::cache::Entry::Bases, None, "--base-layout DIR")
                    .map_err(|e| {
                        Error::Usage(format!("target {}: pulling {reference}: {e}", t.id))
                    })?;
            let opts = PullOptions {
                client: ClientOptions {
                    insecure: self.req.insecure,
                    notify: crate::registry::client::Notify(Some(self.note.clone())),
                    ..ClientOptions::default()
                },
                pin: None,
                platform: Some((platform.os.clone(), platform.architecture.clone())),
                name_by_digest: true,
                registries: None,
            };
            let p = super::pull::pull_locked(
                &reference,
                &cache,
                opts,
                pinned_by_lock.then_some(self.lock_path.as_path()),
                self.req.update_lock,
            )
            .inspect_err(|_| {
                // An ONNX Runtime CPU image is the one CPU image with a base; tract needs none.
                let hint = if t.kind == TargetKind::Cpu {
                    "set `[engine] cpu = \"tract\"` for a FROM scratch image that needs no base, \
                     or name a reachable glibc CPU base in a --matrix DIR"
                } else {
                    "pass --base-layout DIR to build from an OCI layout on disk instead"
                };
                (self.note)(&format!(
                    "target {}: cannot pull base image {reference} into {}\nhint: {hint}",
                    t.id,
                    cache.display()
                ))
            })?;
            if p.offline {
                (self.note)(&format!(
                    "base {reference} {} (from the base cache)",
                    p.digest
                ));
            } else {
                let from = p.served_by.as_ref().map_or(String::new(), |s| {
                    for failed in &s.mirrors_failed {
                        (self.note)(&format!("base {reference}: mirror passed over: {failed}"));
                    }
                    format!(" from {}{}", if s.mirror { "mirror " } else { "" }, s.place)
                });
                (self.note)(&format!(
                    "base {reference} {} (pulled{from}: {} bytes downloaded, {} blobs reused)",
                    p.digest, p.bytes_downloaded, p.blobs_reused
                ));
            }
            if pinned_by_lock {
                (self.note)(&format!(
                    "lock {} pins {reference}",
                    self.lock_path.display()
                ));
            }
            self.pulled.insert(key.clone(), p);
        }
        let p = &self.pulled[&key];
        Ok(assemble::BaseRef {
            layout: p.layout.clone(),
            tag: Some(p.ref_name.clone()),
        })
    }
}

pub(super) fn nonempty(v: Option<&str>) -> Option<String> {
    v.map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}
