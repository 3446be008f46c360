//! Issue 15: the memory facts of today's runtimes, each against a hand-worked figure.

use autopp_models::{presets, LayerKind, Model, ShardSpec};
use autopp_planner::memory::{
    fsdp_state_bytes, rank_memory, MemoryContext, StackMemory, CONTEXT_BYTES, CUDA_CONTEXT_BYTES,
};
use autopp_planner::runtime::OptimizerStates;
use autopp_planner::stages::{
    op_sac_bytes, op_sac_saved_widths, torch_loss_bytes, unfused_loss_bytes, StageCost, TorchLoss,
};
use autopp_planner::Stack;

/// Llama 3 8B as torchtitan's benchmarks run it: local batch 2, sequence 8192, no tensor
/// parallelism, flash attention, the vocabulary unpadded.
fn llama3_8b_layers() -> Vec<autopp_models::LayerCost> {
    let model = presets::preset("llama3-8b").unwrap().load().unwrap();
    let model = model.with_seq_length(8192).unwrap();
    let shard = ShardSpec {
        micro_batch_size: 2,
        vocab_pad_multiple: 1,
        flash_attention: true,
        ..ShardSpec::default()
    };
    model.layers(&shard).unwrap()
}

/// torchtitan's op-level SAC keeps, per block and micro-batch (16,384 tokens): the block input
/// `16384·4096·2` = 134,217,728 B; the outputs of the 1st, 3rd, 5th and 7th matmuls of the
/// block (the counter starts afresh at each block), `wq`, `wv`, `w1` and `w2`, at 2 B:
/// `2·16384·(4096 + 1024 + 14336 + 4096)` = 771,751,936 B; the attention output and its fp32
/// log-sum-exp, `2·32 heads · 8192 · (2·128 + 4)` = 136,314,880 B. In all 1,042,284,544 B
/// (0.97 GiB) in eager mode, against Megatron's selective recompute's 139,264 B per token
/// (2.13 GiB). Compiled, `w2`'s output (read by no backward op) is not kept:
/// `1,042,284,544 − 2·16384·4096` = 908,066,816 B.
#[test]
fn op_sac_keeps_every_other_matmul_hand_worked() {
    let layers = llama3_8b_layers();
    let block = layers
        .iter()
        .find(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    assert_eq!(block.activation_bytes.full, 134_217_728);
    assert_eq!(op_sac_bytes(block, false, false), 1_042_284_544);
    assert_eq!(op_sac_bytes(block, true, false), 908_066_816);
    assert!(op_sac_bytes(block, false, false) < block.activation_bytes.selective / 2);
}

/// With one `wqkv` GEMM (torchtitan from April 2026, PR #2878) the block multiplies `wqkv, wo,
/// w1, w3, w2`: the 1st, 3rd and 5th, `wqkv`, `w1` and `w2`, are saved, at 2 B:
/// `2·16384·(6144 + 14336 + 4096)` = 805,306,368 B — the keys' `2·16384·1024` = 33,554,432 B
/// more than the separate projections' 771,751,936 B. With the block input and the attention
/// output as above: 1,075,838,976 B eager, `− 2·16384·4096` = 941,621,248 B compiled.
#[test]
fn op_sac_on_a_fused_wqkv_saves_the_keys_too() {
    let layers = llama3_8b_layers();
    let block = layers
        .iter()
        .find(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    assert_eq!(op_sac_bytes(block, false, true), 1_075_838_976);
    assert_eq!(op_sac_bytes(block, true, true), 941_621_248);
    assert_eq!(
        op_sac_bytes(block, false, true) - op_sac_bytes(block, false, false),
        2 * 16384 * 1024
    );
}

/// The saved matmul widths per token: a gated block (`wq, wk, wv, wo, w1, w3, w2`) keeps `wq`,
/// `wv`, `w1`, `w2` and its backward never reads `w2`'s; a plain MLP's block (`wq, wk, wv, wo,
/// w1, w2`, GPT-3 widths `h = 12288`) keeps `wq`, `wv`, `w1` = `h + h + 4h`, and `w2`, the 6th,
/// is recomputed; a block of another shape is not matched.
#[test]
fn op_sac_saved_widths_hand_worked() {
    let rows = 2048;
    let llama = [
        (rows, 4096 + 2 * 1024, 4096),
        (rows, 4096, 4096),
        (rows, 2 * 14336, 4096),
        (rows, 4096, 14336),
    ];
    assert_eq!(
        op_sac_saved_widths(&llama, false),
        Some((rows, 4096 + 1024 + 14336 + 4096, 4096))
    );
    let h = 12288;
    let gpt = [
        (rows, 3 * h, h),
        (rows, h, h),
        (rows, 4 * h, h),
        (rows, h, 4 * h),
    ];
    assert_eq!(op_sac_saved_widths(&gpt, false), Some((rows, 6 * h, 0)));
    assert_eq!(op_sac_saved_widths(&gpt[..3], false), None);
    // one wqkv GEMM: a gated block saves wqkv, w1, w2 (the 5th, unread); a plain MLP's saves
    // wqkv and w1, its w2 the 4th
    assert_eq!(
        op_sac_saved_widths(&llama, true),
        Some((rows, 4096 + 2 * 1024 + 14336 + 4096, 4096))
    );
    assert_eq!(
        op_sac_saved_widths(&gpt, true),
        Some((rows, 3 * h + 4 * h, 0))
    );
    assert_eq!(op_sac_saved_widths(&gpt[..3], true), None);
    // Llama 3 70B at tp 8: 8 query heads and one key/value head of 128 a GPU, FFN 28672 / 8
    let llama70 = [
        (rows, 1024 + 2 * 128, 8192),
        (rows, 8192, 1024),
        (rows, 2 * 3584, 8192),
        (rows, 8192, 3584),
    ];
    assert_eq!(
        op_sac_saved_widths(&llama70, false),
        Some((rows, 1024 + 128 + 3584 + 8192, 8192))
    );
    // not a dense block: an odd key/value remainder, a 3f MLP input, no rows, mixed rows
    let mut odd = llama;
    odd[0].1 += 1;
    assert_eq!(op_sac_saved_widths(&odd, false), None);
    let mut three = llama;
    three[2].1 = 3 * 14336;
    assert_eq!(op_sac_saved_widths(&three, false), None);
    let mut empty = llama;
    for g in &mut empty {
        g.0 = 0;
    }
    assert_eq!(op_sac_saved_widths(&empty, false), None);
    let mut mixed = llama;
    mixed[3].0 = rows / 2;
    assert_eq!(op_sac_saved_widths(&mixed, false), None);
}

/// Every gated preset block torchtitan runs goes through the matmul count, not the
/// approximation for other shapes: compiling drops `w2`'s output, `2·tokens·h` bytes, at tp 1
/// and tp 8; a plain MLP's block (GPT-3) loses nothing.
#[test]
fn compiling_drops_w2_for_every_gated_preset() {
    for (name, gated) in [
        ("llama3-8b", true),
        ("llama3-70b", true),
        ("qwen3-32b", true),
        ("gpt3-175b", false),
    ] {
        let model = presets::preset(name).unwrap().load().unwrap();
        for tp in [1, 8] {
            let shard = ShardSpec {
                tp,
                sequence_parallel: tp > 1,
                flash_attention: true,
                ..ShardSpec::default()
            };
            let layers = model.layers(&shard).unwrap();
            let block = layers
                .iter()
                .find(|l| l.kind == LayerKind::Transformer)
                .unwrap();
            let Model::Transformer(t) = &model else {
                panic!("{name} is a transformer");
            };
            let tokens = t.seq_length;
            let want = if gated { 2 * tokens * t.hidden_size } else { 0 };
            // `w2` is the 7th matmul of separate projections and the 5th after one wqkv
            for fused in [false, true] {
                let dropped = op_sac_bytes(block, false, fused) - op_sac_bytes(block, true, fused);
                assert_eq!(dropped, want, "{name} at tp {tp}, fused wqkv {fused}");
            }
        }
    }
}

/// PyTorch's unfused cross-entropy holds two more fp32 logit tensors in its backward:
/// `8 · 16384 · 128256` = 16,810,770,432 B (15.7 GiB) on one GPU.
#[test]
fn unfused_loss_hand_worked() {
    let layers = llama3_8b_layers();
    let head = layers.iter().find(|l| l.kind == LayerKind::Head).unwrap();
    assert_eq!(unfused_loss_bytes(head), 16_810_770_432);
}

/// torchtitan's compiled loss (PR #1033): the head keeps its 16-bit logits, `2 · 16384 ·
/// 128256` = 4,202,692,608 B, where it kept fp32 log-probabilities (twice that), and the
/// backward's working set is one 16-bit gradient, the same 4,202,692,608 B, where the eager
/// loss held 16,810,770,432 B: 8 B per logit less in all. Eager, both are as before.
#[test]
fn compiled_loss_hand_worked() {
    let layers = llama3_8b_layers();
    let head = layers.iter().find(|l| l.kind == LayerKind::Head).unwrap();
    let kept = head.activation_bytes.none;
    let logits = 16_384u64 * 128_256;
    assert!(kept >= 4 * logits, "{kept}");
    assert_eq!(
        torch_loss_bytes(head, kept, TorchLoss::Eager),
        (kept, 16_810_770_432)
    );
    let (kept_c, loss_c) = torch_loss_bytes(head, kept, TorchLoss::Compiled);
    assert_eq!(kept - kept_c, 4_202_692_608);
    assert_eq!(loss_c, 4_202_692_608);
    assert_eq!((kept + 16_810_770_432) - (kept_c + loss_c), 8 * logits);
}

/// DTensor's loss parallelism (torchtitan with tp > 1, `torch.distributed.tensor.parallel.loss`):
/// the backward's `(zeros_like(x) + exp(x)) * grad_output` holds three fp32 tensors of the
/// local logits at once, 12 B per logit: `12 · 16384 · 128256` = 25,216,155,648 B on this head,
/// 4 B per logit (8,405,385,216 B) more than ATen's kernels, the kept figures unchanged. A
/// compiled loss is compiled whatever the tensor parallelism.
#[test]
fn loss_parallel_hand_worked() {
    let layers = llama3_8b_layers();
    let head = layers.iter().find(|l| l.kind == LayerKind::Head).unwrap();
    let kept = head.activation_bytes.none;
    let (kept_p, loss_p) = torch_loss_bytes(head, kept, TorchLoss::LossParallel);
    assert_eq!((kept_p, loss_p), (kept, 25_216_155_648));
    assert_eq!(loss_p - unfused_loss_bytes(head), 8_405_385_216);
    assert_eq!(TorchLoss::of(false, 1), TorchLoss::Eager);
    assert_eq!(TorchLoss::of(false, 8), TorchLoss::LossParallel);
    assert_eq!(TorchLoss::of(true, 8), TorchLoss::Compiled);
    assert_eq!(TorchLoss::of(true, 1), TorchLoss::Compiled);
}

/// DTensor keeps the gathered inputs of its sequence-parallel linears. Llama 3 8B at tp 8,
/// 16,384 tokens: each block gathers its attention and MLP inputs, `16384 · 4096 · 2` =
/// 134,217,728 B each in bf16, of which the layer's figures count an eighth (16,777,216 B):
/// 2 · 117,440,512 = 234,881,024 B more. Under float8 tensorwise (`Float8ColwiseParallel`)
/// the gathers are float8, 67,108,864 B each: 2 · 50,331,648 = 100,663,296 B more. The head's
/// gather of the final norm's output stays bf16 (torchtitan leaves the output projection out of
/// float8): 117,440,512 B more. Without sequence parallelism (all-reduces) nothing changes.
#[test]
fn dtensor_gathered_inputs_hand_worked() {
    use autopp_hardware::Precision;
    use autopp_planner::stages::{dtensor_forward_collectives, dtensor_gathered_input_bytes};
    let model = presets::preset("llama3-8b").unwrap().load().unwrap();
    let model = model.with_seq_length(8192).unwrap();
    let layers_at = |sequence_parallel| {
        let shard = ShardSpec {
            micro_batch_size: 2,
            tp: 8,
            sequence_parallel,
            vocab_pad_multiple: 1,
            flash_attention: true,
            ..ShardSpec::default()
        };
        model.layers(&shard).unwrap()
    };
    let layers = layers_at(true);
    let block = layers
        .iter()
        .find(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    let head = layers.iter().find(|l| l.kind == LayerKind::Head).unwrap();
    let extra = |layer: &autopp_models::LayerCost, precision, is_block| {
        let forward = dtensor_forward_collectives(layer, precision, is_block);
        dtensor_gathered_input_bytes(&forward, &layer.tp_forward, 8)
    };
    assert_eq!(extra(block, Precision::Bf16, true), 234_881_024);
    assert_eq!(extra(block, Precision::Fp8Tensorwise, true), 100_663_296);
    assert_eq!(extra(block, Precision::Fp8Rowwise, true), 234_881_024);
    assert_eq!(extra(head, Precision::Fp8Tensorwise, false), 117_440_512);
    let plain = layers_at(false);
    let block = plain
        .iter()
        .find(|l| l.kind == LayerKind::Transformer)
        .unwrap();
    assert_eq!(extra(block, Precision::Bf16, true), 0);
}

/// FSDP at ZeRO-3 over 8 GPUs: 16 B per parameter sharded — 8.03e9 parameters keep
/// `16 · 8.03e9 / 8` = 16.06e9 B; with the two gathered layers of 218,112,000 parameters in
/// 16 bits (872,448,000 B) and one layer's 16-bit gradient and fp32 copy (1,308,672,000 B).
/// DeepSpeed's ZeRO-3 (18 B per parameter) would keep 18.07e9 B.
/// torchtitan at ZeRO 3 over 8 data-parallel GPUs, no pipeline, with FP8 weight copies of
/// 2 B/param requested (torchao casts per use and keeps none), no reserve or NCCL buffers.
fn torchtitan_zero3_over_8() -> MemoryContext {
    MemoryContext {
        zero_stage: 3,
        zero_shard: 8,
        expert_zero_shard: 8,
        comm_groups: 0,
        reserve_bytes: 0,
        fp32_main_grads: true,
        fp8_copy_bytes_per_param: 2,
        stack: StackMemory::of(Stack::Torchtitan),
        optimizer_states: OptimizerStates::Fp32,
        pp: 1,
    }
}

#[test]
fn fsdp_states_hand_worked() {
    let p = 8_030_000_000u64;
    let (w, g, o) = fsdp_state_bytes(p, 8);
    assert_eq!((w, g, o), (4_015_000_000, 4_015_000_000, 8_030_000_000));
    let layer = 218_112_000u64;
    let stage = StageCost {
        params: p / 8,
        max_layer_params: layer,
        ..StageCost::default()
    };
    let ctx = torchtitan_zero3_over_8();
    let m = rank_memory(&[&stage], 0, &ctx);
    let states = fsdp_state_bytes(p / 8, 8);
    assert_eq!(m.weights_bytes, states.0 + 4 * layer);
    assert_eq!(m.grads_bytes, states.1 + 6 * layer);
    assert_eq!(m.optimizer_bytes, states.2);
    // torchao casts FP8 weights per use: no copies; the CUDA context, not DeepSpeed's
    assert_eq!(m.context_bytes, CUDA_CONTEXT_BYTES);
    assert!(!m.context_fitted);
    // the same rank under Megatron-Core: 18 B per parameter at ZeRO-3 and TE's FP8 copies
    let core = MemoryContext {
        stack: StackMemory::of(Stack::MegatronCore),
        ..ctx
    };
    let block = StageCost {
        block_params: p / 8,
        ..stage.clone()
    };
    let mc = rank_memory(&[&block], 0, &core);
    assert_eq!(
        mc.weights_bytes,
        (2 * p / 8).div_ceil(8) + 2 * (p / 8) + 4 * layer
    );
}

/// The fixed overhead: DeepSpeed's stacks keep the BLOOM fit, the others the CUDA context.
#[test]
fn fixed_overhead_per_stack() {
    for s in Stack::ALL {
        let m = StackMemory::of(s);
        let deepspeed = matches!(s, Stack::Deepspeed | Stack::MegatronDeepspeed);
        assert_eq!(m.fitted_context, deepspeed, "{s}");
        let want = if deepspeed {
            CONTEXT_BYTES
        } else {
            CUDA_CONTEXT_BYTES
        };
        assert_eq!(m.context_bytes(), want, "{s}");
        assert_eq!(
            m.fsdp,
            matches!(s, Stack::Torchtitan | Stack::Composer),
            "{s}"
        );
    }
    assert_eq!(CUDA_CONTEXT_BYTES, 1_610_612_736);
}

/// NeMo's FP8 parameters (`fp8_params`): Transformer Engine holds the blocks' linear weights
/// in FP8 with their cached transpose, 2 B per parameter, where bf16 weights with TE's two FP8
/// copies beside them take 4. Llama 3 8B on 8 H100s at tp 8 (pp 1, NeMo, delayed scaling): the
/// rank's weights fall by `2 · block_params`, everything else stays.
#[test]
fn fp8_params_hold_the_weights_in_fp8_only() {
    use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
    use autopp_planner::{evaluate, Degrees, ParallelConfig};
    let model = presets::preset("llama3-8b").unwrap().load().unwrap();
    let cluster = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 8, 8, None).unwrap();
    let profile = AnalyticProfile::new(cluster, Precision::Fp8Delayed).unwrap();
    let degrees = Degrees {
        tp: 8,
        pp: 1,
        dp: 1,
        cp: 1,
        virtual_stages: 1,
    };
    let mut c = ParallelConfig::new(degrees, 1, 8);
    c.sequence_parallel = true;
    c.settings.precision = Precision::Fp8Delayed;
    c.settings.runtime = Stack::Nemo.runtime();
    let copies = evaluate(&model, &profile, &c).unwrap();
    c.settings.runtime.fp8_params = true;
    let fp8 = evaluate(&model, &profile, &c).unwrap();
    let block_params: u64 = fp8.stages.iter().map(|s| s.block_params).sum();
    assert!(block_params > 0);
    let (a, b) = (&copies.memory[0], &fp8.memory[0]);
    assert_eq!(a.weights_bytes - b.weights_bytes, 2 * block_params);
    assert_eq!(a.grads_bytes, b.grads_bytes);
    assert_eq!(a.optimizer_bytes, b.optimizer_bytes);
    assert_eq!(a.activations_bytes, b.activations_bytes);
}

/// Under a pipeline, torchtitan's FSDP2 keeps a rank's stage unsharded for the iteration
/// (PyTorch's pipeline stages turn off resharding and gradient sync until the last backward;
/// FSDP2 accumulates the unsharded gradients in fp32). A rank of 1e9 parameters (largest layer
/// 1e8) sharded over 8: at ZeRO 3 its states are `16/8` B/param = 2e9 B as without a pipeline,
/// plus its weights in 16 bits, 2e9 B, and its gradients in fp32, 4e9 B, in place of the
/// sharded 0.5e9 B, beside one layer's 16-bit gradient, 2e8 B. At pp 1 nothing changes; at
/// ZeRO 2 the gradients are unsharded the same way, routed experts' too; Megatron-Core's stack
/// is untouched.
#[test]
fn torchtitan_pipeline_keeps_the_stage_unsharded_hand_worked() {
    let p = 1_000_000_000u64;
    let layer = 100_000_000u64;
    let stage = StageCost {
        params: p,
        max_layer_params: layer,
        ..StageCost::default()
    };
    let flat = torchtitan_zero3_over_8();
    let piped = MemoryContext { pp: 4, ..flat };
    let m1 = rank_memory(&[&stage], 0, &flat);
    assert_eq!(
        (m1.weights_bytes, m1.grads_bytes, m1.optimizer_bytes),
        (
            500_000_000 + 4 * layer,
            500_000_000 + 6 * layer,
            1_000_000_000
        )
    );
    let m4 = rank_memory(&[&stage], 0, &piped);
    assert_eq!(
        (m4.weights_bytes, m4.grads_bytes, m4.optimizer_bytes),
        (500_000_000 + 2 * p, 4 * p + 2 * layer, 1_000_000_000)
    );
    // ZeRO 2 (torchtitan's `reshard_after_forward=never`): 16-bit weights whole in both
    let zero2 = |pp| {
        rank_memory(
            &[&stage],
            0,
            &MemoryContext {
                zero_stage: 2,
                pp,
                ..flat
            },
        )
    };
    assert_eq!(zero2(1).grads_bytes, 500_000_000);
    assert_eq!(zero2(4).grads_bytes, 4 * p + 2 * layer);
    assert_eq!(zero2(4).weights_bytes, zero2(1).weights_bytes);
    // a stack without the fact, and ZeRO 1, keep their sharded gradients under a pipeline
    let core = MemoryContext {
        stack: StackMemory::of(Stack::MegatronCore),
        zero_stage: 2,
        ..piped
    };
    assert_eq!(rank_memory(&[&stage], 0, &core).grads_bytes, 500_000_000);
    let zero1 = MemoryContext {
        zero_stage: 1,
        ..piped
    };
    assert_eq!(rank_memory(&[&stage], 0, &zero1).grads_bytes, 4 * p);
    // routed experts are held the same way (the pipeline stage runs the whole FSDP module)
    let moe = StageCost {
        expert_params: p / 2,
        ..stage.clone()
    };
    let m = rank_memory(
        &[&moe],
        0,
        &MemoryContext {
            zero_stage: 2,
            ..piped
        },
    );
    assert_eq!(m.grads_bytes, 4 * p + 2 * layer);
    assert!(StackMemory::of(Stack::Torchtitan).pipelined_fsdp(3, 2));
    assert!(!StackMemory::of(Stack::Torchtitan).pipelined_fsdp(1, 2));
    assert!(!StackMemory::of(Stack::Composer).pipelined_fsdp(3, 2));
}
