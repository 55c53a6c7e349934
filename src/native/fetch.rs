//! Downloading a pinned file: one plain `GET`, no credentials, no cookies, no redirect
//! followed (the file host answers directly; a redirect elsewhere is refused, never chased),
//! TLS only unless the caller allows plain HTTP (tests on loopback), with connect, idle and
//! total deadlines, the size bounded by the pin and the sha256 checked while streaming into a
//! temp file that is renamed into place only when it matches.

use std::path::Path;
use std::time::Duration;

use super::{spool, Error, Result};
use crate::oci::Dir;

/// How a download connects.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// Allow `http://` URLs (tests against a loopback server). Never the default.
    pub allow_http: bool,
    pub connect_timeout: Duration,
    /// No byte for this long fails the download.
    pub idle_timeout: Duration,
    /// The slowest transfer accepted, bytes per second: the total deadline is
    /// `120 s + size / min_rate`.
    pub min_rate: u64,
    /// Tries (first included) on connection errors and 5xx answers.
    pub max_attempts: u32,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            allow_http: false,
            connect_timeout: Duration::from_secs(15),
            idle_timeout: Duration::from_secs(60),
            min_rate: 64 << 10,
            max_attempts: 4,
        }
    }
}

/// Download `url` into `dest/name`, checking that it is `size` bytes (when given, else at most
/// [`super::MAX_WHEEL`]) hashing to `sha256` (hex). Returns the bytes downloaded.
pub(crate) fn download(
    url: &str,
    sha256: &str,
    size: Option<u64>,
    tmp: &Dir,
    dest: &Dir,
    name: &str,
    opts: &Options,
) -> Result<u64> {
    let fail = |why: String| Error::Download {
        url: url.into(),
        why,
    };
    if !(url.starts_with("https://") || (opts.allow_http && url.starts_with("http://"))) {
        return Err(fail("only https:// URLs are fetched".into()));
    }
    let limit = size.unwrap_or(super::MAX_WHEEL).min(super::MAX_WHEEL);
    let total = Duration::from_secs(120) + Duration::from_secs(limit / opts.min_rate.max(1));
    let mut config = ureq::Agent::config_builder();
    // Trust as the registry client does: the certificates of $SSL_CERT_FILE when set (a
    // company proxy's CA), else the built-in web PKI roots.
    if let Some(path) = std::env::var_os("SSL_CERT_FILE").filter(|p| !p.is_empty()) {
        let pem = std::fs::read(&path).map_err(|e| {
            fail(format!(
                "cannot read SSL_CERT_FILE {}: {e}",
                Path::new(&path).display()
            ))
        })?;
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        if certs.is_empty() {
            return Err(fail(format!(
                "SSL_CERT_FILE {} holds no PEM certificate",
                Path::new(&path).display()
            )));
        }
        config = config.tls_config(
            ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::new_with_certs(&certs))
                .build(),
        );
    }
    let agent: ureq::Agent = config
        .http_status_as_error(false)
        .user_agent(concat!("infer-build/", env!("CARGO_PKG_VERSION")))
        .https_only(!opts.allow_http)
        // The pinned host serves the file itself: any redirect is refused, not followed.
        .max_redirects(0)
        .save_redirect_history(false)
        .timeout_connect(Some(opts.connect_timeout))
        .timeout_per_read(Some(opts.idle_timeout))
        .timeout_global(Some(total))
        .build()
        .new_agent();
    let mut last = String::new();
    for attempt in 1..=opts.max_attempts.max(1) {
        if attempt > 1 {
            std::thread::sleep(Duration::from_millis(250 << (attempt - 2).min(5)));
        }
        let resp = match agent.get(url).call() {
            Ok(r) => r,
            Err(e) => {
                last = e.to_string();
                continue;
            }
        };
        let status = resp.status().as_u16();
        if (300..400).contains(&status) {
            let to = resp
                .headers()
                .get("location")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-");
            return Err(fail(format!(
                "the server redirects ({status}) to {to}; pinned files are fetched only from \
                 the URL in the pin"
            )));
        }
        if status >= 500 || status == 429 || status == 408 {
            last = format!("HTTP {status}");
            continue;
        }
        if status != 200 {
            return Err(fail(format!("HTTP {status}")));
        }
        let body = resp
            .into_body()
            .into_with_config()
            .limit(limit.saturating_add(1))
            .reader();
        let (tmp_name, got, n) = match spool(body, tmp, ".download-", limit, |_| {}) {
            Ok(v) => v,
            Err((name, why)) => {
                if let Some(n) = name {
                    let _ = tmp.remove(&n);
                }
                last = why;
                continue;
            }
        };
        let wrong_size = size.is_some_and(|s| s != n);
        if got != sha256 || wrong_size {
            let _ = tmp.remove(&tmp_name);
            return Err(Error::Digest {
                url: url.into(),
                got: format!("{got} ({n} bytes)"),
                want: format!(
                    "{sha256}{}",
                    size.map(|s| format!(" ({s} bytes)")).unwrap_or_default()
                ),
            });
        }
        let res = tmp.rename(&tmp_name, dest, name);
        if res.is_err() {
            let _ = tmp.remove(&tmp_name);
        }
        res?;
        dest.sync();
        return Ok(n);
    }
    Err(fail(last))
}
