//! What the emitters read from a plan file, in one place.
//!
//! Every emitter reads the plan through [`PlanView`], never through the plan file's types
//! directly: when those types change (the schedule as an enum, recompute per rank as an enum,
//! shared degrees), only [`PlanView::new`] changes. The view also checks the plan file's own
//! consistency, so an emitter can trust it: errors name the plan file's field.

use autopp_hardware::Precision;
use autopp_models::{Recompute, TransformerSpec};
use autopp_schedule::{resolve_group_size, Placement, ScheduleKind, ScheduleSpec};

use super::{LaunchError, Refusal};
use crate::config::PlanError;
use crate::config::Runtime;
use crate::framework::Framework;
use crate::planfile::PlanFile;

/// One stage of the plan, in global stage order (`0..pp·v`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The pipeline rank that holds it.
    pub rank: u64,
    /// Its position among that rank's stages (Megatron-LM's virtual-pipeline rank).
    pub chunk: u64,
    /// It holds the embedding.
    pub has_embedding: bool,
    /// It holds the head (final norm, LM head and loss).
    pub has_head: bool,
    /// Its first transformer layer (numbered 0..L among the transformer layers).
    pub first_layer: u64,
    /// Its transformer layers (decoder layers; MTP layers not counted).
    pub layers: u64,
    /// Its multi-token-prediction layers (the model's last transformer-kind entries, before
    /// the head).
    pub mtp: u64,
    /// Of those, how many are fully recomputed under partial recompute (the first ones).
    pub recomputed: u64,
}

/// How the plan recomputes activations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecomputePlan {
    /// Every transformer layer alike.
    Uniform(Recompute),
    /// Some layers of each stage are fully recomputed ([`Stage::recomputed`]); the others use
    /// `base`.
    Partial {
        /// The recompute mode of the layers that are not fully recomputed.
        base: Recompute,
    },
}

/// RoPE base θ of Llama 3 (dimensionless; its `config.json`s and torchtitan's configs).
pub const LLAMA3_ROPE_THETA: u64 = 500_000;

/// RoPE base θ of Qwen3 (dimensionless; its dense and first MoE `config.json`s and
/// torchtitan's Qwen3 configs but 235B-A22B's).
pub const QWEN3_ROPE_THETA: u64 = 1_000_000;

/// A plan file as the emitters read it: checked, in the names of `ARCHITECTURE.md`.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanView {
    /// The model (emitters refuse layer-list models before they get here).
    pub model: TransformerSpec,
    /// GPUs used.
    pub gpus: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// The GPU kind.
    pub gpu: String,
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline ranks.
    pub pp: u64,
    /// Data-parallel degree.
    pub dp: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Expert-parallel degree (1 for dense models).
    pub ep: u64,
    /// Expert-tensor-parallel degree (1 for dense models).
    pub etp: u64,
    /// The share of each expert all-to-all the runtime hides
    /// ([`crate::experts::a2a_hidden_share`]; 0 without the overlap).
    pub ep_hidden_share: f64,
    /// Stages per pipeline rank.
    pub virtual_stages: u64,
    /// Sequences per micro-batch.
    pub micro_batch_size: u64,
    /// Micro-batches per iteration per data-parallel replica.
    pub num_microbatches: u64,
    /// Sequences per iteration.
    pub global_batch_size: u64,
    /// The schedule.
    pub schedule: ScheduleKind,
    /// Interleaved 1F1B's micro-batch group size as autopp modelled it (`None` for other
    /// schedules and for one stage per rank).
    pub group_size: Option<u64>,
    /// Recomputation.
    pub recompute: RecomputePlan,
    /// Megatron-style sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage.
    pub zero_stage: u8,
    /// The stages, in global order.
    pub stages: Vec<Stage>,
    /// Math precision.
    pub precision: Precision,
    /// A fused attention kernel was modelled.
    pub flash_attention: bool,
    /// The framework behaviour that was modelled.
    pub runtime: Runtime,
    /// The framework the plan was made for (`any` when none was named).
    pub made_for: Framework,
}

/// An error about the plan file's field `field`.
fn invalid(field: &str, message: impl Into<String>) -> LaunchError {
    LaunchError::Invalid {
        field: format!("plan file: {field}"),
        message: message.into(),
    }
}

impl PlanView {
    /// The plan's shape as the FP8 kernels see it ([`super::fp8_gemm_fault`]).
    pub fn gemm_shape(&self) -> super::GemmShape {
        super::GemmShape {
            tp: self.tp,
            cp: self.cp,
            micro_batch_size: self.micro_batch_size,
            sequence_parallel: self.sequence_parallel && self.tp > 1,
        }
    }

    /// Reads and checks `file`. A layer-list model is refused (no framework can lay it out);
    /// an inconsistent file is an error naming its field.
    pub fn new(file: &PlanFile) -> Result<PlanView, LaunchError> {
        PlanView::with_model(file, file.model())
    }

    /// [`PlanView::new`] with `file`'s model read already (`file.model()`).
    pub(super) fn with_model(
        file: &PlanFile,
        model: Result<autopp_models::Model, PlanError>,
    ) -> Result<PlanView, LaunchError> {
        let model = match model.map_err(|e| invalid("model", e.to_string()))? {
            autopp_models::Model::Transformer(t) => t,
            autopp_models::Model::Layers(l) => return Err(Refusal::LayerList(l.name).into()),
        };
        let config = file.config().map_err(|e| invalid("plan", e.to_string()))?;
        let p = &file.plan;
        check_counts(file, &config)?;
        let num_stages = config
            .degrees
            .pp
            .saturating_mul(config.degrees.virtual_stages);
        let split = config.split.clone().unwrap_or_default();
        if split.len() as u64 != num_stages {
            return Err(invalid(
                "plan.ranks",
                format!(
                    "{} stages but pp·virtual_stages = {num_stages}",
                    split.len()
                ),
            ));
        }
        let stages = stages(
            &model,
            &split,
            config.schedule.placement(),
            config.degrees.pp,
        )?;
        check_ranks(file, &stages)?;
        let recompute = match &config.recompute_layers {
            None => RecomputePlan::Uniform(config.recompute),
            Some(_) => RecomputePlan::Partial {
                base: config.recompute,
            },
        };
        let stages = with_recompute(stages, config.recompute_layers.as_deref())?;
        let spec = ScheduleSpec::new(
            config.schedule,
            config.degrees.pp as usize,
            p.num_microbatches as usize,
        )
        .with_virtual_stages(config.degrees.virtual_stages as usize);
        let spec = match config.group_size {
            Some(g) => spec.with_group_size(g as usize),
            None => spec,
        };
        let group_size = resolve_group_size(&spec)
            .map_err(|e| invalid("settings.group_size", e.to_string()))?
            .map(|g| g as u64);
        let ep_hidden_share = crate::experts::a2a_hidden_share(&config, model.mtp_num_layers);
        Ok(PlanView {
            model,
            gpus: p.gpus,
            gpus_per_node: p.gpus_per_node,
            gpu: p.gpu.clone(),
            tp: config.degrees.tp,
            pp: config.degrees.pp,
            dp: config.degrees.dp,
            cp: config.degrees.cp,
            ep: config.experts.ep,
            etp: config.experts.etp,
            ep_hidden_share,
            virtual_stages: config.degrees.virtual_stages,
            micro_batch_size: p.micro_batch_size,
            num_microbatches: p.num_microbatches,
            global_batch_size: p.global_batch_size,
            schedule: config.schedule,
            group_size,
            recompute,
            sequence_parallel: config.sequence_parallel,
            zero_stage: config.zero_stage,
            stages,
            precision: config.settings.precision,
            flash_attention: config.settings.flash_attention,
            runtime: config.settings.runtime,
            made_for: file.settings.framework,
        })
    }

    /// Nodes the plan fills: `gpus / gpus_per_node`, or one node when the plan uses fewer GPUs
    /// than a node has.
    pub fn nodes(&self) -> u64 {
        self.gpus.div_ceil(self.gpus_per_node)
    }

    /// GPUs used on each node.
    pub fn gpus_on_each_node(&self) -> u64 {
        self.gpus.min(self.gpus_per_node)
    }

    /// Transformer layers of each stage, in global order.
    pub fn layer_counts(&self) -> Vec<u64> {
        self.stages.iter().map(|s| s.layers).collect()
    }

    /// The stages of pipeline rank `rank`, in its chunk order.
    pub fn stages_of(&self, rank: u64) -> Vec<&Stage> {
        let mut mine: Vec<&Stage> = self.stages.iter().filter(|s| s.rank == rank).collect();
        mine.sort_by_key(|s| s.chunk);
        mine
    }

    /// The rotary-embedding base θ (dimensionless) the plan's model trains with: 1,000,000 for
    /// Qwen3 (the family with qk-norm: `rope_theta` of Qwen3's dense and first MoE
    /// `config.json`s and of torchtitan's Qwen3 configs but its 235B-A22B's 5,000,000), 500,000 for
    /// Llama 3 (its name or its 128,256-token vocabulary), else 10,000 (Llama 2 and the RoPE
    /// paper's; Megatron-LM's and torchtitan's default). The model file does not name it.
    pub fn rope_theta(&self) -> u64 {
        let m = &self.model;
        if m.qk_norm {
            QWEN3_ROPE_THETA
        } else if m.name.starts_with("llama3") || m.vocab_size == 128_256 {
            LLAMA3_ROPE_THETA
        } else {
            10_000
        }
    }

    /// The RMSNorm/LayerNorm ε (dimensionless): 1e-6 for Qwen3 (qk-norm; `rms_norm_eps` of its
    /// `config.json`s), else 1e-5 (DeepSeek-V3's 1e-6 among the exceptions: the model file names
    /// neither), Llama 2's and Llama 3's, and the default of Megatron-LM's
    /// `--norm-epsilon` and torchtitan's `RMSNorm.Config`.
    pub fn norm_eps(&self) -> f64 {
        if self.model.qk_norm {
            1e-6
        } else {
            1e-5
        }
    }

    /// Whether every stage holds the same number of transformer layers (the split each
    /// framework makes by default when the count divides).
    pub fn is_even(&self) -> bool {
        self.stages.windows(2).all(|w| w[0].layers == w[1].layers)
    }
}

/// The plan's counts agree: degrees at least 1, GPUs = tp·pp·dp·cp, global batch =
/// micro-batches · micro-batch size · dp.
fn check_counts(
    file: &PlanFile,
    config: &crate::config::ParallelConfig,
) -> Result<(), LaunchError> {
    let p = &file.plan;
    let degrees = [
        config.degrees.tp,
        config.degrees.pp,
        config.degrees.dp,
        config.degrees.cp,
        config.degrees.virtual_stages,
    ];
    if file.zero_count().is_some() {
        return Err(invalid(
            "plan",
            "tp, pp, dp, cp, virtual_stages, micro_batch_size and num_microbatches must all be at least 1",
        ));
    }
    let used = degrees[..4].iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    if used != Some(p.gpus) {
        return Err(invalid(
            "plan.gpus",
            format!(
                "{} but tp·pp·dp·cp = {}·{}·{}·{}",
                p.gpus, config.degrees.tp, config.degrees.pp, config.degrees.dp, config.degrees.cp
            ),
        ));
    }
    let batch = p
        .num_microbatches
        .checked_mul(p.micro_batch_size)
        .and_then(|x| x.checked_mul(config.degrees.dp));
    if batch != Some(p.global_batch_size) {
        return Err(invalid(
            "plan.global_batch_size",
            format!(
                "{} but num_microbatches·micro_batch_size·dp = {}·{}·{}",
                p.global_batch_size, p.num_microbatches, p.micro_batch_size, config.degrees.dp
            ),
        ));
    }
    if p.gpus_per_node == 0 {
        return Err(invalid("plan.gpus_per_node", "must be at least 1"));
    }
    Ok(())
}

/// The stages of `split` (layer-list entries per stage, global order) for a transformer with
/// its embedding first and head last.
fn stages(
    model: &TransformerSpec,
    split: &[usize],
    placement: Placement,
    pp: u64,
) -> Result<Vec<Stage>, LaunchError> {
    let entries = model.num_layers + model.mtp_num_layers + 2;
    let total: u64 = split.iter().map(|&n| n as u64).sum();
    if total != entries {
        return Err(invalid(
            "plan.ranks",
            format!(
                "the stages hold {total} layer entries but {} has {entries} (embedding, {} transformer and {} MTP layers, head)",
                model.name, model.num_layers, model.mtp_num_layers
            ),
        ));
    }
    // entries 1..=L are decoder layers, L+1..=L+mtp the MTP layers
    let decoder_end = model.num_layers;
    let mut next = 0u64;
    let mut out = Vec::with_capacity(split.len());
    for (s, &n) in split.iter().enumerate() {
        let (first, last) = (next, next + n as u64 - 1);
        next += n as u64;
        let has_embedding = first == 0;
        let has_head = last == entries - 1;
        let body = n as u64 - u64::from(has_embedding) - u64::from(has_head);
        let body_first = first + u64::from(has_embedding);
        // the body entries body_first .. body_first + body − 1 past the decoder layers are MTP
        let mtp = (body_first + body).saturating_sub((decoder_end + 1).max(body_first));
        let layers = body - mtp;
        out.push(Stage {
            rank: placement.rank_of(s, pp as usize) as u64,
            chunk: s as u64 / pp,
            has_embedding,
            has_head,
            first_layer: first.max(1) - 1,
            layers,
            mtp,
            recomputed: 0,
        });
    }
    Ok(out)
}

/// Checks that the plan's ranks hold the stages the schedule's placement gives them.
fn check_ranks(file: &PlanFile, stages: &[Stage]) -> Result<(), LaunchError> {
    let mut bounds = Vec::with_capacity(stages.len());
    let mut next = 0usize;
    for s in stages {
        let n = (s.layers + s.mtp + u64::from(s.has_embedding) + u64::from(s.has_head)) as usize;
        bounds.push([next, next + n - 1]);
        next += n;
    }
    for rank in &file.plan.ranks {
        let expected: Vec<[usize; 2]> = stages
            .iter()
            .zip(&bounds)
            .filter(|(s, _)| s.rank == rank.rank)
            .map(|(_, b)| *b)
            .collect();
        let mut held = rank.stages.clone();
        held.sort_unstable();
        let mut want = expected.clone();
        want.sort_unstable();
        if held != want {
            return Err(invalid(
                &format!("plan.ranks[{}].stages", rank.rank),
                format!(
                    "{:?} but the schedule places {:?} on rank {}",
                    rank.stages, expected, rank.rank
                ),
            ));
        }
    }
    Ok(())
}

/// The stages with their fully recomputed layers (`per_stage`: one count for every stage, or
/// one per stage in global order).
fn with_recompute(
    mut stages: Vec<Stage>,
    per_stage: Option<&[u64]>,
) -> Result<Vec<Stage>, LaunchError> {
    let Some(counts) = per_stage else {
        return Ok(stages);
    };
    for (k, s) in stages.iter_mut().enumerate() {
        let n = match counts {
            [n] => (*n).min(s.layers),
            _ => counts.get(k).copied().unwrap_or(0),
        };
        if n > s.layers {
            return Err(invalid(
                "plan.ranks[].recompute_num_layers_per_stage",
                format!("stage {k} recomputes {n} layers but holds {}", s.layers),
            ));
        }
        s.recomputed = n;
    }
    Ok(stages)
}
