//! Helpers the end-to-end tests share: run the `autopp` binary as a user would.

// each test crate uses its own subset
#![allow(dead_code)]

pub mod launch;

use std::process::{Command, Output};

/// Runs `autopp ARGS…` and returns what it did.
pub fn autopp(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_autopp"))
        .args(args)
        .output()
        .expect("the autopp binary runs")
}

/// Runs `autopp ARGS…`, asserts it succeeded and returns its standard output.
pub fn stdout(args: &[&str]) -> String {
    let out = autopp(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

/// The frameworks `plan --framework` and `autopp launch` emit for.
pub const FRAMEWORKS: [&str; 3] = ["megatron", "torchtitan", "deepspeed"];

/// GPUs to plan the bundled preset `name` on: enough to fit it, few enough that the search
/// takes about a second (8 below 20 B parameters, 64 below 100 B, 512 below 300 B, else 1024;
/// Megatron's search for Llama 3 405B on 512 takes minutes).
pub fn preset_gpus(name: &str) -> u64 {
    let params = autopp_models::presets::preset(name)
        .and_then(|p| p.load().ok())
        .map_or(0, |m| m.num_params());
    match params {
        p if p < 20_000_000_000 => 8,
        p if p < 100_000_000_000 => 64,
        p if p < 300_000_000_000 => 512,
        _ => 1024,
    }
}

/// What `plan PRESET --gpus N --framework FW --emit FW --out DIR` did.
#[derive(Debug, PartialEq, Eq)]
pub enum Emitted {
    /// The plan and its launch files are in DIR.
    Files,
    /// Refused up front: exit 2, one line naming the framework and why, no DIR.
    Refused(String),
}

/// Plans the bundled preset `preset` for `framework` and emits its launch files into `dir`,
/// asserting that it either wrote them (plan.json, launch.sh, sbatch.sh) or refused in one
/// line with exit 2 naming `--framework FRAMEWORK` and writing nothing.
pub fn plan_and_emit(preset: &str, framework: &str, dir: &std::path::Path) -> Emitted {
    let gpus = preset_gpus(preset).to_string();
    let out = autopp(&[
        "plan",
        preset,
        "--gpus",
        &gpus,
        "--framework",
        framework,
        "--emit",
        framework,
        "--out",
        dir.to_str().expect("UTF-8 path"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr).trim_end().to_string();
    if out.status.success() {
        for name in ["plan.json", "launch.sh", "sbatch.sh"] {
            assert!(dir.join(name).is_file(), "{preset} for {framework}: {name}");
        }
        return Emitted::Files;
    }
    assert_eq!(
        out.status.code(),
        Some(2),
        "{preset} for {framework}: {err}"
    );
    assert_eq!(
        err.lines().count(),
        1,
        "{preset} for {framework}: one line: {err}"
    );
    assert!(
        err.contains(&format!("--framework {framework}: ")),
        "{preset} for {framework}: names the framework: {err}"
    );
    assert!(!dir.exists(), "{preset} for {framework}: nothing written");
    Emitted::Refused(err)
}

/// Whether `framework` refuses the bundled preset `preset` whatever the plan: torchtitan builds
/// Llama 3- and Qwen3-style decoders only.
pub fn refuses_preset(framework: &str, preset: &str) -> bool {
    not_launched_yet(framework, preset)
        || (framework == "torchtitan"
            && !preset.starts_with("llama")
            && !preset.starts_with("qwen3"))
}

/// Whether the bundled preset `preset` has parts `framework`'s launch flags are not written for
/// yet: gpt-oss attention (sliding windows, sinks) for every framework; mixtures of experts,
/// MLA and MTP for all but Megatron-LM; Qwen3 attention for DeepSpeed.
pub fn not_launched_yet(framework: &str, preset: &str) -> bool {
    matches!(autopp_models::load(preset), Ok(autopp_models::Model::Transformer(t))
        if t.sliding_window.is_some() || t.attention_sinks
            || (framework != "megatron" && (t.moe.is_some() || t.mla.is_some()
                || t.mtp_num_layers > 0))
            || (framework == "deepspeed" && (t.head_dim.is_some() || t.qk_norm)))
}

/// Runs `autopp ARGS…` and asserts it failed as every bad input must: exit 2, one line on
/// stderr containing `needle`, no panic, nothing on stdout.
pub fn fails_one_line(args: &[&str], needle: &str) {
    let out = autopp(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        stderr.trim_end().lines().count(),
        1,
        "not one line: {stderr}"
    );
    assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
    assert!(out.stdout.is_empty(), "{args:?} printed on stdout");
}
