//! End-to-end tests of `autopp exec` as a user runs it (tiny-gpt at a short sequence, so the
//! runs take a second or two).

mod common;

use common::{autopp, stdout};

/// Asserts a run failed with exit 2 and one line naming `needle`.
fn fails_with(args: &[&str], needle: &str) {
    let out = autopp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "args {args:?}: stderr {stderr}");
    assert!(!stderr.contains("panicked"), "panic for {args:?}: {stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
}

const SMALL: [&str; 4] = ["--seq-len", "16", "--steps", "3"];

/// tiny-gpt on two ranks, one 1F1B pipeline of two micro-batches of one sequence.
const TWO_RANKS: [&str; 10] = [
    "exec",
    "tiny-gpt",
    "--pp",
    "2",
    "--microbatches",
    "2",
    "--mbs",
    "1",
    "--schedule",
    "1f1b",
];

#[test]
fn json_has_every_key_and_the_check_passes() {
    let mut args = vec![
        "exec",
        "tiny-gpt",
        "--pp",
        "2",
        "--dp",
        "2",
        "--virtual",
        "2",
        "--microbatches",
        "4",
        "--mbs",
        "1",
        "--schedule",
        "interleaved-1f1b",
        "--check",
        "--json",
    ];
    args.extend(SMALL);
    let v: serde_json::Value = serde_json::from_str(&stdout(&args)).unwrap();
    assert_eq!(v["losses"].as_array().unwrap().len(), 3);
    assert_eq!(v["step_time_s"].as_array().unwrap().len(), 3);
    assert!(v["iteration_time_s"].as_f64().unwrap() > 0.0);
    assert!(v["predicted_iteration_time_s"].as_f64().unwrap() > 0.0);
    let measured = &v["measured_action_times_s"];
    assert_eq!(measured["stage_s"].as_array().unwrap().len(), 4);
    assert_eq!(measured["p2p_s"].as_array().unwrap().len(), 3);
    assert_eq!(measured["end_of_step_s"].as_array().unwrap().len(), 2);
    assert_eq!(v["global_batch_size"], 8);
    for key in [
        "bubble_fraction",
        "peak_activation_bytes",
        "predicted_peak_activation_bytes",
    ] {
        assert_eq!(v[key].as_array().unwrap().len(), 2, "{key}");
    }
    assert_eq!(
        v["peak_activation_bytes"],
        v["predicted_peak_activation_bytes"]
    );
    assert_eq!(v["check"]["passed"], true);
    assert!(v["check"]["max_rel_err"].as_f64().unwrap() <= 1e-5);
}

#[test]
fn text_report_and_trace() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.json");
    let path_text = path.to_str().unwrap();
    let mut args = TWO_RANKS.to_vec();
    args.extend(["--trace", path_text]);
    args.extend(SMALL);
    let out = stdout(&args);
    assert!(out.contains("iteration time"), "{out}");
    assert!(out.contains("predicted "), "{out}");
    assert!(out.contains("peak activations"), "{out}");
    assert!(
        out.lines()
            .filter(|l| l.starts_with("1 ") || l.starts_with("3 "))
            .count()
            >= 2,
        "{out}"
    );
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let actions = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] != "optimizer")
        .count();
    // 2 ranks × 2 micro-batches × (F + B) × 3 steps
    assert_eq!(actions, 2 * 2 * 2 * 3);
    // only the trace file is left behind (no temporary file)
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn a_plan_file_runs() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let plan_text = plan.to_str().unwrap();
    stdout(&[
        "plan",
        "tiny-gpt",
        "--gpus",
        "4",
        "--fix",
        "pp=2,tp=1",
        "--out",
        plan_text,
    ]);
    let mut args = vec!["exec", "--plan", plan_text, "--json"];
    args.extend(SMALL);
    let v: serde_json::Value = serde_json::from_str(&stdout(&args)).unwrap();
    assert_eq!(v["pp"], 2);
    assert_eq!(
        v["peak_activation_bytes"],
        v["predicted_peak_activation_bytes"]
    );
}

/// `--tp 2` with `--pp 2` under a zero-bubble schedule (split I and W): the check passes and
/// the measured peak bytes equal the prediction; the plan of `plan tiny-gpt --gpus 8` (and one
/// fixed at tp 2 · pp 2) runs as planned.
#[test]
fn tensor_parallel_runs_and_plans_with_tp_run() {
    let mut args = TWO_RANKS.to_vec();
    args[9] = "zb-h1";
    args.extend(["--tp", "2", "--check", "--json"]);
    args.extend(SMALL);
    let v: serde_json::Value = serde_json::from_str(&stdout(&args)).unwrap();
    assert_eq!(v["tp"], 2);
    let comm = &v["measured_action_times_s"]["tp_comm_s"];
    assert_eq!(comm.as_array().unwrap().len(), 2);
    assert_eq!(v["check"]["passed"], true);
    assert!(v["check"]["max_rel_err"].as_f64().unwrap() <= 1e-5);
    assert_eq!(
        v["peak_activation_bytes"],
        v["predicted_peak_activation_bytes"]
    );
    let dir = tempfile::tempdir().unwrap();
    for (name, fix) in [("free.json", None), ("tp2.json", Some("tp=2,pp=2"))] {
        let plan = dir.path().join(name);
        let plan_text = plan.to_str().unwrap();
        let mut p = vec!["plan", "tiny-gpt", "--gpus", "8", "--out", plan_text];
        p.extend(fix.map(|f| ["--fix", f]).into_iter().flatten());
        stdout(&p);
        let mut args = vec!["exec", "--plan", plan_text, "--check", "--json"];
        args.extend(["--seq-len", "16", "--steps", "2"]);
        let v: serde_json::Value = serde_json::from_str(&stdout(&args)).unwrap();
        assert_eq!(v["check"]["passed"], true, "{name}");
        if fix.is_some() {
            assert_eq!((v["tp"].clone(), v["pp"].clone()), (2.into(), 2.into()));
        }
    }
    let mut bad = TWO_RANKS.to_vec();
    bad.extend(["--tp", "3"]);
    fails_with(&bad, "--tp: 3 does not divide the attention heads");
}

/// `--sequence-parallel` with `--tp 2 --pp 2` under 1F1B passes the check, its peak bytes (the
/// norms' tensors on a shard of the sequence) equal the prediction; the plan of
/// `plan tiny-gpt --gpus 8 --fix tp=2,pp=2,sequence_parallel=true` runs with it; a sequence
/// length that tp does not divide is one line naming the flag.
#[test]
fn sequence_parallel_runs_with_the_flag_and_from_a_plan() {
    let mut args = TWO_RANKS.to_vec();
    args.extend(["--tp", "2", "--sequence-parallel", "--check", "--json"]);
    args.extend(SMALL);
    let v: serde_json::Value = serde_json::from_str(&stdout(&args)).unwrap();
    assert_eq!(
        (v["tp"].clone(), v["sequence_parallel"].clone()),
        (2.into(), true.into())
    );
    assert_eq!(v["check"]["passed"], true);
    assert_eq!(
        v["peak_activation_bytes"],
        v["predicted_peak_activation_bytes"]
    );
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("sp.json");
    let plan_text = plan.to_str().unwrap();
    let fix = "tp=2,pp=2,sequence_parallel=true";
    stdout(&[
        "plan", "tiny-gpt", "--gpus", "8", "--fix", fix, "--out", plan_text,
    ]);
    let args = [
        "exec",
        "--plan",
        plan_text,
        "--check",
        "--json",
        "--seq-len",
        "16",
        "--steps",
        "2",
    ];
    let v: serde_json::Value = serde_json::from_str(&stdout(&args)).unwrap();
    assert_eq!(v["check"]["passed"], true);
    assert_eq!(v["sequence_parallel"], true);
    let mut bad = TWO_RANKS.to_vec();
    bad.extend(["--tp", "2", "--sequence-parallel", "--seq-len", "15"]);
    fails_with(
        &bad,
        "--sequence-parallel: needs the sequence length (15) divisible by --tp 2",
    );
}

/// `--scale-down` runs a `llama3-70b --gpus 64` plan (64 ranks: tp 8 · pp 2 · dp 4, ZB-V with
/// 2 stages per rank, at a global batch of 32) as planned on a small model, says so on stderr,
/// and passes the check. The plan pins cp = 1: the search's own answer at this batch uses
/// context parallelism 8, which exec does not run yet (it says so in one line). A minute or more even in release on a loaded
/// machine: `.ci/run` runs it (`cargo test --release --test cli_exec -- --ignored`).
#[test]
#[ignore = "64 threads: cargo test --release --test cli_exec -- --ignored"]
fn a_scaled_down_llama3_70b_plan_runs_as_planned() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let plan_text = plan.to_str().unwrap();
    let p = [
        "plan",
        "llama3-70b",
        "--gpus",
        "64",
        "--global-batch",
        "32",
        "--fix",
        "cp=1",
    ];
    stdout(&[&p[..], &["--out", plan_text]].concat());
    let planned: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan).unwrap()).unwrap();
    let args = [
        "exec",
        "--plan",
        plan_text,
        "--scale-down",
        "--steps",
        "1",
        "--check",
        "--json",
    ];
    let out = autopp(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.contains("scaled down: llama3-70b (80 blocks"),
        "{note}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in ["tp", "pp", "dp", "virtual_stages", "num_microbatches"] {
        assert_eq!(v[key], planned["plan"][key], "{key}");
    }
    assert_eq!(v["schedule"], planned["plan"]["schedule"]);
    assert_eq!(v["check"]["passed"], true);
}

#[test]
fn impossible_requests_fail_with_one_line() {
    let with = |model: &str, extra: &[&'static str]| {
        let mut v = TWO_RANKS.to_vec();
        v[1] = model;
        v.extend(extra.iter().copied());
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>, needle: &str| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(&refs, needle);
    };
    run(with("gpt3-175b", &[]), "exec does not implement");
    run(with("llama3-8b", &[]), "exec does not implement");
    run(
        with("tiny-gpt", &["--virtual", "2"]),
        "error: --virtual: 1f1b places one stage on each rank, so virtual_stages must be 1",
    );
    run(with("tiny-gpt", &["--split", "3,3"]), "--split");
    run(with("tiny-gpt", &["--seq-len", "0"]), "--seq-len");
    run(with("tiny-gpt", &["--steps", "0"]), "--steps");
    run(with("tiny-gpt", &["--recv-timeout", "0"]), "--recv-timeout");
    run(with("no-such-model", &[]), "unknown model");
    fails_with(&["exec", "tiny-gpt", "--pp", "2"], "required");
}

#[test]
fn too_large_untied_models_are_refused_by_size() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("big.json");
    std::fs::write(
        &model,
        r#"{"name": "big", "num_layers": 48, "hidden_size": 2048, "num_attention_heads": 16,
            "vocab_size": 50000, "seq_length": 128, "tied_embeddings": false, "dropout": false}"#,
    )
    .unwrap();
    let mut args = TWO_RANKS;
    args[1] = model.to_str().unwrap();
    fails_with(&args, "above the limit of 100 M");
}

/// Runs `exec` with `--inject-failure FAILURE` and a trace file, and asserts it ends well within
/// 30 s (the receive timeout is 60 s, so a hang would show), exit 2, one `error:` line naming
/// the rank, the step and an action, and no file left behind.
fn injected_failure_stops_every_rank(pp: &str, dp: &str, failure: &str, needle: &str) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.json");
    let mut args = vec![
        "exec",
        "tiny-gpt",
        "--pp",
        pp,
        "--dp",
        dp,
        "--microbatches",
        "4",
        "--mbs",
        "1",
        "--schedule",
        "1f1b",
        "--recv-timeout",
        "60",
        "--inject-failure",
        failure,
        "--trace",
        trace.to_str().unwrap(),
        "--json",
    ];
    args.extend(SMALL);
    let start = std::time::Instant::now();
    let out = autopp(&args);
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(elapsed.as_secs_f64() < 30.0, "took {elapsed:?}: {stderr}");
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(stderr.contains("failed at step 2, action "), "{stderr}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}

#[test]
fn an_injected_failure_stops_two_ranks_quickly() {
    injected_failure_stops_every_rank("2", "1", "1:2", "rank 1 (replica 0, pipeline rank 1)");
}

#[test]
fn an_injected_failure_stops_four_ranks_quickly() {
    injected_failure_stops_every_rank("4", "1", "2:2", "injected failure (--inject-failure 2:2)");
}

#[test]
fn an_injected_panic_stops_every_rank_quickly() {
    injected_failure_stops_every_rank(
        "2",
        "2",
        "3:2:panic",
        "rank 3 (replica 1, pipeline rank 1) failed at step 2, action 1",
    );
}

#[test]
fn an_injected_failure_outside_the_run_is_refused() {
    let base = [&TWO_RANKS[..], &["--steps", "2"]].concat();
    let mut args = base.to_vec();
    args.extend(["--inject-failure", "2:1"]);
    fails_with(&args, "--inject-failure");
    let mut args = base.to_vec();
    args.extend(["--inject-failure", "1:x"]);
    fails_with(&args, "RANK:STEP");
    // a killed process would take every rank's thread with it
    let mut args = base.to_vec();
    args.extend(["--inject-failure", "1:1:kill"]);
    fails_with(&args, "':kill' is only for --transport mpi");
}

/// Without the `mpi` feature, `--transport mpi` says how to get it, in one line, exit 2.
#[cfg(not(feature = "mpi"))]
#[test]
fn the_mpi_transport_needs_the_mpi_feature() {
    fails_with(
        &[&TWO_RANKS[..], &["--transport", "mpi"]].concat(),
        "--features mpi",
    );
}

/// GPUs this test process sees: `None` in a build without CUDA or without a driver.
fn gpus() -> Option<usize> {
    #[cfg(feature = "cuda")]
    {
        autopp_profiler::device::cuda::device_count().ok()
    }
    #[cfg(not(feature = "cuda"))]
    {
        None
    }
}

/// [`TWO_RANKS`] with short sequences on `--backend cuda`.
fn cuda_run() -> Vec<&'static str> {
    [&TWO_RANKS[..], &["--seq-len", "16", "--backend", "cuda"]].concat()
}

/// `--backend cuda` without a GPU (or without the `cuda` feature) is one clear line, exit 2;
/// with a GPU it trains, GEMMs on cuBLAS, and passes `--check`.
#[test]
fn the_cuda_backend_without_a_gpu_is_one_line() {
    match gpus() {
        Some(n) if n > 0 => {
            let mut args = cuda_run();
            args.extend(["--steps", "2", "--check"]);
            let out = stdout(&args);
            assert!(
                out.contains("GEMMs on cuBLAS") && out.contains("PASSED"),
                "{out}"
            );
        }
        _ => {
            let needle = if cfg!(feature = "cuda") {
                "--backend cuda: "
            } else {
                "--features cuda"
            };
            fails_with(&cuda_run(), needle);
        }
    }
}

/// `--transport nccl` needs a CUDA build, `--backend cuda` and a GPU per rank, and says which
/// is missing in one line; with two GPUs it trains over NCCL and passes `--check`.
#[test]
fn the_cuda_backend_over_nccl_runs_or_says_why_not() {
    let mut args = cuda_run();
    args.extend(["--transport", "nccl"]);
    let mut cpu = args.clone();
    cpu[13] = "cpu";
    if !cfg!(feature = "cuda") {
        fails_with(&args, "--features cuda");
        fails_with(&cpu, "--features cuda");
        return;
    }
    fails_with(
        &cpu,
        "--transport nccl: NCCL moves tensors between GPUs; add --backend cuda",
    );
    match gpus() {
        Some(n) if n >= 2 => {
            args.extend(["--steps", "2", "--check"]);
            let out = stdout(&args);
            assert!(
                out.contains("NCCL between GPUs") && out.contains("PASSED"),
                "{out}"
            );
        }
        Some(_) => fails_with(&args, "use --transport threads"),
        None => fails_with(&args, "--backend cuda: "),
    }
}

#[test]
fn v_schedules_default_to_two_stages_per_rank() {
    for kind in ["zb-v", "dualpipe-v"] {
        let line =
            format!("exec tiny-gpt --pp 2 --microbatches 4 --mbs 1 --schedule {kind} --json");
        let mut args: Vec<&str> = line.split(' ').collect();
        args.extend(SMALL);
        let v: serde_json::Value = serde_json::from_str(&stdout(&args)).unwrap();
        assert_eq!(v["losses"].as_array().unwrap().len(), 3, "{kind}: {v}");
    }
}

#[test]
fn interleaved_zb_takes_micro_batch_counts_pytorch_takes() {
    // 6 micro-batches on 4 ranks: one round of 6 in PyTorch's ScheduleInterleavedZeroBubble
    let line =
        "exec tiny-gpt --pp 4 --virtual 2 --microbatches 6 --mbs 1 --schedule interleaved-zb";
    let mut args: Vec<&str> = line.split(' ').collect();
    args.extend(SMALL);
    stdout(&args);
}
