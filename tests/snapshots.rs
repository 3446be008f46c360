//! Snapshot tests (`insta`) of every text format autopp emits: the `plan` and `estimate`
//! tables, ASCII timelines, the SVG Gantt chart, Megatron-LM layout strings and the validation
//! report. A change to any of them shows up as a diff to review (`cargo insta review`, or
//! `INSTA_UPDATE=always cargo test --test snapshots` and read `git diff`).

mod common;

use common::stdout;

/// The output without the lines that hold wall-clock times.
fn stable(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with("searched "))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn plan_tables() {
    insta::assert_snapshot!(
        "plan_llama3_70b_64",
        stable(&stdout(&["plan", "llama3-70b", "--gpus", "64"]))
    );
    insta::assert_snapshot!(
        "plan_gpt3_175b_1024",
        stable(&stdout(&[
            "plan",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--gpu",
            "a100-80g",
            "--global-batch",
            "1536",
        ]))
    );
    insta::assert_snapshot!(
        "plan_tiny_gpt_8_megatron",
        stable(&stdout(&[
            "plan",
            "tiny-gpt",
            "--gpus",
            "8",
            "--framework",
            "megatron",
        ]))
    );
}

#[test]
fn estimate_tables() {
    insta::assert_snapshot!(
        "estimate_llama3_70b_interleaved",
        stdout(&[
            "estimate",
            "llama3-70b",
            "--gpus",
            "64",
            "--tp",
            "8",
            "--pp",
            "4",
            "--virtual",
            "2",
            "--mbs",
            "1",
            "--recompute",
            "selective",
            "--sequence-parallel",
            "--zero",
            "1",
            "--no-advice",
        ])
    );
    insta::assert_snapshot!(
        "estimate_gpt3_zbv",
        stdout(&[
            "estimate",
            "gpt3-175b",
            "--gpus",
            "1024",
            "--gpu",
            "a100-80g",
            "--tp",
            "8",
            "--pp",
            "16",
            "--mbs",
            "1",
            "--global-batch",
            "1536",
            "--schedule",
            "zb-v",
            "--no-advice",
        ])
    );
}

#[test]
fn ascii_timelines() {
    for kind in [
        "gpipe",
        "1f1b",
        "interleaved-1f1b",
        "looped-bfs",
        "zb-h1",
        "zb-h2",
        "zb-v",
        "dualpipe-v",
        "interleaved-zb",
    ] {
        let v = match kind {
            "interleaved-1f1b" | "looped-bfs" | "interleaved-zb" | "zb-v" | "dualpipe-v" => "2",
            _ => "1",
        };
        insta::assert_snapshot!(
            format!("schedule_{kind}"),
            stdout(&[
                "schedule",
                kind,
                "--pp",
                "4",
                "--microbatches",
                "8",
                "--virtual",
                v
            ])
        );
    }
}

#[test]
fn svg_gantt() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("s.svg");
    let path = path.to_str().expect("a UTF-8 path");
    stdout(&[
        "schedule",
        "interleaved-1f1b",
        "--pp",
        "4",
        "--microbatches",
        "8",
        "--virtual",
        "2",
        "--svg",
        path,
    ]);
    let svg = std::fs::read_to_string(path).expect("the SVG was written");
    insta::assert_snapshot!("svg_interleaved_1f1b", svg);
}

#[test]
fn megatron_layouts() {
    let cases: [&[&str]; 4] = [
        &["llama3-70b", "--gpus", "64"],
        &["llama3-70b", "--gpus", "32", "--framework", "megatron"],
        &[
            "gpt3-175b",
            "--gpus",
            "64",
            "--gpu",
            "a100-80g",
            "--global-batch",
            "512",
        ],
        &["llama3-405b", "--gpus", "1024", "--framework", "megatron"],
    ];
    let mut lines = Vec::new();
    for args in cases {
        let mut full = vec!["plan"];
        full.extend_from_slice(args);
        full.push("--json");
        let v: serde_json::Value =
            serde_json::from_str(&stdout(&full)).expect("plan --json prints JSON");
        let layout = v["plan"]["megatron_layout"].as_str().unwrap_or("(none)");
        lines.push(format!("{}: {layout}", args.join(" ")));
    }
    insta::assert_snapshot!("megatron_layouts", lines.join("\n"));
}

/// The validation report as `validate` prints it (the Markdown of `--docs` runs the fit, which
/// takes minutes; its tables come from the same rows and summary).
#[test]
fn validation_report() {
    insta::assert_snapshot!(
        "validate_text",
        stdout(&["validate", "validation/published-runs.json"])
    );
}
