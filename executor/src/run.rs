//! The coordinator: one thread per rank (`pp × dp`), in-process transport between them,
//! per-step summaries as they complete, and the report at the end.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use autopp_profiler::device::{Abort, InProcess, Tensor, Transport};
use serde::Serialize;

use crate::backend::{self, EngineGuard};
use crate::barrier::Barrier;
use crate::config::{ExecConfig, FailureMode};
use crate::error::ExecError;
use autopp_profiler::data::SyntheticData;
use autopp_profiler::median;

use crate::measure::{measure, Measured};
use crate::predict;
use crate::stage::Stage;
use crate::worker::{RankStep, Shared, Worker};

/// One finished step, reported while the run goes on.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepSummary {
    /// Step number, 1-based.
    pub step: usize,
    /// Mean token loss over the global batch.
    pub loss: f64,
    /// Wall time of the step (first rank leaving the start barrier to the last rank's optimizer
    /// step), seconds.
    pub time_s: f64,
}

/// Everything one rank did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RankTrace {
    /// World rank.
    pub rank: usize,
    /// Data-parallel replica.
    pub replica: usize,
    /// Pipeline rank.
    pub pp_rank: usize,
    /// Every step.
    pub steps: Vec<RankStep>,
}

/// The result of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecReport {
    /// Mean token loss per step.
    pub losses: Vec<f64>,
    /// Wall time per step, seconds.
    pub step_time_s: Vec<f64>,
    /// Median of the step times after the first (the first when there is one step), seconds.
    pub iteration_time_s: f64,
    /// Per pipeline rank, measured `1 − busy / makespan` of the pipeline phase, averaged over
    /// replicas and the steps after the first.
    pub bubble_fraction: Vec<f64>,
    /// Per pipeline rank, the simulator's bubble with the measured median action times.
    pub predicted_bubble_fraction: Vec<f64>,
    /// The simulator's iteration time with the measured median action and hop times, plus
    /// each rank's measured end-of-step work, seconds (see [`predict::from_measured`]).
    pub predicted_iteration_time_s: f64,
    /// The measured median times the prediction is made from.
    pub measured: Measured,
    /// Per pipeline rank, the most bytes kept for backward after any action of any step.
    pub peak_activation_bytes: Vec<u64>,
    /// Per pipeline rank, the simulator's peak from the models' fp32 byte counts.
    pub predicted_peak_activation_bytes: Vec<u64>,
    /// Per world rank, every action of every step.
    pub ranks: Vec<RankTrace>,
    /// Per world rank, its stages after the last step.
    pub final_stages: Vec<Vec<Stage>>,
}

impl ExecReport {
    /// The parameters of replica `replica` after the last step, as `("layer 3 qkv.weight",
    /// tensor)` in layer-list order.
    pub fn params_of_replica(&self, replica: usize) -> Vec<(String, &Tensor)> {
        let mut stages: Vec<&Stage> = self
            .ranks
            .iter()
            .zip(&self.final_stages)
            .filter(|(r, _)| r.replica == replica)
            .flat_map(|(_, s)| s)
            .collect();
        stages.sort_by_key(|s| s.first_layer);
        stages.into_iter().flat_map(Stage::named_params).collect()
    }
}

/// One rank's answer for one step: its record, or the error and whether it is only a
/// consequence of another rank's failure.
type Report = (usize, usize, Result<RankStep, (ExecError, bool)>);

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// `panicked: <the panic's message>`.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    format!("panicked: {}", panic_message(payload))
}

/// The name of rank `rank`'s thread; `autopp exec` keeps panics of threads so named off stderr,
/// since the error reports them.
pub const RANK_THREAD_PREFIX: &str = "autopp rank ";

/// Trains `cfg.steps` steps of `cfg.model` under `cfg.schedule` on `pp × dp` threads, calling
/// `on_step` as each step completes.
///
/// When a rank fails — an error or a panic — it sets the world's [`Abort`] switch: every other
/// rank stops within [`autopp_profiler::device::ABORT_POLL`] of reaching a receive or the
/// start-of-step barrier, and the error names the rank that failed first and its action. An
/// injected `:kill` ([`FailureMode::Kill`]) is refused: it would end every rank's thread.
pub fn run(
    cfg: &ExecConfig,
    on_step: &mut dyn FnMut(StepSummary),
) -> Result<ExecReport, ExecError> {
    cfg.validate()?;
    let abort = Abort::new();
    let endpoints = InProcess::world_with_abort(
        cfg.world_size(),
        Duration::from_secs_f64(cfg.recv_timeout_s),
        &abort,
    );
    run_world(cfg, endpoints, abort, on_step)
}

/// [`run`] over any transport: `endpoints` (rank `i` at index `i`) share the world's `abort`
/// switch, which a failing rank sets.
pub(crate) fn run_world<T: Transport + Send>(
    cfg: &ExecConfig,
    endpoints: Vec<T>,
    abort: Abort,
    on_step: &mut dyn FnMut(StepSummary),
) -> Result<ExecReport, ExecError> {
    cfg.validate()?;
    if let Some(f) = cfg.inject_failure.filter(|f| f.mode == FailureMode::Kill) {
        return Err(ExecError::invalid(
            "--inject-failure",
            format!("{f} kills the failing rank's process, and here every rank is a thread of this one: ':kill' is only for --transport mpi (one process per rank)"),
        ));
    }
    let world = cfg.world_size();
    let gpus = backend::gpus(cfg.backend)?;
    let shared = Shared {
        cfg,
        data: SyntheticData::new(cfg.seed, cfg.model.vocab_size as usize, cfg.seq_len()),
        barrier: Barrier::new(world),
        abort: abort.clone(),
        world_sync: false,
        epoch: Instant::now(),
    };
    let (tx, rx) = mpsc::channel::<Report>();
    let mut per_step: Vec<Vec<Option<RankStep>>> = vec![vec![None; world]; cfg.steps];
    // the root cause, and whether it is only a consequence of another failure
    let mut first_error: Option<(ExecError, bool)> = None;
    let finals: Vec<Option<(usize, usize, Vec<Stage>)>> = std::thread::scope(|scope| {
        let shared = &shared;
        let mut handles = Vec::with_capacity(world);
        for t in endpoints {
            let tx = tx.clone();
            let rank = t.rank();
            let spawned = std::thread::Builder::new()
                .name(format!("{RANK_THREAD_PREFIX}{rank}"))
                .spawn_scoped(scope, move || rank_thread(shared, t, gpus, &tx));
            match spawned {
                Ok(h) => handles.push(Some(h)),
                Err(e) => {
                    shared.abort_all();
                    first_error.get_or_insert((
                        ExecError::Unsupported(format!(
                            "cannot start the thread of rank {rank}: {e}"
                        )),
                        false,
                    ));
                    handles.push(None);
                }
            }
        }
        drop(tx);
        let mut done = vec![0usize; cfg.steps];
        for (rank, step, r) in rx {
            match r {
                Ok(s) => {
                    per_step[step][rank] = Some(s);
                    done[step] += 1;
                    if done[step] == world && first_error.is_none() {
                        on_step(summarize(cfg, step, &per_step[step]));
                    }
                }
                Err((e, secondary)) => {
                    shared.abort_all();
                    // The root cause is the first failure that is not a consequence of another.
                    if first_error.as_ref().is_none_or(|(_, s)| *s && !secondary) {
                        first_error = Some((e, secondary));
                    }
                }
            }
        }
        handles
            .into_iter()
            .map(|h| h.and_then(|h| h.join().ok().flatten()))
            .collect()
    });
    if let Some((e, _)) = first_error {
        return Err(e);
    }
    let mut ranks = Vec::with_capacity(world);
    let mut final_stages = Vec::with_capacity(world);
    for (rank, f) in finals.into_iter().enumerate() {
        let (replica, pp_rank, stages) = f.ok_or_else(|| ExecError::Rank {
            rank,
            replica: rank / cfg.pp(),
            pp_rank: rank % cfg.pp(),
            step: cfg.steps,
            action: None,
            message: "the rank's thread panicked".into(),
        })?;
        let steps = per_step
            .iter_mut()
            .map(|s| s[rank].take())
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ExecError::Rank {
                rank,
                replica,
                pp_rank,
                step: cfg.steps,
                action: None,
                message: "a step report is missing".into(),
            })?;
        ranks.push(RankTrace {
            rank,
            replica,
            pp_rank,
            steps,
        });
        final_stages.push(stages);
    }
    report(cfg, ranks, final_stages)
}

/// One rank's thread: every step, reporting each to the coordinator; on a failure or a panic
/// it aborts the world, reports the error and stops.
fn rank_thread<T: Transport>(
    shared: &Shared<'_>,
    transport: T,
    gpus: usize,
    tx: &mpsc::Sender<Report>,
) -> Option<(usize, usize, Vec<Stage>)> {
    let cfg = shared.cfg;
    let rank = transport.rank();
    let (replica, pp_rank) = (rank / cfg.pp(), rank % cfg.pp());
    // the engine outlives the worker, whose transport may still wait for its last sends
    // ranks fewer than cores: each rank's GEMMs get the cores left over
    let threads = crate::backend::gemm_threads_per_rank(cfg.world_size());
    let _engine = match EngineGuard::install(cfg.backend, rank, gpus) {
        Ok(g) => g.with_gemm_threads(threads),
        Err(message) => {
            shared.abort_all();
            let e = ExecError::Rank {
                rank,
                replica,
                pp_rank,
                step: 1,
                action: None,
                message,
            };
            let _ = tx.send((rank, 0, Err((e, false))));
            return None;
        }
    };
    let mut w = Worker::new(shared, transport);
    for step in 0..cfg.steps {
        let r = w
            .run_step_caught(rank, step)
            .inspect_err(|_| shared.abort_all());
        let failed = r.is_err();
        let _ = tx.send((rank, step, r));
        if failed {
            return None;
        }
    }
    Some((replica, pp_rank, w.into_stages()))
}

/// Loss and wall time of step `step` from every rank's report.
pub(crate) fn summarize(
    cfg: &ExecConfig,
    step: usize,
    reports: &[Option<RankStep>],
) -> StepSummary {
    let tokens = (cfg.global_batch_size() * cfg.seq_len()) as f64;
    let all: Vec<&RankStep> = reports.iter().flatten().collect();
    // in world-rank order, so replicas add up in a fixed order
    let loss = all.iter().map(|r| r.loss_sum).sum::<f64>() / tokens;
    let start = all.iter().map(|r| r.start_s).fold(f64::INFINITY, f64::min);
    let end = all.iter().map(|r| r.end_s).fold(0.0, f64::max);
    StepSummary {
        step: step + 1,
        loss,
        time_s: end - start,
    }
}

pub(crate) fn report(
    cfg: &ExecConfig,
    ranks: Vec<RankTrace>,
    final_stages: Vec<Vec<Stage>>,
) -> Result<ExecReport, ExecError> {
    let pp = cfg.pp();
    let steps = cfg.steps;
    let by_step: Vec<Vec<Option<RankStep>>> = (0..steps)
        .map(|k| ranks.iter().map(|r| Some(r.steps[k].clone())).collect())
        .collect();
    let summaries: Vec<StepSummary> = (0..steps).map(|k| summarize(cfg, k, &by_step[k])).collect();
    let step_time_s: Vec<f64> = summaries.iter().map(|s| s.time_s).collect();
    let measured: Vec<usize> = if steps > 1 {
        (1..steps).collect()
    } else {
        vec![0]
    };
    let iteration_time_s = median(&measured.iter().map(|&k| step_time_s[k]).collect::<Vec<_>>());

    let mut bubble = vec![0.0; pp];
    let mut peak = vec![0u64; pp];
    for &k in &measured {
        for d in 0..cfg.dp {
            let replica: Vec<&RankTrace> = ranks.iter().filter(|r| r.replica == d).collect();
            let start = replica
                .iter()
                .map(|r| r.steps[k].start_s)
                .fold(f64::INFINITY, f64::min);
            let end = replica
                .iter()
                .map(|r| r.steps[k].pipeline_end_s)
                .fold(0.0, f64::max);
            let makespan = (end - start).max(f64::MIN_POSITIVE);
            for r in &replica {
                bubble[r.pp_rank] += (1.0 - r.steps[k].busy_s() / makespan).max(0.0);
            }
        }
    }
    let n = (measured.len() * cfg.dp) as f64;
    bubble.iter_mut().for_each(|b| *b /= n);
    for r in &ranks {
        for s in &r.steps {
            peak[r.pp_rank] = peak[r.pp_rank].max(s.peak_activation_bytes);
        }
    }
    let times = measure(cfg, &ranks, &measured);
    let prediction = predict::from_measured(cfg, &times)?;
    Ok(ExecReport {
        losses: summaries.iter().map(|s| s.loss).collect(),
        step_time_s,
        iteration_time_s,
        bubble_fraction: bubble,
        predicted_bubble_fraction: prediction.bubble_fraction,
        predicted_iteration_time_s: prediction.iteration_time_s,
        measured: times,
        peak_activation_bytes: peak,
        predicted_peak_activation_bytes: predict::peak_activation_bytes(cfg)?,
        ranks,
        final_stages,
    })
}
