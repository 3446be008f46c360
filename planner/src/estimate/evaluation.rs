//! The phases of evaluating one configuration, one method each, in the order
//! [`super::evaluate_scheduled`] runs them: lay the stages out, cost them, simulate the
//! pipeline, add each rank's memory and data-parallel tail, then the prediction and the plan.

use autopp_hardware::{AnalyticProfile, LayerTimes, Layout, Link};
use autopp_models::{CollectiveKind, LayerCost, LayerKind, Model, Recompute};

use super::{cp_kv_bytes, dp_comm_time_s, optimizer_time_s, Detail};
use crate::config::{ParallelConfig, PlanError};
use crate::memory::{self, RankMemory};
use crate::plan::{Breakdown, Plan, Predicted, RankPlan, RankRecompute, FORMAT_VERSION};
use crate::schedule::{self, split, Schedule, SimCosts, SimResult};
use crate::stages::{self, StageContext, StageCost};

mod fits;

/// One configuration being evaluated: its inputs and its stage layout.
pub(super) struct Evaluation<'a> {
    model: &'a Model,
    profile: &'a AnalyticProfile,
    c: &'a ParallelConfig,
    layers: &'a [LayerCost],
    /// Each layer's compute times, when the caller has them (the search times its layer
    /// lists once); timed here otherwise.
    timed: Option<&'a [LayerTimes]>,
    sched: &'a Schedule,
    /// The kinds of the layer list.
    kinds: Vec<LayerKind>,
    /// Each stage's inclusive `[first, last]` layers, in global stage order.
    ranges: Vec<[usize; 2]>,
    /// Each rank's stages, in the rank's order.
    rank_stages: Vec<Vec<usize>>,
    layout: Layout,
    /// Micro-batches per iteration per replica.
    m: u64,
}

/// Per-stage costs with partial recompute's fully recomputed layers per stage.
pub(super) struct Stages {
    /// Per stage, in global stage order.
    pub costs: Vec<StageCost>,
    /// Fully recomputed transformer layers per stage (empty without partial recompute).
    full_layers: Vec<u64>,
}

/// The pipeline's simulation.
pub(super) struct Pipeline {
    /// With pipeline sends.
    pub sim: SimResult,
    /// The makespan without pipeline sends, seconds (the simulation's own with
    /// [`Detail::TimeAndMemory`]).
    makespan_no_comm_s: f64,
    /// Per stage: seconds its rank is held by blocking sends per micro-batch.
    send_busy_s: Vec<f64>,
}

/// Each rank's memory and data-parallel tail.
pub(super) struct Ranks {
    /// Memory per GPU by kind.
    pub memory: Vec<RankMemory>,
    /// Exposed data-parallel communication, seconds.
    pub dp_comm_s: Vec<f64>,
    /// Optimizer step, seconds.
    pub optimizer_s: Vec<f64>,
}

impl<'a> Evaluation<'a> {
    /// Lays the stages out: the split (the configuration's, or Megatron's even one) and each
    /// rank's stages under `sched`, which must be the configuration's schedule.
    pub fn new(
        model: &'a Model,
        profile: &'a AnalyticProfile,
        c: &'a ParallelConfig,
        layers: &'a [LayerCost],
        sched: &'a Schedule,
    ) -> Result<Self, PlanError> {
        let kinds: Vec<LayerKind> = layers.iter().map(|l| l.kind).collect();
        let num_stages = c.num_stages() as usize;
        let counts = match &c.split {
            Some(counts) => {
                split::check_split(counts, layers.len(), num_stages)?;
                counts.clone()
            }
            None => split::default_split(&kinds, num_stages)?,
        };
        let m = c.num_microbatches();
        let d = &c.degrees;
        if sched.pp != d.pp as usize
            || sched.num_microbatches != m as usize
            || sched.virtual_stages != d.virtual_stages as usize
            || sched.kind != c.schedule
        {
            return Err(PlanError::Schedule(format!(
                "internal: the schedule given ({} pp {} v {} m {}) is not the configuration's",
                sched.kind, sched.pp, sched.virtual_stages, sched.num_microbatches
            )));
        }
        let mut rank_stages: Vec<Vec<usize>> = vec![Vec::new(); d.pp as usize];
        for k in 0..num_stages {
            rank_stages[sched.rank_of(k)].push(k);
        }
        Ok(Evaluation {
            model,
            profile,
            c,
            layers,
            timed: None,
            sched,
            kinds,
            ranges: split::stage_ranges(&counts),
            rank_stages,
            layout: d.layout(),
            m,
        })
    }

    /// The link of the tensor-parallel group.
    fn tp_link(&self) -> Link {
        let tp = self.c.degrees.tp;
        self.c
            .settings
            .runtime
            .ring_link(&self.profile.cluster, tp, self.layout.tp_stride())
    }

    /// Things the user should know: a tensor-parallel group that leaves the node.
    pub fn warnings(&self) -> Vec<String> {
        let (tp, cluster) = (self.c.degrees.tp, &self.profile.cluster);
        if self.tp_link().inter_node && tp > 1 {
            vec![format!(
                "the tensor-parallel group ({tp} GPUs) leaves the node of {}: its all-reduces run over the NIC",
                cluster.gpus_per_node
            )]
        } else {
            Vec::new()
        }
    }

    /// The same evaluation with each layer's compute times given (`timed[i]` of `layers[i]`,
    /// from the same profile): they are not timed again.
    pub fn with_timed(mut self, timed: Option<&'a [LayerTimes]>) -> Self {
        self.timed = timed.filter(|t| t.len() == self.layers.len());
        self
    }

    /// Every stage's costs for one micro-batch, with partial recompute's fully recomputed
    /// layers (checked against the split).
    pub fn stage_costs(&self) -> Result<Stages, PlanError> {
        let (c, d) = (self.c, &self.c.degrees);
        let ctx = StageContext {
            profile: self.profile,
            tp: d.tp,
            tp_link: self.tp_link(),
            recompute: c.recompute,
            cp: d.cp,
            cp_link: self
                .profile
                .cluster
                .group_link(d.cp, self.layout.cp_stride()),
            cp_kv_bytes: cp_kv_bytes(self.model, c),
            tp_comm_overlap: c.settings.runtime.tp_comm_overlap,
            ep: c.experts.ep,
            ep_link: self.profile.cluster.group_link(c.experts.ep, c.experts.etp),
            ep_hidden_share: crate::experts::a2a_hidden_share(
                c,
                crate::experts::mtp_layers(self.model),
            ),
            ep_across_share: crate::experts::node_dedup_share(
                self.model,
                c,
                self.profile.cluster.gpus_per_node,
            ),
            selective_linear_share: StageContext::selective_share_of(
                &c.settings.runtime,
                self.model,
            ),
            dtensor_tp: c.settings.runtime.tp_collectives == crate::runtime::TpCollectives::Dtensor,
            torch_native: c.settings.runtime.stack == crate::Stack::Torchtitan,
            torch_compiled: c.settings.runtime.torch_compiled(),
            fused_qkv: c.settings.runtime.selective.fused_qkv(),
            compiled_loss: c.settings.runtime.compiled_loss,
            expert_host_launches: c.settings.runtime.expert_host_launches,
            host_serialized: c.settings.runtime.host_serialized,
        };
        let full_layers = partial_recompute(c, self.layers, &self.ranges)?;
        let costs = match self.timed {
            Some(timed) => {
                stages::stage_costs_timed(self.layers, timed, &self.ranges, &ctx, &full_layers)
            }
            None => stages::stage_costs_partial(self.layers, &self.ranges, &ctx, &full_layers),
        };
        Ok(Stages { costs, full_layers })
    }

    /// Seconds of the pipeline send after each stage but the last (0 between stages on one
    /// rank): `1/t` of the boundary activation per GPU with Megatron's scatter/gather, the whole
    /// of it without.
    fn send_times_s(&self, costs: &[StageCost]) -> Vec<f64> {
        let (cluster, sched) = (&self.profile.cluster, self.sched);
        let send_factor = if self.c.settings.runtime.pp_scatter_gather {
            1
        } else {
            self.c.degrees.tp
        };
        let pp_stride = self.layout.pp_stride();
        (0..costs.len().saturating_sub(1))
            .map(|k| {
                let (from, to) = (sched.rank_of(k), sched.rank_of(k + 1));
                if from == to {
                    return 0.0;
                }
                let link = cluster.link_between(from as u64 * pp_stride, to as u64 * pp_stride);
                self.profile
                    .p2p_time_s(costs[k].output_bytes * send_factor, &link)
            })
            .collect()
    }

    /// Simulates the schedule with the stage costs and sends, and (for the breakdown) without
    /// the sends. Blocking sends hold the sender: stage k's forward ends when its output reached
    /// k + 1, and stage k + 1's backward when its input gradient reached k.
    /// `known`: the simulation with sends, from an earlier evaluation of the same
    /// configuration at a detail other than [`Detail::Full`] (not run again).
    pub fn simulate(
        &self,
        costs: &[StageCost],
        detail: Detail,
        known: Option<&SimResult>,
    ) -> Result<Pipeline, PlanError> {
        let p2p_s = self.send_times_s(costs);
        let compute_only: Vec<schedule::StageCosts> = costs
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
        let mut send_busy_s = vec![0.0; costs.len()];
        let mut with_sends = compute_only.clone();
        let p2p_s = if self.c.settings.runtime.pp_blocking_sends {
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
        let sends = p2p_s.len();
        let sim = match known {
            Some(sim) if detail != Detail::Full => sim.clone(),
            _ => self.run(with_sends, p2p_s, detail)?,
        };
        let makespan_no_comm_s = match detail {
            Detail::Full | Detail::Breakdown => {
                self.run(compute_only, vec![0.0; sends], Detail::TimeAndMemory)?
                    .makespan_s
            }
            Detail::TimeAndMemory => sim.makespan_s,
        };
        Ok(Pipeline {
            sim,
            makespan_no_comm_s,
            send_busy_s,
        })
    }

    /// One simulation; the timeline is recorded only with [`Detail::Full`] (the search's inner
    /// loop runs the compiled metrics-only loop, bit for bit the same numbers).
    fn run(
        &self,
        stages: Vec<schedule::StageCosts>,
        p2p_s: Vec<f64>,
        detail: Detail,
    ) -> Result<SimResult, PlanError> {
        let costs = SimCosts {
            stages,
            p2p_s,
            overlap_factor: None,
        };
        match detail {
            Detail::Full => schedule::simulate(self.sched, &costs),
            Detail::Breakdown | Detail::TimeAndMemory => {
                schedule::simulate_metrics(self.sched, &costs).map(|m| SimResult {
                    makespan_s: m.makespan_s,
                    busy_s: m.busy_s,
                    bubble_fraction: m.bubble_fraction,
                    peak_inflight: m.peak_inflight,
                    peak_activation_bytes: m.peak_activation_bytes,
                    timeline: Vec::new(),
                    memory: Vec::new(),
                })
            }
        }
        .map_err(|e| PlanError::Schedule(e.to_string()))
    }

    /// The busiest rank's seconds of work in one iteration, `m · Σ (F + B)` over its stages:
    /// every rank runs its actions one after another, so no simulation of this configuration
    /// (sends, bubble and data-parallel tail only add) takes less.
    pub fn busiest_rank_s(&self, costs: &[StageCost]) -> f64 {
        self.rank_stages
            .iter()
            .map(|stages| {
                let per_microbatch: f64 = stages
                    .iter()
                    .map(|&k| costs[k].forward_s() + costs[k].backward_s())
                    .sum();
                per_microbatch * self.m as f64
            })
            .fold(0.0, f64::max)
    }

    /// Each rank's memory (with its simulated activation peak), exposed data-parallel
    /// communication (with the tied embedding's all-reduce between first and last rank) and
    /// optimizer step.
    pub fn ranks(&self, costs: &[StageCost], sim: &SimResult) -> Ranks {
        let (c, d, profile) = (self.c, &self.c.degrees, self.profile);
        let mem_ctx = self.memory_context();
        let cluster = &profile.cluster;
        let dp_link = c.settings.runtime.ring_link(
            cluster,
            d.data_parallel_gpus(),
            self.layout.tp_stride() * d.tp,
        );
        let embedding_rank = self.sched.rank_of(0);
        let head_rank = self.sched.rank_of(costs.len() - 1);
        let grad_reduce_bytes = if c.settings.runtime.fp32_main_grads {
            memory::GRAD_BYTES_PER_PARAM
        } else {
            memory::HALF_GRAD_BYTES_PER_PARAM
        };
        let pp = self.rank_stages.len();
        let mut ranks = Ranks {
            memory: Vec::with_capacity(pp),
            dp_comm_s: Vec::with_capacity(pp),
            optimizer_s: Vec::with_capacity(pp),
        };
        for (r, ks) in self.rank_stages.iter().enumerate() {
            let st: Vec<&StageCost> = ks.iter().map(|&k| &costs[k]).collect();
            let peak = sim.peak_activation_bytes[r];
            ranks.memory.push(memory::rank_memory(&st, peak, &mem_ctx));
            let mut dp = dp_comm_time_s(profile, c, &st, &dp_link, self.m);
            // Tied word embeddings: the first and last ranks all-reduce the shared gradient.
            if embedding_rank != head_rank && (r == embedding_rank || r == head_rank) {
                let tied: u64 = costs.iter().map(|s| s.tied_params).sum();
                let link = cluster.link_between(
                    embedding_rank as u64 * self.layout.pp_stride(),
                    head_rank as u64 * self.layout.pp_stride(),
                );
                let bytes = tied * grad_reduce_bytes;
                dp += profile.collective_time_s(CollectiveKind::AllReduce, bytes, 2, &link);
            }
            ranks.dp_comm_s.push(dp);
            let params = memory::rank_params(&st);
            ranks
                .optimizer_s
                .push(optimizer_time_s(profile, c, &st, params));
        }
        ranks
    }

    /// The iteration time and where it goes: the pipeline's makespan plus the slowest rank's
    /// data-parallel communication and optimizer step; the busiest rank explains the pipeline
    /// part (compute, tensor-parallel communication, sends, bubble).
    pub fn breakdown(&self, costs: &[StageCost], pipeline: &Pipeline, ranks: &Ranks) -> Breakdown {
        let sim = &pipeline.sim;
        let (dp_comm_s, optimizer_s) = (&ranks.dp_comm_s, &ranks.optimizer_s);
        let pp = self.rank_stages.len();
        let tail_rank = (0..pp)
            .max_by(|&a, &b| {
                (dp_comm_s[a] + optimizer_s[a]).total_cmp(&(dp_comm_s[b] + optimizer_s[b]))
            })
            .unwrap_or(0);
        let busy_rank = (0..pp)
            .max_by(|&a, &b| sim.busy_s[a].total_cmp(&sim.busy_s[b]))
            .unwrap_or(0);
        let m = self.m as f64;
        let busy_stages = &self.rank_stages[busy_rank];
        let comm_busy: f64 = busy_stages.iter().map(|&k| costs[k].comm_s()).sum::<f64>() * m;
        let ep_busy: f64 = busy_stages.iter().map(|&k| costs[k].ep_comm_s).sum::<f64>() * m;
        let ep_hidden = busy_stages
            .iter()
            .map(|&k| costs[k].ep_comm_hidden_s)
            .sum::<f64>()
            * m;
        let pp_comm = (sim.makespan_s - pipeline.makespan_no_comm_s).max(0.0);
        let sends_busy: f64 = busy_stages
            .iter()
            .map(|&k| pipeline.send_busy_s[k])
            .sum::<f64>()
            * m;
        let compute = sim.busy_s[busy_rank] - comm_busy - sends_busy;
        let bubble = (sim.makespan_s - sim.busy_s[busy_rank] - pp_comm).max(0.0);
        Breakdown {
            compute,
            bubble,
            tp_comm: comm_busy - ep_busy,
            ep_comm: ep_busy,
            ep_comm_hidden: ep_hidden,
            // the makespan is at least the busiest rank's busy time, so this is ≥ 0 but for
            // rounding
            pp_comm: (sim.makespan_s - compute - comm_busy - bubble).max(0.0),
            dp_comm: dp_comm_s[tail_rank],
            optimizer: optimizer_s[tail_rank],
        }
    }

    /// Time, throughput, MFU and memory against the GPU's capacity.
    pub fn predicted(
        &self,
        pipeline: &Pipeline,
        breakdown: Breakdown,
        memory: &[RankMemory],
        model_flops_per_sequence: f64,
    ) -> Predicted {
        let (c, profile) = (self.c, self.profile);
        let sim = &pipeline.sim;
        let iteration_time_s = sim.makespan_s + breakdown.dp_comm + breakdown.optimizer;
        let flops_per_iteration = model_flops_per_sequence * c.global_batch_size as f64;
        let gpus = c.num_gpus() as f64;
        let tflops_per_gpu = flops_per_iteration / (iteration_time_s * gpus) / 1e12;
        let capacity = profile.cluster.gpu.memory_bytes;
        let peak_memory_bytes = memory
            .iter()
            .map(RankMemory::total_bytes)
            .max()
            .unwrap_or(0);
        let tokens = c.global_batch_size * self.model.seq_length();
        Predicted {
            iteration_time_s,
            tokens_per_s: tokens as f64 / iteration_time_s,
            tflops_per_gpu,
            mfu: tflops_per_gpu * 1e12 / profile.peak_flops,
            bubble_fraction: sim.bubble_fraction,
            stage_imbalance: stage_imbalance(&sim.busy_s, sim.makespan_s),
            peak_memory_bytes,
            memory_capacity_bytes: capacity,
            fits: peak_memory_bytes + c.settings.memory_margin_bytes <= capacity,
            breakdown_s: breakdown,
        }
    }

    /// The plan: the configuration with each rank's stages, recompute, memory and busy time.
    pub fn plan(&self, stages: &Stages, sim: &SimResult, memory: &[RankMemory]) -> Plan {
        let c = self.c;
        let cluster = &self.profile.cluster;
        let ranks = (0..self.rank_stages.len())
            .map(|r| RankPlan {
                memory_bytes: memory[r].total_bytes(),
                compute_time_s: sim.busy_s[r],
                ..self.rank_plan(r, stages)
            })
            .collect();
        Plan {
            format_version: FORMAT_VERSION,
            model: self.model.name().to_string(),
            gpus: c.num_gpus(),
            gpu: cluster.gpu.name.clone(),
            gpus_per_node: cluster.gpus_per_node,
            degrees: c.degrees,
            micro_batch_size: c.micro_batch_size,
            num_microbatches: self.m,
            global_batch_size: c.global_batch_size,
            schedule: c.schedule,
            recompute: c.recompute,
            sequence_parallel: c.sequence_parallel,
            zero_stage: c.zero_stage,
            ep: self.is_moe().then_some(c.experts.ep),
            etp: self.is_moe().then_some(c.experts.etp),
            moe_imbalance: self.is_moe().then_some(c.experts.imbalance),
            megatron_layout: crate::layout::megatron_layout(
                &self.kinds,
                &self.ranges,
                crate::experts::mtp_layers(self.model) as usize,
                c.degrees.pp as usize,
            ),
            ranks,
        }
    }

    /// Whether the model has routed experts.
    fn is_moe(&self) -> bool {
        matches!(self.model, autopp_models::Model::Transformer(t) if t.moe.is_some())
    }

    /// Rank `r`'s stages and recompute (memory and time left at zero).
    fn rank_plan(&self, r: usize, stages: &Stages) -> RankPlan {
        let ks = &self.rank_stages[r];
        let costs = &stages.costs;
        let transformer_layers: u64 = ks.iter().map(|&k| costs[k].num_transformer_layers).sum();
        let per_stage: Vec<u64> = ks
            .iter()
            .map(|&k| {
                if self.c.recompute == Recompute::Full {
                    costs[k].num_transformer_layers
                } else {
                    stages.full_layers.get(k).copied().unwrap_or(0)
                }
            })
            .collect();
        let full: u64 = per_stage.iter().sum();
        let recompute = if full == 0 {
            RankRecompute::from(self.c.recompute)
        } else if full == transformer_layers {
            RankRecompute::Full
        } else {
            RankRecompute::Partial
        };
        RankPlan {
            rank: r as u64,
            stages: ks.iter().map(|&k| self.ranges[k]).collect(),
            recompute,
            recompute_num_layers: full,
            recompute_num_layers_per_stage: per_stage,
            memory_bytes: 0,
            compute_time_s: 0.0,
        }
    }
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

/// (largest − mean of `busy_s`) / `makespan_s`, seconds over seconds; 0 for an empty run.
pub fn stage_imbalance(busy_s: &[f64], makespan_s: f64) -> f64 {
    if busy_s.is_empty() || makespan_s <= 0.0 {
        return 0.0;
    }
    let max = busy_s.iter().copied().fold(0.0, f64::max);
    let mean = busy_s.iter().sum::<f64>() / busy_s.len() as f64;
    (max - mean) / makespan_s
}

#[cfg(test)]
mod tests {
    /// Busy 4, 3, 2 and 3 s in a 5 s pipeline: the mean rank is busy 3 s, the busiest 4 s, so
    /// the lighter ranks idle (4 − 3) / 5 = 20% more than the busiest on average.
    #[test]
    fn stage_imbalance_hand_worked() {
        let i = super::stage_imbalance(&[4.0, 3.0, 2.0, 3.0], 5.0);
        assert!((i - 0.2).abs() < 1e-12, "{i}");
        assert_eq!(super::stage_imbalance(&[2.0, 2.0], 5.0), 0.0);
        assert_eq!(super::stage_imbalance(&[], 5.0), 0.0);
    }
}
