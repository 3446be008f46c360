//! The analytic profile: seconds for a layer's ops from a roofline with shape-dependent
//! efficiency, and seconds for collectives and point-to-point sends from the ring model.
//!
//! Sources: the roofline `max(flops / (peak · eff), bytes / (hbm_bw · eff_mem))` and the ring
//! collective costs (`2·(n−1)/n · S / bw + 2·(n−1)·α` for all-reduce, half of that for
//! all-gather and reduce-scatter) as collected in autopp's COST_MODEL.md (Thakur et al. 2005
//! for the ring; NCCL's bus-bandwidth convention).

use autopp_models::{AttentionKernel, Collective, CollectiveKind, LayerCost, Op};
use serde::Serialize;

use crate::cluster::{Cluster, Link};
use crate::hardware::Precision;
use crate::measured::MeasuredProfile;
use crate::HardwareError;

mod efficiency;

pub use efficiency::{
    Efficiency, ATTENTION_FA2_ON_HOPPER, FP8_GEMM, FP8_ROWWISE_HALF_DIM, GROUPED_GEMM_HALF_DIM,
    GROUPED_GEMM_HALF_ROWS, GROUPED_GEMM_HOST_S, HOST_BLOCK_S, MOE_LAYER_OVERHEAD_S,
};

/// Times of one layer's passes on one GPU for one micro-batch, in seconds, compute only
/// (tensor-parallel collectives are timed separately by the planner).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize)]
pub struct LayerTimes {
    /// Forward.
    pub forward_s: f64,
    /// Backward with respect to the input (`I`).
    pub backward_input_s: f64,
    /// Backward with respect to the weights (`W`).
    pub backward_weight_s: f64,
    /// Extra forward work under selective recompute.
    pub selective_recompute_s: f64,
    /// Host seconds to issue the grouped GEMMs of the forward, input-gradient and
    /// weight-gradient passes ([`AnalyticProfile::expert_host_s`]), taken when the layer is
    /// timed so that they travel with its times (the planner's layer tables drop the
    /// operation lists once timed).
    pub expert_host_s: [f64; 3],
    /// Seconds of the attention core (the fused kernel, or the score and value GEMMs) in the
    /// forward and in the input-gradient pass, within `forward_s` and `backward_input_s`: what
    /// a context-parallel ring exchange of K and V runs beside. Carried like `expert_host_s`.
    pub attention_s: [f64; 2],
}

/// Per-layer and communication times computed from hardware figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AnalyticProfile {
    /// The cluster being modelled.
    pub cluster: Cluster,
    /// Math precision.
    pub precision: Precision,
    /// Dense tensor-core peak of the bf16/fp16 math (everything but FP8 GEMMs), FLOP/s.
    pub peak_flops: f64,
    /// Dense FP8 tensor-core peak that linear layers' GEMMs run at under an FP8 recipe
    /// (`peak_flops` otherwise), FLOP/s.
    pub linear_peak_flops: f64,
    /// Efficiency factors.
    pub efficiency: Efficiency,
    /// Measured per-layer times that replace the roofline's for the layers they cover
    /// (`estimate --profile`, `plan --profile`); `None`: all analytic.
    #[serde(skip)]
    pub measured: Option<std::sync::Arc<MeasuredProfile>>,
    /// Where `efficiency` comes from when it is not the shipped fit, e.g. `calibrated on 3
    /// runs from my-cluster.json` (`--calibration`); `None`: the shipped knobs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<String>,
}

impl AnalyticProfile {
    /// A profile of `cluster` in `precision` with the default efficiency factors.
    pub fn new(cluster: Cluster, precision: Precision) -> Result<Self, HardwareError> {
        let peak_flops = cluster.gpu.peak_flops(precision.high())?;
        let linear_peak_flops = cluster.gpu.peak_flops(precision)?;
        Ok(AnalyticProfile {
            cluster,
            precision,
            peak_flops,
            linear_peak_flops,
            efficiency: Efficiency::default(),
            measured: None,
            calibration: None,
        })
    }

    /// This profile with `measured`'s per-layer times in place of the roofline's: each pass
    /// of a layer the file covers takes its measured time, scaled by the pass's work at the
    /// layer's shape over the work at measurement; selective recompute scales with the
    /// forward. Collectives and sends stay analytic.
    pub fn with_measured(mut self, measured: MeasuredProfile) -> Self {
        self.measured = Some(std::sync::Arc::new(measured));
        self
    }

    /// Seconds for one op on one GPU.
    pub fn op_time_s(&self, op: &Op) -> f64 {
        let eff = &self.efficiency;
        let e = self.precision.bytes() as f64;
        let hbm = self.cluster.gpu.hbm_bw_bytes_per_s * eff.hbm;
        let peak = self.peak_flops * self.generation_factor();
        match *op {
            Op::Gemm {
                m,
                n,
                k,
                count,
                linear,
            } => {
                let flops = op.flops();
                let grouped = if linear && count > 1 {
                    let x = n.min(k) as f64;
                    let rows = m as f64;
                    x / (x + eff.grouped_gemm_half_dim) * rows / (rows + eff.grouped_gemm_half_rows)
                } else {
                    1.0
                };
                if linear && self.precision.is_fp8() {
                    // FP8 operands (1 byte), a bf16 output; the cast of the [m × k] operand
                    // to FP8 is a separate memory-bound kernel (weights: cached or cast
                    // alongside, a k·n that is small next to m·k over a micro-batch's tokens)
                    let peak8 = self.linear_peak_flops * self.generation_factor();
                    let rowwise = self.rowwise_factor(n, k);
                    let compute =
                        flops / (peak8 * eff.gemm(m, n, k) * eff.fp8_gemm * grouped * rowwise);
                    let bytes = ((m * k + k * n) as f64 + e * (m * n) as f64) * count as f64;
                    let cast = (self.precision.cast_bytes_per_element()
                        * self.precision.cast_elements(m, n, k)
                        * count) as f64;
                    return compute.max(bytes / hbm) + cast / hbm + 2.0 * eff.kernel_overhead_s;
                }
                let compute = flops / (peak * eff.gemm(m, n, k) * grouped);
                let bytes = e * (m * k + k * n + m * n) as f64 * count as f64;
                compute.max(bytes / hbm) + eff.kernel_overhead_s
            }
            Op::Attention {
                batch_heads,
                seq_q,
                seq_k,
                head_dim,
                causal,
                backward,
                fused,
                kernel,
            } => {
                if fused {
                    // A causal kernel skips the masked blocks: about half the work.
                    let work = if causal { 0.5 } else { 1.0 } * op.flops();
                    let sat = seq_q as f64 / (seq_q as f64 + 2.0 * eff.gemm_half_dim);
                    let rate =
                        peak * eff.attention_fused * sat * self.attention_kernel_factor(kernel);
                    work / rate + eff.kernel_overhead_s
                } else {
                    // Two batched GEMMs (Q·Kᵀ and P·V); the backward runs two of each.
                    let scores = Op::Gemm {
                        m: seq_q,
                        n: seq_k,
                        k: head_dim,
                        count: batch_heads,
                        linear: false,
                    };
                    let values = Op::Gemm {
                        m: seq_q,
                        n: head_dim,
                        k: seq_k,
                        count: batch_heads,
                        linear: false,
                    };
                    let once = self.op_time_s(&scores) + self.op_time_s(&values);
                    if backward {
                        2.0 * once
                    } else {
                        once
                    }
                }
            }
            Op::Elementwise { bytes } => bytes as f64 / hbm + eff.kernel_overhead_s,
        }
    }

    /// [`Efficiency::attention_fa2_on_hopper`] for a FlashAttention-2-class kernel on a GPU
    /// with FP8 tensor cores (Hopper and later), else 1.
    pub fn attention_kernel_factor(&self, kernel: AttentionKernel) -> f64 {
        match kernel {
            AttentionKernel::Fa2 if self.cluster.gpu.peak_fp8_flops > 0.0 => {
                self.efficiency.attention_fa2_on_hopper
            }
            _ => 1.0,
        }
    }

    /// [`Efficiency::fp8_rowwise_half_dim`]'s factor on an `[m × k]·[k × n]` linear GEMM
    /// under [`Precision::Fp8Rowwise`], `x / (x + half)` with `x = min(n, k)`; 1 under every
    /// other precision.
    pub fn rowwise_factor(&self, n: u64, k: u64) -> f64 {
        if self.precision != Precision::Fp8Rowwise {
            return 1.0;
        }
        let x = n.min(k) as f64;
        x / (x + self.efficiency.fp8_rowwise_half_dim)
    }

    /// [`Efficiency::hopper_compute`] on a GPU with FP8 tensor cores, else 1.
    pub fn generation_factor(&self) -> f64 {
        if self.cluster.gpu.peak_fp8_flops > 0.0 {
            self.efficiency.hopper_compute
        } else {
            1.0
        }
    }

    /// Seconds for a list of ops run one after another.
    pub fn ops_time_s(&self, ops: &[Op]) -> f64 {
        ops.iter().map(|op| self.op_time_s(op)).sum()
    }

    /// Compute times of one layer's passes: measured ones when the profile has them for this
    /// layer (see [`AnalyticProfile::with_measured`]), else the roofline's.
    pub fn layer_times(&self, layer: &LayerCost) -> LayerTimes {
        // the host work of a mixture-of-experts layer, once per pass (forward, backward)
        let moe = if layer.expert_params > 0 {
            self.efficiency.moe_layer_overhead_s
        } else {
            0.0
        };
        let analytic = LayerTimes {
            forward_s: self.ops_time_s(&layer.forward_ops) + moe,
            backward_input_s: self.ops_time_s(&layer.backward_input_ops) + moe,
            backward_weight_s: self.ops_time_s(&layer.backward_weight_ops),
            selective_recompute_s: self.ops_time_s(&layer.selective_recompute_ops),
            expert_host_s: self.expert_host_s(layer),
            attention_s: [
                self.attention_time_s(&layer.forward_ops),
                self.attention_time_s(&layer.backward_input_ops),
            ],
        };
        match self.measured.as_ref().and_then(|m| m.times_of(layer)) {
            Some([f, i, w]) => LayerTimes {
                forward_s: f,
                backward_input_s: i,
                backward_weight_s: w,
                selective_recompute_s: share(analytic.selective_recompute_s, analytic.forward_s, f),
                // a measurement includes its host time
                expert_host_s: [0.0; 3],
                // the attention core's share of each measured pass, as the roofline has it
                attention_s: [
                    share(analytic.attention_s[0], analytic.forward_s, f),
                    share(analytic.attention_s[1], analytic.backward_input_s, i),
                ],
            },
            None => analytic,
        }
    }

    /// Seconds of the attention-core ops among `ops`.
    fn attention_time_s(&self, ops: &[Op]) -> f64 {
        ops.iter()
            .filter(|op| matches!(op, Op::Attention { .. }))
            .map(|op| self.op_time_s(op))
            .sum()
    }

    /// Host seconds to issue the grouped GEMMs of each of `layer`'s passes, `(F, I, W)`:
    /// [`Efficiency::grouped_gemm_host_s`] times the expert GEMMs of the pass (the `count` of
    /// every linear GEMM run more than once). Zero for a layer without grouped GEMMs and for a
    /// layer whose times are measured (a measurement includes its host time).
    pub fn expert_host_s(&self, layer: &LayerCost) -> [f64; 3] {
        if self
            .measured
            .as_ref()
            .and_then(|m| m.times_of(layer))
            .is_some()
        {
            return [0.0; 3];
        }
        let per_gemm = self.efficiency.grouped_gemm_host_s;
        let host = |ops: &[Op]| -> f64 {
            let gemms: u64 = ops
                .iter()
                .map(|op| match *op {
                    Op::Gemm {
                        count,
                        linear: true,
                        ..
                    } if count > 1 => count,
                    _ => 0,
                })
                .sum();
            gemms as f64 * per_gemm
        };
        [
            host(&layer.forward_ops),
            host(&layer.backward_input_ops),
            host(&layer.backward_weight_ops),
        ]
    }

    /// Effective bandwidth of a link for collectives, bytes/s.
    fn effective_bw(&self, link: &Link) -> f64 {
        let eff = if link.inter_node {
            self.efficiency.comm_inter
        } else {
            self.efficiency.comm_intra
        };
        link.bw_bytes_per_s * eff
    }

    /// Seconds for a ring collective of a `bytes`-sized (whole) tensor over `n` GPUs:
    /// all-reduce `2·(n−1)/n · S / bw + 2·(n−1)·α`; all-gather and reduce-scatter
    /// `(n−1)/n · S / bw + (n−1)·α`.
    pub fn collective_time_s(&self, kind: CollectiveKind, bytes: u64, n: u64, link: &Link) -> f64 {
        if n <= 1 || bytes == 0 {
            return 0.0;
        }
        let steps = match kind {
            CollectiveKind::AllReduce => 2.0,
            CollectiveKind::AllGather | CollectiveKind::ReduceScatter => 1.0,
        };
        let frac = (n - 1) as f64 / n as f64;
        steps * (frac * bytes as f64 / self.effective_bw(link) + (n - 1) as f64 * link.latency_s)
    }

    /// Seconds for an all-to-all in which each of `n` GPUs sends `bytes` spread evenly over
    /// the group (`1/n` to each member, its own share staying put), the group's members laid
    /// out contiguously. Inside one node: `(n−1)/n · S / bw`. A group spanning nodes: each GPU
    /// sends the share of the `n − d` members on other nodes, `(n−d)/n · S`, through its NIC
    /// while the `(d−1)/n · S` for the `d − 1` others of its node cross NVLink at the same time
    /// (`d` = the group's members per node, the cluster's GPUs per node or `n`). The sends to
    /// every peer are posted at once (NCCL's all-to-all is one group of send/receive pairs), so
    /// the latency is one `α` of the slower link, not one per peer.
    pub fn all_to_all_time_s(&self, bytes: u64, n: u64, link: &Link) -> f64 {
        self.all_to_all_dedup_time_s(bytes, n, link, 1.0)
    }

    /// [`Self::all_to_all_time_s`] for a dispatcher that sends each token once per node
    /// rather than once per expert (DeepEP's internode kernels, `deepseek-ai/DeepEP` README;
    /// Megatron-Core's HybridEP): of the cross-node volume `(n−d)/n · S` only `across_share`
    /// goes through the NIC, and the tokens that arrive are forwarded inside the destination
    /// node over NVLink, so NVLink carries every pair not kept on the sender, `(n−1)/n · S`.
    /// `across_share` 1.0 with the NVLink term `(d−1)/n · S` is the plain all-to-all.
    pub fn all_to_all_dedup_time_s(
        &self,
        bytes: u64,
        n: u64,
        link: &Link,
        across_share: f64,
    ) -> f64 {
        if n <= 1 || bytes == 0 {
            return 0.0;
        }
        let s = bytes as f64 / n as f64;
        if !link.inter_node {
            return (n - 1) as f64 * s / self.effective_bw(link) + link.latency_s;
        }
        let d = self.cluster.gpus_per_node.clamp(1, n);
        let nvlink = self.cluster.link_between(0, 0);
        let share = across_share.clamp(0.0, 1.0);
        let across = (n - d) as f64 * s * share / self.effective_bw(link);
        let forwarded = if share < 1.0 { n - 1 } else { d - 1 };
        let within = forwarded as f64 * s / self.effective_bw(&nvlink);
        across.max(within) + link.latency_s
    }

    /// Seconds for a list of tensor-parallel collectives over `n` GPUs.
    pub fn collectives_time_s(&self, list: &[Collective], n: u64, link: &Link) -> f64 {
        list.iter()
            .map(|c| self.collective_time_s(c.kind, c.bytes, n, link))
            .sum()
    }

    /// Seconds to send `bytes` point to point over `link`.
    pub fn p2p_time_s(&self, bytes: u64, link: &Link) -> f64 {
        if bytes == 0 {
            return 0.0;
        }
        bytes as f64 / self.effective_bw(link) + link.latency_s
    }

    /// Seconds for a memory-bound pass over `bytes` of HBM traffic (e.g. the optimizer step).
    pub fn memory_bound_time_s(&self, bytes: f64) -> f64 {
        bytes / (self.cluster.gpu.hbm_bw_bytes_per_s * self.efficiency.hbm)
    }
}

#[cfg(test)]
mod tests;

/// `part` of an analytic `whole`, scaled to a measured `measured` (0 when `whole` is 0).
fn share(part: f64, whole: f64, measured: f64) -> f64 {
    if whole > 0.0 {
        part * measured / whole
    } else {
        0.0
    }
}
