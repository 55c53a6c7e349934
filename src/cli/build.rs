//! `infer-build build RECIPE`: assemble one image per target into an OCI layout (default
//! `out/<model>`), optionally also an `oci-archive`, without a Docker daemon.
//!
//! This file only turns flags and the plan into [`assemble::TargetSpec`]s, draws progress and
//! prints the result; the assembly is [`crate::assemble`]. The base image of each GPU target comes
//! from `--base-layout DIR` when given, else [`registry::pull`] fetches `TargetPlan.base` into
//! the shared base cache, pinned in the recipe's lock file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;

use crate::assemble::{self, BuildOptions, BuildReport, Policy, Progress};
use crate::engine::onnxruntime::{Folding, OrtCandidate};
use crate::error::Error;
use crate::oci::image::Platform;
use crate::oci::{cjson, layout, store::BlobStore, Compression};
use crate::plan::{TargetKind, TargetPlan};
use crate::recipe::CpuEngine;
use crate::registry::pull::{self, PullOptions, PulledImage};
use crate::registry::{self, ClientOptions};

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The recipe (TOML).
    pub input: PathBuf,
    /// Build only these targets (repeatable); default: every target that can be built here.
    #[arg(long = "target", value_name = "ID")]
    pub targets: Vec<String>,
    /// Directory of cached engines (from `infer-build engine`).
    #[arg(long, value_name = "DIR")]
    pub engines: Option<PathBuf>,
    /// The OCI layout to write (default `out/<model>`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also write the layout as an archive: `oci-archive:FILE` (loadable by `docker load`).
    #[arg(long, value_name = "oci-archive:FILE")]
    pub output: Option<String>,
    /// The infer-serve binary to ship (else $INFER_SERVE_BIN, else next to infer-build).
    #[arg(long, value_name = "FILE")]
    pub runtime: Option<PathBuf>,
    /// The dynamically linked infer-serve for images whose engine is ONNX Runtime (else
    /// $INFER_SERVE_DYNAMIC_BIN, else `infer-serve-dynamic` next to infer-build).
    #[arg(long, value_name = "FILE")]
    pub runtime_dynamic: Option<PathBuf>,
    /// The dynamically linked infer-serve built with TensorRT, for GPU images (else
    /// $INFER_SERVE_GPU_BIN, else `infer-serve-gpu` next to infer-build).
    #[arg(long, value_name = "FILE")]
    pub runtime_gpu: Option<PathBuf>,
    /// OCI layout holding the base image of GPU targets (default: pull each target's base into
    /// the shared base cache, pinned in the recipe's lock file).
    #[arg(long, value_name = "DIR")]
    pub base_layout: Option<PathBuf>,
    /// Tag of the base image inside --base-layout (default: its only image for the platform).
    #[arg(long, value_name = "TAG")]
    pub base_tag: Option<String>,
    /// Re-resolve the tags of lock-pinned base images and record the new digests.
    #[arg(long)]
    pub update_lock: bool,
    /// Pull base images over plain HTTP (loopback or trusted registries).
    #[arg(long)]
    pub insecure: bool,
    /// Layer compression: auto (gzip; weights ≥ 4 MiB uncompressed), gzip, gzip-stored, zstd, none.
    #[arg(long, default_value = "auto", value_name = "POLICY")]
    pub compression: String,
    /// `org.opencontainers.image.revision` of the index and every image (e.g. the commit).
    #[arg(long, env = "INFER_BUILD_REVISION", value_name = "REV")]
    pub revision: Option<String>,
    /// `org.opencontainers.image.source` of the index and every image (the repository URL).
    #[arg(long, env = "INFER_BUILD_SOURCE", value_name = "URL")]
    pub source: Option<String>,
    /// Print one JSON document (layout, per-target manifest digests, layers, index digest).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub matrix: super::MatrixArgs,
}

pub fn run(args: BuildArgs) -> Result<(), Error> {
    let policy = parse_policy(&args.compression)?;
    let epoch = source_date_epoch(std::env::var("SOURCE_DATE_EPOCH").ok().as_deref())?;
    let archive = match &args.output {
        None => None,
        Some(o) => Some(PathBuf::from(o.strip_prefix("oci-archive:").ok_or_else(
            || Error::Usage(format!("--output {o}: expected oci-archive:FILE")),
        )?)),
    };
    let (meta, targets, bases, model) = targets(&args)?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join(&meta.name));
    let opts = BuildOptions {
        epoch,
        policy,
        zstd_workers: zstd_workers(),
    };
    let mut progress = Bars::default();
    let report = assemble::build(&out, &meta, &targets, &opts, &mut progress)?;
    let sboms = crate::sbom::write_for_build(&report, &meta, &targets, &model, epoch)?;
    if let Some(a) = &archive {
        let store = BlobStore::open(&out)?;
        layout::write_archive(&store, a, epoch)?;
    }
    print_report(&report, &sboms, archive.as_deref(), &bases, args.json);
    Ok(())
}

fn print_report(
    r: &BuildReport,
    sboms: &[crate::sbom::Written],
    archive: Option<&Path>,
    bases: &[PulledImage],
    as_json: bool,
) {
    if as_json {
        let bases: Vec<serde_json::Value> = bases
            .iter()
            .map(|b| {
                json!({
                    "reference": b.reference,
                    "digest": b.digest,
                    "layout": b.layout.display().to_string(),
                    "ref_name": b.ref_name,
                    "bytes_downloaded": b.bytes_downloaded,
                    "offline": b.offline,
                })
            })
            .collect();
        let doc = json!({
            "layout": r.layout.display().to_string(),
            "archive": archive.map(|a| a.display().to_string()),
            "index": {"tag": r.index_tag, "digest": r.index_digest},
            "targets": r.targets,
            "bases": bases,
            "sbom": sboms,
        });
        println!("{}", String::from_utf8_lossy(&cjson::value_to_vec(&doc)));
        return;
    }
    for t in &r.targets {
        let size: u64 = t.layers.iter().map(|l| l.size).sum();
        let cached = t.layers.iter().filter(|l| l.cache != "miss").count();
        eprintln!(
            "built {} ({}) {} — {} layers, {} bytes, {cached} from cache",
            t.id,
            t.tag,
            t.manifest_digest,
            t.layers.len(),
            size
        );
    }
    for s in sboms {
        eprintln!("sbom {} {}", s.target, s.path.display());
    }
    eprintln!("index {} {}", r.index_tag, r.index_digest);
    eprintln!("layout {}", r.layout.display());
    if let Some(a) = archive {
        eprintln!("archive {}", a.display());
    }
}

pub(crate) fn parse_policy(s: &str) -> Result<Policy, Error> {
    if s == "auto" {
        return Ok(Policy::Auto);
    }
    Compression::parse(s).map(Policy::All).ok_or_else(|| {
        Error::Usage(format!(
            "--compression {s}: expected auto, gzip, gzip-stored, zstd or none"
        ))
    })
}

/// `SOURCE_DATE_EPOCH` (reproducible-builds.org): a decimal number of seconds; unset → 0.
pub(crate) fn source_date_epoch(v: Option<&str>) -> Result<u64, Error> {
    match v.map(str::trim) {
        None | Some("") => Ok(0),
        Some(s) => s.parse().map_err(|_| {
            Error::Usage(format!(
                "SOURCE_DATE_EPOCH={s}: expected whole seconds since 1970"
            ))
        }),
    }
}

/// zstd workers never change bytes; use the cores there are (at least 1).
fn zstd_workers() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
        .clamp(1, 8)
}

/// indicatif bars on stderr for layers over a few MB; hidden when stderr is not a terminal.
#[derive(Default)]
struct Bars {
    bar: Option<ProgressBar>,
}

const BAR_MIN: u64 = 4 << 20;

impl Progress for Bars {
    fn start(&mut self, target: &str, layer: &str, total: u64) {
        if total < BAR_MIN {
            self.bar = None;
            return;
        }
        let bar = ProgressBar::new(total);
        let style = ProgressStyle::with_template(
            "{msg:24} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
        )
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.set_message(format!("{target} {layer}"));
        self.bar = Some(bar);
    }
    fn advance(&mut self, n: u64) {
        if let Some(b) = &self.bar {
            b.inc(n);
        }
    }
    fn finish(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

type Targets = (
    assemble::ImageMeta,
    Vec<assemble::TargetSpec>,
    Vec<PulledImage>,
    PathBuf,
);

/// The image identity, one spec per target to build, the base images pulled for them and the
/// ONNX model (for the SBOM).
fn targets(args: &BuildArgs) -> Result<Targets, Error> {
    let crate::plan::Project {
        mut recipe,
        matrix,
        lock_path,
        plan,
        ..
    } = crate::plan::Project::load(&args.input, args.matrix.matrix.as_deref())?;
    let selected: Vec<&TargetPlan> = plan.select(&args.targets)?;

    // Each runtime flavour is looked for only when a target needs it.
    let exe = std::env::current_exe().ok();
    let runtime = |flavour: assemble::RuntimeFlavour| {
        let (_, env_name, _) = flavour.names();
        let env = std::env::var(env_name).ok();
        let flag = match flavour {
            assemble::RuntimeFlavour::Static => args.runtime.as_deref(),
            assemble::RuntimeFlavour::Dynamic => args.runtime_dynamic.as_deref(),
            assemble::RuntimeFlavour::Gpu => args.runtime_gpu.as_deref(),
        };
        assemble::locate(flavour, flag, env.as_deref(), exe.as_deref())
    };
    let (model, _) = assemble::safe_input(&recipe.dir, &recipe.model.onnx.value)?;
    // The model's dimension names, for the runtime's check that inputs sharing a variable
    // dimension agree, and its outputs when the recipe leaves them to the model; a model that
    // does not parse is refused later, by the engine stage.
    let summary = std::fs::read(&model)
        .ok()
        .and_then(|b| crate::engine::onnx::OnnxSummary::from_bytes(&b).ok());
    let dim_names = summary
        .as_ref()
        .map(|s| s.input_dim_names.clone())
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

    let mut bases = Bases::new(args, lock_path.clone());
    let mut specs = Vec::new();
    // The GPU runtime and the TensorRT headers it names.
    let mut gpu_headers: Option<(PathBuf, Option<crate::matrix::Version>)> = None;
    for t in selected {
        let gpu = t.kind == TargetKind::Gpu;
        let platform = assemble::spec::platform(t);
        let ort = ort_candidate(&matrix, &lock_path, args.update_lock, t, &recipe)?;
        let engine = cached_engine(
            args.engines.as_deref(),
            &recipe,
            t,
            ort.as_ref().map(|(c, _)| c.clone()),
            folding(&matrix, &lock_path, args.update_lock, t),
        )?;
        let ort_engine = engine
            .as_ref()
            .is_some_and(|e| e.kind == infer_spec::engine::EngineKind::Onnxruntime);
        if let (Some(e), true) = (&engine, ort.is_some()) {
            if let Some(line) = &e.selection {
                eprintln!("target {}: {line}", t.id);
            }
        }
        if let Some(line) = engine.as_ref().and_then(|e| e.folded.as_ref()) {
            eprintln!("target {}: {line}", t.id);
        }
        let (engine, engine_profile) = match engine {
            Some(e) => (Some((e.file, e.meta_json)), Some(e.profile)),
            None => (None, None),
        };
        if let (Some((_, lib)), true) = (&ort, ort_engine) {
            let Some(pin) = t.cpu.as_ref().and_then(|c| c.glibc_base.as_ref()) else {
                return Err(Error::Usage(format!(
                    "target {}: the compatibility matrix has no glibc base image for ONNX Runtime",
                    t.id
                )));
            };
            let files = assemble::spec::Files {
                serve_bin: runtime(assemble::RuntimeFlavour::Dynamic)?,
                model: model.clone(),
                engine,
                engine_profile,
                warmup_samples: samples.clone(),
                dim_names: dim_names.clone(),
                base: Some(bases.get_pin(t, pin, &platform)?),
                library: Some(lib.clone()),
            };
            assemble::check_runtime_binary(
                &files.serve_bin,
                &platform.architecture,
                assemble::RuntimeFlavour::Dynamic,
            )?;
            specs.push(assemble::spec::target_spec(&recipe, t, files)?);
            continue;
        }
        let lean = t.tensorrt.as_ref().and_then(|trt| trt.lean.as_ref());
        // Every GPU image serves its engine through the TensorRT backend, which only the
        // dynamically linked flavour has (a static binary cannot dlopen TensorRT and the driver),
        // whether TensorRT comes from the image's base (full) or the lean library layer.
        let flavour = if gpu {
            assemble::RuntimeFlavour::Gpu
        } else {
            assemble::RuntimeFlavour::Static
        };
        let serve = runtime(flavour)?;
        assemble::check_runtime_binary(&serve, &platform.architecture, flavour)?;
        if let Some(trt) = &t.tensorrt {
            // Read once per runtime binary, not once per GPU target.
            if gpu_headers.as_ref().is_none_or(|(p, _)| *p != serve) {
                gpu_headers = Some((serve.clone(), assemble::runtime_tensorrt_headers(&serve)?));
            }
            let headers = gpu_headers.as_ref().and_then(|(_, h)| h.as_ref());
            assemble::check_gpu_runtime_headers(&serve, headers, &t.id, &trt.version)?;
        }
        let library = match lean {
            Some(pin) => {
                if engine.is_none() {
                    return Err(Error::Usage(format!(
                        "target {}: an image on TensorRT's lean runtime serves a TensorRT engine; \
                         pass --engines DIR holding the engine `infer-build engine` built for it",
                        t.id
                    )));
                }
                Some(library_files(args, &matrix, &lock_path, t, pin)?)
            }
            None => None,
        };
        let base = match (&args.base_layout, gpu) {
            (_, false) => None,
            // An explicit layout wins over pulling.
            (Some(layout), true) => Some(assemble::BaseRef {
                layout: layout.clone(),
                tag: args.base_tag.clone(),
            }),
            (None, true) => Some(bases.get(t, &platform)?),
        };
        let files = assemble::spec::Files {
            serve_bin: serve.clone(),
            model: model.clone(),
            engine,
            engine_profile,
            warmup_samples: samples.clone(),
            dim_names: dim_names.clone(),
            base,
            library,
        };
        specs.push(assemble::spec::target_spec(&recipe, t, files)?);
    }
    let mut meta = assemble::spec::image_meta(&recipe, &plan);
    meta.revision = nonempty(args.revision.as_deref());
    meta.source = nonempty(args.source.as_deref());
    Ok((meta, specs, bases.pulled.into_values().collect(), model))
}

/// ONNX Runtime as an engine candidate of CPU target `t` (`engine.cpu` `auto` or
/// `onnxruntime`, where the matrix has its library and a glibc base): the library from the
/// pinned wheel (fetched into the library cache, pinned in the lock file), what the engine
/// stage loads to measure it, and the files an ONNX Runtime image ships. `None`: tract only,
/// including under `auto` when the library cannot be had (no network and not cached), which is
/// said on standard error; a forced ONNX Runtime fails instead.
pub(crate) fn ort_candidate(
    matrix: &crate::matrix::Matrix,
    lock_path: &Path,
    update_lock: bool,
    t: &TargetPlan,
    recipe: &crate::recipe::Recipe,
) -> Result<Option<(OrtCandidate, assemble::spec::LibraryFiles)>, Error> {
    let Some(cpu) = t
        .cpu
        .as_ref()
        .filter(|c| t.kind == TargetKind::Cpu && c.onnxruntime_possible())
    else {
        return Ok(None);
    };
    let forced = cpu.engine == CpuEngine::OnnxRuntime;
    let lock = crate::plan::lock::read(lock_path).map_err(crate::plan::Error::from)?;
    let row = crate::native::resolve(
        matrix,
        "onnxruntime",
        t.platform,
        None,
        lock.as_ref().map(|l| (lock_path, l)),
        update_lock,
    )?;
    let (load, files) = match ensure_library(t, row, lock_path, true) {
        Ok(got) => got,
        Err(Error::Native(e)) if !forced && !e.is_bad_input() => {
            eprintln!(
                "target {}: ONNX Runtime is not measured, tract ships (engine.cpu = auto): {e}",
                t.id
            );
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // The runtime's rule (`engine.threads` is never set in images): its CPUs over its instances.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = infer_spec::runtime::default_intra_op_threads(cpus, recipe.batching.instances);
    Ok(Some((
        OrtCandidate {
            library: load,
            version: row.version.clone(),
            threads,
            forced,
        },
        files,
    )))
}

/// ONNX Runtime for the constant folding of a CPU target under `engine.cpu = "tract"` (see
/// [`Folding`]): the matrix's library for the target's platform, its version part of the engine
/// key; checked against the lock file, fetched into the library cache and pinned in the lock
/// file only when tract cannot load the model as it is. `None` for other targets and policies,
/// and where the matrix has no ONNX Runtime for the platform.
pub(crate) fn folding(
    matrix: &crate::matrix::Matrix,
    lock_path: &Path,
    update_lock: bool,
    t: &TargetPlan,
) -> Option<Folding> {
    t.cpu
        .as_ref()
        .filter(|c| t.kind == TargetKind::Cpu && c.engine == CpuEngine::Tract)?;
    let row = matrix.library("onnxruntime", t.platform, None)?.clone();
    let (t, lock_path) = (t.clone(), lock_path.to_path_buf());
    Some(Folding::new(row.version.clone(), move || {
        let lock = crate::plan::lock::read(&lock_path).map_err(|e| e.to_string())?;
        crate::native::check_lock(
            &row,
            None,
            lock.as_ref().map(|l| (lock_path.as_path(), l)),
            update_lock,
        )
        .map_err(|e| e.to_string())?;
        ensure_library(&t, &row, &lock_path, true)
            .map(|(load, _)| load)
            .map_err(|e| e.to_string())
    }))
}

/// TensorRT's lean runtime of a version-compatible target (`pin`, from the plan), from its
/// pinned wheel through the library cache, pinned in the lock file.
fn library_files(
    args: &BuildArgs,
    matrix: &crate::matrix::Matrix,
    lock_path: &Path,
    t: &TargetPlan,
    pin: &crate::plan::LibraryPin,
) -> Result<assemble::spec::LibraryFiles, Error> {
    let lock = crate::plan::lock::read(lock_path).map_err(crate::plan::Error::from)?;
    let row = crate::native::resolve(
        matrix,
        &pin.name,
        t.platform,
        Some(&pin.version),
        lock.as_ref().map(|l| (lock_path, l)),
        args.update_lock,
    )?;
    Ok(ensure_library(t, row, lock_path, false)?.1)
}

/// The files of library `row` from the library cache (downloaded and verified when missing),
/// its pin recorded in the lock file (`only`: as the one version of its name, see
/// [`crate::native::record`]); and the path to load it from on this machine.
fn ensure_library(
    t: &TargetPlan,
    row: &crate::matrix::RuntimeLibrary,
    lock_path: &Path,
    only: bool,
) -> Result<(PathBuf, assemble::spec::LibraryFiles), Error> {
    let cache = crate::native::default_cache_dir().ok_or_else(|| {
        Error::Usage(format!(
            "target {}: no cache directory for the {} library: set \
             INFER_BUILD_CACHE_DIR, XDG_CACHE_HOME or HOME",
            t.id, row.name
        ))
    })?;
    let lib = crate::native::ensure(row, &cache, &crate::native::fetch::Options::default())?;
    crate::native::record(lock_path, row, only)?;
    if lib.offline {
        eprintln!(
            "library {} {} (from the library cache)",
            row.name, row.version
        );
    } else {
        eprintln!(
            "library {} {} (downloaded {} bytes, sha256 {} verified)",
            row.name, row.version, lib.bytes_downloaded, row.sha256
        );
    }
    Ok((
        lib.load.clone(),
        assemble::spec::LibraryFiles {
            files: lib.files,
            load: row.load_path(),
        },
    ))
}

/// The outputs the ONNX file declares, as recipe tensors (batch first, `-1` where the file has
/// a symbol), for a recipe that leaves them to the model. Outputs of a type the runtime does
/// not serve, or without a declared shape, are left out: the runtime config then says which
/// are missing.
fn model_outputs(s: &crate::engine::onnx::OnnxSummary) -> Vec<crate::recipe::Tensor> {
    s.outputs
        .iter()
        .filter_map(|(name, elem, dims)| {
            let datatype = crate::engine::onnx::recipe_datatype(*elem)?;
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
            })
        })
        .collect()
}

/// Base images of GPU targets, pulled into the shared base cache once per reference and
/// platform, pinned in the recipe's lock file.
struct Bases<'a> {
    args: &'a BuildArgs,
    lock_path: PathBuf,
    /// (pull reference, os, architecture) → the pulled image, in a fixed order.
    pulled: BTreeMap<(String, String, String), PulledImage>,
}

impl<'a> Bases<'a> {
    fn new(args: &'a BuildArgs, lock_path: PathBuf) -> Bases<'a> {
        Bases {
            args,
            lock_path,
            pulled: BTreeMap::new(),
        }
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
        let Some((reference, pinned_by_lock)) = pull::base_request(pin) else {
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
                    insecure: self.args.insecure,
                    ..ClientOptions::default()
                },
                lock: pinned_by_lock.then(|| self.lock_path.clone()),
                update_lock: self.args.update_lock,
                platform: Some((platform.os.clone(), platform.architecture.clone())),
                name_by_digest: true,
            };
            let p = registry::pull_with(&reference, &cache, &opts).inspect_err(|_| {
                // An ONNX Runtime CPU image is the one CPU image with a base; tract needs none.
                let hint = if t.kind == TargetKind::Cpu {
                    "set `[engine] cpu = \"tract\"` for a FROM scratch image that needs no base, \
                     or name a reachable glibc CPU base in a --matrix DIR"
                } else {
                    "pass --base-layout DIR to build from an OCI layout on disk instead"
                };
                eprintln!(
                    "target {}: cannot pull base image {reference} into {}\nhint: {hint}",
                    t.id,
                    cache.display()
                )
            })?;
            if p.offline {
                eprintln!("base {reference} {} (from the base cache)", p.digest);
            } else {
                eprintln!(
                    "base {reference} {} (pulled: {} bytes downloaded, {} blobs reused)",
                    p.digest, p.bytes_downloaded, p.blobs_reused
                );
            }
            if pinned_by_lock {
                eprintln!("lock {} pins {reference}", self.lock_path.display());
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

fn nonempty(v: Option<&str>) -> Option<String> {
    v.map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// The engine of target `t` under `--engines DIR` (an engine cache, or the entries of several
/// caches copied under one folder), found and verified by [`crate::engine::lookup`]:
/// its metadata must match the plan and its file its digest. A GPU target needs one; a CPU
/// target without one ships the ONNX model (tract optimises it at start). Returns the engine
/// file, its metadata JSON and its profile JSON.
fn cached_engine(
    dir: Option<&Path>,
    recipe: &crate::recipe::Recipe,
    t: &TargetPlan,
    ort: Option<OrtCandidate>,
    folding: Option<Folding>,
) -> Result<Option<CachedEngine>, Error> {
    let mut spec = crate::engine::adapt::spec(recipe, t)?;
    spec.onnxruntime = ort;
    spec.folding = folding;
    let found = match dir.map(|dir| (dir, crate::engine::lookup(&spec, dir))) {
        Some((_, Ok(a))) => a,
        Some((dir, Err(crate::engine::Error::NotFound { reason, .. })))
            if t.kind == TargetKind::Cpu =>
        {
            eprintln!(
                "note: target {}: no engine under {} ({reason}); running the engine stage",
                t.id,
                dir.display()
            );
            cpu_engine(&spec)?
        }
        Some((_, Err(e))) => return Err(e.into()),
        // A CPU target always goes through the engine stage (its cache makes a rebuild free):
        // a model tract cannot load or run is refused here, not by the image at start.
        None if t.kind == TargetKind::Cpu => cpu_engine(&spec)?,
        None => return Ok(None),
    };
    let read = |name: &str| -> Result<Vec<u8>, Error> {
        let (p, _) = assemble::safe_input(&found.dir, Path::new(name))?;
        Ok(crate::oci::dir::read_file(
            &p,
            crate::oci::MAX_DOCUMENT,
            name,
        )?)
    };
    let name = found
        .engine
        .file_name()
        .map(PathBuf::from)
        .unwrap_or_default();
    let (file, _) = assemble::safe_input(&found.dir, &name)?;
    eprintln!(
        "target {}: engine {} from {}",
        t.id,
        found.meta.engine_digest,
        found.dir.display()
    );
    Ok(Some(CachedEngine {
        file,
        meta_json: read(infer_spec::engine::META_FILE)?,
        profile: found.profile.to_canonical_json(),
        kind: found.meta.kind,
        selection: found.profile.selection.as_ref().map(selection_line),
        folded: folded_line(&found.meta),
    }))
}

/// For a tract engine built from ONNX Runtime's constant-folded model, that fact in words.
pub(crate) fn folded_line(meta: &infer_spec::engine::EngineMeta) -> Option<String> {
    let v = meta.cpu.as_ref()?.folded_by.as_ref()?;
    Some(format!(
        "tract loads the model only after ONNX Runtime {v}'s constant folding; the engine is the folded model"
    ))
}

/// The CPU engine of `spec`, built into (or found in) the default engine cache.
fn cpu_engine(spec: &crate::engine::EngineSpec) -> Result<crate::engine::EngineArtifact, Error> {
    let root = crate::engine::cache_root(None)?;
    let cache = crate::engine::Cache::open(&root)?;
    Ok(crate::engine::build(
        spec,
        &cache,
        &crate::process::SystemRunner,
    )?)
}

/// The CPU engine choice in one line: what shipped, why, and each candidate's figures.
pub(crate) fn selection_line(s: &infer_spec::engine::EngineSelection) -> String {
    let mut line = format!(
        "CPU engine {} (engine.cpu = {}): {}",
        s.chosen, s.policy, s.reason
    );
    for c in &s.candidates {
        match (&c.error, c.startup_ms) {
            (Some(e), _) => {
                line.push_str(&format!("\n  {} {}: does not load: {e}", c.kind, c.version))
            }
            (None, startup) => {
                let tb: Vec<String> = c
                    .batches
                    .iter()
                    .map(|b| format!("T({})={:.1} µs", b.batch, b.median_us))
                    .collect();
                line.push_str(&format!(
                    "\n  {} {} ({} thread{}): start-up {} ms, {}",
                    c.kind,
                    c.version,
                    c.threads,
                    if c.threads == 1 { "" } else { "s" },
                    startup.map_or("-".into(), |v| format!("{v:.1}")),
                    tb.join(" ")
                ));
            }
        }
    }
    if let Some(a) = &s.agreement {
        line.push_str(&format!(
            "\n  outputs {} (max |a-b| {:.2e}, max rel {:.2e}; atol {:e}, rtol {:e}; {})",
            if a.agreed { "agree" } else { "differ" },
            a.max_abs,
            a.max_rel,
            a.atol,
            a.rtol,
            a.inputs
        ));
    }
    line
}

struct CachedEngine {
    file: PathBuf,
    meta_json: Vec<u8>,
    profile: Vec<u8>,
    kind: infer_spec::engine::EngineKind,
    /// The CPU engine choice, in words.
    selection: Option<String>,
    /// How the model was folded for tract, in words.
    folded: Option<String>,
}
