//! Attacks from a hostile registry on loopback (`hostile_registry::Hostile`): each test reproduces one
//! and checks the client holds: credentials stay with the registry's own origin, TLS never
//! downgrades, every wait is bounded, registry-given offsets must progress, local blobs are
//! verified before upload, manifests and bodies are bounded. No external tool is needed
//! (TLS tests make certificates with `openssl` and skip without it).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use infer_build::registry::{
    self, Client, ClientOptions, Keychain, PullOptions, PushOptions, Reference,
};
use serde_json::json;

use super::hostile_registry::{Hostile, Reply, Seen};
use super::registry_support::{have_openssl_for, make_layout, test_ca, Target};
use super::support::sha256;
use super::support::{infer_build, stderr};

/// Quick, hermetic client options: credentials only from `creds` (a credentials file, or
/// none), short deadlines, few tries.
fn opts(tmp: &Path, creds: Option<&str>) -> ClientOptions {
    let file = tmp.join("creds.json");
    match creds {
        Some(text) => std::fs::write(&file, text).unwrap(),
        None => {
            let _ = std::fs::remove_file(&file);
        }
    }
    ClientOptions {
        insecure: true,
        keychain: Keychain {
            docker_config: Some(file),
            ignore_env: true,
        },
        max_attempts: 3,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_secs(3),
        min_rate: 1 << 20,
        ..ClientOptions::default()
    }
}

fn basic_creds(registry: &str) -> String {
    // "bench:s3cret"
    format!(r#"{{"auths":{{"{registry}":{{"auth":"YmVuY2g6czNjcmV0"}}}}}}"#)
}

const BASIC: &str = "Basic YmVuY2g6czNjcmV0";

fn one_target() -> Vec<Target> {
    vec![Target {
        id: "cpu-fp32",
        sm: None,
        model_bytes: 5_000,
    }]
}

/// An image a hostile registry serves: a manifest with a config and one layer.
pub(crate) struct Image {
    pub manifest: Vec<u8>,
    pub blobs: BTreeMap<String, Vec<u8>>,
    pub config: String,
}

pub(crate) fn image(layers: usize) -> Image {
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#
            .to_vec();
    let layer = b"layer bytes".to_vec();
    let mut blobs = BTreeMap::new();
    blobs.insert(sha256(&config), config.clone());
    blobs.insert(sha256(&layer), layer.clone());
    let one = json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": sha256(&layer), "size": layer.len()});
    let manifest = json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha256(&config), "size": config.len()},
        "layers": vec![one; layers],
    });
    Image {
        manifest: serde_json::to_vec(&manifest).unwrap(),
        config: sha256(&config),
        blobs,
    }
}

/// A registry serving `img` as `x/img:v1`, with `blob` deciding blob answers (`None` = the
/// honest one).
pub(crate) fn serve(
    img: Image,
    blob: impl Fn(&Seen, &[u8]) -> Option<Reply> + Send + Sync + 'static,
) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    let img = Arc::new(img);
    move |r: &Seen| {
        let p = r.path();
        if p == "/v2/" {
            return Reply::status(200);
        }
        if p.starts_with("/v2/x/img/manifests/") {
            return Reply::with(
                200,
                &[
                    ("content-type", "application/vnd.oci.image.manifest.v1+json"),
                    ("docker-content-digest", &sha256(&img.manifest)),
                ],
                &img.manifest,
            );
        }
        if let Some(d) = p.strip_prefix("/v2/x/img/blobs/") {
            if let Some(bytes) = img.blobs.get(d) {
                if let Some(reply) = blob(r, bytes) {
                    return reply;
                }
                return Reply::with(200, &[], bytes);
            }
        }
        Reply::status(404)
    }
}

fn pull_opts(tmp: &Path) -> PullOptions {
    PullOptions {
        client: opts(tmp, None),
        ..PullOptions::default()
    }
}

#[test]
fn hostile_token_realm_on_another_origin_gets_no_credentials() {
    let tmp = tempfile::tempdir().unwrap();
    let token = Hostile::start(|_| {
        Reply::with(
            200,
            &[("content-type", "application/json")],
            br#"{"token":"t0k"}"#,
        )
    });
    let realm = format!("http://{}/token", token.addr);
    let reg = Hostile::start(move |r| {
        if r.header("authorization") == Some("Bearer t0k") {
            return Reply::status(200);
        }
        Reply::with(
            401,
            &[(
                "www-authenticate",
                &format!(r#"Bearer realm="{realm}",service="x""#),
            )],
            b"",
        )
    });
    Client::connect(&reg.addr, opts(tmp.path(), Some(&basic_creds(&reg.addr)))).unwrap();
    let asked = token.requests();
    assert!(!asked.is_empty());
    assert!(
        asked.iter().all(|r| r.header("authorization").is_none()),
        "credentials went to another origin: {asked:?}"
    );
    // Credentials configured for the token endpoint's own host do go there, and only they.
    let both = format!(
        r#"{{"auths":{{"{}":{{"auth":"YmVuY2g6czNjcmV0"}},"{}":{{"auth":"b3RoZXI6cHc="}}}}}}"#,
        reg.addr, token.addr
    );
    Client::connect(&reg.addr, opts(tmp.path(), Some(&both))).unwrap();
    let asked = token.requests();
    assert_eq!(
        asked.last().and_then(|r| r.header("authorization")),
        Some("Basic b3RoZXI6cHc="),
        "{asked:?}"
    );
    assert!(asked
        .iter()
        .all(|r| r.header("authorization") != Some(BASIC)));

    // A realm on the registry's own origin does get them (the control).
    let reg = Hostile::start(|r| match (r.path(), r.header("authorization")) {
        ("/token", Some(BASIC)) => Reply::with(200, &[], br#"{"token":"t1k"}"#),
        ("/token", _) => Reply::status(401),
        (_, Some("Bearer t1k")) => Reply::status(200),
        _ => Reply::with(
            401,
            &[(
                "www-authenticate",
                &format!(
                    r#"Bearer realm="http://{}/token",service="x""#,
                    r.header("host").unwrap_or("")
                ),
            )],
            b"",
        ),
    });
    let client =
        Client::connect(&reg.addr, opts(tmp.path(), Some(&basic_creds(&reg.addr)))).unwrap();
    assert!(client.credentials_checked());
}

#[test]
fn hostile_tls_registry_never_sends_anything_to_a_plain_http_realm() {
    let test = "hostile_tls_registry_never_sends_anything_to_a_plain_http_realm";
    if !have_openssl_for(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    test_ca(tmp.path());
    let token = Hostile::start(|_| Reply::with(200, &[], br#"{"token":"t0k"}"#));
    let realm = format!("http://{}/token", token.addr);
    let reg = Hostile::start_tls(
        &tmp.path().join("cert.pem"),
        &tmp.path().join("key.pem"),
        move |_| {
            Reply::with(
                401,
                &[("www-authenticate", &format!(r#"Bearer realm="{realm}""#))],
                b"",
            )
        },
    );
    let o = ClientOptions {
        insecure: false,
        ca_cert: Some(tmp.path().join("ca.pem")),
        ..opts(tmp.path(), Some(&basic_creds(&reg.addr)))
    };
    let e = Client::connect(&reg.addr, o).unwrap_err();
    assert!(!reg.requests().is_empty(), "the TLS registry was reached");
    assert!(
        token.requests().is_empty(),
        "a TLS registry's credentials went to a plain-HTTP realm: {:?} ({e})",
        token.requests()
    );
    // Said for what it is: the realm is refused, not the credentials.
    let msg = e.to_string();
    assert!(
        msg.contains("realm scheme downgrade") && msg.contains(&realm_shown(&token.addr)),
        "{msg}"
    );
    assert!(!msg.contains("refused the credentials"), "{msg}");
    assert!(!e.is_bad_input(), "the registry's doing: exit 1 ({msg})");
}

fn realm_shown(token_addr: &str) -> String {
    format!("http://{token_addr}/token")
}

/// A registry with basic auth whose upload sessions live at `location(request)`.
fn basic_auth_registry(
    location: impl Fn(&Seen) -> String + Send + Sync + 'static,
) -> impl Fn(&Seen) -> Reply + Send + Sync + 'static {
    move |r: &Seen| {
        if r.header("authorization") != Some(BASIC) {
            return Reply::with(401, &[("www-authenticate", r#"Basic realm="x""#)], b"");
        }
        match (r.method.as_str(), r.path()) {
            ("GET", "/v2/") => Reply::status(200),
            ("POST", p) if p.ends_with("/blobs/uploads/") => {
                Reply::with(202, &[("location", &location(r))], b"")
            }
            _ => Reply::status(404),
        }
    }
}

#[test]
fn hostile_upload_location_on_another_origin_gets_no_authorization() {
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "v1", &one_target(), 1);
    let other = Hostile::start(|_| Reply::status(400));
    let elsewhere = format!("http://{}/upload/1", other.addr);
    let reg = Hostile::start(basic_auth_registry(move |_| elsewhere.clone()));
    let o = PushOptions {
        client: opts(tmp.path(), Some(&basic_creds(&reg.addr))),
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    };
    let to = Reference::parse(&format!("{}/x/img", reg.addr)).unwrap();
    assert!(registry::push(&made.dir, &to, &o).is_err());
    let seen = other.requests();
    assert!(!seen.is_empty(), "the upload never went to its location");
    assert!(
        seen.iter().all(|r| r.header("authorization").is_none()),
        "credentials went to the upload location's origin: {seen:?}"
    );
}

#[test]
fn hostile_tls_upload_location_on_plain_http_is_refused() {
    let test = "hostile_tls_upload_location_on_plain_http_is_refused";
    if !have_openssl_for(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    test_ca(tmp.path());
    let made = make_layout(&tmp.path().join("layout"), "v1", &one_target(), 2);
    let other = Hostile::start(|_| Reply::status(400));
    let elsewhere = format!("http://{}/upload/1", other.addr);
    let reg = Hostile::start_tls(
        &tmp.path().join("cert.pem"),
        &tmp.path().join("key.pem"),
        basic_auth_registry(move |_| elsewhere.clone()),
    );
    let o = PushOptions {
        client: ClientOptions {
            insecure: false,
            ca_cert: Some(tmp.path().join("ca.pem")),
            ..opts(tmp.path(), Some(&basic_creds(&reg.addr)))
        },
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    };
    let to = Reference::parse(&format!("{}/x/img", reg.addr)).unwrap();
    let e = registry::push(&made.dir, &to, &o).unwrap_err().to_string();
    assert!(
        other.requests().is_empty(),
        "TLS was left for plain HTTP ({e})"
    );
    assert!(e.contains("downgrade to plain HTTP refused"), "{e}");
    // Refused at once, not retried.
    let posts = reg.requests().iter().filter(|r| r.method == "POST").count();
    assert!(posts <= 3, "{posts} upload sessions ({e})");
}

#[test]
fn hostile_tls_blob_redirect_to_plain_http_is_not_followed() {
    let test = "hostile_tls_blob_redirect_to_plain_http_is_not_followed";
    if !have_openssl_for(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    test_ca(tmp.path());
    let other = Hostile::start(|_| Reply::status(404));
    let elsewhere = format!("http://{}/storage/blob", other.addr);
    let reg = Hostile::start_tls(
        &tmp.path().join("cert.pem"),
        &tmp.path().join("key.pem"),
        serve(image(1), move |_, _| {
            Some(Reply::with(307, &[("location", &elsewhere)], b""))
        }),
    );
    let o = PullOptions {
        client: ClientOptions {
            insecure: false,
            ca_cert: Some(tmp.path().join("ca.pem")),
            ..opts(tmp.path(), None)
        },
        ..PullOptions::default()
    };
    let r = registry::pull_with(
        &format!("{}/x/img:v1", reg.addr),
        &tmp.path().join("out"),
        &o,
    );
    assert!(r.is_err());
    assert!(
        other.requests().is_empty(),
        "a TLS blob redirect to plain HTTP was followed: {:?}",
        other.requests()
    );
}

#[test]
fn hostile_silence_and_trickles_are_bounded() {
    let tmp = tempfile::tempdir().unwrap();
    // No answer to `/v2/`: three timeouts of a second, not ten of ten minutes.
    let reg = Hostile::start(|_| Reply::Silence);
    let start = Instant::now();
    assert!(Client::connect(&reg.addr, opts(tmp.path(), None)).is_err());
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );
    assert!(reg.requests().len() <= 3, "{}", reg.requests().len());

    // Headers, then silence, on the manifest.
    let reg = Hostile::start(|r| match r.path() {
        "/v2/" => Reply::status(200),
        _ => Reply::HeadersThenSilence {
            status: 200,
            headers: vec![(
                "content-type".into(),
                "application/vnd.oci.image.manifest.v1+json".into(),
            )],
            len: 1000,
        },
    });
    let start = Instant::now();
    let r = registry::pull_with(
        &format!("{}/x/img:v1", reg.addr),
        &tmp.path().join("a"),
        &pull_opts(tmp.path()),
    );
    assert!(r.is_err());
    assert!(
        start.elapsed() < Duration::from_secs(20),
        "{:?}",
        start.elapsed()
    );

    // A blob at one byte every 200 ms: each try ends at its total deadline.
    let reg = Hostile::start(serve(image(1), |_, bytes| {
        Some(Reply::Trickle {
            status: 200,
            headers: Vec::new(),
            body: bytes.to_vec(),
            every: Duration::from_millis(200),
        })
    }));
    let start = Instant::now();
    let r = registry::pull_with(
        &format!("{}/x/img:v1", reg.addr),
        &tmp.path().join("b"),
        &pull_opts(tmp.path()),
    );
    assert!(r.is_err(), "a trickled blob finished within the deadline?");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "{:?}",
        start.elapsed()
    );

    // A push whose upload is never answered.
    let made = make_layout(&tmp.path().join("layout"), "v1", &one_target(), 3);
    let reg = Hostile::start(|r| match (r.method.as_str(), r.path()) {
        ("GET", "/v2/") => Reply::status(200),
        ("HEAD", _) => Reply::status(404),
        ("POST", _) => Reply::with(202, &[("location", "/upload/1")], b""),
        _ => Reply::Silence,
    });
    let o = PushOptions {
        client: opts(tmp.path(), None),
        jobs: 1,
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    };
    let start = Instant::now();
    let to = Reference::parse(&format!("{}/x/img", reg.addr)).unwrap();
    assert!(registry::push(&made.dir, &to, &o).is_err());
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn hostile_range_that_never_moves_fails_the_upload() {
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "v1", &one_target(), 4);
    // Without the check the client would resend forever: the server stops it at 200 PATCHes
    // (with a plain 400) so that the test fails instead of hanging.
    let patches = std::sync::atomic::AtomicUsize::new(0);
    let reg = Hostile::start(move |r| match (r.method.as_str(), r.path()) {
        ("GET", "/v2/") => Reply::status(200),
        ("HEAD", _) => Reply::status(404),
        ("POST", _) => Reply::with(202, &[("location", "/upload/1")], b""),
        ("PATCH", _) if patches.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 200 => {
            Reply::status(400)
        }
        ("PATCH", _) => Reply::with(202, &[("location", "/upload/1"), ("range", "0-49")], b""),
        _ => Reply::status(500),
    });
    let o = PushOptions {
        client: opts(tmp.path(), None),
        jobs: 1,
        chunk_size: 100,
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    };
    let to = Reference::parse(&format!("{}/x/img", reg.addr)).unwrap();
    let e = registry::push(&made.dir, &to, &o).unwrap_err().to_string();
    let patches = reg
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
        .count();
    assert!(patches <= 2, "{patches} PATCHes ({e})");
    assert!(e.contains("Range"), "{e}");
}

#[test]
fn hostile_push_sends_no_symlinked_or_corrupt_blob() {
    let tmp = tempfile::tempdir().unwrap();
    let made = make_layout(&tmp.path().join("layout"), "v1", &one_target(), 5);
    let blob = |d: &str| made.dir.join("blobs/sha256").join(&d[7..]);
    // A layer linked to a file outside the layout, with the right size (and even the right
    // bytes): refused before any connection, exit 2.
    let layer = made.blobs[0].clone();
    let outside = tmp.path().join("outside");
    std::fs::copy(blob(&layer), &outside).unwrap();
    std::fs::remove_file(blob(&layer)).unwrap();
    std::os::unix::fs::symlink(&outside, blob(&layer)).unwrap();
    let out = infer_build()
        .args(["push"])
        .arg(&made.dir)
        .args(["--to", "127.0.0.1:1/x/img", "--insecure"])
        .env("INFER_BUILD_CACHE_DIR", tmp.path())
        .env("DOCKER_CONFIG", tmp.path().join("docker"))
        .env_remove("REGISTRY_AUTH_FILE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("is a symbolic link"),
        "{}",
        stderr(&out)
    );
    std::fs::remove_file(blob(&layer)).unwrap();
    std::fs::copy(&outside, blob(&layer)).unwrap();

    // Right size, wrong bytes: found before a byte is uploaded.
    let mut bytes = std::fs::read(blob(&layer)).unwrap();
    bytes[10] ^= 0xff;
    std::fs::write(blob(&layer), &bytes).unwrap();
    let reg = Hostile::start(|r| match (r.method.as_str(), r.path()) {
        ("GET", "/v2/") => Reply::status(200),
        ("HEAD", _) => Reply::status(404),
        ("POST", _) => Reply::with(202, &[("location", "/upload/1")], b""),
        _ => Reply::status(201),
    });
    let o = PushOptions {
        client: opts(tmp.path(), None),
        jobs: 1,
        locations_file: Some(tmp.path().join("locations.json")),
        ..PushOptions::default()
    };
    let to = Reference::parse(&format!("{}/x/img", reg.addr)).unwrap();
    let e = registry::push(&made.dir, &to, &o).unwrap_err();
    assert!(e.is_bad_input(), "{e}");
    assert!(e.to_string().contains(&layer), "{e}");
    let sent: Vec<Seen> = reg
        .requests()
        .into_iter()
        .filter(|r| r.body_len > 0 && r.header("content-length") != Some("0"))
        .filter(|r| r.path().starts_with("/upload/"))
        .collect();
    assert!(
        sent.iter().all(|r| !r.target.contains(&layer[7..])),
        "{sent:?}"
    );
}

#[test]
fn hostile_manifest_with_too_many_layers_is_refused_before_any_blob() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = Hostile::start(serve(image(5000), |_, _| None));
    let e = registry::pull_with(
        &format!("{}/x/img:v1", reg.addr),
        &tmp.path().join("out"),
        &pull_opts(tmp.path()),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("5000 layers") && e.contains("1000"), "{e}");
    assert!(
        reg.requests().iter().all(|r| !r.path().contains("/blobs/")),
        "blobs were fetched"
    );
}

#[test]
fn hostile_overlong_blob_is_fetched_once_and_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let reg = Hostile::start(serve(image(1), |_, bytes| {
        let mut longer = bytes.to_vec();
        longer.extend_from_slice(&[0u8; 4096]);
        Some(Reply::with(200, &[], &longer))
    }));
    let e = registry::pull_with(
        &format!("{}/x/img:v1", reg.addr),
        &tmp.path().join("out"),
        &pull_opts(tmp.path()),
    )
    .unwrap_err()
    .to_string();
    let gets = reg
        .requests()
        .iter()
        .filter(|r| r.path().contains("/blobs/"))
        .count();
    assert_eq!(gets, 1, "{e}");
    assert!(e.contains("descriptor says"), "{e}");
}

#[test]
fn hostile_killed_pull_leaves_no_partial_blob() {
    let tmp = tempfile::tempdir().unwrap();
    let img = image(1);
    let config = img.config.clone();
    // The config blob: headers, then nothing, so the pull is caught mid-blob.
    let reg = Hostile::start(serve(img, move |r, bytes| {
        r.path()
            .ends_with(&config)
            .then(|| Reply::HeadersThenSilence {
                status: 200,
                headers: Vec::new(),
                len: bytes.len() as u64,
            })
    }));
    let out = tmp.path().join("out");
    let mut child = infer_build()
        .args([
            "pull",
            &format!("{}/x/img:v1", reg.addr),
            "--insecure",
            "--out",
        ])
        .arg(&out)
        .env("INFER_BUILD_CACHE_DIR", tmp.path())
        .env("DOCKER_CONFIG", tmp.path().join("docker"))
        .env_remove("REGISTRY_AUTH_FILE")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let tmp_dir = out.join(".infer-build/pull-tmp");
    let partial = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.len() != 64)
                    .collect()
            })
            .unwrap_or_default()
    };
    // Wait until the blob's temporary file exists, wherever it is made.
    let start = Instant::now();
    while partial(&tmp_dir).is_empty() && partial(&out.join("blobs/sha256")).is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the pull never started a blob"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let leftovers = partial(&out.join("blobs/sha256"));
    assert!(
        leftovers.is_empty(),
        "partial files among the blobs: {leftovers:?}"
    );

    // The next pull clears what the killed one left.
    let reg = Hostile::start(serve(image(1), |_, _| None));
    registry::pull_with(
        &format!("{}/x/img:v1", reg.addr),
        &out,
        &pull_opts(tmp.path()),
    )
    .unwrap();
    assert!(!tmp_dir.exists());
}

/// A directory outside the layout with one file in it, to check a pull never touches it.
fn victim(root: &Path) -> std::path::PathBuf {
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
        "a pull wrote into or removed from {v:?}"
    );
    assert_eq!(std::fs::read(v.join("precious")).unwrap(), b"precious");
}

#[test]
fn hostile_pull_replaces_a_linked_pull_tmp_and_never_writes_through_it() {
    let tmp = tempfile::tempdir().unwrap();
    let v = victim(tmp.path());
    let out = tmp.path().join("out");
    std::fs::create_dir_all(out.join(".infer-build")).unwrap();
    std::os::unix::fs::symlink(&v, out.join(".infer-build/pull-tmp")).unwrap();
    let reg = Hostile::start(serve(image(1), |_, _| None));
    registry::pull_with(
        &format!("{}/x/img:v1", reg.addr),
        &out,
        &pull_opts(tmp.path()),
    )
    .unwrap();
    untouched(&v);
    assert!(
        std::fs::symlink_metadata(out.join(".infer-build/pull-tmp")).is_err(),
        "the link is gone, not followed"
    );
    let blobs = std::fs::read_dir(out.join("blobs/sha256")).unwrap().count();
    assert_eq!(blobs, 3, "config, layer and manifest");
}

#[test]
fn hostile_pull_refuses_a_linked_blob_or_private_directory() {
    for linked in ["blobs/sha256", ".infer-build"] {
        let tmp = tempfile::tempdir().unwrap();
        let v = victim(tmp.path());
        let out = tmp.path().join("out");
        let link = out.join(linked);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&v, &link).unwrap();
        let reg = Hostile::start(serve(image(1), |_, _| None));
        let e = registry::pull_with(
            &format!("{}/x/img:v1", reg.addr),
            &out,
            &pull_opts(tmp.path()),
        )
        .unwrap_err();
        assert!(e.is_bad_input(), "{linked}: {e}");
        assert!(e.to_string().contains("symbolic link"), "{linked}: {e}");
        untouched(&v);
    }
}

#[test]
fn hostile_login_exit_codes_say_whose_mistake() {
    let tmp = tempfile::tempdir().unwrap();
    let login = |addr: &str, password: &str| {
        use std::io::Write as _;
        let mut child = infer_build()
            .args([
                "login",
                addr,
                "-u",
                "bench",
                "--password-stdin",
                "--insecure",
            ])
            .arg("--authfile")
            .arg(tmp.path().join("auth.json"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(
                format!(
                    "{password}
"
                )
                .as_bytes(),
            )
            .unwrap();
        child.wait_with_output().unwrap()
    };
    // The registry's failure: exit 1, nothing stored.
    let down = Hostile::start(|_| Reply::with(503, &[("retry-after", "0")], b""));
    let out = login(&down.addr, "s3cret");
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(!tmp.path().join("auth.json").exists());
    // A wrong password: exit 2, nothing stored, the password never printed.
    let reg = Hostile::start(basic_auth_registry(|_| "/upload/1".into()));
    let out = login(&reg.addr, "wrong-pw");
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains(&reg.addr), "{}", stderr(&out));
    assert!(!stderr(&out).contains("wrong-pw"));
    assert!(!tmp.path().join("auth.json").exists());
    // The right one: stored, in the format skopeo writes.
    let out = login(&reg.addr, "s3cret");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(tmp.path().join("auth.json")).unwrap()).unwrap();
    assert_eq!(doc["auths"][&reg.addr]["auth"], "YmVuY2g6czNjcmV0");
}

/// `infer-build ARGS` in a hermetic environment (no credentials file of this machine, no
/// environment credentials) plus `env`: exit code, stderr and how long it took.
fn cli(tmp: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, Duration) {
    let mut cmd = infer_build();
    cmd.args(args)
        .env("HOME", tmp)
        .env("INFER_BUILD_CACHE_DIR", tmp.join("cache"))
        .env("DOCKER_CONFIG", tmp.join("docker"))
        .env("XDG_CONFIG_HOME", tmp.join("xdg-config"))
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("REGISTRY_AUTH_FILE")
        .env_remove("SSL_CERT_FILE");
    for k in [
        "INFER_BUILD_REGISTRY",
        "INFER_BUILD_REGISTRY_USER",
        "INFER_BUILD_REGISTRY_PASSWORD",
        "INFER_BUILD_REGISTRY_MIN_RATE",
        "INFER_BUILD_REGISTRY_RATE_WINDOW",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let start = Instant::now();
    let out = cmd.output().unwrap();
    (out.status.code(), stderr(&out), start.elapsed())
}

/// `bench:s3cret` from the environment, for `registry`.
fn env_creds(registry: &str) -> Vec<(&'static str, String)> {
    vec![
        ("INFER_BUILD_REGISTRY_USER", "bench".into()),
        ("INFER_BUILD_REGISTRY_PASSWORD", "s3cret".into()),
        ("INFER_BUILD_REGISTRY", registry.into()),
    ]
}

fn as_env<'a>(v: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    v.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

#[test]
fn hostile_env_credentials_go_only_to_the_registry_infer_build_registry_names() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let no_auth = |seen: Vec<Seen>, what: &str| {
        assert!(!seen.is_empty(), "{what} was never asked");
        assert!(
            seen.iter().all(|r| r.header("authorization").is_none()),
            "environment credentials went to {what}: {seen:?}"
        );
    };

    // 1. A token realm on another origin: asked anonymously, by pull and push alike.
    let token = Hostile::start(|_| Reply::with(200, &[], br#"{"token":"t0k"}"#));
    let storage = Hostile::start(|_| Reply::status(404));
    let realm = format!("http://{}/token", token.addr);
    // 2. ... and blobs redirected to storage on another origin.
    let blob_elsewhere = format!("http://{}/storage/blob", storage.addr);
    let inner = serve(image(1), move |_, _| {
        Some(Reply::with(307, &[("location", &blob_elsewhere)], b""))
    });
    let reg = Hostile::start(move |r| {
        if r.header("authorization") != Some("Bearer t0k") {
            return Reply::with(
                401,
                &[(
                    "www-authenticate",
                    &format!(r#"Bearer realm="{realm}",service="x""#),
                )],
                b"",
            );
        }
        inner(r)
    });
    let creds = env_creds(&reg.addr);
    let out = t.join("pulled");
    let (code, err, _) = cli(
        t,
        &[
            "pull",
            &format!("{}/x/img:v1", reg.addr),
            "--insecure",
            "--out",
            out.to_str().unwrap(),
        ],
        &as_env(&creds),
    );
    assert_ne!(code, Some(0), "{err}");
    no_auth(token.requests(), "a token realm on another origin");
    no_auth(storage.requests(), "a blob redirect to another origin");
    assert!(!err.contains("s3cret"), "{err}");

    // The control: a realm on the registry's own origin gets them.
    let reg = Hostile::start(|r| match (r.path(), r.header("authorization")) {
        ("/token", Some(BASIC)) => Reply::with(200, &[], br#"{"token":"t1k"}"#),
        ("/token", _) => Reply::status(401),
        ("/v2/", Some("Bearer t1k")) => Reply::status(200),
        (_, Some("Bearer t1k")) => Reply::status(404),
        _ => Reply::with(
            401,
            &[(
                "www-authenticate",
                &format!(
                    r#"Bearer realm="http://{}/token",service="x""#,
                    r.header("host").unwrap_or("")
                ),
            )],
            b"",
        ),
    });
    let creds = env_creds(&reg.addr);
    let (code, err, _) = cli(
        t,
        &["inspect", &format!("{}/x/img:v1", reg.addr), "--insecure"],
        &as_env(&creds),
    );
    assert_ne!(code, Some(0), "no such image");
    assert!(
        reg.requests()
            .iter()
            .any(|r| r.path() == "/token" && r.header("authorization") == Some(BASIC)),
        "the registry's own realm never got its credentials: {err}"
    );

    // 3. An upload location on another origin: the registry gets its credentials, the
    // location none.
    let made = make_layout(&t.join("layout"), "v1", &one_target(), 6);
    let other = Hostile::start(|_| Reply::status(400));
    let elsewhere = format!("http://{}/upload/1", other.addr);
    let reg = Hostile::start(basic_auth_registry(move |_| elsewhere.clone()));
    let push = |reg: &Hostile, env: &[(&str, &str)]| {
        cli(
            t,
            &[
                "push",
                made.dir.to_str().unwrap(),
                "--to",
                &format!("{}/x/img", reg.addr),
                "--insecure",
                "--no-warmup",
            ],
            env,
        )
    };
    let creds = env_creds(&reg.addr);
    let (code, err, _) = push(&reg, &as_env(&creds));
    assert_ne!(code, Some(0), "{err}");
    assert!(
        reg.requests()
            .iter()
            .any(|r| r.header("authorization") == Some(BASIC)),
        "the registry INFER_BUILD_REGISTRY names never got the credentials"
    );
    no_auth(other.requests(), "an upload location on another origin");

    // 4. Without INFER_BUILD_REGISTRY, or naming another registry, they are not used at all,
    // and the refusal says why (exit 2).
    let reg = Hostile::start(basic_auth_registry(|_| "/upload/1".into()));
    let unbound = [
        ("INFER_BUILD_REGISTRY_USER", "bench"),
        ("INFER_BUILD_REGISTRY_PASSWORD", "s3cret"),
    ];
    let (code, err, _) = push(&reg, &unbound);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("INFER_BUILD_REGISTRY is unset"), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
    let elsewhere = [
        ("INFER_BUILD_REGISTRY_USER", "bench"),
        ("INFER_BUILD_REGISTRY_PASSWORD", "s3cret"),
        ("INFER_BUILD_REGISTRY", "registry.example.com"),
    ];
    let (code, err, _) = push(&reg, &elsewhere);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("are for `registry.example.com`") && err.contains(&reg.addr),
        "{err}"
    );
    no_auth(
        reg.requests(),
        "a registry INFER_BUILD_REGISTRY does not name",
    );
}

#[test]
fn hostile_creeping_range_is_refused_at_the_first_chunk() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let made = make_layout(&t.join("layout"), "v1", &one_target(), 7);
    // Each PATCH "accepted" (202) with a Range one byte past the previous one: the client
    // would resend the chunk for every byte of the blob. Past 200 PATCHes the server
    // answers 400 so that a regression fails instead of running for minutes.
    let patches = std::sync::atomic::AtomicUsize::new(0);
    let reg = Hostile::start(move |r| match (r.method.as_str(), r.path()) {
        ("GET", "/v2/") => Reply::status(200),
        ("HEAD", _) => Reply::status(404),
        ("POST", _) => Reply::with(202, &[("location", "/upload/1")], b""),
        ("PATCH", _) if patches.fetch_add(1, std::sync::atomic::Ordering::Relaxed) >= 200 => {
            Reply::status(400)
        }
        ("PATCH", _) => {
            let start = r
                .header("content-range")
                .and_then(|c| c.split('-').next())
                .unwrap_or("0")
                .to_string();
            Reply::with(
                202,
                &[("location", "/upload/1"), ("range", &format!("0-{start}"))],
                b"",
            )
        }
        ("PUT", _) => Reply::status(201),
        _ => Reply::status(500),
    });
    let (code, err, took) = cli(
        t,
        &[
            "push",
            made.dir.to_str().unwrap(),
            "--to",
            &format!("{}/x/img", reg.addr),
            "--insecure",
            "--no-warmup",
            "--chunk-size",
            "4096",
            "--jobs",
            "1",
        ],
        &[],
    );
    assert_eq!(code, Some(1), "the registry's doing: {err}");
    assert!(
        err.contains("answered `Range: 0-") && err.contains("the whole chunk"),
        "{err}"
    );
    let patches = reg
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH")
        .count();
    assert_eq!(patches, 1, "{err}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

#[test]
fn hostile_trickling_registry_is_cut_off_at_the_minimum_rate() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // A small window, so that the test takes seconds; the rule is the default one's.
    let rate = [
        ("INFER_BUILD_REGISTRY_MIN_RATE", "65536"),
        ("INFER_BUILD_REGISTRY_RATE_WINDOW", "1"),
    ];

    // Push: the registry takes a blob's body at one byte a second. Larger than what the
    // sockets buffer, so the client sees it.
    let made = make_layout(
        &t.join("layout"),
        "v1",
        &[Target {
            id: "cpu-fp32",
            sm: None,
            model_bytes: 8 << 20,
        }],
        8,
    );
    let reg = Hostile::start_slow_reader(1 << 20, Duration::from_secs(1), |r| {
        match (r.method.as_str(), r.path()) {
            ("GET", "/v2/") => Reply::status(200),
            ("HEAD", _) => Reply::status(404),
            ("POST", _) => Reply::with(202, &[("location", "/upload/1")], b""),
            ("PUT", _) => Reply::status(201),
            _ => Reply::status(404),
        }
    });
    let (code, err, took) = cli(
        t,
        &[
            "push",
            made.dir.to_str().unwrap(),
            "--to",
            &format!("{}/x/img", reg.addr),
            "--insecure",
            "--no-warmup",
        ],
        &rate,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("slower than 65536 bytes/s") && err.contains("INFER_BUILD_REGISTRY_MIN_RATE"),
        "{err}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}: {err}");
    // Two small blobs, and at most three tries of the trickled one.
    let sessions = reg.requests().iter().filter(|r| r.method == "POST").count();
    assert!(sessions <= 5, "{sessions} upload sessions: {err}");

    // Pull: a blob body at one byte a second (it says 11 bytes; a large one is the same).
    let reg = Hostile::start(serve(image(1), |_, bytes| {
        Some(Reply::Trickle {
            status: 200,
            headers: Vec::new(),
            body: bytes.to_vec(),
            every: Duration::from_secs(1),
        })
    }));
    let out = t.join("pulled");
    let (code, err, took) = cli(
        t,
        &[
            "pull",
            &format!("{}/x/img:v1", reg.addr),
            "--insecure",
            "--out",
            out.to_str().unwrap(),
        ],
        &[
            ("INFER_BUILD_REGISTRY_MIN_RATE", "1000"),
            ("INFER_BUILD_REGISTRY_RATE_WINDOW", "1"),
        ],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("below the minimum rate of 1000 bytes/s"),
        "{err}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}: {err}");

    // A setting that is not a rate: bad input, before any connection.
    let (code, err, _) = cli(
        t,
        &[
            "pull",
            &format!("{}/x/img:v1", reg.addr),
            "--insecure",
            "--out",
            out.to_str().unwrap(),
        ],
        &[("INFER_BUILD_REGISTRY_MIN_RATE", "fast")],
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("INFER_BUILD_REGISTRY_MIN_RATE"), "{err}");
}
