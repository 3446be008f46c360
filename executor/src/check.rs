//! `--check`: an independent single-worker training loop — no transport, the whole global
//! batch in one forward and one backward — from the same seed, weights and data, and the
//! comparison of its losses and final weights with a pipelined run.
//!
//! **Exactness.** Activations and input gradients are row-wise (every kernel gives a token's
//! row the same bits inside the whole batch as inside its micro-batch), so they match the
//! pipelined run bit for bit. Weight gradients are f32 sums over tokens, whose rounding depends
//! on the order: the single worker adds them in the pipelined run's order — per replica, each
//! stage's micro-batches in the order the schedule runs their `B` or `W` (tokens of a
//! micro-batch in one product, as the pipelined rank does), then the replicas' sums in f64 in
//! group order, rounded once, as the all-reduce does. Same operations on the same values, so
//! the same bits; `max_rel_err` is ~1e-16, from the loss's f64 summation order.
//!
//! The error of a tensor is `‖a − b‖ / max(‖b‖, 1e-12)` with `b` the single-worker value (a
//! step's loss is a one-element tensor); `max_rel_err` is the largest over every step's loss
//! and every parameter of every data-parallel replica after the last step.

use autopp_profiler::device::{Emulated, Flow, Shard, Tensor};
use autopp_schedule::ActionKind;
use serde::Serialize;

use crate::config::ExecConfig;
use crate::error::{ExecError, RankError};
use crate::optim::AdamState;
use crate::report::ExecReport;
use crate::stage::{Stage, StageWeightSaved};
use autopp_profiler::data::SyntheticData;

/// The tolerance the acceptance tests hold `max_rel_err` to.
pub const DEFAULT_TOLERANCE: f64 = 1e-5;

/// What the single-worker loop produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    /// Mean token loss per step.
    pub losses: Vec<f64>,
    /// The parameters after the last step, `("layer 3 qkv.weight", tensor)` in layer-list
    /// order.
    pub params: Vec<(String, Tensor)>,
}

/// The comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckReport {
    /// Largest relative error over step losses and final parameters.
    pub max_rel_err: f64,
    /// Where it occurred (`loss at step 3`, `replica 1 layer 4 fc1.weight`).
    pub worst: String,
    /// `max_rel_err <= tolerance`.
    pub passed: bool,
    /// The tolerance.
    pub tolerance: f64,
    /// The single-worker losses per step.
    pub reference_losses: Vec<f64>,
}

/// Trains `cfg.steps` steps on one worker with the whole global batch at once.
pub fn train_single_worker(cfg: &ExecConfig) -> Result<Reference, ExecError> {
    cfg.validate()?;
    let fail = |step: usize, e: RankError| ExecError::Rank {
        rank: 0,
        replica: 0,
        pp_rank: 0,
        step: step + 1,
        action: None,
        message: format!("single-worker check: {e}"),
    };
    // one worker: its GEMMs may use every core (the bits do not depend on it)
    let _engine = crate::backend::EngineGuard::install(crate::backend::Backend::Cpu, 0, 0)
        .map(|g| g.with_gemm_threads(crate::backend::gemm_threads_per_rank(1)))
        .map_err(|message| fail(0, RankError::Schedule(message)))?;
    let data = SyntheticData::new(cfg.seed, cfg.model.vocab_size as usize, cfg.seq_len());
    let entries = cfg.model.num_layers as usize + 2;
    let mut model = Stage::new(&cfg.model, cfg.seed, 0..entries, Shard::WHOLE);
    let mut adam = AdamState::new(&model);
    let n = cfg.global_batch_size();
    let tokens = n * cfg.seq_len();
    let scale = 1.0 / tokens as f32;
    let mut losses = Vec::with_capacity(cfg.steps);
    // the whole layers compute every tensor-parallel sum as the ranks split it
    let mut emulated = Emulated {
        tp: cfg.tp,
        sequence_parallel: cfg.sequence_parallel,
    };
    for step in 0..cfg.steps {
        let input = Flow::Tokens(data.inputs(step, 0..n));
        let targets = data.targets(step, 0..n);
        let (out, saved) = model
            .forward(input, Some(targets), n, cfg.seq_len(), &mut emulated)
            .map_err(|e| fail(step, e))?;
        let Flow::Loss(sum) = out else {
            return Err(fail(
                step,
                RankError::Schedule("the model did not end in a loss".into()),
            ));
        };
        losses.push(sum / tokens as f64);
        let (_, ws) = model
            .backward_input(saved, None, scale, &mut emulated)
            .map_err(|e| fail(step, e))?;
        pipelined_weight_gradients(cfg, &mut model, &ws).map_err(|e| fail(step, e))?;
        adam.step(&cfg.optimizer, &mut model);
        model.zero_grads();
    }
    let params = model
        .named_params()
        .into_iter()
        .map(|(n, t)| (n, t.clone()))
        .collect();
    Ok(Reference { losses, params })
}

/// Per stage, its micro-batches in the order the schedule runs their weight gradients (`B` or
/// `W`): the order a pipelined rank adds them into the stage's accumulators.
fn weight_gradient_order(cfg: &ExecConfig) -> Vec<Vec<usize>> {
    let mut order = vec![Vec::new(); cfg.num_stages()];
    for list in &cfg.schedule.ranks {
        // the worker runs an overlapped pair's forward first; B and W keep their text order
        for a in list.iter().flat_map(|s| s.actions()) {
            if matches!(a.kind, ActionKind::B | ActionKind::W) {
                order[a.stage as usize].push(a.microbatch as usize);
            }
        }
    }
    order
}

/// The whole batch's weight gradients into `model.grads` (zero on entry), summed as the
/// pipelined run sums them (see the module's documentation).
fn pipelined_weight_gradients(
    cfg: &ExecConfig,
    model: &mut Stage,
    ws: &StageWeightSaved,
) -> Result<(), RankError> {
    let order = weight_gradient_order(cfg);
    let seq_len = cfg.seq_len();
    let mut total: Vec<f64> = Vec::new();
    let mut replica = Vec::new();
    for d in 0..cfg.dp {
        model.zero_grads();
        for (s, range) in cfg.stage_ranges().into_iter().enumerate() {
            for layer in range {
                for &i in &order[s] {
                    let seqs = cfg.sequences_of(d, i);
                    let rows = seqs.start * seq_len..seqs.end * seq_len;
                    model.backward_weight_rows(ws, layer, rows)?;
                }
            }
        }
        // the all-reduce: from 0.0, replicas in group order, in f64
        model.flat_grads_into(&mut replica);
        if d == 0 {
            total = vec![0.0; replica.len()];
        }
        for (t, x) in total.iter_mut().zip(&replica) {
            *t += x;
        }
    }
    model.set_flat_grads(&total);
    Ok(())
}

fn rel_err(a: f64, b: f64) -> f64 {
    (a - b).abs() / b.abs().max(1e-12)
}

/// Compares a pipelined run with the single-worker reference.
pub fn compare(report: &ExecReport, reference: &Reference, tolerance: f64) -> CheckReport {
    let mut worst = (0.0f64, String::from("nothing compared"));
    let mut note = |err: f64, what: String| {
        if err > worst.0 || err.is_nan() {
            worst = (if err.is_nan() { f64::INFINITY } else { err }, what);
        }
    };
    for (k, (a, b)) in report.losses.iter().zip(&reference.losses).enumerate() {
        note(rel_err(*a, *b), format!("loss at step {}", k + 1));
    }
    if report.losses.len() != reference.losses.len() {
        note(f64::INFINITY, "the number of steps".into());
    }
    let replicas = report
        .ranks
        .iter()
        .map(|r| r.replica + 1)
        .max()
        .unwrap_or(0);
    for d in 0..replicas {
        let params = report.params_of_replica(d);
        if params.len() != reference.params.len() {
            note(f64::INFINITY, format!("replica {d}: the parameter count"));
        }
        for ((name, a), (ref_name, b)) in params.iter().zip(&reference.params) {
            if name != ref_name || a.shape() != b.shape() {
                note(
                    f64::INFINITY,
                    format!("replica {d} {name}: does not line up with {ref_name}"),
                );
                continue;
            }
            note(
                a.distance(b) / b.norm().max(1e-12),
                format!("replica {d} {name}"),
            );
        }
    }
    CheckReport {
        max_rel_err: worst.0,
        worst: worst.1,
        passed: worst.0 <= tolerance,
        tolerance,
        reference_losses: reference.losses.clone(),
    }
}
