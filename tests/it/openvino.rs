//! The OpenVINO backend of `infer-serve` against the real libraries of the pinned `openvino`
//! wheel (`real_models.py fetch-openvino`: the files a CPU image carries, in one directory,
//! cached next to the real models and verified by sha256): PaddleOCR's text detector (variable
//! height and width) and recogniser (variable width) served by two instances on two streams of
//! one compiled model, several shapes in flight at once through tritonclient, each answer
//! compared with onnxruntime in Python on the same input. A library without its neighbours, a
//! foreign library, a model OpenVINO cannot read, tensors `runtime.toml` misnames, and an engine
//! recorded for another OpenVINO release stop the server with exit 1 and a message that says
//! which.

use super::onnxruntime::{get, have_python, run_to_exit, serve, DET, REC};
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
        let cfg = config(dir.path(), name, tensors, &onnx, &lib);
        let (mut child, addr, log) = serve(&cfg);
        // The start-up log, the metadata and the config name the engine and the release.
        assert!(
            log.iter()
                .any(|v| v["msg"] == "node" && v["openvino"] == version.as_str()),
            "{log:?}"
        );
        let meta = get(&addr, &format!("/v2/models/{name}"));
        assert_eq!(meta["platform"], "openvino", "{meta}");
        let config = get(&addr, &format!("/v2/models/{name}/config"));
        assert_eq!(config["backend"], "openvino", "{config}");
        assert_eq!(
            config["parameters"]["openvino"]["string_value"],
            version.as_str(),
            "{config}"
        );
        let cases: Vec<serde_json::Value> = shapes
            .iter()
            .map(|s| serde_json::json!({"input": "x", "shape": s}))
            .collect();
        let o = Command::new(&py)
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
    for entry in std::fs::read_dir(lib.parent().unwrap()).unwrap() {
        let p = entry.unwrap().path();
        std::fs::copy(&p, foreign.join(p.file_name().unwrap())).unwrap();
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

    // runtime.toml naming an input the model lacks: the model's names are listed.
    refused(
        &config(
            dir.path(),
            "ocr-det",
            &DET.replace("name = \"x\"", "name = \"pixels\""),
            &onnx,
            &lib,
        ),
        // (The log line is JSON: the quotes come escaped.)
        &["the model has no input \\\"pixels\\\" (it has [\\\"x\\\"])"],
    );

    // An engine recorded for another OpenVINO release is refused before anything loads.
    let cfg = config(dir.path(), "ocr-det", DET, &onnx, &lib);
    let meta = infer_spec::engine::EngineMeta {
        schema: infer_spec::engine::META_SCHEMA,
        kind: infer_spec::engine::EngineKind::Openvino,
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
        cpu: Some(infer_spec::engine::CpuMeta {
            arch: std::env::consts::ARCH.into(),
            tract: "0.23.9".parse().unwrap(),
            onnxruntime: None,
            openvino: Some("2025.3.0".parse().unwrap()),
            folded_by: None,
            threads: None,
            share: None,
            required_features: vec![],
            isa: None,
        }),
        conversion: None,
    };
    std::fs::write(dir.path().join("meta.json"), meta.to_canonical_json()).unwrap();
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("threads = 1\n", "threads = 1\nmetadata = \"meta.json\"\n");
    std::fs::write(&cfg, text).unwrap();
    refused(
        &cfg,
        &[&format!(
            "OpenVINO {version} differs from 2025.3.0 in major.minor"
        )],
    );
}
