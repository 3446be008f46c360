//! Evaluating one full configuration: the iteration time with its breakdown and every rank's
//! peak memory. `autopp estimate` prints this; the planner ranks candidates by it.

mod evaluation;
mod tail;

use std::sync::Arc;

use autopp_hardware::{AnalyticProfile, LayerTimes};
use autopp_models::{LayerCost, Model, ShardSpec};
use serde::Serialize;

use crate::config::{ParallelConfig, PlanError};
use crate::memory::RankMemory;
use crate::plan::PlanAndPrediction;
use crate::schedule::{self, Schedule, ScheduleSpec, SimResult};
use crate::stages::StageCost;

use evaluation::Evaluation;
pub use tail::{dp_comm_time_s, optimizer_time_s, ADAM_BYTES_PER_PARAM};

/// Everything `estimate` knows about one configuration.
#[derive(Debug, Clone, Serialize)]
pub struct Estimate {
    /// The plan and its prediction, as printed by `--json`.
    #[serde(flatten)]
    pub result: PlanAndPrediction,
    /// Memory per rank by kind.
    pub memory: Vec<RankMemory>,
    /// Per-stage costs.
    pub stages: Vec<StageCost>,
    /// The schedule that was simulated (shared: the planner reuses one schedule across the
    /// configurations of the same shape).
    #[serde(skip)]
    pub schedule: Arc<Schedule>,
    /// The simulation.
    #[serde(skip)]
    pub simulation: SimResult,
    /// Exposed data-parallel communication per rank, seconds.
    pub dp_comm_s: Vec<f64>,
    /// Optimizer step per rank, seconds.
    pub optimizer_s: Vec<f64>,
    /// Things the user should know (e.g. a tensor-parallel group that leaves the node).
    pub warnings: Vec<String>,
}

fn positive(flag: &str, value: u64) -> Result<(), PlanError> {
    if value == 0 {
        Err(PlanError::invalid(flag, "must be at least 1"))
    } else {
        Ok(())
    }
}

/// Rejects configurations that cannot run, naming the flag and the fix.
pub fn check_config(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
) -> Result<(), PlanError> {
    let d = &c.degrees;
    for (flag, value) in [
        ("--tp", d.tp),
        ("--pp", d.pp),
        ("--dp", d.dp),
        ("--cp", d.cp),
        ("--virtual", d.virtual_stages),
        ("--mbs", c.micro_batch_size),
        ("--global-batch", c.global_batch_size),
    ] {
        positive(flag, value)?;
    }
    if c.zero_stage > 3 {
        return Err(PlanError::invalid("--zero", "must be 0, 1, 2 or 3"));
    }
    c.experts.check(model, d)?;
    let gpus = profile.cluster.num_gpus();
    if c.num_gpus() != gpus {
        return Err(PlanError::invalid(
            "--dp",
            format!(
                "tp · pp · dp · cp = {} · {} · {} · {} = {} but --gpus is {gpus}: the degrees must multiply to the GPU count",
                d.tp, d.pp, d.dp, d.cp, c.num_gpus()
            ),
        ));
    }
    let Some(per_step) = d.dp.checked_mul(c.micro_batch_size) else {
        return Err(PlanError::invalid(
            "--mbs",
            format!(
                "dp · mbs = {} · {} is more than any batch: use a micro-batch that divides the global batch ({}) over dp",
                d.dp, c.micro_batch_size, c.global_batch_size
            ),
        ));
    };
    if !c.global_batch_size.is_multiple_of(per_step) {
        return Err(PlanError::invalid(
            "--global-batch",
            format!(
                "{} is not divisible by dp · mbs = {} · {} = {per_step}: use a multiple of {per_step}",
                c.global_batch_size, d.dp, c.micro_batch_size
            ),
        ));
    }
    if let Some(heads) = model.num_attention_heads() {
        if heads % d.tp != 0 {
            return Err(PlanError::invalid(
                "--tp",
                format!(
                    "{} does not divide the model's {heads} attention heads: use a divisor of {heads}",
                    d.tp
                ),
            ));
        }
    } else if d.tp > 1 || d.cp > 1 || c.sequence_parallel {
        return Err(PlanError::invalid(
            if d.tp > 1 { "--tp" } else if d.cp > 1 { "--cp" } else { "--sequence-parallel" },
            "a layer-list model has no attention heads to shard: use --tp 1 --cp 1 without --sequence-parallel",
        ));
    }
    if c.sequence_parallel && d.tp == 1 {
        return Err(PlanError::invalid(
            "--sequence-parallel",
            "needs --tp of 2 or more (it shards along the tensor-parallel group)",
        ));
    }
    if d.virtual_stages > 1 && c.schedule.fixed_virtual_stages() == Some(1) {
        return Err(PlanError::invalid(
            "--virtual",
            format!(
                "{} places one stage per rank: use --virtual 1, or a schedule with virtual stages (interleaved-1f1b, looped-bfs, interleaved-zb; zb-v and dualpipe-v with 2)",
                c.schedule
            ),
        ));
    }
    if let Some(v) = c.schedule.fixed_virtual_stages().filter(|&v| v > 1) {
        if d.virtual_stages != v as u64 {
            return Err(PlanError::invalid(
                "--virtual",
                format!(
                    "{} places exactly {v} stages on each rank: use --virtual {v}, or leave --virtual out",
                    c.schedule
                ),
            ));
        }
    }
    Ok(())
}

/// Evaluates one configuration of `model` on `profile`'s cluster.
pub fn evaluate(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
) -> Result<Estimate, PlanError> {
    check_config(model, profile, c)?;
    let layers = model.layers(&shard_spec(c))?;
    evaluate_layers(model, profile, c, &layers)
}

/// The layer sharding a configuration implies.
pub fn shard_spec(c: &ParallelConfig) -> ShardSpec {
    ShardSpec {
        micro_batch_size: c.micro_batch_size,
        tp: c.degrees.tp,
        sequence_parallel: c.sequence_parallel,
        cp: c.degrees.cp,
        dtype_bytes: c.settings.precision.bytes(),
        flash_attention: c.settings.flash_attention,
        vocab_pad_multiple: c.settings.runtime.vocab_pad_multiple,
        attention_kernel: c.settings.runtime.attention_kernel,
        fused_elementwise: c.settings.runtime.fused_elementwise,
        ep: c.experts.ep,
        etp: c.experts.etp,
        moe_imbalance_milli: c.experts.imbalance_milli(),
        fp8_saved_inputs: c.settings.precision.is_fp8()
            && !crate::memory::StackMemory::of(c.settings.runtime.stack).fp8_cast_per_use,
        recompute_modules: c.settings.runtime.recompute_modules,
    }
}

/// [`evaluate`] for a configuration already checked with [`check_config`], given the model's
/// layers under [`shard_spec`]`(c)` (the planner caches them across configurations).
pub fn evaluate_layers(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: &[LayerCost],
) -> Result<Estimate, PlanError> {
    evaluate_layers_with(model, profile, c, layers, Detail::Full)
}

/// How much of an [`Estimate`] to compute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// Everything, including the breakdown's separation of pipeline sends from the bubble (a
    /// second simulation without sends).
    Full,
    /// The numbers of [`Detail::Full`] — iteration time, breakdown, memory — without recording
    /// the timeline ([`SimResult::timeline`] and [`SimResult::memory`] are empty): what the
    /// planner's answers need.
    Breakdown,
    /// Iteration time and memory only (one simulation, no timeline recorded): the breakdown
    /// counts send time as bubble. The search uses this for candidates and re-evaluates its
    /// answers in full.
    TimeAndMemory,
}

/// [`evaluate_layers`] with a choice of [`Detail`].
pub fn evaluate_layers_with(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: &[LayerCost],
    detail: Detail,
) -> Result<Estimate, PlanError> {
    let sched = Arc::new(schedule_for(c)?);
    let flops = model.model_flops_per_sequence()?;
    let layers = LayerList {
        layers,
        timed: None,
    };
    evaluate_scheduled(model, profile, c, layers, detail, sched, flops)
}

/// The schedule a configuration runs: its kind, pipeline ranks, stages per rank and
/// micro-batches.
pub fn schedule_for(c: &ParallelConfig) -> Result<Schedule, PlanError> {
    Ok(schedule::generate(&schedule_spec(c))?)
}

/// What `c` asks of the schedule generator: its kind, ranks, stages per rank, micro-batches
/// and group size.
pub fn schedule_spec(c: &ParallelConfig) -> ScheduleSpec {
    ScheduleSpec {
        kind: c.schedule,
        pp: c.degrees.pp as usize,
        virtual_stages: c.degrees.virtual_stages as usize,
        num_microbatches: c.num_microbatches() as usize,
        group_size: c.group_size.map(|g| g as usize),
    }
}

/// A configuration's layer list, with each layer's compute times when the caller has them.
#[derive(Debug, Clone, Copy)]
pub struct LayerList<'a> {
    /// The layers, embedding first and head last.
    pub layers: &'a [LayerCost],
    /// `timed[i]`: the compute times of `layers[i]` on the profile evaluated with (`None`:
    /// timed during the evaluation).
    pub timed: Option<&'a [LayerTimes]>,
}

/// A lower bound on the iteration time of `c` with `sched` (its schedule), seconds, without
/// simulating: the busiest rank's work, `m · Σ (F + B)` over its stages. The search skips the
/// simulations that this shows cannot beat what it has found.
pub fn busiest_rank_s(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: LayerList<'_>,
    sched: &Schedule,
) -> Result<f64, PlanError> {
    let evaluation =
        Evaluation::new(model, profile, c, layers.layers, sched)?.with_timed(layers.timed);
    let stages = evaluation.stage_costs()?;
    Ok(evaluation.busiest_rank_s(&stages.costs))
}

/// The busiest rank's peak memory of `c`, bytes — [`Predicted`](crate::plan::Predicted)'s
/// `peak_memory_bytes` of [`evaluate_layers`] — without simulating: each rank's activation
/// peak walked along its list of the schedule.
pub fn peak_memory_bytes(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: &[LayerCost],
) -> Result<u64, PlanError> {
    let sched = schedule_for(c)?;
    let evaluation = Evaluation::new(model, profile, c, layers, &sched)?;
    let stages = evaluation.stage_costs()?;
    Ok(evaluation.peak_memory_unsimulated(&stages.costs))
}

/// [`evaluate_layers_with`] given the configuration's schedule, [`schedule_for`]`(c)`, and the
/// model's FLOPs per sequence, [`Model::model_flops_per_sequence`] (the planner computes both
/// once per search and shares them).
pub fn evaluate_scheduled(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: LayerList<'_>,
    detail: Detail,
    sched: Arc<Schedule>,
    model_flops_per_sequence: f64,
) -> Result<Estimate, PlanError> {
    let args = (detail, sched, model_flops_per_sequence);
    evaluate_scheduled_when(model, profile, c, layers, args, None)
        .map(|e| e.expect("evaluated unconditionally"))
}

/// What a configuration must be able to be for [`evaluate_scheduled_when`] to simulate it,
/// decided before simulating.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Gate {
    /// It fits with its margin (`Evaluation::fits_unsimulated`).
    Fitting,
    /// Its iteration time may be under `time_s` seconds (its busiest rank's work alone,
    /// [`busiest_rank_s`], is not over it) and its peak memory is at most `peak_bytes`.
    Beating {
        /// Seconds the iteration must take less than.
        time_s: f64,
        /// Bytes the peak memory must stay within.
        peak_bytes: u64,
    },
}

/// Relative rounding allowed between the busiest rank's work summed per micro-batch
/// ([`busiest_rank_s`]) and summed action by action in the simulation.
const BUSIEST_ROUNDING: f64 = 1e-9;

/// [`evaluate_scheduled`], or `None` for a configuration that cannot pass `gate`, decided
/// before simulating (see [`Gate`]), so that the search's configurations over memory, or too
/// slow for what it asks, cost no simulation.
pub fn evaluate_scheduled_when(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: LayerList<'_>,
    (detail, sched, model_flops_per_sequence): (Detail, Arc<Schedule>, f64),
    gate: Option<Gate>,
) -> Result<Option<Estimate>, PlanError> {
    let args = (detail, sched, model_flops_per_sequence);
    evaluate_scheduled_with(model, profile, c, layers, args, gate, None)
}

/// [`evaluate_scheduled`] of a configuration evaluated before (`before`): where its stages
/// cost the same as then and it was not evaluated at [`Detail::Full`], the pipeline is not
/// simulated again with its sends (the same inputs: the same simulation). `detail`
/// [`Detail::Full`] simulates everything (the timeline was not recorded before).
pub(crate) fn evaluate_scheduled_again(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: LayerList<'_>,
    args: (Detail, Arc<Schedule>, f64),
    before: &Estimate,
) -> Result<Estimate, PlanError> {
    let sim = &before.simulation;
    // a Full evaluation recorded a timeline, which the other details leave out
    let recorded = !sim.timeline.is_empty() || !sim.memory.is_empty();
    let known = (args.0 != Detail::Full && !recorded).then_some((before.stages.as_slice(), sim));
    evaluate_scheduled_with(model, profile, c, layers, args, None, known)
        .map(|e| e.expect("evaluated unconditionally"))
}

/// [`evaluate_scheduled_when`], with the simulation with sends of the same configuration with
/// the stage costs given (`known`) where the caller has it: used where the stages cost the
/// same.
fn evaluate_scheduled_with(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: LayerList<'_>,
    (detail, sched, model_flops_per_sequence): (Detail, Arc<Schedule>, f64),
    gate: Option<Gate>,
    known: Option<(&[StageCost], &SimResult)>,
) -> Result<Option<Estimate>, PlanError> {
    let evaluation =
        Evaluation::new(model, profile, c, layers.layers, &sched)?.with_timed(layers.timed);
    let warnings = evaluation.warnings();
    let stages = evaluation.stage_costs()?;
    let only_fitting = gate == Some(Gate::Fitting);
    let passes = match gate {
        None => true,
        Some(Gate::Fitting) => evaluation.fits_unsimulated(&stages.costs),
        Some(Gate::Beating { time_s, peak_bytes }) => {
            let busiest = evaluation.busiest_rank_s(&stages.costs);
            busiest * (1.0 - BUSIEST_ROUNDING) < time_s
                && evaluation.peak_memory_unsimulated(&stages.costs) <= peak_bytes
        }
    };
    if !passes {
        return Ok(None);
    }
    let known = known
        .filter(|&(costs, _)| costs == stages.costs.as_slice())
        .map(|(_, sim)| sim);
    let pipeline = evaluation.simulate(&stages.costs, detail, known)?;
    debug_assert_eq!(
        pipeline.sim.peak_activation_bytes,
        evaluation.peak_activation_bytes(&stages.costs),
        "the walked activation peaks are the simulated ones"
    );
    let ranks = evaluation.ranks(&stages.costs, &pipeline.sim);
    let breakdown = evaluation.breakdown(&stages.costs, &pipeline, &ranks);
    let predicted = evaluation.predicted(
        &pipeline,
        breakdown,
        &ranks.memory,
        model_flops_per_sequence,
    );
    let plan = evaluation.plan(&stages, &pipeline.sim, &ranks.memory);
    debug_assert!(
        !only_fitting || predicted.fits,
        "fits before simulating, not after"
    );
    Ok(Some(Estimate {
        result: PlanAndPrediction { plan, predicted },
        memory: ranks.memory,
        stages: stages.costs,
        schedule: sched,
        simulation: pipeline.sim,
        dp_comm_s: ranks.dp_comm_s,
        optimizer_s: ranks.optimizer_s,
        warnings,
    }))
}

/// Bytes of one micro-batch's keys and values a context-parallel rank passes around its ring
/// per layer (0 without context parallelism or for layer lists).
pub(crate) fn cp_kv_bytes(model: &Model, c: &ParallelConfig) -> u64 {
    let d = &c.degrees;
    match model {
        Model::Transformer(t) if d.cp > 1 => {
            let tokens = c.micro_batch_size * t.seq_length / d.cp;
            2 * tokens * t.kv_width() * c.settings.precision.bytes() / d.tp
        }
        _ => 0,
    }
}

#[cfg(test)]
mod tests;
