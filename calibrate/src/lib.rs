//! # autopp-calibrate
//!
//! Validation against published, measured training runs: `autopp validate`.
//!
//! Each row of a published-runs file ([`rows`]) is mapped to a model, a cluster and a parallel
//! configuration ([`mapping`]) and evaluated with [`autopp_planner::estimate::evaluate`] — the code path
//! `autopp estimate` uses — or, for per-layer rows, with [`autopp_planner::stages::stage_costs`]. The
//! predictions are compared with the published iteration time, peak memory and per-layer
//! times; [`summarize`] gives the mean absolute percentage error (MAPE) and the largest error per
//! source group and overall. [`fit`] calibrates the global efficiency knobs and the memory
//! terms, in sample and leaving one group out.
//!
//! ```
//! use autopp_calibrate::Calibration;
//!
//! let rows = autopp_calibrate::rows::parse_rows(
//!     r#"[{"id": "x", "kind": "end_to_end_training_throughput", "source_group": "g",
//!          "gpu_type": "TPU v9"}]"#,
//!     "runs.json",
//! )
//! .unwrap();
//! let cases = autopp_calibrate::prepare(&rows);
//! let results = autopp_calibrate::evaluate_all(&cases, &Calibration::default());
//! // a row autopp cannot model is listed with its reason
//! assert!(results[0].skipped.as_deref().unwrap().contains("not reported"));
//! ```

pub mod band;
pub mod experts;
pub mod fit;
pub mod lenient;
pub mod mapping;
pub mod moe;
pub mod moe_fit;
mod network;
pub mod report;
pub mod rows;
mod stacks;
mod summary;
pub mod user;
pub mod validation;

pub use autopp_planner::bands::Metric;
pub use summary::{summarize, GroupSummary, Summary};

use autopp_hardware::{AnalyticProfile, Efficiency};
use autopp_models::{LayerKind, Model};
use serde::Serialize;

use autopp_planner::estimate::{check_config, evaluate_layers, shard_spec};
use autopp_planner::memory::{CONTEXT_BYTES, FRAGMENTATION};
use autopp_planner::stages::{self, StageContext};
use mapping::{map_row, Case, IterationCase, LayerCase};
use rows::PublishedRow;

/// Why a published-runs file cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    /// Malformed JSON, an unknown field or a field of the wrong type; the message has the
    /// field's path (`runs[12].tp`).
    #[error("{origin}: {message}")]
    Json {
        /// The file.
        origin: String,
        /// What is wrong, and where.
        message: String,
    },
}

/// Everything calibration may change: the profile's efficiency knobs and the memory terms.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Calibration {
    /// The analytic profile's efficiency factors.
    pub efficiency: Efficiency,
    /// Fraction of the dynamic memory lost to allocator fragmentation.
    pub fragmentation: f64,
    /// CUDA context, cuBLAS, NCCL and framework buffers per GPU, bytes.
    pub context_bytes: u64,
}

impl Default for Calibration {
    /// The shipped values: [`Efficiency::default`], [`FRAGMENTATION`] and [`CONTEXT_BYTES`].
    fn default() -> Self {
        Calibration {
            efficiency: Efficiency::default(),
            fragmentation: FRAGMENTATION,
            context_bytes: CONTEXT_BYTES,
        }
    }
}

/// One predicted figure against its published value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Comparison {
    /// What is compared.
    pub metric: Metric,
    /// autopp's prediction, in the metric's unit (seconds or GiB).
    pub predicted: f64,
    /// The published value, same unit.
    pub published: f64,
}

impl Comparison {
    /// Signed relative error `(predicted − published) / published`.
    pub fn error(&self) -> f64 {
        (self.predicted - self.published) / self.published
    }
}

/// Whether a run fitted in its GPUs' memory: predicted (every rank's peak within the GPU's
/// memory, under the calibration's memory terms) and published (a completed run fitted; a run
/// that ran out of memory did not). `--json` writes it as `{"metric": "fits", "predicted": …,
/// "published": …}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct FitVerdict {
    /// Always `fits`.
    pub metric: &'static str,
    /// autopp's verdict.
    pub predicted: bool,
    /// The run's outcome.
    pub published: bool,
    /// The largest rank's predicted peak, bytes (what the verdict compares).
    pub peak_bytes: u64,
    /// The GPU's memory, bytes.
    pub capacity_bytes: u64,
}

impl FitVerdict {
    /// Whether autopp's verdict is the run's.
    pub fn right(&self) -> bool {
        self.predicted == self.published
    }
}

/// The outcome of one row.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RowResult {
    /// Row id.
    pub id: String,
    /// Source group.
    pub group: String,
    /// Catalog GPU kind, when the row maps to one.
    pub gpu: Option<String>,
    /// The comparisons made (empty when skipped).
    pub comparisons: Vec<Comparison>,
    /// Why the whole row was skipped.
    pub skipped: Option<String>,
    /// Assumptions the mapping made and figures of the row not compared, with reasons.
    pub notes: Vec<String>,
    /// Where the predicted iteration time goes (iteration rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub breakdown_s: Option<autopp_planner::plan::Breakdown>,
    /// Whether the run fitted in memory, predicted and published (iteration rows).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<FitVerdict>,
}

/// A row mapped once, ready to be evaluated under any calibration.
#[derive(Debug, Clone)]
pub struct PreparedRow {
    /// Row id.
    pub id: String,
    /// Source group.
    pub group: String,
    /// The case, or why the row cannot be modelled.
    pub case: Result<Case, String>,
    /// Assumptions made by the mapping.
    pub assumptions: Vec<String>,
    /// A mapped mixture-of-experts row's report group ([`moe::group_of`]).
    pub moe_group: Option<String>,
    /// The layer costs of an iteration case (they do not depend on the calibration).
    layers: Option<Vec<autopp_models::LayerCost>>,
}

impl PreparedRow {
    /// Whether the row's prediction depends on the knobs only some rows do: the fused-attention
    /// efficiency or the Hopper factor.
    pub fn uses_specific_knobs(&self) -> bool {
        let (cluster, config) = match &self.case {
            Ok(Case::Iteration(it)) => (&it.cluster, &it.config),
            Ok(Case::Layer(lc)) => (&lc.cluster, &lc.config),
            Err(_) => return false,
        };
        config.settings.flash_attention || cluster.gpu.peak_fp8_flops > 0.0
    }
}

/// Maps every row (once); rows that cannot be modelled keep their reason.
pub fn prepare(rows: &[PublishedRow]) -> Vec<PreparedRow> {
    rows.iter()
        .map(|row| {
            let mapped = map_row(row);
            let (case, assumptions) = match mapped {
                Ok(m) => (Ok(m.case), m.assumptions),
                Err(reason) => (Err(reason), Vec::new()),
            };
            let (case, layers) = match case {
                Ok(Case::Iteration(it)) => match iteration_layers(&it) {
                    Ok(layers) => (Ok(Case::Iteration(it)), Some(layers)),
                    Err(e) => (Err(e), None),
                },
                other => (other, None),
            };
            let moe_group = match &case {
                Ok(Case::Iteration(it)) if moe::is_moe(row) => Some(moe::group_of(
                    row,
                    &it.cluster.gpu.name,
                    it.config.settings.precision,
                )),
                _ => None,
            };
            PreparedRow {
                id: row.id.clone(),
                group: row.source_group.clone(),
                case,
                assumptions,
                moe_group,
                layers,
            }
        })
        .collect()
}

/// Checks an iteration case's configuration and expands its layers.
fn iteration_layers(it: &IterationCase) -> Result<Vec<autopp_models::LayerCost>, String> {
    let profile = AnalyticProfile::new(it.cluster.clone(), it.config.settings.precision)
        .map_err(|e| e.to_string())?;
    check_config(&it.model, &profile, &it.config).map_err(|e| e.to_string())?;
    it.model
        .layers(&shard_spec(&it.config))
        .map_err(|e| e.to_string())
}

/// Evaluates every prepared row under `cal`.
pub fn evaluate_all(rows: &[PreparedRow], cal: &Calibration) -> Vec<RowResult> {
    use rayon::prelude::*;
    rows.par_iter().map(|r| evaluate_row(r, cal)).collect()
}

/// Evaluates one prepared row under `cal`.
pub fn evaluate_row(row: &PreparedRow, cal: &Calibration) -> RowResult {
    let mut result = RowResult {
        id: row.id.clone(),
        group: row.group.clone(),
        gpu: None,
        comparisons: Vec::new(),
        skipped: None,
        notes: row.assumptions.clone(),
        breakdown_s: None,
        fit: None,
    };
    let outcome = match (&row.case, &row.layers) {
        (Err(reason), _) => Err(reason.clone()),
        (Ok(Case::Iteration(it)), Some(layers)) => {
            result.gpu = Some(it.cluster.gpu.name.clone());
            if let Some(why) = &it.time_skip {
                result.notes.push(why.clone());
            }
            iteration(it, layers, cal).map(|(c, b, fit)| {
                result.breakdown_s = Some(b);
                result.fit = Some(fit);
                c
            })
        }
        (Ok(Case::Layer(lc)), _) => {
            result.gpu = Some(lc.cluster.gpu.name.clone());
            layer(lc, cal)
        }
        (Ok(Case::Iteration(_)), None) => Err("layers were not expanded".to_string()),
    };
    match outcome {
        Ok(c) => result.comparisons = c,
        Err(reason) => result.skipped = Some(reason),
    }
    result
}

const GIB: f64 = (1u64 << 30) as f64;

fn profile_for(
    cluster: &autopp_hardware::Cluster,
    c: &autopp_planner::ParallelConfig,
    cal: &Calibration,
) -> Result<AnalyticProfile, String> {
    let mut profile =
        AnalyticProfile::new(cluster.clone(), c.settings.precision).map_err(|e| e.to_string())?;
    profile.efficiency = cal.efficiency;
    Ok(profile)
}

/// Time and memory of a whole iteration, through [`evaluate_layers`] (what `evaluate` runs
/// after checking the configuration and expanding the layers, both done in [`prepare`]).
fn iteration(
    it: &IterationCase,
    layers: &[autopp_models::LayerCost],
    cal: &Calibration,
) -> Result<(Vec<Comparison>, autopp_planner::plan::Breakdown, FitVerdict), String> {
    let profile = profile_for(&it.cluster, &it.config, cal)?;
    let e = evaluate_layers(&it.model, &profile, &it.config, layers).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    if let Some(t) = it.time_s {
        out.push(Comparison {
            metric: Metric::IterationTime,
            predicted: e.result.predicted.iteration_time_s,
            published: t,
        });
    }
    if let Some(gib) = it.memory_gib {
        // the larger of the first and the last rank, as the sources report
        let last = e.memory.len().saturating_sub(1);
        let row = fit::MemoryRow {
            id: String::new(),
            published_gib: gib,
            ranks: [0, last]
                .iter()
                .filter_map(|&r| e.memory.get(r).copied())
                .collect(),
            allocator_only: it.memory_allocator_only,
        };
        let peak = row.predicted_gib(cal.fragmentation, cal.context_bytes) * GIB;
        out.push(Comparison {
            metric: Metric::PeakMemory,
            predicted: peak / GIB,
            published: gib,
        });
    }
    let capacity = it.cluster.gpu.memory_bytes;
    let peak = e
        .memory
        .iter()
        .map(|m| m.total_bytes_with(cal.fragmentation, cal.context_bytes))
        .max()
        .unwrap_or(0);
    let fit = FitVerdict {
        metric: "fits",
        predicted: peak <= capacity,
        published: !it.ran_out_of_memory,
        peak_bytes: peak,
        capacity_bytes: capacity,
    };
    Ok((out, e.result.predicted.breakdown_s, fit))
}

/// Forward and backward time of one transformer layer through [`stages::stage_costs`], the
/// per-stage costs `evaluate` sums (tensor-parallel communication included).
fn layer(lc: &LayerCase, cal: &Calibration) -> Result<Vec<Comparison>, String> {
    let c = &lc.config;
    let profile = profile_for(&lc.cluster, c, cal)?;
    let layers = lc.model.layers(&shard_spec(c)).map_err(|e| e.to_string())?;
    let index = layers
        .iter()
        .position(|l| l.kind == LayerKind::Transformer)
        .ok_or_else(|| "the model has no transformer layer".to_string())?;
    let tp = c.degrees.tp;
    let link = profile
        .cluster
        .group_link(tp, c.degrees.layout().tp_stride());
    let ctx = StageContext {
        profile: &profile,
        tp,
        tp_link: link,
        recompute: c.recompute,
        cp: 1,
        cp_link: link,
        cp_kv_bytes: 0,
        tp_comm_overlap: c.settings.runtime.tp_comm_overlap,
        ep: 1,
        ep_link: link,
        ep_hidden_share: 0.0,
        ep_across_share: 1.0,
        selective_linear_share: StageContext::selective_share_of(&c.settings.runtime, &lc.model),
        dtensor_tp: false,
        torch_native: false,
        torch_compiled: false,
        fused_qkv: c.settings.runtime.selective.fused_qkv(),
        compiled_loss: false,
        expert_host_launches: c.settings.runtime.expert_host_launches,
        host_serialized: c.settings.runtime.host_serialized,
    };
    let cost = stages::stage_costs(&layers, &[[index, index]], &ctx);
    let st = cost
        .first()
        .ok_or_else(|| "no stage cost for the layer".to_string())?;
    Ok(vec![
        Comparison {
            metric: Metric::LayerForward,
            predicted: st.forward_s(),
            published: lc.forward_s,
        },
        Comparison {
            metric: Metric::LayerBackward,
            predicted: st.backward_s(),
            published: lc.backward_s,
        },
    ])
}

/// The catalog GPU kinds that have at least one compared row behind them.
pub fn calibrated_gpus(results: &[RowResult]) -> Vec<String> {
    let mut kinds: Vec<String> = results
        .iter()
        .filter(|r| !r.comparisons.is_empty())
        .filter_map(|r| r.gpu.clone())
        .collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The model a prepared iteration row evaluates (for reports).
pub fn model_of(row: &PreparedRow) -> Option<&Model> {
    match &row.case {
        Ok(Case::Iteration(it)) => Some(&it.model),
        Ok(Case::Layer(lc)) => Some(&lc.model),
        Err(_) => None,
    }
}

/// The first and last rank's memory of a row with a published peak (memory does not depend on
/// the efficiency knobs, so one evaluation serves every memory calibration).
fn memory_row(row: &PreparedRow) -> Option<fit::MemoryRow> {
    let (Ok(Case::Iteration(it)), Some(layers)) = (&row.case, &row.layers) else {
        return None;
    };
    let gib = it.memory_gib?;
    let cal = Calibration::default();
    let profile = profile_for(&it.cluster, &it.config, &cal).ok()?;
    let e = evaluate_layers(&it.model, &profile, &it.config, layers).ok()?;
    let last = e.memory.len().checked_sub(1)?;
    Some(fit::MemoryRow {
        id: row.id.clone(),
        published_gib: gib,
        ranks: vec![e.memory[0], e.memory[last]],
        allocator_only: it.memory_allocator_only,
    })
}

/// One acceptance bound of the project's validation (issue 3): a statistic of one group and
/// metric, and its limit.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// What is checked, in words.
    pub what: String,
    /// The statistic (a fraction: 0.05 is 5 %), `None` when no row measured it.
    pub value: Option<f64>,
    /// The limit it must not exceed.
    pub bound: f64,
}

impl Check {
    /// Whether the statistic exists and is within its bound.
    pub fn passes(&self) -> bool {
        self.value.is_some_and(|v| v <= self.bound)
    }
}

/// The acceptance bounds: iteration-time MAPE ≤ 10 % over Narayanan et al. 2021 and over the
/// modelled BLOOM rows, peak-memory MAPE ≤ 10 % over the BLOOM rows with memory, and every
/// Korthikanti et al. 2022 per-layer forward and backward time within 15 %.
pub fn acceptance(summary: &Summary) -> Vec<Check> {
    let stat = |group: &str, metric: Metric, max: bool| {
        summary
            .get(group, metric)
            .map(|g| if max { g.max_abs_error } else { g.mape })
    };
    vec![
        Check {
            what: "Narayanan2021 iteration-time MAPE".into(),
            value: stat("Narayanan2021", Metric::IterationTime, false),
            bound: 0.10,
        },
        Check {
            what: "BLOOM iteration-time MAPE".into(),
            value: stat("BLOOM-prelaunch-benchmarks", Metric::IterationTime, false),
            bound: 0.10,
        },
        Check {
            what: "BLOOM peak-memory MAPE".into(),
            value: stat("BLOOM-prelaunch-benchmarks", Metric::PeakMemory, false),
            bound: 0.10,
        },
        Check {
            what: "Korthikanti2022 largest per-layer forward error".into(),
            value: stat("Korthikanti2022", Metric::LayerForward, true),
            bound: 0.15,
        },
        Check {
            what: "Korthikanti2022 largest per-layer backward error".into(),
            value: stat("Korthikanti2022", Metric::LayerBackward, true),
            bound: 0.15,
        },
    ]
}

/// The iteration-time targets of issue 15 (today's stacks), reported beside the acceptance
/// bounds: the largest iteration-time MAPE of a source group at most 10 %, and the MAPE over
/// every row at most 7 %. Not asserted of the shipped calibration (`docs/validation.md` says
/// which are met); `validate` prints each as `pass` or `FAIL`.
pub fn targets(summary: &Summary) -> Vec<Check> {
    let worst = summary
        .groups
        .iter()
        .filter(|g| g.metric == Metric::IterationTime)
        .max_by(|a, b| a.mape.total_cmp(&b.mape));
    vec![
        Check {
            what: match worst {
                Some(g) => format!("largest group iteration-time MAPE ({})", g.group),
                None => "largest group iteration-time MAPE".into(),
            },
            value: worst.map(|g| g.mape),
            bound: 0.10,
        },
        Check {
            what: "iteration-time MAPE over every row".into(),
            value: summary.get("all", Metric::IterationTime).map(|g| g.mape),
            bound: 0.07,
        },
    ]
}

/// The cost of recomputation per layer, predicted and published: for each per-layer row with
/// recompute, its backward time minus that of the row of its group without recompute and with
/// the same sequence parallelism. `(row id, predicted seconds, published seconds)`.
pub fn recompute_overheads(rows: &[PreparedRow], results: &[RowResult]) -> Vec<(String, f64, f64)> {
    let layer = |r: &PreparedRow| match &r.case {
        Ok(Case::Layer(lc)) => Some(lc.config.clone()),
        _ => None,
    };
    let backward = |id: &str| {
        results
            .iter()
            .find(|r| r.id == id)
            .and_then(|r| {
                r.comparisons
                    .iter()
                    .find(|c| c.metric == Metric::LayerBackward)
            })
            .map(|c| (c.predicted, c.published))
    };
    let mut out = Vec::new();
    for r in rows {
        let Some(c) = layer(r) else { continue };
        if c.recompute == autopp_models::Recompute::None {
            continue;
        }
        let base = rows.iter().find(|b| {
            b.group == r.group
                && layer(b).is_some_and(|bc| {
                    bc.recompute == autopp_models::Recompute::None
                        && bc.sequence_parallel == c.sequence_parallel
                })
        });
        if let (Some(base), Some((p, q))) = (base, backward(&r.id)) {
            if let Some((bp, bq)) = backward(&base.id) {
                out.push((r.id.clone(), p - bp, q - bq));
            }
        }
    }
    out
}
