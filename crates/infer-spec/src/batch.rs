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
/// (oldest first, the oldest included) and `due` whether the oldest has waited the queue delay.
///
/// Requests are added in order while their rows fit `max_batch_size`. The batch goes at once
/// when it is full (the next would not fit, or it holds exactly `max_batch_size` rows) or when it
/// is due; else at the largest count of requests whose rows sum to a preferred size; else it
/// waits.
pub fn cut(
    rows: impl IntoIterator<Item = usize>,
    max_batch_size: usize,
    preferred: &[usize],
    due: bool,
) -> Cut {
    let (mut total, mut n, mut preferred_cut, mut full) = (0usize, 0usize, None, false);
    for r in rows {
        if total + r > max_batch_size {
            full = true;
            break;
        }
        total += r;
        n += 1;
        if preferred.contains(&total) {
            preferred_cut = Some(n);
        }
    }
    full |= total == max_batch_size;
    if full || due {
        Cut::Take(n)
    } else if let Some(c) = preferred_cut {
        Cut::Take(c)
    } else {
        Cut::Wait
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
            let got = cut(rows.iter().copied(), *max, pref, *due);
            assert_eq!(
                got, *want,
                "rows {rows:?} max {max} preferred {pref:?} due {due}"
            );
        }
    }
}
