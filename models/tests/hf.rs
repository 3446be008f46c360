//! Hugging Face `config.json` loading: one realistic fixture per family, checked against the
//! parameter count the library reports for that checkpoint.

use autopp_models::{
    load, load_file, load_str, Model, Norm, PositionEmbedding, ShardSpec, TransformerSpec,
};

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/hf/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn spec(name: &str) -> TransformerSpec {
    match load_file(&fixture(name)).unwrap() {
        Model::Transformer(t) => t,
        Model::Layers(_) => panic!("a config.json loads as a transformer"),
    }
}

/// Expands without error at a few shardings (the config maps onto a usable spec).
fn expands(t: &TransformerSpec) {
    for tp in [1, 2, 4] {
        let shard = ShardSpec {
            tp,
            ..ShardSpec::default()
        };
        let layers = t.layers(&shard).unwrap();
        assert_eq!(layers.len() as u64, t.num_layers + 2);
    }
}

#[test]
fn llama_2_7b() {
    let t = spec("llama-2-7b");
    assert_eq!(t.name, "meta-llama/Llama-2-7b-hf");
    assert_eq!(
        (
            t.num_layers,
            t.hidden_size,
            t.num_attention_heads,
            t.kv_heads(),
            t.ffn()
        ),
        (32, 4096, 32, 32, 11008)
    );
    assert_eq!((t.vocab_size, t.seq_length), (32000, 4096));
    assert!(t.gated_mlp && !t.tied_embeddings && !t.bias && !t.has_qkv_bias() && !t.dropout);
    assert_eq!(t.norm, Norm::Rmsnorm);
    assert_eq!(t.position_embedding, PositionEmbedding::None);
    // transformers reports 6,738,415,616 parameters for LlamaForCausalLM
    assert_eq!(t.num_params(), 6_738_415_616);
    expands(&t);
}

#[test]
fn llama_3_1_8b_uses_the_pre_training_context() {
    let t = spec("llama-3.1-8b");
    // max_position_embeddings is 131072; rope_scaling.original_max_position_embeddings is 8192
    assert_eq!(t.seq_length, 8192);
    assert_eq!(t.kv_heads(), 8);
    assert_eq!(t.num_params(), 8_030_261_248);
    // the same shape as the llama3-8b preset
    let Model::Transformer(preset) = load("llama3-8b").unwrap() else {
        panic!()
    };
    assert_eq!(t.layer_params(), preset.layer_params());
    assert_eq!(t.num_params(), preset.num_params());
    // the directory-less fixture takes its name from the file
    assert_eq!(t.name, "llama-3.1-8b");
    expands(&t);
}

#[test]
fn mistral_7b() {
    let t = spec("mistral-7b");
    assert_eq!((t.kv_heads(), t.ffn(), t.seq_length), (8, 14336, 32768));
    assert_eq!(t.num_params(), 7_241_732_096);
    expands(&t);
    // plan it at the 8192 tokens it was trained on
    let m = load_file(&fixture("mistral-7b"))
        .unwrap()
        .with_seq_length(8192)
        .unwrap();
    assert_eq!(m.seq_length(), 8192);
    assert_eq!(m.num_params(), 7_241_732_096);
}

#[test]
fn qwen2_7b_counts_its_qkv_biases() {
    let t = spec("qwen2-7b");
    assert_eq!(t.qkv_bias, Some(true));
    assert!(!t.bias);
    assert_eq!(
        (t.num_attention_heads, t.kv_heads(), t.ffn()),
        (28, 4, 18944)
    );
    // 3584 + 2·512 QKV bias per layer; transformers reports 7,615,616,512
    assert_eq!(t.num_params(), 7_615_616_512);
    let mut no_bias = t.clone();
    no_bias.qkv_bias = None;
    assert_eq!(t.num_params() - no_bias.num_params(), 28 * (3584 + 2 * 512));
    expands(&TransformerSpec {
        seq_length: 4096,
        ..t
    });
}

#[test]
fn gpt2() {
    let t = spec("gpt2");
    assert_eq!(
        (t.num_layers, t.hidden_size, t.num_attention_heads, t.ffn()),
        (12, 768, 12, 3072)
    );
    assert_eq!(t.position_embedding, PositionEmbedding::Learned);
    assert_eq!(t.position_table_rows(), 1024);
    assert!(t.tied_embeddings && t.bias && t.dropout);
    assert_eq!(t.norm, Norm::Layernorm);
    // GPT2LMHeadModel: 124,439,808 parameters
    assert_eq!(t.num_params(), 124_439_808);
    expands(&t);
    // planned at 512 tokens it keeps its 1024-row position table; 2048 is refused
    let m = load_file(&fixture("gpt2")).unwrap();
    assert_eq!(
        m.clone().with_seq_length(512).unwrap().num_params(),
        124_439_808
    );
    assert!(m.with_seq_length(2048).is_err());
}

#[test]
fn a_checkpoint_directory_loads_its_config() {
    let dir = std::env::temp_dir().join(format!("autopp-models-test-{}", std::process::id()));
    let model_dir = dir.join("gpt2-small");
    std::fs::create_dir_all(&model_dir).unwrap();
    std::fs::copy(fixture("gpt2"), model_dir.join("config.json")).unwrap();
    let m = load(model_dir.to_str().unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(m.name(), "gpt2-small");
    assert_eq!(m.num_params(), 124_439_808);
}

#[test]
fn gpt2_family_told_from_keys_alone() {
    let m = load_str(
        r#"{"n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "vocab_size": 100}"#,
        "dir/tiny/config.json",
    )
    .unwrap();
    assert_eq!(m.name(), "tiny");
    assert_eq!(m.seq_length(), 128);
}

#[test]
fn gpt_neox_20b() {
    let t = spec("gpt-neox-20b");
    assert_eq!(
        (t.num_layers, t.hidden_size, t.num_attention_heads, t.ffn()),
        (44, 6144, 64, 24576)
    );
    assert!(!t.tied_embeddings && t.bias && !t.dropout);
    assert_eq!(t.position_embedding, PositionEmbedding::None);
    // GPTNeoXForCausalLM: 20,554,567,680 parameters
    assert_eq!(t.num_params(), 20_554_567_680);
    expands(&t);
}

#[test]
fn opt_6_7b() {
    let t = spec("opt-6.7b");
    assert_eq!(t.name, "facebook/opt-6.7b");
    assert_eq!((t.ffn(), t.seq_length), (16384, 2048));
    // OPT's learned positions carry 2 extra rows
    assert_eq!(t.position_table_rows(), 2050);
    assert!(t.tied_embeddings && t.bias && t.dropout);
    // OPTForCausalLM: 6,658,473,984 parameters
    assert_eq!(t.num_params(), 6_658_473_984);
    expands(&t);
}

#[test]
fn bloom_560m_and_176b() {
    let t = spec("bloom-560m");
    assert_eq!(
        (t.num_layers, t.hidden_size, t.num_attention_heads),
        (24, 1024, 16)
    );
    assert_eq!(t.seq_length, 2048); // BLOOM configs record none: the documented default
    assert_eq!(t.position_embedding, PositionEmbedding::None);
    assert!(t.tied_embeddings && !t.dropout);
    // BloomForCausalLM: 559,214,592 parameters, less the embedding LayerNorm (2h) not modelled
    assert_eq!(t.num_params(), 559_214_592 - 2 * 1024);
    expands(&t);

    let big = spec("bloom-176b");
    let Model::Transformer(preset) = load("bloom-176b").unwrap() else {
        panic!()
    };
    assert_eq!(big.num_params(), preset.num_params());
    assert_eq!(big.num_params(), 176_247_271_424 - 2 * 14336);
}

#[test]
fn unsupported_and_broken_configs_name_the_key() {
    let cases = [
        (
            r#"{"model_type": "falcon", "num_hidden_layers": 32}"#,
            "model key 'model_type' = \"falcon\" is not supported: autopp reads llama, mistral, qwen2, gpt2, gpt_neox, opt, bloom, qwen3, qwen3_moe, mixtral, deepseek_v2, deepseek_v3, gpt_oss configs; describe other models in an autopp model.json",
        ),
        (
            r#"{"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
                "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096}"#,
            "model key 'num_hidden_layers' is missing from this Hugging Face llama config: add it",
        ),
        (
            r#"{"model_type": "gpt2", "n_layer": 12, "n_embd": -768, "n_head": 12,
                "n_positions": 1024, "vocab_size": 50257}"#,
            "model key 'n_embd' must be a positive whole number, but is negative (-768)",
        ),
        (
            r#"{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 0,
                "n_positions": 1024, "vocab_size": 50257}"#,
            "model key 'n_head' must be at least 1",
        ),
        (
            r#"{"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
                "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 4096,
                "num_local_experts": 8, "num_experts_per_tok": 2}"#,
            "model key 'num_hidden_layers' is missing from this Hugging Face mixtral config: add it",
        ),
        (
            r#"{"model_type": "opt", "num_hidden_layers": 24, "hidden_size": 1024,
                "num_attention_heads": 16, "ffn_dim": 4096, "max_position_embeddings": 2048,
                "vocab_size": 50272, "word_embed_proj_dim": 512}"#,
            "model key 'word_embed_proj_dim' = 512 differs from hidden_size = 1024: OPT's projected embeddings (OPT-350m) are not supported; describe this model with an explicit layer list",
        ),
        (
            r#"{"model_type": "bloom", "n_layer": 2, "n_head": 4, "vocab_size": 100}"#,
            "model key 'hidden_size' is missing from this Hugging Face bloom config (or n_embed): add it",
        ),
        (
            r#"{"architectures": ["FalconForCausalLM"], "num_hidden_layers": 2}"#,
            "model key 'architectures' = [\"FalconForCausalLM\"] is not supported: autopp reads llama, mistral, qwen2, gpt2, gpt_neox, opt, bloom, qwen3, qwen3_moe, mixtral, deepseek_v2, deepseek_v3, gpt_oss configs",
        ),
        (
            r#"{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                "num_attention_heads": 4, "intermediate_size": 128, "vocab_size": 100,
                "max_position_embeddings": 128, "tie_word_embeddings": "yes"}"#,
            "model key 'tie_word_embeddings' must be true or false (got \"yes\")",
        ),
    ];
    for (json, expected) in cases {
        let e = load_str(json, "config.json").unwrap_err().to_string();
        assert_eq!(e, expected);
        assert!(!e.contains('\n'));
    }
}
