//! The command line: argument parsing (clap), dispatch to one file per command, and the one
//! place that renders errors for humans. Commands print human output and progress to stderr
//! and, with `--json`, exactly one JSON document to stdout.
//!
//! The CLI owns no logic of its own: each command turns validated arguments into calls to the
//! library modules and formats their results.
#![allow(
    clippy::disallowed_macros,
    reason = "the one module that writes to the terminal"
)]

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::error::{Error, EXIT_BAD_INPUT, EXIT_OK};

mod bench;
pub(crate) mod build;
mod check;
mod deploy;
mod engine;
mod inspect;
mod login;
mod plan;
mod pull;
mod push;
mod slim;

/// Compile an ONNX model recipe into slim, reproducible OCI images, one per GPU architecture.
#[derive(Debug, Parser)]
#[command(name = "infer-build", version, about, long_about = None, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// Options shared by commands that read a recipe.
#[derive(Debug, Args, Clone)]
pub(crate) struct MatrixArgs {
    /// Read the compatibility matrix from DIR instead of the copy built into this binary. DIR
    /// is the directory that holds `matrix/` and `base-images/` (as a checkout's root does),
    /// not `matrix/` itself: a copy of both with your changes, e.g. base images mirrored in your
    /// own registry. Set it once for a CI pipeline with INFER_BUILD_MATRIX.
    #[arg(long, value_name = "DIR", global = false, env = "INFER_BUILD_MATRIX")]
    pub matrix: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Validate a recipe and resolve every target; exit 2 on any problem, naming file:line:col.
    Check(check::CheckArgs),
    /// Show the build plan: one row per target with TensorRT, CUDA, driver floor, base image and tag.
    Plan(plan::PlanArgs),
    /// Build one target's engine into the content-addressed engine cache.
    Engine(engine::EngineArgs),
    /// Assemble the images (one per target) into an OCI layout, without a Docker daemon.
    Build(build::BuildArgs),
    /// Show the targets, layers, sizes and annotations of an OCI layout or registry reference.
    Inspect(inspect::InspectArgs),
    /// Pull an image by digest-verified streaming into an OCI layout (default: the base cache).
    Pull(pull::PullArgs),
    /// Push a layout to a registry: per-target tags, the index tag and warm-up manifests.
    Push(push::PushArgs),
    /// Check credentials against a registry and store them (containers auth.json, as skopeo).
    Login(login::LoginArgs),
    /// Write Kubernetes YAML for each target.
    Deploy(deploy::DeployArgs),
    /// Build a slim GPU base: a base image plus the shared-library closure of selected files
    /// of a builder image, with its size report.
    Slim(slim::SlimArgs),
    /// Load-test a V2 inference server, or sweep batching settings with `--tune`.
    Bench(bench::BenchArgs),
}

/// Parse the process arguments, run the command and return the process exit code.
pub fn main() -> i32 {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap prints help/version to stdout with exit 0 and usage errors to stderr.
            let code = if e.use_stderr() {
                EXIT_BAD_INPUT
            } else {
                EXIT_OK
            };
            let _ = e.print();
            return code;
        }
    };
    match run(cli.command) {
        Ok(()) => EXIT_OK,
        Err(e) => {
            report(&e);
            e.exit_code()
        }
    }
}

fn run(command: Command) -> Result<(), Error> {
    match command {
        Command::Check(a) => check::run(a),
        Command::Plan(a) => plan::run(a),
        Command::Engine(a) => engine::run(a),
        Command::Build(a) => build::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Pull(a) => pull::run(a),
        Command::Push(a) => push::run(a),
        Command::Login(a) => login::run(a),
        Command::Deploy(a) => deploy::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Slim(a) => slim::run(a),
    }
}

/// Render an error and its chain of causes once, to stderr.
pub(crate) fn report(e: &Error) {
    eprintln!("error: {e}");
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        eprintln!("  caused by: {cause}");
        source = cause.source();
    }
}

/// A `--json` document on standard output, canonical (keys sorted), one line.
pub(crate) fn print_json<T: serde::Serialize>(what: &str, doc: &T) -> Result<(), Error> {
    let bytes = crate::oci::image::encode(what, doc)?;
    println!("{}", String::from_utf8_lossy(&bytes));
    Ok(())
}

/// The pipeline's notes, one line each on standard error.
pub(crate) fn stderr_notes() -> crate::pipeline::Notes {
    std::sync::Arc::new(|line: &str| eprintln!("{line}"))
}

/// Registry client options from the flags `push` and `slim` share: `--insecure`, `--ca-cert`,
/// `--docker-config` (credentials from the environment too). A credentials file named on the
/// command line must exist: [`check_credentials_file`].
pub(crate) fn registry_client(
    insecure: bool,
    ca_cert: Option<std::path::PathBuf>,
    docker_config: Option<std::path::PathBuf>,
) -> crate::registry::ClientOptions {
    crate::registry::ClientOptions {
        insecure,
        ca_cert,
        keychain: crate::registry::auth::Keychain {
            docker_config,
            ignore_env: false,
        },
        notify: crate::registry::client::Notify(Some(std::sync::Arc::new(|text: &str| {
            eprintln!("note: {text}")
        }))),
        ..crate::registry::ClientOptions::default()
    }
}

/// A credentials file given by a flag (`--authfile`, `--docker-config`) must be a readable
/// file: a typo would otherwise push anonymously. Exit 2, naming the flag and the file.
pub(crate) fn check_credentials_file(
    flag: &str,
    path: Option<&std::path::Path>,
) -> Result<(), Error> {
    let Some(path) = path else { return Ok(()) };
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => match std::fs::File::open(path) {
            Ok(_) => Ok(()),
            Err(e) => Err(Error::Usage(format!(
                "{flag} {}: cannot read it: {e}",
                path.display()
            ))),
        },
        Ok(_) => Err(Error::Usage(format!(
            "{flag} {}: not a regular file",
            path.display()
        ))),
        Err(e) => Err(Error::Usage(format!("{flag} {}: {e}", path.display()))),
    }
}
