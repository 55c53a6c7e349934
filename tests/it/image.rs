//! `infer-build build` / `inspect` end to end through the CLI: reproducible digests, the
//! cache, kill -9 in the middle of a build, refused inputs, and
//! (with a Docker engine) `docker load` + `docker run` of the archive.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use infer_build::assemble::LayerSource;
use infer_build::report::{BuildOutput, InspectedImage};

use super::support::{
    build_output, docker_load, docker_port, have_docker, have_tool, infer_build, inspect, python,
    root, stderr, stdout,
};

/// A minimal statically linked x86-64 ELF that exits 0: a stand-in runtime for tests that do
/// not serve (the Docker serving test uses the real one).
pub(crate) fn tiny_static_elf(path: &Path) {
    tiny_elf(path, None, b"");
}

/// A stand-in for the dynamically linked runtime flavours (GPU images, ONNX Runtime images):
/// like them it names a program interpreter (`PT_INTERP`), which `build` checks, and, for GPU
/// images, the release of the TensorRT headers its backend would be compiled against
/// (`infer_spec::engine::TENSORRT_HEADERS_MARKER`). It is never run.
pub(crate) fn tiny_dynamic_elf(path: &Path, tensorrt_headers: Option<&str>) {
    let marker = tensorrt_headers
        .map(|h| format!("{}{h};", infer_spec::engine::TENSORRT_HEADERS_MARKER))
        .unwrap_or_default();
    tiny_elf(
        path,
        Some(b"/lib64/ld-linux-x86-64.so.2\0"),
        marker.as_bytes(),
    );
}

/// An x86-64 executable of one loaded segment whose code exits 0: the ELF header, a
/// `PT_INTERP` program header when `interp` is given, a `PT_LOAD` one, the interpreter's path,
/// the code, then `trailer`.
fn tiny_elf(path: &Path, interp: Option<&[u8]>, trailer: &[u8]) {
    let code: [u8; 9] = [0xb8, 60, 0, 0, 0, 0x31, 0xff, 0x0f, 0x05]; // exit(0)
    let base: u64 = 0x40_0000;
    let interp = interp.unwrap_or_default();
    let phnum: u16 = if interp.is_empty() { 1 } else { 2 };
    let headers = 64 + 56 * u64::from(phnum);
    let n = interp.len() as u64;
    let total = headers + n + code.len() as u64;
    let mut b = Vec::new();
    b.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    b.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    b.extend_from_slice(&62u16.to_le_bytes()); // x86-64
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(base + headers + n).to_le_bytes()); // entry
    b.extend_from_slice(&64u64.to_le_bytes()); // phoff
    b.extend_from_slice(&0u64.to_le_bytes()); // shoff
    b.extend_from_slice(&0u32.to_le_bytes());
    for v in [64u16, 56, phnum, 0, 0, 0] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    if !interp.is_empty() {
        b.extend_from_slice(&3u32.to_le_bytes()); // PT_INTERP
        b.extend_from_slice(&4u32.to_le_bytes()); // R
        for v in [headers, base + headers, base + headers, n, n, 1] {
            b.extend_from_slice(&v.to_le_bytes());
        }
    }
    b.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    b.extend_from_slice(&5u32.to_le_bytes()); // R+X
    for v in [0, base, base, total, total, 0x1000] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(interp);
    b.extend_from_slice(&code);
    b.extend_from_slice(trailer);
    std::fs::write(path, b).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A fresh copy of the example recipe and model, and a stand-in runtime.
pub(crate) struct Example {
    dir: tempfile::TempDir,
}

impl Example {
    pub(crate) fn new() -> Example {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path().join("recipe");
        std::fs::create_dir(&r).unwrap();
        for f in ["recipe.toml", "mlp.onnx"] {
            std::fs::copy(root().join("examples/mlp").join(f), r.join(f)).unwrap();
        }
        tiny_static_elf(&dir.path().join("infer-serve"));
        Example { dir }
    }
    fn recipe(&self) -> PathBuf {
        self.dir.path().join("recipe/recipe.toml")
    }
    pub(crate) fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
    pub(crate) fn cmd(&self, out: &str, extra: &[&str]) -> Command {
        let mut c = infer_build();
        c.arg("build")
            .arg(self.recipe())
            .arg("--out")
            .arg(self.path(out));
        c.arg("--runtime").arg(self.path("infer-serve")).args(extra);
        c.env("SOURCE_DATE_EPOCH", "1700000000");
        c
    }
    fn build(&self, out: &str, extra: &[&str]) -> BuildOutput {
        build_output(
            &self
                .cmd(out, &[extra, &["--json"]].concat())
                .output()
                .unwrap(),
        )
    }
}

/// The index digest and every target's manifest digest of a build.
fn digests(v: &BuildOutput) -> (String, Vec<String>) {
    let t = v
        .targets
        .iter()
        .map(|t| t.manifest_digest.to_string())
        .collect();
    (v.index.digest.to_string(), t)
}

/// What each layer of an inspected image holds, in order (`dev.infer-build.layer`).
fn roles(img: &InspectedImage) -> Vec<&str> {
    img.layers
        .iter()
        .map(|l| l.role.as_deref().unwrap_or("?"))
        .collect()
}

#[test]
fn example_is_reproducible_from_clean_after_touch_and_umask() {
    let ex = Example::new();
    let a = ex.build("a", &[]);
    let b = ex.build("b", &[]);
    assert_eq!(digests(&a), digests(&b));
    assert_eq!(
        std::fs::read(ex.path("a/index.json")).unwrap(),
        std::fs::read(ex.path("b/index.json")).unwrap()
    );
    // Touch every input, rewrite it under umask 077, and build under umask 077 too.
    let script = "umask 077; for f in recipe/recipe.toml recipe/mlp.onnx infer-serve; do cp -p $f $f.tmp && rm $f && cat $f.tmp > $f && rm $f.tmp && touch $f; done; chmod +x infer-serve";
    let st = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(ex.dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    let mut c = Command::new("sh");
    c.arg("-c").arg(format!(
        "umask 077; exec '{}' build '{}' --out '{}' --runtime '{}' --json",
        env!("CARGO_BIN_EXE_infer-build"),
        ex.recipe().display(),
        ex.path("c").display(),
        ex.path("infer-serve").display()
    ));
    c.env("SOURCE_DATE_EPOCH", "1700000000");
    let o = c.output().unwrap();
    assert_eq!(digests(&a), digests(&build_output(&o)));

    // SOURCE_DATE_EPOCH is part of the image.
    let o = ex
        .cmd("d", &["--json"])
        .env("SOURCE_DATE_EPOCH", "0")
        .output()
        .unwrap();
    assert_ne!(digests(&a), digests(&build_output(&o)));
}

#[test]
fn noop_rebuild_reads_nothing_and_inspect_reports_the_layout() {
    let ex = Example::new();
    let first = ex.build("out", &[]);
    assert!(first.targets[0]
        .layers
        .iter()
        .all(|l| l.cache == LayerSource::Miss));
    let again = ex.build("out", &[]);
    assert_eq!(digests(&first), digests(&again));
    assert!(again.targets[0]
        .layers
        .iter()
        .all(|l| l.cache == LayerSource::Stat));

    let v = inspect(&ex.path("out"));
    let img = &v.images[0];
    assert_eq!(img.tags, ["1.0.0-cpu-fp32"]);
    assert_eq!(img.manifest_digest, first.targets[0].manifest_digest);
    // The CPU target went through the engine stage: its engine replaces the ONNX layer.
    assert_eq!(roles(img), ["infer-serve", "engine", "config"]);
    assert_eq!(img.config.user.as_deref(), Some("65532:65532"));
    assert_eq!(img.annotations["dev.infer-build.target"], "cpu-fp32");
    assert_eq!(v.indexes[0].tags, ["1.0.0"]);
    let o = infer_build()
        .arg("inspect")
        .arg(ex.path("out"))
        .output()
        .unwrap();
    assert!(
        stderr(&o).contains("infer-serve") && stderr(&o).contains("total"),
        "{}",
        stderr(&o)
    );
    let o = infer_build()
        .arg("inspect")
        .arg(ex.path("nope"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

fn copy_tree(from: &Path, to: &Path) {
    for e in walkdir::WalkDir::new(from) {
        let e = e.unwrap();
        let dest = to.join(e.path().strip_prefix(from).unwrap());
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&dest).unwrap();
        } else if e.file_type().is_file() {
            std::fs::copy(e.path(), &dest).unwrap();
        }
    }
}

/// `build --engines DIR` with the engine of a separate `engine` run (a CI job's cache copied
/// under one artifact folder): the image ships the verified engine with its metadata and
/// profile, the engine's tuple and start-up measurement become annotations, revision and
/// source are recorded; a changed plan falls back to the ONNX model for a CPU target, and a
/// tampered engine file is refused.
#[test]
fn build_assembles_engines_from_separate_engine_runs() {
    let ex = Example::new();
    let o = infer_build()
        .arg("engine")
        .arg(ex.recipe())
        .args(["--target", "cpu-fp32", "--json", "--cache"])
        .arg(ex.path("job-cpu"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let engine: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let digest = engine["engine_digest"].as_str().unwrap().to_string();
    let artifacts = ex.path("artifacts");
    copy_tree(&ex.path("job-cpu"), &artifacts.join("job-cpu"));

    let engines = artifacts.to_str().unwrap();
    let flags = [
        "--engines",
        engines,
        "--revision",
        "0123abc",
        "--source",
        "https://example.com/models",
    ];
    let v = ex.build("out", &flags);
    let i = inspect(&ex.path("out"));
    let ann = &i.images[0].annotations;
    assert_eq!(ann["dev.infer-build.engine.digest"], digest, "{ann:?}");
    assert_eq!(ann["org.opencontainers.image.revision"], "0123abc");
    assert_eq!(
        ann["org.opencontainers.image.source"],
        "https://example.com/models"
    );
    let load: f64 = ann["dev.infer-build.startup.engine-load-ms"]
        .parse()
        .unwrap();
    assert!(load > 0.0, "{ann:?}");
    // The engine, its metadata and its profile are in the image.
    let manifest = v.targets[0].manifest_digest.as_str();
    let img = infer_build::slim::read_layout(&ex.path("out"), Some(manifest)).unwrap();
    let (tree, _) = infer_build::slim::flatten(&img).unwrap();
    let names: Vec<&String> = tree
        .iter()
        .map(|(p, _)| p)
        .filter(|p| p.contains("opt/infer/model/"))
        .collect();
    let has = |n: &str| names.iter().any(|p| p.ends_with(n));
    let file = match engine["meta"]["format"].as_str().unwrap() {
        "tract-nnef-tar" => "/model.nnef.tar",
        _ => "/model.onnx",
    };
    assert!(
        has("/engine.json") && has("/profile.json") && has(file),
        "{names:?}"
    );
    // Same inputs, same digests.
    assert_eq!(digests(&v), digests(&ex.build("out2", &flags)));

    // No engine for the CPU target under the folder: it runs the engine stage, and says so.
    std::fs::create_dir(ex.path("empty")).unwrap();
    let empty = ex.path("empty");
    let o = ex
        .cmd("out3", &["--engines", empty.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("running the engine stage"),
        "{}",
        stderr(&o)
    );

    // The plan changed (other batch sizes): the stale engine is refused, and what differs named.
    let recipe = std::fs::read_to_string(ex.recipe()).unwrap();
    std::fs::write(
        ex.recipe(),
        recipe.replace(
            "preferred_batch_sizes = [8, 16, 32]",
            "preferred_batch_sizes = [4, 16, 32]",
        ),
    )
    .unwrap();
    let o = ex.cmd("out3", &["--engines", engines]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("planned batch sizes: plan [1, 4, 16, 32], engine [1, 8, 16, 32]"),
        "{}",
        stderr(&o)
    );
    std::fs::write(ex.recipe(), &recipe).unwrap();

    // A tampered engine file is refused by its digest.
    let file = walkdir::WalkDir::new(&artifacts)
        .into_iter()
        .map(|e| e.unwrap().into_path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n == "model.nnef.tar" || n == "model.onnx")
        })
        .expect("the engine file");
    let mut bytes = std::fs::read(&file).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&file, bytes).unwrap();
    let o = ex.cmd("out4", &["--engines", engines]).output().unwrap();
    assert!(!o.status.success());
    assert!(stderr(&o).contains("digest"), "{}", stderr(&o));
}

/// Two builds into the same layout at once (two CI jobs sharing a cache directory): the
/// second waits for the first's lock, both succeed with the same digests, and every blob in
/// the layout hashes to its name.
#[test]
fn two_concurrent_builds_of_one_layout_agree() {
    let ex = Example::new();
    let spawn = || {
        ex.cmd("out", &["--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (a, b) = (spawn(), spawn());
    let (a, b) = (a.wait_with_output().unwrap(), b.wait_with_output().unwrap());
    let (va, vb) = (build_output(&a), build_output(&b));
    assert_eq!(digests(&va), digests(&vb));
    // Every blob in the store hashes to its name.
    let blobs = ex.path("out/blobs/sha256");
    for e in std::fs::read_dir(&blobs).unwrap() {
        let p = e.unwrap().path();
        let bytes = std::fs::read(&p).unwrap();
        let hex = super::support::sha256_hex(&bytes);
        assert_eq!(
            p.file_name().unwrap().to_string_lossy(),
            hex,
            "{}",
            p.display()
        );
    }
    // And a third build after both is a pure cache hit with the same digests.
    let again = ex.build("out", &[]);
    assert_eq!(digests(&again), digests(&va));
}

#[test]
fn refuses_dynamic_runtimes_escaping_models_and_bad_flags() {
    let ex = Example::new();
    let mut c = infer_build();
    c.arg("build")
        .arg(ex.recipe())
        .arg("--out")
        .arg(ex.path("o"));
    let o = c
        .arg("--runtime")
        .arg(env!("CARGO_BIN_EXE_infer-build"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("dynamically linked")
            && stderr(&o).contains("scripts/build-runtime.sh"),
        "{}",
        stderr(&o)
    );

    let o = ex
        .cmd("o", &[])
        .env_remove("INFER_SERVE_BIN")
        .output()
        .unwrap();
    assert!(o.status.success(), "--runtime is given: {}", stderr(&o));
    // A copy of infer-build with no infer-serve beside it, and no INFER_SERVE_BIN.
    std::fs::create_dir(ex.path("bin")).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_infer-build"),
        ex.path("bin/infer-build"),
    )
    .unwrap();
    let mut c = Command::new(ex.path("bin/infer-build"));
    c.arg("build")
        .arg(ex.recipe())
        .arg("--out")
        .arg(ex.path("o"));
    let o = c.env_remove("INFER_SERVE_BIN").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("INFER_SERVE_BIN"), "{}", stderr(&o));

    // The model is a symlink leaving the recipe directory.
    let outside = ex.path("outside.onnx");
    std::fs::copy(ex.path("recipe/mlp.onnx"), &outside).unwrap();
    std::fs::remove_file(ex.path("recipe/mlp.onnx")).unwrap();
    std::os::unix::fs::symlink(&outside, ex.path("recipe/mlp.onnx")).unwrap();
    let o = ex.cmd("o2", &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("outside the recipe"), "{}", stderr(&o));

    for (flag, val) in [("--output", "tar:x"), ("--compression", "brotli")] {
        let o = ex.cmd("o3", &[flag, val]).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{flag}: {}", stderr(&o));
    }
}

#[test]
fn kill_9_mid_build_leaves_no_partial_blob_and_the_rebuild_matches() {
    let ex = Example::new();
    // A 96 MiB file in the config layer (warm-up samples, shipped as they are) compressed at
    // gzip -6: seconds of work to interrupt. (The model must stay a real one: the engine stage
    // refuses what tract cannot load.)
    // A valid sample request whose request-level parameter carries 96 MiB of pseudo-random
    // text (the V2 protocol lets a request carry any parameters; warm-up ignores this one).
    let big: String = (0..96u32 << 20)
        .map(|i| char::from(b'a' + ((i.wrapping_mul(2_654_435_761) >> 15) % 26) as u8))
        .collect();
    let sample = mlp_samples(&[1]);
    let sample = sample.replacen(
        "{\"inputs\"",
        &format!("{{\"parameters\": {{\"pad\": \"{big}\"}}, \"inputs\""),
        1,
    );
    drop(big);
    std::fs::write(ex.path("recipe/warmup.json"), &sample).unwrap();
    drop(sample);
    let recipe = std::fs::read_to_string(ex.recipe()).unwrap();
    std::fs::write(
        ex.recipe(),
        format!("{recipe}\n[warmup]\nsamples = \"warmup.json\"\n"),
    )
    .unwrap();
    let mut child = ex
        .cmd("out", &["--compression", "gzip"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the model layer is being written (a temp file is growing), then SIGKILL.
    let tmp = ex.path("out/.infer-build/tmp");
    let start = Instant::now();
    loop {
        let growing = std::fs::read_dir(&tmp)
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.metadata().map(|m| m.len() > 64 << 10).unwrap_or(false))
            })
            .unwrap_or(false);
        if growing {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the build finished before it could be killed"
        );
        assert!(start.elapsed() < Duration::from_secs(120));
        std::thread::sleep(Duration::from_millis(20));
    }
    let st = Command::new("kill")
        .arg("-9")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let _ = child.wait();
    // Every visible blob is complete: its name is its content's digest.
    for e in std::fs::read_dir(ex.path("out/blobs/sha256"))
        .unwrap()
        .flatten()
    {
        let bytes = std::fs::read(e.path()).unwrap();
        let name = e.file_name().into_string().unwrap();
        assert_eq!(
            infer_build::oci::Digest::of(&bytes).hex(),
            name,
            "partial blob visible"
        );
    }
    assert!(!ex.path("out/index.json").exists());
    let after = ex.build("out", &["--compression", "gzip"]);
    let clean = ex.build("clean", &["--compression", "gzip"]);
    assert_eq!(digests(&after), digests(&clean));
    assert_eq!(
        std::fs::read_dir(&tmp).unwrap().count(),
        0,
        "leftover temp files were removed"
    );
}

/// The image runs under Docker: `docker load` of the oci-archive, then `docker run` of the
/// CPU image. With the stand-in runtime this proves Docker accepts and starts the image.
/// The split layout's three manifests: (runtime, model, ModelPack) digests.
fn split_digests(v: &BuildOutput) -> [String; 3] {
    let s = &v.split[0];
    [
        s.runtime.manifest_digest.to_string(),
        s.model.manifest_digest.to_string(),
        s.modelpack_digest.to_string(),
    ]
}

#[test]
fn the_split_layout_is_reproducible_and_its_runtime_image_owes_nothing_to_the_model() {
    let ex = Example::new();
    let split = ["--image-layout", "split"];
    let a = ex.build("a", &split);
    let b = ex.build("b", &split);
    assert_eq!(split_digests(&a), split_digests(&b));
    // The combined image is the one a combined build writes.
    let combined = ex.build("c", &[]);
    assert_eq!(digests(&a).1, digests(&combined).1);
    assert!(combined.split.is_empty(), "{combined:?}");
    // Another build time: new model image, same runtime image.
    let o = ex
        .cmd("d", &["--json", "--image-layout", "split"])
        .env("SOURCE_DATE_EPOCH", "0")
        .output()
        .unwrap();
    let (sa, sd) = (split_digests(&a), split_digests(&build_output(&o)));
    assert_eq!(sa[0], sd[0]);
    assert_ne!(sa[1], sd[1]);
    // Another model (other batching, other version): the same runtime image again.
    let recipe = ex.recipe();
    let text = std::fs::read_to_string(&recipe).unwrap();
    let changed = text.replacen("version = \"1.0.0\"", "version = \"1.0.1\"", 1);
    assert_ne!(text, changed, "the example's version moved: {text}");
    std::fs::write(&recipe, changed).unwrap();
    let e = ex.build("e", &split);
    assert_eq!(split_digests(&e)[0], sa[0]);
    assert_ne!(split_digests(&e)[1], sa[1]);
    // One uncompressed layer per model file, the ModelPack manifest over the same blobs.
    let doc = inspect(&ex.path("a"));
    let by_part = |part: &str| {
        doc.images
            .iter()
            .find(|i| i.part.as_deref() == Some(part))
            .unwrap_or_else(|| panic!("no {part} image: {doc:?}"))
    };
    let model = by_part("model");
    assert!(model.layers.len() >= 3, "{model:?}");
    for l in &model.layers {
        assert_eq!(
            l.media_type, "application/vnd.oci.image.layer.v1.tar",
            "{l:?}"
        );
    }
    let mp = doc
        .images
        .iter()
        .find(|i| i.artifact_type.as_deref() == Some("application/vnd.cncf.model.manifest.v1+json"))
        .unwrap();
    assert_eq!(
        mp.pairs_with.as_deref(),
        Some(model.manifest_digest.as_str())
    );
    let digests_of = |img: &InspectedImage| -> Vec<String> {
        img.layers.iter().map(|l| l.digest.to_string()).collect()
    };
    assert_eq!(digests_of(mp), digests_of(model));
    assert_eq!(
        by_part("runtime").config.cmd.as_deref(),
        Some(
            &[
                "--config".to_string(),
                "/etc/infer/runtime.toml".to_string()
            ][..]
        )
    );
    // A bundle file is one combined image: the split layout is refused, saying why.
    let bundle = ex.path("recipe/bundle.toml");
    std::fs::write(
        &bundle,
        "[bundle]\nname = \"b\"\nversion = \"1\"\nmodels = [\"recipe.toml\"]\n",
    )
    .unwrap();
    let o = infer_build()
        .arg("build")
        .arg(&bundle)
        .args(["--image-layout", "split", "--runtime"])
        .arg(ex.path("infer-serve"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("bundle file"), "{}", stderr(&o));
}

#[test]
fn docker_load_and_run_the_archive() {
    if !have_docker("docker_load_and_run_the_archive") {
        return;
    }
    let ex = Example::new();
    let archive = ex.path("mlp.tar");
    let v = ex.build(
        "out",
        &["--output", &format!("oci-archive:{}", archive.display())],
    );
    assert_eq!(v.archive, Some(archive.display().to_string()));
    let tag = "localhost/infer-build/mlp:1.0.0-cpu-fp32";
    let loaded = docker_load(&archive);
    assert!(loaded.contains(tag), "{loaded}");
    let o = Command::new("docker")
        .args([
            "image",
            "inspect",
            "--format",
            "{{.Id}} {{.Config.User}}",
            tag,
        ])
        .output()
        .unwrap();
    let config = &v.targets[0].config_digest;
    assert_eq!(stdout(&o).trim(), format!("{config} 65532:65532"));
    let o = Command::new("docker")
        .args(["run", "--rm", "--network", "none", tag])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
}

/// The real runtime serving in Docker: ready after warm-up, and an inference equal to
/// onnxruntime's. Needs the statically linked runtime from `scripts/build-runtime.sh`.
#[test]
fn docker_serves_the_example_like_onnxruntime() {
    if !have_docker("docker_serves_the_example_like_onnxruntime") {
        return;
    }
    let script = root().join("scripts/build-runtime.sh");
    let serve = match std::env::var("INFER_SERVE_BIN") {
        Ok(p) if !p.is_empty() => PathBuf::from(p),
        _ if !script.exists() => {
            eprintln!("skipping docker_serves_the_example_like_onnxruntime: no INFER_SERVE_BIN and no scripts/build-runtime.sh in this checkout");
            return;
        }
        _ => {
            let o = Command::new(&script)
                .current_dir(root())
                .stderr(Stdio::inherit())
                .output()
                .unwrap();
            assert!(o.status.success(), "scripts/build-runtime.sh failed");
            PathBuf::from(stdout(&o).trim().lines().last().unwrap_or_default())
        }
    };
    let ex = Example::new();
    std::fs::copy(&serve, ex.path("infer-serve")).unwrap();
    // Warm-up samples: the image's warm-up sends them (the ready line counts them).
    std::fs::write(ex.path("recipe/warmup.json"), mlp_samples(&[1, 3])).unwrap();
    let recipe = std::fs::read_to_string(ex.recipe()).unwrap();
    std::fs::write(
        ex.recipe(),
        format!("{recipe}\n[warmup]\nsamples = \"warmup.json\"\n"),
    )
    .unwrap();
    let archive = ex.path("mlp.tar");
    ex.build(
        "out",
        &["--output", &format!("oci-archive:{}", archive.display())],
    );
    let tag = "localhost/infer-build/mlp:1.0.0-cpu-fp32";
    docker_load(&archive);
    let o = Command::new("docker")
        .args(["run", "-d", "-p", "127.0.0.1::8000", tag])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let id = stdout(&o).trim().to_string();
    let result = serve_checks(&id, &ex.path("recipe/mlp.onnx"));
    let logs = Command::new("docker")
        .args(["logs", &id])
        .output()
        .map(|o| stderr(&o) + &stdout(&o))
        .unwrap_or_default();
    let _ = Command::new("docker").args(["rm", "-f", &id]).output();
    if let Err(e) = result {
        panic!("{e}\ncontainer logs:\n{logs}");
    }
    assert!(
        logs.contains("\"warmup_samples\":2"),
        "warm-up sent the two samples: {logs}"
    );
}

/// Warm-up sample requests for the example MLP (`input`, FP32 `[rows, 64]`), one request per
/// entry of `rows`.
fn mlp_samples(rows: &[usize]) -> String {
    let reqs: Vec<String> = rows
        .iter()
        .map(|&n| {
            let data: Vec<String> = (0..n * 64).map(|i| format!("{}", (i % 13) as f32 / 13.0)).collect();
            format!(
                r#"{{"inputs": [{{"name": "input", "datatype": "FP32", "shape": [{n}, 64], "data": [{}]}}]}}"#,
                data.join(", ")
            )
        })
        .collect();
    format!("[{}]", reqs.join(",\n"))
}

/// A samples file the model would refuse is refused at `build` (exit 2), naming the recipe's
/// key, the request and the input, and no image is written.
#[test]
fn warmup_samples_the_model_would_refuse_are_refused_at_build() {
    let ex = Example::new();
    let recipe = std::fs::read_to_string(ex.recipe()).unwrap();
    std::fs::write(
        ex.recipe(),
        format!("{recipe}\n[warmup]\nsamples = \"warmup.json\"\n"),
    )
    .unwrap();
    for (text, want) in [
        (
            mlp_samples(&[1, 2]).replacen("[2, 64]", "[2, 63]", 1),
            "request 1: input \"input\": dimension 1 of shape [2, 63] is 63, the model takes 64",
        ),
        (
            mlp_samples(&[40]),
            "request 0: input \"input\": batch of 40 rows: 1 to max_batch_size (32)",
        ),
        ("not json".into(), "not valid JSON"),
    ] {
        std::fs::write(ex.path("recipe/warmup.json"), &text).unwrap();
        let o = ex.cmd("out", &[]).output().unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{e}");
        assert!(
            e.contains("recipe.toml:") && e.contains("warmup.samples"),
            "{e}"
        );
        assert!(e.contains(want), "{e}\nwant: {want}");
        assert!(!ex.path("out/index.json").exists());
    }
}

/// Container `id` (the example MLP, port 8000 published) becomes ready, and an inference equals
/// onnxruntime's on `model`.
pub(crate) fn serve_checks(id: &str, model: &Path) -> Result<(), String> {
    let url = format!("http://{}", docker_port(id, "8000/tcp")?);
    let start = Instant::now();
    loop {
        let code = curl(&[
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            &format!("{url}/v2/health/ready"),
        ]);
        if code.trim() == "200" {
            break;
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!("not ready after 60 s (last status {code:?})"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if !have_tool(
        &python().to_string_lossy(),
        "docker_serves_the_example_like_onnxruntime",
    ) {
        return Err("python with onnxruntime is required for the reference".into());
    }
    let program = r#"
import json, sys, urllib.request, numpy as np, onnxruntime as ort
url, model = sys.argv[1], sys.argv[2]
x = (np.arange(3 * 64, dtype=np.float32).reshape(3, 64) % 17) / 17.0 - 0.5
ref = ort.InferenceSession(model).run(None, {"input": x})[0]
body = {"inputs": [{"name": "input", "shape": [3, 64], "datatype": "FP32", "data": x.flatten().tolist()}]}
req = urllib.request.Request(url + "/v2/models/mlp/infer", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
out = json.load(urllib.request.urlopen(req, timeout=30))["outputs"][0]
got = np.array(out["data"], dtype=np.float32).reshape(out["shape"])
err = float(np.max(np.abs(got - ref)))
print(err)
sys.exit(0 if got.shape == ref.shape and err <= 1e-5 else 1)
"#;
    let o: Output = Command::new(python())
        .arg("-c")
        .arg(program)
        .arg(&url)
        .arg(model)
        .output()
        .map_err(|e| e.to_string())?;
    if !o.status.success() {
        return Err(format!(
            "inference differs from onnxruntime: {} {}",
            stdout(&o),
            stderr(&o)
        ));
    }
    Ok(())
}

fn curl(args: &[&str]) -> String {
    Command::new("curl")
        .args(args)
        .output()
        .map(|o| stdout(&o))
        .unwrap_or_default()
}

/// The shipped MiniLM recipe (`recipes/minilm.toml`, served from text with BERT's tokenizer; its
/// stand-in BERT gathers `input_ids` from word embeddings of 30522 rows, BERT's vocabulary)
/// builds a CPU image whose `runtime.toml` bounds `input_ids` by that table (`table_rows`), so
/// the runtime refuses an id past it; the attention mask indexes nothing and stays unbounded.
#[test]
fn the_minilm_image_bounds_its_token_ids_by_the_embedding_table() {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path().join("recipe");
    std::fs::create_dir_all(r.join("models")).unwrap();
    std::fs::create_dir_all(r.join("tokenizers")).unwrap();
    for file in ["models/minilm.onnx", "tokenizers/bert-base-uncased.json"] {
        std::fs::copy(root().join("recipes").join(file), r.join(file)).unwrap();
    }
    // tract: the CPU engine built here without fetching ONNX Runtime.
    let recipe = std::fs::read_to_string(root().join("recipes/minilm.toml")).unwrap();
    std::fs::write(
        r.join("minilm.toml"),
        format!("{recipe}\n[engine]\ncpu = \"tract\"\n"),
    )
    .unwrap();
    tiny_static_elf(&dir.path().join("infer-serve"));
    let out = dir.path().join("out");
    let o = infer_build()
        .arg("build")
        .arg(r.join("minilm.toml"))
        .args(["--target", "cpu-fp32", "--out"])
        .arg(&out)
        .arg("--runtime")
        .arg(dir.path().join("infer-serve"))
        .env("INFER_BUILD_CACHE_DIR", dir.path().join("cache"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v = inspect(&out);
    let toml = file_in_layer(&out, &v.images[0], "config", "etc/infer/runtime.toml");
    let cfg =
        infer_spec::RuntimeConfig::from_toml_str(std::str::from_utf8(&toml).unwrap()).unwrap();
    let bounds: Vec<(&str, Option<u64>)> = cfg
        .inputs
        .iter()
        .map(|i| (i.name.as_str(), i.table_rows))
        .collect();
    assert_eq!(
        bounds,
        [("attention_mask", None), ("input_ids", Some(30522))]
    );
}

/// The file at `path` in the image's layer of role `role` (`inspect` of `layout`).
fn file_in_layer(layout: &Path, img: &InspectedImage, role: &str, path: &str) -> Vec<u8> {
    let layer = img
        .layers
        .iter()
        .find(|l| l.role.as_deref() == Some(role))
        .unwrap_or_else(|| panic!("no {role} layer: {img:?}"));
    let files = super::support::inspected_layer_files(layout, layer);
    let (_, bytes) = files
        .iter()
        .find(|(p, _)| p.trim_start_matches("./") == path)
        .unwrap_or_else(|| {
            let names: Vec<&str> = files.iter().map(|(p, _)| p.as_str()).collect();
            panic!("no {path} in the {role} layer: {names:?}")
        });
    bytes.clone()
}

/// The example's recipe and a second model (`mlp-b`, with warm-up samples) bundled as `pair`,
/// built once into the layout `a`.
struct Pair {
    ex: Example,
    /// `bundle.toml`, in the example's directory.
    bundle: PathBuf,
    /// The example's recipe, as copied.
    recipe: String,
    /// The report of the build into `a`.
    first: BuildOutput,
}

/// Write `bundle.toml` naming `models` (TOML strings, comma-separated), with its `[deploy]`.
fn write_pair_bundle(bundle: &Path, models: &str) {
    std::fs::write(
        bundle,
        format!("[bundle]\nname = \"pair\"\nversion = \"2.0.0\"\nmodels = [{models}]\n\n[deploy]\nreplicas = {{ min = 2, max = 4 }}\ndrain_delay_s = 7\n"),
    )
    .unwrap();
}

/// `build --json` of the bundle into `out`, which must succeed.
fn build_pair(ex: &Example, bundle: &Path, out: &str) -> BuildOutput {
    let o = infer_build()
        .arg("build")
        .arg(bundle)
        .arg("--out")
        .arg(ex.path(out))
        .arg("--runtime")
        .arg(ex.path("infer-serve"))
        .arg("--json")
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .output()
        .unwrap();
    build_output(&o)
}

/// The scenario's fixture: the two recipes, their bundle, and its build into `a`.
fn build_a_bundle_of_two_recipes() -> Pair {
    let ex = Example::new();
    // A second model: the example's network under another name, with warm-up samples.
    std::fs::create_dir(ex.path("second")).unwrap();
    std::fs::copy(ex.path("recipe/mlp.onnx"), ex.path("second/mlp.onnx")).unwrap();
    std::fs::write(ex.path("second/warmup.json"), mlp_samples(&[2])).unwrap();
    let recipe = std::fs::read_to_string(ex.recipe()).unwrap();
    std::fs::write(
        ex.path("second/recipe.toml"),
        recipe.replace("name = \"mlp\"", "name = \"mlp-b\"")
            + "\n[warmup]\nsamples = \"warmup.json\"\n",
    )
    .unwrap();
    let bundle = ex.path("bundle.toml");
    write_pair_bundle(&bundle, r#""recipe/recipe.toml", "second/recipe.toml""#);
    let first = build_pair(&ex, &bundle, "a");
    Pair {
        ex,
        bundle,
        recipe,
        first,
    }
}

/// `check` names the bundle, its two models and its one target.
fn check_names_the_bundles_models_and_target(p: &Pair) {
    let o = infer_build().arg("check").arg(&p.bundle).output().unwrap();
    assert!(
        o.status.success()
            && stderr(&o).contains("bundle pair of 2 models (mlp, mlp-b), 1 target (cpu-fp32)"),
        "{}",
        stderr(&o)
    );
}

/// The one image is tagged by the bundle's version, names both models and has a layer each.
fn the_image_has_a_layer_per_model_and_names_both(img: &InspectedImage) {
    assert_eq!(img.tags, ["2.0.0-cpu-fp32"]);
    assert_eq!(img.models, ["mlp", "mlp-b"]);
    assert_eq!(
        roles(img),
        ["infer-serve", "engine:mlp", "engine:mlp-b", "config"]
    );
    let a = &img.annotations;
    assert_eq!(a["dev.infer-build.models"], "mlp,mlp-b");
    assert_eq!(a["dev.infer-build.precision"], "fp32");
    assert_eq!(a["org.opencontainers.image.title"], "pair");
}

/// The image's config names the model directories (and the bundle's drain); each model's own
/// config is in its layer, its paths relative to its directory.
fn the_configs_name_each_model_directory_and_paths_within_it(p: &Pair, img: &InspectedImage) {
    let layout = p.ex.path("a");
    let top = file_in_layer(&layout, img, "config", "etc/infer/runtime.toml");
    let top = String::from_utf8(top).unwrap();
    match infer_spec::RuntimeFile::from_toml_str(&top).unwrap() {
        infer_spec::RuntimeFile::Bundle(b) => {
            let paths: Vec<&str> = b.models.iter().map(|m| m.path.as_str()).collect();
            assert_eq!(paths, ["/opt/infer/models/mlp", "/opt/infer/models/mlp-b"]);
            // The bundle's [deploy] drains the one server.
            assert_eq!(b.server.as_ref().map(|s| s.drain_delay_s), Some(7));
        }
        other => panic!("not a bundle: {other:?}"),
    }
    let own = file_in_layer(
        &layout,
        img,
        "engine:mlp-b",
        "opt/infer/models/mlp-b/runtime.toml",
    );
    let cfg = infer_spec::RuntimeConfig::from_toml_str(std::str::from_utf8(&own).unwrap()).unwrap();
    assert_eq!(cfg.model.name, "mlp-b");
    let engine = cfg.engine.path.clone().unwrap();
    assert!(!engine.starts_with('/'), "{engine}");
    assert_eq!(cfg.warmup.samples.as_deref(), Some("warmup/samples.json"));
    file_in_layer(
        &layout,
        img,
        "engine:mlp-b",
        &format!("opt/infer/models/mlp-b/{engine}"),
    );
    file_in_layer(
        &layout,
        img,
        "engine:mlp-b",
        "opt/infer/models/mlp-b/warmup/samples.json",
    );
}

/// The SBOM has a package per model.
fn the_sbom_has_a_package_per_model(p: &Pair) {
    let sbom = std::fs::read_to_string(p.ex.path("a/sbom/cpu-fp32.spdx.json")).unwrap();
    assert!(
        sbom.contains("SPDXRef-Engine-mlp\"") && sbom.contains("SPDXRef-Engine-mlp-b\""),
        "{sbom}"
    );
}

/// Same inputs, same digests: a second build into `b` matches the first.
fn the_same_inputs_build_the_same_digests(p: &Pair) {
    assert_eq!(
        digests(&p.first),
        digests(&build_pair(&p.ex, &p.bundle, "b"))
    );
}

/// `deploy` writes the bundle's pod: its image by digest, its replicas and drain.
fn deploy_writes_the_bundles_pod_by_digest_with_its_replicas(p: &Pair) {
    let o = infer_build()
        .arg("deploy")
        .arg(&p.bundle)
        .arg("--layout")
        .arg(p.ex.path("a"))
        .arg("--out")
        .arg(p.ex.path("k8s"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let yaml = std::fs::read_dir(p.ex.path("k8s"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect::<String>();
    let digest = &p.first.targets[0].manifest_digest;
    assert!(
        yaml.contains(&format!("localhost/infer-build/pair@{digest}")),
        "{yaml}"
    );
    assert!(
        yaml.contains("minReplicas: 2") && yaml.contains("maxReplicas: 4"),
        "{yaml}"
    );
}

/// A pod too small for the two models together is refused by `check` with the numbers.
fn a_pod_too_small_for_both_models_is_refused_with_the_numbers(p: &Pair) {
    std::fs::write(
        &p.bundle,
        std::fs::read_to_string(&p.bundle).unwrap().replace(
            "drain_delay_s = 7",
            "drain_delay_s = 7\nresources = { memory = \"64Mi\" }",
        ),
    )
    .unwrap();
    let o = infer_build().arg("check").arg(&p.bundle).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("target cpu-fp32: the models need about ")
            && stderr(&o).contains("usable of the pod's 64 MiB (deploy.resources.memory)"),
        "{}",
        stderr(&o)
    );
}

/// A second model of the same name, or a missing recipe, is refused by `check` and `build`
/// before any engine is built, naming the bundle's line and key.
fn a_bad_model_list_is_refused_before_any_engine_is_built(p: &Pair) {
    let ex = &p.ex;
    std::fs::create_dir(ex.path("third")).unwrap();
    std::fs::copy(ex.path("recipe/mlp.onnx"), ex.path("third/mlp.onnx")).unwrap();
    std::fs::write(ex.path("third/recipe.toml"), &p.recipe).unwrap();
    for (models, want) in [
        (
            r#""recipe/recipe.toml", "third/recipe.toml""#,
            "bundle.toml:4:33: bundle.models[1]:",
        ),
        (
            r#""recipe/recipe.toml", "nope/recipe.toml""#,
            "bundle.toml:4:33: bundle.models[1]: ",
        ),
    ] {
        write_pair_bundle(&p.bundle, models);
        for cmd in ["check", "build"] {
            let mut c = infer_build();
            c.arg(cmd).arg(&p.bundle).current_dir(ex.path(""));
            if cmd == "build" {
                c.args(["--out", "c", "--runtime"])
                    .arg(ex.path("infer-serve"));
            }
            let o = c.output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{cmd} {models}: {}", stderr(&o));
            assert!(stderr(&o).contains(want), "{cmd} {models}: {}", stderr(&o));
        }
    }
}

/// One scenario on one two-recipe build: `check` names the bundle; its one image holds a layer
/// per model and the configs that tie them together; rebuilt, the same digests; `deploy` writes
/// its pod; a pod too small and a bad model list are refused.
#[test]
fn a_bundle_of_two_recipes_is_one_image_with_a_layer_per_model() {
    let pair = build_a_bundle_of_two_recipes();
    check_names_the_bundles_models_and_target(&pair);
    let v = inspect(&pair.ex.path("a"));
    let img = &v.images[0];
    the_image_has_a_layer_per_model_and_names_both(img);
    the_configs_name_each_model_directory_and_paths_within_it(&pair, img);
    the_sbom_has_a_package_per_model(&pair);
    the_same_inputs_build_the_same_digests(&pair);
    deploy_writes_the_bundles_pod_by_digest_with_its_replicas(&pair);
    a_pod_too_small_for_both_models_is_refused_with_the_numbers(&pair);
    a_bad_model_list_is_refused_before_any_engine_is_built(&pair);
}
