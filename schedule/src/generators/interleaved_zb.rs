//! Interleaved zero bubble, in the order of PyTorch's `ScheduleInterleavedZeroBubble` (the
//! ZB-1P schedule of Qi, Wan, Huang and Lin, 2023, on interleaved 1F1B's looped stages).

use super::interleaved::chunk_order;
use super::zero_bubble::split_backward_rank;
use crate::ir::{Action, ActionKind, Placement, Schedule, ScheduleKind};

/// Interleaved zero bubble: the steps of interleaved 1F1B with groups of `G` micro-batches
/// (PyTorch's rounds: `R = max(1, ⌊m/p⌋)` rounds of `G = m/R`, so `G = p` when `p` divides
/// `m`; rank `r` holds the looped stages `c·p + r`, `c = 0..v−1`), with every backward split into
/// `I` and `W`, one warm-up step per hop fewer than interleaved 1F1B, and rank `r`'s `W`s
/// running `r` backward steps behind its `I`s:
///
/// ```text
/// forward step k  (0 ≤ k < v·m):  F on stage c·p + r,          micro-batch i
/// backward step k (0 ≤ k < v·m):  I / W on stage (v−1−c)·p + r, micro-batch i
///     where c = (k mod G·v) / G  and  i = (k / G·v)·G + k mod G
/// warm-up forward steps  w(r) = min((v − 1)·G + p − r − 1, v·m)
/// W delay                d(r) = r
/// then [`split_backward_rank`] over the v·m steps:
///     forward step w+j, I of backward step j, W of backward step j−d (if j ≥ d); the
///     deferred W's at the end
/// ```
///
/// Peak in-flight (`F` to `W`) is at most `w + 1 + d = (v − 1)·G + p` pairs on every rank
/// (`v·p` when `G = p`). With `F = I = W`, `G = p` and no communication the makespan is
/// `3·v·m·F + (p − 1)·F`.
///
/// Preconditions (checked by [`generate`](super::generate)): `v ≥ 2`, `g` from
/// [`rounds_group_size`](super::rounds_group_size).
pub(crate) fn interleaved_zb(pp: usize, v: usize, m: usize, g: usize) -> Schedule {
    let placement = Placement::Looped;
    let order = chunk_order(v, m, g);
    let ranks = (0..pp)
        .map(|r| {
            let forward = |k: usize| {
                let (c, i) = order[k];
                Action::new(placement.stage_of(r, c, pp), ActionKind::F, i)
            };
            let backward = |k: usize, kind: ActionKind| {
                let (c, i) = order[k];
                Action::new(placement.stage_of(r, v - 1 - c, pp), kind, i)
            };
            let warmup = ((v - 1) * g + (pp - r - 1)).min(v * m);
            split_backward_rank(v * m, warmup, r, forward, backward)
        })
        .collect();
    Schedule {
        kind: ScheduleKind::InterleavedZb,
        pp,
        virtual_stages: v,
        num_microbatches: m,
        placement,
        ranks,
    }
}
