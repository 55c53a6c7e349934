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
use infer_build::report::BuildOutput;
use serde_json::Value;

use super::engine::fake_gpu_tools;
use super::gpu_image::{run_refuses_without_a_gpu, tensorrt_headers};
use super::image::serve_checks;
use super::ort_image::glibc_base_layout;
use super::registry_support::{Registry, Tls};
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

/// What the CI example's steps share: the TLS registry, the user's repository, the matrix copy
/// naming the loopback base, and the workspace `ci_workflow.py` runs the jobs in.
struct CiScene {
    tmp: tempfile::TempDir,
    reg: Registry,
    /// The user's repository (`recipes/mlp.toml` and its model).
    repo: PathBuf,
    /// TensorRT's headers the tools job builds the GPU runtime against.
    headers: PathBuf,
    /// The matrix copy whose GPU base is `base` (`INFER_BUILD_MATRIX`).
    matrix: PathBuf,
    /// The GPU target's base image, in the loopback registry.
    base: String,
    /// The GPU target's id in the plan.
    gpu_id: String,
}

impl CiScene {
    /// A path in the scene's temporary directory.
    fn t(&self, p: &str) -> PathBuf {
        self.tmp.path().join(p)
    }

    fn tls(&self) -> &Tls {
        self.reg.tls.as_ref().unwrap()
    }

    /// The environment every job runs with: the scene's matrix, cache, CA and credentials
    /// files, and nothing of the test run's own.
    fn with_env(&self, c: &mut Command) {
        c.env("INFER_BUILD_MATRIX", &self.matrix)
            .env("INFER_BUILD_CACHE_DIR", self.t("cache"))
            .env("SSL_CERT_FILE", &self.tls().ca)
            .env("REGISTRY_AUTH_FILE", self.t("auth.json"))
            .env("DOCKER_CONFIG", self.t("docker"))
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
    }

    /// A pushed tag, pulled back with skopeo into Docker as `ci-example/mlp:TAG`.
    fn pull(&self, tag: &str) {
        let tls = self.tls();
        let archive = self.t(&format!("{tag}.tar"));
        let o = Command::new("skopeo")
            .args(["copy", "--quiet"])
            .arg(format!("--src-cert-dir={}", tls.cert_dir.display()))
            .arg(format!("--src-creds={}:{}", tls.user, tls.password))
            .arg(format!("docker://{}/models:{tag}", self.reg.addr))
            .arg(format!(
                "docker-archive:{}:ci-example/mlp:{tag}",
                archive.display()
            ))
            .output()
            .unwrap();
        assert!(o.status.success(), "pulling {tag}: {}", stderr(&o));
        docker_load(&archive);
    }
}

/// The user's repository in `repo`: the example recipe with a CPU and an L4 target. TensorRT
/// 10.11 is the newest release the matrix has a builder image for (and it takes fp16 as a
/// builder flag on this FP32 export).
fn write_user_repository(repo: &Path) {
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
}

/// The scene, or `None` (the test skips) without skopeo, jq, Docker, PyYAML, the registry or
/// TensorRT's headers. The plan with the matrix copy puts the GPU target on the loopback base,
/// and stand-ins for `nvidia-smi` and `trtexec` report an L4 and the planned TensorRT.
fn ci_scene(test: &str) -> Option<CiScene> {
    if !have_tool("skopeo", test)
        || !have_tool("jq", test)
        || !have_docker(test)
        || !have_python_module("yaml", test)
    {
        return None;
    }
    let reg = Registry::start_tls(test)?;
    let tmp = tempfile::tempdir().unwrap();
    let t = |p: &str| tmp.path().join(p);

    let repo = t("repo");
    write_user_repository(&repo);

    // The tools job builds the GPU image runtime against TensorRT's headers (checked out from
    // NVIDIA/TensorRT in the workflow; here the copy scripts/test.sh built it against).
    let headers = tensorrt_headers(test)?;

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
    let gpu_id = gpu.id.clone();

    Some(CiScene {
        tmp,
        reg,
        repo,
        headers,
        matrix,
        base,
        gpu_id,
    })
}

/// The glibc test base is pushed to the loopback registry as the GPU target's base.
fn push_gpu_base(s: &CiScene) {
    let tls = s.tls();
    let o = Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("--dest-cert-dir={}", tls.cert_dir.display()))
        .arg(format!("--dest-creds={}:{}", tls.user, tls.password))
        .arg(format!("oci:{}:1", glibc_base_layout().display()))
        .arg(format!("docker://{}", s.base))
        .output()
        .unwrap();
    assert!(o.status.success(), "pushing the base: {}", stderr(&o));
}

/// `ci_workflow.py` runs the workflow's jobs as written and ends with `ok`; returns its
/// stdout (one JSON line per job run).
fn run_workflow(s: &CiScene) -> String {
    let tls = s.tls();
    let mut c = Command::new(python());
    s.with_env(&mut c);
    let o = c
        .arg(root().join("tests/it/ci_workflow.py"))
        .arg(root().join(WORKFLOW))
        .arg("--user-repo")
        .arg(&s.repo)
        .arg("--infer-build-repo")
        .arg(root())
        .arg("--work")
        .arg(s.t("work"))
        .arg("--gpu-tools")
        .arg(s.t("gpu-tools"))
        .arg("--tensorrt-headers")
        .arg(&s.headers)
        .args([
            "--set",
            "env.RECIPE=recipes/mlp.toml",
            "--set",
            &format!("env.REGISTRY={}/models", s.reg.addr),
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
    out
}

/// The jobs ran in the workflow's order; the CPU engine job on a hosted runner without a
/// container, the GPU one on a runner of its architecture inside the plan's TensorRT builder.
fn jobs_ran_in_order_on_their_runners(out: &str) {
    // `ci_workflow.py`'s own lines, not an infer-build document.
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
}

/// skopeo login wrote containers' auth.json, and infer-build pushed with it.
fn skopeo_login_wrote_the_auth_file(s: &CiScene) {
    let creds = std::fs::read_to_string(s.t("auth.json")).unwrap();
    assert!(creds.contains(&s.reg.addr), "{creds}");
}

/// The publish job's `build --json` report (`build.json`); its `deploy` step wrote the
/// Kubernetes YAML.
fn publish_outputs(s: &CiScene) -> BuildOutput {
    let workspace = s.t("work").join("jobs/publish/workspace");
    let text = std::fs::read_to_string(workspace.join("build.json")).unwrap();
    let build: BuildOutput = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("build.json is not a build report: {e}\n{text}"));
    assert!(workspace.join("k8s").read_dir().unwrap().next().is_some());
    build
}

/// The tag the build report gives target `id`.
fn target_tag<'a>(build: &'a BuildOutput, id: &str) -> &'a str {
    &build.targets.iter().find(|t| t.id == id).unwrap().tag
}

/// What was pushed serves: the CPU tag, pulled back, loaded into Docker, like onnxruntime.
fn cpu_tag_serves(s: &CiScene, build: &BuildOutput) {
    let tag = target_tag(build, "cpu-fp32");
    s.pull(tag);
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
}

/// The GPU tag carries the runtime built with TensorRT: on this machine without a GPU it
/// starts and exits 1 naming what is missing (before, GPU images on a CUDA base carried the
/// CPU runtime, which cannot serve a TensorRT engine at all).
fn gpu_tag_refuses_without_a_gpu(s: &CiScene, build: &BuildOutput) {
    let gpu_tag = target_tag(build, &s.gpu_id);
    s.pull(gpu_tag);
    run_refuses_without_a_gpu(&format!("ci-example/mlp:{gpu_tag}"));
}

/// The CI example's steps as written, sharing one registry and workspace: the base is pushed,
/// the workflow's jobs run in order, and what the publish job pushed serves.
#[test]
fn registry_ci_example_runs_as_written() {
    let Some(s) = ci_scene("registry_ci_example_runs_as_written") else {
        return;
    };
    push_gpu_base(&s);
    let out = run_workflow(&s);
    jobs_ran_in_order_on_their_runners(&out);
    skopeo_login_wrote_the_auth_file(&s);
    let build = publish_outputs(&s);
    cpu_tag_serves(&s, &build);
    gpu_tag_refuses_without_a_gpu(&s, &build);
}
