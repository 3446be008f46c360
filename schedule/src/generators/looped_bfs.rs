//! Breadth-first looped schedule (Lamy-Poirier, 2023), in the order of PyTorch's
//! `ScheduleLoopedBFS`.

use crate::ir::{Action, ActionKind, Placement, Schedule, ScheduleKind, Step};

/// Looped BFS: each rank runs all micro-batches through one of its stages before moving to
/// the next — forwards stage by stage in pipeline order, then backwards stage by stage in
/// reverse order, each in *reverse* micro-batch order (as PyTorch runs it).
///
/// Rank `r` holds the looped stages `s_c = c·p + r`, `c = 0..v−1`, and runs
///
/// ```text
/// for c in 0..v:          s_c F 0, s_c F 1, …, s_c F (m−1)
/// for c in (0..v).rev():  s_c B (m−1), s_c B (m−2), …, s_c B 0
/// ```
///
/// Every rank holds all `v·m` activations at its peak. With `v = 1` this is GPipe with the
/// backwards in reverse order.
pub(crate) fn looped_bfs(pp: usize, v: usize, m: usize) -> Schedule {
    let placement = Placement::Looped;
    let ranks = (0..pp)
        .map(|r| {
            let stages: Vec<usize> = (0..v).map(|c| placement.stage_of(r, c, pp)).collect();
            let mut list = Vec::with_capacity(2 * v * m);
            for &s in &stages {
                list.extend((0..m).map(|i| Step::One(Action::new(s, ActionKind::F, i))));
            }
            for &s in stages.iter().rev() {
                list.extend(
                    (0..m)
                        .rev()
                        .map(|i| Step::One(Action::new(s, ActionKind::B, i))),
                );
            }
            list
        })
        .collect();
    Schedule {
        kind: ScheduleKind::LoopedBfs,
        pp,
        virtual_stages: v,
        num_microbatches: m,
        placement,
        ranks,
    }
}
