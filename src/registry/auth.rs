//! Credentials and authentication challenges.
//!
//! Credentials for a registry come from, first match wins:
//! 1. `INFER_BUILD_REGISTRY_USER` and `INFER_BUILD_REGISTRY_PASSWORD`, for the one registry
//!    `INFER_BUILD_REGISTRY` names (`host[:port]`), and for no other host: without
//!    `INFER_BUILD_REGISTRY` they are not used at all ([`env_credential`]);
//! 2. credentials files, in the order skopeo and podman read them: `REGISTRY_AUTH_FILE` when set
//!    (then only that file), else `$XDG_RUNTIME_DIR/containers/auth.json`,
//!    `$XDG_CONFIG_HOME/containers/auth.json` (default `~/.config/…`), then Docker's
//!    `$DOCKER_CONFIG/config.json` (default `~/.docker/config.json`). An explicit file
//!    ([`Keychain::docker_config`], `--authfile`, `--docker-config`) replaces the search.
//!
//! Every file has the same format: `credHelpers[registry]`, then `auths[registry]` (`auth`
//! base64 `user:password`, or `username`/`password`, or `identitytoken`), then `credsStore`.
//! Helpers are the `docker-credential-<name>` programs, run through [`crate::process`] with a
//! deadline. `infer-build login` writes the containers file ([`login_file`], [`store`]).
//!
//! Secrets never reach `Debug`, `Display` or an error message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine as _;

use super::host::RegistryHost;
use super::{Error, Result};
use crate::process::{Cmd, SystemRunner};

/// Environment variables that give credentials for the one registry [`ENV_REGISTRY`] names.
pub(crate) const ENV_USER: &str = "INFER_BUILD_REGISTRY_USER";
pub(crate) const ENV_PASSWORD: &str = "INFER_BUILD_REGISTRY_PASSWORD";
/// The registry (`host[:port]`) the environment credentials are for; unset = they are not used.
pub(crate) const ENV_REGISTRY: &str = "INFER_BUILD_REGISTRY";
/// The containers tools' variable naming the one credentials file to use.
pub(crate) const ENV_AUTH_FILE: &str = "REGISTRY_AUTH_FILE";
/// How long a credential helper may take.
pub(crate) const HELPER_TIMEOUT: Duration = Duration::from_secs(30);
/// Credentials files are small; anything bigger is not one.
const MAX_FILE: u64 = 4 << 20;

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
    pub(crate) fn basic_header(&self) -> Option<String> {
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
    /// Read only this credentials file (a Docker `config.json` or a containers `auth.json`:
    /// same format) instead of searching the default locations; a missing file gives no
    /// credentials (the CLI refuses a missing file it was given). `None` = the default search.
    pub docker_config: Option<PathBuf>,
    /// Ignore `INFER_BUILD_REGISTRY_USER/PASSWORD` (and `INFER_BUILD_REGISTRY`).
    pub ignore_env: bool,
}

/// Where a credentials file comes from: named by the user (a missing one is an error) or found
/// by the default search (a missing one is skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredFile {
    pub path: PathBuf,
    pub named: bool,
}

impl Keychain {
    /// The credentials for `registry` (`host[:port]`), or `None` for anonymous access.
    /// Keys are matched by their canonical host ([`RegistryHost`]), so any spelling of the
    /// registry finds its entry; a malformed `registry` or `INFER_BUILD_REGISTRY` is bad input.
    pub fn lookup(&self, registry: &str) -> Result<Option<Credential>> {
        let host = RegistryHost::parse(registry).map_err(|reason| Error::BadRegistry {
            registry: registry.chars().take(256).collect(),
            reason,
        })?;
        let registry = host.as_str();
        if !self.ignore_env {
            match env_credential(registry, &super::env_var) {
                EnvCredential::For(c) => return Ok(Some(c)),
                EnvCredential::Malformed(reason) => {
                    return Err(Error::Setting {
                        name: ENV_REGISTRY.into(),
                        reason,
                    })
                }
                EnvCredential::None | EnvCredential::NotHere(_) => {}
            }
        }
        for file in self.files() {
            let text = match read_credentials_file(&file.path) {
                Ok(Some(t)) => t,
                Ok(None) if !file.named || self.docker_config.is_some() => continue,
                Ok(None) => {
                    return Err(Error::Credentials {
                        registry: registry.to_string(),
                        reason: format!(
                            "{} (named by {ENV_AUTH_FILE}) does not exist",
                            file.path.display()
                        ),
                    })
                }
                Err(reason) => {
                    return Err(Error::Credentials {
                        registry: registry.to_string(),
                        reason: format!("{}: {reason}", file.path.display()),
                    })
                }
            };
            let fail = |reason: String| Error::Credentials {
                registry: registry.to_string(),
                reason: format!("{}: {reason}", file.path.display()),
            };
            let config = parse_docker_config(&text).map_err(fail)?;
            let found = match config.source_for(registry).map_err(fail)? {
                Source::None => None,
                Source::Inline(c) => Some(c),
                Source::Helper(helper) => {
                    run_helper(&SystemRunner, &helper, registry, HELPER_TIMEOUT)
                        .map_err(|reason| fail(format!("credential helper: {reason}")))?
                }
            };
            if found.is_some() {
                return Ok(found);
            }
        }
        Ok(None)
    }

    /// The credentials files read, in order.
    pub fn files(&self) -> Vec<CredFile> {
        if let Some(p) = &self.docker_config {
            return vec![CredFile {
                path: p.clone(),
                named: true,
            }];
        }
        default_files(&|k| std::env::var_os(k).filter(|v| !v.is_empty()))
    }
}

/// What the environment's credentials are for one registry.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum EnvCredential {
    /// `INFER_BUILD_REGISTRY_USER` is not set (or empty).
    None,
    /// They are for this registry: `INFER_BUILD_REGISTRY` names it.
    For(Credential),
    /// They are set but not for this registry; why, for a hint (never a secret).
    NotHere(String),
    /// `INFER_BUILD_REGISTRY` is not a registry name; why.
    Malformed(String),
}

/// The environment credentials (`var` reads the environment) for `registry` (`host[:port]`):
/// only when `INFER_BUILD_REGISTRY` names that registry (`host[:port]`, case-insensitive;
/// `https://` and a path are ignored, Docker Hub's names are one registry). Never for
/// another host, so a token realm, upload location or redirect elsewhere cannot get them.
pub(crate) fn env_credential(
    registry: &str,
    var: &dyn Fn(&str) -> Option<String>,
) -> EnvCredential {
    let Some(username) = var(ENV_USER).filter(|u| !u.is_empty()) else {
        return EnvCredential::None;
    };
    let Some(bound) = var(ENV_REGISTRY).filter(|b| !b.trim().is_empty()) else {
        return EnvCredential::NotHere(format!(
            "{ENV_USER}/{ENV_PASSWORD} are set but not used: {ENV_REGISTRY} is unset (set it to `{registry}` to use them for this registry)"
        ));
    };
    let b = match key_registry(bound.trim()) {
        Ok(b) => b,
        Err(why) => {
            return EnvCredential::Malformed(format!(
                "`{}` is not a registry (host[:port]): {why}",
                bound.chars().take(64).collect::<String>()
            ))
        }
    };
    let Ok(registry) = RegistryHost::parse(registry) else {
        return EnvCredential::NotHere(format!("`{registry}` is not a registry"));
    };
    if same_registry(&b, &registry) {
        EnvCredential::For(Credential::Basic {
            username,
            password: var(ENV_PASSWORD).unwrap_or_default(),
        })
    } else {
        EnvCredential::NotHere(format!(
            "{ENV_USER}/{ENV_PASSWORD} are for `{b}` ({ENV_REGISTRY}), not for `{registry}`"
        ))
    }
}

/// What to tell a user whose request `registry` refused without credentials: where
/// credentials come from, and why the environment's were not used when they are set.
pub(crate) fn missing_credentials_hint(registry: &str) -> String {
    let how = format!(
        "run `infer-build login`, skopeo or docker login, or set {ENV_REGISTRY}={registry} with {ENV_USER}/{ENV_PASSWORD}"
    );
    match env_credential(registry, &super::env_var) {
        EnvCredential::NotHere(why) => format!("no credentials found: {why}; {how}"),
        _ => format!("no credentials found: {how}"),
    }
}

/// The default search, from the environment `var` gives.
pub(crate) fn default_files(var: &dyn Fn(&str) -> Option<std::ffi::OsString>) -> Vec<CredFile> {
    if let Some(p) = var(ENV_AUTH_FILE) {
        return vec![CredFile {
            path: PathBuf::from(p),
            named: true,
        }];
    }
    let home = var("HOME").map(PathBuf::from);
    let mut out = Vec::new();
    let mut push = |path: PathBuf| out.push(CredFile { path, named: false });
    if let Some(run) = var("XDG_RUNTIME_DIR") {
        push(Path::new(&run).join("containers/auth.json"));
    }
    if let Some(cfg) = var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|h| h.join(".config")))
    {
        push(cfg.join("containers/auth.json"));
    }
    if let Some(dir) = var("DOCKER_CONFIG") {
        push(Path::new(&dir).join("config.json"));
    } else if let Some(h) = &home {
        push(h.join(".docker/config.json"));
    }
    out
}

/// The file `infer-build login` writes: `explicit`, else `REGISTRY_AUTH_FILE`, else
/// `$XDG_RUNTIME_DIR/containers/auth.json`, else `$XDG_CONFIG_HOME/containers/auth.json`
/// (default `~/.config/…`): where skopeo and podman read it first.
pub(crate) fn login_file(
    explicit: Option<&Path>,
    var: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.to_path_buf());
    }
    if let Some(p) = var(ENV_AUTH_FILE) {
        return Some(PathBuf::from(p));
    }
    if let Some(run) = var("XDG_RUNTIME_DIR") {
        return Some(Path::new(&run).join("containers/auth.json"));
    }
    var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| Path::new(&h).join(".config")))
        .map(|c| c.join("containers/auth.json"))
}

/// Read a credentials file: `Ok(None)` when it does not exist; an error (its reason) when it
/// cannot be read, is not a regular file or is too big.
fn read_credentials_file(path: &Path) -> std::result::Result<Option<String>, String> {
    use std::io::Read as _;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot read it: {e}")),
    };
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut text = String::new();
    f.take(MAX_FILE + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if text.len() as u64 > MAX_FILE {
        return Err(format!(
            "larger than {MAX_FILE} bytes: not a credentials file"
        ));
    }
    Ok(Some(text))
}

/// Store basic credentials for `registry` in `path` (a containers `auth.json`, created with
/// mode 0600 when missing; other entries and keys are kept), through a temporary file and a
/// rename.
pub(crate) fn store(path: &Path, registry: &str, username: &str, password: &str) -> Result<()> {
    let fail = |reason: String| Error::Credentials {
        registry: registry.to_string(),
        reason: format!("{}: {reason}", path.display()),
    };
    let mut doc = match read_credentials_file(path).map_err(fail)? {
        Some(text) if !text.trim().is_empty() => serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .filter(|v| v.is_object())
            .ok_or_else(|| fail("not a credentials file (expected a JSON object)".into()))?,
        _ => serde_json::json!({}),
    };
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    let auths = doc
        .as_object_mut()
        .map(|o| o.entry("auths").or_insert_with(|| serde_json::json!({})))
        .and_then(|a| a.as_object_mut())
        .ok_or_else(|| fail("`auths` is not an object".into()))?;
    // One entry per registry: drop spellings of the same host (`https://host/v1/`, case,
    // the default port, IPv4 forms).
    let host = RegistryHost::parse(registry).map_err(|why| fail(why.to_string()))?;
    auths.retain(|k, _| !key_registry(k).is_ok_and(|k| same_registry(&k, &host)));
    auths.insert(host.to_string(), serde_json::json!({ "auth": auth }));
    let bytes = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    }
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::PermissionsExt as _;
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
        tmp.write_all(&bytes)?;
        tmp.write_all(b"\n")?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    };
    write().map_err(|e| fail(format!("cannot write it: {e}")))
}

/// What `login` did.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct LoginReport {
    pub registry: String,
    pub file: PathBuf,
    /// False when the registry answered without asking for credentials, so they could not
    /// be checked (they are stored all the same, as docker and skopeo do).
    pub verified: bool,
}

/// Check `username`/`password` against `registry` (`GET /v2/` with them), then store them in
/// `file`. Nothing is written when the registry refuses them or cannot be reached.
pub(crate) fn login(
    registry: &str,
    username: &str,
    password: &str,
    file: &Path,
    opts: &super::ClientOptions,
) -> Result<LoginReport> {
    let opts = super::ClientOptions {
        credential: Some(Credential::Basic {
            username: username.to_string(),
            password: password.to_string(),
        }),
        ..opts.clone()
    };
    let client = super::Client::connect(registry, opts)?;
    let verified = client.credentials_checked();
    store(file, registry, username, password)?;
    Ok(LoginReport {
        registry: registry.to_string(),
        file: file.to_path_buf(),
        verified,
    })
}

/// The parts of a credentials file (Docker's `config.json`, containers' `auth.json`) that
/// matter here.
#[derive(Debug, Default, serde::Deserialize)]
pub(crate) struct DockerConfig {
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
pub(crate) enum Source {
    None,
    Inline(Credential),
    /// The suffix of a `docker-credential-<suffix>` program.
    Helper(String),
}

/// Parse a credentials file. The error names the problem, never a value.
pub(crate) fn parse_docker_config(text: &str) -> std::result::Result<DockerConfig, String> {
    serde_json::from_str(text).map_err(|e| {
        format!(
            "not a credentials file (Docker config.json / containers auth.json): line {} column {}",
            e.line(),
            e.column()
        )
    })
}

/// The registry of a `config.json` key (or of `INFER_BUILD_REGISTRY`), canonical: keys may be
/// `host`, `https://host`, `https://host/v1/` and the like.
fn key_registry(key: &str) -> std::result::Result<RegistryHost, super::host::NameError> {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    RegistryHost::parse(k.split('/').next().unwrap_or(k))
}

/// True when the registry `key` names is `registry`. Docker Hub has several names:
/// `docker.io` (and `index.docker.io`, the same [`RegistryHost`]) stand for its API host.
pub(crate) fn same_registry(key: &RegistryHost, registry: &RegistryHost) -> bool {
    key == registry
        || (*registry == super::reference::DOCKER_HUB_API && *key == super::reference::DOCKER_HUB)
}

impl DockerConfig {
    /// Where `registry`'s credentials are. An `auths` entry for it that holds nothing usable
    /// is an error (naming the registry, never the value).
    pub(crate) fn source_for(&self, registry: &str) -> std::result::Result<Source, String> {
        let Ok(registry) = RegistryHost::parse(registry) else {
            return Ok(Source::None);
        };
        let names = |k: &String| key_registry(k).is_ok_and(|k| same_registry(&k, &registry));
        if let Some((_, helper)) = self.cred_helpers.iter().find(|(k, _)| names(k)) {
            return Ok(Source::Helper(helper.clone()));
        }
        if let Some((key, entry)) = self.auths.iter().find(|(k, _)| names(k)) {
            if let Some(token) = entry.identitytoken.as_deref().filter(|t| !t.is_empty()) {
                return Ok(Source::Inline(Credential::IdentityToken(token.to_string())));
            }
            if let Some(auth) = entry.auth.as_deref().filter(|a| !a.is_empty()) {
                let decoded = base64::engine::general_purpose::STANDARD
                    .decode(auth.trim())
                    .ok()
                    .and_then(|b| String::from_utf8(b).ok());
                return match decoded.as_deref().and_then(|d| d.split_once(':')) {
                    Some((u, p)) if !u.is_empty() => Ok(Source::Inline(Credential::Basic {
                        username: u.to_string(),
                        password: p.to_string(),
                    })),
                    _ => Err(format!(
                        "`auths.\"{key}\".auth` is not base64 of `user:password`"
                    )),
                };
            }
            if let (Some(u), Some(p)) = (&entry.username, &entry.password) {
                return Ok(Source::Inline(Credential::Basic {
                    username: u.clone(),
                    password: p.clone(),
                }));
            }
            if self.creds_store.as_deref().is_none_or(str::is_empty) {
                return Err(format!(
                    "`auths.\"{key}\"` has no `auth`, `username`/`password` or `identitytoken`"
                ));
            }
        }
        Ok(match &self.creds_store {
            Some(store) if !store.is_empty() => Source::Helper(store.clone()),
            _ => Source::None,
        })
    }
}

/// Ask `docker-credential-<helper> get` for the credentials of `registry`, through `runner`,
/// killing it after `timeout` ([`HELPER_TIMEOUT`] in lookups). The error (a reason) never
/// holds the helper's output.
pub(crate) fn run_helper(
    runner: &dyn crate::process::Runner,
    helper: &str,
    registry: &str,
    timeout: Duration,
) -> std::result::Result<Option<Credential>, String> {
    if helper.is_empty() || helper.contains('/') {
        return Err(format!("`{helper}` is not a credential helper name"));
    }
    let program = format!("docker-credential-{helper}");
    // Helpers are asked by server URL; most store the bare host.
    let cmd = Cmd::new(&program)
        .arg("get")
        .stdin(registry.as_bytes().to_vec())
        .timeout(timeout);
    let out = runner.run(&cmd).map_err(|e| match e {
        crate::process::Error::Timeout { after, .. } => format!(
            "`{program} get` did not answer within {:.1} s",
            after.as_secs_f64()
        ),
        other => other.to_string(),
    })?;
    if !out.success() {
        let msg = String::from_utf8_lossy(&out.stdout).to_lowercase();
        if msg.contains("credentials not found") {
            return Ok(None);
        }
        // The helper's output may echo secrets: report only its exit status.
        return Err(format!(
            "`{program} get` exited with {}",
            out.code
                .map_or("a signal".to_string(), |c| format!("code {c}"))
        ));
    }
    #[derive(serde::Deserialize)]
    struct HelperReply {
        #[serde(rename = "Username", default)]
        username: String,
        #[serde(rename = "Secret", default)]
        secret: String,
    }
    let reply: HelperReply = serde_json::from_slice(&out.stdout)
        .map_err(|_| format!("`{program} get` printed something that is not its JSON reply"))?;
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
pub(crate) enum Challenge {
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parse a `WWW-Authenticate` header value (`Basic realm="x"` or
/// `Bearer realm="https://auth",service="reg",scope="repository:a:pull"`).
pub(crate) fn parse_challenge(header: &str) -> Option<Challenge> {
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
        assert_eq!(c.source_for(registry), Ok(expected), "{config} {registry}");
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
            r#"{"auths":{"r.io":{}},"credsStore":"pass"}"#,
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

    /// A credentials-file key finds its registry whatever the spelling on either side, and
    /// finds no other registry.
    #[test]
    fn credentials_keys_match_the_canonical_registry() {
        let basic = || {
            Source::Inline(Credential::Basic {
                username: "bench".into(),
                password: "s3cret".into(),
            })
        };
        for (key, registry) in [
            ("127.0.0.1:5301", "127.1:5301"),
            ("127.0.0.1:5301", "[::ffff:127.0.0.1]:5301"),
            ("https://127.0.0.01:5301/v1/", "2130706433:5301"),
            ("LOCALHOST:5301", "localhost:5301"),
            ("https://Reg.Example.com./v1/", "reg.example.com:443"),
            ("reg.example.com:443", "REG.example.com"),
        ] {
            let config = format!(r#"{{"auths":{{"{key}":{{"auth":"YmVuY2g6czNjcmV0"}}}}}}"#);
            check_source(&config, registry, basic());
        }
        for (key, registry) in [
            ("127.0.0.1:5301", "localhost:5301"),
            ("127.0.0.1:5301", "127.0.0.2:5301"),
            ("reg.example.com", "reg.example.com:8443"),
            ("bad host?", "bad"),
        ] {
            let config = format!(r#"{{"auths":{{"{key}":{{"auth":"YmVuY2g6czNjcmV0"}}}}}}"#);
            check_source(&config, registry, Source::None);
        }
    }

    #[test]
    fn malformed_entries_name_the_key_never_the_value() {
        let c = parse_docker_config(r#"{"auths":{"r.io":{"auth":"bm90LWJhc2U2NA-!!"}}}"#).unwrap();
        let e = c.source_for("r.io").unwrap_err();
        assert!(
            e.contains("auths.\"r.io\".auth") && !e.contains("bm90"),
            "{e}"
        );
        // base64 of "nocolon": no user:password pair.
        let c = parse_docker_config(r#"{"auths":{"r.io":{"auth":"bm9jb2xvbg=="}}}"#).unwrap();
        assert!(c.source_for("r.io").is_err());
        let c = parse_docker_config(r#"{"auths":{"r.io":{}}}"#).unwrap();
        assert!(c.source_for("r.io").unwrap_err().contains("has no `auth`"));
        // Another registry's bad entry is none of this registry's business.
        assert_eq!(c.source_for("other.io"), Ok(Source::None));
        let e = parse_docker_config(r#"{"auths":[]}"#).unwrap_err();
        assert!(e.contains("line 1"), "{e}");
    }

    #[test]
    fn default_files_in_the_order_skopeo_and_podman_read_them() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let paths = |files: Vec<CredFile>| -> Vec<(String, bool)> {
            files
                .into_iter()
                .map(|f| (f.path.display().to_string(), f.named))
                .collect()
        };
        let all = env(&[
            ("HOME", "/h"),
            ("XDG_RUNTIME_DIR", "/run/u"),
            ("DOCKER_CONFIG", "/d"),
        ]);
        assert_eq!(
            paths(default_files(&all)),
            [
                ("/run/u/containers/auth.json".to_string(), false),
                ("/h/.config/containers/auth.json".to_string(), false),
                ("/d/config.json".to_string(), false),
            ]
        );
        let home = env(&[("HOME", "/h"), ("XDG_CONFIG_HOME", "/x")]);
        assert_eq!(
            paths(default_files(&home)),
            [
                ("/x/containers/auth.json".to_string(), false),
                ("/h/.docker/config.json".to_string(), false),
            ]
        );
        // REGISTRY_AUTH_FILE: that file only, and it must exist.
        let named = env(&[("HOME", "/h"), ("REGISTRY_AUTH_FILE", "/a.json")]);
        assert_eq!(
            paths(default_files(&named)),
            [("/a.json".to_string(), true)]
        );
        assert_eq!(login_file(None, &named).unwrap(), PathBuf::from("/a.json"));
        assert_eq!(
            login_file(None, &all).unwrap(),
            PathBuf::from("/run/u/containers/auth.json")
        );
        assert_eq!(
            login_file(None, &home).unwrap(),
            PathBuf::from("/x/containers/auth.json")
        );
        assert_eq!(
            login_file(Some(Path::new("/f")), &all).unwrap(),
            PathBuf::from("/f")
        );
    }

    #[test]
    fn store_keeps_other_entries_and_writes_mode_0600() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/auth.json");
        store(&path, "r.io", "u", "p1").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        std::fs::write(
            &path,
            r#"{"auths":{"https://r.io/v1/":{"auth":"eDp5"},"o.io":{"auth":"eDp5"}},"credHelpers":{"z.io":"pass"}}"#,
        )
        .unwrap();
        store(&path, "r.io", "u", "p2").unwrap();
        let c = parse_docker_config(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(
            c.source_for("r.io"),
            Ok(Source::Inline(Credential::Basic {
                username: "u".into(),
                password: "p2".into()
            }))
        );
        assert!(matches!(c.source_for("o.io"), Ok(Source::Inline(_))));
        assert_eq!(c.source_for("z.io"), Ok(Source::Helper("pass".into())));
        std::fs::write(&path, "[1]").unwrap();
        assert!(store(&path, "r.io", "u", "p").is_err());
    }

    #[test]
    fn a_helper_that_hangs_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let helper = dir.path().join("docker-credential-hang");
        std::fs::write(&helper, "#!/bin/sh\nsleep 60\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
        // The helper is found by path here; lookups find it on PATH.
        struct ByPath(PathBuf);
        impl crate::process::Runner for ByPath {
            fn run(
                &self,
                cmd: &Cmd,
            ) -> std::result::Result<crate::process::Output, crate::process::Error> {
                let mut c = cmd.clone();
                c.program = self.0.join(&cmd.program).display().to_string();
                crate::process::Runner::run(&SystemRunner, &c)
            }
            fn available(&self, _: &str) -> bool {
                true
            }
        }
        let start = std::time::Instant::now();
        let e = run_helper(
            &ByPath(dir.path().to_path_buf()),
            "hang",
            "r.io",
            Duration::from_millis(500),
        )
        .unwrap_err();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        assert!(e.contains("did not answer within"), "{e}");
        assert!(run_helper(&SystemRunner, "../x", "r.io", HELPER_TIMEOUT).is_err());
    }

    #[test]
    fn environment_credentials_are_bound_to_the_registry_named() {
        let env = crate::registry::test_env;
        let basic = EnvCredential::For(Credential::Basic {
            username: "ci".into(),
            password: "pw".into(),
        });
        let bound = env(&[
            (ENV_USER, "ci"),
            (ENV_PASSWORD, "pw"),
            (ENV_REGISTRY, "Reg.example.com:5000"),
        ]);
        assert_eq!(env_credential("reg.example.com:5000", &bound), basic);
        // Another host, another port of the same host, a token realm's host: nothing.
        for other in [
            "reg.example.com",
            "reg.example.com:5001",
            "auth.example.com",
            "127.0.0.1:5000",
        ] {
            match env_credential(other, &bound) {
                EnvCredential::NotHere(why) => {
                    assert!(
                        why.contains("reg.example.com:5000") && !why.contains("pw"),
                        "{why}"
                    )
                }
                e => panic!("{other}: {e:?}"),
            }
        }
        // Spellings of the same registry, as in credentials files.
        let url = env(&[(ENV_USER, "ci"), (ENV_REGISTRY, "https://r.io/v1/")]);
        assert!(matches!(
            env_credential("r.io", &url),
            EnvCredential::For(_)
        ));
        let hub = env(&[(ENV_USER, "ci"), (ENV_REGISTRY, "docker.io")]);
        assert!(matches!(
            env_credential("registry-1.docker.io", &hub),
            EnvCredential::For(_)
        ));
        // Unbound: not used at all, and the reason says what to set.
        let unbound = env(&[(ENV_USER, "ci"), (ENV_PASSWORD, "pw")]);
        match env_credential("r.io", &unbound) {
            EnvCredential::NotHere(why) => assert!(why.contains(ENV_REGISTRY), "{why}"),
            e => panic!("{e:?}"),
        }
        let empty = env(&[(ENV_USER, "ci"), (ENV_REGISTRY, " ")]);
        assert!(matches!(
            env_credential("r.io", &empty),
            EnvCredential::NotHere(_)
        ));
        assert_eq!(
            env_credential("r.io", &env(&[(ENV_REGISTRY, "r.io")])),
            EnvCredential::None
        );
        // The bound registry's other spellings are the same registry.
        let spelled = env(&[(ENV_USER, "ci"), (ENV_REGISTRY, "127.1:5301")]);
        for registry in ["127.0.0.1:5301", "[::ffff:127.0.0.1]:5301"] {
            assert!(
                matches!(env_credential(registry, &spelled), EnvCredential::For(_)),
                "{registry}"
            );
        }
        // A bound that is not a registry is refused, not silently matched or ignored.
        let malformed = env(&[(ENV_USER, "ci"), (ENV_REGISTRY, "r.io:99999")]);
        match env_credential("r.io", &malformed) {
            EnvCredential::Malformed(why) => assert!(why.contains("out of range"), "{why}"),
            e => panic!("{e:?}"),
        }
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
