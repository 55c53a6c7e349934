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

/// `docker load -i archive`; its stdout (the tags loaded). Panics with Docker's error.
pub fn docker_load(archive: &Path) -> String {
    let o = Command::new("docker")
        .arg("load")
        .arg("-i")
        .arg(archive)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "docker load {}: {}",
        archive.display(),
        stderr(&o)
    );
    stdout(&o)
}

/// The loopback address (`127.0.0.1:PORT`) Docker published for `container_port` (e.g.
/// `"8000/tcp"`) of container `id`.
pub fn docker_port(id: &str, container_port: &str) -> Result<String, String> {
    let o = Command::new("docker")
        .args(["port", id, container_port])
        .output()
        .map_err(|e| format!("docker port: {e}"))?;
    let line = stdout(&o).lines().next().unwrap_or_default().to_string();
    match line.rsplit_once(':') {
        Some((_, port)) if o.status.success() && !port.is_empty() => {
            Ok(format!("127.0.0.1:{port}"))
        }
        _ => Err(format!(
            "docker port {id} {container_port}: no published port ({}{})",
            line,
            stderr(&o)
        )),
    }
}

/// The `infer-serve` binary the runtime and bench tests start on loopback. It needs the
/// `synthetic` backend (a cost model for overload, drain and tuning tests), which images never
/// carry, and the ONNX Runtime backend, so it is NOT the statically linked image runtime of
/// `INFER_SERVE_BIN`.
///
/// `INFER_SERVE_TEST_BIN` points at a binary built elsewhere (`scripts/test.sh`: the one
/// `cargo test --workspace` builds, with both backends through infer-build's dev-dependency);
/// otherwise it is built once per test run into `target/serve-it` (its own target dir: the
/// outer `cargo test` holds the lock on the main one).
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

/// How a matrix copy points a base-image row at a local base.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseRow {
    /// Add a copy of the row under the new reference; the original row stays.
    Append,
    /// Rename the row's reference to the new one.
    Replace,
}

/// A `--matrix DIR` copy of the shipped matrix data at `dir` in which the base-image row whose
/// reference is `chosen` is pointed at `base` (appended as a new row or renamed, as `how` says).
pub fn matrix_with_base(dir: &Path, chosen: &str, base: &str, how: BaseRow) -> PathBuf {
    for file in [
        "matrix/tensorrt.toml",
        "matrix/cuda.toml",
        "matrix/gpus.toml",
        "matrix/runtime-libraries.toml",
        "base-images/images.toml",
    ] {
        let mut text = std::fs::read_to_string(root().join(file)).unwrap();
        if file == "base-images/images.toml" {
            let reference = format!("reference = \"{chosen}\"");
            let at = text
                .find(&reference)
                .unwrap_or_else(|| panic!("{chosen} not in {file}"));
            text = match how {
                BaseRow::Replace => text.replace(&reference, &format!("reference = \"{base}\"")),
                BaseRow::Append => {
                    let start = text[..at].rfind("[[image]]").unwrap();
                    let end = text[at..].find("[[image]]").map_or(text.len(), |e| at + e);
                    let row = text[start..end].replace(chosen, base);
                    format!("{text}\n{row}")
                }
            };
        }
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir.to_path_buf()
}

/// Read an HTTP/1.1 request head from `s`, as the test servers do: the bytes read so far (the
/// head and whatever part of the body came with it) and where the head ends (after its blank
/// line). `None` when the peer closes first or the head passes 64 KiB.
pub fn read_request_head(s: &mut impl std::io::Read) -> std::io::Result<Option<(Vec<u8>, usize)>> {
    let mut buf = Vec::new();
    let mut tmp = [0u8; 16384];
    loop {
        let n = s.read(&mut tmp)?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&tmp[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(Some((buf, i + 4)));
        }
        if buf.len() > 64 * 1024 {
            return Ok(None);
        }
    }
}

/// A loopback TCP server for the test servers (hostile registries, fault proxies): each
/// connection is handed to `handle` on a thread of its own, with the flag that is set when the
/// server is dropped.
pub struct Server {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    pub fn start(
        handle: impl Fn(std::net::TcpStream, &std::sync::atomic::AtomicBool) + Send + Sync + 'static,
    ) -> Server {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let handle = Arc::new(handle);
        let flag = stop.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Ordering::Relaxed) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let (handle, flag) = (handle.clone(), flag.clone());
                std::thread::spawn(move || handle(conn, &flag));
            }
        });
        Server { addr, stop }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = std::net::TcpStream::connect(&self.addr);
    }
}

/// The example MLP (`examples/mlp/mlp.onnx`) as `runtime.toml` describes it, from the
/// runtime's own fixture (`crates/infer-serve/testdata/mlp.runtime.toml`): its model, inputs and
/// outputs, followed by `tail` (the test's batching, engine and server tables).
pub fn mlp_runtime_config(tail: &str) -> String {
    let path = root().join("crates/infer-serve/testdata/mlp.runtime.toml");
    let fixture = std::fs::read_to_string(&path).unwrap();
    let head = &fixture[..fixture
        .find("[batching]")
        .expect("the fixture has [batching]")];
    format!("{head}{tail}")
}
