//! Snapshot tests (`insta`) of `autopp launch --json` — the arguments and every file — for five
//! plans: Megatron-LM with an even split and with an uneven layout (and its decoder-first/last
//! equivalent), torchtitan with a CSV action table, with a V schedule and with autopp's config
//! module for a shape torchtitan ships no config for, DeepSpeed with a
//! `type:` partition. The plans pin every choice and Megatron's even split, so only a change to
//! the emitters moves them (`cargo insta review`, or `INSTA_UPDATE=always` and `git diff`).

mod common;

use common::stdout;

/// `autopp launch --json` for the plan `plan ARGS`, made for `framework`.
fn launch(args: &str, framework: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("plan.json");
    let path = path.to_str().expect("UTF-8");
    let mut argv: Vec<&str> = vec!["plan"];
    argv.extend(args.split_whitespace());
    argv.extend(["--even-split", "--out", path]);
    stdout(&argv);
    stdout(&["launch", path, "--framework", framework, "--json"])
}

#[test]
fn megatron_launch_files() {
    insta::assert_snapshot!(
        "megatron_llama3_70b_64_even",
        launch(
            "llama3-70b --gpus 64 --framework megatron --fix tp=4,pp=8,dp=2,virtual_stages=1,micro_batch_size=1,schedule=1f1b,recompute=full,zero_stage=1,sequence_parallel=true",
            "megatron"
        )
    );
    insta::assert_snapshot!(
        "megatron_bloom_176b_384_layout_fp16",
        launch(
            "bloom-176b --gpus 384 --gpu a100-80g --precision fp16 --framework megatron --fix tp=8,pp=12,dp=4,virtual_stages=1,micro_batch_size=1,schedule=1f1b,recompute=selective,zero_stage=1,sequence_parallel=true",
            "megatron"
        )
    );
}

#[test]
fn torchtitan_launch_files() {
    insta::assert_snapshot!(
        "torchtitan_llama3_8b_64_zb_h2_csv",
        launch(
            "llama3-8b --gpus 64 --global-batch 64 --fix tp=2,pp=4,dp=8,virtual_stages=1,micro_batch_size=1,schedule=zb-h2,recompute=none,zero_stage=2,sequence_parallel=true",
            "torchtitan"
        )
    );
    // Llama 2 70B: torchtitan ships no config of its shape, so autopp_torchtitan.py builds it
    insta::assert_snapshot!(
        "torchtitan_llama2_70b_64_custom_config",
        launch(
            "llama2-70b --gpus 64 --global-batch 16 --framework torchtitan --fix tp=8,pp=4,dp=2,virtual_stages=1,micro_batch_size=1,schedule=zb-h1,recompute=full,zero_stage=2,sequence_parallel=true",
            "torchtitan"
        )
    );
    insta::assert_snapshot!(
        "torchtitan_llama3_70b_128_zb_v",
        launch(
            "llama3-70b --gpus 128 --framework torchtitan --fix tp=8,pp=4,dp=4,virtual_stages=2,micro_batch_size=1,schedule=zb-v,recompute=full,zero_stage=2,sequence_parallel=true",
            "torchtitan"
        )
    );
}

#[test]
fn deepspeed_launch_files() {
    insta::assert_snapshot!(
        "deepspeed_gpt3_175b_1024_type_partition",
        launch(
            "gpt3-175b --gpus 1024 --gpu a100-80g --framework deepspeed --fix tp=8,pp=16,dp=8,virtual_stages=1,micro_batch_size=1,schedule=1f1b,recompute=full,zero_stage=1,sequence_parallel=true",
            "deepspeed"
        )
    );
}
