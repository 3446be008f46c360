//! `autopp compare` (issue #22): two plan files side by side, every term with B − A.

mod common;

use common::{autopp, fails_one_line, stdout};

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

#[test]
fn estimate_set_changes_a_plan_file() {
    let dir = tempdir("set");
    let a = plan(&dir, "best", &[]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&[
        "estimate",
        "--plan",
        &a,
        "--set",
        "tp=4,pp=2,recompute=full",
        "--json",
        "--no-advice",
    ]))
    .expect("JSON");
    let p = &v["plan"];
    assert_eq!((p["tp"].as_u64(), p["pp"].as_u64()), (Some(4), Some(2)));
    assert_eq!(p["dp"].as_u64(), Some(4), "dp refills the plan's 32 GPUs");
    assert_eq!(p["recompute"], "full");
    let set = |s: &'static str| ["estimate", "--plan", "PLAN", "--set", s];
    for (s, wanted) in [
        ("tpp=4", "--set: unknown key 'tpp'; keys: tp, pp, dp"),
        ("tp=abc", "--set: tp=abc: give a whole number from 1 to 32"),
        (
            "tp=3",
            "--set: tp · pp · cp = 3 does not divide the plan's 32 GPUs",
        ),
        ("recompute=most", "--set: recompute=most: "),
        ("tp", "--set: 'tp' is not KEY=VALUE"),
    ] {
        let mut args = set(s);
        args[2] = &a;
        fails_one_line(&args, wanted);
    }
    fails_one_line(
        &["estimate", "tiny-gpt", "--gpus", "8", "--set", "tp=2"],
        "--set: changes a plan file (--plan FILE)",
    );
    fails_one_line(
        &["estimate", "--plan", &a, "--tp", "4"],
        "'--plan <FILE>' cannot be used with '--tp <T>'",
    );
    let _ = std::fs::remove_dir_all(&dir);
}
