//! The coordinator: one thread per rank (`pp × dp × tp`), in-process transport between them,
//! per-step summaries as they complete, and the report at the end.

use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use autopp_profiler::data::SyntheticData;
use autopp_profiler::device::{Abort, InProcess, Transport};

use crate::backend::{self, EngineGuard};
use crate::barrier::Barrier;
use crate::config::{ExecConfig, FailureMode};
use crate::error::ExecError;
use crate::record::{summarize, RankStep, RankTrace, StepSummary};
use crate::report::ExecReport;
use crate::stage::Stage;
use crate::worker::{Shared, Worker};

/// One rank's answer for one step: its record, or the error and whether it is only a
/// consequence of another rank's failure.
type Report = (usize, usize, Result<RankStep, (ExecError, bool)>);

/// What a rank's thread leaves when it ends well: its stages.
type Final = Option<Vec<Stage>>;

/// The name of rank `rank`'s thread; `autopp exec` keeps panics of threads so named off stderr,
/// since the error reports them.
pub const RANK_THREAD_PREFIX: &str = "autopp rank ";

/// Keeps panics of rank threads off stderr (a run reports them as its one error line); other
/// threads' panics still go to the hook that was installed before.
pub fn quiet_rank_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let name = std::thread::current().name().map(str::to_owned);
        if !name.is_some_and(|n| n.starts_with(RANK_THREAD_PREFIX)) {
            default(info);
        }
    }));
}

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
    refuse_kill(cfg)?;
    let gpus = backend::gpus(cfg.backend)?;
    let shared = Shared {
        cfg,
        data: SyntheticData::new(cfg.seed, cfg.model.vocab_size as usize, cfg.seq_len()),
        barrier: Barrier::new(cfg.world_size()),
        abort,
        world_sync: false,
        epoch: Instant::now(),
    };
    let mut records = Records::new(cfg);
    let finals: Vec<Final> = std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<Report>();
        let handles: Vec<_> = endpoints
            .into_iter()
            .map(|t| spawn_rank(scope, &shared, t, gpus, tx.clone(), &mut records))
            .collect();
        drop(tx);
        for report in rx {
            records.take(report, &shared, on_step);
        }
        handles
            .into_iter()
            .map(|h| h.and_then(|h| h.join().ok().flatten()))
            .collect()
    });
    let (ranks, final_stages) = records.into_traces(finals)?;
    ExecReport::from_records(cfg, ranks, final_stages)
}

/// Refuses an injected `:kill`, which would end every rank's thread with the process.
fn refuse_kill(cfg: &ExecConfig) -> Result<(), ExecError> {
    match cfg.inject_failure.filter(|f| f.mode == FailureMode::Kill) {
        Some(f) => Err(ExecError::invalid(
            "--inject-failure",
            format!("{f} kills the failing rank's process, and here every rank is a thread of this one: ':kill' is only for --transport mpi (one process per rank)"),
        )),
        None => Ok(()),
    }
}

/// Starts the thread of `transport`'s rank; when it cannot start, aborts the world and records
/// why.
fn spawn_rank<'scope, 'env, T: Transport + Send + 'scope>(
    scope: &'scope Scope<'scope, 'env>,
    shared: &'scope Shared<'env>,
    transport: T,
    gpus: usize,
    tx: mpsc::Sender<Report>,
    records: &mut Records,
) -> Option<ScopedJoinHandle<'scope, Final>> {
    let rank = transport.rank();
    let spawned = std::thread::Builder::new()
        .name(format!("{RANK_THREAD_PREFIX}{rank}"))
        .spawn_scoped(scope, move || rank_thread(shared, transport, gpus, &tx));
    match spawned {
        Ok(h) => Some(h),
        Err(e) => {
            shared.abort_all();
            let e = ExecError::Unsupported(format!("cannot start the thread of rank {rank}: {e}"));
            records.fail(e, false);
            None
        }
    }
}

/// The coordinator's view of the run: every rank's record of every step as it arrives, and
/// the root cause of a failure.
struct Records<'c> {
    cfg: &'c ExecConfig,
    /// Per step, per world rank.
    per_step: Vec<Vec<Option<RankStep>>>,
    /// Per step, how many ranks have reported it.
    done: Vec<usize>,
    /// The root cause, and whether it is only a consequence of another failure.
    first_error: Option<(ExecError, bool)>,
}

impl<'c> Records<'c> {
    fn new(cfg: &'c ExecConfig) -> Self {
        Records {
            cfg,
            per_step: vec![vec![None; cfg.world_size()]; cfg.steps],
            done: vec![0; cfg.steps],
            first_error: None,
        }
    }

    /// Keeps a failure: the root cause is the first failure that is not a consequence of
    /// another.
    fn fail(&mut self, e: ExecError, secondary: bool) {
        if self
            .first_error
            .as_ref()
            .is_none_or(|(_, s)| *s && !secondary)
        {
            self.first_error = Some((e, secondary));
        }
    }

    /// Takes one rank's report of one step; the step's summary goes to `on_step` once every
    /// rank has reported it, unless the run failed. A failure aborts the world.
    fn take(&mut self, report: Report, shared: &Shared<'_>, on_step: &mut dyn FnMut(StepSummary)) {
        let (rank, step, r) = report;
        match r {
            Ok(s) => {
                self.per_step[step][rank] = Some(s);
                self.done[step] += 1;
                if self.done[step] == self.cfg.world_size() && self.first_error.is_none() {
                    on_step(summarize(self.cfg, step, &self.per_step[step]));
                }
            }
            Err((e, secondary)) => {
                shared.abort_all();
                self.fail(e, secondary);
            }
        }
    }

    /// Each world rank's trace and final stages, or the run's failure.
    fn into_traces(
        mut self,
        finals: Vec<Final>,
    ) -> Result<(Vec<RankTrace>, Vec<Vec<Stage>>), ExecError> {
        if let Some((e, _)) = self.first_error {
            return Err(e);
        }
        let cfg = self.cfg;
        let mut ranks = Vec::with_capacity(finals.len());
        let mut final_stages = Vec::with_capacity(finals.len());
        for (rank, f) in finals.into_iter().enumerate() {
            let place = cfg.place(rank);
            let failed = |message: &str| place.failure(cfg.steps, None, message.into());
            let stages = f.ok_or_else(|| failed("the rank's thread panicked"))?;
            let steps = self
                .per_step
                .iter_mut()
                .map(|s| s[rank].take())
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| failed("a step report is missing"))?;
            ranks.push(RankTrace {
                rank,
                replica: place.replica,
                pp_rank: place.pp_rank,
                tp_rank: place.tp_rank,
                steps,
            });
            final_stages.push(stages);
        }
        Ok((ranks, final_stages))
    }
}

/// One rank's thread: every step, reporting each to the coordinator; on a failure or a panic
/// it aborts the world, reports the error and stops.
fn rank_thread<T: Transport>(
    shared: &Shared<'_>,
    transport: T,
    gpus: usize,
    tx: &mpsc::Sender<Report>,
) -> Final {
    let cfg = shared.cfg;
    let place = cfg.place(transport.rank());
    // the engine outlives the worker, whose transport may still wait for its last sends
    // ranks fewer than cores: each rank's GEMMs get the cores left over
    let threads = crate::backend::gemm_threads_per_rank(cfg.world_size());
    let _engine = match EngineGuard::install(cfg.backend, place.rank, gpus) {
        Ok(g) => g.with_gemm_threads(threads),
        Err(message) => {
            shared.abort_all();
            let e = place.failure(1, None, message);
            let _ = tx.send((place.rank, 0, Err((e, false))));
            return None;
        }
    };
    let mut w = Worker::new(shared, transport);
    for step in 0..cfg.steps {
        let r = w.run_step_caught(step).inspect_err(|_| shared.abort_all());
        let failed = r.is_err();
        let _ = tx.send((place.rank, step, r));
        if failed {
            return None;
        }
    }
    Some(w.into_stages())
}
