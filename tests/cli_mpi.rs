//! `exec --transport mpi` under `mpirun` (feature `mpi`; needs Open MPI): the 4-rank grids of
//! the acceptance (p = 2, dp = 2 and p = 4, dp = 1, and tp = 2 · p = 2) pass `--check`, as do four replicas of one
//! stage (dp = 4), bit for bit equal to the threaded run; an injected failure ends every
//! process within 30 s with the failing rank's error line, and so does a killed process, which
//! mpirun names.
#![cfg(feature = "mpi")]

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn mpirun(np: &str, args: &[&str]) -> Output {
    Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np", np])
        .arg(env!("CARGO_BIN_EXE_autopp"))
        .args(args)
        .output()
        .expect("mpirun runs (install openmpi-bin)")
}

const BASE: [&str; 12] = [
    "exec",
    "tiny-gpt",
    "--mbs",
    "1",
    "--seq-len",
    "32",
    "--steps",
    "3",
    "--transport",
    "mpi",
    "--microbatches",
    "4",
];

/// Runs the 4-process job `BASE + extra --check --json`, asserts it passes, and returns the JSON
/// rank 0 printed, parsed and as text.
fn passes_check(extra: &[&str]) -> (serde_json::Value, String) {
    let mut args = BASE.to_vec();
    args.extend(extra);
    args.extend(["--check", "--json"]);
    let out = mpirun("4", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?}: {stderr}");
    // only rank 0 reports
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text.trim_end().lines().count(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["check"]["passed"], true, "{v}");
    assert_eq!(
        v["peak_activation_bytes"],
        v["predicted_peak_activation_bytes"]
    );
    (v, text)
}

/// The text of `key`'s value (a number or an array of numbers) in the JSON `json` as printed:
/// serde_json prints each f64 as the shortest text that reads back to it, so equal texts are
/// equal bits.
fn printed<'a>(json: &'a str, key: &str) -> &'a str {
    let field = format!("\"{key}\":");
    let at = json
        .find(&field)
        .unwrap_or_else(|| panic!("no {key} in {json}"));
    let rest = &json[at + field.len()..];
    let end = match rest.strip_prefix('[') {
        Some(array) => array.find(']').map(|i| i + 2),
        None => rest.find([',', '}']),
    };
    &rest[..end.unwrap_or_else(|| panic!("{key} does not end in {json}"))]
}

#[test]
fn four_ranks_as_two_pipelines_of_two_match_single_worker_training() {
    let (v, _) = passes_check(&["--pp", "2", "--dp", "2", "--schedule", "1f1b"]);
    assert_eq!(v["dp"], 2);
}

/// Tensor parallelism across processes: tp 2 · pp 2 (world rank = pp rank · 2 + tp rank, as
/// on threads; a tensor-parallel communicator per pipeline rank) passes the check, with and
/// without sequence parallelism, and its collectives are timed.
#[test]
fn four_ranks_as_tp_two_times_pp_two_match_single_worker_training() {
    for sp in [false, true] {
        let mut extra = vec!["--pp", "2", "--tp", "2", "--schedule", "1f1b"];
        if sp {
            extra.push("--sequence-parallel");
        }
        let (v, _) = passes_check(&extra);
        assert_eq!((v["tp"].clone(), v["pp"].clone()), (2.into(), 2.into()));
        assert_eq!(v["sequence_parallel"], sp);
        let comm = &v["measured_action_times_s"]["tp_comm_s"];
        let timed = comm.as_array().unwrap().iter().filter_map(|a| a.as_array());
        let total: f64 = timed.flatten().filter_map(|x| x.as_f64()).sum();
        assert!(total > 0.0, "{comm}");
    }
}

#[test]
fn four_ranks_as_one_pipeline_of_four_match_single_worker_training() {
    let (v, _) = passes_check(&["--pp", "4", "--schedule", "zb-h1"]);
    assert_eq!(v["pp"], 4);
}

/// An all-reduce over four replicas, where `MPI_Allreduce` need not give every rank the same
/// bits: every replica ends with the same weights (`--check`), and the losses and the distance
/// from single-worker training are the threaded run's to the bit.
#[test]
fn four_replicas_of_one_stage_match_the_threaded_run_bit_for_bit() {
    let grid = ["--pp", "1", "--dp", "4", "--schedule", "1f1b"];
    let (v, mpi) = passes_check(&grid);
    assert_eq!(v["dp"], 4);
    let mut args: Vec<&str> = BASE
        .iter()
        .map(|&a| if a == "mpi" { "threads" } else { a })
        .collect();
    args.extend(grid);
    args.extend(["--check", "--json"]);
    let out = Command::new(env!("CARGO_BIN_EXE_autopp"))
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let threads = String::from_utf8(out.stdout).unwrap();
    for key in ["losses", "max_rel_err"] {
        assert_eq!(printed(&mpi, key), printed(&threads, key), "{key}");
    }
    let t: serde_json::Value = serde_json::from_str(&threads).unwrap();
    assert_eq!(v["check"]["worst"], t["check"]["worst"]);
}

/// Runs the 4-process job `--pp 2 --dp 2 --schedule 1f1b --inject-failure FAILURE` and
/// `extra`, and asserts it ends, unsuccessfully, within 30 s; returns its output and time.
fn fails_within_30_s(failure: &str, extra: &[&str]) -> (Output, Duration) {
    let mut args = BASE.to_vec();
    args.extend([
        "--pp",
        "2",
        "--dp",
        "2",
        "--schedule",
        "1f1b",
        "--inject-failure",
        failure,
    ]);
    args.extend(extra);
    let start = Instant::now();
    let out = mpirun("4", &args);
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(elapsed.as_secs_f64() < 30.0, "took {elapsed:?}: {stderr}");
    assert!(!out.status.success(), "{stderr}");
    (out, elapsed)
}

#[test]
fn an_injected_failure_ends_every_process_quickly() {
    let (out, _) = fails_within_30_s("3:2", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {stderr}"));
    assert!(
        line.contains("rank 3 (replica 1, pipeline rank 1) failed at step 2, action "),
        "{line}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn a_job_of_the_wrong_size_is_refused() {
    let mut args = BASE.to_vec();
    args.extend(["--pp", "2", "--schedule", "1f1b"]);
    let out = mpirun("4", &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("mpirun -np 2"), "{stderr}");
}

/// `--inject-failure 2:2:kill`: rank 2's process dies at once (SIGKILL) without our error line,
/// as a killed process would; mpirun ends the other three, names the dead rank and exits
/// non-zero within 30 s, and neither the JSON nor the trace is written.
#[test]
fn a_killed_process_ends_the_job_quickly_naming_its_rank() {
    let trace = std::env::temp_dir().join(format!("autopp-mpi-kill-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&trace);
    let trace_arg = trace.to_string_lossy().into_owned();
    let (out, elapsed) = fails_within_30_s("2:2:kill", &["--json", "--trace", &trace_arg]);
    eprintln!(
        "a killed rank 2 of 4 ended the job in {:.2} s ({})",
        elapsed.as_secs_f64(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!trace.exists(), "{} was written", trace.display());
    // the dead rank printed nothing of its own: no error line, no JSON from rank 0
    assert!(
        !stderr.lines().any(|l| l.starts_with("error: ")),
        "{stderr}"
    );
    assert!(!stdout.contains('{'), "{stdout}");
    // Open MPI 4: "mpirun noticed that process rank 2 with PID 1234 on node x exited on
    // signal 9 (Killed)."
    let all = format!("{stdout}{stderr}");
    assert!(
        all.contains("process rank 2 with PID") && all.contains("signal 9"),
        "{all}"
    );
}
