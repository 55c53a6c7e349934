//! `infer-build slim [NAME]`: build a slim GPU base (image A plus the ELF closure of selected
//! files of image B, `docs/slim-bases.md`) into an OCI layout and print its size report.
//!
//! The definition is named (`base-images/slim/`, embedded or under `--matrix DIR`), read from
//! `--definition FILE`, or chosen for an engine from its metadata (`--engine-meta FILE`). Each
//! image comes from `--base-layout`/`--builder-layout DIR` or is pulled from its reference by
//! `registry::pull` (pinned by the definition's digest or the `--lock FILE`). The work is
//! `pipeline::slim`; this file turns flags into its request and prints the result.

use std::path::{Path, PathBuf};

use clap::Args;

use crate::error::Error;
use crate::pipeline::slim::{slim, ImageSource, SlimRequest};
use crate::pipeline::Notes;
use crate::report::{SlimChoice, SlimOutput, SlimSource};
use crate::slim::def::{self, Definition, ImageRef, Needs, Tactic};
use crate::slim::image;

#[derive(Debug, Args)]
pub(crate) struct SlimArgs {
    /// A definition of `base-images/slim/` by name, e.g. `trt10-cuda12-vc`.
    #[arg(value_name = "NAME")]
    pub name: Option<String>,
    /// Read the definition from this TOML file instead (format: docs/slim-bases.md).
    #[arg(long, value_name = "FILE", conflicts_with = "name")]
    pub definition: Option<PathBuf>,
    /// Choose the definition that serves this TensorRT engine, from its metadata (`meta.json` of
    /// the engine cache): version-compatible or full, and its TensorRT version.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["name", "definition"])]
    pub engine_meta: Option<PathBuf>,
    /// A tactic source the engine's build enabled: cudnn, cublas or cublaslt (repeatable);
    /// takes the selections of the definition that are only needed with it.
    #[arg(long = "tactic", value_name = "SOURCE")]
    pub tactics: Vec<String>,
    /// OCI layout holding the base image (image A); default: pull its reference.
    #[arg(long, value_name = "DIR")]
    pub base_layout: Option<PathBuf>,
    /// OCI layout holding the builder image (image B); default: pull its reference.
    #[arg(long, value_name = "DIR")]
    pub builder_layout: Option<PathBuf>,
    /// Keep pulled images here (`DIR/base`, `DIR/builder`) and reuse their blobs next time;
    /// default: a temporary directory inside --out, removed afterwards.
    #[arg(long, value_name = "DIR")]
    pub pull_dir: Option<PathBuf>,
    /// Lock file pinning the images the definition names without a digest: a pinned image is
    /// pulled (and read from a layout) by that digest, an unpinned one is pinned at its first pull.
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// Re-resolve the tags of pulled images even when the lock file pins them, and re-pin.
    #[arg(long, requires = "lock")]
    pub update_lock: bool,
    /// Build even when an image is pinned neither by the definition nor by a lock file (the
    /// result then depends on what the tag points at today).
    #[arg(long)]
    pub allow_unpinned: bool,
    /// Pull over plain HTTP (no TLS). Only for registries on a trusted network or loopback.
    #[arg(long)]
    pub insecure: bool,
    /// Trust the CA certificates in this PEM file (default: `$SSL_CERT_FILE`, else the web PKI).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Docker config file for credentials (default: `$DOCKER_CONFIG/config.json`, else
    /// `~/.docker/config.json`).
    #[arg(long, value_name = "FILE")]
    pub docker_config: Option<PathBuf>,
    /// The OCI layout to write the slim image into, tagged with the definition's name
    /// (default `out/<name>`); other images already in it keep their tags.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Print one JSON document (definition, images, copied and excluded files, size report).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub matrix: super::MatrixArgs,
}

pub(super) fn run(args: SlimArgs) -> Result<(), Error> {
    let tactics = parse_tactics(&args.tactics)?;
    let (definition, chosen_for) = definition(&args, &tactics)?;
    let needs = Needs {
        tactics: match &chosen_for {
            Some(c) => c.1.tactics.clone(),
            None => tactics.iter().copied().collect(),
        },
    };
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| Path::new("out").join(&definition.name));
    let quiet = args.json;
    let note: Notes = std::sync::Arc::new(move |text: &str| {
        if !quiet {
            eprintln!("{text}");
        }
    });
    let s = slim(
        SlimRequest {
            definition,
            needs,
            lock: args.lock.clone(),
            update_lock: args.update_lock,
            allow_unpinned: args.allow_unpinned,
            base_layout: args.base_layout.clone(),
            builder_layout: args.builder_layout.clone(),
            pull_dir: args.pull_dir.clone(),
            out: out.clone(),
            client: super::registry_client(
                args.insecure,
                args.ca_cert.clone(),
                args.docker_config.clone(),
            ),
        },
        &note,
    )?;
    let (def, built) = (&s.definition, &s.built);
    if args.json {
        let image_doc = |src: &ImageSource, r: &ImageRef, digest: &str| SlimSource {
            reference: r.reference.clone(),
            digest: digest.to_string(),
            source: if src.pulled.is_some() {
                "pull"
            } else {
                "layout"
            }
            .into(),
            layout: src.layout.display().to_string(),
            bytes_downloaded: src.pulled.as_ref().map(|p| p.bytes_downloaded),
        };
        let doc = SlimOutput {
            definition: def.name.clone(),
            engine: def.engine.as_str().into(),
            chosen_for: chosen_for.as_ref().map(|(choice, _)| choice.clone()),
            tactics: s
                .needs
                .tactics
                .iter()
                .map(|t| tactic_name(*t).into())
                .collect(),
            base: image_doc(&s.base, &def.base, &s.base_digest),
            builder: image_doc(&s.builder, &def.builder, &s.builder_digest),
            layout: out.display().to_string(),
            tag: def.name.clone(),
            manifest_digest: built.manifest_digest.clone(),
            copied: built.plan.copy.keys().map(|p| format!("/{p}")).collect(),
            kept_base: built.plan.kept_base.clone(),
            excluded: built.plan.excluded.clone(),
            report: built.report.clone(),
        };
        return super::print_json("the slim report", &doc);
    }
    eprint!("{}", image::render_excluded(&built.plan));
    for p in &built.plan.kept_base {
        eprintln!("kept the base's /{p} (on_conflict = \"base\")");
    }
    eprintln!(
        "copied {} entries from {}@{}",
        built.plan.copy.len(),
        def.builder.reference,
        s.builder_digest
    );
    eprint!("{}", built.report.render());
    eprintln!(
        "slim base {} {} in {}",
        def.name,
        built.manifest_digest,
        out.display()
    );
    Ok(())
}

type Chosen = (SlimChoice, Needs);

/// The definition to build, and, with `--engine-meta`, what the engine is and needs.
fn definition(args: &SlimArgs, tactics: &[Tactic]) -> Result<(Definition, Option<Chosen>), Error> {
    if let Some(file) = &args.definition {
        // A regular file of bounded size: a FIFO or device is refused before any read.
        let bytes = crate::oci::dir::read_file(file, 1 << 20, "slim definition")
            .map_err(|e| Error::Usage(format!("--definition {}: {e}", file.display())))?;
        let text = String::from_utf8(bytes)
            .map_err(|_| Error::Usage(format!("--definition {}: not UTF-8", file.display())))?;
        return Ok((Definition::parse(&file.display().to_string(), &text)?, None));
    }
    let defs = image::definitions(args.matrix.matrix.as_deref())?;
    if let Some(name) = &args.name {
        return Ok((def::find(&defs, name)?.clone(), None));
    }
    let Some(file) = &args.engine_meta else {
        return Err(Error::Usage(format!(
            "name a slim base definition ({}), or pass --definition FILE or --engine-meta FILE",
            defs.iter()
                .map(|d| d.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let bytes = crate::oci::dir::read_file(file, crate::oci::MAX_DOCUMENT, "engine metadata")
        .map_err(|e| Error::Usage(format!("--engine-meta {}: {e}", file.display())))?;
    let meta = infer_spec::engine::EngineMeta::from_json(&bytes)
        .map_err(|e| Error::Usage(format!("--engine-meta {}: {e}", file.display())))?;
    let Some(gpu) = &meta.gpu else {
        return Err(Error::Usage(format!(
            "--engine-meta {}: target {} is a CPU (tract) engine; slim GPU bases serve TensorRT engines",
            file.display(),
            meta.target
        )));
    };
    let (kind, needs, tensorrt) = def::engine_needs(gpu, tactics);
    let chosen = def::choose(&defs, kind, Some(&tensorrt))?.clone();
    let why = SlimChoice {
        engine_meta: file.display().to_string(),
        target: meta.target.clone(),
        kind: kind.as_str().into(),
        tensorrt: tensorrt.clone(),
    };
    if !args.json {
        eprintln!(
            "engine {} ({} engine, TensorRT {tensorrt}) → slim base {}",
            meta.target,
            kind.as_str(),
            chosen.name
        );
    }
    Ok((chosen, Some((why, needs))))
}

fn parse_tactics(list: &[String]) -> Result<Vec<Tactic>, Error> {
    list.iter()
        .map(|t| match t.as_str() {
            "cudnn" => Ok(Tactic::Cudnn),
            "cublas" => Ok(Tactic::Cublas),
            "cublaslt" => Ok(Tactic::Cublaslt),
            other => Err(Error::Usage(format!(
                "--tactic {other}: expected cudnn, cublas or cublaslt"
            ))),
        })
        .collect()
}

fn tactic_name(t: Tactic) -> &'static str {
    match t {
        Tactic::Cudnn => "cudnn",
        Tactic::Cublas => "cublas",
        Tactic::Cublaslt => "cublaslt",
    }
}
