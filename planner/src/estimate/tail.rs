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
/// Gradients travel in fp32 with main gradients and in 16 bits otherwise; weights in 16 bits.
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
    // the routed experts reduce over the expert-data-parallel group instead, at least as fast
    // (a subset of the same GPUs): their time is taken as that of the same bytes over `n`
    // scaled by edp's share ((edp−1)/edp over (n−1)/n)
    let n_all = c.degrees.data_parallel_gpus().max(1);
    let edp = c.experts.expert_dp(&c.degrees);
    let expert_share = if n_all > 1 {
        (edp - 1) as f64 / edp as f64 / ((n_all - 1) as f64 / n_all as f64)
    } else {
        0.0
    };
    let params = all - experts + (experts as f64 * expert_share).round() as u64;
    let grad_bytes = params
        * if c.settings.runtime.fp32_main_grads {
            memory::GRAD_BYTES_PER_PARAM
        } else {
            memory::HALF_GRAD_BYTES_PER_PARAM
        };
    let weight_bytes = params * memory::WEIGHT_BYTES_PER_PARAM;
    let n = c.degrees.data_parallel_gpus();
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
            let per = |kind, bytes: u64| {
                pieces as f64 * profile.collective_time_s(kind, bytes.div_ceil(pieces), n, link)
            };
            let comm = 2.0 * per(AllGather, weight_bytes) + per(ReduceScatter, grad_bytes);
            let compute: f64 = stages.iter().map(|s| s.forward_s() + s.backward_s()).sum();
            m as f64 * eff.exposed_comm_s(comm, compute)
        }
    }
}
