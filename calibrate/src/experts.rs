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

/// Compares the planner with one published end-to-end run; `Err` says why the row cannot be
/// compared.
pub fn compare(row: &PublishedRow) -> Result<Comparison, String> {
    let mapped = map_row(row)?;
    let Case::Iteration(case) = mapped.case else {
        return Err(String::from("not an end-to-end training row"));
    };
    let c: &ParallelConfig = &case.config;
    let profile = AnalyticProfile::new(case.cluster.clone(), c.settings.precision)
        .map_err(|e| e.to_string())?;
    let published = evaluate(&case.model, &profile, c).map_err(|e: PlanError| e.to_string())?;
    let mut opts = SearchOptions::new(
        Framework::Any,
        c.global_batch_size,
        case.cluster.gpus_per_node,
    );
    opts.top_k = 3;
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
