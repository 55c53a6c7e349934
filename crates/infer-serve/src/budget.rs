//! The memory the requests in flight may hold, and each request's share of it.
//!
//! `server.memory_budget_bytes` bounds the whole process. At start the batches' working memory
//! (`instances x max_batch_size x` a row's bytes at its largest), the response caches' bounds and
//! a [`headroom`] for the transports' buffers are set aside; once every model is loaded and warmed
//! up, what the process already holds (its resident set: the runtime, the engines and their
//! arenas) is set aside too, and the rest is the [`Budget`] of the requests in flight. Every request is charged before the work it causes: its body as the bytes arrive
//! (HTTP and gRPC alike), then the core's estimate of what decoding, tokenizing, the engine's
//! tensors and the answer will take ([`crate::core`]). A charge that does not fit is refused
//! at once, before more is read or done: 503 with `Retry-After` (gRPC `RESOURCE_EXHAUSTED`)
//! when requests in flight hold the budget, 413 when the request alone needs more than the
//! whole budget. A [`Reservation`] gives its bytes back when it is dropped, however the request
//! ends (answered, refused, or its client gone).

use crate::error::ApiError;

/// What the requests' budget leaves aside, beyond the process's own memory and its batches, for
/// what the transports hold before a body is charged (an HTTP/2 connection's flow-control window,
/// the connections' read buffers) and the allocator's own slack: 16 MiB and 1/32 of
/// `server.memory_budget_bytes`.
pub(crate) fn headroom(memory_budget_bytes: u64) -> u64 {
    (16 << 20) + memory_budget_bytes / 32
}
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// The bytes the requests in flight may hold, and how many they hold now.
#[derive(Debug)]
pub struct Budget {
    limit: AtomicU64,
    held: AtomicU64,
    /// What the process may hold beside the batches, the caches and the headroom, once
    /// [`Budget::follow`] was called: the limit is then this less what the process holds that no
    /// request accounts for (its resident set less [`Budget::held`]), refreshed every
    /// [`FOLLOW_EVERY`]. 0: a fixed limit.
    room: AtomicU64,
    /// The resident set when the budget began to follow it (the models loaded, no request in
    /// flight): the least the process holds beside its requests, whatever they are charged.
    floor: AtomicU64,
}

/// How often a following budget reads the process's resident set.
pub(crate) const FOLLOW_EVERY: std::time::Duration = std::time::Duration::from_millis(100);

/// A request's charge against a [`Budget`]; released when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<Budget>,
    bytes: u64,
}

impl Budget {
    /// A budget of `limit` bytes, none held.
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit: AtomicU64::new(limit),
            held: AtomicU64::new(0),
            room: AtomicU64::new(0),
            floor: AtomicU64::new(0),
        })
    }

    /// From now on the limit is `room` less what the process holds that no request accounts
    /// for (the runtime, the engines and their arenas, memory the allocator keeps), as its
    /// resident set says: read now, and at each [`Budget::refresh`]. So what the process holds
    /// beyond the estimate at start (an engine's arena grown for a new shape, a runtime
    /// library's caches) shrinks what requests may hold, and the process stays within its
    /// budget.
    pub fn follow(&self, room: u64) {
        self.room.store(room, Relaxed);
        let resident = resident_bytes().unwrap_or(0);
        self.floor
            .store(resident.saturating_sub(self.held()), Relaxed);
        self.refresh();
    }

    /// Sets the limit from the resident set now (see [`Budget::follow`]); nothing when the limit
    /// is fixed or the resident set cannot be read.
    pub fn refresh(&self) {
        let room = self.room.load(Relaxed);
        if room == 0 {
            return;
        }
        let Some(resident) = resident_bytes() else {
            return;
        };
        // Charges are estimates made before the memory is used (a body charged at its announced
        // length): the resident set less them is never taken for less than the floor.
        let unaccounted = resident
            .saturating_sub(self.held())
            .max(self.floor.load(Relaxed));
        self.limit.store(room.saturating_sub(unaccounted), Relaxed);
    }

    /// Sets the bytes requests may hold (what stays of `memory_budget_bytes` once the models
    /// are loaded). Charges already made stay.
    pub fn set_limit(&self, limit: u64) {
        self.limit.store(limit, Relaxed);
    }

    /// The bytes requests may hold.
    pub fn limit(&self) -> u64 {
        self.limit.load(Relaxed)
    }

    /// The bytes requests hold now.
    pub fn held(&self) -> u64 {
        self.held.load(Relaxed)
    }

    /// An empty reservation, to grow as a request's needs become known.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: self.clone(),
            bytes: 0,
        }
    }

    /// Takes `bytes` when they fit beside what is held; `Err` with the refusal when not.
    /// `total` is the request's whole charge once this is added, for the 413 of a request
    /// that could never fit.
    fn take(&self, bytes: u64, total: u64, what: &str) -> Result<(), ApiError> {
        let limit = self.limit();
        if total > limit {
            return Err(ApiError::TooLarge(format!(
                "{what} needs about {total} bytes of memory, more than the {limit} bytes server.memory_budget_bytes leaves for requests in flight"
            )));
        }
        let mut held = self.held.load(Relaxed);
        loop {
            let next = held.saturating_add(bytes);
            if next > limit {
                return Err(ApiError::Overloaded(format!(
                    "the requests in flight hold the server's memory budget ({held} of {limit} bytes, server.memory_budget_bytes); {what} needs {bytes} more: retry later or elsewhere"
                )));
            }
            match self
                .held
                .compare_exchange_weak(held, next, Relaxed, Relaxed)
            {
                Ok(_) => return Ok(()),
                Err(now) => held = now,
            }
        }
    }
}

impl Reservation {
    /// Adds `bytes` to the charge (`what` names the request in a refusal); on refusal the
    /// charge is as it was.
    pub fn grow(&mut self, bytes: u64, what: &str) -> Result<(), ApiError> {
        if bytes == 0 {
            return Ok(());
        }
        let total = self.bytes.saturating_add(bytes);
        self.budget.take(bytes, total, what)?;
        self.bytes = total;
        Ok(())
    }

    /// The bytes charged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// A second charge of `bytes` against the same budget (memory a step needs for a while,
    /// beside what the request holds), released on its own.
    pub fn split(&self, bytes: u64, what: &str) -> Result<Reservation, ApiError> {
        let mut r = self.budget.reservation();
        r.grow(bytes, what)?;
        Ok(r)
    }

    /// Gives the whole charge back now.
    pub fn release(&mut self) {
        if self.bytes > 0 {
            self.budget.held.fetch_sub(self.bytes, Relaxed);
            self.bytes = 0;
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.release();
    }
}

/// The resident set of this process in bytes (`VmRSS` of `/proc/self/status`), `None` where
/// there is no such file.
pub(crate) fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_the_limit_and_come_back_when_dropped() {
        let b = Budget::new(100);
        let mut a = b.reservation();
        a.grow(60, "request a").unwrap();
        let mut c = b.reservation();
        // Does not fit beside a: 503, and nothing is taken.
        let e = c.grow(50, "request c").unwrap_err();
        assert!(matches!(e, ApiError::Overloaded(_)), "{e:?}");
        assert!(e.to_string().contains("server.memory_budget_bytes"), "{e}");
        assert_eq!((b.held(), c.bytes()), (60, 0));
        // Could never fit: 413.
        let e = c.grow(101, "request c").unwrap_err();
        assert!(matches!(e, ApiError::TooLarge(_)), "{e:?}");
        c.grow(40, "request c").unwrap();
        assert_eq!(b.held(), 100);
        drop(a);
        assert_eq!(b.held(), 40);
        drop(c);
        assert_eq!(b.held(), 0);
        assert!(resident_bytes().is_some_and(|r| r > 0));
    }

    #[test]
    fn a_following_budget_leaves_out_what_the_process_holds() {
        let resident = resident_bytes().unwrap();
        let b = Budget::new(0);
        b.follow(resident + (64 << 20));
        // What the process holds (this test's binary) is not the requests' to hold.
        let limit = b.limit();
        assert!(limit <= 64 << 20 && limit > 32 << 20, "{limit}");
        // Charges above what is resident never lift the limit past room less the floor.
        let mut r = b.reservation();
        r.grow(limit, "a request").unwrap();
        b.refresh();
        assert!(b.limit() <= 64 << 20, "{}", b.limit());
    }
}
