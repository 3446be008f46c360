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

mod general;
mod metrics;
use crate::deps::{self, Output};
use crate::ir::{Action, ActionKind, Schedule};

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
    /// The engine for `s` under `costs`, after checking that they fit together.
    pub(super) fn new(s: &'a Schedule, costs: &'a SimCosts) -> Result<Self, SimError> {
        check_shape(s)?;
        let num_stages = s.num_stages();
        let dur = durations(costs, num_stages)?;
        let overlap = costs.overlap_factor.unwrap_or(0.0);
        if !(0.0..=1.0).contains(&overlap) {
            return Err(SimError::InvalidCost(format!(
                "overlap factor {overlap} is outside [0, 1]"
            )));
        }
        let (comm_prev, comm_next) = hops(s, &costs.p2p_s);
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

    /// When an action of `kind` on stage `s` whose `F` slot is `base` can start on its inputs
    /// ([`deps::inputs`]: each one's end, plus the hop when it comes from another rank), or
    /// the slot of the first input not yet done.
    #[inline(always)]
    fn ready_at(
        &self,
        kind: ActionKind,
        s: usize,
        base: usize,
        done: &[f64],
    ) -> Result<f64, usize> {
        // the latest input, each plus its hop; 0 for an action without inputs
        let mut ready: Option<f64> = None;
        deps::try_for_each_input(kind, s, self.num_stages, |input| {
            // the input's pair is `input.stage − s` pairs (2 slots each) from the action's
            let slot = (base + offset(input.output)).wrapping_add(input.stage.wrapping_sub(s) << 1);
            let t = done[slot];
            if t.is_nan() {
                return Err(slot);
            }
            let t = if input.stage == s {
                t
            } else {
                t + self.hop_s(s, input.stage)
            };
            ready = Some(ready.map_or(t, |r| r.max(t)));
            Ok(())
        })?;
        Ok(ready.unwrap_or(0.0))
    }

    /// The send time into stage `s` from the neighbouring stage `from` (0 from `s` itself, and
    /// between stages on the same rank).
    #[inline(always)]
    fn hop_s(&self, s: usize, from: usize) -> f64 {
        if from < s {
            self.comm_prev[s]
        } else if from > s {
            self.comm_next[s]
        } else {
            0.0
        }
    }

    /// The slot that the end of an action of `kind` whose `F` slot is `base` fills for the
    /// actions that wait for it ([`deps::output`]); `None` for a `W`.
    #[inline(always)]
    fn output_slot(base: usize, kind: ActionKind) -> Option<usize> {
        deps::output(kind).map(|o| base + offset(o))
    }
}

/// Where a result sits next to its pair's `F` slot: the forward's end in the slot itself, the
/// backward-input part's in the next.
#[inline(always)]
fn offset(output: Output) -> usize {
    usize::from(output == Output::Backward)
}

/// Checks that `s` has one list per rank, non-zero sizes and at least as many actions as
/// (stage, micro-batch) pairs.
fn check_shape(s: &Schedule) -> Result<(), SimError> {
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
    Ok(())
}

/// Per stage, the durations of `F`, `B`, `I`, `W`, after checking the lengths of `costs`
/// against `num_stages` and that every time is finite and non-negative.
fn durations(costs: &SimCosts, num_stages: usize) -> Result<Vec<[f64; 4]>, SimError> {
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
    Ok(dur)
}

/// Per stage `k`, the hop time from stage `k−1` and from stage `k+1`: `p2p_s` of the boundary
/// when the two stages sit on different ranks, 0 otherwise (and past either end).
fn hops(s: &Schedule, p2p_s: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let num_stages = s.num_stages();
    let rank: Vec<usize> = (0..num_stages).map(|k| s.rank_of(k)).collect();
    let comm_prev = (0..num_stages)
        .map(|k| match k {
            0 => 0.0,
            _ if rank[k - 1] == rank[k] => 0.0,
            _ => p2p_s[k - 1],
        })
        .collect();
    let comm_next = (0..num_stages)
        .map(|k| match k {
            _ if k + 1 == num_stages => 0.0,
            _ if rank[k + 1] == rank[k] => 0.0,
            _ => p2p_s[k],
        })
        .collect();
    (comm_prev, comm_next)
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
