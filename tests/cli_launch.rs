//! `autopp launch` and `plan --emit` as a user runs them: every refusal, bad input (one line,
//! exit 2, no output directory), the JSON object, directories written whole or not at all.

mod common;

use std::path::{Path, PathBuf};

use common::{autopp, plan_and_emit, refuses_preset, stdout, Emitted, FRAMEWORKS};
use serde_json::Value;

/// `autopp plan ARGS --memory-margin 0 --out DIR/NAME.json`; returns the plan file's path.
/// No margin: the pinned configurations here were chosen before plans kept one and some fill
/// memory; the launch files, not the margin, are under test.
fn plan(dir: &Path, name: &str, args: &str) -> PathBuf {
    let path = dir.join(format!("{name}.json"));
    let mut argv: Vec<&str> = vec!["plan"];
    argv.extend(args.split_whitespace());
    argv.extend(["--memory-margin", "0"]);
    argv.extend(["--out", path.to_str().expect("UTF-8")]);
    stdout(&argv);
    path
}

/// A copy of the plan file at `path` as NAME.json, changed by `edit`.
fn edited(path: &Path, name: &str, edit: impl FnOnce(&mut Value)) -> PathBuf {
    let mut file: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read")).expect("JSON");
    edit(&mut file);
    let out = path.with_file_name(format!("{name}.json"));
    std::fs::write(&out, file.to_string()).expect("write");
    out
}

/// Runs `autopp launch PLAN ARGS… --out DIR/out`, asserts exit 2 with one line of stderr that
/// contains every `needle`, and that no output directory was made.
fn fails(plan: &Path, args: &[&str], needles: &[&str]) {
    let out_dir = plan.with_file_name("out");
    let mut argv = vec!["launch", plan.to_str().expect("UTF-8")];
    argv.extend(args);
    argv.extend(["--out", out_dir.to_str().expect("UTF-8")]);
    let out = autopp(&argv);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{argv:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    for needle in needles {
        assert!(
            err.contains(needle),
            "{argv:?}: expected `{needle}` in: {err}"
        );
    }
    assert!(!out_dir.exists(), "no partial output directory");
    assert!(out.stdout.is_empty(), "nothing on stdout");
}

const ZB_H2: &str = "llama3-70b --gpus 64 --fix tp=8,pp=4,dp=2,schedule=zb-h2,zero_stage=2";
const ZB_V: &str = "llama3-70b --gpus 128 --framework torchtitan --fix tp=8,pp=4,dp=4,virtual_stages=2,micro_batch_size=1,schedule=zb-v,zero_stage=2";
const EVEN_1F1B: &str = "llama3-8b --gpus 8 --framework megatron --fix tp=2,pp=4,dp=1,virtual_stages=1,micro_batch_size=1,schedule=1f1b,recompute=none,zero_stage=1 --even-split";
const CP2: &str = "llama2-70b --gpus 128 --framework megatron --fix tp=8,pp=4,dp=2,cp=2,virtual_stages=1,schedule=1f1b,zero_stage=1";

#[test]
fn schedules_a_framework_does_not_run_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let zb_h2 = plan(d, "zb-h2", ZB_H2);
    fails(
        &zb_h2,
        &["--framework", "megatron"],
        &["--framework megatron:", "no zero-bubble schedule", "zb-h2"],
    );
    let zb_v = plan(d, "zb-v", ZB_V);
    fails(
        &zb_v,
        &["--framework", "megatron"],
        &[
            "places stages in a V",
            "--pipeline-model-parallel-layout cannot express it",
        ],
    );
    fails(
        &zb_v,
        &["--framework", "deepspeed"],
        &["--framework deepspeed:", "does not run zb-v", "1f1b only"],
    );
    let gpipe = plan(d, "gpipe", "llama3-8b --gpus 32 --global-batch 64 --framework torchtitan --fix tp=1,pp=4,dp=8,schedule=gpipe,zero_stage=0,micro_batch_size=1");
    fails(
        &gpipe,
        &["--framework", "megatron"],
        &[
            "Megatron-LM does not run gpipe",
            "1f1b and interleaved-1f1b",
        ],
    );
}

#[test]
fn zero_stages_a_framework_does_not_combine_with_its_pipeline_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let zero2 = plan(d, "zero2", "llama3-70b --gpus 64 --framework torchtitan --fix tp=8,pp=4,dp=2,schedule=1f1b,zero_stage=2");
    fails(
        &zero2,
        &["--framework", "megatron"],
        &["ZeRO stage 2", "--use-distributed-optimizer"],
    );
    fails(
        &zero2,
        &["--framework", "deepspeed"],
        &["ZeRO stage 2", "incompatible with pipeline parallelism"],
    );
    let zero1 = plan(d, "zero1", EVEN_1F1B);
    fails(
        &zero1,
        &["--framework", "torchtitan"],
        &["ZeRO stage 1", "FSDP2", "no ZeRO 1"],
    );
}

#[test]
fn recompute_a_framework_cannot_express_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let base = plan(
        d,
        "base",
        &EVEN_1F1B.replace("zero_stage=1", "zero_stage=0"),
    );
    let partial = |name: &str, mode: &str, counts: [u64; 4]| {
        edited(&base, name, |f| {
            f["plan"]["recompute"] = mode.into();
            for (r, n) in counts.iter().enumerate() {
                f["plan"]["ranks"][r]["recompute_num_layers_per_stage"] = serde_json::json!([n]);
            }
        })
    };
    let same = partial("same", "none", [2, 2, 2, 2]);
    fails(
        &same,
        &["--framework", "torchtitan"],
        &[
            "torchtitan cannot recompute as planned",
            "same for every layer",
        ],
    );
    fails(
        &same,
        &["--framework", "deepspeed"],
        &[
            "DeepSpeed cannot recompute as planned",
            "activation_checkpoint_interval",
        ],
    );
    let differing = partial("differing", "none", [3, 2, 1, 0]);
    fails(
        &differing,
        &["--framework", "megatron"],
        &["--recompute-num-layers", "[3, 2, 1, 0]"],
    );
    let over_selective = partial("over-selective", "selective", [2, 2, 2, 2]);
    fails(
        &over_selective,
        &["--framework", "megatron"],
        &["one of full or selective", "the others selective"],
    );
    let selective = edited(&base, "selective", |f| {
        f["plan"]["recompute"] = "selective".into()
    });
    fails(
        &selective,
        &["--framework", "deepspeed"],
        &["checkpoints whole layers", "not the attention core"],
    );
}

#[test]
fn what_else_a_framework_cannot_run_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let cp2 = plan(d, "cp2", CP2);
    fails(
        &cp2,
        &["--framework", "deepspeed"],
        &["DeepSpeed does not run context parallelism"],
    );
    let short = edited(&cp2, "short", |f| f["model"]["seq_length"] = 4094.into());
    fails(
        &short,
        &["--framework", "megatron"],
        &["multiple of 2·cp = 4", "4094"],
    );
    let titan_cp2 = plan(d, "titan-cp2", "llama3-70b --gpus 128 --framework torchtitan --fix tp=8,pp=2,dp=4,cp=2,virtual_stages=2,schedule=interleaved-1f1b,zero_stage=2");
    let titan_short = edited(&titan_cp2, "titan-short", |f| {
        f["model"]["seq_length"] = 8190.into()
    });
    fails(
        &titan_short,
        &["--framework", "torchtitan"],
        &["load balancer", "8190"],
    );
    let fp16 = plan(d, "fp16", "llama3-8b --gpus 8 --precision fp16 --framework deepspeed --fix tp=1,pp=8,dp=1,schedule=1f1b,zero_stage=0");
    fails(
        &fp16,
        &["--framework", "torchtitan"],
        &["torchtitan does not train in fp16"],
    );
    let gpt3 = plan(
        d,
        "gpt3",
        "gpt3-175b --gpus 1024 --gpu a100-80g --framework megatron",
    );
    fails(
        &gpt3,
        &["--framework", "torchtitan"],
        &[
            "builds Llama-family decoders only",
            "gpt3-175b has a plain (not SwiGLU) MLP, biases, LayerNorm, learned positions",
            "--framework megatron or deepspeed",
        ],
    );
    let uneven = plan(
        d,
        "uneven",
        "llama3-70b --gpus 64 --framework megatron --fix tp=4,pp=8,dp=2,schedule=1f1b,zero_stage=1",
    );
    let file: Value =
        serde_json::from_str(&std::fs::read_to_string(&uneven).expect("read")).expect("JSON");
    assert!(
        file["plan"]["megatron_layout"]
            .as_str()
            .expect("layout")
            .contains("t*11"),
        "an uneven split"
    );
    // DeepSpeed runs it through the plan's explicit stage boundaries
    let ds = stdout(&[
        "launch",
        uneven.to_str().expect("UTF-8"),
        "--framework",
        "deepspeed",
        "--json",
    ]);
    assert!(ds.contains(r#"\"partition_method\": \"autopp\""#), "{ds}");
    let nodes = edited(&uneven, "nodes", |f| f["plan"]["gpus_per_node"] = 3.into());
    fails(
        &nodes,
        &["--framework", "megatron"],
        &["64 GPUs do not fill whole nodes of 3"],
    );
}

#[test]
fn micro_batching_a_framework_would_not_run_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    // one rank with two stages: Megatron-LM interleaves only across a pipeline
    let one_rank = plan(
        d,
        "one-rank",
        "llama3-8b --gpus 8 --framework megatron --fix tp=1,pp=1,dp=8,schedule=1f1b,zero_stage=1",
    );
    let looped = edited(&one_rank, "looped", |f| {
        f["plan"]["schedule"] = "interleaved-1f1b".into();
        f["plan"]["virtual_stages"] = 2.into();
        f["plan"]["ranks"][0]["stages"] = serde_json::json!([[0, 16], [17, 33]]);
        f["plan"]["ranks"][0]["recompute_num_layers_per_stage"] = serde_json::json!([0, 0]);
    });
    fails(
        &looped,
        &["--framework", "megatron"],
        &["need a pipeline (pp > 1)"],
    );
    // nine micro-batches in one group of nine: PyTorch makes two rounds of four
    let interleaved = plan(d, "interleaved", "llama3-8b --gpus 32 --global-batch 32 --framework torchtitan --fix tp=2,pp=4,dp=4,virtual_stages=2,micro_batch_size=1,schedule=interleaved-1f1b,zero_stage=2");
    let nine = edited(&interleaved, "nine", |f| {
        f["plan"]["num_microbatches"] = 9.into();
        f["plan"]["global_batch_size"] = 36.into();
        f["settings"]["group_size"] = 9.into();
    });
    fails(
        &nine,
        &["--framework", "torchtitan"],
        &["PyTorch's Interleaved1F1B", "rounds", "it groups 9"],
    );
}

/// A layer-list model file `DIR/net.json` named my-net.
fn layer_list_model(dir: &Path) -> PathBuf {
    let model = dir.join("net.json");
    std::fs::write(
        &model,
        r#"{"name": "my-net", "seq_length": 1024, "global_batch_size": 64, "layers": [
            {"name": "block", "count": 8, "params": 1.0e7, "forward_flops": 2.0e10,
             "activation_bytes": 3.0e7, "output_bytes": 2097152}]}"#,
    )
    .expect("write");
    model
}

#[test]
fn a_layer_list_model_is_refused_by_every_framework() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = layer_list_model(dir.path());
    let p = plan(
        dir.path(),
        "layers",
        &format!("{} --gpus 8", model.display()),
    );
    for fw in ["megatron", "torchtitan", "deepspeed"] {
        fails(&p, &["--framework", fw], &["my-net is a layer list"]);
    }
}

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
                    assert!(
                        why.contains("builds Llama-family decoders only")
                            && why.contains(&format!("and {} has", preset.name)),
                        "{why}"
                    );
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

/// `autopp plan ARGS` (whitespace-separated) exits 2 with one line of stderr containing `needle`.
fn plan_refused(args: &str, needle: &str) {
    let mut argv = vec!["plan"];
    argv.extend(args.split_whitespace());
    let out = autopp(&argv);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args}: {err}");
    assert!(
        err.contains(needle),
        "{args}: expected `{needle}` in: {err}"
    );
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
