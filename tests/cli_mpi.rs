//! `exec --transport mpi` under `mpirun` (feature `mpi`; needs Open MPI): the 4-rank grids of
//! the acceptance (p = 2, dp = 2 and p = 4, dp = 1) pass `--check`, and an injected failure
//! ends every process within 30 s with the failing rank's error line.
#![cfg(feature = "mpi")]

use std::process::{Command, Output};
use std::time::Instant;

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

fn passes_check(extra: &[&str]) -> serde_json::Value {
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
    v
}

#[test]
fn four_ranks_as_two_pipelines_of_two_match_single_worker_training() {
    let v = passes_check(&["--pp", "2", "--dp", "2", "--schedule", "1f1b"]);
    assert_eq!(v["dp"], 2);
}

#[test]
fn four_ranks_as_one_pipeline_of_four_match_single_worker_training() {
    let v = passes_check(&["--pp", "4", "--schedule", "zb-h1"]);
    assert_eq!(v["pp"], 4);
}

#[test]
fn an_injected_failure_ends_every_process_quickly() {
    let mut args = BASE.to_vec();
    args.extend([
        "--pp",
        "2",
        "--dp",
        "2",
        "--schedule",
        "1f1b",
        "--inject-failure",
        "3:2",
    ]);
    let start = Instant::now();
    let out = mpirun("4", &args);
    let elapsed = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(elapsed.as_secs_f64() < 30.0, "took {elapsed:?}: {stderr}");
    assert!(!out.status.success(), "{stderr}");
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
