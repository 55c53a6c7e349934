//! `infer-build login REGISTRY -u USER`: read the password from standard input, check it
//! against the registry, and store it where skopeo and podman keep credentials (the containers
//! `auth.json`, same format), for `push`, `pull`, `inspect` and `build` to use.

use std::io::Read as _;
use std::path::PathBuf;

use clap::Args;

use crate::error::Error;
use crate::registry::auth;
use crate::registry::{ClientOptions, RegistryHost};

#[derive(Debug, Args)]
pub(crate) struct LoginArgs {
    /// The registry: HOST[:PORT].
    pub registry: String,
    /// The user name.
    #[arg(short, long)]
    pub username: String,
    /// Read the password from standard input. It is always read from there (never from the
    /// command line); the flag is accepted for scripts written for `docker login`.
    #[arg(long)]
    pub password_stdin: bool,
    /// The credentials file to write (default: `$REGISTRY_AUTH_FILE`, else
    /// `$XDG_RUNTIME_DIR/containers/auth.json`, else `~/.config/containers/auth.json`).
    #[arg(long, value_name = "FILE")]
    pub authfile: Option<PathBuf>,
    /// Plain HTTP (loopback or trusted networks). Without it the check is verified TLS.
    #[arg(long)]
    pub insecure: bool,
    /// Trust the CA certificates in this PEM file (default: `$SSL_CERT_FILE`, else the web PKI).
    #[arg(long, value_name = "FILE")]
    pub ca_cert: Option<PathBuf>,
    /// Print what was done as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// The longest password read from standard input.
const MAX_PASSWORD: u64 = 64 << 10;

pub(super) fn run(args: LoginArgs) -> Result<(), Error> {
    let registry = args
        .registry
        .strip_prefix("https://")
        .or_else(|| args.registry.strip_prefix("http://"))
        .unwrap_or(&args.registry)
        .trim_end_matches('/');
    // The canonical name ([`RegistryHost`]): the one key any spelling of it finds.
    let registry = RegistryHost::parse(registry)
        .map_err(|why| {
            Error::Usage(format!(
                "login {}: give the registry as HOST[:PORT]: {why}",
                args.registry
            ))
        })?
        .to_string();
    if args.username.is_empty() || args.username.contains(':') {
        return Err(Error::Usage(
            "--username: must not be empty or hold `:`".into(),
        ));
    }
    let mut password = String::new();
    std::io::stdin()
        .take(MAX_PASSWORD + 1)
        .read_to_string(&mut password)
        .map_err(|e| Error::Usage(format!("cannot read the password from standard input: {e}")))?;
    if password.len() as u64 > MAX_PASSWORD {
        return Err(Error::Usage(format!(
            "the password on standard input is longer than {MAX_PASSWORD} bytes"
        )));
    }
    let password = password.trim_end_matches(['\n', '\r']).to_string();
    if password.is_empty() {
        return Err(Error::Usage(
            "no password on standard input (pipe it in: `echo \"$TOKEN\" | infer-build login REGISTRY -u USER --password-stdin`)".into(),
        ));
    }
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    let file = auth::login_file(args.authfile.as_deref(), &var).ok_or_else(|| {
        Error::Usage(
            "no place for the credentials file: set --authfile, REGISTRY_AUTH_FILE, XDG_RUNTIME_DIR or HOME".into(),
        )
    })?;
    let opts = ClientOptions {
        insecure: args.insecure,
        ca_cert: args.ca_cert.clone(),
        ..ClientOptions::default()
    };
    let report = auth::login(&registry, &args.username, &password, &file, &opts)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).map_err(|e| Error::Usage(e.to_string()))?
        );
    }
    if !report.verified {
        eprintln!(
            "note: {registry} answered without asking for credentials, so they could not be checked"
        );
    }
    eprintln!(
        "login succeeded: credentials for {registry} stored in {}",
        report.file.display()
    );
    Ok(())
}
