//! Megatron-LM: the full argument list of `pretrain_gpt.py` for a plan.
//!
//! Flag names and rules are Megatron-LM main's (`megatron/training/arguments.py`,
//! `TransformerConfig.__post_init__`, `pipeline_parallel_layer_layout.py`). The split goes
//! through `--pipeline-model-parallel-layout` unless it is Megatron's own even split; virtual
//! stages come from the layout or from `--num-virtual-stages-per-pipeline-rank`, never both.

use autopp_hardware::Precision;
use autopp_models::{Norm, PositionEmbedding, Recompute};
use autopp_schedule::{Placement, ScheduleKind};

use super::fp8_shapes::fp8_gemm_fault;
use super::view::{PlanView, RecomputePlan};
use super::{flag, Entry, Refusal};
use crate::framework::Framework;

const FW: Framework = Framework::Megatron;

/// The `pretrain_gpt.py` entry for `view`, or why Megatron-LM cannot run it.
pub(super) fn emit(view: &PlanView) -> Result<Entry, Refusal> {
    check(view)?;
    super::megatron_moe::check(view)?;
    let mut args = Vec::new();
    model_args(view, &mut args);
    super::megatron_moe::moe_args(view, &mut args);
    flag(&mut args, "--tensor-model-parallel-size", view.tp);
    flag(&mut args, "--pipeline-model-parallel-size", view.pp);
    flag(&mut args, "--context-parallel-size", view.cp);
    if view.sequence_parallel && view.tp > 1 {
        // Megatron-LM turns sequence parallelism off (with a warning) when tp = 1
        args.push("--sequence-parallel".into());
    }
    let mut notes = Vec::new();
    if let Some(alternative) = split_args(view, &mut args) {
        notes.push(
            "the split has Megatron-LM's uneven first/last shape, so in place of --pipeline-model-parallel-layout you may pass:".to_string(),
        );
        notes.push(format!("equivalent: {alternative}"));
    }
    batch_args(view, &mut args);
    recompute_args(view, &mut args)?;
    optimizer_args(view, &mut args);
    let mut env = Vec::new();
    if view.tp > 1 || view.cp > 1 {
        env.push((
            "CUDA_DEVICE_MAX_CONNECTIONS",
            "1".to_string(),
            "Megatron-LM requires it with tensor (sequence) or context parallelism, so that communication kernels are queued before the compute that overlaps them".to_string(),
        ));
    }
    if view.model.position_embedding == PositionEmbedding::None && !view.model.gated_mlp {
        notes.push(format!(
            "{} has no position parameters; Megatron-LM has no ALiBi, so it runs rotary embeddings (no parameters either)",
            view.model.name
        ));
    }
    notes.push(
        "RUN_ARGS runs the plan on mock data with a null tokenizer of the model's vocabulary, to check speed and memory; replace it with --data-path, --tokenizer-type and --tokenizer-model, --lr and --train-iters for real training".into(),
    );
    Ok(Entry {
        program: vec!["\"${MEGATRON_LM:-.}/pretrain_gpt.py\"".into()],
        args,
        run_args: run_args(view),
        env,
        notes,
        files: Vec::new(),
    })
}

/// What Megatron-LM cannot run.
fn check(view: &PlanView) -> Result<(), Refusal> {
    let kind = view.schedule;
    if kind.placement() == Placement::V {
        return Err(Refusal::VPlacement(kind));
    }
    if kind.splits_backward() {
        return Err(Refusal::ZeroBubble(kind));
    }
    if !matches!(kind, ScheduleKind::OneFOneB | ScheduleKind::Interleaved1F1B) {
        return Err(Refusal::Schedule(FW, kind));
    }
    if view.zero_stage > 1 {
        return Err(Refusal::ZeroStage(FW, view.zero_stage));
    }
    let seq = view.model.seq_length;
    if view.cp > 1 && !FW.cp_cuts(seq, view.cp) {
        return Err(Refusal::SequenceLength(
            FW,
            format!(
                "context parallelism of {} needs the sequence length to be a multiple of 2·cp = {}, and it is {seq}",
                view.cp,
                2 * view.cp
            ),
        ));
    }
    if view.virtual_stages > 1 {
        check_interleaving(view)?;
    }
    check_fp8_shapes(view)
}

/// A plan whose GEMM shapes Transformer Engine's FP8 kernels refuse would stop at its first
/// FP8 GEMM: refused with the sizes ([`super::fp8_shapes`]).
fn check_fp8_shapes(view: &PlanView) -> Result<(), Refusal> {
    match fp8_gemm_fault(FW, &view.model, view.precision, view.gemm_shape()) {
        Some(fault) => Err(Refusal::SequenceLength(FW, fault.message())),
        None => Ok(()),
    }
}

/// Megatron-LM's interleaved schedule: pp > 1, and `pp ≤ G ≤ m` with `m mod G` either 0 or at
/// least pp for the micro-batch group size G (`schedules.py`).
fn check_interleaving(view: &PlanView) -> Result<(), Refusal> {
    let (pp, m) = (view.pp, view.num_microbatches);
    if pp == 1 {
        return Err(Refusal::Microbatches(
            FW,
            format!(
                "{} stages per rank need a pipeline (pp > 1); this plan has pp = 1",
                view.virtual_stages
            ),
        ));
    }
    let g = view.group_size.unwrap_or(pp);
    let rest = m % g;
    if g < pp || g > m || (rest != 0 && rest < pp) {
        return Err(Refusal::Microbatches(
            FW,
            format!(
                "the interleaved schedule needs pp <= micro-batch group <= micro-batches and the remainder 0 or at least pp; this plan has pp = {pp}, group = {g}, {m} micro-batches"
            ),
        ));
    }
    Ok(())
}

/// The model's shape, as `pretrain_gpt.py` takes it.
fn model_args(view: &PlanView, args: &mut Vec<String>) {
    let m = &view.model;
    flag(args, "--num-layers", m.num_layers);
    flag(args, "--hidden-size", m.hidden_size);
    flag(args, "--ffn-hidden-size", m.ffn());
    flag(args, "--num-attention-heads", m.num_attention_heads);
    if m.kv_heads() != m.num_attention_heads {
        args.push("--group-query-attention".into());
        flag(args, "--num-query-groups", m.kv_heads());
    }
    flag(args, "--seq-length", m.seq_length);
    match m.position_embedding {
        PositionEmbedding::Learned => {
            flag(args, "--max-position-embeddings", m.position_table_rows());
            flag(args, "--position-embedding-type", "learned_absolute");
        }
        PositionEmbedding::None => {
            flag(args, "--max-position-embeddings", m.seq_length);
            // a model without position parameters: rotary embeddings, Megatron-LM's choice
            // for them (it has no ALiBi)
            flag(args, "--position-embedding-type", "rope");
            if view.rope_theta() != 10_000 {
                flag(args, "--rotary-base", view.rope_theta());
            }
        }
    }
    if m.gated_mlp {
        args.push("--swiglu".into());
    }
    if m.norm == Norm::Rmsnorm {
        flag(args, "--normalization", "RMSNorm");
    }
    // Megatron-LM's `--norm-epsilon` defaults to 1e-5
    if view.norm_eps() != 1e-5 {
        flag(args, "--norm-epsilon", format!("{:e}", view.norm_eps()));
    }
    if !m.tied_embeddings {
        args.push("--untie-embeddings-and-output-weights".into());
    }
    if !m.bias {
        args.push("--disable-bias-linear".into());
        if m.has_qkv_bias() {
            args.push("--add-qkv-bias".into());
        }
    }
    if !m.dropout {
        flag(args, "--attention-dropout", 0);
        flag(args, "--hidden-dropout", 0);
    }
    flag(
        args,
        "--make-vocab-size-divisible-by",
        view.runtime.vocab_pad_multiple,
    );
    let backend = if view.flash_attention {
        "flash"
    } else {
        "unfused"
    };
    flag(args, "--attention-backend", backend);
}

/// The split: nothing for Megatron-LM's own even split (plus the number of virtual stages),
/// else the layout. Returns the equivalent `--decoder-first/last-pipeline-num-layers` flags
/// when the split has that shape.
fn split_args(view: &PlanView, args: &mut Vec<String>) -> Option<String> {
    if view.pp * view.virtual_stages == 1 {
        return None;
    }
    if view.is_even() {
        if view.virtual_stages > 1 {
            flag(
                args,
                "--num-virtual-stages-per-pipeline-rank",
                view.virtual_stages,
            );
        }
        return None;
    }
    flag(args, "--pipeline-model-parallel-layout", layout(view));
    first_last(view).map(|(first, last)| {
        let mut alt = format!(
            "--decoder-first-pipeline-num-layers {first} --decoder-last-pipeline-num-layers {last}"
        );
        if view.virtual_stages > 1 {
            alt.push_str(&format!(
                " --num-virtual-stages-per-pipeline-rank {}",
                view.virtual_stages
            ));
        }
        alt
    })
}

/// The layout string: each stage's `E`, `t*N`, `m*N` (MTP), `L`, stages joined by `|`, and runs of three or
/// more equal stages written once as `(S|)*n`.
pub(super) fn layout(view: &PlanView) -> String {
    let stages: Vec<String> = view
        .stages
        .iter()
        .map(|s| {
            let mut text = String::new();
            if s.has_embedding {
                text.push('E');
            }
            for (c, n) in [('t', s.layers), ('m', s.mtp)] {
                match n {
                    0 => {}
                    1 => text.push(c),
                    n => text.push_str(&format!("{c}*{n}")),
                }
            }
            if s.has_head {
                text.push('L');
            }
            text
        })
        .collect();
    compress(&stages)
}

/// Stages joined by `|`, with runs of equal stages as `(S|)*n` (Megatron-LM's grammar expands
/// a parenthesised body once, before single-character repeats).
fn compress(stages: &[String]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < stages.len() {
        let run = stages[i..].iter().take_while(|s| **s == stages[i]).count();
        let last = i + run == stages.len();
        // the final stage has no `|` after it, so it stays outside the group
        let grouped = if last { run - 1 } else { run };
        if grouped >= 3 {
            out.push_str(&format!("({}|)*{grouped}", stages[i]));
        } else {
            for _ in 0..grouped {
                out.push_str(&stages[i]);
                out.push('|');
            }
        }
        if last {
            out.push_str(&stages[i]);
        }
        i += run;
    }
    out
}

/// `(first, last)` transformer layers of the first and last pipeline ranks when the split has
/// Megatron-LM's `--decoder-first/last-pipeline-num-layers` shape: every stage of the first
/// rank alike, every stage of the last rank alike, every other stage alike (none on a
/// two-rank pipeline), all counts positive.
fn first_last(view: &PlanView) -> Option<(u64, u64)> {
    let (pp, v) = (view.pp, view.virtual_stages);
    if pp < 2 {
        return None;
    }
    let per_chunk = |rank: u64| -> Option<u64> {
        let counts: Vec<u64> = view.stages_of(rank).iter().map(|s| s.layers).collect();
        counts
            .windows(2)
            .all(|w| w[0] == w[1])
            .then(|| counts.first().copied())
            .flatten()
    };
    let (first, last) = (per_chunk(0)?, per_chunk(pp - 1)?);
    let middle: Option<Vec<u64>> = (1..pp - 1).map(per_chunk).collect();
    let middle = middle?;
    if first == 0 || last == 0 || middle.iter().any(|&c| c != *middle.first().unwrap_or(&c)) {
        return None;
    }
    if middle.first() == Some(&0) {
        return None;
    }
    Some((first * v, last * v))
}

/// Batching; the micro-batch group of the interleaved schedule.
fn batch_args(view: &PlanView, args: &mut Vec<String>) {
    flag(args, "--micro-batch-size", view.micro_batch_size);
    flag(args, "--global-batch-size", view.global_batch_size);
    if view.virtual_stages > 1 {
        flag(
            args,
            "--microbatch-group-size-per-virtual-pipeline-stage",
            view.group_size.unwrap_or(view.pp),
        );
    }
}

/// Recompute: selective, full for every layer, or the first N layers of every stage
/// (`--recompute-method block`), which is the only partial recompute Megatron-LM has.
fn recompute_args(view: &PlanView, args: &mut Vec<String>) -> Result<(), Refusal> {
    match view.recompute {
        RecomputePlan::Uniform(Recompute::None) => {}
        RecomputePlan::Uniform(Recompute::Selective) => {
            flag(args, "--recompute-granularity", "selective");
        }
        RecomputePlan::Uniform(Recompute::Full) => {
            flag(args, "--recompute-granularity", "full");
            flag(args, "--recompute-method", "uniform");
            flag(args, "--recompute-num-layers", 1);
        }
        RecomputePlan::Partial { base } => {
            if base != Recompute::None {
                return Err(Refusal::Recompute(
                    FW,
                    format!("its recompute granularity is one of full or selective, so it cannot recompute some layers fully and the others {base}; re-plan with --framework megatron"),
                ));
            }
            let n = view.stages.iter().map(|s| s.recomputed).max().unwrap_or(0);
            if view.stages.iter().any(|s| s.recomputed != n.min(s.layers)) {
                let counts: Vec<u64> = view.stages.iter().map(|s| s.recomputed).collect();
                return Err(Refusal::Recompute(
                    FW,
                    format!("--recompute-num-layers recomputes the same first N layers of every stage, but this plan recomputes {counts:?} per stage; re-plan with --framework megatron"),
                ));
            }
            if n > 0 {
                flag(args, "--recompute-granularity", "full");
                flag(args, "--recompute-method", "block");
                flag(args, "--recompute-num-layers", n);
            }
        }
    }
    Ok(())
}

/// The distributed optimizer (ZeRO 1), the overlap the plan's runtime assumed, precision.
fn optimizer_args(view: &PlanView, args: &mut Vec<String>) {
    if view.zero_stage == 1 {
        args.push("--use-distributed-optimizer".into());
    }
    if view.runtime.overlap_grad_reduce {
        args.push("--overlap-grad-reduce".into());
    }
    // the weight all-gather of the distributed optimizer overlapped with the next forward
    if view.zero_stage == 1 && view.runtime.overlap_param_gather {
        args.push("--overlap-param-gather".into());
    }
    match view.precision.high() {
        Precision::Fp16 => {
            args.push("--fp16".into());
            if view.runtime.fp32_main_grads {
                // fp16 accumulates and reduces 16-bit gradients unless asked
                args.push("--accumulate-allreduce-grads-in-fp32".into());
            }
        }
        _ => args.push("--bf16".into()),
    }
    fp8_args(view, args);
    flag(args, "--clip-grad", "1.0");
}

/// Transformer Engine's FP8 recipe for an FP8 plan, beside `--bf16` (Megatron-Core's
/// `TransformerConfig.fp8` and `fp8_recipe`, flags `--fp8-format` and `--fp8-recipe`):
/// delayed scaling with NeMo's amax history (1,024 steps, the maximum: the recipe autopp's
/// NeMo rows ran), current (tensorwise) scaling, both `hybrid` (E4M3 forward, E5M2 gradients),
/// and MXFP8 in E4M3 throughout (Megatron-LM's Blackwell recipes). FP8 weights
/// (`--fp8-param-gather`, `fp8_param`) where the plan's runtime assumed them. Nothing for bf16
/// and fp16; rowwise scaling is refused before this (Transformer Engine has none).
fn fp8_args(view: &PlanView, args: &mut Vec<String>) {
    let (format, recipe) = match view.precision {
        Precision::Fp8Delayed => ("hybrid", "delayed"),
        Precision::Fp8Tensorwise => ("hybrid", "tensorwise"),
        Precision::Mxfp8 => ("e4m3", "mxfp8"),
        Precision::Bf16 | Precision::Fp16 | Precision::Fp8Rowwise => return,
    };
    flag(args, "--fp8-format", format);
    flag(args, "--fp8-recipe", recipe);
    if view.precision == Precision::Fp8Delayed {
        flag(args, "--fp8-amax-history-len", 1024);
        flag(args, "--fp8-amax-compute-algo", "max");
    }
    if view.runtime.fp8_params {
        args.push("--fp8-param-gather".into());
    }
}

/// Arguments a run needs that the plan does not decide: mock data, a null tokenizer of the
/// model's vocabulary, a short run.
fn run_args(view: &PlanView) -> Vec<String> {
    let mut args = vec!["--mock-data".to_string()];
    flag(&mut args, "--tokenizer-type", "NullTokenizer");
    flag(&mut args, "--vocab-size", view.model.vocab_size);
    flag(&mut args, "--train-iters", 20);
    flag(&mut args, "--lr", "1.0e-4");
    flag(&mut args, "--log-interval", 1);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_equal_stages_are_grouped() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(compress(&s(&["Et", "t*2", "tL"])), "Et|t*2|tL");
        assert_eq!(
            compress(&s(&["Et", "t*2", "t*2", "t*2", "tL"])),
            "Et|(t*2|)*3tL"
        );
        assert_eq!(
            compress(&s(&["Et*2", "t*3", "t*3", "t*3", "t*3"])),
            "Et*2|(t*3|)*3t*3"
        );
        assert_eq!(compress(&s(&["Et*80L"])), "Et*80L");
    }
}
