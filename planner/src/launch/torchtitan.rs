//! torchtitan: `torchtitan.train` arguments (`--module`/`--config` and `--section.key`
//! overrides) for a plan, the schedule under the name PyTorch accepts or, for a schedule
//! PyTorch does not name, autopp's own action table as a CSV.
//!
//! Written for the PyPI release ([`super::TORCHTITAN_VERSION`]): Python config functions
//! selected by `--module`/`--config`, batching through `training.local_batch_size`,
//! `training.global_batch_size` and `parallelism.pipeline_parallel_microbatch_size`, the split
//! through `parallelism.module_fqns_per_model_part`. [`Era`] holds what differs in the
//! configuration eras before and after it (`../shared/reference/torchtitan-deepspeed.md`).

use std::fmt::Write as _;

use autopp_hardware::Precision;
use autopp_models::Recompute;
use autopp_schedule::{generate, ScheduleKind, ScheduleSpec, Step};

use super::torchtitan_models::{config_for, CONFIG_MODULE};
use super::view::{PlanView, RecomputePlan};
use super::{flag, Entry, Refusal};
use crate::framework::Framework;

const FW: Framework = Framework::Torchtitan;

/// File name of the CSV action table.
pub(super) const CSV_FILE: &str = "pipeline_schedule.csv";

/// torchtitan's configuration eras, by how batching and the output head are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 0.3.x (Python config functions, 2026-02-23 to 2026-08-20): sequences per DP rank
    /// (`training.local_batch_size`), pipeline micro-batch size, `lm_head`.
    Release03,
    /// torchtitan main since 2026-08-20 ("fold batch dim"): token counts
    /// (`training.num_tokens_per_microbatch_per_dp_rank`, `num_tokens_per_train_step`) and
    /// `parallelism.num_pp_microbatches`. Not on PyPI yet.
    TokenBatches,
}

/// The `torchtitan.train` entry for `view`, or why torchtitan cannot run it.
pub(super) fn emit(view: &PlanView) -> Result<Entry, Refusal> {
    emit_for(view, Era::Release03)
}

/// The entry for `view` in the configuration era `era`.
pub(super) fn emit_for(view: &PlanView, era: Era) -> Result<Entry, Refusal> {
    let config = config_for(view)?;
    check(view)?;
    // the converters are written for 0.3.0's config functions
    if era != Era::Release03 && view.precision != Precision::Bf16 {
        return Err(Refusal::Precision(FW, view.precision));
    }
    let config = super::torchtitan_fp8::converted(view, config);
    let mut args = vec![
        "--module".to_string(),
        config.module.to_string(),
        "--config".to_string(),
        config.function.to_string(),
    ];
    mesh_args(view, &mut args);
    let mut files = Vec::new();
    let mut env = vec![(
        "PYTORCH_CUDA_ALLOC_CONF",
        "expandable_segments:True".to_string(),
        "as torchtitan's run_train.sh: less fragmentation, which autopp's memory model assumes"
            .to_string(),
    )];
    if let Some(text) = &config.file {
        files.push((CONFIG_MODULE.to_string(), text.clone()));
        env.push((
            "PYTHONPATH",
            "$PLAN_DIR${PYTHONPATH:+:$PYTHONPATH}".to_string(),
            format!("--module autopp_torchtitan is {CONFIG_MODULE} in this directory"),
        ));
    }
    if view.pp > 1 {
        if let Some(csv) = schedule_args(view, &mut args)? {
            files.push((CSV_FILE.to_string(), csv));
        }
        match era {
            Era::Release03 => flag(
                &mut args,
                "--parallelism.pipeline_parallel_microbatch_size",
                view.micro_batch_size,
            ),
            Era::TokenBatches => flag(
                &mut args,
                "--parallelism.num_pp_microbatches",
                view.num_microbatches,
            ),
        }
        args.push("--parallelism.module_fqns_per_model_part".into());
        args.extend(module_fqns(view, era));
        args.push("--training.disable_cuda_graphs".into());
    }
    batch_args(view, era, &mut args);
    flag(&mut args, "--training.mixed_precision_param", "bfloat16");
    // autopp times torchtitan's blocks with fused element-wise kernels and sizes their op-level
    // checkpoint as compiled (`Runtime::torch_compiled`); the loss stays eager, as it plans it
    args.push("--compile.enable".into());
    flag(&mut args, "--compile.components", "model");
    let notes = vec![
        format!(
            "--module {} --config {} defines {} (its shape is the plan's model); the flags after it set what the plan decides",
            config.module, config.function, view.model.name
        ),
        "--compile.enable --compile.components model: the blocks compiled and the loss eager, as autopp predicted them; compiling the loss too (\"model\" \"loss\", torchtitan's default list) needs less memory than predicted".to_string(),
    ];
    // the subcommand goes last: tyro reads the flags after it as its own
    args.push(format!("activation-checkpoint:{}", checkpointing(view)?));
    Ok(Entry {
        program: vec!["-m".into(), "torchtitan.train".into()],
        args,
        run_args: vec!["--training.steps".into(), "20".into()],
        env,
        notes,
        files,
    })
}

pub(super) const TITAN: &str = "torchtitan 0.3.0";

/// What torchtitan cannot run.
fn check(view: &PlanView) -> Result<(), Refusal> {
    // bf16, or the FP8 recipes of torchtitan's converters (`super::torchtitan_fp8`)
    if !matches!(
        view.precision,
        Precision::Bf16 | Precision::Fp8Rowwise | Precision::Mxfp8
    ) {
        return Err(Refusal::Precision(FW, view.precision));
    }
    if let Some(fault) = super::fp8_gemm_fault(FW, &view.model, view.precision, view.gemm_shape()) {
        return Err(Refusal::SequenceLength(FW, fault.message()));
    }
    if view.zero_stage == 1 {
        return Err(Refusal::ZeroStage(FW, 1));
    }
    let kv = view.model.kv_heads();
    if !kv.is_multiple_of(view.tp) {
        return Err(Refusal::Model(
            FW,
            format!(
                "splits whole key/value heads over its tensor-parallel ranks, and tp = {} does not divide {}'s {kv}; re-plan with --framework torchtitan",
                view.tp, view.model.name
            ),
        ));
    }
    let seq = view.model.seq_length;
    if view.cp > 1 && !FW.cp_cuts(seq, view.cp) {
        return Err(Refusal::SequenceLength(
            FW,
            format!(
                "its context-parallel load balancer cuts each sequence into 2·cp = {} chunks, and the sequence length is {seq}",
                2 * view.cp
            ),
        ));
    }
    if view.pp > 1 {
        check_microbatches(view)?;
    }
    Ok(())
}

/// PyTorch's interleaved schedules run `max(1, m // pp)` rounds of `m / rounds` micro-batches
/// (`torch.distributed.pipelining.schedules`); the plan must group them the same way. (Its
/// DualPipeV needs `m ≥ 2·pp`, which autopp's generator asks too.)
fn check_microbatches(view: &PlanView) -> Result<(), Refusal> {
    let (pp, m) = (view.pp, view.num_microbatches);
    if !matches!(
        view.schedule,
        ScheduleKind::Interleaved1F1B | ScheduleKind::InterleavedZb
    ) || view.virtual_stages == 1
    {
        return Ok(());
    }
    let rounds = (m / pp).max(1);
    let grouped = m.is_multiple_of(rounds).then_some(m / rounds);
    let planned = view.group_size.or(grouped);
    if grouped.is_none() || planned != grouped {
        return Err(Refusal::Microbatches(
            FW,
            format!(
                "PyTorch's {} runs max(1, m // pp) = {rounds} rounds of m / rounds micro-batches, which needs m ({m}) to divide into them and the plan to group its micro-batches so (it groups {})",
                name(view.schedule).unwrap_or_default(),
                planned.map_or("none".to_string(), |g| g.to_string())
            ),
        ));
    }
    Ok(())
}

/// The name `get_schedule_class` accepts for `kind`; `None` for schedules PyTorch does not
/// name (run from a CSV).
pub(super) fn name(kind: ScheduleKind) -> Option<&'static str> {
    Some(match kind {
        ScheduleKind::Gpipe => "GPipe",
        ScheduleKind::OneFOneB => "1F1B",
        ScheduleKind::Interleaved1F1B => "Interleaved1F1B",
        ScheduleKind::LoopedBfs => "LoopedBFS",
        ScheduleKind::InterleavedZb => "InterleavedZeroBubble",
        ScheduleKind::ZbV => "ZBVZeroBubble",
        ScheduleKind::DualPipeV => "DualPipeV",
        ScheduleKind::ZbH1 | ScheduleKind::ZbH2 => return None,
    })
}

/// Degrees: dp_replicate × dp_shard = dp (ZeRO 0 replicates; ZeRO 2 and 3 shard with FSDP2),
/// tp with or without sequence parallelism, pp, cp.
fn mesh_args(view: &PlanView, args: &mut Vec<String>) {
    let (replicate, shard, reshard) = match view.zero_stage {
        0 => (view.dp, 1, None),
        2 => (1, view.dp, Some("never")),
        _ => (1, view.dp, Some("always")),
    };
    flag(
        args,
        "--parallelism.data_parallel_replicate_degree",
        replicate,
    );
    flag(args, "--parallelism.data_parallel_shard_degree", shard);
    if let Some(policy) = reshard {
        flag(args, "--parallelism.fsdp_reshard_after_forward", policy);
    }
    flag(args, "--parallelism.tensor_parallel_degree", view.tp);
    if view.tp > 1 && !view.sequence_parallel {
        args.push("--parallelism.no_enable_sequence_parallel".into());
    }
    flag(args, "--parallelism.pipeline_parallel_degree", view.pp);
    flag(args, "--parallelism.context_parallel_degree", view.cp);
}

/// The schedule by name, or by the CSV action table (returned) for one PyTorch does not name.
fn schedule_args(view: &PlanView, args: &mut Vec<String>) -> Result<Option<String>, Refusal> {
    if let Some(name) = name(view.schedule) {
        flag(args, "--parallelism.pipeline_parallel_schedule", name);
        return Ok(None);
    }
    flag(
        args,
        "--parallelism.pipeline_parallel_schedule",
        "PipelineScheduleMulti",
    );
    flag(
        args,
        "--parallelism.pipeline_parallel_schedule_csv",
        CSV_FILE,
    );
    csv(view).map(Some)
}

/// autopp's action lists for the plan's schedule, one CSV row per rank, in exact order, in
/// PyTorch's action grammar (`2F0`, `2I0`, `2W0`, `2B0`).
pub(super) fn csv(view: &PlanView) -> Result<String, Refusal> {
    let spec = ScheduleSpec::new(
        view.schedule,
        view.pp as usize,
        view.num_microbatches as usize,
    )
    .with_virtual_stages(view.virtual_stages as usize);
    let schedule = generate(&spec).map_err(|e| Refusal::Microbatches(FW, e.to_string()))?;
    let mut text = String::new();
    for rank in &schedule.ranks {
        for (i, step) in rank.iter().enumerate() {
            let Step::One(a) = step else {
                return Err(Refusal::Schedule(FW, view.schedule));
            };
            if i > 0 {
                text.push(',');
            }
            // writing to a String cannot fail
            let _ = write!(text, "{a}");
        }
        text.push('\n');
    }
    Ok(text)
}

/// The modules of each stage, in global stage order, one argument per stage
/// (`tok_embeddings,layers.0,…`).
fn module_fqns(view: &PlanView, era: Era) -> Vec<String> {
    let head = match era {
        Era::Release03 | Era::TokenBatches => ["norm", "lm_head"],
    };
    view.stages
        .iter()
        .map(|s| {
            let mut names = Vec::new();
            if s.has_embedding {
                names.push("tok_embeddings".to_string());
            }
            names.extend((s.first_layer..s.first_layer + s.layers).map(|i| format!("layers.{i}")));
            if s.has_head {
                names.extend(head.iter().map(|h| h.to_string()));
            }
            names.join(",")
        })
        .collect()
}

/// Batching. With a pipeline, one step's batch per DP rank is split into the plan's
/// micro-batches (their size or count is a parallelism flag); without one, torchtitan
/// accumulates gradients over them.
fn batch_args(view: &PlanView, era: Era, args: &mut Vec<String>) {
    let seq = view.model.seq_length;
    let mbs = view.micro_batch_size;
    match era {
        Era::Release03 => {
            let m = view.num_microbatches;
            let local = if view.pp > 1 { m * mbs } else { mbs };
            flag(args, "--training.local_batch_size", local);
            flag(args, "--training.global_batch_size", view.global_batch_size);
            flag(args, "--training.seq_len", seq);
        }
        Era::TokenBatches => {
            flag(
                args,
                "--training.num_tokens_per_microbatch_per_dp_rank",
                mbs.saturating_mul(seq),
            );
            flag(
                args,
                "--training.num_tokens_per_train_step",
                view.global_batch_size.saturating_mul(seq),
            );
            flag(args, "--training.max_context_length", seq);
        }
    }
}

/// The activation-checkpointing subcommand: torchtitan applies one mode to every layer.
fn checkpointing(view: &PlanView) -> Result<&'static str, Refusal> {
    match view.recompute {
        RecomputePlan::Uniform(Recompute::None) => Ok("none"),
        RecomputePlan::Uniform(Recompute::Selective) => Ok("selective"),
        RecomputePlan::Uniform(Recompute::Full) => Ok("full"),
        RecomputePlan::Partial { .. } => Err(Refusal::Recompute(
            FW,
            "its activation checkpointing is the same for every layer, and this plan fully recomputes only some; re-plan with --framework torchtitan".into(),
        )),
    }
}
