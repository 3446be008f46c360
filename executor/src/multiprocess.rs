//! One rank per process (MPI): [`run_rank`] runs this process's rank over any [`Transport`],
//! then gathers every rank's records and weights through world all-reduces, so rank 0 builds
//! the same [`ExecReport`] as a threaded run (and `--check` compares the same weights).
//!
//! Gathering is exact: each rank writes its values (f64, or f32 widened) into its own slot of a
//! zeroed world-sized buffer, and the sum over ranks adds only zeros to them.

use std::time::Instant;

use autopp_profiler::device::{Abort, Shard, Transport};
use autopp_schedule::{Action, ActionKind};

use crate::barrier::Barrier;
use crate::config::ExecConfig;
use crate::error::ExecError;
use crate::record::{summarize, ActionEvent, RankStep, RankTrace, StepSummary};
use crate::report::ExecReport;
use crate::stage::Stage;
use crate::topology::Place;
use crate::worker::{Shared, Worker};
use autopp_profiler::data::SyntheticData;

/// Runs this process's rank (`transport.rank()`) of `cfg` — every step — then gathers all
/// ranks' records and weights. Rank 0 gets the report (and `on_step` is called for each step
/// once the records are in); the other ranks get `None`. Every rank of the job must call it.
///
/// On an error or a panic it returns the error naming this rank and its action; the caller
/// must then end the job (`MPI_Abort`), since the other ranks may wait on this one. An injected
/// `:kill` ([`FailureMode::Kill`](crate::FailureMode::Kill)) ends this process there and then,
/// as a killed process would; the launcher (`mpirun`) is what notices.
pub fn run_rank<T: Transport>(
    cfg: &ExecConfig,
    transport: &mut T,
    on_step: &mut dyn FnMut(StepSummary),
) -> Result<Option<ExecReport>, ExecError> {
    cfg.validate()?;
    let world = cfg.world_size();
    let rank = transport.rank();
    if transport.world_size() != world {
        return Err(ExecError::invalid(
            "--transport",
            format!(
                "the job has {} processes, but pp × dp × tp = {world}: run `mpirun -np {world}`",
                transport.world_size()
            ),
        ));
    }
    let everyone: Vec<usize> = (0..world).collect();
    let place = cfg.place(rank);
    let gathered = |e: &dyn std::fmt::Display| {
        place.failure(cfg.steps, None, format!("gathering the report: {e}"))
    };
    // the ranks start their clocks together
    transport
        .all_reduce_sum(&everyone, &mut [0.0])
        .map_err(|e| gathered(&e))?;
    let shared = Shared {
        cfg,
        data: SyntheticData::new(cfg.seed, cfg.model.vocab_size as usize, cfg.seq_len()),
        barrier: Barrier::new(1),
        abort: Abort::new(),
        world_sync: true,
        epoch: Instant::now(),
    };
    let gpus = crate::backend::gpus(cfg.backend)?;
    let _engine = crate::backend::EngineGuard::install(cfg.backend, rank, gpus)
        .map_err(|message| place.failure(1, None, message))?;
    let mut w = Worker::new(&shared, &mut *transport);
    let mut steps = Vec::with_capacity(cfg.steps);
    for step in 0..cfg.steps {
        steps.push(w.run_step_caught(step).map_err(|(e, _)| e)?);
    }
    let stages = w.into_stages();

    let records = share(transport, &everyone, encode_steps(&steps)).map_err(|e| gathered(&e))?;
    let params: Vec<f64> = stages.iter().flat_map(Stage::flat_params).collect();
    let weights = share(transport, &everyone, params).map_err(|e| gathered(&e))?;
    if rank != 0 {
        return Ok(None);
    }
    let ranges = cfg.stage_ranges();
    let mut ranks = Vec::with_capacity(world);
    let mut final_stages = Vec::with_capacity(world);
    for (r, (record, flat)) in records.iter().zip(&weights).enumerate() {
        let Place {
            replica,
            pp_rank,
            tp_rank,
            ..
        } = cfg.place(r);
        let shard = Shard {
            rank: tp_rank,
            size: cfg.tp,
        };
        let steps = decode_steps(record)
            .ok_or_else(|| gathered(&format!("rank {r}'s records are garbled")))?;
        let mut stages: Vec<Stage> = cfg
            .schedule
            .stages_of(pp_rank)
            .into_iter()
            .map(|s| Stage::new(&cfg.model, cfg.seed, ranges[s].clone(), shard))
            .collect();
        let mut at = 0;
        for s in &mut stages {
            let n = s.flat_params().len();
            let part = flat
                .get(at..at + n)
                .ok_or_else(|| gathered(&format!("rank {r} sent too few weights")))?;
            s.set_flat_params(part);
            at += n;
        }
        ranks.push(RankTrace {
            rank: r,
            replica,
            pp_rank,
            tp_rank,
            steps,
        });
        final_stages.push(stages);
    }
    for k in 0..cfg.steps {
        let by_rank: Vec<Option<RankStep>> =
            ranks.iter().map(|r| Some(r.steps[k].clone())).collect();
        on_step(summarize(cfg, k, &by_rank));
    }
    ExecReport::from_records(cfg, ranks, final_stages).map(Some)
}

/// Every rank's `mine`, in rank order, on every rank: the lengths first, then the values.
fn share<T: Transport>(
    transport: &mut T,
    everyone: &[usize],
    mine: Vec<f64>,
) -> Result<Vec<Vec<f64>>, autopp_profiler::device::TransportError> {
    let rank = transport.rank();
    let mut lengths = vec![0.0; everyone.len()];
    lengths[rank] = mine.len() as f64;
    transport.all_reduce_sum(everyone, &mut lengths)?;
    let lengths: Vec<usize> = lengths.iter().map(|&n| n as usize).collect();
    let offset: usize = lengths[..rank].iter().sum();
    let mut all = vec![0.0; lengths.iter().sum()];
    all[offset..offset + mine.len()].copy_from_slice(&mine);
    transport.all_reduce_sum(everyone, &mut all)?;
    let mut out = Vec::with_capacity(lengths.len());
    let mut at = 0;
    for n in lengths {
        out.push(all[at..at + n].to_vec());
        at += n;
    }
    Ok(out)
}

fn kind_code(kind: ActionKind) -> f64 {
    match kind {
        ActionKind::F => 0.0,
        ActionKind::B => 1.0,
        ActionKind::I => 2.0,
        ActionKind::W => 3.0,
    }
}

/// Steps as numbers: per step `loss_sum, start_s, pipeline_end_s, end_s, peak bytes, events,
/// (kind, stage, micro-batch, start_s, end_s, wait_s) per event, samples, (time, bytes) per
/// memory sample`. Bytes and indices are below 2⁵³, so f64 holds them exactly.
fn encode_steps(steps: &[RankStep]) -> Vec<f64> {
    let mut v = vec![steps.len() as f64];
    for s in steps {
        v.extend([
            s.loss_sum,
            s.start_s,
            s.pipeline_end_s,
            s.end_s,
            s.peak_activation_bytes as f64,
            s.events.len() as f64,
        ]);
        for e in &s.events {
            v.extend([
                kind_code(e.action.kind),
                f64::from(e.action.stage),
                f64::from(e.action.microbatch),
                e.start_s,
                e.end_s,
                e.wait_s,
                e.tp_comm_s,
            ]);
        }
        v.push(s.memory.len() as f64);
        for &(t, b) in &s.memory {
            v.extend([t, b as f64]);
        }
    }
    v
}

fn decode_steps(v: &[f64]) -> Option<Vec<RankStep>> {
    let mut it = v.iter().copied();
    let mut next = || it.next();
    let n = next()? as usize;
    let mut steps = Vec::with_capacity(n);
    for _ in 0..n {
        let (loss_sum, start_s, pipeline_end_s, end_s) = (next()?, next()?, next()?, next()?);
        let peak_activation_bytes = next()? as u64;
        let events = (0..next()? as usize)
            .map(|_| {
                let kind = match next()? as u32 {
                    0 => ActionKind::F,
                    1 => ActionKind::B,
                    2 => ActionKind::I,
                    3 => ActionKind::W,
                    _ => return None,
                };
                let (stage, microbatch) = (next()? as u32, next()? as u32);
                Some(ActionEvent {
                    action: Action {
                        stage,
                        microbatch,
                        kind,
                    },
                    start_s: next()?,
                    end_s: next()?,
                    wait_s: next()?,
                    tp_comm_s: next()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        let memory = (0..next()? as usize)
            .map(|_| Some((next()?, next()? as u64)))
            .collect::<Option<Vec<_>>>()?;
        steps.push(RankStep {
            loss_sum,
            events,
            memory,
            peak_activation_bytes,
            start_s,
            pipeline_end_s,
            end_s,
        });
    }
    Some(steps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::run;
    use autopp_profiler::device::InProcess;
    use autopp_schedule::{generate, ScheduleKind, ScheduleSpec};
    use std::time::Duration;

    /// The multi-process path, with threads standing in for processes: rank 0's report equals
    /// a threaded run's in everything but timing, and the records survive the encoding.
    #[test]
    fn ranks_as_processes_give_the_threaded_report() {
        let model = autopp_models::load("tiny-gpt")
            .unwrap()
            .with_seq_length(16)
            .unwrap();
        let spec = ScheduleSpec::new(ScheduleKind::ZbH1, 2, 4);
        let mut cfg = ExecConfig::new(&model, generate(&spec).unwrap(), 2, 1, None).unwrap();
        cfg.steps = 2;
        let threaded = run(&cfg, &mut |_| {}).unwrap();
        let endpoints = InProcess::world(cfg.world_size(), Duration::from_secs(30));
        let reports: Vec<Option<ExecReport>> = std::thread::scope(|s| {
            let handles: Vec<_> = endpoints
                .into_iter()
                .map(|mut t| {
                    let cfg = &cfg;
                    s.spawn(move || run_rank(cfg, &mut t, &mut |_| {}).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(reports[1..].iter().all(Option::is_none));
        let r = reports[0].as_ref().unwrap();
        assert_eq!(r.losses, threaded.losses);
        assert_eq!(r.final_stages, threaded.final_stages);
        assert_eq!(r.peak_activation_bytes, threaded.peak_activation_bytes);
        for (a, b) in r.ranks.iter().zip(&threaded.ranks) {
            for (x, y) in a.steps.iter().zip(&b.steps) {
                let actions = |s: &RankStep| s.events.iter().map(|e| e.action).collect::<Vec<_>>();
                assert_eq!(actions(x), actions(y));
                assert_eq!(x.memory.len(), y.memory.len());
            }
        }
        assert_eq!(
            decode_steps(&encode_steps(&r.ranks[1].steps)).unwrap(),
            r.ranks[1].steps
        );
    }
}
