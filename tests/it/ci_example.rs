//! The CI fan-out example (`examples/ci/build-images.yml`) and the install script it uses, run
//! as a user would: the workflow is checked against GitHub's workflow schema, and its jobs run
//! in order on this machine (`ci_workflow.py`: every `run:` step as written, the `uses:` steps
//! emulated) against a TLS registry with a password on loopback. Only what needs a GPU is
//! replaced: the engine job's builder container runs on the host with stand-ins for
//! `nvidia-smi` and `trtexec` first on PATH, and the GPU target's base image is one
//! infer-build built and pushed to the loopback registry (a matrix copy names it, through
//! `INFER_BUILD_MATRIX`). The CPU image the publish job pushed is pulled back, loaded into
//! Docker, and must serve like onnxruntime.
//!
//! The `tools` job runs `scripts/install.sh` of this checkout; `scripts/test.sh` runs the same
//! script before the tests, so here it finds the runtimes built, and installs the infer-build
//! `cargo test` built (`INFER_BUILD_BIN`, which `scripts/test.sh` sets and the jobs inherit).

use std::path::{Path, PathBuf};
use std::process::Command;

use infer_build::plan::{BuildPlan, TargetKind, TargetPlan};
use serde_json::Value;

use super::engine::fake_gpu_tools;
use super::gpu_image::{run_refuses_without_a_gpu, tensorrt_headers};
use super::image::serve_checks;
use super::ort_image::glibc_base_layout;
use super::registry_support::Registry;
use super::support::{docker_load, have_docker, have_tool, python, root, stderr, stdout};

const WORKFLOW: &str = "examples/ci/build-images.yml";

/// True when the test Python has `module`; prints why the test is skipped otherwise.
fn have_python_module(module: &str, test: &str) -> bool {
    let ok = Command::new(python())
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipping {test}: Python module `{module}` is missing (.ci/run installs tests/requirements.txt)");
    }
    ok
}

#[test]
fn py_ci_example_is_a_valid_github_workflow() {
    let test = "py_ci_example_is_a_valid_github_workflow";
    if !have_python_module("check_jsonschema", test) {
        return;
    }
    let o = Command::new(python())
        .args([
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
        ])
        .arg(root().join(WORKFLOW))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));

    // The schema has teeth: a job without `runs-on` is refused.
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yml");
    let text = std::fs::read_to_string(root().join(WORKFLOW)).unwrap();
    std::fs::write(&broken, text.replacen("    runs-on: ubuntu-24.04\n", "", 1)).unwrap();
    let o = Command::new(python())
        .args([
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.github-workflows",
        ])
        .arg(&broken)
        .output()
        .unwrap();
    assert!(!o.status.success(), "{}", stdout(&o));
}

fn gpu_target(plan: &BuildPlan) -> &TargetPlan {
    plan.targets
        .iter()
        .find(|t| t.kind == TargetKind::Gpu)
        .expect("a GPU target")
}

/// A copy of the matrix whose base image for `plan`'s GPU target is `base` instead.
fn matrix_with_base(dir: &Path, plan: &BuildPlan, base: &str) -> PathBuf {
    let chosen = &gpu_target(plan).base.reference;
    super::support::matrix_with_base(dir, chosen, base, super::support::BaseRow::Replace)
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "the CI example's steps as written, sharing one registry and workspace"
)]
fn registry_ci_example_runs_as_written() {
    let test = "registry_ci_example_runs_as_written";
    if !have_tool("skopeo", test)
        || !have_tool("jq", test)
        || !have_docker(test)
        || !have_python_module("yaml", test)
    {
        return;
    }
    let Some(reg) = Registry::start_tls(test) else {
        return;
    };
    let tls = reg.tls.as_ref().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let t = |p: &str| tmp.path().join(p);

    // The user's repository: the example recipe with a CPU and an L4 target. TensorRT 10.11 is
    // the newest release the matrix has a builder image for (and it takes fp16 as a builder flag
    // on this FP32 export).
    let repo = t("repo");
    std::fs::create_dir_all(repo.join("recipes")).unwrap();
    std::fs::copy(
        root().join("examples/mlp/mlp.onnx"),
        repo.join("recipes/mlp.onnx"),
    )
    .unwrap();
    let recipe = std::fs::read_to_string(root().join("examples/mlp/recipe.toml"))
        .unwrap()
        .replace(
            "[targets]\ncpu = true",
            "[targets]\ncpu = true\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.11\"",
        );
    std::fs::write(repo.join("recipes/mlp.toml"), recipe).unwrap();

    // The tools job builds the GPU image runtime against TensorRT's headers (checked out from
    // NVIDIA/TensorRT in the workflow; here the copy scripts/test.sh built it against).
    let Some(headers) = tensorrt_headers(test) else {
        return;
    };

    // The GPU target's base lives in the loopback registry (NVIDIA's registries are not
    // reachable here): the glibc test base, so that the GPU image's runtime starts in Docker.
    let plan = super::support::plan(&repo.join("recipes/mlp.toml"), &[]);
    let base = format!("{}/bases/cuda:1.0.0", reg.addr);
    let matrix = matrix_with_base(&t("matrix"), &plan, &base);
    let plan = super::support::plan(
        &repo.join("recipes/mlp.toml"),
        &["--matrix", matrix.to_str().unwrap()],
    );
    let gpu = gpu_target(&plan);
    assert_eq!(gpu.base.reference, base);
    let trt = gpu.tensorrt.as_ref().unwrap().build.clone();
    fake_gpu_tools(&t("gpu-tools"), "8.9, 580.95.05, NVIDIA L4", &trt);

    let cache = t("cache");
    let auth = t("auth.json");
    let with_env = |c: &mut Command| {
        c.env("INFER_BUILD_MATRIX", &matrix)
            .env("INFER_BUILD_CACHE_DIR", &cache)
            .env("SSL_CERT_FILE", &tls.ca)
            .env("REGISTRY_AUTH_FILE", &auth)
            .env("DOCKER_CONFIG", t("docker"))
            .env("SOURCE_DATE_EPOCH", "1700000000")
            // The jobs use the runtimes the tools job installed, never the test run's.
            .env_remove("INFER_SERVE_BIN")
            .env_remove("INFER_SERVE_DYNAMIC_BIN")
            .env_remove("INFER_SERVE_GPU_BIN")
            .env_remove("INFER_BUILD_REGISTRY")
            .env_remove("INFER_BUILD_REGISTRY_USER")
            .env_remove("INFER_BUILD_REGISTRY_PASSWORD");
        // What `cargo test` sets for this test binary (CARGO_PKG_NAME, CARGO_MANIFEST_DIR, ...)
        // is not in a CI runner's environment, and some dependencies' build scripts rerun when
        // it changes: left in, the tools job's install would rebuild the builder.
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy();
            if k.starts_with("CARGO_") && k != "CARGO_HOME" && k != "CARGO_TARGET_DIR" {
                c.env_remove(&*k);
            }
        }
    };
    let o = Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("--dest-cert-dir={}", tls.cert_dir.display()))
        .arg(format!("--dest-creds={}:{}", tls.user, tls.password))
        .arg(format!("oci:{}:1", glibc_base_layout().display()))
        .arg(format!("docker://{base}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "pushing the base: {}", stderr(&o));

    // Run the workflow.
    let work = t("work");
    let mut c = Command::new(python());
    with_env(&mut c);
    let o = c
        .arg(root().join("tests/it/ci_workflow.py"))
        .arg(root().join(WORKFLOW))
        .arg("--user-repo")
        .arg(&repo)
        .arg("--infer-build-repo")
        .arg(root())
        .arg("--work")
        .arg(&work)
        .arg("--gpu-tools")
        .arg(t("gpu-tools"))
        .arg("--tensorrt-headers")
        .arg(&headers)
        .args([
            "--set",
            "env.RECIPE=recipes/mlp.toml",
            "--set",
            &format!("env.REGISTRY={}/models", reg.addr),
            "--set",
            &format!("secrets.GITHUB_TOKEN={}", tls.password),
            "--set",
            &format!("github.actor={}", tls.user),
            "--set",
            "github.repository_owner=acme",
        ])
        .output()
        .unwrap();
    let out = stdout(&o);
    assert!(o.status.success(), "{out}\n{}", stderr(&o));
    assert!(out.trim_end().ends_with("ok"), "{out}");
    let jobs: Vec<Value> = out
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let names: Vec<&str> = jobs.iter().map(|j| j["job"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["tools", "plan", "engine[0]", "engine[1]", "publish"],
        "{out}"
    );
    // The CPU engine job runs on a hosted runner without a container; the GPU one on a runner
    // of its architecture, inside the plan's TensorRT builder image.
    assert_eq!(jobs[2]["container"], "", "{out}");
    assert_eq!(jobs[2]["runs_on"], serde_json::json!(["ubuntu-latest"]));
    let builder = jobs[3]["container"].as_str().unwrap();
    assert!(builder.contains("tensorrt"), "{out}");
    assert!(
        jobs[3]["runs_on"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("gpu-sm89")),
        "{out}"
    );
    // skopeo login wrote containers' auth.json, and infer-build pushed with it.
    let creds = std::fs::read_to_string(&auth).unwrap();
    assert!(creds.contains(&reg.addr), "{creds}");

    // What was pushed serves: the CPU tag, pulled back, loaded into Docker, like onnxruntime.
    let build: Value = serde_json::from_str(
        &std::fs::read_to_string(work.join("jobs/publish/workspace/build.json")).unwrap(),
    )
    .unwrap();
    let cpu = build["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == "cpu-fp32")
        .unwrap();
    let tag = cpu["tag"].as_str().unwrap();
    assert!(work
        .join("jobs/publish/workspace/k8s")
        .read_dir()
        .unwrap()
        .next()
        .is_some());
    // A pushed tag, pulled back with skopeo into Docker as `ci-example/mlp:TAG`.
    let pull = |tag: &str| {
        let archive = t(&format!("{tag}.tar"));
        let o = Command::new("skopeo")
            .args(["copy", "--quiet"])
            .arg(format!("--src-cert-dir={}", tls.cert_dir.display()))
            .arg(format!("--src-creds={}:{}", tls.user, tls.password))
            .arg(format!("docker://{}/models:{tag}", reg.addr))
            .arg(format!(
                "docker-archive:{}:ci-example/mlp:{tag}",
                archive.display()
            ))
            .output()
            .unwrap();
        assert!(o.status.success(), "pulling {tag}: {}", stderr(&o));
        docker_load(&archive);
    };
    pull(tag);
    let o = Command::new("docker")
        .args(["run", "-d", "--rm", "-p", "127.0.0.1::8000"])
        .arg(format!("ci-example/mlp:{tag}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let id = stdout(&o).trim().to_string();
    let result = serve_checks(&id, &root().join("examples/mlp/mlp.onnx"));
    let logs = Command::new("docker").args(["logs", &id]).output().unwrap();
    let _ = Command::new("docker").args(["rm", "-f", &id]).output();
    let _ = Command::new("docker")
        .args(["rmi", &format!("ci-example/mlp:{tag}")])
        .output();
    if let Err(e) = result {
        panic!("{e}\ncontainer log:\n{}{}", stdout(&logs), stderr(&logs));
    }

    // The GPU tag carries the runtime built with TensorRT: on this machine without a GPU it
    // starts and exits 1 naming what is missing (before, GPU images on a CUDA base carried the
    // CPU runtime, which cannot serve a TensorRT engine at all).
    let gpu_id = gpu.id.as_str();
    let gpu_tag = build["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == gpu_id)
        .unwrap()["tag"]
        .as_str()
        .unwrap()
        .to_string();
    pull(&gpu_tag);
    run_refuses_without_a_gpu(&format!("ci-example/mlp:{gpu_tag}"));
}
