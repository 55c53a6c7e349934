//! Image assembly through the library: layouts built from fixed inputs are reproducible,
//! valid for skopeo and umoci, and archives load; the CLI-level tests are in `image.rs`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use infer_build::assemble::{
    self, BuildOptions, BuildReport, ImageMeta, LayerSource, ModelSpec, NoProgress, Payload,
    Policy, TargetSpec,
};
use infer_build::oci::{Compression, Platform};
use infer_build::plan::TargetKind;

use super::support::have_tool;

struct Inputs {
    dir: tempfile::TempDir,
}

impl Inputs {
    fn new() -> Inputs {
        let dir = tempfile::tempdir().unwrap();
        let serve: Vec<u8> = (0..300_000u32).map(|i| (i % 253) as u8).collect();
        std::fs::write(dir.path().join("infer-serve"), serve).unwrap();
        let model: Vec<u8> = (0..5_000_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
            .collect();
        std::fs::write(dir.path().join("model.onnx"), model).unwrap();
        Inputs { dir }
    }
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    fn touch_all(&self) {
        for f in ["infer-serve", "model.onnx"] {
            let p = self.path(f);
            let b = std::fs::read(&p).unwrap();
            std::fs::remove_file(&p).unwrap();
            std::fs::write(&p, b).unwrap();
            // What another umask would give: the image's modes must not follow it.
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
    }
}

fn meta() -> ImageMeta {
    ImageMeta {
        name: "mlp".into(),
        version: "1.0.0".into(),
        revision: Some("0123abcd".into()),
        source: Some("https://example.com/mlp".into()),
        repository: "localhost/infer-build/mlp".into(),
        index_tag: "1.0.0".into(),
        labels: BTreeMap::new(),
        user: None,
    }
}

fn cpu_target(i: &Inputs) -> TargetSpec {
    let mut compat = BTreeMap::new();
    compat.insert("precision".into(), "fp32".into());
    compat.insert("device".into(), "cpu".into());
    let mut extra = BTreeMap::new();
    extra.insert(
        "etc/infer/warmup/requests.json".into(),
        br#"{"batch_sizes":[1,8]}"#.to_vec().into(),
    );
    TargetSpec {
        id: "cpu-fp32".into(),
        tag: "1.0.0-cpu-fp32".into(),
        platform: Platform::new("linux", "amd64"),
        kind: TargetKind::Cpu,
        base: None,
        runtime_libs: vec![],
        serve_bin: i.path("infer-serve"),
        models: vec![ModelSpec {
            name: "mlp".into(),
            dir: assemble::paths::MODEL_DIR.into(),
            payload: Payload::Model {
                onnx: i.path("model.onnx"),
            },
            onnx: i.path("model.onnx"),
            files: BTreeMap::new(),
        }],
        runtime_toml: b"[model]\nname = \"mlp\"\n".to_vec(),
        extra_files: extra,
        compat,
        split: None,
    }
}

fn build_into(out: &Path, targets: &[TargetSpec], policy: Policy) -> BuildReport {
    let opts = BuildOptions {
        epoch: 1_700_000_000,
        policy,
        zstd_workers: 2,
    };
    assemble::build(out, &meta(), targets, &opts, &mut NoProgress).unwrap()
}

fn digests(r: &BuildReport) -> Vec<String> {
    let mut v = vec![r.index_digest.to_string()];
    v.extend(r.targets.iter().map(|t| t.manifest_digest.to_string()));
    v
}

#[test]
fn layouts_are_reproducible_across_clean_builds_touches_and_umask() {
    let i = Inputs::new();
    let out = tempfile::tempdir().unwrap();
    let first = build_into(&out.path().join("a"), &[cpu_target(&i)], Policy::Auto);
    let second = build_into(&out.path().join("b"), &[cpu_target(&i)], Policy::Auto);
    assert_eq!(digests(&first), digests(&second));
    let idx_a = std::fs::read(out.path().join("a/index.json")).unwrap();
    assert_eq!(
        idx_a,
        std::fs::read(out.path().join("b/index.json")).unwrap()
    );

    // Rewrite every input (new inodes, mtimes, modes 0600): same digests.
    i.touch_all();
    let third = build_into(&out.path().join("c"), &[cpu_target(&i)], Policy::Auto);
    assert_eq!(digests(&first), digests(&third));

    // A no-op rebuild in place comes from the stat cache; a touched one from the content cache.
    let again = build_into(&out.path().join("a"), &[cpu_target(&i)], Policy::Auto);
    assert_eq!(digests(&first), digests(&again));
    let hits: Vec<LayerSource> = again.targets[0].layers.iter().map(|l| l.cache).collect();
    assert_eq!(
        hits,
        [
            LayerSource::Content,
            LayerSource::Content,
            LayerSource::Stat
        ],
        "files re-hashed, inline config unchanged"
    );
    let noop = build_into(&out.path().join("a"), &[cpu_target(&i)], Policy::Auto);
    assert!(noop.targets[0]
        .layers
        .iter()
        .all(|l| l.cache == LayerSource::Stat));
}

#[test]
fn layer_order_media_types_and_annotations() {
    let i = Inputs::new();
    let out = tempfile::tempdir().unwrap();
    let r = build_into(out.path(), &[cpu_target(&i)], Policy::Auto);
    let t = &r.targets[0];
    let roles: Vec<&str> = t.layers.iter().map(|l| l.role.as_str()).collect();
    assert_eq!(roles, ["infer-serve", "model", "config"]);
    // The 5 MB model is "weights": uncompressed under auto; the rest gzip.
    let mt: Vec<&str> = t.layers.iter().map(|l| l.media_type.as_str()).collect();
    let gz = "application/vnd.oci.image.layer.v1.tar+gzip";
    assert_eq!(mt, [gz, "application/vnd.oci.image.layer.v1.tar", gz]);
    assert_eq!(
        t.layers[1].digest, t.layers[1].diff_id,
        "uncompressed: digest = diff_id"
    );
    assert!(t.layers[0].size < 300_000 / 10, "the binary is deflated");

    let m: serde_json::Value = read_blob(out.path(), t.manifest_digest.as_str());
    let a = &m["annotations"];
    assert_eq!(
        a["org.opencontainers.image.created"],
        "2023-11-14T22:13:20Z"
    );
    assert_eq!(a["org.opencontainers.image.ref.name"], "1.0.0-cpu-fp32");
    assert_eq!(a["org.opencontainers.image.revision"], "0123abcd");
    assert_eq!(a["dev.infer-build.precision"], "fp32");
    assert_eq!(a["dev.infer-build.layer-recipe"], "infer-build.layer.v2");
    let c: serde_json::Value = read_blob(out.path(), m["config"]["digest"].as_str().unwrap());
    assert_eq!(c["config"]["User"], "65532:65532");
    assert_eq!(c["config"]["Entrypoint"][0], "/usr/local/bin/infer-serve");
    assert_eq!(c["config"]["StopSignal"], "SIGTERM");
    assert_eq!(
        c["config"]["ExposedPorts"],
        serde_json::json!({"8000/tcp": {}, "8001/tcp": {}}),
        "HTTP and gRPC"
    );
    assert_eq!(c["rootfs"]["diff_ids"].as_array().unwrap().len(), 3);

    let idx: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.path().join("index.json")).unwrap()).unwrap();
    let names: Vec<&str> = idx["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            d["annotations"]["org.opencontainers.image.ref.name"]
                .as_str()
                .unwrap()
        })
        .collect();
    assert_eq!(names, ["1.0.0", "1.0.0-cpu-fp32"]);
    let group: serde_json::Value = read_blob(out.path(), r.index_digest.as_str());
    assert_eq!(
        group["manifests"][0]["annotations"]["dev.infer-build.target"],
        "cpu-fp32"
    );
    assert_eq!(group["manifests"][0]["platform"]["architecture"], "amd64");
    // Canonical JSON: no whitespace, sorted keys.
    let raw = std::fs::read(out.path().join("index.json")).unwrap();
    assert!(!raw.contains(&b'\n') && !raw.contains(&b' '));
}

fn read_blob(layout: &Path, digest: &str) -> serde_json::Value {
    let p = layout.join("blobs/sha256").join(&digest[7..]);
    serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
}

#[test]
fn every_compression_policy_builds() {
    let i = Inputs::new();
    let out = tempfile::tempdir().unwrap();
    for c in [
        Compression::Gzip,
        Compression::GzipStored,
        Compression::Zstd,
        Compression::None,
    ] {
        let r = build_into(
            &out.path().join(c.name()),
            &[cpu_target(&i)],
            Policy::All(c),
        );
        assert!(r.targets[0]
            .layers
            .iter()
            .all(|l| l.media_type == c.media_type()));
    }
}

#[test]
fn gpu_targets_need_a_base_layout() {
    let i = Inputs::new();
    let out = tempfile::tempdir().unwrap();
    let mut t = cpu_target(&i);
    t.id = "sm90-fp16".into();
    t.kind = TargetKind::Gpu;
    let opts = BuildOptions {
        epoch: 0,
        policy: Policy::Auto,
        zstd_workers: 1,
    };
    let e = assemble::build(out.path(), &meta(), &[t], &opts, &mut NoProgress).unwrap_err();
    assert!(e.to_string().contains("--base-layout"), "{e}");
    assert!(e.is_bad_input());
}

#[test]
fn gpu_target_stacks_on_a_base_layout() {
    let i = Inputs::new();
    let base = tempfile::tempdir().unwrap();
    // A "base image": one of our own CPU images stands in for a CUDA runtime image.
    let b = build_into(base.path(), &[cpu_target(&i)], Policy::Auto);
    let out = tempfile::tempdir().unwrap();
    let mut t = cpu_target(&i);
    t.id = "sm90-fp16".into();
    t.tag = "1.0.0-sm90-fp16".into();
    t.kind = TargetKind::Gpu;
    t.base = Some(assemble::BaseRef {
        layout: base.path().into(),
        tag: Some("1.0.0-cpu-fp32".into()),
    });
    t.compat.insert("gpu.sm".into(), "90".into());
    let r = build_into(out.path(), &[t], Policy::Auto);
    let layers = &r.targets[0].layers;
    assert_eq!(layers.len(), 6);
    assert_eq!(
        &layers[..3]
            .iter()
            .map(|l| l.digest.clone())
            .collect::<Vec<_>>(),
        &b.targets[0]
            .layers
            .iter()
            .map(|l| l.digest.clone())
            .collect::<Vec<_>>()
    );
    assert!(layers[..3].iter().all(|l| l.cache == LayerSource::Base));
    let m: serde_json::Value = read_blob(out.path(), r.targets[0].manifest_digest.as_str());
    assert_eq!(
        m["annotations"]["org.opencontainers.image.base.digest"],
        b.targets[0].manifest_digest.as_str()
    );
}

#[test]
fn skopeo_and_umoci_accept_the_layout() {
    if !have_tool("skopeo", "skopeo_and_umoci_accept_the_layout")
        || !have_tool("umoci", "skopeo_and_umoci_accept_the_layout")
    {
        return;
    }
    let i = Inputs::new();
    let out = tempfile::tempdir().unwrap();
    let layout = out.path().join("mlp");
    let r = build_into(&layout, &[cpu_target(&i)], Policy::Auto);
    let o = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci:{}:1.0.0-cpu-fp32", layout.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["Digest"], r.targets[0].manifest_digest.as_str());
    assert_eq!(v["Architecture"], "amd64");
    assert_eq!(v["Layers"].as_array().unwrap().len(), 3);

    let bundle = out.path().join("bundle");
    let o = Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:1.0.0-cpu-fp32", layout.display()))
        .arg(&bundle)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rootfs = bundle.join("rootfs");
    assert_eq!(
        std::fs::read(rootfs.join("opt/infer/model/model.onnx")).unwrap(),
        std::fs::read(i.path("model.onnx")).unwrap()
    );
    assert_eq!(
        std::fs::read(rootfs.join("etc/infer/runtime.toml")).unwrap(),
        b"[model]\nname = \"mlp\"\n"
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(rootfs.join("usr/local/bin/infer-serve"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["process"]["args"][0], "/usr/local/bin/infer-serve");
    assert_eq!(cfg["process"]["user"]["uid"], 65532);

    // The oci-archive is accepted by skopeo too (docker load is tested in image.rs).
    let store = infer_build::oci::BlobStore::open(&layout).unwrap();
    let archive = out.path().join("mlp.tar");
    infer_build::oci::write_archive(&store, &archive, 0).unwrap();
    let o = Command::new("skopeo")
        .arg("inspect")
        .arg(format!("oci-archive:{}:1.0.0-cpu-fp32", archive.display()))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

#[test]
fn corrupt_blobs_are_caught_when_read() {
    let i = Inputs::new();
    let out = tempfile::tempdir().unwrap();
    let r = build_into(out.path(), &[cpu_target(&i)], Policy::Auto);
    let l = &r.targets[0].layers[0];
    let p = out.path().join("blobs/sha256").join(l.digest.hex());
    let mut b = std::fs::read(&p).unwrap();
    b[20] ^= 0xff;
    std::fs::write(&p, b).unwrap();
    let store = infer_build::oci::BlobStore::open(out.path()).unwrap();
    let e = infer_build::oci::write_archive(&store, &out.path().join("x.tar"), 0).unwrap_err();
    assert!(e.to_string().contains("corrupt"), "{e}");
    assert!(!out.path().join("x.tar").exists() && !out.path().join("x.partial").exists());
}

#[test]
fn an_engine_replaces_the_model_in_its_layer() {
    let i = Inputs::new();
    std::fs::write(i.path("engine.plan"), vec![7u8; 1000]).unwrap();
    let mut t = cpu_target(&i);
    t.models[0].payload = Payload::Engine {
        file: i.path("engine.plan"),
        file_name: "engine.plan".into(),
        meta_json: br#"{"target":"cpu-fp32"}"#.to_vec(),
    };
    let out = tempfile::tempdir().unwrap();
    let r = build_into(out.path(), &[t], Policy::All(Compression::None));
    let l = &r.targets[0].layers[1];
    assert_eq!(l.role, "engine");
    let tar = std::fs::read(out.path().join("blobs/sha256").join(l.digest.hex())).unwrap();
    let mut a = tar::Archive::new(&tar[..]);
    let names: Vec<String> = a
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        [
            "opt/",
            "opt/infer/",
            "opt/infer/model/",
            "opt/infer/model/engine.json",
            "opt/infer/model/engine.plan"
        ]
    );
}
