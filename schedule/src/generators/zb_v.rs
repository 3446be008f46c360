//! ZB-V (Qi, Wan, Huang and Lin, 2023, "Zero Bubble Pipeline Parallelism", §6), in the order of
//! PyTorch's `ScheduleZBVZeroBubble`: two stages per rank in a V, split backwards.

use crate::ir::{Action, ActionKind, Placement, Schedule, ScheduleKind, Step};

/// Hands out the micro-batches of one rank's two chunks in order, per action kind, and keeps
/// the list they go into.
pub(super) struct ChunkCursor {
    /// Global stage of chunk 0 and chunk 1.
    stages: [usize; 2],
    /// Per chunk, the next micro-batch of `F`, of `I` (or `B`), and of `W`.
    next: [[usize; 3]; 2],
    /// The rank's list so far.
    pub(super) list: Vec<Step>,
}

impl ChunkCursor {
    /// A cursor for the rank holding `stages[0]` (chunk 0) and `stages[1]` (chunk 1).
    pub(super) fn new(stages: [usize; 2], capacity: usize) -> Self {
        ChunkCursor {
            stages,
            next: [[0; 3]; 2],
            list: Vec::with_capacity(capacity),
        }
    }

    /// The next action of `kind` on `chunk`, advancing its count. A full `B` does the work of
    /// an `I` and a `W`, so it advances both counts.
    pub(super) fn take(&mut self, chunk: usize, kind: ActionKind) -> Action {
        let slot = match kind {
            ActionKind::F => 0,
            ActionKind::B | ActionKind::I => 1,
            ActionKind::W => 2,
        };
        let i = self.next[chunk][slot];
        self.next[chunk][slot] += 1;
        if kind == ActionKind::B {
            self.next[chunk][2] += 1;
        }
        Action::new(self.stages[chunk], kind, i)
    }

    /// Appends the next action of `kind` on `chunk`.
    pub(super) fn push(&mut self, chunk: usize, kind: ActionKind) {
        let a = self.take(chunk, kind);
        self.list.push(Step::One(a));
    }

    /// How many actions of `kind` `chunk` has had (`B` counts as an `I` and a `W`).
    pub(super) fn count(&self, chunk: usize, kind: ActionKind) -> usize {
        match kind {
            ActionKind::F => self.next[chunk][0],
            ActionKind::B | ActionKind::I => self.next[chunk][1],
            ActionKind::W => self.next[chunk][2],
        }
    }
}

/// ZB-V: rank `r` holds chunk 0 = stage `r` (on the way down the V) and chunk 1 = stage
/// `2p − 1 − r` (on the way back up), and runs, with `n = max(m, 2p − 1)` and every action
/// taking its chunk's next micro-batch:
///
/// ```text
/// 1. 2(p − r) − 1 times:   F0
/// 2. r times:              F1, F0
/// 3. p − r times:          F1, I1, W1
/// 4. n − p times:          F0 (while chunk 0 has forwards left), I0, W0, F1, I1, W1
/// 5. r times:              I0, I1
/// 6. p − r times:          I0, W0
/// 7. the remaining W1, then the remaining W0
/// ```
///
/// then drops the actions on micro-batches `≥ m` (when `m < 2p − 1`, the steps of a full
/// pipeline that have no micro-batch). Peak in-flight (`F` to `W`) is `2p` pairs — `p`
/// micro-batches' worth of activations, as 1F1B's rank 0 with stages half as large. With
/// `F = I = W` and no communication, for `m ≥ 2p − 1` no rank idles between its first `F`
/// and its last `W`; the makespan is `6·m·F + (p − 1)·F`.
pub(crate) fn zb_v(pp: usize, m: usize) -> Schedule {
    use ActionKind::{F, I, W};
    let placement = Placement::V;
    let n = m.max(2 * pp - 1);
    let ranks = (0..pp)
        .map(|r| {
            let stages = [placement.stage_of(r, 0, pp), placement.stage_of(r, 1, pp)];
            let mut c = ChunkCursor::new(stages, 6 * n);
            for _ in 0..2 * (pp - r) - 1 {
                c.push(0, F);
            }
            for _ in 0..r {
                c.push(1, F);
                c.push(0, F);
            }
            for _ in 0..pp - r {
                c.push(1, F);
                c.push(1, I);
                c.push(1, W);
            }
            for _ in 0..n - pp {
                if c.count(0, F) < n {
                    c.push(0, F);
                }
                c.push(0, I);
                c.push(0, W);
                c.push(1, F);
                c.push(1, I);
                c.push(1, W);
            }
            for _ in 0..r {
                c.push(0, I);
                c.push(1, I);
            }
            for _ in 0..pp - r {
                c.push(0, I);
                c.push(0, W);
            }
            for chunk in [1, 0] {
                while c.count(chunk, W) < n {
                    c.push(chunk, W);
                }
            }
            c.list.retain(|step| (step.first().microbatch as usize) < m);
            c.list
        })
        .collect();
    Schedule {
        kind: ScheduleKind::ZbV,
        pp,
        virtual_stages: 2,
        num_microbatches: m,
        placement,
        ranks,
    }
}
