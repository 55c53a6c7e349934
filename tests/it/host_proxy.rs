//! An HTTP `CONNECT` proxy on loopback that stands in for DNS: the client is pointed at it with
//! `HTTPS_PROXY`/`HTTP_PROXY` (which the registry client honours, as curl and Docker do), asks
//! it for `registry-1.docker.io:80`, and is tunnelled to the loopback server the test mapped
//! to that name. So a test sees which host names the client really asks for, and can answer
//! as Docker Hub (registry, token service and CDN on their own hosts) without a network.
//! A name that is not mapped is refused with 502 and still recorded.

#![allow(
    dead_code,
    reason = "shared by test modules; not every test binary uses every helper"
)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::support::Server;

pub(crate) struct HostProxy {
    /// `127.0.0.1:PORT`, for `http://ADDR` in the proxy variables.
    pub addr: String,
    /// Every `CONNECT` target asked for (`host:port`), in order.
    pub asked: Arc<Mutex<Vec<String>>>,
    _server: Server,
}

impl HostProxy {
    /// Tunnel `host:port` → loopback address, for each pair of `map`.
    pub(crate) fn start(map: &[(&str, &str)]) -> HostProxy {
        let map: Arc<HashMap<String, String>> = Arc::new(
            map.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let server = Server::start(move |mut conn, _stop| {
            let _ = conn.set_read_timeout(Some(Duration::from_secs(30)));
            let Some(target) = read_connect(&mut conn) else {
                return;
            };
            seen.lock().unwrap().push(target.clone());
            let Some(upstream) = map.get(&target).and_then(|a| TcpStream::connect(a).ok()) else {
                let _ = conn.write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n");
                return;
            };
            if conn
                .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                .is_err()
            {
                return;
            }
            splice(conn, upstream);
        });
        HostProxy {
            addr: server.addr.clone(),
            asked,
            _server: server,
        }
    }

    pub(crate) fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }

    /// The environment that sends a client's connections through this proxy.
    pub(crate) fn env(&self) -> Vec<(&'static str, String)> {
        let url = format!("http://{}", self.addr);
        vec![
            ("HTTPS_PROXY", url.clone()),
            ("HTTP_PROXY", url.clone()),
            ("https_proxy", url.clone()),
            ("http_proxy", url),
            ("NO_PROXY", String::new()),
            ("no_proxy", String::new()),
        ]
    }
}

/// The `host:port` of a `CONNECT` request head, read to its blank line.
fn read_connect(conn: &mut TcpStream) -> Option<String> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 << 10 || conn.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let mut words = text.lines().next()?.split_whitespace();
    (words.next()? == "CONNECT").then(|| words.next().map(str::to_string))?
}

/// Copy both ways until either side closes.
fn splice(client: TcpStream, upstream: TcpStream) {
    let (mut c_read, mut u_write) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut c_read, &mut u_write);
        let _ = u_write.shutdown(Shutdown::Write);
    });
    let (mut u_read, mut c_write) = (upstream, client);
    let _ = std::io::copy(&mut u_read, &mut c_write);
    let _ = c_write.shutdown(Shutdown::Both);
    let _ = up.join();
}
