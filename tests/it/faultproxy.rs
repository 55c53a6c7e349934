//! A fault-injecting HTTP/1.1 TCP proxy for registry tests. One request per connection (it
//! rewrites `Connection` to `close`); on a seeded share of requests it drops the connection
//! half-way through the request body, answers 500, or answers 429 with `Retry-After: 1`.

#![allow(
    dead_code,
    reason = "shared by test modules; not every test binary uses every helper"
)]

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};

use super::support::Server;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub requests: AtomicUsize,
    pub resets: AtomicUsize,
    pub errors_500: AtomicUsize,
    pub errors_429: AtomicUsize,
}

pub(crate) struct FaultProxy {
    /// `127.0.0.1:PORT` to give the client.
    pub addr: String,
    pub stats: Arc<Stats>,
    _server: Server,
}

/// Which faults, how often.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Faults {
    pub seed: u64,
    /// Share of requests that get a fault, in per mille.
    pub per_mille: u64,
    /// At most this many 429s (each costs the client a one-second wait).
    pub max_429: usize,
}

impl FaultProxy {
    pub(crate) fn start(upstream: &str, faults: Faults) -> FaultProxy {
        let stats = Arc::new(Stats::default());
        let rng = Arc::new(Mutex::new(faults.seed | 1));
        let upstream = upstream.to_string();
        let s = stats.clone();
        let server = Server::start(move |conn, _| {
            let _ = handle(conn, &upstream, &s, &rng, faults);
        });
        FaultProxy {
            addr: server.addr.clone(),
            stats,
            _server: server,
        }
    }
}

fn next(rng: &Mutex<u64>) -> u64 {
    let mut s = rng.lock().unwrap();
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn handle(
    mut client: TcpStream,
    upstream: &str,
    stats: &Stats,
    rng: &Mutex<u64>,
    faults: Faults,
) -> std::io::Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(30)))?;
    // Read the request head.
    let Some((buf, head_end)) = super::support::read_request_head(&mut client)? else {
        return Ok(());
    };
    let mut tmp = [0u8; 8192];
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let body_start = buf[head_end..].to_vec();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_string();
    let mut content_length = 0u64;
    let mut new_head = format!("{request_line}\r\n");
    for line in lines {
        if line.is_empty() {
            continue;
        }
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("connection:") {
            continue;
        }
        if let Some(v) = lower.strip_prefix("content-length:") {
            content_length = v.trim().parse().unwrap_or(0);
        }
        new_head.push_str(line);
        new_head.push_str("\r\n");
    }
    new_head.push_str("Connection: close\r\n\r\n");
    stats.requests.fetch_add(1, Ordering::Relaxed);

    let roll = next(rng) % 1000;
    if roll < faults.per_mille {
        match next(rng) % 3 {
            0 if content_length > 0 => {
                // Forward the head and half the body, then drop both sides.
                stats.resets.fetch_add(1, Ordering::Relaxed);
                let mut up = TcpStream::connect(upstream)?;
                up.write_all(new_head.as_bytes())?;
                let half = (content_length / 2) as usize;
                let mut sent = body_start.len().min(half);
                up.write_all(&body_start[..sent])?;
                while sent < half {
                    let n = client.read(&mut tmp[..(half - sent).min(8192)])?;
                    if n == 0 {
                        break;
                    }
                    up.write_all(&tmp[..n])?;
                    sent += n;
                }
                let _ = up.shutdown(Shutdown::Both);
                let _ = client.shutdown(Shutdown::Both);
                return Ok(());
            }
            0 | 1 => {
                stats.errors_500.fetch_add(1, Ordering::Relaxed);
                let _ = client.write_all(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
                return finish(client);
            }
            _ => {
                if stats.errors_429.fetch_add(1, Ordering::Relaxed) < faults.max_429 {
                    let _ = client.write_all(
                        b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                    );
                    return finish(client);
                }
                stats.errors_429.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    let mut up = TcpStream::connect(upstream)?;
    up.write_all(new_head.as_bytes())?;
    up.write_all(&body_start)?;
    let mut up_read = up.try_clone()?;
    let mut client_read = client.try_clone()?;
    let mut up_write = up.try_clone()?;
    let pump = std::thread::spawn(move || {
        let _ = std::io::copy(&mut client_read, &mut up_write);
    });
    let _ = std::io::copy(&mut up_read, &mut client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = up.shutdown(Shutdown::Both);
    let _ = pump.join();
    Ok(())
}

/// Close after an early answer; the unread request body is discarded by the kernel.
fn finish(client: TcpStream) -> std::io::Result<()> {
    let _ = client.shutdown(Shutdown::Write);
    std::thread::sleep(Duration::from_millis(20));
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}
