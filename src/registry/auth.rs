//! Credentials and authentication challenges.
//!
//! Credentials come from, in this order: `INFER_BUILD_REGISTRY_USER` and
//! `INFER_BUILD_REGISTRY_PASSWORD` (for every registry), then Docker's `config.json`
//! (`$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`): `credHelpers[registry]`, then
//! `auths[registry]` (`auth` base64 `user:password`, or `username`/`password`, or
//! `identitytoken`), then `credsStore`. Helpers are the `docker-credential-<name>` programs.
//!
//! Secrets never reach `Debug`, `Display` or an error message.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;

use super::{Error, Result};

/// Environment variables that give credentials for every registry.
pub const ENV_USER: &str = "INFER_BUILD_REGISTRY_USER";
pub const ENV_PASSWORD: &str = "INFER_BUILD_REGISTRY_PASSWORD";

/// Credentials for one registry.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// User name and password (or a personal access token).
    Basic { username: String, password: String },
    /// An OAuth2 refresh token (Docker's `identitytoken`), exchanged at the token endpoint.
    IdentityToken(String),
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credential::Basic { username, .. } => write!(f, "Basic({username}, <redacted>)"),
            Credential::IdentityToken(_) => write!(f, "IdentityToken(<redacted>)"),
        }
    }
}

impl Credential {
    /// The `Authorization: Basic …` value, when these are basic credentials.
    pub fn basic_header(&self) -> Option<String> {
        match self {
            Credential::Basic { username, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
            )),
            Credential::IdentityToken(_) => None,
        }
    }
}

/// Where credentials are looked up; tests and callers can point it elsewhere.
#[derive(Debug, Clone, Default)]
pub struct Keychain {
    /// The Docker config file; `None` = the default location.
    pub docker_config: Option<PathBuf>,
    /// Ignore `INFER_BUILD_REGISTRY_USER/PASSWORD`.
    pub ignore_env: bool,
}

impl Keychain {
    /// The credentials for `registry` (`host[:port]`), or `None` for anonymous access.
    pub fn lookup(&self, registry: &str) -> Result<Option<Credential>> {
        if !self.ignore_env {
            if let (Ok(u), Ok(p)) = (std::env::var(ENV_USER), std::env::var(ENV_PASSWORD)) {
                if !u.is_empty() {
                    return Ok(Some(Credential::Basic {
                        username: u,
                        password: p,
                    }));
                }
            }
        }
        let path = match &self.docker_config {
            Some(p) => p.clone(),
            None => match default_docker_config() {
                Some(p) => p,
                None => return Ok(None),
            },
        };
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io(path, e)),
        };
        let config = parse_docker_config(&text).map_err(|reason| Error::Credentials {
            registry: registry.to_string(),
            reason: format!("{}: {reason}", path.display()),
        })?;
        match config.source_for(registry) {
            Source::None => Ok(None),
            Source::Inline(c) => Ok(Some(c)),
            Source::Helper(helper) => run_helper(&helper, registry),
        }
    }
}

fn default_docker_config() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG") {
        return Some(Path::new(&dir).join("config.json"));
    }
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".docker/config.json"))
}

/// The parts of Docker's `config.json` that matter here.
#[derive(Debug, Default, serde::Deserialize)]
pub struct DockerConfig {
    #[serde(default)]
    auths: std::collections::BTreeMap<String, AuthEntry>,
    #[serde(default, rename = "credsStore")]
    creds_store: Option<String>,
    #[serde(default, rename = "credHelpers")]
    cred_helpers: std::collections::BTreeMap<String, String>,
}

#[derive(Default, serde::Deserialize)]
struct AuthEntry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    identitytoken: Option<String>,
}

impl std::fmt::Debug for AuthEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthEntry(<redacted>)")
    }
}

/// Where the credentials of one registry come from.
#[derive(Debug, PartialEq, Eq)]
pub enum Source {
    None,
    Inline(Credential),
    /// The suffix of a `docker-credential-<suffix>` program.
    Helper(String),
}

/// Parse `config.json`. The error names the problem, never a value.
pub fn parse_docker_config(text: &str) -> std::result::Result<DockerConfig, String> {
    serde_json::from_str(text).map_err(|e| {
        format!(
            "not a Docker config file: line {} column {}",
            e.line(),
            e.column()
        )
    })
}

/// The host (and port) of a `config.json` key: keys may be `host`, `https://host`,
/// `https://host/v1/` and the like.
fn key_host(key: &str) -> &str {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    k.split('/').next().unwrap_or(k)
}

fn same_registry(key: &str, registry: &str) -> bool {
    let host = key_host(key);
    host == registry
        || (registry == "registry-1.docker.io" && matches!(host, "index.docker.io" | "docker.io"))
}

impl DockerConfig {
    pub fn source_for(&self, registry: &str) -> Source {
        if let Some((_, helper)) = self
            .cred_helpers
            .iter()
            .find(|(k, _)| same_registry(k, registry))
        {
            return Source::Helper(helper.clone());
        }
        if let Some((_, entry)) = self.auths.iter().find(|(k, _)| same_registry(k, registry)) {
            if let Some(token) = entry.identitytoken.as_deref().filter(|t| !t.is_empty()) {
                return Source::Inline(Credential::IdentityToken(token.to_string()));
            }
            if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok());
                if let Some((u, p)) = decoded.as_deref().and_then(|d| d.split_once(':')) {
                    return Source::Inline(Credential::Basic {
                        username: u.to_string(),
                        password: p.to_string(),
                    });
                }
            }
            if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
                return Source::Inline(Credential::Basic {
                    username: u.clone(),
                    password: p.clone(),
                });
            }
        }
        match &self.creds_store {
            Some(store) if !store.is_empty() => Source::Helper(store.clone()),
            _ => Source::None,
        }
    }
}

/// Ask `docker-credential-<helper> get` for the credentials of `registry`.
fn run_helper(helper: &str, registry: &str) -> Result<Option<Credential>> {
    let program = format!("docker-credential-{helper}");
    let fail = |reason: String| Error::Credentials {
        registry: registry.to_string(),
        reason,
    };
    let mut child = Command::new(&program)
        .arg("get")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(format!("cannot run `{program}`: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        // Helpers are asked by server URL; most store the bare host.
        let _ = stdin.write_all(registry.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| fail(format!("`{program}` failed: {e}")))?;
    if !out.status.success() {
        let msg = String::from_utf8_lossy(&out.stdout).to_lowercase();
        if msg.contains("credentials not found") {
            return Ok(None);
        }
        // The helper's output may echo secrets: report only its exit status.
        return Err(fail(format!("`{program} get` exited with {}", out.status)));
    }
    #[derive(serde::Deserialize)]
    struct HelperReply {
        #[serde(rename = "Username", default)]
        username: String,
        #[serde(rename = "Secret", default)]
        secret: String,
    }
    let reply: HelperReply = serde_json::from_slice(&out.stdout).map_err(|_| {
        fail(format!(
            "`{program} get` printed something that is not its JSON reply"
        ))
    })?;
    Ok(Some(if reply.username == "<token>" {
        Credential::IdentityToken(reply.secret)
    } else {
        Credential::Basic {
            username: reply.username,
            password: reply.secret,
        }
    }))
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parse a `WWW-Authenticate` header value (`Basic realm="x"` or
/// `Bearer realm="https://auth",service="reg",scope="repository:a:pull"`).
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let header = header.trim();
    let (scheme, params) = header.split_once(' ').unwrap_or((header, ""));
    let params = parse_params(params);
    let get = |k: &str| {
        params
            .iter()
            .find(|(pk, _)| pk.eq_ignore_ascii_case(k))
            .map(|(_, v)| v.clone())
    };
    if scheme.eq_ignore_ascii_case("basic") {
        Some(Challenge::Basic)
    } else if scheme.eq_ignore_ascii_case("bearer") {
        Some(Challenge::Bearer {
            realm: get("realm")?,
            service: get("service"),
            scope: get("scope"),
        })
    } else {
        None
    }
}

/// `k="v", k2=v2` pairs; quoted values may hold commas and `\"`.
fn parse_params(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        while let Some(&c) = chars.peek() {
            if c == '=' {
                break;
            }
            key.push(c);
            chars.next();
        }
        if chars.next().is_none() {
            break;
        }
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            while let Some(c) = chars.next() {
                match c {
                    '\\' => {
                        if let Some(n) = chars.next() {
                            value.push(n)
                        }
                    }
                    '"' => break,
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.push((key.trim().to_string(), value.trim().to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_challenge(header: &str, expected: Option<Challenge>) {
        assert_eq!(parse_challenge(header), expected, "{header}");
    }

    #[test]
    fn challenges() {
        check_challenge(r#"Basic realm="bench-realm""#, Some(Challenge::Basic));
        check_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/busybox:pull,push""#,
            Some(Challenge::Bearer {
                realm: "https://auth.docker.io/token".into(),
                service: Some("registry.docker.io".into()),
                scope: Some("repository:library/busybox:pull,push".into()),
            }),
        );
        check_challenge(
            "bearer realm=https://a/t, service=reg",
            Some(Challenge::Bearer {
                realm: "https://a/t".into(),
                service: Some("reg".into()),
                scope: None,
            }),
        );
        check_challenge(r#"Bearer service="x""#, None);
        check_challenge("Negotiate abc", None);
    }

    fn check_source(config: &str, registry: &str, expected: Source) {
        let c = parse_docker_config(config).unwrap();
        assert_eq!(c.source_for(registry), expected, "{config} {registry}");
    }

    #[test]
    fn docker_config_sources() {
        // "bench:s3cret"
        let auths = r#"{"auths":{"https://127.0.0.1:5056/v1/":{"auth":"YmVuY2g6czNjcmV0"}}}"#;
        let basic = Source::Inline(Credential::Basic {
            username: "bench".into(),
            password: "s3cret".into(),
        });
        check_source(auths, "127.0.0.1:5056", basic);
        check_source(auths, "127.0.0.1:5057", Source::None);
        check_source(
            r#"{"auths":{"r.io":{"auth":"eA=="}},"credsStore":"pass"}"#,
            "r.io",
            Source::Helper("pass".into()),
        );
        check_source(
            r#"{"credHelpers":{"r.io":"ecr-login"},"credsStore":"pass"}"#,
            "r.io",
            Source::Helper("ecr-login".into()),
        );
        check_source(
            r#"{"auths":{"https://index.docker.io/v1/":{"identitytoken":"tok"}}}"#,
            "registry-1.docker.io",
            Source::Inline(Credential::IdentityToken("tok".into())),
        );
        assert!(parse_docker_config("{").is_err());
    }

    #[test]
    fn debug_redacts_secrets() {
        let c = Credential::Basic {
            username: "u".into(),
            password: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
        let cfg = parse_docker_config(r#"{"auths":{"r":{"auth":"dTpodW50ZXIy"}}}"#).unwrap();
        assert!(!format!("{cfg:?}").contains("dTpodW50ZXIy"));
    }
}
