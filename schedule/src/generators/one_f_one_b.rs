//! 1F1B (PipeDream-Flush, Narayanan et al., 2021), in the order of Megatron-LM core's
//! non-interleaved schedule (`forward_backward_pipelining_without_interleaving`).

use crate::ir::{Action, ActionKind, Placement, Schedule, ScheduleKind, Step};

/// Number of warm-up forwards of rank `r` in 1F1B: `w(r) = min(p − r − 1, m)`.
fn warmup_1f1b(pp: usize, rank: usize, m: usize) -> usize {
    (pp - rank - 1).min(m)
}

/// 1F1B: warm-up forwards, then one forward and one backward in turn, then the remaining
/// backwards. One stage per rank (stage `r` on rank `r`); micro-batches in order.
///
/// With `w = min(p − r − 1, m)` warm-up forwards, rank `r` runs
///
/// ```text
/// warm-up:    F 0, …, F (w−1)
/// steady:     for j in 0..m−w:  F (w+j), B j
/// cool-down:  B (m−w), …, B (m−1)
/// ```
///
/// Its peak in-flight is `min(p − r, m)`; with equal stage costs and no communication the
/// bubble fraction is `(p−1)/(m+p−1)`, as for GPipe, at a fraction of the memory.
pub(crate) fn one_f_one_b(pp: usize, m: usize) -> Schedule {
    let ranks = (0..pp)
        .map(|r| {
            let w = warmup_1f1b(pp, r, m);
            let f = |i| Step::One(Action::new(r, ActionKind::F, i));
            let b = |i| Step::One(Action::new(r, ActionKind::B, i));
            let mut list = Vec::with_capacity(2 * m);
            list.extend((0..w).map(f));
            for j in 0..m - w {
                list.push(f(w + j));
                list.push(b(j));
            }
            list.extend((m - w..m).map(b));
            list
        })
        .collect();
    Schedule {
        kind: ScheduleKind::OneFOneB,
        pp,
        virtual_stages: 1,
        num_microbatches: m,
        placement: Placement::Looped,
        ranks,
    }
}
