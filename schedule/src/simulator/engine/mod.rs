//! The simulator's dependency engine: one pass over the actions.
//!
//! Each rank has a cursor into its list. A rank runs steps while their inputs are done; when
//! an input is missing it parks on that input's slot (an intrusive list: the slot holds the
//! first parked rank, each rank the next one) and is woken when the input finishes. Every
//! action is started once and every input finishes once, so the run is O(total actions).
//!
//! End times live in one flat vector, micro-batch major, so an action and its inputs share
//! cache lines: slot `2·(i·S + s)` holds the end of `F(s,i)`, slot `2·(i·S + s) + 1` the end
//! of `B(s,i)` or `I(s,i)`. The scratch vectors are kept per thread between runs.

use std::cell::RefCell;

use super::{SimCosts, SimError, SimResult, TimedStep};

mod metrics;
use crate::ir::{Action, ActionKind, Schedule, Step};

const NONE: u32 = u32::MAX;

/// Larger runs use fresh vectors instead of the per-thread scratch (at most 48 MiB kept).
const MAX_SCRATCH_SLOTS: usize = 1 << 22;

/// Per-thread vectors reused between runs.
struct Scratch {
    /// End times, reset to NaN for each run.
    done: Vec<f64>,
    /// Parked-rank heads; all `NONE` after a run that finished (every park was released).
    heads: Vec<u32>,
    /// Whether `heads` may hold parked ranks from a run that stopped early.
    heads_dirty: bool,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = const {
        RefCell::new(Scratch { done: Vec::new(), heads: Vec::new(), heads_dirty: false })
    };
}

pub(super) struct Engine<'a> {
    s: &'a Schedule,
    m: usize,
    num_stages: usize,
    /// Per stage, the durations of F, B, I, W.
    dur: Vec<[f64; 4]>,
    /// Per stage `s`, the hop time from stage `s−1` (0 on the same rank or for stage 0).
    comm_prev: Vec<f64>,
    /// Per stage `s`, the hop time from stage `s+1` (0 on the same rank or for the last).
    comm_next: Vec<f64>,
    /// Per stage, activation bytes and weight-gradient bytes.
    bytes: Vec<(u64, u64)>,
    /// Overlap factor of pairs.
    overlap: f64,
}

/// Records the bytes alive after a change at `t`; changes at the same instant (a backward
/// ending as the next forward starts) collapse into one point.
#[inline]
fn push_memory(curve: &mut Vec<(f64, u64)>, t: f64, bytes: u64) {
    match curve.last_mut() {
        Some(last) if last.0 == t => last.1 = bytes,
        _ => curve.push((t, bytes)),
    }
}

/// Per rank: the next step, the time it is free, busy seconds, in-flight micro-batches and
/// live bytes with their peaks.
struct RankState {
    pos: Vec<usize>,
    free_s: Vec<f64>,
    busy_s: Vec<f64>,
    inflight: Vec<i64>,
    peak_inflight: Vec<i64>,
    alive: Vec<u64>,
    peak_bytes: Vec<u64>,
}

impl RankState {
    fn new(pp: usize) -> Self {
        RankState {
            pos: vec![0; pp],
            free_s: vec![0.0; pp],
            busy_s: vec![0.0; pp],
            inflight: vec![0; pp],
            peak_inflight: vec![0; pp],
            alive: vec![0; pp],
            peak_bytes: vec![0; pp],
        }
    }
}

/// Mutable state of one run.
struct State<'v> {
    done: &'v mut [f64],
    wait_head: &'v mut [u32],
    wait_next: Vec<u32>,
    parked_on: Vec<usize>,
    ready: Vec<u32>,
}

impl<'v> State<'v> {
    /// A run's start: nothing done or parked, every rank ready (rank 0 first).
    fn new(done: &'v mut [f64], wait_head: &'v mut [u32], pp: usize) -> Self {
        State {
            done,
            wait_head,
            wait_next: vec![NONE; pp],
            parked_on: vec![0; pp],
            ready: (0..pp as u32).rev().collect(),
        }
    }

    #[inline]
    fn park(&mut self, rank: usize, slot: usize) {
        self.wait_next[rank] = self.wait_head[slot];
        self.wait_head[slot] = rank as u32;
        self.parked_on[rank] = slot;
    }

    #[inline]
    fn finish(&mut self, slot: usize, end: f64) {
        self.done[slot] = end;
        let mut r = self.wait_head[slot];
        if r == NONE {
            return;
        }
        self.wait_head[slot] = NONE;
        while r != NONE {
            self.ready.push(r);
            r = std::mem::replace(&mut self.wait_next[r as usize], NONE);
        }
    }
}

impl<'a> Engine<'a> {
    pub(super) fn new(s: &'a Schedule, costs: &'a SimCosts) -> Result<Self, SimError> {
        if s.pp == 0 || s.virtual_stages == 0 {
            return Err(SimError::InvalidSchedule(
                "pp and virtual_stages must be at least 1".into(),
            ));
        }
        if s.ranks.len() != s.pp {
            return Err(SimError::InvalidSchedule(format!(
                "it has {} rank lists but pp = {}",
                s.ranks.len(),
                s.pp
            )));
        }
        let num_stages = s.num_stages();
        let declared =
            s.pp.checked_mul(s.virtual_stages)
                .and_then(|x| x.checked_mul(s.num_microbatches));
        let listed = s.num_actions();
        if declared.is_none_or(|pairs| pairs > listed) {
            return Err(SimError::InvalidSchedule(format!(
                "it lists {listed} actions, fewer than the pp x virtual_stages x \
                 num_microbatches = {} x {} x {} (stage, micro-batch) pairs it declares \
                 (a complete schedule lists two actions or more per pair)",
                s.pp, s.virtual_stages, s.num_microbatches
            )));
        }
        if costs.stages.len() != num_stages {
            return Err(SimError::CostsLength {
                what: "stages",
                expected: num_stages,
                got: costs.stages.len(),
            });
        }
        if costs.p2p_s.len() != num_stages - 1 {
            return Err(SimError::CostsLength {
                what: "p2p_s",
                expected: num_stages - 1,
                got: costs.p2p_s.len(),
            });
        }
        let bad = |x: f64| !x.is_finite() || x < 0.0;
        let dur: Vec<[f64; 4]> = costs
            .stages
            .iter()
            .map(|c| {
                [
                    c.forward_s,
                    c.backward_s,
                    c.backward_input_s,
                    c.backward_weight_s,
                ]
            })
            .collect();
        if let Some(k) = dur.iter().position(|d| d.iter().any(|&x| bad(x))) {
            return Err(SimError::InvalidCost(format!(
                "stage {k} has a negative or non-finite time ({:?})",
                costs.stages[k]
            )));
        }
        if let Some(k) = costs.p2p_s.iter().position(|&x| bad(x)) {
            return Err(SimError::InvalidCost(format!(
                "p2p time between stages {k} and {} is {}",
                k + 1,
                costs.p2p_s[k]
            )));
        }
        let overlap = costs.overlap_factor.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&overlap) {
            return Err(SimError::InvalidCost(format!(
                "overlap factor {overlap} is outside [0, 1]"
            )));
        }
        let rank: Vec<usize> = (0..num_stages).map(|k| s.rank_of(k)).collect();
        let comm_prev = (0..num_stages)
            .map(|k| match k {
                0 => 0.0,
                _ if rank[k - 1] == rank[k] => 0.0,
                _ => costs.p2p_s[k - 1],
            })
            .collect();
        let comm_next = (0..num_stages)
            .map(|k| match k {
                _ if k + 1 == num_stages => 0.0,
                _ if rank[k + 1] == rank[k] => 0.0,
                _ => costs.p2p_s[k],
            })
            .collect();
        Ok(Engine {
            s,
            m: s.num_microbatches,
            num_stages,
            dur,
            comm_prev,
            comm_next,
            bytes: costs
                .stages
                .iter()
                .map(|c| (c.activation_bytes, c.weight_grad_bytes))
                .collect(),
            overlap,
        })
    }

    /// Runs with the scratch vectors of this thread (fresh ones if they are in use).
    pub(super) fn run<const RECORD: bool>(self) -> Result<SimResult, SimError> {
        let n = 2 * self.num_stages * self.m;
        if n > MAX_SCRATCH_SLOTS {
            return self.run_any::<RECORD>(&mut vec![f64::NAN; n], &mut vec![NONE; n]);
        }
        SCRATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut scratch) => {
                let sc = &mut *scratch;
                sc.done.clear();
                sc.done.resize(n, f64::NAN);
                if sc.heads_dirty {
                    sc.heads.clear();
                }
                if sc.heads.len() < n {
                    sc.heads.resize(n, NONE);
                }
                let result = self.run_any::<RECORD>(&mut sc.done, &mut sc.heads[..n]);
                sc.heads_dirty = result.is_err();
                result
            }
            Err(_) => self.run_any::<RECORD>(&mut vec![f64::NAN; n], &mut vec![NONE; n]),
        })
    }

    /// Without a timeline, the compiled loop of [`metrics`] where it applies; otherwise, and
    /// for what it leaves (overlapped pairs, bad actions, deadlocks: their errors), the general
    /// loop. `done` must be all NaN and `wait_head` all `NONE`.
    fn run_any<const RECORD: bool>(
        &self,
        done: &mut [f64],
        wait_head: &mut [u32],
    ) -> Result<SimResult, SimError> {
        if !RECORD {
            if let Some(result) = self.run_metrics(done, wait_head) {
                return Ok(result);
            }
            done.fill(f64::NAN);
            wait_head.fill(NONE);
        }
        self.run_with::<RECORD>(done, wait_head)
    }

    /// The end-time slot of `F(s,i)`; the `B`-or-`I` slot is one higher.
    fn slot(&self, stage: usize, mb: usize) -> usize {
        2 * (mb * self.num_stages + stage)
    }

    /// When `a` can start on its inputs, or the slot it waits for. `a` must be in range.
    #[inline]
    fn ready_s(&self, a: Action, done: &[f64]) -> Result<f64, usize> {
        let s = a.stage as usize;
        self.ready_at(a.kind, s, self.slot(s, a.microbatch as usize), done)
    }

    /// When an action of `kind` on stage `s` whose `F` slot is `base` can start on its inputs,
    /// or the slot it waits for.
    #[inline]
    fn ready_at(
        &self,
        kind: ActionKind,
        s: usize,
        base: usize,
        done: &[f64],
    ) -> Result<f64, usize> {
        match kind {
            ActionKind::F if s == 0 => Ok(0.0),
            ActionKind::F => {
                let t = done[base - 2];
                if t.is_nan() {
                    Err(base - 2)
                } else {
                    Ok(t + self.comm_prev[s])
                }
            }
            ActionKind::B | ActionKind::I => {
                let t = done[base];
                if t.is_nan() {
                    return Err(base);
                }
                if s + 1 == self.num_stages {
                    return Ok(t);
                }
                let g = done[base + 3];
                if g.is_nan() {
                    Err(base + 3)
                } else {
                    Ok(t.max(g + self.comm_next[s]))
                }
            }
            ActionKind::W => {
                let t = done[base + 1];
                if t.is_nan() {
                    Err(base + 1)
                } else {
                    Ok(t)
                }
            }
        }
    }

    #[inline]
    fn in_range(&self, a: Action, rank: usize, idx: usize, step: &Step) -> Result<(), SimError> {
        if (a.stage as usize) < self.num_stages && (a.microbatch as usize) < self.m {
            Ok(())
        } else {
            Err(self.out_of_range(a, rank, idx, step))
        }
    }

    #[cold]
    fn out_of_range(&self, a: Action, rank: usize, idx: usize, step: &Step) -> SimError {
        let reason = if a.stage as usize >= self.num_stages {
            format!("stage {} is outside 0..{}", a.stage, self.num_stages)
        } else if a.microbatch as usize >= self.m {
            format!("micro-batch {} is outside 0..{}", a.microbatch, self.m)
        } else {
            "is out of range".to_string()
        };
        SimError::InvalidAction {
            rank,
            step_index: idx,
            step: step.to_string(),
            reason,
        }
    }

    fn slot_text(&self, slot: usize) -> String {
        let (pair, backward) = (slot / 2, slot % 2 == 1);
        let (i, s) = (pair / self.num_stages, pair % self.num_stages);
        if backward {
            format!("{s}B{i} (or {s}I{i})")
        } else {
            format!("{s}F{i}")
        }
    }

    fn run_with<const RECORD: bool>(
        &self,
        done: &mut [f64],
        wait_head: &mut [u32],
    ) -> Result<SimResult, SimError> {
        let s = self.s;
        let pp = s.pp;
        let mut st = State::new(done, wait_head, pp);
        let RankState {
            mut pos,
            mut free_s,
            mut busy_s,
            mut inflight,
            mut peak_inflight,
            mut alive,
            mut peak_bytes,
        } = RankState::new(pp);
        let mut timeline: Vec<Vec<TimedStep>> = Vec::new();
        let mut memory: Vec<Vec<(f64, u64)>> = Vec::new();
        if RECORD {
            timeline = s
                .ranks
                .iter()
                .map(|l| Vec::with_capacity(l.len()))
                .collect();
            memory = s
                .ranks
                .iter()
                .map(|l| Vec::with_capacity(l.len()))
                .collect();
        }

        while let Some(r) = st.ready.pop() {
            let r = r as usize;
            let list = &s.ranks[r];
            let mut free = free_s[r];
            let mut busy = busy_s[r];
            while pos[r] < list.len() {
                let idx = pos[r];
                let step = list[idx];
                let (start, end) = match step {
                    Step::One(a) => {
                        self.in_range(a, r, idx, &step)?;
                        let ready = match self.ready_s(a, st.done) {
                            Ok(t) => t,
                            Err(slot) => {
                                st.park(r, slot);
                                break;
                            }
                        };
                        let d = self.dur[a.stage as usize][a.kind.index()];
                        let start = ready.max(free);
                        busy += d;
                        (start, start + d)
                    }
                    Step::Overlapped(a, b) => {
                        self.in_range(a, r, idx, &step)?;
                        self.in_range(b, r, idx, &step)?;
                        let ready = match (self.ready_s(a, st.done), self.ready_s(b, st.done)) {
                            (Ok(x), Ok(y)) => x.max(y),
                            (Err(slot), _) | (_, Err(slot)) => {
                                st.park(r, slot);
                                break;
                            }
                        };
                        let da = self.dur[a.stage as usize][a.kind.index()];
                        let db = self.dur[b.stage as usize][b.kind.index()];
                        let d = da + db - self.overlap * da.min(db);
                        let start = ready.max(free);
                        busy += d;
                        (start, start + d)
                    }
                };
                free = end;
                pos[r] += 1;

                // In-flight and bytes: increments at the start, decrements at the end.
                let (first, second) = match step {
                    Step::One(a) => (a, None),
                    Step::Overlapped(a, b) => (a, Some(b)),
                };
                let mut grew = false;
                for x in std::iter::once(first).chain(second) {
                    if x.kind == ActionKind::F {
                        inflight[r] += 1;
                        alive[r] += self.bytes[x.stage as usize].0;
                        grew = true;
                    }
                }
                if grew {
                    peak_inflight[r] = peak_inflight[r].max(inflight[r]);
                    peak_bytes[r] = peak_bytes[r].max(alive[r]);
                    if RECORD {
                        push_memory(&mut memory[r], start, alive[r]);
                    }
                }
                let mut shrank = false;
                for x in std::iter::once(first).chain(second) {
                    let base = self.slot(x.stage as usize, x.microbatch as usize);
                    match x.kind {
                        ActionKind::F => st.finish(base, end),
                        ActionKind::B => {
                            let (act, _) = self.bytes[x.stage as usize];
                            inflight[r] -= 1;
                            alive[r] = alive[r].saturating_sub(act);
                            shrank = true;
                            st.finish(base + 1, end);
                        }
                        ActionKind::I => {
                            let (act, wgb) = self.bytes[x.stage as usize];
                            alive[r] = (alive[r] + wgb).saturating_sub(act);
                            peak_bytes[r] = peak_bytes[r].max(alive[r]);
                            shrank = true;
                            st.finish(base + 1, end);
                        }
                        ActionKind::W => {
                            let (_, wgb) = self.bytes[x.stage as usize];
                            inflight[r] -= 1;
                            alive[r] = alive[r].saturating_sub(wgb);
                            shrank = true;
                        }
                    }
                }
                if RECORD {
                    if shrank {
                        push_memory(&mut memory[r], end, alive[r]);
                    }
                    timeline[r].push(TimedStep {
                        step,
                        start_s: start,
                        end_s: end,
                    });
                }
            }
            free_s[r] = free;
            busy_s[r] = busy;
        }

        let stuck: Vec<usize> = (0..pp).filter(|&r| pos[r] < s.ranks[r].len()).collect();
        if let Some(&first) = stuck.first() {
            let describe = |r: usize| {
                (
                    pos[r],
                    s.ranks[r][pos[r]].to_string(),
                    self.slot_text(st.parked_on[r]),
                )
            };
            let (step_index, step, waits_for) = describe(first);
            let others: Vec<String> = stuck[1..]
                .iter()
                .map(|&r| {
                    let (i, text, w) = describe(r);
                    format!("; rank {r} at step {i} ({text}) waits for {w}")
                })
                .collect();
            return Err(SimError::Deadlock {
                rank: first,
                step_index,
                step,
                waits_for,
                others: others.concat(),
            });
        }

        Ok(finish_result(
            free_s,
            busy_s,
            &peak_inflight,
            peak_bytes,
            timeline,
            memory,
        ))
    }
}

/// The simulator's answer from each rank's end (free) time, busy time and peaks.
fn finish_result(
    free_s: Vec<f64>,
    busy_s: Vec<f64>,
    peak_inflight: &[i64],
    peak_bytes: Vec<u64>,
    timeline: Vec<Vec<TimedStep>>,
    memory: Vec<Vec<(f64, u64)>>,
) -> SimResult {
    let pp = free_s.len();
    let makespan_s = free_s.iter().copied().fold(0.0, f64::max);
    let total_busy: f64 = busy_s.iter().sum();
    let bubble_fraction = if makespan_s > 0.0 {
        ((pp as f64 * makespan_s - total_busy) / (pp as f64 * makespan_s)).max(0.0)
    } else {
        0.0
    };
    SimResult {
        makespan_s,
        busy_s,
        bubble_fraction,
        peak_inflight: peak_inflight.iter().map(|&x| x.max(0) as u32).collect(),
        peak_activation_bytes: peak_bytes,
        timeline,
        memory,
    }
}
