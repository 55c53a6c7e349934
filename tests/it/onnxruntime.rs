//! The ONNX Runtime backend of `infer-serve` against a real `libonnxruntime`: the library of the
//! pinned onnxruntime wheel (`real_models.py fetch-ort`, cached next to the real models and
//! verified by sha256; the release the `ort` crate targets) serves PaddleOCR's text detector
//! (variable height and width) and text recogniser (variable width, which tract cannot
//! translate), several shapes in flight at once through tritonclient, each answer compared
//! with onnxruntime in Python on the same input; and the three OCR models (detector, direction
//! classifier, recogniser) as one bundle, one server, all checked at once. A missing, foreign or
//! garbage library, and an engine recorded for another ONNX Runtime minor, stop the server with
//! exit 1 and a message that says which.

use super::support::{self, python, stderr, stdout};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub(super) const DET: &str = r#"
[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, -1, -1]
profile = { min = [3, 32, 32], opt = [3, 96, 96], max = [3, 256, 256] }

[[outputs]]
name = "sigmoid_0.tmp_0"
datatype = "FP32"
dims = [-1, 1, -1, -1]
"#;

pub(super) const REC: &str = r#"
[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, 48, -1]
profile = { min = [3, 48, 32], opt = [3, 48, 160], max = [3, 48, 320] }

[[outputs]]
name = "softmax_11.tmp_0"
datatype = "FP32"
dims = [-1, -1, 6625]
"#;

const CLS: &str = r#"
[[inputs]]
name = "x"
datatype = "FP32"
dims = [-1, 3, 48, 192]

[[outputs]]
name = "save_infer_model/scale_0.tmp_1"
datatype = "FP32"
dims = [-1, 2]
"#;

use super::real_models::{cache_dir, script, spawn_check};

/// A `runtime.toml` in `dir` serving `onnx` with ONNX Runtime from `library`.
fn config(dir: &Path, name: &str, tensors: &str, onnx: &Path, library: &Path) -> PathBuf {
    let text = format!(
        "[model]\nname = \"{name}\"\n{tensors}\n[batching]\nmax_batch_size = 4\nmax_queue_delay_us = 20000\n\n\
         [engine]\nkind = \"onnxruntime\"\npath = \"{}\"\nlibrary = \"{}\"\nthreads = 1\n\n\
         [server]\nhost = \"127.0.0.1\"\nport = 0\n",
        onnx.display(),
        library.display()
    );
    let path = dir.join(format!("{name}.runtime.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Starts infer-serve on `config` and waits for `ready`; returns the child, the address and
/// the log lines seen.
pub(super) fn serve(config: &Path) -> (std::process::Child, String, Vec<serde_json::Value>) {
    serve_grpc(config, 0)
}

/// [`serve`] with gRPC on `grpc_port` (0: off).
fn serve_grpc(
    config: &Path,
    grpc_port: u16,
) -> (std::process::Child, String, Vec<serde_json::Value>) {
    let mut child = Command::new(support::serve_test_binary())
        .arg("--config")
        .arg(config)
        .env("INFER_GRPC_PORT", grpc_port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut addr, mut seen, start) = (String::new(), Vec::new(), Instant::now());
    for line in lines.map_while(Result::ok) {
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        if v["msg"] == "listening" {
            addr = v["addr"].as_str().unwrap_or_default().to_owned();
        }
        let ready = v["msg"] == "ready";
        assert!(v["level"] != "error", "infer-serve failed to start: {line}");
        seen.push(v);
        if ready {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "not ready");
    }
    assert!(!addr.is_empty(), "infer-serve never became ready");
    (child, addr, seen)
}

/// GET `path` from `addr`: the JSON body.
pub(super) fn get(addr: &str, path: &str) -> serde_json::Value {
    let (status, body) = support::http_request(addr, "GET", path, "");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {status} {e}: {body}"))
}

/// Runs infer-serve on `config` to its exit; returns the exit code and what it logged.
pub(super) fn run_to_exit(config: &Path) -> (Option<i32>, String) {
    let o = Command::new(support::serve_test_binary())
        .arg("--config")
        .arg(config)
        .env("INFER_GRPC_PORT", "0")
        .output()
        .unwrap();
    (o.status.code(), format!("{}{}", stdout(&o), stderr(&o)))
}

fn fetch(py: &Path) -> (serde_json::Value, PathBuf, String) {
    let o = Command::new(py)
        .arg(script())
        .arg("fetch")
        .arg(cache_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "fetching the models: {}", stderr(&o));
    let models: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let o = Command::new(py)
        .arg(script())
        .arg("fetch-ort")
        .arg(cache_dir())
        .output()
        .unwrap();
    assert!(o.status.success(), "fetching onnxruntime: {}", stderr(&o));
    let ort: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let lib = PathBuf::from(ort["library"].as_str().unwrap());
    (models, lib, ort["version"].as_str().unwrap().to_owned())
}

pub(super) fn have_python(test: &str) -> Option<PathBuf> {
    let py = python();
    let have = Command::new(&py)
        .args(["-c", "import tritonclient.http, onnxruntime, numpy"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !have || std::env::consts::ARCH != "x86_64" {
        eprintln!(
            "skipping {test}: needs x86_64 and {} with tritonclient, onnxruntime and numpy",
            py.display()
        );
        return None;
    }
    Some(py)
}

#[test]
fn py_onnxruntime_serves_real_models_like_onnxruntime_in_python() {
    let Some(py) = have_python("py_onnxruntime_serves_real_models_like_onnxruntime_in_python")
    else {
        return;
    };
    let (models, lib, version) = fetch(&py);
    let dir = tempfile::tempdir().unwrap();
    serve_and_check(
        &py,
        &models,
        ("onnxruntime", "onnxruntime_onnx", &version),
        |name, tensors, onnx| config(dir.path(), name, tensors, onnx, &lib),
    );

    // An engine recorded for another ONNX Runtime minor is refused before anything loads.
    let onnx = PathBuf::from(models["ocr-det"].as_str().unwrap());
    let cfg = config(dir.path(), "ocr-det", DET, &onnx, &lib);
    let meta = cpu_engine_meta(
        infer_spec::engine::EngineKind::Onnxruntime,
        infer_spec::engine::CpuMeta {
            onnxruntime: Some("1.30.0".parse().unwrap()),
            ..cpu_meta()
        },
    );
    refused_with_metadata(
        &cfg,
        &meta,
        &format!("ONNX Runtime {version} differs from 1.30.0 in major.minor"),
    );
}

/// PaddleOCR's detector and recogniser, each served with the `runtime.toml` `config` writes
/// (for a model name, its tensors and its ONNX): the start-up log, the metadata and the config
/// name `engine`'s library at its version (`platform` in the metadata), and every shape sent
/// at once through tritonclient matches onnxruntime in Python.
pub(super) fn serve_and_check(
    py: &Path,
    models: &serde_json::Value,
    (engine, platform, version): (&str, &str, &str),
    config: impl Fn(&str, &str, &Path) -> PathBuf,
) {
    let cases: [(&str, &str, &[&[usize]]); 2] = [
        (
            "ocr-det",
            DET,
            &[
                &[1, 3, 64, 96],
                &[2, 3, 96, 64],
                &[1, 3, 96, 96],
                &[1, 3, 64, 96],
            ],
        ),
        (
            "ocr-rec",
            REC,
            &[
                &[1, 3, 48, 160],
                &[2, 3, 48, 320],
                &[1, 3, 48, 96],
                &[3, 3, 48, 160],
            ],
        ),
    ];
    for (name, tensors, shapes) in cases {
        let onnx = PathBuf::from(models[name].as_str().unwrap());
        let (mut child, addr, log) = serve(&config(name, tensors, &onnx));
        assert!(
            log.iter()
                .any(|v| v["msg"] == "node" && v[engine] == version),
            "{log:?}"
        );
        let meta = get(&addr, &format!("/v2/models/{name}"));
        assert_eq!(meta["platform"], platform, "{meta}");
        let config = get(&addr, &format!("/v2/models/{name}/config"));
        assert_eq!(config["backend"], engine, "{config}");
        assert_eq!(
            config["parameters"][engine]["string_value"], version,
            "{config}"
        );
        let cases: Vec<serde_json::Value> = shapes
            .iter()
            .map(|s| serde_json::json!({"input": "x", "shape": s}))
            .collect();
        let o = Command::new(py)
            .arg(script())
            .arg("check")
            .arg(&addr)
            .arg(name)
            .arg(&onnx)
            .arg(serde_json::to_string(&cases).unwrap())
            .output()
            .unwrap();
        let _ = child.kill();
        let _ = child.wait();
        assert!(o.status.success(), "{name}: {}\n{}", stdout(&o), stderr(&o));
        eprintln!("{}", stdout(&o).trim());
    }
}

/// A CPU engine's metadata in the CPU section `cpu` (the rest stand-ins).
pub(super) fn cpu_engine_meta(
    kind: infer_spec::engine::EngineKind,
    cpu: infer_spec::engine::CpuMeta,
) -> infer_spec::engine::EngineMeta {
    infer_spec::engine::EngineMeta {
        schema: infer_spec::engine::META_SCHEMA,
        kind,
        format: infer_spec::engine::EngineFormat::Onnx,
        target: "cpu-fp32".into(),
        precision: infer_spec::engine::Precision::Fp32,
        shape_profile: vec![],
        onnx_digest: format!("sha256:{}", "1".repeat(64)),
        engine_digest: format!("sha256:{}", "2".repeat(64)),
        engine_size: 1,
        cache_key: "k".into(),
        builder_version: "0.1.0".into(),
        gpu: None,
        cpu: Some(cpu),
        conversion: None,
    }
}

/// A CPU section of this machine's architecture and tract, naming no library.
pub(super) fn cpu_meta() -> infer_spec::engine::CpuMeta {
    infer_spec::engine::CpuMeta {
        arch: std::env::consts::ARCH.into(),
        tract: "0.23.9".parse().unwrap(),
        onnxruntime: None,
        openvino: None,
        folded_by: None,
        threads: None,
        share: None,
        required_features: vec![],
        isa: None,
        gate: None,
    }
}

/// The server on `cfg` given `meta` as its engine metadata exits 1 saying `want`.
pub(super) fn refused_with_metadata(cfg: &Path, meta: &infer_spec::engine::EngineMeta, want: &str) {
    let path = cfg.with_extension("engine.json");
    std::fs::write(&path, meta.to_canonical_json()).unwrap();
    let text = std::fs::read_to_string(cfg).unwrap().replace(
        "threads = 1\n",
        &format!("threads = 1\nmetadata = \"{}\"\n", path.display()),
    );
    std::fs::write(cfg, text).unwrap();
    let (code, out) = run_to_exit(cfg);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains(want), "{want:?} not in: {out}");
}

/// A server started by a test, killed when dropped (also when the test fails first).
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// POST `body` to `path` on `addr`: the status and the body.
fn post(addr: &str, path: &str, body: &str) -> (u16, String) {
    support::http_request(addr, "POST", path, body)
}

/// PaddleOCR's three models (detector, direction classifier, recogniser) as one bundle: one
/// server, each model in its own directory with its own runtime.toml and batcher, the CPUs
/// divided between them. All three are checked against onnxruntime in Python at once
/// (tritonclient HTTP and gRPC, several shapes per model in flight together); a bad request to
/// one harms none; the repository index lists them; SIGTERM drains all and exits 0.
#[test]
fn py_a_bundle_serves_the_three_ocr_models_together_like_onnxruntime() {
    let test = "py_a_bundle_serves_the_three_ocr_models_together_like_onnxruntime";
    let Some(py) = have_python(test) else {
        return;
    };
    let (models, lib, _) = fetch(&py);
    let dir = tempfile::tempdir().unwrap();
    let ocr: [(&str, &str, &[&[usize]]); 3] = [
        (
            "ocr-det",
            DET,
            &[&[1, 3, 64, 96], &[2, 3, 96, 64], &[1, 3, 96, 96]],
        ),
        ("ocr-cls", CLS, &[&[1, 3, 48, 192], &[3, 3, 48, 192]]),
        (
            "ocr-rec",
            REC,
            &[&[1, 3, 48, 160], &[2, 3, 48, 320], &[1, 3, 48, 96]],
        ),
    ];
    let mut bundle = "[server]\nhost = \"127.0.0.1\"\nport = 0\ndrain_delay_s = 0\n".to_owned();
    for (name, tensors, _) in &ocr {
        let model_dir = dir.path().join(name);
        std::fs::create_dir(&model_dir).unwrap();
        std::fs::copy(
            models[*name].as_str().unwrap(),
            model_dir.join("model.onnx"),
        )
        .unwrap();
        // Paths relative to the model's directory; no engine.threads: the bundle divides the
        // CPUs between the models.
        let text = format!(
            "[model]\nname = \"{name}\"\n{tensors}\n[batching]\nmax_batch_size = 4\nmax_queue_delay_us = 20000\n\n\
             [engine]\nkind = \"onnxruntime\"\npath = \"model.onnx\"\nlibrary = \"{}\"\n",
            lib.display()
        );
        std::fs::write(model_dir.join("runtime.toml"), text).unwrap();
        bundle.push_str(&format!("\n[[models]]\npath = \"{name}\"\n"));
    }
    let cfg = dir.path().join("runtime.toml");
    std::fs::write(&cfg, bundle).unwrap();
    let (child, addr, log) = serve_grpc(&cfg, support::free_port());
    // Killed when the test fails before its SIGTERM.
    let mut child = Running(child);
    let listening = log.iter().find(|v| v["msg"] == "listening").unwrap();
    let grpc = listening["grpc_addr"].as_str().unwrap().to_owned();
    assert_eq!(
        listening["models"],
        serde_json::json!(["ocr-det", "ocr-cls", "ocr-rec"])
    );
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = (cpus / 3).max(1);
    let nodes: Vec<_> = log.iter().filter(|v| v["msg"] == "node").collect();
    assert_eq!(nodes.len(), 3, "{log:?}");
    assert!(
        nodes
            .iter()
            .all(|v| v["threads_per_instance"] == share && v["threads_from"] == "cpus / instances"),
        "each model computes with its share of {cpus} CPUs ({share}): {nodes:?}"
    );
    let (status, index) = post(&addr, "/v2/repository/index", "");
    assert_eq!(status, 200, "{index}");
    let index: serde_json::Value = serde_json::from_str(&index).unwrap();
    let states: Vec<_> = index
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{} {}",
                m["name"].as_str().unwrap(),
                m["state"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(states, ["ocr-cls READY", "ocr-det READY", "ocr-rec READY"]);

    // A request of the recogniser's shape sent to the classifier: 400, naming the model's
    // bounds; the models go on serving.
    let bad = r#"{"inputs":[{"name":"x","shape":[1,3,48,160],"datatype":"FP32","data":[0]}]}"#;
    let (status, body) = post(&addr, "/v2/models/ocr-cls/infer", bad);
    assert_eq!(status, 400, "{body}");

    // Every model checked against onnxruntime at the same time, over HTTP and gRPC.
    let checks: Vec<_> = ocr
        .iter()
        .map(|(name, _, shapes)| {
            let onnx = dir.path().join(name).join("model.onnx");
            let child = spawn_check(&py, &addr, &grpc, name, &onnx, "x", shapes);
            (*name, child)
        })
        .collect();
    for (name, c) in checks {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{name}: {}\n{}", stdout(&o), stderr(&o));
        eprintln!("{name}: {}", stdout(&o).trim());
    }
    let (status, metrics) = support::http_request(&addr, "GET", "/metrics", "");
    assert_eq!(status, 200, "{metrics}");
    for (name, _, _) in &ocr {
        assert!(
            metrics.contains(&format!(
                "nv_inference_exec_count{{model=\"{name}\",version=\"1\"}}"
            )),
            "{name}: {metrics}"
        );
    }
    assert_eq!(
        metrics.matches("# TYPE nv_inference_exec_count ").count(),
        1
    );

    // SIGTERM drains every model, then exit 0.
    let ok = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    let end = Instant::now() + Duration::from_secs(30);
    let code = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break st.code();
        }
        assert!(Instant::now() < end, "no exit after SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0));
}

/// A text model's runtime.toml body (after `[model]`): `tokens` INT64 `[-1, -1]` inputs
/// sharing the sequence dimension (up to `max`), then `rest` (outputs, `[text]`).
fn text_tables(tokens: &[&str], max: u32, rest: &str) -> String {
    let mut t = String::new();
    for name in tokens {
        t.push_str(&format!(
            "[[inputs]]\nname = \"{name}\"\ndatatype = \"INT64\"\ndims = [-1, -1]\nprofile = {{ min = [1], opt = [16], max = [{max}] }}\ndim_names = [\"sequence\"]\n\n"
        ));
    }
    t + rest
}

/// Two real text models (all-MiniLM-L6-v2 and WordLlama) in one bundle: OpenAI's
/// `/v1/embeddings` routes by `model` and each answer equals the one-model server's for the
/// same texts (whose answers `real_models.rs` checks against the reference pipeline), long texts
/// going through the tokenizer workers both models share; TEI's `/embed`, which names no model,
/// says to use `/v1/embeddings` with `model`.
#[test]
fn py_a_bundle_of_two_text_models_answers_as_each_alone() {
    let test = "py_a_bundle_of_two_text_models_answers_as_each_alone";
    let Some(py) = have_python(test) else {
        return;
    };
    let (models, lib, _) = fetch(&py);
    let dir = tempfile::tempdir().unwrap();
    let minilm = text_tables(
        &["input_ids", "attention_mask", "token_type_ids"],
        256,
        "[[outputs]]\nname = \"last_hidden_state\"\ndatatype = \"FP32\"\ndims = [-1, -1, 384]\n\n\
         [text]\ntokenizer = \"tokenizer.json\"\nmax_length = 256\ninput_ids = \"input_ids\"\nattention_mask = \"attention_mask\"\n\
         token_type_ids = \"token_type_ids\"\noutput = \"last_hidden_state\"\npooling = \"mean\"\nnormalize = true\n",
    );
    let wordllama = text_tables(
        &["input_ids", "attention_mask"],
        128,
        "[[outputs]]\nname = \"embedding\"\ndatatype = \"FP32\"\ndims = [-1, 256]\n\n\
         [text]\ntokenizer = \"tokenizer.json\"\nmax_length = 128\nspecial_tokens = false\ninput_ids = \"input_ids\"\n\
         attention_mask = \"attention_mask\"\noutput = \"embedding\"\npooling = \"none\"\nnormalize = false\n",
    );
    let mut bundle = "[server]\nhost = \"127.0.0.1\"\nport = 0\ndrain_delay_s = 0\n".to_owned();
    for (name, tables) in [("minilm", &minilm), ("wordllama", &wordllama)] {
        let onnx = PathBuf::from(models[name].as_str().unwrap());
        let model_dir = dir.path().join(name);
        std::fs::create_dir(&model_dir).unwrap();
        std::fs::copy(&onnx, model_dir.join("model.onnx")).unwrap();
        std::fs::copy(
            onnx.with_file_name(format!("{name}.tokenizer.json")),
            model_dir.join("tokenizer.json"),
        )
        .unwrap();
        let text = format!(
            "[model]\nname = \"{name}\"\n{tables}\n[batching]\nmax_batch_size = 8\n\n\
             [engine]\nkind = \"onnxruntime\"\npath = \"model.onnx\"\nlibrary = \"{}\"\nthreads = 1\n\n\
             [server]\nhost = \"127.0.0.1\"\nport = 0\ndrain_delay_s = 0\n",
            lib.display()
        );
        std::fs::write(model_dir.join("runtime.toml"), text).unwrap();
        bundle.push_str(&format!("\n[[models]]\npath = \"{name}\"\n"));
    }
    std::fs::write(dir.path().join("runtime.toml"), bundle).unwrap();
    // Over the runtime's inline bound (2 KiB): tokenized on the shared workers.
    let long = "Containers carry the runtime and the engine, one image per GPU. ".repeat(40);
    let texts = serde_json::json!(["a dog runs in the park", "tax law", long]);
    let embed = |addr: &str, model: &str| -> serde_json::Value {
        let body = serde_json::json!({ "model": model, "input": texts }).to_string();
        let (status, reply) = post(addr, "/v1/embeddings", &body);
        assert_eq!(status, 200, "{model}: {reply}");
        let v: serde_json::Value = serde_json::from_str(&reply).unwrap();
        v["data"].clone()
    };

    let (child, addr, _) = serve(&dir.path().join("runtime.toml"));
    let bundled = Running(child);
    let answers: Vec<_> = ["minilm", "wordllama"]
        .iter()
        .map(|m| embed(&addr, m))
        .collect();
    let (status, reply) = post(&addr, "/embed", r#"{"inputs":"a dog"}"#);
    assert_eq!(status, 400, "{reply}");
    assert!(reply.contains("use /v1/embeddings with"), "{reply}");
    let (status, reply) = post(&addr, "/v1/embeddings", r#"{"model":"ocr","input":"a"}"#);
    assert_eq!(status, 404, "{reply}");
    assert!(
        reply.contains(r#"serves [\"minilm\", \"wordllama\"]"#),
        "{reply}"
    );
    drop(bundled);

    for (name, bundled) in ["minilm", "wordllama"].iter().zip(&answers) {
        let (child, addr, _) = serve(&dir.path().join(name).join("runtime.toml"));
        let _alone = Running(child);
        let alone = embed(&addr, name);
        assert_eq!(alone.as_array().unwrap().len(), 3);
        // The same vectors, to float rounding: the texts of different lengths may share a padded
        // batch in one server and not in the other, and ONNX Runtime's sums then round apart in
        // the last bit.
        let vectors = |v: &serde_json::Value| -> Vec<Vec<f64>> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|e| {
                    e["embedding"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap())
                        .collect()
                })
                .collect()
        };
        let (a, b) = (vectors(&alone), vectors(bundled));
        let worst = a
            .iter()
            .zip(&b)
            .flat_map(|(x, y)| {
                assert_eq!(x.len(), y.len(), "{name}");
                x.iter().zip(y).map(|(p, q)| (p - q).abs())
            })
            .fold(0.0, f64::max);
        assert!(
            a.len() == b.len() && worst <= 1e-5,
            "{name}: the bundle's answer differs from the model's alone by {worst}\n{alone}\n{bundled}"
        );
    }
}

/// Libraries that are not a usable ONNX Runtime: exit 1 with a message naming the path and
/// what is wrong with it, never a crash.
#[test]
fn onnxruntime_unusable_library_exits_1_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let onnx = support::root().join("examples/mlp/mlp.onnx");
    let mlp = "[[inputs]]\nname = \"input\"\ndatatype = \"FP32\"\ndims = [-1, 64]\n\n\
               [[outputs]]\nname = \"output\"\ndatatype = \"FP32\"\ndims = [-1, 10]\n";
    let garbage = dir.path().join("libonnxruntime.so.1.31.0");
    std::fs::write(&garbage, b"not a shared library\n").unwrap();
    // A real shared library that is not ONNX Runtime: the C library this binary uses.
    let libc = [
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib/aarch64-linux-gnu/libc.so.6",
        "/lib64/libc.so.6",
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|p| p.exists());
    let mut cases = vec![
        (dir.path().join("missing.so"), "does not exist"),
        (garbage.clone(), "cannot load the ONNX Runtime library"),
    ];
    if let Some(libc) = libc {
        cases.push((libc, "is not an ONNX Runtime library"));
    }
    for (lib, want) in cases {
        let cfg = config(dir.path(), "mlp", mlp, &onnx, &lib);
        let (code, out) = run_to_exit(&cfg);
        assert_eq!(code, Some(1), "{}: {out}", lib.display());
        assert!(
            out.contains(want) && out.contains(&lib.display().to_string()),
            "{}: want {want:?} in {out}",
            lib.display()
        );
        assert!(out.contains("this node cannot run the engine"), "{out}");
    }
}

/// all-MiniLM-L6-v2 against texts far longer than it reads and ids past its tables: served
/// from text, every long text of `real_models.py`'s `long_texts` (prose, CJK, emoji, accents,
/// URLs, leading whitespace; hundreds of kilobytes each) is cut before it is tokenized and gets
/// the tokens of the whole text truncated to 256 (the tokenizers package's), a text of
/// 1,000-character words a prefix of them, each `/embed` equal to the reference embedding of
/// its tokens; served as tensors with the tables its graph indexes (`table_rows`, as the
/// builder writes them), ids past the word table are refused over HTTP and gRPC (tritonclient).
#[test]
fn py_minilm_cuts_long_texts_as_a_whole_text_truncates_and_refuses_ids_past_its_table() {
    let test = "py_minilm_cuts_long_texts_as_a_whole_text_truncates_and_refuses_ids_past_its_table";
    let Some(py) = have_python(test) else {
        return;
    };
    let (models, lib, _) = fetch(&py);
    let dir = tempfile::tempdir().unwrap();
    let onnx = PathBuf::from(models["minilm"].as_str().unwrap());
    std::fs::copy(
        onnx.with_file_name("minilm.tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let engine = format!(
        "[batching]\nmax_batch_size = 8\n\n[engine]\nkind = \"onnxruntime\"\npath = \"{}\"\nlibrary = \"{}\"\nthreads = 1\n\n\
         [server]\nhost = \"127.0.0.1\"\nport = 0\ndrain_delay_s = 0\n",
        onnx.display(),
        lib.display()
    );
    let text = text_tables(
        &["input_ids", "attention_mask", "token_type_ids"],
        256,
        "[[outputs]]\nname = \"last_hidden_state\"\ndatatype = \"FP32\"\ndims = [-1, -1, 384]\n\n\
         [text]\ntokenizer = \"tokenizer.json\"\nmax_length = 256\ninput_ids = \"input_ids\"\nattention_mask = \"attention_mask\"\n\
         token_type_ids = \"token_type_ids\"\noutput = \"last_hidden_state\"\npooling = \"mean\"\nnormalize = true\n",
    );
    let cfg = dir.path().join("text.runtime.toml");
    std::fs::write(
        &cfg,
        format!("[model]\nname = \"minilm\"\n{text}\n{engine}"),
    )
    .unwrap();
    let (child, addr, _) = serve(&cfg);
    let _text = Running(child);
    let o = Command::new(&py)
        .arg(script())
        .args(["check-long", &addr, "minilm"])
        .arg(cache_dir())
        .arg("")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    eprintln!("{}", stdout(&o).trim());
    drop(_text);

    // As tensors: the word table (30522 rows) and the token-type table (2 rows).
    let tensors = text_tables(&["input_ids", "attention_mask", "token_type_ids"], 256, "")
        .replacen(
            "dim_names = [\"sequence\"]\n",
            "dim_names = [\"sequence\"]\ntable_rows = 30522\n",
            1,
        )
        .replace(
            "name = \"token_type_ids\"\ndatatype = \"INT64\"\ndims = [-1, -1]\nprofile = { min = [1], opt = [16], max = [256] }\ndim_names = [\"sequence\"]\n",
            "name = \"token_type_ids\"\ndatatype = \"INT64\"\ndims = [-1, -1]\nprofile = { min = [1], opt = [16], max = [256] }\ndim_names = [\"sequence\"]\ntable_rows = 2\n",
        );
    assert!(tensors.contains("table_rows = 2"), "{tensors}");
    let cfg = dir.path().join("tensors.runtime.toml");
    std::fs::write(
        &cfg,
        format!(
            "[model]\nname = \"minilm\"\n{tensors}[[outputs]]\nname = \"last_hidden_state\"\ndatatype = \"FP32\"\ndims = [-1, -1, 384]\n\n{engine}"
        ),
    )
    .unwrap();
    let grpc_port = support::free_port();
    let (child, addr, _) = serve_grpc(&cfg, grpc_port);
    let _tensors = Running(child);
    let o = Command::new(&py)
        .arg(script())
        .args([
            "check-table",
            &addr,
            "minilm",
            &format!("127.0.0.1:{grpc_port}"),
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}
