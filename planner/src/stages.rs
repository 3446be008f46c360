//! Per-stage costs: the times of one stage's F, B, I and W for one micro-batch and the bytes it
//! holds, summed from its layers' costs and the profile.

use autopp_hardware::{AnalyticProfile, LayerTimes, Link};
use autopp_models::{Collective, CollectiveKind, LayerCost, LayerKind, Recompute};
use serde::Serialize;

mod torch;

pub use torch::{
    dtensor_backward_collectives, dtensor_forward_collectives, dtensor_gathered_input_bytes,
    layout_copies_s, op_sac_bytes, op_sac_saved_widths, torch_loss_bytes, unfused_loss_bytes,
    TorchLoss,
};

/// What one stage costs for one micro-batch on one GPU of its rank.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct StageCost {
    /// Inclusive `[first, last]` layer indices.
    pub layers: [usize; 2],
    /// Pure compute of the forward, seconds.
    pub forward_compute_s: f64,
    /// Tensor- (and context-) parallel communication in the forward, seconds.
    pub forward_comm_s: f64,
    /// Pure compute of the backward-input part, seconds (recompute excluded).
    pub backward_input_compute_s: f64,
    /// Pure compute of the backward-weight part, seconds.
    pub backward_weight_compute_s: f64,
    /// Tensor- (and context-) parallel communication in the backward, seconds.
    pub backward_comm_s: f64,
    /// Of the communication above and in `recompute_comm_s`, the expert-parallel all-to-alls
    /// (dispatch and combine, forward, backward and recomputed forwards), seconds.
    pub ep_comm_s: f64,
    /// The expert-parallel all-to-all time run beside another micro-batch's compute and so not
    /// in any of the times above (Megatron-Core's `--overlap-moe-expert-parallel-comm`), seconds.
    pub ep_comm_hidden_s: f64,
    /// Recomputation done before the backward (compute and its communication), seconds.
    pub recompute_s: f64,
    /// The communication part of `recompute_s` (collectives of recomputed forwards), seconds.
    pub recompute_comm_s: f64,
    /// Activation bytes held from F to B per micro-batch.
    pub activation_bytes: u64,
    /// Bytes still held from I to W when the backward is split.
    pub weight_grad_bytes: u64,
    /// The largest transient working set of the backward (recomputed activations and gradient
    /// buffers), bytes.
    pub transient_bytes: u64,
    /// Parameters owned by the stage on one GPU.
    pub params: u64,
    /// Parameters used but owned by another stage (tied LM head), on one GPU.
    pub tied_params: u64,
    /// Of `params`, those of routed experts (sharded over the expert-data-parallel group).
    pub expert_params: u64,
    /// Of `params`, those of transformer blocks on one GPU: the linear layers FP8 recipes
    /// keep FP8 copies of (the blocks' norms, a few thousand parameters, counted too).
    pub block_params: u64,
    /// Largest single layer's parameters on one GPU (ZeRO-3 gathers one layer at a time).
    pub max_layer_params: u64,
    /// Largest single weight tensor's parameters on one GPU, the tied LM-head copy included
    /// ([`autopp_models::LayerCost::largest_weight_params`]).
    pub largest_weight_params: u64,
    /// Bytes sent to the next stage per micro-batch.
    pub output_bytes: u64,
    /// Transformer layers in the stage.
    pub num_transformer_layers: u64,
    /// The stage holds the embedding.
    pub has_embedding: bool,
    /// The stage holds the head.
    pub has_head: bool,
}

impl StageCost {
    /// Forward time including communication, seconds.
    pub fn forward_s(&self) -> f64 {
        self.forward_compute_s + self.forward_comm_s
    }
    /// Backward-input time (with recomputation and communication), seconds.
    pub fn backward_input_s(&self) -> f64 {
        self.backward_input_compute_s + self.backward_comm_s + self.recompute_s
    }
    /// Backward-weight time, seconds.
    pub fn backward_weight_s(&self) -> f64 {
        self.backward_weight_compute_s
    }
    /// Full backward time (B = I + W), seconds.
    pub fn backward_s(&self) -> f64 {
        self.backward_input_s() + self.backward_weight_s()
    }
    /// Communication inside F and B (tensor/context parallel, including recomputed forwards),
    /// seconds.
    pub fn comm_s(&self) -> f64 {
        self.forward_comm_s + self.backward_comm_s + self.recompute_comm_s
    }
}

/// Inputs that shape the per-stage costs besides the layers.
#[derive(Debug, Clone, Copy)]
pub struct StageContext<'a> {
    /// The profile that times ops and collectives.
    pub profile: &'a AnalyticProfile,
    /// Tensor-parallel group size.
    pub tp: u64,
    /// The tensor-parallel group's link.
    pub tp_link: Link,
    /// Recompute mode of transformer layers.
    pub recompute: Recompute,
    /// Context-parallel group size and its link, with the bytes of K and V exchanged per
    /// transformer layer per micro-batch (0 without context parallelism).
    pub cp: u64,
    /// The context-parallel group's link.
    pub cp_link: Link,
    /// Bytes of K and V each GPU contributes per transformer layer per micro-batch.
    pub cp_kv_bytes: u64,
    /// Tensor- and context-parallel collectives overlap the layer's GEMMs in the forward and
    /// the whole backward ([`crate::config::Runtime::tp_comm_overlap`]).
    pub tp_comm_overlap: bool,
    /// Expert-parallel group size (1: no all-to-all).
    pub ep: u64,
    /// The expert-parallel group's link.
    pub ep_link: Link,
    /// The share of each all-to-all run beside another micro-batch's compute
    /// ([`crate::experts::a2a_hidden_share`]; 0: all exposed).
    pub ep_hidden_share: f64,
    /// The share of the all-to-alls' cross-node volume a node-deduplicating dispatcher still
    /// sends ([`crate::experts::node_dedup_share`]; 1.0: every (token, expert) pair).
    pub ep_across_share: f64,
    /// Under selective recompute, the share of a block's forward linear-GEMM time re-run in
    /// the backward in place of the attention core (torchtitan's per-op checkpointing,
    /// [`crate::runtime::every_other_matmul_share`]); 0: Megatron's attention-core recompute.
    pub selective_linear_share: f64,
    /// The tensor-parallel layers are DTensor's
    /// ([`crate::runtime::TpCollectives::Dtensor`]): backward collectives exposed (unless
    /// `tp_comm_overlap`), a copy of the whole tensor beside each sequence-parallel
    /// collective ([`layout_copies_s`]), and the all-gathers run again under op-level
    /// selective recompute.
    pub dtensor_tp: bool,
    /// The stack is torchtitan: selective recompute is its op-level selective activation
    /// checkpointing ([`op_sac_bytes`]) rather than Megatron's (attention core only), and its
    /// loss is PyTorch's unfused cross-entropy ([`unfused_loss_bytes`]; loss-parallel with
    /// tp > 1, [`TorchLoss`]).
    pub torch_native: bool,
    /// torchtitan's blocks run under `torch.compile` ([`crate::config::Runtime::torch_compiled`]):
    /// the op-level checkpoint keeps only the saved outputs its backward reads
    /// ([`op_sac_bytes`]).
    pub torch_compiled: bool,
    /// torchtitan's blocks project queries, keys and values in one `wqkv` GEMM
    /// ([`crate::runtime::SelectiveRecompute::EveryOtherMatmulFusedQkv`]): the op-level
    /// checkpoint saves other matmuls' outputs ([`op_sac_bytes`]).
    pub fused_qkv: bool,
    /// torchtitan's loss runs under `torch.compile` too ([`crate::config::Runtime::compiled_loss`],
    /// [`torch_loss_bytes`]).
    pub compiled_loss: bool,
    /// The stack issues the routed experts' GEMMs from the host one by one
    /// ([`crate::config::Runtime::expert_host_launches`]): each pass of a MoE layer lasts at
    /// least their host time ([`autopp_hardware::LayerTimes::expert_host_s`]).
    pub expert_host_launches: bool,
    /// The GPU waits for the host at every launch
    /// ([`crate::config::Runtime::host_serialized`]): each block's passes add its host time.
    pub host_serialized: bool,
}

impl StageContext<'_> {
    /// [`StageContext::selective_linear_share`] for `runtime` and `model`.
    pub fn selective_share_of(
        runtime: &crate::config::Runtime,
        model: &autopp_models::Model,
    ) -> f64 {
        match runtime.selective {
            crate::runtime::SelectiveRecompute::AttentionCore => 0.0,
            kind @ (crate::runtime::SelectiveRecompute::EveryOtherMatmul
            | crate::runtime::SelectiveRecompute::EveryOtherMatmulFusedQkv) => {
                crate::runtime::every_other_matmul_share(model, kind.fused_qkv())
            }
        }
    }
}

/// Sums the costs of `layers[first..=last]` for each stage range.
pub fn stage_costs(
    layers: &[LayerCost],
    ranges: &[[usize; 2]],
    ctx: &StageContext<'_>,
) -> Vec<StageCost> {
    stage_costs_partial(layers, ranges, ctx, &[])
}

/// [`stage_costs`] with partial recompute: in stage `k`, the first `full_layers[k]`
/// recomputable layers are fully recomputed and the others use `ctx.recompute` (a missing
/// entry counts as 0).
pub fn stage_costs_partial(
    layers: &[LayerCost],
    ranges: &[[usize; 2]],
    ctx: &StageContext<'_>,
    full_layers: &[u64],
) -> Vec<StageCost> {
    let timed: Vec<_> = layers.iter().map(|l| ctx.profile.layer_times(l)).collect();
    stage_costs_timed(layers, &timed, ranges, ctx, full_layers)
}

/// [`stage_costs_partial`] with each layer's compute times given (`timed[i]` of
/// `layers[i]`, from `ctx.profile`): the planner times a layer list once for every recompute
/// mode.
pub fn stage_costs_timed(
    layers: &[LayerCost],
    timed: &[LayerTimes],
    ranges: &[[usize; 2]],
    ctx: &StageContext<'_>,
    full_layers: &[u64],
) -> Vec<StageCost> {
    let profile = ctx.profile;
    let cp_fwd = if ctx.cp > 1 {
        profile.collective_time_s(
            autopp_models::CollectiveKind::AllGather,
            ctx.cp_kv_bytes * ctx.cp,
            ctx.cp,
            &ctx.cp_link,
        )
    } else {
        0.0
    };
    ranges
        .iter()
        .enumerate()
        .map(|(k, &[first, last])| {
            let mut st = StageCost {
                layers: [first, last],
                ..StageCost::default()
            };
            let mut full_left = full_layers.get(k).copied().unwrap_or(0);
            for (layer, times) in layers[first..=last].iter().zip(&timed[first..=last]) {
                let mode = if !layer.recomputable {
                    Recompute::None
                } else if full_left > 0 {
                    full_left -= 1;
                    Recompute::Full
                } else {
                    ctx.recompute
                };
                add_layer(&mut st, layer, times, ctx, cp_fwd, mode);
            }
            st
        })
        .collect()
}

/// Adds one layer to stage `st`: its compute, exposed tensor-parallel, context-parallel
/// (`cp_fwd_s` per block and pass) and expert all-to-all time, its recompute under `mode`, and
/// its bytes.
fn add_layer(
    st: &mut StageCost,
    layer: &LayerCost,
    times: &LayerTimes,
    ctx: &StageContext<'_>,
    cp_fwd_s: f64,
    mode: Recompute,
) {
    let profile = ctx.profile;
    let cp_fwd = cp_fwd_s;
    let is_block = layer.kind == LayerKind::Transformer;
    // dispatch + combine: each GPU sends `ep_a2a_bytes` over the ep group, across nodes
    // through its NIC (once per node with a deduplicating dispatcher) and inside its node
    // over NVLink
    let a2a = if ctx.ep > 1 && layer.ep_a2a_bytes > 0 {
        profile.all_to_all_dedup_time_s(
            layer.ep_a2a_bytes,
            ctx.ep,
            &ctx.ep_link,
            ctx.ep_across_share,
        )
    } else {
        0.0
    };
    // DTensor's collectives come with a copy of the whole tensor each
    let dtensor = ctx.dtensor_tp && ctx.tp > 1;
    let tp_time = |list: &[Collective]| {
        profile.collectives_time_s(list, ctx.tp, &ctx.tp_link)
            + if dtensor {
                layout_copies_s(profile, list)
            } else {
                0.0
            }
    };
    let cp_block = if is_block { cp_fwd } else { 0.0 };
    let forward = dtensor_forward_collectives(layer, profile.precision, dtensor && is_block);
    let tp_f_tp = tp_time(&forward);
    let tp_f = tp_f_tp + cp_block;
    let eff = &profile.efficiency;
    // Ring attention sends the next K/V block while the current one is attended (Transformer
    // Engine's `AttnFuncWithCPAndKVP2P` under Megatron-Core and NeMo, PyTorch's
    // `_templated_ring_attention` under torchtitan): the forward exchange is exposed only
    // beyond the attention core's own time.
    let cp_f = eff.exposed_comm_s(cp_block, times.attention_s[0]);
    let tp_b_tp = tp_time(&dtensor_backward_collectives(
        layer,
        profile.precision,
        dtensor && is_block,
    ));
    let tp_b = tp_b_tp + cp_block;
    st.forward_compute_s += times.forward_s;
    // With the overlap on (userbuffers, async TP), a block's collectives run
    // chunked beside its GEMMs: only what they cannot hide is exposed.
    st.forward_comm_s += if is_block && ctx.tp_comm_overlap {
        eff.exposed_comm_s(tp_f, times.forward_s)
    } else {
        tp_f_tp + cp_f
    };
    // With the overlap, the steady phase's share of each all-to-all runs beside the other
    // micro-batch's pass of the same layer (a forward's beside a backward and the reverse):
    // only what that compute cannot hide is exposed.
    let backward_compute = times.backward_input_s + times.backward_weight_s;
    let s = ctx.ep_hidden_share;
    let a2a_f = (1.0 - s) * a2a + s * eff.exposed_comm_s(a2a, backward_compute);
    let a2a_b = (1.0 - s) * a2a + s * eff.exposed_comm_s(a2a, times.forward_s);
    st.forward_comm_s += a2a_f;
    st.backward_comm_s += a2a_b;
    st.ep_comm_s += a2a_f + a2a_b;
    st.ep_comm_hidden_s += 2.0 * a2a - a2a_f - a2a_b;
    st.backward_input_compute_s += times.backward_input_s;
    st.backward_weight_compute_s += times.backward_weight_s;
    // a pass whose grouped GEMMs take the host longer to issue than the GPU to run (with the
    // pass's exposed all-to-all) waits for the host: the difference counts as compute
    if ctx.expert_host_launches {
        let [host_f, host_i, host_w] = times.expert_host_s;
        st.forward_compute_s += (host_f - times.forward_s - a2a_f).max(0.0);
        st.backward_input_compute_s += (host_i - times.backward_input_s - a2a_b).max(0.0);
        st.backward_weight_compute_s += (host_w - times.backward_weight_s).max(0.0);
    }
    // Megatron launches the input-gradient all-reduce (with sequence parallelism:
    // the all-gather and reduce-scatter) asynchronously and runs the weight-gradient
    // GEMMs meanwhile: only what they cannot hide is exposed.
    // With the overlap on, the whole backward hides them.
    // DTensor's backward collectives wait where they are used, right after they are
    // launched: exposed (the context-parallel exchange keeps its overlap), with async TP
    // too, whose fused all-gather-matmul and matmul-reduce-scatter ops replace the
    // forward's ([`crate::runtime::TpCollectives::Dtensor`]).
    st.backward_comm_s += if is_block && dtensor {
        tp_b_tp + eff.exposed_comm_s(cp_block, times.backward_weight_s)
    } else if is_block && ctx.tp_comm_overlap {
        eff.exposed_comm_s(tp_b, times.backward_input_s + times.backward_weight_s)
    } else if is_block {
        eff.exposed_comm_s(tp_b, times.backward_weight_s)
    } else {
        tp_b
    };
    st.recompute_s += match mode {
        Recompute::None => 0.0,
        Recompute::Selective if ctx.selective_linear_share > 0.0 && is_block => {
            let linear: f64 = layer
                .forward_ops
                .iter()
                .filter(|op| matches!(op, autopp_models::Op::Gemm { linear: true, .. }))
                .map(|op| profile.op_time_s(op))
                .sum();
            let rerun = ctx.selective_linear_share * linear;
            // per-op checkpointing saves no all-gather: DTensor runs them again
            let regather = if dtensor {
                let gathers: Vec<Collective> = forward
                    .iter()
                    .filter(|c| c.kind == CollectiveKind::AllGather)
                    .cloned()
                    .collect();
                tp_time(&gathers)
            } else {
                0.0
            };
            st.recompute_comm_s += regather;
            rerun + regather
        }
        Recompute::Selective => times.selective_recompute_s,
        Recompute::Full => times.forward_s + tp_f_tp + cp_f + a2a,
    };
    if mode == Recompute::Full {
        st.recompute_comm_s += tp_f_tp + cp_f + a2a;
        st.ep_comm_s += a2a;
    }
    // a host-serialized runtime: the GPU idles while the host issues each pass of a block
    // (the backward about twice the forward's kernels, a full recompute the forward's again)
    if ctx.host_serialized && is_block {
        let host = eff.host_block_s;
        st.forward_compute_s += host;
        st.backward_input_compute_s += host;
        st.backward_weight_compute_s += host;
        if mode == Recompute::Full {
            st.recompute_s += host;
        }
    }
    let kept = if mode == Recompute::Full {
        Recompute::Full
    } else {
        ctx.recompute
    };
    // DTensor's linears keep their gathered inputs (a dense block's two, the head's one) where
    // the layer counts Megatron's sequence shards: kept without recompute (always at the
    // head), regrown under full recompute; op-level selective checkpointing saves no
    // all-gather (run again in the backward, above)
    let gathered =
        if dtensor && (layer.kind == LayerKind::Head || (is_block && layer.expert_params == 0)) {
            dtensor_gathered_input_bytes(&forward, &layer.tp_forward, ctx.tp)
        } else {
            0
        };
    let activation_bytes = if kept == Recompute::Selective
        && ctx.torch_native
        && is_block
        && layer.recomputable
        && layer.expert_params == 0
    {
        op_sac_bytes(layer, ctx.torch_compiled, ctx.fused_qkv)
    } else if kept == Recompute::None || layer.kind == LayerKind::Head {
        layer.activation_bytes_for(kept) + gathered
    } else {
        layer.activation_bytes_for(kept)
    };
    let (activation_bytes, loss) = if ctx.torch_native && layer.kind == LayerKind::Head {
        torch_loss_bytes(
            layer,
            activation_bytes,
            TorchLoss::of(ctx.compiled_loss, ctx.tp),
        )
    } else {
        (activation_bytes, 0)
    };
    st.activation_bytes += activation_bytes;
    st.weight_grad_bytes += layer.weight_grad_bytes;
    // Backward working set: under full recompute one layer's whole activations
    // come back; always, the output gradient and the input gradient of one layer.
    let regrown = if mode == Recompute::Full {
        layer.activation_bytes.none + gathered
    } else {
        0
    };
    st.transient_bytes = st
        .transient_bytes
        .max(regrown + 2 * layer.output_bytes * ctx.tp)
        .max(loss);
    st.params += layer.params;
    st.tied_params += layer.tied_params;
    st.expert_params += layer.expert_params;
    if is_block {
        st.block_params += layer.params;
    }
    st.max_layer_params = st.max_layer_params.max(layer.params + layer.tied_params);
    st.largest_weight_params = st.largest_weight_params.max(layer.largest_weight_params);
    st.output_bytes = layer.output_bytes;
    st.num_transformer_layers += u64::from(is_block);
    st.has_embedding |= layer.kind == LayerKind::Embedding;
    st.has_head |= layer.kind == LayerKind::Head;
}

/// One stage made of consecutive parts (e.g. single-layer costs): times and bytes add up, the
/// working set and the largest layer are maxima, the output is the last part's.
pub fn combine(parts: &[StageCost]) -> StageCost {
    let mut st = StageCost::default();
    if let (Some(first), Some(last)) = (parts.first(), parts.last()) {
        st.layers = [first.layers[0], last.layers[1]];
        st.output_bytes = last.output_bytes;
    }
    for p in parts {
        st.forward_compute_s += p.forward_compute_s;
        st.forward_comm_s += p.forward_comm_s;
        st.backward_input_compute_s += p.backward_input_compute_s;
        st.backward_weight_compute_s += p.backward_weight_compute_s;
        st.backward_comm_s += p.backward_comm_s;
        st.ep_comm_s += p.ep_comm_s;
        st.ep_comm_hidden_s += p.ep_comm_hidden_s;
        st.recompute_s += p.recompute_s;
        st.recompute_comm_s += p.recompute_comm_s;
        st.activation_bytes += p.activation_bytes;
        st.weight_grad_bytes += p.weight_grad_bytes;
        st.transient_bytes = st.transient_bytes.max(p.transient_bytes);
        st.params += p.params;
        st.tied_params += p.tied_params;
        st.expert_params += p.expert_params;
        st.block_params += p.block_params;
        st.max_layer_params = st.max_layer_params.max(p.max_layer_params);
        st.largest_weight_params = st.largest_weight_params.max(p.largest_weight_params);
        st.num_transformer_layers += p.num_transformer_layers;
        st.has_embedding |= p.has_embedding;
        st.has_head |= p.has_head;
    }
    st
}
