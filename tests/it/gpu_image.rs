//! GPU images, lean and full, both with the dynamically linked runtime built with feature
//! `tensorrt`. Lean: a version-compatible engine (a stand-in plan written by a stand-in
//! `trtexec`, since nothing here has a GPU), the glibc base, and the lean library from the
//! matrix's pinned `tensorrt-lean-cu1x-libs` wheel (downloaded once, verified, cached, pinned in
//! the lock file). Full: an ordinary engine on a base that brings TensorRT.
//!
//! The docker tests run the images on this machine, which has no GPU and no NVIDIA container
//! toolkit: the real runtime must exit 1 naming the missing GPU or driver, never die of a signal.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::engine::fake_gpu_tools;
use super::ort_image::{glibc_base_layout, keep_wheels, library_rows, seed_wheels};
use super::support::{
    blob_path, build_output, docker_load, have_docker, have_tool, infer_build, layer_files, root,
    stderr, stdout,
};

const RECIPE: &str = r#"
[model]
name = "mlp"
version = "1.0.0"
onnx = "mlp.onnx"

[model.inputs.input]
datatype = "fp32"
shape = [-1, 64]

[model.outputs.output]
datatype = "fp32"
shape = [-1, 10]

[targets]
gpus = ["A100"]
precision = ["fp16"]
cpu = false
tensorrt = "10"
version_compatible = true

[batching]
max_batch_size = 8
max_queue_delay_us = 500
instances = 1

[image]
repository = "localhost/infer-build/mlp-gpu"
tag = "{version}-{target}"
"#;

/// A project with the recipe, the example model and `bin/` stand-ins for `nvidia-smi` (an A100)
/// and `trtexec` (TensorRT 10.16.1, whose engine bytes name the flags it was given).
fn project(dir: &Path) {
    std::fs::write(dir.join("recipe.toml"), RECIPE).unwrap();
    std::fs::copy(root().join("examples/mlp/mlp.onnx"), dir.join("mlp.onnx")).unwrap();
    fake_gpu_tools(
        &dir.join("bin"),
        "8.0, 595.58.03, NVIDIA A100-SXM4-40GB",
        "10.16.1.11",
    );
}

fn path_with_bin(dir: &Path) -> String {
    format!(
        "{}:{}",
        dir.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The lean library rows of the matrix: (name, version, sha256) for x86_64.
fn lean_rows() -> Vec<(String, String, String)> {
    library_rows(|n| n.starts_with("tensorrt-lean-"))
}

/// The sha256 of every lean library wheel the matrix pins for x86_64.
fn lean_wheels() -> Vec<String> {
    lean_rows().into_iter().map(|(_, _, sha)| sha).collect()
}

fn blob(layout: &Path, digest: &str) -> Vec<u8> {
    std::fs::read(blob_path(layout, digest)).unwrap()
}

/// The TensorRT headers the tests build the GPU runtime against: `$TENSORRT_ROOT`, else the
/// 10.16 headers of `../shared/third_party` (`None`, reason printed, when they are not there).
pub(crate) fn tensorrt_headers(test: &str) -> Option<PathBuf> {
    let headers = std::env::var("TENSORRT_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root().join("../shared/third_party/tensorrt-headers/10.16"));
    if !headers.join("include/NvInferRuntime.h").is_file() {
        eprintln!(
            "skipping {test}: no TensorRT headers at {} (set TENSORRT_ROOT)",
            headers.display()
        );
        return None;
    }
    Some(headers)
}

/// The runtime GPU images carry: `$INFER_SERVE_GPU_BIN`, else built with
/// `FLAVOUR=gpu scripts/build-runtime.sh` against the 10.16 headers of `../shared/third_party`
/// (`None`, reason printed, when neither is there).
fn gpu_runtime(test: &str) -> Option<PathBuf> {
    if let Ok(p) = std::env::var("INFER_SERVE_GPU_BIN") {
        if !p.is_empty() {
            return Some(PathBuf::from(p));
        }
    }
    let headers = tensorrt_headers(test)?;
    let o = Command::new(root().join("scripts/build-runtime.sh"))
        .current_dir(root())
        .env("FLAVOUR", "gpu")
        .env("CHECK", "1")
        .env("TENSORRT_ROOT", &headers)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "FLAVOUR=gpu scripts/build-runtime.sh failed"
    );
    Some(PathBuf::from(
        stdout(&o).trim().lines().last().unwrap_or_default(),
    ))
}

/// What the Docker GPU image tests need: the image tools and the GPU runtime (`None`, reason
/// printed, when one is missing), and a project in a fresh temporary directory.
fn gpu_test(test: &str) -> Option<(PathBuf, tempfile::TempDir, PathBuf)> {
    for tool in ["umoci", "apt-get", "dpkg-deb"] {
        if !have_tool(tool, test) {
            return None;
        }
    }
    let serve = gpu_runtime(test)?;
    let f = tempfile::tempdir().unwrap();
    let dir = f.path().join("project");
    std::fs::create_dir_all(&dir).unwrap();
    project(&dir);
    Some((serve, f, dir))
}

/// `docker run` of a GPU image on this machine, which has no GPU: it must start and exit 1 (a
/// signal would be 137 or 139), with an error that names the missing GPU, driver or TensorRT
/// library, from a runtime that has the TensorRT backend. Returns the container's output.
pub(crate) fn run_refuses_without_a_gpu(tag: &str) -> String {
    static RUN: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = RUN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let o = Command::new("docker")
        .args(["run", "--rm", "--name"])
        .arg(format!("infer-gpu-image-{}-{n}", std::process::id()))
        .arg(tag)
        .output()
        .unwrap();
    let _ = Command::new("docker").args(["rmi", tag]).output();
    let logs = format!("{}{}", stdout(&o), stderr(&o));
    assert_eq!(
        o.status.code(),
        Some(1),
        "the image must exit 1 without a GPU (137/139 would be a signal): {logs}"
    );
    assert!(
        !logs.contains("is not built into this infer-serve"),
        "the image carries a runtime without TensorRT: {logs}"
    );
    let lower = logs.to_lowercase();
    assert!(
        lower.contains("gpu") || lower.contains("driver") || lower.contains("libnvinfer"),
        "the error names the missing GPU, driver or TensorRT library: {logs}"
    );
    logs
}

/// Build the sm80-fp16 engine with the stand-in trtexec into `dir/cache`, then the image on the
/// glibc test base with `serve` as the GPU runtime; returns the build's JSON report.
fn build_image(
    dir: &Path,
    cache: &Path,
    serve: &Path,
    out: &str,
    archive: Option<&Path>,
) -> Output {
    let o = infer_build()
        .current_dir(dir)
        .env("PATH", path_with_bin(dir))
        .args([
            "engine",
            "recipe.toml",
            "--target",
            "sm80-fp16",
            "--cache",
            "cache",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "engine: {}", stderr(&o));
    let mut c = infer_build();
    c.current_dir(dir)
        .args([
            "build",
            "recipe.toml",
            "--json",
            "--engines",
            "cache",
            "--out",
            out,
        ])
        .arg("--base-layout")
        .arg(glibc_base_layout())
        .args(["--base-tag", "1"])
        .arg("--runtime-gpu")
        .arg(serve)
        .env("INFER_BUILD_CACHE_DIR", cache)
        .env("SOURCE_DATE_EPOCH", "1700000000");
    if let Some(a) = archive {
        c.arg("--output")
            .arg(format!("oci-archive:{}", a.display()));
    }
    c.output().unwrap()
}

/// The plan of a version-compatible target ships the lean runtime on the glibc base; without
/// version compatibility it keeps the full runtime of its CUDA base. Left unset, a target is
/// version-compatible and lean where the matrix has the release's lean wheel, and an ordinary
/// engine on the full runtime (with a note) where it has not.
#[test]
fn plan_lean_runtime_only_for_version_compatible_engines() {
    let f = tempfile::tempdir().unwrap();
    project(f.path());
    let plan = |recipe: &str| -> Value {
        std::fs::write(f.path().join("recipe.toml"), recipe).unwrap();
        let o = infer_build()
            .current_dir(f.path())
            .args(["plan", "recipe.toml", "--json"])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let p = plan(RECIPE);
    let t = &p["targets"][0];
    assert_eq!(t["id"], "sm80-fp16");
    assert_eq!(t["base"]["reference"], "gcr.io/distroless/cc-debian12");
    let lean = &t["tensorrt"]["lean"];
    assert!(
        lean["name"]
            .as_str()
            .unwrap()
            .starts_with("tensorrt-lean-cu"),
        "{lean}"
    );
    assert_eq!(lean["version"], t["tensorrt"]["version"]);
    assert_eq!(lean["path"], "/opt/tensorrt/lib/libnvinfer_lean.so.10");

    let full = |t: &Value| {
        assert!(t["tensorrt"]["lean"].is_null(), "{t}");
        assert!(
            t["base"]["reference"]
                .as_str()
                .unwrap()
                .contains("nvidia/cuda"),
            "{}",
            t["base"]
        );
    };
    let p = plan(&RECIPE.replace("version_compatible = true", "version_compatible = false"));
    let t = &p["targets"][0];
    full(t);
    assert_eq!(t["tensorrt"]["version_compatible"], false);

    // The default: lean where it can be.
    let p = plan(&RECIPE.replace("version_compatible = true\n", ""));
    let t = &p["targets"][0];
    assert_eq!(t["tensorrt"]["version_compatible"], true);
    assert_eq!(t["base"]["reference"], "gcr.io/distroless/cc-debian12");
    assert!(t["tensorrt"]["lean"].is_object(), "{t}");
    // TensorRT 10.11 has no lean wheel in the matrix: an ordinary engine on the full runtime,
    // and the plan says why.
    let old = RECIPE
        .replace("version_compatible = true\n", "")
        .replace("tensorrt = \"10\"", "tensorrt = \"10.11\"");
    let p = plan(&old);
    let t = &p["targets"][0];
    full(t);
    assert_eq!(t["tensorrt"]["version_compatible"], false);
    assert!(
        t["notes"].to_string().contains("full TensorRT runtime"),
        "{}",
        t["notes"]
    );
    // Asked for explicitly, it stays version-compatible (on the full runtime there).
    let p = plan(&RECIPE.replace("tensorrt = \"10\"", "tensorrt = \"10.11\""));
    let t = &p["targets"][0];
    full(t);
    assert_eq!(t["tensorrt"]["version_compatible"], true);
}

/// The assembled image: lean library from the pinned wheel, the GPU runtime, `runtime.toml`
/// naming both, the NVIDIA env, no libcuda; rebuilt offline to the same digest. With Docker:
/// `docker load`, and `docker run` on this GPU-less machine exits 1 naming the GPU or driver.
#[test]
fn docker_lean_gpu_image_loads_and_refuses_without_a_gpu() {
    let test = "docker_lean_gpu_image_loads_and_refuses_without_a_gpu";
    let Some((serve, f, dir)) = gpu_test(test) else {
        return;
    };
    let cache = f.path().join("cache");
    seed_wheels(&cache, &lean_wheels());
    let archive = f.path().join("gpu.tar");

    let o = build_image(&dir, &cache, &serve, "out", Some(&archive));
    let report = build_output(&o);
    keep_wheels(&cache, &lean_wheels());
    let t = &report.targets[0];
    assert_eq!(t.id, "sm80-fp16");
    let digest = t.manifest_digest.to_string();
    let layout = dir.join("out");
    let man: Value = serde_json::from_slice(&blob(&layout, &digest)).unwrap();
    let layers = man["layers"].as_array().unwrap();
    let roles: Vec<&str> = layers
        .iter()
        .map(|l| l["annotations"]["dev.infer-build.layer"].as_str().unwrap())
        .collect();
    assert_eq!(roles[0], "base");
    assert_eq!(
        &roles[roles.len() - 4..],
        ["runtime-libs", "infer-serve", "engine", "config"]
    );
    let n = roles.len();

    // The lean library and, beside it, the version-compatible plugin library the runtime
    // registers: exactly the wheel's members, which the lock file pins.
    let libs = layer_files(&layout, &layers[n - 4]);
    let names: Vec<&str> = libs.iter().map(|l| l.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "opt/tensorrt/lib/libnvinfer_lean.so.10",
            "opt/tensorrt/lib/libnvinfer_vc_plugin.so.10"
        ]
    );
    assert!(libs[0].1.starts_with(b"\x7fELF") && libs[0].1.len() > 50 << 20);
    assert!(libs[1].1.starts_with(b"\x7fELF"));
    let lock = std::fs::read_to_string(dir.join("recipe.lock")).unwrap();
    let lockv: toml::Value = toml::from_str(&lock).unwrap();
    let pinned = &lockv["library"][0];
    assert!(pinned["name"]
        .as_str()
        .unwrap()
        .starts_with("tensorrt-lean-cu"));
    assert_eq!(pinned["version"].as_str(), Some("10.16.1"));
    assert!(lean_rows()
        .iter()
        .any(|(n, v, s)| Some(n.as_str()) == pinned["name"].as_str()
            && v == "10.16.1"
            && Some(s.as_str()) == pinned["sha256"].as_str()));

    // The engine: built version-compatible with the lean runtime left out (the stand-in's plan
    // names its flags).
    let engine_files = layer_files(&layout, &layers[n - 2]);
    let plan = engine_files
        .iter()
        .find(|(p, _)| p.ends_with("engine.plan"))
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_else(|| {
            panic!(
                "no engine.plan in {:?}",
                engine_files.iter().map(|f| &f.0).collect::<Vec<_>>()
            )
        });
    assert!(
        plan.contains("--versionCompatible") && plan.contains("--excludeLeanRuntime"),
        "{plan}"
    );

    // The runtime built with TensorRT, and its config.
    let bins = layer_files(&layout, &layers[n - 3]);
    assert_eq!(bins[0].0, "usr/local/bin/infer-serve");
    assert_eq!(bins[0].1, std::fs::read(&serve).unwrap());
    let cfg_files = layer_files(&layout, &layers[n - 1]);
    let rt = String::from_utf8(
        cfg_files
            .iter()
            .find(|(p, _)| p == "etc/infer/runtime.toml")
            .unwrap()
            .1
            .clone(),
    )
    .unwrap();
    assert!(rt.contains("kind = \"tensorrt\""), "{rt}");
    assert!(
        rt.contains("library = \"/opt/tensorrt/lib/libnvinfer_lean.so.10\""),
        "{rt}"
    );
    let config: Value =
        serde_json::from_slice(&blob(&layout, man["config"]["digest"].as_str().unwrap())).unwrap();
    let env: Vec<&str> = config["config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(env.contains(&"NVIDIA_VISIBLE_DEVICES=all"), "{env:?}");
    assert!(
        env.contains(&"NVIDIA_DRIVER_CAPABILITIES=compute,utility"),
        "{env:?}"
    );
    // No driver library anywhere: the container toolkit injects it.
    for l in layers {
        for (p, _) in layer_files(&layout, l) {
            let name = p.rsplit('/').next().unwrap_or_default();
            assert!(
                !name.starts_with("libcuda") && !name.starts_with("libnvidia-"),
                "{p} is in the image"
            );
        }
    }
    let size: u64 = layers
        .iter()
        .map(|l| l["size"].as_u64().unwrap())
        .sum::<u64>()
        + man["config"]["size"].as_u64().unwrap();
    let engine = layers[n - 2]["size"].as_u64().unwrap();
    eprintln!(
        "lean GPU image: {size} bytes compressed ({:.1} MB), of which engine layer {engine} bytes, lean library layer {} bytes, runtime layer {} bytes",
        size as f64 / 1e6,
        layers[n - 4]["size"],
        layers[n - 3]["size"]
    );
    assert!(
        size - engine <= 150_000_000,
        "the image without its engine is {size} bytes, over 150 MB"
    );
    let inspect = infer_build().arg("inspect").arg(&layout).output().unwrap();
    assert!(inspect.status.success(), "{}", stderr(&inspect));

    // Offline rebuild: the wheel from the library cache, the same digest.
    let o = build_image(&dir, &cache, &serve, "out2", None);
    assert!(o.status.success(), "rebuild: {}", stderr(&o));
    assert!(
        stderr(&o).contains("(from the library cache)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(build_output(&o).targets[0].manifest_digest.as_str(), digest);

    if !have_docker(test) {
        return;
    }
    docker_load(&archive);
    let logs = run_refuses_without_a_gpu("localhost/infer-build/mlp-gpu:1.0.0-sm80-fp16");
    assert!(
        logs.contains("libnvinfer_lean.so.10"),
        "the lean library was found and named: {logs}"
    );
}

/// A full GPU image (an ordinary engine, TensorRT from the base) carries the same runtime as a
/// lean one, built with TensorRT: before, it carried the static CPU runtime, which has no
/// TensorRT backend, so no full GPU image could ever serve. With Docker, on this GPU-less
/// machine, it starts and exits 1 naming what is missing.
#[test]
fn docker_full_gpu_image_carries_the_tensorrt_runtime() {
    let test = "docker_full_gpu_image_carries_the_tensorrt_runtime";
    let Some((serve, f, dir)) = gpu_test(test) else {
        return;
    };
    std::fs::write(
        dir.join("recipe.toml"),
        // Its own repository: the lean test's image, loaded into the same Docker, has the other.
        RECIPE
            .replace("version_compatible = true", "version_compatible = false")
            .replace("/mlp-gpu\"", "/mlp-gpu-full\""),
    )
    .unwrap();
    let cache = f.path().join("cache");
    let archive = f.path().join("gpu-full.tar");

    // A static binary is refused where the runtime must open TensorRT.
    let stub = f.path().join("static-serve");
    super::image::tiny_static_elf(&stub);
    let o = build_image(&dir, &cache, &stub, "bad", None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("statically linked") && stderr(&o).contains("FLAVOUR=gpu"),
        "{}",
        stderr(&o)
    );

    // So is a GPU runtime whose TensorRT backend has another major than the target's (10.16.1).
    let other = f.path().join("serve-trt11");
    super::image::tiny_dynamic_elf(&other, Some("11.1.0"));
    let o = build_image(&dir, &cache, &other, "bad", None);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("TensorRT 11.1.0 headers") && stderr(&o).contains("TensorRT 10.16.1"),
        "{}",
        stderr(&o)
    );

    let o = build_image(&dir, &cache, &serve, "out", Some(&archive));
    let digest = build_output(&o).targets[0].manifest_digest.to_string();
    let layout = dir.join("out");
    let man: Value = serde_json::from_slice(&blob(&layout, &digest)).unwrap();
    let layers = man["layers"].as_array().unwrap();
    let role = |l: &Value| {
        l["annotations"]["dev.infer-build.layer"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let serve_layer = layers.iter().find(|l| role(l) == "infer-serve").unwrap();
    let bins = layer_files(&layout, serve_layer);
    assert_eq!(bins[0].0, "usr/local/bin/infer-serve");
    assert_eq!(bins[0].1, std::fs::read(&serve).unwrap());
    // No lean library: TensorRT is the base's.
    for l in layers.iter().filter(|l| role(l) == "runtime-libs") {
        assert!(layer_files(&layout, l).is_empty(), "{l}");
    }
    let config_layer = layers.iter().find(|l| role(l) == "config").unwrap();
    let rt = layer_files(&layout, config_layer)
        .into_iter()
        .find(|(p, _)| p == "etc/infer/runtime.toml")
        .map(|(_, b)| String::from_utf8(b).unwrap())
        .unwrap();
    assert!(rt.contains("kind = \"tensorrt\""), "{rt}");
    assert!(!rt.contains("library ="), "{rt}");

    if !have_docker(test) {
        return;
    }
    docker_load(&archive);
    let logs = run_refuses_without_a_gpu("localhost/infer-build/mlp-gpu-full:1.0.0-sm80-fp16");
    let headers = infer_spec::engine::tensorrt_headers_in(&std::fs::read(&serve).unwrap())
        .expect("the GPU runtime names its TensorRT headers");
    assert!(
        logs.contains(&format!("compiled against TensorRT {headers} headers")),
        "the error says which TensorRT the runtime was built for: {logs}"
    );
}
