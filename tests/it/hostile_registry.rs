//! A hostile registry for tests: an HTTP/1.1 server on 127.0.0.1 (plain, or TLS with a test
//! CA) whose every answer comes from a handler, so a test can send what a real registry never
//! would: token realms and upload locations on other origins, redirects from TLS to plain
//! HTTP, `Range` headers that never move, headers then silence, bodies that trickle or run past
//! their descriptor, request bodies read a byte at a time ([`Hostile::start_slow_reader`]). It
//! records every request (method, target, headers, body size) for the
//! test to check what the client sent where. One request per connection.

#![allow(
    dead_code,
    reason = "shared by test modules; not every test binary uses every helper"
)]

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::support::Server;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub method: String,
    /// The request target: path and query.
    pub target: String,
    /// Header names lowercased.
    pub headers: Vec<(String, String)>,
    pub body_len: u64,
}

impl Seen {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
    pub(crate) fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }
}

/// What the server does with a request.
pub(crate) enum Reply {
    /// Status, headers and a body (Content-Length is added).
    Respond {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// Status and headers announcing `len` body bytes, then nothing until the client leaves.
    HeadersThenSilence {
        status: u16,
        headers: Vec<(String, String)>,
        len: u64,
    },
    /// No answer at all until the client leaves.
    Silence,
    /// Status, headers and `body`, one byte every `every`.
    Trickle {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        every: Duration,
    },
}

impl Reply {
    pub(crate) fn status(status: u16) -> Reply {
        Reply::Respond {
            status,
            headers: Vec::new(),
            body: Vec::new(),
        }
    }
    pub(crate) fn with(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Reply {
        Reply::Respond {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec(),
        }
    }
}

type Handler = dyn Fn(&Seen) -> Reply + Send + Sync;

pub(crate) struct Hostile {
    /// `127.0.0.1:PORT`
    pub addr: String,
    /// Every request, in arrival order.
    pub seen: Arc<Mutex<Vec<Seen>>>,
    _server: Server,
}

impl Hostile {
    /// Plain HTTP.
    pub(crate) fn start(handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Hostile {
        Self::spawn(None, Arc::new(handler), None)
    }

    /// Plain HTTP, reading every request body longer than `over` bytes one byte per `every`
    /// (a registry that trickles what it takes); the handler answers once the body is in.
    pub(crate) fn start_slow_reader(
        over: u64,
        every: Duration,
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Hostile {
        Self::spawn(None, Arc::new(handler), Some((over, every)))
    }

    /// TLS with `cert` (PEM chain) and `key` (PEM private key), e.g. from
    /// `registry_support::test_ca`.
    pub(crate) fn start_tls(
        cert: &Path,
        key: &Path,
        handler: impl Fn(&Seen) -> Reply + Send + Sync + 'static,
    ) -> Hostile {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let pem = std::fs::read(cert).unwrap();
        let certs: Vec<CertificateDer<'static>> = ureq::tls::parse_pem(&pem)
            .filter_map(|i| match i.unwrap() {
                ureq::tls::PemItem::Certificate(c) => Some(CertificateDer::from(c.der().to_vec())),
                _ => None,
            })
            .collect();
        let k = ureq::tls::PrivateKey::from_pem(&std::fs::read(key).unwrap()).unwrap();
        let key = PrivateKeyDer::try_from(k.der().to_vec()).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        Self::spawn(Some(Arc::new(config)), Arc::new(handler), None)
    }

    fn spawn(
        tls: Option<Arc<rustls::ServerConfig>>,
        handler: Arc<Handler>,
        slow: Option<(u64, Duration)>,
    ) -> Hostile {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen2 = seen.clone();
        let server = Server::start(move |conn, stop| {
            let (seen, handler) = (&seen2, &*handler);
            let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
            match tls.clone() {
                Some(config) => {
                    let Ok(server) = rustls::ServerConnection::new(config) else {
                        return;
                    };
                    let mut s = rustls::StreamOwned::new(server, conn);
                    let _ = serve(&mut s, seen, stop, handler, slow);
                }
                None => {
                    let mut s = conn;
                    let _ = serve(&mut s, seen, stop, handler, slow);
                }
            }
        });
        Hostile {
            addr: server.addr.clone(),
            seen,
            _server: server,
        }
    }

    /// The requests seen so far.
    pub(crate) fn requests(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(
    s: &mut (impl Read + Write),
    seen: &Mutex<Vec<Seen>>,
    stop: &AtomicBool,
    handler: &Handler,
    slow: Option<(u64, Duration)>,
) -> std::io::Result<()> {
    let Some((buf, head_end)) = super::support::read_request_head(s)? else {
        return Ok(());
    };
    let mut tmp = [0u8; 16384];
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_string();
    let target = first.next().unwrap_or("").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let len: u64 = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    // Read (and discard) the request body: a byte per `every` when it is long and this is a
    // slow reader.
    let mut got = (buf.len() - head_end) as u64;
    let every = slow.filter(|(over, _)| len > *over).map(|(_, every)| every);
    while got < len {
        if let Some(every) = every {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            std::thread::sleep(every);
        }
        let most = if every.is_some() { 1 } else { 16384 };
        let n = s.read(&mut tmp[..((len - got).min(most)) as usize])?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let req = Seen {
        method,
        target,
        headers,
        body_len: got,
    };
    seen.lock().unwrap().push(req.clone());
    let head_of = |status: u16, headers: &[(String, String)], len: u64| {
        let mut h =
            format!("HTTP/1.1 {status} X\r\nContent-Length: {len}\r\nConnection: close\r\n");
        for (k, v) in headers {
            h.push_str(&format!("{k}: {v}\r\n"));
        }
        h.push_str("\r\n");
        h
    };
    let hold = || {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    match handler(&req) {
        Reply::Respond {
            status,
            headers,
            body,
        } => {
            s.write_all(head_of(status, &headers, body.len() as u64).as_bytes())?;
            s.write_all(&body)?;
            s.flush()?;
        }
        Reply::HeadersThenSilence {
            status,
            headers,
            len,
        } => {
            s.write_all(head_of(status, &headers, len).as_bytes())?;
            s.flush()?;
            hold();
        }
        Reply::Silence => hold(),
        Reply::Trickle {
            status,
            headers,
            body,
            every,
        } => {
            s.write_all(head_of(status, &headers, body.len() as u64).as_bytes())?;
            s.flush()?;
            for b in body {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                s.write_all(&[b])?;
                s.flush()?;
                std::thread::sleep(every);
            }
        }
    }
    Ok(())
}
