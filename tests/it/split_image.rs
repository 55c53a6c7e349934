//! The split layout (`[image] layout = "split"`, or `build --image-layout split`): two real
//! models for the same CPU target, all-MiniLM-L6-v2 (a text model: its tokenizer travels in
//! the model image) and PaddleOCR's recogniser, both on ONNX Runtime, each built into its
//! combined image plus a runtime image and a model image with its ModelPack manifest.
//!
//! What must hold: the two runtime images are one (same digest); each model image, unpacked by
//! umoci and mounted read-only at `/mnt/models` of the runtime image (`docker run -v`, where
//! a Kubernetes image volume puts it), serves its model like the reference (tritonclient over
//! HTTP and gRPC against onnxruntime; the text model also through the `openai` client and
//! TEI's `/embed`); without the mount the runtime exits 1 naming the path; skopeo reads the
//! ModelPack manifest back, its config passes ModelPack's own JSON schema; and pushed to a
//! loopback registry after the first model, the second model uploads none of the runtime
//! image's bytes.

use std::path::PathBuf;
use std::process::Command;

use infer_build::report::{InspectedImage, Inspection};
use serde_json::Value;

use super::real_models::{
    cache_dir, check_served, dynamic_runtime, fetch_models, python_with_references, write_recipe,
    Container, CASES,
};
use super::support::{self, stderr, stdout};

const MODELS: [&str; 2] = ["minilm", "ocr-rec"];
const TAG: &str = "1-cpu-fp32";

/// The image of an inspected layout tagged `tag`.
fn image<'a>(doc: &'a Inspection, tag: &str) -> &'a InspectedImage {
    doc.images
        .iter()
        .find(|i| i.tags.iter().any(|t| t == tag))
        .unwrap_or_else(|| panic!("no image tagged {tag}: {doc:?}"))
}

#[test]
#[allow(
    clippy::too_many_lines,
    reason = "one scenario: two models' split images share one runtime image, registry and containers"
)]
fn docker_registry_py_split_layout_serves_two_real_models_from_one_runtime_image() {
    let test = "docker_registry_py_split_layout_serves_two_real_models_from_one_runtime_image";
    if !support::have_docker(test) {
        return;
    }
    let Some(py) = python_with_references(test) else {
        return;
    };
    let models = fetch_models(&py);
    let dir = tempfile::tempdir().unwrap();
    let Some(env) = super::ort_image::OrtBuild::start(test, dir.path()) else {
        return;
    };
    let (reg, cache) = (&env.reg, &env.cache);

    // MiniLM asks for the split layout with the flag, the recogniser in its recipe.
    let mut built = Vec::new();
    for name in MODELS {
        let case = CASES.iter().find(|c| c.name == name).unwrap();
        let onnx = PathBuf::from(models[name].as_str().unwrap());
        let recipe = write_recipe(
            &dir.path().join(name),
            name,
            case.recipe,
            case.policy,
            &onnx,
        );
        if !case.texts.is_empty() {
            std::fs::copy(
                cache_dir().join(format!("{name}.tokenizer.json")),
                dir.path().join(name).join("tokenizer.json"),
            )
            .unwrap();
        }
        let mut c = support::infer_build();
        c.arg("build").arg(&recipe);
        if name == "ocr-rec" {
            let text = std::fs::read_to_string(&recipe).unwrap();
            std::fs::write(
                &recipe,
                text.replace("[image]\n", "[image]\nlayout = \"split\"\n"),
            )
            .unwrap();
        } else {
            // Its archive: `docker load` takes every image of it, the ModelPack artifact aside.
            c.args(["--image-layout", "split", "--output"]).arg(format!(
                "oci-archive:{}",
                dir.path().join("minilm.tar").display()
            ));
        }
        let out = dir.path().join(name).join("out");
        c.arg("--out").arg(&out).arg("--json");
        let o = env.args(&mut c, &dynamic_runtime()).output().unwrap();
        let mut report = support::build_output(&o);
        assert_eq!(report.split.len(), 1, "{name}: {report:?}");
        built.push((name, out, report.split.remove(0)));
    }
    super::ort_image::keep_wheel(cache);

    // One runtime image for both models; two model images, each naming it.
    let runtime = built[0].2.runtime.manifest_digest.as_str();
    assert_eq!(
        runtime,
        built[1].2.runtime.manifest_digest.as_str(),
        "the two models' runtime images differ"
    );
    assert_ne!(
        built[0].2.model.manifest_digest,
        built[1].2.model.manifest_digest
    );
    for (name, out, split) in &built {
        let doc = support::inspect(out);
        let model = image(&doc, &format!("{TAG}-model"));
        assert_eq!(model.part.as_deref(), Some("model"), "{name}: {model:?}");
        assert_eq!(
            model.pairs_with.as_deref(),
            Some(runtime),
            "{name}: {model:?}"
        );
        assert_eq!(
            image(&doc, &format!("{TAG}-runtime")).part.as_deref(),
            Some("runtime")
        );
        // The combined image is still there, the default tag.
        assert!(image(&doc, TAG).part.is_none());
        // Every model file is a layer of its own, uncompressed, named by both annotations.
        for l in &split.model.layers {
            assert_eq!(
                l.media_type, "application/vnd.oci.image.layer.v1.tar",
                "{l:?}"
            );
        }

        // skopeo reads the ModelPack manifest back: the same blobs as the model image.
        let (ok, raw, e) = super::registry::skopeo(&[
            "inspect",
            "--raw",
            &format!("oci:{}:{TAG}-modelpack", out.display()),
        ]);
        assert!(ok, "{name}: {e}");
        let mp: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(
            mp["artifactType"],
            "application/vnd.cncf.model.manifest.v1+json"
        );
        assert_eq!(
            mp["config"]["mediaType"],
            "application/vnd.cncf.model.config.v1+json"
        );
        assert_eq!(
            mp["subject"]["digest"],
            split.model.manifest_digest.as_str()
        );
        let files: Vec<&str> = mp["layers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| {
                assert_eq!(
                    l["annotations"]["org.cncf.model.filepath"],
                    l["annotations"]["org.opencontainers.image.title"]
                );
                l["annotations"]["org.cncf.model.filepath"]
                    .as_str()
                    .unwrap()
            })
            .collect();
        assert_eq!(
            files[0], "model.onnx",
            "{name}: the weights first: {files:?}"
        );
        assert_eq!(
            mp["layers"][0]["mediaType"],
            "application/vnd.cncf.model.weight.v1.tar"
        );
        for f in ["engine.json", "runtime.toml"] {
            assert!(files.contains(&f), "{name}: no {f} in {files:?}");
        }
        if *name == "minilm" {
            assert!(files.contains(&"tokenizer.json"), "{files:?}");
        }
        let layer_digests = |m: &Value| -> Vec<String> {
            m["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l["digest"].as_str().unwrap().to_string())
                .collect()
        };
        let (ok, raw, e) = super::registry::skopeo(&[
            "inspect",
            "--raw",
            &format!("oci:{}:{TAG}-model", out.display()),
        ]);
        assert!(ok, "{name}: {e}");
        let model_manifest: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(layer_digests(&mp), layer_digests(&model_manifest));
        // Its config passes ModelPack's own schema.
        let config_digest = mp["config"]["digest"].as_str().unwrap();
        let config = out.join("blobs/sha256").join(&config_digest[7..]);
        let schema = support::root().join("tests/fixtures/modelpack/config-schema.json");
        let o = Command::new(&py)
            .args([
                "-c",
                "import json, sys, jsonschema; c = json.load(open(sys.argv[1])); \
                 jsonschema.validate(c, json.load(open(sys.argv[2]))); \
                 assert c['config']['format'] == 'onnx' and c['config']['precision'] == 'float32', c; \
                 assert len(c['modelfs']['diffIds']) == int(sys.argv[3]), c",
            ])
            .arg(&config)
            .arg(&schema)
            .arg(files.len().to_string())
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", stderr(&o));
    }

    // `deploy` of the recipe that asks for the split layout: the runtime image runs, the model
    // image is the volume, both pinned from the layout.
    let (_, out, split) = &built[1];
    let k8s = dir.path().join("k8s");
    let o = support::infer_build()
        .arg("deploy")
        .arg(dir.path().join("ocr-rec/recipe.toml"))
        .arg("--layout")
        .arg(out)
        .arg("--out")
        .arg(&k8s)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = std::fs::read_to_string(k8s.join("ocr-rec-cpu-fp32.yaml")).unwrap();
    for want in [
        format!("image: \"localhost/infer-build/ocr-rec@{runtime}\""),
        format!(
            "reference: \"localhost/infer-build/ocr-rec@{}\"",
            split.model.manifest_digest
        ),
        "mountPath: \"/mnt/models\"".to_string(),
    ] {
        assert!(yaml.contains(&want), "no {want:?} in\n{yaml}");
    }

    // The runtime image, loaded once with the rest of MiniLM's archive.
    let runtime_tag = &format!("localhost/infer-build/minilm:{TAG}-runtime");
    let loaded = support::docker_load(&dir.path().join("minilm.tar"));
    for tag in [TAG, &format!("{TAG}-runtime"), &format!("{TAG}-model")] {
        assert!(loaded.contains(&format!("minilm:{tag}\n")), "{loaded}");
    }

    // Without its model, the runtime says what is missing and exits 1.
    let o = Command::new("docker")
        .args(["run", "--rm", runtime_tag])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let said = stderr(&o) + &stdout(&o);
    assert!(
        said.contains("/mnt/models") && said.contains("image volume"),
        "{said}"
    );

    // Each model image, unpacked and mounted read-only where the image volume goes.
    for (name, out, _) in &built {
        let case = CASES.iter().find(|c| c.name == *name).unwrap();
        let bundle = dir.path().join(format!("{name}-unpacked"));
        let o = Command::new("umoci")
            .args(["raw", "unpack", "--rootless", "--image"])
            .arg(format!("{}:{TAG}-model", out.display()))
            .arg(&bundle)
            .output()
            .unwrap();
        assert!(o.status.success(), "umoci: {}", stderr(&o));
        assert!(bundle.join("runtime.toml").is_file(), "{name}");
        // World-readable, so the image's non-root user reads them.
        let mount = format!("{}:/mnt/models:ro", bundle.display());
        let c = Container::run_with(runtime_tag, &["-v", &mount]);
        let onnx = PathBuf::from(models[*name].as_str().unwrap());
        let result = c
            .wait_ready(300)
            .and_then(|()| check_served(&py, case, &c, name, &onnx));
        let logs = c.logs();
        drop(c);
        match result {
            Ok(said) => eprintln!("{name} (split): {}", said.trim()),
            Err(e) => panic!("{name}: {e}\ncontainer logs:\n{logs}"),
        }
    }

    // Pushed one after the other: the second model sends none of the runtime's bytes.
    let runtime_layers: Vec<String> = built[0]
        .2
        .runtime
        .layers
        .iter()
        .map(|l| l.digest.to_string())
        .collect();
    let mut uploaded = Vec::new();
    for (name, out, _) in &built {
        let to = format!("{}/ml/{name}", reg.addr);
        let (code, report, err) = super::registry::push_cli(out, &to, cache, &["--insecure"]);
        assert_eq!(code, 0, "{name}: {err}");
        let sent: Vec<String> = report["blobs"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|b| b["outcome"] == "uploaded")
            .map(|b| b["digest"].as_str().unwrap().to_string())
            .collect();
        // The ModelPack manifest is among the model image's referrers.
        assert!(
            report["referrers"]
                .as_array()
                .unwrap()
                .iter()
                .any(
                    |r| r["subject"] == built[0].2.model.manifest_digest.as_str()
                        || r["subject"] == built[1].2.model.manifest_digest.as_str()
                ),
            "{report}"
        );
        eprintln!(
            "{name}: pushed {} bytes in {} blobs",
            report["bytes_uploaded"],
            sent.len()
        );
        // The model image's referrers: its warm-up manifest (read from its runtime.toml) and
        // the ModelPack manifest.
        let model = built
            .iter()
            .find(|b| b.0 == *name)
            .unwrap()
            .2
            .model
            .manifest_digest
            .to_string();
        let (ok, raw, e) = super::registry::skopeo(&[
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{to}:sha256-{}", &model[7..]),
        ]);
        assert!(ok, "{name}: {e}");
        let referrers: Value = serde_json::from_str(&raw).unwrap();
        let kinds: Vec<&str> = referrers["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["artifactType"].as_str())
            .collect();
        for kind in [
            "application/vnd.infer-build.warmup.v1+json",
            "application/vnd.cncf.model.manifest.v1+json",
        ] {
            assert!(kinds.contains(&kind), "{name}: {kinds:?}");
        }
        let warmup = report["warmup"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["subject"] == model.as_str())
            .unwrap_or_else(|| panic!("{name}: no warm-up manifest for the model image: {report}"));
        assert_eq!(warmup["missing"], serde_json::json!([]), "{name}: {warmup}");
        // None for the runtime image: it serves no model of its own.
        assert!(
            !report["warmup"]
                .as_array()
                .unwrap()
                .iter()
                .any(|w| w["subject"] == runtime),
            "{report}"
        );
        uploaded.push(sent);
    }
    for l in &runtime_layers {
        assert!(
            !uploaded[1].contains(l),
            "the second push uploaded the runtime layer {l}"
        );
    }
}
