//! End-to-end tests of `autopp plan` as a user runs it.

mod common;

use std::process::{Command, Output};

fn autopp(args: &[&str], threads: Option<&str>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_autopp"));
    cmd.args(args);
    if let Some(t) = threads {
        cmd.env("RAYON_NUM_THREADS", t);
    }
    cmd.output().expect("the autopp binary runs")
}

fn json(args: &[&str], threads: Option<&str>) -> serde_json::Value {
    let out = autopp(args, threads);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object on stdout")
}

fn fails_with(args: &[&str], needle: &str) {
    common::fails_one_line(args, needle);
}

const LLAMA8B: [&str; 6] = ["plan", "llama3-8b", "--gpus", "32", "--gpu", "a100-80g"];

/// Llama 3 8B on 32 H100s under Megatron.
const LLAMA8B_MEGATRON: [&str; 6] = [
    "plan",
    "llama3-8b",
    "--gpus",
    "32",
    "--framework",
    "megatron",
];

/// The memory-bound GPT-3 case: 175 B parameters on 64 A100s.
const GPT3_64: [&str; 8] = [
    "plan",
    "gpt3-175b",
    "--gpus",
    "64",
    "--gpu",
    "a100-80g",
    "--global-batch",
    "512",
];

#[test]
fn plan_json_has_plan_predicted_search_and_alternatives() {
    let mut args = LLAMA8B.to_vec();
    args.push("--json");
    let v = json(&args, None);
    for key in ["plan", "predicted", "search", "alternatives"] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["predicted"]["fits"], true);
    assert!(v["search"]["candidates"].as_u64().unwrap() > 100);
    assert!(v["search"]["elapsed_s"].as_f64().unwrap() > 0.0);
    let layout = v["plan"]["megatron_layout"].as_str().unwrap();
    assert!(layout.starts_with('E') && layout.ends_with('L'), "{layout}");
    let t = v["predicted"]["iteration_time_s"].as_f64().unwrap();
    for alt in v["alternatives"].as_array().unwrap() {
        // a simpler plan may be chosen within the 1% tolerance
        assert!(alt["predicted"]["iteration_time_s"].as_f64().unwrap() >= t / 1.01);
        assert_eq!(alt["predicted"]["fits"], true);
    }
}

#[test]
fn plan_is_deterministic_for_any_thread_count() {
    let mut args = LLAMA8B.to_vec();
    args.push("--json");
    let strip = |mut v: serde_json::Value| {
        v["search"]["elapsed_s"] = serde_json::Value::Null;
        v
    };
    let one = strip(json(&args, Some("1")));
    let two = strip(json(&args, Some("2")));
    let four = strip(json(&args, Some("4")));
    assert_eq!(one, two);
    assert_eq!(one, four);
}

#[test]
fn plan_file_round_trips_through_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    let path = path.to_str().unwrap();
    let mut args = LLAMA8B.to_vec();
    args.extend(["--json", "--out", path]);
    let planned = json(&args, None);
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for key in ["format_version", "plan", "predicted", "model", "cluster"] {
        assert!(file.get(key).is_some(), "{key} missing in the plan file");
    }
    let again = json(&["estimate", "--plan", path, "--json"], None);
    assert_eq!(again["plan"], planned["plan"]);
    assert_eq!(again["predicted"], planned["predicted"]);

    // schedule --plan simulates the plan's own schedule in seconds
    let svg = dir.path().join("plan.svg");
    let sched = json(
        &[
            "schedule",
            "--plan",
            path,
            "--json",
            "--svg",
            svg.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(sched["schedule"], planned["plan"]["schedule"]);
    assert_eq!(sched["pp"], planned["plan"]["pp"]);
    assert_eq!(
        sched["num_microbatches"],
        planned["plan"]["num_microbatches"]
    );
    assert_eq!(
        sched["metrics"]["bubble_fraction"],
        planned["predicted"]["bubble_fraction"]
    );
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    fails_with(&["schedule", "--plan", path, "--pp", "4"], "--plan");
}

#[test]
fn fix_pins_fields() {
    let v = json(
        &[
            "plan",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--gpu",
            "a100-80g",
            "--global-batch",
            "1536",
            "--fix",
            "tp=8,pp=16,recompute=full",
            "--json",
        ],
        None,
    );
    assert_eq!(v["plan"]["tp"], 8);
    assert_eq!(v["plan"]["pp"], 16);
    assert_eq!(v["plan"]["recompute"], "full");
    fails_with(
        &["plan", "gpt3-175b", "--gpus", "64", "--fix", "tensor=8"],
        "--fix",
    );
}

#[test]
fn human_output_explains_the_choice() {
    let out = autopp(&LLAMA8B, None);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in ["searched", "FITS", "why", "alternatives"] {
        assert!(text.contains(needle), "{needle} missing:\n{text}");
    }
    // a layout and a schedule only for a pipeline (issue 22)
    let pipelined = !text.contains(" · pp 1 · ");
    assert_eq!(text.contains("  layout  "), pipelined, "{text}");
    assert_eq!(text.contains("stage per rank"), pipelined, "{text}");
}

#[test]
fn impossible_requests_explain_themselves() {
    // GPUs that do not fill whole nodes
    fails_with(&["plan", "gpt3-175b", "--gpus", "12"], "--gpus");
    // a global batch smaller than the smallest data-parallel degree
    fails_with(
        &[
            "plan",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--global-batch",
            "1",
            "--fix",
            "cp=1",
        ],
        "smallest data-parallel degree",
    );
    // a negative number, which clap takes for an unknown flag; a margin over the memory
    for (flag, value, needle) in [
        (
            "--global-batch",
            "-3",
            "--global-batch: '-3' is negative; give a positive value",
        ),
        (
            "--memory-margin",
            "-1.5",
            "--memory-margin: '-1.5' is negative",
        ),
        ("--memory-margin", "200%", "below 100%"),
        // numbers whose sums once overflowed (a panic in a debug build)
        ("--memory-reserve-gib", "1e308", "more than any GPU holds"),
    ] {
        fails_with(&["plan", "llama3-8b", "--gpus", "8", flag, value], needle);
    }
    // a model larger than all the memory
    fails_with(&["plan", "gpt3-175b", "--gpus", "16"], "nothing fits");
    fails_with(&["plan", "gpt3-175b", "--gpus", "16"], "GiB");
}

/// `autopp plan … | head -1`: a reader that closes the pipe early ends the process quietly
/// (as it does `cat`), never with a panic on stderr.
#[cfg(unix)]
#[test]
fn closed_stdout_is_not_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_autopp"))
        .args(["plan", "llama3-8b", "--gpus", "32"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the autopp binary runs");
    // close the read end before the plan is printed
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("autopp ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("Broken pipe"), "{stderr}");
}

/// `--framework` pins and schedules the framework cannot run are one-line errors naming what
/// it runs.
#[test]
fn framework_rejects_what_it_cannot_run() {
    fails_with(
        &[
            "plan",
            "llama3-8b",
            "--gpus",
            "32",
            "--framework",
            "deepspeed",
            "--fix",
            "zero_stage=3",
        ],
        "deepspeed does not run it with a pipeline; it runs ZeRO 0, 1",
    );
    fails_with(
        &[&LLAMA8B_MEGATRON[..], &["--schedules", "zb-v"]].concat(),
        "megatron does not run zb-v; it runs 1f1b, interleaved-1f1b",
    );
    fails_with(
        &["plan", "llama3-8b", "--gpus", "32", "--framework", "jax"],
        "unknown framework",
    );
}

/// On a memory-bound case the plan recomputes a few layers where memory binds, says so, and
/// its plan file gives `estimate --plan` the same prediction.
#[test]
fn partial_recompute_is_planned_explained_and_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    let path = path.to_str().unwrap();
    let mut args = GPT3_64.to_vec();
    // per-rank counts are the mixed space's (Megatron's one count per stage is the default's)
    // the reserve keeps the case memory-bound now that the fixed overhead outside DeepSpeed is
    // the CUDA context (1.5 GiB) rather than BLOOM's 7.875 GiB: 1 + 6.375 GiB, as before
    args.extend([
        "--max-tp",
        "4",
        "--framework",
        "any-mix",
        "--memory-reserve-gib",
        "7.375",
        "--out",
        path,
    ]);
    let out = autopp(&args, None);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("full recompute of"), "{text}");
    let planned = json(&[&args[..], &["--json"]].concat(), None);
    let ranks = planned["plan"]["ranks"].as_array().unwrap();
    assert!(ranks.iter().any(|r| r["recompute"] == "partial"));
    let again = json(&["estimate", "--plan", path, "--json"], None);
    assert_eq!(
        again["predicted"]["iteration_time_s"],
        planned["predicted"]["iteration_time_s"]
    );
    assert_eq!(again["plan"]["ranks"], planned["plan"]["ranks"]);
}

#[test]
fn alternatives_that_run_identically_are_listed_once() {
    // one micro-batch on one rank: gpipe and 1f1b are the same run
    let args = "plan tiny-gpt --gpus 8 --fix pp=1 --global-batch 8 --top 10 --json";
    let out = autopp(&args.split(' ').collect::<Vec<_>>(), None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut seen = Vec::new();
    for e in std::iter::once(&json).chain(json["alternatives"].as_array().unwrap()) {
        let mut plan = e["plan"].clone();
        plan["schedule"] = serde_json::Value::Null;
        let key = (plan, e["predicted"].clone());
        assert!(!seen.contains(&key), "listed twice: {key:?}");
        seen.push(key);
    }
    assert!(seen.len() >= 5, "{json}");
}

/// Plans with a margin (#15): the chosen plan and every alternative keep the GPU kind's memory
/// band free — `peak · (1 + band) ≤ capacity` — where this case used to fill 79.6 of 80.0 GiB.
#[test]
fn no_plan_is_within_the_memory_band_of_the_limit() {
    let (band, _) = autopp_planner::bands::memory_band("a100-80g").expect("bundled band");
    let mut args = GPT3_64.to_vec();
    args.push("--json");
    let v = json(&args, None);
    let plans = std::iter::once(&v).chain(v["alternatives"].as_array().unwrap());
    for p in plans {
        let peak = p["predicted"]["peak_memory_bytes"].as_f64().unwrap();
        let capacity = p["predicted"]["memory_capacity_bytes"].as_f64().unwrap();
        assert!(peak * (1.0 + band) <= capacity, "{peak} of {capacity}");
    }
    let m = &v["memory_margin"];
    assert!(m["free_bytes"].as_u64().unwrap() >= m["required_bytes"].as_u64().unwrap());
}

/// `--memory-margin` takes GiB or a percentage of the GPU's memory: 25% of 80 GiB = 20 GiB.
#[test]
fn memory_margin_overrides_the_band() {
    let mut args = LLAMA8B.to_vec();
    args.extend(["--memory-margin", "25%", "--json"]);
    let v = json(&args, None);
    assert_eq!(v["memory_margin"]["required_bytes"], 20u64 << 30);
    let peak = v["predicted"]["peak_memory_bytes"].as_u64().unwrap();
    assert!(peak <= 60u64 << 30, "{peak}");
    let mut args = LLAMA8B.to_vec();
    args.extend(["--memory-margin", "2.5GiB", "--json"]);
    let v = json(&args, None);
    assert_eq!(v["memory_margin"]["required_bytes"], 5u64 << 29);
    let mut args = LLAMA8B.to_vec();
    args.extend(["--memory-margin", "lots"]);
    fails_with(&args, "--memory-margin");
}

/// Simple when it is as good (#15): a 1.3B GPT (GPT-3 XL's sizes: 24 layers, hidden 2048) on 32
/// H100s and Llama 3 8B on 32 H100s under Megatron plan without a pipeline, as NVIDIA runs them.
#[test]
fn small_models_plan_without_a_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("gpt-1.3b.json");
    std::fs::write(
        &model,
        r#"{"name": "gpt-1.3b", "num_layers": 24, "hidden_size": 2048,
            "num_attention_heads": 16, "vocab_size": 50257, "seq_length": 2048,
            "position_embedding": "learned", "global_batch_size": 512}"#,
    )
    .unwrap();
    let gpt = json(
        &["plan", model.to_str().unwrap(), "--gpus", "32", "--json"],
        None,
    );
    assert_eq!(gpt["plan"]["pp"], 1, "{}", gpt["plan"]);
    let llama = json(&[&LLAMA8B_MEGATRON[..], &["--json"]].concat(), None);
    assert_eq!(llama["plan"]["pp"], 1, "{}", llama["plan"]);
    assert_eq!(llama["plan"]["tp"], 1, "{}", llama["plan"]);
    // whichever framework runs it
    let any = json(&["plan", "llama3-8b", "--gpus", "32", "--json"], None);
    assert_eq!(any["plan"]["pp"], 1, "{}", any["plan"]);
    assert_eq!(any["plan"]["tp"], 1, "{}", any["plan"]);
}

/// A rank of several stages shares its memory by need when equal shares fit no split: under
/// looped BFS every micro-batch's forward runs before any backward, so the rank holding
/// torchtitan's head keeps 16 micro-batches of fp32 log-probabilities (2.1 GB each) beside a
/// block stage. Half the rank each could not hold them, and this pinned configuration was
/// "nothing fits" while its leanest form needed 62.0 of 79.6 GiB.
#[test]
fn a_rank_of_several_stages_shares_its_memory_by_need() {
    let v = json(
        &[
            "plan",
            "llama3-8b",
            "--gpus",
            "64",
            "--global-batch",
            "128",
            "--framework",
            "torchtitan",
            "--fix",
            "tp=2,pp=4,dp=8,virtual_stages=2,schedule=looped-bfs,zero_stage=2,micro_batch_size=1",
            "--memory-margin",
            "0",
            "--json",
        ],
        None,
    );
    assert_eq!(v["plan"]["schedule"], "looped-bfs");
    assert_eq!(v["plan"]["virtual_stages"], 2);
    let (peak, capacity) = (
        v["predicted"]["peak_memory_bytes"].as_f64().unwrap(),
        v["predicted"]["memory_capacity_bytes"].as_f64().unwrap(),
    );
    assert!(
        v["predicted"]["fits"].as_bool().unwrap() && peak <= capacity,
        "{peak} {capacity}"
    );
}

/// When nothing fits, the error names the leanest configuration of the whole space and a GPU
/// count where it fits: Llama 3 405B on 8 A100 40GB needs 859.7 GiB a GPU at tp 8 (once the
/// error said 1147.9, a ZeRO stage over a single replica ranking first, and "about 200 GPUs",
/// a linear guess on which nothing fits), and the count it advises plans.
#[test]
fn nothing_fits_names_the_leanest_and_a_gpu_count_that_plans() {
    for (args, leanest) in [
        (
            ["plan", "llama3-405b", "--gpus", "8", "--gpu", "a100-40g"],
            "(tp 8 · pp 1 · dp 1, micro-batch 1, recompute full, ZeRO 0) needs 859.7 GiB",
        ),
        (
            ["plan", "gpt3-175b", "--gpus", "16", "--gpu", "h100-sxm"],
            "(tp 8 · pp 2 · dp 1, micro-batch 1, recompute full, ZeRO 0) needs 187.7 GiB",
        ),
    ] {
        let out = autopp(&args, None);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(leanest), "{args:?}: {err}");
        let advised = err
            .split("use about ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .expect("a GPU count");
        let count: u64 = advised.parse().expect("a number");
        assert!(count > 8, "{err}");
        let mut more = args;
        more[3] = advised;
        let planned = json(&[&more[..], &["--json"]].concat(), None);
        assert_eq!(planned["plan"]["gpus"].as_u64(), Some(count), "{planned}");
    }
}
