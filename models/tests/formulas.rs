//! Hand-worked checks of the transformer formulas against their sources: parameter counts,
//! FLOPs (Narayanan et al. 2021), activation bytes (Korthikanti et al. 2022, Table 2) and how
//! they shard under tensor parallelism.

use autopp_models::{load, LayerCost, Model, Recompute, ShardSpec, TransformerSpec};

fn spec(name: &str) -> TransformerSpec {
    match load(name).unwrap() {
        Model::Transformer(t) => t,
        Model::Layers(_) => panic!("{name} is a transformer preset"),
    }
}

fn shard(b: u64, tp: u64, sequence_parallel: bool) -> ShardSpec {
    ShardSpec {
        micro_batch_size: b,
        tp,
        sequence_parallel,
        flash_attention: false,
        ..ShardSpec::default()
    }
}

/// The first transformer layer (index 1) under `shard`.
fn block(t: &TransformerSpec, shard: &ShardSpec) -> LayerCost {
    t.layers(shard).unwrap()[1].clone()
}

#[test]
fn gpt3_175b_has_174_6_billion_parameters() {
    let t = spec("gpt3-175b");
    let (l, h, v, s) = (96u64, 12288u64, 50257u64, 2048u64);
    // 12·L·h² + 13·L·h + V·h + s·h, plus the final LayerNorm 2h
    let expected = 12 * l * h * h + 13 * l * h + v * h + s * h + 2 * h;
    assert_eq!(t.num_params(), expected);
    assert_eq!(expected, 174_604_259_328);
    assert_eq!((t.num_params() as f64 / 1e8).round() / 10.0, 174.6);
}

#[test]
fn layer_forward_flops_are_24bsh2_plus_4bs2h() {
    // GPT-3 shape: f = 4h, g = a
    let t = spec("gpt3-175b");
    for b in [1u64, 2, 4] {
        let layer = block(&t, &shard(b, 1, false));
        let (s, h) = (2048f64, 12288f64);
        let b = b as f64;
        let expected = 24.0 * b * s * h * h + 4.0 * b * s * s * h;
        assert_eq!(layer.forward_flops(), expected);
        // backward-input + backward-weight = 2 × forward
        assert_eq!(
            layer.backward_input_flops() + layer.backward_weight_flops(),
            2.0 * expected
        );
        assert_eq!(layer.model_flops(), 3.0 * expected);
    }
}

#[test]
fn model_flops_per_sequence_is_korthikanti_mfu_formula() {
    for name in [
        "gpt3-175b",
        "megatron-1t",
        "mt-nlg-530b",
        "bloom-176b",
        "tiny-gpt",
    ] {
        let t = spec(name);
        if t.ffn() != 4 * t.hidden_size {
            continue;
        }
        let (s, l, h, v) = (
            t.seq_length as f64,
            t.num_layers as f64,
            t.hidden_size as f64,
            t.vocab_size as f64, // unpadded
        );
        let expected = 72.0 * s * l * h * h * (1.0 + s / (6.0 * h) + v / (12.0 * l * h));
        let got = Model::Transformer(t).model_flops_per_sequence().unwrap();
        assert!(
            ((got - expected) / expected).abs() < 1e-12,
            "{name}: {got} vs {expected}"
        );
    }
}

/// Korthikanti et al. 2022, Table 2, per layer, 16-bit, dropout on, no fused attention.
#[test]
fn activation_bytes_match_korthikanti_table_2() {
    let t = spec("gpt3-175b");
    assert!(t.dropout);
    let (s, h, a) = (2048u64, 12288u64, 96u64);
    for b in [1u64, 2] {
        let sbh = s * b * h;
        let core = 5 * a * s * s * b; // 5as/h · sbh
                                      // no parallelism: sbh(34 + 5as/h); selective 34sbh; full 2sbh
        let l = block(&t, &shard(b, 1, false));
        assert_eq!(l.activation_bytes_for(Recompute::None), 34 * sbh + core);
        assert_eq!(l.activation_bytes_for(Recompute::Selective), 34 * sbh);
        assert_eq!(l.activation_bytes_for(Recompute::Full), 2 * sbh);
        for tp in [2u64, 4, 8] {
            // tensor parallel: sbh(10 + 24/t + 5as/(ht))
            let l = block(&t, &shard(b, tp, false));
            assert_eq!(
                l.activation_bytes_for(Recompute::None),
                10 * sbh + 24 * sbh / tp + core / tp,
                "tp {tp}"
            );
            // tensor parallel + selective: sbh(10 + 24/t)
            assert_eq!(
                l.activation_bytes_for(Recompute::Selective),
                10 * sbh + 24 * sbh / tp
            );
            // full recompute without sequence parallelism: 2sbh
            assert_eq!(l.activation_bytes_for(Recompute::Full), 2 * sbh);
            // tensor + sequence parallel: sbh(34 + 5as/h)/t
            let l = block(&t, &shard(b, tp, true));
            assert_eq!(
                l.activation_bytes_for(Recompute::None),
                (34 * sbh + core) / tp
            );
            // tensor + sequence parallel + selective: 34sbh/t
            assert_eq!(l.activation_bytes_for(Recompute::Selective), 34 * sbh / tp);
            // full recompute with sequence parallelism: 2sbh/t
            assert_eq!(l.activation_bytes_for(Recompute::Full), 2 * sbh / tp);
        }
    }
}

/// Qi et al. 2023 ("Zero Bubble Pipeline Parallelism", Table 1): between a split backward's `I`
/// and `W` a GPT layer (f = 4h, g = a, 16-bit) keeps only the inputs of its four GEMMs and their
/// output gradients, `M_W = 32·sbh` bytes — less than the `34·sbh + 5as²b` held from F to B.
/// By GEMM: inputs QKV 2sbh, out-proj 2sbh/t, MLP-up 2sbh, MLP-down 8sbh/t; output gradients
/// QKV 6sbh/t, out-proj 2sbh, MLP-up 8sbh/t, MLP-down 2sbh. Sequence parallelism shards the
/// replicated four (kept sharded, gathered again for W).
#[test]
fn weight_grad_bytes_match_zero_bubble_table_1() {
    let t = spec("gpt3-175b");
    let (s, h, a) = (2048u64, 12288u64, 96u64);
    for b in [1u64, 2] {
        let sbh = s * b * h;
        let l = block(&t, &shard(b, 1, false));
        assert_eq!(l.weight_grad_bytes, 32 * sbh);
        assert!(l.weight_grad_bytes < l.activation_bytes.none);
        assert_eq!(l.activation_bytes.none, 34 * sbh + 5 * a * s * s * b);
        for tp in [2u64, 4, 8] {
            let l = block(&t, &shard(b, tp, false));
            assert_eq!(l.weight_grad_bytes, 8 * sbh + 24 * sbh / tp, "tp {tp}");
            let l = block(&t, &shard(b, tp, true));
            assert_eq!(l.weight_grad_bytes, 32 * sbh / tp, "tp {tp} sp");
        }
    }
}

/// The same count for Llama 3 70B (h = 8192, 8 key/value heads of 128, gated f = 28672, no
/// bias, t = 1), per token in 2-byte elements. GEMM inputs: h for QKV, h for the output
/// projection, h for gate/up and f for down; output gradients: h + 2·1024 for QKV, h for the
/// output projection, 2f for gate/up and h for down. In all 2·(6·8192 + 2·1024 + 3·28672) =
/// 274,432 bytes per token, × 8192 tokens. The embedding keeps its token ids (8 bytes each) and
/// output gradient (2h); the head its input (2h) and logit gradients (2·128,256 per token).
#[test]
fn weight_grad_bytes_of_llama3_70b_by_hand() {
    let t = spec("llama3-70b");
    let layers = t.layers(&shard(1, 1, false)).unwrap();
    let tokens = 8192u64;
    assert_eq!(layers[1].weight_grad_bytes, 274_432 * tokens);
    assert_eq!(layers[0].weight_grad_bytes, (8 + 2 * 8192) * tokens);
    assert_eq!(
        layers.last().unwrap().weight_grad_bytes,
        2 * (8192 + 128_256) * tokens
    );
}

#[test]
fn fused_attention_drops_the_score_matrices() {
    let t = spec("gpt3-175b");
    let (s, h, a, tp) = (2048u64, 12288u64, 96u64, 8u64);
    let flash = ShardSpec {
        tp,
        sequence_parallel: true,
        ..ShardSpec::default()
    };
    let l = block(&t, &flash);
    // 34sbh/t plus the fp32 softmax statistics 4·a·s·b/t
    assert_eq!(l.activation_bytes.none, 34 * s * h / tp + 4 * a * s / tp);
    assert_eq!(l.activation_bytes.selective, 34 * s * h / tp);
}

/// Under Transformer Engine's FP8 recipes the linear layers keep their FP8-cast inputs for
/// the weight gradient (TE `Linear`, `LayerNormLinear`, `LayerNormMLP`: the saved input is
/// the quantized one). GPT-3 175B, t = 8 with sequence parallelism, fused attention: of
/// Korthikanti's 34sbh/t the QKV input and the MLP input (2sbh/t each) drop to 1 byte
/// (−2sbh/t), the down projection's input, the GeLU output 8sbh/t, to 4sbh/t (−4sbh/t), and
/// the output projection keeps an FP8 copy of its input beside the attention core's 16-bit
/// output (+sbh/t): 34 − 2 − 4 + 1 = 29sbh/t.
#[test]
fn fp8_linear_inputs_are_kept_in_one_byte() {
    let t = spec("gpt3-175b");
    let (s, h, a, tp) = (2048u64, 12288u64, 96u64, 8u64);
    let fp8 = ShardSpec {
        tp,
        sequence_parallel: true,
        fp8_saved_inputs: true,
        ..ShardSpec::default()
    };
    let l = block(&t, &fp8);
    assert_eq!(l.activation_bytes.none, 29 * s * h / tp + 4 * a * s / tp);
    // full recompute keeps the layer input, in 16 bits
    assert_eq!(l.activation_bytes.full, 2 * s * h / tp);
    // selective recompute of the core (Megatron-Core's `core_attn`) drops the softmax
    // statistics and, the core's outputs not being saved inside the checkpoint, the fused
    // kernel's 16-bit output: the output projection keeps only its FP8 copy, 29 − 2 = 27sbh/t
    assert_eq!(l.activation_bytes.selective, 27 * s * h / tp);
    // in bf16 the projection keeps the 16-bit output itself: only the statistics go
    let bf16 = block(
        &t,
        &ShardSpec {
            fp8_saved_inputs: false,
            ..fp8
        },
    );
    assert_eq!(bf16.activation_bytes.selective, 34 * s * h / tp);
}

#[test]
fn without_dropout_no_masks_are_kept() {
    let mut t = spec("gpt3-175b");
    t.dropout = false;
    let (s, h, a) = (2048u64, 12288u64, 96u64);
    let l = block(&t, &shard(1, 1, false));
    // 34sbh − 2sbh of hidden masks; of the 5as²b only the softmax output 2as²b remains (the
    // attention over V reads it directly)
    assert_eq!(l.activation_bytes.none, 32 * s * h + 2 * a * s * s);
}

#[test]
fn tensor_parallel_flops_divide_exactly() {
    // vocabulary 51200 pads to itself for every tp up to 8 with --make-vocab-size-divisible-by 128
    let t = spec("megatron-1t");
    let base = t.layers(&shard(1, 1, false)).unwrap();
    for tp in [2u64, 4, 8] {
        let sharded = t.layers(&shard(1, tp, false)).unwrap();
        for (one, many) in base.iter().zip(&sharded) {
            assert_eq!(one.forward_flops(), many.forward_flops() * tp as f64);
            assert_eq!(one.model_flops(), many.model_flops() * tp as f64);
        }
    }
}

#[test]
fn vocabulary_pads_to_a_multiple_of_128_tp() {
    let t = spec("gpt3-175b");
    let h = 12288u64;
    for (tp, padded) in [(1u64, 50304u64), (2, 50432), (4, 50688), (8, 51200)] {
        let s = shard(1, tp, false);
        assert_eq!(s.padded_vocab(50257), padded);
        let layers = t.layers(&s).unwrap();
        let embedding = &layers[0];
        let head = layers.last().unwrap();
        assert_eq!(embedding.params, padded * h / tp + 2048 * h);
        assert_eq!(head.tied_params, padded * h / tp);
        assert_eq!(head.params, 2 * h); // the final LayerNorm; the LM head is tied
        assert_eq!(head.forward_flops(), 2.0 * (2048 * h * padded / tp) as f64);
    }
}

#[test]
fn grouped_query_attention_parameter_counts() {
    for (name, expected) in [
        ("llama2-70b", 68_976_648_192u64), // ≈ 68.98 B
        ("llama3-8b", 8_030_261_248),      // ≈ 8.03 B
        ("llama3-70b", 70_553_706_496),    // ≈ 70.55 B
        ("llama3-405b", 405_853_388_800),  // ≈ 405.85 B
    ] {
        assert_eq!(spec(name).num_params(), expected, "{name}");
    }
    // by hand for Llama 2 70B: attention 2h² + 2·h·(g·h/a), SwiGLU 3hf, two RMSNorms 2h
    let (h, kv, f) = (8192u64, 8 * 128u64, 28672u64);
    let layer = 2 * h * h + 2 * h * kv + 3 * h * f + 2 * h;
    assert_eq!(spec("llama2-70b").layer_params(), layer);
    assert_eq!(80 * layer + 2 * 32000 * h + h, 68_976_648_192);
}

#[test]
fn gqa_layer_flops() {
    // QKV 2bsh(h + 2gh/a), attention 4bs²h, output 2bsh², SwiGLU 6bshf
    let t = spec("llama3-8b");
    let (s, h, kv, f) = (8192f64, 4096f64, 1024f64, 14336f64);
    let l = block(&t, &shard(1, 1, false));
    let expected =
        2.0 * s * h * (h + 2.0 * kv) + 4.0 * s * s * h + 2.0 * s * h * h + 6.0 * s * h * f;
    assert_eq!(l.forward_flops(), expected);
}

#[test]
fn sharded_layer_parameters_replicate_norms_and_row_biases() {
    let t = spec("gpt3-175b");
    let h = 12288u64;
    for tp in [1u64, 2, 8] {
        let l = block(&t, &shard(1, tp, false));
        // weights 12h²/t; QKV and MLP-up biases (3h + 4h)/t; output and MLP-down biases 2h and
        // both LayerNorms 4h replicated
        assert_eq!(
            l.params,
            12 * h * h / tp + 7 * h / tp + 2 * h + 4 * h,
            "tp {tp}"
        );
        assert_eq!(l.params_total, 12 * h * h + 13 * h);
    }
}

#[test]
fn tensor_parallel_beyond_kv_heads_replicates_one_kv_head() {
    // Llama 3 8B has 8 key/value heads; at tp 16 each GPU holds one (replicated) of width 128
    let t = spec("llama3-8b");
    let (h, hd, f, tp) = (4096u64, 128u64, 14336u64, 16u64);
    let l = block(&t, &shard(1, tp, false));
    let qkv_n = h / tp + 2 * hd;
    assert_eq!(l.params, h * qkv_n + (h / tp) * h + 3 * h * f / tp + 2 * h);
    let s = 8192f64;
    let gemms = 2.0 * s * (h * qkv_n + (h / tp) * h + 3 * h * f / tp) as f64;
    let attention = 4.0 * s * s * h as f64 / tp as f64;
    assert_eq!(l.forward_flops(), gemms + attention);
    // at tp 8 it is an exact eighth
    let l8 = block(&t, &shard(1, 8, false));
    let l1 = block(&t, &shard(1, 1, false));
    assert_eq!(l1.forward_flops(), 8.0 * l8.forward_flops());
    assert_eq!(l1.params - 2 * h, 8 * (l8.params - 2 * h));
}

#[test]
fn layer_list_order_and_output_bytes() {
    let t = spec("gpt3-175b");
    let layers = t.layers(&shard(2, 8, true)).unwrap();
    assert_eq!(layers.len(), 98);
    assert_eq!(layers[0].name, "embedding");
    assert_eq!(layers[1].name, "layer 0");
    assert_eq!(layers[96].name, "layer 95");
    assert_eq!(layers[97].name, "head");
    // 2bsh bytes over t (Megatron's scatter/gather)
    assert_eq!(layers[1].output_bytes, 2 * 2048 * 12288 * 2 / 8);
    assert_eq!(layers[0].output_bytes, 2 * 2048 * 12288 * 2 / 8);
    assert_eq!(layers[97].output_bytes, 0);
    // head keeps fp32 logits 4·s·b·V/t
    let logits = 4 * 2 * 2048 * 51200 / 8;
    assert_eq!(
        layers[97].activation_bytes.none,
        logits + 2 * (2 * 2048 * 12288 * 2 / 8)
    );
}

#[test]
fn sequence_length_override() {
    let m = load("llama3-8b").unwrap().with_seq_length(4096).unwrap();
    assert_eq!(m.seq_length(), 4096);
    assert_eq!(m.num_params(), 8_030_261_248);
    // GPT-3's learned table keeps its 2048 rows at a shorter sequence, and refuses a longer one
    let m = load("gpt3-175b").unwrap().with_seq_length(1024).unwrap();
    assert_eq!(m.num_params(), 174_604_259_328);
    let e = load("gpt3-175b")
        .unwrap()
        .with_seq_length(4096)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "model key 'seq_length' = 4096 exceeds the 2048 learned positions of model 'gpt3-175b': choose at most 2048"
    );
    let m = load("gpt3-175b").unwrap().with_global_batch(512).unwrap();
    assert_eq!(m.default_global_batch(), Some(512));
    assert!(load("gpt3-175b").unwrap().with_global_batch(0).is_err());
    assert!(load("gpt3-175b").unwrap().with_seq_length(0).is_err());
}
