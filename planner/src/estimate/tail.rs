//! A rank's tail of the iteration, after its pipeline work: the data-parallel gradient (and
//! ZeRO parameter) communication and the optimizer step.

use autopp_hardware::AnalyticProfile;

use crate::config::ParallelConfig;
use crate::memory;
use crate::stages::StageCost;

/// Bytes of HBM traffic per optimizer-owned parameter in one Adam step: read the fp32 gradient
/// (4), read and write master weight, m and v (24), write the 16-bit weight (2).
pub const ADAM_BYTES_PER_PARAM: f64 = 30.0;

/// Seconds of one rank's optimizer step: memory-bound Adam over the parameters it owns
/// (`params`, sharded over `dp · cp` from ZeRO 1 on; the routed experts' among them over the
/// expert-data-parallel group).
pub fn optimizer_time_s(
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    stages: &[&StageCost],
    params: u64,
) -> f64 {
    let experts: u64 = stages
        .iter()
        .map(|s| s.expert_params)
        .sum::<u64>()
        .min(params);
    let owned = if c.zero_stage >= 1 {
        (params - experts).div_ceil(c.degrees.data_parallel_gpus().max(1))
            + experts.div_ceil(c.experts.expert_dp(&c.degrees))
    } else {
        params
    };
    profile.memory_bound_time_s(ADAM_BYTES_PER_PARAM * owned as f64)
}

/// Exposed data-parallel communication of one rank, seconds, for `m` micro-batches:
///
/// * ZeRO 0: an all-reduce of the gradients; ZeRO 1–2: a reduce-scatter of the gradients and an
///   all-gather of the updated 16-bit weights (Megatron's distributed optimizer). With
///   `overlap_grad_reduce` the gradient reduction overlaps the last micro-batch's backward;
///   with `overlap_param_gather` the weight all-gather overlaps the next iteration's first
///   forward (Megatron-Core's `--overlap-param-gather` gathers bucket by bucket in the forward
///   pre-hooks of the first micro-batch; FSDP2 prefetches the same way).
/// * ZeRO 3: per micro-batch, an all-gather of each layer's weights for the forward and again for
///   the backward and a reduce-scatter of its gradients (Rajbhandari et al. 2020, §5.3: 1.5× the
///   traffic of an all-reduce), prefetched layer by layer so that it overlaps the micro-batch's
///   compute.
///
/// * ZeRO 2 under PyTorch FSDP ([`memory::StackMemory::fsdp`]: FSDP2's
///   `reshard_after_forward=False`, FSDP1's `SHARD_GRAD_OP`): per micro-batch, one all-gather
///   of each layer's weights, kept from the forward to the backward, and a reduce-scatter of its
///   gradients, prefetched and overlapped as under ZeRO 3. FSDP reduce-scatters every
///   micro-batch's gradients: torchtitan's training loop accumulates without
///   `set_requires_gradient_sync(False)`, "usually the gradient sync should be well-hidden"
///   (pytorch/torchtitan#1710).
/// * FSDP under a pipeline ([`memory::StackMemory::pipelined_fsdp`], ZeRO 2 or 3): once per
///   step. PyTorch's pipeline stages keep the stage unsharded from the first forward to the
///   last backward (`set_reshard_after_backward(False)`, `set_requires_gradient_sync(False)`)
///   and then call each layer's `post_backward` by hand: the first micro-batch's forward
///   gathers each layer (prefetched, overlapped with that forward under
///   `overlap_param_gather`), and the reduce-scatters run after the rank's last backward with
///   nothing left to hide behind, one per layer.
///
/// Gradients travel in fp32 with main gradients and in 16 bits otherwise; weights in 16 bits.
/// Under ZeRO 0–2 the routed experts' parameters reduce and gather over the
/// expert-data-parallel group (`edp` GPUs `ep · etp` apart, on `expert_dp_link`), the rest
/// over the data-parallel group (`link`), one after the other: Megatron-Core's distributed
/// data parallel keeps the expert-parallel parameters in buffers of their own, reduced over
/// the expert-data-parallel group (`distributed_data_parallel.py`: `expert_parallel_buffers`,
/// `parallel_state.get_expert_data_parallel_group`).
pub fn dp_comm_time_s(
    profile: &AnalyticProfile,
    c: &ParallelConfig,
    stages: &[&StageCost],
    link: &autopp_hardware::Link,
    m: u64,
) -> f64 {
    use autopp_models::CollectiveKind::*;
    let all = memory::rank_params(stages);
    let experts: u64 = stages.iter().map(|s| s.expert_params).sum::<u64>().min(all);
    let dense = all - experts;
    let grad_bytes_per_param = if c.settings.runtime.fp32_main_grads {
        memory::GRAD_BYTES_PER_PARAM
    } else {
        memory::HALF_GRAD_BYTES_PER_PARAM
    };
    let edp = c.experts.expert_dp(&c.degrees);
    let edp_link = expert_dp_link(profile, c);
    let n = c.degrees.data_parallel_gpus();
    let eff = &profile.efficiency;
    let backward_s: f64 = stages.iter().map(|s| s.backward_s()).sum();
    let stack = memory::StackMemory::of(c.settings.runtime.stack);
    // FSDP at ZeRO 2 (`reshard_after_forward=False`) exchanges per micro-batch as ZeRO 3 does
    let fsdp_zero2 = stack.fsdp && c.zero_stage == 2;
    match c.zero_stage {
        0..=2 if !fsdp_zero2 => {
            let reduce_kind = if c.zero_stage == 0 {
                AllReduce
            } else {
                ReduceScatter
            };
            let reduce =
                profile.collective_time_s(reduce_kind, dense * grad_bytes_per_param, n, link)
                    + profile.collective_time_s(
                        reduce_kind,
                        experts * grad_bytes_per_param,
                        edp,
                        &edp_link,
                    );
            let gather = if c.zero_stage == 0 {
                0.0
            } else {
                let w = memory::WEIGHT_BYTES_PER_PARAM;
                profile.collective_time_s(AllGather, dense * w, n, link)
                    + profile.collective_time_s(AllGather, experts * w, edp, &edp_link)
            };
            let gather = if c.settings.runtime.overlap_param_gather {
                let forward_s: f64 = stages.iter().map(|s| s.forward_s()).sum();
                eff.exposed_comm_s(gather, forward_s)
            } else {
                gather
            };
            let reduce = if c.settings.runtime.overlap_grad_reduce {
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
            // The routed experts' share as the same bytes over the data-parallel group, scaled
            // by edp's share of a ring step ((edp−1)/edp over (n−1)/n), not over the
            // expert-data-parallel link: the per-micro-batch exchange of ZeRO-3 over that
            // link would charge Megatron-FSDP's one expert run (ModelZoo Qwen3-235B, pp 1,
            // edp 32 one GPU a node) 32 s of a published 17.6, so how FSDP shards and
            // gathers routed experts is left at this approximation.
            let expert_share = if n > 1 {
                (edp - 1) as f64 / edp as f64 / ((n - 1) as f64 / n as f64)
            } else {
                0.0
            };
            let params = dense + (experts as f64 * expert_share).round() as u64;
            let per = |kind, bytes: u64| {
                pieces as f64 * profile.collective_time_s(kind, bytes.div_ceil(pieces), n, link)
            };
            let w = memory::WEIGHT_BYTES_PER_PARAM;
            if stack.pipelined_fsdp(c.zero_stage, c.degrees.pp) {
                // once per step: the first micro-batch's forward gathers each layer (prefetched
                // as it runs), the last backward's post-backward reduce-scatters them all with
                // no compute left on the rank to hide behind
                let forward_s: f64 = stages.iter().map(|s| s.forward_s()).sum();
                let gather = per(AllGather, params * w);
                let gather = if c.settings.runtime.overlap_param_gather {
                    eff.exposed_comm_s(gather, forward_s)
                } else {
                    gather
                };
                return gather + per(ReduceScatter, params * grad_bytes_per_param);
            }
            // ZeRO 3 gathers for the forward and again for the backward; FSDP at ZeRO 2 keeps
            // the forward's gather until the backward has run
            let gathers = if c.zero_stage >= 3 { 2.0 } else { 1.0 };
            let comm = gathers * per(AllGather, params * w)
                + per(ReduceScatter, params * grad_bytes_per_param);
            let compute: f64 = stages.iter().map(|s| s.forward_s() + s.backward_s()).sum();
            m as f64 * eff.exposed_comm_s(comm, compute)
        }
    }
}

/// The link of a routed expert's expert-data-parallel group: `edp = tp · cp · dp / (ep · etp)`
/// GPUs, `ep · etp` apart, since Megatron-Core orders the expert ranks of a pipeline rank
/// etp fastest, then ep, then edp (`parallel_state.py`, the expert `RankGenerator` of order
/// `tp-ep-dp-pp` with `tp = etp`; Liu et al. 2025, arXiv 2504.14960, §3). A ring collective
/// over it runs on one rail per member that shares a node ([`crate::config::Runtime::ring_link`]):
/// with ep 8 on 8-GPU nodes every member sits on its own node, and the experts' gradients
/// cross one NIC per GPU where the data-parallel group's (8 members a node) use eight.
pub fn expert_dp_link(profile: &AnalyticProfile, c: &ParallelConfig) -> autopp_hardware::Link {
    let edp = c.experts.expert_dp(&c.degrees);
    let stride = c.experts.ep.max(1) * c.experts.etp.max(1);
    c.settings.runtime.ring_link(&profile.cluster, edp, stride)
}
