//! Plan files: a plan, its prediction, and the model, cluster and settings it was made for —
//! everything needed to evaluate, draw or run it again.

use autopp_hardware::{Cluster, Precision};
use autopp_models::Model;
use serde::{Deserialize, Serialize};

use crate::config::{EvalSettings, ParallelConfig, PlanError, Runtime};
use crate::estimate::Estimate;
use crate::framework::Framework;
use crate::plan::{Plan, Predicted, FORMAT_VERSION};
use crate::schedule::PipelinePlan;

/// Settings a plan was evaluated under that are not part of the plan itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "SettingsJson", into = "SettingsJson")]
pub struct Settings {
    /// Precision, memory headroom, attention kernel and framework runtime that were modelled.
    pub evaluation: EvalSettings,
    /// Micro-batch group size of interleaved schedules, when not the default.
    pub group_size: Option<u64>,
    /// The framework the plan was made for (`any` when none was named).
    pub framework: Framework,
}

/// [`Settings`] as plan files store them: one flat object, in this field order, that rejects
/// unknown fields (which `#[serde(flatten)]` cannot do).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettingsJson {
    precision: Precision,
    memory_reserve_bytes: u64,
    #[serde(default)]
    memory_margin_bytes: u64,
    flash_attention: bool,
    group_size: Option<u64>,
    #[serde(default)]
    runtime: Runtime,
    #[serde(default)]
    framework: Framework,
}

impl From<SettingsJson> for Settings {
    fn from(j: SettingsJson) -> Self {
        Settings {
            evaluation: EvalSettings {
                precision: j.precision,
                memory_reserve_bytes: j.memory_reserve_bytes,
                memory_margin_bytes: j.memory_margin_bytes,
                flash_attention: j.flash_attention,
                runtime: j.runtime,
            },
            group_size: j.group_size,
            framework: j.framework,
        }
    }
}

impl From<Settings> for SettingsJson {
    fn from(s: Settings) -> Self {
        let e = s.evaluation;
        SettingsJson {
            precision: e.precision,
            memory_reserve_bytes: e.memory_reserve_bytes,
            memory_margin_bytes: e.memory_margin_bytes,
            flash_attention: e.flash_attention,
            group_size: s.group_size,
            runtime: e.runtime,
            framework: s.framework,
        }
    }
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
    /// The frameworks that run the plan ([`crate::launch::runs_on`]), as the planner wrote them;
    /// absent from files of earlier versions and when no framework runs it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs_on: Vec<Framework>,
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
                evaluation: config.settings,
                group_size: config.group_size,
                framework: Framework::Any,
            },
            runs_on: Vec::new(),
        })
    }

    /// The same file, saying which frameworks run it ([`crate::launch::runs_on`]).
    pub fn with_runs_on(mut self) -> PlanFile {
        self.runs_on = crate::launch::runs_on(&self);
        self
    }

    /// The same file, made for `framework`.
    pub fn with_framework(mut self, framework: Framework) -> PlanFile {
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
        file.cluster.validate(origin)?;
        let e = &file.settings.evaluation;
        for (name, bytes) in [
            ("memory_reserve_bytes", e.memory_reserve_bytes),
            ("memory_margin_bytes", e.memory_margin_bytes),
        ] {
            if bytes > crate::config::MAX_MEMORY_SETTING_BYTES {
                return Err(PlanError::invalid(
                    "--plan",
                    format!(
                        "{origin}: settings.{name} is {bytes}, more than any GPU holds; it must be at most {} (re-run `autopp plan` to make a new file)",
                        crate::config::MAX_MEMORY_SETTING_BYTES
                    ),
                ));
            }
        }
        if let Some(name) = file.zero_count() {
            return Err(PlanError::invalid(
                "--plan",
                format!(
                    "{origin}: plan.{name} is 0; it must be at least 1 (re-run `autopp plan` to make a new file)"
                ),
            ));
        }
        Ok(file)
    }

    /// The first of the plan's degrees, micro-batch size and counts that is 0, by its key in
    /// the file (`tp`, `micro_batch_size`, …); `None` when all are at least 1. A file edited by
    /// hand to `"tp": 0` is refused on reading ([`PlanFile::from_json`]), before any command
    /// divides by it.
    pub fn zero_count(&self) -> Option<&'static str> {
        let p = &self.plan;
        let d = &p.degrees;
        [
            ("tp", d.tp),
            ("pp", d.pp),
            ("dp", d.dp),
            ("cp", d.cp),
            ("virtual_stages", d.virtual_stages),
            ("micro_batch_size", p.micro_batch_size),
            ("num_microbatches", p.num_microbatches),
            ("global_batch_size", p.global_batch_size),
            ("gpus", p.gpus),
        ]
        .into_iter()
        .find_map(|(name, v)| (v == 0).then_some(name))
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
        Ok(
            ParallelConfig::new(p.degrees, p.micro_batch_size, p.global_batch_size)
                .with_schedule(p.schedule)
                .with_group_size(self.settings.group_size)
                .with_recompute(p.recompute)
                .with_recompute_layers(p.recompute_layers())
                .with_sequence_parallel(p.sequence_parallel)
                .with_zero_stage(p.zero_stage)
                .with_split(Some(p.split()?))
                .with_settings(self.settings.evaluation)
                .with_experts(crate::ExpertParallel {
                    ep: p.ep.unwrap_or(1),
                    etp: p.etp.unwrap_or(1),
                    imbalance: p.moe_imbalance.unwrap_or(1.0),
                }),
        )
    }

    /// What the plan says about the pipeline: its schedule, data-parallel degree, micro-batch
    /// size and exact split.
    pub fn pipeline(&self) -> Result<PipelinePlan, PlanError> {
        let c = self.config()?;
        Ok(PipelinePlan {
            spec: crate::estimate::schedule_spec(&c),
            dp: c.degrees.dp as usize,
            micro_batch_size: c.micro_batch_size as usize,
            split: c.split,
        })
    }

    /// The plan's schedule simulated with the cost model's per-stage times (in seconds), and a
    /// title naming the model, the cluster and the schedule (`autopp schedule --plan`).
    pub fn simulated(
        &self,
    ) -> Result<
        (
            autopp_schedule::Schedule,
            autopp_schedule::SimResult,
            String,
        ),
        PlanError,
    > {
        let model = self.model()?;
        let config = self.config()?;
        let profile =
            autopp_hardware::AnalyticProfile::new(self.cluster.clone(), config.settings.precision)?;
        let e = crate::evaluate(&model, &profile, &config)?;
        let title = format!(
            "{} on {} × {}: {}",
            model.name(),
            self.plan.gpus,
            self.plan.gpu,
            autopp_schedule::report::title(&e.schedule)
        );
        Ok((
            std::sync::Arc::unwrap_or_clone(e.schedule),
            e.simulation,
            title,
        ))
    }

    /// What `autopp exec --plan` runs: the model, the pipeline, the tensor-parallel degree and
    /// sequence parallelism, after refusing context parallelism (exec runs cp = 1); with a
    /// note when the plan's recompute mode will not be applied (exec keeps every activation).
    pub fn exec_parts(
        &self,
    ) -> Result<(Model, PipelinePlan, usize, bool, Option<String>), PlanError> {
        let c = self.config()?;
        if c.degrees.cp != 1 {
            return Err(PlanError::invalid(
                "--plan",
                format!(
                    "the plan uses context parallelism {}; exec runs cp = 1 only (tensor, pipeline and data parallelism run as planned)",
                    c.degrees.cp
                ),
            ));
        }
        let note = (c.recompute != autopp_models::Recompute::None).then(|| {
            format!(
                "exec keeps every activation; the plan's recompute mode ({}) is not applied",
                c.recompute
            )
        });
        Ok((
            self.model()?,
            self.pipeline()?,
            c.degrees.tp as usize,
            c.sequence_parallel,
            note,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fuzzer's plan file, with `edit` applied to its JSON.
    fn edited(edit: impl Fn(&mut serde_json::Value)) -> Result<PlanFile, PlanError> {
        let text = include_str!("../../tests/fixtures/fuzz/plan.json");
        let mut v: serde_json::Value = serde_json::from_str(text).expect("the fixture is JSON");
        edit(&mut v);
        PlanFile::from_json(&v.to_string(), "plan.json")
    }

    /// Values whose sums and products once overflowed (panics the fuzzer found in a debug
    /// build) are refused on reading, naming the key.
    #[test]
    fn absurd_settings_and_clusters_are_refused_on_reading() {
        assert!(edited(|_| {}).is_ok());
        let max = serde_json::Value::from(u64::MAX);
        for (edit, want) in [
            (
                &(|v: &mut serde_json::Value| v["settings"]["memory_reserve_bytes"] = max.clone())
                    as &dyn Fn(&mut serde_json::Value),
                "settings.memory_reserve_bytes",
            ),
            (
                &|v: &mut serde_json::Value| v["settings"]["memory_margin_bytes"] = max.clone(),
                "settings.memory_margin_bytes",
            ),
            (
                &|v: &mut serde_json::Value| v["cluster"]["nodes"] = max.clone(),
                "'cluster.nodes' × gpus_per_node is too large",
            ),
            (
                &|v: &mut serde_json::Value| v["cluster"]["intra_node_latency_s"] = 1e300.into(),
                "'cluster.intra_node_latency_s' must be from 0 to 1 second",
            ),
            (
                &|v: &mut serde_json::Value| v["cluster"]["nic_bw_bytes_per_s"] = 1e-300.into(),
                "'cluster.nic_bw_bytes_per_s' must be from",
            ),
        ] {
            let err = edited(edit).expect_err(want).to_string();
            assert!(err.contains(want), "{want:?} not in {err}");
        }
    }
}
