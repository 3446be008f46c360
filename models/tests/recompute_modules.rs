//! Hand-worked bytes and re-run work of Megatron-Core's selective recompute modules
//! (`--recompute-modules`, [`RecomputeModules`]) on MoE and MLA blocks.

use autopp_models::{load, LayerCost, Model, Op, RecomputeModules, ShardSpec, TransformerSpec};

fn spec(name: &str) -> TransformerSpec {
    match load(name).unwrap() {
        Model::Transformer(t) => t,
        Model::Layers(_) => panic!("{name} is a transformer"),
    }
}

/// The last transformer layer (a MoE layer in every preset here) at tp 1, ep 8.
fn moe_layer(t: &TransformerSpec, modules: &[&str], fp8: bool) -> LayerCost {
    let s = ShardSpec {
        ep: 8,
        fp8_saved_inputs: fp8,
        recompute_modules: RecomputeModules::from_names(modules).unwrap(),
        ..ShardSpec::default()
    };
    t.layers(&s).unwrap()[t.num_layers as usize].clone()
}

fn gemms(ops: &[Op]) -> Vec<(u64, u64, u64)> {
    ops.iter()
        .filter_map(|op| match *op {
            Op::Gemm { m, n, k, .. } => Some((m, n, k)),
            _ => None,
        })
        .collect()
}

/// The default is Megatron's `[core_attn]`: selective recompute as before the modules (the
/// attention core's bytes dropped, its forward re-run and nothing else).
#[test]
fn default_is_the_attention_core() {
    assert_eq!(
        RecomputeModules::from_names(&["core_attn"]).unwrap(),
        RecomputeModules::default()
    );
    let t = spec("qwen3-30b-a3b");
    let l = moe_layer(&t, &["core_attn"], false);
    assert!(l.activation_bytes.selective < l.activation_bytes.none);
    assert_eq!(l.selective_recompute_ops.len(), 1);
    assert!(matches!(
        l.selective_recompute_ops[0],
        Op::Attention {
            backward: false,
            ..
        }
    ));
    assert!(RecomputeModules::from_names(&["moe"]).is_err());
}

/// `layernorm` and `moe_act` on Qwen3-30B-A3B (s 4096, b 1, t 1, h 2048, k 8, f_e 768, bf16):
/// the pre-MLP norm's output `s·h·2` = 16,777,216 B and the routed SwiGLU output
/// `R·f_e·2` = 32,768 · 768 · 2 = 50,331,648 B (R = s·k pairs) are dropped, 67,108,864 B in
/// all; the attention core (not listed) is kept. The re-run work is element-wise: the norm
/// read and written `2·s·h·2` = 33,554,432 B, the activation read (`R·2f_e`) and written
/// (`R·f_e`) `R·3f_e·2` = 150,994,944 B, 184,549,376 B. Under FP8 the SwiGLU output is kept
/// as the second grouped GEMM's 1-byte copy: `R·f_e` = 25,165,824 B goes, with the 16-bit
/// norm output the router keeps, 41,943,040 B.
#[test]
fn layernorm_and_moe_act_drop_the_norm_and_swiglu_outputs() {
    let t = spec("qwen3-30b-a3b");
    assert_eq!(t.seq_length, 4096);
    let l = moe_layer(&t, &["layernorm", "moe_act"], false);
    let a = l.activation_bytes;
    assert_eq!(a.none - a.selective, 16_777_216 + 50_331_648);
    assert!(gemms(&l.selective_recompute_ops).is_empty());
    assert_eq!(
        l.selective_recompute_ops,
        vec![Op::Elementwise {
            bytes: 33_554_432 + 150_994_944
        }]
    );
    let fp8 = moe_layer(&t, &["layernorm", "moe_act"], true);
    let a = fp8.activation_bytes;
    assert_eq!(a.none - a.selective, 16_777_216 + 25_165_824);
}

/// `mla_up_proj` on DeepSeek-V3 (s 4096, b 1, t 1, 128 heads, d_qk 192, d_v 128, q rank
/// 1536, kv rank 512): Q, K and V, `s·128·(2·192 + 128)·2` = 536,870,912 B, are dropped and
/// the two up projections re-run: `[4096 × 24,576]` from the 1536-wide query latent and
/// `[4096 × 32,768]` (128 · (128 + 128)) from the 512-wide key/value latent.
#[test]
fn mla_up_proj_drops_q_k_v_and_reruns_the_up_projections() {
    let t = spec("deepseek-v3");
    assert_eq!(t.seq_length, 4096);
    let l = moe_layer(&t, &["mla_up_proj"], false);
    let a = l.activation_bytes;
    assert_eq!(a.none - a.selective, 536_870_912);
    assert_eq!(
        gemms(&l.selective_recompute_ops),
        vec![(4096, 24_576, 1536), (4096, 32_768, 512)]
    );
    // the rotary embedding and the assembly of Q, K, V: written again
    assert!(l
        .selective_recompute_ops
        .contains(&Op::Elementwise { bytes: 536_870_912 }));
    // `mlp` touches no MoE layer ("recompute the dense MLP submodule")
    let m = moe_layer(&t, &["mlp"], false);
    assert_eq!(m.activation_bytes.selective, m.activation_bytes.none);
    assert!(m.selective_recompute_ops.is_empty());
}

/// `mlp` on DeepSeek-V3's first (dense) block, bf16, s 4096, t 1, f 18,432: its MLP input
/// `s·h·2` = 58,720,256 B and SwiGLU input and output `s·3f·2` = 452,984,832 B are dropped
/// (511,705,088 B), the three FFN GEMMs re-run.
#[test]
fn mlp_drops_a_dense_blocks_mlp_activations() {
    let t = spec("deepseek-v3");
    let s = ShardSpec {
        ep: 8,
        recompute_modules: RecomputeModules::from_names(&["mlp"]).unwrap(),
        ..ShardSpec::default()
    };
    let dense = t.layers(&s).unwrap()[1].clone();
    assert_eq!(dense.expert_params, 0);
    let a = dense.activation_bytes;
    assert_eq!(a.none - a.selective, 58_720_256 + 452_984_832);
    let g = gemms(&dense.selective_recompute_ops);
    assert_eq!(g, vec![(4096, 36_864, 7168), (4096, 7168, 18_432)]);
}
