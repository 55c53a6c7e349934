//! Slim bases end to end, from real Debian ELF files: a "base" image (glibc) and a "builder"
//! image (curl's whole dependency tree, unrelated libraries, headers, a stub `libcuda`, two
//! layers with a whiteout) are written as OCI layouts by umoci, pushed to a real registry on
//! loopback and pulled back by digest; the slim image must hold exactly the closure that glibc's
//! own `ldd` reports, list the toolkit libraries it left out, and run its test program in a
//! `chroot` of the unpacked image and under Docker.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use infer_build::report::{BuildOutput, SlimOutput};
use infer_build::slim::{self, BuildOptions, Definition};

use super::registry_support::Registry;
use super::support::{build_output, have_docker, have_tool, infer_build, stderr, stdout};

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";

fn sh(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tools(test: &str) -> bool {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| o.stdout == b"0\n")
        .unwrap_or(false);
    if !root {
        eprintln!("skipping {test}: chroot needs root");
    }
    root && have_tool("gcc", test)
        && have_tool("umoci", test)
        && Path::new("/usr/bin/curl").exists()
}

/// Copy a host path into `root` (same path), keeping symlinks as symlinks; parent directories
/// are created through `root`'s own symlinks (`lib -> usr/lib`).
fn put(root: &Path, path: &str) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    let dest = root.join(path.trim_start_matches('/'));
    if meta.is_dir() {
        fs::create_dir_all(&dest).unwrap();
        return;
    }
    if let Some(parent) = dest.parent() {
        fs::create_dir_all(parent).unwrap();
    }
    if fs::symlink_metadata(&dest).is_ok() {
        return;
    }
    if meta.file_type().is_symlink() {
        symlink(fs::read_link(path).unwrap(), &dest).unwrap();
    } else {
        fs::copy(path, &dest).unwrap();
    }
}

/// Every file of a Debian package, copied into `root`.
fn put_package(root: &Path, package: &str) {
    for line in sh(Command::new("dpkg").args(["-L", package])).lines() {
        if line.starts_with('/') && line != "/." {
            put(root, line);
        }
    }
}

fn merged_usr(root: &Path) {
    fs::create_dir_all(root.join("usr/lib")).unwrap();
    fs::create_dir_all(root.join("usr/lib64")).unwrap();
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    for (link, target) in [
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("bin", "usr/bin"),
    ] {
        symlink(target, root.join(link)).unwrap();
    }
}

/// The Debian package that owns a library path (dpkg records some under /lib, some under /usr/lib).
fn owner(path: &str) -> String {
    let alt = match path.strip_prefix("/usr") {
        Some(rest) => rest.to_string(),
        None => format!("/usr{path}"),
    };
    for p in [path, &alt] {
        let out = Command::new("dpkg").args(["-S", p]).output().unwrap();
        if out.status.success() {
            let text = String::from_utf8_lossy(&out.stdout);
            return text.split(':').next().unwrap().trim().to_string();
        }
    }
    panic!("no package owns {path}");
}

/// The libraries glibc's loader maps for `bin`, as `ldd` prints them (`=> /path`).
fn ldd(bin: &Path) -> Vec<String> {
    sh(Command::new("ldd").arg(bin))
        .lines()
        .filter_map(|l| l.split("=> ").nth(1))
        .filter_map(|r| r.split(' ').next())
        .map(str::to_string)
        .collect()
}

/// Write a layout with one image tagged `tag` whose layers are `rootfs`es applied in order
/// (umoci computes the whiteouts between them), and return its manifest digest.
fn umoci_image(layout: &Path, tag: &str, rootfses: &[&dyn Fn(&Path)]) -> String {
    let image = format!("{}:{tag}", layout.display());
    if !layout.exists() {
        sh(Command::new("umoci").args(["init", "--layout"]).arg(layout));
    }
    sh(Command::new("umoci").args(["new", "--image", &image]));
    let bundle = layout.with_extension(format!("{tag}-bundle"));
    for fill in rootfses {
        let _ = fs::remove_dir_all(&bundle);
        sh(Command::new("umoci")
            .args(["unpack", "--image", &image])
            .arg(&bundle));
        fill(&bundle.join("rootfs"));
        sh(Command::new("umoci")
            .args(["repack", "--image", &image])
            .arg(&bundle));
    }
    let _ = fs::remove_dir_all(&bundle);
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(layout.join("index.json")).unwrap()).unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

struct Fixture {
    tmp: tempfile::TempDir,
    base_layout: PathBuf,
    builder_layout: PathBuf,
    base_digest: String,
    builder_digest: String,
    /// What the slim layer must hold: the closure's files and symlinks, as placed in the image.
    expected: BTreeSet<String>,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // The test program and a GPU library: real ELF objects linked by gcc against Debian's
    // libcurl, and against stub libcuda/libnvidia-ml (as CUDA's stubs directory has them).
    fs::write(t.join("app.c"), "#include <stdio.h>\nchar *curl_version(void);\nint main(void) { printf(\"slim-ok %s\\n\", curl_version()); return 0; }\n").unwrap();
    fs::write(t.join("stub.c"), "int cuInit(unsigned f) { return 0; }\n").unwrap();
    fs::write(t.join("nvml.c"), "int nvmlInit(void) { return 0; }\n").unwrap();
    fs::write(
        t.join("probe.c"),
        "int cuInit(unsigned f);\nint nvmlInit(void);\nint probe(void) { return cuInit(0) + nvmlInit(); }\n",
    )
    .unwrap();
    let gcc = |args: &[&str]| sh(Command::new("gcc").current_dir(t).args(args));
    gcc(&["-o", "app", "app.c", &format!("{LIBDIR}/libcurl.so.4")]);
    gcc(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libcuda.so.1",
        "-o",
        "libcuda.so.1",
        "stub.c",
    ]);
    gcc(&[
        "-shared",
        "-fPIC",
        "-Wl,-soname,libnvidia-ml.so.1",
        "-o",
        "libnvidia-ml.so.1",
        "nvml.c",
    ]);
    gcc(&[
        "-shared",
        "-fPIC",
        "-o",
        "libgpuprobe.so",
        "probe.c",
        "-Wl,--no-as-needed",
        "-L.",
        "-l:libcuda.so.1",
        "-l:libnvidia-ml.so.1",
        "-lz",
    ]);

    // glibc's own answer for the closure of the program, and the packages that provide it.
    let closure = ldd(&t.join("app"));
    assert!(closure.len() > 15, "curl's closure is deep: {closure:?}");
    let packages: BTreeSet<String> = closure.iter().map(|p| owner(p)).collect();

    let base_root = |root: &Path| {
        merged_usr(root);
        put_package(root, "libc6");
    };
    let builder_first = |root: &Path| {
        merged_usr(root);
        put_package(root, "libc6");
        for p in &packages {
            put_package(root, p);
        }
        // Unrelated packages a builder image also carries: must not leak into the slim image.
        // libxml2 is needed as installed (its missing ICU is a test case); the others are
        // taken when installed.
        put_package(root, "libxml2");
        for p in ["curl", "libssl-dev"] {
            let installed = Command::new("dpkg")
                .args(["-L", p])
                .output()
                .map(|o| o.status.success());
            if installed.unwrap_or(false) {
                put_package(root, p);
            }
        }
        // A plugin a later layer deletes: only whiteout handling keeps it out.
        fs::create_dir_all(root.join("opt/app/lib")).unwrap();
        fs::copy(
            format!("{LIBDIR}/libxml2.so.2"),
            root.join("opt/app/lib/libold-plugin.so"),
        )
        .unwrap();
    };
    let builder_second = |root: &Path| {
        fs::remove_file(root.join("opt/app/lib/libold-plugin.so")).unwrap();
        fs::create_dir_all(root.join("opt/app/bin")).unwrap();
        fs::copy(t.join("app"), root.join("opt/app/bin/app")).unwrap();
        fs::copy(
            t.join("libgpuprobe.so"),
            root.join("opt/app/lib/libgpuprobe.so"),
        )
        .unwrap();
        for stub in ["libcuda.so.1", "libnvidia-ml.so.1"] {
            fs::copy(
                t.join(stub),
                root.join(format!("usr/lib/x86_64-linux-gnu/{stub}")),
            )
            .unwrap();
        }
    };
    let base_layout = t.join("base-oci");
    let builder_layout = t.join("builder-oci");
    let base_digest = umoci_image(&base_layout, "base", &[&base_root]);
    let builder_digest = umoci_image(
        &builder_layout,
        "builder",
        &[&builder_first, &builder_second],
    );

    // Expected slim layer: the program, the probe, and every library of the closure that the
    // base lacks, each with the symlinks leading to it (placed under usr/lib: the base has
    // lib -> usr/lib).
    let base_files: BTreeSet<String> = sh(Command::new("dpkg").args(["-L", "libc6"]))
        .lines()
        .map(|l| l.replace("/usr/lib/", "/lib/"))
        .collect();
    let mut expected: BTreeSet<String> = ["opt/app/bin/app", "opt/app/lib/libgpuprobe.so"]
        .map(String::from)
        .into();
    for lib in &closure {
        let as_lib = lib.replace("/usr/lib/", "/lib/");
        if base_files.contains(&as_lib) {
            continue;
        }
        let mut p = format!("{LIBDIR}/{}", lib.rsplit('/').next().unwrap());
        loop {
            expected.insert(p.trim_start_matches('/').to_string());
            match fs::read_link(&p) {
                Ok(target) => {
                    p = format!(
                        "{LIBDIR}/{}",
                        target.to_string_lossy().rsplit('/').next().unwrap()
                    )
                }
                Err(_) => break,
            }
        }
    }
    Fixture {
        tmp,
        base_layout,
        builder_layout,
        base_digest,
        builder_digest,
        expected,
    }
}

fn definition(f: &Fixture) -> Definition {
    Definition::parse("curl-slim.toml", &definition_text(f, "localhost", true)).unwrap()
}

/// The test definition, its images named under `registry`, pinned by digest or not (then the
/// lock file pins them).
fn definition_text(f: &Fixture, registry: &str, pinned: bool) -> String {
    let pin = |d: &str| match pinned {
        true => format!("digest = \"{d}\"\ndigest_source = \"built by this test\"\n"),
        false => String::new(),
    };
    format!(
        r#"
name = "curl-slim"
description = "the test program, its GPU probe and their closure, on a glibc-only base"
engine = "full"
tensorrt = "10"
[base]
reference = "{registry}/slim-test/base:base"
{}[builder]
reference = "{registry}/slim-test/builder:builder"
{}[closure]
drop = ["/**/libnvinfer_builder_resource*"]
[[select]]
paths = ["/opt/app/bin/app", "/opt/app/lib/*.so"]
"#,
        pin(&f.base_digest),
        pin(&f.builder_digest)
    )
}

/// Non-directory entries of the slim layer (the last layer of the image).
fn layer_entries(layout: &Path, manifest_digest: &str) -> BTreeSet<String> {
    let img = slim::read_layout(layout, Some(manifest_digest)).unwrap();
    let last = img.layers().last().unwrap();
    let mut archive = tar::Archive::new(
        infer_build::oci::open_layer(&img.store, &last.digest, last.size, &last.media_type)
            .unwrap(),
    );
    let mut out = BTreeSet::new();
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        if e.header().entry_type() != tar::EntryType::Directory {
            out.insert(e.path().unwrap().to_string_lossy().into_owned());
        }
        std::io::copy(&mut e.by_ref().take(u64::MAX), &mut std::io::sink()).unwrap();
    }
    out
}

/// Build the slim image, check it holds exactly the closure, and run its program in a chroot.
fn build_and_check(f: &Fixture, base_layout: &Path, builder_layout: &Path) -> (PathBuf, String) {
    let def = definition(f);
    let out = f.tmp.path().join("slim-oci");
    let built = slim::build(
        &def,
        base_layout,
        builder_layout,
        &out,
        &BuildOptions::default(),
    )
    .unwrap_or_else(|e| panic!("slim build failed: {e}"));

    let got = layer_entries(&out, built.manifest_digest.as_str());
    let missing: Vec<_> = f.expected.difference(&got).collect();
    let extra: Vec<_> = got.difference(&f.expected).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "slim layer differs from ldd's closure\nmissing: {missing:?}\nextra: {extra:?}"
    );

    // The toolkit libraries are left out on purpose and listed, with who needs them.
    let excluded = slim::render_excluded(&built.plan);
    eprint!("{excluded}");
    for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(
            excluded.contains(&format!("excluded {lib} (needed by /opt/app/lib/libgpuprobe.so): injected at run time by the NVIDIA container toolkit")),
            "{excluded}"
        );
    }

    // Sizes: every layer, and the reduction against the builder image.
    let r = &built.report;
    eprint!("{}", r.render());
    assert_eq!(r.layers.len(), 2);
    assert_eq!(
        r.layers.iter().map(|l| l.from.as_str()).collect::<Vec<_>>(),
        ["base", "slim"]
    );
    assert!(r.builder_size > r.size && r.reduction > 1.0, "{r:?}");
    assert_eq!(
        slim::size_report_of_layout(&out, Some(built.manifest_digest.as_str()))
            .unwrap()
            .as_ref(),
        Some(r)
    );

    // Same inputs, same image.
    let again = slim::build(
        &def,
        base_layout,
        builder_layout,
        &f.tmp.path().join("slim-oci-2"),
        &BuildOptions::default(),
    )
    .unwrap();
    assert_eq!(again.manifest_digest, built.manifest_digest);

    // The program runs in a chroot of the unpacked image: its closure is complete.
    let bundle = f.tmp.path().join("slim-bundle");
    sh(Command::new("umoci")
        .args(["unpack", "--image", &format!("{}:curl-slim", out.display())])
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    let ran = sh(Command::new("chroot").arg(&rootfs).arg("/opt/app/bin/app"));
    assert!(ran.starts_with("slim-ok libcurl/"), "{ran}");
    // ... and the stubs stayed out: the node's driver provides them.
    assert!(!rootfs
        .join("usr/lib/x86_64-linux-gnu/libcuda.so.1")
        .exists());
    assert!(
        !rootfs.join("opt/app/lib/libold-plugin.so").exists(),
        "a whited-out file came back"
    );
    (out, built.manifest_digest.to_string())
}

#[test]
fn slim_image_holds_exactly_the_closure_and_runs_in_a_chroot() {
    if !tools("slim_image_holds_exactly_the_closure_and_runs_in_a_chroot") {
        return;
    }
    let f = fixture();
    build_and_check(&f, &f.base_layout, &f.builder_layout);
}

#[test]
fn slim_missing_dependency_and_conflict_fail_with_context() {
    if !tools("slim_missing_dependency_and_conflict_fail_with_context") {
        return;
    }
    let f = fixture();
    // libxml2 is in the builder, but not its ICU and lzma dependencies: every missing one is
    // reported with the chain that needs it.
    let mut def = definition(&f);
    def.selections[0].paths = vec![format!("{LIBDIR}/libxml2.so.2")];
    let err = slim::build(
        &def,
        &f.base_layout,
        &f.builder_layout,
        &f.tmp.path().join("o0"),
        &BuildOptions::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(err.is_bad_input());
    assert!(text.contains(&format!("{LIBDIR}/libxml2.so.2 → libicuuc.so.72: not found in the combined image (searched /lib/x86_64-linux-gnu:")), "{text}");
    assert!(
        text.contains(&format!(
            "{LIBDIR}/libxml2.so.2 → liblzma.so.5: not found in the combined image"
        )),
        "{text}"
    );
    // A dependency that resolves to a dropped path fails too.
    let mut def = definition(&f);
    def.closure.drop = vec!["/**/libnghttp2.so*".into()];
    let err = slim::build(
        &def,
        &f.base_layout,
        &f.builder_layout,
        &f.tmp.path().join("o1"),
        &BuildOptions::default(),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("/opt/app/bin/app → libcurl.so.4 → libnghttp2.so.14 resolves to /usr/lib/x86_64-linux-gnu/libnghttp2.so.14"), "{text}");
    // A digest the layout does not hold is refused before anything is read.
    let mut def = definition(&f);
    def.base.digest = Some(f.builder_digest.clone());
    let err = slim::build(
        &def,
        &f.base_layout,
        &f.builder_layout,
        &f.tmp.path().join("o2"),
        &BuildOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .contains(&format!("no image `{}` in the layout", f.builder_digest)),
        "{err}"
    );
    // Unpinned images need the lock file or an explicit opt-in.
    let mut def = definition(&f);
    def.builder.digest = None;
    let err = slim::build(
        &def,
        &f.base_layout,
        &f.builder_layout,
        &f.tmp.path().join("o3"),
        &BuildOptions::default(),
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "localhost/slim-test/builder:builder is not pinned: no digest in the definition or the lock file; pull it once to record one, or allow unpinned images explicitly");
}

#[test]
fn registry_slim_from_images_pulled_by_digest() {
    if !tools("registry_slim_from_images_pulled_by_digest") {
        return;
    }
    let Some(reg) = Registry::start("registry_slim_from_images_pulled_by_digest") else {
        return;
    };
    let f = fixture();
    let opts = infer_build::registry::PushOptions {
        client: client_opts(f.tmp.path()),
        locations_file: Some(f.tmp.path().join("locations.json")),
        ..Default::default()
    };
    let mut pulled = Vec::new();
    for (layout, repo, digest) in [
        (&f.base_layout, "slim-test/base", &f.base_digest),
        (&f.builder_layout, "slim-test/builder", &f.builder_digest),
    ] {
        let target =
            infer_build::registry::Reference::parse(&format!("{}/{repo}", reg.addr)).unwrap();
        infer_build::registry::push(layout, &target, &opts)
            .unwrap_or_else(|e| panic!("push {repo}: {e}"));
        let dest = f
            .tmp
            .path()
            .join(format!("pulled-{}", repo.replace('/', "-")));
        let pull_opts = infer_build::registry::PullOptions {
            client: client_opts(f.tmp.path()),
            ..Default::default()
        };
        let p = infer_build::registry::pull_with(
            &format!("{}/{repo}@{digest}", reg.addr),
            &dest,
            &pull_opts,
        )
        .unwrap_or_else(|e| panic!("pull {repo}@{digest}: {e}"));
        assert_eq!(&p.digest, digest);
        pulled.push(dest);
    }
    build_and_check(&f, &pulled[0], &pulled[1]);
}

#[test]
fn docker_slim_image_runs_its_program() {
    if !tools("docker_slim_image_runs_its_program")
        || !have_docker("docker_slim_image_runs_its_program")
        || !have_tool("skopeo", "docker_slim_image_runs_its_program")
    {
        return;
    }
    let f = fixture();
    let (out, digest) = build_and_check(&f, &f.base_layout, &f.builder_layout);
    let tag = format!("infer-build-slim-test:{}", &digest[7..19]);
    let archive = f.tmp.path().join("slim.tar");
    sh(Command::new("skopeo").args([
        "copy",
        &format!("oci:{}:curl-slim", out.display()),
        &format!("docker-archive:{}:{tag}", archive.display()),
    ]));
    sh(Command::new("docker").arg("load").arg("-i").arg(&archive));
    let ran = Command::new("docker")
        .args(["run", "--rm", "--network=none", &tag, "/opt/app/bin/app"])
        .output()
        .unwrap();
    let _ = Command::new("docker").args(["rmi", "-f", &tag]).output();
    let text = String::from_utf8_lossy(&ran.stdout);
    assert!(
        ran.status.success() && text.starts_with("slim-ok libcurl/"),
        "{text}{}",
        String::from_utf8_lossy(&ran.stderr)
    );
}

fn client_opts(tmp: &Path) -> infer_build::registry::ClientOptions {
    infer_build::registry::ClientOptions {
        insecure: true,
        keychain: infer_build::registry::Keychain {
            docker_config: Some(tmp.join("no-docker-config.json")),
            ignore_env: true,
        },
        ..Default::default()
    }
}

/// A fake ELF object with the dynamic facts the TensorRT research recorded.
fn elf(needed: &[&str]) -> slim::Node {
    slim::Node::File(Box::new(slim::File {
        mode: 0o644,
        size: 1,
        sha256: format!("{:0>64}", needed.len()),
        elf: Some(Ok(slim::ElfInfo {
            is_64: true,
            machine: 62, // EM_X86_64
            needed: needed.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        })),
        source: slim::Source::Inline(std::sync::Arc::from(&b"x"[..])),
    }))
}

/// The shape of nvcr.io/nvidia/tensorrt (paths unconfirmed, see the definitions) and of the CUDA
/// base image, as plain data: which files each definition takes, for each kind of engine.
#[test]
fn slim_tensorrt_definitions_take_only_what_each_engine_needs() {
    use slim::{choose, Needs, PlanCompat, Tactic};
    let defs = slim::load_definitions(&super::support::root().join("base-images/slim")).unwrap();
    let sys = [
        "libc.so.6",
        "libm.so.6",
        "libdl.so.2",
        "libpthread.so.0",
        "librt.so.1",
        "libstdc++.so.6",
        "libgcc_s.so.1",
    ];
    let mut base = slim::Tree::new();
    base.insert_symlink("lib", "usr/lib");
    for l in sys {
        base.insert(&format!("usr/lib/x86_64-linux-gnu/{l}"), elf(&[]));
    }
    let mut builder = base.clone();
    let d = "usr/lib/x86_64-linux-gnu";
    for (lib, needs) in [
        ("libnvinfer.so.10.11.0", &sys[..]),
        ("libnvinfer_lean.so.10.11.0", &sys[..]),
        ("libnvinfer_dispatch.so.10.11.0", &sys[..]),
        ("libnvinfer_builder_resource.so.10.11.0", &sys[..0]),
        ("libnvonnxparser.so.10.11.0", &["libnvinfer.so.10"][..]),
        ("libcudnn.so.9.10.2", &sys[..]),
        ("libcudnn_ops.so.9.10.2", &["libcudnn_graph.so.9"][..]),
        ("libcudnn_graph.so.9.10.2", &sys[..]),
    ] {
        builder.insert(&format!("{d}/{lib}"), elf(needs));
        let short = lib.rsplit_once('.').unwrap().0.rsplit_once('.').unwrap().0;
        builder.insert_symlink(&format!("{d}/{short}"), lib);
    }
    builder.insert_symlink("usr/local/cuda", "cuda-12.9");
    builder.insert_symlink("usr/local/cuda-12.9/lib64", "targets/x86_64-linux/lib");
    let cl = "usr/local/cuda-12.9/targets/x86_64-linux/lib";
    builder.insert(&format!("{cl}/libcublasLt.so.12.9.1.4"), elf(&sys));
    builder.insert_symlink(
        &format!("{cl}/libcublasLt.so.12"),
        "libcublasLt.so.12.9.1.4",
    );
    builder.insert(
        &format!("{cl}/libcublas.so.12.9.1.4"),
        elf(&["libcublasLt.so.12", "libc.so.6"]),
    );
    builder.insert_symlink(&format!("{cl}/libcublas.so.12"), "libcublas.so.12.9.1.4");
    builder.insert("usr/lib/x86_64-linux-gnu/libcuda.so.1", elf(&[]));

    let take = |kind: PlanCompat, needs: Needs| -> Vec<String> {
        let def = choose(&defs, kind, Some("10.11.0")).unwrap();
        let sels = def.selections_for(&needs);
        let plan = slim::compute(
            &base,
            &builder,
            slim::Spec {
                selections: &sels,
                closure: &def.closure,
            },
        )
        .unwrap_or_else(|e| panic!("{}: {e}", def.name));
        plan.copy
            .keys()
            .map(|k| k.rsplit('/').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        take(PlanCompat::VersionCompatible, Needs::default()),
        [
            "libnvinfer_dispatch.so.10",
            "libnvinfer_dispatch.so.10.11.0",
            "libnvinfer_lean.so.10",
            "libnvinfer_lean.so.10.11.0"
        ]
    );
    assert_eq!(
        take(PlanCompat::Full, Needs::default()),
        ["libnvinfer.so.10", "libnvinfer.so.10.11.0"]
    );
    let cudnn = Needs {
        tactics: [Tactic::Cudnn].into(),
    };
    let full_cudnn = take(PlanCompat::Full, cudnn);
    assert!(
        full_cudnn.contains(&"libcudnn_graph.so.9.10.2".to_string()),
        "{full_cudnn:?}"
    );
    assert!(
        !full_cudnn
            .iter()
            .any(|f| f.contains("builder_resource") || f.contains("cublas")),
        "{full_cudnn:?}"
    );
    let cublas = Needs {
        tactics: [Tactic::Cublas].into(),
    };
    assert_eq!(
        take(PlanCompat::Full, cublas),
        [
            "libnvinfer.so.10",
            "libnvinfer.so.10.11.0",
            "cuda",
            "lib64",
            "libcublas.so.12",
            "libcublas.so.12.9.1.4",
            "libcublasLt.so.12",
            "libcublasLt.so.12.9.1.4",
        ]
    );
    assert!(choose(&defs, PlanCompat::Full, Some("11.0")).is_err());

    // Every image they name is in the plain base-image table with the matching role, and none
    // carries a digest no public source gives.
    let table: toml::Value = toml::from_str(
        &fs::read_to_string(super::support::root().join("base-images/images.toml")).unwrap(),
    )
    .unwrap();
    let role = |r: &str| -> Option<String> {
        table["image"]
            .as_array()?
            .iter()
            .find(|i| i["reference"].as_str() == Some(r))?["role"]
            .as_str()
            .map(str::to_string)
    };
    for def in &defs {
        assert_eq!(
            role(&def.base.reference).as_deref(),
            Some("runtime"),
            "{}",
            def.name
        );
        assert_eq!(
            role(&def.builder.reference).as_deref(),
            Some("builder"),
            "{}",
            def.name
        );
        assert_eq!(
            def.unpinned().len(),
            2,
            "{}: a digest needs a public source",
            def.name
        );
    }
}

/// Push the fixture's two images to `reg` as `slim-test/base:base` and `slim-test/builder:builder`.
fn push_fixture(f: &Fixture, reg: &Registry) {
    let opts = infer_build::registry::PushOptions {
        client: client_opts(f.tmp.path()),
        locations_file: Some(f.tmp.path().join("locations.json")),
        ..Default::default()
    };
    for (layout, repo) in [
        (&f.base_layout, "slim-test/base"),
        (&f.builder_layout, "slim-test/builder"),
    ] {
        let target =
            infer_build::registry::Reference::parse(&format!("{}/{repo}", reg.addr)).unwrap();
        infer_build::registry::push(layout, &target, &opts)
            .unwrap_or_else(|e| panic!("push {repo}: {e}"));
    }
}

/// The document of a `slim --json` run that must have succeeded.
fn slim_output(o: &std::process::Output) -> SlimOutput {
    assert!(o.status.success(), "{}", stderr(o));
    serde_json::from_str(&stdout(o)).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// The metadata of a TensorRT engine, as the engine cache writes it.
fn engine_meta(path: &Path, tensorrt: &str, version_compatible: bool, gpu: bool) {
    use infer_spec::engine::{
        CpuMeta, EngineFormat, EngineKind, EngineMeta, GpuMeta, HardwareCompat, META_SCHEMA,
    };
    let digest = format!("sha256:{}", "1".repeat(64));
    let meta = EngineMeta {
        schema: META_SCHEMA,
        kind: if gpu {
            EngineKind::Tensorrt
        } else {
            EngineKind::Tract
        },
        format: if gpu {
            EngineFormat::TensorrtPlan
        } else {
            EngineFormat::TractNnefTar
        },
        target: if gpu { "sm89-fp16" } else { "cpu-fp32" }.into(),
        precision: if gpu {
            infer_spec::engine::Precision::Fp16
        } else {
            infer_spec::engine::Precision::Fp32
        },
        shape_profile: vec![],
        onnx_digest: digest.clone(),
        engine_digest: digest,
        engine_size: 1,
        cache_key: "k".into(),
        builder_version: "0.1.0".into(),
        gpu: gpu.then(|| GpuMeta {
            sm: "sm_89".parse().unwrap(),
            tensorrt: tensorrt.parse().unwrap(),
            cuda: "12.9".parse().unwrap(),
            driver_floor: "575.51.03".parse().unwrap(),
            hardware_compat: HardwareCompat::None,
            version_compatible,
            exclude_lean_runtime: false,
            builder_gpu: "NVIDIA L4".into(),
        }),
        cpu: (!gpu).then(|| CpuMeta {
            arch: "x86_64".into(),
            tract: "0.23.9".parse().unwrap(),
            onnxruntime: None,
            openvino: None,
            folded_by: None,
            threads: None,
            share: None,
            required_features: vec![],
            isa: None,
            gate: None,
        }),
        conversion: None,
    };
    fs::write(path, meta.to_canonical_json()).unwrap();
}

/// `infer-build slim` from layouts: the slim layer is the closure, the report (JSON and
/// stderr) lists every layer with the reduction against the builder measured on the builder
/// layout itself; `--engine-meta` chooses the same definition from a `--matrix` directory and
/// gives the same image; `inspect` shows the report; a GPU image built on the slim base with
/// `build --base-layout` keeps it (compared with the same image on the full builder), and
/// rebuilds bit for bit. One scenario: every step reads the same slim base, which is expensive
/// to make, so the steps below run in order on one fixture.
#[test]
fn slim_cli_report_reaches_inspect_and_a_gpu_build() {
    if !tools("slim_cli_report_reaches_inspect_and_a_gpu_build") {
        return;
    }
    let s = slim_from_layouts(fixture());
    slim_doc_names_the_closure_and_its_images(&s);
    let sizes = report_measures_every_layer_on_the_layouts(&s);
    engine_meta_chooses_the_same_image_and_reports_it(&s);
    inspect_shows_the_slim_report(&s);
    let g = yolov8n_gpu_recipe(&s);
    let image = s.f.tmp.path().join("image");
    let built = build_on_slim_base(&s, &g, &image);
    gpu_image_report_keeps_the_slim_layers(&s, &sizes, &image, &built);
    gpu_build_is_bit_reproducible(&s, &g, &built);
}

/// The slim base `infer-build slim --definition … --json` wrote from the fixture's layouts,
/// shared by the steps of `slim_cli_report_reaches_inspect_and_a_gpu_build`.
struct SlimCli {
    f: Fixture,
    /// The definition file (`curl-slim.toml`), pinned by digest.
    def_file: PathBuf,
    /// The layout the slim base was written to.
    slim_out: PathBuf,
    /// The `slim --json` document.
    doc: SlimOutput,
    /// The slim image's manifest digest (`manifest_digest`).
    digest: String,
}

/// What the slim image and its builder weigh, summed over the layers of the layouts.
struct LayoutSizes {
    builder_size: u64,
    size: u64,
}

/// The yolov8n recipe copied beside the slim base, its first GPU target, and a stand-in GPU
/// runtime for it.
struct GpuRecipe {
    recipe: PathBuf,
    target: String,
    runtime: PathBuf,
}

/// `--base-layout` and `--builder-layout`: the fixture's two images.
fn with_layouts<'c>(c: &'c mut Command, f: &Fixture) -> &'c mut Command {
    c.arg("--base-layout")
        .arg(&f.base_layout)
        .arg("--builder-layout")
        .arg(&f.builder_layout)
}

/// Writes the pinned definition file and builds the slim base from the layouts with `--json`.
fn slim_from_layouts(f: Fixture) -> SlimCli {
    let t = f.tmp.path();
    let def_file = t.join("curl-slim.toml");
    fs::write(&def_file, definition_text(&f, "localhost", true)).unwrap();
    let slim_out = t.join("cli-slim");
    let mut c = infer_build();
    c.arg("slim").arg("--definition").arg(&def_file);
    with_layouts(&mut c, &f);
    let doc = slim_output(
        &c.arg("--out")
            .arg(&slim_out)
            .arg("--json")
            .output()
            .unwrap(),
    );
    let digest = doc.manifest_digest.to_string();
    SlimCli {
        f,
        def_file,
        slim_out,
        doc,
        digest,
    }
}

/// The slim layer is the closure; the document names both images and the libraries left out.
fn slim_doc_names_the_closure_and_its_images(s: &SlimCli) {
    let (f, doc) = (&s.f, &s.doc);
    assert_eq!(layer_entries(&s.slim_out, &s.digest), f.expected);
    assert_eq!(doc.base.digest, f.base_digest);
    assert_eq!(doc.builder.digest, f.builder_digest);
    assert_eq!(doc.base.source, "layout");
    let excluded: Vec<&str> = doc.excluded.iter().map(|e| e.name.as_str()).collect();
    assert!(
        excluded.contains(&"libcuda.so.1") && excluded.contains(&"libnvidia-ml.so.1"),
        "{excluded:?}"
    );
}

/// The report lists every layer of the written image, with sizes measured on the layouts.
fn report_measures_every_layer_on_the_layouts(s: &SlimCli) -> LayoutSizes {
    let img = slim::read_layout(&s.slim_out, Some(&s.digest)).unwrap();
    let report = &s.doc.report;
    let layers = &report.layers;
    assert_eq!(layers.len(), img.layers().len());
    for (l, m) in layers.iter().zip(img.layers()) {
        assert_eq!(m.digest, l.digest);
        assert_eq!(l.size, m.size);
        assert!(l.uncompressed > m.size, "{l:?}");
    }
    let froms: Vec<&str> = layers.iter().map(|l| l.from.as_str()).collect();
    assert_eq!(froms, ["base", "slim"]);
    let builder = slim::read_layout(&s.f.builder_layout, Some(&s.f.builder_digest)).unwrap();
    let builder_size: u64 = builder.layers().iter().map(|l| l.size).sum();
    let size: u64 = img.layers().iter().map(|l| l.size).sum();
    assert_eq!(report.builder_size, builder_size);
    assert_eq!(report.size, size);
    let reduction = report.reduction;
    assert!((reduction - builder_size as f64 / size as f64).abs() < 1e-9);
    assert!(reduction > 1.0, "{reduction}");
    LayoutSizes { builder_size, size }
}

/// Chosen from an engine's metadata among the definitions of a `--matrix` directory: the same
/// image, and the human report on stderr.
fn engine_meta_chooses_the_same_image_and_reports_it(s: &SlimCli) {
    let t = s.f.tmp.path();
    let matrix = t.join("matrix");
    fs::create_dir_all(matrix.join("base-images/slim")).unwrap();
    fs::copy(&s.def_file, matrix.join("base-images/slim/curl-slim.toml")).unwrap();
    let meta = t.join("meta.json");
    engine_meta(&meta, "10.11.0.33", false, true);
    let mut c = infer_build();
    c.arg("slim")
        .arg("--engine-meta")
        .arg(&meta)
        .arg("--matrix")
        .arg(&matrix);
    with_layouts(&mut c, &s.f);
    let o = c.arg("--out").arg(t.join("cli-slim-2")).output().unwrap();
    let err = stderr(&o);
    eprint!("{err}");
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("engine sm89-fp16 (full engine, TensorRT 10.11.0.33) → slim base curl-slim"),
        "{err}"
    );
    assert!(
        err.contains(&format!("slim base curl-slim {}", s.digest)),
        "{err}"
    );
    for l in &s.doc.report.layers {
        let short = &l.digest[..19];
        assert!(err.contains(short), "{short} missing:\n{err}");
    }
    assert!(
        err.contains(&format!("{:.1}x", s.doc.report.reduction)),
        "{err}"
    );
    assert!(
        err.contains("excluded libcuda.so.1 (needed by /opt/app/lib/libgpuprobe.so)"),
        "{err}"
    );
}

/// `inspect` shows the report the image carries, in JSON and to people.
fn inspect_shows_the_slim_report(s: &SlimCli) {
    let inspected = super::support::inspect(&s.slim_out);
    assert_eq!(
        inspected.images[0].slim_report.as_ref(),
        Some(&s.doc.report)
    );
    let o = infer_build()
        .arg("inspect")
        .arg(&s.slim_out)
        .output()
        .unwrap();
    let text = stderr(&o);
    assert!(
        text.contains("slim size report")
            && text.contains(&format!("{:.1}x", s.doc.report.reduction)),
        "{text}"
    );
}

/// A real recipe (yolov8n) beside the slim base, its first GPU target, and a stand-in GPU
/// runtime naming headers of that target's TensorRT major (this scenario is about sizes).
fn yolov8n_gpu_recipe(s: &SlimCli) -> GpuRecipe {
    let t = s.f.tmp.path();
    let rdir = t.join("recipe");
    fs::create_dir_all(rdir.join("models")).unwrap();
    let recipe = rdir.join("yolov8n.toml");
    fs::copy(super::support::root().join("recipes/yolov8n.toml"), &recipe).unwrap();
    fs::copy(
        super::support::root().join("recipes/models/yolov8n.onnx"),
        rdir.join("models/yolov8n.onnx"),
    )
    .unwrap();
    fs::create_dir_all(rdir.join("labels")).unwrap();
    fs::copy(
        super::support::root().join("recipes/labels/coco-80.txt"),
        rdir.join("labels/coco-80.txt"),
    )
    .unwrap();
    let plan = super::support::plan(&recipe, &[]);
    let gpu = plan
        .targets
        .iter()
        .find(|t| t.kind == infer_build::plan::TargetKind::Gpu)
        .expect("a GPU target in the plan");
    let trt = gpu
        .tensorrt
        .as_ref()
        .expect("the GPU target's TensorRT")
        .version
        .as_str()
        .to_string();
    let runtime = t.join("infer-serve-gpu");
    super::image::tiny_dynamic_elf(&runtime, Some(&trt));
    GpuRecipe {
        recipe,
        target: gpu.id.clone(),
        runtime,
    }
}

/// `build --json` of the GPU target on the slim base (`--base-layout`), into `out`.
fn build_on_slim_base(s: &SlimCli, g: &GpuRecipe, out: &Path) -> BuildOutput {
    build_output(
        &infer_build()
            .arg("build")
            .arg(&g.recipe)
            .args(["--target", &g.target, "--base-tag", "curl-slim", "--json"])
            .arg("--base-layout")
            .arg(&s.slim_out)
            .arg("--runtime-gpu")
            .arg(&g.runtime)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap(),
    )
}

/// The GPU image's report keeps the slim base's layers as they are, adds its own, and compares
/// it with the same image on the full builder (in `inspect --json` and to people).
fn gpu_image_report_keeps_the_slim_layers(
    s: &SlimCli,
    sizes: &LayoutSizes,
    image_dir: &Path,
    built: &BuildOutput,
) {
    let target = &built.targets[0];
    let inspected = super::support::inspect(image_dir);
    let image = inspected
        .images
        .iter()
        .find(|i| i.manifest_digest == target.manifest_digest)
        .unwrap();
    let r = image
        .slim_report
        .as_ref()
        .expect("the GPU image carries a slim size report");
    let built_layers = &target.layers;
    let rl = &r.layers;
    assert_eq!(rl.len(), built_layers.len());
    assert!(rl.len() > 2);
    let mut added = 0u64;
    for (i, (l, b)) in rl.iter().zip(built_layers).enumerate() {
        assert_eq!(b.digest, l.digest);
        assert_eq!(l.size, b.size);
        if i < 2 {
            assert_eq!(
                l, &s.doc.report.layers[i],
                "the slim base's layers are kept as they are"
            );
        } else {
            assert_eq!(l.from, b.role);
            assert!(l.uncompressed > 0, "{l:?}");
            added += b.size;
        }
    }
    // Compared with the same image on the full builder.
    assert_eq!(r.builder_size, sizes.builder_size + added);
    assert_eq!(r.size, sizes.size + added);
    let factor = r.reduction;
    assert!(
        (factor - (sizes.builder_size + added) as f64 / (sizes.size + added) as f64).abs() < 1e-9
            && factor > 1.0,
        "{r:?}"
    );
    let o = infer_build()
        .arg("inspect")
        .arg(image_dir)
        .output()
        .unwrap();
    let text = stderr(&o);
    eprint!("{text}");
    assert!(
        text.contains("same on full builder") && text.contains(&format!("{factor:.1}x")),
        "{text}"
    );
}

/// The same GPU build again, into another layout, gives the same image bit for bit.
fn gpu_build_is_bit_reproducible(s: &SlimCli, g: &GpuRecipe, built: &BuildOutput) {
    let again = build_on_slim_base(s, g, &s.f.tmp.path().join("image-2"));
    assert_eq!(
        again.targets[0].manifest_digest,
        built.targets[0].manifest_digest
    );
}

/// `infer-build slim` pulling from a real registry: refused when nothing pins the images,
/// pinned in the lock file at the first pull, pulled by that pin later with every blob reused,
/// and the same image as from the layouts.
#[test]
fn registry_slim_cli_pins_at_first_pull_and_reuses_blobs() {
    let test = "registry_slim_cli_pins_at_first_pull_and_reuses_blobs";
    if !tools(test) {
        return;
    }
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let f = fixture();
    push_fixture(&f, &reg);
    let t = f.tmp.path();
    let def_file = t.join("curl-slim.toml");
    fs::write(&def_file, definition_text(&f, &reg.addr, false)).unwrap();
    let slim = |out: &str, extra: &[&str]| {
        infer_build()
            .arg("slim")
            .arg("--definition")
            .arg(&def_file)
            .arg("--insecure")
            .arg("--docker-config")
            .arg(t.join("no-docker-config.json"))
            .arg("--out")
            .arg(t.join(out))
            .args(extra)
            .output()
            .unwrap()
    };
    let base_ref = format!("{}/slim-test/base:base", reg.addr);
    let builder_ref = format!("{}/slim-test/builder:builder", reg.addr);

    let o = slim("o0", &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!(
            "{base_ref} is not pinned: the definition gives no digest and no --lock FILE pins it"
        )),
        "{}",
        stderr(&o)
    );
    assert!(!t.join("o0/index.json").exists());

    let lock = t.join("slim.lock");
    let lock_s = lock.to_str().unwrap();
    let pulled = t.join("pulled");
    let pulled_s = pulled.to_str().unwrap();
    let first = slim_output(&slim(
        "o1",
        &["--lock", lock_s, "--pull-dir", pulled_s, "--json"],
    ));
    assert_eq!(first.base.source, "pull");
    assert_eq!(first.base.digest, f.base_digest);
    assert_eq!(first.builder.digest, f.builder_digest);
    assert!(first.builder.bytes_downloaded.unwrap() > 0);
    let digest = first.manifest_digest.as_str();
    assert_eq!(layer_entries(&t.join("o1"), digest), f.expected);
    let pins = infer_build::plan::read_lock(&lock).unwrap().unwrap();
    assert_eq!(pins.digest(&base_ref), Some(f.base_digest.as_str()));
    assert_eq!(pins.digest(&builder_ref), Some(f.builder_digest.as_str()));

    // Pulled again by the pin: nothing downloaded, same image.
    let second = slim_output(&slim(
        "o2",
        &["--lock", lock_s, "--pull-dir", pulled_s, "--json"],
    ));
    assert_eq!(second.manifest_digest, digest);
    assert_eq!(second.base.bytes_downloaded, Some(0));
    assert_eq!(second.builder.bytes_downloaded, Some(0));

    // From the layouts, pinned by the same lock: the same image.
    let o = slim(
        "o3",
        &[
            "--lock",
            lock_s,
            "--base-layout",
            f.base_layout.to_str().unwrap(),
            "--builder-layout",
            f.builder_layout.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(slim_output(&o).manifest_digest, digest);
    // The pull directory was kept; the default temporary one is removed.
    assert!(pulled.join("builder/index.json").is_file());
    let o = slim("o4", &["--lock", lock_s, "--json"]);
    assert_eq!(slim_output(&o).manifest_digest, digest);
    let leftovers: Vec<_> = fs::read_dir(t.join("o4"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".slim-"))
        .map(|e| e.file_name())
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Bad input is refused with exit code 2 and a message that says what to do, before anything
/// is pulled (the real NVIDIA images cannot be pulled here, and are never contacted).
#[test]
fn slim_cli_refuses_bad_input() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let p = |name: &str| t.join(name).to_str().unwrap().to_string();
    let bad_def = p("bad.toml");
    fs::write(&bad_def, "name = \"x\"\nengine = \"full\"\nsurprise = 1\n").unwrap();
    let empty = p("empty");
    fs::create_dir_all(&empty).unwrap();
    let vc = p("vc.json");
    engine_meta(Path::new(&vc), "10.11.0.33", true, true);
    let trt9 = p("trt9.json");
    engine_meta(Path::new(&trt9), "9.3.0.1", true, true);
    let cpu = p("cpu.json");
    engine_meta(Path::new(&cpu), "", false, false);
    let garbage = p("garbage.json");
    fs::write(&garbage, "{").unwrap();
    let out = p("out");
    let missing = p("missing.toml");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec![], "name a slim base definition (trt10-cuda12-full, trt10-cuda12-vc)"),
        (
            vec!["nosuch"],
            "no slim base definition `nosuch` (known: trt10-cuda12-full, trt10-cuda12-vc)",
        ),
        (
            vec!["trt10-cuda12-vc", "--out", &out],
            "docker.io/nvidia/cuda:12.9.1-base-ubuntu24.04 is not pinned: the definition gives no digest and no --lock FILE pins it; pass --lock FILE",
        ),
        (
            vec!["trt10-cuda12-vc", "--tactic", "cudnn9"],
            "--tactic cudnn9: expected cudnn, cublas or cublaslt",
        ),
        (vec!["trt10-cuda12-vc", "--definition", &bad_def], "cannot be used with"),
        (vec!["--definition", &missing], "--definition"),
        (vec!["--definition", &bad_def], "unknown field `surprise`"),
        (
            vec![
                "trt10-cuda12-vc",
                "--allow-unpinned",
                "--base-layout",
                &empty,
                "--out",
                &out,
            ],
            "not an OCI image layout (no index.json)",
        ),
        (
            vec!["--engine-meta", &vc, "--out", &out],
            "→ slim base trt10-cuda12-vc",
        ),
        (
            vec!["--engine-meta", &trt9],
            "no slim base definition serves version-compatible engines of TensorRT 9.3.0.1",
        ),
        (vec!["--engine-meta", &cpu], "is a CPU (tract) engine"),
        (vec!["--engine-meta", &garbage], "--engine-meta"),
    ];
    for (args, want) in cases {
        let o = infer_build().arg("slim").args(&args).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    // Nothing was pulled or written for the refused definitions.
    assert!(!Path::new(&out).join("index.json").exists());
}
