//! Launch files checked by the frameworks' own code (issue #17): plans made by `autopp plan`,
//! their files from `autopp launch`, fed to Megatron-Core (`PipelineParallelLayerLayout`,
//! `TransformerConfig`), torchtitan (`ConfigManager().parse_args`, its stage split and
//! PyTorch's schedules) and DeepSpeed (`DeepSpeedConfig`, `PipelineModule`'s partitioning) by
//! `tests/launch/check_frameworks.py`, which compares every framework's layer assignment with
//! the plan's, stage by stage.
//!
//! Every bundled preset is also planned for every framework (`plan --framework X --emit X`):
//! each plan either passes the same check or was refused up front in one line.
//!
//! The Python environment (several GB) lives outside the clone: `scripts/python-env.sh` makes
//! it at `${AUTOPP_VENV:-~/.cache/autopp/venv}`. When `AUTOPP_VENV` is set or `CI` is, a missing
//! environment fails the test; otherwise the test says why it skips.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{autopp, plan_and_emit, preset_gpus, refuses_preset, Emitted, FRAMEWORKS};
use serde_json::Value;

/// One plan: a name, `autopp plan`'s arguments, the frameworks that must run it.
struct Case {
    name: &'static str,
    plan: &'static str,
    frameworks: &'static [&'static str],
}

/// The plans: every preset family, 8 to 16,384 GPUs, every schedule each framework runs
/// (`plan --framework X` searches among them, the others pin a configuration).
const CASES: &[Case] = &[
    // recompute pinned: at a margin of 0 the search may recompute a few layers per rank,
    // which DeepSpeed's `activation_checkpoint_interval` cannot express
    Case { name: "llama3-70b-64-megatron", plan: "llama3-70b --gpus 64 --framework megatron --fix cp=1,recompute=none", frameworks: &["megatron", "deepspeed"] },
    Case { name: "gpt3-175b-1024-megatron", plan: "gpt3-175b --gpus 1024 --gpu a100-80g --framework megatron", frameworks: &["megatron"] },
    Case { name: "llama3-405b-16384-megatron", plan: "llama3-405b --gpus 16384 --framework megatron", frameworks: &["megatron"] },
    Case { name: "llama3-8b-8-selective", plan: "llama3-8b --gpus 8 --fix tp=2,pp=4,dp=1,virtual_stages=1,micro_batch_size=1,schedule=1f1b,recompute=selective,zero_stage=0,sequence_parallel=true --even-split", frameworks: &["megatron", "torchtitan"] },
    Case { name: "gpt3-175b-512-interleaved-full", plan: "gpt3-175b --gpus 512 --gpu a100-80g --fix tp=8,pp=8,dp=8,virtual_stages=3,micro_batch_size=1,schedule=interleaved-1f1b,recompute=full,zero_stage=1 --even-split", frameworks: &["megatron"] },
    Case { name: "bloom-176b-384-fp16", plan: "bloom-176b --gpus 384 --gpu a100-80g --precision fp16 --fix tp=8,pp=12,dp=4,virtual_stages=1,schedule=1f1b,zero_stage=1 --even-split", frameworks: &["megatron"] },
    Case { name: "llama2-70b-128-cp2", plan: "llama2-70b --gpus 128 --framework megatron --fix tp=8,pp=4,dp=2,cp=2,schedule=interleaved-1f1b,virtual_stages=2,zero_stage=1", frameworks: &["megatron"] },
    Case { name: "mt-nlg-530b-2240", plan: "mt-nlg-530b --gpus 2240 --gpu a100-80g --global-batch 1920 --framework megatron --fix tp=8,pp=35,dp=8,schedule=1f1b,zero_stage=1", frameworks: &["megatron"] },
    Case { name: "megatron-1t-3072", plan: "megatron-1t --gpus 3072 --gpu a100-80g --global-batch 3072 --framework megatron --fix tp=8,pp=64,dp=6,schedule=1f1b,zero_stage=1", frameworks: &["megatron"] },
    Case { name: "llama3-8b-8-torchtitan", plan: "llama3-8b --gpus 8 --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "llama3-70b-64-torchtitan", plan: "llama3-70b --gpus 64 --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "llama3-405b-16384-torchtitan", plan: "llama3-405b --gpus 16384 --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "llama3-8b-32-gpipe", plan: "llama3-8b --gpus 32 --global-batch 64 --framework torchtitan --fix tp=1,pp=4,dp=8,schedule=gpipe,zero_stage=0,micro_batch_size=1", frameworks: &["torchtitan"] },
    Case { name: "llama3-70b-128-zb-v", plan: "llama3-70b --gpus 128 --framework torchtitan --fix tp=8,pp=4,dp=4,virtual_stages=2,micro_batch_size=1,schedule=zb-v,zero_stage=2", frameworks: &["torchtitan"] },
    Case { name: "llama3-70b-256-dualpipe-v", plan: "llama3-70b --gpus 256 --framework torchtitan --fix tp=8,pp=4,dp=8,schedule=dualpipe-v,zero_stage=2,micro_batch_size=1", frameworks: &["torchtitan"] },
    Case { name: "llama3-8b-64-looped-bfs", plan: "llama3-8b --gpus 64 --global-batch 128 --framework torchtitan --fix tp=2,pp=4,dp=8,virtual_stages=2,schedule=looped-bfs,zero_stage=2,micro_batch_size=1", frameworks: &["torchtitan"] },
    Case { name: "llama3-70b-512-zb-h1", plan: "llama3-70b --gpus 512 --framework torchtitan --fix tp=8,pp=8,dp=8,schedule=zb-h1,zero_stage=2,recompute=full", frameworks: &["torchtitan"] },
    Case { name: "llama3-70b-64-zb-h2", plan: "llama3-70b --gpus 64 --framework torchtitan --fix tp=8,pp=4,dp=2,schedule=zb-h2,zero_stage=2", frameworks: &["torchtitan"] },
    Case { name: "llama3-8b-8-no-pipeline", plan: "llama3-8b --gpus 8 --framework torchtitan --fix tp=1,pp=1,dp=8,zero_stage=3,recompute=full", frameworks: &["torchtitan"] },
    Case { name: "llama3-70b-128-cp2", plan: "llama3-70b --gpus 128 --framework torchtitan --fix tp=8,pp=2,dp=4,cp=2,virtual_stages=2,schedule=interleaved-1f1b,zero_stage=2", frameworks: &["torchtitan"] },
    Case { name: "llama3-8b-64-interleaved-zb", plan: "llama3-8b --gpus 64 --framework torchtitan --fix tp=2,pp=4,dp=8,virtual_stages=2,schedule=interleaved-zb,zero_stage=0,sequence_parallel=false", frameworks: &["torchtitan"] },
    Case { name: "llama2-70b-64-torchtitan", plan: "llama2-70b --gpus 64 --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "llama2-13b-16-torchtitan", plan: "tests/launch/llama2-13b.json --gpus 16 --framework torchtitan", frameworks: &["torchtitan"] },
    // Qwen3 attention (qk-norm, heads of 128) through torchtitan's Qwen3 classes: its own
    // qwen3_32b, autopp's module for an 8B and for sequences past its RoPE table of 40,960
    Case { name: "qwen3-32b-32-torchtitan", plan: "qwen3-32b --gpus 32 --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "qwen3-32b-32-megatron", plan: "qwen3-32b --gpus 32 --framework megatron", frameworks: &["megatron"] },
    Case { name: "qwen3-8b-16-torchtitan", plan: "tests/launch/qwen3-8b.json --gpus 16 --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "qwen3-32b-64-seq65536", plan: "qwen3-32b --gpus 64 --seq-len 65536 --global-batch 64 --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "bloom-176b-384-deepspeed", plan: "bloom-176b --gpus 384 --gpu a100-80g --framework deepspeed", frameworks: &["deepspeed", "megatron"] },
    Case { name: "llama3-70b-64-deepspeed", plan: "llama3-70b --gpus 64 --framework deepspeed", frameworks: &["deepspeed", "megatron"] },
    Case { name: "gpt3-175b-1024-deepspeed", plan: "gpt3-175b --gpus 1024 --gpu a100-80g --framework deepspeed --fix tp=8,pp=16,dp=8,schedule=1f1b,zero_stage=1", frameworks: &["deepspeed", "megatron"] },
    Case { name: "llama3-8b-8-fp16-full", plan: "llama3-8b --gpus 8 --precision fp16 --framework deepspeed --fix tp=1,pp=8,dp=1,schedule=1f1b,recompute=full,zero_stage=0", frameworks: &["deepspeed", "megatron"] },
    Case { name: "mt-nlg-530b-512-deepspeed", plan: "mt-nlg-530b --gpus 512 --framework deepspeed", frameworks: &["deepspeed"] },
    Case { name: "opt-175b-512-deepspeed", plan: "opt-175b --gpus 512 --gpu a100-80g --framework deepspeed", frameworks: &["deepspeed"] },
    // mixtures of experts (issue 16): experts, ep/etp, MLA, MTP in the layout, Qwen3 attention,
    // the expert all-to-all overlap
    Case { name: "qwen3-30b-a3b-16-megatron", plan: "qwen3-30b-a3b --gpus 16 --framework megatron", frameworks: &["megatron"] },
    Case { name: "qwen3-30b-a3b-16-ep-overlap", plan: "qwen3-30b-a3b --gpus 16 --framework megatron-core-ep-overlap --fix tp=1,pp=2,virtual_stages=2,ep=8,schedule=interleaved-1f1b", frameworks: &["megatron"] },
    Case { name: "deepseek-v3-1024-megatron", plan: "deepseek-v3 --gpus 1024 --global-batch 8192 --seq-len 4096 --framework megatron", frameworks: &["megatron"] },
    // FP8 through Transformer Engine: delayed and current (tensorwise) scaling on H100, MXFP8
    // on B200; the tensorwise plan is made for any framework and runs on Megatron-LM
    Case { name: "llama3-70b-64-fp8-delayed", plan: "llama3-70b --gpus 64 --precision fp8 --framework megatron", frameworks: &["megatron"] },
    Case { name: "llama3-405b-512-fp8-tensorwise", plan: "llama3-405b --gpus 512 --gpu h100-hbm2e-500w --global-batch 256 --precision fp8-tensorwise", frameworks: &["megatron"] },
    Case { name: "llama3-70b-64-mxfp8-b200", plan: "llama3-70b --gpus 64 --gpu b200 --precision mxfp8 --framework megatron", frameworks: &["megatron"] },
    // FP8 through torchao's converters in torchtitan's config functions: float8 rowwise over
    // torchtitan's llama3_8b and over autopp's 405B and custom-model modules, MXFP8 on B200
    Case { name: "llama3-8b-8-float8-titan", plan: "llama3-8b --gpus 8 --precision fp8-rowwise --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "llama3-405b-512-float8-titan", plan: "llama3-405b --gpus 512 --global-batch 256 --precision fp8-rowwise --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "llama2-13b-16-float8-titan", plan: "tests/launch/llama2-13b.json --gpus 16 --precision fp8-rowwise --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "qwen3-32b-64-float8-titan", plan: "qwen3-32b --gpus 64 --precision fp8-rowwise --framework torchtitan", frameworks: &["torchtitan"] },
    Case { name: "llama3-70b-64-mxfp8-titan", plan: "llama3-70b --gpus 64 --gpu b200 --precision mxfp8 --framework torchtitan", frameworks: &["torchtitan"] },
];

/// The environment's Python, or `None` (with the reason printed) where the test may skip.
fn python() -> Option<PathBuf> {
    let set = std::env::var_os("AUTOPP_VENV");
    let ci = std::env::var_os("CI").is_some();
    let venv = match &set {
        Some(v) => PathBuf::from(v),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/autopp/venv")
        }
    };
    let python = venv.join("bin/python");
    if python.exists() {
        return Some(python);
    }
    assert!(
        set.is_none() && !ci,
        "no Python environment at {}: run scripts/python-env.sh (AUTOPP_VENV set or CI: this check may not skip)",
        venv.display()
    );
    eprintln!(
        "skipping: no Python environment at {} and neither AUTOPP_VENV nor CI is set; run scripts/python-env.sh to check the launch files with the frameworks",
        venv.display()
    );
    None
}

/// Runs `autopp ARGS`, asserting success; returns stdout.
fn run(args: &[&str]) -> String {
    let out = autopp(args);
    assert!(
        out.status.success(),
        "autopp {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// Plans every case and writes each framework's launch files with plan.json and launch.json
/// into `root/NAME-FRAMEWORK`; returns the manifest entries.
fn emit_cases(root: &Path) -> Vec<Value> {
    let mut manifest = Vec::new();
    for case in CASES {
        let plan = root.join(format!("{}.json", case.name));
        let plan_s = plan.to_str().expect("UTF-8 path");
        let mut args: Vec<String> = vec!["plan".into()];
        // a model file of the repository's is named relative to it
        args.extend(case.plan.split_whitespace().map(|w| {
            match w.ends_with(".json") {
                true => Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join(w)
                    .display()
                    .to_string(),
                false => w.to_string(),
            }
        }));
        // pinned cases that fill memory were chosen before plans kept a margin; the launch
        // files, not the margin, are under test
        args.extend(["--memory-margin", "0", "--out", plan_s].map(String::from));
        run(&args.iter().map(String::as_str).collect::<Vec<_>>());
        for fw in case.frameworks {
            let dir = root.join(format!("{}-{fw}", case.name));
            let dir_s = dir.to_str().expect("UTF-8 path");
            let json = run(&[
                "launch",
                plan_s,
                "--framework",
                fw,
                "--json",
                "--out",
                dir_s,
            ]);
            std::fs::write(dir.join("launch.json"), json).expect("write launch.json");
            std::fs::copy(&plan, dir.join("plan.json")).expect("copy plan.json");
            manifest.push(serde_json::json!({
                "name": case.name, "framework": fw, "dir": dir_s,
            }));
        }
    }
    manifest
}

/// Every bundled preset × every framework, as `plan PRESET --framework X --emit X` makes them:
/// the files of each plan that is not refused up front (a refusal is one line, exit 2, and
/// only where the framework cannot run the model at all), with launch.json beside them.
fn emit_preset_matrix(root: &Path) -> Vec<Value> {
    let mut manifest = Vec::new();
    // mixtures of experts and Qwen3 are emitted for Megatron-LM and refused up front by the
    // others (`common::refuses_preset`)
    for preset in autopp_models::presets() {
        for fw in FRAMEWORKS {
            let dir = root.join(format!("preset-{}-{fw}", preset.name));
            let refused = plan_and_emit(preset.name, fw, &dir) != Emitted::Files;
            assert_eq!(
                refused,
                refuses_preset(fw, preset.name),
                "{} for {fw}",
                preset.name
            );
            if refused {
                continue;
            }
            let plan = dir.join("plan.json");
            let json = run(&["launch", plan.to_str().expect("UTF-8 path"), "--json"]);
            std::fs::write(dir.join("launch.json"), json).expect("write launch.json");
            manifest.push(serde_json::json!({
                "name": format!("preset-{}-{}", preset.name, preset_gpus(preset.name)),
                "framework": fw,
                "dir": dir.to_str(),
            }));
        }
    }
    manifest
}

/// Cases copied with their plan.json moving one layer from stage 0 to stage 1 after the files
/// were made: the frameworks must disagree with them (the check is not vacuous).
const SHIFTED: [(&str, &str); 4] = [
    ("llama3-70b-64-megatron", "megatron"),
    ("llama3-70b-64-torchtitan", "torchtitan"),
    ("llama3-70b-64-deepspeed", "deepspeed"),
    ("deepseek-v3-1024-megatron", "megatron"),
];

/// The [`SHIFTED`] copies.
fn negative_controls(root: &Path) -> Vec<Value> {
    let mut manifest = Vec::new();
    for (case, fw) in SHIFTED {
        let from = root.join(format!("{case}-{fw}"));
        let to = root.join(format!("shifted-{case}-{fw}"));
        std::fs::create_dir(&to).expect("mkdir");
        for entry in std::fs::read_dir(&from).expect("read dir") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
        }
        let path = to.join("plan.json");
        let mut plan: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
        let ranks = &mut plan["plan"]["ranks"];
        let last0 = ranks[0]["stages"][0][1].as_u64().expect("u64");
        ranks[0]["stages"][0][1] = (last0 - 1).into();
        ranks[1]["stages"][0][0] = (last0).into();
        std::fs::write(&path, plan.to_string()).expect("write");
        manifest.push(serde_json::json!({
            "name": format!("shifted-{case}"), "framework": fw, "dir": to.to_str(),
        }));
    }
    manifest
}

#[test]
fn the_frameworks_accept_the_launch_files_and_compute_the_plans_split() {
    let Some(python) = python() else { return };
    let root = tempfile::tempdir().expect("tempdir");
    let mut manifest = emit_cases(root.path());
    manifest.extend(emit_preset_matrix(root.path()));
    let checked = manifest.len();
    manifest.extend(negative_controls(root.path()));
    let manifest_path = root.path().join("manifest.json");
    std::fs::write(&manifest_path, Value::from(manifest).to_string()).expect("manifest");
    let results_path = root.path().join("results.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/launch/check_frameworks.py");
    let out = Command::new(&python)
        .arg(&script)
        .arg(&manifest_path)
        .arg(&results_path)
        .env("DS_BUILD_OPS", "0")
        .output()
        .expect("python runs");
    let text = std::fs::read_to_string(&results_path).unwrap_or_else(|_| {
        panic!(
            "the check wrote no results: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let results: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    report(&results);
    assert_results(&results, checked, root.path());
}

/// One line per case (visible with --nocapture, as `.ci/run` runs it).
fn report(results: &[Value]) {
    for r in results {
        if let Some(v) = r.get("versions") {
            println!("versions: {v}");
            continue;
        }
        let what = r.get("checked").unwrap_or(&r["error"]);
        let ok = if r["ok"] == true { "ok  " } else { "FAIL" };
        println!(
            "{ok} {:<34} {:<10} {what}",
            r["name"].as_str().unwrap_or("?"),
            r["framework"].as_str().unwrap_or("?")
        );
    }
}

fn assert_results(results: &[Value], checked: usize, root: &Path) {
    let cases: Vec<&Value> = results.iter().filter(|r| r.get("name").is_some()).collect();
    assert_eq!(cases.len(), checked + SHIFTED.len(), "every case reports");
    for r in &cases {
        let shifted = r["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("shifted-"));
        if shifted {
            assert_eq!(
                r["ok"], false,
                "{}: a shifted split must not pass",
                r["name"]
            );
        } else {
            assert_eq!(
                r["ok"],
                true,
                "{}: {}\n{}",
                r["name"],
                r["error"],
                r["trace"].as_str().unwrap_or("")
            );
        }
    }
    assert!(CASES.len() >= 20, "at least 20 plans");
    // the framework versions the emitters name are the ones installed
    let versions = &results.last().expect("versions")["versions"];
    for (fw, package) in [
        ("megatron", "megatron-core"),
        ("torchtitan", "torchtitan"),
        ("deepspeed", "deepspeed"),
    ] {
        let installed = versions[package].as_str().expect("version");
        let launch: Value = serde_json::from_str(
            &std::fs::read_to_string(root.join(format!("llama3-70b-64-{fw}-{fw}/launch.json")))
                .expect("read"),
        )
        .expect("JSON");
        let named = launch["framework_version"].as_str().expect("version");
        assert!(
            named.contains(installed),
            "{fw}: emitted for {named}, installed {installed}"
        );
    }
}

/// The value of `key=` in a case's `--fix` pins.
fn pinned(case: &Case, key: &str) -> Option<String> {
    let prefix = format!("{key}=");
    case.plan
        .split([' ', ','])
        .find_map(|w| w.strip_prefix(&prefix).map(str::to_string))
}

#[test]
fn the_cases_cover_every_schedule_each_framework_runs_from_8_to_16384_gpus() {
    let covered: Vec<(String, String)> = CASES
        .iter()
        .filter_map(|c| Some((c, pinned(c, "schedule")?)))
        .flat_map(|(c, s)| {
            c.frameworks
                .iter()
                .map(move |fw| (fw.to_string(), s.clone()))
        })
        .collect();
    // torchtitan runs every schedule autopp generates (PyTorch's names, or the CSV table)
    let all: Vec<&str> = autopp_schedule::ScheduleKind::ALL
        .iter()
        .map(|k| k.as_str())
        .collect();
    for (fw, kinds) in [
        ("megatron", &["1f1b", "interleaved-1f1b"][..]),
        ("torchtitan", &all[..]),
        ("deepspeed", &["1f1b"][..]),
    ] {
        for k in kinds {
            let case = (fw.to_string(), k.to_string());
            assert!(covered.contains(&case), "no pinned {k} case for {fw}");
        }
    }
    let gpus: Vec<u64> = CASES
        .iter()
        .filter_map(|c| {
            let mut words = c.plan.split_whitespace().skip_while(|w| *w != "--gpus");
            words.nth(1)?.parse().ok()
        })
        .collect();
    assert_eq!(gpus.iter().min(), Some(&8));
    assert_eq!(gpus.iter().max(), Some(&16384));
}
