//! `infer-build inspect REF [--referrers]`: an image in a registry (the registry module does
//! the talking; this renders). Kept apart from layout inspection, which `inspect.rs` owns.

use super::InspectArgs;
use crate::error::Error;
use crate::registry::auth::Keychain;
use crate::registry::inspect::{inspect, RemoteImage};
use crate::registry::{ClientOptions, Reference};

/// True when `input` reads as a registry reference rather than a local path: it does not
/// exist on disk and its first component looks like a registry host.
pub(super) fn is_reference(input: &str) -> bool {
    if std::path::Path::new(input).exists() {
        return false;
    }
    let first = input.split('/').next().unwrap_or("");
    input.contains('/') && (first.contains('.') || first.contains(':') || first == "localhost")
}

pub(super) fn run(input: &str, args: &InspectArgs) -> Result<(), Error> {
    let reference = Reference::parse(input)?;
    let opts = ClientOptions {
        insecure: args.insecure,
        ca_cert: args.ca_cert.clone(),
        keychain: Keychain::default(),
        ..ClientOptions::default()
    };
    let image = inspect(&reference, &opts, args.referrers)?;
    if !args.json {
        print_human(&image);
    } else {
        println!(
            "{}",
            serde_json::to_string_pretty(&image).map_err(|e| Error::Usage(e.to_string()))?
        );
    }
    Ok(())
}

fn print_human(image: &RemoteImage) {
    eprintln!(
        "{} {} ({})",
        image.reference, image.digest, image.media_type
    );
    for m in &image.images {
        let platform = m
            .platform
            .as_ref()
            .map(|p| format!("{}/{}", p.os, p.architecture))
            .unwrap_or_default();
        let target = m
            .annotations
            .get("dev.infer-build.target")
            .cloned()
            .unwrap_or_default();
        eprintln!(
            "  {} {platform} {target} {} bytes in {} layers",
            m.digest,
            m.total_size,
            m.layers.len()
        );
        for l in &m.layers {
            eprintln!("    {} {:>12} {}", l.digest, l.size, l.media_type);
        }
        for (k, v) in &m.annotations {
            eprintln!("    {k} = {v}");
        }
        if let Some(refs) = &m.referrers {
            if refs.is_empty() {
                eprintln!("    referrers: none");
            }
            for r in refs {
                eprintln!(
                    "    referrer {} {} ({})",
                    r.digest,
                    r.artifact_type.as_deref().unwrap_or(&r.media_type),
                    r.source
                );
            }
        }
    }
    if let Some(p) = &image.plain_pull {
        eprintln!("  note: {}", p.note);
    }
    if let Some(refs) = &image.referrers {
        for r in refs {
            eprintln!(
                "  index referrer {} {} ({})",
                r.digest,
                r.artifact_type.as_deref().unwrap_or(&r.media_type),
                r.source
            );
        }
    }
}
