//! The transport: one HTTP exchange ([`Client::run_once`]: deadlines, bodies streamed from
//! verified files, no credentials off the registry's origin), the name resolver that refuses
//! where a registry may not send the client, TLS roots, and the URL and header helpers.

use super::*;

impl Client {
    pub(super) fn run_once(
        &self,
        req: &Req,
        scopes: &[String],
    ) -> std::result::Result<Resp, ureq::Error> {
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
pub(super) struct At<'a> {
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

pub(super) struct Counting<'a, R> {
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

/// The refusal of an address a registry sent the client to, carried inside the I/O error the
/// resolver returns (so it is not retried) and shown as the reason.
#[derive(Debug)]
pub(super) struct Refused(String);

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
pub(super) struct GuardedResolver {
    pub(super) registry: Host,
    /// The registry's name, for messages.
    pub(super) shown: String,
    pub(super) own: Mutex<Vec<std::net::IpAddr>>,
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
    let (host, port) = super::super::host::split_port(authority);
    let host = Host::parse(host).ok()?;
    let port = match port {
        Some(p) => super::super::host::parse_port(p).ok()?,
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
pub(super) fn strip_query(url: &str) -> String {
    url.split('?').next().unwrap_or(url).to_string()
}

pub(super) fn load_certs(path: &Path) -> Result<Vec<Certificate<'static>>> {
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

pub(super) fn encode_query(v: &str) -> String {
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
                crate::registry::fuzz_registry_response(&b);
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
}
