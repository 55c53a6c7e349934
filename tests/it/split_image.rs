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

use std::path::{Path, PathBuf};
use std::process::Command;

use infer_build::assemble::TargetReport;
use infer_build::registry::BlobOutcome;
use infer_build::report::{InspectedImage, Inspection};
use serde_json::Value;

use super::ort_image::OrtBuild;

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

/// One model built into the split layout: its layout and its runtime and model images.
struct Built {
    name: &'static str,
    /// The OCI layout the build wrote.
    out: PathBuf,
    runtime: TargetReport,
    model: TargetReport,
}

/// What the scenario shares: the references, the models, the loopback registry and cache, and
/// the two models' split builds.
struct SplitBuilds {
    py: PathBuf,
    models: Value,
    built: Vec<Built>,
    // Dropped before `dir`, as when they were locals declared after it.
    env: OrtBuild,
    dir: tempfile::TempDir,
}

impl SplitBuilds {
    /// The two models' runtime image (the first's; they are checked to be one).
    fn runtime(&self) -> &str {
        self.built[0].runtime.manifest_digest.as_str()
    }
}

/// Builds both models in the split layout, MiniLM asking for it with the flag (into an
/// archive too), the recogniser in its recipe; `None` (with the reason printed) when Docker,
/// the Python references or a tool the base needs is absent.
fn build_both_models_split(test: &str) -> Option<SplitBuilds> {
    if !support::have_docker(test) {
        return None;
    }
    let py = python_with_references(test)?;
    let models = fetch_models(&py);
    let dir = tempfile::tempdir().unwrap();
    let env = OrtBuild::start(test, dir.path())?;

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
        let split = report.split.remove(0);
        built.push(Built {
            name,
            out,
            runtime: split.runtime,
            model: split.model,
        });
    }
    super::ort_image::keep_wheel(&env.cache);
    Some(SplitBuilds {
        py,
        models,
        built,
        env,
        dir,
    })
}

/// One runtime image for both models; two model images.
fn the_two_models_share_one_runtime_image(s: &SplitBuilds) {
    assert_eq!(
        s.runtime(),
        s.built[1].runtime.manifest_digest.as_str(),
        "the two models' runtime images differ"
    );
    assert_ne!(
        s.built[0].model.manifest_digest,
        s.built[1].model.manifest_digest
    );
}

/// The layout holds the model image (naming the runtime image it pairs with, a layer per file,
/// uncompressed), the runtime image and the combined image under the default tag.
fn the_layout_tags_its_model_runtime_and_combined_images(b: &Built, runtime: &str) {
    let name = b.name;
    let doc = support::inspect(&b.out);
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
    for l in &b.model.layers {
        assert_eq!(
            l.media_type, "application/vnd.oci.image.layer.v1.tar",
            "{l:?}"
        );
    }
}

/// The digests of a manifest's layers, in order.
fn layer_digests(m: &Value) -> Vec<String> {
    m["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// The manifest skopeo reads from `b`'s layout under the tag `<TAG>-<suffix>`.
fn raw_manifest(b: &Built, suffix: &str) -> Value {
    let (ok, raw, e) = super::registry::skopeo(&[
        "inspect",
        "--raw",
        &format!("oci:{}:{TAG}-{suffix}", b.out.display()),
    ]);
    assert!(ok, "{}: {e}", b.name);
    serde_json::from_str(&raw).unwrap()
}

/// skopeo reads the ModelPack manifest back: the model image its subject, the weights first,
/// the same blobs as the model image, and a config that passes ModelPack's own schema.
fn the_modelpack_manifest_mirrors_the_model_image_and_passes_its_schema(py: &Path, b: &Built) {
    let (name, out) = (b.name, &b.out);
    let mp = raw_manifest(b, "modelpack");
    assert_eq!(
        mp["artifactType"],
        "application/vnd.cncf.model.manifest.v1+json"
    );
    assert_eq!(
        mp["config"]["mediaType"],
        "application/vnd.cncf.model.config.v1+json"
    );
    assert_eq!(mp["subject"]["digest"], b.model.manifest_digest.as_str());
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
    if name == "minilm" {
        assert!(files.contains(&"tokenizer.json"), "{files:?}");
    }
    let model_manifest = raw_manifest(b, "model");
    assert_eq!(layer_digests(&mp), layer_digests(&model_manifest));
    // Its config passes ModelPack's own schema.
    let config_digest = mp["config"]["digest"].as_str().unwrap();
    let config = out.join("blobs/sha256").join(&config_digest[7..]);
    let schema = support::root().join("tests/fixtures/modelpack/config-schema.json");
    let o = Command::new(py)
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

/// `deploy` of the recipe that asks for the split layout: the runtime image runs, the model
/// image is the volume, both pinned from the layout.
fn deploy_runs_the_runtime_image_with_the_model_image_as_its_volume(s: &SplitBuilds) {
    let b = &s.built[1];
    let k8s = s.dir.path().join("k8s");
    let o = support::infer_build()
        .arg("deploy")
        .arg(s.dir.path().join("ocr-rec/recipe.toml"))
        .arg("--layout")
        .arg(&b.out)
        .arg("--out")
        .arg(&k8s)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = std::fs::read_to_string(k8s.join("ocr-rec-cpu-fp32.yaml")).unwrap();
    for want in [
        format!("image: \"localhost/infer-build/ocr-rec@{}\"", s.runtime()),
        format!(
            "reference: \"localhost/infer-build/ocr-rec@{}\"",
            b.model.manifest_digest
        ),
        "mountPath: \"/mnt/models\"".to_string(),
    ] {
        assert!(yaml.contains(&want), "no {want:?} in\n{yaml}");
    }
}

/// `docker load` of MiniLM's archive loads its combined, runtime and model images; the
/// runtime image's tag.
fn docker_load_takes_the_combined_runtime_and_model_images(s: &SplitBuilds) -> String {
    let loaded = support::docker_load(&s.dir.path().join("minilm.tar"));
    for tag in [TAG, &format!("{TAG}-runtime"), &format!("{TAG}-model")] {
        assert!(loaded.contains(&format!("minilm:{tag}\n")), "{loaded}");
    }
    format!("localhost/infer-build/minilm:{TAG}-runtime")
}

/// Without its model, the runtime says what is missing and exits 1.
fn without_its_model_the_runtime_exits_1_naming_the_mount(runtime_tag: &str) {
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
}

/// Each model image, unpacked by umoci and mounted read-only where the image volume goes,
/// serves its model like the reference from the one runtime image.
fn each_model_image_mounted_on_the_runtime_serves_like_the_reference(
    s: &SplitBuilds,
    runtime_tag: &str,
) {
    for b in &s.built {
        let name = b.name;
        let case = CASES.iter().find(|c| c.name == name).unwrap();
        let bundle = s.dir.path().join(format!("{name}-unpacked"));
        let o = Command::new("umoci")
            .args(["raw", "unpack", "--rootless", "--image"])
            .arg(format!("{}:{TAG}-model", b.out.display()))
            .arg(&bundle)
            .output()
            .unwrap();
        assert!(o.status.success(), "umoci: {}", stderr(&o));
        assert!(bundle.join("runtime.toml").is_file(), "{name}");
        // World-readable, so the image's non-root user reads them.
        let mount = format!("{}:/mnt/models:ro", bundle.display());
        let c = Container::run_with(runtime_tag, &["-v", &mount]);
        let onnx = PathBuf::from(s.models[name].as_str().unwrap());
        let result = c
            .wait_ready(300)
            .and_then(|()| check_served(&s.py, case, &c, name, &onnx));
        let logs = c.logs();
        drop(c);
        match result {
            Ok(said) => eprintln!("{name} (split): {}", said.trim()),
            Err(e) => panic!("{name}: {e}\ncontainer logs:\n{logs}"),
        }
    }
}

/// `push` of one model's layout to the loopback registry, which must succeed: the ModelPack
/// manifest among the referrers, the model image's referrers its warm-up manifest (none
/// missing) and the ModelPack manifest, none for the runtime image; the digests uploaded.
fn push_lists_the_model_images_referrers(s: &SplitBuilds, b: &Built) -> Vec<String> {
    let name = b.name;
    let to = format!("{}/ml/{name}", s.env.reg.addr);
    let (code, report, err) = super::registry::push_cli(&b.out, &to, &s.env.cache, &["--insecure"]);
    assert_eq!(code, 0, "{name}: {err}");
    let report = report.expect("push --json prints its report");
    let sent: Vec<String> = report
        .blobs
        .iter()
        .filter(|b| b.outcome == BlobOutcome::Uploaded)
        .map(|b| b.digest.to_string())
        .collect();
    // The ModelPack manifest is among the model image's referrers.
    assert!(
        report
            .referrers
            .iter()
            .any(|r| r.subject == s.built[0].model.manifest_digest.as_str()
                || r.subject == s.built[1].model.manifest_digest.as_str()),
        "{report:?}"
    );
    eprintln!(
        "{name}: pushed {} bytes in {} blobs",
        report.bytes_uploaded,
        sent.len()
    );
    // The model image's referrers: its warm-up manifest (read from its runtime.toml) and
    // the ModelPack manifest.
    let model = b.model.manifest_digest.to_string();
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
    let warmup = report.attached["warmup"]
        .iter()
        .find(|w| w.subject == model.as_str())
        .unwrap_or_else(|| panic!("{name}: no warm-up manifest for the model image: {report:?}"));
    assert!(warmup.missing.is_empty(), "{name}: {warmup:?}");
    // None for the runtime image: it serves no model of its own.
    assert!(
        !report.attached["warmup"]
            .iter()
            .any(|w| w.subject == s.runtime()),
        "{report:?}"
    );
    sent
}

/// Pushed one after the other, each with its referrers: the second model sends none of the
/// runtime's bytes.
fn the_second_push_uploads_none_of_the_runtime_images_layers(s: &SplitBuilds) {
    let runtime_layers: Vec<String> = s.built[0]
        .runtime
        .layers
        .iter()
        .map(|l| l.digest.to_string())
        .collect();
    let uploaded: Vec<Vec<String>> = s
        .built
        .iter()
        .map(|b| push_lists_the_model_images_referrers(s, b))
        .collect();
    for l in &runtime_layers {
        assert!(
            !uploaded[1].contains(l),
            "the second push uploaded the runtime layer {l}"
        );
    }
}

/// One scenario on one pair of split builds (the registry and containers shared): one runtime
/// image; each layout's images and ModelPack manifest; `deploy`; the runtime image alone and
/// with each model image mounted; the pushes.
#[test]
fn docker_registry_py_split_layout_serves_two_real_models_from_one_runtime_image() {
    let test = "docker_registry_py_split_layout_serves_two_real_models_from_one_runtime_image";
    let Some(s) = build_both_models_split(test) else {
        return;
    };
    the_two_models_share_one_runtime_image(&s);
    for b in &s.built {
        the_layout_tags_its_model_runtime_and_combined_images(b, s.runtime());
        the_modelpack_manifest_mirrors_the_model_image_and_passes_its_schema(&s.py, b);
    }
    deploy_runs_the_runtime_image_with_the_model_image_as_its_volume(&s);
    let runtime_tag = docker_load_takes_the_combined_runtime_and_model_images(&s);
    without_its_model_the_runtime_exits_1_naming_the_mount(&runtime_tag);
    each_model_image_mounted_on_the_runtime_serves_like_the_reference(&s, &runtime_tag);
    the_second_push_uploads_none_of_the_runtime_images_layers(&s);
}
