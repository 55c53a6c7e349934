//! `infer-build deploy`: the YAML is valid Kubernetes (checked offline, strictly, by the
//! PyPI `kubernetes-validate` schemas) and carries the numbers it was derived from.

use std::path::Path;
use std::process::Command;

use infer_build::deploy::{self, Autoscale, DeploySpec, GpuSelector, StartupMeasurement};

use super::support;

/// The Kubernetes version the manifests are validated against.
const K8S_VERSION: &str = "1.33.0";

/// True when the test Python has `kubernetes_validate`; prints why the test is skipped if not.
pub(super) fn have_validator(test: &str) -> bool {
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
    validate_at(files, K8S_VERSION)
}

/// [`validate`] against Kubernetes `version`.
pub(super) fn validate_at(files: &[&Path], version: &str) -> (bool, String) {
    let out = Command::new(support::python())
        .args(["-m", "kubernetes_validate", "-k", version, "--strict"])
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
        cpu_prefers: Vec::new(),
        gpu_count: 1,
        gpu_share: deploy::GpuShare::Whole,
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
        grpc_readiness: false,
        split: None,
    }
}

#[test]
fn py_deploy_variants_pass_strict_validation() {
    if !have_validator("py_deploy_variants_pass_strict_validation") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut variants = vec![("gpu-compute", spec())];
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
    let mut s = spec();
    s.grpc_readiness = true;
    variants.push(("grpc-probe", s));
    // Shared GPUs: a MIG slice, a time-sliced and an MPS share.
    for (name, share) in [
        (
            "gpu-mig",
            deploy::GpuShare::Mig {
                profile: "1g.10gb".into(),
                product: "H100".into(),
                need_gb: 3.2,
            },
        ),
        ("gpu-time-sliced", deploy::GpuShare::TimeSliced),
        ("gpu-mps", deploy::GpuShare::Mps),
    ] {
        let mut s = spec();
        s.gpu_share = share;
        let y = deploy::render(&s).unwrap();
        let resource = s.gpu_share.resource();
        assert!(
            y.contains(&format!("{resource}: \"1\"")) && !y.contains("nvidia.com/gpu: \"1\""),
            "{name}: {y}"
        );
        for caveat in s.gpu_share.caveats() {
            assert!(y.contains(&caveat), "{name}: {y}");
        }
        variants.push((name, s));
    }
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

/// The split layout: the runtime image runs, the model image is an image volume mounted
/// read-only at `/mnt/models`, both pinned; the pre-pull DaemonSet pulls both.
#[test]
fn py_a_split_deployment_mounts_the_model_image_as_an_image_volume() {
    if !have_validator("py_a_split_deployment_mounts_the_model_image_as_an_image_volume") {
        return;
    }
    let (runtime, model) = (
        format!("sha256:{}", "1".repeat(64)),
        format!("sha256:{}", "2".repeat(64)),
    );
    let mut s = spec();
    s.digest = Some(format!("sha256:{}", "3".repeat(64)));
    s.split = Some(deploy::SplitImages {
        runtime_digest: Some(runtime.clone()),
        model_digest: Some(model.clone()),
    });
    let y = deploy::render(&s).unwrap();
    let repo = &s.repository;
    for want in [
        format!("image: \"{repo}@{runtime}\""),
        format!("reference: \"{repo}@{model}\""),
        "pullPolicy: \"IfNotPresent\"".to_string(),
        "mountPath: \"/mnt/models\"".to_string(),
        "readOnly: true".to_string(),
        "Kubernetes 1.35".to_string(),
        "containerd 2.1+ or CRI-O 1.31+".to_string(),
    ] {
        assert!(y.contains(&want), "no {want:?} in:\n{y}");
    }
    // The combined image is not run, and the model is mounted by the server and the pre-pull.
    assert!(!y.contains(&s.digest.clone().unwrap()), "{y}");
    assert_eq!(y.matches("mountPath: \"/mnt/models\"").count(), 2, "{y}");
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("split.yaml");
    std::fs::write(&p, &y).unwrap();
    // Image volumes: beta on by default in 1.35, GA in 1.36; the schema has had them since 1.31.
    for version in ["1.35.0", "1.36.0"] {
        let (ok, out) = validate_at(&[p.as_path()], version);
        assert!(ok, "{version}: {out}");
        assert_eq!(out.matches("passed").count(), 4, "{version}: {out}");
    }
    // Without a digest, by tag: `<tag>-runtime` and `<tag>-model`.
    s.split = Some(deploy::SplitImages::default());
    let y = deploy::render(&s).unwrap();
    assert!(
        y.contains(&format!("image: \"{repo}:{}-runtime\"", s.tag)),
        "{y}"
    );
    assert!(
        y.contains(&format!("reference: \"{repo}:{}-model\"", s.tag)),
        "{y}"
    );
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

/// Every shipped recipe and every example's recipe or bundle file through the real CLI, then the
/// strict validator.
#[test]
fn py_every_recipe_deploys_to_valid_yaml() {
    if !have_validator("py_every_recipe_deploys_to_valid_yaml") {
        return;
    }
    let mut recipes: Vec<std::path::PathBuf> = std::fs::read_dir(support::root().join("recipes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    recipes.sort();
    assert!(recipes.len() >= 5, "{recipes:?}");
    // The examples' recipes (the split layout's among them) and bundle file.
    let mut examples: Vec<std::path::PathBuf> = std::fs::read_dir(support::root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .flat_map(|d| [d.join("recipe.toml"), d.join("bundle.toml")])
        .filter(|p| p.is_file())
        .collect();
    examples.sort();
    assert!(examples.len() >= 5, "{examples:?}");
    recipes.extend(examples);
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, r) in recipes.iter().enumerate() {
        let out_dir = dir.path().join(i.to_string());
        let out = support::run(&[
            "deploy",
            r.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}: {}",
            r.display(),
            support::stderr(&out)
        );
        for f in std::fs::read_dir(&out_dir).unwrap() {
            let p = f.unwrap().path();
            let yaml = std::fs::read_to_string(&p).unwrap();
            // The derived numbers carry their arithmetic.
            assert!(yaml.contains("# start-up budget:"), "{}", p.display());
            assert!(yaml.contains("# grace period: preStop"), "{}", p.display());
            files.push(p);
        }
    }
    assert!(
        files.len() > recipes.len(),
        "some recipe has GPU targets: {files:?}"
    );
    let refs: Vec<&Path> = files.iter().map(|p| p.as_path()).collect();
    let (ok, out) = validate(&refs);
    assert!(ok, "{out}");
    assert_eq!(out.matches("passed").count(), 4 * files.len(), "{out}");
}

#[test]
fn deploy_is_deterministic_and_pins_a_given_digest() {
    let recipe = support::root().join("recipes/resnet50.toml");
    let dir = tempfile::tempdir().unwrap();
    let run = |sub: &str, extra: &[&str]| {
        let out_dir = dir.path().join(sub);
        let mut args = vec![
            "deploy",
            recipe.to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let out = support::run(&args);
        assert!(out.status.success(), "{}", support::stderr(&out));
        let mut files: Vec<(String, String)> = std::fs::read_dir(&out_dir)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                (
                    p.file_name().unwrap().to_string_lossy().into_owned(),
                    std::fs::read_to_string(&p).unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    };
    let a = run("a", &[]);
    let b = run("b", &[]);
    assert_eq!(a, b);
    let first = a[0].0.trim_end_matches(".yaml").to_string();
    let target = a[0]
        .1
        .lines()
        .find(|l| l.starts_with("# Generated"))
        .unwrap();
    let target = target
        .rsplit("target ")
        .next()
        .unwrap()
        .trim_end_matches('.')
        .to_string();
    let digest = format!("sha256:{}", "ab".repeat(32));
    let image = format!("registry.example.com/ml/resnet50@{digest}");
    let pinned = run("c", &["--target", &target, "--image", &image]);
    assert_eq!(pinned.len(), 1, "{first}");
    assert!(
        pinned[0].1.contains(&format!("image: \"{image}\"")),
        "{}",
        pinned[0].1
    );

    // Bad input: an unknown target is exit 2 and names the known ones.
    let out = support::run(&[
        "deploy",
        recipe.to_str().unwrap(),
        "--target",
        "sm1-fp3",
        "--out",
        dir.path().to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        support::stderr(&out).contains("sm1-fp3"),
        "{}",
        support::stderr(&out)
    );
}
