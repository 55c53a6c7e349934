//! `infer-build engine RECIPE --target ID [--cache DIR] [--matrix DIR] [--json]`: build one
//! target's engine into the content-addressed engine cache (or find it there).
//!
//! Resolves the recipe to its plan, derives the target's [`EngineSpec`](crate::engine::EngineSpec)
//! and hands it to [`crate::engine::build`] with the real process runner. Human output goes to
//! stderr; `--json` prints one canonical JSON document to stdout.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde_json::json;

use crate::cli::MatrixArgs;
use crate::engine::{self, Cache};
use crate::error::Error;
use crate::process::SystemRunner;

#[derive(Debug, Args)]
pub(crate) struct EngineArgs {
    /// The recipe (TOML).
    pub input: PathBuf,
    /// The target to build, as `infer-build plan` lists it (`cpu-fp32`, `sm89-fp16`, …).
    #[arg(long, value_name = "ID")]
    pub target: String,
    /// The engine cache (default `$INFER_BUILD_CACHE_DIR/engines`, else
    /// `$XDG_CACHE_HOME/infer-build/engines`, else `~/.cache/infer-build/engines`).
    #[arg(long, value_name = "DIR")]
    pub cache: Option<PathBuf>,
    #[command(flatten)]
    pub matrix: MatrixArgs,
    /// Re-resolve what the lock file pins (the ONNX Runtime library), as `build --update-lock`.
    #[arg(long)]
    pub update_lock: bool,
    /// Print the result as one JSON document on stdout.
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: EngineArgs) -> Result<(), Error> {
    let started = Instant::now();
    let crate::plan::Project {
        recipe,
        matrix,
        lock_path,
        plan,
        ..
    } = crate::plan::Project::load(&args.input, args.matrix.matrix.as_deref())?;
    let target = plan.require(&args.target)?;
    let notes = super::stderr_notes();
    // The same spec `build` makes: ONNX Runtime measured against tract where the CPU target
    // may ship it, and the ONNX Runtime that may fold the model for tract.
    let (spec, _) = crate::pipeline::engine_spec(
        &matrix,
        &lock_path,
        args.update_lock,
        &recipe,
        target,
        &notes,
    )?;
    let root = engine::cache_root(args.cache.as_deref())?;
    let cache = Cache::open(&root)?;
    let prepared = engine::prepare(&spec, &cache, &SystemRunner)?;
    if let Some(c) = &prepared.converted {
        if !args.json {
            eprintln!(
                "{} {} model of {} ({}) {} in {:.2}s{}",
                if c.cached { "cached" } else { "converted" },
                c.precision,
                spec.target,
                c.onnx_digest,
                c.onnx.display(),
                started.elapsed().as_secs_f64(),
                if c.env_created {
                    " (created the converter environment)"
                } else {
                    ""
                }
            );
            eprintln!("  converter: {}", c.report.tool());
            for line in c.report.steps() {
                eprintln!("  {line}");
            }
            eprintln!(
                "  accuracy against FP32 on {}: passed",
                engine::evaluation_text(&c.report)
            );
            for line in c.report.summary() {
                eprintln!("  {line}");
            }
        }
    }
    let conversion = prepared.converted.as_ref().map(|c| {
        json!({
            "key": c.key,
            "cached": c.cached,
            "onnx": c.onnx.display().to_string(),
            "onnx_digest": c.onnx_digest,
            "report": c.report,
        })
    });
    let art = engine::build_prepared(&spec, prepared, &cache, &SystemRunner)?;
    let elapsed = started.elapsed().as_secs_f64();
    if args.json {
        let doc = json!({
            "target": art.meta.target,
            "key": art.key,
            "cached": art.cached,
            "engine": art.engine.display().to_string(),
            "engine_digest": art.meta.engine_digest,
            "dir": art.dir.display().to_string(),
            "seconds": (elapsed * 1000.0).round() / 1000.0,
            "meta": art.meta,
            "profile": art.profile,
            "conversion": conversion,
        });
        println!(
            "{}",
            String::from_utf8_lossy(&infer_spec::engine::canonical_json(&doc)).trim_end()
        );
    } else {
        eprintln!(
            "{} engine {} ({}, {}) {} in {:.2}s",
            if art.cached { "cached" } else { "built" },
            art.meta.target,
            art.meta.format.file_name(),
            art.meta.engine_digest,
            art.dir.display(),
            elapsed
        );
        for b in &art.profile.batches {
            eprintln!("  T({}) = {:.1} us", b.batch, b.median_us);
        }
        if let Some(s) = &art.profile.selection {
            eprintln!("  {}", crate::pipeline::selection_line(s));
        }
        if let Some(line) = crate::pipeline::folded_line(&art.meta) {
            eprintln!("  {line}");
        }
    }
    Ok(())
}
