//! What `plan` and `estimate` say about their inputs (issue #22): the sequence length and where it
//! comes from, in the batching line and in `--json`; the calibration used and the time to train
//! in `--json`; and `whatif`'s batch flags and search, shared with `plan`.

mod common;

use common::{fails_one_line, stdout};
use serde_json::Value;

const CAL: &str = "tests/fixtures/fuzz/calibration.json";

/// `estimate MODEL --gpus 8 --no-advice EXTRA…`'s text.
fn estimate(model: &str, extra: &[&str]) -> String {
    stdout(&[&["estimate", model, "--gpus", "8", "--no-advice"], extra].concat())
}

/// `estimate MODEL --gpus 8 --no-advice --json EXTRA…`.
fn estimate_json(model: &str, extra: &[&str]) -> Value {
    let text = estimate(model, &[&["--json"], extra].concat());
    serde_json::from_str(&text).expect("JSON")
}

/// The batching line of a report.
fn batching(text: &str) -> &str {
    text.lines()
        .find(|l| l.starts_with("  batching"))
        .expect("a batching line")
}

#[test]
fn the_batching_line_says_where_the_sequence_length_comes_from() {
    // llama3-8b's preset: 512 sequences of 8,192 = 4,194,304 tokens
    let preset = estimate("llama3-8b", &["--tp", "8"]);
    assert!(
        batching(&preset).ends_with(
            "global batch 512 (4,194,304 tokens of 8,192 per sequence, from the preset)"
        ),
        "{preset}"
    );
    // 512 × 4,096 = 2,097,152
    let flag = estimate("llama3-8b", &["--tp", "8", "--seq-len", "4096"]);
    assert!(
        batching(&flag).ends_with("(2,097,152 tokens of 4,096 per sequence, from --seq-len)"),
        "{flag}"
    );
    // Llama 2's config: max_position_embeddings 4096; no batch named: 2^22 / 4,096 = 1,024
    let hf = estimate("tests/fixtures/hf-configs/llama2-7b.json", &["--tp", "8"]);
    assert!(
        batching(&hf).ends_with(
            "(4,194,304 tokens of 4,096 per sequence, from the model file's max_position_embeddings)"
        ),
        "{hf}"
    );
    // Llama 3.1: pre-trained at rope_scaling's 8,192 (max_position_embeddings is 131,072)
    let rope = estimate("tests/fixtures/hf-configs/llama3.1-8b.json", &["--tp", "8"]);
    assert!(
        batching(&rope).ends_with(
            "of 8,192 per sequence, from the model file's rope_scaling.original_max_position_embeddings)"
        ),
        "{rope}"
    );
    // Qwen2.5: 131,072 positions and nothing shorter: capped at 8,192
    let capped = estimate("tests/fixtures/hf-configs/qwen2.5-7b.json", &["--tp", "4"]);
    assert!(
        batching(&capped).ends_with(
            "of 8,192 per sequence, from the default cap of 8,192, not the model's 131,072)"
        ),
        "{capped}"
    );
    let lines = [&preset, &flag, &hf, &rope, &capped].map(|t| batching(t));
    insta::assert_snapshot!("batching_lines_by_seq_len_source", lines.join("\n"));
}

#[test]
fn json_records_the_batch_and_the_sequence_lengths_source() {
    let cases: [(&str, &[&str], u64, &str, Value); 4] = [
        ("llama3-8b", &[], 8192, "preset", Value::Null),
        (
            "llama3-8b",
            &["--seq-len", "2048"],
            2048,
            "flag",
            Value::Null,
        ),
        (
            "tests/fixtures/hf-configs/llama2-7b.json",
            &[],
            4096,
            "model_file",
            "max_position_embeddings".into(),
        ),
        (
            "tests/fixtures/hf-configs/qwen2.5-7b.json",
            &[],
            8192,
            "default",
            Value::Null,
        ),
    ];
    for (model, extra, seq, source, field) in cases {
        // Qwen2.5-7B has 28 heads: tp 4
        let v = estimate_json(model, &[&["--tp", "4"], extra].concat());
        let b = &v["batch"];
        assert_eq!(b["seq_len"], seq, "{model} {extra:?}: {b}");
        assert_eq!(b["seq_len_source"], source, "{model} {extra:?}: {b}");
        assert_eq!(b["seq_len_field"], field, "{model} {extra:?}: {b}");
        let g = b["global_batch"].as_u64().expect("sequences");
        assert_eq!(b["global_batch_tokens"], g * seq, "{b}");
        assert_eq!(v["plan"]["global_batch_size"], g, "{v}");
    }
}

#[test]
fn plan_json_records_inputs_and_estimate_of_a_plan_file_says_so() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("plan.json");
    let path = path.to_str().expect("UTF-8 path");
    let text = stdout(&["plan", "tiny-gpt", "--gpus", "8", "--json", "--out", path]);
    let v: Value = serde_json::from_str(&text).expect("JSON");
    // tiny-gpt: 32 sequences of 128 tokens = 4,096
    assert_eq!(v["batch"]["seq_len"], 128, "{v}");
    assert_eq!(v["batch"]["seq_len_source"], "preset", "{v}");
    assert_eq!(v["batch"]["global_batch_tokens"], 4096, "{v}");
    assert_eq!(v["calibration"], Value::Null, "{v}");
    assert_eq!(v["time_to_train"], Value::Null, "{v}");
    // the keys plan --json had before stay
    for key in [
        "plan",
        "predicted",
        "made_for",
        "runs_on",
        "search",
        "alternatives",
    ] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
    let again = stdout(&["estimate", "--plan", path, "--no-advice"]);
    assert!(
        batching(&again).ends_with("of 128 per sequence, from the plan file)"),
        "{again}"
    );
    let args = ["estimate", "--plan", path, "--no-advice", "--json"];
    let v: Value = serde_json::from_str(&stdout(&args)).expect("JSON");
    assert_eq!(v["batch"]["seq_len_source"], "plan_file", "{v}");
}

#[test]
fn json_records_the_calibration_used() {
    for cmd in ["plan", "estimate"] {
        let args = [
            cmd,
            "tiny-gpt",
            "--gpus",
            "8",
            "--json",
            "--calibration",
            CAL,
        ];
        let v: Value = serde_json::from_str(&stdout(&args)).expect("JSON");
        let c = &v["calibration"];
        assert_eq!(c["file"], CAL, "{cmd}: {c}");
        // the fixture was fitted on 3 runs
        assert_eq!(c["runs"], 3, "{cmd}: {c}");
        assert_eq!(c["run_ids"].as_array().map(Vec::len), Some(3), "{cmd}: {c}");
        assert!(c["efficiency"]["gemm_max"].as_f64().is_some(), "{cmd}: {c}");
    }
}

#[test]
fn json_records_the_time_to_train() {
    for cmd in ["plan", "estimate"] {
        let args = [
            cmd,
            "llama3-8b",
            "--gpus",
            "64",
            "--json",
            "--train-tokens",
            "1T",
            "--price",
            "2.5",
        ];
        let v: Value = serde_json::from_str(&stdout(&args)).expect("JSON");
        let t = &v["time_to_train"];
        let tokens_per_s = v["predicted"]["tokens_per_s"].as_f64().expect("tokens/s");
        // days = 1e12 / tokens_per_s / 86,400; GPU-hours = days × 24 × 64; cost = GPU-hours × 2.5
        let days = 1e12 / tokens_per_s / 86_400.0;
        let num = |k: &str| t[k].as_f64().unwrap_or_else(|| panic!("{cmd}: {k} in {t}"));
        assert_eq!(num("tokens"), 1e12, "{cmd}: {t}");
        assert!((num("days") / days - 1.0).abs() < 1e-9, "{cmd}: {t}");
        assert!((num("gpu_hours") / (days * 24.0 * 64.0) - 1.0).abs() < 1e-9);
        assert_eq!(num("price_usd_per_gpu_hour"), 2.5, "{cmd}: {t}");
        assert!((num("cost_usd") / (num("gpu_hours") * 2.5) - 1.0).abs() < 1e-12);
    }
    // without a price: no cost
    let v = estimate_json("llama3-8b", &["--tp", "8", "--train-tokens", "300B"]);
    assert_eq!(v["time_to_train"]["cost_usd"], Value::Null, "{v}");
    assert_eq!(v["time_to_train"]["tokens"], 3e11, "{v}");
}

#[test]
fn whatif_shares_plans_batch_flags_and_refusal() {
    // 4M tokens typed as sequences: 4,194,304 × 8,192 = 34.4B tokens per iteration
    fails_one_line(
        &["whatif", "llama3-8b", "--gpus", "8", "--global-batch", "4194304"],
        "--global-batch: 4194304 sequences × 8192 tokens = 34.4B tokens per iteration; did you mean --global-batch-tokens 4194304? (--huge-batch if you mean it)",
    );
    fails_one_line(
        &[
            "whatif",
            "llama3-8b",
            "--gpus",
            "8",
            "--global-batch-tokens",
            "4M",
        ],
        "--global-batch-tokens: 4M tokens is not a whole number of 8192-token sequences",
    );
    // 2,097,152 tokens = 256 sequences of 8,192
    let text = stdout(&[
        "whatif",
        "llama3-8b",
        "--gpus",
        "8,16",
        "--global-batch-tokens",
        "2097152",
        "--json",
    ]);
    let rows: Value = serde_json::from_str(&text).expect("JSON");
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{text}");
    assert!(rows.iter().all(|r| r["global_batch"] == 256), "{text}");
    // plan's --train-tokens names whatif's --tokens too
    let args = [
        "whatif",
        "llama3-8b",
        "--gpus",
        "8",
        "--train-tokens",
        "1T",
        "--json",
    ];
    let rows: Value = serde_json::from_str(&stdout(&args)).expect("JSON");
    assert!(rows[0]["plan"]["gpu_hours"].as_f64().is_some(), "{rows}");
    let out = common::autopp(&[
        "whatif",
        "llama3-8b",
        "--gpus",
        "8",
        "--global-batch-tokens",
        "2097152",
        "--batch-per-gpu",
        "64K",
    ]);
    assert_eq!(out.status.code(), Some(2), "conflicting batch flags");
}

#[test]
fn whatif_searches_the_runnable_default_and_says_what_runs_each_answer() {
    let args = [
        "whatif",
        "llama3-8b",
        "--gpus",
        "8,16",
        "--global-batch",
        "64",
    ];
    let text = stdout(&args);
    let header = text
        .lines()
        .find(|l| l.starts_with("gpu "))
        .expect("header");
    assert!(header.ends_with("binds          runs on"), "{text}");
    let json: Value =
        serde_json::from_str(&stdout(&[&args[..], &["--json"]].concat())).expect("JSON");
    for row in json.as_array().expect("rows") {
        let runs_on = row["plan"]["runs_on"].as_array().expect("runs_on");
        // the default (`any`) answers with a plan some framework runs
        assert!(!runs_on.is_empty(), "{row}");
    }
    // the same answer as plan's default at each point
    for gpus in ["8", "16"] {
        let plan = stdout(&[
            "plan",
            "llama3-8b",
            "--gpus",
            gpus,
            "--global-batch",
            "64",
            "--json",
        ]);
        let plan: Value = serde_json::from_str(&plan).expect("JSON");
        let row = json
            .as_array()
            .and_then(|rows| {
                rows.iter()
                    .find(|r| r["gpus"] == gpus.parse::<u64>().unwrap())
            })
            .expect("a row");
        let (a, b) = (
            &row["plan"]["iteration_time_s"],
            &plan["predicted"]["iteration_time_s"],
        );
        assert_eq!(a, b, "{gpus} GPUs: whatif {row} vs plan {plan}");
        assert_eq!(row["plan"]["runs_on"], plan["runs_on"], "{gpus} GPUs");
    }
    // the mixed space stays available, as plan's
    let mix = stdout(&[&args[..], &["--framework", "any-mix", "--csv"]].concat());
    assert!(
        mix.lines().next().is_some_and(|h| h.ends_with(",runs_on")),
        "{mix}"
    );
}
