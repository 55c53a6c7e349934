//! Data-driven resolution tests: recipe text in, a one-line summary per target (or the refusal
//! rules) out.

use std::path::Path;

use super::lock::Lock;
use super::*;
use crate::matrix::Matrix;

const HEAD: &str = r#"
[model]
name = "m"
version = "1.0.0"
onnx = "m.onnx"
[model.inputs.input]
datatype = "fp32"
shape = [-1, 64]
"#;

fn recipe(extra: &str) -> crate::recipe::Recipe {
    let text = format!("{HEAD}{extra}");
    match crate::recipe::parse(&text, Path::new("r.toml")) {
        Ok(r) => r,
        Err(e) => panic!("fixture recipe invalid:\n{e}\n---\n{text}"),
    }
}

fn plan_with(extra: &str, lock: Option<&Lock>) -> Result<BuildPlan, Error> {
    let m = Matrix::embedded().expect("embedded matrix");
    resolve(&recipe(extra), &m, lock)
}

/// One line per target: `id trt=… cuda=… driver=… base=… tag=…`.
fn summary(p: &BuildPlan) -> Vec<String> {
    p.targets
        .iter()
        .map(|t| {
            format!(
                "{} products={} trt={} cuda={} driver={} base={}{} tag={}",
                t.id,
                t.gpu.as_ref().map_or("-".into(), |g| g.products.join("+")),
                t.tensorrt
                    .as_ref()
                    .map_or("-".into(), |r| r.version.to_string()),
                t.cuda.as_ref().map_or("-".into(), |c| c.to_string()),
                t.driver_floor
                    .as_ref()
                    .map_or("-".into(), |c| c.to_string()),
                t.base.reference,
                t.base
                    .digest
                    .as_ref()
                    .map_or(String::new(), |d| format!("@{}", &d.as_str()[..15])),
                t.tag,
            )
        })
        .collect()
}

fn check(extra: &str, want: &[&str]) {
    match plan_with(extra, None) {
        Ok(p) => assert_eq!(summary(&p), want, "recipe:\n{extra}"),
        Err(e) => panic!("refused:\n{e}\nrecipe:\n{extra}"),
    }
}

/// The refusal messages; each must name its rule.
fn refused(extra: &str, rules: &[&str]) -> Vec<String> {
    match plan_with(extra, None) {
        Ok(p) => panic!("expected refusal, got {:#?}", summary(&p)),
        Err(e) => {
            let d: Vec<String> = e.diagnostics().iter().map(|d| d.to_string()).collect();
            assert_eq!(d.len(), rules.len(), "{d:#?}");
            for (d, r) in d.iter().zip(rules) {
                assert!(d.contains(&format!("[rule: {r}]")), "{d} does not name {r}");
                assert!(d.starts_with("r.toml:"), "{d}");
                assert!(d.contains("\n  hint: "), "{d} has no way out");
            }
            d
        }
    }
}

#[test]
fn cpu_only() {
    check(
        "[targets]\ncpu = true\n",
        &["cpu-fp32 products=- trt=- cuda=- driver=- base=scratch tag=1.0.0-cpu-fp32"],
    );
}

#[test]
fn newest_tensorrt_and_cuda_by_default_and_products_collapse_by_sm() {
    check(
        "[targets]\ngpus = [\"H100\", \"L4\", \"H200\", \"sm_86\"]\nprecision = [\"fp16\", \"int8\"]\ncpu = true\n[int8]\nqdq = true\n",
        &[
            "cpu-fp32 products=- trt=- cuda=- driver=- base=scratch tag=1.0.0-cpu-fp32",
            "sm86-fp16 products=A10+A10G+A40+RTX 3090 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm86-fp16",
            "sm86-int8 products=A10+A10G+A40+RTX 3090 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm86-int8",
            "sm89-fp16 products=L4 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm89-fp16",
            "sm89-int8 products=L4 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm89-int8",
            "sm90-fp16 products=H100+H200 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm90-fp16",
            "sm90-int8 products=H100+H200 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm90-int8",
        ],
    );
}

#[test]
fn pins_pick_the_newest_matching_release_and_its_newest_cuda() {
    check(
        "[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10\"\n",
        &["sm89-fp16 products=L4 trt=10.16.1 cuda=13.2.1 driver=595.58.03 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm89-fp16"],
    );
    check(
        "[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.8\"\n",
        &["sm89-fp16 products=L4 trt=10.8.0 cuda=12.8.1 driver=570.124.06 base=docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04 tag=1.0.0-sm89-fp16"],
    );
    check(
        "[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10\"\ncuda = \"12\"\n",
        &["sm89-fp16 products=L4 trt=10.16.1 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm89-fp16"],
    );
}

#[test]
fn v100_gets_the_last_tensorrt_with_volta() {
    check(
        "[targets]\ngpus = [\"V100\"]\nprecision = [\"fp16\"]\n",
        &["sm70-fp16 products=V100 trt=10.4.0 cuda=12.6.3 driver=560.35.05 base=docker.io/nvidia/cuda:12.6.3-base-ubuntu24.04 tag=1.0.0-sm70-fp16"],
    );
}

#[test]
fn int8_calibration_data_converts_on_the_newest_tensorrt() {
    // Calibration data (a directory): infer-build quantizes to Q/DQ, which TensorRT 11 builds.
    check(
        "[targets]\ngpus = [\"T4\"]\nprecision = [\"int8\"]\n[int8]\ncalibration = \"calib\"\n",
        &["sm75-int8 products=T4 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm75-int8"],
    );
    let text =
        "[targets]\ngpus = [\"T4\"]\nprecision = [\"int8\"]\n[int8]\ncalibration = \"calib\"\n";
    let p = plan_with(text, None).unwrap();
    assert_eq!(
        p.targets[0].tensorrt.as_ref().unwrap().precision_mode,
        PrecisionMode::Convert
    );
    // A calibration cache (a file, as `recipe::load` finds it) stays on TensorRT 10's own
    // calibration.
    let mut r = recipe(text);
    r.int8.as_mut().unwrap().calibration_is_cache = Some(true);
    let p = resolve(&r, &Matrix::embedded().unwrap(), None).unwrap();
    let t = p.targets[0].tensorrt.as_ref().unwrap();
    assert_eq!(t.version.to_string(), "10.16.1");
    assert_eq!(t.precision_mode, PrecisionMode::Calibration);
}

#[test]
fn every_accepted_precision_is_one_the_engine_stage_builds() {
    for (p, mode) in [
        ("fp16", PrecisionMode::Convert),
        ("fp32", PrecisionMode::Native),
        ("fp8", PrecisionMode::Convert),
    ] {
        for trt in ["11", "10"] {
            let t = plan_with(
                &format!("[targets]\ngpus = [\"H100\", \"L4\"]\nprecision = [\"{p}\"]\ntensorrt = \"{trt}\"\n[fp8]\ncalibration = \"calib\"\n"),
                None,
            )
            .unwrap();
            for target in &t.targets {
                let mode = if p == "fp16" && trt == "10" {
                    PrecisionMode::BuilderFlag
                } else {
                    mode
                };
                assert_eq!(
                    target.tensorrt.as_ref().unwrap().precision_mode,
                    mode,
                    "{p} {trt}"
                );
            }
        }
    }
    let d = refused(
        "[targets]\ngpus = [\"H100\"]\nprecision = [\"bf16\"]\n",
        &["precision-not-built"],
    );
    assert!(d[0].contains("targets.precision[0]"), "{}", d[0]);
    refused(
        "[targets]\ngpus = [\"B200\"]\nprecision = [\"fp4\"]\n",
        &["precision-not-built"],
    );
}

#[test]
fn driver_floor_selection_picks_what_the_fleet_runs() {
    // With a stated driver: the newest CUDA major it runs, then the newest TensorRT with a
    // build for that major, then that build's newest CUDA the driver runs.
    let cases: [(&str, &str, &str); 7] = [
        ("H100", "595.58.03", "sm90-fp16 products=H100 trt=11.0.0 cuda=13.2.1 driver=595.58.03 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm90-fp16"),
        ("H100", "580.95.05", "sm90-fp16 products=H100 trt=10.14.1 cuda=13.0.2 driver=580.95.05 base=docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04 tag=1.0.0-sm90-fp16"),
        ("H100", "575.57.08", "sm90-fp16 products=H100 trt=11.4.0 cuda=12.9.1 driver=575.57.08 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm90-fp16"),
        ("H100", "570.124.06", "sm90-fp16 products=H100 trt=10.9.0 cuda=12.8.1 driver=570.124.06 base=docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04 tag=1.0.0-sm90-fp16"),
        ("H100", "550.54.15", "sm90-fp16 products=H100 trt=10.1.0 cuda=12.4.1 driver=550.54.15 base=docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04 tag=1.0.0-sm90-fp16"),
        // Below every CUDA 12 floor the matrix has: CUDA 11.8 (TensorRT 10.13.0 is the last with it).
        ("H100", "522.30", "sm90-fp16 products=H100 trt=10.13.0 cuda=11.8.0 driver=520.61.05 base=docker.io/nvidia/cuda:11.8.0-base-ubuntu22.04 tag=1.0.0-sm90-fp16"),
        // CUDA 11.8 cannot compile for Blackwell.
        ("B200", "575.51.03", "sm100-fp16 products=B200 trt=10.9.0 cuda=12.8.1 driver=570.124.06 base=docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04 tag=1.0.0-sm100-fp16"),
    ];
    for (gpu, driver, want) in cases {
        check(&format!("[targets]\ngpus = [\"{gpu}\"]\nprecision = [\"fp16\"]\n[deploy]\nnode_driver = \"{driver}\"\n"), &[want]);
    }
    // A driver too old for any Blackwell build is refused with the floor it needs.
    refused("[targets]\ngpus = [\"B200\"]\nprecision = [\"fp16\"]\n[deploy]\nnode_driver = \"560.35.05\"\n", &["driver-floor"]);
    // With TensorRT 10 pinned and a 595 driver, the CUDA 13.2 build of 10.16.1 runs.
    check(
        "[targets]\ngpus = [\"H100\"]\nprecision = [\"fp16\"]\ntensorrt = \"10\"\n[deploy]\nnode_driver = \"595.58.03\"\n",
        &["sm90-fp16 products=H100 trt=10.16.1 cuda=13.2.1 driver=595.58.03 base=gcr.io/distroless/cc-debian12 tag=1.0.0-sm90-fp16"],
    );
}

#[test]
fn refusal_v100_with_tensorrt_10_5_or_newer() {
    let d = refused(
        "[targets]\ngpus = [\"V100\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.16\"\n",
        &["tensorrt-min-sm"],
    );
    assert!(d[0].contains("targets.tensorrt"), "{}", d[0]);
    assert!(d[0].contains("pin tensorrt = \"10.4\""), "{}", d[0]);
}

#[test]
fn refusal_fp8_on_sm86() {
    let d = refused(
        "[targets]\ngpus = [\"A10\"]\nprecision = [\"fp8\"]\n[fp8]\ncalibration = \"c\"\n",
        &["fp8-needs-sm89"],
    );
    assert!(d[0].contains("targets.precision[0]"), "{}", d[0]);
}

#[test]
fn refusal_int8_calibration_cache_on_tensorrt_11() {
    let mut r = recipe("[targets]\ngpus = [\"L4\"]\nprecision = [\"int8\"]\ntensorrt = \"11\"\n[int8]\ncalibration = \"calib\"\n");
    r.int8.as_mut().unwrap().calibration_is_cache = Some(true);
    let e = resolve(&r, &Matrix::embedded().unwrap(), None).unwrap_err();
    let d: Vec<String> = e.diagnostics().iter().map(|d| d.to_string()).collect();
    assert_eq!(d.len(), 1, "{d:#?}");
    assert!(
        d[0].contains("[rule: int8-calibration-needs-tensorrt-10]"),
        "{}",
        d[0]
    );
    assert!(d[0].contains("int8.calibration"), "{}", d[0]);
}

#[test]
fn refusal_tensorrt_11_on_jetson() {
    refused(
        "[targets]\ngpus = [\"Jetson AGX Orin\"]\nprecision = [\"fp16\"]\ntensorrt = \"11\"\n",
        &["tensorrt-11-no-jetson"],
    );
}

#[test]
fn jetson_uses_the_tensorrt_of_its_jetpack_image() {
    check(
        "[targets]\ngpus = [\"Jetson AGX Orin\"]\nprecision = [\"fp16\"]\n",
        &["sm87-jetson-fp16 products=Jetson AGX Orin trt=10.3.0 cuda=12.6 driver=- base=nvcr.io/nvidia/l4t-jetpack:r36.4.0 tag=1.0.0-sm87-jetson-fp16"],
    );
}

#[test]
fn refusal_cuda13_base_for_a_driver_below_580() {
    let d = refused(
        "[targets]\ngpus = [\"H100\"]\nprecision = [\"fp16\"]\n[image]\nbase = \"docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04\"\n[deploy]\nnode_driver = \"575.57.08\"\n",
        &["cuda13-needs-driver-580"],
    );
    assert!(d[0].contains("image.base"), "{}", d[0]);
    let d = refused("[targets]\ngpus = [\"H100\"]\nprecision = [\"fp16\"]\ncuda = \"13\"\n[deploy]\nnode_driver = \"570.124.06\"\n", &["cuda13-needs-driver-580"]);
    assert!(d[0].contains("targets.cuda"), "{}", d[0]);
}

#[test]
fn all_refusals_are_reported_at_once() {
    refused(
        "[targets]\ngpus = [\"V100\", \"A10\", \"H900\"]\nprecision = [\"fp8\"]\ntensorrt = \"10.16\"\n[fp8]\ncalibration = \"c\"\n",
        &["known-gpu", "fp8-needs-sm89", "fp8-needs-sm89"],
    );
}

#[test]
fn base_images_are_pinned_by_the_lock_file_or_marked_to_be() {
    // Not version-compatible: the full runtime on NVIDIA's CUDA base.
    let extra = "[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10\"\ncuda = \"12\"\nversion_compatible = false\n";
    let p = plan_with(extra, None).unwrap();
    let b = &p.targets[0].base;
    assert_eq!((b.digest.as_ref(), b.pinned_by), (None, PinnedBy::Lock));
    assert_eq!(p.unpinned_images().len(), 1);
    let mut lock = Lock::default();
    let d = format!("sha256:{}", "ab".repeat(32));
    lock.set("docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04", &d);
    let p = plan_with(extra, Some(&lock)).unwrap();
    let b = &p.targets[0].base;
    assert_eq!(
        (b.digest.as_ref().map(|d| d.as_str()), b.pinned_by),
        (Some(d.as_str()), PinnedBy::Lock)
    );
    assert!(p.unpinned_images().is_empty());
    assert_eq!(
        b.pull_reference(),
        format!("docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04@{d}")
    );
}

#[test]
fn builder_image_is_found_for_tensorrt_versions_ngc_ships() {
    let p = plan_with(
        "[targets]\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.0\"\n",
        None,
    )
    .unwrap();
    let b = p.targets[0].builder.as_ref().map(|b| b.reference.as_str());
    assert_eq!(b, Some("nvcr.io/nvidia/tensorrt:24.05-py3"));
}

#[test]
fn tags_come_from_the_template() {
    check(
        "[targets]\ngpus = [\"RTX 4090\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.8\"\n[image]\ntag = \"{model}-{version}-trt{tensorrt}-{gpu}-{precision}\"\n",
        &["sm89-fp16 products=RTX 4090 trt=10.8.0 cuda=12.8.1 driver=570.124.06 base=docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04 tag=m-1.0.0-trt10.8.0-rtx-4090-fp16"],
    );
    let p = plan_with("[targets]\ngpus = [\"RTX 4090\"]\nprecision = [\"fp16\"]\n[image]\ntag = \"{gpu}-{target}\"\n", None).unwrap();
    assert!(p.targets[0]
        .notes
        .iter()
        .any(|n| n.contains("tag sanitized")));
    refused(
        &format!(
            "[targets]\ncpu = true\n[image]\ntag = \"{}{{target}}\"\n",
            "x".repeat(125)
        ),
        &["tag-length"],
    );
}

#[test]
fn json_is_deterministic() {
    let extra = "[targets]\ngpus = [\"H100\", \"L4\"]\nprecision = [\"fp16\"]\ncpu = true\n";
    let a = serde_json::to_string(&plan_with(extra, None).unwrap()).unwrap();
    let b = serde_json::to_string(&plan_with(extra, None).unwrap()).unwrap();
    assert_eq!(a, b);
    assert!(a.contains("\"pinned_by\":\"lock\""));
}

/// One case per refusal of the release rules, the build walk and the base override checks: an edit of the embedded matrix
/// (often none), recipe text, the rule entry of [`super::rules::RULES`] it exercises (or `walk`)
/// and the refusal's rule id.
struct RuleCase {
    entry: &'static str,
    refusal: &'static str,
    recipe: &'static str,
    matrix: fn(&mut Matrix),
}

fn unchanged(_: &mut Matrix) {}

const RULE_CASES: &[RuleCase] = &[
    RuleCase { entry: "tensor-cores", refusal: "fp8-needs-sm89", recipe: "gpus = [\"A10\"]\nprecision = [\"fp8\"]\n[fp8]\ncalibration = \"c\"\n", matrix: unchanged },
    RuleCase { entry: "tensor-cores", refusal: "bf16-needs-sm80", recipe: "gpus = [\"T4\"]\nprecision = [\"bf16\"]\n", matrix: unchanged },
    RuleCase { entry: "precision-built", refusal: "precision-not-built", recipe: "gpus = [\"H100\"]\nprecision = [\"bf16\"]\n", matrix: unchanged },
    RuleCase { entry: "known-tensorrt", refusal: "known-tensorrt", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"7\"\n", matrix: unchanged },
    RuleCase { entry: "complete-tensorrt", refusal: "complete-tensorrt", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\n", matrix: |m| m.releases.iter_mut().for_each(|r| r.incomplete = Some("a test".into())) },
    RuleCase { entry: "platform", refusal: "tensorrt-11-no-jetson", recipe: "gpus = [\"Jetson AGX Orin\"]\nprecision = [\"fp16\"]\ntensorrt = \"11\"\n", matrix: unchanged },
    RuleCase { entry: "platform", refusal: "tensorrt-platform", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\n", matrix: |m| m.releases.iter_mut().for_each(|r| r.platforms.retain(|p| *p != crate::matrix::Platform::X86_64)) },
    RuleCase { entry: "compute-capability", refusal: "tensorrt-min-sm", recipe: "gpus = [\"V100\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.8\"\n", matrix: unchanged },
    RuleCase { entry: "compute-capability", refusal: "tensorrt-max-sm", recipe: "gpus = [\"B200\"]\nprecision = [\"fp16\"]\n", matrix: |m| m.releases.iter_mut().for_each(|r| r.max_cc = crate::matrix::ComputeCapability::new(9, 0)) },
    RuleCase { entry: "tensorrt-precision", refusal: "tensorrt-precision", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\n", matrix: |m| m.releases.iter_mut().for_each(|r| r.precisions.retain(|p| *p != crate::matrix::Precision::Fp16)) },
    RuleCase { entry: "hardware-compatibility", refusal: "ampere-plus-needs-sm80", recipe: "gpus = [\"T4\"]\nprecision = [\"fp16\"]\nhardware_compatibility = \"ampere+\"\n", matrix: unchanged },
    RuleCase { entry: "hardware-compatibility", refusal: "tensorrt-hardware-compat", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\nhardware_compatibility = \"ampere+\"\n", matrix: |m| m.releases.iter_mut().for_each(|r| r.hardware_compat.clear()) },
    RuleCase { entry: "version-compatible", refusal: "tensorrt-version-compatible", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\nversion_compatible = true\n", matrix: |m| m.releases.iter_mut().for_each(|r| r.version_compatible = false) },
    RuleCase { entry: "walk", refusal: "tensorrt-cuda-build", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\ncuda = \"9\"\n", matrix: unchanged },
    RuleCase { entry: "walk", refusal: "base-image", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\n", matrix: |m| m.images.retain(|i| i.role != crate::matrix::ImageRole::Runtime) },
    RuleCase { entry: "walk", refusal: "glibc", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\n", matrix: |m| m.releases.iter_mut().for_each(|r| r.glibc_min = Some("99".parse().unwrap())) },
    RuleCase { entry: "walk", refusal: "driver-floor", recipe: "gpus = [\"B200\"]\nprecision = [\"fp16\"]\n[deploy]\nnode_driver = \"560.35.05\"\n", matrix: unchanged },
    RuleCase { entry: "walk", refusal: "cuda13-needs-driver-580", recipe: "gpus = [\"H100\"]\nprecision = [\"fp16\"]\ncuda = \"13\"\n[deploy]\nnode_driver = \"570.124.06\"\n", matrix: unchanged },
    RuleCase { entry: "tensor-cores", refusal: "fp4-needs-blackwell", recipe: "gpus = [\"H100\"]\nprecision = [\"fp4\"]\n", matrix: unchanged },
    RuleCase { entry: "walk", refusal: "base-cuda-mismatch", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10.0\"\n[image]\nbase = \"docker.io/nvidia/cuda:13.0.2-base-ubuntu24.04\"\n", matrix: unchanged },
    RuleCase { entry: "base-override", refusal: "known-base", recipe: "gpus = [\"L4\"]\nprecision = [\"fp16\"]\n[image]\nbase = \"registry.example.com/own/cuda:12\"\n", matrix: unchanged },
];

/// Each rule refuses alone, in its own words, at the recipe key it names; every entry of the
/// rule list is exercised (the INT8 calibration rule by `refusal_int8_calibration_cache_…`).
/// Entries outside the list: `walk` (the CUDA/base walk) and `base-override` (`image.base`; a
/// malformed digest there is a recipe error, `tests/it/recipe.rs`).
#[test]
fn each_release_rule_refuses_in_its_own_words() {
    for case in RULE_CASES {
        let mut m = Matrix::embedded().expect("embedded matrix");
        (case.matrix)(&mut m);
        let extra = format!("[targets]\n{}", case.recipe);
        let d = match resolve(&recipe(&extra), &m, None) {
            Ok(p) => panic!(
                "{}: expected [rule: {}], got {:#?}",
                case.entry,
                case.refusal,
                summary(&p)
            ),
            Err(e) => e
                .diagnostics()
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>(),
        };
        assert_eq!(d.len(), 1, "{}: {d:#?}", case.refusal);
        assert!(
            d[0].contains(&format!("[rule: {}]", case.refusal)),
            "{}: {}",
            case.refusal,
            d[0]
        );
        assert!(d[0].starts_with("r.toml:"), "{}", d[0]);
        assert!(d[0].contains("\n  hint: "), "{} has no way out", d[0]);
    }
    let mut tested: Vec<&str> = RULE_CASES.iter().map(|c| c.entry).collect();
    tested.push("int8-calibration");
    for (name, _) in super::rules::RULES {
        assert!(tested.contains(name), "rule `{name}` has no case");
    }
}
