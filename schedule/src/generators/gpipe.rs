//! GPipe (Huang et al., 2019), in the order of PyTorch's `ScheduleGPipe`.

use crate::ir::{Action, ActionKind, Placement, Schedule, ScheduleKind, Step};

/// GPipe: each rank runs every forward, then every backward, both in micro-batch order.
///
/// With `p` ranks, one stage per rank (stage `r` on rank `r`) and `m` micro-batches, rank `r`
/// runs
///
/// ```text
/// r F 0, r F 1, …, r F (m−1),   r B 0, r B 1, …, r B (m−1)
/// ```
///
/// Every rank holds all `m` activations at its peak; with equal stage costs and no
/// communication the bubble fraction is `(p−1)/(m+p−1)`.
pub(crate) fn gpipe(pp: usize, m: usize) -> Schedule {
    let ranks = (0..pp)
        .map(|r| {
            let forwards = (0..m).map(|i| Step::One(Action::new(r, ActionKind::F, i)));
            let backwards = (0..m).map(|i| Step::One(Action::new(r, ActionKind::B, i)));
            forwards.chain(backwards).collect()
        })
        .collect();
    Schedule {
        kind: ScheduleKind::Gpipe,
        pp,
        virtual_stages: 1,
        num_microbatches: m,
        placement: Placement::Looped,
        ranks,
    }
}
