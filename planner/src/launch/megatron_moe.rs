//! Megatron-LM's flags for mixtures of experts, latent attention, MTP and Qwen3-style
//! attention.
//!
//! Names are the fields of Megatron-Core 0.16.1's `TransformerConfig` / `MLATransformerConfig`
//! and `ModelParallelConfig` as `megatron/training/arguments.py` generates flags from them
//! (`--` + the field name with `_` → `-`), except `--num-experts` (the field
//! `num_moe_experts`, a manual flag) and `--moe-layer-freq`, which Megatron-LM parses as a
//! Python list expression (`([0]*3+[1]*58)`: 0 a dense layer, 1 an MoE one). Rules are
//! `TransformerConfig.__post_init__`'s and `pipeline_parallel_layer_layout.py`'s
//! (`../shared/reference/megatron-lm.md`).

use super::view::PlanView;
use super::{flag, Refusal};
use crate::framework::Framework;

/// Adds the flags of `view`'s model beyond a dense GPT's: Qwen3's head size and qk-norm,
/// DeepSeek's latent attention, the experts and their degrees, the MTP layers, and the expert
/// all-to-all overlap when the plan's runtime modelled it.
pub(super) fn moe_args(view: &PlanView, args: &mut Vec<String>) {
    let m = &view.model;
    if let Some(d) = m.head_dim {
        flag(args, "--kv-channels", d);
    }
    if m.qk_norm {
        args.push("--qk-layernorm".into());
    }
    if let Some(mla) = &m.mla {
        args.push("--multi-latent-attention".into());
        if let Some(q) = mla.q_lora_rank {
            flag(args, "--q-lora-rank", q);
        }
        flag(args, "--kv-lora-rank", mla.kv_lora_rank);
        flag(args, "--qk-head-dim", mla.qk_nope_head_dim);
        flag(args, "--qk-pos-emb-head-dim", mla.qk_rope_head_dim);
        flag(args, "--v-head-dim", mla.v_head_dim);
    }
    if let Some(moe) = &m.moe {
        flag(args, "--num-experts", moe.num_experts);
        flag(args, "--moe-router-topk", moe.num_experts_per_tok);
        flag(args, "--moe-ffn-hidden-size", moe.moe_ffn_hidden_size);
        if moe.shared_ffn() > 0 {
            flag(
                args,
                "--moe-shared-expert-intermediate-size",
                moe.shared_ffn(),
            );
        }
        if moe.first_k_dense_layers > 0 {
            let dense = moe.first_k_dense_layers.min(m.num_layers);
            let freq = format!("([0]*{dense}+[1]*{})", m.num_layers - dense);
            flag(args, "--moe-layer-freq", freq);
        }
        flag(args, "--expert-model-parallel-size", view.ep);
        flag(args, "--expert-tensor-parallel-size", view.etp);
        args.push("--moe-grouped-gemm".into());
        flag(args, "--moe-token-dispatcher-type", "alltoall");
        if view.ep_hidden_share > 0.0 {
            args.push("--overlap-moe-expert-parallel-comm".into());
        }
    }
    if m.mtp_num_layers > 0 {
        flag(args, "--mtp-num-layers", m.mtp_num_layers);
    }
}

/// Refuses what Megatron-Core refuses of an expert or MTP plan: MTP layers split over stages
/// or off a rank's last virtual stage (`validate_layer_layout`), and `ep · etp` not dividing
/// the GPUs of a pipeline rank (`tp · cp · dp`, parallel folding).
pub(super) fn check(view: &PlanView) -> Result<(), Refusal> {
    let fw = Framework::Megatron;
    let mut ranges = Vec::with_capacity(view.stages.len());
    let mut next = 0usize;
    for s in &view.stages {
        let n = (s.layers + s.mtp + u64::from(s.has_embedding) + u64::from(s.has_head)) as usize;
        ranges.push([next, next + n - 1]);
        next += n;
    }
    let mtp = view.model.mtp_num_layers as usize;
    if let Some(why) = crate::layout::mtp_placement_error(&ranges, mtp, view.pp as usize) {
        return Err(Refusal::Model(fw, format!("cannot run this split: {why}")));
    }
    let folded = view.tp * view.cp * view.dp;
    let experts = view.ep.saturating_mul(view.etp);
    if experts == 0 || !folded.is_multiple_of(experts) {
        return Err(Refusal::Model(
            fw,
            format!(
                "has ep · etp = {experts}, which does not divide tp · cp · dp = {folded}: Megatron-Core folds the experts onto those GPUs"
            ),
        ));
    }
    Ok(())
}
