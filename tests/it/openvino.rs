//! The OpenVINO backend of `infer-serve` against the real libraries of the pinned `openvino`
//! wheel (`real_models.py fetch-openvino`: the files a CPU image carries, in one directory,
//! cached next to the real models and verified by sha256): PaddleOCR's text detector (variable
//! height and width) and recogniser (variable width) served by two instances on two streams of
//! one compiled model, several shapes in flight at once through tritonclient, each answer
//! compared with onnxruntime in Python on the same input. A library without its neighbours, a
//! foreign library, a model OpenVINO cannot read, tensors `runtime.toml` misnames, and an engine
//! recorded for another OpenVINO release stop the server with exit 1 and a message that says
//! which.

use super::onnxruntime::{
    cpu_engine_meta, cpu_meta, have_python, refused_with_metadata, run_to_exit, serve,
    serve_and_check, DET, REC,
};
use super::real_models::{cache_dir, script};
use super::support::{stderr, stdout};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A `runtime.toml` in `dir` serving `onnx` with OpenVINO from `library`, two instances.
fn config(dir: &Path, name: &str, tensors: &str, onnx: &Path, library: &Path) -> PathBuf {
    let text = format!(
        "[model]\nname = \"{name}\"\n{tensors}\n[batching]\nmax_batch_size = 4\nmax_queue_delay_us = 20000\ninstances = 2\n\n\
         [engine]\nkind = \"openvino\"\npath = \"{}\"\nlibrary = \"{}\"\nthreads = 1\n\n\
         [server]\nhost = \"127.0.0.1\"\nport = 0\n",
        onnx.display(),
        library.display()
    );
    let path = dir.join(format!("{name}.runtime.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// The real models, and OpenVINO's library with its version.
fn fetch(py: &Path) -> (serde_json::Value, PathBuf, String) {
    let run = |what: &str| -> serde_json::Value {
        let o = Command::new(py)
            .arg(script())
            .arg(what)
            .arg(cache_dir())
            .output()
            .unwrap();
        assert!(o.status.success(), "{what}: {}", stderr(&o));
        serde_json::from_str(&stdout(&o)).unwrap()
    };
    let models = run("fetch");
    let ov = run("fetch-openvino");
    (
        models,
        PathBuf::from(ov["library"].as_str().unwrap()),
        ov["version"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn py_openvino_serves_real_models_like_onnxruntime_in_python() {
    let test = "py_openvino_serves_real_models_like_onnxruntime_in_python";
    let Some(py) = have_python(test) else {
        return;
    };
    let (models, lib, version) = fetch(&py);
    let dir = tempfile::tempdir().unwrap();
    serve_and_check(
        &py,
        &models,
        ("openvino", "openvino", &version),
        |name, tensors, onnx| config(dir.path(), name, tensors, onnx, &lib),
    );
}

#[test]
fn py_openvino_refuses_what_it_cannot_serve_with_exit_1_and_the_reason() {
    let test = "py_openvino_refuses_what_it_cannot_serve_with_exit_1_and_the_reason";
    let Some(py) = have_python(test) else {
        return;
    };
    let (models, lib, version) = fetch(&py);
    let dir = tempfile::tempdir().unwrap();
    let onnx = PathBuf::from(models["ocr-det"].as_str().unwrap());
    let refused = |cfg: &Path, must: &[&str]| {
        let (code, out) = run_to_exit(cfg);
        assert_eq!(code, Some(1), "{out}");
        for m in must {
            assert!(out.contains(m), "{m:?} not in: {out}");
        }
    };

    // The C library alone: its neighbours are named.
    let alone = dir.path().join("alone");
    std::fs::create_dir_all(&alone).unwrap();
    let lone = alone.join(lib.file_name().unwrap());
    std::fs::copy(&lib, &lone).unwrap();
    refused(
        &config(dir.path(), "ocr-det", DET, &onnx, &lone),
        &[
            "libtbb.so.12",
            "missing: it must lie beside libopenvino_c.so.2641",
        ],
    );

    // A file by that name that is not a shared library, beside the real neighbours.
    let foreign = dir.path().join("foreign");
    std::fs::create_dir_all(&foreign).unwrap();
    // (Other tests may be fetching into the same directory: their temporary `.part` files come
    // and go, so only the finished libraries are copied.)
    for entry in std::fs::read_dir(lib.parent().unwrap()).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if name.contains(".part") {
            continue;
        }
        match std::fs::copy(&p, foreign.join(&name)) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => panic!("{name}: {e}"),
        }
    }
    std::fs::write(foreign.join(lib.file_name().unwrap()), b"not a library").unwrap();
    refused(
        &config(
            dir.path(),
            "ocr-det",
            DET,
            &onnx,
            &foreign.join(lib.file_name().unwrap()),
        ),
        &["cannot open OpenVINO's library", "libopenvino_c.so.2641"],
    );

    // A model OpenVINO cannot read.
    let garbage = dir.path().join("garbage.onnx");
    std::fs::write(&garbage, b"\x08\x07garbage").unwrap();
    refused(
        &config(dir.path(), "ocr-det", DET, &garbage, &lib),
        &["OpenVINO 2026.4.1 cannot load the model", "garbage.onnx"],
    );

    // runtime.toml giving an input another datatype than the model's. (Names that are not the
    // model's are matched by position, as for the other backends.)
    refused(
        &config(
            dir.path(),
            "ocr-det",
            &DET.replacen("datatype = \"FP32\"", "datatype = \"INT64\"", 1),
            &onnx,
            &lib,
        ),
        // (The log line is JSON: the quotes come escaped.)
        &["input \\\"x\\\" is a tensor of F32 in the model, runtime.toml says INT64"],
    );

    // An engine recorded for another OpenVINO release is refused before anything loads.
    let meta = cpu_engine_meta(
        infer_spec::engine::EngineKind::Openvino,
        infer_spec::engine::CpuMeta {
            openvino: Some("2025.3.0".parse().unwrap()),
            ..cpu_meta()
        },
    );
    refused_with_metadata(
        &config(dir.path(), "ocr-det", DET, &onnx, &lib),
        &meta,
        &format!("OpenVINO {version} differs from 2025.3.0 in major.minor"),
    );
}

/// `engine.precision = "bf16"`: OpenVINO computes in BF16 where the CPU has it (AVX-512 BF16 or
/// AMX, read from the kernel's flags), so PaddleOCR's recogniser answers within BF16's error of
/// onnxruntime's FP32 and no longer within FP32's; on a CPU without it OpenVINO computes FP32
/// and the answers stay within FP32's error.
#[test]
fn py_openvino_computes_in_bf16_where_the_cpu_has_it() {
    let test = "py_openvino_computes_in_bf16_where_the_cpu_has_it";
    let Some(py) = have_python(test) else {
        return;
    };
    let (models, lib, _) = fetch(&py);
    let dir = tempfile::tempdir().unwrap();
    let onnx = PathBuf::from(models["ocr-rec"].as_str().unwrap());
    let cfg = config(dir.path(), "ocr-rec", REC, &onnx, &lib);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("threads = 1\n", "threads = 1\nprecision = \"bf16\"\n");
    std::fs::write(&cfg, text).unwrap();
    let (mut child, addr, log) = serve(&cfg);
    assert!(
        log.iter()
            .any(|v| v["msg"] == "node" && v["precision"] == "bf16"),
        "{log:?}"
    );
    let cases =
        r#"[{"input": "x", "shape": [1, 3, 48, 160]}, {"input": "x", "shape": [2, 3, 48, 320]}]"#;
    let o = Command::new(&py)
        .arg(script())
        .args(["check", &addr, "ocr-rec"])
        .arg(&onnx)
        .arg(cases)
        .env("CHECK_TOL", "0.2")
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let got: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let diff = got["max_abs_diff"].as_f64().unwrap();
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let bf16 = flags.contains(" avx512_bf16") || flags.contains(" amx_bf16");
    eprintln!("bf16 on this CPU: {bf16}; max |diff| against FP32 onnxruntime: {diff:e}");
    if bf16 {
        assert!(diff > 1e-3, "computed in FP32? max |diff| {diff:e}");
    } else {
        assert!(diff <= 1e-3, "max |diff| {diff:e}");
    }
}
