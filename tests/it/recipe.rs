//! Recipe parsing and validation: the example and shipped recipes load, every class of problem
//! is reported with file:line:col, key, expectation and hint, all at once, and no input panics.

use std::path::{Path, PathBuf};

use infer_build::recipe::{self, ComputeCapability, DataType, Gpu, Precision, Recipe};

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
    assert_eq!(r.model.inputs[0].datatype, DataType::F32);
    assert_eq!(r.model.inputs[0].shape, vec![-1, 4]);
    assert_eq!(
        r.targets.cpu.iter().map(|p| p.value).collect::<Vec<_>>(),
        [Precision::Fp32]
    );
    assert!(r.targets.gpus.is_empty());
    assert_eq!(r.batching.max_batch_size, recipe::DEFAULT_MAX_BATCH_SIZE);
    assert_eq!(r.image.user, recipe::DEFAULT_USER);
    assert_eq!(r.image.layout, recipe::ImageLayout::Combined);
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
    assert_eq!(
        gpus,
        vec![
            Gpu::Product("L4".into()),
            Gpu::Sm(ComputeCapability::new(9, 0))
        ]
    );
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
  hint: valid keys in [batching]: max_batch_size, preferred_batch_sizes, max_queue_delay_us, queue_delay, max_queue_size, default_timeout_ms, instances",
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

#[test]
fn toml_syntax_errors_are_reported_without_validation_echoes() {
    // syntax
    check(
        r#"name = "x
[model
a = 1"#,
        r#"
recipe.toml:1:10: invalid TOML: invalid basic string, expected `"`
  hint: see https://toml.io/en/v1.0.0 for the syntax
recipe.toml:2:7: invalid TOML: unclosed table, expected `]`
  hint: see https://toml.io/en/v1.0.0 for the syntax
"#,
    );
    // syntax2
    check(
        r#"[model]
name = "a"
name = "b""#,
        r#"
recipe.toml:3:1: invalid TOML: duplicate key
  hint: see https://toml.io/en/v1.0.0 for the syntax
"#,
    );
    // empty
    check(
        r#""#,
        r#"
recipe.toml:1:1: model: missing required table [model]
  hint: start the recipe with `[model]` and its `name`, `version`, `onnx` and inputs
"#,
    );
}

#[test]
fn missing_and_unknown_tables_and_keys() {
    // nomodel
    check(
        r#"[targets]
cpu = true"#,
        r#"
recipe.toml:1:1: model: missing required table [model]
  hint: start the recipe with `[model]` and its `name`, `version`, `onnx` and inputs
"#,
    );
    // model_missing_keys
    check(
        r#"[model]
descripton = "x""#,
        r#"
recipe.toml:1:2: model.inputs: missing required table [model.inputs.NAME]
  hint: declare each input: `[model.inputs.input]` with `datatype = "fp32"` and `shape = [-1, 3, 224, 224]`
recipe.toml:1:2: model.name: missing required key `name` in [model]
  hint: add `name = "resnet50"` to [model]
recipe.toml:1:2: model.onnx: missing required key `onnx` in [model]
  hint: add `onnx = "model.onnx"` to [model]
recipe.toml:1:2: model.version: missing required key `version` in [model]
  hint: add `version = "1.0.0"` to [model]
recipe.toml:2:1: model.descripton: unknown key `descripton` in [model]; did you mean `description`?
  hint: valid keys in [model]: name, version, onnx, description, inputs, outputs
"#,
    );
    // unknown_tables
    check(
        &format!(
            "{BASE}{}",
            r#"
[batch]
max_batch_size = 8

[deployment]
replicas = 2

[Targets]
cpu = true
"#
        ),
        r#"
recipe.toml:10:2: batch: unknown table [batch]; did you mean [batching]?
  hint: a recipe has the tables [model], [targets], [engine], [int8], [fp8], [accuracy], [batching], [warmup], [image], [deploy], [text], [vision], [response_cache]
recipe.toml:13:2: deployment: unknown table [deployment]; did you mean [deploy]?
  hint: a recipe has the tables [model], [targets], [engine], [int8], [fp8], [accuracy], [batching], [warmup], [image], [deploy], [text], [vision], [response_cache]
recipe.toml:16:2: Targets: unknown table [Targets]; did you mean [targets]?
  hint: a recipe has the tables [model], [targets], [engine], [int8], [fp8], [accuracy], [batching], [warmup], [image], [deploy], [text], [vision], [response_cache]
"#,
    );
    // types_tables
    check(
        &format!(
            "{BASE}{}",
            r#"
batching = 8
targets = [1]
[[warmup]]
enabled = true
"#
        ),
        r#"
recipe.toml:10:1: model.inputs.input.batching: unknown key `batching` in [model.inputs.input]
  hint: `batching` is a top-level table, but here it falls under [model.inputs.input]: keys belong to the last [header] above them; write `[batching]` on its own line
recipe.toml:11:1: model.inputs.input.targets: unknown key `targets` in [model.inputs.input]
  hint: `targets` is a top-level table, but here it falls under [model.inputs.input]: keys belong to the last [header] above them; write `[targets]` on its own line
recipe.toml:12:1: warmup: expected a table, found an array
  hint: write it as a table: `[warmup]` followed by its keys
"#,
    );
    // dotted_outputs
    check(
        &format!(
            "{BASE}{}",
            r#"
[model.outputs]
logits = 5
"#
        ),
        r#"
recipe.toml:11:10: model.outputs.logits: expected a table with `datatype` and `shape`, found integer 5
  hint: write a `[model.outputs.logits]` header followed by `datatype = "fp32"` and `shape = [-1, ...]`
"#,
    );
    // inputnottable
    check(
        r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"
inputs.input = [-1, 3]
"#,
        r#"
recipe.toml:5:16: model.inputs.input: expected a table with `datatype` and `shape`, found an array
  hint: write a `[model.inputs.input]` header followed by `datatype = "fp32"` and `shape = [-1, ...]`
"#,
    );
    // noinputs
    check(
        r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"
"#,
        r#"
recipe.toml:1:2: model.inputs: missing required table [model.inputs.NAME]
  hint: declare each input: `[model.inputs.input]` with `datatype = "fp32"` and `shape = [-1, 3, 224, 224]`
"#,
    );
    // emptyinputs
    check(
        r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"
[model.inputs]
"#,
        r#"
recipe.toml:5:8: model.inputs: the model has no inputs
  hint: declare each input as `[model.inputs.NAME]` with `datatype` and `shape`
"#,
    );
}

#[test]
fn model_values() {
    // model_bad_values
    check(
        r#"[model]
name = "ResNet 50"
version = 1
onnx = "../outside.onnx"

[model.inputs.input]
datatype = "float32"
shape = [8, 0, 3]
"#,
        r#"
recipe.toml:2:8: model.name: invalid model name "ResNet 50"
  hint: use 1 to 63 lowercase letters, digits, `.`, `_` or `-`, starting with a letter or digit (the name is used in URLs, image names and Kubernetes objects)
recipe.toml:3:11: model.version: expected a string, found integer 1
  hint: quote it: `version = "1"`
recipe.toml:4:8: model.onnx: path "../outside.onnx" to the ONNX model leaves the recipe's directory
  hint: write a path relative to the recipe's directory that stays inside it, such as "models/model.onnx"; copy or link the file there
recipe.toml:7:12: model.inputs.input.datatype: unknown datatype "float32"; did you mean `fp32`?
  hint: datatypes: bool, uint8, uint16, uint32, uint64, int8, int16, int32, int64, fp16, bf16, fp32, fp64, bytes
recipe.toml:8:10: model.inputs.input.shape[0]: the first dimension is the batch dimension and must be -1 (dynamic), found 8
  hint: write -1 first; a model that only takes batches of 1 can say 1 with `max_batch_size = 1`
recipe.toml:8:13: model.inputs.input.shape[1]: a dimension cannot be 0
  hint: write -1 for a dynamic dimension or its fixed size
"#,
    );
    // abs_path
    check(
        r#"[model]
name = "m"
version = "1.0"
onnx = "/etc/passwd"
inputs = {}"#,
        r#"
recipe.toml:4:8: model.onnx: path "/etc/passwd" to the ONNX model is absolute
  hint: write a path relative to the recipe's directory that stays inside it, such as "models/model.onnx"; copy or link the file there
recipe.toml:5:1: model.inputs: the model has no inputs
  hint: declare each input as `[model.inputs.NAME]` with `datatype` and `shape`
"#,
    );
    // output_datatypes
    check(
        &format!(
            "{BASE}{}",
            r#"
[model.outputs."out.1"]
datatype = "FP16"
shape = [-1, 2]
[model.outputs.o2]
datatype = "double"
shape = [-1]
"#
        ),
        r#"
recipe.toml:14:12: model.outputs.o2.datatype: unknown datatype "double"; did you mean `fp64`?
  hint: datatypes: bool, uint8, uint16, uint32, uint64, int8, int16, int32, int64, fp16, bf16, fp32, fp64, bytes
"#,
    );
    // batch1
    check(
        r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"

[model.inputs.input]
datatype = "fp32"
shape = [1, 4]

[batching]
max_batch_size = 1
"#,
        r#"
ok
"#,
    );
    // batch1bad
    check(
        r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"

[model.inputs.input]
datatype = "fp32"
shape = [1, 4]
"#,
        r#"
recipe.toml:8:10: model.inputs.input.shape[0]: the first dimension is the batch dimension and must be -1 (dynamic), found 1
  hint: write -1 first; a model that only takes batches of 1 can say 1 with `max_batch_size = 1`
"#,
    );
}

#[test]
fn shape_profiles() {
    // profile_bad
    check(
        &format!(
            "{BASE}{}",
            r#"
[model.inputs.ids]
datatype = "int64"
shape = [-1, -1, 16]
profile = { min = [1, 16], opt = [256, 16], max = [128] }

[model.inputs.mask]
datatype = "int64"
shape = [-1, -1]
profile = { min = [8], opt = [4], max = [2], extra = 1 }

[model.inputs.fixed]
datatype = "fp16"
shape = [-1, 3]
profile = { min = [3], opt = [3], max = [3] }

[model.outputs.out]
datatype = "fp32"
shape = [-1, 2]
profile = { min = [1] }
"#
        ),
        r#"
recipe.toml:13:51: model.inputs.ids.profile.max: expected 2 sizes (one per dimension after the batch dimension of shape [-1, -1, 16]), found 1
  hint: write `max = [128, 16]`; the batch range comes from [batching]
recipe.toml:18:20: model.inputs.mask.profile.min[0]: profile min (8) is larger than opt (4)
  hint: a profile needs min <= opt <= max for every dimension
recipe.toml:18:31: model.inputs.mask.profile.opt[0]: profile opt (4) is larger than max (2)
  hint: a profile needs min <= opt <= max for every dimension
recipe.toml:18:46: model.inputs.mask.profile.extra: unknown key `extra` in [model.inputs.mask.profile]
  hint: valid keys in [model.inputs.mask.profile]: min, opt, max
recipe.toml:23:1: model.inputs.fixed.profile: a profile is only for inputs with dynamic dimensions after the batch dimension, and this shape has none
  hint: remove the profile, or write -1 for the dimensions that vary
recipe.toml:28:1: model.outputs.out.profile: unknown key `profile` in [model.outputs.out]
  hint: valid keys in [model.outputs.out]: datatype, shape
"#,
    );
    // profile_missing_gpu
    check(
        &format!(
            "{BASE}{}",
            r#"
[model.inputs.ids]
datatype = "int64"
shape = [-1, -1]

[targets]
gpus = ["L4"]
"#
        ),
        r#"
recipe.toml:12:14: model.inputs.ids.shape[1]: this dimension is dynamic, and TensorRT engines need its range: the input has no profile
  hint: add `profile = { min = [...], opt = [...], max = [...] }` with one size per dimension after the batch dimension
"#,
    );
    // A CPU-only recipe needs the range too: the runtime checks requests against it (`build`
    // would refuse the runtime config otherwise, so `check` says it first).
    check(
        &format!(
            "{BASE}{}",
            r#"
[model.inputs.ids]
datatype = "int64"
shape = [-1, -1]

[targets]
cpu = true
"#
        ),
        r#"
recipe.toml:12:14: model.inputs.ids.shape[1]: this dimension is dynamic, and the runtime needs its bounds to check requests: the input has no profile
  hint: add `profile = { min = [...], opt = [...], max = [...] }` with one size per dimension after the batch dimension
"#,
    );
    // profile_fixed_mismatch
    check(
        &format!(
            "{BASE}{}",
            r#"
[model.inputs.img]
datatype = "uint8"
shape = [-1, -1, 224, 3]
profile = { min = [64, 224, 3], opt = [128, 200, 3], max = [256, 224, 4] }
"#
        ),
        r#"
recipe.toml:13:45: model.inputs.img.profile.opt[1]: dimension 2 of the shape is fixed at 224, but the profile says 200
  hint: repeat the fixed size 224 here
recipe.toml:13:71: model.inputs.img.profile.max[2]: dimension 3 of the shape is fixed at 3, but the profile says 4
  hint: repeat the fixed size 3 here
"#,
    );
}

#[test]
fn targets() {
    // targets_bad
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
gpus = ["L4", "sm_5", 42, "L4", "A100;rm -rf"]
precision = ["fp61", "fp16", "fp16", 8]
cpu = "yes"
tensorrt = 10.10
cuda = "twelve"
version_compatible = "true"
hardware_compatibility = "ampere"
"#
        ),
        r#"
recipe.toml:11:15: targets.gpus[1]: invalid GPU name "sm_5"
  hint: write a product name such as "L4", "H100", "RTX 4090" or an SM name such as "sm_89"
recipe.toml:11:23: targets.gpus[2]: expected a GPU name such as "L4" or an SM name such as "sm_89", found integer 42
recipe.toml:11:27: targets.gpus[3]: GPU "L4" is listed twice
  hint: remove the duplicate
recipe.toml:11:33: targets.gpus[4]: invalid GPU name "A100;rm -rf"
  hint: write a product name such as "L4", "H100", "RTX 4090" or an SM name such as "sm_89"
recipe.toml:12:14: targets.precision[0]: unknown precision "fp61"; did you mean `fp16`?
  hint: precisions: fp32, fp16, bf16, int8, fp8, fp4
recipe.toml:12:30: targets.precision[2]: precision "fp16" is listed twice
  hint: remove the duplicate
recipe.toml:12:38: targets.precision[3]: expected a precision (fp32, fp16, bf16, int8, fp8, fp4), found integer 8
recipe.toml:13:7: targets.cpu: expected true, false or a list of CPU precisions such as ["fp32", "bf16"], found string "yes"
recipe.toml:14:12: targets.tensorrt: expected a version string, found float 10.10
  hint: quote it: `tensorrt = "10.10"` (as a number, 10.10 would read as 10.1)
recipe.toml:15:8: targets.cuda: invalid version "twelve"
  hint: write dotted numbers, such as `cuda = "12.8"`
recipe.toml:16:22: targets.version_compatible: expected a boolean, found string "true"
  hint: drop the quotes: `version_compatible = true`
recipe.toml:17:26: targets.hardware_compatibility: unknown hardware compatibility level "ampere"
  hint: levels: "none", "ampere+" (one engine for Ampere and later), "same-compute-capability"
"#,
    );
    // no_targets
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
cpu = false
precision = ["fp16"]
tensorrt = "10.8"
"#
        ),
        r#"
recipe.toml:11:7: targets.cpu: no targets: `gpus` lists none and `cpu = false`
  hint: add GPUs (`gpus = ["L4"]`) or set `cpu = true`
recipe.toml:12:13: targets.precision: precision applies to GPU targets, and `gpus` lists none
  hint: add `gpus = [...]`, or remove `precision` (the CPU target's precisions are `cpu = ["fp32", "bf16"]`)
recipe.toml:13:12: targets.tensorrt: `tensorrt` pins a GPU toolchain, and `gpus` lists none
  hint: add `gpus = [...]`, or remove `tensorrt`
"#,
    );
}

#[test]
fn cpu_precisions_are_a_list_and_bf16_needs_an_engine_that_computes_in_it() {
    // A list of precisions: one CPU target each, in recipe order.
    let r = parse_ok(&format!(
        "{BASE}{}",
        "\n[targets]\ncpu = [\"bf16\", \"fp32\"]\n\n[image]\ntag = \"{version}-{target}\"\n"
    ));
    assert_eq!(
        r.targets.cpu.iter().map(|p| p.value).collect::<Vec<_>>(),
        [Precision::Bf16, Precision::Fp32]
    );
    assert_eq!(r.requested_target_count(), 2);
    // cpu_list_errors
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
cpu = ["fp32", "fp16", "bf61", "fp32", 16]
"#
        ),
        r#"
recipe.toml:11:16: targets.cpu[1]: precision fp16 is not built for the CPU target
  hint: precisions: fp32, bf16, int8
recipe.toml:11:24: targets.cpu[2]: unknown precision "bf61"; did you mean `bf16`?
  hint: precisions: fp32, bf16, int8
recipe.toml:11:32: targets.cpu[3]: precision "fp32" is listed twice
  hint: remove the duplicate
recipe.toml:11:40: targets.cpu[4]: expected a precision (fp32, bf16, int8), found integer 16
"#,
    );
    // cpu_int8_without_calibration
    check(
        &format!("{BASE}\n[targets]\ncpu = [\"int8\"]\n"),
        r#"
recipe.toml:11:8: targets.cpu[0]: a cpu-int8 target is quantised from calibration data, and the recipe has no [int8] table
  hint: add `[int8]` with `calibration = "calibration/"` (a directory of *.npy / *.npz batches)
"#,
    );
    // cpu_int8_of_a_qdq_model
    check(
        &format!("{BASE}\n[targets]\ncpu = [\"int8\"]\n\n[int8]\nqdq = true\n"),
        r#"
recipe.toml:14:7: int8.qdq: a cpu-int8 target (targets.cpu at line 11) quantises a plain model from calibration data; a Q/DQ model is not taken for it yet
  hint: set `qdq = false` with `calibration = "calibration/"`, or remove "int8" from targets.cpu
"#,
    );
    // cpu_empty
    check(
        &format!("{BASE}\n[targets]\ncpu = []\n"),
        r#"
recipe.toml:11:7: targets.cpu: no targets: `gpus` lists none and `cpu` lists no precision
  hint: add GPUs (`gpus = ["L4"]`) or a CPU precision (`cpu = ["fp32"]`)
"#,
    );
    // bf16_on_tract
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
cpu = ["fp32", "bf16"]

[engine]
cpu = "onnxruntime"
"#
        ),
        r#"
recipe.toml:11:16: targets.cpu[1]: ONNX Runtime computes in fp32 only (engine.cpu = "onnxruntime" at line 14), and this CPU target asks for bf16
  hint: use engine.cpu = "auto" or "openvino", or remove "bf16" from `cpu`
"#,
    );
    // two_cpu_targets_one_tag
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
cpu = ["fp32", "bf16"]

[image]
tag = "{version}-{sm}"
"#
        ),
        r#"
recipe.toml:14:7: image.tag: the tag template gives every target the same tag
  hint: include {target}, or {sm} (or {gpu}) and {precision}, such as "{version}-{target}"
"#,
    );
    // ...which {precision} tells apart.
    check(
        &format!(
            "{BASE}{}",
            "\n[targets]\ncpu = [\"fp32\", \"bf16\"]\n\n[image]\ntag = \"{version}-{sm}-{precision}\"\n"
        ),
        "ok",
    );
}

#[test]
fn int8_needs_calibration_or_qdq() {
    // int8_missing
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
gpus = ["L4"]
precision = ["int8"]
"#
        ),
        r#"
recipe.toml:12:14: targets.precision[0]: int8 engines need calibration data or a Q/DQ model, and the recipe has no [int8] table
  hint: add `[int8]` with `calibration = "calibration/"` (TensorRT 10 and earlier) or `qdq = true` (a Q/DQ model)
"#,
    );
    // int8_both
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
gpus = ["L4"]
precision = ["int8"]

[int8]
calibration = "calib/"
qdq = true
"#
        ),
        r#"
recipe.toml:15:15: int8.calibration: `calibration` and `qdq = true` exclude each other: a Q/DQ model carries its own scales
  hint: remove `calibration` for a Q/DQ model, or set `qdq = false` to calibrate a plain model
"#,
    );
    // int8_empty
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
gpus = ["L4"]
precision = ["int8"]

[int8]
"#
        ),
        r#"
recipe.toml:14:2: int8: [int8] needs `calibration` (a data directory or cache) or `qdq = true`
  hint: add `calibration = "calibration/"`, or `qdq = true` when the model has Q/DQ nodes
"#,
    );
}

#[test]
fn batching_ranges_and_consistency() {
    // batching_bad
    check(
        &format!(
            "{BASE}{}",
            r#"
[batching]
max_batch_size = 16
preferred_batch_sizes = [4, 32, 4, 0]
max_queue_delay_us = 2000000
max_queue_size = 8
default_timeout_ms = 1000
instances = 0
"#
        ),
        r#"
recipe.toml:12:29: batching.preferred_batch_sizes[1]: preferred batch size 32 is larger than max_batch_size (16)
  hint: raise `max_batch_size` or drop this size
recipe.toml:12:33: batching.preferred_batch_sizes[2]: batch size 4 is listed twice
  hint: remove the duplicate
recipe.toml:12:36: batching.preferred_batch_sizes[3]: expected a positive batch size, found integer 0
recipe.toml:13:22: batching.max_queue_delay_us: max_queue_delay_us (2000000 µs) is not shorter than default_timeout_ms (1000 ms): requests would time out while waiting for a batch
  hint: keep the queue delay well below the request timeout
recipe.toml:14:18: batching.max_queue_size: max_queue_size (8) is smaller than max_batch_size (16), so a full batch can never queue
  hint: make `max_queue_size` at least `max_batch_size` (it counts rows, not requests)
recipe.toml:16:13: batching.instances: expected an integer from 1 to 64, found integer 0
"#,
    );
    // batching_big
    check(
        &format!(
            "{BASE}{}",
            r#"
[batching]
max_batch_size = 99999999999999999999999999999999999999999999999999
max_queue_delay_us = -5
max_queue_size = 0x10
instances = "2"
"#
        ),
        r#"
recipe.toml:11:18: batching.max_batch_size: expected a positive integer up to 4096, found integer 99999999999999999999…
  hint: the largest value allowed here is 4096
recipe.toml:12:22: batching.max_queue_delay_us: expected an integer from 0 to 10000000 (10 s), found integer -5
recipe.toml:14:13: batching.instances: expected an integer from 1 to 64, found string "2"
  hint: drop the quotes: `instances = 2`
"#,
    );
    // batching_queue_delay
    check(
        &format!(
            "{BASE}{}",
            r#"
[batching]
queue_delay = "sometimes"
"#
        ),
        r#"
recipe.toml:11:15: batching.queue_delay: unknown queue delay "sometimes"
  hint: "adaptive" (wait only while more requests can come: the default) or "strict" (always wait, as Triton does)
"#,
    );
}

#[test]
fn warmup() {
    // warmup_bad
    check(
        &format!(
            "{BASE}{}",
            r#"
[warmup]
enabled = 1
batch_sizes = [1, 64]
samples = "../samples.json"
colour = "blue"
"#
        ),
        r#"
recipe.toml:11:11: warmup.enabled: expected a boolean (true or false), found integer 1
recipe.toml:12:19: warmup.batch_sizes[1]: warm-up batch size 64 is larger than max_batch_size (8)
  hint: warm up only batch sizes the server can form
recipe.toml:13:11: warmup.samples: path "../samples.json" to the warm-up samples leaves the recipe's directory
  hint: write a path relative to the recipe's directory that stays inside it, such as "models/model.onnx"; copy or link the file there
recipe.toml:14:1: warmup.colour: unknown key `colour` in [warmup]
  hint: valid keys in [warmup]: enabled, batch_sizes, samples
"#,
    );
}

/// A text model's inputs, for the `[text]` cases.
const TEXT_BASE: &str = r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"

[model.inputs.input_ids]
datatype = "int64"
shape = [-1, -1]
profile = { min = [1], opt = [16], max = [128] }

[model.inputs.attention_mask]
datatype = "int64"
shape = [-1, -1]
profile = { min = [1], opt = [16], max = [128] }
"#;

#[test]
fn text() {
    // Defaults: the usual input names when the model has them, the profile's max length.
    let r = parse_ok(&format!(
        "{TEXT_BASE}\n[text]\ntokenizer = \"tokenizer.json\"\n"
    ));
    let t = r.text.unwrap();
    assert_eq!(t.input_ids, "input_ids");
    assert_eq!(t.attention_mask.as_deref(), Some("attention_mask"));
    assert_eq!(t.token_type_ids, None);
    assert_eq!(t.max_length, 128);
    assert!(t.truncate && t.special_tokens && t.normalize);
    assert_eq!((t.output, t.pooling, t.token_budget), (None, None, 0));
    assert_eq!(t.max_padding_percent, None);
    assert_eq!(
        t.max_client_batch_size,
        infer_spec::text::DEFAULT_MAX_CLIENT_BATCH_SIZE
    );
    let r = parse_ok(&format!(
        "{TEXT_BASE}\n[text]\ntokenizer = \"tokenizer.json\"\nmax_client_batch_size = 64\n"
    ));
    assert_eq!(r.text.unwrap().max_client_batch_size, 64);
    check(
        &format!(
            "{TEXT_BASE}{}",
            r#"
[text]
tokenizer = "/etc/tokenizer.json"
attention_mask = "ids"
token_type_ids = "input_ids"
max_length = 4096
pooling = "max"
normalize = "yes"
colour = 1
activation = "relu"
labels = ["a", 2]
max_padding_percent = 20000
max_client_batch_size = 0
"#
        ),
        r#"
recipe.toml:16:2: text: input_ids, attention_mask and token_type_ids name the same input
  hint: give each the model input it fills
recipe.toml:17:13: text.tokenizer: path "/etc/tokenizer.json" to the tokenizer is absolute
  hint: write a path relative to the recipe's directory that stays inside it, such as "models/model.onnx"; copy or link the file there
recipe.toml:18:18: text.attention_mask: the model has no input "ids"
  hint: the model's inputs are ["attention_mask", "input_ids"]
recipe.toml:20:14: text.max_length: max_length 4096 is more than the model's sequence length 128
  hint: raise the input's profile max, or lower max_length
recipe.toml:21:11: text.pooling: unknown pooling "max"
  hint: use "mean", "cls", "last" or "none" (the model pools itself)
recipe.toml:22:13: text.normalize: expected a boolean (true or false), found string "yes"
recipe.toml:23:1: text.colour: unknown key `colour` in [text]
  hint: valid keys in [text]: tokenizer, max_length, truncate, special_tokens, prefix, input_ids, attention_mask, token_type_ids, output, pooling, normalize, token_budget, max_padding_percent, pairs, activation, labels, max_client_batch_size
recipe.toml:24:14: text.activation: unknown activation "relu"
  hint: use "sigmoid" (a reranker, multi-label), "softmax" (single-label classifier) or "none"
recipe.toml:25:16: text.labels[1]: expected a string (a label name), found integer 2
recipe.toml:26:23: text.max_padding_percent: expected 0 to 10000 (a percent of the batch's own tokens), found integer 20000
recipe.toml:27:25: text.max_client_batch_size: expected 1 to 65536 (texts in one request), found integer 0
"#,
    );
}

/// `pad` on token-like inputs: requests of different lengths batch together (a tensor model);
/// every input says its value, int32/int64 `[-1, -1]` only, never with `[text]`.
#[test]
fn padded_inputs() {
    let padded = TEXT_BASE.replace("max = [128] }\n", "max = [128] }\npad = 0\n");
    let r = parse_ok(&padded);
    let pads: Vec<Option<i64>> = r.model.inputs.iter().map(|i| i.pad).collect();
    assert_eq!(pads, [Some(0), Some(0)]);
    let one = TEXT_BASE.replacen("max = [128] }\n", "max = [128] }\npad = 0\n", 1);
    check(
        &one,
        r#"
recipe.toml:12:15: model.inputs.attention_mask: no `pad`, though input "input_ids" has one: requests of different lengths are padded on every input
  hint: add `pad = 0` (or this input's padding value), or remove `pad` from every input
"#,
    );
    check(
        &format!(
            "{padded}\n[model.inputs.pixels]\ndatatype = \"fp32\"\nshape = [-1, 3]\npad = \"0\"\n"
        ),
        r#"
recipe.toml:21:7: model.inputs.pixels.pad: expected padding value (a whole number), found string "0"
  hint: drop the quotes: `pad = 0`
"#,
    );
    check(
        &format!("{padded}\n[model.inputs.scale]\ndatatype = \"fp32\"\nshape = [-1, -1]\nprofile = {{ min = [1], opt = [1], max = [8] }}\npad = 0\n"),
        r#"
recipe.toml:22:7: model.inputs.scale.pad: `pad` is for int32 or int64 inputs of shape [-1, -1] (token ids, masks), this one is fp32 [-1, -1]
  hint: remove `pad`: only token-like inputs are padded, and a model with other inputs batches requests of equal shapes
"#,
    );
    check(
        &format!("{padded}\n[text]\ntokenizer = \"tokenizer.json\"\n"),
        r#"
recipe.toml:18:2: text: input "attention_mask" has a pad, and a [text] model pads its own inputs
  hint: remove `pad` from the inputs: the tokenizer's padding applies
"#,
    );
}

#[test]
fn response_cache() {
    let r = parse_ok(&format!("{BASE}\n[response_cache]\nmax_bytes = 1048576\n"));
    assert_eq!(r.response_cache, Some(1 << 20));
    assert_eq!(parse_ok(BASE).response_cache, None);
    check(
        &format!("{BASE}\n[response_cache]\nsize = 1\n"),
        r#"
recipe.toml:10:2: response_cache.max_bytes: missing required key `max_bytes` in [response_cache]
  hint: add `max_bytes = 67108864` to [response_cache]
recipe.toml:11:1: response_cache.size: unknown key `size` in [response_cache]
  hint: valid keys in [response_cache]: max_bytes
"#,
    );
}

const VISION_BASE: &str = r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"

[model.inputs.pixel_values]
datatype = "fp32"
shape = [-1, 3, 224, 224]

[model.outputs.logits]
datatype = "fp32"
shape = [-1, 3]

[model.outputs.features]
datatype = "fp32"
shape = [-1, 1280, 7, 7]

[model.outputs.tokens]
datatype = "fp32"
shape = [-1, 49, 1280]
"#;

/// `[vision]`: defaults from the model's input, and every class of mistake named at its key.
#[test]
fn vision() {
    let r = parse_ok(&format!(
        "{VISION_BASE}\n[vision]\nresize = \"crop\"\nanswer = \"classify\"\noutput = \"logits\"\nlabels = [\"a\", \"b\", \"c\"]\n"
    ));
    let v = r.vision.unwrap().section;
    assert_eq!(
        (v.height, v.width, v.input.as_str()),
        (224, 224, "pixel_values")
    );
    assert_eq!(v.crop_shorter(), 256);
    assert_eq!((v.top_k, v.labels.len()), (5, 3));
    // A feature map or a vector embeds; the map is pooled by the runtime.
    for output in ["features", "logits"] {
        parse_ok(&format!(
            "{VISION_BASE}\n[vision]\nresize = \"stretch\"\nanswer = \"embed\"\noutput = \"{output}\"\nnormalize = true\n"
        ));
    }
    check(
        &format!(
            "{VISION_BASE}{}",
            r#"
[vision]
input = "image"
resize = "zoom"
shorter = 0
interpolation = "lanczos"
pad = 300
mean = [0.5, 0.5]
std = [1, 0, 1]
answer = "embed"
output = "tokens"
top_k = 0
labels = 3
colour = "rgb"
"#
        ),
        r#"
recipe.toml:23:9: vision.input: the model has no input "image"
  hint: the model's inputs are ["pixel_values"]
recipe.toml:24:10: vision.resize: unknown resize "zoom"
  hint: use "crop" (shorter side, then the centre: classifiers), "letterbox" (fit and pad: YOLO), "stretch" or "pad" (keep the ratio, pad the width: OCR)
recipe.toml:25:11: vision.shorter: expected a side in pixels, found integer 0
recipe.toml:26:17: vision.interpolation: unknown interpolation "lanczos"
  hint: use "bilinear" (PIL's and torchvision's default), "bicubic" or "nearest"
recipe.toml:27:7: vision.pad: expected a pixel value from 0 to 255, found integer 300
recipe.toml:28:8: vision.mean: expected three numbers (one per channel, in the model's channel order)
recipe.toml:29:7: vision.std: expected three numbers, none 0 (one per channel, in the model's channel order)
recipe.toml:32:9: vision.top_k: expected a count of labels, found integer 0
recipe.toml:33:10: vision.labels: expected a file beside the recipe with one label per line, or a list of labels, found integer 3
recipe.toml:34:1: vision.colour: unknown key `colour` in [vision]; did you mean `color`?
  hint: valid keys in [vision]: input, layout, color, resize, shorter, interpolation, pad, scale, mean, std, answer, output, activation, top_k, labels, confidence, iou, max_detections, normalize, max_image_bytes, max_pixels, width_multiple, max_client_batch_size
"#,
    );
    // With the pixels found: an embedding from a sequence, labels that miss a class.
    for (answer, labels, expected) in [
        (
            "embed",
            "",
            r#"
recipe.toml:24:10: vision.answer: "embed" answers from [batch, dims] or [batch, C, H, W], but output "tokens" has shape [-1, 49, 1280]
  hint: name the model's pooled output in [vision] output (a feature map is averaged over its positions)
"#,
        ),
        (
            "classify",
            "labels = [\"a\", \"b\"]",
            r#"
recipe.toml:26:10: vision.labels: 2 labels for 3 classes
  hint: give one label per class of the output, in the model's class order
"#,
        ),
    ] {
        let output = if answer == "embed" {
            "tokens"
        } else {
            "logits"
        };
        check(
            &format!(
                "{VISION_BASE}\n[vision]\nresize = \"crop\"\nanswer = \"{answer}\"\noutput = \"{output}\"\n{labels}\n"
            ),
            expected,
        );
    }
}

const RECOGNISER_BASE: &str = r#"[model]
name = "m"
version = "1"
onnx = "m.onnx"

[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, -1]
profile = { min = [3, 48, 64], opt = [3, 48, 320], max = [3, 48, 1280] }

[model.outputs.probs]
datatype = "fp32"
shape = [-1, -1, 5]

[model.outputs.logits]
datatype = "fp32"
shape = [-1, 5]
"#;

/// A text-line recogniser: a dynamic width within the profile, padded to a multiple; CTC
/// classes are the blank, the characters and perhaps a space.
#[test]
fn vision_recogniser() {
    let r = parse_ok(&format!(
        "{RECOGNISER_BASE}\n[vision]\nresize = \"pad\"\nanswer = \"text\"\noutput = \"probs\"\nlabels = [\"a\", \"b\", \"c\"]\n"
    ));
    let v = r.vision.unwrap().section;
    assert_eq!(
        (v.height, v.width, v.max_width, v.width_multiple),
        (48, 64, 1280, 32)
    );
    assert_eq!(v.activation, infer_spec::text::Activation::None);
    // Four characters: no space class.
    parse_ok(&format!(
        "{RECOGNISER_BASE}\n[vision]\nresize = \"pad\"\nanswer = \"text\"\noutput = \"probs\"\nlabels = [\"a\", \"b\", \"c\", \"d\"]\nwidth_multiple = 8\n"
    ));
    check(
        &format!(
            "{RECOGNISER_BASE}\n[vision]\nresize = \"crop\"\nanswer = \"text\"\noutput = \"probs\"\nlabels = [\"a\"]\n"
        ),
        r#"
recipe.toml:20:10: vision.resize: input "x" has a dynamic width: only resize = "pad" fills it
  hint: use resize = "pad" (the height fixed, the width the image's own), or fix the width in the input's shape
recipe.toml:23:10: vision.labels: 1 character for 5 classes: a CTC output's classes are the blank, then one per character, then perhaps a space (4 or 3 characters)
  hint: one character per line, in the order of the output's classes after the blank (PaddleOCR's dict file as it is)
"#,
    );
    check(
        &format!(
            "{RECOGNISER_BASE}\n[vision]\nresize = \"pad\"\nanswer = \"text\"\noutput = \"logits\"\n"
        ),
        r#"
recipe.toml:19:2: vision.labels: answer = "text" needs the characters of the recogniser's classes
  hint: labels = "characters.txt": one character per line, the dictionary the model was trained with (PaddleOCR's dict file)
recipe.toml:21:10: vision.answer: "text" answers from CTC probabilities [batch, steps, classes], but output "logits" has shape [-1, 5]
  hint: name the recogniser's output in [vision] output, its classes fixed
"#,
    );
    check(
        &format!(
            "{VISION_BASE}\n[vision]\nresize = \"pad\"\nanswer = \"classify\"\noutput = \"logits\"\nwidth_multiple = 32\n"
        ),
        r#"
recipe.toml:26:18: vision.width_multiple: width_multiple applies to an input with a dynamic width only
  hint: remove it
"#,
    );
}

#[test]
fn image_and_tag_template() {
    // image_bad
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
gpus = ["L4", "H100"]
precision = ["fp16", "int8"]
cpu = true

[int8]
qdq = true

[image]
repository = "Registry.Example.com/ML/ResNet"
tag = "{version}-{precison}"
base = "ubuntu@sha256:abc"
user = 0
labels = { "ok.label" = "x", "bad" = 1 }
layout = "separate"
"#
        ),
        r#"
recipe.toml:19:14: image.repository: invalid repository "Registry.Example.com/ML/ResNet": repository names are lowercase
  hint: write [HOST[:PORT]/]PATH with lowercase letters, digits and `.`, `_`, `-` separators, such as "registry.example.com/ml/resnet50"
recipe.toml:20:7: image.tag: unknown placeholder `{precison}` in tag template; did you mean `{precision}`?
  hint: tags may contain letters, digits, `_`, `.` and `-`, and placeholders {model} {version} {target} {sm} {gpu} {precision} {tensorrt} {cuda}
recipe.toml:21:8: image.base: invalid base image "ubuntu@sha256:abc": the digest must be sha256: and 64 lowercase hex digits
  hint: write a reference such as "nvcr.io/nvidia/tensorrt:24.12-py3@sha256:<64 hex digits>"
recipe.toml:22:8: image.user: images must not run as root (user 0)
  hint: remove `user` for the default (65532) or pick another non-zero id
recipe.toml:23:38: image.labels.bad: expected a string, found integer 1
recipe.toml:24:10: image.layout: unknown layout "separate"
  hint: use "combined" (one image per target) or "split" (also a runtime image and the model as an artifact to mount)
"#,
    );
    // tag_collide
    check(
        &format!(
            "{BASE}{}",
            r#"
[targets]
gpus = ["L4", "H100"]
precision = ["fp16"]

[image]
tag = "{version}-{precision}"
"#
        ),
        r#"
recipe.toml:15:7: image.tag: the tag template gives every target the same tag
  hint: include {target}, or {sm} (or {gpu}) and {precision}, such as "{version}-{target}"
"#,
    );
    // tag_syntax
    check(
        &format!(
            "{BASE}{}",
            r#"
[image]
tag = "v{version"
"#
        ),
        r#"
recipe.toml:11:7: image.tag: unclosed `{` in tag template "v{version"
  hint: tags may contain letters, digits, `_`, `.` and `-`, and placeholders {model} {version} {target} {sm} {gpu} {precision} {tensorrt} {cuda}
"#,
    );
    // tag_chars
    check(
        &format!(
            "{BASE}{}",
            r#"
[image]
tag = "-{version}"
"#
        ),
        r#"
recipe.toml:11:7: image.tag: a tag cannot start with `.` or `-`
  hint: tags may contain letters, digits, `_`, `.` and `-`, and placeholders {model} {version} {target} {sm} {gpu} {precision} {tensorrt} {cuda}
"#,
    );
    // tag_chars2
    check(
        &format!(
            "{BASE}{}",
            r#"
[image]
tag = "{version}/{target}"
"#
        ),
        r#"
recipe.toml:11:7: image.tag: character '/' is not allowed in a tag
  hint: tags may contain letters, digits, `_`, `.` and `-`, and placeholders {model} {version} {target} {sm} {gpu} {precision} {tensorrt} {cuda}
"#,
    );
}

#[test]
fn deploy() {
    // deploy_bad
    check(
        &format!(
            "{BASE}{}",
            r#"
[batching]
max_queue_delay_us = 60000

[deploy]
node_driver = 550.54
replicas = { min = 4, max = 2, mid = 3 }
resources = { cpu = "lots", memory = "4GB", gpu = 1 }
latency_slo_ms = 50
peak_qps = -3
drain_delay_s = 99999
"#
        ),
        r#"
recipe.toml:14:15: deploy.node_driver: expected a version string, found float 550.54
  hint: quote it: `node_driver = "550.54"` (as a number, 10.10 would read as 10.1)
recipe.toml:15:29: deploy.replicas.max: max (2) is smaller than min (4)
  hint: make `max` at least `min`
recipe.toml:15:32: deploy.replicas.mid: unknown key `mid` in [deploy.replicas]; did you mean `min`?
  hint: valid keys in [deploy.replicas]: min, max
recipe.toml:16:21: deploy.resources.cpu: expected a CPU quantity, found string "lots"
  hint: write cores (`cpu = 2`, `cpu = "1.5"`) or millicores (`cpu = "500m"`)
recipe.toml:16:38: deploy.resources.memory: expected a memory quantity, found string "4GB"
  hint: write a Kubernetes quantity such as "4Gi" or "512Mi"
recipe.toml:16:45: deploy.resources.gpu: unknown key `gpu` in [deploy.resources]; did you mean `cpu`?
  hint: valid keys in [deploy.resources]: cpu, memory
recipe.toml:17:18: deploy.latency_slo_ms: the p99 budget (50 ms) is used up by batching.max_queue_delay_us (60000 µs) alone
  hint: lower `max_queue_delay_us` well below the latency budget
recipe.toml:18:12: deploy.peak_qps: expected a positive number of requests per second, found integer -3
recipe.toml:19:17: deploy.drain_delay_s: expected an integer from 0 to 3600, found integer 99999
"#,
    );
    // replicas_int
    check(
        &format!(
            "{BASE}{}",
            r#"
[deploy]
replicas = 3
resources = { cpu = 1.5, memory = "512Mi" }
peak_qps = 12.5
"#
        ),
        r#"
ok
"#,
    );
}

#[test]
fn absurd_input_ends_in_diagnostics() {
    // Nesting deeper than the TOML parser recurses.
    let deep = format!("a = {}{}", "[".repeat(5000), "]".repeat(5000));
    check(
        &deep,
        r#"
recipe.toml:1:85: invalid TOML: cannot recurse further; max recursion depth met
  hint: see https://toml.io/en/v1.0.0 for the syntax
"#,
    );
    // A number with 50 digits, in a shape and a profile.
    let big = "9".repeat(50);
    check(
        &format!("{BASE}\n[model.inputs.ids]\ndatatype = \"int64\"\nshape = [-1, {big}]\n"),
        r#"
recipe.toml:12:14: model.inputs.ids.shape[1]: expected a dimension (-1 for dynamic, else a positive size), found integer 99999999999999999999…
  hint: the largest value allowed here is 2147483648
"#,
    );
    // Long strings are shortened in messages.
    let long = "x".repeat(10_000);
    let r = recipe::parse(
        &format!("{BASE}\n[targets]\ncpu = \"{long}\"\n"),
        Path::new("recipe.toml"),
    );
    let shown = recipe::render(r.unwrap_err().diagnostics());
    assert!(shown.len() < 200, "{shown}");
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(&p, text).unwrap();
    p
}

/// Load a recipe whose model path is `onnx`, in a fresh directory prepared by `setup`, and
/// return the rendering of its problems with the directory blanked as `DIR`.
fn load_with_model(onnx: &str, setup: impl FnOnce(&Path)) -> String {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    std::fs::create_dir_all(&dir).unwrap();
    setup(&dir);
    let src = BASE.replace("\"m.onnx\"", &format!("{onnx:?}"));
    let path = write(&dir, "recipe.toml", &src);
    match recipe::load(&path) {
        Ok(_) => "ok".into(),
        Err(e) => {
            assert!(e.is_bad_input());
            recipe::render(e.diagnostics())
                .replace(&dir.display().to_string(), "DIR")
                .replace(&tmp.path().display().to_string(), "TMP")
                .replace(
                    &std::fs::canonicalize(tmp.path())
                        .unwrap()
                        .display()
                        .to_string(),
                    "TMP",
                )
        }
    }
}

#[test]
fn model_files_must_be_regular_files_inside_the_recipe_directory() {
    let ok = load_with_model("models/m.onnx", |d| {
        write(d, "models/m.onnx", "onnx");
    });
    assert_eq!(ok, "ok");

    // A symbolic link that stays inside is fine.
    let ok = load_with_model("link.onnx", |d| {
        write(d, "real.onnx", "onnx");
        std::os::unix::fs::symlink("real.onnx", d.join("link.onnx")).unwrap();
    });
    assert_eq!(ok, "ok");

    // One that leads out of the recipe's directory is refused, even to an existing file.
    let got = load_with_model("escape.onnx", |d| {
        write(d.parent().unwrap(), "outside.onnx", "onnx");
        std::os::unix::fs::symlink("../outside.onnx", d.join("escape.onnx")).unwrap();
    });
    assert_eq!(
        got,
        "DIR/recipe.toml:4:8: model.onnx: model file DIR/escape.onnx resolves to TMP/outside.onnx, outside the recipe's directory
  hint: copy the file into the recipe's directory; symbolic links may not lead out of it, so that the recipe's directory is everything a build depends on"
    );

    // Devices are outside by construction (and not regular files).
    let got = load_with_model("null.onnx", |d| {
        std::os::unix::fs::symlink("/dev/null", d.join("null.onnx")).unwrap();
    });
    assert!(got.contains("resolves to /dev/null, outside"), "{got}");

    let got = load_with_model("dir.onnx", |d| {
        std::fs::create_dir(d.join("dir.onnx")).unwrap();
    });
    assert!(
        got.contains("model file DIR/dir.onnx is a directory, not a regular file"),
        "{got}"
    );

    let got = load_with_model("fifo.onnx", |d| {
        let status = std::process::Command::new("mkfifo")
            .arg(d.join("fifo.onnx"))
            .status()
            .unwrap();
        assert!(status.success());
    });
    assert!(
        got.contains("model file DIR/fifo.onnx is a FIFO, not a regular file"),
        "{got}"
    );

    let mut _listener = None;
    let got = load_with_model("sock.onnx", |d| {
        _listener = Some(std::os::unix::net::UnixListener::bind(d.join("sock.onnx")).unwrap());
    });
    assert!(
        got.contains("model file DIR/sock.onnx is a socket, not a regular file"),
        "{got}"
    );

    let got = load_with_model("dangling.onnx", |d| {
        std::os::unix::fs::symlink("nowhere.onnx", d.join("dangling.onnx")).unwrap();
    });
    assert!(
        got.contains("model file not found: DIR/dangling.onnx"),
        "{got}"
    );
}

#[test]
fn calibration_and_samples_are_checked_like_the_model() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    write(d, "m.onnx", "onnx");
    write(d, "calib/README.md", "samples go here");
    let src = format!(
        "{BASE}\n[targets]\ngpus = [\"L4\"]\nprecision = [\"int8\"]\n\n[int8]\ncalibration = \"calib\"\n\n[warmup]\nsamples = \"warmup.json\"\n"
    );
    let path = write(d, "recipe.toml", &src);
    let err = recipe::load(&path).unwrap_err();
    let got = recipe::render(err.diagnostics()).replace(&d.display().to_string(), "DIR");
    assert_eq!(
        got,
        "DIR/recipe.toml:18:11: warmup.samples: warm-up samples file not found: DIR/warmup.json
  hint: write the warm-up requests file at this path, or remove `samples` to warm up with synthetic data"
    );
    write(d, "warmup.json", "{}");
    let r = recipe::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        r.int8.unwrap().calibration.unwrap().value,
        PathBuf::from("calib")
    );
}

#[test]
fn unreadable_recipes() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();

    let e = recipe::load(&d.join("absent.toml")).unwrap_err();
    assert!(e.is_bad_input());
    assert!(e.to_string().starts_with("cannot read recipe "), "{e}");

    let e = recipe::load(d).unwrap_err();
    assert!(e.is_bad_input());
    assert!(
        e.to_string()
            .ends_with("is a directory, not a regular file"),
        "{e}"
    );

    let big = write(d, "big.toml", &"# padding\n".repeat(200_000));
    let e = recipe::load(&big).unwrap_err();
    assert!(e.is_bad_input());
    assert!(e.to_string().contains("is larger than"), "{e}");

    let bad = d.join("latin1.toml");
    std::fs::write(&bad, b"[model]\nname = \"caf\xe9\"\n").unwrap();
    let e = recipe::load(&bad).unwrap_err();
    assert!(e.is_bad_input());
    assert_eq!(
        recipe::render(e.diagnostics()).replace(&d.display().to_string(), "DIR"),
        "DIR/latin1.toml:2:12: the recipe is not valid UTF-8\n  hint: save the file as UTF-8"
    );
}

/// A small deterministic generator (SplitMix64), so the mutation test needs no dependency and
/// finds the same inputs on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// Bytes and values that tend to find edge cases in TOML and in the schema.
const INTERESTING_BYTES: &[u8] = b"[]{}\"'=,.-+_#\n\r\t\\ 0189e:/{}\xff\xc3";
const INTERESTING_VALUES: &[&str] = &[
    "-1",
    "0",
    "-0",
    "1e400",
    "nan",
    "-inf",
    "99999999999999999999999999999",
    "0x7fffffffffffffff",
    "-9223372036854775808",
    "\"\"",
    "\"x\"",
    "\"../x\"",
    "\"/etc/passwd\"",
    "\"sm_0\"",
    "\"{\"",
    "\"{target\"",
    "[]",
    "[[]]",
    "[-1, -1, -1, -1, -1, -1, -1, -1, -1]",
    "{}",
    "{ min = [], opt = [1], max = [0] }",
    "true",
    "1979-05-27T07:32:00Z",
    "\"é\u{0}\"",
];

fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = out.len();
        match rng.below(9) {
            // Flip, insert, delete a byte.
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 => {
                let b = *rng.pick(INTERESTING_BYTES);
                out.insert(rng.below(len + 1), b);
            }
            2 if len > 0 => {
                out.remove(rng.below(len));
            }
            // Truncate.
            3 => out.truncate(rng.below(len + 1)),
            // Line mutations: delete, duplicate, swap, replace a value.
            m => {
                let text = String::from_utf8_lossy(&out).into_owned();
                let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
                if lines.is_empty() {
                    continue;
                }
                let i = rng.below(lines.len());
                match m {
                    4 => {
                        lines.remove(i);
                    }
                    5 => {
                        let l = lines[i].clone();
                        let j = rng.below(lines.len() + 1);
                        lines.insert(j, l);
                    }
                    6 => {
                        let j = rng.below(lines.len());
                        lines.swap(i, j);
                    }
                    _ => {
                        if let Some((k, _)) = lines[i].split_once('=') {
                            lines[i] = format!("{k}= {}", rng.pick(INTERESTING_VALUES));
                        }
                    }
                }
                out = lines.join("\n").into_bytes();
            }
        }
    }
    out
}

/// What the fuzz target (`fuzz/fuzz_targets/recipe.rs`) checks, run on stable Rust in every
/// test run: thousands of byte and line mutations of the shipped recipes never panic, and every
/// problem is a well-formed diagnostic inside the file.
#[test]
fn mutated_recipes_never_panic() {
    let root = support::root();
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(root.join("recipes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    seeds.push(std::fs::read(root.join("examples/mlp/recipe.toml")).unwrap());
    seeds.sort();
    let file = Path::new("mutant.toml");
    let mut rng = Rng(0x1b5e_ed00);
    let (mut valid, mut invalid) = (0, 0);
    for round in 0..6_000 {
        let seed = &seeds[round % seeds.len()];
        let input = mutate(&mut rng, seed);
        let result = std::panic::catch_unwind(|| recipe::parse_bytes(&input, file));
        let Ok(result) = result else {
            panic!(
                "parse panicked on mutation {round}:\n{}",
                String::from_utf8_lossy(&input)
            );
        };
        match result {
            Ok(_) => valid += 1,
            Err(e) => {
                invalid += 1;
                let lines = input.split(|&b| b == b'\n').count() as u32;
                assert!(!e.diagnostics().is_empty(), "mutation {round}: {e}");
                for d in e.diagnostics() {
                    assert!(
                        d.line >= 1 && d.line <= lines && d.col >= 1,
                        "mutation {round}: position {}:{} outside the input ({lines} lines): {d}",
                        d.line,
                        d.col
                    );
                    assert!(
                        !d.message.is_empty() && !d.message.ends_with('.'),
                        "mutation {round}: {d}"
                    );
                }
                // Same input, same report: nothing depends on hashing or timing.
                let again = recipe::parse_bytes(&input, file).unwrap_err();
                assert_eq!(e.diagnostics(), again.diagnostics());
            }
        }
    }
    // Both outcomes must be exercised, or the mutations are too weak or too strong to test
    // anything.
    assert!(
        valid > 300 && invalid > 3_000,
        "{valid} valid, {invalid} invalid"
    );
}

/// The committed stand-in models are exactly what `make_models.py` generates (deterministic),
/// each under 200 KB, and declare the inputs and outputs their recipes say: names, datatypes
/// and shapes, with every dynamic dimension of the recipe symbolic in the ONNX graph. Uses the
/// `onnx` Python package as an independent reader.
#[test]
fn py_stand_in_models_match_make_models_and_their_recipes() {
    let python = support::python();
    if !support::have_tool(&python.display().to_string(), "py_stand_in_models") {
        return;
    }
    let root = support::root();
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(&python)
        .arg(root.join("recipes/models/make_models.py"))
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "make_models.py failed: {}",
        support::stderr(&out)
    );

    const READ: &str = r#"
import json, sys, onnx
m = onnx.load(sys.argv[1])
name = {v: k.lower() for k, v in onnx.TensorProto.DataType.items()}
def sig(vs):
    return {v.name: [name[v.type.tensor_type.elem_type],
                     [d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim]]
            for v in vs}
init = {i.name for i in m.graph.initializer}
print(json.dumps({"inputs": sig([v for v in m.graph.input if v.name not in init]), "outputs": sig(m.graph.output)}))
"#;
    let onnx_name = |d: DataType| match d {
        DataType::F32 => "float",
        DataType::F16 => "float16",
        DataType::F64 => "double",
        DataType::BF16 => "bfloat16",
        DataType::Bytes => "string",
        other => other.recipe_name(),
    };
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("recipes")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let r = recipe::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let model = r.model_path();
        let committed = std::fs::read(&model).unwrap();
        assert!(committed.len() < 200_000, "{}", model.display());
        let fresh = std::fs::read(tmp.path().join(model.file_name().unwrap())).unwrap();
        assert!(
            committed == fresh,
            "{} differs from what make_models.py generates",
            model.display()
        );
        let out = std::process::Command::new(&python)
            .args(["-c", READ])
            .arg(&model)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", support::stderr(&out));
        let sig: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        for (kind, tensors) in [("inputs", &r.model.inputs), ("outputs", &r.model.outputs)] {
            let declared = sig[kind].as_object().unwrap();
            assert_eq!(declared.len(), tensors.len(), "{} {kind}", path.display());
            for t in tensors.iter() {
                let want = serde_json::json!([onnx_name(t.datatype), t.shape]);
                assert_eq!(
                    declared.get(&t.name),
                    Some(&want),
                    "{} {}",
                    path.display(),
                    t.name
                );
            }
        }
        checked += 1;
    }
    assert_eq!(checked, 5);
}

/// The acceptance case through the CLI: `infer-build check` exits 2 and names all three
/// problems with file:line:col.
#[test]
fn check_exits_2_naming_wrong_type_unknown_key_and_missing_model() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "recipe.toml",
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
    );
    let out = support::run_in(dir.path(), &["check", "recipe.toml"]);
    let err = support::stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    for line in [
        "recipe.toml:4:8: model.onnx: model file not found: missing.onnx",
        "recipe.toml:11:18: batching.max_batch_size: expected a positive integer up to 4096, found string \"eight\"",
        "recipe.toml:12:1: batching.max_batchsize: unknown key `max_batchsize` in [batching]; did you mean `max_batch_size`?",
    ] {
        assert!(err.lines().any(|l| l == line), "missing {line:?} in:\n{err}");
    }
}

/// A WordPiece `tokenizer.json` of a few tokens whose largest id is `big_id` (the added special
/// token `[BIG]`, in the vocabulary at that id as BERT's specials are), looking up words of at
/// most `max_chars` characters.
fn wordpiece(big_id: u32, max_chars: u64) -> serde_json::Value {
    serde_json::json!({
        "version": "1.0",
        "added_tokens": [{
            "id": big_id, "content": "[BIG]", "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": {"type": "BertNormalizer", "clean_text": true,
            "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {
            "type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
            "max_input_chars_per_word": max_chars,
            "vocab": {"[UNK]": 0, "[CLS]": 1, "[SEP]": 2, "hello": 3, "world": 4, "[BIG]": big_id}
        }
    })
}

/// A text recipe over the MiniLM stand-in (`recipes/models/minilm.onnx`: `input_ids` gathered
/// from 30522 rows) with `tokenizer` as its `tokenizer.json` (`text.tokenizer` is at
/// `recipe.toml:21:13`), in a fresh directory.
fn text_recipe(tokenizer: &serde_json::Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        support::root().join("recipes/models/minilm.onnx"),
        dir.path().join("m.onnx"),
    )
    .unwrap();
    write(
        dir.path(),
        "recipe.toml",
        &format!(
            "{TEXT_BASE}\n[model.outputs.sentence_embedding]\ndatatype = \"fp32\"\nshape = [-1, 384]\n\n[text]\ntokenizer = \"tokenizer.json\"\n"
        ),
    );
    write(dir.path(), "tokenizer.json", &tokenizer.to_string());
    dir
}

/// What `check` and `build` of [`text_recipe`] say: each command's exit code and the line
/// naming `text.tokenizer`, or its whole stderr when none does.
fn tokenizer_refusals(tokenizer: &serde_json::Value) -> [(Option<i32>, String); 2] {
    let dir = text_recipe(tokenizer);
    let line = |o: std::process::Output| {
        let err = support::stderr(&o);
        let named = err.lines().find(|l| l.contains("text.tokenizer"));
        (o.status.code(), named.map_or(err.clone(), str::to_string))
    };
    let check = support::run_in(dir.path(), &["check", "recipe.toml"]);
    let build = support::infer_build()
        .current_dir(dir.path())
        .args(["build", "recipe.toml", "--out", "out"])
        .env("INFER_BUILD_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(!dir.path().join("out/index.json").exists());
    [line(check), line(build)]
}

/// A tokenizer whose token count fits the model's embedding table but whose largest id does
/// not (an added token with a large id) would hand the engine an id past the table: `check`
/// and `build` both refuse it, at `text.tokenizer` in the same words, naming the id, its
/// token, the input and the table's rows. The same tokenizer with the token inside the table
/// is accepted.
#[test]
fn a_tokenizer_whose_largest_id_is_past_the_embedding_table_is_refused_by_check_and_build() {
    let want = "tokenizer.json: the tokenizer's largest id 40000 (token \"[BIG]\") is past the model's embedding table for \"input_ids\" of 30522 rows";
    let [check, build] = tokenizer_refusals(&wordpiece(40000, 100));
    for (command, (code, line)) in [("check", &check), ("build", &build)] {
        assert_eq!(*code, Some(2), "{command}: {line}");
        assert!(
            line.contains("recipe.toml:21:13: text.tokenizer: ") && line.ends_with(want),
            "{command}: {line}"
        );
    }
    assert_eq!(check.1, build.1);
    let fits = text_recipe(&wordpiece(30521, 100));
    let o = support::run_in(fits.path(), &["check", "recipe.toml"]);
    assert_eq!(o.status.code(), Some(0), "{}", support::stderr(&o));
}

/// A WordPiece tokenizer that looks up words of any length (greedy longest-match costs the
/// cube of a word's length: one long word holds a core for minutes) is refused by `check` and
/// `build` alike, at `text.tokenizer`, naming the key and the limit.
#[test]
fn a_wordpiece_tokenizer_of_unbounded_words_is_refused_by_check_and_build() {
    let [check, build] = tokenizer_refusals(&wordpiece(5, 1_000_000_000_000));
    for (command, (code, line)) in [("check", &check), ("build", &build)] {
        assert_eq!(*code, Some(2), "{command}: {line}");
        assert!(
            line.contains("recipe.toml:21:13: text.tokenizer: ")
                && line.contains(
                    "tokenizer.json: model.max_input_chars_per_word 1000000000000 is more than 200"
                )
                && line.ends_with("(BERT's tokenizers use 100)"),
            "{command}: {line}"
        );
    }
    assert_eq!(check.1, build.1);
}

/// `check` accepts every shipped recipe and the example.
#[test]
fn check_accepts_the_shipped_recipes() {
    let mut recipes: Vec<String> = std::fs::read_dir(support::root().join("recipes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .map(|p| p.display().to_string())
        .collect();
    recipes.push("examples/mlp/recipe.toml".into());
    for r in recipes {
        let out = support::run(&["check", &r]);
        assert_eq!(out.status.code(), Some(0), "{r}: {}", support::stderr(&out));
    }
}

#[test]
fn calibration_method_and_accuracy_limits() {
    let targets = "\n[targets]\ngpus = [\"L4\"]\nprecision = [\"int8\"]\n";
    let r = parse_ok(&format!(
        "{BASE}{targets}[int8]\ncalibration = \"c/\"\nmethod = \"entropy\"\n[accuracy]\ndata = \"eval/\"\n[accuracy.int8]\nmin_top1 = 0.9\nmax_abs = 1\n"
    ));
    assert_eq!(
        r.int8.as_ref().unwrap().method.as_ref().unwrap().value,
        "entropy"
    );
    assert_eq!(r.accuracy.data.as_ref().unwrap().value, Path::new("eval/"));
    let l = r.accuracy.limits[&recipe::Precision::Int8];
    assert_eq!(
        (l.min_top1, l.max_abs, l.max_rel),
        (Some(0.9), Some(1.0), None)
    );
    assert!(parse_ok(BASE).accuracy.limits.is_empty());
    check(
        &format!("{BASE}{targets}[int8]\ncalibration = \"c/\"\nmethod = \"kl\"\n[accuracy.fp16]\nmin_top1 = 2\nmax_rel = \"a\"\nmax = 1\n"),
        r#"recipe.toml:15:10: int8.method: unknown calibration method `kl`
  hint: use one of minmax, entropy, percentile
recipe.toml:17:12: accuracy.fp16.min_top1: expected a fraction from 0 to 1, found integer 2
recipe.toml:18:11: accuracy.fp16.max_rel: expected a non-negative number, found string "a"
recipe.toml:19:1: accuracy.fp16.max: unknown key `max` in [accuracy.fp16]
  hint: valid keys in [accuracy.fp16]: max_abs, max_rel, min_top1"#,
    );
}

#[test]
fn fp8_calibration_table() {
    let targets = "\n[targets]\ngpus = [\"L4\"]\nprecision = [\"fp8\"]\n";
    let r = parse_ok(&format!(
        "{BASE}{targets}[fp8]\ncalibration = \"c/\"\nmethod = \"minmax\"\n[accuracy.fp8]\nmin_top1 = 0.9\n"
    ));
    let f = r.fp8.as_ref().unwrap();
    assert_eq!(f.calibration.as_ref().unwrap().value, Path::new("c/"));
    assert_eq!(f.method.as_ref().unwrap().value, "minmax");
    assert_eq!(
        r.accuracy.limits[&recipe::Precision::Fp8].min_top1,
        Some(0.9)
    );
    let errors = |src: String| match recipe::parse(&src, Path::new("recipe.toml")) {
        Ok(_) => panic!("accepted:\n{src}"),
        Err(e) => recipe::render(e.diagnostics()),
    };
    let e = errors(format!("{BASE}{targets}"));
    assert!(e.contains("the recipe has no [fp8] table"), "{e}");
    let e = errors(format!("{BASE}{targets}[fp8]\nmethod = \"entropy\"\n"));
    assert!(
        e.contains("[fp8] needs `calibration`")
            && e.contains(
                "the builtin converter (engine.convert) has no fp8 calibration method `entropy`"
            )
            && e.contains("hint: use one of minmax, percentile"),
        "{e}"
    );
}

#[test]
fn engine_convert_picks_the_converter_and_its_calibration_methods() {
    let targets = "\n[targets]\ngpus = [\"L4\"]\nprecision = [\"int8\", \"fp8\"]\n";
    let tables = "[int8]\ncalibration = \"c/\"\n[fp8]\ncalibration = \"c/\"\n";
    let r = parse_ok(&format!("{BASE}{targets}{tables}"));
    assert_eq!(r.engine.convert.value, recipe::ConvertTool::Builtin);
    let r = parse_ok(&format!(
        "{BASE}{targets}{tables}[engine]\nconvert = \"modelopt\"\n"
    ));
    assert_eq!(r.engine.convert.value, recipe::ConvertTool::ModelOpt);
    // ModelOpt's `entropy` is fine for FP8 there; its missing percentile is refused at its line.
    let r = parse_ok(&format!(
        "{BASE}{targets}[int8]\ncalibration = \"c/\"\nmethod = \"minmax\"\n[fp8]\ncalibration = \"c/\"\nmethod = \"entropy\"\n[engine]\nconvert = \"modelopt\"\n"
    ));
    assert_eq!(r.fp8.unwrap().method.unwrap().value, "entropy");
    check(
        &format!("{BASE}{targets}[int8]\ncalibration = \"c/\"\nmethod = \"percentile\"\n[fp8]\ncalibration = \"c/\"\n[engine]\nconvert = \"torch\"\n"),
        r#"recipe.toml:19:11: engine.convert: unknown precision converter "torch"
  hint: converters: "builtin" (the pinned environment infer-build creates, no torch), "modelopt" (NVIDIA Model Optimizer, from a Python with it and torch)"#,
    );
    check(
        &format!("{BASE}{targets}[int8]\ncalibration = \"c/\"\nmethod = \"percentile\"\n[fp8]\ncalibration = \"c/\"\n[engine]\nconvert = \"modelopt\"\n"),
        r#"recipe.toml:15:10: int8.method: the modelopt converter (engine.convert) has no calibration method `percentile`
  hint: use one of minmax, entropy"#,
    );
}
