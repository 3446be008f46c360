//! `autopp launch` as a user runs it: every refusal, with the reason (bad input, the JSON object
//! and the output directory are in `cli_launch_out.rs`).

mod common;

use common::launch::*;
use common::stdout;
use serde_json::Value;

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
            "builds Llama 3- and Qwen3-style decoders only",
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

/// FP8 plans launch on Megatron-LM with Transformer Engine's recipe (delayed scaling with
/// NeMo's amax history, current scaling, MXFP8); torchtitan's float8 converters are not written
/// yet, DeepSpeed has no FP8; a shape Transformer Engine's FP8 GEMMs refuse is refused.
#[test]
fn fp8_plans_launch_on_megatron_with_their_recipe() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let args_of = |p: &std::path::Path| launched(p, "megatron").0;
    let fixed =
        "--framework megatron --fix tp=2,pp=2,dp=2,schedule=1f1b,zero_stage=1,micro_batch_size=1";
    let delayed = plan(
        d,
        "delayed",
        &format!("llama3-8b --gpus 8 --precision fp8 {fixed}"),
    );
    let a = args_of(&delayed);
    has(
        &a,
        &[
            "--bf16",
            "--fp8-format",
            "hybrid",
            "--fp8-recipe",
            "delayed",
        ],
    );
    has(
        &a,
        &[
            "--fp8-amax-history-len",
            "1024",
            "--fp8-amax-compute-algo",
            "max",
        ],
    );
    let tensorwise = plan(
        d,
        "tensorwise",
        &format!("llama3-8b --gpus 8 --precision fp8-tensorwise {fixed}"),
    );
    let a = args_of(&tensorwise);
    has(
        &a,
        &["--fp8-format", "hybrid", "--fp8-recipe", "tensorwise"],
    );
    assert!(!a.iter().any(|x| x == "--fp8-amax-history-len"), "{a:?}");
    let mx = plan(
        d,
        "mxfp8",
        &format!("llama3-8b --gpus 8 --gpu b200 --precision mxfp8 {fixed}"),
    );
    has(
        &args_of(&mx),
        &["--fp8-format", "e4m3", "--fp8-recipe", "mxfp8"],
    );
    let bf16 = plan(d, "bf16", &format!("llama3-8b --gpus 8 {fixed}"));
    assert!(!args_of(&bf16).iter().any(|x| x.starts_with("--fp8")));
    // torchtitan 0.3 scales float8 rowwise only
    fails(
        &tensorwise,
        &["--framework", "torchtitan"],
        &["torchtitan has no fp8-tensorwise recipe (it has fp8-rowwise, mxfp8)"],
    );
    let rowwise = plan(
        d,
        "rowwise",
        "llama3-8b --gpus 8 --precision fp8-rowwise --framework torchtitan",
    );
    // torchtitan: a config function over llama3_8b converting the blocks' linears, the LM head
    // filtered out; MXFP8 the same with its own converter
    let titan_module = |plan: &std::path::Path| -> (Vec<String>, String) {
        let (args, files) = launched(plan, "torchtitan");
        let module = files["autopp_torchtitan.py"].as_str().expect("module");
        (args, module.to_string())
    };
    let (args, module) = titan_module(&rowwise);
    has(
        &args,
        &["--module", "autopp_torchtitan", "--config", "autopp_float8"],
    );
    assert!(module.contains("config = llama3_8b()"), "{module}");
    assert!(
        module.contains(
            r#"Float8LinearConverter.Config(
            recipe_name="rowwise", filter_fqns=["lm_head"],
            model_compile_enabled=True,"#
        ),
        "{module}"
    );
    let mx_titan = plan(
        d,
        "mxfp8-titan",
        "llama3-8b --gpus 8 --gpu b200 --precision mxfp8 --framework torchtitan",
    );
    let (args, module) = titan_module(&mx_titan);
    has(&args, &["--config", "autopp_mxfp8"]);
    assert!(
        module.contains(
            r#"MXFP8LinearConverter.Config(
            fqns=["layers."],"#
        ),
        "{module}"
    );
    fails(
        &rowwise,
        &["--framework", "megatron"],
        &["Megatron-LM has no fp8-rowwise recipe"],
    );
    fails(
        &tensorwise,
        &["--framework", "deepspeed"],
        &["DeepSpeed has no fp8-tensorwise recipe"],
    );
    // 8,200 rows a micro-batch: a multiple of 8, not of torchao's 16
    let odd_rowwise = edited(&rowwise, "odd-rowwise", |f| {
        f["model"]["seq_length"] = 8200.into()
    });
    fails(
        &odd_rowwise,
        &["--framework", "torchtitan"],
        &[
            "torchao's fp8-rowwise GEMMs need rows in multiples of 16",
            "= 8200 rows",
        ],
    );
    // 8,196 rows a micro-batch, 4,098 on each of tp 2 under sequence parallelism: not a multiple of 8
    let odd = edited(&tensorwise, "odd", |f| {
        f["model"]["seq_length"] = 8196.into()
    });
    fails(
        &odd,
        &["--framework", "megatron"],
        &[
            "Transformer Engine's fp8-tensorwise GEMMs need rows in multiples of 8",
            "8196 / (1 · 2) · 1 = 4098 rows under sequence parallelism",
        ],
    );
}

/// A plan made for a framework at an FP8 precision launches there: the search leaves out the
/// micro-batches whose `s/cp · b` rows the FP8 GEMMs refuse (at s = 4,100 one sequence is 4,100
/// rows, 4,100 mod 8 = 4; two are 8,200 = 8 · 1,025, a multiple of Transformer Engine's 8 but
/// not of torchao's 16) and the context-parallel degrees whose `2·cp` chunks do not divide the
/// sequence (cp 4: 4,100 mod 8 = 4), so every answer, under `--framework megatron`, `any` and
/// `torchtitan` alike, runs on its framework (under Megatron's sequence parallelism Transformer
/// Engine checks its slice, s/(cp·tp) · b: at s = 4,104 and tp 8, 513 rows); pinning a
/// micro-batch or a cp that leaves nothing is one line naming the sizes and the fix.
#[test]
fn fp8_plans_keep_to_the_gemm_shapes_their_framework_runs() {
    // (framework, precision, rows' multiple, the framework that must run every answer)
    for (framework, precision, tile, runs_on) in [
        ("megatron", "fp8", 8, "megatron"),
        ("any", "fp8", 8, "megatron"),
        ("torchtitan", "fp8-rowwise", 16, "torchtitan"),
    ] {
        let text = stdout(&[
            "plan",
            "llama3-8b",
            "--gpus",
            "16",
            "--precision",
            precision,
            "--seq-len",
            "4100",
            "--framework",
            framework,
            "--json",
        ]);
        let v: Value = serde_json::from_str(&text).expect("plan --json");
        let mut answers = vec![&v];
        answers.extend(v["alternatives"].as_array().expect("alternatives"));
        assert!(answers.len() > 1, "{text}");
        for a in answers {
            let runs: Vec<&str> = a["runs_on"]
                .as_array()
                .expect("runs_on")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            assert!(runs.contains(&runs_on), "{framework}: {a}");
            let p = &a["plan"];
            let cp = p["cp"].as_u64().expect("cp");
            let mbs = p["micro_batch_size"].as_u64().expect("micro_batch_size");
            // Transformer Engine checks the sequence-parallel slice, s/(cp·tp) · b
            let tp = p["tp"].as_u64().expect("tp");
            let sp = p["sequence_parallel"].as_bool().expect("sequence_parallel");
            let split = cp * if sp && runs_on == "megatron" { tp } else { 1 };
            assert_eq!(4100 % split, 0, "{framework}: cp {cp}, tp {tp}, sp {sp}");
            assert_eq!(
                4100 / split * mbs % tile,
                0,
                "{framework}: {split}, mbs {mbs}"
            );
            // Megatron-Core's context parallelism cuts a sequence into 2·cp chunks
            assert!(cp == 1 || 4100 % (2 * cp) == 0, "{framework}: cp {cp}");
        }
    }
    plan_refused(
        "llama3-8b --gpus 8 --seq-len 4104 --precision fp8 --framework megatron --fix tp=8,micro_batch_size=1,sequence_parallel=true",
        "4104 / (1 · 8) · 1 = 513 rows under sequence parallelism, not a multiple of 8",
    );
    plan_refused(
        "llama3-8b --gpus 16 --seq-len 4100 --framework megatron --fix cp=4",
        "--fix cp=4: megatron cuts each sequence into 8 chunks for context parallelism of 4, and the sequence length 4100 is not a multiple of 8",
    );
    plan_refused(
        "llama3-8b --gpus 16 --precision fp8 --seq-len 4100 --framework megatron --fix mbs=1",
        "--precision: Megatron-LM cannot run any of these plans: Transformer Engine's fp8 GEMMs need rows in multiples of 8 and columns in multiples of 16, and a linear's input has s/cp · micro-batch = 4100 / 1 · 1 = 4100 rows",
    );
}
