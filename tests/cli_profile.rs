//! End-to-end tests of `autopp profile` and of `estimate --profile` / `plan --profile`.

mod common;

use common::{autopp, stdout};

fn one_line_error(args: &[&str], needle: &str) {
    let out = autopp(args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
}

fn iteration_s(args: &[&str]) -> f64 {
    let v: serde_json::Value = serde_json::from_str(&stdout(args)).unwrap();
    v["predicted"]["iteration_time_s"].as_f64().unwrap()
}

#[test]
fn a_measured_profile_replaces_the_analytic_layer_times() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.profile.json");
    let path = file.to_str().unwrap();
    let out = stdout(&[
        "profile",
        "--backend",
        "cpu",
        "tiny-gpt",
        "--mbs",
        "2",
        "--seq-len",
        "32",
        "--repetitions",
        "1",
        "--out",
        path,
    ]);
    assert!(out.contains("layer 7") && out.contains("head"), "{out}");
    let p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(p["format"], "autopp-profile/1");
    assert_eq!(p["layers"].as_array().unwrap().len(), 10);
    assert!(p["layers"][1]["forward_s"].as_f64().unwrap() > 0.0);
    // only the profile is left behind (no temporary file)
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    let estimate = [
        "estimate",
        "tiny-gpt",
        "--gpus",
        "2",
        "--pp",
        "2",
        "--mbs",
        "2",
        "--global-batch",
        "16",
        "--json",
    ];
    let analytic = iteration_s(&estimate);
    let mut with = estimate.to_vec();
    with.extend(["--profile", path]);
    let measured = iteration_s(&with);
    // a CPU core is orders of magnitude slower than an H100's roofline
    assert!(measured > 20.0 * analytic, "{measured} vs {analytic}");

    let plan = stdout(&[
        "plan",
        "tiny-gpt",
        "--gpus",
        "2",
        "--profile",
        path,
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&plan).unwrap();
    assert!(v["predicted"]["iteration_time_s"].as_f64().unwrap() > 20.0 * analytic);

    one_line_error(
        &["estimate", "gpt3-175b", "--gpus", "8", "--profile", path],
        "was measured for 'tiny-gpt'",
    );
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"format\": 1}").unwrap();
    let mut with = estimate.to_vec();
    with.extend(["--profile", bad.to_str().unwrap()]);
    one_line_error(&with, "bad.json");
}

#[test]
fn profile_refuses_what_it_cannot_time() {
    one_line_error(
        &["profile", "llama3-8b", "--out", "/nonexistent/x.json"],
        "exec does not implement",
    );
    one_line_error(
        &["profile", "tiny-gpt", "--mbs", "0", "--out", "x.json"],
        "--mbs",
    );
}
