//! `autopp launch` and `plan --emit` as a user runs them: bad input (one line, exit 2, no
//! output directory), the JSON object, directories written whole or not at all, and plans made
//! for a framework (the refusals are in `cli_launch.rs`).

mod common;

use common::launch::*;
use common::{
    autopp, not_launched_yet, plan_and_emit, refuses_preset, stdout, Emitted, FRAMEWORKS,
};
use serde_json::Value;

#[test]
fn bad_input_is_one_line_naming_the_field_and_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    fails(
        &d.join("missing.json"),
        &["--framework", "megatron"],
        &["PLAN: cannot read"],
    );
    let junk = d.join("junk.json");
    std::fs::write(&junk, "{not json").expect("write");
    fails(
        &junk,
        &["--framework", "megatron"],
        &["PLAN: ", "junk.json"],
    );
    let base = plan(d, "base", EVEN_1F1B);
    let gpus = edited(&base, "gpus", |f| f["plan"]["gpus"] = 16.into());
    fails(
        &gpus,
        &["--framework", "megatron"],
        &["plan file: plan.gpus: 16 but tp·pp·dp·cp = 2·4·1·1"],
    );
    let batch = edited(&base, "batch", |f| {
        f["plan"]["global_batch_size"] = 500.into()
    });
    fails(
        &batch,
        &["--framework", "megatron"],
        &["plan file: plan.global_batch_size: 500"],
    );
    let ranks = edited(&base, "ranks", |f| f["plan"]["ranks"][1]["rank"] = 2.into());
    fails(
        &ranks,
        &["--framework", "megatron"],
        &["plan file: plan.ranks[2].stages"],
    );
    fails(
        &base,
        &["--framework", "pytorch"],
        &["unknown framework `pytorch`"],
    );
    fails(
        &base,
        &["--framework", "any"],
        &["--framework: name the framework to launch"],
    );
    let any = edited(&base, "any", |f| f["settings"]["framework"] = "any".into());
    fails(
        &any,
        &[],
        &["--framework: the plan was made for any framework"],
    );
}

#[test]
fn json_is_one_object_with_the_framework_its_version_args_and_files() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = plan(dir.path(), "zb-h2", ZB_H2);
    let out = stdout(&[
        "launch",
        p.to_str().expect("UTF-8"),
        "--framework",
        "torchtitan",
        "--json",
    ]);
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let keys: Vec<&str> = v
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys, ["args", "files", "framework", "framework_version"]);
    assert_eq!(v["framework"], "torchtitan");
    assert_eq!(v["framework_version"], "torchtitan 0.3.0");
    assert_eq!(v["args"][0], "--module");
    let files: Vec<&str> = v["files"]
        .as_object()
        .expect("files")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(files, ["launch.sh", "pipeline_schedule.csv", "sbatch.sh"]);
    // the CSV is autopp's own schedule, rank by rank, in order
    let schedule = stdout(&[
        "schedule",
        "zb-h2",
        "--pp",
        "4",
        "--microbatches",
        "256",
        "--json",
    ]);
    let schedule: Value = serde_json::from_str(&schedule).expect("JSON");
    let rows: Vec<String> = schedule["ranks"]
        .as_array()
        .expect("ranks")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("steps")
                .iter()
                .map(|s| s.as_str().expect("step"))
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect();
    assert_eq!(v["files"]["pipeline_schedule.csv"], rows.join("\n") + "\n");
}

#[test]
fn out_is_written_whole_replaces_earlier_launch_files_and_keeps_foreign_ones() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = plan(dir.path(), "zb-h2", ZB_H2);
    let p = p.to_str().expect("UTF-8");
    let out = dir.path().join("launch");
    let out_s = out.to_str().expect("UTF-8");
    stdout(&["launch", p, "--framework", "torchtitan", "--out", out_s]);
    assert!(out.join("pipeline_schedule.csv").exists());
    let script = out.join("launch.sh");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&script)
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "launch.sh is executable");
    }
    let status = std::process::Command::new("bash")
        .arg("-n")
        .arg(&script)
        .status()
        .expect("bash");
    assert!(status.success(), "launch.sh parses");
    // an earlier launch's directory is replaced: no stale schedule table
    let even = plan(dir.path(), "even", EVEN_1F1B);
    stdout(&["launch", even.to_str().expect("UTF-8"), "--out", out_s]);
    assert!(!out.join("pipeline_schedule.csv").exists());
    assert!(std::fs::read_to_string(&script)
        .expect("read")
        .contains("pretrain_gpt.py"));
    // a directory holding anything else is left alone
    std::fs::write(out.join("notes.txt"), "mine").expect("write");
    let err = autopp(&["launch", p, "--framework", "torchtitan", "--out", out_s]);
    assert_eq!(err.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&err.stderr).contains("holds notes.txt"));
    assert!(!out.join("pipeline_schedule.csv").exists(), "untouched");
}

#[test]
fn plan_emit_writes_the_plan_and_its_launch_files_in_one_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("l70");
    let out_s = out.to_str().expect("UTF-8");
    let text = stdout(&[
        "plan",
        "llama3-70b",
        "--gpus",
        "64",
        "--emit",
        "megatron",
        "--out",
        out_s,
    ]);
    assert!(text.contains("layout"));
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).expect("plan.json"))
            .expect("JSON");
    assert_eq!(
        file["settings"]["framework"], "megatron",
        "--emit searches for its framework"
    );
    for name in ["launch.sh", "sbatch.sh"] {
        assert!(out.join(name).exists(), "{name}");
    }
    // launching the plan.json of a directory into that directory keeps the plan
    let plan_json = out.join("plan.json");
    stdout(&["launch", plan_json.to_str().expect("UTF-8"), "--out", out_s]);
    assert!(
        plan_json.exists(),
        "plan.json survives a launch into its directory"
    );
    let again = stdout(&[
        "launch",
        out.join("plan.json").to_str().expect("UTF-8"),
        "--json",
    ]);
    let again: Value = serde_json::from_str(&again).expect("JSON");
    assert_eq!(
        again["files"]["launch.sh"],
        std::fs::read_to_string(out.join("launch.sh")).expect("read")
    );
    let missing = autopp(&["plan", "llama3-70b", "--gpus", "64", "--emit", "megatron"]);
    assert_eq!(missing.status.code(), Some(2), "--emit needs --out");
}

#[test]
fn plans_made_for_a_framework_always_emit_for_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut emitted = 0;
    for preset in autopp_models::presets() {
        for fw in FRAMEWORKS {
            let out = dir.path().join(format!("{}-{fw}", preset.name));
            match plan_and_emit(preset.name, fw, &out) {
                Emitted::Files => {
                    assert!(!refuses_preset(fw, preset.name), "{} for {fw}", preset.name);
                    emitted += 1;
                }
                Emitted::Refused(why) => {
                    assert!(
                        refuses_preset(fw, preset.name),
                        "{} for {fw}: {why}",
                        preset.name
                    );
                    // torchtitan builds Llama 3- and Qwen3-style decoders only; for a mixture of experts
                    // either refusal may come first
                    let llama_only = why.contains("builds Llama 3- and Qwen3-style decoders only")
                        && why.contains(&format!("and {} has", preset.name));
                    let not_yet = not_launched_yet(fw, preset.name)
                        && (why.contains("is not launched by autopp yet")
                            || why.contains("cannot express this plan"));
                    assert!(llama_only || not_yet, "{why}");
                }
            }
        }
    }
    assert!(emitted >= 20, "{emitted} plans emitted");
    // more GPU counts for the models every framework runs
    for model in ["llama3-8b", "llama3-70b", "llama2-70b"] {
        for fw in FRAMEWORKS {
            for gpus in ["16", "512", "4096"] {
                let out = dir.path().join(format!("{model}-{gpus}-{fw}"));
                let run = autopp(&[
                    "plan",
                    model,
                    "--gpus",
                    gpus,
                    "--framework",
                    fw,
                    "--emit",
                    fw,
                    "--out",
                    out.to_str().expect("UTF-8"),
                ]);
                let err = String::from_utf8_lossy(&run.stderr);
                if err.contains("nothing fits") || err.contains("no configuration") {
                    continue;
                }
                assert!(run.status.success(), "{model} on {gpus} for {fw}: {err}");
            }
        }
    }
}

#[test]
fn plan_for_a_framework_refuses_up_front_what_it_cannot_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    plan_refused(
        "llama3-8b --gpus 8 --precision fp16 --framework torchtitan",
        "torchtitan does not train in fp16",
    );
    let model = layer_list_model(dir.path());
    for fw in FRAMEWORKS {
        plan_refused(
            &format!("{} --gpus 8 --framework {fw}", model.display()),
            "my-net is a layer list",
        );
    }
    // a model whose key/value heads tp=8 does not divide: torchtitan's search keeps tp | 4
    let kv4 = dir.path().join("kv4.json");
    std::fs::write(
        &kv4,
        r#"{"name": "kv4", "num_layers": 16, "hidden_size": 4096, "num_attention_heads": 32,
            "num_kv_heads": 4, "ffn_hidden_size": 11008, "vocab_size": 32000, "seq_length": 4096,
            "global_batch_size": 256, "gated_mlp": true, "tied_embeddings": false, "bias": false,
            "norm": "rmsnorm", "position_embedding": "none", "dropout": false}"#,
    )
    .expect("write");
    let out = dir.path().join("kv4-titan");
    stdout(&[
        "plan",
        kv4.to_str().expect("UTF-8"),
        "--gpus",
        "64",
        "--framework",
        "torchtitan",
        "--emit",
        "torchtitan",
        "--out",
        out.to_str().expect("UTF-8"),
    ]);
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("plan.json")).expect("plan.json"))
            .expect("JSON");
    assert_eq!(
        file["plan"]["tp"].as_u64().map(|t| 4 % t),
        Some(0),
        "{file}"
    );
    plan_refused(
        &format!(
            "{} --gpus 64 --framework torchtitan --fix tp=8",
            kv4.display()
        ),
        "--fix tp=8: torchtitan splits whole key/value heads",
    );
    // a plan of the mixed space with tp = 8 over 4 key/value heads: torchtitan refuses it
    let any = plan(
        dir.path(),
        "kv4-tp8",
        &format!(
            "{} --gpus 64 --framework any-mix --fix tp=8,pp=2,dp=4,schedule=1f1b,zero_stage=2",
            kv4.display()
        ),
    );
    fails(
        &any,
        &["--framework", "torchtitan"],
        &[
            "torchtitan splits whole key/value heads",
            "tp = 8 does not divide kv4's 4",
        ],
    );
}
