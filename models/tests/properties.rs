//! Invariants over random transformer shapes.

use autopp_models::{Model, Recompute, ShardSpec, TransformerSpec};
use proptest::prelude::*;

/// A random valid transformer whose heads, key/value heads and FFN width are divisible by 8, so
/// every tp in {1, 2, 4, 8} divides them.
fn transformer() -> impl Strategy<Value = TransformerSpec> {
    (
        1u64..6,                                                       // layers
        1u64..5,                                                       // head_dim / 16
        1u64..5,                                                       // kv heads / 8
        1u64..4,                                                       // query heads per kv head
        prop_oneof![Just(None), (1u64..9).prop_map(|x| Some(x * 64))], // ffn
        1u64..5000,                                                    // vocab
        (1u64..9).prop_map(|x| x * 64),                                // seq
        any::<(bool, bool, bool, bool, bool)>(),
    )
        .prop_map(|(l, hd, g8, group, ffn, v, s, flags)| {
            let g = 8 * g8;
            let a = g * group;
            let h = a * hd * 16;
            let mut t = TransformerSpec::new("p", l, h, a, v, s);
            t.num_kv_heads = Some(g);
            t.ffn_hidden_size = ffn;
            t.gated_mlp = flags.0;
            t.tied_embeddings = flags.1;
            t.bias = flags.2;
            t.dropout = flags.3;
            t.qkv_bias = Some(flags.4);
            t
        })
}

fn shard(tp: u64, sequence_parallel: bool, flash_attention: bool, b: u64) -> ShardSpec {
    ShardSpec {
        micro_batch_size: b,
        tp,
        sequence_parallel,
        flash_attention,
        ..ShardSpec::default()
    }
}

proptest! {
    #[test]
    fn flops_and_sharded_params_scale_as_one_over_tp(
        t in transformer(),
        tp in prop_oneof![Just(2u64), Just(4), Just(8)],
        sp in any::<bool>(),
        b in 1u64..4,
    ) {
        let one = t.layers(&shard(1, false, true, b)).unwrap();
        let many = t.layers(&shard(tp, sp, true, b)).unwrap();
        // transformer layers (the head's padded vocabulary may differ with tp)
        for (x, y) in one[1..one.len() - 1].iter().zip(&many[1..many.len() - 1]) {
            prop_assert_eq!(x.forward_flops(), y.forward_flops() * tp as f64);
            prop_assert_eq!(x.backward_input_flops(), y.backward_input_flops() * tp as f64);
            prop_assert_eq!(x.backward_weight_flops(), y.backward_weight_flops() * tp as f64);
            // everything but the replicated norms and row-parallel biases divides by tp
            let replicated = 2 * t.norm_params() + if t.bias { 2 * t.hidden_size } else { 0 };
            prop_assert_eq!(x.params - replicated, (y.params - replicated) * tp);
        }
    }

    #[test]
    fn backward_is_twice_forward(t in transformer(), b in 1u64..4) {
        let layers = t.layers(&shard(1, false, false, b)).unwrap();
        for l in &layers[1..] {
            prop_assert_eq!(l.backward_input_flops() + l.backward_weight_flops(), 2.0 * l.forward_flops());
        }
    }

    #[test]
    fn activation_bytes_are_monotone_in_recompute(
        t in transformer(),
        tp in prop_oneof![Just(1u64), Just(2), Just(4), Just(8)],
        sp in any::<bool>(),
        flash in any::<bool>(),
        b in 1u64..4,
    ) {
        for l in t.layers(&shard(tp, sp, flash, b)).unwrap() {
            let none = l.activation_bytes_for(Recompute::None);
            let selective = l.activation_bytes_for(Recompute::Selective);
            let full = l.activation_bytes_for(Recompute::Full);
            prop_assert!(none >= selective && selective >= full, "{}: {none} {selective} {full}", l.name);
        }
    }

    #[test]
    fn params_per_gpu_add_up_at_tp_1(t in transformer()) {
        let shard = ShardSpec { vocab_pad_multiple: 1, ..ShardSpec::default() };
        let layers = t.layers(&shard).unwrap();
        let total: u64 = layers.iter().map(|l| l.params).sum();
        prop_assert_eq!(total, t.num_params());
        let owned: u64 = layers.iter().map(|l| l.params_total).sum();
        prop_assert_eq!(owned, t.num_params());
        prop_assert_eq!(Model::Transformer(t).num_params(), total);
    }

    #[test]
    fn activation_bytes_scale_with_micro_batch(t in transformer(), b in 2u64..5) {
        let one = t.layers(&shard(2, true, false, 1)).unwrap();
        let many = t.layers(&shard(2, true, false, b)).unwrap();
        for (x, y) in one.iter().zip(&many) {
            prop_assert_eq!(x.activation_bytes.none * b, y.activation_bytes.none);
            prop_assert_eq!(x.activation_bytes.full * b, y.activation_bytes.full);
            prop_assert_eq!(x.forward_flops() * b as f64, y.forward_flops());
        }
    }
}
