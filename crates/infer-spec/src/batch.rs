//! The batching rule: when the requests waiting form a batch, and how many of them. The runtime's
//! batcher applies it to its queue; the builder's benchmark replays it in its model of the
//! server. Pure: no clock, no queue, only the facts the decision needs.

/// What to do with the requests waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// Take this many requests from the front.
    Take(usize),
    /// Nothing is due yet: wait for more requests or for the delay to pass.
    Wait,
}

/// The rule, with `rows` the rows of each waiting request that may join the oldest one's batch
/// (oldest first, the oldest included), `due` whether the oldest has waited the queue delay and
/// `expect_more` whether another request can be expected before it has ([`Arrivals`]; always
/// true under Triton's strict rule).
///
/// Requests are added in order while their rows fit `max_batch_size`. The batch goes at once
/// when it is full (the next would not fit, or it holds exactly `max_batch_size` rows), when it
/// is due, or when no other request is expected in time (waiting would only add the delay);
/// else at the largest count of requests whose rows sum to a preferred size; else it waits.
pub fn cut(
    rows: impl IntoIterator<Item = usize>,
    max_batch_size: usize,
    preferred: &[usize],
    due: bool,
    expect_more: bool,
) -> Cut {
    let items = rows.into_iter().map(|r| (r, 0));
    cut_padded(
        items,
        max_batch_size,
        Padded::NONE,
        preferred,
        due,
        expect_more,
    )
}

/// The bounds of a batch of requests padded to a common length (text models).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Padded {
    /// The most tokens, counted as rows x the batch's longest sequence.
    pub token_budget: usize,
    /// The most padding, in percent of the batch's own tokens (25: at most 1.25 tokens computed
    /// per token of text); 0: no bound. Where the engine's cost grows with every token computed
    /// (a CPU), a batch of mixed lengths can cost more than its requests one by one.
    pub max_padding_percent: u32,
}

impl Padded {
    /// No bound beyond `max_batch_size` (requests of equal shapes).
    pub const NONE: Padded = Padded {
        token_budget: usize::MAX,
        max_padding_percent: 0,
    };
}

/// [`cut`] for requests padded to a common length (text models): `items` are each request's
/// rows and sequence length, and a batch is also full where the next request would make its
/// rows x the longest length pass `bounds.token_budget`, or its padding pass
/// `bounds.max_padding_percent` of the tokens its rows hold (the oldest request always fits,
/// whatever its size).
pub fn cut_padded(
    items: impl IntoIterator<Item = (usize, usize)>,
    max_batch_size: usize,
    bounds: Padded,
    preferred: &[usize],
    due: bool,
    expect_more: bool,
) -> Cut {
    let (mut total, mut longest, mut n, mut tokens) = (0usize, 0usize, 0usize, 0usize);
    let (mut preferred_cut, mut full) = (None, false);
    for (r, len) in items {
        let longer = longest.max(len);
        let computed = (total + r).saturating_mul(longer);
        let held = tokens.saturating_add(r.saturating_mul(len));
        let padded_past = bounds.max_padding_percent > 0
            && computed.saturating_mul(100)
                > held.saturating_mul(100 + bounds.max_padding_percent as usize);
        if total + r > max_batch_size || (n > 0 && (computed > bounds.token_budget || padded_past))
        {
            full = true;
            break;
        }
        (total, longest, n, tokens) = (total + r, longer, n + 1, held);
        if preferred.contains(&total) {
            preferred_cut = Some(n);
        }
    }
    full |= total == max_batch_size;
    if full || due || !expect_more {
        Cut::Take(n)
    } else if let Some(c) = preferred_cut {
        Cut::Take(c)
    } else {
        Cut::Wait
    }
}

/// What the adaptive queue delay knows of the traffic: whether waiting for company can pay.
///
/// Two moving averages over arrivals (weight 1/8 for the newest), on the caller's clock in
/// nanoseconds: the gap between arrivals, and how often an arrival found company (another
/// request queued or running). Company is expected only when arrivals have lately overlapped
/// (at least one in eight) and the average gap, or the silence since the last arrival when that
/// is longer, fits in what is left of the delay. Under load both hold and the batch waits as
/// Triton's does; a lone client sending its next request only once it has the answer never
/// overlaps, and at a low rate the next request is not due before the delay ends: then a lone
/// request goes at once instead of waiting the whole delay for company that cannot come.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Arrivals {
    last: Option<u64>,
    gap: Option<f64>,
    together: f64,
}

/// The share of recent arrivals that must have found company before the batch waits for more.
const TOGETHER: f64 = 1.0 / 8.0;

impl Arrivals {
    /// A request arrived at `at`; `alone` when nothing else was queued or running then.
    pub fn observe(&mut self, at: u64, alone: bool) {
        if let Some(last) = self.last {
            let g = at.saturating_sub(last) as f64;
            self.gap = Some(match self.gap {
                Some(avg) => avg + (g - avg) / 8.0,
                None => g,
            });
        }
        let seen = if alone { 0.0 } else { 1.0 };
        self.together += (seen - self.together) / 8.0;
        self.last = Some(self.last.map_or(at, |l| l.max(at)));
    }

    /// Whether another request is expected within `remaining` of `now` (see the type). Without
    /// two arrivals seen, none is.
    pub fn expect_within(&self, now: u64, remaining: u64) -> bool {
        match (self.last, self.gap) {
            (Some(last), Some(gap)) => {
                self.together >= TOGETHER
                    && gap.max(now.saturating_sub(last) as f64) <= remaining as f64
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        /// (rows, max, preferred, due, expected)
        type Case = (&'static [usize], usize, &'static [usize], bool, Cut);
        let cases: &[Case] = &[
            (&[1, 1, 1], 4, &[4], false, Cut::Wait),
            (&[1, 1, 1], 4, &[4], true, Cut::Take(3)),
            (&[1, 1, 1, 1], 4, &[4], false, Cut::Take(4)),
            (&[1, 1, 1, 1, 1], 4, &[], false, Cut::Take(4)),
            (&[3, 2], 4, &[], false, Cut::Take(1)),
            (&[1, 1, 1], 8, &[2], false, Cut::Take(2)),
            (&[1, 1, 1, 1, 1], 8, &[2, 4], false, Cut::Take(4)),
            (&[2, 2], 8, &[3], false, Cut::Wait),
            (&[2, 1, 1], 8, &[3], false, Cut::Take(2)),
            (&[2, 1, 1], 8, &[3, 4], false, Cut::Take(3)),
            (&[1, 1], 8, &[2], true, Cut::Take(2)),
        ];
        for (rows, max, pref, due, want) in cases {
            let got = cut(rows.iter().copied(), *max, pref, *due, true);
            assert_eq!(
                got, *want,
                "rows {rows:?} max {max} preferred {pref:?} due {due}"
            );
        }
    }

    #[test]
    fn nobody_expected_means_no_wait() {
        // Not due, no preferred size reached: waits only while company is expected.
        assert_eq!(cut([1, 1], 8, &[4], false, true), Cut::Wait);
        assert_eq!(cut([1, 1], 8, &[4], false, false), Cut::Take(2));
        // Never past max_batch_size, nor past a shape the batch cannot take.
        assert_eq!(cut([3, 3, 3], 8, &[], false, false), Cut::Take(2));
    }

    fn budget(token_budget: usize) -> Padded {
        Padded {
            token_budget,
            max_padding_percent: 0,
        }
    }

    #[test]
    fn a_token_budget_ends_a_padded_batch() {
        // (rows, length): 2 x 5 = 10 fits a budget of 10; a third row would make 15.
        let items = [(1, 2), (1, 5), (1, 3)];
        assert_eq!(
            cut_padded(items, 8, budget(10), &[], false, true),
            Cut::Take(2)
        );
        // Within the budget, the rows rule as before: not full, not due, so it waits.
        assert_eq!(
            cut_padded(items, 8, budget(1000), &[], false, true),
            Cut::Wait
        );
        // The oldest request runs even when it alone is over the budget.
        assert_eq!(
            cut_padded([(1, 20), (1, 1)], 8, budget(10), &[], false, true),
            Cut::Take(1)
        );
        // The length that counts is the longest so far, later ones included.
        assert_eq!(
            cut_padded([(2, 1), (1, 4)], 8, budget(10), &[], false, true),
            Cut::Take(1)
        );
    }

    #[test]
    fn a_padding_bound_ends_a_batch_of_mixed_lengths() {
        let bounded = |pct| Padded {
            token_budget: usize::MAX,
            max_padding_percent: pct,
        };
        // (rows, length) → requests taken, at 25% padding: 10 + 12 tokens computed as 24 is
        // 9% padding; adding 20 makes 60 computed for 42 held, 43%.
        let items = [(1, 10), (1, 12), (1, 20)];
        assert_eq!(
            cut_padded(items, 8, bounded(25), &[], false, true),
            Cut::Take(2)
        );
        // No bound (0), or a loose one: the rows rule as before (not full: waits).
        assert_eq!(
            cut_padded(items, 8, bounded(0), &[], false, true),
            Cut::Wait
        );
        assert_eq!(
            cut_padded(items, 8, bounded(50), &[], false, true),
            Cut::Wait
        );
        // Equal lengths never pad; the oldest request always runs, however long.
        assert_eq!(
            cut_padded([(3, 7), (2, 7)], 5, bounded(1), &[], false, true),
            Cut::Take(2)
        );
        assert_eq!(
            cut_padded([(1, 200), (1, 2)], 8, bounded(25), &[], false, true),
            Cut::Take(1)
        );
        // A short request after a long one pads itself to the long one's length.
        assert_eq!(
            cut_padded([(1, 40), (1, 30), (1, 8)], 8, bounded(25), &[], false, true),
            Cut::Take(2)
        );
    }

    #[test]
    fn arrivals_estimate_whether_company_can_come() {
        const MS: u64 = 1_000_000;
        let mut a = Arrivals::default();
        // Nothing seen, or one arrival: no gap known, nobody expected.
        assert!(!a.expect_within(0, 2 * MS));
        a.observe(10 * MS, false);
        assert!(!a.expect_within(10 * MS, 2 * MS));
        // Under load: requests 0.2 ms apart finding company, a 2 ms delay: company expected.
        for i in 1..=40 {
            a.observe(10 * MS + i * MS / 5, false);
        }
        let last = 10 * MS + 8 * MS;
        assert!(a.expect_within(last, 2 * MS));
        // The burst ended: 5 ms of silence, longer than what is left of the delay.
        assert!(!a.expect_within(last + 5 * MS, 2 * MS));
        // A low rate: one request every 50 ms, the average follows within a few arrivals.
        let mut t = last;
        for _ in 0..32 {
            t += 50 * MS;
            a.observe(t, true);
        }
        assert!(!a.expect_within(t, 2 * MS));
        // One client, each request sent once the last was answered, 1 ms apart: the gap fits
        // the delay but no arrival ever found company, so nobody can come.
        let mut c = Arrivals::default();
        for i in 0..40 {
            c.observe(i * MS, true);
        }
        assert!(!c.expect_within(39 * MS, 2 * MS));
        // Two clients: half the arrivals find the other's request: company is expected.
        for i in 40..80 {
            c.observe(i * MS, i % 2 == 0);
        }
        assert!(c.expect_within(79 * MS, 2 * MS));
        // Out-of-order timestamps (two handlers racing) never move the clock back.
        let mut b = Arrivals::default();
        b.observe(5 * MS, false);
        b.observe(4 * MS, false);
        b.observe(6 * MS, false);
        assert!(b.expect_within(6 * MS, 2 * MS));
    }
}
