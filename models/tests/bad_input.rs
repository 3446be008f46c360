//! Bad input gives one clear line naming the key and the fix — never a panic.

use autopp_models::{load, load_file, load_str, ModelError, ShardSpec};

const GOOD: &str = r#"{
  "name": "m",
  "num_layers": 4,
  "hidden_size": 256,
  "num_attention_heads": 8,
  "vocab_size": 1000,
  "seq_length": 128
}"#;

/// `GOOD` with `key` set to the raw JSON `value` (or removed when `value` is empty).
fn with(key: &str, value: &str) -> String {
    let mut object: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(GOOD).unwrap();
    if value.is_empty() {
        object.remove(key);
    } else {
        object.insert(key.to_string(), serde_json::from_str(value).unwrap());
    }
    serde_json::to_string_pretty(&object).unwrap()
}

fn error(json: &str) -> String {
    let e = load_str(json, "model.json").unwrap_err().to_string();
    assert!(!e.contains('\n'), "not one line: {e}");
    e
}

#[test]
fn good_input_loads() {
    let m = load_str(GOOD, "model.json").unwrap();
    assert_eq!(m.name(), "m");
    assert_eq!(m.num_layer_entries(), 6);
}

#[test]
fn malformed_json_gives_line_and_column() {
    let e = error("{\n  \"name\": \"m\",\n  \"num_layers\": 4,\n}");
    assert_eq!(
        e,
        "model.json: malformed JSON: trailing comma at line 4 column 1; fix the syntax there"
    );
    let e = error("{\"name\": \"m\" \"num_layers\": 4}");
    assert_eq!(
        e,
        "model.json: malformed JSON: expected `,` or `}` at line 1 column 14; fix the syntax there"
    );
    let e = error("");
    assert_eq!(
        e,
        "model.json: malformed JSON: EOF while parsing a value at line 1 column 0; fix the syntax there"
    );
    let e = error("[]");
    assert_eq!(
        e,
        "model.json: expected a JSON object { ... } at the top level, found an array"
    );
}

#[test]
fn missing_key() {
    for key in [
        "name",
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "seq_length",
    ] {
        assert_eq!(
            error(&with(key, "")),
            format!("model key '{key}' is required but missing: add it")
        );
    }
}

#[test]
fn unknown_key_is_named_with_the_valid_keys() {
    let e = error(&with("hiden_size", "256"));
    assert_eq!(
        e,
        "model key 'hiden_size' is not a known key: remove it or fix its spelling (valid keys: \
         name, num_layers, hidden_size, num_attention_heads, num_kv_heads, ffn_hidden_size, \
         vocab_size, seq_length, gated_mlp, tied_embeddings, global_batch_size, bias, norm, \
         position_embedding, dropout, max_position_embeddings, qkv_bias, head_dim, qk_norm, \
         attention_sinks, sliding_window, sliding_window_pattern, moe, mla, mtp_num_layers)"
    );
}

#[test]
fn zero_sizes() {
    for key in [
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "ffn_hidden_size",
        "vocab_size",
        "seq_length",
        "global_batch_size",
    ] {
        assert_eq!(
            error(&with(key, "0")),
            format!("model key '{key}' must be at least 1"),
        );
    }
}

#[test]
fn negative_sizes() {
    for key in [
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "ffn_hidden_size",
        "vocab_size",
        "seq_length",
        "global_batch_size",
    ] {
        assert_eq!(
            error(&with(key, "-8")),
            format!("model key '{key}' must be a positive whole number, but is negative (-8)"),
        );
    }
}

#[test]
fn wrong_types_and_values() {
    assert_eq!(
        error(&with("hidden_size", "256.5")),
        "model key 'hidden_size' must be a positive whole number, but is not a whole number (256.5)"
    );
    assert_eq!(
        error(&with("hidden_size", "\"256\"")),
        "model key 'hidden_size' must be a positive whole number, but is a string (\"256\")"
    );
    assert_eq!(
        error(&with("hidden_size", "1e30")),
        "model key 'hidden_size' must be a positive whole number, but is too large (1e+30)"
    );
    assert_eq!(
        error(&with("hidden_size", "1099511627776")),
        "model key 'hidden_size' = 1099511627776 is too large: autopp accepts at most 1048576"
    );
    assert_eq!(
        error(&with("norm", "\"batchnorm\"")),
        "model key 'norm' must be one of layernorm, rmsnorm (got \"batchnorm\")"
    );
    assert_eq!(
        error(&with("gated_mlp", "1")),
        "model key 'gated_mlp' must be true or false (got 1)"
    );
    assert_eq!(
        error(&with("name", "7")),
        "model key 'name' must be a string (got 7)"
    );
    assert_eq!(
        error(&with("name", "\" \"")),
        "model key 'name' must not be empty"
    );
}

#[test]
fn heads_must_divide_hidden() {
    assert_eq!(
        error(&with("num_attention_heads", "3")),
        "model key 'hidden_size' = 256 is not divisible by num_attention_heads = 3: choose a head count that divides the hidden size"
    );
}

#[test]
fn kv_heads_must_divide_heads() {
    assert_eq!(
        error(&with("num_kv_heads", "3")),
        "model key 'num_kv_heads' = 3 does not divide num_attention_heads = 8: choose a key/value head count that divides the head count"
    );
}

#[test]
fn learned_positions_bound_the_sequence() {
    let json = with("position_embedding", "\"learned\"");
    let mut object: serde_json::Value = serde_json::from_str(&json).unwrap();
    object["max_position_embeddings"] = 64.into();
    assert_eq!(
        error(&object.to_string()),
        "model key 'seq_length' = 128 exceeds the 64 learned positions (max_position_embeddings): shorten the sequence"
    );
    assert_eq!(
        error(&with("max_position_embeddings", "256")),
        "model key 'max_position_embeddings' only applies with \"position_embedding\": \"learned\": remove it"
    );
}

#[test]
fn unknown_model_lists_presets() {
    let e = load("gpt-5").unwrap_err();
    assert!(matches!(e, ModelError::UnknownModel { .. }));
    assert_eq!(
        e.to_string(),
        "unknown model 'gpt-5': not a preset (gpt3-175b, megatron-1t, mt-nlg-530b, bloom-176b, \
         opt-175b, llama2-70b, llama3-8b, llama3-70b, llama3-405b, llama2-7b, llama2-13b, \
         gpt3-5b, gpt3-20b, nemotron3-8b, nemotron3-22b, nemotron4-340b, deepseek-v3, \
         qwen3-235b-a22b, qwen3-30b-a3b, qwen3-32b, mixtral-8x7b, mixtral-8x22b, gpt-oss-120b, \
         tiny-gpt) and not a file"
    );
    // presets are case-sensitive
    assert!(matches!(
        load("GPT3-175B").unwrap_err(),
        ModelError::UnknownModel { .. }
    ));
}

#[test]
fn unreadable_file() {
    let e = load_file("/nonexistent/model.json")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("cannot read model file '/nonexistent/model.json': "),
        "{e}"
    );
    assert!(!e.contains('\n'));
}

#[test]
fn bad_sharding_is_an_error_not_a_panic() {
    let m = load_str(GOOD, "model.json").unwrap();
    let cases = [
        (
            ShardSpec {
                tp: 3,
                ..ShardSpec::default()
            },
            "--tp 3 does not divide num_attention_heads = 8: choose a tensor-parallel degree that divides the head count",
        ),
        (
            ShardSpec {
                tp: 0,
                ..ShardSpec::default()
            },
            "--tp must be at least 1",
        ),
        (
            ShardSpec {
                cp: 3,
                ..ShardSpec::default()
            },
            "--cp 3 does not divide seq_length = 128: choose a context-parallel degree that divides it",
        ),
        (
            ShardSpec {
                micro_batch_size: (1 << 20) + 1,
                ..ShardSpec::default()
            },
            "--mbs = 1048577 is too large: at most 1048576",
        ),
    ];
    for (shard, expected) in cases {
        assert_eq!(m.layers(&shard).unwrap_err().to_string(), expected);
    }
    // the largest accepted shapes expand without overflow
    let huge = r#"{"name": "huge", "num_layers": 100000, "hidden_size": 1048576,
        "num_attention_heads": 1048576, "ffn_hidden_size": 4194304, "vocab_size": 268435456,
        "seq_length": 67108864}"#;
    let m = load_str(huge, "huge.json").unwrap();
    assert!(m.num_params() > 0);
    let e = m
        .layers(&ShardSpec {
            flash_attention: false,
            ..ShardSpec::default()
        })
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "--mbs 1 with seq_length = 67108864 is too large to count in 64-bit bytes: use a smaller micro-batch or sequence"
    );
}
