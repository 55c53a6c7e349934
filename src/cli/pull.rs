//! `infer-build pull REF`: pull an image (a tag resolves through its index to linux/amd64)
//! into an OCI layout, every blob verified by digest, and print the resolved digest. Without
//! `--out` the image goes into the shared base cache that `build` uses for GPU targets
//! (`bases` under the cache root, [`crate::cache`]), named `REF@DIGEST`; with `--out DIR` it is named
//! by its tag, ready for `build --base-layout DIR --base-tag TAG`.

use std::path::PathBuf;

use clap::Args;
use serde_json::json;

use crate::error::Error;
use crate::pipeline::PullRequest;

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
    super::check_credentials_file("--authfile", args.authfile.as_deref())?;
    let req = PullRequest {
        reference: args.reference.clone(),
        out: args.out.clone(),
        lock: args.lock.clone(),
        update_lock: args.update_lock,
        registries_conf: args.registries_conf.clone(),
        client: super::registry_client(args.insecure, args.ca_cert.clone(), args.authfile.clone()),
    };
    let p = crate::pipeline::pull(&req)?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn flags_parse() {
        let cli = crate::cli::Cli::try_parse_from([
            "infer-build",
            "pull",
            "r.io/a:1",
            "--lock",
            "l",
            "--update-lock",
            "--insecure",
        ])
        .expect("arguments parse");
        let crate::cli::Command::Pull(a) = cli.command else {
            panic!("not pull");
        };
        assert!(a.insecure && a.update_lock);
        assert_eq!(a.lock, Some(PathBuf::from("l")));
    }
}
