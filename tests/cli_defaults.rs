//! The defaults a newcomer meets with a real Hugging Face config (issue #21): a long maximum
//! context is trained at 8192 tokens, a missing batch becomes about 4M tokens, each said on
//! stderr with the flag that changes it; `--seq-len` on every command that reads a model.

mod common;

use common::autopp;

const QWEN_72B: &str = "tests/fixtures/hf-configs/qwen2.5-72b.json";

/// The words of a command line.
fn words(line: &str) -> Vec<&str> {
    line.split(' ').collect()
}

/// Runs a command that must succeed; its JSON output and its stderr.
fn run_ok(args: &[&str]) -> (serde_json::Value, String) {
    let out = autopp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{args:?}: {stderr}");
    let json = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    (json, stderr)
}

#[test]
fn a_long_context_config_trains_at_8192_tokens_and_4m_token_batches_with_notes() {
    let (json, stderr) = run_ok(&words(&format!(
        "estimate {QWEN_72B} --gpus 64 --tp 8 --pp 4 --json"
    )));
    assert!(
        stderr.contains("training at 8,192 tokens per sequence, not the model's 131,072-token maximum context; change it with --seq-len"),
        "{stderr}"
    );
    assert!(
        stderr.contains("global batch 512 sequences (4,194,304 tokens), as the model names none; change it with --global-batch"),
        "{stderr}"
    );
    assert_eq!(json["plan"]["global_batch_size"], 512, "{json}");
    assert_eq!(json["plan"]["num_microbatches"], 256, "{json}");
    // at 131k tokens per sequence it needed 1,123 GiB per GPU; at 8k about 116
    let peak = json["predicted"]["peak_memory_bytes"].as_f64().unwrap();
    assert!(peak < 200.0 * (1u64 << 30) as f64, "{json}");
}

#[test]
fn seq_len_and_global_batch_flags_silence_the_notes() {
    let (json, stderr) = run_ok(&words(&format!(
        "estimate {QWEN_72B} --gpus 64 --tp 8 --pp 4 --seq-len 4096 --global-batch 256 --json"
    )));
    assert!(!stderr.contains("note:"), "{stderr}");
    assert_eq!(json["plan"]["global_batch_size"], 256, "{json}");
    // the batch at the flag's length: 256 × 4096 tokens
    let tokens_per_s = json["predicted"]["tokens_per_s"].as_f64().unwrap();
    let t = json["predicted"]["iteration_time_s"].as_f64().unwrap();
    assert!((tokens_per_s * t - 256.0 * 4096.0).abs() < 1.0, "{json}");
}

#[test]
fn presets_keep_their_published_length_and_batch_without_notes() {
    let (json, stderr) = run_ok(&words(
        "estimate gpt3-175b --gpus 1024 --tp 8 --pp 16 --json",
    ));
    assert!(!stderr.contains("note:"), "{stderr}");
    assert_eq!(json["plan"]["global_batch_size"], 1536, "{json}");
}

#[test]
fn plan_uses_the_same_defaults() {
    let (json, stderr) = run_ok(&words(&format!("plan {QWEN_72B} --gpus 64 --json")));
    assert!(stderr.contains("change it with --seq-len"), "{stderr}");
    assert!(stderr.contains("change it with --global-batch"), "{stderr}");
    assert_eq!(json["plan"]["global_batch_size"], 512, "{json}");
}

#[test]
fn seq_len_is_on_every_command_that_reads_a_model() {
    for command in ["estimate", "plan", "exec", "profile"] {
        let out = autopp(&[command, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains("--seq-len"), "{command} --help: {help}");
    }
    // a zero length is one line naming the flag
    let line = one_line_error("estimate llama3-8b --gpus 8 --seq-len 0");
    assert!(line.starts_with("error: --seq-len"), "{line}");
}

#[test]
fn a_zero_global_batch_names_the_flag() {
    let line = one_line_error("estimate llama3-8b --gpus 8 --global-batch 0");
    assert!(line.starts_with("error: --global-batch"), "{line}");
}

/// Runs a command line that must fail with exit 2 and one line on stderr; that line.
fn one_line_error(line: &str) -> String {
    let out = autopp(&words(line));
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{line}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{line}: {stderr}");
    stderr
}
