//! Helpers shared by the integration tests: paths to the built binaries, temp dirs, and
//! the rule for skipping when an external tool is absent.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `infer-build` binary built for this test run.
pub fn infer_build() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infer-build"))
}

/// Run `infer-build` with `args` from `cwd` and return its output.
pub fn run_in(cwd: &Path, args: &[&str]) -> Output {
    infer_build()
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("spawn infer-build")
}

/// Run `infer-build` with `args` from the repository root.
pub fn run(args: &[&str]) -> Output {
    run_in(&root(), args)
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// True when `tool` can be run (`tool --version` or `tool version` starts). When it cannot,
/// prints why the calling test is skipped; CI installs every tool so nothing is skipped there.
pub fn have_tool(tool: &str, test: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping {test}: `{tool}` is not installed (.ci/run installs it)");
    }
    ok
}

/// The Python interpreter with the test requirements (`tests/requirements.txt`) installed:
/// `$INFER_BUILD_PYTHON`, else `.venv/bin/python` made by `.ci/run`, else `python3`.
pub fn python() -> PathBuf {
    if let Ok(p) = std::env::var("INFER_BUILD_PYTHON") {
        return PathBuf::from(p);
    }
    let venv = root().join(".venv/bin/python");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// True when the Docker engine answers; prints the reason for skipping otherwise.
pub fn have_docker(test: &str) -> bool {
    let ok = Command::new("docker")
        .args(["info", "--format", "{{.ServerVersion}}"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping {test}: no Docker engine answers `docker info`");
    }
    ok
}

/// The `infer-serve` binary the runtime and bench tests start on loopback. It needs the
/// `synthetic` backend (a cost model for overload, drain and tuning tests), which images never
/// carry, and the ONNX Runtime backend, so it is NOT the statically linked image runtime of
/// `INFER_SERVE_BIN`.
///
/// `INFER_SERVE_TEST_BIN` points at a binary built elsewhere; otherwise it is built once per
/// test run into `target/serve-it` (its own target dir: the outer `cargo test` holds the lock
/// on the main one). `scripts/test.sh` builds it first, so the tests find it up to date.
pub fn serve_test_binary() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(p) = std::env::var("INFER_SERVE_TEST_BIN") {
            return PathBuf::from(p);
        }
        let target = root().join("target/serve-it");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let status = Command::new(cargo)
            .current_dir(root())
            .args([
                "build",
                "-q",
                "-p",
                "infer-serve",
                "--features",
                "synthetic,onnxruntime",
                "--target-dir",
            ])
            .arg(&target)
            .status()
            .expect("run cargo build -p infer-serve");
        assert!(status.success(), "cargo build -p infer-serve failed");
        target.join("debug/infer-serve")
    })
    .clone()
}

/// The id of the first GPU target in `infer-build plan --json` output.
pub fn first_gpu_target(plan: &serde_json::Value) -> String {
    plan["targets"]
        .as_array()
        .expect("plan targets")
        .iter()
        .find(|t| t["kind"] == "gpu")
        .expect("a GPU target in the plan")["id"]
        .as_str()
        .expect("a target id")
        .to_string()
}
