//! The TensorRT shim and backend against real TensorRT files, on a machine without a GPU:
//!
//! - the shim compiles warning-free (`-Wall -Wextra -Werror`, as `build.rs` builds it) against
//!   NVIDIA's public headers of every release in `../shared/third_party/tensorrt-headers`;
//! - the real lean runtime libraries from the pinned wheels (`tests/lean-wheels.txt`, fetched
//!   with pip, sha256-checked, cached in `target/trt-wheels`) are opened, their version read,
//!   and a shim compiled against one major refuses a library of the other before calling into
//!   it; on a node without a driver, runtime creation fails because TensorRT logged an error;
//! - `infer-serve` built with feature `tensorrt` exits 1 on a `kind = "tensorrt"` runtime.toml
//!   when no NVIDIA driver is visible, naming the driver and the TensorRT library it found.
//!
//! Skips (with a printed reason) only when a wheel cannot be fetched. Nothing here needs or uses
//! a GPU; on a node with one, the driver-dependent expectations are reported, not asserted.
#![allow(
    clippy::disallowed_macros,
    clippy::disallowed_methods,
    reason = "tests start the binaries and tools they check, and print why they skip"
)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn headers(release: &str) -> PathBuf {
    let p = root()
        .join("../shared/third_party/tensorrt-headers")
        .join(release);
    assert!(
        p.join("include/NvInferRuntime.h").is_file(),
        "TensorRT {release} headers missing at {} (see ../shared/third_party/README.md)",
        p.display()
    );
    p
}

fn work(dir: &str) -> PathBuf {
    let p = root().join("target/trt-test").join(dir);
    std::fs::create_dir_all(&p).expect("create the test directory");
    p
}

fn run(cmd: &mut Command) -> (Option<i32>, String) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

/// Compiles shim.cpp against one header release with build.rs's flags; returns the object.
fn compile_shim(release: &str, hooks: bool) -> PathBuf {
    let out = work(&format!("shim-{release}")).join(if hooks { "shim-hooks.o" } else { "shim.o" });
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let shim = Path::new(env!("CARGO_MANIFEST_DIR")).join("shim");
    let (code, text) = run(Command::new(&cxx)
        .args(["-std=c++17", "-Wall", "-Wextra", "-Werror", "-fPIC", "-c"])
        .arg(shim.join("shim.cpp"))
        .arg(format!(
            "-isystem{}",
            headers(release).join("include").display()
        ))
        .arg(format!("-isystem{}", shim.join("cuda_stub").display()))
        .args(hooks.then_some("-DITRT_TEST_HOOKS"))
        .arg("-o")
        .arg(&out));
    assert_eq!(
        code,
        Some(0),
        "shim.cpp against TensorRT {release}:\n{text}"
    );
    assert!(
        text.trim().is_empty(),
        "shim.cpp against TensorRT {release} warns:\n{text}"
    );
    out
}

/// The probe program (tests/shim_probe.c) linked with the shim compiled against `release`.
fn probe(release: &str) -> PathBuf {
    let dir = work(&format!("shim-{release}"));
    let shim = compile_shim(release, true);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let obj = dir.join("probe.o");
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/shim_probe.c");
    let (code, text) = run(Command::new(cc)
        .args(["-Wall", "-Wextra", "-Werror", "-c"])
        .arg(c)
        .arg("-o")
        .arg(&obj));
    assert_eq!(code, Some(0), "shim_probe.c:\n{text}");
    let bin = dir.join("probe");
    let (code, text) = run(Command::new(cxx)
        .arg(&obj)
        .arg(&shim)
        .arg("-ldl")
        .arg("-o")
        .arg(&bin));
    assert_eq!(code, Some(0), "linking the probe:\n{text}");
    bin
}

/// One pinned wheel: (package, version, sha256, header release of the same major).
struct Wheel {
    package: String,
    version: String,
    sha256: String,
    headers: String,
}

fn wheels() -> Vec<Wheel> {
    include_str!("lean-wheels.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Wheel {
                package: f[0].into(),
                version: f[1].into(),
                sha256: f[2].into(),
                headers: f[3].into(),
            }
        })
        .collect()
}

fn python() -> String {
    std::env::var("INFER_BUILD_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// The directory holding the wheel's `libnvinfer_lean.so.N`: downloaded once with pip into
/// `target/trt-wheels`, its sha256 checked against the pin, unpacked. `Err` says why it could not
/// be fetched (the caller skips); a digest mismatch fails.
fn fetch(w: &Wheel) -> Result<PathBuf, String> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let cache = root().join("target/trt-wheels");
    let unpacked = cache.join(format!("{}-{}", w.package, w.version));
    let lib = unpacked.join("tensorrt_lean_libs");
    if lib.is_dir() {
        return Ok(lib);
    }
    let download = cache.join("download");
    std::fs::create_dir_all(&download).map_err(|e| e.to_string())?;
    let file_prefix = format!("{}-{}-", w.package.replace('-', "_"), w.version);
    let find = || {
        std::fs::read_dir(&download)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&file_prefix) && n.ends_with(".whl"))
            })
    };
    if find().is_none() {
        let (code, text) = run(Command::new(python())
            .args([
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
            ])
            .arg(&download)
            .arg(format!("{}=={}", w.package, w.version)));
        if code != Some(0) {
            return Err(format!(
                "pip download {}=={} failed: {}",
                w.package,
                w.version,
                text.trim()
            ));
        }
    }
    let whl = find()
        .ok_or_else(|| format!("pip left no {file_prefix}*.whl in {}", download.display()))?;
    let (_, sum) = run(Command::new("sha256sum").arg(&whl));
    let digest = sum.split_whitespace().next().unwrap_or_default().to_owned();
    if digest != w.sha256 {
        let _ = std::fs::remove_file(&whl);
        panic!(
            "{} has sha256 {digest}, pinned {} (tests/lean-wheels.txt)",
            whl.display(),
            w.sha256
        );
    }
    let staging = cache.join(format!("{}-{}.partial", w.package, w.version));
    let _ = std::fs::remove_dir_all(&staging);
    let (code, text) = run(Command::new(python())
        .args(["-m", "zipfile", "-e"])
        .arg(&whl)
        .arg(&staging));
    assert_eq!(code, Some(0), "unpacking {}: {text}", whl.display());
    std::fs::rename(&staging, &unpacked).map_err(|e| e.to_string())?;
    Ok(lib)
}

/// Every pinned wheel's library directory, or `None` (reason printed) when one cannot be fetched.
fn libraries() -> Option<Vec<(&'static Wheel, PathBuf)>> {
    static WHEELS: OnceLock<Vec<Wheel>> = OnceLock::new();
    let ws = WHEELS.get_or_init(wheels);
    let mut out = Vec::new();
    for w in ws {
        match fetch(w) {
            Ok(dir) => out.push((w, dir)),
            Err(e) => {
                println!("skipped: cannot fetch the TensorRT lean wheel: {e}");
                return None;
            }
        }
    }
    Some(out)
}

fn so(dir: &Path, w: &Wheel) -> PathBuf {
    dir.join(format!(
        "libnvinfer_lean.so.{}",
        w.version.split('.').next().unwrap_or_default()
    ))
}

fn libcuda_present() -> bool {
    let (_, text) = run(Command::new("sh").args([
        "-c",
        "ldconfig -p 2>/dev/null | grep -c 'libcuda.so.1 ' || true",
    ]));
    text.trim() != "0"
}

/// `getInferLibVersion` (+ build) as the wheel's version: 101601 + 11 → 10.16.1.11.
fn as_version(code: i64, build: i64) -> String {
    let (major, minor, patch) = if code >= 100_000 {
        (code / 10_000, code / 100 % 100, code % 100)
    } else {
        (code / 1000, code / 100 % 10, code % 100)
    };
    format!("{major}.{minor}.{patch}.{build}")
}

#[test]
fn shim_compiles_warning_free_against_every_header_release() {
    for release in ["8.6", "10.16", "11.1"] {
        compile_shim(release, false);
    }
}

#[test]
fn an_error_on_another_thread_never_fails_a_call() {
    // Instances are created and run on several threads: an error TensorRT logs on one must not
    // make another thread's good call look failed (the counter is per thread), and a failing
    // call with nothing of its own names the other thread's error only as such.
    for release in ["8.6", "10.16", "11.1"] {
        let (code, text) = run(Command::new(probe(release)).arg("--threads"));
        assert_eq!(code, Some(0), "{release}: {text}");
        assert!(text.contains("per-thread errors ok"), "{release}: {text}");
    }
}

#[test]
fn real_lean_libraries_version_and_major_refusal() {
    let Some(libs) = libraries() else { return };
    let driver = libcuda_present();
    for release in ["10.16", "11.1"] {
        let bin = probe(release);
        for (w, dir) in &libs {
            let (code, text) = run(Command::new(&bin).arg(so(dir, w)));
            // Never a signal: the shim refuses or creates, the process exits.
            assert!(
                matches!(code, Some(0) | Some(3)),
                "{release} shim on {}: {code:?}\n{text}",
                w.version
            );
            let f: Vec<&str> = text.split_whitespace().collect();
            let (lib, build) = (f[3].parse::<i64>().unwrap(), f[5].parse::<i64>().unwrap());
            assert_eq!(
                as_version(lib, build),
                w.version,
                "version read from the library:\n{text}"
            );
            if w.headers != release {
                assert_eq!(
                    code,
                    Some(3),
                    "{release} shim must refuse {}:\n{text}",
                    w.version
                );
                assert!(text.contains("virtual-table layouts differ"), "{text}");
            } else if !driver {
                // No driver: TensorRT logs "CUDA initialization failure with error: 35" and
                // still returns a runtime; the shim must refuse it.
                assert_eq!(code, Some(3), "{text}");
                assert!(text.contains("CUDA initialization failure"), "{text}");
            } else {
                println!(
                    "libcuda.so.1 present: {release} shim on {}: {}",
                    w.version,
                    text.trim()
                );
            }
        }
    }
}

#[test]
fn the_lean_wheels_ship_the_plugin_library_the_runtime_registers() {
    // What a lean image's runtime looks for beside its lean library: the version-compatible
    // plugin library, which exports the creators the plugin registry loads.
    let Some(libs) = libraries() else { return };
    for (w, dir) in &libs {
        let lean = so(dir, w).display().to_string();
        let major: u64 = w.version.split('.').next().unwrap().parse().unwrap();
        let kind = infer_trt::LibraryKind::of_name(&lean);
        assert_eq!(kind, infer_trt::LibraryKind::Lean);
        let plugin = infer_trt::plugin_library_path(kind, major, &lean);
        let (code, text) = run(Command::new("nm").args(["-D", "--defined-only", &plugin]));
        assert_eq!(code, Some(0), "{plugin}: {text}");
        assert!(
            text.lines().any(|l| l.ends_with(" T getCreators")),
            "{plugin} exports no getCreators:\n{text}"
        );
    }
}

#[test]
fn gpu_check_runs_end_to_end_in_a_dry_run() {
    // The script a lent GPU runs: here each GPU step says what it would do and that it was
    // skipped, and the header/library rule runs on a stated node.
    let script = root().join("scripts/gpu-check.sh");
    let work = work("gpu-check-dry");
    let dry = |trt: &str| {
        run(Command::new("bash")
            .arg(&script)
            .arg("--dry-run")
            .env("WORK", &work)
            .env("DRY_TRT", trt)
            .env_remove("TENSORRT_ROOT"))
    };
    let (code, text) = dry("10.16.1");
    assert_eq!(code, Some(0), "{text}");
    for step in [
        "skipped (dry run): would build infer-serve with feature tensorrt",
        "would build an ordinary fp32 plan",
        "would build an ordinary fp16 plan",
        "serve it through libnvinfer.so.10 (the full runtime), two instances",
        "would build the classifier's int8 engine",
        "opens libnvinfer_lean.so.10 as the metadata calls for",
        "nothing ran on a GPU",
    ] {
        assert!(text.contains(step), "{step}:\n{text}");
    }
    assert!(!text.contains("NOT DONE"), "{text}");
    // A node older than the headers: said, with what to set, and not passed.
    let (code, text) = dry("10.9.0");
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains("TensorRT 10.9.0 is older than the 10.16 headers")
            && text.contains("TENSORRT_ROOT"),
        "{text}"
    );
}

/// `infer-serve` with feature `tensorrt`, its shim built against the 10.16 headers:
/// `$INFER_SERVE_GPU_BIN` (the GPU image runtime scripts/test.sh builds), else built into
/// `target/serve-trt` (its own target dir: the outer `cargo test` holds the main one).
fn serve_trt() -> PathBuf {
    if let Some(p) = std::env::var_os("INFER_SERVE_GPU_BIN").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let target = root().join("target/serve-trt");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let (code, text) = run(Command::new(cargo)
        .current_dir(root())
        .env("TENSORRT_ROOT", headers("10.16"))
        .args([
            "build",
            "-q",
            "-p",
            "infer-serve",
            "--no-default-features",
            "--features",
            "tensorrt",
            "--target-dir",
        ])
        .arg(&target));
    assert_eq!(
        code,
        Some(0),
        "cargo build -p infer-serve --features tensorrt:\n{text}"
    );
    target.join("debug/infer-serve")
}

#[test]
fn serving_a_tensorrt_engine_without_a_driver_exits_1_naming_it() {
    let Some(libs) = libraries() else { return };
    if libcuda_present() {
        println!("skipped: libcuda.so.1 is present (this test is for a node without a driver)");
        return;
    }
    let (w, dir) = libs
        .iter()
        .find(|(w, _)| w.headers == "10.16")
        .expect("a 10.16 wheel pin");
    let bin = serve_trt();
    let d = work("serve");
    // A stand-in plan: the start-up check fails before any plan is read.
    std::fs::write(d.join("engine.plan"), b"not a plan").unwrap();
    // The synthetic test model's inputs and outputs, on a TensorRT engine.
    let fixture = include_str!("../../infer-serve/testdata/synthetic.runtime.toml");
    let head = &fixture[..fixture
        .find("[batching]")
        .expect("the fixture has [batching]")];
    std::fs::write(
        d.join("runtime.toml"),
        head.to_string()
            + r#"
[engine]
kind = "tensorrt"
path = "engine.plan"
[server]
host = "127.0.0.1"
port = 0
"#,
    )
    .unwrap();
    // Without engine metadata nothing says the plan is version-compatible: the full runtime,
    // the one library that runs any plan, is what is looked for (the library path holds only
    // the lean one here).
    let (code, text) = run(Command::new(&bin)
        .arg("--config")
        .arg(d.join("runtime.toml"))
        .env("LD_LIBRARY_PATH", dir));
    assert_eq!(code, Some(1), "exit 1 expected (not a signal):\n{text}");
    assert!(
        text.contains("cannot load libnvinfer.so.10") && text.contains("10.16.0 headers"),
        "{text}"
    );
    // The lean library by soname (INFER_TRT_LIBRARY) from the library path: opened, its
    // version read, then refused for want of a driver.
    let (code, text) = run(Command::new(&bin)
        .arg("--config")
        .arg(d.join("runtime.toml"))
        .env("LD_LIBRARY_PATH", dir)
        .env("INFER_TRT_LIBRARY", "libnvinfer_lean.so.10"));
    assert_eq!(code, Some(1), "exit 1 expected (not a signal):\n{text}");
    assert!(
        text.contains("libcuda.so.1") && text.contains("no NVIDIA driver"),
        "{text}"
    );
    assert!(
        text.contains(&format!("libnvinfer_lean.so.10 {}", w.version)),
        "{text}"
    );

    // `engine.library` (what a GPU image's runtime.toml names) is the library opened, with no
    // library path set.
    let lean = so(dir, w);
    let toml = std::fs::read_to_string(d.join("runtime.toml")).unwrap();
    std::fs::write(
        d.join("runtime.toml"),
        toml.replace(
            "path = \"engine.plan\"\n",
            &format!("path = \"engine.plan\"\nlibrary = \"{}\"\n", lean.display()),
        ),
    )
    .unwrap();
    let (code, text) = run(Command::new(&bin)
        .arg("--config")
        .arg(d.join("runtime.toml")));
    assert_eq!(code, Some(1), "exit 1 expected (not a signal):\n{text}");
    assert!(
        text.contains(&format!("{} {}", lean.display(), w.version)),
        "the library engine.library names is opened: {text}"
    );
    std::fs::write(d.join("runtime.toml"), toml).unwrap();

    // The same 10.x-built runtime handed the real 11.x library refuses it at start, naming both
    // majors, before any call into it but its version entry point.
    let (w11, dir11) = libs
        .iter()
        .find(|(w, _)| w.headers == "11.1")
        .expect("an 11.1 wheel pin");
    let (code, text) = run(Command::new(&bin)
        .arg("--config")
        .arg(d.join("runtime.toml"))
        .env("INFER_TRT_LIBRARY", so(dir11, w11)));
    assert_eq!(code, Some(1), "exit 1 expected (not a signal):\n{text}");
    assert!(
        text.contains("it is TensorRT 11.x") && text.contains("TensorRT 10.x headers"),
        "{text}"
    );
}
