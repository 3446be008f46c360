//! The planner against published expert configurations: for each published run, the plan for
//! the same model, GPU kind and count and global batch, next to `estimate` of what the authors
//! ran.

use autopp_hardware::AnalyticProfile;
use autopp_planner::framework::Framework;

use crate::mapping::{map_row, Case};
use crate::rows::PublishedRow;
use autopp_planner::config::{ParallelConfig, PlanError};
use autopp_planner::estimate::{evaluate, Estimate};
use autopp_planner::search::{search, SearchOptions};

/// One published run against the plan.
#[derive(Debug, Clone)]
pub struct Comparison {
    /// The row's id.
    pub id: String,
    /// `estimate` of the published configuration.
    pub published: Estimate,
    /// The planner's best plan for the same problem.
    pub planned: Estimate,
}

impl Comparison {
    /// Planned over published predicted iteration time (below 1: the plan is faster).
    pub fn ratio(&self) -> f64 {
        self.planned.result.predicted.iteration_time_s
            / self.published.result.predicted.iteration_time_s
    }
}

/// A plan's layout in one line, as `docs/planner.md`'s tables print it: degrees, stages per
/// rank, micro-batch size, schedule and recompute.
pub fn describe(p: &autopp_planner::plan::Plan) -> String {
    format!(
        "tp {} · pp {} · dp {} · cp {}, v {}, mbs {}, {}, recompute {}",
        p.degrees.tp,
        p.degrees.pp,
        p.degrees.dp,
        p.degrees.cp,
        p.degrees.virtual_stages,
        p.micro_batch_size,
        p.schedule,
        p.recompute
    )
}

/// Compares the planner (`--framework any`) with one published end-to-end run; `Err` says why
/// the row cannot be compared.
pub fn compare(row: &PublishedRow) -> Result<Comparison, String> {
    compare_with(row, Framework::Any)
}

/// [`compare`] with the plan searched under `framework`'s rules (`Megatron` for a NeMo run:
/// NeMo runs Megatron-Core, so its plan must be one Megatron-Core can launch). The search keeps
/// the row's own runtime, precision and attention kernel, so both predictions are of the same
/// software.
pub fn compare_with(row: &PublishedRow, framework: Framework) -> Result<Comparison, String> {
    compare_inner(row, framework, false)
}

/// [`compare_with`], with the GPU's memory raised to what the published configuration needs
/// by autopp's memory model when that model predicts it not to fit (a run that ran): the
/// search is then tested on its own, apart from the memory model's verdict, which `validate`'s
/// fit verdicts test.
pub fn compare_with_room(row: &PublishedRow, framework: Framework) -> Result<Comparison, String> {
    compare_inner(row, framework, true)
}

fn compare_inner(
    row: &PublishedRow,
    framework: Framework,
    room: bool,
) -> Result<Comparison, String> {
    let mapped = map_row(row)?;
    let Case::Iteration(case) = mapped.case else {
        return Err(String::from("not an end-to-end training row"));
    };
    let c: &ParallelConfig = &case.config;
    let profile = AnalyticProfile::new(case.cluster.clone(), c.settings.precision)
        .map_err(|e| e.to_string())?;
    let published = evaluate(&case.model, &profile, c).map_err(|e: PlanError| e.to_string())?;
    let predicted = &published.result.predicted;
    let profile = if room && !predicted.fits {
        let mut cluster = case.cluster.clone();
        let over = predicted
            .peak_memory_bytes
            .saturating_sub(predicted.memory_capacity_bytes);
        cluster.gpu.memory_bytes += over + (1 << 20);
        AnalyticProfile::new(cluster, c.settings.precision).map_err(|e| e.to_string())?
    } else {
        profile
    };
    let mut opts = SearchOptions::new(framework, c.global_batch_size, case.cluster.gpus_per_node);
    opts.top_k = 3;
    // the fastest plan, not the simplest within a tolerance: the comparison is of the search
    opts.tolerance = 0.0;
    opts.settings = c.settings;
    let planned = search(&case.model, &profile, &opts, &|_, _| {})
        .map_err(|e| e.to_string())?
        .best;
    Ok(Comparison {
        id: row.id.clone(),
        published,
        planned,
    })
}
