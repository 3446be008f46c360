//! The handcrafted zero-bubble schedules ZB-H1 and ZB-H2 (Qi, Wan, Huang and Lin, 2023, "Zero
//! Bubble Pipeline Parallelism", §3): 1F1B with each backward split into its input part `I`,
//! which the previous stage waits for, and its weight part `W`, which nobody waits for and
//! which therefore moves to wherever a rank would otherwise sit idle.

use crate::ir::{Action, ActionKind, Placement, Schedule, ScheduleKind, Step};

/// One rank's list of a 1F1B-shaped schedule with split backwards, over `n` forward steps and
/// `n` backward steps: `warmup` forward steps, then each backward step's `I` after the next
/// forward step (while forward steps remain), with the `W`s running `delay` backward steps
/// behind the `I`s; the `delay` deferred `W`s close the list.
///
/// ```text
/// warm-up:   forward steps 0 … warmup−1
/// for j in 0..n:   forward step warmup+j (if < n),   I of backward step j,
///                  W of backward step j−delay (if j ≥ delay)
/// drain:     W of backward steps n−delay … n−1
/// ```
///
/// In flight (+1 at an `F`, −1 at a `W`) the rank holds at most `warmup + 1 + delay` pairs.
/// `forward(k)` is the forward action of step `k`; `backward(k, kind)` the `I` or `W` action of
/// backward step `k`. Used by ZB-H1, ZB-H2 and interleaved zero bubble.
pub(super) fn split_backward_rank(
    n: usize,
    warmup: usize,
    delay: usize,
    forward: impl Fn(usize) -> Action,
    backward: impl Fn(usize, ActionKind) -> Action,
) -> Vec<Step> {
    let warmup = warmup.min(n);
    let mut list = Vec::with_capacity(3 * n);
    list.extend((0..warmup).map(|k| Step::One(forward(k))));
    let mut weights_done = 0;
    for j in 0..n {
        if warmup + j < n {
            list.push(Step::One(forward(warmup + j)));
        }
        list.push(Step::One(backward(j, ActionKind::I)));
        if j >= delay {
            list.push(Step::One(backward(weights_done, ActionKind::W)));
            weights_done += 1;
        }
    }
    list.extend((weights_done..n).map(|k| Step::One(backward(k, ActionKind::W))));
    list
}

/// A one-stage-per-rank schedule whose rank `r` runs [`split_backward_rank`] over its `m`
/// micro-batches in order, with warm-up `warmup(r)` and `W` delay `delay(r)`.
fn one_stage_per_rank(
    kind: ScheduleKind,
    pp: usize,
    m: usize,
    warmup: impl Fn(usize) -> usize,
    delay: impl Fn(usize) -> usize,
) -> Schedule {
    let ranks = (0..pp)
        .map(|r| {
            split_backward_rank(
                m,
                warmup(r),
                delay(r),
                |i| Action::new(r, ActionKind::F, i),
                |i, kind| Action::new(r, kind, i),
            )
        })
        .collect();
    Schedule {
        kind,
        pp,
        virtual_stages: 1,
        num_microbatches: m,
        placement: Placement::Looped,
        ranks,
    }
}

/// ZB-H1: 1F1B's warm-up, with the backward split and rank `r`'s `W`s running `r`
/// micro-batches behind its `I`s, so that the last ranks, which would idle longest while the
/// final backwards travel back to rank 0, fill that time with their deferred `W`s.
///
/// ```text
/// warm-up forwards  w(r) = min(p − r − 1, m)      (as 1F1B)
/// W delay           d(r) = r
/// then [`split_backward_rank`]:   F(w+j), I j, W(j−d) …, and the d deferred W's at the end
/// ```
///
/// Peak in-flight (`F` to `W`) is at most `p` on every rank, and `min(p, m)` on rank 0 — the
/// same as 1F1B's rank 0. With `F = I = W` and no communication the bubble is
/// `(p − 1)·F` per rank instead of 1F1B's `(p − 1)·(F + B)`: makespan `3·m·F + (p − 1)·F` for
/// `m ≥ p` (the paper's `(p − 1)(T_F + T_B − T_W)`, with its `T_B` our `I`).
pub(crate) fn zb_h1(pp: usize, m: usize) -> Schedule {
    one_stage_per_rank(ScheduleKind::ZbH1, pp, m, |r| pp - r - 1, |r| r)
}

/// ZB-H2: ZB-H1 with up to `p − r − 1` more warm-up forwards, which fill the wait for the first
/// backward, and up to `r` more deferred `W`s, which fill the drain — as many of each as the
/// micro-batches beyond `p` allow:
///
/// ```text
/// e    = max(m − p, 0)
/// w(r) = min((p − r − 1) + min(p − r − 1, e), m)     warm-up forwards
/// d(r) = r + min(r, e)                               W delay
/// then [`split_backward_rank`]
/// ```
///
/// For `m ≥ 2p − 1` that is `w(r) = 2·(p − r − 1)` and `d(r) = 2r`; for `m ≤ p` it is ZB-H1.
/// Peak in-flight is at most `w + 1 + d ≤ 2p − 1` micro-batches on every rank (the paper's
/// bound of `2p`). With `F = I = W` its makespan equals ZB-H1's; when `I > W` it is shorter,
/// down to `(p − 1)·F + m·(F + I + W)` when `I = 2·W`.
pub(crate) fn zb_h2(pp: usize, m: usize) -> Schedule {
    let extra = m.saturating_sub(pp);
    one_stage_per_rank(
        ScheduleKind::ZbH2,
        pp,
        m,
        |r| (pp - r - 1) + (pp - r - 1).min(extra),
        |r| r + r.min(extra),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &Schedule, rank: usize) -> String {
        s.ranks[rank]
            .iter()
            .map(Step::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Worked by hand from the rules: p = 2, m = 3. Rank 0 warms up with one forward and runs
    /// its W's right behind its I's; rank 1 defers one W to the end.
    #[test]
    fn zb_h1_lists_by_hand() {
        let s = zb_h1(2, 3);
        assert_eq!(text(&s, 0), "0F0 0F1 0I0 0W0 0F2 0I1 0W1 0I2 0W2");
        assert_eq!(text(&s, 1), "1F0 1I0 1F1 1I1 1W0 1F2 1I2 1W1 1W2");
    }

    /// p = 2, m = 4 (e = 2): rank 0 warms up with 2 forwards, rank 1 defers 2 W's.
    #[test]
    fn zb_h2_lists_by_hand() {
        let s = zb_h2(2, 4);
        assert_eq!(
            text(&s, 0),
            "0F0 0F1 0F2 0I0 0W0 0F3 0I1 0W1 0I2 0W2 0I3 0W3"
        );
        assert_eq!(
            text(&s, 1),
            "1F0 1I0 1F1 1I1 1F2 1I2 1W0 1F3 1I3 1W1 1W2 1W3"
        );
    }
}
