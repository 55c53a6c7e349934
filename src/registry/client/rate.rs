//! Rate limits of transfers: a body slower than the minimum rate over a window is stopped
//! ([`RateGuard`]), the settings from the environment, and what a registry's own rate-limit
//! answer says.

use super::*;

/// The environment variable that sets [`ClientOptions::min_rate`] (bytes per second).
pub(crate) const ENV_MIN_RATE: &str = "INFER_BUILD_REGISTRY_MIN_RATE";

/// The environment variable that sets [`ClientOptions::rate_window`] (seconds).
pub(crate) const ENV_RATE_WINDOW: &str = "INFER_BUILD_REGISTRY_RATE_WINDOW";

/// The default minimum transfer rate: 64 KiB/s.
pub(crate) const DEFAULT_MIN_RATE: u64 = 64 << 10;

/// The default window over which the minimum rate is measured.
pub(crate) const DEFAULT_RATE_WINDOW: Duration = Duration::from_secs(30);

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
