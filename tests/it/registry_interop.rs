//! Registries as they answer: loopback fakes in the shapes of Docker Hub, NGC and GHCR, driven
//! by `infer-build pull`, and the places a pull goes (registries.conf mirrors, rate limits,
//! token services on other hosts).
//!
//! The shapes, from the registries' documentation and public clients:
//! - Docker Hub (docs.docker.com "Registry authentication" / "Docker Hub usage and limits";
//!   containerd `remotes/docker/resolver.go`, `DefaultHost`): the API on
//!   `registry-1.docker.io`, a `Bearer realm="https://auth.docker.io/token",
//!   service="registry.docker.io"` challenge, manifest lists and manifests with Docker media
//!   types, blob GETs answered `307` to a CDN host (`production.cloudflare.docker.com`) that
//!   must get no `Authorization`, `RateLimit-Limit`/`RateLimit-Remaining` headers and 429
//!   `TOOMANYREQUESTS` when the pull limit is spent; manifest HEADs do not count.
//! - NGC (docs.nvidia.com "NGC Private Registry User Guide"): user `$oauthtoken`, password
//!   the API key, the token realm on the registry's own host (`/proxy_auth`).
//! - GHCR (docs.github.com "Working with the Container registry"): anonymous tokens for public
//!   images from the realm `https://ghcr.io/token`, `service="ghcr.io"`.
//!
//! The fakes run over plain HTTP (`--insecure`); Docker Hub's host names are reached through a
//! loopback `CONNECT` proxy standing in for DNS ([`HostProxy`]).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use infer_build::registry::{self, ClientOptions, Keychain, Notify, PullOptions, Registries};
use serde_json::{json, Value};

use super::host_proxy::HostProxy;
use super::hostile_registry::{Hostile, Reply, Seen};
use super::registry_support::tar_gz_with_diff_id;
use super::support::{infer_build, sha256, stderr, stdout};

/// An image in Docker's media types: a manifest list (amd64 and arm64) over two manifests.
pub(crate) struct DockerImage {
    pub list: Vec<u8>,
    pub amd64: Vec<u8>,
    pub blobs: Vec<(String, Vec<u8>)>,
}

pub(crate) fn docker_image() -> DockerImage {
    let (layer, diff_id) = tar_gz_with_diff_id(&[("etc/hub", b"from the hub\n")]);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "config": {"Entrypoint": ["/bin/sh"]},
    }))
    .unwrap();
    let manifest = |config: &[u8]| {
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "size": config.len(), "digest": sha256(config)},
            "layers": [{"mediaType": "application/vnd.docker.image.rootfs.diff.tar.gzip",
                        "size": layer.len(), "digest": sha256(&layer)}],
        }))
        .unwrap()
    };
    let amd64 = manifest(&config);
    let arm_config = String::from_utf8(config.clone())
        .unwrap()
        .replace("amd64", "arm64")
        .into_bytes();
    let arm64 = manifest(&arm_config);
    let entry = |m: &[u8], arch: &str| {
        json!({"mediaType": "application/vnd.docker.distribution.manifest.v2+json",
               "size": m.len(), "digest": sha256(m),
               "platform": {"architecture": arch, "os": "linux"}})
    };
    let list = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.list.v2+json",
        "manifests": [entry(&arm64, "arm64"), entry(&amd64, "amd64")],
    }))
    .unwrap();
    DockerImage {
        blobs: vec![
            (sha256(&config), config),
            (sha256(&layer), layer),
            (sha256(&arm64), arm64),
        ],
        list,
        amd64,
    }
}

/// A manifest answer in Docker's shape (HEAD: the headers alone).
fn manifest_reply(r: &Seen, bytes: &[u8], media_type: &str, extra: &[(&str, &str)]) -> Reply {
    let digest = sha256(bytes);
    let mut headers = vec![
        ("content-type", media_type),
        ("docker-content-digest", digest.as_str()),
    ];
    headers.extend_from_slice(extra);
    let body: &[u8] = if r.method == "HEAD" { b"" } else { bytes };
    Reply::with(200, &headers, body)
}

/// A scratch home: no credentials, an empty registries.conf, no proxy unless asked.
fn cli(tmp: &Path, args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    let conf = tmp.join("registries.conf");
    if !conf.exists() {
        std::fs::write(&conf, "").unwrap();
    }
    let mut c = infer_build();
    c.args(args)
        .env("HOME", tmp)
        .env("DOCKER_CONFIG", tmp.join("docker"))
        .env("CONTAINERS_REGISTRIES_CONF", &conf)
        .env("INFER_BUILD_CACHE_DIR", tmp.join("cache"))
        .env("XDG_CONFIG_HOME", tmp.join("xdg-config"));
    for k in [
        "XDG_RUNTIME_DIR",
        "INFER_BUILD_REGISTRY",
        "INFER_BUILD_REGISTRY_USER",
        "INFER_BUILD_REGISTRY_PASSWORD",
        "INFER_BUILD_REGISTRY_REALMS",
        "REGISTRY_AUTH_FILE",
        "HTTPS_PROXY",
        "HTTP_PROXY",
        "ALL_PROXY",
        "https_proxy",
        "http_proxy",
        "all_proxy",
    ] {
        c.env_remove(k);
    }
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// A loopback Docker Hub: its registry, token service and CDN over TLS with certificates for
/// their real names, reached through a `CONNECT` proxy; credentials for `hubuser` under
/// Docker's `https://index.docker.io/v1/` key in `HOME/docker/config.json`. Every repository
/// serves [`docker_image`]: a tag names its manifest list.
pub(crate) struct DockerHub {
    pub registry: Hostile,
    pub auth: Hostile,
    pub cdn: Hostile,
    pub proxy: HostProxy,
    pub image: Arc<DockerImage>,
    /// The directory holding the test CA (`ca.pem`).
    pub pki: std::path::PathBuf,
}

impl DockerHub {
    pub(crate) fn start(home: &Path) -> DockerHub {
        let pki = home.join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        super::registry_support::test_ca_for(
            &pki,
            "DNS:registry-1.docker.io,DNS:auth.docker.io,DNS:production.cloudflare.docker.com",
        );
        let (cert, key) = (pki.join("cert.pem"), pki.join("key.pem"));
        std::fs::create_dir_all(home.join("docker")).unwrap();
        let hub_basic = base64::engine::general_purpose::STANDARD.encode("hubuser:hubpass");
        std::fs::write(
            home.join("docker/config.json"),
            format!(r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{hub_basic}"}}}}}}"#),
        )
        .unwrap();
        let want_basic = format!("Basic {hub_basic}");
        let img = Arc::new(docker_image());
        let cdn_blobs: Arc<Vec<(String, Vec<u8>)>> = Arc::new(img.blobs.clone());
        let cdn = Hostile::start_tls(&cert, &key, move |r| {
            let hex = r.path().rsplit('/').nth(1).unwrap_or("");
            match cdn_blobs
                .iter()
                .find(|(d, _)| d.ends_with(hex) && !hex.is_empty())
            {
                Some((_, bytes)) => {
                    Reply::with(200, &[("content-type", "application/octet-stream")], bytes)
                }
                None => Reply::status(404),
            }
        });
        let auth = Hostile::start_tls(&cert, &key, move |r| {
            let q = r.target.split_once('?').map_or("", |(_, q)| q);
            if r.path() == "/token"
                && q.contains("service=registry.docker.io")
                && r.header("authorization") == Some(want_basic.as_str())
            {
                return Reply::with(
                200,
                &[("content-type", "application/json")],
                br#"{"token":"hubtoken","access_token":"hubtoken","expires_in":300,"issued_at":"2026-12-05T00:00:00Z"}"#,
            );
            }
            Reply::status(400)
        });
        let hub_img = img.clone();
        let hub = Hostile::start_tls(&cert, &key, move |r| {
            if r.header("authorization") != Some("Bearer hubtoken") {
                return Reply::with(
                401,
                &[
                    ("content-type", "application/json"),
                    (
                        "www-authenticate",
                        r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io""#,
                    ),
                ],
                br#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":null}]}"#,
            );
            }
            let p = r.path();
            let limits = [
                ("ratelimit-limit", "100;w=21600"),
                ("ratelimit-remaining", "99;w=21600"),
                ("docker-ratelimit-source", "127.0.0.1"),
            ];
            if p == "/v2/" {
                return Reply::with(
                    200,
                    &[("docker-distribution-api-version", "registry/2.0")],
                    b"{}",
                );
            }
            // Any repository serves the image: a tag names the manifest list.
            let (repo_path, what) = p.rsplit_once('/').unwrap_or(("", ""));
            if repo_path.ends_with("/manifests") && !what.starts_with("sha256:") {
                return manifest_reply(
                    r,
                    &hub_img.list,
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                    &limits,
                );
            }
            if repo_path.ends_with("/manifests") && what == sha256(&hub_img.list) {
                return manifest_reply(
                    r,
                    &hub_img.list,
                    "application/vnd.docker.distribution.manifest.list.v2+json",
                    &limits,
                );
            }
            if repo_path.ends_with("/manifests") && what == sha256(&hub_img.amd64) {
                return manifest_reply(
                    r,
                    &hub_img.amd64,
                    "application/vnd.docker.distribution.manifest.v2+json",
                    &limits,
                );
            }
            if repo_path.ends_with("/blobs") {
                let hex = what.trim_start_matches("sha256:");
                let location = format!(
                "https://production.cloudflare.docker.com/registry-v2/docker/registry/v2/blobs/sha256/{}/{hex}/data?verify=1&expires=2",
                &hex[..2.min(hex.len())]
            );
                return Reply::with(307, &[("location", &location)], b"");
            }
            Reply::status(404)
        });
        let proxy = HostProxy::start(&[
            ("registry-1.docker.io:443", &hub.addr),
            ("auth.docker.io:443", &auth.addr),
            ("production.cloudflare.docker.com:443", &cdn.addr),
        ]);
        DockerHub {
            registry: hub,
            auth,
            cdn,
            proxy,
            image: img,
            pki,
        }
    }
}

/// Docker Hub: `docker.io/…` (and a bare `busybox`) are asked of `registry-1.docker.io`, the
/// token comes from `auth.docker.io` for `service=registry.docker.io`, the manifest list is
/// resolved to linux/amd64 with one HEAD and GETs by digest only, and blobs come from the CDN
/// host, which gets no `Authorization`. The written name stays `docker.io/library/busybox`.
/// Over TLS with certificates for those names, so the one built-in exception to "credentials
/// go only to the registry's own host" is exercised as it runs: Docker Hub's credentials (the
/// `https://index.docker.io/v1/` key of Docker's `config.json`) go to `https://auth.docker.io`.
#[test]
fn docker_hub_shaped_pull_asks_registry_1_and_sends_no_token_to_the_cdn() {
    let test = "docker_hub_shaped_pull_asks_registry_1_and_sends_no_token_to_the_cdn";
    if !super::registry_support::have_openssl_for(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let hub = DockerHub::start(tmp.path());
    let (img, proxy, pki) = (&hub.image, &hub.proxy, &hub.pki);
    let (hub, auth, cdn) = (&hub.registry, &hub.auth, &hub.cdn);
    let out = tmp.path().join("layout");
    let env = proxy.env();
    for name in ["docker.io/library/busybox", "busybox"] {
        let o = cli(
            tmp.path(),
            &[
                "pull",
                name,
                "--out",
                out.to_str().unwrap(),
                "--ca-cert",
                pki.join("ca.pem").to_str().unwrap(),
                "--json",
            ],
            &env,
        );
        assert!(o.status.success(), "{name}: {}", stderr(&o));
        let report: Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert_eq!(report["digest"], sha256(&img.amd64), "{name}");
        assert_eq!(report["index_digest"], sha256(&img.list), "{name}");
        assert_eq!(
            report["served_by"]["place"],
            "registry-1.docker.io/library/busybox"
        );
        assert_eq!(report["served_by"]["mirror"], false);
    }
    let asked = proxy.asked();
    assert!(
        asked.contains(&"registry-1.docker.io:443".to_string()),
        "{asked:?}"
    );
    assert!(
        !asked
            .iter()
            .any(|h| h.starts_with("docker.io:") || h.starts_with("index.docker.io:")),
        "asked Docker Hub's names instead of its API host: {asked:?}"
    );
    // Blobs came from the CDN, without the registry's token.
    let fetched = cdn.requests();
    assert_eq!(fetched.len(), 2, "config and layer, once each: {fetched:?}");
    assert!(
        fetched.iter().all(|r| r.header("authorization").is_none()),
        "the CDN got an Authorization header: {fetched:?}"
    );
    // The tag was resolved with HEADs; manifests were only ever GET by digest, and the second
    // pull of the same tag (already in the layout) made no GET of a manifest at all.
    let seen = hub.requests();
    let manifest_gets: Vec<&Seen> = seen
        .iter()
        .filter(|r| r.method == "GET" && r.path().contains("/manifests/"))
        .collect();
    assert!(
        manifest_gets
            .iter()
            .all(|r| r.path().contains("/manifests/sha256:")),
        "{manifest_gets:?}"
    );
    assert_eq!(
        manifest_gets.len(),
        2,
        "list and amd64 manifest, first pull only: {manifest_gets:?}"
    );
    assert!(seen
        .iter()
        .any(|r| r.method == "HEAD" && r.path().ends_with("/manifests/latest")));
    // The token service was asked for the pull scope of the normalized name.
    let tokens = auth.requests();
    assert!(tokens
        .iter()
        .all(|r| r.target.contains("service=registry.docker.io")));
    assert!(
        tokens.iter().any(|r| r
            .target
            .contains("scope=repository%3Alibrary%2Fbusybox%3Apull")
            || r.target.contains("scope=repository:library/busybox:pull")),
        "{tokens:?}"
    );
}

fn client_opts(creds: Option<(&str, &str, &Path)>) -> ClientOptions {
    let file = match creds {
        Some((registry, user_pass, dir)) => {
            let f = dir.join("creds.json");
            let auth = base64::engine::general_purpose::STANDARD.encode(user_pass);
            std::fs::write(
                &f,
                format!(r#"{{"auths":{{"{registry}":{{"auth":"{auth}"}}}}}}"#),
            )
            .unwrap();
            Some(f)
        }
        None => None,
    };
    ClientOptions {
        insecure: true,
        keychain: Keychain {
            docker_config: file
                .or_else(|| Some(std::path::PathBuf::from("/nonexistent/creds.json"))),
            ignore_env: true,
        },
        max_attempts: 4,
        backoff_base: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        connect_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(2),
        request_timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    }
}

fn pull_opts(client: ClientOptions) -> PullOptions {
    PullOptions {
        client,
        registries: Some(Arc::new(Registries::default())),
        ..PullOptions::default()
    }
}

/// A blob: its digest and bytes.
type Blob = (String, Vec<u8>);

/// A small OCI image: its manifest, the manifest's digest, and its blobs (config, layer).
fn oci_image() -> (Vec<u8>, String, [Blob; 2]) {
    let (layer, diff_id) = tar_gz_with_diff_id(&[("etc/x", b"x\n")]);
    let config = serde_json::to_vec(&json!({"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[diff_id]}})).unwrap();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": config.len(), "digest": sha256(&config)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": layer.len(), "digest": sha256(&layer)}],
    }))
    .unwrap();
    let digest = sha256(&manifest);
    (
        manifest,
        digest,
        [(sha256(&config), config), (sha256(&layer), layer)],
    )
}

/// An OCI image served at `repo:tag` by a handler that checks `authorized` first.
fn oci_registry(
    repo: &'static str,
    authorized: impl Fn(&Seen) -> Option<Reply> + Send + Sync + 'static,
) -> (Hostile, String) {
    let (manifest, digest, blobs) = oci_image();
    let reg = Hostile::start(move |r| {
        if let Some(refused) = authorized(r) {
            return refused;
        }
        let p = r.path();
        if p == "/v2/" {
            return Reply::status(200);
        }
        if p.starts_with(&format!("/v2/{repo}/manifests/")) {
            return manifest_reply(
                r,
                &manifest,
                "application/vnd.oci.image.manifest.v1+json",
                &[],
            );
        }
        if let Some(d) = p.strip_prefix(&format!("/v2/{repo}/blobs/")) {
            if let Some((_, b)) = blobs.iter().find(|(x, _)| x == d) {
                return Reply::with(200, &[], b);
            }
        }
        Reply::status(404)
    });
    (reg, digest)
}

/// A 401 whose bearer realm is `path` on the host the request was sent to, then `params`.
fn challenge_on_own_host(r: &Seen, path: &str, params: &str) -> Reply {
    let host = r.header("host").unwrap_or("");
    Reply::with(
        401,
        &[(
            "www-authenticate",
            &format!(r#"Bearer realm="http://{host}{path}"{params}"#),
        )],
        b"",
    )
}

/// NGC: the `$oauthtoken` user with an API key goes to the realm on the registry's own host.
#[test]
fn ngc_shaped_registry_takes_the_oauthtoken_user_at_its_own_realm() {
    let tmp = tempfile::tempdir().unwrap();
    let key = "$oauthtoken:nvapi-test-key";
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let (reg, digest) = oci_registry("nvidia/cuda", move |r| {
        if r.path() == "/proxy_auth" {
            return Some(if r.header("authorization") == Some(basic.as_str()) {
                Reply::with(200, &[], br#"{"token":"ngc-token","expires_in":300}"#)
            } else {
                Reply::status(401)
            });
        }
        if r.header("authorization") == Some("Bearer ngc-token") {
            return None;
        }
        Some(challenge_on_own_host(
            r,
            "/proxy_auth",
            r#",scope="repository:nvidia/cuda:pull""#,
        ))
    });
    let opts = pull_opts(client_opts(Some((&reg.addr, key, tmp.path()))));
    let p = registry::pull_with(
        &format!("{}/nvidia/cuda:12.8.1-base-ubuntu24.04", reg.addr),
        &tmp.path().join("layout"),
        &opts,
    )
    .unwrap();
    assert_eq!(p.digest.as_str(), digest);
    let token_asks: Vec<Seen> = reg
        .requests()
        .into_iter()
        .filter(|r| r.path() == "/proxy_auth")
        .collect();
    assert!(!token_asks.is_empty());
}

/// GHCR: a public image pulls with an anonymous token (no credentials anywhere).
#[test]
fn ghcr_shaped_registry_pulls_public_images_with_anonymous_tokens() {
    let tmp = tempfile::tempdir().unwrap();
    let (reg, digest) = oci_registry("org/img", |r| {
        if r.path() == "/token" {
            let q = r.target.split_once('?').map_or("", |(_, q)| q);
            return Some(
                if r.header("authorization").is_none() && q.contains("service=ghcr.io") {
                    Reply::with(200, &[], br#"{"token":"anon"}"#)
                } else {
                    Reply::status(403)
                },
            );
        }
        if r.header("authorization") == Some("Bearer anon") {
            return None;
        }
        Some(challenge_on_own_host(
            r,
            "/token",
            r#",service="ghcr.io",scope="repository:org/img:pull""#,
        ))
    });
    let p = registry::pull_with(
        &format!("{}/org/img:v1", reg.addr),
        &tmp.path().join("layout"),
        &pull_opts(client_opts(None)),
    )
    .unwrap();
    assert_eq!(p.digest.as_str(), digest);
}

/// A 429 with a short `Retry-After` is waited out and said; one asking for longer than the
/// client waits fails at once, naming the limit headers the registry sent.
#[test]
fn rate_limits_are_waited_out_when_short_and_named_when_long() {
    let tmp = tempfile::tempdir().unwrap();
    let budget = Arc::new(Mutex::new(2u32));
    let left = budget.clone();
    let (reg, digest) = oci_registry("lib/img", move |r| {
        let mut n = left.lock().unwrap();
        // As Docker Hub: GETs of manifests count against the limit, HEADs do not.
        if r.method == "GET" && r.path().contains("/manifests/") && *n > 0 {
            *n -= 1;
            return Some(Reply::with(
                429,
                &[
                    ("retry-after", "1"),
                    ("ratelimit-limit", "100;w=21600"),
                    ("ratelimit-remaining", "0;w=21600"),
                    ("content-type", "application/json"),
                ],
                br#"{"errors":[{"code":"TOOMANYREQUESTS","message":"You have reached your pull rate limit."}]}"#,
            ));
        }
        None
    });
    let said = Arc::new(Mutex::new(Vec::<String>::new()));
    let log = said.clone();
    let mut client = client_opts(None);
    client.notify = Notify(Some(Arc::new(move |t: &str| {
        log.lock().unwrap().push(t.to_string())
    })));
    let p = registry::pull_with(
        &format!("{}/lib/img:v1", reg.addr),
        &tmp.path().join("a"),
        &pull_opts(client.clone()),
    )
    .unwrap();
    assert_eq!(p.digest.as_str(), digest);
    let said = said.lock().unwrap().clone();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said.iter().all(|s| s.contains("rate limiting")
            && s.contains("waiting 1 s (Retry-After)")
            && s.contains("RateLimit-Remaining: 0;w=21600")),
        "{said:?}"
    );

    let (reg, _) = oci_registry("lib/img", |r| {
        (r.method == "GET" && r.path().contains("/manifests/")).then(|| {
            Reply::with(
                429,
                &[("retry-after", "21600"), ("ratelimit-limit", "100;w=21600"), ("ratelimit-remaining", "0;w=21600")],
                br#"{"errors":[{"code":"TOOMANYREQUESTS","message":"You have reached your pull rate limit."}]}"#,
            )
        })
    });
    let start = Instant::now();
    let e = registry::pull_with(
        &format!("{}/lib/img:v1", reg.addr),
        &tmp.path().join("b"),
        &pull_opts(client),
    )
    .unwrap_err();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "waited {:?}",
        start.elapsed()
    );
    let msg = e.to_string();
    for want in [
        "429",
        "TOOMANYREQUESTS",
        "RateLimit-Limit: 100;w=21600",
        "Retry-After: 21600",
    ] {
        assert!(msg.contains(want), "{want}: {msg}");
    }
    let manifest_gets = reg
        .requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path().contains("/manifests/"))
        .count();
    assert_eq!(manifest_gets, 1, "no retry of a long limit");
}

/// A token service on another host gets none of the registry's credentials: the 401 then
/// names that host, the `login` to run and the opt-in, which sends them over https only.
#[test]
fn a_token_service_elsewhere_is_explained_and_trusted_only_on_request() {
    let tmp = tempfile::tempdir().unwrap();
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("ci:pw")
    );
    let want = basic.clone();
    let token = Hostile::start(move |r| {
        if r.header("authorization") == Some(want.as_str()) {
            Reply::with(200, &[], br#"{"token":"gl"}"#)
        } else {
            Reply::status(401)
        }
    });
    let realm = format!("http://{}/jwt/auth", token.addr);
    let (reg, _) = oci_registry("group/img", move |r| {
        (r.header("authorization") != Some("Bearer gl")).then(|| {
            Reply::with(
                401,
                &[(
                    "www-authenticate",
                    &format!(r#"Bearer realm="{realm}",service="container_registry""#),
                )],
                b"",
            )
        })
    });
    let mut client = client_opts(Some((&reg.addr, "ci:pw", tmp.path())));
    let e = registry::pull_with(
        &format!("{}/group/img:v1", reg.addr),
        &tmp.path().join("a"),
        &pull_opts(client.clone()),
    )
    .unwrap_err();
    let msg = e.to_string();
    assert!(e.is_bad_input(), "{msg}");
    for want in [
        format!("on another host, {}", token.addr),
        format!("infer-build login {}", token.addr),
        format!("INFER_BUILD_REGISTRY_REALMS={}={}", reg.addr, token.addr),
    ] {
        assert!(msg.contains(&want), "{want}: {msg}");
    }
    assert!(token
        .requests()
        .iter()
        .all(|r| r.header("authorization").is_none()));
    // The opt-in never sends credentials to a plain-HTTP realm.
    client.trusted_realms = vec![(reg.addr.clone(), token.addr.clone())];
    assert!(registry::pull_with(
        &format!("{}/group/img:v1", reg.addr),
        &tmp.path().join("b"),
        &pull_opts(client),
    )
    .is_err());
    assert!(
        token
            .requests()
            .iter()
            .all(|r| r.header("authorization").is_none()),
        "credentials went to a plain-HTTP realm"
    );
    assert!(basic.starts_with("Basic "));
}

/// A mirror that serves other bytes for a pinned digest is passed over (and said why); the
/// primary serves the image, verified by digest.
#[test]
fn a_mirror_serving_other_bytes_for_a_digest_is_passed_over() {
    let tmp = tempfile::tempdir().unwrap();
    let (primary, digest) = oci_registry("team/base", |_| None);
    let (liar, _) = oci_registry("team/base", |r| {
        r.path().contains("/manifests/").then(|| {
            let fake = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","size":2,"digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},"layers":[]}"#;
            manifest_reply(r, fake, "application/vnd.oci.image.manifest.v1+json", &[])
        })
    });
    let conf = format!(
        "[[registry]]\nprefix = \"registry.example\"\nlocation = \"{}\"\ninsecure = true\n[[registry.mirror]]\nlocation = \"{}\"\ninsecure = true\n",
        primary.addr, liar.addr
    );
    let regs = Registries::parse(Path::new("registries.conf"), &conf).unwrap();
    let opts = PullOptions {
        registries: Some(Arc::new(regs)),
        ..pull_opts(client_opts(None))
    };
    let p = registry::pull_with(
        &format!("registry.example/team/base@{digest}"),
        &tmp.path().join("layout"),
        &opts,
    )
    .unwrap();
    assert_eq!(p.digest.as_str(), digest);
    let s = p.served_by.unwrap();
    assert_eq!(s.place, format!("{}/team/base", primary.addr));
    assert!(!s.mirror);
    assert_eq!(s.mirrors_failed.len(), 1);
    assert!(
        s.mirrors_failed[0].contains("expected digest"),
        "{:?}",
        s.mirrors_failed
    );
}

/// The opt-in over TLS: with `REGISTRY=REALM_HOST` trusted, the registry's credentials go to
/// its https token service on the other host, and the pull succeeds.
#[test]
fn a_trusted_https_token_service_elsewhere_gets_the_credentials() {
    let test = "a_trusted_https_token_service_elsewhere_gets_the_credentials";
    if !super::registry_support::have_openssl_for(test) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    super::registry_support::test_ca(tmp.path());
    let (cert, key) = (tmp.path().join("cert.pem"), tmp.path().join("key.pem"));
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("ci:pw")
    );
    let token = Hostile::start_tls(&cert, &key, move |r| {
        if r.header("authorization") == Some(basic.as_str()) {
            Reply::with(200, &[], br#"{"token":"gl"}"#)
        } else {
            Reply::status(401)
        }
    });
    let realm = format!("https://{}/jwt/auth", token.addr);
    let (manifest, digest, blobs) = oci_image();
    let reg = Hostile::start_tls(&cert, &key, move |r| {
        if r.header("authorization") != Some("Bearer gl") {
            return Reply::with(
                401,
                &[(
                    "www-authenticate",
                    &format!(r#"Bearer realm="{realm}",service="container_registry""#),
                )],
                b"",
            );
        }
        let p = r.path();
        if p == "/v2/" {
            return Reply::status(200);
        }
        if p.starts_with("/v2/group/img/manifests/") {
            return manifest_reply(
                r,
                &manifest,
                "application/vnd.oci.image.manifest.v1+json",
                &[],
            );
        }
        match p
            .strip_prefix("/v2/group/img/blobs/")
            .and_then(|d| blobs.iter().find(|(x, _)| x == d))
        {
            Some((_, b)) => Reply::with(200, &[], b),
            None => Reply::status(404),
        }
    });
    let mut client = client_opts(Some((&reg.addr, "ci:pw", tmp.path())));
    client.insecure = false;
    client.ca_cert = Some(tmp.path().join("ca.pem"));
    let reference = format!("{}/group/img:v1", reg.addr);
    // Not trusted: refused, and the token service saw no credentials.
    assert!(registry::pull_with(
        &reference,
        &tmp.path().join("a"),
        &pull_opts(client.clone())
    )
    .is_err());
    assert!(token
        .requests()
        .iter()
        .all(|r| r.header("authorization").is_none()));
    // Trusted: the credentials go there, over TLS.
    client.trusted_realms = vec![(reg.addr.clone(), token.addr.clone())];
    let p = registry::pull_with(&reference, &tmp.path().join("b"), &pull_opts(client)).unwrap();
    assert_eq!(p.digest.as_str(), digest);
    assert!(token
        .requests()
        .iter()
        .any(|r| r.header("authorization").is_some()));
}

/// A real `docker-registry` answering as `registry-1.docker.io` (TLS for that name, basic
/// auth): `push --to docker.io/bench/app` and `pull docker.io/bench/app:TAG` go to Docker Hub's
/// API host, never to `docker.io`, with the credentials stored under Docker's
/// `https://index.docker.io/v1/` key, and what was pushed comes back bit for bit.
#[test]
fn docker_hub_names_push_and_pull_through_registry_1() {
    let test = "docker_hub_names_push_and_pull_through_registry_1";
    let Some(reg) =
        super::registry_support::Registry::start_tls_for(test, "DNS:registry-1.docker.io")
    else {
        return;
    };
    let tls = reg.tls.as_ref().unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let auth =
        base64::engine::general_purpose::STANDARD.encode(format!("{}:{}", tls.user, tls.password));
    std::fs::create_dir_all(tmp.path().join("docker")).unwrap();
    std::fs::write(
        tmp.path().join("docker/config.json"),
        format!(r#"{{"auths":{{"https://index.docker.io/v1/":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
    let made = super::registry_support::make_layout(
        &tmp.path().join("layout"),
        "1.0.0",
        &[super::registry_support::Target {
            id: "cpu-fp32",
            sm: None,
            model_bytes: 4_000,
        }],
        7,
    );
    let proxy = HostProxy::start(&[("registry-1.docker.io:443", &reg.addr)]);
    let env = proxy.env();
    let ca = tls.ca.to_str().unwrap();
    let o = cli(
        tmp.path(),
        &[
            "push",
            made.dir.to_str().unwrap(),
            "--to",
            "docker.io/bench/app",
            "--ca-cert",
            ca,
            "--no-warmup",
            "--json",
        ],
        &env,
    );
    assert!(o.status.success(), "push: {}", stderr(&o));
    let (tag, digest) = made.targets[0].clone();
    let o = cli(
        tmp.path(),
        &[
            "pull",
            &format!("docker.io/bench/app:{tag}"),
            "--out",
            tmp.path().join("pulled").to_str().unwrap(),
            "--ca-cert",
            ca,
            "--json",
        ],
        &env,
    );
    assert!(o.status.success(), "pull: {}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["digest"], digest.as_str());
    assert_eq!(
        v["reference"],
        format!("docker.io/bench/app:{tag}").as_str()
    );
    assert_eq!(v["served_by"]["place"], "registry-1.docker.io/bench/app");
    let asked = proxy.asked();
    assert!(!asked.is_empty());
    assert!(
        asked.iter().all(|h| h == "registry-1.docker.io:443"),
        "{asked:?}"
    );
}
