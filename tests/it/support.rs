//! Helpers shared by the integration tests: paths to the built binaries, temp dirs, and
//! the rule for skipping when an external tool is absent.

#![allow(
    dead_code,
    reason = "shared by test modules; not every test binary uses every helper"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

use infer_build::report::{BuildOutput, Inspection};

/// The repository root.
pub(crate) fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `infer-build` binary built for this test run.
pub(crate) fn infer_build() -> Command {
    Command::new(env!("CARGO_BIN_EXE_infer-build"))
}

/// Run `infer-build` with `args` from `cwd` and return its output.
pub(crate) fn run_in(cwd: &Path, args: &[&str]) -> Output {
    infer_build()
        .current_dir(cwd)
        .args(args)
        .output()
        .expect("spawn infer-build")
}

/// Run `infer-build` with `args` from the repository root.
pub(crate) fn run(args: &[&str]) -> Output {
    run_in(&root(), args)
}

/// Run `infer-build` with `args` (which ask for `--json`) from `cwd`, require success and read
/// its one JSON document on stdout as `T`, a report type of the library: tests then read
/// fields, not `serde_json::Value` paths, and a renamed field fails to compile or to parse.
pub(crate) fn cli_json<T: serde::de::DeserializeOwned>(cwd: &Path, args: &[&str]) -> T {
    let o = run_in(cwd, args);
    assert!(
        o.status.success(),
        "infer-build {}: {}",
        args.join(" "),
        stderr(&o)
    );
    serde_json::from_str(&stdout(&o)).unwrap_or_else(|e| {
        panic!(
            "infer-build {}: stdout is not the expected document: {e}\n{}",
            args.join(" "),
            stdout(&o)
        )
    })
}

/// `infer-build plan --json RECIPE [ARGS]`: the recipe's plan.
pub(crate) fn plan(recipe: &Path, args: &[&str]) -> infer_build::plan::BuildPlan {
    let recipe = recipe.to_str().expect("UTF-8 recipe path");
    let mut all = vec!["plan", "--json", recipe];
    all.extend(args);
    cli_json(&root(), &all)
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub(crate) fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// True when `tool` can be run (`tool --version` or `tool version` starts). When it cannot,
/// prints why the calling test is skipped; CI installs every tool so nothing is skipped there.
pub(crate) fn have_tool(tool: &str, test: &str) -> bool {
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
pub(crate) fn python() -> PathBuf {
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
pub(crate) fn have_docker(test: &str) -> bool {
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
pub(crate) fn docker_load(archive: &Path) -> String {
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
pub(crate) fn docker_port(id: &str, container_port: &str) -> Result<String, String> {
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
pub(crate) fn serve_test_binary() -> PathBuf {
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

/// sha256 of `bytes` as lowercase hex, computed here with `sha2`, not by the code under test.
pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// sha256 of `bytes` as an OCI digest, `sha256:HEX`.
pub(crate) fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", sha256_hex(bytes))
}

/// sha256 of the file at `p`, as lowercase hex.
pub(crate) fn sha256_file(p: &Path) -> String {
    sha256_hex(&std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
}

/// A running `infer-serve` (`serve_test_binary`) on a loopback port, killed on drop.
pub(crate) struct Serve {
    child: std::process::Child,
    pub port: u16,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    /// POST `body` (JSON) to `path`: the status and the JSON answer.
    pub(crate) fn post_json(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (status, answer) =
            http_request(&format!("127.0.0.1:{}", self.port), "POST", path, body);
        (status, serde_json::from_str(&answer).unwrap_or_default())
    }
}

/// One HTTP/1.1 request to `addr` on a fresh connection (`Connection: close`, a JSON `body`),
/// read to the end: the status and the body.
pub(crate) fn http_request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let answer = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, answer.to_owned())
}

/// A port that was free on 127.0.0.1 a moment ago.
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_ok(port: u16, path: &str) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200")
}

/// Starts `serve_test_binary` on `config` (its `PORT` replaced by a free port) in `dir` and
/// waits until it is ready; its log is `dir/serve.log`.
pub(crate) fn start_serve(dir: &Path, config: &str) -> Serve {
    let port = free_port();
    let cfg = dir.join("runtime.toml");
    std::fs::write(&cfg, config.replace("PORT", &port.to_string())).unwrap();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    let child = Command::new(serve_test_binary())
        .arg("--config")
        .arg(&cfg)
        // A fixed HTTP port makes gRPC default to 8001, which parallel tests would share.
        .env("INFER_GRPC_PORT", "0")
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start infer-serve");
    let serve = Serve {
        child,
        port,
        url: format!("http://127.0.0.1:{port}"),
    };
    let t0 = std::time::Instant::now();
    while !http_ok(port, "/v2/health/ready") {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "infer-serve not ready: {}",
            std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    serve
}

/// The id of the first GPU target in `infer-build plan --json` output.
pub(crate) fn first_gpu_target(plan: &serde_json::Value) -> String {
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
pub(crate) enum BaseRow {
    /// Add a copy of the row under the new reference; the original row stays.
    Append,
    /// Rename the row's reference to the new one.
    Replace,
}

/// A `--matrix DIR` copy of the shipped matrix data at `dir` in which the base-image row whose
/// reference is `chosen` is pointed at `base` (appended as a new row or renamed, as `how` says).
pub(crate) fn matrix_with_base(dir: &Path, chosen: &str, base: &str, how: BaseRow) -> PathBuf {
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
pub(crate) fn read_request_head(
    s: &mut impl std::io::Read,
) -> std::io::Result<Option<(Vec<u8>, usize)>> {
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
pub(crate) struct Server {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Server {
    pub(crate) fn start(
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
pub(crate) fn mlp_runtime_config(tail: &str) -> String {
    head_with("mlp.runtime.toml", tail)
}

/// The runtime's synthetic test model (`crates/infer-serve/testdata/synthetic.runtime.toml`,
/// model `synthetic`, served by a binary built with the `synthetic` feature): its model, inputs
/// and outputs, followed by `tail`.
pub(crate) fn synthetic_runtime_config(tail: &str) -> String {
    head_with("synthetic.runtime.toml", tail)
}

/// The tables of the runtime's fixture `name` before `[batching]`, then `tail`.
fn head_with(name: &str, tail: &str) -> String {
    let path = root().join("crates/infer-serve/testdata").join(name);
    let fixture = std::fs::read_to_string(&path).unwrap();
    let head = &fixture[..fixture
        .find("[batching]")
        .expect("the fixture has [batching]")];
    format!("{head}{tail}")
}

/// Every `.rs` file under `dirs` (recursively; a directory that does not exist is skipped), as
/// paths relative to the repository root, sorted: what the source scans read.
pub(crate) fn rust_sources(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let root = root();
    let mut out = Vec::new();
    let mut dirs = dirs.to_vec();
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(&root).unwrap_or(&p).to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// Every file of a layer (a manifest's layer descriptor as JSON): (path, bytes), read through
/// infer-build's one layer reader (the blob verified against its digest first).
pub(crate) fn layer_files(layout: &Path, layer: &serde_json::Value) -> Vec<(String, Vec<u8>)> {
    let digest = infer_build::oci::Digest::parse(layer["digest"].as_str().unwrap()).unwrap();
    files_of_layer(
        layout,
        &digest,
        layer["size"].as_u64().unwrap(),
        layer["mediaType"].as_str().unwrap(),
    )
}

/// Every file of a layer `inspect` listed: (path, bytes), as [`layer_files`].
pub(crate) fn inspected_layer_files(
    layout: &Path,
    layer: &infer_build::report::InspectedLayer,
) -> Vec<(String, Vec<u8>)> {
    files_of_layer(layout, &layer.digest, layer.size, &layer.media_type)
}

fn files_of_layer(
    layout: &Path,
    digest: &infer_build::oci::Digest,
    size: u64,
    media_type: &str,
) -> Vec<(String, Vec<u8>)> {
    use infer_build::oci::{open_layer, BlobStore};
    use std::io::Read;
    let store = BlobStore::open(layout).unwrap();
    let reader = open_layer(&store, digest, size, media_type).unwrap();
    let mut a = tar::Archive::new(reader);
    let mut out = Vec::new();
    for e in a.entries().unwrap() {
        let mut e = e.unwrap_or_else(|e| panic!("layer {digest}: {e}"));
        let path = e.path().unwrap().to_string_lossy().into_owned();
        if path.ends_with('/') {
            continue;
        }
        let mut b = Vec::new();
        e.read_to_end(&mut b)
            .unwrap_or_else(|e| panic!("layer {digest}, {path}: {e}"));
        out.push((path, b));
    }
    out
}

/// Where the blob `digest` (`sha256:…`) lives in the OCI layout `layout`.
pub(crate) fn blob_path(layout: &Path, digest: &str) -> PathBuf {
    layout.join("blobs/sha256").join(&digest[7..])
}

/// The manifest digest of target `id` in a build report (`build --json`).
pub(crate) fn target_digest(report: &BuildOutput, id: &str) -> String {
    report
        .targets
        .iter()
        .find(|t| t.id == id)
        .unwrap_or_else(|| panic!("no target {id} in {report:?}"))
        .manifest_digest
        .to_string()
}

/// `infer-build build … --json`'s report, from a run that must have succeeded.
pub(crate) fn build_output(o: &Output) -> BuildOutput {
    assert!(o.status.success(), "build failed: {}", stderr(o));
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("build --json is not a build report: {e}\n{}", stdout(o)))
}

/// `infer-build inspect --json PATH` (a layout or an `oci-archive`), which must succeed.
pub(crate) fn inspect(path: &Path) -> Inspection {
    let path = path.to_str().expect("UTF-8 path");
    cli_json(&root(), &["inspect", "--json", path])
}

/// The kernel lists `avx512_bf16` or `amx_bf16` among the CPU's flags: OpenVINO computes in BF16
/// here (a `cpu-bf16` target builds; elsewhere it is refused).
pub(crate) fn cpu_computes_bf16() -> bool {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    flags
        .lines()
        .find(|l| l.starts_with("flags"))
        .is_some_and(|l| {
            l.split_whitespace()
                .any(|f| f == "avx512_bf16" || f == "amx_bf16")
        })
}
