//! `infer-build pull REF`: pull an image (a tag resolves through its index to linux/amd64)
//! into an OCI layout, every blob verified by digest, and print the resolved digest. Without
//! `--out` the image goes into the shared base cache that `build` uses for GPU targets
//! (`bases` under the cache root, [`crate::cache`]), named `REF@DIGEST`; with `--out DIR` it is named
//! by its tag, ready for `build --base-layout DIR --base-tag TAG`.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::error::Error;
use crate::registry::pull::PullOptions;
use crate::registry::{self, Reference};

#[derive(Debug, Args)]
pub(crate) struct PullArgs {
    /// The image: REGISTRY[:PORT]/REPO[:TAG][@sha256:HEX].
    pub reference: String,
    /// The OCI layout to pull into (default: the shared base cache,
    /// `$INFER_BUILD_CACHE_DIR/bases`, else `$XDG_CACHE_HOME/infer-build/bases`, else
    /// `~/.cache/infer-build/bases`).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Lock file: use the digest it pins for REF instead of the tag, record the resolved one.
    #[arg(long, value_name = "FILE")]
    pub lock: Option<PathBuf>,
    /// Re-resolve the tag even when --lock pins a digest, and record the new one.
    #[arg(long)]
    pub update_lock: bool,
    /// Plain HTTP (loopback or trusted networks). Without it every connection is verified TLS.
    #[arg(long)]
    pub insecure: bool,
    /// Trust the CA certificates in this PEM file (default: `$SSL_CERT_FILE`, else the web PKI).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Read credentials only from this containers `auth.json` or Docker `config.json`
    /// (default `$REGISTRY_AUTH_FILE`, then the usual search; see docs/registry.md).
    #[arg(long, value_name = "FILE")]
    pub authfile: Option<PathBuf>,
    /// Mirrors and remapped registries from this registries.conf (containers-registries.conf(5))
    /// instead of `$CONTAINERS_REGISTRIES_CONF` or the usual files (see docs/registry.md).
    #[arg(long, value_name = "FILE")]
    pub registries_conf: Option<PathBuf>,
    /// Print one JSON document (reference, digest, index digest, layout, name, bytes, source).
    #[arg(long)]
    pub json: bool,
}

pub(super) fn run(args: PullArgs) -> Result<(), Error> {
    let (dest, named_by_digest) =
        destination(&args, crate::cache::path(crate::cache::Entry::Bases, None))?;
    super::check_credentials_file("--authfile", args.authfile.as_deref())?;
    let opts = PullOptions {
        client: super::registry_client(args.insecure, args.ca_cert.clone(), args.authfile.clone()),
        lock: args.lock.clone(),
        update_lock: args.update_lock,
        platform: None,
        name_by_digest: named_by_digest,
        registries: Some(std::sync::Arc::new(registry::sources::Registries::load(
            args.registries_conf.as_deref(),
            &registry::env_var,
        )?)),
    };
    let p = registry::pull_with(&args.reference, &dest, &opts)?;
    if args.json {
        let doc = json!({
            "reference": p.reference,
            "digest": p.digest,
            "index_digest": p.index_digest,
            "layout": p.layout.display().to_string(),
            "ref_name": p.ref_name,
            "bytes_downloaded": p.bytes_downloaded,
            "blobs_reused": p.blobs_reused,
            "offline": p.offline,
            "served_by": p.served_by,
            "lock": args.lock.as_ref().map(|l| l.display().to_string()),
        });
        return super::print_json("the pull report", &doc);
    }
    let how = if p.offline {
        "already in the layout, registry not contacted".to_string()
    } else {
        format!(
            "{} bytes downloaded, {} blobs reused",
            p.bytes_downloaded, p.blobs_reused
        )
    };
    eprintln!("pulled {} {} ({how})", p.reference, p.digest);
    if let Some(s) = &p.served_by {
        for failed in &s.mirrors_failed {
            eprintln!("mirror passed over: {failed}");
        }
        let what = if s.mirror { "mirror " } else { "" };
        eprintln!("served by {what}{}", s.place);
    }
    if let Some(i) = &p.index_digest {
        eprintln!("index {i}");
    }
    eprintln!("layout {} name {}", p.layout.display(), p.ref_name);
    if let Some(l) = &args.lock {
        eprintln!("lock file {} pins {}", l.display(), p.digest);
    }
    Ok(())
}

/// Where to pull and whether images are named `REF@DIGEST` (the shared cache) or by tag.
/// Checks the flags before any I/O.
fn destination(args: &PullArgs, cache: Option<PathBuf>) -> Result<(PathBuf, bool), Error> {
    let r = Reference::parse(&args.reference)?;
    if args.update_lock && args.lock.is_none() {
        return Err(Error::Usage(
            "--update-lock needs --lock FILE (the lock file to update)".into(),
        ));
    }
    if args.update_lock && r.digest.is_some() {
        return Err(Error::Usage(format!(
            "--update-lock: {} names a digest, there is no tag to re-resolve",
            args.reference
        )));
    }
    match &args.out {
        Some(out) => Ok((out.clone(), false)),
        None => cache.map(|c| (c, true)).ok_or_else(|| {
            Error::Usage(crate::cache::NoCacheDir { flag: "--out DIR" }.to_string())
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> PullArgs {
        let cli = crate::cli::Cli::try_parse_from([&["infer-build", "pull"], args].concat())
            .expect("arguments parse");
        match cli.command {
            crate::cli::Command::Pull(a) => a,
            other => panic!("not pull: {other:?}"),
        }
    }

    #[test]
    fn default_destination_is_the_cache_named_by_digest() {
        let a = parse(&["127.0.0.1:5000/bases/cuda:12"]);
        let (dest, by_digest) = destination(&a, Some(PathBuf::from("/c/bases"))).unwrap();
        assert_eq!(dest, PathBuf::from("/c/bases"));
        assert!(by_digest);
        let a = parse(&["127.0.0.1:5000/bases/cuda:12", "--out", "x"]);
        assert_eq!(
            destination(&a, Some(PathBuf::from("/c"))).unwrap(),
            (PathBuf::from("x"), false)
        );
        let a = parse(&["127.0.0.1:5000/bases/cuda:12"]);
        let e = destination(&a, None).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--out DIR"), "{e}");
    }

    #[test]
    fn bad_flag_combinations_are_usage_errors() {
        let d = format!("@sha256:{}", "a".repeat(64));
        for (args, want) in [
            (vec!["r.io/a:1", "--update-lock"], "needs --lock"),
            (
                vec![&*format!("r.io/a{d}"), "--lock", "l", "--update-lock"],
                "names a digest",
            ),
            (vec!["r.io/A:1"], "invalid reference"),
            (vec!["r.io/a:-x"], "invalid reference"),
        ] {
            let a = parse(&args);
            let e = destination(&a, Some(PathBuf::from("/c"))).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{args:?}");
            assert!(e.to_string().contains(want), "{args:?}: {e}");
        }
        let a = parse(&["r.io/a:1", "--lock", "l", "--update-lock", "--insecure"]);
        assert!(destination(&a, Some(PathBuf::from("/c"))).is_ok());
        assert!(a.insecure && a.update_lock);
    }
}
