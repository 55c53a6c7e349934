//! `infer-build build RECIPE`: assemble one image per target into an OCI layout (default
//! `out/<model>`), optionally also an `oci-archive`, without a Docker daemon.
//!
//! This file only turns flags into a [`BuildRequest`], draws progress and prints the result;
//! the pipeline is [`crate::pipeline`], the assembly [`crate::assemble`].

use std::path::{Path, PathBuf};

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use crate::assemble::{BuildOptions, BuildReport, Policy, Progress};
use crate::error::Error;
use crate::oci::Compression;
use crate::pipeline::{self, BuildRequest};
use crate::registry::pull::PulledImage;

#[derive(Debug, Args)]
pub(crate) struct BuildArgs {
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
    /// What to write per target: `combined` (one image with the model) or `split` (also a
    /// runtime image without it and the model as an artifact to mount); default: the recipe's
    /// `[image] layout`, else combined.
    #[arg(long, value_name = "LAYOUT", value_parser = parse_image_layout)]
    pub image_layout: Option<crate::recipe::ImageLayout>,
    /// Print one JSON document (layout, per-target manifest digests, layers, index digest).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub matrix: super::MatrixArgs,
}

pub(crate) fn run(args: BuildArgs) -> Result<(), Error> {
    let policy = parse_policy(&args.compression)?;
    let epoch = source_date_epoch(std::env::var("SOURCE_DATE_EPOCH").ok().as_deref())?;
    let archive = match &args.output {
        None => None,
        Some(o) => Some(PathBuf::from(o.strip_prefix("oci-archive:").ok_or_else(
            || Error::Usage(format!("--output {o}: expected oci-archive:FILE")),
        )?)),
    };
    let req = BuildRequest {
        input: args.input,
        matrix: args.matrix.matrix,
        targets: args.targets,
        engines: args.engines,
        runtime: args.runtime,
        runtime_dynamic: args.runtime_dynamic,
        runtime_gpu: args.runtime_gpu,
        base_layout: args.base_layout,
        base_tag: args.base_tag,
        update_lock: args.update_lock,
        insecure: args.insecure,
        revision: args.revision,
        source: args.source,
        layout: args.image_layout,
    };
    let opts = BuildOptions {
        epoch,
        policy,
        zstd_workers: zstd_workers(),
    };
    let mut progress = Bars::default();
    let b = pipeline::build(
        &req,
        args.out.as_deref(),
        archive.as_deref(),
        &opts,
        &mut progress,
        &super::stderr_notes(),
    )?;
    print_report(&b.report, &b.sboms, archive.as_deref(), &b.bases, args.json)
}

fn print_report(
    r: &BuildReport,
    sboms: &[crate::sbom::Written],
    archive: Option<&Path>,
    bases: &[PulledImage],
    as_json: bool,
) -> Result<(), Error> {
    if as_json {
        let doc = crate::report::BuildOutput {
            layout: r.layout.display().to_string(),
            archive: archive.map(|a| a.display().to_string()),
            index: crate::report::IndexRef {
                tag: r.index_tag.clone(),
                digest: r.index_digest.clone(),
            },
            targets: r.targets.clone(),
            split: r.split.clone(),
            bases: bases.to_vec(),
            sbom: sboms.to_vec(),
        };
        return super::print_json("the build report", &doc);
    }
    for t in &r.targets {
        let size: u64 = t.layers.iter().map(|l| l.size).sum();
        let cached = t
            .layers
            .iter()
            .filter(|l| l.cache != crate::assemble::LayerSource::Miss)
            .count();
        eprintln!(
            "built {} ({}) {} — {} layers, {} bytes, {cached} from cache",
            t.id,
            t.tag,
            t.manifest_digest,
            t.layers.len(),
            size
        );
    }
    for s in &r.split {
        eprintln!(
            "split {}: runtime {} {}, model {} {} ({} files), modelpack {} {}",
            s.target,
            s.runtime.tag,
            s.runtime.manifest_digest,
            s.model.tag,
            s.model.manifest_digest,
            s.model.layers.len(),
            s.modelpack_tag,
            s.modelpack_digest
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
    Ok(())
}

pub(crate) fn parse_image_layout(s: &str) -> Result<crate::recipe::ImageLayout, String> {
    crate::recipe::ImageLayout::parse(s).ok_or_else(|| {
        format!(
            "expected {}",
            crate::recipe::ImageLayout::NAMES.join(" or ")
        )
    })
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
