//! `infer-build push`: push an OCI layout to a registry (per-target tags, the index tag and
//! warm-up artifacts): the flags as a [`PushRequest`] for
//! [`crate::pipeline::push`](fn@crate::pipeline::push). Progress bars on stderr; `--json`
//! prints the report on stdout.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use clap::Args;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::error::Error;
use crate::pipeline::PushRequest;
use crate::registry::push::{BlobOutcome, Progress};
use crate::registry::PushOptions;

#[derive(Debug, Args)]
pub(crate) struct PushArgs {
    /// The OCI layout directory to push (as written by `infer-build build`).
    pub input: PathBuf,
    /// Destination `REGISTRY[:PORT]/REPOSITORY`; tags come from the layout.
    #[arg(long, value_name = "REGISTRY/REPO")]
    pub to: String,
    /// Talk plain HTTP (no TLS). Only for registries on a trusted network or loopback.
    #[arg(long)]
    pub insecure: bool,
    /// Trust the CA certificates in this PEM file (default: `$SSL_CERT_FILE`, else the web PKI).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Print the push report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Parallel blob uploads.
    #[arg(long, default_value_t = 4)]
    pub jobs: usize,
    /// Blobs larger than this many bytes are uploaded in chunks of this size.
    #[arg(long, value_name = "BYTES", default_value_t = 128 << 20)]
    pub chunk_size: u64,
    /// Try mounting blobs from this repository of the same registry (repeatable).
    #[arg(long, value_name = "REPO")]
    pub mount_from: Vec<String>,
    /// Do not attach warm-up artifacts.
    #[arg(long)]
    pub no_warmup: bool,
    /// Do not attach the layout's SBOMs (`sbom/<target>.spdx.json`, written by `build`).
    #[arg(long)]
    pub no_sbom: bool,
    /// Docker config file for credentials (default: the containers `auth.json` files, then
    /// `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`; see docs/registry.md).
    #[arg(long, value_name = "FILE", conflicts_with = "authfile")]
    pub docker_config: Option<PathBuf>,
    /// Read credentials only from this containers `auth.json` (as skopeo and podman's
    /// `--authfile`; default `$REGISTRY_AUTH_FILE`, then the usual search).
    #[arg(long, value_name = "FILE")]
    pub authfile: Option<PathBuf>,
}

pub(super) fn run(args: PushArgs) -> Result<(), Error> {
    super::check_credentials_file("--docker-config", args.docker_config.as_deref())?;
    super::check_credentials_file("--authfile", args.authfile.as_deref())?;
    let bars = Bars::new();
    let progress = {
        let bars = bars.clone();
        Arc::new(move |p: Progress| bars.event(p))
    };
    let opts = PushOptions {
        client: super::registry_client(
            args.insecure,
            args.ca_cert.clone(),
            args.authfile.clone().or_else(|| args.docker_config.clone()),
        ),
        jobs: args.jobs,
        chunk_size: args.chunk_size.max(1),
        mount_from: args.mount_from.clone(),
        locations_file: None,
        progress: Some(progress),
        ..PushOptions::default()
    };
    let opts = crate::attach::Attachments {
        warmup: !args.no_warmup,
        sbom: !args.no_sbom,
    }
    .onto(opts);
    let req = PushRequest {
        layout: args.input.clone(),
        to: args.to.clone(),
        options: opts,
    };
    let report = crate::pipeline::push(&req);
    bars.finish();
    let report = report?;
    for t in &report.tags {
        eprintln!(
            "tagged {}/{}:{} {}",
            report.registry, report.repository, t.tag, t.digest
        );
    }
    let attached = |group: &str| report.attached.get(group).into_iter().flatten();
    for w in attached(crate::attach::WARMUP) {
        eprintln!("warm-up {} -> {} ({})", w.digest, w.subject, w.attached_via);
        for m in &w.missing {
            eprintln!("  left out: {m}");
        }
    }
    for s in attached(crate::attach::SBOM) {
        eprintln!("sbom {} -> {} ({})", s.digest, s.subject, s.attached_via);
    }
    eprintln!(
        "uploaded {} blob bytes ({} blobs); skipped {} bytes ({} already there, {} mounted); {} manifests written",
        report.bytes_uploaded,
        report.blobs_uploaded,
        report.bytes_skipped,
        report.blobs_skipped,
        report.blobs_mounted,
        report.manifests_written
    );
    if report.bytes_uploaded == 0 {
        eprintln!(
            "nothing to upload: every blob was already in {}",
            report.repository
        );
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| Error::Usage(e.to_string()))?
        );
    }
    Ok(())
}

/// One progress bar per uploading blob (bytes, rate), drawn on stderr when it is a terminal.
#[derive(Clone)]
struct Bars {
    multi: MultiProgress,
    bars: Arc<Mutex<HashMap<String, ProgressBar>>>,
}

impl Bars {
    fn new() -> Bars {
        Bars {
            multi: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            bars: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// A line above the bars; plain stderr when the bars are hidden (not a terminal).
    fn line(&self, text: String) {
        if self.multi.is_hidden() {
            eprintln!("{text}");
        } else {
            let _ = self.multi.println(text);
        }
    }

    fn event(&self, p: Progress) {
        let mut bars = self.bars.lock().unwrap_or_else(|p| p.into_inner());
        match p {
            Progress::BlobStart { digest, size } => {
                let bar = self.multi.add(ProgressBar::new(size));
                bar.set_style(
                    ProgressStyle::with_template(
                        "{msg} [{bar:30}] {bytes}/{total_bytes} {binary_bytes_per_sec}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                );
                bar.set_message(digest.short().to_string());
                bars.insert(digest.to_string(), bar);
            }
            Progress::BlobBytes { digest, bytes } => {
                if let Some(b) = bars.get(digest.as_str()) {
                    b.inc(bytes);
                }
            }
            Progress::BlobDone { digest, size, how } => {
                if let Some(b) = bars.remove(digest.as_str()) {
                    b.finish_and_clear();
                }
                let how = match how {
                    BlobOutcome::Uploaded => "uploaded",
                    BlobOutcome::Mounted => "mounted",
                    BlobOutcome::Skipped => "exists",
                };
                self.line(format!("{} {how} ({size} bytes)", digest.short()));
            }
            Progress::Retry { what, reason } => {
                self.line(format!("retrying {what}: {reason}"));
            }
            Progress::Resumed { digest, offset } => {
                self.line(format!("{} resumed at byte {offset}", digest.short()));
            }
            Progress::Manifest {
                reference, written, ..
            } => {
                if written {
                    self.line(format!("manifest {reference} written"));
                }
            }
        }
    }

    fn finish(&self) {
        for (_, b) in self.bars.lock().unwrap_or_else(|p| p.into_inner()).drain() {
            b.finish_and_clear();
        }
        let _ = self.multi.clear();
    }
}
