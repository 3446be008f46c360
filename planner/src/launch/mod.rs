//! Launch files from a plan: the training script's arguments for Megatron-LM, torchtitan or
//! DeepSpeed, the framework's own config files, and launcher scripts (torchrun on one node,
//! Slurm `sbatch` on many).
//!
//! [`emit`] reads a plan file through [`PlanView`] (one place that knows the plan file's
//! types), refuses what the framework cannot run with the reason ([`Refusal`]), and returns
//! every file's text; writing them is the caller's. The flag names, rules and versions are
//! those of `docs/frameworks.md` and the framework references it cites; the repository's
//! `tests/launch/` feeds the emitted files to the frameworks' own code.

mod deepspeed;
mod fp8_shapes;
mod megatron;
mod megatron_moe;
mod scripts;
mod torchtitan;
mod torchtitan_fp8;
mod torchtitan_models;
pub mod view;
mod write;

use std::collections::BTreeMap;
use std::fmt;

use autopp_hardware::Precision;
use autopp_models::Model;
use autopp_schedule::ScheduleKind;
use serde::Serialize;

use crate::config::PlanError;
use crate::framework::Framework;
use crate::planfile::PlanFile;
pub use fp8_shapes::{fp8_gemm_fault, fp8_gemm_multiples, Fp8GemmFault, GemmShape};
pub use torchtitan::Era as TorchtitanEra;
pub use view::{PlanView, RecomputePlan, Stage};
pub use write::{summary_text, write_dir, WriteError, OURS};

/// The Megatron-LM the arguments are written for (flag names and rules read from its code).
pub const MEGATRON_VERSION: &str = "Megatron-LM main d98e8a64 (Megatron-Core 0.16.1)";
/// The torchtitan release the arguments are written for (the one on PyPI).
pub const TORCHTITAN_VERSION: &str = "torchtitan 0.3.0";
/// The DeepSpeed release the config is written for.
pub const DEEPSPEED_VERSION: &str = "DeepSpeed 0.19.8";

/// What `autopp launch` emits for one framework.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Launch {
    /// The framework.
    pub framework: Framework,
    /// The framework version the files are written for.
    pub framework_version: String,
    /// The training script's argument vector (for torchtitan including `--module`/`--config`).
    pub args: Vec<String>,
    /// Every file by name: `launch.sh`, `sbatch.sh` and, where they apply, `ds_config.json`,
    /// `autopp_pipeline.py` and `pipeline_schedule.csv`.
    pub files: BTreeMap<String, String>,
}

/// Why a framework cannot run a plan. Each message says what the framework does instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A layer-list model: no framework can build it from a plan.
    LayerList(String),
    /// The GPUs do not fill whole nodes, so no launcher starts the same count on each.
    NotWholeNodes {
        /// GPUs used.
        gpus: u64,
        /// GPUs per node.
        gpus_per_node: u64,
    },
    /// A zero-bubble (split-backward) schedule for Megatron-LM.
    ZeroBubble(ScheduleKind),
    /// A V-placed schedule, which a Megatron-LM layout cannot express.
    VPlacement(ScheduleKind),
    /// A schedule the framework does not run.
    Schedule(Framework, ScheduleKind),
    /// A ZeRO stage the framework does not combine with this plan.
    ZeroStage(Framework, u8),
    /// A recompute the framework cannot express.
    Recompute(Framework, String),
    /// Context parallelism the framework does not run.
    ContextParallel(Framework),
    /// A precision the framework does not train in (or, for FP8, whose flags autopp does not
    /// write yet).
    Precision(Framework, Precision),
    /// An FP8 recipe the framework has not: the recipes it has.
    Fp8Recipe(Framework, Precision, &'static str),
    /// A model the framework cannot build or split; the text follows the framework's name
    /// (`torchtitan 0.3.0 builds …`).
    Model(Framework, String),
    /// Micro-batching or interleaving the framework's schedule rejects.
    Microbatches(Framework, String),
    /// A sequence length the framework's context parallelism rejects.
    SequenceLength(Framework, String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::LayerList(name) => write!(
                f,
                "{name} is a layer list; launch files need a transformer (embedding, layers, head) the framework can build"
            ),
            Refusal::NotWholeNodes { gpus, gpus_per_node } => write!(
                f,
                "the plan's {gpus} GPUs do not fill whole nodes of {gpus_per_node}; launchers start the same number of processes on every node"
            ),
            Refusal::ZeroBubble(k) => write!(
                f,
                "Megatron-LM has no zero-bubble schedule: {k} splits the backward into input and weight passes, which Megatron-LM's 1F1B and interleaved 1F1B never do; re-plan with --framework megatron"
            ),
            Refusal::VPlacement(k) => write!(
                f,
                "{k} places stages in a V (rank r holds stages r and 2pp-1-r) but a Megatron-LM layout is looped (rank r holds r, r+pp, ...), so --pipeline-model-parallel-layout cannot express it; re-plan with --framework megatron"
            ),
            Refusal::Schedule(fw, k) => write!(
                f,
                "{} does not run {k}; it runs {}; re-plan with --framework {fw}",
                name(*fw),
                runs(*fw)
            ),
            Refusal::ZeroStage(fw, z) => write!(f, "ZeRO stage {z}: {}", zero_rule(*fw)),
            Refusal::Recompute(fw, why) => write!(f, "{} cannot recompute as planned: {why}", name(*fw)),
            Refusal::ContextParallel(fw) => write!(
                f,
                "{} does not run context parallelism beside its pipeline; re-plan with --framework {fw}",
                name(*fw)
            ),
            Refusal::Precision(fw, p) if p.is_fp8() => write!(
                f,
                "{} FP8 launch flags ({p}) are not written by autopp yet; the plan itself stands (re-plan with --precision bf16, or launch an fp8, fp8-tensorwise or mxfp8 plan with --framework megatron)",
                name(*fw)
            ),
            Refusal::Fp8Recipe(fw, p, has) => write!(
                f,
                "{} has no {p} recipe (it has {has}); re-plan with --precision set to one of those",
                name(*fw)
            ),
            Refusal::Precision(fw, p) => write!(
                f,
                "{} does not train in {p} mixed precision (only bf16); re-plan with --precision bf16",
                name(*fw)
            ),
            Refusal::Model(fw, why) => write!(f, "{} {why}", name(*fw)),
            Refusal::Microbatches(fw, why)
            | Refusal::SequenceLength(fw, why) => write!(f, "{}: {why}", name(*fw)),
        }
    }
}

/// The framework's name as its users know it.
pub(crate) fn name(fw: Framework) -> &'static str {
    match fw {
        Framework::Megatron => "Megatron-LM",
        Framework::Torchtitan => "torchtitan",
        Framework::Deepspeed => "DeepSpeed",
        Framework::Any => "any",
    }
}

/// The schedules a framework runs, for a refusal (torchtitan: PyTorch's named schedules and,
/// through a CSV action table, any other schedule autopp generates).
fn runs(fw: Framework) -> &'static str {
    match fw {
        Framework::Megatron => "1f1b and interleaved-1f1b",
        Framework::Torchtitan => "every schedule autopp generates",
        Framework::Deepspeed => "1f1b only (its TrainSchedule, one stage per rank)",
        Framework::Any => "everything",
    }
}

/// What the framework does about ZeRO beside a pipeline.
fn zero_rule(fw: Framework) -> &'static str {
    match fw {
        Framework::Megatron => {
            "Megatron-LM shards only the optimizer states (--use-distributed-optimizer, ZeRO 1); re-plan with --framework megatron"
        }
        Framework::Deepspeed => {
            "DeepSpeed's pipeline engine asserts ZeRO stage < 2 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism\"); re-plan with --framework deepspeed"
        }
        Framework::Torchtitan => {
            "torchtitan shards with FSDP2, which shards gradients with the optimizer states (ZeRO 2, or 3 when parameters are resharded); it has no ZeRO 1; re-plan with --framework torchtitan"
        }
        Framework::Any => "",
    }
}

/// Why no launch files were made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LaunchError {
    /// The framework cannot run the plan.
    #[error("--framework {framework}: {refusal}")]
    Refused {
        /// The framework asked for.
        framework: Framework,
        /// Why it cannot.
        refusal: Refusal,
    },
    /// The plan file or the request is inconsistent; `field` names the field or flag.
    #[error("{field}: {message}")]
    Invalid {
        /// The field or flag at fault.
        field: String,
        /// What is wrong.
        message: String,
    },
}

impl From<Refusal> for LaunchError {
    fn from(refusal: Refusal) -> Self {
        // the framework is filled in by `emit`; a refusal raised while reading the plan holds
        // for every framework
        LaunchError::Refused {
            framework: Framework::Any,
            refusal,
        }
    }
}

/// What an emitter hands to the launcher scripts.
#[derive(Debug, Clone, Default)]
struct Entry {
    /// How torchrun starts the training: a script path (may use shell variables) or
    /// `-m MODULE`.
    program: Vec<String>,
    /// The training script's arguments, from the plan.
    args: Vec<String>,
    /// Arguments a run needs that the plan does not decide (data, tokenizer, steps), as
    /// defaults of the scripts' `RUN_ARGS`.
    run_args: Vec<String>,
    /// Environment variables set on purpose: name, value, why.
    env: Vec<(&'static str, String, String)>,
    /// Comment lines for the scripts' headers.
    notes: Vec<String>,
    /// The framework's own files (config, schedule table, module arguments): name and text.
    files: Vec<(String, String)>,
}

/// Why `framework` gets no launch for what the model has that its emitter writes no flags for
/// yet, if anything: sliding windows and attention sinks (every framework); mixtures of experts,
/// MLA and MTP (all but Megatron-LM); a `head_dim` apart from hidden/heads and qk-norm
/// (DeepSpeed).
fn not_written_yet(t: &autopp_models::TransformerSpec, framework: Framework) -> Option<String> {
    // Megatron-LM's MoE, MLA, MTP and Qwen3 flags are written (`megatron_moe`); torchtitan's
    // Qwen3 classes build Qwen3-style attention (`torchtitan_models`)
    let megatron = framework == Framework::Megatron;
    let not_yet = |what: &str, written: &str| {
        format!("is not launched by autopp yet for {what}: {written}; the plan itself stands")
    };
    let megatron_only = "autopp writes these flags for megatron only";
    if t.moe.is_some() && framework == Framework::Deepspeed {
        Some("cannot express this plan: its pipeline engine's PipelineModule takes the layers autopp writes, and autopp writes no DeepSpeed-MoE layers (deepspeed.moe.layer.MoE) for expert parallelism; launch it with megatron; the plan itself stands".into())
    } else if t.moe.is_some() && !megatron {
        Some(not_yet("mixtures of experts", megatron_only))
    } else if (t.mla.is_some() || t.mtp_num_layers > 0) && !megatron {
        Some(not_yet("MLA attention and MTP layers", megatron_only))
    } else if (t.head_dim.is_some() || t.qk_norm) && !megatron && framework != Framework::Torchtitan
    {
        Some(not_yet(
            "Qwen3-style attention (head_dim, qk-norm)",
            "autopp writes them for megatron and torchtitan only",
        ))
    } else if t.sliding_window.is_some() || t.attention_sinks {
        let written = if megatron {
            "autopp writes no sliding-window or attention-sink flags yet"
        } else {
            megatron_only
        };
        Some(not_yet(
            "sliding-window attention and attention sinks",
            written,
        ))
    } else {
        None
    }
}

/// Refuses, for `framework`, a model whose launch flags autopp does not write yet (see
/// `not_written_yet`); `plan --emit` asks before it searches, `emit` again.
pub fn check_emittable(model: &Model, framework: Framework) -> Result<(), LaunchError> {
    match model {
        Model::Transformer(t) => match not_written_yet(t, framework) {
            Some(why) => Err(LaunchError::Refused {
                framework,
                refusal: Refusal::Model(framework, why),
            }),
            None => Ok(()),
        },
        Model::Layers(_) => Ok(()),
    }
}

/// The launch files of `file` for `framework`, or why it cannot run them.
pub fn emit(file: &PlanFile, framework: Framework) -> Result<Launch, LaunchError> {
    let (view, entry, version) = accepted(file, file.model(), framework)?;
    let mut files: BTreeMap<String, String> = entry.files.iter().cloned().collect();
    files.insert(
        "launch.sh".into(),
        scripts::launch_sh(&view, framework, &entry),
    );
    files.insert(
        "sbatch.sh".into(),
        scripts::sbatch_sh(&view, framework, &entry),
    );
    Ok(Launch {
        framework,
        framework_version: version.to_string(),
        args: entry.args,
        files,
    })
}

/// What [`emit`] checks and builds before writing the scripts, with `file`'s model given
/// (`file.model()`, read once by a caller that asks several frameworks): the plan's view, the
/// framework's entry and its version; or why the framework cannot run the plan.
fn accepted(
    file: &PlanFile,
    model: Result<Model, PlanError>,
    framework: Framework,
) -> Result<(PlanView, Entry, &'static str), LaunchError> {
    let version = match framework {
        Framework::Megatron => MEGATRON_VERSION,
        Framework::Torchtitan => TORCHTITAN_VERSION,
        Framework::Deepspeed => DEEPSPEED_VERSION,
        Framework::Any => {
            return Err(LaunchError::Invalid {
                field: "--framework".into(),
                message: "name the framework to launch: megatron, torchtitan or deepspeed".into(),
            })
        }
    };
    let refused = |refusal| LaunchError::Refused { framework, refusal };
    if let Ok(model) = &model {
        check_emittable(model, framework)?;
    }
    let view = view_for(file, model, framework)?;
    // Megatron-LM's FP8 flags (`megatron::fp8_args`) and torchtitan's converters
    // (`torchtitan_fp8`) are written for the recipes each has; DeepSpeed has none
    if let Some(has) = fp8_recipes_missing(framework, view.precision) {
        return Err(refused(Refusal::Fp8Recipe(framework, view.precision, has)));
    }
    if view.gpus > view.gpus_per_node && view.gpus % view.gpus_per_node != 0 {
        return Err(refused(Refusal::NotWholeNodes {
            gpus: view.gpus,
            gpus_per_node: view.gpus_per_node,
        }));
    }
    let entry = match framework {
        Framework::Megatron => megatron::emit(&view),
        Framework::Torchtitan => torchtitan::emit(&view),
        _ => deepspeed::emit(&view),
    }
    .map_err(refused)?;
    Ok((view, entry, version))
}

/// The frameworks that run `file`'s plan, in [`Framework::RUNNABLE`] order: those for which
/// [`check_model`] and [`emit`] — the rules `autopp launch` and `plan --framework` apply —
/// accept it (the scripts, which refuse nothing, are not written). Empty when none does (a
/// layer list, GPUs that do not fill whole nodes, features of different frameworks mixed
/// under `--framework any-mix`).
pub fn runs_on(file: &PlanFile) -> Vec<Framework> {
    let Ok(model) = file.model() else {
        return Vec::new();
    };
    let precision = file.settings.evaluation.precision;
    Framework::RUNNABLE
        .into_iter()
        .filter(|&fw| {
            check_model(&model, precision, fw).is_ok()
                && accepted(file, Ok(model.clone()), fw).is_ok()
        })
        .collect()
}

/// Refuses, before a search made for `framework` (`plan --framework`), a model or precision the
/// framework cannot run whatever the plan, so that a plan made for a framework always emits
/// for it: a layer list (every framework), a model torchtitan's Llama 3 and Qwen3 classes cannot build,
/// fp16 for torchtitan, an FP8 recipe the framework lacks (`fp8_recipes_missing`).
pub fn check_model(
    model: &Model,
    precision: Precision,
    framework: Framework,
) -> Result<(), LaunchError> {
    let refused = |refusal| Err(LaunchError::Refused { framework, refusal });
    let transformer = match (framework, model) {
        (Framework::Any, _) => return Ok(()),
        (_, Model::Layers(l)) => return refused(Refusal::LayerList(l.name.clone())),
        (_, Model::Transformer(t)) => t,
    };
    if framework == Framework::Torchtitan {
        if let Err(why) = torchtitan_models::family(transformer) {
            return refused(Refusal::Model(framework, why));
        }
        if precision == Precision::Fp16 {
            return refused(Refusal::Precision(framework, precision));
        }
    }
    if let Some(has) = fp8_recipes_missing(framework, precision) {
        return refused(Refusal::Fp8Recipe(framework, precision, has));
    }
    Ok(())
}

/// The FP8 recipes `framework` has, when `precision` is an FP8 recipe it has not: torchtitan
/// [`TORCHTITAN_VERSION`] converts linears to torchao's float8 with rowwise scaling only
/// (`components/quantization/float8.py`: `recipe_name` is `rowwise` or `rowwise_with_gw_hp`;
/// the tensorwise recipe of its 2024–25 benchmarks is gone) and to MXFP8 on Blackwell, with no
/// delayed scaling; Transformer Engine (Megatron-Core) has delayed and current (tensorwise)
/// scaling and MXFP8, no rowwise; DeepSpeed has no FP8 recipe of its own.
fn fp8_recipes_missing(framework: Framework, precision: Precision) -> Option<&'static str> {
    let (has, recipes): (&[Precision], &'static str) = match framework {
        Framework::Torchtitan => (
            &[Precision::Fp8Rowwise, Precision::Mxfp8],
            "fp8-rowwise, mxfp8",
        ),
        Framework::Megatron => (
            &[
                Precision::Fp8Delayed,
                Precision::Fp8Tensorwise,
                Precision::Mxfp8,
            ],
            "fp8, fp8-tensorwise, mxfp8",
        ),
        Framework::Deepspeed => (&[], "none: bf16 or fp16"),
        Framework::Any => return None,
    };
    (precision.is_fp8() && !has.contains(&precision)).then_some(recipes)
}

/// torchtitan's arguments for `file` in the configuration era `era` (`emit` writes
/// [`TorchtitanEra::Release03`], the PyPI release's).
pub fn torchtitan_args(file: &PlanFile, era: TorchtitanEra) -> Result<Vec<String>, LaunchError> {
    let framework = Framework::Torchtitan;
    let view = view_for(file, file.model(), framework)?;
    let entry = torchtitan::emit_for(&view, era)
        .map_err(|refusal| LaunchError::Refused { framework, refusal })?;
    Ok(entry.args)
}

/// The plan file's view, its refusals attributed to `framework`.
fn view_for(
    file: &PlanFile,
    model: Result<Model, PlanError>,
    framework: Framework,
) -> Result<PlanView, LaunchError> {
    PlanView::with_model(file, model).map_err(|e| match e {
        LaunchError::Refused { refusal, .. } => LaunchError::Refused { framework, refusal },
        other => other,
    })
}

/// `args` as shell words, one flag with its values per line (as the scripts write them).
pub fn shell_lines(args: &[String]) -> Vec<String> {
    let words: Vec<String> = args.iter().map(|a| scripts::quote(a)).collect();
    scripts::arg_lines(&words)
}

/// `--flag value` as two arguments.
fn flag(args: &mut Vec<String>, name: &str, value: impl fmt::Display) {
    args.push(name.to_string());
    args.push(value.to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each framework's FP8 recipes: Transformer Engine's (Megatron), torchao's (torchtitan),
    /// none (DeepSpeed); `any` refuses none.
    #[test]
    fn fp8_recipes_per_framework() {
        let model = autopp_models::load("llama3-8b").unwrap();
        let ok = |p: Precision, fw| check_model(&model, p, fw).is_ok();
        assert!(ok(Precision::Fp8Delayed, Framework::Megatron));
        assert!(ok(Precision::Fp8Tensorwise, Framework::Megatron));
        assert!(!ok(Precision::Fp8Rowwise, Framework::Megatron));
        assert!(!ok(Precision::Fp8Delayed, Framework::Torchtitan));
        assert!(!ok(Precision::Fp8Tensorwise, Framework::Torchtitan));
        assert!(ok(Precision::Fp8Rowwise, Framework::Torchtitan));
        assert!(ok(Precision::Mxfp8, Framework::Torchtitan));
        assert!(!ok(Precision::Fp16, Framework::Torchtitan));
        assert!(!ok(Precision::Fp8Tensorwise, Framework::Deepspeed));
        assert!(ok(Precision::Fp16, Framework::Deepspeed));
        assert!(ok(Precision::Fp8Rowwise, Framework::Any));
        let err = check_model(&model, Precision::Fp8Delayed, Framework::Torchtitan)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("torchtitan has no fp8 recipe (it has fp8-rowwise, mxfp8)"),
            "{err}"
        );
    }
}
