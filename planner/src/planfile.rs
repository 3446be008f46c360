//! Plan files: a plan, its prediction, and the model, cluster and settings it was made for —
//! everything needed to evaluate, draw or run it again.

use autopp_hardware::{Cluster, Precision};
use autopp_models::Model;
use serde::{Deserialize, Serialize};

use crate::config::{ParallelConfig, PlanError};
use crate::estimate::Estimate;
use crate::plan::{Plan, Predicted, FORMAT_VERSION};
use crate::schedule::PipelinePlan;

/// Settings a plan was evaluated under that are not part of the plan itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// Math precision.
    pub precision: Precision,
    /// Bytes kept free per GPU.
    pub memory_reserve_bytes: u64,
    /// A fused attention kernel was modelled.
    pub flash_attention: bool,
    /// Micro-batch group size of interleaved schedules, when not the default.
    pub group_size: Option<u64>,
    /// Framework behaviour (gradient dtype, overlap) that was modelled.
    #[serde(default)]
    pub runtime: crate::config::Runtime,
    /// The framework the plan was made for (`any` when none was named).
    #[serde(default)]
    pub framework: crate::framework::Framework,
}

/// `plan.json`: self-contained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    /// [`FORMAT_VERSION`].
    pub format_version: u32,
    /// What to run.
    pub plan: Plan,
    /// What it was predicted to do.
    pub predicted: Predicted,
    /// The model, in autopp's model JSON.
    pub model: serde_json::Value,
    /// The cluster.
    pub cluster: Cluster,
    /// Evaluation settings.
    pub settings: Settings,
}

impl PlanFile {
    /// The plan file for an evaluated configuration.
    pub fn new(
        estimate: &Estimate,
        model: &Model,
        cluster: &Cluster,
        config: &ParallelConfig,
    ) -> Result<PlanFile, PlanError> {
        let model = serde_json::to_value(model)
            .map_err(|e| PlanError::invalid("--out", format!("cannot serialise the model: {e}")))?;
        Ok(PlanFile {
            format_version: FORMAT_VERSION,
            plan: estimate.result.plan.clone(),
            predicted: estimate.result.predicted.clone(),
            model,
            cluster: cluster.clone(),
            settings: Settings {
                precision: config.precision,
                memory_reserve_bytes: config.memory_reserve_bytes,
                flash_attention: config.flash_attention,
                group_size: config.group_size,
                runtime: config.runtime,
                framework: crate::framework::Framework::Any,
            },
        })
    }

    /// The same file, made for `framework`.
    pub fn with_framework(mut self, framework: crate::framework::Framework) -> PlanFile {
        self.settings.framework = framework;
        self
    }

    /// Reads the plan file at `path` (`--plan`); errors name the file and what is wrong.
    pub fn load(path: &str) -> Result<PlanFile, PlanError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| PlanError::invalid("--plan", format!("cannot read '{path}': {e}")))?;
        PlanFile::from_json(&text, path)
    }

    /// Parses a plan file's text; errors name `origin` and what is wrong.
    pub fn from_json(text: &str, origin: &str) -> Result<PlanFile, PlanError> {
        let file: PlanFile = serde_json::from_str(text)
            .map_err(|e| PlanError::invalid("--plan", format!("{origin}: {e}")))?;
        if file.format_version != FORMAT_VERSION {
            return Err(PlanError::invalid(
                "--plan",
                format!(
                    "{origin} has format_version {} but this autopp reads {FORMAT_VERSION}: re-run `autopp plan` to make a new one",
                    file.format_version
                ),
            ));
        }
        Ok(file)
    }

    /// The model the plan was made for.
    pub fn model(&self) -> Result<Model, PlanError> {
        Ok(autopp_models::load_str(
            &self.model.to_string(),
            "plan file model",
        )?)
    }

    /// The configuration the plan describes, with its exact split.
    pub fn config(&self) -> Result<ParallelConfig, PlanError> {
        let p = &self.plan;
        let ranges = p.stages_in_order();
        let recompute: autopp_models::Recompute = p
            .recompute
            .parse()
            .map_err(|e: String| PlanError::invalid("--plan", e))?;
        let recompute_layers = p.recompute_layers();
        let mut next = 0;
        let mut split = Vec::with_capacity(ranges.len());
        for ([first, last], _) in ranges {
            if first != next || last < first {
                return Err(PlanError::invalid(
                    "--plan",
                    format!("the ranks' stages do not tile the layers in order (a stage starts at layer {first}, expected {next})"),
                ));
            }
            split.push(last - first + 1);
            next = last + 1;
        }
        Ok(ParallelConfig {
            tp: p.tp,
            pp: p.pp,
            dp: p.dp,
            cp: p.cp,
            virtual_stages: p.virtual_stages,
            micro_batch_size: p.micro_batch_size,
            global_batch_size: p.global_batch_size,
            schedule: p
                .schedule
                .parse()
                .map_err(|e: String| PlanError::invalid("--plan", e))?,
            group_size: self.settings.group_size,
            recompute,
            recompute_layers,
            sequence_parallel: p.sequence_parallel,
            zero_stage: p.zero_stage,
            split: Some(split),
            precision: self.settings.precision,
            memory_reserve_bytes: self.settings.memory_reserve_bytes,
            flash_attention: self.settings.flash_attention,
            runtime: self.settings.runtime,
        })
    }

    /// What the plan says about the pipeline: its schedule, data-parallel degree, micro-batch
    /// size and exact split.
    pub fn pipeline(&self) -> Result<PipelinePlan, PlanError> {
        let c = self.config()?;
        Ok(PipelinePlan {
            spec: crate::estimate::schedule_spec(&c),
            dp: c.dp as usize,
            micro_batch_size: c.micro_batch_size as usize,
            split: c.split,
        })
    }
}
