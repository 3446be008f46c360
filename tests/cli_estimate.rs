//! End-to-end tests of `autopp estimate` as a user runs it.

mod common;

use common::autopp;

/// Asserts a run failed with exit 2 and one clear line naming `needle`; returns the line.
fn fails_with(args: &[&str], needle: &str) -> String {
    let out = autopp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {stderr}");
    assert!(!stderr.contains("panicked"), "panic for {args:?}: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(out.stdout.is_empty(), "stdout on error: {:?}", out.stdout);
    stderr
}

fn json(args: &[&str]) -> serde_json::Value {
    let out = autopp(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

const GPT3: [&str; 16] = [
    "estimate",
    "gpt3-175b",
    "--gpus",
    "1024",
    "--tp",
    "8",
    "--pp",
    "16",
    "--mbs",
    "1",
    "--global-batch",
    "1536",
    "--gpu",
    "a100-80g",
    "--recompute",
    "full",
];

#[test]
fn gpt3_json_has_the_documented_shape() {
    let mut args = GPT3.to_vec();
    args.push("--json");
    let v = json(&args);
    let obj = v.as_object().unwrap();
    let mut keys: Vec<&String> = obj.keys().collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            "batch",
            "calibration",
            "defaults_used",
            "fix",
            "gap",
            "plan",
            "predicted",
            "time_to_train"
        ],
        "plan, predicted, the advice and the inputs: {v}"
    );
    let plan = &v["plan"];
    for key in [
        "format_version",
        "model",
        "gpus",
        "gpu",
        "gpus_per_node",
        "tp",
        "pp",
        "dp",
        "cp",
        "virtual_stages",
        "micro_batch_size",
        "num_microbatches",
        "global_batch_size",
        "schedule",
        "recompute",
        "sequence_parallel",
        "zero_stage",
        "ranks",
    ] {
        assert!(plan.get(key).is_some(), "plan.{key} missing");
    }
    assert_eq!(plan["dp"], 8);
    assert_eq!(plan["num_microbatches"], 192);
    assert_eq!(plan["recompute"], "full");
    let ranks = plan["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 16);
    // the stages tile the 98 layer entries in order
    let mut next = 0;
    for r in ranks {
        for st in r["stages"].as_array().unwrap() {
            assert_eq!(st[0], next);
            next = st[1].as_u64().unwrap() + 1;
        }
        assert_eq!(r["recompute"], "full");
        assert_eq!(r["recompute_num_layers"], 6);
    }
    assert_eq!(next, 98);
    let p = &v["predicted"];
    let t = p["iteration_time_s"].as_f64().unwrap();
    let b = &p["breakdown_s"];
    let sum: f64 = [
        "compute",
        "bubble",
        "tp_comm",
        "pp_comm",
        "dp_comm",
        "optimizer",
    ]
    .iter()
    .map(|k| b[k].as_f64().unwrap())
    .sum();
    assert!((sum - t).abs() < 1e-6 * t, "breakdown {sum} vs {t}");
    let tokens = p["tokens_per_s"].as_f64().unwrap();
    assert!((tokens * t - 1536.0 * 2048.0).abs() < 1e-3 * tokens);
    let mfu = p["mfu"].as_f64().unwrap();
    assert!(mfu > 0.2 && mfu < 0.8, "mfu {mfu}");
    assert_eq!(p["fits"], true);
    // 1f1b on 16 ranks with 192 micro-batches: bubble (p-1)/(m+p-1) ≈ 7.2 %, plus sends
    let bubble = p["bubble_fraction"].as_f64().unwrap();
    assert!((0.07..0.12).contains(&bubble), "bubble {bubble}");
}

#[test]
fn gpt3_human_output_says_fits() {
    let out = autopp(&GPT3);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("FITS: peak"), "{text}");
    assert!(text.contains("tokens/s"), "{text}");
    assert!(text.contains("rank 0"), "{text}");
}

#[test]
fn a_config_that_does_not_fit_is_still_evaluated() {
    let v = json(&[
        "estimate",
        "gpt3-175b",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--global-batch",
        "8",
        "--gpu",
        "a100-80g",
        "--json",
    ]);
    assert_eq!(v["predicted"]["fits"], false);
    let out = autopp(&[
        "estimate",
        "gpt3-175b",
        "--gpus",
        "8",
        "--tp",
        "8",
        "--global-batch",
        "8",
        "--gpu",
        "a100-80g",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("DOES NOT FIT (rank 0 needs"), "{text}");
}

#[test]
fn zero_bubble_schedules_are_estimated() {
    let base = [
        "estimate",
        "llama3-8b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--pp",
        "4",
        "--json",
    ];
    let time = |extra: &[&str]| -> (f64, serde_json::Value) {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let j = json(&args);
        (j["predicted"]["iteration_time_s"].as_f64().unwrap(), j)
    };
    let (one_f_one_b, _) = time(&["--schedule", "1f1b"]);
    let (zb_h1, _) = time(&["--schedule", "zb-h1"]);
    assert!(zb_h1 < one_f_one_b, "zb-h1 {zb_h1} vs 1f1b {one_f_one_b}");
    // zb-v and dualpipe-v take two stages per rank by default
    for kind in ["zb-v", "dualpipe-v"] {
        let (_, j) = time(&["--schedule", kind]);
        assert_eq!(j["plan"]["virtual_stages"], 2, "{kind}");
        assert_eq!(j["plan"]["schedule"], kind);
        assert_eq!(j["plan"]["ranks"][0]["stages"].as_array().unwrap().len(), 2);
    }
    let args: Vec<&str> = base
        .iter()
        .chain(&["--schedule", "zb-v", "--virtual", "4"])
        .copied()
        .collect();
    fails_with(&args, "--virtual");
}

#[test]
fn impossible_configurations_name_the_flag() {
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "64",
            "--tp",
            "8",
            "--dp",
            "3",
        ],
        "--dp",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "1000",
            "--tp",
            "8",
            "--pp",
            "16",
        ],
        "--gpus",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--tp",
            "8",
            "--pp",
            "128",
        ],
        "--pp",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "64",
            "--tp",
            "8",
            "--global-batch",
            "100",
        ],
        "--global-batch",
    );
    fails_with(
        &["estimate", "gpt3-175b", "--gpus", "8", "--gpu", "b100"],
        "--gpu",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "40",
            "--tp",
            "5",
            "--global-batch",
            "8",
        ],
        "--tp",
    );
    fails_with(
        &["estimate", "gpt3-175b", "--gpus", "8", "--tp", "0"],
        "--tp",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "12",
            "--gpus-per-node",
            "8",
        ],
        "--gpus",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "8",
            "--pp",
            "2",
            "--virtual",
            "2",
            "--schedule",
            "1f1b",
        ],
        "--virtual",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "8",
            "--gpu",
            "v100-32g",
            "--tp",
            "8",
        ],
        "--precision",
    );
    fails_with(
        &[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "8",
            "--tp",
            "8",
            "--zero",
            "4",
        ],
        "--zero",
    );
    fails_with(
        &["estimate", "no-such-model", "--gpus", "8"],
        "no-such-model",
    );
}

fn model_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().to_string()
}

#[test]
fn bad_model_files_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = r#"{"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
                   "vocab_size": 1000, "seq_length": 128, "global_batch_size": 16}"#;
    let path = model_file(&dir, "good.json", good);
    let v = json(&["estimate", &path, "--gpus", "2", "--pp", "2", "--json"]);
    assert_eq!(v["plan"]["model"], "m");

    let cases = [
        (
            "malformed.json",
            r#"{"name": "m", "num_layers": 4,"#,
            "line",
        ),
        (
            "missing.json",
            r#"{"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000}"#,
            "seq_length",
        ),
        (
            "unknown.json",
            r#"{"name": "m", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000, "seq_length": 128, "hidden_dim": 3}"#,
            "hidden_dim",
        ),
        (
            "zero.json",
            r#"{"name": "m", "num_layers": 0, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 1000, "seq_length": 128}"#,
            "num_layers",
        ),
        (
            "negative.json",
            r#"{"name": "m", "num_layers": 4, "hidden_size": -256, "num_attention_heads": 4, "vocab_size": 1000, "seq_length": 128}"#,
            "hidden_size",
        ),
    ];
    for (name, text, needle) in cases {
        let path = model_file(&dir, name, text);
        fails_with(
            &["estimate", &path, "--gpus", "1", "--global-batch", "4"],
            needle,
        );
    }
}
