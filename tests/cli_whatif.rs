//! End-to-end tests of `autopp whatif` as a user runs it.

mod common;

use common::{fails_one_line, stdout};

#[test]
fn a_sweep_prints_a_row_per_point_and_writes_its_files_whole() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("sweep");
    let out = out.to_str().expect("UTF-8 path");
    let text = stdout(&[
        "whatif",
        "llama3-8b",
        "--gpus",
        "8..32",
        "--gpu",
        "h100-sxm,a100-80g",
        "--tokens",
        "1T",
        "--price",
        "h100-sxm=3,a100-80g=2",
        "--out",
        out,
    ]);
    assert!(text.contains("fixed global batch"), "{text}");
    assert!(text.contains("prices: --price"), "{text}");
    let rows = text
        .lines()
        .filter(|l| l.starts_with("h100-sxm") || l.starts_with("a100-80g"));
    assert_eq!(rows.count(), 6, "{text}");
    for f in [
        "rows.json",
        "rows.csv",
        "table.txt",
        "throughput.svg",
        "throughput.png",
        "mfu.png",
        "time-to-train.png",
        "cost-vs-time.svg",
        "breakdown.png",
    ] {
        let path = std::path::Path::new(out).join(f);
        assert!(path.metadata().is_ok_and(|m| m.len() > 0), "{f} missing");
    }
    let leftovers: Vec<_> = std::fs::read_dir(out)
        .expect("dir")
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(std::path::Path::new(out).join("rows.json")).expect("rows"),
    )
    .expect("JSON");
    let first = &json[0]["plan"];
    assert!(
        first["tp"].as_u64().is_some() && first["cost_usd"].as_f64().is_some(),
        "{json}"
    );
}

#[test]
fn csv_has_a_header_and_a_line_per_point() {
    let text = stdout(&[
        "whatif",
        "llama3-8b",
        "--gpus",
        "8,16",
        "--batch-per-gpu",
        "64K",
        "--csv",
    ]);
    let lines: Vec<_> = text.lines().collect();
    assert!(lines[0].starts_with("gpu,gpus,"), "{text}");
    assert_eq!(lines.len(), 3, "{text}");
}

#[test]
fn bad_input_gets_one_line_naming_the_flag() {
    let base = ["whatif", "llama3-8b"];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    fails_one_line(
        &with(&["--gpus", "512..64"]),
        "--gpus: the range 512..64 is empty",
    );
    fails_one_line(&with(&["--gpus", "0"]), "--gpus");
    fails_one_line(&with(&["--gpus", "8", "--gpu", "h900"]), "h900");
    fails_one_line(
        &with(&["--gpus", "8", "--tokens", "1T", "--price", "b300=9"]),
        "--price: a price for b300",
    );
    fails_one_line(&with(&["--gpus", "8", "--tokens", "0"]), "--tokens");
    fails_one_line(&with(&["--gpus", "8", "--price", "h100-sxm=-2"]), "--price");
}

#[test]
fn a_point_that_does_not_fill_whole_nodes_is_a_row_that_says_so() {
    let text = stdout(&["whatif", "llama3-8b", "--gpus", "8,12"]);
    let row = text
        .lines()
        .find(|l| l.starts_with("h100-sxm") && l.contains(" 12 "))
        .expect("row");
    assert!(
        row.contains("no plan: --gpus 12 GPUs do not fill whole nodes of 8"),
        "{row}"
    );
}
