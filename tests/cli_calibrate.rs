//! End-to-end tests of `autopp calibrate` and of `--calibration` on `plan`, `estimate` and
//! `whatif`.

mod common;

use common::{autopp, stdout as ok};

const RUNS: &str = "tests/fixtures/fuzz/my-runs.json";
const CAL: &str = "tests/fixtures/fuzz/calibration.json";

#[test]
fn calibrate_prints_the_fit_and_writes_a_file_plan_and_estimate_read() {
    let dir = std::env::temp_dir().join(format!("autopp-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("my-cluster.json");
    let out_s = out.to_string_lossy().to_string();
    let text = ok(&["calibrate", RUNS, "--out", &out_s]);
    for needle in [
        "calibrating on 3 of 3 runs",
        "gemm_max",
        "comm_inter",
        "comm_overlap",
        "8 other knobs keep their shipped values: 3 runs determine at most 3 knobs",
        "time error on these runs (MAPE): shipped",
        "no out-of-sample error: it needs at least 4 runs",
    ] {
        assert!(text.contains(needle), "{needle:?} not in\n{text}");
    }
    let file: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(file["format"], "autopp-calibration");
    assert_eq!(file["runs"].as_array().unwrap().len(), 3);

    let base = [
        "estimate",
        "llama3-8b",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--pp",
        "2",
        "--global-batch",
        "32",
    ];
    let shipped = ok(&base);
    let mut args = base.to_vec();
    args.extend(["--calibration", out_s.as_str()]);
    let calibrated = ok(&args);
    assert!(!shipped.contains("calibrated on"));
    let label = format!("calibrated on 3 runs from {out_s}");
    assert!(calibrated.contains(&label), "{calibrated}");
    let iteration = |t: &str| {
        t.lines()
            .find(|l| l.contains("iteration"))
            .map(str::to_string)
    };
    assert_ne!(
        iteration(&shipped),
        iteration(&calibrated),
        "the knobs changed nothing"
    );

    let plan = ok(&[
        "plan",
        "llama3-8b",
        "--gpus",
        "8",
        "--global-batch",
        "32",
        "--calibration",
        CAL,
    ]);
    assert!(plan.contains("calibrated on 3 runs from"), "{plan}");
    let whatif = ok(&["whatif", "tiny-gpt", "--gpus", "8", "--calibration", CAL]);
    assert!(whatif.contains("calibrated on 3 runs from"), "{whatif}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_calibration_file_is_one_line_naming_the_field() {
    let dir = std::env::temp_dir().join(format!("autopp-badcal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = std::fs::read_to_string(CAL).unwrap();
    for (from, to, field) in [
        ("\"gemm_max\": ", "\"gemm_max\": 7.0, \"x\": ", "gemm_max"),
        ("\"version\": 1", "\"version\": 9", "version"),
        ("\"runs\": [", "\"runz\": [", "runz"),
    ] {
        let path = dir.join("bad.json");
        std::fs::write(&path, good.replacen(from, to, 1)).unwrap();
        let p = path.to_string_lossy().to_string();
        let out = autopp(&["estimate", "tiny-gpt", "--gpus", "8", "--calibration", &p]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("--calibration") && stderr.contains(field),
            "{stderr}"
        );
    }
    let out = autopp(&["calibrate", "no-such-runs.json", "--out", "x.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!std::path::Path::new("x.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
