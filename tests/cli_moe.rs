//! End-to-end tests of `plan` and `estimate` on mixtures of experts: the expert pins
//! (`--fix ep=E,etp=T`) and the routing imbalance (`--moe-imbalance`).

mod common;

use common::{autopp, fails_one_line};

/// Qwen3-30B-A3B (128 routed experts, expert FFN 768) on 16 H100 (on 8 nothing fits): answers
/// in a fraction of a second.
const QWEN: [&str; 4] = ["plan", "qwen3-30b-a3b", "--gpus", "16"];

fn plan_json(extra: &[&str]) -> serde_json::Value {
    let mut args: Vec<&str> = QWEN.to_vec();
    args.extend_from_slice(extra);
    args.push("--json");
    let out = autopp(&args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn fix_ep_and_etp_pin_the_expert_degrees() {
    for ep in ["1", "2", "8"] {
        let v = plan_json(&["--fix", &format!("ep={ep}")]);
        assert_eq!(v["plan"]["ep"].to_string(), ep, "--fix ep={ep}");
    }
    let v = plan_json(&["--fix", "tp=2,ep=4,etp=2"]);
    assert_eq!(
        (&v["plan"]["tp"], &v["plan"]["ep"], &v["plan"]["etp"]),
        (&2.into(), &4.into(), &2.into())
    );
}

#[test]
fn bad_expert_pins_get_one_line_and_exit_2() {
    let with = |fix: &str| {
        let mut a: Vec<&str> = QWEN.to_vec();
        a.extend_from_slice(&["--fix", fix]);
        a.iter().map(|s| s.to_string()).collect::<Vec<String>>()
    };
    let cases = [
        // 128 experts: 3 does not divide them
        (
            "ep=3",
            "power of two dividing qwen3-30b-a3b's 128 routed experts",
        ),
        // 16 GPUs cannot fold ep 32
        (
            "ep=32",
            "ep · etp = 32 does not divide the 16 GPUs of a pipeline rank",
        ),
        // pp 4 leaves 4 GPUs per rank: ep 4 · etp 2 = 8 does not fold onto them
        (
            "pp=4,ep=4,etp=2",
            "does not divide the 4 GPUs of a pipeline rank",
        ),
        // expert FFN 768 = 2^8 · 3: etp 512 does not split it
        ("etp=512", "etp must divide the expert FFN size 768"),
        ("tp=4,etp=2", "etp must be 1 or tp (4)"),
        ("ep=0", "ep=0: expected a positive whole number"),
    ];
    for (fix, needle) in cases {
        let args = with(fix);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_one_line(&args, needle);
    }
    fails_one_line(
        &["plan", "llama3-8b", "--gpus", "8", "--fix", "ep=2"],
        "model 'llama3-8b' has no experts",
    );
    fails_one_line(
        &[
            "plan",
            "qwen3-30b-a3b",
            "--gpus",
            "16",
            "--framework",
            "deepspeed",
            "--fix",
            "etp=2",
        ],
        "DeepSpeed-MoE does not split experts",
    );
}
