//! What the simulator predicts for an executor run: peak bytes kept for backward per rank,
//! from `autopp-models`' fp32 byte counts of the executor's own layers, and the bubble and the
//! iteration time from measured per-action times ([`Measured`]) — the same simulator the
//! planner uses, so the run checks the planner's model of time.

use autopp_schedule::{simulate, SimCosts, StageCosts};

use crate::config::ExecConfig;
use crate::error::ExecError;
use crate::measure::Measured;

/// Per global stage, the bytes one micro-batch keeps from `F` to `B` (or `I`), and from `I`
/// to `W`, on tensor-parallel rank 0 (the most): the sums of the stage's layers'
/// [`autopp_profiler::Fp32LayerBytes`].
pub fn stage_bytes(cfg: &ExecConfig) -> Vec<(u64, u64)> {
    let layers = autopp_profiler::fp32_layers::fp32_layer_bytes_sp(
        &cfg.model,
        cfg.micro_batch_size as u64,
        cfg.tp as u64,
        cfg.sequence_parallel,
    );
    cfg.stage_ranges()
        .into_iter()
        .map(|r| {
            layers[r].iter().fold((0, 0), |(a, w), l| {
                (a + l.activation_bytes, w + l.weight_grad_bytes)
            })
        })
        .collect()
}

fn costs(cfg: &ExecConfig, measured: Option<&Measured>) -> SimCosts {
    let bytes = stage_bytes(cfg);
    let stages = bytes
        .iter()
        .enumerate()
        .map(|(s, &(activation_bytes, weight_grad_bytes))| {
            let [f, b, i, w] = measured.map_or([1.0, 2.0, 1.0, 1.0], |m| m.stage_s[s]);
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
        p2p_s: measured.map_or_else(
            || vec![0.0; cfg.num_stages().saturating_sub(1)],
            |m| m.p2p_s.clone(),
        ),
        overlap_factor: None,
    }
}

/// The simulator's peak bytes kept for backward on each pipeline rank. Ranks run their lists
/// in order, so the peak depends on the order and the byte counts only, not on times.
pub fn peak_activation_bytes(cfg: &ExecConfig) -> Result<Vec<u64>, ExecError> {
    let r = simulate(&cfg.schedule, &costs(cfg, None))?;
    Ok(r.peak_activation_bytes)
}

/// What the simulator predicts from measured action times.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Per pipeline rank, the bubble fraction `1 − busy / makespan` of the pipeline phase.
    pub bubble_fraction: Vec<f64>,
    /// The iteration time, seconds: the latest over ranks of the simulated end of the rank's
    /// list plus its measured end-of-step work (all-reduce and AdamW), as the planner adds the
    /// gradient reduction and the optimizer step to the makespan.
    pub iteration_time_s: f64,
}

/// Simulates the run's schedule with the measured median time of each action kind on each
/// stage and of each hop between ranks. An action's time includes its tensor-parallel
/// collectives ([`Measured::tp_comm_s`]), as the planner adds tp communication to a stage's
/// compute, so a tensor-parallel run's prediction carries its measured collectives.
pub fn from_measured(cfg: &ExecConfig, measured: &Measured) -> Result<Prediction, ExecError> {
    let r = simulate(&cfg.schedule, &costs(cfg, Some(measured)))?;
    let iteration_time_s = r
        .timeline
        .iter()
        .zip(&measured.end_of_step_s)
        .map(|(steps, tail)| steps.last().map_or(0.0, |t| t.end_s) + tail)
        .fold(0.0, f64::max);
    let bubble_fraction = r
        .busy_s
        .iter()
        .map(|b| {
            if r.makespan_s > 0.0 {
                1.0 - b / r.makespan_s
            } else {
                0.0
            }
        })
        .collect();
    Ok(Prediction {
        bubble_fraction,
        iteration_time_s,
    })
}
