//! CPU images whose engine is ONNX Runtime: a glibc base (pulled from a real registry on
//! loopback and pinned in the lock file), the dynamically linked runtime, and the library taken
//! from the pinned `onnxruntime` wheel (downloaded once, verified, cached; the lock pins it too).
//!
//! Docker Hub cannot be reached from the tests, so the glibc base is built here from Debian's
//! own packages (`apt-get download libc6 libstdc++6 libgcc-s1`, pinned by sha256 below, cached
//! in `target/glibc-base`), pushed with skopeo to `docker-registry` on 127.0.0.1, and the
//! matrix's default glibc CPU base is pointed at it (`--matrix DIR`). `real_models.rs` uses the
//! same base for the real models served from ONNX Runtime images under Docker.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use super::registry_support::Registry;
use super::support::{
    build_output, have_tool, infer_build, layer_files, root, sha256_file, stderr, target_digest,
};

/// The Debian 12 packages of the test base: name, version, sha256 of the `.deb`.
pub(crate) const DEBS: &[(&str, &str, &str)] = &[
    (
        "libc6",
        "2.36-9+deb12u14",
        "ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf",
    ),
    (
        "libgcc-s1",
        "12.2.0-14+deb12u1",
        "3016e62cb4b7cd8038822870601f5ed131befe942774d0f745622cc77d8a88f7",
    ),
    (
        "libstdc++6",
        "12.2.0-14+deb12u1",
        "5cd3171216d4ab0fc911cfe9c35509bf2dd8f47761c43b7f6a4296701551a24d",
    ),
];

/// The x86_64 rows of matrix/runtime-libraries.toml whose name `name` accepts, as
/// (name, version, sha256 of the wheel: its name in the library cache).
pub(crate) fn library_rows(name: impl Fn(&str) -> bool) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(root().join("matrix/runtime-libraries.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    v["library"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| name(l["name"].as_str().unwrap()) && l["platform"].as_str() == Some("x86_64"))
        .map(|l| {
            let field = |k: &str| l[k].as_str().unwrap().to_string();
            (field("name"), field("version"), field("sha256"))
        })
        .collect()
}

/// The matrix's pinned x86_64 onnxruntime wheel: sha256 (its name in the library cache).
fn wheel_sha256() -> String {
    let rows = library_rows(|n| n == "onnxruntime");
    assert_eq!(rows.len(), 1, "one x86_64 onnxruntime row: {rows:?}");
    rows[0].2.clone()
}

fn shared_dir(name: &str) -> PathBuf {
    let d = root().join("target").join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run_ok(c: &mut Command, what: &str) -> Output {
    let o = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(o.status.success(), "{what}: {}", stderr(&o));
    o
}

/// The OCI layout of the glibc test base (tag `1`), built once from the pinned packages.
///
/// Tests of one run (threads of one process) and concurrent runs share it: an exclusive lock
/// on `target/glibc-base/.lock` makes exactly one of them build it, so no one extracts a
/// package another is still downloading, or layers a root filesystem another is deleting
/// (which gave a layer whose last file was cut short).
pub(crate) fn glibc_base_layout() -> PathBuf {
    let dir = shared_dir("glibc-base");
    let layout = dir.join("layout");
    let lock = std::fs::File::create(dir.join(".lock")).unwrap();
    fs4::FileExt::lock(&lock).unwrap();
    if layout.join("index.json").is_file() {
        return layout;
    }
    let debs = dir.join("debs");
    std::fs::create_dir_all(&debs).unwrap();
    let rootfs = dir.join(format!("rootfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&rootfs);
    std::fs::create_dir_all(&rootfs).unwrap();
    for (name, version, sha) in DEBS {
        let file = debs.join(format!("{name}_{}_amd64.deb", version.replace(':', "%3a")));
        if !file.is_file() || sha256_file(&file) != *sha {
            run_ok(
                Command::new("apt-get")
                    .current_dir(&debs)
                    .args(["download", &format!("{name}={version}")]),
                "apt-get download",
            );
        }
        assert_eq!(
            sha256_file(&file),
            *sha,
            "{} is not the pinned package",
            file.display()
        );
        run_ok(
            Command::new("dpkg-deb").arg("-x").arg(&file).arg(&rootfs),
            "dpkg-deb -x",
        );
    }
    // Documentation is not needed in a base image.
    let _ = std::fs::remove_dir_all(rootfs.join("usr/share"));
    let tmp = dir.join(format!("layout-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let image = format!("{}:1", tmp.display());
    run_ok(
        Command::new("umoci").args(["init", "--layout"]).arg(&tmp),
        "umoci init",
    );
    run_ok(
        Command::new("umoci").args(["new", "--image", &image]),
        "umoci new",
    );
    // Through a bundle, not `umoci insert`: umoci 0.4.7's insert leaves the layer's tar
    // unterminated (no padding after the last file, no end-of-archive blocks), which Docker
    // accepts and a strict tar reader refuses.
    let bundle = dir.join(format!("bundle-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&bundle);
    run_ok(
        Command::new("umoci")
            .args(["unpack", "--image", &image])
            .arg(&bundle),
        "umoci unpack",
    );
    let mut into = bundle.join("rootfs").into_os_string();
    into.push("/");
    let mut from = rootfs.clone().into_os_string();
    from.push("/.");
    run_ok(Command::new("cp").arg("-a").arg(&from).arg(&into), "cp -a");
    run_ok(
        Command::new("umoci")
            .args(["repack", "--image", &image])
            .arg(&bundle),
        "umoci repack",
    );
    let _ = std::fs::remove_dir_all(&rootfs);
    let _ = std::fs::remove_dir_all(&bundle);
    std::fs::rename(&tmp, &layout).unwrap();
    layout
}

/// Push the glibc test base to `reg` as `bases/glibc:1`; returns the reference.
pub(crate) fn push_glibc_base(reg: &Registry) -> String {
    let layout = glibc_base_layout();
    let reference = format!("{}/bases/glibc:1", reg.addr);
    run_ok(
        Command::new("skopeo")
            .args(["copy", "--dest-tls-verify=false", "--quiet"])
            .arg(format!("oci:{}:1", layout.display()))
            .arg(format!("docker://{reference}")),
        "skopeo copy",
    );
    reference
}

/// A `--matrix DIR` copy of the embedded data whose default glibc CPU base is `base`.
pub(crate) fn matrix_with_glibc_base(dir: &Path, base: &str) -> PathBuf {
    super::support::matrix_with_base(
        &dir.join("matrix-dir"),
        "gcr.io/distroless/cc-debian12",
        base,
        super::support::BaseRow::Replace,
    )
}

/// What a test that builds ONNX Runtime images with `infer-build` needs: a loopback registry
/// holding the glibc test base (kept running until the builds have pulled it), a `--matrix` whose
/// glibc base it is, and a cache directory seeded with the pinned wheel.
pub(crate) struct OrtBuild {
    pub reg: Registry,
    pub matrix: PathBuf,
    pub cache: PathBuf,
}

impl OrtBuild {
    /// Set up in `dir`; `None` (with the reason printed) when a tool the base needs is absent.
    pub(crate) fn start(test: &str, dir: &Path) -> Option<OrtBuild> {
        for tool in ["skopeo", "umoci", "apt-get", "dpkg-deb"] {
            if !super::support::have_tool(tool, test) {
                return None;
            }
        }
        let reg = Registry::start(test)?;
        let base = push_glibc_base(&reg);
        let matrix = matrix_with_glibc_base(dir, &base);
        let cache = dir.join("cache");
        seed_wheel(&cache);
        Some(OrtBuild { reg, matrix, cache })
    }

    /// `cmd` (an `infer-build build`) pointed at the base, the matrix, the cache and `runtime`
    /// (the dynamic one), with no credentials of this machine.
    pub(crate) fn args<'c>(&self, cmd: &'c mut Command, runtime: &Path) -> &'c mut Command {
        cmd.args(["--insecure", "--matrix"])
            .arg(&self.matrix)
            .arg("--runtime-dynamic")
            .arg(runtime)
            .env("INFER_BUILD_CACHE_DIR", &self.cache)
            .env("DOCKER_CONFIG", self.cache.join("docker"))
    }
}

/// The pinned x86_64 wheels of the CPU engines that run from a library (ONNX Runtime, OpenVINO):
/// what a build under `engine.cpu = "auto"` fetches.
fn cpu_wheels() -> Vec<String> {
    library_rows(|n| n == "onnxruntime" || n == "openvino")
        .into_iter()
        .map(|(_, _, sha)| sha)
        .collect()
}

/// Put the pinned wheels of the CPU library engines (ONNX Runtime, OpenVINO) into the library
/// cache under `cache` when a previous run downloaded them, so only the first run goes to the
/// network.
pub(crate) fn seed_wheel(cache: &Path) {
    seed_wheels(cache, &cpu_wheels());
}

/// Keep the CPU library engines' wheels a build downloaded into `cache` for later runs.
pub(crate) fn keep_wheel(cache: &Path) {
    keep_wheels(cache, &cpu_wheels());
}

/// Copy the wheels of sha256 `shas` that earlier tests kept (`target/wheels/<sha256>.whl`) into
/// the library cache under `cache`.
pub(crate) fn seed_wheels<S: AsRef<str>>(cache: &Path, shas: &[S]) {
    let wheels = cache.join("libraries/wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    for sha in shas {
        let name = format!("{}.whl", sha.as_ref());
        let shared = shared_dir("wheels").join(&name);
        if shared.is_file() {
            // A link where the file system allows it: the OpenVINO wheel is 59 MB.
            let to = wheels.join(&name);
            if std::fs::hard_link(&shared, &to).is_err() {
                std::fs::copy(&shared, &to).unwrap();
            }
        }
    }
}

/// Keep the wheels of sha256 `shas` that a build downloaded into `cache` (the library cache
/// verified them) for later tests and runs; each lands whole, under a temporary name unique to
/// this copy, then renamed.
pub(crate) fn keep_wheels<S: AsRef<str>>(cache: &Path, shas: &[S]) {
    static COPY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for sha in shas {
        let name = format!("{}.whl", sha.as_ref());
        let got = cache.join("libraries/wheels").join(&name);
        let shared = shared_dir("wheels").join(&name);
        if got.is_file() && !shared.is_file() {
            let n = COPY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let tmp = shared.with_extension(format!("tmp-{}-{n}", std::process::id()));
            std::fs::copy(&got, &tmp).unwrap();
            std::fs::rename(&tmp, &shared).unwrap();
        }
    }
}

fn json_blob(layout: &Path, digest: &str) -> Value {
    serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(&digest[7..])).unwrap())
        .unwrap()
}

fn layer_bytes(layout: &Path, layer: &Value, path: &str) -> Vec<u8> {
    use std::io::Read;
    let digest = layer["digest"].as_str().unwrap();
    let bytes = std::fs::read(layout.join("blobs/sha256").join(&digest[7..])).unwrap();
    let reader: Box<dyn std::io::Read> = if layer["mediaType"].as_str().unwrap().ends_with("gzip") {
        Box::new(flate2::read::GzDecoder::new(&bytes[..]))
    } else {
        Box::new(&bytes[..])
    };
    let mut a = tar::Archive::new(reader);
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_string_lossy() == path {
            let mut out = Vec::new();
            e.read_to_end(&mut out).unwrap();
            return out;
        }
    }
    panic!("{path} not in layer {digest}");
}

/// A copy of the example MLP recipe in `dir/name` with `[engine] cpu = "onnxruntime"`.
fn ort_recipe(dir: &Path, name: &str) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).unwrap();
    for f in ["recipe.toml", "mlp.onnx"] {
        std::fs::copy(root().join("examples/mlp").join(f), d.join(f)).unwrap();
    }
    let text = std::fs::read_to_string(d.join("recipe.toml")).unwrap();
    std::fs::write(
        d.join("recipe.toml"),
        text.replace("cpu = \"tract\"", "cpu = \"onnxruntime\""),
    )
    .unwrap();
    d.join("recipe.toml")
}

#[test]
fn registry_onnxruntime_image_on_the_glibc_base_with_the_pinned_library_rebuilds_offline() {
    let test =
        "registry_onnxruntime_image_on_the_glibc_base_with_the_pinned_library_rebuilds_offline";
    for tool in ["skopeo", "umoci", "apt-get", "dpkg-deb"] {
        if !have_tool(tool, test) {
            return;
        }
    }
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let f = tempfile::tempdir().unwrap();
    let base = push_glibc_base(&reg);
    let matrix = matrix_with_glibc_base(f.path(), &base);
    let cache = f.path().join("cache");
    seed_wheel(&cache);
    // Stand-ins for the runtimes (this test checks the assembly, not the server): the static
    // one is a tiny static ELF, the dynamic one any dynamically linked amd64 program.
    let serve = f.path().join("infer-serve");
    super::image::tiny_static_elf(&serve);
    let serve_dyn = f.path().join("infer-serve-dynamic");
    std::fs::copy("/bin/true", &serve_dyn).unwrap();
    let recipe = ort_recipe(f.path(), "app");
    let lock = recipe.with_extension("lock");
    let build = |out: &str| -> Output {
        infer_build()
            .args([
                "build",
                recipe.to_str().unwrap(),
                "--json",
                "--insecure",
                "--out",
            ])
            .arg(f.path().join(out))
            .arg("--matrix")
            .arg(&matrix)
            .arg("--runtime")
            .arg(&serve)
            .arg("--runtime-dynamic")
            .arg(&serve_dyn)
            .env("INFER_BUILD_CACHE_DIR", &cache)
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .env("DOCKER_CONFIG", f.path().join("docker"))
            .output()
            .unwrap()
    };

    // 1. First build: pulls the glibc base, fetches (or finds) the wheel, pins both.
    let o = build("o1");
    let r1 = build_output(&o);
    keep_wheel(&cache);
    let lock_text = std::fs::read_to_string(&lock).unwrap();
    let v: toml::Value = toml::from_str(&lock_text).unwrap();
    assert_eq!(v["image"][0]["reference"].as_str(), Some(base.as_str()));
    assert_eq!(v["library"][0]["name"].as_str(), Some("onnxruntime"));
    assert_eq!(
        v["library"][0]["sha256"].as_str(),
        Some(wheel_sha256().as_str())
    );
    let layout = f.path().join("o1");
    let digest = target_digest(&r1, "cpu-fp32");
    let man = json_blob(&layout, &digest);
    assert_eq!(
        man["annotations"]["org.opencontainers.image.base.digest"].as_str(),
        v["image"][0]["digest"].as_str()
    );
    let layers = man["layers"].as_array().unwrap();
    let roles: Vec<&str> = layers
        .iter()
        .map(|l| l["annotations"]["dev.infer-build.layer"].as_str().unwrap())
        .collect();
    // The engine stage measured the model in ONNX Runtime: it ships as the engine (the ONNX
    // file with engine.json and profile.json).
    assert_eq!(
        roles,
        ["base", "runtime-libs", "infer-serve", "engine", "config"]
    );
    let libs: Vec<(String, u64)> = layer_files(&layout, &layers[1])
        .into_iter()
        .map(|(p, bytes)| (p, bytes.len() as u64))
        .collect();
    assert_eq!(libs.len(), 1, "{libs:?}");
    assert_eq!(libs[0].0, "opt/onnxruntime/lib/libonnxruntime.so.1.31.0");
    assert!(libs[0].1 > 10 << 20);
    assert_eq!(
        layer_bytes(&layout, &layers[2], "usr/local/bin/infer-serve"),
        std::fs::read(&serve_dyn).unwrap(),
        "the dynamic runtime ships"
    );
    let rt = String::from_utf8(layer_bytes(&layout, &layers[4], "etc/infer/runtime.toml")).unwrap();
    assert!(rt.contains("kind = \"onnxruntime\""), "{rt}");
    assert!(
        rt.contains("library = \"/opt/onnxruntime/lib/libonnxruntime.so.1.31.0\""),
        "{rt}"
    );

    // 2. Registry gone, wheel cached: the same bytes, and the lock untouched.
    drop(reg);
    let o = build("o2");
    let r2 = build_output(&o);
    assert_eq!(target_digest(&r2, "cpu-fp32"), digest);
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), lock_text);
    assert!(
        stderr(&o).contains("(from the library cache)"),
        "{}",
        stderr(&o)
    );

    // 3. A lock pinning another wheel is refused (exit 2) with the way out.
    let moved = lock_text.replace(&wheel_sha256(), &"0".repeat(64));
    std::fs::write(&lock, moved).unwrap();
    let o = build("o3");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--update-lock"), "{}", stderr(&o));
}
