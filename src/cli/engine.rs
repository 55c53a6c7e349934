//! `infer-build engine RECIPE --target ID [--cache DIR] [--matrix DIR] [--json]`: build one
//! target's engine into the content-addressed engine cache (or find it there).
//!
//! The flags as an [`EngineRequest`] for [`crate::pipeline::engine`](fn@crate::pipeline::engine),
//! which builds it; human output goes to stderr, `--json` prints one canonical JSON document to
//! stdout.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::cli::MatrixArgs;
use crate::engine::{self, convert::Converted};
use crate::error::Error;
use crate::pipeline::{EngineBuilt, EngineRequest};

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
    let req = EngineRequest {
        input: args.input,
        matrix: args.matrix.matrix,
        target: args.target,
        cache: args.cache,
        update_lock: args.update_lock,
    };
    let target = req.target.clone();
    let mut on_converted = |c: &Converted, seconds: f64| {
        if !args.json {
            print_conversion(&target, c, seconds);
        }
    };
    let built = crate::pipeline::engine(&req, &super::stderr_notes(), &mut on_converted)?;
    if args.json {
        print_json(&built)
    } else {
        print_human(&built);
        Ok(())
    }
}

/// The conversion of the target's model (through the accuracy gate) as lines on standard error,
/// before its engine is built.
fn print_conversion(target: &str, c: &Converted, seconds: f64) {
    eprintln!(
        "{} {} model of {} ({}) {} in {seconds:.2}s{}",
        if c.cached { "cached" } else { "converted" },
        c.precision,
        target,
        c.onnx_digest,
        c.onnx.display(),
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

/// The engine as lines on standard error.
fn print_human(built: &EngineBuilt) {
    let art = &built.artifact;
    eprintln!(
        "{} engine {} ({}, {}) {} in {:.2}s",
        if art.cached { "cached" } else { "built" },
        art.meta.target,
        art.meta.format.file_name(),
        art.meta.engine_digest,
        art.dir.display(),
        built.seconds
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

/// The engine (and the conversion before it) as one canonical JSON document on standard output.
fn print_json(built: &EngineBuilt) -> Result<(), Error> {
    let conversion = built.converted.as_ref().map(|(c, _)| {
        json!({
            "key": c.key,
            "cached": c.cached,
            "onnx": c.onnx.display().to_string(),
            "onnx_digest": c.onnx_digest,
            "report": c.report,
        })
    });
    let art = &built.artifact;
    let doc = json!({
        "target": art.meta.target,
        "key": art.key,
        "cached": art.cached,
        "engine": art.engine.display().to_string(),
        "engine_digest": art.meta.engine_digest,
        "dir": art.dir.display().to_string(),
        "seconds": (built.seconds * 1000.0).round() / 1000.0,
        "meta": art.meta,
        "profile": art.profile,
        "conversion": conversion,
    });
    println!(
        "{}",
        String::from_utf8_lossy(&infer_spec::engine::canonical_json(&doc)).trim_end()
    );
    Ok(())
}
