//! Qwen3-style attention (qk-norm, a head size of its own) launched as a user runs it: on
//! torchtitan through its own Qwen3 classes — its `qwen3_32b` config, or autopp's module from
//! the plan's sizes — and on Megatron-LM with Qwen3's RoPE base and norm ε.

mod common;

use std::path::{Path, PathBuf};

use common::launch::*;
use serde_json::Value;

/// `tests/launch/qwen3-8b.json` with `fields` changed, as DIR/NAME.json named NAME.
fn qwen3_8b_with(dir: &Path, name: &str, fields: &[(&str, Value)]) -> PathBuf {
    let text = std::fs::read_to_string("tests/launch/qwen3-8b.json").expect("read");
    let mut model: Value = serde_json::from_str(&text).expect("JSON");
    for (k, v) in fields {
        model[*k] = v.clone();
    }
    model["name"] = name.into();
    let path = dir.join(format!("{name}.json"));
    std::fs::write(&path, model.to_string()).expect("write");
    path
}

/// Qwen3-32B made for torchtitan runs torchtitan's own `qwen3_32b`; past the 40,960 positions of
/// its RoPE table the launch builds the model itself, with the table the plan needs.
#[test]
fn qwen3_32b_launches_on_torchtitan_with_its_own_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let p = plan(d, "q32", "qwen3-32b --gpus 32 --framework torchtitan");
    let (args, files) = launched(&p, "torchtitan");
    has(&args, &["--module", "qwen3", "--config", "qwen3_32b"]);
    assert!(files.get("autopp_torchtitan.py").is_none(), "{files}");
    let long = plan(
        d,
        "q32-long",
        "qwen3-32b --gpus 64 --seq-len 65536 --global-batch 64 --framework torchtitan",
    );
    let (args, files) = launched(&long, "torchtitan");
    has(
        &args,
        &["--module", "autopp_torchtitan", "--config", "autopp_model"],
    );
    let module = files["autopp_torchtitan.py"].as_str().expect("module text");
    for line in ["SEQ_LEN = 65536", "HEAD_DIM = 128", "ROPE_THETA = 1000000"] {
        assert!(module.contains(line), "{line} not in {module}");
    }
}

/// A Qwen3 shape torchtitan ships no config for (Qwen3-8B's) gets autopp's module: the model
/// built by `_build_qwen3_layers` with the plan's sizes, qk-norm, Qwen3's RoPE base and ε.
#[test]
fn a_qwen3_shape_torchtitan_does_not_ship_gets_autopps_module() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = plan(
        dir.path(),
        "q8",
        "tests/launch/qwen3-8b.json --gpus 16 --framework torchtitan",
    );
    let (args, files) = launched(&p, "torchtitan");
    has(
        &args,
        &["--module", "autopp_torchtitan", "--config", "autopp_model"],
    );
    let module = files["autopp_torchtitan.py"].as_str().expect("module text");
    for line in [
        "_build_qwen3_layers(",
        "Qwen3Model.Config(",
        "N_LAYERS = 36",
        "DIM = 4096",
        "N_HEADS = 32",
        "N_KV_HEADS = 8",
        "HEAD_DIM = 128",
        "FFN_HIDDEN_DIM = 12288",
        "VOCAB_SIZE = 151936",
        "ROPE_THETA = 1000000",
        "NORM_EPS = 1e-6",
        "layer.attention.qk_norm.eps = NORM_EPS",
    ] {
        assert!(module.contains(line), "{line} not in {module}");
    }
    assert!(!module.contains('@'), "a key left unfilled: {module}");
}

/// Megatron-LM trains Qwen3 with its RoPE base (1,000,000) and RMSNorm ε (1e-6), not Megatron's
/// defaults (10,000 and 1e-5); a Llama model keeps the default ε, no flag.
#[test]
fn qwen3_on_megatron_has_its_rope_base_and_norm_epsilon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let q = plan(d, "q32", "qwen3-32b --gpus 32 --framework megatron");
    let (args, _) = launched(&q, "megatron");
    has(&args, &["--rotary-base", "1000000"]);
    has(&args, &["--norm-epsilon", "1e-6"]);
    has(&args, &["--qk-layernorm"]);
    let l = plan(d, "l8", "llama3-8b --gpus 8 --framework megatron");
    let (args, _) = launched(&l, "megatron");
    has(&args, &["--rotary-base", "500000"]);
    assert!(!args.iter().any(|a| a == "--norm-epsilon"), "{args:?}");
}

/// A head size apart from hidden / heads without qk-norm is neither Llama 3's nor Qwen3's: one
/// line naming it, for the plan made for torchtitan and for the launch.
#[test]
fn a_head_size_without_qk_norm_is_refused_for_torchtitan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // 32 heads of 96 over a hidden size of 4096
    let path = qwen3_8b_with(
        d,
        "narrow-heads",
        &[("qk_norm", false.into()), ("head_dim", 96.into())],
    );
    let m = path.to_str().expect("UTF-8");
    plan_refused(
        &format!("{m} --gpus 16 --framework torchtitan"),
        "a head size apart from hidden / heads without Qwen3's qk-norm",
    );
    let p = plan(d, "narrow", &format!("{m} --gpus 16 --framework megatron"));
    fails(
        &p,
        &["--framework", "torchtitan"],
        &[
            "--framework torchtitan:",
            "without Qwen3's qk-norm",
            // DeepSpeed gets no head size of its own either: megatron alone is offered
            "re-plan with --framework megatron",
        ],
    );
    let out = common::autopp(&[
        "launch",
        p.to_str().expect("UTF-8"),
        "--framework",
        "torchtitan",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("deepspeed"), "{err}");
}

/// torchtitan ships `qwen3_14b` too: a model of its shape (40 × 5120, 40 heads of 128, 8
/// key/value heads, FFN 17408) runs it; Llama 3 8B at 262,144 tokens, past the 131,072
/// positions of `llama3_8b`'s RoPE table, gets autopp's module with a table as long.
#[test]
fn shipped_configs_are_chosen_by_shape_and_rope_table() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let path = qwen3_8b_with(
        d,
        "qwen3-14b",
        &[
            ("num_layers", 40.into()),
            ("hidden_size", 5120.into()),
            ("num_attention_heads", 40.into()),
            ("ffn_hidden_size", 17408.into()),
        ],
    );
    let m = path.to_str().expect("UTF-8");
    let p = plan(d, "q14", &format!("{m} --gpus 16 --framework torchtitan"));
    let (args, files) = launched(&p, "torchtitan");
    has(&args, &["--module", "qwen3", "--config", "qwen3_14b"]);
    assert!(files.get("autopp_torchtitan.py").is_none(), "{files}");
    let long = plan(
        d,
        "l8-long",
        "llama3-8b --gpus 64 --seq-len 262144 --global-batch 16 --framework torchtitan",
    );
    let (args, files) = launched(&long, "torchtitan");
    has(
        &args,
        &["--module", "autopp_torchtitan", "--config", "autopp_model"],
    );
    let module = files["autopp_torchtitan.py"].as_str().expect("module text");
    for line in [
        "_build_llama3_layers(",
        "SEQ_LEN = 262144",
        "ROPE_THETA = 500000",
    ] {
        assert!(module.contains(line), "{line} not in {module}");
    }
}
