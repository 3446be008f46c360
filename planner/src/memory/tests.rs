//! Hand-worked memory figures.

use super::*;
use crate::runtime::OptimizerStates;

/// Hand-worked: 1e9 parameters, ZeRO 0 → 18 B/param; ZeRO 1 over d = 8 → 6 + 12/8 = 7.5
/// B/param (Narayanan et al. 2021; Megatron's distributed optimizer).
#[test]
fn bytes_per_param_hand_worked() {
    let p = 1_000_000_000u64;
    let (w, g, o) = model_state_bytes(p, 0, 8);
    assert_eq!(w + g + o, 18 * p);
    let (w, g, o) = model_state_bytes(p, 1, 8);
    assert_eq!(w + g + o, 7_500_000_000);
    let (w, g, o) = model_state_bytes(p, 2, 8);
    assert_eq!(w + g + o, 2 * p + 2 * p);
    let (w, g, o) = model_state_bytes(p, 3, 8);
    assert_eq!(w + g + o, 18 * p / 8);
}

/// Hand-worked: 16-bit gradients (DeepSpeed fp16, Megatron-LM 2021): 2 + 2 + 16 = 20 B/param
/// unsharded; ZeRO-1 over d = 4 → 2 + 2 + 16/4 = 8 B/param.
#[test]
fn half_gradients_hand_worked() {
    let p = 1_000_000_000u64;
    let (w, g, o) = model_state_bytes_for(p, 0, 4, false);
    assert_eq!((w, g, o), (2 * p, 2 * p, 16 * p));
    let (w, g, o) = model_state_bytes_for(p, 1, 4, false);
    assert_eq!(w + g + o, 8 * p);
    assert_eq!(
        model_state_bytes_for(p, 1, 4, true),
        model_state_bytes(p, 1, 4)
    );
}

/// Fragmentation applies to the dynamic memory only; the context is fixed.
#[test]
fn calibrated_terms_hand_worked() {
    let m = RankMemory {
        weights_bytes: 100,
        activations_bytes: 300,
        transient_bytes: 100,
        reserve_bytes: 7,
        fragmentation_bytes: fragmentation_bytes(400, 0.25),
        context_bytes: 50,
        context_fitted: true,
        ..RankMemory::default()
    };
    assert_eq!(m.fragmentation_bytes, 100);
    assert_eq!(m.total_bytes(), 100 + 400 + 7 + 100 + 50);
    assert_eq!(m.total_bytes_with(0.5, 10), 100 + 400 + 7 + 200 + 10);
}

/// Hand-worked: 1e9 parameters under NeMo's bf16 gradients and the distributed optimizer
/// over d = 8: 2 B weights + 2 B gradients + 12/8 B master weights and moments resident;
/// the fp32 gradient copy, 4/8 B, only at the step (Megatron-Core `distrib_optimizer.py`
/// `_copy_model_grads_to_main_grads`, freed by `zero_grad(set_to_none=True)`). With 3 GB of
/// activations the peak is 2 + 2 + 1.5 + 3 = 8.5 GB, not 9 GB; with 0.1 GB the step's
/// 0.5 GB copy is the larger: 5.5 + 0.5 = 6 GB. DeepSpeed's optimizer keeps the copy
/// resident, as fitted: 9 GB.
#[test]
fn fp32_gradient_copy_only_at_the_step_hand_worked() {
    let p = 1_000_000_000u64;
    let stage = StageCost {
        params: p,
        ..StageCost::default()
    };
    let ctx = MemoryContext {
        zero_stage: 1,
        zero_shard: 8,
        expert_zero_shard: 8,
        comm_groups: 0,
        reserve_bytes: 0,
        fp32_main_grads: false,
        fp8_copy_bytes_per_param: 0,
        stack: StackMemory::of(crate::Stack::Nemo),
        optimizer_states: OptimizerStates::Fp32,
        pp: 1,
    };
    let without_terms = |m: RankMemory| m.total_bytes_with(0.0, 0) - m.context_bytes;
    let m = rank_memory(&[&stage], 3 * p, &ctx);
    assert_eq!(
        (
            m.weights_bytes,
            m.grads_bytes,
            m.optimizer_bytes,
            m.step_bytes
        ),
        (2 * p, 2 * p, 1_500_000_000, 500_000_000)
    );
    assert_eq!(without_terms(m), 8_500_000_000);
    let small = rank_memory(&[&stage], p / 10, &ctx);
    assert_eq!(without_terms(small), 6_000_000_000);
    let ds = MemoryContext {
        stack: StackMemory::of(crate::Stack::MegatronDeepspeed),
        ..ctx
    };
    let m = rank_memory(&[&stage], 3 * p, &ds);
    assert_eq!((m.optimizer_bytes, m.step_bytes), (2 * p, 0));
    assert_eq!(m.total_bytes_with(0.0, 0), 9 * p);
    // fp32 main gradients are what the optimizer reads: no copy
    let fp32 = MemoryContext {
        fp32_main_grads: true,
        ..ctx
    };
    assert_eq!(rank_memory(&[&stage], 3 * p, &fp32).step_bytes, 0);
}

/// BigScience's 02-28 stack at ZeRO 1 over 8 replicas: Megatron-DeepSpeed with DeepSpeed's
/// `BF16_Optimizer` (fp32 gradient accumulation), no reserve or communicator buffers.
fn bf16_optimizer_ctx() -> MemoryContext {
    MemoryContext {
        zero_stage: 1,
        zero_shard: 8,
        expert_zero_shard: 8,
        comm_groups: 0,
        reserve_bytes: 0,
        fp32_main_grads: true,
        fp8_copy_bytes_per_param: 0,
        stack: StackMemory::of(crate::Stack::MegatronDeepspeed),
        optimizer_states: OptimizerStates::Fp32,
        pp: 1,
    }
}

/// Hand-worked: DeepSpeed's `BF16_Optimizer` (`deepspeed/runtime/bf16_optimizer.py`:
/// `fp32_groups_gradients_flat` whole on every rank; the pipeline engine's
/// `_exec_backward_pass` keeps the bf16 `param.grad`, `update_hp_grads(clear_lp_grads=False)`).
/// 1e9 parameters at ZeRO 1 over d = 8: 2 B bf16 weights + 2 B bf16 gradients + 4 B fp32
/// gradients + 12/8 B master weights and moments = 9.5 GB. DeepSpeed's fp16 ZeRO-1 optimizer
/// holds 2 + 2 + 16/8 = 6 GB: 3.5 GB = (4 − 4/8) B/param more, BigScience's "additional
/// memory usage is 4bytes x params and it's not sharded" (`chronicles-prequel.md`,
/// "Rebalancing layers"). Megatron-Core's fp32 main gradients keep no bf16 copy (7.5 GB),
/// nor does DeepSpeed at ZeRO 2, whose optimizer is not `BF16_Optimizer`, nor DeepSpeed 0.16,
/// whose `BF16_Optimizer` may free each bf16 gradient in a hook (`immediate_grad_update`).
#[test]
fn bf16_optimizer_keeps_both_gradients_hand_worked() {
    let p = 1_000_000_000u64;
    let stage = StageCost {
        params: p,
        ..StageCost::default()
    };
    let ctx = bf16_optimizer_ctx();
    let states = |m: RankMemory| (m.weights_bytes, m.grads_bytes, m.optimizer_bytes);
    let bf16 = rank_memory(&[&stage], 0, &ctx);
    assert_eq!(states(bf16), (2 * p, 6 * p, 1_500_000_000));
    let fp16 = rank_memory(
        &[&stage],
        0,
        &MemoryContext {
            fp32_main_grads: false,
            ..ctx
        },
    );
    assert_eq!(states(fp16), (2 * p, 2 * p, 2 * p));
    let more = |a: RankMemory, b: RankMemory| {
        let (w, g, o) = states(a);
        let (w2, g2, o2) = states(b);
        (w + g + o) - (w2 + g2 + o2)
    };
    assert_eq!(more(bf16, fp16), 3_500_000_000);
    let core = MemoryContext {
        stack: StackMemory::of(crate::Stack::MegatronCore),
        ..ctx
    };
    assert_eq!(states(rank_memory(&[&stage], 0, &core)).1, 4 * p);
    let zero2 = MemoryContext {
        zero_stage: 2,
        ..ctx
    };
    assert_eq!(states(rank_memory(&[&stage], 0, &zero2)).1, p / 2);
    let ds16 = MemoryContext {
        stack: StackMemory::of(crate::Stack::Deepspeed),
        ..ctx
    };
    assert_eq!(states(rank_memory(&[&stage], 0, &ds16)).1, 4 * p);
}

#[test]
fn tied_head_copy_only_away_from_the_embedding() {
    let emb = StageCost {
        params: 10,
        has_embedding: true,
        ..StageCost::default()
    };
    let head = StageCost {
        params: 5,
        tied_params: 7,
        has_head: true,
        ..StageCost::default()
    };
    assert_eq!(rank_params(&[&emb, &head]), 15);
    assert_eq!(rank_params(&[&head]), 12);
}

/// Routed experts shard their ZeRO states over the expert-data-parallel group. DeepSeek-V3
/// at pp 16, dp 128, ep 64 (arXiv 2412.19437 §3.2): edp = 128 / 64 = 2. One MoE layer on
/// one GPU holds 176,160,768 expert parameters (4 experts of 3·7168·2048) and 232,997,120
/// others (`models/tests/moe_formulas.rs`); under ZeRO-1 the experts keep 2 + 4 + 12/2 =
/// 12 B per parameter and the rest 2 + 4 + 12/128 B.
#[test]
fn expert_states_shard_over_expert_dp_hand_worked() {
    let (experts, rest) = (176_160_768u64, 232_997_120u64);
    let layer = StageCost {
        params: experts + rest,
        expert_params: experts,
        ..StageCost::default()
    };
    let ctx = MemoryContext {
        zero_stage: 1,
        zero_shard: 128,
        expert_zero_shard: 2,
        comm_groups: 0,
        reserve_bytes: 0,
        fp32_main_grads: true,
        fp8_copy_bytes_per_param: 0,
        stack: StackMemory::default(),
        optimizer_states: OptimizerStates::Fp32,
        pp: 1,
    };
    let m = rank_memory(&[&layer], 0, &ctx);
    assert_eq!(m.weights_bytes, 2 * (experts + rest));
    // under FP8 delayed scaling: an FP8 weight and its transpose per block parameter
    let block = StageCost {
        block_params: experts + rest,
        ..layer.clone()
    };
    let fp8 = MemoryContext {
        fp8_copy_bytes_per_param: 2,
        ..ctx
    };
    let m8 = rank_memory(&[&block], 0, &fp8);
    assert_eq!(m8.weights_bytes, 4 * (experts + rest));
    assert_eq!(
        (m8.grads_bytes, m8.optimizer_bytes),
        (m.grads_bytes, m.optimizer_bytes)
    );
    assert_eq!(m.grads_bytes, 4 * (experts + rest));
    assert_eq!(
        m.optimizer_bytes,
        12 * experts / 2 + (12 * rest).div_ceil(128)
    );
    // 2.11 GB of expert states beyond the weights and gradients, per MoE layer
    assert_eq!(12 * experts / 2, 1_056_964_608);
}

/// NeMo 1.x's Apex `DistributedFusedAdam` under bf16 O2 (`megatron_base_model.py`
/// `setup_optimization`): with an fp32 optimizer it stores 16-bit remainders of the master
/// weights (`store_param_remainders=True`), 2 + 4 + 4 = 10 B/param; with `optim.dtype: bf16`
/// no master copy and bf16 moments, 4 B/param; with FP8 parameters (`store_params=True`) a
/// bf16 copy of the weights beside them, 6 B/param. All sharded over the data-parallel group.
/// 1e9 parameters at ZeRO-1 over 8 with bf16 gradients (NeMo's runtime):
/// - fp32 master and moments, the fp32 gradient copy at the step: (12 + 4)/8 = 2 B/param,
///   1.5 of it resident (the 0.5 copy held only at the step);
/// - remainders: 12 − 2 = 10 → 1.25 resident; bf16 states: 4 → 0.5 resident; bf16 states and
///   weights: 6 → 0.75 resident.
#[test]
fn nemo_apex_optimizer_states_hand_worked() {
    let p = 1_000_000_000u64;
    let stage = StageCost {
        params: p,
        ..StageCost::default()
    };
    let ctx = MemoryContext {
        zero_stage: 1,
        zero_shard: 8,
        expert_zero_shard: 8,
        comm_groups: 0,
        reserve_bytes: 0,
        fp32_main_grads: false,
        fp8_copy_bytes_per_param: 0,
        stack: StackMemory::of(crate::Stack::Nemo),
        optimizer_states: OptimizerStates::Fp32,
        pp: 1,
    };
    let optimizer = |states| {
        rank_memory(
            &[&stage],
            0,
            &MemoryContext {
                optimizer_states: states,
                ..ctx
            },
        )
        .optimizer_bytes
    };
    assert_eq!(optimizer(OptimizerStates::Fp32), 1_500_000_000);
    assert_eq!(optimizer(OptimizerStates::Fp32Remainders), 1_250_000_000);
    assert_eq!(optimizer(OptimizerStates::Bf16), 500_000_000);
    assert_eq!(optimizer(OptimizerStates::Bf16StoredParams), 750_000_000);
    // unsharded at ZeRO 0: 10 B and 4 B per parameter, beside the 4 B gradient copy
    let zero0 = MemoryContext {
        zero_stage: 0,
        optimizer_states: OptimizerStates::Fp32Remainders,
        ..ctx
    };
    assert_eq!(rank_memory(&[&stage], 0, &zero0).optimizer_bytes, 10 * p);
    assert_eq!(
        optimizer_states_saving_bytes(p, 1, 8, OptimizerStates::Bf16),
        1_000_000_000
    );
}

/// Hand-worked: `BF16_Optimizer.update_hp_grads` casts each bf16 gradient to fp32 before adding
/// it (`lp.grad.data.to(hp_grad.dtype)`), so the largest tensor's cast is held whole. BigScience's
/// first stage at tp 4 (chronicles-prequel.md, "Rebalancing layers": 250k vocabulary, hidden
/// 14336): the word embedding, 250,880 padded rows (Megatron-DeepSpeed pads to 128 · tp) over 4
/// ranks, is 62,720 × 14,336 = 899,153,920 parameters; its fp32 cast 4 × that = 3,596,615,680 B
/// (3.35 GiB). A transformer stage holds its MLP input projection, 14,336 × 57,344 / 4 =
/// 205,520,896 parameters, 822,083,584 B. The fp16 optimizer and Megatron-Core's fp32 main
/// gradients make no such copy.
#[test]
fn bf16_optimizer_holds_the_largest_gradient_cast_hand_worked() {
    let ctx = bf16_optimizer_ctx();
    let working = 1_000_000u64;
    let first = StageCost {
        params: 899_153_920 + 5 * 616_562_688,
        largest_weight_params: 899_153_920,
        transient_bytes: working,
        ..StageCost::default()
    };
    let middle = StageCost {
        params: 6 * 616_562_688,
        largest_weight_params: 205_520_896,
        transient_bytes: working,
        ..StageCost::default()
    };
    assert_eq!(
        rank_memory(&[&first], 0, &ctx).transient_bytes,
        working + 3_596_615_680
    );
    assert_eq!(
        rank_memory(&[&middle], 0, &ctx).transient_bytes,
        working + 822_083_584
    );
    for other in [
        MemoryContext {
            fp32_main_grads: false,
            ..ctx
        },
        MemoryContext {
            stack: StackMemory::of(crate::Stack::MegatronCore),
            ..ctx
        },
    ] {
        assert_eq!(rank_memory(&[&first], 0, &other).transient_bytes, working);
    }
}
