//! `engine.cpu = "auto"`: the engine stage loads the model in tract and in ONNX Runtime (the
//! pinned wheel's library, downloaded once into the library cache), measures both, compares
//! their outputs and ships the faster one that loads and agrees; the choice and both
//! measurements are in the engine profile. A model neither loads is refused at `build` with
//! both reasons and no image is written; a model only ONNX Runtime loads goes to ONNX Runtime.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::ort_image::{keep_wheel, seed_wheel};
use super::support::{infer_build, root, stderr, stdout};

/// A measured candidate's (or profile's) summed T(b): the medians over its batch sizes, µs.
fn sum(c: &Value) -> f64 {
    c["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["median_us"].as_f64().unwrap())
        .sum()
}

/// `infer-build engine RECIPE --target cpu-fp32 --json` with its own cache root.
fn engine(recipe: &Path, cache: &Path) -> Output {
    seed_wheel(cache);
    let o = infer_build()
        .arg("engine")
        .arg(recipe)
        .args(["--target", "cpu-fp32", "--json"])
        .env("INFER_BUILD_CACHE_DIR", cache)
        .output()
        .unwrap();
    keep_wheel(cache);
    o
}

fn copy_example(dir: &Path, engine: &str) -> PathBuf {
    let d = dir.join("recipe");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(root().join("examples/mlp/mlp.onnx"), d.join("mlp.onnx")).unwrap();
    // The example pins tract; these tests set the engine themselves.
    let text = std::fs::read_to_string(root().join("examples/mlp/recipe.toml")).unwrap();
    assert!(text.contains("cpu = \"tract\""));
    std::fs::write(
        d.join("recipe.toml"),
        text.replace("cpu = \"tract\"", &format!("cpu = \"{engine}\"")),
    )
    .unwrap();
    d.join("recipe.toml")
}

#[test]
fn auto_measures_tract_and_onnxruntime_records_both_and_a_rebuild_is_cached() {
    let f = tempfile::tempdir().unwrap();
    let recipe = copy_example(f.path(), "auto");
    let cache = f.path().join("cache");
    let o = engine(&recipe, &cache);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["cached"], false);
    let sel = &doc["profile"]["selection"];
    assert_eq!(sel["policy"], "auto", "{doc}");
    let cands = sel["candidates"].as_array().unwrap();
    // tract, then ONNX Runtime and then OpenVINO, each at 1, 2, 4, … threads up to an
    // instance's share of this machine's CPUs (and of the deployment's request, 2 by default).
    let kinds: Vec<&str> = cands.iter().map(|c| c["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds[0], "tract", "{sel}");
    let ort = kinds.iter().filter(|k| **k == "onnxruntime").count();
    assert!(ort >= 1, "{sel}");
    assert_eq!(
        kinds[1..],
        [vec!["onnxruntime"; ort], vec!["openvino"; ort]].concat(),
        "{sel}"
    );
    let threads: Vec<u64> = cands[1..=ort]
        .iter()
        .map(|c| c["threads"].as_u64().unwrap())
        .collect();
    let ov_threads: Vec<u64> = cands[1 + ort..]
        .iter()
        .map(|c| c["threads"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, ov_threads, "{sel}");
    assert_eq!(threads[0], 1, "{sel}");
    assert!(threads.windows(2).all(|w| w[0] < w[1]), "{sel}");
    let planned: Vec<u64> = doc["profile"]["batches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["batch"].as_u64().unwrap())
        .collect();
    for c in cands {
        assert!(c["error"].is_null(), "{c}");
        assert!(c["startup_ms"].as_f64().unwrap() > 0.0, "{c}");
        let b: Vec<u64> = c["batches"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["batch"].as_u64().unwrap())
            .collect();
        assert_eq!(b, planned, "both measured at the planned batch sizes: {c}");
    }
    // Same model, same inputs: the outputs agree within the recorded tolerance.
    let a = &sel["agreement"];
    assert_eq!(a["agreed"], true, "{a}");
    assert!(a["max_abs"].as_f64().unwrap() <= a["atol"].as_f64().unwrap() + 1e-2);
    // What shipped is what was chosen, and its T(b) is the chosen candidate's.
    let chosen = sel["chosen"].as_str().unwrap();
    assert_eq!(doc["meta"]["kind"], chosen);
    // ONNX Runtime's count: more threads only when at most 0.95x the best fewer threads'
    // summed T(b) (`select::THREADS_MARGIN`).
    let mut best = &cands[1];
    for c in &cands[2..] {
        if sum(c) <= 0.95 * sum(best) {
            best = c;
        }
    }
    let winner = if chosen == "tract" { &cands[0] } else { best };
    assert_eq!(winner["batches"], doc["profile"]["batches"]);
    let (t, r) = (sum(&cands[0]), sum(best));
    // The rule: ONNX Runtime only when at most 0.9x tract's summed T(b) (`select::ORT_MARGIN`).
    assert_eq!(
        chosen == "onnxruntime",
        r <= 0.9 * t,
        "tract {t} us, onnxruntime {r} us"
    );
    if chosen == "onnxruntime" {
        assert_eq!(doc["meta"]["format"], "onnx");
        assert!(doc["meta"]["cpu"]["onnxruntime"].is_string(), "{doc}");
        // A count below the instance's share is recorded, with that share, as a hint for the
        // runtime (taken only where an instance has the same share); the share is not.
        let hint = doc["meta"]["cpu"]["threads"].as_u64();
        let share = *threads.last().unwrap();
        let best = best["threads"].as_u64().unwrap();
        assert_eq!(hint, (best < share).then_some(best), "{doc}");
        assert_eq!(
            doc["meta"]["cpu"]["share"].as_u64(),
            (best < share).then_some(share),
            "{doc}"
        );
    }

    // The rebuild costs nothing: the measured choice is cached with the engine.
    let again = engine(&recipe, &cache);
    assert!(again.status.success(), "{}", stderr(&again));
    let doc2: Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(doc2["cached"], true);
    assert_eq!(doc2["key"], doc["key"]);
    assert_eq!(doc2["profile"], doc["profile"]);
}

/// `[engine] threads` pins ONNX Runtime's intra-op threads: the one count measured, in the
/// engine key (the counts measured otherwise are not), no hint recorded; under
/// `engine.cpu = "tract"` it is refused at its line.
#[test]
fn recipe_threads_are_the_one_count_measured_and_tract_refuses_them() {
    let f = tempfile::tempdir().unwrap();
    let recipe = copy_example(f.path(), "onnxruntime");
    let text = std::fs::read_to_string(&recipe).unwrap();
    assert!(text.contains("[engine]\n"), "{text}");
    std::fs::write(
        &recipe,
        text.replace("[engine]\n", "[engine]\nthreads = 3\n"),
    )
    .unwrap();
    let cache = f.path().join("cache");
    let o = engine(&recipe, &cache);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let cands = doc["profile"]["selection"]["candidates"]
        .as_array()
        .unwrap();
    let threads: Vec<u64> = cands
        .iter()
        .map(|c| c["threads"].as_u64().unwrap())
        .collect();
    assert_eq!(threads, [3], "{doc}");
    assert!(doc["meta"]["cpu"]["threads"].is_null(), "{doc}");
    assert!(doc["meta"]["cpu"]["share"].is_null(), "{doc}");
    let reason = doc["profile"]["selection"]["reason"].as_str().unwrap();
    assert!(reason.contains("the recipe's engine.threads"), "{reason}");
    // Another count is another key; none (the builder's counts) is a third.
    std::fs::write(
        &recipe,
        text.replace("[engine]\n", "[engine]\nthreads = 1\n"),
    )
    .unwrap();
    let one = engine(&recipe, &cache);
    assert!(one.status.success(), "{}", stderr(&one));
    let one: Value = serde_json::from_str(&stdout(&one)).unwrap();
    std::fs::write(&recipe, &text).unwrap();
    let none = engine(&recipe, &cache);
    assert!(none.status.success(), "{}", stderr(&none));
    let none: Value = serde_json::from_str(&stdout(&none)).unwrap();
    let keys = BTreeSet::from([&doc["key"], &one["key"], &none["key"]].map(Value::to_string));
    assert_eq!(keys.len(), 3, "{keys:?}");

    let tract = std::fs::read_to_string(copy_example(f.path(), "tract")).unwrap();
    let recipe = f.path().join("recipe/recipe.toml");
    std::fs::write(
        &recipe,
        tract.replace("[engine]\n", "[engine]\nthreads = 2\n"),
    )
    .unwrap();
    let o = infer_build().arg("plan").arg(&recipe).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let line = tract.lines().position(|l| l == "[engine]").unwrap() + 2;
    assert!(
        err.contains(&format!("recipe.toml:{line}:"))
            && err.contains("engine.threads")
            && err.contains("tract computes each batch on its instance's thread"),
        "{err}"
    );
}

#[test]
fn forcing_tract_measures_nothing_else() {
    let f = tempfile::tempdir().unwrap();
    let recipe = copy_example(f.path(), "tract");
    let cache = f.path().join("cache");
    let o = infer_build()
        .arg("engine")
        .arg(&recipe)
        .args(["--target", "cpu-fp32", "--json"])
        .env("INFER_BUILD_CACHE_DIR", &cache)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["meta"]["kind"], "tract");
    assert!(doc["profile"]["selection"].is_null(), "{doc}");
    assert!(
        !cache.join("libraries").exists(),
        "no ONNX Runtime library is fetched for a tract-only target"
    );
}

/// A model with an operator neither engine knows: `build` refuses it with both engines'
/// reasons (exit 2) and writes no image.
#[test]
fn py_a_model_no_engine_loads_is_refused_at_build_with_every_reason() {
    let py = super::support::python();
    let f = tempfile::tempdir().unwrap();
    let d = f.path().join("recipe");
    std::fs::create_dir_all(&d).unwrap();
    let onnx = d.join("model.onnx");
    let o = Command::new(&py)
        .arg("-c")
        .arg(
            r#"
import sys, onnx
from onnx import helper, TensorProto
x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4])
y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4])
node = helper.make_node("NoSuchOperator", ["input"], ["output"])
g = helper.make_graph([node], "g", [x], [y])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
m.ir_version = 8
onnx.save(m, sys.argv[1])
"#,
        )
        .arg(&onnx)
        .output()
        .unwrap();
    if !o.status.success() {
        eprintln!(
            "skipping: {} cannot write an ONNX model: {}",
            py.display(),
            stderr(&o)
        );
        return;
    }
    std::fs::write(
        d.join("recipe.toml"),
        r#"[model]
name = "unknown-op"
version = "1"
onnx = "model.onnx"

[model.inputs.input]
datatype = "fp32"
shape = [-1, 4]

[model.outputs.output]
datatype = "fp32"
shape = [-1, 4]

[targets]
cpu = true

[batching]
max_batch_size = 4
"#,
    )
    .unwrap();
    let cache = f.path().join("cache");
    seed_wheel(&cache);
    let out = f.path().join("out");
    let o = infer_build()
        .arg("build")
        .arg(d.join("recipe.toml"))
        .arg("--out")
        .arg(&out)
        .env("INFER_BUILD_CACHE_DIR", &cache)
        .output()
        .unwrap();
    keep_wheel(&cache);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no CPU engine loads the model"), "{err}");
    assert!(
        err.contains("tract:") && err.contains("ONNX Runtime:") && err.contains("OpenVINO:"),
        "{err}"
    );
    assert!(err.contains("NoSuchOperator"), "{err}");
    assert!(
        !out.join("index.json").exists(),
        "no image may be written: {:?}",
        std::fs::read_dir(&out).map(|r| r.count())
    );
}

/// A real model for the recipes below: `real_models.py fetch`, or `None` (with the reason
/// printed) when the models cannot be fetched.
fn real_model(name: &str) -> Option<PathBuf> {
    let py = super::support::python();
    let o = Command::new(&py)
        .arg(super::real_models::script())
        .arg("fetch")
        .arg(super::real_models::cache_dir())
        .output()
        .unwrap();
    if !o.status.success() {
        eprintln!("skipping: fetching the real models failed: {}", stderr(&o));
        return None;
    }
    let models: Value = serde_json::from_str(&stdout(&o)).unwrap();
    Some(PathBuf::from(models[name].as_str().unwrap()))
}

/// A CPU recipe for a copy of `onnx` with the given tensor tables and `engine.cpu`.
fn real_recipe(dir: &Path, name: &str, onnx: &Path, tensors: &str, cpu: &str) -> PathBuf {
    let d = dir.join("recipe");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::copy(onnx, d.join("model.onnx")).unwrap();
    std::fs::write(
        d.join("recipe.toml"),
        format!(
            "[model]\nname = \"{name}\"\nversion = \"1\"\nonnx = \"model.onnx\"\n{tensors}\n[targets]\ncpu = true\n\n[engine]\ncpu = \"{cpu}\"\n\n[batching]\nmax_batch_size = 4\ninstances = 1\n",
        ),
    )
    .unwrap();
    d.join("recipe.toml")
}

/// PaddleOCR's direction classifier computes a reshape's shape at run time, which tract cannot
/// translate: under `engine.cpu = "tract"` the engine stage fetches the pinned ONNX Runtime
/// (only now), folds the model with it and builds tract's engine from the folded model, which
/// the metadata records; a rebuild is cached.
#[test]
fn py_tract_loads_a_model_after_onnxruntime_folds_it() {
    let Some(onnx) = real_model("ocr-cls") else {
        return;
    };
    let f = tempfile::tempdir().unwrap();
    let recipe = real_recipe(f.path(), "ocr-cls", &onnx, super::real_models::CLS, "tract");
    let cache = f.path().join("cache");
    let o = engine(&recipe, &cache);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["meta"]["kind"], "tract", "{doc}");
    assert_eq!(doc["meta"]["cpu"]["folded_by"], "1.31.0", "{doc}");
    assert!(doc["profile"]["selection"].is_null(), "{doc}");
    assert!(
        stderr(&o).contains("library onnxruntime 1.31.0"),
        "{}",
        stderr(&o)
    );
    // The engine is not the recipe's model: it is the folded one (or tract's NNEF of it).
    let format: infer_spec::engine::EngineFormat =
        serde_json::from_value(doc["meta"]["format"].clone()).unwrap();
    let engine_file = PathBuf::from(doc["dir"].as_str().unwrap()).join(format.file_name());
    assert_ne!(
        std::fs::read(&engine_file).unwrap(),
        std::fs::read(&onnx).unwrap()
    );
    let again = engine(&recipe, &cache);
    assert!(again.status.success(), "{}", stderr(&again));
    let doc2: Value = serde_json::from_str(&stdout(&again)).unwrap();
    assert_eq!(doc2["cached"], true);
    assert_eq!(doc2["meta"], doc["meta"]);
}

/// PaddleOCR's text recogniser, which tract cannot translate, goes under `auto` to the faster of
/// the library engines (ONNX Runtime and OpenVINO measure within a few percent of each other on
/// it here, so either may ship), with tract's reason recorded: the one with the least summed
/// T(b) of the measured rows.
#[test]
fn py_a_model_only_onnxruntime_loads_goes_to_onnxruntime_under_auto() {
    let Some(onnx) = real_model("ocr-rec") else {
        return;
    };
    let f = tempfile::tempdir().unwrap();
    let recipe = real_recipe(f.path(), "ocr-rec", &onnx, super::real_models::REC, "auto");
    let o = engine(&recipe, &f.path().join("cache"));
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let sel = &doc["profile"]["selection"];
    let kind = doc["meta"]["kind"].as_str().unwrap();
    assert!(["onnxruntime", "openvino"].contains(&kind), "{doc}");
    assert_eq!(sel["chosen"], kind);
    // The shipped engine's best row is the least summed T(b) of all library rows, but for the
    // margin more threads need to ship (select::THREADS_MARGIN, 0.95).
    let best = |k: &str| {
        sel["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["kind"] == k)
            .map(sum)
            .fold(f64::INFINITY, f64::min)
    };
    let other = if kind == "openvino" {
        "onnxruntime"
    } else {
        "openvino"
    };
    assert!(best(kind) <= best(other) / 0.95, "{sel}");
    assert!(
        sel["candidates"][0]["error"].is_string(),
        "tract's reason is recorded: {sel}"
    );
    assert!(sel["candidates"][1]["batches"].as_array().unwrap().len() >= 2);
    assert!(
        sel["reason"]
            .as_str()
            .unwrap()
            .starts_with("tract does not load the model"),
        "{sel}"
    );
}

/// An ONNX Runtime image (here forced, so that the outcome does not hang on a measurement;
/// under `auto` the example MLP goes the same way, ONNX Runtime being about 4x faster here) needs
/// the glibc base: when that base cannot be pulled, `build` fails (exit 1) and says how to build
/// without one.
#[test]
fn an_onnxruntime_image_without_a_reachable_base_says_how_to_build_without_one() {
    let f = tempfile::tempdir().unwrap();
    let recipe = copy_example(f.path(), "onnxruntime");
    let cache = f.path().join("cache");
    seed_wheel(&cache);
    // `.invalid` never resolves (RFC 2606): the pull fails at once.
    let matrix =
        super::ort_image::matrix_with_glibc_base(f.path(), "registry.invalid/distroless/cc:12");
    let stand_in = f.path().join("infer-serve");
    super::image::tiny_static_elf(&stand_in);
    let dynamic_stand_in = f.path().join("infer-serve-dynamic");
    super::image::tiny_dynamic_elf(&dynamic_stand_in, None);
    let o = infer_build()
        .arg("build")
        .arg(&recipe)
        .arg("--out")
        .arg(f.path().join("out"))
        .arg("--matrix")
        .arg(&matrix)
        .arg("--runtime")
        .arg(&stand_in)
        .arg("--runtime-dynamic")
        .arg(&dynamic_stand_in)
        .env("INFER_BUILD_CACHE_DIR", &cache)
        .output()
        .unwrap();
    keep_wheel(&cache);
    let e = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{e}");
    assert!(
        e.contains("registry.invalid") && e.contains("[engine] cpu = \"tract\""),
        "{e}"
    );
    assert!(!f.path().join("out/index.json").exists());
}

/// The example as a recipe of two CPU targets, `cpu-fp32` and `cpu-bf16`, under `auto`.
fn bf16_recipe(dir: &Path, extra: &str) -> PathBuf {
    let recipe = copy_example(dir, "auto");
    let text = std::fs::read_to_string(&recipe).unwrap();
    assert!(text.contains("[targets]\ncpu = true\n"));
    std::fs::write(
        &recipe,
        text.replace(
            "[targets]\ncpu = true\n",
            "[targets]\ncpu = [\"fp32\", \"bf16\"]\n",
        ) + extra,
    )
    .unwrap();
    recipe
}

/// The MLP's gate (`meta.cpu.gate`): against OpenVINO on the FP32 model, its output's
/// `max_rel`.
fn gate_max_rel(gate: &Value) -> f64 {
    assert!(
        gate["against"]
            .as_str()
            .is_some_and(|a| a.starts_with("OpenVINO 2026.4.1 in FP32")),
        "{gate}"
    );
    gate["accuracy"]["output"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .find_map(|w| w.strip_prefix("max_rel="))
        .unwrap()
        .parse()
        .unwrap()
}

/// `infer-build plan RECIPE --json`, which must succeed.
fn plan_json(recipe: &Path) -> Value {
    let o = infer_build()
        .arg("plan")
        .arg(recipe)
        .arg("--json")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).unwrap()
}

fn engine_at(recipe: &Path, cache: &Path, target: &str) -> Output {
    seed_wheel(cache);
    let o = infer_build()
        .arg("engine")
        .arg(recipe)
        .args(["--target", target, "--json"])
        .env("INFER_BUILD_CACHE_DIR", cache)
        .output()
        .unwrap();
    keep_wheel(cache);
    o
}

/// `cpu = ["fp32", "bf16"]`: the plan has a target per precision, `cpu-bf16` narrowed to
/// OpenVINO (the one engine that computes in BF16) with a note saying what it needs. Its
/// engine is OpenVINO measured in BF16 and gated against itself in FP32, the figures in the
/// metadata; a limit the model cannot meet refuses the target with the figures (exit 2), and
/// the limit is in the cache key (the same recipe is served from the cache, a changed limit
/// gates again). A CPU that cannot compute in BF16 refuses the target instead, saying why.
#[test]
fn a_cpu_bf16_target_is_openvino_in_bf16_gated_against_fp32() {
    let f = tempfile::tempdir().unwrap();
    let recipe = bf16_recipe(f.path(), "");
    let plan = plan_json(&recipe);
    let ids: Vec<&str> = plan["targets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["cpu-fp32", "cpu-bf16"], "{plan}");
    let bf16 = &plan["targets"][1];
    assert_eq!(bf16["precision"], "bf16", "{bf16}");
    assert_eq!(bf16["tag"], "1.0.0-cpu-bf16", "{bf16}");
    assert_eq!(bf16["cpu"]["engine"], "openvino", "{bf16}");
    assert_eq!(plan["targets"][0]["cpu"]["engine"], "auto", "{plan}");
    // The CPU features it computes fast with, from matrix/cpus.toml, in the plan and its note.
    let features: Vec<(&str, &str)> = bf16["cpu"]["features"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap(),
                f["nfd_label"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        features,
        [
            (
                "avx512-bf16",
                "feature.node.kubernetes.io/cpu-cpuid.AVX512BF16"
            ),
            ("amx", "feature.node.kubernetes.io/cpu-cpuid.AMXBF16")
        ],
        "{bf16}"
    );
    assert!(
        plan["targets"][0]["cpu"].get("features").is_none(),
        "{plan}"
    );
    assert!(
        bf16["notes"][0]
            .as_str()
            .is_some_and(|n| n.contains("on CPUs with avx512-bf16 or amx (matrix/cpus.toml)")),
        "{bf16}"
    );
    // The deployment prefers nodes with one of them.
    let k8s = f.path().join("k8s");
    let o = infer_build()
        .arg("deploy")
        .arg(&recipe)
        .args(["--target", "cpu-bf16", "--out"])
        .arg(&k8s)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml: String = std::fs::read_dir(&k8s)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect();
    for label in [
        "feature.node.kubernetes.io/cpu-cpuid.AVX512BF16",
        "feature.node.kubernetes.io/cpu-cpuid.AMXBF16",
    ] {
        assert!(yaml.contains(label), "{yaml}");
    }
    assert!(
        yaml.contains("preferredDuringSchedulingIgnoredDuringExecution"),
        "{yaml}"
    );

    let cache = f.path().join("cache");
    let o = engine_at(&recipe, &cache, "cpu-bf16");
    if !super::support::cpu_computes_bf16() {
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("needs AVX-512 BF16 or AMX"),
            "{}",
            stderr(&o)
        );
        eprintln!("this CPU cannot compute in BF16: the cpu-bf16 target was refused as documented");
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["cached"], false);
    let meta = &doc["meta"];
    assert_eq!(meta["kind"], "openvino", "{meta}");
    assert_eq!(meta["precision"], "bf16", "{meta}");
    let gate = &meta["cpu"]["gate"];
    assert_eq!(gate["computed_in"], "bf16", "{meta}");
    assert_eq!(
        gate["evaluation"], "generated inputs, 8 batches of one row",
        "{gate}"
    );
    // BF16 keeps 8 bits of mantissa: the MLP's outputs move, within the default 5%.
    let max_rel = gate_max_rel(gate);
    assert!(max_rel > 0.0 && max_rel < 0.05, "{gate}");
    let sel = &doc["profile"]["selection"];
    assert_eq!(sel["policy"], "openvino", "{sel}");
    assert!(
        sel["candidates"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["kind"] == "openvino"),
        "{sel}"
    );
    // The same recipe again: from the cache.
    let o = engine_at(&recipe, &cache, "cpu-bf16");
    assert!(o.status.success(), "{}", stderr(&o));
    let again: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(again["cached"], true);

    // A limit below what BF16 can keep: refused with the figures, nothing cached.
    let strict = bf16_recipe(
        &f.path().join("strict"),
        "\n[accuracy.bf16]\nmax_rel = 1e-9\n",
    );
    let o = engine_at(&strict, &cache, "cpu-bf16");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    for must in [
        "target cpu-bf16: the bf16 model fails the accuracy gate",
        "output: max rel",
        "> 1.000e-9",
        "OpenVINO 2026.4.1 in FP32",
        "generated inputs",
    ] {
        assert!(err.contains(must), "{must}: {err}");
    }
}

/// `[accuracy] data`: the gate runs on the user's batches (`*.npy` written by numpy, in file
/// name order) instead of generated inputs, and says so.
#[test]
fn py_the_bf16_gate_runs_on_the_recipes_evaluation_data() {
    if !super::support::cpu_computes_bf16() {
        eprintln!("skipping: this CPU cannot compute in BF16 (no avx512_bf16 or amx_bf16 flag), so the cpu-bf16 target is refused before its gate");
        return;
    }
    let py = super::support::python();
    let f = tempfile::tempdir().unwrap();
    let recipe = bf16_recipe(f.path(), "\n[accuracy]\ndata = \"eval\"\n");
    let eval = recipe.parent().unwrap().join("eval");
    std::fs::create_dir_all(&eval).unwrap();
    let o = Command::new(&py)
        .arg("-c")
        .arg(
            "import sys, numpy as np\n\
             r = np.random.default_rng(7)\n\
             for i in range(3):\n    np.save(f'{sys.argv[1]}/{i}.npy', r.standard_normal((4, 64)).astype('float32'))\n",
        )
        .arg(&eval)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let o = engine_at(&recipe, &f.path().join("cache"), "cpu-bf16");
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let gate = &doc["meta"]["cpu"]["gate"];
    assert!(
        gate["evaluation"]
            .as_str()
            .is_some_and(|e| e.starts_with("data ") && e.ends_with("eval, 3 batches")),
        "{gate}"
    );
    // A file that is not an array: the target is refused naming it.
    std::fs::write(eval.join("3.npy"), b"not numpy").unwrap();
    let o = engine_at(&recipe, &f.path().join("cache"), "cpu-bf16");
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("3.npy") && err.contains("not an .npy array"),
        "{err}"
    );
}

/// `cpu = ["int8"]`: infer-build quantises the model to INT8 Q/DQ from `[int8]` calibration
/// data (written by numpy) in its pinned environment, that conversion passes the converter's
/// gate, and the engine is OpenVINO running the Q/DQ model with INT8 kernels, gated again
/// against OpenVINO on the FP32 model; the image's engine is the converted model. A limit the
/// quantised model cannot meet is refused with the figures (exit 2).
#[test]
fn py_a_cpu_int8_target_is_openvino_on_the_quantised_model_gated_against_fp32() {
    let py = super::support::python();
    let f = tempfile::tempdir().unwrap();
    let recipe = copy_example(f.path(), "auto");
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        &recipe,
        text.replace("[targets]\ncpu = true\n", "[targets]\ncpu = [\"int8\"]\n")
            + "\n[int8]\ncalibration = \"calib\"\n",
    )
    .unwrap();
    let calib = recipe.parent().unwrap().join("calib");
    std::fs::create_dir_all(&calib).unwrap();
    let o = Command::new(&py)
        .arg("-c")
        .arg(
            "import sys, numpy as np\n\
             r = np.random.default_rng(3)\n\
             for i in range(4):\n    np.save(f'{sys.argv[1]}/{i}.npy', r.uniform(-1, 1, (8, 64)).astype('float32'))\n",
        )
        .arg(&calib)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let plan = plan_json(&recipe);
    let t = &plan["targets"][0];
    assert_eq!(t["id"], "cpu-int8", "{plan}");
    assert_eq!(t["cpu"]["engine"], "openvino", "{t}");
    assert_eq!(t["cpu"]["features"][0]["name"], "avx512-vnni", "{t}");

    let engine = |recipe: &Path| {
        let cache = f.path().join("cache");
        seed_wheel(&cache);
        let o = infer_build()
            .arg("engine")
            .arg(recipe)
            .args(["--target", "cpu-int8", "--json"])
            .env("INFER_BUILD_CACHE_DIR", &cache)
            .env("INFER_BUILD_PYENV", super::precision::pyenv_root())
            .output()
            .unwrap();
        keep_wheel(&cache);
        o
    };
    let o = engine(&recipe);
    assert!(o.status.success(), "{}", stderr(&o));
    let doc: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let meta = &doc["meta"];
    assert_eq!(meta["kind"], "openvino", "{meta}");
    assert_eq!(meta["precision"], "int8", "{meta}");
    // The engine is the converted Q/DQ model, not the recipe's.
    let conversion = &meta["conversion"];
    assert_eq!(
        conversion["tool"], "onnxruntime.quantization.quantize_static",
        "{meta}"
    );
    // Both gates ran on the calibration data (no [accuracy] data): the conversion's under ONNX
    // Runtime, the engine's under OpenVINO.
    assert_eq!(
        conversion["evaluation"], "calibration data, 4 batches",
        "{meta}"
    );
    assert_eq!(
        meta["engine_digest"], conversion["converted_digest"],
        "{meta}"
    );
    assert_ne!(meta["engine_digest"], meta["onnx_digest"], "{meta}");
    let gate = &meta["cpu"]["gate"];
    assert_eq!(gate["computed_in"], "int8", "{meta}");
    assert!(
        gate["evaluation"]
            .as_str()
            .is_some_and(|e| e.starts_with("data ") && e.ends_with("calib, 4 batches")),
        "{gate}"
    );
    // INT8 moves the outputs more than BF16, within the default 35%.
    let max_rel = gate_max_rel(gate);
    assert!(max_rel > 1e-3 && max_rel < 0.35, "{gate}");
    served_like_fp32(&py, &recipe, Path::new(doc["engine"].as_str().unwrap()));

    // A limit below what INT8 keeps: refused with the figures.
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(&recipe, text + "\n[accuracy.int8]\nmax_rel = 1e-6\n").unwrap();
    let o = engine(&recipe);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("target cpu-int8: the int8 model fails the accuracy gate")
            && err.contains("> 1.000e-6"),
        "{err}"
    );
}

/// The runtime serves `engine` (the MLP's Q/DQ model) on OpenVINO's library as a `cpu-int8`
/// image's `runtime.toml` says (no precision: INT8 is in the model), and answers within INT8's
/// error of onnxruntime on the recipe's FP32 model, through tritonclient.
fn served_like_fp32(py: &Path, recipe: &Path, engine: &Path) {
    let script = super::real_models::script();
    let o = Command::new(py)
        .arg(&script)
        .arg("fetch-openvino")
        .arg(super::real_models::cache_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let ov: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let dir = recipe.parent().unwrap();
    let config = dir.join("int8.runtime.toml");
    std::fs::write(
        &config,
        format!(
            "[model]\nname = \"mlp\"\n\n[[inputs]]\nname = \"input\"\ndatatype = \"FP32\"\ndims = [-1, 64]\n\n[[outputs]]\nname = \"output\"\ndatatype = \"FP32\"\ndims = [-1, 10]\n\n\
             [batching]\nmax_batch_size = 32\ninstances = 1\n\n[engine]\nkind = \"openvino\"\npath = \"{}\"\nlibrary = \"{}\"\n\n\
             [server]\nhost = \"127.0.0.1\"\nport = 0\n",
            engine.display(),
            ov["library"].as_str().unwrap()
        ),
    )
    .unwrap();
    let (mut child, addr, _) = super::onnxruntime::serve(&config);
    let o = Command::new(py)
        .arg(&script)
        .args(["check", &addr, "mlp"])
        .arg(dir.join("mlp.onnx"))
        .arg(r#"[{"input": "input", "shape": [1, 64]}, {"input": "input", "shape": [7, 64]}]"#)
        .env("CHECK_TOL", "0.02")
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
}
