//! Every real Hugging Face config in `tests/fixtures/hf-configs/` (a copy of
//! `shared/data/hf-configs/`) either estimates and plans, or says in one line exactly what it
//! lacks. One test per file.

mod common;

use common::autopp;

/// What a file must do.
enum Expect {
    /// Estimate and plan succeed.
    Runs,
    /// Estimates; plans, or says in one line that nothing fits (DeepSeek-V3's 671B on 128 GPUs
    /// without expert parallelism in the search).
    RunsOrNothingFits,
}

fn check(file: &str, expect: Expect) {
    let path = format!("tests/fixtures/hf-configs/{file}");
    let estimate = [
        "estimate", &path, "--gpus", "128", "--tp", "4", "--pp", "2", "--json",
    ];
    let plan = ["plan", &path, "--gpus", "128", "--json"];
    for args in [&estimate[..], &plan[..]] {
        let out = autopp(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        let needle = match expect {
            Expect::Runs => {
                assert!(out.status.success(), "{args:?}: {stderr}");
                let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
                assert!(json["predicted"]["iteration_time_s"].as_f64().unwrap() > 0.0);
                continue;
            }
            Expect::RunsOrNothingFits if out.status.success() => continue,
            Expect::RunsOrNothingFits => "nothing fits",
        };
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn deepseek_v3() {
    check("deepseek-v3.json", Expect::RunsOrNothingFits);
}

#[test]
fn gpt_oss_120b() {
    check("gpt-oss-120b.json", Expect::Runs);
}

#[test]
fn gpt2_large() {
    check("gpt2-large.json", Expect::Runs);
}

#[test]
fn llama2_70b() {
    check("llama2-70b.json", Expect::Runs);
}

#[test]
fn llama2_7b() {
    check("llama2-7b.json", Expect::Runs);
}

#[test]
fn llama3_1_405b() {
    check("llama3.1-405b.json", Expect::Runs);
}

#[test]
fn llama3_1_70b() {
    check("llama3.1-70b.json", Expect::Runs);
}

#[test]
fn llama3_1_8b() {
    check("llama3.1-8b.json", Expect::Runs);
}

#[test]
fn mixtral_8x22b() {
    check("mixtral-8x22b.json", Expect::Runs);
}

#[test]
fn mixtral_8x7b() {
    check("mixtral-8x7b.json", Expect::Runs);
}

#[test]
fn qwen2_5_72b() {
    check("qwen2.5-72b.json", Expect::Runs);
}

#[test]
fn qwen2_5_7b() {
    check("qwen2.5-7b.json", Expect::Runs);
}

#[test]
fn qwen3_235b_a22b() {
    check("qwen3-235b-a22b.json", Expect::Runs);
}

#[test]
fn qwen3_30b_a3b() {
    check("qwen3-30b-a3b.json", Expect::Runs);
}

#[test]
fn qwen3_32b() {
    // head_dim 128 differs from hidden_size / heads = 80: the query width is 64·128 = 8192
    check("qwen3-32b.json", Expect::Runs);
}

#[test]
fn every_file_has_a_test() {
    let source = include_str!("hf_configs.rs");
    for entry in std::fs::read_dir("tests/fixtures/hf-configs").unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".json") {
            assert!(
                source.contains(&format!("check(\"{name}\""))
                    || source.contains(&format!("\"{name}\",")),
                "{name} has no test"
            );
        }
    }
}
