//! Push, pull and warm-up artifacts against a real `docker-registry` on loopback, read back
//! with skopeo; faults injected by `faultproxy`.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use infer_build::attach::Attachments;
use infer_build::registry::{
    self, ClientOptions, Keychain, Pin, Progress, PullOptions, PushOptions, PushReport, Reference,
    RemoteImage,
};
use serde_json::Value;

use super::faultproxy::{FaultProxy, Faults};
use super::registry_support::{make_layout, MadeLayout, Registry, Target, Tls};
use super::support::{have_tool, infer_build, stderr, stdout};

fn targets() -> Vec<Target> {
    vec![
        Target {
            id: "sm89-fp16",
            sm: Some("89"),
            model_bytes: 200_000,
        },
        Target {
            id: "sm90-fp16",
            sm: Some("90"),
            model_bytes: 200_000,
        },
        Target {
            id: "cpu-fp32",
            sm: None,
            model_bytes: 100_000,
        },
    ]
}

/// Client options for tests: no credentials from the environment or `~/.docker`.
fn plain_opts(tmp: &Path) -> ClientOptions {
    ClientOptions {
        insecure: true,
        keychain: Keychain {
            docker_config: Some(tmp.join("no-docker-config.json")),
            ignore_env: true,
        },
        backoff_base: Duration::from_millis(20),
        backoff_max: Duration::from_millis(400),
        ..ClientOptions::default()
    }
}

pub(super) fn skopeo(args: &[&str]) -> (bool, String, String) {
    let o = Command::new("skopeo")
        .args(args)
        .output()
        .expect("run skopeo");
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

pub(super) fn push_cli(
    layout: &Path,
    to: &str,
    cache: &Path,
    extra: &[&str],
) -> (i32, Option<PushReport>, String) {
    let out = infer_build()
        .args(["push"])
        .arg(layout)
        .args(["--to", to, "--json"])
        .args(extra)
        .env("INFER_BUILD_CACHE_DIR", cache)
        .env("DOCKER_CONFIG", cache.join("docker"))
        // Only the credentials files a test writes: none of this machine's.
        .env("XDG_CONFIG_HOME", cache.join("xdg-config"))
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("INFER_BUILD_REGISTRY")
        .env_remove("INFER_BUILD_REGISTRY_USER")
        .env_remove("INFER_BUILD_REGISTRY_PASSWORD")
        .output()
        .unwrap();
    let report = serde_json::from_str(&stdout(&out)).ok();
    (out.status.code().unwrap_or(-1), report, stderr(&out))
}

/// `infer-build login` with the password on stdin and `env` on top of a hermetic environment.
fn login_cli(
    registry: &str,
    user: &str,
    password: &str,
    home: &Path,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (i32, String) {
    use std::io::Write as _;
    let mut cmd = infer_build();
    cmd.args(["login", registry, "-u", user, "--password-stdin"])
        .args(extra)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("xdg-config"))
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("REGISTRY_AUTH_FILE")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (out.status.code().unwrap_or(-1), stderr(&out))
}

/// `infer-build push` of `layout` with `env` on top of a hermetic environment (no credentials
/// but what `env` names).
fn push_with_env(
    layout: &Path,
    to: &str,
    home: &Path,
    extra: &[&str],
    env: &[(&str, &Path)],
) -> (i32, String) {
    let mut cmd = infer_build();
    cmd.args(["push"])
        .arg(layout)
        .args(["--to", to])
        .args(extra)
        .env("HOME", home)
        .env("INFER_BUILD_CACHE_DIR", home.join("cache"))
        .env("DOCKER_CONFIG", home.join("no-docker"))
        .env("XDG_CONFIG_HOME", home.join("xdg-config"))
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("INFER_BUILD_REGISTRY")
        .env_remove("INFER_BUILD_REGISTRY_USER")
        .env_remove("INFER_BUILD_REGISTRY_PASSWORD");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (out.status.code().unwrap_or(-1), stderr(&out))
}

/// The scene of the login test: a TLS registry with a password, a one-target layout and a
/// home of its own, shared by every step.
struct LoginScene {
    home: tempfile::TempDir,
    reg: Registry,
    made: MadeLayout,
    /// The repository the pushes that must succeed go to (`REG/login/skopeo`).
    to: String,
}

impl LoginScene {
    /// A TLS registry with a password and a layout to push; `None` (the test skips) without
    /// the registry or skopeo.
    fn start(test: &str) -> Option<LoginScene> {
        let reg = Registry::start_tls(test)?;
        if !have_tool("skopeo", test) {
            return None;
        }
        let home = tempfile::tempdir().unwrap();
        let made = make_layout(&home.path().join("layout"), "v1", &targets()[..1], 21);
        let to = format!("{}/login/skopeo", reg.addr);
        Some(LoginScene {
            home,
            reg,
            made,
            to,
        })
    }

    fn home(&self) -> &Path {
        self.home.path()
    }

    fn tls(&self) -> &Tls {
        self.reg.tls.as_ref().unwrap()
    }

    fn ca(&self) -> &str {
        self.tls().ca.to_str().unwrap()
    }

    fn cert_dir(&self) -> &str {
        self.tls().cert_dir.to_str().unwrap()
    }

    /// `push_with_env` of the layout to `to`, trusting the registry's CA.
    fn push(&self, to: &str, extra: &[&str], env: &[(&str, &Path)]) -> (i32, String) {
        let mut args = vec!["--ca-cert", self.ca()];
        args.extend_from_slice(extra);
        push_with_env(&self.made.dir, to, self.home(), &args, env)
    }

    /// `login_cli` with the registry's user and `password`, trusting its CA.
    fn login(&self, password: &str, extra: &[&str], env: &[(&str, &Path)]) -> (i32, String) {
        let mut args = vec!["--ca-cert", self.ca()];
        args.extend_from_slice(extra);
        login_cli(
            &self.reg.addr,
            &self.tls().user,
            password,
            self.home(),
            &args,
            env,
        )
    }
}

/// skopeo logs in (its auth.json), infer-build pushes with it through REGISTRY_AUTH_FILE and
/// through --authfile.
fn infer_build_pushes_with_skopeos_auth_file(s: &LoginScene) {
    let tls = s.tls();
    let by_skopeo = s.home().join("skopeo-auth.json");
    let mut child = Command::new("skopeo")
        .args(["login", "--authfile"])
        .arg(&by_skopeo)
        .args([
            "--cert-dir",
            s.cert_dir(),
            "-u",
            &tls.user,
            "--password-stdin",
            &s.reg.addr,
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(format!("{}\n", tls.password).as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "skopeo login: {}", stderr(&out));
    let (code, err) = s.push(&s.to, &[], &[("REGISTRY_AUTH_FILE", &by_skopeo)]);
    assert_eq!(code, 0, "{err}\n{}", s.reg.log());
    // The same file through --authfile.
    let (code, err) = s.push(&s.to, &["--authfile", by_skopeo.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
}

/// infer-build logs in (checked against the registry first) without echoing the password,
/// and skopeo reads the auth.json it wrote.
fn skopeo_reads_infer_builds_auth_file(s: &LoginScene) {
    let tls = s.tls();
    let ours = s.home().join("ours/auth.json");
    let (code, err) = s.login(&tls.password, &["--authfile", ours.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains(&tls.password));
    let (tag, digest) = &s.made.targets[0];
    let (ok, out, e) = skopeo(&[
        "inspect",
        "--cert-dir",
        s.cert_dir(),
        "--authfile",
        ours.to_str().unwrap(),
        &format!("docker://{}:{tag}", s.to),
    ]);
    assert!(ok, "skopeo with infer-build's auth.json: {e}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["Digest"].as_str(), Some(digest.as_str()));
}

/// Without --authfile, login writes $XDG_RUNTIME_DIR/containers/auth.json, which is read
/// before Docker's config.json (here holding a wrong password), as skopeo and podman do;
/// Docker's file alone is refused (exit 2) without echoing its password.
fn xdg_runtime_auth_file_is_read_before_dockers(s: &LoginScene) {
    let tls = s.tls();
    let run = s.home().join("run");
    std::fs::create_dir_all(&run).unwrap();
    let (code, err) = s.login(&tls.password, &[], &[("XDG_RUNTIME_DIR", &run)]);
    assert_eq!(code, 0, "{err}");
    assert!(run.join("containers/auth.json").is_file());
    let docker = s.home().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    use base64::Engine as _;
    let wrong = base64::engine::general_purpose::STANDARD.encode(format!("{}:not-it", tls.user));
    std::fs::write(
        docker.join("config.json"),
        format!(r#"{{"auths":{{"{}":{{"auth":"{wrong}"}}}}}}"#, s.reg.addr),
    )
    .unwrap();
    let (code, err) = s.push(
        &format!("{}/login/xdg", s.reg.addr),
        &[],
        &[("XDG_RUNTIME_DIR", &run), ("DOCKER_CONFIG", &docker)],
    );
    assert_eq!(code, 0, "{err}");
    // Docker's file alone: its wrong password is refused, exit 2.
    let (code, err) = s.push(
        &format!("{}/login/docker", s.reg.addr),
        &[],
        &[("DOCKER_CONFIG", &docker)],
    );
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("not-it"), "{err}");
}

/// A wrong password at login: exit 2, naming the registry but not the password, nothing
/// written.
fn wrong_password_at_login_writes_nothing(s: &LoginScene) {
    let never = s.home().join("never/auth.json");
    let (code, err) = s.login("wrong-pw", &["--authfile", never.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(&s.reg.addr) && !err.contains("wrong-pw"),
        "{err}"
    );
    assert!(!never.exists());
}

/// A malformed auth.json entry: exit 2, naming the file and the registry, not the value.
fn malformed_auth_entry_names_file_and_registry_not_value(s: &LoginScene) {
    let bad = s.home().join("bad-auth.json");
    std::fs::write(
        &bad,
        format!(
            r#"{{"auths":{{"{}":{{"auth":"%%not-base64%%"}}}}}}"#,
            s.reg.addr
        ),
    )
    .unwrap();
    let (code, err) = s.push(&s.to, &[], &[("REGISTRY_AUTH_FILE", &bad)]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains(bad.to_str().unwrap()) && err.contains(&s.reg.addr),
        "{err}"
    );
    assert!(!err.contains("%%not-base64%%"), "{err}");
}

/// A missing file named by REGISTRY_AUTH_FILE or --authfile: exit 2, naming it.
fn missing_auth_file_is_named(s: &LoginScene) {
    let missing = s.home().join("missing.json");
    let (code, err) = s.push(&s.to, &[], &[("REGISTRY_AUTH_FILE", &missing)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
    let (code, err) = s.push(&s.to, &["--authfile", missing.to_str().unwrap()], &[]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
}

/// One scenario against one authenticated registry: skopeo's login serves infer-build's push,
/// infer-build's login serves skopeo, and bad or missing credentials fail clearly.
#[test]
fn registry_login_with_skopeo_push_with_infer_build_and_the_reverse() {
    let Some(s) =
        LoginScene::start("registry_login_with_skopeo_push_with_infer_build_and_the_reverse")
    else {
        return;
    };
    infer_build_pushes_with_skopeos_auth_file(&s);
    skopeo_reads_infer_builds_auth_file(&s);
    xdg_runtime_auth_file_is_read_before_dockers(&s);
    wrong_password_at_login_writes_nothing(&s);
    malformed_auth_entry_names_file_and_registry_not_value(&s);
    missing_auth_file_is_named(&s);
}

#[test]
fn registry_push_skopeo_reads_back_and_second_push_uploads_nothing() {
    let test = "registry_push_skopeo_reads_back_and_second_push_uploads_nothing";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    if !have_tool("skopeo", test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "v1", &targets(), 1);
    let to = format!("{}/ml/mlp", reg.addr);
    let (code, report, err) = push_cli(&made.dir, &to, tmp.path(), &["--insecure"]);
    assert_eq!(code, 0, "{err}\n{}", reg.log());
    let report = report.expect("push --json prints its report");
    assert!(report.bytes_uploaded > 500_000, "{report:?}");
    assert_eq!(
        report.blobs_uploaded,
        made.blobs.len() + 3 + 1,
        "{report:?}"
    );

    // Every per-target tag and the index tag hold the local digests.
    for (tag, digest) in &made.targets {
        let (ok, out, e) = skopeo(&[
            "inspect",
            "--tls-verify=false",
            &format!("docker://{to}:{tag}"),
        ]);
        assert!(ok, "{e}");
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["Digest"].as_str(), Some(digest.as_str()), "{tag}");
    }
    let (ok, raw, e) = skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{to}:v1"),
    ]);
    assert!(ok, "{e}");
    assert_eq!(super::support::sha256(raw.as_bytes()), made.index_digest);
    let copy = tmp.path().join("copy");
    let (ok, _, e) = skopeo(&[
        "copy",
        "--all",
        "--src-tls-verify=false",
        &format!("docker://{to}:v1"),
        &format!("oci:{}:v1", copy.display()),
    ]);
    assert!(ok, "skopeo copy --all failed: {e}");

    // Warm-up artifacts, one per target, through the fallback tag (docker-registry 2.8 has no
    // referrers API).
    assert_eq!(report.attached["warmup"].len(), made.targets.len());
    for (tag, digest) in &made.targets {
        let fallback = format!("sha256-{}", &digest[7..]);
        let (ok, raw, e) = skopeo(&[
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{to}:{fallback}"),
        ]);
        assert!(ok, "{tag}: {e}");
        let index: Value = serde_json::from_str(&raw).unwrap();
        let entry = &index["manifests"][0];
        assert_eq!(
            entry["artifactType"],
            "application/vnd.infer-build.warmup.v1+json"
        );
        let art = entry["digest"].as_str().unwrap();
        let (ok, raw, e) = skopeo(&[
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{to}@{art}"),
        ]);
        assert!(ok, "{e}");
        let m: Value = serde_json::from_str(&raw).unwrap();
        assert_eq!(m["subject"]["digest"].as_str(), Some(digest.as_str()));
        let payload = reg
            .stored_blob(m["layers"][0]["digest"].as_str().unwrap())
            .unwrap();
        let doc: Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(doc["image"]["digest"].as_str(), Some(digest.as_str()));
        // The layout's runtime.toml names no warm-up sizes: 1, the preferred size and the max.
        assert_eq!(doc["requests"]["batch_sizes"], serde_json::json!([1, 4, 8]));
        assert_eq!(doc["node_selector"]["kubernetes.io/arch"], "amd64");
        // The library lists it too.
        let r = Reference::parse(&format!("{to}:{tag}")).unwrap();
        let (d, list) = registry::referrers(&r, &plain_opts(tmp.path())).unwrap();
        assert_eq!(&d, digest);
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].digest, art);
        assert_eq!(list[0].source, "fallback-tag");
    }

    // The whole index with its referrers, as `inspect REF --referrers` shows it.
    let r = Reference::parse(&format!("{to}:v1")).unwrap();
    let image = registry::inspect(&r, &plain_opts(tmp.path()), true).unwrap();
    assert_eq!(image.digest, made.index_digest);
    assert_eq!(image.images.len(), made.targets.len());
    for m in &image.images {
        let refs = m.referrers.as_ref().unwrap();
        assert_eq!(refs.len(), 1, "{}", m.digest);
        assert_eq!(
            refs[0].artifact_type.as_deref(),
            Some("application/vnd.infer-build.warmup.v1+json")
        );
        assert_eq!(m.layers.len(), 2);
    }

    // The CLI: `inspect REF --referrers`.
    let out = infer_build()
        .args([
            "inspect",
            &format!("{to}:v1"),
            "--referrers",
            "--insecure",
            "--json",
        ])
        .env("DOCKER_CONFIG", tmp.path().join("docker"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: RemoteImage = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v.digest, made.index_digest.as_str());
    for m in &v.images {
        let refs = m.referrers.as_deref().unwrap_or_default();
        assert_eq!(
            refs.first().and_then(|r| r.artifact_type.as_deref()),
            Some("application/vnd.infer-build.warmup.v1+json"),
            "{}",
            m.digest
        );
    }

    // Second push: nothing uploaded, and it says so.
    let (code, report, err) = push_cli(&made.dir, &to, tmp.path(), &["--insecure"]);
    assert_eq!(code, 0, "{err}");
    let report = report.expect("push --json prints its report");
    assert_eq!(report.bytes_uploaded, 0, "{report:?}");
    assert_eq!(report.blobs_uploaded, 0, "{report:?}");
    assert_eq!(report.manifests_written, 0, "{report:?}");
    assert!(err.contains("uploaded 0 blob bytes"), "{err}");
}

#[test]
fn registry_push_survives_resets_500s_and_429s() {
    let test = "registry_push_survives_resets_500s_and_429s";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let big = vec![
        Target {
            id: "sm89-fp16",
            sm: Some("89"),
            model_bytes: 3_000_000,
        },
        Target {
            id: "sm90-fp16",
            sm: Some("90"),
            model_bytes: 2_500_000,
        },
    ];
    let made = make_layout(&tmp.path().join("layout"), "v2", &big, 2);
    let proxy = FaultProxy::start(
        &reg.addr,
        Faults {
            seed: 0x5eed,
            per_mille: 250,
            max_429: 3,
        },
    );
    let target = Reference::parse(&format!("{}/faulty", proxy.addr)).unwrap();
    let resumed = Arc::new(AtomicUsize::new(0));
    let counter = resumed.clone();
    let opts = PushOptions {
        client: plain_opts(tmp.path()),
        chunk_size: 512 * 1024,
        // One upload at a time: the proxy's seeded fault sequence then meets the same requests
        // in the same order on every run.
        jobs: 1,
        progress: Some(Arc::new(move |p| {
            if let Progress::Resumed { .. } = p {
                counter.fetch_add(1, Ordering::Relaxed);
            }
        })),
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    };
    // Warm-up manifests attached too, as `infer-build push` does.
    let opts = Attachments::default().onto(opts);
    let report = registry::push(&made.dir, &target, &opts)
        .unwrap_or_else(|e| panic!("push failed: {e:?}\n{}", reg.log()));
    let s = &proxy.stats;
    let (resets, e500, e429) = (
        s.resets.load(Ordering::Relaxed),
        s.errors_500.load(Ordering::Relaxed),
        s.errors_429.load(Ordering::Relaxed),
    );
    let resumes = resumed.load(Ordering::Relaxed);
    eprintln!(
        "requests {} resets {resets} 500s {e500} 429s {e429} resumed {resumes}",
        s.requests.load(Ordering::Relaxed)
    );
    assert!(
        resets > 0 && e500 > 0 && e429 > 0,
        "the proxy injected too few faults to prove anything"
    );
    assert!(resumes > 0, "no upload resumed from the registry's Range");
    // Byte for byte: every layout blob equals the registry's stored copy.
    for d in &made.blobs {
        let local = std::fs::read(made.dir.join("blobs/sha256").join(&d[7..])).unwrap();
        assert!(
            reg.stored_blob(d).as_deref() == Some(&local[..]),
            "blob {d} differs"
        );
    }
    // And the tags, read directly from the registry (not through the proxy).
    for (tag, digest) in &made.targets {
        let t = report.tags.iter().find(|t| &t.tag == tag).unwrap();
        assert_eq!(&t.digest, digest);
        let r = Reference::parse(&format!("{}/faulty:{tag}", reg.addr)).unwrap();
        let (d, list) = registry::referrers(&r, &plain_opts(tmp.path())).unwrap();
        assert_eq!(&d, digest);
        assert_eq!(list.len(), 1);
    }
}

#[test]
fn registry_tls_basic_auth_with_docker_config() {
    let test = "registry_tls_basic_auth_with_docker_config";
    let Some(reg) = Registry::start_tls(test) else {
        return;
    };
    let tls = reg.tls.as_ref().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "v1", &targets()[..1], 3);
    let to = format!("{}/secure/mlp", reg.addr);
    let ca = tls.ca.to_str().unwrap();

    // No credentials: refused, exit 2, and the message says what to do.
    let (code, _, err) = push_cli(&made.dir, &to, tmp.path(), &["--ca-cert", ca]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("refused") && err.contains("INFER_BUILD_REGISTRY_USER"),
        "{err}"
    );

    // Environment credentials: used for the registry INFER_BUILD_REGISTRY names, and only
    // then (CI secrets bound to their registry).
    let env_push = |bound: Option<&str>| {
        let mut cmd = infer_build();
        cmd.args(["push"])
            .arg(&made.dir)
            .args(["--to", &to, "--ca-cert", ca, "--no-warmup"])
            .env("INFER_BUILD_CACHE_DIR", tmp.path())
            .env("DOCKER_CONFIG", tmp.path().join("env-docker"))
            .env("XDG_CONFIG_HOME", tmp.path().join("env-xdg"))
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("REGISTRY_AUTH_FILE")
            .env("INFER_BUILD_REGISTRY_USER", &tls.user)
            .env("INFER_BUILD_REGISTRY_PASSWORD", &tls.password)
            .env_remove("INFER_BUILD_REGISTRY");
        if let Some(b) = bound {
            cmd.env("INFER_BUILD_REGISTRY", b);
        }
        cmd.output().unwrap()
    };
    let out = env_push(None);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("INFER_BUILD_REGISTRY is unset"),
        "{}",
        stderr(&out)
    );
    let out = env_push(Some(&reg.addr));
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains(&tls.password));

    // Unknown CA: a TLS failure, not a silent downgrade.
    let (code, _, err) = push_cli(&made.dir, &to, tmp.path(), &[]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("certificate"), "{err}");

    // Docker config.json with `auths`.
    let docker = tmp.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    use base64::Engine as _;
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", tls.user, tls.password));
    std::fs::write(
        docker.join("config.json"),
        format!(
            r#"{{"auths":{{"https://{}":{{"auth":"{auth}"}}}}}}"#,
            reg.addr
        ),
    )
    .unwrap();
    let (code, report, err) = push_cli(&made.dir, &to, tmp.path(), &["--ca-cert", ca]);
    assert_eq!(code, 0, "{err}\n{}", reg.log());
    let report = report.expect("push --json prints its report");
    assert!(!err.contains(&tls.password) && !format!("{report:?}").contains(&tls.password));
    // A credential helper (`credsStore`): a real `docker-credential-<name>` program on PATH.
    let bin = tmp.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("docker-credential-itest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 1\nread host\n[ \"$host\" = \"{}\" ] || {{ echo 'credentials not found in native keychain'; exit 1; }}\nprintf '{{\"ServerURL\":\"%s\",\"Username\":\"{}\",\"Secret\":\"{}\"}}' \"$host\"\n",
            reg.addr, tls.user, tls.password
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(docker.join("config.json"), r#"{"credsStore":"itest"}"#).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = infer_build()
        .args(["push"])
        .arg(&made.dir)
        .args([
            "--to",
            &format!("{}/helper/mlp", reg.addr),
            "--ca-cert",
            ca,
            "--json",
        ])
        .env("PATH", &path)
        .env("DOCKER_CONFIG", &docker)
        .env("INFER_BUILD_CACHE_DIR", tmp.path())
        .env_remove("INFER_BUILD_REGISTRY")
        .env_remove("INFER_BUILD_REGISTRY_USER")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains(&tls.password));
    let (tag, digest) = &made.targets[0];
    let (ok, out, e) = skopeo(&[
        "inspect",
        "--cert-dir",
        tls.cert_dir.to_str().unwrap(),
        "--creds",
        &format!("{}:{}", tls.user, tls.password),
        &format!("docker://{to}:{tag}"),
    ]);
    assert!(ok, "{e}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["Digest"].as_str(), Some(digest.as_str()));
}

/// The client pulls what a tag names now, or the digest the caller pins it to (a lock file's:
/// `tests/it/pull.rs` runs the lock file through the CLI).
#[test]
fn registry_pull_of_a_tag_and_of_a_pinned_digest() {
    let test = "registry_pull_of_a_tag_and_of_a_pinned_digest";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "base", &targets()[..1], 4);
    let opts = PushOptions {
        client: plain_opts(tmp.path()),
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    };
    registry::push(
        &made.dir,
        &Reference::parse(&format!("{}/bases/cuda", reg.addr)).unwrap(),
        &opts,
    )
    .unwrap();

    let reference = format!("{}/bases/cuda:base", reg.addr);
    let pull_opts = PullOptions {
        client: plain_opts(tmp.path()),
        ..PullOptions::default()
    };
    let dest = tmp.path().join("base-layout");
    let pulled = registry::pull_with(&reference, &dest, &pull_opts).unwrap();
    // The tag names an index; the amd64 manifest is what gets pinned.
    assert_eq!(
        pulled.index_digest.as_ref().map(|d| d.as_str()),
        Some(made.index_digest.as_str())
    );
    assert_eq!(pulled.digest, made.targets[0].1);
    for d in &made.blobs {
        assert!(
            dest.join("blobs/sha256").join(&d[7..]).is_file(),
            "{d} not pulled"
        );
    }
    if have_tool("skopeo", test) {
        let (ok, out, e) = skopeo(&["inspect", &format!("oci:{}:base", dest.display())]);
        assert!(ok, "{e}");
        assert!(out.contains(&made.targets[0].1));
    }

    // The tag moves; a pin keeps the old digest, without one the new one is pulled.
    let moved = make_layout(&tmp.path().join("layout2"), "base", &targets()[..1], 5);
    registry::push(
        &moved.dir,
        &Reference::parse(&format!("{}/bases/cuda", reg.addr)).unwrap(),
        &opts,
    )
    .unwrap();
    let pinned = PullOptions {
        pin: Some(Pin {
            digest: pulled.digest.clone(),
            source: "lock file recipe.lock".into(),
        }),
        ..pull_opts.clone()
    };
    let again = registry::pull_with(&reference, &tmp.path().join("l2"), &pinned).unwrap();
    assert_eq!(again.digest, made.targets[0].1);
    let updated = registry::pull_with(&reference, &tmp.path().join("l3"), &pull_opts).unwrap();
    assert_eq!(updated.digest, moved.targets[0].1);
}

#[test]
fn registry_push_to_second_repository_mounts() {
    let test = "registry_push_to_second_repository_mounts";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "v1", &targets(), 6);
    let (code, _, err) = push_cli(
        &made.dir,
        &format!("{}/team-a/mlp", reg.addr),
        tmp.path(),
        &["--insecure"],
    );
    assert_eq!(code, 0, "{err}");
    let (code, report, err) = push_cli(
        &made.dir,
        &format!("{}/team-b/mlp", reg.addr),
        tmp.path(),
        &["--insecure"],
    );
    assert_eq!(code, 0, "{err}");
    let report = report.expect("push --json prints its report");
    assert_eq!(report.bytes_uploaded, 0, "{report:?}");
    assert_eq!(report.blobs_mounted, made.blobs.len() + 4, "{report:?}");
}

#[test]
fn registry_push_rejects_bad_layouts() {
    let tmp = tempfile::tempdir().unwrap();
    // No registry needed: the layout is checked before connecting.
    let (code, _, err) = push_cli(tmp.path(), "127.0.0.1:1/x", tmp.path(), &["--insecure"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("oci-layout"), "{err}");
    let made = make_layout(&tmp.path().join("layout"), "v1", &targets()[..1], 7);
    std::fs::write(
        made.dir.join("blobs/sha256").join(&made.blobs[0][7..]),
        b"short",
    )
    .unwrap();
    let (code, _, err) = push_cli(&made.dir, "127.0.0.1:1/x", tmp.path(), &["--insecure"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&made.blobs[0]), "{err}");
    let (code, _, err) = push_cli(&made.dir, "127.0.0.1:1/x:tag", tmp.path(), &["--insecure"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn registry_bearer_token_auth_with_scopes() {
    let test = "registry_bearer_token_auth_with_scopes";
    let Some((reg, tokens)) = Registry::start_token_auth(test) else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "v1", &targets()[..1], 8);
    let mut client = plain_opts(tmp.path());
    // The token endpoint is on another origin (its own port): the registry's credentials are
    // never sent there, only those configured for the token endpoint's own host.
    std::fs::write(
        tmp.path().join("docker.json"),
        format!(
            r#"{{"auths":{{"{}":{{"username":"tok-user","password":"tok-pass"}}}}}}"#,
            reg.addr
        ),
    )
    .unwrap();
    client.keychain.docker_config = Some(tmp.path().join("docker.json"));
    let _ = registry::push(
        &made.dir,
        &Reference::parse(&format!("{}/team-0/mlp", reg.addr)).unwrap(),
        &Attachments::default().onto(PushOptions {
            client: client.clone(),
            locations_file: Some(tmp.path().join("locations-0.json")),
            ..PushOptions::default()
        }),
    );
    {
        let asked = tokens.requests.lock().unwrap();
        assert!(!asked.is_empty());
        assert!(asked.iter().all(|(_, basic)| !*basic), "{asked:?}");
    }
    tokens.requests.lock().unwrap().clear();
    // Basic credentials for the token endpoint's host go to it, which trades them for tokens.
    std::fs::write(
        tmp.path().join("docker.json"),
        format!(
            r#"{{"auths":{{"{}":{{"username":"tok-user","password":"tok-pass"}},"{}":{{"username":"tok-user","password":"tok-pass"}}}}}}"#,
            reg.addr, tokens.addr
        ),
    )
    .unwrap();
    client.keychain.docker_config = Some(tmp.path().join("docker.json"));
    let opts = Attachments::default().onto(PushOptions {
        client,
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    });
    let a = Reference::parse(&format!("{}/team-a/mlp", reg.addr)).unwrap();
    let report =
        registry::push(&made.dir, &a, &opts).unwrap_or_else(|e| panic!("{e:?}\n{}", reg.log()));
    assert_eq!(report.tags.len(), 2);
    // A second repository: the mount needs pull access to the first one in the same token.
    let b = Reference::parse(&format!("{}/team-b/mlp", reg.addr)).unwrap();
    let report =
        registry::push(&made.dir, &b, &opts).unwrap_or_else(|e| panic!("{e:?}\n{}", reg.log()));
    assert_eq!(report.bytes_uploaded, 0);
    assert!(report.blobs_mounted > 0);
    let asked = tokens.requests.lock().unwrap().clone();
    assert!(
        asked
            .iter()
            .any(|(s, _)| s.contains(&"repository:team-a/mlp:pull,push".to_string())),
        "{asked:?}"
    );
    assert!(
        asked.iter().any(
            |(s, _)| s.contains(&"repository:team-b/mlp:pull,push".to_string())
                && s.contains(&"repository:team-a/mlp:pull".to_string())
        ),
        "{asked:?}"
    );
    // Tokens are cached: far fewer token requests than registry requests.
    assert!(
        asked.len() <= 8,
        "{} token requests: {asked:?}",
        asked.len()
    );
    assert!(asked.iter().all(|(_, basic)| *basic), "{asked:?}");
}

#[test]
fn registry_docker_pull_of_the_index_tag_gets_the_first_amd64_entry() {
    let test = "registry_docker_pull_of_the_index_tag_gets_the_first_amd64_entry";
    let Some(reg) = Registry::start(test) else {
        return;
    };
    if !super::support::have_docker(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // As `build` writes them: CPU first, then the GPU targets, every one linux/amd64.
    let mut order = targets();
    order.rotate_right(1);
    assert_eq!(order[0].id, "cpu-fp32");
    let made = make_layout(&tmp.path().join("layout"), "v1", &order, 31);
    let to = format!("{}/ml/fleet", reg.addr);
    let (code, _, err) = push_cli(&made.dir, &to, tmp.path(), &["--insecure"]);
    assert_eq!(code, 0, "{err}");

    // `inspect` of the index says what a plain pull gets, and that GPU nodes must not use it.
    let out = infer_build()
        .args(["inspect", &format!("{to}:v1"), "--insecure", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let v: RemoteImage = serde_json::from_str(&stdout(&out)).unwrap();
    let plain = v.plain_pull.expect("an index says what a plain pull gets");
    assert_eq!(plain.target.as_deref(), Some("cpu-fp32"), "{plain:?}");
    assert_eq!(plain.candidates, 3, "{plain:?}");
    assert_eq!(plain.digest, made.targets[0].1.as_str());
    let out = infer_build()
        .args(["inspect", &format!("{to}:v1"), "--insecure"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("GPU nodes must pull their per-target tag"),
        "{}",
        stderr(&out)
    );

    // What Docker itself pulls from the index tag: the CPU image, whatever the node's GPU.
    let image = format!("{to}:v1");
    let pull = Command::new("docker")
        .args(["pull", &image])
        .output()
        .unwrap();
    assert!(pull.status.success(), "docker pull: {}", stderr(&pull));
    let id = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", &image])
        .output()
        .unwrap();
    let _ = Command::new("docker").args(["rmi", &image]).output();
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(made.dir.join("blobs/sha256").join(&made.targets[0].1[7..])).unwrap(),
    )
    .unwrap();
    assert_eq!(
        stdout(&id).trim(),
        manifest["config"]["digest"].as_str().unwrap(),
        "docker pull of the index tag did not get the first (CPU) entry"
    );
}
