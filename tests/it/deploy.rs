//! `infer-build deploy`: the YAML is valid Kubernetes (checked offline, strictly, by the
//! PyPI `kubernetes-validate` schemas) and carries the numbers it was derived from.

use std::path::Path;
use std::process::Command;

use infer_build::deploy::{self, Autoscale, DeploySpec, GpuSelector, StartupMeasurement};

use super::support;

/// The Kubernetes version the manifests are validated against.
const K8S_VERSION: &str = "1.33.0";

/// True when the test Python has `kubernetes_validate`; prints why the test is skipped if not.
fn have_validator(test: &str) -> bool {
    let ok = Command::new(support::python())
        .args(["-c", "import kubernetes_validate"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!(
            "skipping {test}: python `kubernetes_validate` is not installed (tests/requirements.txt)"
        );
    }
    ok
}

/// Run `kubernetes-validate --strict` on files; returns (success, combined output).
fn validate(files: &[&Path]) -> (bool, String) {
    let out = Command::new(support::python())
        .args(["-m", "kubernetes_validate", "-k", K8S_VERSION, "--strict"])
        .args(files)
        .output()
        .expect("run kubernetes_validate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn spec() -> DeploySpec {
    DeploySpec {
        model: "resnet50".into(),
        model_version: "1.4.0".into(),
        target: "sm89-fp16".into(),
        repository: "registry.example.com/ml/resnet50".into(),
        tag: "1.4.0-trt10.8-sm89-fp16".into(),
        digest: None,
        gpu: Some(GpuSelector::Compute { major: 8, minor: 9 }),
        gpu_count: 1,
        cpu_millis: 4000,
        memory_mib: 8192,
        shm_mib: 2048,
        replicas_min: 2,
        replicas_max: 8,
        startup: Some(StartupMeasurement {
            seconds: 21.4,
            source: "engine profile".into(),
        }),
        run_as_user: 65532,
        startup_safety: 3.0,
        prestop_s: 10,
        runtime_drain_s: 5,
        longest_deadline_ms: 1500,
        deadline_assumed: false,
        autoscale: Autoscale::GpuUtilisation {
            metric: "DCGM_FI_DEV_GPU_UTIL".into(),
            target_percent: 70,
        },
    }
}

#[test]
fn py_deploy_variants_pass_strict_validation() {
    if !have_validator("py_deploy_variants_pass_strict_validation") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut variants = Vec::new();
    variants.push(("gpu-compute", spec()));
    let mut s = spec();
    s.gpu = Some(GpuSelector::Products(vec![
        "NVIDIA-L4".into(),
        "NVIDIA-L40S".into(),
    ]));
    s.digest = Some(format!("sha256:{}", "0123456789abcdef".repeat(4)));
    s.startup = None;
    variants.push(("gpu-products", s));
    let mut s = spec();
    s.gpu = Some(GpuSelector::ComputeAtLeast { major: 8 });
    s.longest_deadline_ms = 30_000;
    s.deadline_assumed = true;
    variants.push(("gpu-hw-compat", s));
    let mut s = spec();
    s.gpu = None;
    s.target = "cpu-fp32".into();
    s.autoscale = Autoscale::QueueTime {
        metric: "infer_queue_time_seconds".into(),
        target_ms: 7.5,
    };
    variants.push(("cpu", s));
    let mut paths = Vec::new();
    for (name, s) in &variants {
        let p = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&p, deploy::render(s).unwrap()).unwrap();
        paths.push(p);
    }
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    let (ok, out) = validate(&refs);
    assert!(ok, "{out}");
    // Four objects per file, each reported as passed.
    assert_eq!(out.matches("passed").count(), 4 * variants.len(), "{out}");
}

#[test]
fn py_the_validator_does_reject_a_broken_manifest() {
    // The check above is only worth something if the validator fails on a real mistake: a
    // field the schema does not know (strict mode) in otherwise generated output.
    if !have_validator("py_the_validator_does_reject_a_broken_manifest") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let yaml = deploy::render(&spec()).unwrap().replace(
        "enableServiceLinks: false",
        "enableServiceLinks: false\n      bogusField: 1",
    );
    let p = dir.path().join("broken.yaml");
    std::fs::write(&p, yaml).unwrap();
    let (ok, out) = validate(&[p.as_path()]);
    assert!(!ok, "{out}");
    assert!(out.contains("bogusField"), "{out}");
}
