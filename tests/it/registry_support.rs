//! A real registry for tests: Debian's `docker-registry` with its own temporary config and
//! data directory on an ephemeral 127.0.0.1 port (plain, or TLS with htpasswd basic auth),
//! stopped on drop. Also builds small multi-target OCI layouts like `infer-build build` writes.

#![allow(
    dead_code,
    reason = "shared by test modules; not every test binary uses every helper"
)]

use std::io::Write as _;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::support::{free_port, sha256};

pub(crate) struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`
    pub addr: String,
    pub dir: tempfile::TempDir,
    pub tls: Option<Tls>,
}

pub(crate) struct Tls {
    /// The CA certificate that signed the registry's certificate.
    pub ca: PathBuf,
    /// A directory holding `ca.crt`, for skopeo's `--cert-dir`.
    pub cert_dir: PathBuf,
    pub user: String,
    pub password: String,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// A plain-HTTP registry, or `None` (with a printed reason) when `docker-registry` is absent.
    pub(crate) fn start(test: &str) -> Option<Registry> {
        if !have_registry(test) {
            return None;
        }
        Some(Self::spawn(None))
    }

    /// TLS (a test CA, leaf with SAN IP:127.0.0.1) with htpasswd basic auth.
    pub(crate) fn start_tls(test: &str) -> Option<Registry> {
        Self::start_tls_for(test, "IP:127.0.0.1")
    }

    /// [`Registry::start_tls`] with a certificate for `subject_alt_names` (e.g.
    /// `DNS:registry-1.docker.io`, reached through a `HostProxy`).
    pub(crate) fn start_tls_for(test: &str, subject_alt_names: &str) -> Option<Registry> {
        if !have_registry(test) || !have_openssl(test) || !have_htpasswd(test) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        test_ca_for(p, subject_alt_names);
        let out = Command::new("htpasswd")
            .args(["-Bbn", "bench", "s3cret-pw"])
            .output()
            .unwrap();
        assert!(out.status.success());
        std::fs::write(p.join("htpasswd"), &out.stdout).unwrap();
        let cert_dir = p.join("certs");
        std::fs::create_dir_all(&cert_dir).unwrap();
        std::fs::copy(p.join("ca.pem"), cert_dir.join("ca.crt")).unwrap();
        let tls = Tls {
            ca: p.join("ca.pem"),
            cert_dir,
            user: "bench".into(),
            password: "s3cret-pw".into(),
        };
        Some(Self::spawn_in(dir, Some(tls), ""))
    }

    fn spawn(tls: Option<Tls>) -> Registry {
        Self::spawn_in(tempfile::tempdir().unwrap(), tls, "")
    }

    /// A plain-HTTP registry that wants bearer tokens from `tokens` (the distribution token
    /// auth: JWTs signed by a key whose certificate is in the registry's root bundle).
    pub(crate) fn start_token_auth(test: &str) -> Option<(Registry, TokenServer)> {
        if !have_registry(test) || !have_openssl(test) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let ok = Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=test token issuer",
            ])
            .args(["-keyout", "token-key.pem", "-out", "token-root.pem"])
            .current_dir(p)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "openssl req failed");
        let tokens = TokenServer::start(p, "test-issuer", "test-registry");
        let auth = format!(
            "auth:\n  token:\n    realm: http://{}/token\n    service: test-registry\n    issuer: test-issuer\n    rootcertbundle: {}\n",
            tokens.addr,
            p.join("token-root.pem").display()
        );
        Some((Self::spawn_in(dir, None, &auth), tokens))
    }

    fn spawn_in(dir: tempfile::TempDir, tls: Option<Tls>, extra: &str) -> Registry {
        let port = free_port();
        let addr = format!("127.0.0.1:{port}");
        let p = dir.path();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  cache:\n    blobdescriptor: inmemory\nhttp:\n  addr: {addr}\n  secret: test-secret\n  headers:\n    X-Content-Type-Options: [nosniff]\n",
            p.join("data").display()
        );
        if tls.is_some() {
            config.push_str(&format!(
                "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: test-realm\n    path: {}\n",
                p.join("cert.pem").display(),
                p.join("key.pem").display(),
                p.join("htpasswd").display()
            ));
        }
        config.push_str(extra);
        std::fs::write(p.join("config.yml"), config).unwrap();
        let log = std::fs::File::create(p.join("registry.log")).unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(p.join("config.yml"))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let start = Instant::now();
        while TcpStream::connect(&addr).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "docker-registry did not start on {addr}"
            );
            std::thread::sleep(Duration::from_millis(25));
        }
        Registry {
            child,
            addr,
            dir,
            tls,
        }
    }

    /// The registry's copy of a blob, straight from its storage directory.
    pub(crate) fn stored_blob(&self, digest: &str) -> Option<Vec<u8>> {
        let hex = digest.strip_prefix("sha256:")?;
        std::fs::read(
            self.dir
                .path()
                .join("data/docker/registry/v2/blobs/sha256")
                .join(&hex[..2])
                .join(hex)
                .join("data"),
        )
        .ok()
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

/// A test CA (`ca.pem`, `ca.key`) and a leaf certificate for 127.0.0.1 signed by it
/// (`cert.pem`, `key.pem`) in `p`, made with `openssl`. Webpki, like browsers, refuses a
/// self-signed CA certificate used as the server's own certificate, hence the two.
pub(crate) fn test_ca(p: &Path) {
    test_ca_for(p, "IP:127.0.0.1")
}

/// [`test_ca`] with a leaf certificate for `subject_alt_names` (openssl's syntax:
/// `DNS:registry-1.docker.io,DNS:auth.docker.io`), for servers reached by host name.
pub(crate) fn test_ca_for(p: &Path, subject_alt_names: &str) {
    let openssl = |args: &[&str]| {
        let ok = Command::new("openssl")
            .args(args)
            .current_dir(p)
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success();
        assert!(ok, "openssl {args:?} failed");
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=infer-build test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "key.pem",
        "-out",
        "leaf.csr",
    ]);
    std::fs::write(
        p.join("leaf.ext"),
        format!("subjectAltName={subject_alt_names}\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n"),
    )
    .unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
        "-out",
        "cert.pem",
    ]);
}

/// True when `openssl` runs (for tests that need only certificates); prints why not.
pub(crate) fn have_openssl_for(test: &str) -> bool {
    have_openssl(test)
}

fn have_registry(test: &str) -> bool {
    let ok = Command::new("docker-registry")
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping {test}: `docker-registry` is not installed (.ci/run installs it)");
    }
    ok
}

fn have_openssl(test: &str) -> bool {
    // `openssl` has no `--version` flag; `openssl version` is its spelling.
    let ok = Command::new("openssl")
        .arg("version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipping {test}: `openssl` is not installed (.ci/run installs it)");
    }
    ok
}

fn have_htpasswd(test: &str) -> bool {
    let ok = Command::new("htpasswd").arg("-h").output().is_ok();
    if !ok {
        eprintln!("skipping {test}: `htpasswd` is not installed (apt-get install apache2-utils)");
    }
    ok
}

/// Deterministic incompressible bytes.
pub(crate) fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// A gzip'd tar holding `files` (path, bytes), with fixed headers.
pub(crate) fn tar_gz(files: &[(&str, &[u8])]) -> Vec<u8> {
    tar_gz_with_diff_id(files).0
}

/// [`tar_gz`] and the layer's diff_id (the digest of the uncompressed tar), which Docker checks
/// against the config when it pulls the image.
pub(crate) fn tar_gz_with_diff_id(files: &[(&str, &[u8])]) -> (Vec<u8>, String) {
    let mut plain = Vec::new();
    {
        let mut b = tar::Builder::new(&mut plain);
        for (path, data) in files {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_mtime(0);
            h.set_uid(0);
            h.set_gid(0);
            h.set_cksum();
            b.append_data(&mut h, path, *data).unwrap();
        }
        b.finish().unwrap();
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&plain).unwrap();
    (gz.finish().unwrap(), sha256(&plain))
}

/// A target of a test layout.
pub(crate) struct Target {
    pub id: &'static str,
    pub sm: Option<&'static str>,
    /// Size of the target's own (incompressible) model file.
    pub model_bytes: usize,
}

/// What `make_layout` wrote.
pub(crate) struct MadeLayout {
    pub dir: PathBuf,
    pub index_digest: String,
    /// (tag, manifest digest) per target.
    pub targets: Vec<(String, String)>,
    /// Every blob (config, layers) digest.
    pub blobs: Vec<String>,
}

fn put(dir: &Path, bytes: &[u8]) -> (String, u64) {
    let d = sha256(bytes);
    let path = dir.join("blobs/sha256").join(&d[7..]);
    std::fs::write(path, bytes).unwrap();
    (d, bytes.len() as u64)
}

fn canonical(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

/// An OCI layout like `infer-build build` writes: one image per target (a shared base layer
/// and a per-target layer with the model and `/etc/infer/runtime.toml`), an index over them
/// tagged `tag`, and each per-target manifest tagged `tag-<id>` in `index.json`.
pub(crate) fn make_layout(dir: &Path, tag: &str, targets: &[Target], seed: u64) -> MadeLayout {
    std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
    std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    let (base, base_diff) = tar_gz_with_diff_id(&[("bin/infer-serve", &noise(7, 300_000))]);
    let (base_d, base_n) = put(dir, &base);
    let mut blobs = vec![base_d.clone()];
    let mut entries = Vec::new();
    let mut tagged = Vec::new();
    for (i, t) in targets.iter().enumerate() {
        let runtime = format!(
            "[model]\nname = \"mlp\"\nversion = \"1\"\n\n[[inputs]]\nname = \"input\"\ndatatype = \"FP32\"\ndims = [-1, 64]\n\n[batching]\nmax_batch_size = 8\npreferred_batch_sizes = [4]\n\n# seed {seed}\n"
        );
        let model = noise(seed.wrapping_mul(31).wrapping_add(i as u64), t.model_bytes);
        let (layer, layer_diff) = tar_gz_with_diff_id(&[
            ("etc/infer/runtime.toml", runtime.as_bytes()),
            ("models/model.bin", &model),
        ]);
        let (layer_d, layer_n) = put(dir, &layer);
        let config = json!({
            "architecture": "amd64", "os": "linux",
            "config": {"Entrypoint": ["/bin/infer-serve"], "Labels": {"dev.infer-build.target": t.id}},
            "rootfs": {"type": "layers", "diff_ids": [base_diff, layer_diff]},
        });
        let (config_d, config_n) = put(dir, &canonical(&config));
        let mut ann = json!({"dev.infer-build.target": t.id, "dev.infer-build.precision": "fp16", "org.opencontainers.image.version": "1"});
        if let Some(sm) = t.sm {
            ann["dev.infer-build.sm"] = json!(sm);
            ann["dev.infer-build.startup.engine-load-ms"] = json!("420");
        }
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_d, "size": config_n},
            "layers": [
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": base_d, "size": base_n},
                {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_d, "size": layer_n},
            ],
            "annotations": ann,
        });
        let (m_d, m_n) = put(dir, &canonical(&manifest));
        blobs.push(layer_d);
        blobs.push(config_d);
        let target_tag = format!("{tag}-{}", t.id);
        entries.push(json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": m_d, "size": m_n,
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {"dev.infer-build.target": t.id, "org.opencontainers.image.ref.name": target_tag},
        }));
        tagged.push((target_tag, m_d));
    }
    let index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": entries});
    let (i_d, i_n) = put(dir, &canonical(&index));
    let mut top = entries.clone();
    top.push(json!({
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": i_d, "size": i_n,
        "annotations": {"org.opencontainers.image.ref.name": tag},
    }));
    let oci_index = json!({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": top});
    let mut f = std::fs::File::create(dir.join("index.json")).unwrap();
    f.write_all(&canonical(&oci_index)).unwrap();
    blobs.sort();
    blobs.dedup();
    MadeLayout {
        dir: dir.to_path_buf(),
        index_digest: i_d,
        targets: tagged,
        blobs,
    }
}

/// Token requests seen: (scopes asked, whether basic credentials came with them).
pub(crate) type TokenLog = std::sync::Arc<std::sync::Mutex<Vec<(Vec<String>, bool)>>>;

/// A token issuer for the distribution token auth: `GET /token?service=…&scope=…` answers a
/// JWT (RS256, signed with `openssl dgst`, certificate in `x5c`) granting what was asked.
pub(crate) struct TokenServer {
    pub addr: String,
    /// Every token request: (scopes asked, whether it carried basic credentials).
    pub requests: TokenLog,
}

impl TokenServer {
    fn start(dir: &Path, issuer: &str, service: &str) -> TokenServer {
        use std::io::{BufRead, BufReader};
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let der = Command::new("openssl")
            .args(["x509", "-in", "token-root.pem", "-outform", "DER"])
            .current_dir(dir)
            .output()
            .unwrap()
            .stdout;
        use base64::Engine as _;
        let x5c = base64::engine::general_purpose::STANDARD.encode(der);
        let requests = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (log, dir, issuer, service) = (
            requests.clone(),
            dir.to_path_buf(),
            issuer.to_string(),
            service.to_string(),
        );
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(mut conn) = conn else { continue };
                let mut reader = BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let mut basic = false;
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).is_err() || h == "\r\n" || h.is_empty() {
                        break;
                    }
                    if h.to_ascii_lowercase().starts_with("authorization: basic ") {
                        basic = true;
                    }
                }
                let target = line.split(' ').nth(1).unwrap_or("");
                let query = target.split_once('?').map(|x| x.1).unwrap_or("");
                let scopes: Vec<String> = query
                    .split('&')
                    .filter_map(|kv| kv.strip_prefix("scope="))
                    .map(|v| {
                        v.replace("%3A", ":")
                            .replace("%3a", ":")
                            .replace("%2C", ",")
                            .replace("%2c", ",")
                            .replace("%2F", "/")
                            .replace("%2f", "/")
                    })
                    .collect();
                log.lock().unwrap().push((scopes.clone(), basic));
                let access: Vec<Value> = scopes
                    .iter()
                    .filter_map(|s| {
                        let (kind, rest) = s.split_once(':')?;
                        let (name, actions) = rest.rsplit_once(':')?;
                        Some(json!({"type": kind, "name": name, "actions": actions.split(',').collect::<Vec<_>>()}))
                    })
                    .collect();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_secs();
                let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
                let header = json!({"alg": "RS256", "typ": "JWT", "x5c": [x5c]});
                let claims = json!({"iss": issuer, "sub": "bench", "aud": service, "exp": now + 600, "nbf": now - 60, "iat": now - 60, "jti": format!("{now}-{}", scopes.len()), "access": access});
                let signing_input = format!(
                    "{}.{}",
                    b64(&serde_json::to_vec(&header).unwrap()),
                    b64(&serde_json::to_vec(&claims).unwrap())
                );
                let mut sign = Command::new("openssl")
                    .args(["dgst", "-sha256", "-sign", "token-key.pem"])
                    .current_dir(&dir)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap();
                sign.stdin
                    .take()
                    .unwrap()
                    .write_all(signing_input.as_bytes())
                    .unwrap();
                let sig = sign.wait_with_output().unwrap().stdout;
                let token = format!("{signing_input}.{}", b64(&sig));
                let body =
                    json!({"token": token, "access_token": token, "expires_in": 600}).to_string();
                let _ = conn.write_all(
                    format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).as_bytes(),
                );
            }
        });
        TokenServer { addr, requests }
    }
}
