//! `infer-build plan`: show the build plan. A table on stderr by default; `--json` (or
//! `--format json`) writes the whole plan as one JSON document to stdout; `--format
//! github-matrix` writes one line of JSON ready for a GitHub Actions `strategy.matrix`
//! (`{"include":[{"target":"sm90-fp16","runner":[…],…}]}`).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::MatrixArgs;
use crate::error::Error;
use crate::plan::{BuildPlan, ImagePin, PinnedBy, TargetKind, TargetPlan};
use crate::recipe::CpuEngine;

#[derive(Debug, Args)]
pub(crate) struct PlanArgs {
    /// The recipe (TOML).
    pub input: PathBuf,
    /// Write the plan as one JSON document to stdout (same as `--format json`).
    #[arg(long, conflicts_with = "format")]
    pub json: bool,
    /// Output format: `table` (stderr), `json` (stdout) or `github-matrix` (stdout, one line).
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Option<Format>,
    #[command(flatten)]
    pub matrix: MatrixArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Format {
    Table,
    Json,
    GithubMatrix,
}

pub(super) fn run(args: PlanArgs) -> Result<(), Error> {
    let plan = super::check::load_plan(&args.input, args.matrix.matrix.as_deref())?;
    let format = match (args.json, args.format) {
        (true, _) => Format::Json,
        (false, f) => f.unwrap_or(Format::Table),
    };
    match format {
        Format::Table => eprint!("{}", table(&plan)),
        Format::Json => println!("{}", json(&plan)),
        Format::GithubMatrix => println!("{}", github_matrix(&plan)),
    }
    Ok(())
}

/// The plan as pretty JSON (struct field order: deterministic).
pub(super) fn json(plan: &BuildPlan) -> String {
    serde_json::to_string_pretty(plan).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// One entry of a GitHub Actions matrix `include` list.
#[derive(Serialize)]
struct MatrixEntry<'a> {
    target: &'a str,
    kind: TargetKind,
    /// `runs-on` labels: GPU jobs need a self-hosted runner of that SM (engines bind to it).
    runner: Vec<String>,
    platform: &'a str,
    sm: &'a str,
    precision: String,
    products: String,
    tensorrt: String,
    cuda: String,
    driver_floor: String,
    base: String,
    /// The job container: the plan's TensorRT builder image (its trtexec is the planned
    /// TensorRT) for GPU targets, empty for the CPU target and where the matrix has no builder
    /// (a job whose `container.image` is empty runs on the runner itself).
    container: String,
    image: &'a str,
    tag: &'a str,
}

#[derive(Serialize)]
struct GithubMatrix<'a> {
    include: Vec<MatrixEntry<'a>>,
}

fn runner(t: &TargetPlan) -> Vec<String> {
    match &t.gpu {
        None => vec!["ubuntu-latest".into()],
        Some(g) => {
            let arch = if t.oci_platform.ends_with("arm64") {
                "arm64"
            } else {
                "x64"
            };
            vec![
                "self-hosted".into(),
                "linux".into(),
                arch.into(),
                format!("gpu-{}", g.sm),
            ]
        }
    }
}

/// The plan as a one-line GitHub Actions matrix.
pub(super) fn github_matrix(plan: &BuildPlan) -> String {
    let include = plan
        .targets
        .iter()
        .map(|t| MatrixEntry {
            target: &t.id,
            kind: t.kind,
            runner: runner(t),
            platform: t.platform.as_str(),
            sm: t.gpu.as_ref().map_or("cpu", |g| g.sm.as_str()),
            precision: t.precision.to_string(),
            products: t
                .gpu
                .as_ref()
                .map_or_else(String::new, |g| g.products.join(", ")),
            tensorrt: t
                .tensorrt
                .as_ref()
                .map_or_else(String::new, |r| r.version.to_string()),
            cuda: t.cuda.as_ref().map_or_else(String::new, |c| c.to_string()),
            driver_floor: t
                .driver_floor
                .as_ref()
                .map_or_else(String::new, |c| c.to_string()),
            base: t.base.pull_reference(),
            container: t
                .builder
                .as_ref()
                .filter(|_| t.gpu.is_some())
                .map_or_else(String::new, ImagePin::pull_reference),
            image: &t.image,
            tag: &t.tag,
        })
        .collect();
    serde_json::to_string(&GithubMatrix { include })
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn pin_text(p: &ImagePin) -> String {
    match (&p.digest, p.pinned_by) {
        (_, PinnedBy::None) => p.reference.clone(),
        (Some(d), _) => format!("{}@{}", p.reference, d.short()),
        (None, _) => format!("{} (digest: lock file, first pull)", p.reference),
    }
}

/// The base image a target's image is built on, as the table shows it. A CPU target's depends on
/// its engine: tract ships on the target's `base` (`scratch` unless the recipe names one), ONNX
/// Runtime and OpenVINO on the matrix's glibc base; under `engine.cpu = "auto"` the build
/// measures them and ships the fastest, so the table names both bases (and a note says so,
/// [`auto_base_note`]).
fn base_text(t: &TargetPlan) -> String {
    match &t.cpu {
        Some(cpu) if library_engines(cpu).next().is_some() => {
            let glibc = cpu.glibc_base.as_ref().map_or_else(String::new, pin_text);
            if cpu.engine == CpuEngine::Auto {
                format!("{} or {glibc}", pin_text(&t.base))
            } else {
                glibc
            }
        }
        _ => pin_text(&t.base),
    }
}

/// The titles of the library engines (ONNX Runtime, OpenVINO) a CPU target may ship.
fn library_engines(cpu: &crate::plan::CpuPlan) -> impl Iterator<Item = &'static str> + '_ {
    infer_spec::engine::EngineKind::cpu_engines()
        .filter(|d| d.library.is_some() && cpu.possible(d.kind))
        .map(|d| d.title)
}

/// What the table's "A or B" base of an `auto` CPU target means, or `None` for other targets.
fn auto_base_note(t: &TargetPlan) -> Option<String> {
    let cpu = t.cpu.as_ref()?;
    let glibc = cpu.glibc_base.as_ref()?;
    let titles: Vec<&str> = library_engines(cpu).collect();
    (cpu.engine == CpuEngine::Auto && !titles.is_empty()).then(|| {
        format!(
            "engine.cpu = \"auto\": the build measures tract and {} and ships the fastest, tract FROM {}, {} on {} (`build` says which; `[engine] cpu` fixes it)",
            titles.join(" and "),
            t.base.reference,
            titles.join(" or "),
            glibc.reference
        )
    })
}

/// The human table.
pub(super) fn table(plan: &BuildPlan) -> String {
    let header = [
        "TARGET", "GPUS", "TENSORRT", "CUDA", "DRIVER>=", "BASE", "TAG",
    ];
    let rows: Vec<[String; 7]> = plan
        .targets
        .iter()
        .map(|t| {
            [
                t.id.clone(),
                t.gpu.as_ref().map_or_else(
                    // A CPU target that computes fast with some CPU features names them.
                    || match t.cpu.as_ref().map(|c| &c.features) {
                        Some(f) if !f.is_empty() => format!(
                            "cpu ({})",
                            f.iter()
                                .map(|f| f.name.as_str())
                                .collect::<Vec<_>>()
                                .join(" or ")
                        ),
                        _ => "cpu".into(),
                    },
                    |g| g.products.join(", "),
                ),
                t.tensorrt
                    .as_ref()
                    .map_or_else(|| "-".into(), |r| r.version.to_string()),
                t.cuda
                    .as_ref()
                    .map_or_else(|| "-".into(), |c| c.to_string()),
                t.driver_floor
                    .as_ref()
                    .map_or_else(|| "-".into(), |c| c.to_string()),
                base_text(t),
                t.tag.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.len());
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s.push('\n');
        s
    };
    let mut out = format!(
        "plan for {} ({} {}), image {}\n",
        plan.recipe.display(),
        plan.model,
        plan.version,
        plan.repository
    );
    out.push_str(&line(&header.map(String::from)));
    for r in &rows {
        out.push_str(&line(r));
    }
    // Notes shared by several targets are printed once, with the targets they concern.
    let auto: Vec<Option<String>> = plan.targets.iter().map(auto_base_note).collect();
    let mut notes: Vec<(&str, Vec<&str>)> = Vec::new();
    for (t, auto) in plan.targets.iter().zip(&auto) {
        for n in t.notes.iter().chain(auto) {
            match notes.iter_mut().find(|(m, _)| *m == n.as_str()) {
                Some((_, ids)) => ids.push(&t.id),
                None => notes.push((n, vec![&t.id])),
            }
        }
    }
    for (n, ids) in notes {
        out.push_str(&format!("note ({}): {n}\n", ids.join(", ")));
    }
    let unpinned = plan.unpinned_images();
    if !unpinned.is_empty() {
        out.push_str(&format!(
            "{} base image{} will be pinned by digest in {} at first pull\n",
            unpinned.len(),
            if unpinned.len() == 1 { "" } else { "s" },
            plan.lock_file.display()
        ));
    }
    out
}
