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

/// The largest manifest or index read from a registry (what registries themselves accept).
pub(crate) const MAX_MANIFEST: u64 = 4 << 20;
/// The largest token endpoint answer read.
pub(crate) const MAX_TOKEN: u64 = 256 << 10;
/// The largest error body read (for its message).
pub(crate) const MAX_ERROR_BODY: u64 = 64 << 10;
/// Timeouts allowed per request (first try included) before giving up.
pub(crate) const MAX_TIMEOUTS: u32 = 3;
/// The environment variable that sets [`ClientOptions::min_rate`] (bytes per second).
pub(crate) const ENV_MIN_RATE: &str = "INFER_BUILD_REGISTRY_MIN_RATE";
/// The environment variable that sets [`ClientOptions::rate_window`] (seconds).
pub(crate) const ENV_RATE_WINDOW: &str = "INFER_BUILD_REGISTRY_RATE_WINDOW";
/// The default minimum transfer rate: 64 KiB/s.
pub(crate) const DEFAULT_MIN_RATE: u64 = 64 << 10;
/// The default window over which the minimum rate is measured.
pub(crate) const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(30);

/// The environment variable that lets named registries' credentials go to a token service on
/// another host: `REGISTRY=REALM_HOST[,REGISTRY=REALM_HOST…]` (https realms only).
pub(crate) const ENV_REALMS: &str = "INFER_BUILD_REGISTRY_REALMS";
/// Docker Hub's token service, the one realm on another host that gets a registry's
/// credentials without being asked (Docker Hub's own clients send them there).
pub(crate) const DOCKER_HUB_REALM: &str = "https://auth.docker.io";
/// The longest `Retry-After` waited for; a registry asking for longer fails the request at
/// once, naming its limit.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

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

/// The pairs of [`ENV_REALMS`] from the environment `var` reads; an error names the entry
/// that is not `REGISTRY=HOST`.
pub(crate) fn trusted_realms_from(
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>> {
    let Some(text) = var(ENV_REALMS) else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| {
            Error::Setting {
            name: ENV_REALMS.into(),
            reason: format!(
                "`{}` is not REGISTRY=REALM_HOST (e.g. registry.gitlab.example.com=gitlab.example.com){why}",
                entry.chars().take(64).collect::<String>()
            ),
        }
        };
        let Some((r, h)) = entry.split_once('=').map(|(r, h)| (r.trim(), h.trim())) else {
            return Err(bad(""));
        };
        let host = |text: &str| RegistryHost::parse(text).map_err(|why| bad(&format!(": {why}")));
        let (r, h) = (host(r)?, host(h)?);
        out.push((
            super::reference::endpoint_of(r.as_str()).to_string(),
            h.to_string(),
        ));
    }
    Ok(out)
}

/// `min_rate` and `rate_window` from the environment `var` reads
/// (`INFER_BUILD_REGISTRY_MIN_RATE`: bytes per second, a whole number of at least 1;
/// `INFER_BUILD_REGISTRY_RATE_WINDOW`: seconds, decimals allowed, above 0 and at most a day),
/// each `None` when unset or empty; an error names the variable and what it holds.
pub(crate) fn rate_limits_from(
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<(Option<u64>, Option<Duration>)> {
    let get = |k: &str| {
        var(k)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let bad = |name: &str, value: &str, want: &str| Error::Setting {
        name: name.to_string(),
        reason: format!(
            "`{}` is not {want}",
            value.chars().take(64).collect::<String>()
        ),
    };
    let rate = match get(ENV_MIN_RATE) {
        None => None,
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n >= 1 => Some(n),
            _ => {
                return Err(bad(
                    ENV_MIN_RATE,
                    &v,
                    "a rate in bytes per second (a whole number, at least 1)",
                ))
            }
        },
    };
    let window = match get(ENV_RATE_WINDOW) {
        None => None,
        Some(v) => match v.parse::<f64>() {
            Ok(s) if s.is_finite() && s > 0.0 && s <= 86_400.0 => Some(Duration::from_secs_f64(s)),
            _ => {
                return Err(bad(
                    ENV_RATE_WINDOW,
                    &v,
                    "a number of seconds above 0 and at most 86400",
                ))
            }
        },
    };
    Ok((rate, window))
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

/// Stops a transfer that moves fewer than `min_rate` bytes per second over a window: the
/// clock starts at the first byte, and each time a window has passed the bytes it moved are
/// checked, so a registry that trickles (a byte a second, or just under the rate) is cut off
/// after at most two windows, whatever size it declared. The error is a `TimedOut` I/O error
/// (a timeout for the retry rules) naming the rate.
#[derive(Debug, Clone)]
pub(crate) struct RateGuard {
    min_rate: u64,
    window: Duration,
    start: Option<Instant>,
    bytes: u64,
}

impl RateGuard {
    pub(crate) fn new(min_rate: u64, window: Duration) -> RateGuard {
        RateGuard {
            min_rate: min_rate.max(1),
            window,
            start: None,
            bytes: 0,
        }
    }

    /// Count `n` more bytes moved now.
    pub(crate) fn tick(&mut self, n: u64) -> std::io::Result<()> {
        self.tick_at(n, Instant::now())
    }

    fn tick_at(&mut self, n: u64, now: Instant) -> std::io::Result<()> {
        let start = *self.start.get_or_insert(now);
        self.bytes = self.bytes.saturating_add(n);
        let elapsed = now.saturating_duration_since(start);
        if elapsed < self.window {
            return Ok(());
        }
        let need = (self.min_rate as f64 * elapsed.as_secs_f64()) as u64;
        if self.bytes < need {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "{} bytes moved in {:.1} s, below the minimum rate of {} bytes/s ({ENV_MIN_RATE}, over {ENV_RATE_WINDOW}={} s)",
                    self.bytes,
                    elapsed.as_secs_f64(),
                    self.min_rate,
                    self.window.as_secs_f64()
                ),
            ));
        }
        self.start = Some(now);
        self.bytes = 0;
        Ok(())
    }
}

/// A reader whose bytes go through a [`RateGuard`].
pub(crate) struct Guarded<R> {
    pub inner: R,
    pub guard: RateGuard,
}

impl<R: Read> Read for Guarded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.guard.tick(n as u64)?;
        Ok(n)
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

    /// Send with retries on connection errors, 408, 429 and 5xx. Other statuses (including the
    /// last retryable one) are returned for the caller to judge.
    pub fn send(&self, req: &Req, scopes: &[String]) -> Result<Resp> {
        let mut attempt = 0;
        let mut timeouts = 0;
        loop {
            attempt += 1;
            if self.out_of_time() {
                return Err(Error::Transport {
                    method: req.method.to_string(),
                    url: strip_query(&req.url),
                    source: Box::new(ureq::Error::Timeout(ureq::Timeout::Global)),
                });
            }
            let last = attempt >= self.opts.max_attempts;
            let result = self.attempt(req, scopes);
            if matches!(result, Err(ureq::Error::Timeout(_))) {
                timeouts += 1;
            }
            let last = last || timeouts >= MAX_TIMEOUTS || self.out_of_time();
            match result {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    if !retryable_status(status) || last {
                        return Ok(resp);
                    }
                    let wait = retry_after(&resp);
                    if status == 429 {
                        // A registry that asks for a longer wait than is worth it: its answer
                        // (with the limit it names) is the caller's error, now.
                        if wait.is_some_and(|w| w > MAX_RETRY_AFTER) {
                            return Ok(resp);
                        }
                        self.opts.notify.say(&format!(
                            "{} is rate limiting ({} {}): waiting {} before try {} of {}{}",
                            self.registry,
                            req.method,
                            strip_query(&req.url),
                            wait.map_or("a backoff".to_string(), |w| format!(
                                "{} s (Retry-After)",
                                w.as_secs()
                            )),
                            attempt + 1,
                            self.opts.max_attempts,
                            rate_limit_detail(&resp).map_or(String::new(), |d| format!("; {d}"))
                        ));
                    }
                    self.pause(attempt, wait);
                }
                // A TLS registry sending the client to plain HTTP: refused, and said so.
                Err(ureq::Error::RequireHttpsOnly(why)) => {
                    return Err(Error::Protocol {
                        what: format!("{} {}", req.method, strip_query(&req.url)),
                        reason: downgrade_reason(why),
                    })
                }
                // A registry sending the client to an address it may not go to.
                Err(ureq::Error::Io(e)) if e.get_ref().is_some_and(|i| i.is::<Refused>()) => {
                    return Err(Error::Protocol {
                        what: format!("{} {}", req.method, strip_query(&req.url)),
                        reason: e.to_string(),
                    })
                }
                Err(e) if !last && retryable_error(&e) => self.pause(attempt, None),
                Err(e) => {
                    return Err(Error::Transport {
                        method: req.method.to_string(),
                        url: strip_query(&req.url),
                        source: Box::new(e),
                    })
                }
            }
        }
    }

    /// Sleep before retry number `attempt` (1-based): `Retry-After` when the server gave one
    /// (capped at a minute), else exponential backoff with jitter.
    pub(crate) fn pause(&self, attempt: u32, retry_after: Option<Duration>) {
        let wait = match retry_after {
            Some(d) => d.min(MAX_RETRY_AFTER),
            None => {
                let exp = self
                    .opts
                    .backoff_base
                    .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
                    .min(self.opts.backoff_max);
                // "Equal jitter": half fixed, half random, so parallel uploads spread out.
                let half = exp / 2;
                half + half.mul_f64(self.random_unit())
            }
        };
        std::thread::sleep(self.time_left().map_or(wait, |left| wait.min(left)));
    }

    /// True once [`ClientOptions::deadline`] has passed.
    fn out_of_time(&self) -> bool {
        self.time_left().is_some_and(|d| d.is_zero())
    }

    pub fn max_attempts(&self) -> u32 {
        self.opts.max_attempts
    }

    fn random_unit(&self) -> f64 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        // xorshift64
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
    }

    /// One try, with authentication: a 401 is answered by (re)authenticating and resending
    /// once. Transport errors are returned as they are.
    pub fn attempt(&self, req: &Req, scopes: &[String]) -> std::result::Result<Resp, ureq::Error> {
        let resp = self.run_once(req, scopes)?;
        // Authentication happens only with the registry itself.
        if resp.status().as_u16() != 401 || !self.same_origin(&req.url) {
            return Ok(resp);
        }
        let challenge = resp
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(parse_challenge);
        let Some(challenge) = challenge else {
            return Ok(resp);
        };
        match challenge {
            Challenge::Basic => {
                if self
                    .credential
                    .as_ref()
                    .and_then(Credential::basic_header)
                    .is_none()
                {
                    return Ok(resp);
                }
                {
                    let mut mode = self.mode.lock().unwrap_or_else(|p| p.into_inner());
                    if matches!(*mode, AuthMode::Basic) {
                        return Ok(resp); // credentials already sent and refused
                    }
                    *mode = AuthMode::Basic;
                }
                let again = self.run_once(req, scopes)?;
                if again.status().is_success() {
                    self.presented
                        .store(true, std::sync::atomic::Ordering::Relaxed);
                }
                return Ok(again);
            }
            Challenge::Bearer {
                realm,
                service,
                scope,
            } => {
                let mut all: Vec<String> = scopes.to_vec();
                if let Some(s) = scope {
                    for one in s.split(' ') {
                        if !all.iter().any(|x| x == one) {
                            all.push(one.to_string());
                        }
                    }
                }
                *self.mode.lock().unwrap_or_else(|p| p.into_inner()) = AuthMode::Bearer {
                    realm: realm.clone(),
                    service: service.clone(),
                };
                match self.fetch_token(&realm, service.as_deref(), &all) {
                    Ok(token) => {
                        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
                        tokens.insert(scope_key(scopes), token.clone());
                        tokens.insert(scope_key(&all), token);
                    }
                    // Not a refusal of the credentials: the realm itself is refused.
                    Err(e @ ureq::Error::RequireHttpsOnly(_)) => return Err(e),
                    Err(ureq::Error::Io(e)) if e.get_ref().is_some_and(|i| i.is::<Refused>()) => {
                        return Err(ureq::Error::Io(e))
                    }
                    Err(_) => return Ok(resp),
                }
            }
        }
        self.run_once(req, scopes)
    }

    fn auth_header(&self, scopes: &[String]) -> Option<String> {
        let mode = self.mode.lock().unwrap_or_else(|p| p.into_inner());
        match &*mode {
            AuthMode::Anonymous => None,
            AuthMode::Basic => self.credential.as_ref().and_then(Credential::basic_header),
            AuthMode::Bearer { realm, service } => {
                let key = scope_key(scopes);
                if let Some(t) = self
                    .tokens
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                {
                    return Some(format!("Bearer {t}"));
                }
                let (realm, service) = (realm.clone(), service.clone());
                drop(mode);
                // A new scope set: get its token up front instead of collecting a 401 first,
                // once, however many upload threads ask at the same moment.
                let _single = self.token_fetch.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(t) = self
                    .tokens
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get(&key)
                {
                    return Some(format!("Bearer {t}"));
                }
                let token = self.fetch_token(&realm, service.as_deref(), scopes).ok()?;
                self.tokens
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(key, token.clone());
                Some(format!("Bearer {token}"))
            }
        }
    }

    /// The credentials a token endpoint gets: the registry's own when `realm` is on its origin
    /// (or is Docker Hub's token service, for Docker Hub); for a realm elsewhere, only those
    /// configured for the realm's own host (`infer-build login HOST`), looked up once.
    fn realm_credential(&self, realm: &str) -> Option<Credential> {
        if self.realm_gets_credentials(realm) {
            return self.credential.clone();
        }
        let host = realm_host(realm)?;
        let mut cache = self
            .realm_credentials
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let own = cache
            .entry(host.clone())
            .or_insert_with(|| self.opts.keychain.lookup(&host).ok().flatten())
            .clone();
        if own.is_none() && self.credential.is_some() {
            *self
                .withheld_realm
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(host);
        }
        own
    }

    /// True when the registry's credentials may go to the token endpoint `realm`: it is on the
    /// registry's own origin, or it is Docker Hub's token service for Docker Hub.
    ///
    /// Also a realm whose host the user paired with this registry in [`ENV_REALMS`], over
    /// https only.
    fn realm_gets_credentials(&self, realm: &str) -> bool {
        self.same_origin(realm)
            || (self.registry == super::reference::DOCKER_HUB_API
                && origin(realm).is_some_and(|o| origin(DOCKER_HUB_REALM) == Some(o)))
            || realm_host(realm).is_some_and(|host| {
                realm.starts_with("https://")
                    && self
                        .opts
                        .trusted_realms
                        .iter()
                        .any(|(r, h)| self.registry == r.as_str() && h == &host)
            })
    }

    /// Ask the token endpoint for a token covering `scopes`. The registry's credentials go
    /// with the request only when [`Client::realm_gets_credentials`]; otherwise the token is
    /// asked for anonymously. A plain-HTTP realm of a TLS registry is refused.
    fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scopes: &[String],
    ) -> std::result::Result<String, ureq::Error> {
        if !self.opts.insecure && !realm.starts_with("https://") {
            return Err(ureq::Error::RequireHttpsOnly(format!(
                "the TLS registry {} names the token realm `{}`: realm scheme downgrade to plain HTTP refused (nothing was sent to it)",
                self.registry,
                strip_query(realm)
            )));
        }
        let credential = self.realm_credential(realm);
        let credential = credential.as_ref();
        let mut last_err = None;
        for attempt in 1..=self.opts.max_attempts.min(4) {
            if self.out_of_time() {
                break;
            }
            let resp = match credential {
                Some(Credential::IdentityToken(refresh)) => {
                    let mut form = vec![
                        ("grant_type", "refresh_token".to_string()),
                        ("refresh_token", refresh.clone()),
                        ("client_id", "infer-build".to_string()),
                        ("scope", scopes.join(" ")),
                    ];
                    if let Some(s) = service {
                        form.push(("service", s.to_string()));
                    }
                    let mut r = self.agent.post(realm);
                    if let Some(left) = self.time_left() {
                        r = r.config().timeout_global(Some(left)).build();
                    }
                    r.send_form(form)
                }
                other => {
                    let mut r = self.agent.get(realm);
                    if let Some(left) = self.time_left() {
                        r = r.config().timeout_global(Some(left)).build();
                    }
                    if let Some(s) = service {
                        r = r.query("service", s);
                    }
                    for s in scopes {
                        r = r.query("scope", s);
                    }
                    if let Some(h) = other.and_then(|c| c.basic_header()) {
                        r = r.header("authorization", h);
                    }
                    r.call()
                }
            };
            match resp {
                Ok(mut resp) if resp.status().is_success() => {
                    #[derive(serde::Deserialize)]
                    struct Token {
                        token: Option<String>,
                        access_token: Option<String>,
                    }
                    let body = resp
                        .body_mut()
                        .with_config()
                        .limit(MAX_TOKEN)
                        .read_to_vec()?;
                    let t: Token = serde_json::from_slice(&body).map_err(|_| {
                        ureq::Error::BadUri(
                            "token endpoint answered something that is not JSON".into(),
                        )
                    })?;
                    let token = t.token.or(t.access_token).ok_or_else(|| {
                        ureq::Error::BadUri("token endpoint answered without a token".into())
                    })?;
                    if credential.is_some() {
                        self.presented
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    return Ok(token);
                }
                Ok(resp) if retryable_status(resp.status().as_u16()) => {
                    self.pause(attempt, retry_after(&resp));
                    last_err = Some(ureq::Error::StatusCode(resp.status().as_u16()));
                }
                Ok(resp) => return Err(ureq::Error::StatusCode(resp.status().as_u16())),
                Err(e) if retryable_error(&e) && !matches!(e, ureq::Error::Timeout(_)) => {
                    self.pause(attempt, None);
                    last_err = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_err.unwrap_or(ureq::Error::StatusCode(503)))
    }

    fn run_once(&self, req: &Req, scopes: &[String]) -> std::result::Result<Resp, ureq::Error> {
        let mut builder = http::Request::builder()
            .method(req.method.clone())
            .uri(&req.url);
        for (k, v) in &req.headers {
            builder = builder.header(*k, v);
        }
        if self.same_origin(&req.url) {
            if let Some(h) = self.auth_header(scopes) {
                builder = builder.header("authorization", h);
            }
        } else if !self.opts.insecure && !req.url.starts_with("https://") {
            return Err(ureq::Error::RequireHttpsOnly(format!(
                "the TLS registry {} sent the client to `{}`: scheme downgrade to plain HTTP refused",
                self.registry,
                strip_query(&req.url)
            )));
        }
        // The total deadline: the base budget plus the bytes carried at the slowest rate.
        // Bodies are also held to the rate over each window ([`RateGuard`]), and the answer
        // must start within `request_timeout` of the request being sent, whatever its size.
        let bytes = req.body.len().saturating_add(req.expect_bytes);
        let mut total = self
            .opts
            .request_timeout
            .saturating_add(Duration::from_secs(bytes / self.opts.min_rate.max(1)));
        let mut answer = self.opts.request_timeout;
        if let Some(left) = self.time_left() {
            total = total.min(left);
            answer = answer.min(left);
        }
        // A body that stalls on one write for a whole window moved nothing in it.
        let write_idle = self.opts.idle_timeout.min(self.opts.rate_window);
        macro_rules! run {
            ($r:expr, $with_body:expr) => {{
                let c = self
                    .agent
                    .configure_request($r)
                    .timeout_global(Some(total))
                    .timeout_recv_response(Some(answer));
                let c = if $with_body {
                    c.timeout_per_write(Some(write_idle))
                } else {
                    c
                };
                self.agent.run(c.build())
            }};
        }
        match &req.body {
            Body::Empty => {
                let with_body = matches!(req.method, Method::POST | Method::PUT | Method::PATCH);
                if with_body {
                    builder = builder.header("content-length", "0");
                }
                let r = builder
                    .body(())
                    .map_err(|e| ureq::Error::BadUri(e.to_string()))?;
                run!(r, false)
            }
            Body::Bytes(b) => {
                let r = builder
                    .header("content-length", b.len().to_string())
                    .body(*b)
                    .map_err(|e| ureq::Error::BadUri(e.to_string()))?;
                run!(r, true)
            }
            Body::File {
                file,
                offset,
                len,
                progress,
            } => {
                let mut reader = Guarded {
                    inner: Counting {
                        inner: At {
                            file,
                            pos: *offset,
                            end: offset.saturating_add(*len),
                        },
                        progress: *progress,
                    },
                    guard: self.rate_guard(),
                };
                let r = builder
                    .header("content-length", len.to_string())
                    .header("content-type", "application/octet-stream")
                    .body(SendBody::from_reader(&mut reader))
                    .map_err(|e| ureq::Error::BadUri(e.to_string()))?;
                run!(r, true)
            }
        }
    }
}

/// Positioned reads of `file` from `pos` to `end`: each request body has its own cursor on a
/// shared, already verified handle.
struct At<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt as _;
        let want = (self.end - self.pos).min(buf.len() as u64) as usize;
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the blob file ended before its size",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

struct Counting<'a, R> {
    inner: R,
    progress: Option<&'a (dyn Fn(u64) + Sync)>,
}

impl<R: Read> Read for Counting<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if let Some(p) = self.progress {
            p(n as u64);
        }
        Ok(n)
    }
}

fn scope_key(scopes: &[String]) -> String {
    let mut s = scopes.to_vec();
    s.sort();
    s.join(" ")
}

/// The host (and port) of a token realm URL, canonical ([`RegistryHost`]); `None` for one with
/// user info or no host.
fn realm_host(realm: &str) -> Option<String> {
    let host = realm.split_once("://")?.1.split(['/', '?', '#']).next()?;
    if host.contains('@') {
        return None;
    }
    RegistryHost::parse(host).ok().map(|h| h.to_string())
}

/// The refusal of an address a registry sent the client to, carried inside the I/O error the
/// resolver returns (so it is not retried) and shown as the reason.
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// The name resolver of one registry's agent: the system's, plus the decision on where the
/// registry may send the client ([`redirect_refusal`]). The registry's own host goes wherever
/// it resolves (the user named it), and its addresses are remembered; any other host (a
/// redirect, an upload location, a token realm) is refused when one of its addresses is
/// link-local, loopback other than the registry's, private while the registry is not, or
/// not a host address at all. Deciding on the resolved addresses, before connecting, also
/// covers a name that resolves somewhere it should not. A proxy the user configured is
/// theirs: it resolves the hosts it is asked for, so through one only the proxy is resolved
/// here.
#[derive(Debug)]
struct GuardedResolver {
    registry: Host,
    /// The registry's name, for messages.
    shown: String,
    own: Mutex<Vec<std::net::IpAddr>>,
}

impl ureq::unversioned::resolver::Resolver for GuardedResolver {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> std::result::Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        use ureq::unversioned::resolver::{DefaultResolver, Resolver};
        let addrs = Resolver::resolve(&DefaultResolver::default(), uri, config, timeout)?;
        let host = uri.host().unwrap_or("");
        let port = uri.port_u16();
        if config
            .proxy()
            .is_some_and(|p| p.host() == host && port.unwrap_or(p.port()) == p.port())
        {
            return Ok(addrs);
        }
        let ips: Vec<std::net::IpAddr> = addrs.iter().map(|a| a.ip()).collect();
        let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
        if Host::parse(host).is_ok_and(|h| h == self.registry) {
            for ip in ips {
                if !own.contains(&ip) {
                    own.push(ip);
                }
            }
            return Ok(addrs);
        }
        if let Some(why) = ips.iter().find_map(|ip| redirect_refusal(*ip, &own)) {
            let place = match port {
                Some(p) => format!("{host}:{p}"),
                None => host.to_string(),
            };
            return Err(ureq::Error::Io(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                Refused(format!(
                    "the registry {} sent the client to {place}, and {why}: refused before connecting (redirects, upload locations and token realms may not lead to link-local or other loopback addresses, nor to private ones unless the registry is on a private network)",
                    self.shown
                )),
            )));
        }
        Ok(addrs)
    }
}

pub(crate) fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500 | 502 | 503 | 504)
}

pub(crate) fn retryable_error(e: &ureq::Error) -> bool {
    use std::io::ErrorKind as K;
    match e {
        // Dropped or refused connections are worth another try; TLS failures (bad
        // certificate: `InvalidData`) and the like are not.
        ureq::Error::Io(io) => matches!(
            io.kind(),
            K::ConnectionReset
                | K::ConnectionAborted
                | K::ConnectionRefused
                | K::BrokenPipe
                | K::UnexpectedEof
                | K::TimedOut
                | K::Interrupted
                | K::NotConnected
                | K::WouldBlock
        ),
        ureq::Error::Timeout(_)
        | ureq::Error::ConnectionFailed
        | ureq::Error::Protocol(_)
        | ureq::Error::BodyStalled => true,
        _ => false,
    }
}

/// True when a body read failed because a deadline passed (ureq wraps its `Timeout` in an
/// `io::Error`; the socket's own says `TimedOut`).
pub(crate) fn is_timeout(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::TimedOut
        || e.get_ref()
            .and_then(|x| x.downcast_ref::<ureq::Error>())
            .is_some_and(|u| matches!(u, ureq::Error::Timeout(_)))
}

/// `Retry-After` in seconds (the HTTP-date form is treated as "use the backoff").
pub(crate) fn retry_after(resp: &Resp) -> Option<Duration> {
    resp.headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// The error for an unexpected status, with the registry's error code and message when the
/// body is the distribution-spec error JSON.
pub(crate) fn status_error(method: &Method, url: &str, status: u16, mut resp: Resp) -> Error {
    let limits = if status == 429 {
        rate_limit_detail(&resp)
    } else {
        None
    };
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_ERROR_BODY)
        .read_to_vec()
        .unwrap_or_default();
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<OneError>,
    }
    #[derive(serde::Deserialize)]
    struct OneError {
        code: Option<String>,
        message: Option<String>,
    }
    let detail = serde_json::from_slice::<Errors>(&body)
        .ok()
        .map(|e| {
            e.errors
                .iter()
                .map(|x| {
                    format!(
                        "{}: {}",
                        x.code.as_deref().unwrap_or("ERROR"),
                        x.message.as_deref().unwrap_or("")
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .unwrap_or_default();
    let detail = match limits {
        None => detail,
        Some(l) if detail.is_empty() => format!("rate limited: {l}"),
        Some(l) => format!("{detail}; rate limited: {l}"),
    };
    Error::Status {
        method: method.to_string(),
        url: strip_query(url),
        status,
        detail,
    }
}

/// The rate-limit headers a registry sent (`RateLimit-Limit`, `RateLimit-Remaining`,
/// `RateLimit-Reset`, `Retry-After`, Docker Hub's `Docker-RateLimit-Source`), as
/// `Name: value` pairs; `None` when it sent none.
pub(crate) fn rate_limit_detail(resp: &Resp) -> Option<String> {
    let names = [
        ("ratelimit-limit", "RateLimit-Limit"),
        ("ratelimit-remaining", "RateLimit-Remaining"),
        ("ratelimit-reset", "RateLimit-Reset"),
        ("retry-after", "Retry-After"),
        ("docker-ratelimit-source", "Docker-RateLimit-Source"),
    ];
    let parts: Vec<String> = names
        .iter()
        .filter_map(|(h, shown)| {
            header(resp, h).map(|v| format!("{shown}: {}", v.chars().take(80).collect::<String>()))
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// The last byte of a `Range: 0-<last>` (or `bytes=0-<last>`) answer; `None` unless it starts
/// at 0 and both ends are numbers.
pub(crate) fn parse_range(r: &str) -> Option<u64> {
    let r = r.trim();
    let r = r.strip_prefix("bytes=").unwrap_or(r);
    let (first, last) = r.split_once('-')?;
    if first.trim() != "0" {
        return None;
    }
    last.trim().parse::<u64>().ok()
}

/// `scheme://host:port` of an absolute http(s) URL, lowercased, with the default port made
/// explicit; `None` for anything else.
pub(crate) fn origin(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    // Userinfo (`user@host`) is not a different origin trick we accept: refuse it.
    if authority.contains('@') || authority.is_empty() {
        return None;
    }
    let (host, port) = super::host::split_port(authority);
    let host = Host::parse(host).ok()?;
    let port = match port {
        Some(p) => super::host::parse_port(p).ok()?,
        None => default_port,
    };
    Some(format!("{scheme}://{host}:{port}"))
}

/// The reason of a refused downgrade: ours say it; ureq's (a redirect) give only the URL.
pub(crate) fn downgrade_reason(why: String) -> String {
    if why.contains("downgrade") {
        why
    } else {
        format!(
            "redirected to `{}`: scheme downgrade to plain HTTP refused",
            strip_query(&why)
        )
    }
}

/// URLs of upload sessions carry opaque state in their query: keep errors short and free of it.
fn strip_query(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_string()
}

fn load_certs(path: &Path) -> Result<Vec<Certificate<'static>>> {
    let pem = std::fs::read(path).map_err(|e| Error::CaCert {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(ureq::tls::PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => {
                return Err(Error::CaCert {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })
            }
        }
    }
    if certs.is_empty() {
        return Err(Error::CaCert {
            path: path.to_path_buf(),
            reason: "no PEM certificate in the file".into(),
        });
    }
    Ok(certs)
}

/// A response header as a string.
pub(crate) fn header<'r>(resp: &'r Resp, name: &str) -> Option<&'r str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// Append `key=value` to a URL that may already have a query.
pub(crate) fn with_query(url: &str, key: &str, value: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{key}={}", encode_query(value))
}

fn encode_query(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_realms_are_registry_host_pairs() {
        let env = |v: &'static str| move |k: &str| (k == ENV_REALMS).then(|| v.to_string());
        assert_eq!(trusted_realms_from(&|_: &str| None).unwrap(), vec![]);
        assert_eq!(
            trusted_realms_from(&env(
                " Registry.GitLab.example.com=gitlab.example.com , docker.io=login.example:8443,"
            ))
            .unwrap(),
            vec![
                (
                    "registry.gitlab.example.com".to_string(),
                    "gitlab.example.com".to_string()
                ),
                // Docker Hub's name stands for its API host, the client's registry.
                (
                    "registry-1.docker.io".to_string(),
                    "login.example:8443".to_string()
                ),
            ]
        );
        // Both sides canonical: the pair matches the registry and realm however spelled.
        assert_eq!(
            trusted_realms_from(&env("127.1:5301=Auth.Example.:443")).unwrap(),
            vec![("127.0.0.1:5301".to_string(), "auth.example".to_string())]
        );
        for bad in [
            "r.io",
            "=h",
            "r.io=",
            "r.io=https://h/x",
            "u@r.io=h",
            "r.io=h:99999",
            "r.io#x=h",
        ] {
            let e = trusted_realms_from(&env(bad)).unwrap_err();
            assert!(
                e.is_bad_input() && e.to_string().contains(ENV_REALMS),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn query_building() {
        assert_eq!(
            with_query(
                "http://h/v2/x/blobs/uploads/u?_state=a",
                "digest",
                "sha256:ab"
            ),
            "http://h/v2/x/blobs/uploads/u?_state=a&digest=sha256%3Aab"
        );
        assert_eq!(with_query("/u", "from", "a/b"), "/u?from=a%2Fb");
        assert_eq!(strip_query("http://h/u?_state=secret"), "http://h/u");
    }

    #[test]
    fn ranges() {
        assert_eq!(parse_range("0-49"), Some(49));
        assert_eq!(parse_range("bytes=0-1023"), Some(1023));
        assert_eq!(parse_range(" 0-7 "), Some(7));
        for bad in ["", "10-20", "0-", "-5", "0-x", "0-18446744073709551616"] {
            assert_eq!(parse_range(bad), None, "{bad}");
        }
    }

    /// The parsers that read what a registry says, on mutated real answers: never a panic
    /// (the same inputs the fuzz target `fuzz/fuzz_targets/registry_response.rs` explores).
    #[test]
    fn mutated_registry_answers_never_panic() {
        let seeds: [&[u8]; 6] = [
            br#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:a/b:pull,push""#,
            br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a","size":2},"layers":[]}"#,
            br#"{"auths":{"https://r.io/v1/":{"auth":"dTpw"}},"credsStore":"x","credHelpers":{"q.io":"y"}}"#,
            b"bytes=0-1048575",
            b"https://[::1]:5000/v2/x/blobs/uploads/abc?_state=1",
            br#"{"errors":[{"code":"DENIED","message":"no"}]}"#,
        ];
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for seed in seeds {
            for _ in 0..2000 {
                let mut b = seed.to_vec();
                for _ in 0..(1 + next() % 4) {
                    let i = (next() % (b.len() as u64 + 1)) as usize;
                    match next() % 3 {
                        0 if i < b.len() => b[i] = next() as u8,
                        1 if i < b.len() => {
                            b.remove(i);
                        }
                        _ => b.insert(i, next() as u8),
                    }
                }
                super::super::fuzz_registry_response(&b);
            }
        }
    }

    #[test]
    fn origins() {
        for (url, want) in [
            ("https://r.io/v2/", Some("https://r.io:443")),
            ("https://R.io:443/x?y", Some("https://r.io:443")),
            ("http://127.0.0.1:5000/v2/x", Some("http://127.0.0.1:5000")),
            ("http://[::1]:5000/v2/", Some("http://[::1]:5000")),
            ("http://[::1]/v2/", Some("http://[::1]:80")),
            ("https://user@evil.io/", None),
            ("ftp://r.io/", None),
            ("/v2/relative", None),
            ("https://r.io:99999/", None),
            // One origin however the host is spelled.
            ("http://127.1:5000/v2/", Some("http://127.0.0.1:5000")),
            (
                "http://[::ffff:127.0.0.1]:5000/",
                Some("http://127.0.0.1:5000"),
            ),
            ("https://R.io.:443/", Some("https://r.io:443")),
        ] {
            assert_eq!(origin(url).as_deref(), want, "{url}");
        }
        assert_ne!(origin("https://r.io/"), origin("http://r.io:443/"));
        assert_ne!(origin("https://r.io/"), origin("https://r.io:8443/"));
    }

    #[test]
    fn rate_guard_cuts_a_trickle_and_lets_a_transfer_at_the_rate_through() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // 1000 B/s over 1 s windows: a byte a second fails at the end of the first window.
        let mut g = RateGuard::new(1000, Duration::from_secs(1));
        g.tick_at(1, at(0)).unwrap();
        g.tick_at(1, at(500)).unwrap();
        let e = g.tick_at(1, at(1000)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(
            e.to_string().contains("minimum rate of 1000 bytes/s"),
            "{e}"
        );
        // At the rate, window after window: never stopped.
        let mut g = RateGuard::new(1000, Duration::from_secs(1));
        for i in 0..50 {
            g.tick_at(100, at(i * 100)).unwrap();
        }
        // A fast start banks nothing for a trickle later: each window is judged alone.
        let mut g = RateGuard::new(1000, Duration::from_secs(1));
        g.tick_at(1 << 20, at(0)).unwrap();
        g.tick_at(1, at(1000)).unwrap();
        g.tick_at(1, at(1900)).unwrap();
        assert!(g.tick_at(1, at(2000)).is_err());
    }

    #[test]
    fn rate_settings_from_the_environment() {
        let env = crate::registry::test_env;
        assert_eq!(rate_limits_from(&env(&[])).unwrap(), (None, None));
        assert_eq!(
            rate_limits_from(&env(&[(ENV_MIN_RATE, "1000"), (ENV_RATE_WINDOW, "0.5")])).unwrap(),
            (Some(1000), Some(Duration::from_millis(500)))
        );
        for (k, v) in [
            (ENV_MIN_RATE, "0"),
            (ENV_MIN_RATE, "fast"),
            (ENV_MIN_RATE, "-1"),
            (ENV_RATE_WINDOW, "0"),
            (ENV_RATE_WINDOW, "inf"),
            (ENV_RATE_WINDOW, "NaN"),
            (ENV_RATE_WINDOW, "1e9"),
        ] {
            let pairs: &'static [(&'static str, &'static str)] = Box::leak(Box::new([(k, v)]));
            let e = rate_limits_from(&env(pairs)).unwrap_err();
            assert!(
                e.is_bad_input() && e.to_string().contains(k),
                "{k}={v}: {e}"
            );
        }
    }

    #[test]
    fn statuses_that_retry() {
        for (s, r) in [
            (429, true),
            (500, true),
            (503, true),
            (404, false),
            (401, false),
            (201, false),
        ] {
            assert_eq!(retryable_status(s), r, "{s}");
        }
    }
}
