//! Precision as a build step, on a real pretrained model (PaddleOCR's text direction classifier
//! from the pinned `rapidocr-onnxruntime` wheel, see `real_models.rs`), with no GPU:
//! `infer-build engine` of a GPU target converts the FP32 ONNX (FP16 with onnxconverter-common,
//! INT8 Q/DQ with ONNX Runtime's quantiser, FP8 E4M3 Q/DQ with infer-build's own insertion) in
//! the pinned environment it creates, measures the
//! converted model against FP32 under ONNX Runtime, and stops at the GPU check; a second call
//! is a conversion cache hit; a deliberately bad calibration set is refused by the accuracy gate
//! with its figures (exit 2); the shipped ResNet-50 recipe's INT8 target converts.
//!
//! The converter environment is created once under `target/convert-pyenv` (or
//! `$INFER_BUILD_PYENV`) and shared by every run; creating it downloads about 60 MB of pinned
//! wheels from the Python registry.

use super::support::{self, python, stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

pub(super) fn pyenv_root() -> PathBuf {
    std::env::var_os("INFER_BUILD_PYENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::root().join("target/convert-pyenv"))
}

use super::real_models::cache_dir as model_cache;

/// The classifier's recipe after `[model]` and its tensor tables (`real_models::CLS`).
const RECIPE: &str = r#"
[targets]
gpus = ["L4"]
precision = ["fp16", "int8", "fp8"]
tensorrt = "11"
cpu = false

[int8]
calibration = "CALIB/"

[fp8]
calibration = "CALIB/"

[accuracy]
data = "eval/"

[accuracy.int8]
# 32 held-out rows: one flipped row is 96.9%; the bad calibration set flips about a third.
# That flipped row's probabilities move by 0.38 (the Q/DQ model run as written), past the
# default max_rel of 0.35.
min_top1 = 0.9
max_rel = 0.45

[batching]
max_batch_size = 8
"#;

/// Counts a model's Q/DQ nodes and those whose zero point is FLOAT8E4M3FN, its FP8 weights,
/// its opset, and the element type of its inputs and outputs.
const FP8_CHECK: &str = r#"
import json, sys
import onnx
from onnx import TensorProto as T
m = onnx.load(sys.argv[1])
g = m.graph
types = {i.name: i.data_type for i in g.initializer}
q = [n for n in g.node if n.op_type == "QuantizeLinear"]
dq = [n for n in g.node if n.op_type == "DequantizeLinear"]
fp8 = lambda n: len(n.input) > 2 and types.get(n.input[2]) == T.FLOAT8E4M3FN
io = {v.type.tensor_type.elem_type for v in list(g.input) + list(g.output)}
print(json.dumps({
    "opset": max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
    "q": len(q), "q_fp8": sum(map(fp8, q)), "dq_fp8": sum(map(fp8, dq)),
    "fp8_weights": sum(1 for n in dq if types.get(n.input[0]) == T.FLOAT8E4M3FN),
    "io": "fp32" if io == {T.FLOAT} else str(io),
}))
"#;

fn engine(dir: &Path, cache: &Path, target: &str) -> (std::process::Output, f64) {
    let start = Instant::now();
    let o = support::infer_build()
        .current_dir(dir)
        .env("INFER_BUILD_PYENV", pyenv_root())
        .args(["engine", "recipe.toml", "--target", target, "--cache"])
        .arg(cache)
        .output()
        .unwrap();
    (o, start.elapsed().as_secs_f64())
}

fn recipe_dir(root: &Path, onnx: &Path, data: &Path, calib: &str) -> PathBuf {
    let dir = root.join(calib);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(onnx, dir.join("model.onnx")).unwrap();
    for sub in ["calib", "eval", "bad"] {
        let to = dir.join(sub);
        std::fs::create_dir_all(&to).unwrap();
        for e in std::fs::read_dir(data.join(sub)).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
    let recipe = format!(
        "[model]\nname = \"ocr-cls\"\nversion = \"1\"\nonnx = \"model.onnx\"\n{}{}",
        super::real_models::CLS,
        RECIPE.replace("CALIB", calib)
    );
    std::fs::write(dir.join("recipe.toml"), recipe).unwrap();
    dir
}

/// The classifier (fetched into the shared model cache) and its calibration, evaluation and bad
/// calibration batches written under `tmp/data`: `(python, onnx, data)`, or `None`, with the
/// reason printed, when the test Python lacks onnxruntime or numpy.
fn classifier_and_data(test: &str, tmp: &Path) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let py = python();
    let have = Command::new(&py)
        .args(["-c", "import onnxruntime, numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !have {
        eprintln!("skipping {test}: {} lacks onnxruntime/numpy", py.display());
        return None;
    }
    let o = Command::new(&py)
        .arg(super::real_models::script())
        .arg("fetch")
        .arg(model_cache())
        .output()
        .unwrap();
    assert!(o.status.success(), "fetching the models: {}", stderr(&o));
    let models: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let onnx = PathBuf::from(models["ocr-cls"].as_str().unwrap());
    let data = tmp.join("data");
    let o = Command::new(&py)
        .arg(support::root().join("tests/it/precision_data.py"))
        .arg(&data)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    Some((py, onnx, data))
}

#[test]
fn py_precision_conversion_gate_and_cache_on_a_real_model() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((py, onnx, data)) = classifier_and_data(
        "py_precision_conversion_gate_and_cache_on_a_real_model",
        tmp.path(),
    ) else {
        return;
    };
    let good = recipe_dir(tmp.path(), &onnx, &data, "calib");
    let cache = tmp.path().join("cache");

    // The plan converts both precisions.
    let o = support::run_in(&good, &["plan", "recipe.toml", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for t in plan["targets"].as_array().unwrap() {
        assert_eq!(t["tensorrt"]["precision_mode"], "convert", "{t}");
    }

    for target in ["sm89-fp16", "sm89-int8", "sm89-fp8"] {
        let (first, t1) = engine(&good, &cache, target);
        let err = stderr(&first);
        eprintln!("{target} first call ({t1:.1}s):\n{err}");
        // Converted and gated here, then stopped at the GPU check (not a bad-input failure).
        assert_eq!(first.status.code(), Some(1), "{err}");
        let precision = &target[5..];
        assert!(
            err.contains(&format!("converted {precision} model of {target}")),
            "{err}"
        );
        assert!(
            err.contains("accuracy against FP32 on evaluation data, 16 batches: passed"),
            "{err}"
        );
        assert!(err.contains("top-1 agreement"), "{err}");
        assert!(
            err.contains(&format!(
                "target {target} needs a GPU to build its TensorRT engine"
            )) && err.contains("nvidia-smi"),
            "{err}"
        );
        let converted: Vec<PathBuf> = std::fs::read_dir(cache.join("v1/converted"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.join("model.onnx").is_file() && p.join("conversion.json").is_file())
            .collect();
        assert!(!converted.is_empty());

        // Second call: the conversion comes from the cache (no Python runs).
        let (second, t2) = engine(&good, &cache, target);
        let err2 = stderr(&second);
        eprintln!("{target} second call ({t2:.1}s):\n{err2}");
        assert_eq!(second.status.code(), Some(1), "{err2}");
        assert!(
            err2.contains(&format!("cached {precision} model of {target}")),
            "{err2}"
        );
        assert!(t2 < t1, "the cached call took {t2:.2}s, the first {t1:.2}s");
    }

    // The report records the tool versions the requirements pin and the figures.
    let reports: Vec<serde_json::Value> = std::fs::read_dir(cache.join("v1/converted"))
        .unwrap()
        .filter_map(|e| std::fs::read(e.unwrap().path().join("conversion.json")).ok())
        .map(|b| serde_json::from_slice(&b).unwrap())
        .collect();
    assert_eq!(reports.len(), 3);
    for r in &reports {
        assert_eq!(r["versions"]["onnxruntime"], "1.32.0", "{r}");
        assert_eq!(r["versions"]["onnx"], "1.23.2", "{r}");
        let o = &r["outputs"][0];
        assert_eq!(o["rows"], 32, "{r}");
        assert!(o["top1_agreement"].as_f64().unwrap() >= 0.9, "{r}");
    }

    // The FP8 model really is FP8: opset 19 Q/DQ pairs with FLOAT8E4M3FN zero points on the
    // activations, FP8 weights behind DequantizeLinear, inputs and outputs still FP32.
    let fp8 = std::fs::read_dir(cache.join("v1/converted"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            std::fs::read(p.join("conversion.json"))
                .map(|b| String::from_utf8_lossy(&b).contains("FLOAT8E4M3FN"))
                .unwrap_or(false)
        })
        .expect("an fp8 conversion");
    let o = Command::new(&py)
        .arg("-c")
        .arg(FP8_CHECK)
        .arg(fp8.join("model.onnx"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let census: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    eprintln!("fp8 model: {census}");
    assert!(census["opset"].as_i64().unwrap() >= 19, "{census}");
    assert!(census["q_fp8"].as_u64().unwrap() > 0, "{census}");
    assert_eq!(census["q_fp8"], census["q"], "{census}");
    assert!(
        census["dq_fp8"].as_u64().unwrap() > census["q_fp8"].as_u64().unwrap(),
        "{census}"
    );
    assert!(census["fp8_weights"].as_u64().unwrap() > 0, "{census}");
    assert_eq!(census["io"], "fp32", "{census}");

    // A useless calibration set: the INT8 model is refused with its figures, exit 2.
    let bad = recipe_dir(tmp.path(), &onnx, &data, "bad");
    let (o, _) = engine(&bad, &cache, "sm89-int8");
    let err = stderr(&o);
    eprintln!("bad calibration:\n{err}");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("target sm89-int8: the int8 model fails the accuracy gate")
            && err.contains("top-1 agreement")
            && err.contains("< 90.00%")
            && err.contains("against FP32 on evaluation data, 16 batches"),
        "{err}"
    );
    assert!(!err.contains("needs a GPU"), "{err}");
    let (o, _) = engine(&bad, &cache, "sm89-fp8");
    let err = stderr(&o);
    eprintln!("bad fp8 calibration:\n{err}");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("target sm89-fp8: the fp8 model fails the accuracy gate")
            && err.contains("< 95.00%"),
        "{err}"
    );

    // The shipped ResNet-50 recipe's INT8 targets convert from its committed calibration set
    // (TensorRT 10 here: explicit quantization instead of TensorRT's own calibration).
    let o = support::infer_build()
        .current_dir(support::root())
        .env("INFER_BUILD_PYENV", pyenv_root())
        .args([
            "engine",
            "recipes/resnet50.toml",
            "--target",
            "sm75-int8",
            "--cache",
        ])
        .arg(&cache)
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("int8 model of sm75-int8")
            && err.contains("accuracy against FP32 on calibration data, 8 batches: passed")
            && err.contains("needs a GPU"),
        "{err}"
    );
}

/// `engine.convert = "modelopt"` on the same classifier. Its interpreter is the user's
/// (`$INFER_BUILD_MODELOPT_PYTHON`): the test tools' Python has onnx and onnxruntime but not
/// ModelOpt (its ONNX tools import torch, which CI does not install), so the engine stage
/// refuses before converting anything, naming the import error and the variable; a ModelOpt
/// calibration method ModelOpt lacks is refused by `check` with the recipe's line. Where
/// `$INFER_BUILD_TEST_MODELOPT_PYTHON` names an interpreter with nvidia-modelopt and torch, the
/// three precisions are converted by ModelOpt and pass the same accuracy gate.
#[test]
fn py_modelopt_converter_runs_in_the_users_python_or_says_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((py, onnx, data)) = classifier_and_data(
        "py_modelopt_converter_runs_in_the_users_python_or_says_what_is_missing",
        tmp.path(),
    ) else {
        return;
    };
    let dir = recipe_dir(tmp.path(), &onnx, &data, "calib");
    let recipe = dir.join("recipe.toml");
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        &recipe,
        format!("{text}\n[engine]\nconvert = \"modelopt\"\n"),
    )
    .unwrap();
    let cache = tmp.path().join("cache");
    let engine_with = |python: &Path, target: &str| {
        support::infer_build()
            .current_dir(&dir)
            .env("INFER_BUILD_PYENV", pyenv_root())
            .env("INFER_BUILD_MODELOPT_PYTHON", python)
            .args(["engine", "recipe.toml", "--target", target, "--cache"])
            .arg(&cache)
            .output()
            .unwrap()
    };

    // An interpreter without ModelOpt: refused before any conversion, exit 1 (the machine's
    // tools, not the recipe), with the import error and what to do.
    let o = engine_with(&py, "sm89-int8");
    let err = stderr(&o);
    eprintln!("without modelopt:\n{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("engine.convert = \"modelopt\" needs a Python with nvidia-modelopt")
            && err.contains("No module named 'modelopt'")
            && err.contains("INFER_BUILD_MODELOPT_PYTHON"),
        "{err}"
    );
    assert!(
        !cache.join("v1/converted").exists()
            || std::fs::read_dir(cache.join("v1/converted"))
                .unwrap()
                .next()
                .is_none()
    );

    // A calibration method ModelOpt does not have: `check` names the line and the key.
    let text = std::fs::read_to_string(&recipe).unwrap();
    std::fs::write(
        &recipe,
        text.replace("[int8]\n", "[int8]\nmethod = \"percentile\"\n"),
    )
    .unwrap();
    let o = support::run_in(&dir, &["check", "recipe.toml"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("recipe.toml:")
            && err.contains("int8.method")
            && err.contains(
                "the modelopt converter (engine.convert) has no calibration method `percentile`"
            )
            && err.contains("minmax, entropy"),
        "{err}"
    );
    std::fs::write(&recipe, &text).unwrap();

    let Some(modelopt) = std::env::var_os("INFER_BUILD_TEST_MODELOPT_PYTHON") else {
        eprintln!(
            "py_modelopt_converter_runs_in_the_users_python_or_says_what_is_missing: ModelOpt's own conversions not run: set INFER_BUILD_TEST_MODELOPT_PYTHON to a Python with nvidia-modelopt[onnx] and torch (the test tools leave torch out)"
        );
        return;
    };
    let modelopt = PathBuf::from(modelopt);
    for target in ["sm89-fp16", "sm89-int8", "sm89-fp8"] {
        let start = Instant::now();
        let o = engine_with(&modelopt, target);
        let err = stderr(&o);
        eprintln!(
            "{target} with ModelOpt ({:.1}s):\n{err}",
            start.elapsed().as_secs_f64()
        );
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(
            err.contains("accuracy against FP32 on evaluation data, 16 batches: passed")
                && err.contains("needs a GPU"),
            "{err}"
        );
    }
    let reports: Vec<serde_json::Value> = std::fs::read_dir(cache.join("v1/converted"))
        .unwrap()
        .filter_map(|e| std::fs::read(e.unwrap().path().join("conversion.json")).ok())
        .map(|b| serde_json::from_slice(&b).unwrap())
        .collect();
    assert_eq!(reports.len(), 3);
    for r in &reports {
        assert!(r["versions"]["nvidia-modelopt"].is_string(), "{r}");
        assert!(r["versions"]["torch"].is_string(), "{r}");
        assert!(
            r["options"]["tool"]
                .as_str()
                .unwrap()
                .starts_with("modelopt.onnx."),
            "{r}"
        );
    }
}

/// Two small models made for the FP16 path: `overflow.onnx` squares `300 x` (up to 9e4, beyond
/// FP16's 65504) before a MatMul scales it back, so FP16 must keep those nodes FP32; `coarse.onnx`
/// computes `(x + 256) I - 256`, whose FP16 sum before the MatMul has steps of 0.25 without
/// overflowing anything, so the gate must refuse it. Both `x: fp32 [N, 8] -> y: fp32 [N, 8]`.
const FP16_MODELS: &str = r#"
import sys
import numpy as np
import onnx
from onnx import TensorProto as T, helper as h, numpy_helper as nh

def save(name, nodes, consts):
    g = h.make_graph(nodes, name,
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 8])],
        [h.make_tensor_value_info("y", T.FLOAT, ["N", 8])],
        [nh.from_array(np.array(v, np.float32), k) for k, v in consts.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    onnx.save(m, f"{sys.argv[1]}/{name}.onnx")

save("overflow", [h.make_node("Mul", ["x", "k"], ["a"]), h.make_node("Mul", ["a", "a"], ["b"]),
                  h.make_node("MatMul", ["b", "w"], ["y"])], {"k": 300.0, "w": np.eye(8) / 300.0})
save("coarse", [h.make_node("Add", ["x", "c"], ["a"]), h.make_node("MatMul", ["a", "i"], ["b"]),
                h.make_node("Sub", ["b", "c"], ["y"])], {"c": 256.0, "i": np.eye(8)})
"#;

const FP16_RECIPE: &str = r#"
[targets]
gpus = ["L4"]
precision = ["fp16"]
tensorrt = "11"
cpu = false

[batching]
max_batch_size = 4
"#;

/// FP16 of every real model the tests fetch passes the default gate (TensorRT 11, strongly
/// typed: the converted ONNX is the only way to FP16), stopping only at the GPU step, with the
/// folding and the nodes kept FP32 printed: PaddleOCR v4's detector among them, which the
/// converter ruined before folding (max rel 38.7 on generated inputs). A model that overflows FP16 converts with
/// the overflowing nodes kept FP32; one that FP16 rounds too coarsely is still refused, exit 2.
#[test]
fn py_fp16_of_every_real_model_passes_the_default_gate_and_a_coarse_one_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((py, _, _)) = classifier_and_data(
        "py_fp16_of_every_real_model_passes_the_default_gate_and_a_coarse_one_is_refused",
        tmp.path(),
    ) else {
        return;
    };
    let cache = tmp.path().join("cache");
    let models = model_cache();
    let write = |name: &str, onnx: &Path, tables: &str| -> PathBuf {
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(onnx, dir.join("model.onnx")).unwrap();
        let tokenizer = models.join(format!("{name}.tokenizer.json"));
        if tables.contains("[text]") {
            std::fs::copy(&tokenizer, dir.join("tokenizer.json")).unwrap();
        }
        std::fs::write(
            dir.join("recipe.toml"),
            format!("[model]\nname = \"{name}\"\nversion = \"1\"\nonnx = \"model.onnx\"\n{tables}{FP16_RECIPE}"),
        )
        .unwrap();
        dir
    };
    for case in super::real_models::CASES {
        // A second recipe of a fetched model (`real_models.py`'s ALIASES) converts as its model.
        if !models.join(format!("{}.onnx", case.name)).is_file() {
            continue;
        }
        let dir = write(
            case.name,
            &models.join(format!("{}.onnx", case.name)),
            case.recipe,
        );
        let (o, secs) = engine(&dir, &cache, "sm89-fp16");
        let err = stderr(&o);
        eprintln!("{} ({secs:.1}s):\n{err}", case.name);
        assert_eq!(o.status.code(), Some(1), "{}: {err}", case.name);
        assert!(
            err.contains("converted fp16 model of sm89-fp16")
                && err.contains("folded first by onnxruntime 1.32.0 basic optimisation")
                && err.contains("kept FP32: ")
                && err.contains("accuracy against FP32 on generated inputs")
                && err.contains(": passed")
                && err.contains("needs a GPU to build its TensorRT engine"),
            "{}: {err}",
            case.name
        );
    }

    let made = tmp.path().join("made");
    std::fs::create_dir_all(&made).unwrap();
    let o = Command::new(&py)
        .args(["-c", FP16_MODELS])
        .arg(&made)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let tables = "\n[model.inputs.x]\ndatatype = \"fp32\"\nshape = [-1, 8]\n\n[model.outputs.y]\ndatatype = \"fp32\"\nshape = [-1, 8]\n";
    let dir = write("overflow", &made.join("overflow.onnx"), tables);
    let (o, _) = engine(&dir, &cache, "sm89-fp16");
    let err = stderr(&o);
    eprintln!("overflow:\n{err}");
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("kept FP32: 2 of 3 nodes (0 by operator type, 0 reading a constant beyond ±65504, 2 with values beyond ±512 on generated inputs")
            && err.contains(": passed"),
        "{err}"
    );

    let dir = write("coarse", &made.join("coarse.onnx"), tables);
    let (o, _) = engine(&dir, &cache, "sm89-fp16");
    let err = stderr(&o);
    eprintln!("coarse:\n{err}");
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("target sm89-fp16: the fp16 model fails the accuracy gate (y: max rel")
            && err.contains("kept FP32: 0 of 3 nodes"),
        "{err}"
    );
}
