//! Evaluating one full configuration: the iteration time with its breakdown and every rank's
//! peak memory. `autopp estimate` prints this; the planner ranks candidates by it.

use std::sync::Arc;

use autopp_hardware::{AnalyticProfile, Layout};
use autopp_models::{LayerCost, LayerKind, Model, Recompute, ShardSpec};
use serde::Serialize;

use crate::config::{ParallelConfig, PlanError};
use crate::memory::{self, MemoryContext, RankMemory};
use crate::plan::{Breakdown, Plan, PlanAndPrediction, Predicted, RankPlan, FORMAT_VERSION};
use crate::schedule::split;
use crate::schedule::{self, Schedule, ScheduleSpec, SimCosts, SimResult};
use crate::stages::{self, StageContext, StageCost};

/// Bytes of HBM traffic per optimizer-owned parameter in one Adam step: read the fp32 gradient
/// (4), read and write master weight, m and v (24), write the 16-bit weight (2).
pub const ADAM_BYTES_PER_PARAM: f64 = 30.0;

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
    for (flag, value) in [
        ("--tp", c.tp),
        ("--pp", c.pp),
        ("--dp", c.dp),
        ("--cp", c.cp),
        ("--virtual", c.virtual_stages),
        ("--mbs", c.micro_batch_size),
        ("--global-batch", c.global_batch_size),
    ] {
        positive(flag, value)?;
    }
    if c.zero_stage > 3 {
        return Err(PlanError::invalid("--zero", "must be 0, 1, 2 or 3"));
    }
    let gpus = profile.cluster.num_gpus();
    if c.num_gpus() != gpus {
        return Err(PlanError::invalid(
            "--dp",
            format!(
                "tp · pp · dp · cp = {} · {} · {} · {} = {} but --gpus is {gpus}: the degrees must multiply to the GPU count",
                c.tp, c.pp, c.dp, c.cp, c.num_gpus()
            ),
        ));
    }
    let per_step = c.dp * c.micro_batch_size;
    if !c.global_batch_size.is_multiple_of(per_step) {
        return Err(PlanError::invalid(
            "--global-batch",
            format!(
                "{} is not divisible by dp · mbs = {} · {} = {per_step}: use a multiple of {per_step}",
                c.global_batch_size, c.dp, c.micro_batch_size
            ),
        ));
    }
    if let Some(heads) = model.num_attention_heads() {
        if heads % c.tp != 0 {
            return Err(PlanError::invalid(
                "--tp",
                format!(
                    "{} does not divide the model's {heads} attention heads: use a divisor of {heads}",
                    c.tp
                ),
            ));
        }
    } else if c.tp > 1 || c.cp > 1 || c.sequence_parallel {
        return Err(PlanError::invalid(
            if c.tp > 1 { "--tp" } else if c.cp > 1 { "--cp" } else { "--sequence-parallel" },
            "a layer-list model has no attention heads to shard: use --tp 1 --cp 1 without --sequence-parallel",
        ));
    }
    if c.sequence_parallel && c.tp == 1 {
        return Err(PlanError::invalid(
            "--sequence-parallel",
            "needs --tp of 2 or more (it shards along the tensor-parallel group)",
        ));
    }
    if c.virtual_stages > 1 && c.schedule.fixed_virtual_stages() == Some(1) {
        return Err(PlanError::invalid(
            "--virtual",
            format!(
                "{} places one stage per rank: use --virtual 1, or a schedule with virtual stages (interleaved-1f1b, looped-bfs, interleaved-zb; zb-v and dualpipe-v with 2)",
                c.schedule
            ),
        ));
    }
    if let Some(v) = c.schedule.fixed_virtual_stages().filter(|&v| v > 1) {
        if c.virtual_stages != v as u64 {
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
        tp: c.tp,
        sequence_parallel: c.sequence_parallel,
        cp: c.cp,
        dtype_bytes: c.precision.bytes(),
        flash_attention: c.flash_attention,
        vocab_pad_multiple: c.runtime.vocab_pad_multiple,
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
        pp: c.pp as usize,
        virtual_stages: c.virtual_stages as usize,
        num_microbatches: c.num_microbatches() as usize,
        group_size: c.group_size.map(|g| g as usize),
    }
}

/// [`evaluate_layers_with`] given the configuration's schedule, [`schedule_for`]`(c)`, and the
/// model's FLOPs per sequence, [`Model::model_flops_per_sequence`] (the planner computes both
/// once per search and shares them).
pub fn evaluate_scheduled(
    model: &Model,
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    layers: &[LayerCost],
    detail: Detail,
    sched: Arc<Schedule>,
    model_flops_per_sequence: f64,
) -> Result<Estimate, PlanError> {
    let cluster = &profile.cluster;
    let kinds: Vec<LayerKind> = layers.iter().map(|l| l.kind).collect();
    let num_stages = c.num_stages() as usize;
    let counts = match &c.split {
        Some(counts) => {
            split::check_split(counts, layers.len(), num_stages)?;
            counts.clone()
        }
        None => split::default_split(&kinds, num_stages)?,
    };
    let ranges = split::stage_ranges(&counts);
    let m = c.num_microbatches();
    if sched.pp != c.pp as usize
        || sched.num_microbatches != m as usize
        || sched.virtual_stages != c.virtual_stages as usize
        || sched.kind != c.schedule
    {
        return Err(PlanError::Schedule(format!(
            "internal: the schedule given ({} pp {} v {} m {}) is not the configuration's",
            sched.kind, sched.pp, sched.virtual_stages, sched.num_microbatches
        )));
    }

    let layout = Layout {
        tp: c.tp,
        cp: c.cp,
        dp: c.dp,
        pp: c.pp,
    };
    let tp_link = cluster.group_link(c.tp, layout.tp_stride());
    let cp_link = cluster.group_link(c.cp, layout.cp_stride());
    let dp_link = cluster.group_link(c.dp * c.cp, layout.tp_stride() * c.tp);
    let mut warnings = Vec::new();
    if tp_link.inter_node && c.tp > 1 {
        warnings.push(format!(
            "the tensor-parallel group ({} GPUs) leaves the node of {}: its all-reduces run over the NIC",
            c.tp, cluster.gpus_per_node
        ));
    }
    let cp_kv_bytes = match model {
        Model::Transformer(t) if c.cp > 1 => {
            let tokens = c.micro_batch_size * t.seq_length / c.cp;
            2 * tokens * t.kv_width() * c.precision.bytes() / c.tp
        }
        _ => 0,
    };
    let ctx = StageContext {
        profile,
        tp: c.tp,
        tp_link,
        recompute: c.recompute,
        cp: c.cp,
        cp_link,
        cp_kv_bytes,
    };
    let full_layers = partial_recompute(c, layers, &ranges)?;
    let stage_costs = stages::stage_costs_partial(layers, &ranges, &ctx, &full_layers);

    // Pipeline sends between consecutive stages that sit on different ranks: `1/t` of the
    // boundary activation per GPU with Megatron's scatter/gather, the whole of it without.
    let send_factor = if c.runtime.pp_scatter_gather { 1 } else { c.tp };
    let p2p_s: Vec<f64> = (0..num_stages.saturating_sub(1))
        .map(|k| {
            let (from, to) = (sched.rank_of(k), sched.rank_of(k + 1));
            if from == to {
                return 0.0;
            }
            let link = cluster.link_between(
                from as u64 * layout.pp_stride(),
                to as u64 * layout.pp_stride(),
            );
            profile.p2p_time_s(stage_costs[k].output_bytes * send_factor, &link)
        })
        .collect();
    let compute_only: Vec<schedule::StageCosts> = stage_costs
        .iter()
        .map(|s| schedule::StageCosts {
            forward_s: s.forward_s(),
            backward_s: s.backward_s(),
            backward_input_s: s.backward_input_s(),
            backward_weight_s: s.backward_weight_s(),
            activation_bytes: s.activation_bytes,
            weight_grad_bytes: s.weight_grad_bytes,
        })
        .collect();
    // Blocking sends hold the sender: stage k's forward ends when its output reached k + 1, and
    // stage k + 1's backward when its input gradient reached k.
    let mut send_busy_s = vec![0.0; num_stages];
    let mut with_sends = compute_only.clone();
    let p2p_s = if c.runtime.pp_blocking_sends {
        for (k, &t) in p2p_s.iter().enumerate() {
            with_sends[k].forward_s += t;
            with_sends[k + 1].backward_s += t;
            with_sends[k + 1].backward_input_s += t;
            send_busy_s[k] += t;
            send_busy_s[k + 1] += t;
        }
        vec![0.0; p2p_s.len()]
    } else {
        p2p_s
    };
    let sim_costs = SimCosts {
        stages: with_sends,
        p2p_s,
        overlap_factor: None,
    };
    let sim = match detail {
        Detail::Full => schedule::simulate(&sched, &sim_costs),
        // the same numbers without recording the timeline (the search's inner loop)
        Detail::Breakdown | Detail::TimeAndMemory => schedule::simulate_metrics(&sched, &sim_costs)
            .map(|m| SimResult {
                makespan_s: m.makespan_s,
                busy_s: m.busy_s,
                bubble_fraction: m.bubble_fraction,
                peak_inflight: m.peak_inflight,
                peak_activation_bytes: m.peak_activation_bytes,
                timeline: Vec::new(),
                memory: Vec::new(),
            }),
    }
    .map_err(|e| PlanError::Schedule(e.to_string()))?;
    let no_comm = SimCosts {
        stages: compute_only,
        p2p_s: vec![0.0; sim_costs.p2p_s.len()],
        overlap_factor: None,
    };
    let makespan_no_comm_s = match detail {
        Detail::Full | Detail::Breakdown => {
            schedule::simulate_metrics(&sched, &no_comm)
                .map_err(|e| PlanError::Schedule(e.to_string()))?
                .makespan_s
        }
        Detail::TimeAndMemory => sim.makespan_s,
    };

    // Per rank: stages, memory, data-parallel tail.
    let pp = c.pp as usize;
    let mut rank_stages: Vec<Vec<usize>> = vec![Vec::new(); pp];
    for k in 0..num_stages {
        rank_stages[sched.rank_of(k)].push(k);
    }
    let groups = [c.tp, c.cp, c.dp, c.pp].iter().filter(|&&d| d > 1).count() as u64;
    let mem_ctx = MemoryContext {
        zero_stage: c.zero_stage,
        zero_shard: c.dp * c.cp,
        comm_groups: groups,
        reserve_bytes: c.memory_reserve_bytes,
        fp32_main_grads: c.runtime.fp32_main_grads,
    };
    let embedding_rank = sched.rank_of(0);
    let head_rank = sched.rank_of(num_stages - 1);
    let mut memory = Vec::with_capacity(pp);
    let mut dp_comm_s = Vec::with_capacity(pp);
    let mut optimizer_s = Vec::with_capacity(pp);
    for (r, ks) in rank_stages.iter().enumerate() {
        let st: Vec<&StageCost> = ks.iter().map(|&k| &stage_costs[k]).collect();
        memory.push(memory::rank_memory(
            &st,
            sim.peak_activation_bytes[r],
            &mem_ctx,
        ));
        let params = memory::rank_params(&st);
        let grad_reduce_bytes = if c.runtime.fp32_main_grads {
            memory::GRAD_BYTES_PER_PARAM
        } else {
            memory::HALF_GRAD_BYTES_PER_PARAM
        };
        let mut dp = dp_comm_time_s(profile, c, &st, &dp_link, m);
        // Tied word embeddings: the first and last ranks all-reduce the shared gradient.
        if embedding_rank != head_rank && (r == embedding_rank || r == head_rank) {
            let tied: u64 = stage_costs.iter().map(|s| s.tied_params).sum();
            let link = cluster.link_between(
                embedding_rank as u64 * layout.pp_stride(),
                head_rank as u64 * layout.pp_stride(),
            );
            dp += profile.collective_time_s(
                autopp_models::CollectiveKind::AllReduce,
                tied * grad_reduce_bytes,
                2,
                &link,
            );
        }
        dp_comm_s.push(dp);
        optimizer_s.push(optimizer_time_s(profile, c, params));
    }

    // The tail: the slowest rank's data-parallel communication and optimizer step.
    let tail_rank = (0..pp)
        .max_by(|&a, &b| {
            (dp_comm_s[a] + optimizer_s[a]).total_cmp(&(dp_comm_s[b] + optimizer_s[b]))
        })
        .unwrap_or(0);
    let iteration_time_s = sim.makespan_s + dp_comm_s[tail_rank] + optimizer_s[tail_rank];

    // The busiest rank explains the pipeline part of the breakdown.
    let busy_rank = (0..pp)
        .max_by(|&a, &b| sim.busy_s[a].total_cmp(&sim.busy_s[b]))
        .unwrap_or(0);
    let comm_busy: f64 = rank_stages[busy_rank]
        .iter()
        .map(|&k| stage_costs[k].comm_s())
        .sum::<f64>()
        * m as f64;
    let pp_comm = (sim.makespan_s - makespan_no_comm_s).max(0.0);
    let sends_busy: f64 = rank_stages[busy_rank]
        .iter()
        .map(|&k| send_busy_s[k])
        .sum::<f64>()
        * m as f64;
    let compute = sim.busy_s[busy_rank] - comm_busy - sends_busy;
    let bubble = (sim.makespan_s - sim.busy_s[busy_rank] - pp_comm).max(0.0);
    let breakdown = Breakdown {
        compute,
        bubble,
        tp_comm: comm_busy,
        pp_comm: sim.makespan_s - compute - comm_busy - bubble,
        dp_comm: dp_comm_s[tail_rank],
        optimizer: optimizer_s[tail_rank],
    };

    let flops_per_iteration = model_flops_per_sequence * c.global_batch_size as f64;
    let gpus = c.num_gpus() as f64;
    let tflops_per_gpu = flops_per_iteration / (iteration_time_s * gpus) / 1e12;
    let capacity = cluster.gpu.memory_bytes;
    let peak_memory_bytes = memory
        .iter()
        .map(RankMemory::total_bytes)
        .max()
        .unwrap_or(0);
    let predicted = Predicted {
        iteration_time_s,
        tokens_per_s: (c.global_batch_size * model.seq_length()) as f64 / iteration_time_s,
        tflops_per_gpu,
        mfu: tflops_per_gpu * 1e12 / profile.peak_flops,
        bubble_fraction: sim.bubble_fraction,
        peak_memory_bytes,
        memory_capacity_bytes: capacity,
        fits: peak_memory_bytes <= capacity,
        breakdown_s: breakdown,
    };
    let ranks = rank_stages
        .iter()
        .enumerate()
        .map(|(r, ks)| {
            let transformer_layers: u64 = ks
                .iter()
                .map(|&k| stage_costs[k].num_transformer_layers)
                .sum();
            let per_stage: Vec<u64> = ks
                .iter()
                .map(|&k| {
                    if c.recompute == Recompute::Full {
                        stage_costs[k].num_transformer_layers
                    } else {
                        full_layers.get(k).copied().unwrap_or(0)
                    }
                })
                .collect();
            let full: u64 = per_stage.iter().sum();
            let recompute = if full == 0 {
                c.recompute.to_string()
            } else if full == transformer_layers {
                Recompute::Full.to_string()
            } else {
                String::from("partial")
            };
            RankPlan {
                rank: r as u64,
                stages: ks.iter().map(|&k| ranges[k]).collect(),
                recompute,
                recompute_num_layers: full,
                recompute_num_layers_per_stage: per_stage,
                memory_bytes: memory[r].total_bytes(),
                compute_time_s: sim.busy_s[r],
            }
        })
        .collect();
    let plan = Plan {
        format_version: FORMAT_VERSION,
        model: model.name().to_string(),
        gpus: c.num_gpus(),
        gpu: cluster.gpu.name.clone(),
        gpus_per_node: cluster.gpus_per_node,
        tp: c.tp,
        pp: c.pp,
        dp: c.dp,
        cp: c.cp,
        virtual_stages: c.virtual_stages,
        micro_batch_size: c.micro_batch_size,
        num_microbatches: m,
        global_batch_size: c.global_batch_size,
        schedule: c.schedule.to_string(),
        recompute: c.recompute.to_string(),
        sequence_parallel: c.sequence_parallel,
        zero_stage: c.zero_stage,
        megatron_layout: crate::layout::megatron_layout(&kinds, &ranges),
        ranks,
    };
    Ok(Estimate {
        result: PlanAndPrediction { plan, predicted },
        memory,
        stages: stage_costs,
        schedule: sched,
        simulation: sim,
        dp_comm_s,
        optimizer_s,
        warnings,
    })
}

/// The fully recomputed transformer layers of each stage under `c.recompute_layers`, checked
/// against the split (empty when there is no partial recompute).
fn partial_recompute(
    c: &ParallelConfig,
    layers: &[LayerCost],
    ranges: &[[usize; 2]],
) -> Result<Vec<u64>, PlanError> {
    let Some(counts) = &c.recompute_layers else {
        return Ok(Vec::new());
    };
    let recomputable = |&[first, last]: &[usize; 2]| {
        layers[first..=last]
            .iter()
            .filter(|l| l.recomputable)
            .count() as u64
    };
    if let [n] = counts[..] {
        // Megatron-LM: the first N layers of every stage, all of a shorter stage's
        return Ok(ranges.iter().map(|r| n.min(recomputable(r))).collect());
    }
    if counts.len() != ranges.len() {
        return Err(PlanError::invalid(
            "--recompute-num-layers",
            format!(
                "gives {} stage counts but the plan has {} stages (pp × virtual stages): give one number for every stage, or one for all",
                counts.len(),
                ranges.len()
            ),
        ));
    }
    for (k, (&n, range)) in counts.iter().zip(ranges).enumerate() {
        let recomputable = recomputable(range);
        if n > recomputable {
            return Err(PlanError::invalid(
                "--recompute-num-layers",
                format!("stage {k} has {recomputable} recomputable layers, fewer than the {n} asked to be fully recomputed"),
            ));
        }
    }
    Ok(counts.clone())
}

/// Seconds of one rank's optimizer step: memory-bound Adam over the parameters it owns
/// (`params`, sharded over `dp · cp` from ZeRO 1 on).
pub fn optimizer_time_s(profile: &AnalyticProfile, c: &ParallelConfig, params: u64) -> f64 {
    let owned = if c.zero_stage >= 1 {
        params.div_ceil((c.dp * c.cp).max(1))
    } else {
        params
    };
    profile.memory_bound_time_s(ADAM_BYTES_PER_PARAM * owned as f64)
}

/// Exposed data-parallel communication of one rank, seconds, for `m` micro-batches:
///
/// * ZeRO 0: an all-reduce of the gradients; ZeRO 1–2: a reduce-scatter of the gradients and an
///   all-gather of the updated 16-bit weights (Megatron's distributed optimizer). With
///   `overlap_grad_reduce` the gradient reduction overlaps the last micro-batch's backward.
/// * ZeRO 3: per micro-batch, an all-gather of each layer's weights for the forward and again for
///   the backward and a reduce-scatter of its gradients (Rajbhandari et al. 2020, §5.3: 1.5× the
///   traffic of an all-reduce), prefetched layer by layer so that it overlaps the micro-batch's
///   compute.
///
/// Gradients travel in fp32 with main gradients and in 16 bits otherwise; weights in 16 bits.
pub fn dp_comm_time_s(
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    stages: &[&StageCost],
    link: &autopp_hardware::Link,
    m: u64,
) -> f64 {
    use autopp_models::CollectiveKind::*;
    let params = memory::rank_params(stages);
    let grad_bytes = params
        * if c.runtime.fp32_main_grads {
            memory::GRAD_BYTES_PER_PARAM
        } else {
            memory::HALF_GRAD_BYTES_PER_PARAM
        };
    let weight_bytes = params * memory::WEIGHT_BYTES_PER_PARAM;
    let n = c.dp * c.cp;
    let eff = &profile.efficiency;
    let backward_s: f64 = stages.iter().map(|s| s.backward_s()).sum();
    match c.zero_stage {
        0..=2 => {
            let reduce = if c.zero_stage == 0 {
                profile.collective_time_s(AllReduce, grad_bytes, n, link)
            } else {
                profile.collective_time_s(ReduceScatter, grad_bytes, n, link)
            };
            let gather = if c.zero_stage == 0 {
                0.0
            } else {
                profile.collective_time_s(AllGather, weight_bytes, n, link)
            };
            let reduce = if c.runtime.overlap_grad_reduce {
                eff.exposed_comm_s(reduce, backward_s)
            } else {
                reduce
            };
            reduce + gather
        }
        _ => {
            // one collective per layer: the latency counts once per layer
            let pieces: u64 = stages
                .iter()
                .map(|s| (s.layers[1] + 1 - s.layers[0]) as u64)
                .sum::<u64>()
                .max(1);
            let per = |kind, bytes: u64| {
                pieces as f64 * profile.collective_time_s(kind, bytes.div_ceil(pieces), n, link)
            };
            let comm = 2.0 * per(AllGather, weight_bytes) + per(ReduceScatter, grad_bytes);
            let compute: f64 = stages.iter().map(|s| s.forward_s() + s.backward_s()).sum();
            m as f64 * eff.exposed_comm_s(comm, compute)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Runtime;
    use crate::schedule::ScheduleKind;
    use autopp_hardware::{hardware, Cluster, Precision};

    fn setup(gpus: u64, tp: u64, pp: u64) -> (Model, AnalyticProfile, ParallelConfig) {
        let model = autopp_models::load_str(
            r#"{"name": "m", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
                "vocab_size": 32000, "seq_length": 2048}"#,
            "test",
        )
        .unwrap();
        let c = Cluster::new(hardware::gpu("a100-80g").unwrap(), gpus, 8, Some(50.0)).unwrap();
        let profile = AnalyticProfile::new(c, Precision::Fp16).unwrap();
        let config = ParallelConfig {
            tp,
            pp,
            dp: gpus / (tp * pp),
            cp: 1,
            virtual_stages: 1,
            micro_batch_size: 1,
            global_batch_size: 64,
            schedule: ScheduleKind::OneFOneB,
            group_size: None,
            recompute: Recompute::Full,
            recompute_layers: None,
            sequence_parallel: false,
            zero_stage: 0,
            split: None,
            precision: Precision::Fp16,
            memory_reserve_bytes: 0,
            flash_attention: false,
            runtime: Runtime::default(),
        };
        (model, profile, config)
    }

    fn time(m: &Model, p: &AnalyticProfile, c: &ParallelConfig) -> Estimate {
        evaluate(m, p, c).unwrap()
    }

    #[test]
    fn overlapped_gradient_reduction_hides_behind_the_backward() {
        let (m, p, mut c) = setup(32, 1, 1);
        let plain = time(&m, &p, &c).dp_comm_s[0];
        c.runtime.overlap_grad_reduce = true;
        let hidden = time(&m, &p, &c).dp_comm_s[0];
        assert!(hidden < plain, "{hidden} vs {plain}");
        // 16-bit gradients halve the traffic
        c.runtime.overlap_grad_reduce = false;
        c.runtime.fp32_main_grads = false;
        let half = time(&m, &p, &c).dp_comm_s[0];
        assert!(
            (half - plain / 2.0).abs() < 0.05 * plain,
            "{half} vs {plain}"
        );
    }

    #[test]
    fn deepspeed_pipeline_sends_cost_more() {
        let (m, p, mut c) = setup(32, 8, 4);
        let megatron = time(&m, &p, &c).result.predicted;
        c.runtime.pp_scatter_gather = false;
        c.runtime.pp_blocking_sends = true;
        let deepspeed = time(&m, &p, &c).result.predicted;
        assert!(deepspeed.iteration_time_s > megatron.iteration_time_s);
        assert!(deepspeed.breakdown_s.pp_comm > megatron.breakdown_s.pp_comm);
        let b = deepspeed.breakdown_s;
        let sum = b.compute + b.bubble + b.tp_comm + b.pp_comm + b.dp_comm + b.optimizer;
        assert!((sum - deepspeed.iteration_time_s).abs() < 1e-9 * sum);
    }

    /// ZeRO-3 gathers each layer's weights twice and reduce-scatters its gradients every
    /// micro-batch (1.5× an all-reduce); with the compute fully hidden behind it, the exposed
    /// time is at most that traffic.
    #[test]
    fn zero3_traffic_overlaps_compute() {
        let (m, mut p, mut c) = setup(32, 1, 1);
        c.zero_stage = 3;
        p.efficiency.comm_overlap = 0.0;
        let serial = time(&m, &p, &c).dp_comm_s[0];
        p.efficiency.comm_overlap = 1.0;
        let overlapped = time(&m, &p, &c).dp_comm_s[0];
        assert!(overlapped < serial);
        let m_count = c.num_microbatches() as f64;
        assert!(serial > m_count * 1e-3);
    }
}
