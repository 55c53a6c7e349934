//! `infer-build check` and `infer-build plan` through the real binary: golden plans for the
//! shipped recipes, every refusal rule (exit 2, `file:line:col`, the rule's name), tags, driver
//! floors, the lock file, `--matrix DIR` and the GitHub Actions matrix.

use std::path::{Path, PathBuf};

use infer_build::plan::{BuildPlan, PinnedBy, TargetKind};
use serde_json::Value;

use super::support::{root, run, run_in, stderr, stdout};

const HEAD: &str = r#"[model]
name = "m"
version = "1.0.0"
onnx = "m.onnx"
[model.inputs.input]
datatype = "fp32"
shape = [-1, 64]
"#;

/// A fresh directory holding `r.toml` (HEAD + `extra`) and the example model as `m.onnx`.
fn fixture(extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::copy(
        root().join("examples/mlp/mlp.onnx"),
        dir.path().join("m.onnx"),
    )
    .expect("copy model");
    std::fs::write(dir.path().join("r.toml"), format!("{HEAD}{extra}")).expect("write recipe");
    dir
}

fn plan_json(dir: &Path, extra_args: &[&str]) -> BuildPlan {
    super::support::plan(&dir.join("r.toml"), extra_args)
}

/// `check` must refuse `extra` with exit 2, naming each rule at r.toml:line:col.
fn refused(extra: &str, rules: &[&str]) -> String {
    let dir = fixture(extra);
    for cmd in ["check", "plan"] {
        let o = run_in(dir.path(), &[cmd, "r.toml"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        for r in rules {
            assert!(
                err.contains(&format!("[rule: {r}]")),
                "{cmd}: no rule {r} in:\n{err}"
            );
        }
        assert!(err.contains("r.toml:") && err.contains("hint:"), "{err}");
        assert!(stdout(&o).is_empty());
    }
    stderr(&run_in(dir.path(), &["check", "r.toml"]))
}

#[test]
fn refuses_v100_with_tensorrt_10_5_or_newer() {
    let e = refused(
        "[targets]\ngpus = [\"V100\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.5\"\n",
        &["tensorrt-min-sm"],
    );
    assert!(e.contains("r.toml:11:12: targets.tensorrt:"), "{e}");
}

#[test]
fn refuses_fp8_on_sm86() {
    let e = refused(
        "[targets]\ngpus = [\"sm_86\"]\nprecision = [\"fp8\"]\n[fp8]\ncalibration = \".\"\n",
        &["fp8-needs-sm89"],
    );
    assert!(e.contains("r.toml:10:14: targets.precision[0]:"), "{e}");
}

#[test]
fn refuses_int8_calibration_on_tensorrt_11() {
    let e = refused(
        "[targets]\ngpus = [\"L4\"]\nprecision = [\"int8\"]\ntensorrt = \"11\"\n[int8]\ncalibration = \"m.onnx\"\n",
        &["int8-calibration-needs-tensorrt-10"],
    );
    assert!(e.contains("int8.calibration:"), "{e}");
}

#[test]
fn refuses_tensorrt_11_on_jetson() {
    refused(
        "[targets]\ngpus = [\"Jetson Orin NX\"]\nprecision = [\"fp16\"]\ntensorrt = \"11\"\n",
        &["tensorrt-11-no-jetson"],
    );
}

#[test]
fn refuses_a_cuda_13_base_below_driver_580() {
    let e = refused(
        "[targets]\ngpus = [\"H100\"]\nprecision = [\"fp16\"]\n[image]\nbase = \"docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04\"\n[deploy]\nnode_driver = \"570.124.06\"\n",
        &["cuda13-needs-driver-580"],
    );
    assert!(e.contains("image.base:") && e.contains("570.124.06"), "{e}");
}

#[test]
fn reports_every_refusal_at_once() {
    refused(
        "[targets]\ngpus = [\"V100\", \"A10\", \"Jetson AGX Orin\", \"H9000\"]\nprecision = [\"fp16\", \"fp8\"]\ntensorrt = \"11\"\n[fp8]\ncalibration = \".\"\n",
        &["tensorrt-min-sm", "fp8-needs-sm89", "tensorrt-11-no-jetson", "known-gpu"],
    );
}

#[test]
fn check_prints_a_summary_and_exits_0() {
    let dir = fixture("[targets]\ngpus = [\"L4\", \"H100\"]\nprecision = [\"fp16\"]\ncpu = true\n");
    let o = run_in(dir.path(), &["check", "r.toml"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("3 targets (cpu-fp32, sm89-fp16, sm90-fp16)"),
        "{e}"
    );
    assert!(e.contains("to be pinned in r.lock at first pull"), "{e}");
    assert!(stdout(&o).is_empty());
}

#[test]
fn json_lists_every_target_with_versions_base_and_tag() {
    let dir = fixture("[targets]\ngpus = [\"H100\", \"H200\", \"L4\"]\nprecision = [\"fp16\"]\ncpu = true\n[image]\nrepository = \"registry.example.com/ml/m\"\n");
    let v = plan_json(dir.path(), &[]);
    let ids: Vec<&str> = v.targets.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["cpu-fp32", "sm89-fp16", "sm90-fp16"]);
    let h = &v.targets[2];
    assert_eq!(h.kind, TargetKind::Gpu);
    let gpu = h.gpu.as_ref().unwrap();
    assert_eq!(gpu.products, ["H100", "H200"]);
    assert_eq!(gpu.sm, "sm90");
    assert_eq!(h.precision, infer_build::matrix::Precision::Fp16);
    let trt = h.tensorrt.as_ref().unwrap();
    assert!(!trt.version.to_string().is_empty() && !trt.build.is_empty());
    assert!(h.cuda.is_some() && h.driver_floor.is_some());
    assert!(!h.cudnn.as_ref().unwrap().version.is_empty());
    assert_eq!(h.base.digest, None);
    assert_eq!(h.base.pinned_by, PinnedBy::Lock);
    assert_eq!(h.tag, "1.0.0-sm90-fp16");
    assert_eq!(h.image, "registry.example.com/ml/m:1.0.0-sm90-fp16");
    assert_eq!(v.repository, "registry.example.com/ml/m");
    assert_eq!(v.targets[0].base.reference, "scratch");
    assert_eq!(v.targets[0].base.pinned_by, PinnedBy::None);
    // Deterministic: the same bytes twice.
    let a = stdout(&run_in(dir.path(), &["plan", "r.toml", "--json"]));
    let b = stdout(&run_in(dir.path(), &["plan", "r.toml", "--format", "json"]));
    assert_eq!(a, b);
}

/// The table names the base each CPU image is really built on, as `plan --json` has it:
/// `scratch` under tract, the glibc base under ONNX Runtime, and under `auto` both, with a note
/// that the build measures the two engines and ships the faster.
#[test]
fn the_table_shows_the_base_the_cpu_engine_ships_on() {
    for engine in ["tract", "onnxruntime", "auto"] {
        let dir = fixture(&format!(
            "[targets]\ncpu = true\n[engine]\ncpu = \"{engine}\"\n"
        ));
        let v = plan_json(dir.path(), &[]);
        let t = &v.targets[0];
        assert_eq!(t.base.reference, "scratch", "{engine}");
        let glibc = t
            .cpu
            .as_ref()
            .unwrap()
            .glibc_base
            .as_ref()
            .map(|p| p.reference.clone());
        let o = run_in(dir.path(), &["plan", "r.toml"]);
        assert!(o.status.success(), "{engine}: {}", stderr(&o));
        let table = stderr(&o);
        let row = table
            .lines()
            .find(|l| l.starts_with("cpu-fp32 "))
            .unwrap_or_else(|| panic!("{engine}: no cpu-fp32 row in:\n{table}"));
        let base = row.split_whitespace().nth(5).unwrap();
        let note = table.lines().find(|l| l.contains("engine.cpu = \"auto\""));
        match engine {
            "tract" => {
                assert_eq!(base, "scratch", "{table}");
                assert!(note.is_none(), "{table}");
            }
            "onnxruntime" => {
                let glibc = glibc.expect("an ONNX Runtime target has the glibc base");
                assert_eq!(base, glibc, "{table}");
                assert!(!row.contains("scratch") && note.is_none(), "{table}");
            }
            _ => {
                let glibc = glibc.expect("auto: ONNX Runtime is a candidate");
                assert!(row.contains(&format!("scratch or {glibc}")), "{table}");
                let note = note.unwrap_or_else(|| panic!("no note on auto in:\n{table}"));
                assert!(
                    note.starts_with("note (cpu-fp32): ")
                        && note.contains("tract FROM scratch")
                        && note.contains("measures tract and ONNX Runtime and OpenVINO")
                        && note.contains(&format!("ONNX Runtime or OpenVINO on {glibc}")),
                    "{table}"
                );
            }
        }
    }
}

#[test]
fn the_lock_file_beside_the_recipe_pins_base_digests() {
    let dir = fixture(
        "[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10\"\ncuda = \"12\"\nversion_compatible = false\n",
    );
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    std::fs::write(
        dir.path().join("r.lock"),
        format!("version = 1\n\n[[image]]\nreference = \"docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04\"\ndigest = \"{digest}\"\n"),
    )
    .unwrap();
    let v = plan_json(dir.path(), &[]);
    let base = &v.targets[0].base;
    assert_eq!(
        base.digest.as_ref().map(|d| d.as_str()),
        Some(digest.as_str())
    );
    assert_eq!(base.pinned_by, PinnedBy::Lock);
    // A broken lock file is bad input, named with its line.
    std::fs::write(
        dir.path().join("r.lock"),
        "version = 1\n[[image]]\nreference = \"x\"\ndigest = \"sha256:1\"\n",
    )
    .unwrap();
    let o = run_in(dir.path(), &["check", "r.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("r.lock:2:1:"), "{}", stderr(&o));
}

#[test]
fn driver_floor_selects_the_newest_build_the_fleet_runs() {
    let cases = [
        ("H100", "", "11.4.0", "12.9.1", "575.57.08"),
        ("H100", "575.57.08", "11.4.0", "12.9.1", "575.57.08"),
        ("H100", "550.54.15", "10.1.0", "12.4.1", "550.54.15"),
        ("H100", "595.58.03", "11.0.0", "13.2.1", "595.58.03"),
        ("B200", "575.51.03", "10.9.0", "12.8.1", "570.124.06"),
        ("L4", "", "11.4.0", "12.9.1", "575.57.08"),
    ];
    for (gpu, driver, trt, cuda, floor) in cases {
        let deploy = if driver.is_empty() {
            String::new()
        } else {
            format!("[deploy]\nnode_driver = \"{driver}\"\n")
        };
        let dir = fixture(&format!(
            "[targets]\ngpus = [\"{gpu}\"]\nprecision = [\"fp16\"]\n{deploy}"
        ));
        let v = plan_json(dir.path(), &[]);
        let t = &v.targets[0];
        let text = |v: Option<&infer_build::matrix::Version>| v.map(|v| v.to_string());
        assert_eq!(
            (
                text(t.tensorrt.as_ref().map(|t| &t.version)),
                text(t.cuda.as_ref()),
                text(t.driver_floor.as_ref())
            ),
            (Some(trt.into()), Some(cuda.into()), Some(floor.into())),
            "{gpu} driver {driver}"
        );
    }
}

#[test]
fn tags_render_from_the_template() {
    let cases = [
        ("{version}-{target}", "1.0.0-sm89-fp16"),
        ("{model}-{gpu}-{precision}", "m-rtx-4090-fp16"),
        ("trt{tensorrt}-cuda{cuda}-{sm}", "trt10.8.0-cuda12.8.1-sm89"),
    ];
    for (tpl, want) in cases {
        let dir = fixture(&format!("[targets]\ngpus = [\"RTX 4090\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.8\"\n[image]\ntag = \"{tpl}\"\n"));
        let v = plan_json(dir.path(), &[]);
        assert_eq!(v.targets[0].tag, want, "{tpl}");
    }
    // A template within the recipe's limit can still render a tag over 128 characters.
    let long = "{gpu}".repeat(25);
    let e = refused(
        &format!(
            "[targets]\ngpus = [\"RTX 4090\"]\nprecision = [\"fp16\"]\n[image]\ntag = \"{long}\"\n"
        ),
        &["tag-length"],
    );
    assert!(e.contains("image.tag:"), "{e}");
}

#[test]
fn github_matrix_is_one_line_ready_for_strategy_matrix() {
    let dir =
        fixture("[targets]\ngpus = [\"L4\", \"GH200\"]\nprecision = [\"fp16\"]\ncpu = true\n");
    let o = run_in(dir.path(), &["plan", "r.toml", "--format", "github-matrix"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert_eq!(out.trim_end().lines().count(), 1, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let include = v["include"].as_array().unwrap();
    let targets: Vec<&str> = include
        .iter()
        .map(|e| e["target"].as_str().unwrap())
        .collect();
    assert_eq!(targets, ["cpu-fp32", "sm89-fp16", "sm90-sbsa-fp16"]);
    assert_eq!(include[0]["runner"], serde_json::json!(["ubuntu-latest"]));
    assert_eq!(
        include[1]["runner"],
        serde_json::json!(["self-hosted", "linux", "x64", "gpu-sm89"])
    );
    assert_eq!(
        include[2]["runner"],
        serde_json::json!(["self-hosted", "linux", "arm64", "gpu-sm90"])
    );
    for e in include {
        for k in [
            "target",
            "kind",
            "runner",
            "platform",
            "sm",
            "precision",
            "tensorrt",
            "cuda",
            "driver_floor",
            "base",
            "container",
            "image",
            "tag",
        ] {
            assert!(e.get(k).is_some(), "missing {k} in {e}");
        }
    }
    // The job container: none for the CPU target and where the matrix has no builder image for
    // the target's TensorRT (the newest release here), the builder image where it has one.
    assert_eq!(include[0]["container"], "");
    let dir = fixture(
        "[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.11\"\ncpu = true\n",
    );
    let o = run_in(dir.path(), &["plan", "r.toml", "--format", "github-matrix"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["include"][0]["container"], "");
    assert_eq!(
        v["include"][1]["container"],
        "nvcr.io/nvidia/tensorrt:25.06-py3"
    );
}

/// Copy the embedded matrix into `dir` (as `--matrix DIR` expects it), with `edit` applied.
fn matrix_copy(dir: &Path, edit: impl Fn(&str, String) -> String) -> PathBuf {
    let m = dir.join("matrix-copy");
    for f in [
        "matrix/tensorrt.toml",
        "matrix/cuda.toml",
        "matrix/gpus.toml",
        "base-images/images.toml",
    ] {
        let text = std::fs::read_to_string(root().join(f)).unwrap();
        let path = m.join(f);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, edit(f, text)).unwrap();
    }
    m
}

#[test]
fn matrix_dir_overrides_the_embedded_data() {
    let dir = fixture("[targets]\ngpus = [\"Acme X1\"]\nprecision = [\"fp16\"]\n");
    // Unknown to the embedded matrix.
    let o = run_in(dir.path(), &["check", "r.toml"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("[rule: known-gpu]"));
    // Known to a copy with one more GPU row.
    let m = matrix_copy(dir.path(), |f, t| {
        if f == "matrix/gpus.toml" {
            t + "\n[[gpu]]\nname = \"Acme X1\"\ncc = \"8.9\"\narch = \"ada\"\nplatform = \"x86_64\"\ntensor_cores = [\"fp16\", \"int8\", \"fp8\"]\nmig = 0\nsource = [\"https://example.com/acme-x1\"]\nconfirmed = false\n"
        } else {
            t
        }
    });
    let v = plan_json(dir.path(), &["--matrix", m.to_str().unwrap()]);
    assert_eq!(v.targets[0].id, "sm89-fp16");
    assert_eq!(v.targets[0].gpu.as_ref().unwrap().products, ["Acme X1"]);
    assert_eq!(v.matrix, m.to_str().unwrap());
    // A copy that contradicts itself is refused with the file and line.
    let bad = matrix_copy(dir.path(), |f, t| {
        if f == "matrix/tensorrt.toml" {
            t.replacen("min_cc = \"7.5\"", "min_cc = \"seven\"", 1)
        } else {
            t
        }
    });
    let o = run_in(
        dir.path(),
        &["check", "r.toml", "--matrix", bad.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains("matrix/tensorrt.toml:") && e.contains("key `min_cc`"),
        "{e}"
    );
    // A directory without the data files.
    let o = run_in(
        dir.path(),
        &[
            "check",
            "r.toml",
            "--matrix",
            dir.path().join("nowhere").to_str().unwrap(),
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cannot read matrix file"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn help_is_available_for_check_and_plan() {
    for cmd in ["check", "plan"] {
        let o = run(&[cmd, "--help"]);
        assert!(o.status.success());
        assert!(stdout(&o).contains("--matrix"), "{}", stdout(&o));
        // `--matrix` takes the directory above `matrix/` and `base-images/`, and says so.
        let help = stdout(&o).split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            help.contains("DIR is the directory that holds `matrix/` and `base-images/`")
                && help.contains("not `matrix/` itself"),
            "{help}"
        );
    }
    assert!(stdout(&run(&["plan", "--help"])).contains("github-matrix"));
}

/// Golden plans: `plan --json` of every shipped recipe, compared with `tests/golden/plan/`.
/// Regenerate with `INFER_BUILD_UPDATE_GOLDEN=1 cargo test --test tests plan::golden`.
#[test]
fn golden_plans_of_the_shipped_recipes() {
    let mut recipes: Vec<PathBuf> = std::fs::read_dir(root().join("recipes"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect()
        })
        .unwrap_or_default();
    recipes.sort();
    recipes.push(root().join("examples/mlp/recipe.toml"));
    let update = std::env::var_os("INFER_BUILD_UPDATE_GOLDEN").is_some();
    for r in recipes {
        let rel = r
            .strip_prefix(root())
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let o = run(&["plan", &rel, "--json"]);
        assert!(o.status.success(), "{rel}: {}", stderr(&o));
        let name = rel.trim_end_matches(".toml").replace('/', "__");
        let golden = root()
            .join("tests/golden/plan")
            .join(format!("{name}.json"));
        if update {
            std::fs::create_dir_all(golden.parent().unwrap()).unwrap();
            std::fs::write(&golden, stdout(&o)).unwrap();
        }
        let want = std::fs::read_to_string(&golden).unwrap_or_else(|_| {
            panic!(
                "no golden plan {}: run with INFER_BUILD_UPDATE_GOLDEN=1",
                golden.display()
            )
        });
        assert_eq!(
            stdout(&o),
            want,
            "{rel}: plan differs from {}",
            golden.display()
        );
        // The table goes to stderr and names every target.
        let t = run(&["plan", &rel]);
        let v: BuildPlan = serde_json::from_str(&want).unwrap();
        for target in &v.targets {
            assert!(stderr(&t).contains(&target.id));
        }
    }
}

#[test]
fn a_bundle_whose_models_do_not_fit_the_gpu_together_is_refused_with_the_numbers() {
    // Each model alone fits an L4 (24 GB); the two together, with batches of 64 images of
    // 2048 x 2048, do not: `check` and `plan` refuse before any engine is built.
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b"] {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        std::fs::copy(root().join("examples/mlp/mlp.onnx"), d.join("m.onnx")).unwrap();
        std::fs::write(
            d.join("r.toml"),
            format!(
                "[model]\nname = \"{name}\"\nversion = \"1\"\nonnx = \"m.onnx\"\n[model.inputs.input]\ndatatype = \"fp32\"\nshape = [-1, 3, 2048, 2048]\n[model.outputs.output]\ndatatype = \"fp32\"\nshape = [-1, 10]\n[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\n[batching]\nmax_batch_size = 64\ninstances = 2\n"
            ),
        )
        .unwrap();
    }
    let bundle =
        "[bundle]\nname = \"big\"\nversion = \"1\"\nmodels = [\"a/r.toml\", \"b/r.toml\"]\n";
    std::fs::write(dir.path().join("bundle.toml"), bundle).unwrap();
    for cmd in ["check", "plan"] {
        let o = run_in(dir.path(), &[cmd, "bundle.toml"]);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains(
                "bundle.toml:4:11: bundle.models: target sm89-fp16: the models need about "
            ) && err.contains("of GPU memory together (an estimate: a ")
                && err.contains("usable of L4's 24 GB (10% kept free)"),
            "{cmd}: {err}"
        );
    }
    // One of them alone fits.
    std::fs::write(
        dir.path().join("bundle.toml"),
        bundle.replace(", \"b/r.toml\"", ""),
    )
    .unwrap();
    let o = run_in(dir.path(), &["check", "bundle.toml"]);
    assert!(o.status.success(), "{}", stderr(&o));

    // On CPU without a stated pod memory, `deploy` sizes the pod to hold both.
    for name in ["a", "b"] {
        let r = dir.path().join(name).join("r.toml");
        let text = std::fs::read_to_string(&r).unwrap();
        std::fs::write(
            &r,
            text.replace("gpus = [\"L4\"]\nprecision = [\"fp16\"]", "cpu = true"),
        )
        .unwrap();
    }
    std::fs::write(dir.path().join("bundle.toml"), bundle).unwrap();
    let o = run_in(dir.path(), &["deploy", "bundle.toml", "--out", "k8s"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("cpu-fp32: the bundle's models need about 27"),
        "{}",
        stderr(&o)
    );
    let yaml = std::fs::read_to_string(dir.path().join("k8s/big-cpu-fp32.yaml")).unwrap();
    assert!(yaml.contains("memory: \"27"), "{yaml}");
}

#[test]
fn deploy_asks_for_the_smallest_mig_slice_that_holds_the_model() {
    // The example's tiny model and the server's 0.5 GB: the smallest slice of an H100,
    // 1g.10gb, holds it.
    let dir = fixture(
        "[model.outputs.output]\ndatatype = \"fp32\"\nshape = [-1, 10]\n[targets]\ngpus = [\"H100\", \"L4\"]\nprecision = [\"fp16\"]\n",
    );
    let o = run_in(
        dir.path(),
        &[
            "deploy",
            "r.toml",
            "--gpu-share",
            "mig",
            "--target",
            "sm90-fp16",
            "--out",
            "k8s",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = std::fs::read_to_string(dir.path().join("k8s/m-sm90-fp16.yaml")).unwrap();
    assert!(yaml.contains("nvidia.com/mig-1g.10gb: \"1\""), "{yaml}");
    assert!(
        yaml.contains("# GPU: a MIG slice 1g.10gb of a H100"),
        "{yaml}"
    );
    // The L4 has no MIG: refused, saying what to use instead.
    let o = run_in(
        dir.path(),
        &[
            "deploy",
            "r.toml",
            "--gpu-share",
            "mig",
            "--target",
            "sm89-fp16",
            "--out",
            "k8s",
        ],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(
            "target sm89-fp16: none of its GPUs (L4) has MIG; use --gpu-share time-sliced or mps"
        ),
        "{}",
        stderr(&o)
    );
    // A model no slice holds: refused with the estimate.
    let big = fixture(
        "[model.outputs.output]\ndatatype = \"fp32\"\nshape = [-1, 10]\n[targets]\ngpus = [\"H100\"]\nprecision = [\"fp16\"]\n[batching]\nmax_batch_size = 1024\ninstances = 64\n",
    );
    let text = std::fs::read_to_string(big.path().join("r.toml"))
        .unwrap()
        .replace("shape = [-1, 64]", "shape = [-1, 3, 1024, 1024]");
    std::fs::write(big.path().join("r.toml"), text).unwrap();
    let o = run_in(
        big.path(),
        &["deploy", "r.toml", "--gpu-share", "mig", "--out", "k8s"],
    );
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("more than the largest MIG profile of H100 (7g.80gb) holds"),
        "{}",
        stderr(&o)
    );
}

/// A `cpu-bf16` target needs OpenVINO, the one CPU engine that computes in BF16: a matrix
/// without its library refuses the target at the precision, saying why.
#[test]
fn a_bf16_cpu_target_without_openvino_in_the_matrix_is_refused_at_the_precision() {
    let dir = fixture("[targets]\ncpu = [\"fp32\", \"bf16\"]\n");
    // The copy has no matrix/runtime-libraries.toml: no ONNX Runtime, no OpenVINO.
    let m = matrix_copy(dir.path(), |_, t| t);
    let o = run_in(
        dir.path(),
        &["plan", "r.toml", "--matrix", m.to_str().unwrap()],
    );
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let text = std::fs::read_to_string(dir.path().join("r.toml")).unwrap();
    let line = text.lines().position(|l| l.starts_with("cpu = [")).unwrap() + 1;
    assert!(
        err.contains(&format!("r.toml:{line}:"))
            && err.contains("targets.cpu[1]")
            && err.contains("bf16 on the CPU runs on OpenVINO: the compatibility matrix has no openvino library for x86_64")
            && err.contains("[rule: cpu-library]")
            && err.contains("or remove \"bf16\" from targets.cpu"),
        "{err}"
    );
    // The FP32 target alone plans with the same matrix.
    std::fs::write(
        dir.path().join("r.toml"),
        text.replace("cpu = [\"fp32\", \"bf16\"]", "cpu = [\"fp32\"]"),
    )
    .unwrap();
    let v = plan_json(dir.path(), &["--matrix", m.to_str().unwrap()]);
    assert_eq!(v.targets.len(), 1);
    assert_eq!(v.targets[0].id, "cpu-fp32");
}
