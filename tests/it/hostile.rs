//! Hostile inputs on the builder side: crafted layouts, output directories with planted links,
//! FIFOs and devices where files are expected, oversized documents. Each test reproduces one
//! attack and checks that nothing outside the output is written, deleted or read, that nothing
//! hangs, and that the error names what was refused.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use infer_build::assemble::{
    self, BuildOptions, ImageMeta, ModelSpec, NoProgress, Payload, Policy, TargetSpec,
};
use infer_build::oci::{read_index, walk, write_archive, BlobStore, Digest, Platform};
use infer_build::plan::TargetKind;
use serde_json::{json, Value};

use super::support::{infer_build, sha256, stderr};

fn meta() -> ImageMeta {
    ImageMeta {
        name: "mlp".into(),
        version: "1.0.0".into(),
        revision: None,
        source: None,
        repository: "localhost/infer-build/mlp".into(),
        index_tag: "1.0.0".into(),
        labels: BTreeMap::new(),
        user: None,
    }
}

/// Small inputs for a CPU target.
fn inputs(dir: &Path) {
    std::fs::write(dir.join("infer-serve"), vec![7u8; 10_000]).unwrap();
    std::fs::write(dir.join("model.onnx"), vec![9u8; 20_000]).unwrap();
}

fn cpu_target(dir: &Path) -> TargetSpec {
    TargetSpec {
        id: "cpu-fp32".into(),
        tag: "1.0.0-cpu-fp32".into(),
        platform: Platform::new("linux", "amd64"),
        kind: TargetKind::Cpu,
        base: None,
        runtime_libs: vec![],
        serve_bin: dir.join("infer-serve"),
        models: vec![ModelSpec {
            name: "mlp".into(),
            dir: assemble::paths::MODEL_DIR.into(),
            payload: Payload::Model {
                onnx: dir.join("model.onnx"),
            },
            onnx: dir.join("model.onnx"),
            files: BTreeMap::new(),
        }],
        runtime_toml: b"[model]\nname = \"mlp\"\n".to_vec(),
        extra_files: BTreeMap::new(),
        compat: BTreeMap::new(),
        split: None,
    }
}

fn gpu_target(dir: &Path, base: &Path) -> TargetSpec {
    let mut t = cpu_target(dir);
    t.id = "sm90-fp16".into();
    t.tag = "1.0.0-sm90-fp16".into();
    t.kind = TargetKind::Gpu;
    t.base = Some(assemble::BaseRef {
        layout: base.into(),
        tag: None,
    });
    t
}

fn build_into(
    out: &Path,
    targets: &[TargetSpec],
) -> Result<assemble::BuildReport, assemble::Error> {
    let opts = BuildOptions {
        epoch: 0,
        policy: Policy::Auto,
        zstd_workers: 1,
    };
    assemble::build(out, &meta(), targets, &opts, &mut NoProgress)
}

/// A gzip-compressed tar layer holding `files` (path bytes, content).
fn layer(files: &[(&[u8], &[u8])]) -> (Vec<u8>, String) {
    let mut tar = tar::Builder::new(Vec::new());
    for (path, content) in files {
        let mut h = tar::Header::new_gnu();
        h.as_gnu_mut().unwrap().name[..path.len()].copy_from_slice(path);
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        tar.append(&h, *content).unwrap();
    }
    let tar = tar.into_inner().unwrap();
    let diff_id = sha256(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    (gz.finish().unwrap(), diff_id)
}

/// A one-image layout (linux/amd64) of `layers`; `diff_ids` overrides the config's. Returns
/// the layer digests and the manifest digest.
fn make_layout(
    dir: &Path,
    layers: &[(Vec<u8>, String)],
    diff_ids: Option<Vec<String>>,
    annotations: Value,
) -> (Vec<String>, String) {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let put = |bytes: &[u8]| {
        let d = sha256(bytes);
        std::fs::write(dir.join("blobs/sha256").join(&d[7..]), bytes).unwrap();
        d
    };
    let digests: Vec<String> = layers.iter().map(|(b, _)| put(b)).collect();
    let diff_ids = diff_ids.unwrap_or_else(|| layers.iter().map(|(_, d)| d.clone()).collect());
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap();
    let config_digest = put(&config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config.len()},
        "layers": layers.iter().zip(&digests).map(|((b, _), d)| json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": b.len(),
        })).collect::<Vec<_>>(),
        "annotations": annotations,
    }))
    .unwrap();
    let manifest_digest = put(&manifest);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest, "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": "base"},
        }],
    }))
    .unwrap();
    std::fs::write(dir.join("index.json"), index).unwrap();
    (digests, manifest_digest)
}

fn blob(dir: &Path, digest: &str) -> PathBuf {
    super::support::blob_path(dir, digest)
}

fn mkfifo(p: &Path) {
    let _ = std::fs::remove_file(p);
    let ok = Command::new("mkfifo").arg(p).status().unwrap().success();
    assert!(ok, "mkfifo {}", p.display());
}

/// Runs `f` on a thread and fails the test if it has not returned within 30 s (a FIFO read
/// would block forever).
fn bounded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(30))
        .expect("did not return within 30 s: blocked on a FIFO or a device")
}

/// A directory outside the output with one file in it, to check nothing touches it.
fn victim(root: &Path) -> PathBuf {
    let v = root.join("victim");
    std::fs::create_dir_all(&v).unwrap();
    std::fs::write(v.join("precious"), b"precious").unwrap();
    v
}

fn untouched(v: &Path) {
    let names: Vec<_> = std::fs::read_dir(v)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        names,
        ["precious"],
        "something was written into or removed from {v:?}"
    );
    assert_eq!(std::fs::read(v.join("precious")).unwrap(), b"precious");
}

#[test]
fn build_refuses_a_linked_private_tmp_and_deletes_nothing_outside() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let out = t.path().join("out");
    build_into(&out, &[cpu_target(t.path())]).unwrap();
    let v = victim(t.path());
    std::fs::remove_dir_all(out.join(".infer-build/tmp")).unwrap();
    symlink(&v, out.join(".infer-build/tmp")).unwrap();
    let e = build_into(&out, &[cpu_target(t.path())]).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(e.to_string().contains(".infer-build/tmp"), "{e}");
    assert!(e.is_bad_input());
    untouched(&v);
}

#[test]
fn build_refuses_a_linked_blob_directory() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let out = t.path().join("out");
    let v = victim(t.path());
    std::fs::create_dir_all(out.join("blobs")).unwrap();
    symlink(&v, out.join("blobs/sha256")).unwrap();
    let e = build_into(&out, &[cpu_target(t.path())]).unwrap_err();
    assert!(e.to_string().contains("blobs/sha256"), "{e}");
    untouched(&v);
}

#[test]
fn build_refuses_a_linked_sbom_directory() {
    let ex = super::image::Example::new();
    let v = victim(&ex.path("v"));
    std::fs::create_dir_all(ex.path("out")).unwrap();
    symlink(&v, ex.path("out/sbom")).unwrap();
    let o = ex.cmd("out", &["--target", "cpu-fp32"]).output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("sbom` is a symbolic link"), "{err}");
    untouched(&v);
}

#[test]
fn archive_never_writes_through_a_planted_partial_link() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let out = t.path().join("out");
    build_into(&out, &[cpu_target(t.path())]).unwrap();
    let v = victim(t.path());
    let dest = t.path().join("image.tar");
    symlink(v.join("precious"), t.path().join("image.partial")).unwrap();
    symlink(v.join("precious"), &dest).unwrap();
    let store = BlobStore::open(&out).unwrap();
    write_archive(&store, &dest, 0).unwrap();
    untouched(&v);
    let m = std::fs::symlink_metadata(&dest).unwrap();
    assert!(m.file_type().is_file(), "the archive must replace the link");
    assert!(m.len() > 10_000);
}

#[test]
fn base_layer_linked_outside_or_to_a_device_or_fifo_is_refused() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let base = t.path().join("base");
    let l = layer(&[(b"etc/hostname", b"base\n")]);
    let (digests, _) = make_layout(&base, std::slice::from_ref(&l), None, json!({}));
    let b = blob(&base, &digests[0]);
    // A link to a file with the right bytes still is a link.
    let outside = t.path().join("outside.tar.gz");
    std::fs::write(&outside, &l.0).unwrap();
    std::fs::remove_file(&b).unwrap();
    symlink(&outside, &b).unwrap();
    let e = build_into(&t.path().join("o1"), &[gpu_target(t.path(), &base)]).unwrap_err();
    assert!(e.to_string().contains("symbolic link"), "{e}");
    assert!(e.is_bad_input());
    // A FIFO: refused at open, no read blocks.
    std::fs::remove_file(&b).unwrap();
    mkfifo(&b);
    let (dir, base2) = (t.path().to_path_buf(), base.clone());
    let e = bounded(move || {
        build_into(&dir.join("o2"), &[gpu_target(&dir, &base2)])
            .unwrap_err()
            .to_string()
    });
    assert!(e.contains("not a regular file"), "{e}");
    // A descriptor of 2^64-1 bytes: refused by size, before reading.
    std::fs::remove_file(&b).unwrap();
    std::fs::write(&b, &l.0).unwrap();
    let store = BlobStore::open(&base).unwrap();
    let e = store
        .verify(&Digest::parse(&digests[0]).unwrap(), u64::MAX)
        .unwrap_err();
    assert!(e.to_string().contains("18446744073709551615"), "{e}");
}

#[test]
fn fifo_or_oversized_index_json_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    make_layout(&base, &[layer(&[(b"a", b"a")])], None, json!({}));
    std::fs::remove_file(base.join("index.json")).unwrap();
    mkfifo(&base.join("index.json"));
    let b = base.clone();
    let e = bounded(move || {
        let s = BlobStore::open(&b).unwrap();
        read_index(&s).unwrap_err().to_string()
    });
    assert!(e.contains("not a regular file"), "{e}");
    std::fs::remove_file(base.join("index.json")).unwrap();
    symlink("/dev/zero", base.join("index.json")).unwrap();
    let s = BlobStore::open(&base).unwrap();
    let e = read_index(&s).unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    std::fs::remove_file(base.join("index.json")).unwrap();
    let f = std::fs::File::create(base.join("index.json")).unwrap();
    f.set_len(5 << 20).unwrap();
    let e = read_index(&s).unwrap_err().to_string();
    assert!(e.contains("over the limit of 4194304"), "{e}");
}

#[test]
fn base_layout_with_a_wrong_diff_id_is_refused() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let base = t.path().join("base");
    let l = layer(&[(b"etc/hostname", b"base\n")]);
    let bogus = sha256(b"not the layer");
    make_layout(&base, &[l], Some(vec![bogus.clone()]), json!({}));
    let e = build_into(&t.path().join("out"), &[gpu_target(t.path(), &base)]).unwrap_err();
    assert!(e.to_string().contains(&bogus), "{e}");
    assert!(e.to_string().contains("diff_id"), "{e}");
    assert!(e.is_bad_input());
}

#[test]
fn corrupt_base_layout_is_bad_input_for_build_as_for_push() {
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let base = t.path().join("base");
    let (digests, _) = make_layout(&base, &[layer(&[(b"a", b"a")])], None, json!({}));
    std::fs::write(blob(&base, &digests[0]), b"short").unwrap();
    let e = build_into(&t.path().join("out"), &[gpu_target(t.path(), &base)]).unwrap_err();
    assert!(e.to_string().contains(&digests[0]), "{e}");
    assert_eq!(infer_build::Error::from(e).exit_code(), 2);
    std::fs::remove_file(blob(&base, &digests[0])).unwrap();
    let e = build_into(&t.path().join("out"), &[gpu_target(t.path(), &base)]).unwrap_err();
    assert!(e.to_string().contains("missing"), "{e}");
    assert_eq!(infer_build::Error::from(e).exit_code(), 2);
}

#[test]
fn manifest_with_too_many_layers_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let base = t.path().join("base");
    let l = layer(&[(b"a", b"a")]);
    let many = vec![l; 1001];
    make_layout(&base, &many, None, json!({}));
    let s = BlobStore::open(&base).unwrap();
    let e = walk(&s).unwrap_err().to_string();
    assert!(e.contains("1001 layers"), "{e}");
}

fn inspect(layout: &Path) -> (i32, String) {
    let o = infer_build().arg("inspect").arg(layout).output().unwrap();
    (o.status.code().unwrap_or(-1), stderr(&o))
}

#[test]
fn inspect_verifies_layers_and_escapes_control_characters() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("l");
    let (digests, _) = make_layout(
        &dir,
        &[layer(&[(b"a", b"a")])],
        None,
        json!({"note": "\u{1b}]0;pwned\u{7}\u{1b}[2J\rfake line\u{9b}31m"}),
    );
    let (code, err) = inspect(&dir);
    assert_eq!(code, 0, "{err}");
    assert!(
        !err.contains('\u{1b}') && !err.contains('\u{7}') && !err.contains('\r'),
        "raw control characters reach the terminal: {err:?}"
    );
    assert!(!err.contains('\u{9b}'), "{err:?}");
    assert!(err.contains("\\u{1b}]0;pwned"), "{err}");
    std::fs::write(blob(&dir, &digests[0]), b"corrupt").unwrap();
    let (code, err) = inspect(&dir);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&digests[0]), "{err}");
    std::fs::remove_file(blob(&dir, &digests[0])).unwrap();
    let (code, err) = inspect(&dir);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("missing"), "{err}");
}

#[test]
fn inspect_refuses_a_layer_of_u64_max_bytes() {
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("l");
    make_layout(&dir, &[layer(&[(b"a", b"a")])], None, json!({}));
    // Rewrite the manifest with a layer size of 2^64-1 (valid JSON, a u64).
    let idx: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let md = idx["manifests"][0]["digest"].as_str().unwrap().to_string();
    let mut m: Value = serde_json::from_slice(&std::fs::read(blob(&dir, &md)).unwrap()).unwrap();
    m["layers"][0]["size"] = json!(u64::MAX);
    let mb = serde_json::to_vec(&m).unwrap();
    let nd = sha256(&mb);
    std::fs::write(blob(&dir, &nd), &mb).unwrap();
    let idx = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": nd, "size": mb.len()}]});
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&idx).unwrap()).unwrap();
    let (code, err) = inspect(&dir);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("its descriptor says 18446744073709551615"),
        "{err}"
    );
    assert!(!err.contains("TiB"), "{err}");
}

#[test]
fn slim_refuses_linked_blobs_non_utf8_names_and_dot_whiteouts() {
    use infer_build::slim::{flatten, read_layout};
    let t = tempfile::tempdir().unwrap();
    // Two names that differ only in a non-UTF-8 byte would merge into one if converted.
    let dir = t.path().join("nonutf8");
    make_layout(
        &dir,
        &[layer(&[
            (b"usr/lib/libx.so.\xff", b"\x7fELFone"),
            (b"usr/lib/libx.so.\xfe", b"two"),
        ])],
        None,
        json!({}),
    );
    let e = flatten(&read_layout(&dir, None).unwrap())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("libx.so.\\xff") && e.contains("not UTF-8"),
        "{e}"
    );
    // `.wh..` and `.wh...` name the directory itself and its parent.
    for w in [&b"usr/lib/.wh.."[..], b"usr/lib/.wh..."] {
        let dir = t.path().join(format!("wh{}", w.len()));
        make_layout(
            &dir,
            &[layer(&[(b"usr/lib/keep", b"k")]), layer(&[(w, b"")])],
            None,
            json!({}),
        );
        let e = flatten(&read_layout(&dir, None).unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("whiteout") && e.contains("names no file"), "{e}");
    }
    // A layer blob linked to a device: refused by the open, no endless read.
    let dir = t.path().join("dev");
    let (digests, _) = make_layout(&dir, &[layer(&[(b"a", b"a")])], None, json!({}));
    std::fs::remove_file(blob(&dir, &digests[0])).unwrap();
    symlink("/dev/zero", blob(&dir, &digests[0])).unwrap();
    let start = Instant::now();
    let e = flatten(&read_layout(&dir, None).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("symbolic link"), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
    // A base blob that is a link is not hard-linked into the output.
    let out = BlobStore::create(&t.path().join("out")).unwrap();
    let src = BlobStore::open(&dir).unwrap();
    let d = Digest::parse(&digests[0]).unwrap();
    let e = out.import(&src, &d, 1, true).unwrap_err().to_string();
    assert!(e.contains("symbolic link"), "{e}");
    assert!(!t.path().join("out/blobs/sha256").join(d.hex()).exists());
}

#[test]
fn slim_definition_and_engine_meta_fifos_do_not_block() {
    let t = tempfile::tempdir().unwrap();
    let fifo = t.path().join("fifo");
    mkfifo(&fifo);
    for flag in ["--definition", "--engine-meta"] {
        let mut cmd = infer_build();
        cmd.args(["slim", flag])
            .arg(&fifo)
            .args(["--base-layout", "b", "--builder-layout", "c", "--out"])
            .arg(t.path().join("out"));
        let o = bounded(move || cmd.output().unwrap());
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flag}: {err}");
        assert!(err.contains("not a regular file"), "{flag}: {err}");
    }
}

#[test]
fn a_directory_as_engine_file_is_named() {
    let t = tempfile::tempdir().unwrap();
    let e = infer_build::engine::digest_file(t.path()).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(chain.contains("not a regular file"), "{chain}");
}

#[test]
fn a_megabyte_of_unknown_recipe_keys_gives_a_bounded_message() {
    let mut text = String::from("[model]\nname = \"m\"\nonnx = \"m.onnx\"\n");
    let mut n = 0;
    while text.len() < (1 << 20) - 64 {
        text.push_str(&format!("unknown_key_{n} = 1\n"));
        n += 1;
    }
    let e = infer_build::recipe::parse(&text, Path::new("recipe.toml")).unwrap_err();
    let shown = e.to_string();
    assert!(shown.len() < 64 << 10, "{} bytes of messages", shown.len());
    assert!(shown.contains("more problems not shown"), "{shown}");
    assert!(e.diagnostics().len() <= infer_build::recipe::MAX_DIAGNOSTICS + 1);
}

/// The files of `src/` that write by path instead of through an `oci::Dir` handle, and why
/// that is safe. ARCHITECTURE.md's "No link is followed" invariant names the same list.
const WRITES_BY_PATH: &[(&str, &str)] = &[
    (
        "src/engine/cache.rs",
        "the engine cache's lock file, and a private staging directory renamed into place whole",
    ),
    (
        "src/engine/convert.rs",
        "a per-process staging directory in the conversion cache, renamed into place whole",
    ),
    (
        "src/engine/pyenv.rs",
        "a per-process staging virtual environment, renamed into place whole",
    ),
    (
        "src/engine/tensorrt.rs",
        "scratch files trtexec wrote in the engine's staging directory",
    ),
    (
        "src/slim/image.rs",
        "files in a fresh private temporary directory (mkdtemp) inside the output",
    ),
    (
        "src/registry/auth.rs",
        "the credentials file: a NamedTempFile (O_EXCL) persisted by rename",
    ),
    (
        "src/bench/tune/mod.rs",
        "the sweep's runtime config and log in its own temporary directory",
    ),
    (
        "src/cli/bench.rs",
        "the report file the user names with --output",
    ),
];

/// The invariant behind the tests above, checked on the whole source tree: outside
/// `oci/dir.rs`, code creates, renames, links, writes or removes files by path only in the
/// files of [`WRITES_BY_PATH`]; everything else goes through `oci::Dir` handles. A new writer
/// is a reviewed entry in that list, and an entry that no longer writes is removed.
#[test]
fn every_write_goes_through_a_directory_handle_or_is_listed() {
    let root = super::support::root();
    let banned = [
        "fs::rename(",
        "File::create(",
        "fs::write(",
        "fs::hard_link(",
        "OpenOptions::new()",
        "NamedTempFile",
        "fs::remove_file(",
    ];
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for p in super::support::rust_sources(&[root.join("src")]) {
        let rel = p.display().to_string();
        if rel == "src/oci/dir.rs" || p.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&p)).unwrap();
        // Unit tests may set up files however they like.
        let code = text.split("#[cfg(test)]").next().unwrap();
        for (n, line) in code.lines().enumerate() {
            if banned.iter().any(|b| line.contains(b)) {
                found.entry(rel.clone()).or_default().push(format!(
                    "{rel}:{}: {}",
                    n + 1,
                    line.trim()
                ));
            }
        }
    }
    let listed: Vec<&str> = WRITES_BY_PATH.iter().map(|(f, _)| *f).collect();
    let unlisted: Vec<String> = found
        .iter()
        .filter(|(f, _)| !listed.contains(&f.as_str()))
        .flat_map(|(_, lines)| lines.clone())
        .collect();
    assert!(
        unlisted.is_empty(),
        "write through oci::Dir, or list the file in WRITES_BY_PATH with the reason it is safe:\n{}",
        unlisted.join("\n")
    );
    let stale: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|f| !found.contains_key(*f))
        .collect();
    assert!(stale.is_empty(), "these no longer write by path: {stale:?}");
}

/// The stable-Rust companion of `fuzz/fuzz_targets/layout.rs`: seeded byte mutations of a
/// valid layout's `index.json`, manifest and config never make the readers panic.
#[test]
fn mutated_layouts_never_panic() {
    use infer_build::slim::{flatten, read_layout};
    let t = tempfile::tempdir().unwrap();
    let good = t.path().join("good");
    let (_, manifest) = make_layout(&good, &[layer(&[(b"usr/lib/a", b"a")])], None, json!({}));
    let manifest_bytes = std::fs::read(blob(&good, &manifest)).unwrap();
    let index_bytes = std::fs::read(good.join("index.json")).unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..300 {
        let dir = t.path().join(format!("m{i}"));
        let mut cmd = Command::new("cp");
        assert!(cmd
            .arg("-r")
            .arg(&good)
            .arg(&dir)
            .status()
            .unwrap()
            .success());
        // Mutate the manifest (stored under its new digest, so the index can reach it) or
        // the index itself.
        let (mut bytes, manifest_too) = if i % 2 == 0 {
            (manifest_bytes.clone(), true)
        } else {
            (index_bytes.clone(), false)
        };
        for _ in 0..1 + next() % 4 {
            let at = (next() as usize) % bytes.len();
            match next() % 3 {
                0 => bytes[at] = next() as u8,
                1 => {
                    bytes.remove(at);
                }
                _ => bytes.insert(at, b"{}[]\",:0-9e"[(next() % 11) as usize]),
            }
        }
        if manifest_too {
            let d = sha256(&bytes);
            std::fs::write(blob(&dir, &d), &bytes).unwrap();
            let text = String::from_utf8_lossy(&index_bytes)
                .replace(&manifest, &d)
                .replace(
                    &format!("\"size\":{}", manifest_bytes.len()),
                    &format!("\"size\":{}", bytes.len()),
                );
            std::fs::write(dir.join("index.json"), text).unwrap();
        } else {
            std::fs::write(dir.join("index.json"), &bytes).unwrap();
        }
        if let Ok(store) = BlobStore::open(&dir) {
            if let Ok((images, _)) = walk(&store) {
                for img in images {
                    for l in &img.manifest.layers {
                        let _ = store.verify(&l.digest, l.size);
                    }
                }
            }
        }
        if let Ok(img) = read_layout(&dir, None) {
            let _ = flatten(&img);
        }
    }
}

/// Warm-up samples are read once and shared by every target's layer, not copied per target
/// (a 157 MB file with 6 targets reached 1.09 GB before).
#[test]
fn warmup_samples_are_shared_by_every_target() {
    use infer_build::oci::Source;
    use std::sync::Arc;
    let recipe =
        infer_build::recipe::load(&super::support::root().join("recipes/resnet50.toml")).unwrap();
    let matrix = infer_build::matrix::load(None).unwrap();
    let plan = infer_build::plan::resolve(&recipe, &matrix, None).unwrap();
    assert!(plan.targets.len() >= 2);
    // One valid request (ResNet-50's `input`, FP32 [1, 3, 224, 224]) padded to exactly 1 MiB
    // with a request parameter, so that `target_spec`'s check of the samples passes.
    let data = vec!["0"; 3 * 224 * 224].join(",");
    let head = r#"{"parameters": {"pad": ""#;
    let tail = format!(
        r#""}}, "inputs": [{{"name": "input", "datatype": "FP32", "shape": [1, 3, 224, 224], "data": [{data}]}}]}}"#
    );
    let pad = (1usize << 20) - head.len() - tail.len();
    let samples: Arc<[u8]> = Arc::from(format!("{head}{}{tail}", "x".repeat(pad)).into_bytes());
    assert_eq!(samples.len(), 1 << 20);
    for t in &plan.targets {
        let files = assemble::Files {
            serve_bin: "infer-serve".into(),
            model: "model.onnx".into(),
            engine: None,
            engine_profile: None,
            warmup_samples: Some(samples.clone()),
            tokenizer: None,
            dim_names: Vec::new(),
            table_rows: Vec::new(),
            base: None,
            library: None,
        };
        let spec = assemble::target_spec(&recipe, t, files).unwrap();
        let shipped = spec
            .extra_files
            .values()
            .find(|b| b.len() == 1 << 20)
            .expect("samples shipped");
        assert!(
            Arc::ptr_eq(shipped, &samples),
            "target {} copied the samples",
            t.id
        );
        let e = infer_build::oci::Entry::bytes("s", 0o644, shipped.clone());
        let Source::Bytes(b) = &e.source else {
            panic!()
        };
        assert!(Arc::ptr_eq(b, &samples));
    }
    // Each target holds a reference, none a copy.
    assert_eq!(Arc::strong_count(&samples), 1);
}

/// A gzip bomb in a slim input (1 MB that uncompresses to over 1 GiB) is stopped by the
/// expansion bound instead of being decompressed and hashed whole.
#[test]
fn slim_stops_a_gzip_bomb() {
    use infer_build::slim::{flatten, read_layout};
    let t = tempfile::tempdir().unwrap();
    // Quick to make, never held whole.
    let bomb = gzip_bomb();
    let dir = t.path().join("bomb");
    // The diff_id is not checked by `flatten`; any value will do.
    make_layout(&dir, &[(bomb, sha256(b"unused"))], None, json!({}));
    let e = flatten(&read_layout(&dir, None).unwrap()).unwrap_err();
    assert!(e.to_string().contains("decompression bomb"), "{e}");
    assert!(e.to_string().contains(&dir.display().to_string()), "{e}");
    assert!(e.is_bad_input(), "{e}");
}

/// A gzip layer of one tar entry that uncompresses past 1 GiB (the expansion bound of a small
/// layer): gzip members concatenate, so it is one member of a tar header, then the same
/// compressed MiB of zeros over and over, then the end-of-archive blocks.
fn gzip_bomb() -> Vec<u8> {
    let gz = |bytes: &[u8]| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    };
    let size: u64 = (1 << 30) + (64 << 20);
    let mut h = tar::Header::new_gnu();
    h.set_path("zeros").unwrap();
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut bomb = gz(h.as_bytes());
    let mib = gz(&vec![0u8; 1 << 20]);
    for _ in 0..size >> 20 {
        bomb.extend_from_slice(&mib);
    }
    bomb.extend_from_slice(&gz(&[0u8; 1024]));
    assert!(bomb.len() < 8 << 20, "{} bytes", bomb.len());
    bomb
}

/// A gzip layer of `n` directory entries under `prefix/` (small once compressed).
fn many_dirs(prefix: &str, n: usize) -> (Vec<u8>, String) {
    let mut tar = tar::Builder::new(Vec::new());
    for i in 0..n {
        let mut h = tar::Header::new_gnu();
        h.set_path(format!("{prefix}/d{i}/")).unwrap();
        h.set_size(0);
        h.set_mode(0o755);
        h.set_entry_type(tar::EntryType::Directory);
        h.set_cksum();
        tar.append(&h, std::io::empty()).unwrap();
    }
    let tar = tar.into_inner().unwrap();
    let diff_id = sha256(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    (gz.finish().unwrap(), diff_id)
}

/// `bytes` as a blob of the layout at `dir`; its digest.
fn put_blob(dir: &Path, bytes: &[u8]) -> String {
    let d = sha256(bytes);
    std::fs::write(blob(dir, &d), bytes).unwrap();
    d
}

/// Replace the one manifest of the layout at `dir` by `edit` of its bytes (`index.json`
/// updated to the new digest and size).
fn rewrite_manifest(dir: &Path, edit: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    let mut idx: Value =
        serde_json::from_slice(&std::fs::read(dir.join("index.json")).unwrap()).unwrap();
    let md = idx["manifests"][0]["digest"].as_str().unwrap().to_string();
    let bytes = edit(std::fs::read(blob(dir, &md)).unwrap());
    idx["manifests"][0]["size"] = json!(bytes.len());
    idx["manifests"][0]["digest"] = json!(put_blob(dir, &bytes));
    std::fs::write(dir.join("index.json"), serde_json::to_vec(&idx).unwrap()).unwrap();
}

/// Replace the config of the layout at `dir` by `edit` of its bytes (manifest rewritten).
fn rewrite_config(dir: &Path, edit: impl FnOnce(Vec<u8>) -> Vec<u8>) {
    rewrite_manifest(dir, |m| {
        let mut m: Value = serde_json::from_slice(&m).unwrap();
        let cd = m["config"]["digest"].as_str().unwrap().to_string();
        let bytes = edit(std::fs::read(blob(dir, &cd)).unwrap());
        m["config"]["size"] = json!(bytes.len());
        m["config"]["digest"] = json!(put_blob(dir, &bytes));
        serde_json::to_vec(&m).unwrap()
    });
}

/// `bytes` with every `from` replaced by `to`.
fn replace(bytes: &[u8], from: &str, to: &[u8]) -> Vec<u8> {
    let (text, from) = (bytes.to_vec(), from.as_bytes());
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    assert_ne!(out, bytes, "nothing to replace");
    out
}

/// `{"x":<value>,` in front of a JSON object's fields: a field of raw bytes.
fn with_field(bytes: &[u8], value: &[u8]) -> Vec<u8> {
    let mut out = b"{\"x\":".to_vec();
    out.extend_from_slice(value);
    out.push(b',');
    out.extend_from_slice(&bytes[1..]);
    out
}

/// The hostile layout of one row of the threat model's exit-code table, at `dir`.
fn hostile_layout(case: &str, dir: &Path, outside: &Path) {
    let one = || vec![layer(&[(b"a", b"a")])];
    match case {
        "layer-wrong-diff-id" => {
            make_layout(dir, &one(), Some(vec![sha256(b"not it")]), json!({}));
            return;
        }
        "layer-not-gzip" => {
            let l = (b"not gzip at all".to_vec(), sha256(b"unused"));
            make_layout(dir, &[l], None, json!({}));
            return;
        }
        // The diff_id is right for nothing: the bomb stops before it is compared.
        "layer-gzip-bomb" => {
            make_layout(dir, &[(gzip_bomb(), sha256(b"unused"))], None, json!({}));
            return;
        }
        "layer-many-entries" => {
            let layers: Vec<_> = (0..3).map(|i| many_dirs(&format!("l{i}"), 2000)).collect();
            make_layout(dir, &layers, None, json!({}));
            return;
        }
        "manifest-too-many-layers" => {
            make_layout(dir, &vec![layer(&[(b"a", b"a")]); 1001], None, json!({}));
            return;
        }
        _ => {}
    }
    let (digests, md) = make_layout(dir, &one(), None, json!({}));
    let index = || std::fs::read(dir.join("index.json")).unwrap();
    let set_index = |b: Vec<u8>| std::fs::write(dir.join("index.json"), b).unwrap();
    match case {
        "index-not-json" => set_index(b"{\"schemaVersion\": 2, \"manifests\": [".to_vec()),
        "index-not-utf8" => set_index(with_field(&index(), b"\"\xff\xfe\"")),
        "index-uppercase-digest" => set_index(replace(
            &index(),
            &md[7..],
            md[7..].to_uppercase().as_bytes(),
        )),
        "index-dotdot-digest" => set_index(replace(&index(), &md, b"sha256:../../../etc/passwd")),
        "index-huge-size" => {
            let size = std::fs::metadata(blob(dir, &md)).unwrap().len();
            set_index(replace(
                &index(),
                &format!("\"size\":{size}"),
                b"\"size\":1e400",
            ))
        }
        "index-oversized" => set_index(with_field(&index(), &vec![b'1'; 5 << 20])),
        "manifest-not-json" => rewrite_manifest(dir, |_| b"<manifest/>".to_vec()),
        "manifest-uppercase-digest" => rewrite_manifest(dir, |m| {
            replace(
                &m,
                &digests[0][7..],
                digests[0][7..].to_uppercase().as_bytes(),
            )
        }),
        "manifest-dotdot-digest" => {
            rewrite_manifest(dir, |m| replace(&m, &digests[0], b"sha256:../../x"))
        }
        "manifest-huge-size" => rewrite_manifest(dir, |m| {
            let mut m: Value = serde_json::from_slice(&m).unwrap();
            m["layers"][0]["size"] = json!("@size@");
            replace(&serde_json::to_vec(&m).unwrap(), "\"@size@\"", b"1e400")
        }),
        "manifest-corrupt" => {
            let mut b = std::fs::read(blob(dir, &md)).unwrap();
            let n = b.len() - 2;
            b[n] = b' ';
            std::fs::write(blob(dir, &md), b).unwrap();
        }
        "config-not-utf8" => rewrite_config(dir, |c| with_field(&c, b"\"\xff\xfe\"")),
        "config-huge-number" => rewrite_config(dir, |c| with_field(&c, b"1e400")),
        "layer-missing" => std::fs::remove_file(blob(dir, &digests[0])).unwrap(),
        "layer-symlink" => {
            let target = outside.join("layer");
            std::fs::rename(blob(dir, &digests[0]), &target).unwrap();
            symlink(&target, blob(dir, &digests[0])).unwrap();
        }
        _ => panic!("the table names case `{case}`, which this test cannot build: add it here"),
    }
}

/// The rows of the exit-code table of `docs/threat-model.md`: case, commands, exit code and
/// the phrases of which the message holds one.
fn exit_code_table() -> Vec<(String, Vec<String>, i32, Vec<String>)> {
    let doc = include_str!("../../docs/threat-model.md");
    let section = doc
        .split("## Exit codes")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/threat-model.md has an `## Exit codes` section");
    let quoted = |cell: &str| -> Vec<String> {
        cell.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 5, "a row of five cells: {l}");
            let case = quoted(cells[0]).remove(0);
            let commands = cells[2].split(',').map(|c| c.trim().to_string()).collect();
            let code = cells[3]
                .parse()
                .unwrap_or_else(|_| panic!("exit code: {l}"));
            (case, commands, code, quoted(cells[4]))
        })
        .collect()
}

/// Every row of the threat model's exit-code table: its hostile layout is built, and each
/// command the row lists is run on it (`inspect`, `push` and `slim` as the binary, `build
/// --base-layout` through `assemble::build`, the library call it makes, with the exit code
/// `error::Error::exit_code` gives the CLI): the exit code is the table's, and the message
/// names the layout and holds one of the row's phrases. `build` never names its output.
#[test]
fn every_hostile_layout_of_the_table_is_exit_2_naming_its_layout() {
    let rows = exit_code_table();
    assert!(rows.len() >= 20, "{} rows", rows.len());
    let t = tempfile::tempdir().unwrap();
    inputs(t.path());
    let outside = t.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let def = t.path().join("hostile.toml");
    std::fs::write(
        &def,
        "name = \"hostile\"\nengine = \"full\"\n[base]\nreference = \"localhost/h/base:1\"\n\
         [builder]\nreference = \"localhost/h/builder:1\"\n[[select]]\npaths = [\"/a\"]\n",
    )
    .unwrap();
    let mut failures = Vec::new();
    for (case, commands, want, phrases) in &rows {
        let dir = t.path().join(case);
        hostile_layout(case, &dir, &outside);
        let shown = dir.display().to_string();
        for command in commands {
            let start = Instant::now();
            let out = t.path().join(format!("out-{case}-{command}"));
            let (code, message) = match command.as_str() {
                "build" => match build_into(&out, &[gpu_target(t.path(), &dir)]) {
                    Ok(_) => (0, String::new()),
                    Err(e) => {
                        let e = infer_build::Error::from(e);
                        let mut m = e.to_string();
                        let mut source = std::error::Error::source(&e);
                        while let Some(c) = source {
                            m.push_str(&format!("\n  caused by: {c}"));
                            source = c.source();
                        }
                        assert!(
                            !m.contains(&out.display().to_string()),
                            "{case}: build names its output: {m}"
                        );
                        (e.exit_code(), m)
                    }
                },
                "inspect" | "push" | "slim" => {
                    let mut cmd = infer_build();
                    cmd.env("INFER_BUILD_SLIM_MAX_ENTRIES", "5000");
                    match command.as_str() {
                        "inspect" => cmd.arg("inspect").arg(&dir),
                        // Nothing listens there: a layout that passes reaches the network
                        // and fails with 1, a refused one never connects.
                        "push" => cmd.arg("push").arg(&dir).args([
                            "--to",
                            "127.0.0.1:9/hostile",
                            "--insecure",
                        ]),
                        _ => cmd
                            .args(["slim", "--allow-unpinned", "--definition"])
                            .arg(&def)
                            .arg("--base-layout")
                            .arg(&dir)
                            .arg("--builder-layout")
                            .arg(&dir)
                            .arg("--out")
                            .arg(&out),
                    };
                    let o = cmd.output().unwrap();
                    (o.status.code().unwrap_or(-1), stderr(&o))
                }
                other => panic!("{case}: unknown command `{other}` in the table"),
            };
            let elapsed = start.elapsed();
            if code != *want
                || !message.contains(&shown)
                || !phrases.iter().any(|p| message.contains(p.as_str()))
            {
                failures.push(format!(
                    "{case} / {command}: exit {code} (want {want}), message should name {shown} and hold one of {phrases:?}:\n{message}"
                ));
            }
            assert!(
                elapsed < Duration::from_secs(60),
                "{case} / {command} took {elapsed:?}"
            );
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Slim bounds what it holds across layers: each of these layers is small and far under any
/// per-layer bound, together they pass the budget, and the refusal names the image, its
/// layout, the layer and the bound. The byte bound and the name bound hold the same way.
#[test]
fn slim_bounds_the_whole_tree_across_layers() {
    use infer_build::slim::{flatten_within, read_layout, Budget, MAX_ENTRIES};
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("many");
    let layers: Vec<_> = (0..3).map(|i| many_dirs(&format!("l{i}"), 3000)).collect();
    assert!(layers.iter().all(|(b, _)| b.len() < 200_000));
    make_layout(&dir, &layers, None, json!({}));
    let img = read_layout(&dir, None).unwrap();
    let start = Instant::now();
    let e = flatten_within(&img, "base", &mut Budget::new(8000, 1 << 30)).unwrap_err();
    let m = e.to_string();
    assert!(
        m.contains("the base image in") && m.contains(&dir.display().to_string()),
        "{m}"
    );
    assert!(
        m.contains("more than 8000 entries by its layer 3 of 3"),
        "{m}"
    );
    assert!(e.is_bad_input());
    assert!(start.elapsed() < Duration::from_secs(20));
    // Within the bound, the budget is spent for the next image.
    let mut budget = Budget::new(10_000, 1 << 30);
    let (tree, _) = flatten_within(&img, "base", &mut budget).unwrap();
    assert_eq!(tree.len(), 9003);
    let e = flatten_within(&img, "builder", &mut budget)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("the builder image") && e.contains("layer 1 of 3"),
        "{e}"
    );
    // The byte bound.
    let e = flatten_within(&img, "base", &mut Budget::new(MAX_ENTRIES, 100_000))
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than 100000 bytes"), "{e}");
    // The default is the documented bound; the test knob only lowers it.
    assert!(Budget::default().max_entries <= MAX_ENTRIES);
    // A path longer than PATH_MAX is refused.
    let long = format!("{}f", "x/".repeat(2100));
    let dir = t.path().join("long");
    make_layout(&dir, &[layer_with_long_name(&long)], None, json!({}));
    let e = infer_build::slim::flatten(&read_layout(&dir, None).unwrap())
        .unwrap_err()
        .to_string();
    assert!(e.contains("more than the 4096 accepted"), "{e}");
}

/// A gzip layer of one file whose (GNU long) name is `name`.
fn layer_with_long_name(name: &str) -> (Vec<u8>, String) {
    let mut tar = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut h, name, &b"x"[..]).unwrap();
    let tar = tar.into_inner().unwrap();
    let diff_id = sha256(&tar);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    (gz.finish().unwrap(), diff_id)
}
