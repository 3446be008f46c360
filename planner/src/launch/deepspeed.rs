//! DeepSpeed: `ds_config.json` and the `PipelineModule` arguments for a plan.
//!
//! The JSON holds batching (`train_batch_size = micro × gradient accumulation × dp`, where the
//! pipeline engine runs one micro-batch per accumulation step), ZeRO (< 2 with a pipeline),
//! precision and clipping. The stage count and split are `PipelineModule` arguments, set in
//! code (the JSON's `pipeline.stages` and `pipeline.partition` are never read):
//! `autopp_pipeline.py` holds them, with `partition_method` chosen so that DeepSpeed's own
//! partitioning (`deepspeed/runtime/utils.py`, ported below) reproduces the plan's split; when
//! none does, the explicit boundaries (`"autopp"`, read by the file's `PipelineModule`
//! subclass).

use autopp_models::Recompute;
use autopp_schedule::ScheduleKind;
use serde_json::json;

use super::view::{PlanView, RecomputePlan};
use super::{Entry, Refusal};
use crate::framework::Framework;

const FW: Framework = Framework::Deepspeed;

/// The config file's name.
pub(super) const CONFIG_FILE: &str = "ds_config.json";
/// The `PipelineModule` arguments' file.
pub(super) const MODULE_FILE: &str = "autopp_pipeline.py";

/// The class-name regex of `partition_method="type:…"`: it matches the transformer layers
/// only (Megatron-DeepSpeed's `ParallelTransformerLayerPipe`, `TransformerLayerPipe`).
const TRANSFORMER_TYPE: &str = "type:TransformerLayer";

/// DeepSpeed's files and arguments for `view`, or why DeepSpeed cannot run it.
pub(super) fn emit(view: &PlanView) -> Result<Entry, Refusal> {
    check(view)?;
    let interval = match view.recompute {
        RecomputePlan::Uniform(Recompute::None) => 0,
        RecomputePlan::Uniform(Recompute::Full) => 1,
        RecomputePlan::Uniform(Recompute::Selective) => {
            return Err(Refusal::Recompute(
                FW,
                "its pipeline engine checkpoints whole layers (activation_checkpoint_interval), not the attention core alone; re-plan with --framework deepspeed".into(),
            ))
        }
        RecomputePlan::Partial { .. } => {
            return Err(Refusal::Recompute(
                FW,
                "activation_checkpoint_interval checkpoints every k-th layer alike, and this plan fully recomputes different layers per stage; re-plan with --framework deepspeed".into(),
            ))
        }
    };
    let parts = parts(view);
    let method = partition_method(view, &parts);
    let mut notes = vec![format!(
        "the training script builds its PipelineModule from {MODULE_FILE} and calls deepspeed.initialize with --deepspeed_config"
    )];
    if view.tp > 1 {
        notes.push(format!(
            "tensor parallelism ({}{}) lives in the model's layers (Megatron-DeepSpeed); {MODULE_FILE} gives the pipe x model x data topology",
            view.tp,
            if view.sequence_parallel {
                ", with sequence parallelism"
            } else {
                ""
            }
        ));
    }
    Ok(Entry {
        program: vec!["\"${TRAIN_SCRIPT:-train.py}\"".into()],
        args: vec![
            "--deepspeed".into(),
            "--deepspeed_config".into(),
            CONFIG_FILE.into(),
        ],
        run_args: Vec::new(),
        env: Vec::new(),
        notes,
        files: vec![
            (CONFIG_FILE.to_string(), config(view, interval)),
            (
                MODULE_FILE.to_string(),
                module_file(view, &parts, method, interval),
            ),
        ],
    })
}

/// What DeepSpeed's pipeline engine cannot run.
fn check(view: &PlanView) -> Result<(), Refusal> {
    let one_stage_1f1b = view.virtual_stages == 1
        && matches!(
            view.schedule,
            ScheduleKind::OneFOneB | ScheduleKind::Interleaved1F1B
        );
    if !one_stage_1f1b {
        return Err(Refusal::Schedule(FW, view.schedule));
    }
    // the launch always builds a PipelineModule, whose engine asserts ZeRO < 2
    if view.zero_stage > 1 {
        return Err(Refusal::ZeroStage(FW, view.zero_stage));
    }
    if view.cp > 1 {
        return Err(Refusal::ContextParallel(FW));
    }
    Ok(())
}

/// The layer-list boundaries of each stage: stage s holds `layers[parts[s]..parts[s + 1]]`.
fn parts(view: &PlanView) -> Vec<usize> {
    let mut parts = vec![0];
    for s in &view.stages {
        let n = s.layers + u64::from(s.has_embedding) + u64::from(s.has_head);
        parts.push(parts[parts.len() - 1] + n as usize);
    }
    parts
}

/// The partition method DeepSpeed's own partitioning reproduces `parts` with: `uniform`
/// (layer count) or `type:TransformerLayer` (transformer layers balanced, embedding and head
/// weightless); else [`EXPLICIT`], the boundaries themselves.
fn partition_method(view: &PlanView, parts: &[usize]) -> &'static str {
    let n = view.model.num_layers as usize + 2;
    let stages = view.stages.len();
    if partition_uniform(n, stages) == parts {
        return "uniform";
    }
    // DeepSpeed's dynamic program is O(n²·stages): beyond real models, take the boundaries
    if n.saturating_mul(n).saturating_mul(stages) > 1 << 32 {
        return EXPLICIT;
    }
    let mut weights = vec![1u64; n];
    weights[0] = 0;
    weights[n - 1] = 0;
    if partition_balanced(&weights, stages) == parts {
        return TRANSFORMER_TYPE;
    }
    EXPLICIT
}

/// The partition method of `autopp_pipeline.py`'s `PipelineModule` subclass that takes the
/// plan's boundaries as they are.
const EXPLICIT: &str = "autopp";

/// DeepSpeed's `partition_uniform(num_items, num_parts)`: the remainder goes to the first
/// parts; with no more items than parts, one each and then empty parts.
pub(super) fn partition_uniform(num_items: usize, num_parts: usize) -> Vec<usize> {
    if num_items <= num_parts {
        return (0..=num_parts).map(|p| p.min(num_items)).collect();
    }
    let chunk = num_items / num_parts;
    let residual = num_items - chunk * num_parts;
    (0..=num_parts)
        .map(|p| p * chunk + p.min(residual))
        .collect()
}

/// DeepSpeed's `partition_balanced(weights, num_parts)`: the linear partition that minimises
/// the spread (largest minus smallest part), ties to the latest cut, as its dynamic program.
pub(super) fn partition_balanced(weights: &[u64], num_parts: usize) -> Vec<usize> {
    let (n, m) = (weights.len(), num_parts);
    if n <= m {
        return partition_uniform(n, m);
    }
    let inf = f64::INFINITY;
    let mut dp_max = vec![vec![inf; m + 1]; n + 1];
    let mut dp_min = vec![vec![inf; m + 1]; n + 1];
    let mut dp_cost = vec![vec![inf; m + 1]; n + 1];
    let mut position = vec![vec![0usize; m + 1]; n + 1];
    let mut prefix = vec![0.0f64; n + 1];
    for (i, w) in weights.iter().enumerate() {
        prefix[i + 1] = prefix[i] + *w as f64;
    }
    dp_max[0][0] = 0.0;
    dp_cost[0][0] = 0.0;
    for i in 1..=n {
        for j in 1..=i.min(m) {
            for k in 0..i {
                let part = prefix[i] - prefix[k];
                let max_sum = dp_max[k][j - 1].max(part);
                let min_sum = dp_min[k][j - 1].min(part);
                let cost = max_sum - min_sum;
                if dp_cost[i][j] >= cost {
                    dp_cost[i][j] = cost;
                    dp_max[i][j] = max_sum;
                    dp_min[i][j] = min_sum;
                    position[i][j] = k;
                }
            }
        }
    }
    let mut parts = vec![n];
    for j in (1..=m).rev() {
        let last = parts[parts.len() - 1];
        parts.push(position[last][j]);
    }
    parts.reverse();
    parts
}

/// `ds_config.json`.
fn config(view: &PlanView, interval: u64) -> String {
    let mut c = json!({
        "train_batch_size": view.global_batch_size,
        "train_micro_batch_size_per_gpu": view.micro_batch_size,
        "gradient_accumulation_steps": view.num_microbatches,
        "zero_optimization": {"stage": view.zero_stage},
        "gradient_clipping": 1.0,
        "steps_per_print": 10,
        "wall_clock_breakdown": false,
    });
    // FP8 plans are refused before this (launch::emit)
    let precision = view.precision.high().as_str();
    c[precision] = json!({"enabled": true});
    if view.runtime.fp32_main_grads {
        // gradients accumulated and reduced in fp32 (DeepSpeed's BF16_Optimizer under bf16)
        c["data_types"] = json!({"grad_accum_dtype": "fp32"});
    }
    c["pipeline"] = json!({"activation_checkpoint_interval": interval});
    let mut text = serde_json::to_string_pretty(&c).unwrap_or_default();
    text.push('\n');
    text
}

/// `autopp_pipeline.py`: the `PipelineModule` arguments, the split they reproduce, the
/// topology, and a helper that builds the module.
fn module_file(view: &PlanView, parts: &[usize], method: &str, interval: u64) -> String {
    let l = view.model.num_layers;
    let parts_text: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
    format!(
        r#""""DeepSpeed PipelineModule arguments for autopp's plan: {model} on {gpus} GPUs.

Written by `autopp launch --framework deepspeed` for {version}. Build the model's layers in
the order of LAYERS, then

    from autopp_pipeline import pipeline_module
    model = pipeline_module(layers, loss_fn=...)
    engine, *_ = deepspeed.initialize(model=model, config=args.deepspeed_config, ...)
"""

from deepspeed.pipe import PipelineModule
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

# the layer list the split counts: the embedding, {l} transformer layers, the head (final norm,
# LM head and loss); the class names must match TransformerLayer for a "type:" partition
LAYERS = ["EmbeddingPipe"] + ["TransformerLayerPipe"] * {l} + ["LMHeadPipe"]
# stage s holds LAYERS[PARTS[s]:PARTS[s + 1]]: the plan's split
PARTS = [{parts}]
# PipelineModule's arguments: DeepSpeed's "uniform" or "type:" partitioning when it reproduces
# PARTS, else "autopp" (PlannedPipelineModule takes PARTS as they are)
PIPELINE_MODULE_ARGS = {{
    "num_stages": {pp},
    "partition_method": "{method}",
    "activation_checkpoint_interval": {interval},
}}
# ranks: pipeline x tensor (model) x data parallel
TOPOLOGY = {{"num_pp": {pp}, "num_mp": {tp}, "num_dp": {dp}}}


class PlannedPipelineModule(PipelineModule):
    """A PipelineModule that also takes partition_method="autopp": the stages are PARTS."""

    def _partition_layers(self, method="uniform"):
        if method != "autopp":
            return super()._partition_layers(method=method)
        self.parts = list(PARTS)
        stage_id = self._topo.get_coord(self.global_rank).pipe
        self._set_bounds(start=self.parts[stage_id], stop=self.parts[stage_id + 1])


def pipeline_module(layers, **kwargs):
    """The plan's PipelineModule over `layers` (in the order of LAYERS)."""
    args = dict(PIPELINE_MODULE_ARGS)
    if TOPOLOGY["num_mp"] > 1:
        del args["num_stages"]
        args["topology"] = PipeModelDataParallelTopology(**TOPOLOGY)
    args.update(kwargs)
    return PlannedPipelineModule(layers=layers, **args)
"#,
        model = view.model.name,
        gpus = view.gpus,
        version = super::DEEPSPEED_VERSION,
        parts = parts_text.join(", "),
        pp = view.pp,
        tp = view.tp,
        dp = view.dp,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deepspeed_partitions() {
        // the reference's worked example: 10 layers over 4 stages gives 3, 3, 2, 2
        assert_eq!(partition_uniform(10, 4), [0, 3, 6, 8, 10]);
        assert_eq!(partition_uniform(2, 4), [0, 1, 2, 2, 2]);
        // embedding and head weightless: the transformer layers split evenly
        let mut w = vec![1u64; 10];
        w[0] = 0;
        w[9] = 0;
        assert_eq!(partition_balanced(&w, 2), [0, 5, 10]);
        assert_eq!(partition_balanced(&w, 4), [0, 3, 5, 7, 10]);
    }
}
