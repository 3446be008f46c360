//! The launch emitters on plan files made in-process: the plan view, Megatron-LM's layout and
//! its decoder-first/last equivalent, torchtitan's configuration eras, DeepSpeed's partitions.

use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
use autopp_models::Recompute;
use autopp_planner::launch::{self, PlanView, TorchtitanEra};
use autopp_planner::{evaluate, Degrees, Framework, ParallelConfig, PlanFile};
use autopp_schedule::ScheduleKind;

/// The plan file of `preset` on `gpus` H100s under `config`.
fn plan_file(preset: &str, gpus: u64, config: ParallelConfig) -> PlanFile {
    let model = autopp_models::load(preset).expect("preset");
    let cluster =
        Cluster::new(hardware::gpu("h100-sxm").expect("gpu"), gpus, 8, None).expect("cluster");
    let profile = AnalyticProfile::new(cluster.clone(), Precision::Bf16).expect("profile");
    let e = evaluate(&model, &profile, &config).expect("evaluate");
    PlanFile::new(&e, &model, &cluster, &config).expect("plan file")
}

/// tp 8 · pp 4 · dp 2 with `schedule` over `v` stages per rank, the given split.
fn config(schedule: ScheduleKind, v: u64, split: Option<Vec<usize>>) -> ParallelConfig {
    let degrees = Degrees {
        tp: 8,
        pp: 4,
        dp: 2,
        cp: 1,
        virtual_stages: v,
    };
    ParallelConfig::new(degrees, 1, 64)
        .with_schedule(schedule)
        .with_recompute(Recompute::Full)
        .with_sequence_parallel(true)
        .with_zero_stage(1)
        .with_split(split)
}

/// The value after `flag` in `args`.
fn value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    let i = args.iter().position(|a| a == flag)?;
    args.get(i + 1).map(String::as_str)
}

#[test]
fn the_view_numbers_stages_globally_and_places_them_as_the_schedule_does() {
    // zb-v: rank r holds stages r and 7 − r
    let file = plan_file("llama3-70b", 64, config(ScheduleKind::ZbV, 2, None));
    let view = PlanView::new(&file).expect("view");
    assert_eq!(view.layer_counts(), vec![10; 8]);
    let ranks: Vec<u64> = view.stages.iter().map(|s| s.rank).collect();
    assert_eq!(ranks, [0, 1, 2, 3, 3, 2, 1, 0]);
    assert!(view.stages[0].has_embedding && view.stages[7].has_head);
    assert_eq!(view.stages[3].first_layer, 30);
    assert_eq!(
        view.stages_of(0)
            .iter()
            .map(|s| s.chunk)
            .collect::<Vec<_>>(),
        [0, 1]
    );
    assert_eq!((view.nodes(), view.gpus_on_each_node()), (8, 8));
}

#[test]
fn megatron_writes_the_layout_and_offers_decoder_first_last_for_that_shape() {
    // 19 | 21 | 21 | 19 transformer layers: Megatron-LM's uneven first/last shape
    let split = vec![20, 21, 21, 20];
    let file = plan_file(
        "llama3-70b",
        64,
        config(ScheduleKind::OneFOneB, 1, Some(split)),
    )
    .with_framework(Framework::Megatron);
    let l = launch::emit(&file, Framework::Megatron).expect("emits");
    assert_eq!(
        value(&l.args, "--pipeline-model-parallel-layout"),
        Some("Et*19|t*21|t*21|t*19L")
    );
    assert!(l.files["launch.sh"].contains(
        "# equivalent: --decoder-first-pipeline-num-layers 19 --decoder-last-pipeline-num-layers 19\n"
    ));
    assert_eq!(value(&l.args, "--recompute-method"), Some("uniform"));
    // interleaved and even: the number of virtual stages, never a layout besides
    let file = plan_file(
        "llama3-70b",
        64,
        config(ScheduleKind::Interleaved1F1B, 2, None),
    );
    let l = launch::emit(&file, Framework::Megatron).expect("emits");
    assert_eq!(
        value(&l.args, "--num-virtual-stages-per-pipeline-rank"),
        Some("2")
    );
    assert!(!l
        .args
        .iter()
        .any(|a| a == "--pipeline-model-parallel-layout"));
    assert_eq!(
        value(
            &l.args,
            "--microbatch-group-size-per-virtual-pipeline-stage"
        ),
        Some("4")
    );
}

#[test]
fn torchtitan_eras_name_batching_their_own_way() {
    let file = plan_file(
        "llama3-70b",
        64,
        config(ScheduleKind::Interleaved1F1B, 2, None),
    );
    let mut c = config(ScheduleKind::Interleaved1F1B, 2, None);
    c.zero_stage = 2;
    let file2 = plan_file("llama3-70b", 64, c);
    let refused = launch::torchtitan_args(&file, TorchtitanEra::Release03).expect_err("ZeRO 1");
    assert!(refused.to_string().contains("no ZeRO 1"), "{refused}");
    let release = launch::torchtitan_args(&file2, TorchtitanEra::Release03).expect("0.3");
    assert_eq!(value(&release, "--training.local_batch_size"), Some("32"));
    assert_eq!(
        value(&release, "--parallelism.pipeline_parallel_microbatch_size"),
        Some("1")
    );
    assert_eq!(
        value(&release, "--parallelism.pipeline_parallel_schedule"),
        Some("Interleaved1F1B")
    );
    let head = launch::torchtitan_args(&file2, TorchtitanEra::TokenBatches).expect("main");
    assert_eq!(
        value(&head, "--training.num_tokens_per_microbatch_per_dp_rank"),
        Some("8192")
    );
    assert_eq!(
        value(&head, "--training.num_tokens_per_train_step"),
        Some("524288")
    );
    assert_eq!(
        value(&head, "--parallelism.num_pp_microbatches"),
        Some("32")
    );
    assert!(!head.iter().any(|a| a == "--training.local_batch_size"));
    assert_eq!(
        head.last().map(String::as_str),
        Some("activation-checkpoint:full")
    );
}

#[test]
fn deepspeed_names_the_partition_that_reproduces_the_split() {
    let mut c = config(ScheduleKind::OneFOneB, 1, None);
    c.recompute = Recompute::None;
    let file = plan_file("llama3-70b", 64, c.clone());
    let l = launch::emit(&file, Framework::Deepspeed).expect("emits");
    let module = &l.files["autopp_pipeline.py"];
    // 82 entries over 4 stages: uniform gives 21, 21, 20, 20, not the even 21, 20, 20, 21
    assert!(
        module.contains("\"partition_method\": \"type:TransformerLayer\""),
        "{module}"
    );
    assert!(module.contains("PARTS = [0, 21, 41, 61, 82]"));
    assert!(l.files["ds_config.json"].contains("\"train_batch_size\": 64"));
    c.split = Some(vec![20, 21, 21, 20]);
    let file = plan_file("llama3-70b", 64, c);
    let l = launch::emit(&file, Framework::Deepspeed).expect("emits");
    assert!(l.files["autopp_pipeline.py"].contains("\"partition_method\": \"autopp\""));
}

#[test]
fn torchtitan_writes_a_config_module_for_shapes_it_does_not_ship_and_puts_it_on_pythonpath() {
    let mut c = config(ScheduleKind::OneFOneB, 1, None);
    c.zero_stage = 2;
    for (preset, function) in [
        ("llama3-70b", "llama3_70b"),
        ("llama3-405b", "llama3_405b_bf16"),
        ("llama2-70b", "autopp_model"),
    ] {
        let file = plan_file(preset, 64, c.clone());
        let l = launch::emit(&file, Framework::Torchtitan).expect(preset);
        assert_eq!(value(&l.args, "--config"), Some(function), "{preset}");
        let ours = function != "llama3_70b";
        assert_eq!(
            l.files.contains_key("autopp_torchtitan.py"),
            ours,
            "{preset}"
        );
        for script in ["launch.sh", "sbatch.sh"] {
            let text = &l.files[script];
            assert_eq!(
                text.contains("export PYTHONPATH=\"$PLAN_DIR${PYTHONPATH:+:$PYTHONPATH}\""),
                ours,
                "{preset} {script}: {text}"
            );
            assert!(text.contains("export PYTORCH_CUDA_ALLOC_CONF="));
        }
    }
    // llama2-70b: the plan's sizes, the FFN width as is, Llama 2's RoPE base
    let file = plan_file("llama2-70b", 64, c);
    let l = launch::emit(&file, Framework::Torchtitan).expect("llama2-70b");
    let module = &l.files["autopp_torchtitan.py"];
    for line in [
        "N_LAYERS = 80\n",
        "DIM = 8192\n",
        "N_KV_HEADS = 8\n",
        "FFN_HIDDEN_DIM = 28672\n",
        "VOCAB_SIZE = 32000\n",
        "ROPE_THETA = 10000\n",
        "NORM_EPS = 1e-5\n",
        "NAME = \"llama2-70b\"\n",
    ] {
        assert!(module.contains(line), "{line} in {module}");
    }
}

/// A plan file edited to a zero degree or count is refused when it is read, naming the file
/// and the field; the file as written reads back.
#[test]
fn a_plan_file_with_a_zero_count_is_refused_on_reading() {
    let file = plan_file("llama3-70b", 64, config(ScheduleKind::OneFOneB, 1, None));
    let text = serde_json::to_string(&file).expect("json");
    assert!(PlanFile::from_json(&text, "p.json").is_ok());
    let value: serde_json::Value = serde_json::from_str(&text).expect("value");
    for key in ["pp", "micro_batch_size", "num_microbatches"] {
        let mut edited = value.clone();
        edited["plan"][key] = serde_json::json!(0);
        let err = PlanFile::from_json(&edited.to_string(), "p.json")
            .expect_err("zero refused")
            .to_string();
        assert!(err.contains(&format!("p.json: plan.{key} is 0")), "{err}");
    }
}
