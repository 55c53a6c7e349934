//! `infer-build pull`, and `infer-build build` pulling the base image of GPU targets, against a
//! real `docker-registry` on loopback: the base is an image infer-build itself built and pushed,
//! the digest is pinned in the recipe's lock file, the shared base cache serves rebuilds with
//! the registry gone, a moved tag changes nothing until `--update-lock`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use infer_build::report::BuildOutput;
use serde_json::Value;

use super::image::{tiny_dynamic_elf, tiny_static_elf};
use super::registry_support::Registry;
use super::support::{
    blob_path, build_output, first_gpu_target, have_tool, infer_build, root, stderr, stdout,
    target_digest,
};

/// A scratch directory with a stand-in runtime, its own base cache and no credentials.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        tiny_static_elf(&dir.path().join("infer-serve"));
        tiny_dynamic_elf(&dir.path().join("infer-serve-gpu"), Some("10.16.0"));
        Fixture { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = infer_build();
        c.args(args)
            .env("INFER_BUILD_CACHE_DIR", self.path("cache"))
            .env("DOCKER_CONFIG", self.path("docker"))
            .env("SOURCE_DATE_EPOCH", "1700000000")
            .env_remove("INFER_BUILD_REGISTRY")
            .env_remove("INFER_BUILD_REGISTRY_USER")
            .env_remove("INFER_BUILD_REGISTRY_PASSWORD");
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().unwrap()
    }

    /// A copy of the example recipe (tiny MLP) in `name/`, with `edit` applied to its text.
    fn recipe(&self, name: &str, edit: impl Fn(String) -> String) -> PathBuf {
        let d = self.path(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["recipe.toml", "mlp.onnx"] {
            std::fs::copy(root().join("examples/mlp").join(f), d.join(f)).unwrap();
        }
        let text = std::fs::read_to_string(d.join("recipe.toml")).unwrap();
        std::fs::write(d.join("recipe.toml"), edit(text)).unwrap();
        d.join("recipe.toml")
    }

    /// Build `recipe` into `out` with `extra` flags; the `--json` report.
    fn build(&self, recipe: &Path, out: &str, extra: &[&str]) -> BuildOutput {
        build_output(&self.build_raw(recipe, out, &[extra, &["--json"]].concat()))
    }

    fn build_raw(&self, recipe: &Path, out: &str, extra: &[&str]) -> Output {
        self.build_cmd(recipe, &self.path(out), extra)
            .output()
            .unwrap()
    }

    /// `build RECIPE --out OUT EXTRA…` with the stand-in runtimes, to add environment to.
    fn build_cmd(&self, recipe: &Path, out: &Path, extra: &[&str]) -> Command {
        let (runtime, gpu_runtime) = (self.path("infer-serve"), self.path("infer-serve-gpu"));
        let mut args = vec![
            "build",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--runtime",
            runtime.to_str().unwrap(),
            "--runtime-gpu",
            gpu_runtime.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        self.cmd(&args)
    }
}

/// The recipe's first GPU target and the base reference its plan names.
fn gpu_target_and_base(f: &Fixture, recipe: &Path) -> (String, String) {
    let o = f.run(&["plan", "--json", recipe.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let gpu = first_gpu_target(&plan);
    let base = plan["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["id"] == gpu.as_str())
        .unwrap()["base"]["reference"]
        .as_str()
        .unwrap()
        .to_string();
    (gpu, base)
}

fn json_file(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn blob(layout: &Path, digest: &str) -> Value {
    json_file(&blob_path(layout, digest))
}

fn layer_digests(manifest: &Value) -> Vec<String> {
    manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["digest"].as_str().unwrap().to_string())
        .collect()
}

/// The digest `reference` is pinned to in a lock file.
fn pinned(lock: &Path, reference: &str) -> Option<String> {
    let v: toml::Value = toml::from_str(&std::fs::read_to_string(lock).ok()?).unwrap();
    v["image"]
        .as_array()?
        .iter()
        .find(|i| i["reference"].as_str() == Some(reference))
        .map(|i| i["digest"].as_str().unwrap().to_string())
}

/// A real base image: the example's CPU image built by infer-build (`epoch` varies its bytes),
/// pushed to `repo` under the index tag `1.0.0`. Returns the linux/amd64 manifest digest and
/// its layer digests.
fn push_base(f: &Fixture, epoch: &str, repo: &str) -> (String, Vec<String>) {
    let recipe = f.recipe(&format!("base-src-{epoch}"), |t| t);
    let out = f.path(&format!("base-{epoch}"));
    let o = f
        .cmd(&[
            "build",
            recipe.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
            "--runtime",
            f.path("infer-serve").to_str().unwrap(),
            "--json",
        ])
        .env("SOURCE_DATE_EPOCH", epoch)
        .output()
        .unwrap();
    let digest = target_digest(&build_output(&o), "cpu-fp32");
    let o = f.run(&[
        "push",
        out.to_str().unwrap(),
        "--to",
        repo,
        "--insecure",
        "--no-warmup",
    ]);
    assert!(o.status.success(), "push: {}", stderr(&o));
    let layers = layer_digests(&blob(&out, &digest));
    (digest, layers)
}

/// A matrix copy (for `--matrix DIR`) where `base` is a runtime image row identical to the one
/// the embedded matrix picks for the recipe's GPU target.
fn matrix_with_base(f: &Fixture, recipe: &Path, base: &str, name: &str) -> PathBuf {
    let plan = super::support::plan(recipe, &[]);
    let chosen = &plan
        .targets
        .iter()
        .find(|t| t.kind == infer_build::plan::TargetKind::Gpu)
        .expect("a GPU target")
        .base
        .reference;
    super::support::matrix_with_base(&f.path(name), chosen, base, super::support::BaseRow::Append)
}

/// The example with an L4 target on the full TensorRT runtime of its CUDA base (not
/// version-compatible, so not lean): these tests are about pulling that base. TensorRT 10, the
/// major of the stand-in GPU runtime's headers.
fn gpu_recipe(f: &Fixture, name: &str, base: Option<&str>) -> PathBuf {
    f.recipe(name, |t| {
        let t = t.replace(
            "[targets]\ncpu = true",
            "[targets]\ncpu = true\ngpus = [\"L4\"]\nprecision = [\"fp16\"]\ntensorrt = \"10\"\nversion_compatible = false",
        );
        match base {
            Some(b) => t.replace("[image]\n", &format!("[image]\nbase = \"{b}\"\n")),
            None => t,
        }
    })
}

#[test]
fn registry_build_pulls_gpu_base_pins_it_and_rebuilds_offline() {
    let test = "registry_build_pulls_gpu_base_pins_it_and_rebuilds_offline";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let f = Fixture::new();
    let repo = format!("{}/bases/cuda", reg.addr);
    let base_ref = format!("{repo}:1.0.0");
    let (d1, layers1) = push_base(&f, "1", &repo);

    let plain = gpu_recipe(&f, "plain", None);
    let matrix = matrix_with_base(&f, &plain, &base_ref, "matrix");
    let recipe = gpu_recipe(&f, "app", Some(&base_ref));
    let lock = recipe.with_extension("lock");
    let m = ["--matrix", matrix.to_str().unwrap()];
    let o = f.run(&["plan", "--json", recipe.to_str().unwrap(), m[0], m[1]]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: Value = serde_json::from_str(&stdout(&o)).unwrap();
    let gpu = first_gpu_target(&plan);

    // 1. First build: pulls the base over plain HTTP, pins its digest, stacks on its layers.
    let r1 = f.build(&recipe, "o1", &[m[0], m[1], "--insecure"]);
    assert_eq!(pinned(&lock, &base_ref).as_deref(), Some(d1.as_str()));
    assert_eq!(r1.bases[0].digest.as_str(), d1);
    assert!(!r1.bases[0].offline);
    let g1 = target_digest(&r1, &gpu);
    let man = blob(&f.path("o1"), &g1);
    let got = layer_digests(&man);
    assert_eq!(got[..layers1.len()], layers1[..], "base layers first");
    assert!(got.len() > layers1.len());
    assert_eq!(
        man["annotations"]["org.opencontainers.image.base.digest"],
        d1.as_str()
    );
    // The CPU target stays on scratch.
    let cpu = blob(&f.path("o1"), &target_digest(&r1, "cpu-fp32"));
    assert!(cpu["layers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|l| l["annotations"]["dev.infer-build.layer"] != "base"));
    assert!(cpu["annotations"]
        .get("org.opencontainers.image.base.digest")
        .is_none());
    let lock_text = std::fs::read(&lock).unwrap();

    // 2. The tag moves; the pinned build does not follow it and needs no download.
    let (d2, layers2) = push_base(&f, "2", &repo);
    assert_ne!(d1, d2);
    let r2 = f.build(&recipe, "o2", &[m[0], m[1], "--insecure"]);
    assert_eq!(target_digest(&r2, &gpu), g1);
    assert!(r2.bases[0].offline);
    assert_eq!(std::fs::read(&lock).unwrap(), lock_text, "lock unchanged");
    assert_eq!(
        std::fs::read(f.path("o1/index.json")).unwrap(),
        std::fs::read(f.path("o2/index.json")).unwrap()
    );

    // 3. --update-lock re-resolves on purpose.
    let r3 = f.build(&recipe, "o3", &[m[0], m[1], "--insecure", "--update-lock"]);
    assert_eq!(pinned(&lock, &base_ref).as_deref(), Some(d2.as_str()));
    let g3 = target_digest(&r3, &gpu);
    assert_ne!(g3, g1);
    let got = layer_digests(&blob(&f.path("o3"), &g3));
    assert_eq!(got[..layers2.len()], layers2[..]);

    // 4. A pinned digest the registry does not have is a clear error (exit 2).
    let gone = gpu_recipe(&f, "gone", Some(&base_ref));
    let missing = format!("sha256:{}", "0".repeat(64));
    std::fs::write(
        gone.with_extension("lock"),
        format!("version = 1\n\n[[image]]\nreference = \"{base_ref}\"\ndigest = \"{missing}\"\n"),
    )
    .unwrap();
    let o = f.build_raw(&gone, "o-gone", &[m[0], m[1], "--insecure"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains(&missing) && e.contains("no longer has") && e.contains("--update-lock"),
        "{e}"
    );

    // 5. With the registry gone, the pinned base comes from the cache, bit for bit.
    drop(reg);
    let r4 = f.build(&recipe, "o4", &[m[0], m[1], "--insecure"]);
    assert_eq!(target_digest(&r4, &gpu), g3);
    assert_eq!(
        std::fs::read(f.path("o3/index.json")).unwrap(),
        std::fs::read(f.path("o4/index.json")).unwrap()
    );
    // An explicit --base-layout still wins: the layout of the first base image.
    let o = f.build_raw(
        &recipe,
        "o5",
        &[
            m[0],
            m[1],
            "--base-layout",
            f.path("base-1").to_str().unwrap(),
            "--base-tag",
            "1.0.0",
            "--target",
            &gpu,
            "--json",
        ],
    );
    let r5 = build_output(&o);
    assert!(r5.bases.is_empty(), "{:?}", r5.bases);
    let got = layer_digests(&blob(&f.path("o5"), &target_digest(&r5, &gpu)));
    assert_eq!(got[..layers1.len()], layers1[..]);
}

#[test]
fn registry_pull_cli_prints_digest_and_pins_it() {
    let test = "registry_pull_cli_prints_digest_and_pins_it";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let f = Fixture::new();
    let repo = format!("{}/bases/cuda", reg.addr);
    let reference = format!("{repo}:1.0.0");
    let (d1, layers1) = push_base(&f, "1", &repo);
    let lock = f.path("r.lock");
    let pull = |extra: &[&str]| -> (Output, Value) {
        let mut args = vec!["pull", reference.as_str(), "--insecure", "--json"];
        args.extend_from_slice(extra);
        let o = f.run(&args);
        let v = serde_json::from_str(&stdout(&o)).unwrap_or(Value::Null);
        (o, v)
    };

    // Into the shared base cache, named REF@DIGEST, pinned in the lock file.
    let (o, v) = pull(&["--lock", lock.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["digest"], d1.as_str());
    assert_eq!(v["ref_name"], format!("{reference}@{d1}").as_str());
    let cache = f.path("cache/bases");
    assert_eq!(v["layout"], cache.to_str().unwrap());
    for l in &layers1 {
        assert!(cache.join("blobs/sha256").join(&l[7..]).is_file(), "{l}");
    }
    assert_eq!(pinned(&lock, &reference).as_deref(), Some(d1.as_str()));

    // The tag moves: the lock keeps the pin (served from the cache), --update-lock follows.
    let (d2, _) = push_base(&f, "2", &repo);
    let (o, v) = pull(&["--lock", lock.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["digest"], d1.as_str());
    assert_eq!(v["offline"], true);
    let (o, v) = pull(&["--lock", lock.to_str().unwrap(), "--update-lock"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["digest"], d2.as_str());
    assert_eq!(pinned(&lock, &reference).as_deref(), Some(d2.as_str()));

    // --out DIR: named by tag, readable by skopeo and usable as --base-layout.
    let out = f.path("layout");
    let (o, v) = pull(&["--out", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(v["ref_name"], "1.0.0");
    assert_eq!(v["digest"], d2.as_str());
    if have_tool("skopeo", test) {
        let s = Command::new("skopeo")
            .args(["inspect", &format!("oci:{}:1.0.0", out.display())])
            .output()
            .unwrap();
        assert!(s.status.success(), "{}", stderr(&s));
        assert!(stdout(&s).contains(&d2), "{}", stdout(&s));
    }

    // Bad input exits 2 before any network; a missing tag too.
    for args in [
        vec!["pull", "Not A Ref", "--insecure"],
        vec!["pull", reference.as_str(), "--update-lock"],
    ] {
        let o = f.run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
    }
    let o = f.run(&["pull", &format!("{repo}:nope"), "--insecure"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no such manifest"), "{}", stderr(&o));
}

#[test]
fn gpu_base_that_cannot_be_pulled_fails_with_a_hint_and_unknown_targets_exit_2() {
    let f = Fixture::new();
    // `.invalid` never resolves (RFC 2606): the pull fails at once, without retries.
    let base = "registry.invalid/nvidia/cuda:12";
    let plain = gpu_recipe(&f, "plain", None);
    let matrix = matrix_with_base(&f, &plain, base, "matrix");
    let recipe = gpu_recipe(&f, "app", Some(base));
    let m = ["--matrix", matrix.to_str().unwrap()];
    let o = f.build_raw(&recipe, "o", &[m[0], m[1]]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(
        e.contains("registry.invalid") && e.contains("--base-layout"),
        "{e}"
    );
    assert!(!recipe.with_extension("lock").exists(), "nothing pinned");
    assert!(!f.path("o/index.json").exists());
    // The CPU target alone needs no base and builds.
    let r = f.build(&recipe, "cpu", &[m[0], m[1], "--target", "cpu-fp32"]);
    assert!(r.bases.is_empty(), "{:?}", r.bases);
    let o = f.build_raw(&recipe, "o", &[m[0], m[1], "--target", "sm1-fp64"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

/// A team's registries.conf (containers-registries.conf(5)) sends the matrix's Docker Hub
/// base to their mirror: `build` pulls it from the mirror with the primary unreachable, says
/// where it came from, and pins it under the familiar `docker.io/…` name; `pull` of the
/// digest-pinned reference is served by the mirror too, verified by digest. Mirrors need no
/// `--insecure`: the mirror's own `insecure = true` applies to it alone.
#[test]
fn registry_mirror_from_registries_conf_serves_the_docker_hub_base() {
    let test = "registry_mirror_from_registries_conf_serves_the_docker_hub_base";
    let Some(mirror) = Registry::start(test) else {
        return;
    };
    let f = Fixture::new();
    let (d1, layers1) = push_base(&f, "1", &format!("{}/hub-cache/cuda", mirror.addr));
    let recipe = gpu_recipe(&f, "app", None);
    let (gpu, base) = gpu_target_and_base(&f, &recipe);
    assert!(base.starts_with("docker.io/nvidia/cuda:"), "{base}");
    // The primary is a closed port: only the mirror can serve the base.
    let conf = f.path("registries.conf");
    std::fs::write(
        &conf,
        format!(
            "unqualified-search-registries = [\"docker.io\"]\n\n\
             [[registry]]\nprefix = \"{base}\"\nlocation = \"127.0.0.1:9/unreachable/cuda:1.0.0\"\n\n\
             [[registry.mirror]]\nlocation = \"{}/hub-cache/cuda:1.0.0\"\ninsecure = true\n",
            mirror.addr
        ),
    )
    .unwrap();
    let out = f.path("o1");
    let o = f
        .build_cmd(&recipe, &out, &["--target", &gpu, "--json"])
        .env("CONTAINERS_REGISTRIES_CONF", &conf)
        .output()
        .unwrap();
    let report = build_output(&o);
    assert_eq!(report.bases[0].digest.as_str(), d1);
    let served = report.bases[0]
        .served_by
        .as_ref()
        .expect("served by a registry");
    assert_eq!(served.place, format!("{}/hub-cache/cuda", mirror.addr));
    assert!(served.mirror);
    assert!(
        stderr(&o).contains(&format!("from mirror {}/hub-cache/cuda", mirror.addr)),
        "{}",
        stderr(&o)
    );
    let got = layer_digests(&blob(&out, &target_digest(&report, &gpu)));
    assert_eq!(
        got[..layers1.len()],
        layers1[..],
        "the mirror's base layers first"
    );
    let lock = recipe.with_extension("lock");
    assert_eq!(
        pinned(&lock, &base).as_deref(),
        Some(d1.as_str()),
        "pinned under {base}"
    );

    // `pull` of the pinned digest: from the mirror, verified, into a fresh layout.
    let pinned_ref = format!("{base}@{d1}");
    let o = f
        .cmd(&[
            "pull",
            &pinned_ref,
            "--out",
            f.path("pulled").to_str().unwrap(),
            "--registries-conf",
            conf.to_str().unwrap(),
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "pull: {}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["digest"], d1.as_str());
    assert_eq!(v["served_by"]["mirror"], true);

    // A digest the mirror does not have: passed over, then the unreachable primary's error,
    // with the mirror's answer beside it.
    let missing = format!("{base}@sha256:{}", "0".repeat(64));
    let o = f
        .cmd(&[
            "pull",
            &missing,
            "--out",
            f.path("missing").to_str().unwrap(),
            "--registries-conf",
            conf.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("127.0.0.1:9")
            && e.contains("mirrors tried first")
            && e.contains("hub-cache/cuda"),
        "{e}"
    );

    // A malformed registries.conf is bad input naming the file, line and key.
    std::fs::write(
        &conf,
        "[[registry]]\nprefix = \"docker.io\"\nlocation = \"https://mirror\"\n",
    )
    .unwrap();
    let o = f
        .cmd(&[
            "pull",
            &pinned_ref,
            "--out",
            f.path("bad").to_str().unwrap(),
        ])
        .env("CONTAINERS_REGISTRIES_CONF", &conf)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("{}:3: `location`", conf.display())),
        "{}",
        stderr(&o)
    );
}

/// `build` pulls the matrix's `docker.io/nvidia/cuda` base as it would on a network: from
/// Docker Hub's API host with a token from `auth.docker.io` (Docker Hub's credentials sent
/// there), the manifest list resolved to linux/amd64, blobs from the CDN without credentials;
/// the lock pins it under its `docker.io/…` name. The Docker Hub here is loopback servers with
/// certificates for those names, reached through a `CONNECT` proxy standing in for DNS.
#[test]
fn build_pulls_the_matrix_docker_hub_base_from_registry_1() {
    let test = "build_pulls_the_matrix_docker_hub_base_from_registry_1";
    if !super::registry_support::have_openssl_for(test) {
        return;
    }
    let f = Fixture::new();
    let hub = super::registry_interop::DockerHub::start(f.dir.path());
    let recipe = gpu_recipe(&f, "app", None);
    let (gpu, base) = gpu_target_and_base(&f, &recipe);
    let empty_conf = f.path("registries.conf");
    std::fs::write(&empty_conf, "").unwrap();
    let out = f.path("o");
    let mut cmd = f.build_cmd(&recipe, &out, &["--target", &gpu, "--json"]);
    cmd.env("CONTAINERS_REGISTRIES_CONF", &empty_conf)
        .env("HOME", f.dir.path())
        .env("SSL_CERT_FILE", hub.pki.join("ca.pem"));
    for (k, v) in hub.proxy.env() {
        cmd.env(k, v);
    }
    let o = cmd.output().unwrap();
    let report = build_output(&o);
    let amd64 = super::support::sha256(&hub.image.amd64);
    assert_eq!(report.bases[0].reference, base);
    assert_eq!(report.bases[0].digest.as_str(), amd64);
    let repo = base
        .strip_prefix("docker.io/")
        .unwrap()
        .split(':')
        .next()
        .unwrap();
    assert_eq!(
        report.bases[0].served_by.as_ref().map(|s| s.place.as_str()),
        Some(format!("registry-1.docker.io/{repo}").as_str())
    );
    assert_eq!(
        pinned(&recipe.with_extension("lock"), &base).as_deref(),
        Some(amd64.as_str())
    );
    let asked = hub.proxy.asked();
    assert!(
        asked.iter().all(|h| [
            "registry-1.docker.io:443",
            "auth.docker.io:443",
            "production.cloudflare.docker.com:443"
        ]
        .contains(&h.as_str())),
        "{asked:?}"
    );
    assert!(hub
        .auth
        .requests()
        .iter()
        .all(|r| r.header("authorization").is_some()));
    assert!(hub
        .cdn
        .requests()
        .iter()
        .all(|r| r.header("authorization").is_none()));
    // The image stacks on the base's layer.
    let layers = layer_digests(&blob(&out, &target_digest(&report, &gpu)));
    assert_eq!(layers[0], hub.image.blobs[1].0);
}
