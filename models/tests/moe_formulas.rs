//! Hand-worked MoE counts: all-to-all bytes per token, routed-expert parameters per GPU under
//! expert parallelism, and activated FLOPs.

use autopp_models::{load, LayerCost, Model, ShardSpec, TransformerSpec};

fn spec(name: &str) -> TransformerSpec {
    match load(name).unwrap() {
        Model::Transformer(t) => t,
        Model::Layers(_) => panic!("{name} is a transformer"),
    }
}

fn shard(tp: u64, ep: u64, etp: u64) -> ShardSpec {
    ShardSpec {
        tp,
        ep,
        etp,
        sequence_parallel: tp > 1,
        ..ShardSpec::default()
    }
}

/// The last transformer layer (a MoE layer in every preset here).
fn moe_layer(t: &TransformerSpec, s: &ShardSpec) -> LayerCost {
    let layers = t.layers(s).unwrap();
    layers[t.num_layers as usize].clone()
}

/// Dispatch and combine each move every (token, expert) pair's hidden vector: per token
/// `2 · k · h · e` bytes per forward (Megatron-Core's all-to-all token dispatcher; Liu et al.
/// 2025, §3.2), split over the tensor-parallel group.
#[test]
fn all_to_all_bytes_per_token() {
    let t = spec("mixtral-8x7b"); // k 2, h 4096, bf16, s 4096
    let l = moe_layer(&t, &shard(1, 8, 1));
    assert_eq!(l.ep_a2a_bytes, 4096 * (2 * 2 * 4096 * 2)); // 32,768 B per token
    let l = moe_layer(&t, &shard(2, 8, 1));
    assert_eq!(l.ep_a2a_bytes, 4096 * (2 * 2 * 4096 * 2) / 2);
    let t = spec("deepseek-v3"); // k 8, h 7168
    let l = moe_layer(&t, &shard(1, 64, 1));
    assert_eq!(l.ep_a2a_bytes, 4096 * 229_376); // 2·8·7168·2 B per token
                                                // dense layers send nothing
    let layers = t.layers(&shard(1, 64, 1)).unwrap();
    assert_eq!(layers[1].ep_a2a_bytes, 0);
}

/// DeepSeek-V3 at ep 64, etp 1 (its published layout, arXiv 2412.19437 §3.2): 256/64 = 4
/// experts per GPU of `3 · 7168 · 2048 = 44,040,192` parameters = 176,160,768 per MoE layer;
/// the rest of the layer (MLA 187,107,328, router 7168·256 + 256, shared expert 44,040,192,
/// two norms 2·7168) is on every GPU.
#[test]
fn deepseek_v3_expert_params_per_gpu_at_ep_64() {
    let t = spec("deepseek-v3");
    let l = moe_layer(&t, &shard(1, 64, 1));
    assert_eq!(l.expert_params, 4 * 44_040_192);
    let rest = 187_107_328 + 7168 * 256 + 256 + 44_040_192 + 2 * 7168;
    assert_eq!(l.params, 176_160_768 + rest);
    // etp 2 halves each expert
    let l = moe_layer(&t, &shard(1, 32, 2));
    assert_eq!(l.expert_params, 8 * 44_040_192 / 2);
}

/// Mixtral 8x7B at ep 8: one expert of `3 · 4096 · 14336 = 176,160,768` parameters per GPU.
#[test]
fn mixtral_expert_params_per_gpu_at_ep_8() {
    let t = spec("mixtral-8x7b");
    let l = moe_layer(&t, &shard(1, 8, 1));
    assert_eq!(l.expert_params, 176_160_768);
    let l = moe_layer(&t, &shard(1, 1, 1));
    assert_eq!(l.expert_params, 8 * 176_160_768);
}

/// Balanced, the routed-expert FLOPs of one GPU do not depend on ep: `2 · T · k · 3 · h · f_e
/// / tp` in the forward (each of the `T·k/tp` pairs a GPU dispatches is computed somewhere,
/// one pair's worth per pair received); an imbalance of 1.5 makes the busiest rank's 1.5×.
#[test]
fn routed_flops_are_activated_flops() {
    let t = spec("mixtral-8x7b");
    let gemm_flops = |l: &LayerCost| -> f64 {
        l.forward_ops
            .iter()
            .filter(|op| {
                matches!(op, autopp_models::Op::Gemm { n, k, .. } if *n == 2 * 14336 || *k == 14336)
            })
            .map(|op| op.flops())
            .sum()
    };
    let expected = 2.0 * 4096.0 * 2.0 * 3.0 * 4096.0 * 14336.0;
    for ep in [1, 2, 8] {
        let l = moe_layer(&t, &shard(1, ep, 1));
        let f = gemm_flops(&l);
        assert!((f / expected - 1.0).abs() < 1e-9, "ep {ep}: {f}");
    }
    let l = moe_layer(
        &t,
        &ShardSpec {
            moe_imbalance_milli: 1500,
            ..shard(1, 8, 1)
        },
    );
    assert!((gemm_flops(&l) / expected - 1.5).abs() < 1e-9);
}

/// Under Transformer Engine's FP8 recipes a MoE layer keeps each routed (token, expert) pair's
/// input and SwiGLU output in FP8 (`GroupedLinear` saves its quantized input): Qwen3-30B-A3B,
/// s 4096, b 1, t 1, k 8, h 2048, f_e 768 — `R = 32,768` pairs save `R·(h + f_e)` =
/// 92,274,688 bytes; the QKV input saves `sh` = 8,388,608; the output projection keeps an FP8
/// copy of its input, `s·a·d_h` = 4096·32·128 = 16,777,216 bytes. The MLP input stays in
/// 16 bits: the router keeps it. Net 83,886,080 bytes fewer.
#[test]
fn fp8_keeps_routed_inputs_in_one_byte() {
    let t = spec("qwen3-30b-a3b");
    let bf16 = moe_layer(&t, &shard(1, 8, 1));
    let fp8 = moe_layer(
        &t,
        &ShardSpec {
            fp8_saved_inputs: true,
            ..shard(1, 8, 1)
        },
    );
    let (s, h, fe, k) = (4096u64, 2048u64, 768u64, 8u64);
    let saved = s * k * (h + fe) + s * h - s * 32 * 128;
    assert_eq!(saved, 83_886_080);
    assert_eq!(
        bf16.activation_bytes.none - fp8.activation_bytes.none,
        saved
    );
}
