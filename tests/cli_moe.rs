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

/// `plan --moe-imbalance F` plans under that load, writes it into the plan file, and
/// `estimate --plan` reads it back: the same prediction bit for bit. The same degrees under a
/// larger factor are slower.
#[test]
fn moe_imbalance_is_planned_recorded_and_reread() {
    let dir = std::env::temp_dir().join(format!("autopp-cli-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pinned = "tp=1,pp=2,ep=8,mbs=1,schedule=1f1b,recompute=full,zero=1";
    let mut times = Vec::new();
    for f in ["1", "1.5"] {
        let path = dir.join(format!("plan-{f}.json"));
        let path = path.to_str().unwrap();
        let v = plan_json(&["--fix", pinned, "--moe-imbalance", f, "--out", path]);
        let file: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(file["plan"]["moe_imbalance"], f.parse::<f64>().unwrap());
        let out = autopp(&["estimate", "--plan", path, "--json", "--no-advice"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let again: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let t = &v["predicted"]["iteration_time_s"];
        assert_eq!(&again["predicted"]["iteration_time_s"], t, "imbalance {f}");
        times.push(v["predicted"]["breakdown_s"]["compute"].as_f64().unwrap());
    }
    assert!(times[0] < times[1], "compute {times:?}");
    std::fs::remove_dir_all(&dir).ok();
    let mut args: Vec<&str> = QWEN.to_vec();
    args.extend_from_slice(&["--moe-imbalance", "0.5"]);
    fails_one_line(&args, "--moe-imbalance");
}

/// `autopp launch` for an MoE plan: Megatron-LM gets the expert flags with the plan's degrees
/// (the frameworks' own check is `tests/launch_frameworks.rs`); DeepSpeed and torchtitan refuse
/// in one line.
#[test]
fn moe_plans_launch_on_megatron_and_are_refused_elsewhere() {
    let dir = std::env::temp_dir().join(format!("autopp-cli-moe-launch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("plan.json");
    let path = path.to_str().unwrap();
    let v = plan_json(&["--framework", "megatron", "--fix", "ep=8", "--out", path]);
    let out = autopp(&["launch", path, "--framework", "megatron", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let launch: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let args: Vec<&str> = launch["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let value = |flag: &str| args.iter().position(|a| *a == flag).map(|i| args[i + 1]);
    assert_eq!(value("--num-experts"), Some("128"));
    assert_eq!(value("--moe-router-topk"), Some("8"));
    assert_eq!(value("--moe-ffn-hidden-size"), Some("768"));
    assert_eq!(value("--expert-model-parallel-size"), Some("8"));
    let etp = v["plan"]["etp"].to_string();
    assert_eq!(value("--expert-tensor-parallel-size"), Some(etp.as_str()));
    assert_eq!(value("--kv-channels"), Some("128"));
    assert!(args.contains(&"--qk-layernorm") && args.contains(&"--moe-grouped-gemm"));
    // Megatron-Core's runtime has the all-to-all overlap off: the flag is not written
    assert!(!args.contains(&"--overlap-moe-expert-parallel-comm"));
    fails_one_line(
        &["launch", path, "--framework", "deepspeed"],
        "cannot express this plan",
    );
    fails_one_line(&["launch", path, "--framework", "torchtitan"], "torchtitan");
    std::fs::remove_dir_all(&dir).ok();
}
