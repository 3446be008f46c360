//! `autopp compare` (issue #22): two plan files side by side, every term with B − A.

mod common;

use common::{autopp, stdout};

/// Plans Llama 2 13B on 32 A100 80GB into `dir/NAME.json`, with `extra` flags.
fn plan(dir: &std::path::Path, name: &str, extra: &[&str]) -> String {
    let path = dir
        .join(format!("{name}.json"))
        .to_string_lossy()
        .into_owned();
    let mut args = vec![
        "plan",
        "tests/launch/llama2-13b.json",
        "--gpus",
        "32",
        "--gpu",
        "a100-80g",
        "--global-batch",
        "1024",
        "--out",
        &path,
    ];
    args.extend(extra);
    stdout(&args);
    path
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("autopp-compare-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temporary directory");
    dir
}

#[test]
fn two_plans_side_by_side_with_every_term() {
    let dir = tempdir("text");
    let a = plan(&dir, "best", &[]);
    let b = plan(&dir, "pp2-full", &["--fix", "pp=2,recompute=full"]);
    let text = stdout(&["compare", &a, &b]).replace(&*dir.to_string_lossy(), "DIR");
    insta::assert_snapshot!("compare_llama2_13b_32_a100", text);
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&["compare", &a, &b, "--json"])).expect("JSON");
    let terms = v["terms_s"].as_array().expect("terms_s");
    let names: Vec<&str> = terms.iter().map(|t| t[0].as_str().unwrap_or("")).collect();
    assert_eq!(
        names,
        [
            "compute",
            "bubble",
            "tp/cp comm",
            "pp p2p",
            "dp comm",
            "optimizer",
            "iteration"
        ]
    );
    // B − A of every term is B's figure minus A's
    for t in terms {
        let (x, y, d) = (t[1].as_f64(), t[2].as_f64(), t[3].as_f64());
        assert!((y.unwrap() - x.unwrap() - d.unwrap()).abs() < 1e-9, "{t}");
    }
    assert!(
        v["b_over_a"].as_f64().expect("b_over_a") > 0.0,
        "full recompute is slower"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_plan_file_is_one_line_naming_it() {
    let dir = tempdir("missing");
    let a = plan(&dir, "best", &[]);
    let out = autopp(&["compare", &a, "no-such-plan.json"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("error: B.json: cannot read 'no-such-plan.json'"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
