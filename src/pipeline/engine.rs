//! `infer-build engine` (one target's engine built into the engine cache, or found there), the
//! engine-spec step it shares with `build`, the engine cache lookup of a build, the native
//! library an engine stage loads, and the words for an engine choice.

use std::path::{Path, PathBuf};

use crate::assemble;
use crate::engine::onnxruntime::{Folding, OrtError};
use crate::engine::LibraryCandidate;
use crate::error::Error;
use crate::plan::{TargetKind, TargetPlan};
use crate::recipe::CpuEngine;
use infer_spec::engine::EngineKind;

use super::Notes;

/// What `infer-build engine` builds: one target of a recipe, into an engine cache.
#[derive(Debug, Clone, Default)]
pub(crate) struct EngineRequest {
    /// The recipe (TOML).
    pub input: PathBuf,
    /// `--matrix DIR`, else the embedded matrix.
    pub matrix: Option<PathBuf>,
    /// The target, as `plan` lists it.
    pub target: String,
    /// The engine cache (default: the cache root's `engines`).
    pub cache: Option<PathBuf>,
    /// Re-resolve what the lock file pins (the ONNX Runtime library).
    pub update_lock: bool,
}

/// What [`engine`] made or found.
pub(crate) struct EngineBuilt {
    /// The converted model, for a target whose precision converts it (through the accuracy
    /// gate), and the seconds from the start to its conversion.
    pub converted: Option<(crate::engine::convert::Converted, f64)>,
    /// The engine in the cache.
    pub artifact: crate::engine::EngineArtifact,
    /// Seconds from the start to the engine.
    pub seconds: f64,
}

/// The engine of `req.target` built into the content-addressed engine cache (or found there):
/// the same spec `build` makes (ONNX Runtime measured against tract where the CPU target may
/// ship it, and the ONNX Runtime that may fold the model for tract), the model converted first
/// where the target's precision asks for it. `converted` hears of the conversion (with the
/// seconds it took from the start) before the engine is built: a build that then fails (no GPU
/// here) still shows what was converted and gated.
pub(crate) fn engine(
    req: &EngineRequest,
    note: &Notes,
    converted: &mut dyn FnMut(&crate::engine::convert::Converted, f64),
) -> Result<EngineBuilt, Error> {
    let started = std::time::Instant::now();
    let crate::plan::Project {
        recipe,
        matrix,
        lock_path,
        plan,
        ..
    } = crate::plan::Project::load(&req.input, req.matrix.as_deref())?;
    let target = plan.require(&req.target)?;
    let (spec, _) = engine_spec(&matrix, &lock_path, req.update_lock, &recipe, target, note)?;
    let root = crate::engine::cache_root(req.cache.as_deref())?;
    let cache = crate::engine::Cache::open(&root)?;
    let runner = crate::process::SystemRunner;
    let prepared = crate::engine::prepare(&spec, &cache, &runner)?;
    let conversion = prepared
        .converted
        .clone()
        .map(|c| (c, started.elapsed().as_secs_f64()));
    if let Some((c, seconds)) = &conversion {
        converted(c, *seconds);
    }
    let artifact = crate::engine::build_prepared(&spec, prepared, &cache, &runner)?;
    Ok(EngineBuilt {
        converted: conversion,
        artifact,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A target's engine spec and, per library engine that is a candidate (ONNX Runtime,
/// OpenVINO), the library files its image would carry.
pub(super) type SpecAndLibrary = (
    crate::engine::EngineSpec,
    Vec<(EngineKind, assemble::spec::LibraryFiles)>,
);

/// The engine-spec step `build` and `engine` share: the recipe's spec for target `t`, with
/// each library engine as a candidate where the CPU target may ship it ([`candidate`]: also
/// the library files its image carries) and the ONNX Runtime that may fold the model for tract
/// (`folding`); `update_lock` re-resolves what the lock file pins.
pub(crate) fn engine_spec(
    matrix: &crate::matrix::Matrix,
    lock_path: &Path,
    update_lock: bool,
    recipe: &crate::recipe::Recipe,
    t: &TargetPlan,
    note: &Notes,
) -> Result<SpecAndLibrary, Error> {
    let mut spec = crate::engine::adapt::spec(recipe, t)?;
    let mut files = Vec::new();
    for kind in [EngineKind::Onnxruntime, EngineKind::Openvino] {
        let Some((c, f)) = candidate(kind, matrix, lock_path, update_lock, t, recipe, note)? else {
            continue;
        };
        files.push((kind, f));
        match kind {
            EngineKind::Openvino => spec.openvino = Some(c),
            _ => spec.onnxruntime = Some(c),
        }
    }
    spec.folding = folding(matrix, lock_path, update_lock, t, note);
    Ok((spec, files))
}

/// Library engine `kind` (ONNX Runtime, OpenVINO) as an engine candidate of CPU target `t`
/// (`engine.cpu` `auto` or its name, where the matrix has its library and a glibc base): the
/// library from the pinned wheel (fetched into the library cache, pinned in the lock file),
/// what the engine stage loads to measure it, and the files its image ships. `None`: not a
/// candidate, including under `auto` when the library cannot be had (no network and not
/// cached), which is said on standard error; a forced engine fails instead.
pub(super) fn candidate(
    kind: EngineKind,
    matrix: &crate::matrix::Matrix,
    lock_path: &Path,
    update_lock: bool,
    t: &TargetPlan,
    recipe: &crate::recipe::Recipe,
    note: &Notes,
) -> Result<Option<(LibraryCandidate, assemble::spec::LibraryFiles)>, Error> {
    let Some(cpu) = t
        .cpu
        .as_ref()
        .filter(|c| t.kind == TargetKind::Cpu && c.possible(kind))
    else {
        return Ok(None);
    };
    let def = kind.def();
    let Some(library) = def.library else {
        return Ok(None);
    };
    let forced = cpu.engine == CpuEngine::Only(kind);
    let lock = crate::plan::lock::read(lock_path).map_err(crate::plan::Error::from)?;
    let row = crate::native::resolve(
        matrix,
        library.name,
        t.platform,
        None,
        lock.as_ref().map(|l| (lock_path, l)),
        update_lock,
    )?;
    let (load, files) = match ensure_library(t, row, lock_path, true, note) {
        Ok(got) => got,
        Err(Error::Native(e)) if !forced && !e.is_bad_input() => {
            note(&format!(
                "target {}: {} is not measured (engine.cpu = auto): {e}",
                t.id, def.title
            ));
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    // The recipe's threads, measured alone; else the most threads an instance may use, the
    // runtime's rule: its CPUs over its instances, the CPUs being this machine's up to those
    // the deployment requests; the engine stage measures the counts up to it, and the fastest
    // is a hint in runtime.toml (the runtime decides where it runs).
    let given = recipe.engine.threads.as_ref().map(|t| t.value as usize);
    let threads = given.unwrap_or_else(|| {
        let here = std::thread::available_parallelism().map_or(1, |n| n.get());
        // (A quantity `deploy` would refuse counts as the default here.)
        let requested = crate::deploy::from_plan::requested_cpu_millis(recipe)
            .unwrap_or(crate::deploy::from_plan::DEFAULT_CPU_MILLIS)
            .div_ceil(1000) as usize;
        infer_spec::runtime::default_intra_op_threads(
            here.min(requested),
            recipe.batching.instances,
        )
    });
    Ok(Some((
        LibraryCandidate {
            kind,
            library: load,
            version: row.version.clone(),
            threads,
            given: given.is_some(),
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
pub(super) fn folding(
    matrix: &crate::matrix::Matrix,
    lock_path: &Path,
    update_lock: bool,
    t: &TargetPlan,
    note: &Notes,
) -> Option<Folding> {
    t.cpu
        .as_ref()
        .filter(|c| t.kind == TargetKind::Cpu && c.engine == CpuEngine::TRACT)?;
    let row = matrix.library("onnxruntime", t.platform, None)?.clone();
    let (t, lock_path, note) = (t.clone(), lock_path.to_path_buf(), note.clone());
    Some(Folding::new(row.version.clone(), move || {
        let library = |e: &dyn std::fmt::Display| OrtError::Library(e.to_string());
        let lock = crate::plan::lock::read(&lock_path).map_err(|e| library(&e))?;
        crate::native::check_lock(
            &row,
            None,
            lock.as_ref().map(|l| (lock_path.as_path(), l)),
            update_lock,
        )
        .map_err(|e| library(&e))?;
        ensure_library(&t, &row, &lock_path, true, &note)
            .map(|(load, _)| load)
            .map_err(|e| library(&e))
    }))
}

/// The files of library `row` from the library cache (downloaded and verified when missing),
/// its pin recorded in the lock file (`only`: as the one version of its name, see
/// [`crate::native::record`]); and the path to load it from on this machine.
pub(super) fn ensure_library(
    t: &TargetPlan,
    row: &crate::matrix::RuntimeLibrary,
    lock_path: &Path,
    only: bool,
    note: &Notes,
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
        note(&format!(
            "library {} {} (from the library cache)",
            row.name, row.version
        ));
    } else {
        note(&format!(
            "library {} {} (downloaded {} bytes, sha256 {} verified)",
            row.name, row.version, lib.bytes_downloaded, row.sha256
        ));
    }
    Ok((
        lib.load.clone(),
        assemble::spec::LibraryFiles {
            files: lib.files,
            load: row.load_path(),
        },
    ))
}

/// The engine of target `t` under `--engines DIR` (an engine cache, or the entries of several
/// caches copied under one folder), found and verified by [`crate::engine::lookup`]:
/// its metadata must match the plan and its file its digest. A GPU target needs one; a CPU
/// target without one ships the ONNX model (tract optimises it at start). Returns the engine
/// file, its metadata JSON and its profile JSON.
pub(super) fn cached_engine(
    dir: Option<&Path>,
    spec: crate::engine::EngineSpec,
    t: &TargetPlan,
    note: &Notes,
) -> Result<Option<CachedEngine>, Error> {
    let found = match dir.map(|dir| (dir, crate::engine::lookup(&spec, dir))) {
        Some((_, Ok(a))) => a,
        Some((dir, Err(crate::engine::Error::NotFound { reason, .. })))
            if t.kind == TargetKind::Cpu =>
        {
            note(&format!(
                "note: target {}: no engine under {} ({reason}); running the engine stage",
                t.id,
                dir.display()
            ));
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
    note(&format!(
        "target {}: engine {} from {}",
        t.id,
        found.meta.engine_digest,
        found.dir.display()
    ));
    Ok(Some(CachedEngine {
        file,
        meta_json: read(infer_spec::engine::META_FILE)?,
        profile: found.profile.to_canonical_json(),
        kind: found.meta.kind,
        selection: found.profile.selection.as_ref().map(selection_line),
        folded: folded_line(&found.meta),
    }))
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

/// For a tract engine built from ONNX Runtime's constant-folded model, that fact in words.
pub(crate) fn folded_line(meta: &infer_spec::engine::EngineMeta) -> Option<String> {
    let v = meta.cpu.as_ref()?.folded_by.as_ref()?;
    Some(format!(
        "tract loads the model only after ONNX Runtime {v}'s constant folding; the engine is the folded model"
    ))
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

pub(super) struct CachedEngine {
    pub(super) file: PathBuf,
    pub(super) meta_json: Vec<u8>,
    pub(super) profile: Vec<u8>,
    pub(super) kind: infer_spec::engine::EngineKind,
    /// The CPU engine choice, in words.
    pub(super) selection: Option<String>,
    /// How the model was folded for tract, in words.
    pub(super) folded: Option<String>,
}
