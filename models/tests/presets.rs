//! Every bundled preset loads, has its published shape and batch, and is documented.

use autopp_models::presets::{preset, preset_names};
use autopp_models::{load, presets, Model, ShardSpec, TransformerSpec};

fn spec(name: &str) -> TransformerSpec {
    match load(name).unwrap() {
        Model::Transformer(t) => t,
        Model::Layers(_) => panic!("{name} is a transformer preset"),
    }
}

#[test]
fn every_preset_loads_and_expands() {
    assert_eq!(presets().len(), 24);
    for p in presets() {
        let m = load(p.name).unwrap();
        assert_eq!(m.name(), p.name, "a preset's name matches its file");
        assert!(m.default_global_batch().is_some(), "{}", p.name);
        assert!(!p.description.is_empty() && !p.description.contains('\n'));
        let tp = if p.name == "tiny-gpt" { 4 } else { 8 };
        let layers = m
            .layers(&ShardSpec {
                tp,
                sequence_parallel: true,
                ..ShardSpec::default()
            })
            .unwrap();
        assert_eq!(layers.len(), m.num_layer_entries());
    }
    assert_eq!(
        preset_names(),
        "gpt3-175b, megatron-1t, mt-nlg-530b, bloom-176b, opt-175b, llama2-70b, llama3-8b, \
         llama3-70b, llama3-405b, llama2-7b, llama2-13b, gpt3-5b, gpt3-20b, nemotron3-8b, \
         nemotron3-22b, nemotron4-340b, deepseek-v3, qwen3-235b-a22b, qwen3-30b-a3b, qwen3-32b, \
         mixtral-8x7b, mixtral-8x22b, gpt-oss-120b, tiny-gpt"
    );
    assert!(preset("tiny-gpt").is_some() && preset("Tiny-GPT").is_none());
}

/// A preset's expected shape: name, L, h, a, g, f, V, s, global batch, billions of parameters.
type Row = (&'static str, u64, u64, u64, u64, u64, u64, u64, u64, f64);

#[test]
fn published_shapes_and_batches() {
    // (name, L, h, a, g, f, V, s, global batch, billions of parameters to one decimal)
    let table: [Row; 9] = [
        (
            "gpt3-175b",
            96,
            12288,
            96,
            96,
            49152,
            50257,
            2048,
            1536,
            174.6,
        ),
        (
            "megatron-1t",
            128,
            25600,
            160,
            160,
            102400,
            51200,
            2048,
            3072,
            1008.0,
        ),
        (
            "mt-nlg-530b",
            105,
            20480,
            128,
            128,
            81920,
            50257,
            2048,
            1920,
            529.6,
        ),
        (
            "bloom-176b",
            70,
            14336,
            112,
            112,
            57344,
            250880,
            2048,
            2048,
            176.2,
        ),
        (
            "opt-175b", 96, 12288, 96, 96, 49152, 50272, 2048, 1024, 174.6,
        ),
        (
            "llama2-70b",
            80,
            8192,
            64,
            8,
            28672,
            32000,
            4096,
            1024,
            69.0,
        ),
        ("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 512, 8.0),
        (
            "llama3-70b",
            80,
            8192,
            64,
            8,
            28672,
            128256,
            8192,
            512,
            70.6,
        ),
        (
            "llama3-405b",
            126,
            16384,
            128,
            8,
            53248,
            128256,
            8192,
            2048,
            405.9,
        ),
    ];
    for (name, l, h, a, g, f, v, s, batch, billions) in table {
        let t = spec(name);
        assert_eq!(
            (
                t.num_layers,
                t.hidden_size,
                t.num_attention_heads,
                t.kv_heads(),
                t.ffn(),
                t.vocab_size,
                t.seq_length,
                t.global_batch_size
            ),
            (l, h, a, g, f, v, s, Some(batch)),
            "{name}"
        );
        let got = (t.num_params() as f64 / 1e8).round() / 10.0;
        assert_eq!(got, billions, "{name}: {}", t.num_params());
    }
}

#[test]
fn consistent_with_the_calibration_rows() {
    // Narayanan et al. 2021 Table 1 lists these models as 174.6 B ("GPT 174.6B", V 51200),
    // 529.6 B and 1008.0 B; with the padded vocabulary 51200 the counts agree to 0.1 B.
    for (name, published) in [
        ("gpt3-175b", 174.6),
        ("mt-nlg-530b", 529.6),
        ("megatron-1t", 1008.0),
    ] {
        let mut t = spec(name);
        t.vocab_size = 51200;
        assert_eq!(
            (t.num_params() as f64 / 1e8).round() / 10.0,
            published,
            "{name}"
        );
    }
}

#[test]
fn llama_presets_are_llama_shaped() {
    for name in ["llama2-70b", "llama3-8b", "llama3-70b", "llama3-405b"] {
        let t = spec(name);
        assert!(
            t.gated_mlp && !t.tied_embeddings && !t.bias && !t.dropout,
            "{name}"
        );
    }
}

#[test]
fn tiny_gpt_is_small_and_as_specified() {
    let t = spec("tiny-gpt");
    assert_eq!(
        (
            t.num_layers,
            t.hidden_size,
            t.num_attention_heads,
            t.seq_length,
            t.vocab_size
        ),
        (8, 128, 4, 128, 1024)
    );
    assert!(!t.gated_mlp && !t.tied_embeddings);
    assert_eq!(t.position_embedding, autopp_models::PositionEmbedding::None);
    assert_eq!(t.global_batch_size, Some(32));
    assert!(t.num_params() < 2_000_000);
}

#[test]
fn presets_readme_lists_every_preset() {
    let readme = include_str!("../presets/README.md");
    for p in presets() {
        assert!(readme.contains(&format!("`{}`", p.name)), "{}", p.name);
    }
}

/// A preset, its parameters by hand, and its published total with the bound on the difference.
type NemoCount = (&'static str, u64, Option<(f64, f64)>);

/// NeMo 24.07's performance models (`models/src/presets.rs` has the sources). Parameters by
/// hand, `P = L·(attention + MLP + norms) + embeddings (+ positions) + final norm`:
/// - Llama 2 7B: `32·(4·4096² + 3·4096·11008 + 2·4096) + 2·32000·4096 + 4096` = 6,738,415,616,
///   the `meta-llama/Llama-2-7b-hf` count; 13B likewise 13,015,864,320 (`-13b-hf`).
/// - GPT-3 5B (tied, biases, learned positions): `24·(12·4096² + 13·4096) + 50257·4096 +
///   2048·4096 + 2·4096` = 5,047,365,632; 20B: `44·(12·6144² + 13·6144) + 50257·6144 +
///   2048·6144 + 2·6144` = 20,256,221,184. NeMo publishes only the names' "5B" and "20B"
///   (0.9% and 1.3% off).
/// - Nemotron-3 8B (MHA, squared ReLU, LayerNorm with bias, no linear biases):
///   `32·(4·4096² + 2·4096·16384 + 4·4096) + 2·256000·4096 + 2·4096` = 8,540,135,424; 22B:
///   `40·(4·6144² + 2·6144·24576 + 4·6144) + 2·256000·6144 + 2·6144` = 21,266,116,608. No
///   exact totals are published (the names are nominal).
/// - Nemotron-4 340B (8 KV groups of 192): `96·(2·18432² + 2·18432·1536 + 2·18432·73728 +
///   4·18432) + 2·256000·18432 + 2·18432` = 341,029,195,776: the technical report's "340B"
///   within 0.5% (0.3%).
#[test]
fn nemo_presets_have_their_published_parameter_counts() {
    // (name, by hand, published total and the bound on the difference)
    let table: [NemoCount; 7] = [
        ("llama2-7b", 6_738_415_616, Some((6_738_415_616.0, 0.0))),
        ("llama2-13b", 13_015_864_320, Some((13_015_864_320.0, 0.0))),
        ("gpt3-5b", 5_047_365_632, Some((5e9, 0.01))),
        ("gpt3-20b", 20_256_221_184, Some((20e9, 0.013))),
        ("nemotron3-8b", 8_540_135_424, None),
        ("nemotron3-22b", 21_266_116_608, None),
        ("nemotron4-340b", 341_029_195_776, Some((340e9, 0.005))),
    ];
    for (name, hand, published) in table {
        let got = spec(name).num_params();
        assert_eq!(got, hand, "{name}");
        if let Some((total, bound)) = published {
            let off = (got as f64 - total).abs() / total;
            assert!(off <= bound, "{name}: {got} vs {total} ({off})");
        }
    }
    for name in ["nemotron3-8b", "nemotron3-22b", "nemotron4-340b"] {
        let t = spec(name);
        assert!(
            !t.gated_mlp && !t.tied_embeddings && !t.bias && !t.dropout,
            "{name}"
        );
    }
}

/// Every preset's distinct layers, each put at its places, are the model's layers (names
/// apart), under sharded and MoE shardings; alternating models keep one block per kind.
#[test]
fn distinct_layers_expand_to_the_layers() {
    let mut compared = 0;
    for p in presets() {
        let m = load(p.name).unwrap();
        let tp = if p.name == "tiny-gpt" { 4 } else { 8 };
        let moe = matches!(&m, Model::Transformer(t) if t.moe.is_some());
        for shard in [
            ShardSpec::default(),
            ShardSpec {
                tp,
                sequence_parallel: true,
                ep: if moe { 8 } else { 1 },
                micro_batch_size: 2,
                ..ShardSpec::default()
            },
        ] {
            let Ok(layers) = m.layers(&shard) else {
                continue;
            };
            let (distinct, slot) = m.distinct_layers(&shard).unwrap();
            assert_eq!(slot.len(), layers.len(), "{}", p.name);
            for (layer, &j) in layers.iter().zip(&slot) {
                let mut d = distinct[j].clone();
                d.name.clone_from(&layer.name);
                assert_eq!(&d, layer, "{}", p.name);
            }
            // at most embedding, four block kinds, the MTP layer and the head
            assert!(distinct.len() <= 7, "{}: {}", p.name, distinct.len());
            compared += 1;
        }
    }
    assert!(
        compared >= 2 * presets().len() - 2,
        "{compared} shardings compared"
    );
    let (distinct, slot) = load("gpt-oss-120b")
        .unwrap()
        .distinct_layers(&ShardSpec::default())
        .unwrap();
    assert_eq!((distinct.len(), slot.len()), (4, 38));
}
