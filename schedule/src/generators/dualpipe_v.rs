//! DualPipe-V (DeepSeek-AI, 2024, DeepSeek-V3 technical report §3.2.1 and its open-source
//! `DualPipeV`), in the order of PyTorch's `ScheduleDualPipeV`: two stages per rank in a V,
//! one micro-batch's forward overlapped with another's backward in the steady state.

use std::collections::VecDeque;

use super::zb_v::ChunkCursor;
use crate::ir::{ActionKind, Placement, Schedule, ScheduleKind, Step};

/// One rank's list under construction: the chunk cursor plus the `W`s owed by split backwards,
/// oldest first.
struct Rank {
    c: ChunkCursor,
    owed: VecDeque<crate::ir::Action>,
}

impl Rank {
    /// Appends the next backward of `chunk`: a full `B`, or an `I` whose `W` is owed.
    fn backward(&mut self, chunk: usize, split: bool) {
        if split {
            let i = self.c.take(chunk, ActionKind::I);
            let w = self.c.take(chunk, ActionKind::W);
            self.owed.push_back(w);
            self.c.list.push(Step::One(i));
        } else {
            let b = self.c.take(chunk, ActionKind::B);
            self.c.list.push(Step::One(b));
        }
    }

    /// Appends the oldest owed `W`, if any.
    fn owed_weight(&mut self) {
        if let Some(w) = self.owed.pop_front() {
            self.c.list.push(Step::One(w));
        }
    }

    /// Appends the overlapped pair (next `F` of `forward_chunk`; next full `B` of
    /// `backward_chunk`).
    fn pair(&mut self, forward_chunk: usize, backward_chunk: usize) {
        let f = self.c.take(forward_chunk, ActionKind::F);
        let b = self.c.take(backward_chunk, ActionKind::B);
        self.c.list.push(Step::Overlapped(f, b));
    }
}

/// DualPipe-V: rank `r` holds chunk 0 = stage `r` and chunk 1 = stage `2p − 1 − r`. Writing
/// `(F0;B1)` for the overlapped pair of chunk 0's next forward and chunk 1's next full
/// backward, it runs (every action takes its chunk's next micro-batch):
///
/// ```text
/// 1. 2(p − r − 1) times:       F0
/// 2. r + 1 times:              F0, F1
/// 3. p − r − 1 times:          I1, W1, F1                  (split: the W runs at once)
/// 4. m − 2p + r + 1 times:     (F0;B1), (F1;B0)            (on rank p − 1 the first (F0;B1)
///                                                           runs as F0, then B1)
/// 5. p − r − 1 times:          B1, (F1;B0)
/// 6. r + 1 times:              B1, B0      — of these 2(r + 1) backwards the last r + 1 are
///                                            split into I (their W's owed)
/// 7. p − r − 1 times:          owed W, I0  (split)
/// 8. r + 1 times:              owed W
/// ```
///
/// (`m ≥ 2p` keeps step 4 at least once on every rank.) Peak in-flight (`F` to `B` or `W`) is
/// `2p + 1` pairs on every rank. With `F = I = W` and an overlapped pair lasting `F + B` (no
/// overlap factor), every rank idles `(p − 1)·(F&B + B − 3W)` in all — the bubble of the
/// DualPipe paper with `F&B = F + B`.
pub(crate) fn dualpipe_v(pp: usize, m: usize) -> Schedule {
    use ActionKind::F;
    let placement = Placement::V;
    let ranks = (0..pp)
        .map(|r| {
            let stages = [placement.stage_of(r, 0, pp), placement.stage_of(r, 1, pp)];
            let mut k = Rank {
                c: ChunkCursor::new(stages, 5 * m),
                owed: VecDeque::new(),
            };
            let rest = pp - r - 1;
            for _ in 0..2 * rest {
                k.c.push(0, F);
            }
            for _ in 0..=r {
                k.c.push(0, F);
                k.c.push(1, F);
            }
            for _ in 0..rest {
                k.backward(1, true);
                k.owed_weight();
                k.c.push(1, F);
            }
            for step in 0..(m + r + 1).saturating_sub(2 * pp) {
                if step == 0 && r == pp - 1 {
                    k.c.push(0, F);
                    k.backward(1, false);
                } else {
                    k.pair(0, 1);
                }
                k.pair(1, 0);
            }
            for _ in 0..rest {
                k.backward(1, false);
                k.pair(1, 0);
            }
            for j in 0..2 * (r + 1) {
                k.backward(if j % 2 == 0 { 1 } else { 0 }, j > r);
            }
            for _ in 0..rest {
                k.owed_weight();
                k.backward(0, true);
            }
            for _ in 0..=r {
                k.owed_weight();
            }
            k.c.list
        })
        .collect();
    Schedule {
        kind: ScheduleKind::DualPipeV,
        pp,
        virtual_stages: 2,
        num_microbatches: m,
        placement,
        ranks,
    }
}
