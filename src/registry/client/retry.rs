//! Retries: which answers and errors are retried, the backoff with jitter (`Retry-After`
//! honoured, capped), and [`Client::send`], the one request loop every plain resend goes
//! through.

use super::*;

/// Timeouts allowed per request (first try included) before giving up.
pub(crate) const MAX_TIMEOUTS: u32 = 3;

/// The longest `Retry-After` waited for; a registry asking for longer fails the request at
/// once, naming its limit.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

impl Client {
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
    pub(super) fn out_of_time(&self) -> bool {
        self.time_left().is_some_and(|d| d.is_zero())
    }

    fn random_unit(&self) -> f64 {
        let mut s = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        // xorshift64
        *s ^= *s << 13;
        *s ^= *s >> 7;
        *s ^= *s << 17;
        (*s >> 11) as f64 / (1u64 << 53) as f64
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

#[cfg(test)]
mod tests {
    use super::*;

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
