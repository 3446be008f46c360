//! What the simulator predicts for an executor run: peak bytes kept for backward per rank,
//! from `autopp-models`' fp32 byte counts of the executor's own layers, and the bubble from
//! measured per-action times.

use autopp_planner::schedule::{simulate, SimCosts, StageCosts};

use crate::config::ExecConfig;
use crate::error::ExecError;

/// Per global stage, the bytes one micro-batch keeps from `F` to `B` (or `I`), and from `I`
/// to `W`: the sums of the stage's layers' [`autopp_models::Fp32LayerBytes`].
pub fn stage_bytes(cfg: &ExecConfig) -> Vec<(u64, u64)> {
    let layers = cfg.model.fp32_layer_bytes(cfg.micro_batch_size as u64);
    cfg.stage_ranges()
        .into_iter()
        .map(|r| {
            layers[r].iter().fold((0, 0), |(a, w), l| {
                (a + l.activation_bytes, w + l.weight_grad_bytes)
            })
        })
        .collect()
}

/// Mean seconds of each action kind per global stage: `[F, B, I, W]`.
pub type StageTimes = Vec<[f64; 4]>;

fn costs(cfg: &ExecConfig, times: Option<&StageTimes>) -> SimCosts {
    let bytes = stage_bytes(cfg);
    let stages = bytes
        .iter()
        .enumerate()
        .map(|(s, &(activation_bytes, weight_grad_bytes))| {
            let [f, b, i, w] = times.map_or([1.0, 2.0, 1.0, 1.0], |t| t[s]);
            StageCosts {
                forward_s: f,
                backward_s: b,
                backward_input_s: i,
                backward_weight_s: w,
                activation_bytes,
                weight_grad_bytes,
            }
        })
        .collect();
    SimCosts {
        stages,
        p2p_s: vec![0.0; cfg.num_stages().saturating_sub(1)],
        overlap_factor: None,
    }
}

/// The simulator's peak bytes kept for backward on each pipeline rank. Ranks run their lists
/// in order, so the peak depends on the order and the byte counts only, not on times.
pub fn peak_activation_bytes(cfg: &ExecConfig) -> Result<Vec<u64>, ExecError> {
    let r = simulate(&cfg.schedule, &costs(cfg, None))
        .map_err(|e| ExecError::Schedule(e.to_string()))?;
    Ok(r.peak_activation_bytes)
}

/// The simulator's bubble fraction per pipeline rank (`1 − busy / makespan`) with the
/// measured mean time of each action kind on each stage and free sends.
pub fn bubble_fraction(cfg: &ExecConfig, times: &StageTimes) -> Result<Vec<f64>, ExecError> {
    let r = simulate(&cfg.schedule, &costs(cfg, Some(times)))
        .map_err(|e| ExecError::Schedule(e.to_string()))?;
    Ok(r.busy_s
        .iter()
        .map(|b| {
            if r.makespan_s > 0.0 {
                1.0 - b / r.makespan_s
            } else {
                0.0
            }
        })
        .collect())
}
