//! `infer-build inspect LAYOUT [--json]`: the images of an OCI layout, per target: tag,
//! platform, manifest digest, layers (media type, size, digest), annotations, config summary
//! and totals. Every blob read is verified against its digest.

use std::path::PathBuf;

use clap::Args;

use crate::error::Error;
use crate::report::Inspection;

// `inspect REF`: images in a registry (owned by the registry engineer, kept apart).
mod remote;

#[derive(Debug, Args)]
pub(crate) struct InspectArgs {
    /// An OCI image layout directory (as written by `infer-build build`), an `oci-archive`
    /// file (`build --output oci-archive:FILE`), or a registry reference
    /// `REGISTRY/REPO[:TAG|@DIGEST]`.
    pub input: PathBuf,
    /// Print one JSON document to stdout instead of the human summary on stderr.
    #[arg(long)]
    pub json: bool,
    /// Registry reference only: list what is attached to each manifest (warm-up manifests).
    #[arg(long)]
    pub referrers: bool,
    /// Registry reference only: plain HTTP instead of TLS.
    #[arg(long)]
    pub insecure: bool,
    /// Registry reference only: trust the CA certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
}

pub(super) fn run(args: InspectArgs) -> Result<(), Error> {
    if let Some(reference) = args.input.to_str().filter(|s| remote::is_reference(s)) {
        return remote::run(reference, &args);
    }
    if args.referrers || args.insecure || args.ca_cert.is_some() {
        return Err(Error::Usage(format!(
            "--referrers, --insecure and --ca-cert need a registry reference; {} is a local path",
            args.input.display()
        )));
    }
    let doc = crate::pipeline::inspect(&args.input)?;
    if args.json {
        super::print_json("the inspection", &doc)?;
    } else {
        eprint!("{}", render(&doc));
    }
    Ok(())
}

fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// `s` with every control character (C0, DEL, C1: terminal escapes, carriage returns,
/// newlines) written as an escape, so text from a layout cannot drive the terminal or forge
/// lines of the summary.
fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.push_str(&c.escape_unicode().to_string());
        } else {
            out.push(c);
        }
    }
    out
}

/// The summary, every line cleaned of control characters.
fn render(doc: &Inspection) -> String {
    render_raw(doc).lines().map(|l| clean(l) + "\n").collect()
}

fn render_raw(doc: &Inspection) -> String {
    let mut s = format!("layout {}\n", clean(&doc.layout));
    for i in &doc.indexes {
        s += &format!("index {} {}\n", join(&i.tags), i.digest);
        for m in &i.manifests {
            let target = m
                .annotations
                .get("dev.infer-build.target")
                .map_or("?", String::as_str);
            s += &format!("  {:<16} {}\n", clean(target), m.digest);
        }
    }
    for img in &doc.images {
        s += &render_image(img);
    }
    s += &format!("\ntotal {}\n", human(doc.total_size));
    s
}

fn render_image(img: &crate::report::InspectedImage) -> String {
    // An artifact (the split layout's ModelPack manifest) has a type, not a platform.
    let kind = match &img.artifact_type {
        Some(t) => format!("artifact {t}"),
        None => format!(
            "{}/{}",
            img.platform.os.as_deref().unwrap_or("?"),
            img.platform.architecture.as_deref().unwrap_or("?")
        ),
    };
    let c = &img.config;
    let mut s = format!(
        "\nimage {} ({kind})\n  manifest {}\n  config   {} ({})\n",
        join(&img.tags),
        img.manifest_digest,
        c.digest,
        human(c.size),
    );
    s += &format!(
        "  entrypoint {}  user {}  ports {}\n",
        json_text(&c.entrypoint),
        json_text(&c.user),
        c.exposed_ports
            .as_ref()
            .map(|o| o.keys().cloned().collect::<Vec<_>>().join(","))
            .unwrap_or_default()
    );
    let pairs = img.pairs_with.as_deref().unwrap_or("?");
    match (img.part.as_deref(), img.artifact_type.as_deref()) {
        (_, Some(crate::assemble::split::modelpack::ARTIFACT_TYPE)) => {
            s += &format!("  ModelPack manifest of the model image {pairs} (same layer blobs)\n");
        }
        (Some("runtime"), _) => {
            s += &format!(
                "  runtime image: serves the model mounted at {}\n",
                crate::assemble::split::MOUNT
            );
        }
        (Some("model"), _) => {
            s += &format!(
                "  model image: mount at {} in the runtime image {pairs}\n",
                crate::assemble::split::MOUNT
            );
        }
        _ => {}
    }
    if img.annotations.contains_key("dev.infer-build.models") {
        s += &format!("  models {}\n", img.models.join(", "));
    }
    s += "  layers:\n";
    for l in &img.layers {
        s += &format!(
            "    {:>10}  {:<42} {}{}\n",
            human(l.size),
            clean(
                l.media_type
                    .trim_start_matches("application/vnd.oci.image.")
            ),
            l.digest,
            l.role.as_ref().map_or(String::new(), |r| format!("  {r}"))
        );
    }
    s += &format!(
        "    {:>10}  total (layers + config)\n",
        human(img.total_size)
    );
    if let Some(r) = &img.slim_report {
        s += "  slim size report:\n";
        for line in r.render().lines() {
            s += &format!("    {line}\n");
        }
    }
    s += "  annotations:\n";
    for (k, v) in &img.annotations {
        s += &format!("    {} = {}\n", clean(k), clean(v));
    }
    s
}

/// A value as JSON text (`null`, `"root"`, `["/infer-serve"]`), as the summary shows config
/// fields.
fn json_text<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn join(v: &[String]) -> String {
    v.iter().map(|x| clean(x)).collect::<Vec<_>>().join(", ")
}
