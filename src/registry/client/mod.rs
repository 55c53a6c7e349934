//! The distribution-spec HTTP client: one registry, auth, retries. Built on `ureq` 3 (sync,
//! rustls); parallelism comes from the callers' threads sharing one `Client`.
//!
//! Auth: `GET /v2/` at connect time learns the scheme. `Basic` challenges get the keychain's
//! credentials on every request; `Bearer` challenges get a token from the realm for the scopes
//! a request needs (cached per scope set, refreshed on a 401).
//!
//! Retries: connection errors, 408, 429 and 5xx are retried with exponential backoff and
//! jitter, honouring `Retry-After`; timeouts are retried at most [`MAX_TIMEOUTS`] times in all.
//! Requests whose retry is not a plain resend (chunk uploads) use [`Client::attempt`] and
//! recover themselves.
//!
//! Invariants, enforced here for every request rather than per call site:
//! - credentials (basic, identity token, bearer token) go only to the registry's own origin
//!   (scheme, host, port): an upload `Location` elsewhere gets no `Authorization`, a token
//!   realm elsewhere only the credentials configured for its own host, and redirects never
//!   carry any ([`Client::same_origin`]);
//! - a TLS registry is never left for plain HTTP: `http://` locations, realms and redirects are
//!   refused;
//! - a registry never sends the client to a link-local address, a loopback address other than
//!   its own, or a private address unless it is on a private network itself: the address is
//!   judged when the name is resolved, before connecting ([`GuardedResolver`]);
//! - every request has a connect deadline, an idle deadline per read and write, a deadline
//!   for the answer once the request is sent (never scaled by a size), and a total deadline
//!   that grows with the bytes it carries; a body that moves slower than the minimum rate
//!   over a window is stopped ([`ClientOptions`], [`RateGuard`]);
//! - response bodies read whole are capped ([`MAX_MANIFEST`], [`MAX_TOKEN`], [`MAX_ERROR_BODY`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::http::{self, Method, Response};
use ureq::tls::{Certificate, RootCerts, TlsConfig};
use ureq::SendBody;

use super::auth::{parse_challenge, Challenge, Credential, Keychain};
use super::host::{redirect_refusal, Host, RegistryHost};
use super::{Error, Result};

mod rate;
mod retry;
mod token;
mod transport;

pub(crate) use rate::*;
pub(crate) use retry::*;
pub(crate) use token::*;
pub(crate) use transport::*;

/// The largest manifest or index read from a registry (what registries themselves accept).
pub(crate) const MAX_MANIFEST: u64 = 4 << 20;
/// The largest token endpoint answer read.
pub(crate) const MAX_TOKEN: u64 = 256 << 10;
/// The largest error body read (for its message).
pub(crate) const MAX_ERROR_BODY: u64 = 64 << 10;
/// Where the client says what it is waiting for (a rate limit): the CLI prints it; by default
/// nothing is said.
#[derive(Clone, Default)]
pub struct Notify(pub Option<std::sync::Arc<NotifyFn>>);

/// What a [`Notify`] calls.
pub(crate) type NotifyFn = dyn Fn(&str) + Send + Sync;

impl std::fmt::Debug for Notify {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Notify(on)"
        } else {
            "Notify(off)"
        })
    }
}

impl Notify {
    fn say(&self, text: &str) {
        if let Some(f) = &self.0 {
            f(text);
        }
    }
}

/// How a client connects.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Plain HTTP, no TLS. Never the default.
    pub insecure: bool,
    /// Trust exactly the certificates of this PEM file (`--ca-cert`; default `$SSL_CERT_FILE`,
    /// else the built-in web PKI roots).
    pub ca_cert: Option<PathBuf>,
    pub keychain: Keychain,
    /// Use these credentials instead of looking them up (`login` checks them this way).
    pub credential: Option<Credential>,
    /// Tries per request (first try included).
    pub max_attempts: u32,
    /// First backoff delay; it doubles per retry up to `backoff_max`.
    pub backoff_base: Duration,
    pub backoff_max: Duration,
    /// Establishing a connection (TLS handshake included).
    pub connect_timeout: Duration,
    /// The longest silence on a connection: no byte read or written for this long fails the
    /// request (waiting for response headers included).
    pub idle_timeout: Duration,
    /// The total deadline of a request without a large body, and the deadline for the
    /// answer to start once a request (body included) is sent, whatever its size.
    pub request_timeout: Duration,
    /// The slowest transfer accepted, in bytes per second (at least 1): a blob body, up or
    /// down, that moves fewer than `min_rate × rate_window` bytes in a window is stopped
    /// (`RateGuard`), and a request carrying `n` bytes gets `request_timeout + n / min_rate`
    /// in all, so a registry that trickles cannot hold a push or pull for long. Default
    /// `DEFAULT_MIN_RATE`, or `INFER_BUILD_REGISTRY_MIN_RATE`.
    pub min_rate: u64,
    /// The window the minimum rate is measured over; also the longest a request body may
    /// stall on one write. Default `DEFAULT_RATE_WINDOW`, or
    /// `INFER_BUILD_REGISTRY_RATE_WINDOW` (seconds).
    pub rate_window: Duration,
    /// Told when the client waits on a registry's rate limit.
    pub notify: Notify,
    /// `(registry, realm host)` pairs (canonical [`RegistryHost`] texts): the registry's
    /// credentials may go to that https token service on another host (`ENV_REALMS`).
    pub trusted_realms: Vec<(String, String)>,
    /// When set, no request (nor retry, nor backoff) runs past this instant: a pull gives its
    /// mirrors one deadline between them, so dead mirrors cannot hold it for long.
    pub deadline: Option<Instant>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        // A malformed setting is refused by `Client::connect`; the defaults stand here.
        let (min_rate, rate_window) = rate_limits_from(&super::env_var).unwrap_or_default();
        ClientOptions {
            insecure: false,
            ca_cert: None,
            keychain: Keychain::default(),
            credential: None,
            max_attempts: 10,
            backoff_base: Duration::from_millis(100),
            backoff_max: Duration::from_secs(8),
            connect_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(60),
            request_timeout: Duration::from_secs(120),
            min_rate: min_rate.unwrap_or(DEFAULT_MIN_RATE),
            rate_window: rate_window.unwrap_or(DEFAULT_RATE_WINDOW),
            notify: Notify::default(),
            trusted_realms: trusted_realms_from(&super::env_var).unwrap_or_default(),
            deadline: None,
        }
    }
}

/// A request body. Files are streamed from `offset`, never read whole.
pub enum Body<'a> {
    Empty,
    Bytes(&'a [u8]),
    /// `len` bytes of an open file from `offset` (positioned reads: the handle is shared).
    File {
        file: &'a File,
        offset: u64,
        len: u64,
        progress: Option<&'a (dyn Fn(u64) + Sync)>,
    },
}

impl Body<'_> {
    fn len(&self) -> u64 {
        match self {
            Body::Empty => 0,
            Body::Bytes(b) => b.len() as u64,
            Body::File { len, .. } => *len,
        }
    }
}

/// One request, rebuilt for every try.
pub struct Req<'a> {
    pub method: Method,
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: Body<'a>,
    /// The size of the response body the caller will read (a blob), for the total deadline.
    pub expect_bytes: u64,
}

impl<'a> Req<'a> {
    pub fn new(method: Method, url: String) -> Self {
        Req {
            method,
            url,
            headers: Vec::new(),
            body: Body::Empty,
            expect_bytes: 0,
        }
    }
    pub(crate) fn expect_bytes(mut self, n: u64) -> Self {
        self.expect_bytes = n;
        self
    }
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers.push((name, value.into()));
        self
    }
    pub fn body(mut self, body: Body<'a>) -> Self {
        self.body = body;
        self
    }
}

pub(crate) type Resp = Response<ureq::Body>;

#[derive(Debug)]
enum AuthMode {
    Anonymous,
    Basic,
    Bearer {
        realm: String,
        service: Option<String>,
    },
}

/// A client for one registry.
pub struct Client {
    agent: ureq::Agent,
    registry: RegistryHost,
    base: String,
    credential: Option<Credential>,
    mode: Mutex<AuthMode>,
    tokens: Mutex<HashMap<String, String>>,
    token_fetch: Mutex<()>,
    opts: ClientOptions,
    rng: Mutex<u64>,
    /// Set once the registry's credentials were sent to it (or to its token endpoint) and
    /// accepted.
    presented: std::sync::atomic::AtomicBool,
    /// Credentials configured for token endpoints on other origins, by host.
    realm_credentials: Mutex<HashMap<String, Option<Credential>>>,
    /// The host of a token service on another origin that got no credentials although the
    /// registry has some (for the hint of an authorisation error).
    withheld_realm: Mutex<Option<String>>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Client({})", self.base)
    }
}

impl Client {
    /// Connect to `registry` (`host[:port]`): load credentials and learn the auth scheme. A
    /// name that is not a host and port ([`RegistryHost`]) is bad input, refused before
    /// anything is sent.
    pub fn connect(registry: &str, opts: ClientOptions) -> Result<Client> {
        let registry = RegistryHost::parse(registry).map_err(|reason| Error::BadRegistry {
            registry: registry.chars().take(256).collect(),
            reason,
        })?;
        let mut config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(concat!("infer-build/", env!("CARGO_PKG_VERSION")))
            .accept_encoding(ureq::config::AutoHeaderValue::None)
            .max_idle_connections_per_host(16)
            // A TLS registry is never left for plain HTTP, redirects included; redirects
            // (blob storage) never carry the Authorization header.
            .https_only(!opts.insecure)
            .redirect_auth_headers(ureq::config::RedirectAuthHeaders::Never)
            .max_redirects(5)
            .timeout_connect(Some(opts.connect_timeout))
            .timeout_per_read(Some(opts.idle_timeout))
            .timeout_per_write(Some(opts.idle_timeout))
            .timeout_global(Some(opts.request_timeout));
        if !opts.insecure {
            let ca = opts
                .ca_cert
                .clone()
                .or_else(|| std::env::var_os("SSL_CERT_FILE").map(PathBuf::from));
            if let Some(path) = ca {
                config = config.tls_config(
                    TlsConfig::builder()
                        .root_certs(RootCerts::new_with_certs(&load_certs(&path)?))
                        .build(),
                );
            }
        }
        let scheme = if opts.insecure { "http" } else { "https" };
        // A malformed setting is bad input, said before any connection.
        rate_limits_from(&super::env_var)?;
        trusted_realms_from(&super::env_var)?;
        let credential = match &opts.credential {
            Some(c) => Some(c.clone()),
            None => opts.keychain.lookup(registry.as_str())?,
        };
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9)
            | 1;
        let resolver = GuardedResolver {
            registry: registry.host().clone(),
            shown: registry.to_string(),
            own: Mutex::new(Vec::new()),
        };
        let agent = ureq::Agent::with_parts(
            config.build(),
            ureq::unversioned::transport::DefaultConnector::default(),
            resolver,
        );
        let client = Client {
            agent,
            base: format!("{scheme}://{registry}"),
            registry,
            credential,
            mode: Mutex::new(AuthMode::Anonymous),
            tokens: Mutex::new(HashMap::new()),
            token_fetch: Mutex::new(()),
            opts,
            rng: Mutex::new(seed),
            presented: std::sync::atomic::AtomicBool::new(false),
            realm_credentials: Mutex::new(HashMap::new()),
            withheld_realm: Mutex::new(None),
        };
        client.ping()?;
        Ok(client)
    }

    pub fn registry(&self) -> &str {
        self.registry.as_str()
    }

    /// Lift [`ClientOptions::deadline`]: a mirror that answered serves the rest of the pull
    /// under the usual deadlines.
    pub(crate) fn lift_deadline(&mut self) {
        self.opts.deadline = None;
    }

    /// The time left before [`ClientOptions::deadline`], `None` without one.
    fn time_left(&self) -> Option<Duration> {
        self.opts
            .deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// A [`RateGuard`] with this client's minimum rate and window, for a body read by the
    /// caller (a blob download).
    pub(crate) fn rate_guard(&self) -> RateGuard {
        RateGuard::new(self.opts.min_rate, self.opts.rate_window)
    }

    /// The minimum rate and its window, for messages.
    pub fn min_rate(&self) -> (u64, Duration) {
        (self.opts.min_rate, self.opts.rate_window)
    }

    /// For an authorisation error: what to do when no credentials were found (and why the
    /// environment's were not used, when they are set); `None` when there were credentials.
    ///
    /// Also when the registry's token service is on another host that got none of its
    /// credentials: the hint names that host, the `login` to run and the opt-in.
    pub(crate) fn missing_credentials_hint(&self) -> Option<String> {
        if self.credential.is_none() {
            return Some(super::auth::missing_credentials_hint(
                self.registry.as_str(),
            ));
        }
        let host = self
            .withheld_realm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()?;
        Some(format!(
            "the token service of {registry} is on another host, {host}, and credentials go only to \
             a registry's own host: its credentials were not sent there. Run `infer-build login {host}` \
             to give that host its own, or let {registry}'s go there with \
             {ENV_REALMS}={registry}={host}",
            registry = self.registry
        ))
    }

    /// True when the credentials were presented to the registry (basic auth, or a token
    /// endpoint of its own) during the requests so far, and accepted.
    pub fn credentials_checked(&self) -> bool {
        self.presented.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// `scheme://host[:port]/v2/<path>`.
    pub fn url(&self, path: &str) -> String {
        format!("{}/v2/{path}", self.base)
    }

    /// Resolve a `Location` header: absolute, or relative to the registry.
    pub fn resolve(&self, location: &str) -> String {
        if location.starts_with("http://") || location.starts_with("https://") {
            location.to_string()
        } else if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            format!("{}/{location}", self.base)
        }
    }

    /// True when `url` is on the registry's own origin (scheme, host and port): the only
    /// place credentials and tokens are sent.
    pub fn same_origin(&self, url: &str) -> bool {
        origin(url).is_some_and(|o| Some(o) == origin(&self.base))
    }

    fn ping(&self) -> Result<()> {
        let url = self.url("");
        let resp = self.send(&Req::new(Method::GET, url.clone()), &[])?;
        match resp.status().as_u16() {
            200 => Ok(()),
            401 => Err(Error::Unauthorized {
                registry: self.registry.to_string(),
                status: 401,
                what: match self.missing_credentials_hint() {
                    None => "the API version check".into(),
                    Some(hint) => format!("the API version check ({hint})"),
                },
            }),
            s => Err(status_error(&Method::GET, &url, s, resp)),
        }
    }

    pub fn max_attempts(&self) -> u32 {
        self.opts.max_attempts
    }
}
