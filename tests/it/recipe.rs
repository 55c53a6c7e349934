//! Recipe parsing and validation: the example and shipped recipes load, every class of problem
//! is reported with file:line:col, key, expectation and hint, all at once, and no input panics.

use std::path::{Path, PathBuf};

use infer_build::recipe::{self, DataType, Gpu, Precision, Recipe};

use super::support;

/// A minimal valid recipe; cases append or replace lines.
const BASE: &str = r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"

[model.inputs.input]
datatype = "fp32"
shape = [-1, 4]
"#;

/// Parse `src` as `recipe.toml` and compare the rendered diagnostics with `expected`
/// (or `"ok"` when the recipe must be valid).
#[track_caller]
fn check(src: &str, expected: &str) {
    let got = match recipe::parse(src, Path::new("recipe.toml")) {
        Ok(_) => "ok".to_string(),
        Err(e) => recipe::render(e.diagnostics()),
    };
    assert_eq!(
        got.trim(),
        expected.trim(),
        "\n--- recipe ---\n{src}\n--- got ---\n{got}\n"
    );
}

fn parse_ok(src: &str) -> Recipe {
    match recipe::parse(src, Path::new("recipe.toml")) {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn minimal_recipe_gets_defaults() {
    let r = parse_ok(BASE);
    assert_eq!(r.model.name, "m");
    assert_eq!(r.model.inputs.len(), 1);
    assert_eq!(r.model.inputs[0].datatype, DataType::Fp32);
    assert_eq!(r.model.inputs[0].shape, vec![-1, 4]);
    assert!(r.targets.cpu);
    assert!(r.targets.gpus.is_empty());
    assert_eq!(r.batching.max_batch_size, recipe::DEFAULT_MAX_BATCH_SIZE);
    assert_eq!(r.image.user, recipe::DEFAULT_USER);
    assert_eq!(r.image.tag.value, recipe::DEFAULT_TAG);
    assert_eq!(r.image.repository.value, "localhost/infer-build/m");
    assert_eq!(r.warmup_batch_sizes(), vec![1, 8]);
    assert_eq!(r.model_path(), PathBuf::from("m.onnx"));
}

#[test]
fn located_values_point_into_the_recipe() {
    let src = format!(
        "{BASE}\n[targets]\ngpus = [\"L4\", \"sm_90\"]\nprecision = [\"fp16\", \"int8\"]\ntensorrt = \"10.8\"\n\n[int8]\nqdq = true\n\n[deploy]\nnode_driver = \"550.54.15\"\n"
    );
    let r = parse_ok(&src);
    let gpus: Vec<_> = r.targets.gpus.iter().map(|g| g.value.clone()).collect();
    assert_eq!(gpus, vec![Gpu::Product("L4".into()), Gpu::Sm(90)]);
    let sm = &r.targets.gpus[1];
    assert_eq!(
        (sm.span.line, sm.span.col, sm.key.as_str()),
        (11, 15, "targets.gpus[1]")
    );
    let p = &r.targets.precision[1];
    assert_eq!(p.value, Precision::Int8);
    assert_eq!((p.span.line, p.span.col), (12, 22));
    let trt = r.targets.tensorrt.as_ref().unwrap();
    assert_eq!(
        (trt.span.line, trt.span.col, trt.value.to_string()),
        (13, 12, "10.8".into())
    );
    let drv = r.deploy.node_driver.as_ref().unwrap();
    let d = drv.diagnostic(&r.file, "driver 550 cannot run CUDA 13");
    assert_eq!(
        d.to_string(),
        "recipe.toml:19:15: deploy.node_driver: driver 550 cannot run CUDA 13"
    );
}

#[test]
fn the_example_recipe_loads() {
    let r = recipe::load(&support::root().join("examples/mlp/recipe.toml"))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.model.name, "mlp");
    assert!(r.model_path().is_file());
}

/// The acceptance case: a wrong type, an unknown key and a missing model file, all named with
/// file:line:col in one report.
#[test]
fn wrong_type_unknown_key_and_missing_model_reported_together() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("recipe.toml");
    std::fs::write(
        &path,
        r#"[model]
name = "m"
version = "1"
onnx = "missing.onnx"

[model.inputs.input]
datatype = "fp32"
shape = [-1, 4]

[batching]
max_batch_size = "eight"
max_batchsize = 8
"#,
    )
    .unwrap();
    let err = recipe::load(&path).unwrap_err();
    assert!(err.is_bad_input());
    let shown = path.display();
    let d = dir.path().join("missing.onnx");
    let expected = format!(
        "{shown}:4:8: model.onnx: model file not found: {}
  hint: export the model to this path, or point `onnx` at your export (relative to the recipe)
{shown}:11:18: batching.max_batch_size: expected a positive integer up to 4096, found string \"eight\"
  hint: write a number without quotes
{shown}:12:1: batching.max_batchsize: unknown key `max_batchsize` in [batching]; did you mean `max_batch_size`?
  hint: valid keys in [batching]: max_batch_size, preferred_batch_sizes, max_queue_delay_us, max_queue_size, default_timeout_ms, instances",
        d.display()
    );
    assert_eq!(recipe::render(err.diagnostics()), expected);
    assert!(err.to_string().starts_with("3 problems in recipe "));
}

#[test]
fn wrong_types_are_named_with_position_expectation_and_hint() {
    check(
        &format!("{BASE}\n[batching]\nmax_batch_size = \"eight\"\ninstances = 1.5\n"),
        r#"
recipe.toml:11:18: batching.max_batch_size: expected a positive integer up to 4096, found string "eight"
  hint: write a number without quotes
recipe.toml:12:13: batching.instances: expected an integer from 1 to 64, found float 1.5
  hint: write a whole number
"#,
    );
}

/// The shipped recipes and the example all load (model files present, every key valid), and
/// their stand-in models declare what the recipes say.
#[test]
fn shipped_recipes_load() {
    let root = support::root();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root.join("recipes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let r = recipe::load(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(r.model_path().is_file());
            assert!(r.requested_target_count() > 1, "{}", path.display());
            names.push(r.model.name);
        }
    }
    names.sort();
    assert_eq!(
        names,
        [
            "minilm-embed",
            "msmarco-reranker",
            "resnet50",
            "whisper-tiny-encoder",
            "yolov8n"
        ]
    );
}
