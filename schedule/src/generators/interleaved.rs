//! Interleaved 1F1B (Narayanan et al., 2021, "virtual pipeline"), in the order of Megatron-LM
//! core's `forward_backward_pipelining_with_interleaving`.

use crate::ir::{Action, ActionKind, Placement, Schedule, ScheduleKind, Step};

/// Number of warm-up forwards of rank `r` in interleaved 1F1B (v ≥ 2):
/// `w(r) = min(2·(p − r − 1) + (v − 1)·G, v·m)`.
fn warmup_interleaved(pp: usize, v: usize, m: usize, g: usize, rank: usize) -> usize {
    (2 * (pp - rank - 1) + (v - 1) * g).min(v * m)
}

/// The (local chunk, micro-batch) of forward step `k` when micro-batches go through the
/// chunks in groups of `G` (`m` a multiple of `G`):
/// `chunk = (k mod G·v) / G`, `microbatch = (k / G·v)·G + k mod G`.
pub(super) fn step_chunk_microbatch(k: usize, v: usize, g: usize) -> (usize, usize) {
    let within = k % (g * v);
    (within / g, (k / (g * v)) * g + k % g)
}

/// [`step_chunk_microbatch`] of every step `k < v·m`, computed once for all ranks.
pub(super) fn chunk_order(v: usize, m: usize, g: usize) -> Vec<(usize, usize)> {
    (0..v * m).map(|k| step_chunk_microbatch(k, v, g)).collect()
}

/// Interleaved 1F1B: every rank holds `v` looped stages (rank `r` holds `c·p + r`,
/// `c = 0..v−1`) and runs `v·m` forward steps and `v·m` backward steps. Micro-batches enter
/// the chunks in groups of `G` (default `p`): the `G` micro-batches of a group pass through
/// chunk 0, then chunk 1, …, before the next group starts.
///
/// ```text
/// forward step k  (0 ≤ k < v·m):  stage c·p + r,         micro-batch i,
/// backward step k (0 ≤ k < v·m):  stage (v−1−c)·p + r,   micro-batch i,
///     where c = (k mod G·v) / G  and  i = (k / G·v)·G + k mod G
/// warm-up forward steps:  w = min(2·(p − r − 1) + (v − 1)·G, v·m)
///
/// warm-up:    forward steps 0..w
/// steady:     for j in 0..v·m−w:  forward step w+j, backward step j
/// cool-down:  backward steps v·m−w..v·m
/// ```
///
/// When `w = v·m` (all warm-up) the rank runs every forward, then every backward. Peak
/// in-flight is `min(w + 1, v·m)`; with equal stage costs, no communication and `G = p` the
/// bubble fraction is `(p−1)/(v·m+p−1)`.
///
/// Preconditions (checked by [`generate`](super::generate)): `v ≥ 2`, `p ≤ G ≤ m`,
/// `m mod G = 0`.
pub(crate) fn interleaved_1f1b(pp: usize, v: usize, m: usize, g: usize) -> Schedule {
    let placement = Placement::Looped;
    let total = v * m;
    let order = chunk_order(v, m, g);
    let ranks = (0..pp)
        .map(|r| {
            let forward = |k: usize| {
                let (c, i) = order[k];
                Step::One(Action::new(placement.stage_of(r, c, pp), ActionKind::F, i))
            };
            let backward = |k: usize| {
                let (c, i) = order[k];
                Step::One(Action::new(
                    placement.stage_of(r, v - 1 - c, pp),
                    ActionKind::B,
                    i,
                ))
            };
            let w = warmup_interleaved(pp, v, m, g, r);
            let mut list = Vec::with_capacity(2 * total);
            list.extend((0..w).map(forward));
            for j in 0..total - w {
                list.push(forward(w + j));
                list.push(backward(j));
            }
            list.extend((total - w..total).map(backward));
            list
        })
        .collect();
    Schedule {
        kind: ScheduleKind::Interleaved1F1B,
        pp,
        virtual_stages: v,
        num_microbatches: m,
        placement,
        ranks,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Megatron-LM's schedule table comment, PP2 with VP2 and groups of 3 over 6
    /// micro-batches: micro-batch ids 0 1 2 0 1 2 3 4 5 3 4 5, chunks 0 0 0 1 1 1 0 0 0 1 1 1.
    #[test]
    fn step_table_matches_megatron_groups() {
        let got: Vec<(usize, usize)> = (0..12).map(|k| step_chunk_microbatch(k, 2, 3)).collect();
        let mbs: Vec<usize> = got.iter().map(|x| x.1).collect();
        let chunks: Vec<usize> = got.iter().map(|x| x.0).collect();
        assert_eq!(mbs, [0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5]);
        assert_eq!(chunks, [0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1]);
    }
}
