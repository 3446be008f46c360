//! What a run measured, in the simulator's terms: the median time of each action kind on each
//! stage (and the part of it in tensor-parallel collectives), of each point-to-point hop between stages, and of each rank's end-of-step work (the
//! data-parallel all-reduce and AdamW), over the steps after the first.

use std::collections::HashMap;

use autopp_profiler::median;
use autopp_schedule::deps::{self, Output};
use autopp_schedule::ActionKind;
use serde::Serialize;

use crate::config::ExecConfig;
use crate::record::RankTrace;

/// Measured per-action times, the simulator's inputs for a prediction of the run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    /// Per global stage, the median seconds of its `[F, B, I, W]` actions (0 for a kind the
    /// schedule does not run), tensor-parallel collectives included (they run inside the
    /// action, between its GEMMs, as in Megatron).
    pub stage_s: Vec<[f64; 4]>,
    /// Per global stage, the median seconds of its `[F, B, I, W]` actions spent in
    /// tensor-parallel collectives (all 0 without tp): the part of [`Measured::stage_s`] the
    /// planner charges as tp communication.
    pub tp_comm_s: Vec<[f64; 4]>,
    /// Per boundary between stages `k` and `k + 1` (length `stages − 1`), the median seconds
    /// from the end of the sending action to the start of the receiving one, over the
    /// transfers (both directions) whose receiver was already waiting when the sender finished;
    /// 0 where the two stages share a rank or no receiver waited.
    pub p2p_s: Vec<f64>,
    /// Per pipeline rank, the median seconds from the end of its action list to the end of its
    /// step (the gradient all-reduce and AdamW; the slowest replica of each step).
    pub end_of_step_s: Vec<f64>,
}

fn kind_index(kind: ActionKind) -> usize {
    match kind {
        ActionKind::F => 0,
        ActionKind::B => 1,
        ActionKind::I => 2,
        ActionKind::W => 3,
    }
}

/// Medians over the steps `steps` (0-based) of `ranks`' records.
pub fn measure(cfg: &ExecConfig, ranks: &[RankTrace], steps: &[usize]) -> Measured {
    let stages = cfg.num_stages();
    let mut samples: Vec<[Vec<f64>; 4]> = vec![Default::default(); stages];
    let mut comm: Vec<[Vec<f64>; 4]> = vec![Default::default(); stages];
    let mut hops: Vec<Vec<f64>> = vec![Vec::new(); stages.saturating_sub(1)];
    let mut tails: Vec<Vec<f64>> = vec![Vec::new(); cfg.pp()];
    // (replica, tp rank, step, stage, micro-batch, result) → end of the action that sends it
    let mut ends: HashMap<(usize, usize, usize, usize, u32, Output), f64> = HashMap::new();
    for r in ranks {
        for &k in steps {
            for e in &r.steps[k].events {
                let a = e.action;
                samples[a.stage as usize][kind_index(a.kind)].push(e.end_s - e.start_s);
                comm[a.stage as usize][kind_index(a.kind)].push(e.tp_comm_s);
                if let Some(output) = deps::output(a.kind) {
                    let key = (
                        r.replica,
                        r.tp_rank,
                        k,
                        a.stage as usize,
                        a.microbatch,
                        output,
                    );
                    ends.insert(key, e.end_s);
                }
            }
        }
    }
    for r in ranks {
        for &k in steps {
            for e in &r.steps[k].events {
                let a = e.action;
                let s = a.stage as usize;
                let Some(input) = deps::received(a.kind, s, stages) else {
                    continue;
                };
                let (from, boundary) = (input.stage, input.stage.min(s));
                if cfg.schedule.rank_of(from) == cfg.schedule.rank_of(s) {
                    continue;
                }
                let key = (r.replica, r.tp_rank, k, from, a.microbatch, input.output);
                if let Some(&sent) = ends.get(&key) {
                    // the receiver asked before the sender finished: the gap is the transfer
                    if e.start_s - e.wait_s < sent {
                        hops[boundary].push((e.start_s - sent).max(0.0));
                    }
                }
            }
        }
    }
    for &k in steps {
        let mut slowest = vec![0.0f64; cfg.pp()];
        for r in ranks {
            let s = &r.steps[k];
            slowest[r.pp_rank] = slowest[r.pp_rank].max(s.end_s - s.pipeline_end_s);
        }
        for (t, x) in tails.iter_mut().zip(slowest) {
            t.push(x);
        }
    }
    let medians = |v: &[[Vec<f64>; 4]]| -> Vec<[f64; 4]> {
        v.iter()
            .map(|s| std::array::from_fn(|k| median(&s[k])))
            .collect()
    };
    Measured {
        stage_s: medians(&samples),
        tp_comm_s: medians(&comm),
        p2p_s: hops.iter().map(|h| median(h)).collect(),
        end_of_step_s: tails.iter().map(|t| median(t)).collect(),
    }
}
