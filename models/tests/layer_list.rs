//! Explicit layer lists: loading, scaling by micro-batch and tensor parallelism, and errors
//! that name the layer and key.

use autopp_models::{load, load_str, LayerKind, Model, Recompute, ShardSpec};

fn fixture() -> Model {
    load(&format!(
        "{}/tests/fixtures/layer-list.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

fn shard(b: u64, tp: u64) -> ShardSpec {
    ShardSpec {
        micro_batch_size: b,
        tp,
        ..ShardSpec::default()
    }
}

#[test]
fn loads_and_expands_counts() {
    let m = fixture();
    assert!(matches!(m, Model::Layers(_)));
    assert_eq!(m.name(), "conv-net");
    assert_eq!(m.seq_length(), 1024);
    assert_eq!(m.default_global_batch(), Some(256));
    assert_eq!(m.num_layer_entries(), 1 + 12 + 1 + 1);
    assert_eq!(m.num_params(), 1_000_000 + 12 * 4_194_304 + 1_025_000);
    assert_eq!(m.num_attention_heads(), None);
    let layers = m.layers(&shard(1, 1)).unwrap();
    assert_eq!(layers.len(), 15);
    let names: Vec<&str> = layers.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names[..3], ["stem", "block 0", "block 1"]);
    assert_eq!(names[13..], ["pool", "classifier"]);
    assert!(layers.iter().all(|l| l.kind == LayerKind::Custom));
}

#[test]
fn per_sequence_values_at_mbs_1_tp_1() {
    let layers = fixture().layers(&shard(1, 1)).unwrap();
    let stem = &layers[0];
    assert_eq!(stem.forward_flops(), 4.194304e9);
    // defaults: backward-input and backward-weight equal forward
    assert_eq!(stem.backward_input_flops(), 4.194304e9);
    assert_eq!(stem.backward_weight_flops(), 4.194304e9);
    assert_eq!(stem.params, 1_000_000);
    assert_eq!(stem.activation_bytes.none, 8_388_608);
    // the first layer has no input to keep: full recompute keeps what none keeps
    assert_eq!(stem.activation_bytes.full, 8_388_608);
    assert_eq!(stem.output_bytes, 2_097_152);
    // a dense 2048 × 2048 layer over 1024 tokens becomes that GEMM
    let block = &layers[1];
    assert_eq!(
        block.forward_ops,
        vec![autopp_models::Op::Gemm {
            m: 1024,
            n: 2048,
            k: 2048,
            count: 1,
            linear: true,
        }]
    );
    assert_eq!(block.activation_bytes_for(Recompute::Full), 2_097_152);
    assert_eq!(block.activation_bytes_for(Recompute::Selective), 33_554_432);
    let pool = &layers[13];
    assert_eq!(pool.model_flops(), 0.0);
    assert_eq!(pool.weight_grad_bytes, 0);
    // default full recompute keeps the input: the previous layer's output
    assert_eq!(pool.activation_bytes.full, 2_097_152);
    let classifier = &layers[14];
    assert_eq!(classifier.activation_bytes.full, 4096);
    let m = fixture();
    assert_eq!(
        m.model_flops_per_sequence().unwrap(),
        3.0 * (4.194304e9 + 12.0 * 8589934592.0 + 2050000.0)
    );
}

#[test]
fn micro_batch_and_tensor_parallel_scaling() {
    let one = fixture().layers(&shard(1, 1)).unwrap();
    let scaled = fixture().layers(&shard(4, 2)).unwrap();
    for (a, b) in one.iter().zip(&scaled) {
        assert_eq!(b.forward_flops(), a.forward_flops() * 2.0, "{}", a.name);
        assert_eq!(b.activation_bytes.none, a.activation_bytes.none * 2);
        assert_eq!(b.output_bytes, a.output_bytes * 2);
        assert_eq!(b.params, a.params.div_ceil(2));
        // one all-reduce of the whole output (b · output_bytes) per pass
        assert_eq!(b.tp_forward.len(), 1);
        assert_eq!(b.tp_forward[0].bytes, 4 * a.output_bytes);
        assert_eq!(b.tp_backward.len(), 1);
    }
    assert!(one.iter().all(|l| l.tp_forward.is_empty()));
}

#[test]
fn sequence_length_and_context_parallelism() {
    let m = fixture();
    assert!(m.clone().with_seq_length(1024).is_ok());
    assert_eq!(
        m.clone().with_seq_length(2048).unwrap_err().to_string(),
        "model key 'seq_length' of layer list 'conv-net' is 1024: its per-sequence costs hold for that length only; write a layer list for 2048"
    );
    let e = m
        .layers(&ShardSpec {
            cp: 2,
            ..ShardSpec::default()
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "--cp 2 cannot split a layer list (it has no attention to split): use --cp 1 for model 'conv-net'"
    );
    assert_eq!(
        m.with_global_batch(64).unwrap().default_global_batch(),
        Some(64)
    );
}

#[test]
fn errors_name_the_layer_and_key() {
    let wrap = |layers: &str| format!(r#"{{"name": "n", "seq_length": 16, "layers": [{layers}]}}"#);
    let ok = r#"{"name": "a", "params": 1, "forward_flops": 2, "activation_bytes": 3, "output_bytes": 4}"#;
    let cases = [
        (
            wrap(&format!(
                r#"{ok}, {{"name": "b", "params": -5, "forward_flops": 2, "activation_bytes": 3, "output_bytes": 4}}"#
            )),
            "model key 'layers[1].params' must be a non-negative whole number, but is negative (-5)",
        ),
        (
            wrap(&format!(
                r#"{ok}, {{"name": "b", "params": 1, "forward_flops": 2, "activation_bytes": 3}}"#
            )),
            "model key 'layers[1].output_bytes' is required but missing: add it",
        ),
        (
            wrap(&format!(
                r#"{ok}, {{"name": "b", "params": 1, "flops": 2, "forward_flops": 2, "activation_bytes": 3, "output_bytes": 4}}"#
            )),
            "model key 'layers[1].flops' is not a known key: remove it or fix its spelling (valid keys: name, params, forward_flops, backward_input_flops, backward_weight_flops, activation_bytes, activation_bytes_full, output_bytes, count)",
        ),
        (
            wrap(&format!(
                r#"{ok}, {{"name": "b", "params": 1, "forward_flops": 2, "activation_bytes": 3, "activation_bytes_full": 9, "output_bytes": 4}}"#
            )),
            "model key 'layers[1].activation_bytes_full' = 9 exceeds activation_bytes = 3: full recompute keeps at most what no recompute keeps",
        ),
        (
            wrap(&format!(
                r#"{ok}, {{"name": "b", "count": 0, "params": 1, "forward_flops": 2, "activation_bytes": 3, "output_bytes": 4}}"#
            )),
            "model key 'layers[1].count' must be at least 1",
        ),
        (
            wrap(
                r#"{"name": "", "params": 1, "forward_flops": 2, "activation_bytes": 3, "output_bytes": 4}"#,
            ),
            "model key 'layers[0].name' must not be empty",
        ),
        (
            wrap(""),
            "model key 'layers' is empty: list at least one layer",
        ),
        (
            format!(r#"{{"name": "n", "layers": [{ok}]}}"#),
            "model key 'seq_length' is required but missing: add it",
        ),
        (
            format!(r#"{{"name": "n", "seq_length": 16, "layer_count": 3, "layers": [{ok}]}}"#),
            "model key 'layer_count' is not a known key: remove it or fix its spelling (valid keys: name, seq_length, global_batch_size, layers)",
        ),
        (
            r#"{"name": "n", "seq_length": 16, "layers": {"a": 1}}"#.to_string(),
            "model key 'layers' must be a JSON array [ ... ] (got {\"a\":1})",
        ),
    ];
    for (json, expected) in cases {
        let e = load_str(&json, "list.json").unwrap_err().to_string();
        assert_eq!(e, expected);
        assert!(!e.contains('\n'));
    }
}
