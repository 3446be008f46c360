//! The largest weight tensor each layer reports (`LayerCost::largest_weight_params`), worked by
//! hand from the shapes: what an optimizer that casts gradients one tensor at a time holds.

use autopp_models::{load, Model, ShardSpec};

/// The bloom-176b preset (hidden 14,336, vocabulary 250,880, tied embeddings) at tp 4: the
/// embedding table is 250,880 rows / 4 × 14,336 = 899,153,920 (250,880 is already a multiple
/// of 128 · 4); a block's largest matrix is the MLP input projection, 4 · 14,336 / 4 × 14,336 =
/// 205,520,896 (the fused QKV is 3 · 14,336 / 4 × 14,336 = 154,140,672); the tied head holds
/// the embedding's copy, as large.
#[test]
fn largest_weight_tensors_hand_worked() {
    let Model::Transformer(t) = load("bloom-176b").expect("preset") else {
        panic!("bloom-176b is a transformer preset")
    };
    let shard = ShardSpec {
        tp: 4,
        ..ShardSpec::default()
    };
    let layers = t.layers(&shard).expect("layers");
    let embedding = layers.first().expect("embedding");
    let head = layers.last().expect("head");
    assert_eq!(embedding.largest_weight_params, 899_153_920);
    assert_eq!(head.largest_weight_params, 899_153_920);
    assert_eq!(head.tied_params, 899_153_920);
    for block in &layers[1..layers.len() - 1] {
        assert_eq!(block.largest_weight_params, 205_520_896);
    }
}
