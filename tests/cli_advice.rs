//! `estimate` as advice (issue #22): the defaults it takes from `plan` and says, its gap to the
//! best plan, and the cheapest change that closes most of it.

mod common;

use common::{autopp, fails_one_line, stdout};

/// A colleague's Llama 2 13B configuration on 32 A100 80GB: tp 2 · pp 2 with full recompute,
/// no sequence parallelism and no sharded optimizer.
const COLLEAGUE: [&str; 18] = [
    "estimate",
    "tests/launch/llama2-13b.json",
    "--gpus",
    "32",
    "--gpu",
    "a100-80g",
    "--tp",
    "2",
    "--pp",
    "2",
    "--recompute",
    "full",
    "--sequence-parallel",
    "off",
    "--zero",
    "0",
    "--global-batch",
    "1024",
];

#[test]
fn the_colleague_config_gets_its_gap_and_a_fix() {
    let text = stdout(&COLLEAGUE);
    let advice = &text[text.find("  defaults used").expect("a defaults line")..];
    insta::assert_snapshot!("advice_llama2_13b_32_a100", advice);
}

#[test]
fn json_holds_the_gap_and_the_fix() {
    let mut args = COLLEAGUE.to_vec();
    args.push("--json");
    let v: serde_json::Value = serde_json::from_str(&stdout(&args)).expect("JSON");
    let slower = v["gap"]["slower_by"].as_f64().expect("gap.slower_by");
    assert!(slower > 0.3, "{slower}");
    let fix = &v["fix"];
    assert!(fix["recovered"].as_f64().expect("fix.recovered") >= 0.7);
    assert_eq!(fix["enough"], true);
    assert!(!fix["changes"].as_array().expect("changes").is_empty());
    assert_eq!(v["defaults_used"][0], "megatron-core runtime");
}

#[test]
fn defaults_follow_plan_and_are_stated() {
    let text = stdout(&[
        "estimate",
        "tiny-gpt",
        "--gpus",
        "8",
        "--tp",
        "2",
        "--no-advice",
    ]);
    assert!(text.contains("sequence parallel on · ZeRO 1"), "{text}");
    assert!(
        text.contains("defaults used: megatron-core runtime, sequence parallel on (tp ≥ 2), ZeRO 1 (distributed optimizer), recompute none, bf16"),
        "{text}"
    );
    assert!(!text.contains("\nadvice\n"));
    // one replica: nothing to shard; tp 1: no sequence parallelism
    let one = stdout(&[
        "estimate",
        "tiny-gpt",
        "--gpus",
        "8",
        "--pp",
        "8",
        "--no-advice",
    ]);
    assert!(one.contains("sequence parallel off · ZeRO 0"), "{one}");
}

#[test]
fn the_best_plan_itself_has_no_gap() {
    // what plan finds for tiny-gpt on 8 GPUs, estimated: no gap, no fix
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&["plan", "tiny-gpt", "--gpus", "8", "--json"]))
            .expect("JSON");
    let p = &v["plan"];
    let s = |k: &str| p[k].to_string().trim_matches('"').to_string();
    let (tp, pp, dp, mbs) = (s("tp"), s("pp"), s("dp"), s("micro_batch_size"));
    let sp = if p["sequence_parallel"] == true {
        "on"
    } else {
        "off"
    };
    let (zero, recompute, schedule) = (s("zero_stage"), s("recompute"), s("schedule"));
    let v_ = s("virtual_stages");
    let out = autopp(&[
        "estimate",
        "tiny-gpt",
        "--gpus",
        "8",
        "--tp",
        &tp,
        "--pp",
        &pp,
        "--dp",
        &dp,
        "--mbs",
        &mbs,
        "--sequence-parallel",
        sp,
        "--zero",
        &zero,
        "--recompute",
        &recompute,
        "--schedule",
        &schedule,
        "--virtual",
        &v_,
        "--framework",
        "any",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("  gap           none"), "{text}");
}

#[test]
fn batch_units_and_time_to_train() {
    let base = [
        "estimate",
        "llama3-8b",
        "--gpus",
        "64",
        "--tp",
        "2",
        "--no-advice",
    ];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    // tokens typed as sequences: 4,194,304 × 8,192 tokens
    fails_one_line(
        &with(&["--global-batch", "4194304"]),
        "--global-batch: 4194304 sequences × 8192 tokens = 34.4B tokens per iteration; did you mean --global-batch-tokens 4194304? (--huge-batch if you mean it)",
    );
    fails_one_line(
        &with(&["--global-batch-tokens", "4M"]),
        "--global-batch-tokens: 4M tokens is not a whole number of 8192-token sequences",
    );
    fails_one_line(
        &with(&["--train-tokens", "1Q"]),
        "--train-tokens: '1Q': unknown suffix",
    );
    fails_one_line(
        &with(&["--train-tokens", "1T", "--price", "NaN"]),
        "--price: NaN is not a price",
    );
    fails_one_line(
        &[
            "plan",
            "llama3-8b",
            "--gpus",
            "64",
            "--global-batch",
            "4194304",
        ],
        "did you mean --global-batch-tokens 4194304?",
    );
    // 4,194,304 tokens = 512 sequences of 8,192; at that batch the time to train 1T tokens
    let text = stdout(&with(&[
        "--global-batch-tokens",
        "4194304",
        "--train-tokens",
        "1T",
        "--price",
        "2",
    ]));
    assert!(
        text.contains(
            "→ global batch 512 (4,194,304 tokens of 8,192 per sequence, from the preset)"
        ),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("  to train"))
        .expect("a to-train line");
    assert!(line.starts_with("  to train      1.0T tokens: "), "{line}");
    assert!(
        line.contains(" GPU-hours · $") && line.ends_with(" at $2.00/GPU-hour"),
        "{line}"
    );
}
