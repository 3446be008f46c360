//! What-if sweeps over clusters (`autopp whatif`): the full planner at every point of a grid of
//! GPU kinds, GPU counts and networks, with time and cost to train a token budget.
//!
//! Every point is an independent [`crate::search::plans`] with `plan`'s defaults for the
//! framework (memory reserve, margin and runtime included; under `--framework any` the best plan
//! some framework runs); points run in parallel on rayon.
//! From each point's best plan a [`Row`] keeps the degrees and schedule, the iteration time,
//! tokens/s, MFU, the scaling efficiency against the smallest point of its series, the time,
//! GPU-hours and cost of the token budget, and what binds.

mod grid;
pub mod plot;
mod prices;
mod table;

pub use grid::{cluster_files, machines, parse_gpu_counts, parse_tokens, points, BatchPolicy};
pub use prices::Prices;
pub use table::{to_csv, to_table};

use autopp_hardware::{Cluster, Precision};
use autopp_models::Model;
use rayon::prelude::*;
use serde::Serialize;

use crate::degrees::Degrees;
use crate::framework::Framework;
use crate::plan::Breakdown;
use crate::runtime::Stack;
use crate::search::{self, SearchOptions};
use crate::{bands, cost_profile, PlanError};

/// Below this share of the iteration in compute, a row names the term that binds.
pub const COMPUTE_BOUND_SHARE: f64 = 0.8;

/// One point of a sweep: a machine (GPU kind, GPUs per node, NIC, latencies) at a GPU count.
#[derive(Debug, Clone)]
pub struct Point {
    /// The machine; its own GPU count is ignored.
    pub template: Cluster,
    /// GPUs at this point.
    pub gpus: u64,
}

impl Point {
    /// The series this point draws in: GPU kind, NIC Gbit/s and GPUs per node (the label of a
    /// line in the pictures; scaling efficiency compares points of one series).
    pub fn series(&self) -> String {
        let c = &self.template;
        format!(
            "{} · {} Gb/s · {}/node",
            c.gpu.name,
            fmt_gbps(nic_gbps(c)),
            c.gpus_per_node
        )
    }
}

fn nic_gbps(c: &Cluster) -> f64 {
    c.nic_bw_bytes_per_s * 8.0 / 1e9
}

fn fmt_gbps(g: f64) -> String {
    if (g - g.round()).abs() < 1e-9 {
        format!("{}", g.round() as u64)
    } else {
        format!("{g:.1}")
    }
}

/// What a sweep runs at every point.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// The framework (and version) whose space and runtime every search uses.
    pub framework: Stack,
    /// Math precision.
    pub precision: Precision,
    /// Global batch at each point.
    pub batch: BatchPolicy,
    /// Tokens to train, for time, GPU-hours and cost (none: those columns are empty).
    pub train_tokens: Option<f64>,
    /// USD per GPU-hour by GPU kind.
    pub prices: Prices,
    /// The user's calibration (`--calibration`) in place of the shipped knobs.
    pub calibration: Option<crate::calibration::CalibrationFile>,
}

/// The best plan at one point, and what it costs to train the budget with it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointPlan {
    /// tp, pp, dp, cp and stages per pipeline rank.
    #[serde(flatten)]
    pub degrees: Degrees,
    /// Sequences per micro-batch.
    pub micro_batch_size: u64,
    /// The pipeline schedule.
    pub schedule: String,
    /// Seconds per iteration.
    pub iteration_time_s: f64,
    /// Tokens per second over the cluster.
    pub tokens_per_s: f64,
    /// Model FLOPs utilisation (fraction of the dense peak).
    pub mfu: f64,
    /// Tokens/s per GPU against the smallest point of the same series (1 = perfect scaling).
    pub scaling_efficiency: f64,
    /// Seconds to train the token budget.
    pub train_time_s: Option<f64>,
    /// GPU-hours to train the token budget.
    pub gpu_hours: Option<f64>,
    /// GPU-hours × the kind's price, USD.
    pub cost_usd: Option<f64>,
    /// The term that binds (its share of the iteration) when compute is below
    /// [`COMPUTE_BOUND_SHARE`] of it; none when the point is compute-bound.
    pub binds: Option<Binding>,
    /// Peak memory per GPU over capacity.
    pub memory_fraction: f64,
    /// Where the time goes, seconds per iteration.
    pub breakdown_s: Breakdown,
    /// The frameworks that run the plan (empty: none).
    pub runs_on: Vec<Framework>,
}

/// What binds a point: a non-compute term and its share of the iteration.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Binding {
    /// `bubble`, `tp-comm`, `pp-comm`, `dp-comm` or `optimizer`.
    pub term: &'static str,
    /// Its seconds over the iteration's.
    pub share: f64,
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {:.0}%", self.term, 100.0 * self.share)
    }
}

/// One row of the sweep's table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// GPU kind.
    pub gpu: String,
    /// GPUs.
    pub gpus: u64,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// NIC bandwidth per GPU, Gbit/s.
    pub nic_gbps: f64,
    /// The series label (kind, NIC, GPUs per node).
    pub series: String,
    /// Global batch in sequences.
    pub global_batch: u64,
    /// The best plan, or why nothing fits.
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// A point's answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The best plan.
    Plan(Box<PointPlan>),
    /// Why no plan fits (the planner's one line).
    NoPlan(String),
}

impl Row {
    /// The plan, when one fits.
    pub fn plan(&self) -> Option<&PointPlan> {
        match &self.outcome {
            Outcome::Plan(p) => Some(p),
            Outcome::NoPlan(_) => None,
        }
    }
}

/// Runs the planner at every point (in parallel), in the order given; a point where nothing
/// fits gets a row saying why. Errors only for what no point could run with (a price for a
/// kind not swept).
pub fn sweep(
    model: &Model,
    points: &[Point],
    sweep: &Sweep,
    progress: &(dyn Fn(usize, usize) + Sync),
) -> Result<Vec<Row>, PlanError> {
    let kinds: Vec<&str> = points
        .iter()
        .map(|p| p.template.gpu.name.as_str())
        .collect();
    sweep.prices.check_kinds(&kinds)?;
    let done = std::sync::atomic::AtomicUsize::new(0);
    let mut rows: Vec<Row> = points
        .par_iter()
        .with_max_len(1)
        .map(|p| {
            let row = run_point(model, p, sweep);
            let n = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            progress(n, points.len());
            row
        })
        .collect();
    fill_scaling(&mut rows);
    Ok(rows)
}

fn run_point(model: &Model, point: &Point, sweep: &Sweep) -> Row {
    let t = &point.template;
    let global_batch = sweep.batch.global_batch(point.gpus, model.seq_length());
    let outcome = match t.resized(point.gpus) {
        Ok(cluster) => match best_plan(model, &cluster, sweep, global_batch) {
            Ok(p) => Outcome::Plan(Box::new(p)),
            Err(e) => Outcome::NoPlan(e.to_string()),
        },
        Err(e) => Outcome::NoPlan(e.to_string()),
    };
    Row {
        gpu: t.gpu.name.clone(),
        gpus: point.gpus,
        gpus_per_node: t.gpus_per_node,
        nic_gbps: nic_gbps(t),
        series: point.series(),
        global_batch,
        outcome,
    }
}

fn best_plan(
    model: &Model,
    c: &Cluster,
    sweep: &Sweep,
    global_batch: u64,
) -> Result<PointPlan, PlanError> {
    let mut profile = cost_profile(c.clone(), sweep.precision, None, model)?;
    if let Some(cal) = &sweep.calibration {
        profile = cal.apply(profile);
    }
    let family = sweep.framework.family();
    let mut opts = SearchOptions::new(family, global_batch, c.gpus_per_node);
    opts.limits.schedules = family.schedules_to_search(None)?;
    opts.settings.runtime = sweep.framework.runtime();
    opts.settings.precision = sweep.precision;
    // `plan`'s default margin: the GPU kind's memory band (the widest band for kinds without
    // published memory figures)
    opts.settings.memory_margin_bytes = bands::memory_band(&c.gpu.name)
        .map_or(0, |(f, _)| bands::margin_bytes(f, c.gpu.memory_bytes));
    opts.top_k = 0;
    let runnable = sweep.framework == Stack::Any;
    let plans = search::plans(model, &profile, &opts, runnable, &|_, _| {})?;
    let best = &plans.result.best.result;
    let (plan, pr) = (&best.plan, &best.predicted);
    let train_time_s = sweep.train_tokens.map(|t| t / pr.tokens_per_s);
    let gpu_hours = train_time_s.map(|t| t * c.num_gpus() as f64 / 3600.0);
    let cost_usd = gpu_hours.and_then(|h| sweep.prices.cost_usd(&c.gpu.name, h));
    Ok(PointPlan {
        degrees: plan.degrees,
        micro_batch_size: plan.micro_batch_size,
        schedule: plan.schedule.as_str().to_string(),
        iteration_time_s: pr.iteration_time_s,
        tokens_per_s: pr.tokens_per_s,
        mfu: pr.mfu,
        scaling_efficiency: 1.0,
        train_time_s,
        gpu_hours,
        cost_usd,
        binds: binding(&pr.breakdown_s, pr.iteration_time_s),
        memory_fraction: pr.peak_memory_bytes as f64 / pr.memory_capacity_bytes.max(1) as f64,
        breakdown_s: pr.breakdown_s,
        runs_on: plans
            .answers
            .first()
            .map(|a| a.runs_on.clone())
            .unwrap_or_default(),
    })
}

/// The largest non-compute term, when compute is under [`COMPUTE_BOUND_SHARE`] of the
/// iteration.
pub fn binding(b: &Breakdown, iteration_time_s: f64) -> Option<Binding> {
    if iteration_time_s.is_nan()
        || iteration_time_s <= 0.0
        || b.compute >= COMPUTE_BOUND_SHARE * iteration_time_s
    {
        return None;
    }
    let terms = [
        ("bubble", b.bubble),
        ("tp-comm", b.tp_comm),
        ("pp-comm", b.pp_comm),
        ("dp-comm", b.dp_comm),
        ("optimizer", b.optimizer),
    ];
    let (term, s) = terms
        .into_iter()
        .fold(("bubble", f64::MIN), |m, t| if t.1 > m.1 { t } else { m });
    Some(Binding {
        term,
        share: s / iteration_time_s,
    })
}

/// Scaling efficiency: each plan's tokens/s per GPU over that of the series' smallest point
/// that has a plan.
fn fill_scaling(rows: &mut [Row]) {
    let base: Vec<Option<f64>> = rows
        .iter()
        .map(|r| {
            rows.iter()
                .filter(|o| o.series == r.series)
                .filter_map(|o| o.plan().map(|p| (o.gpus, p.tokens_per_s / o.gpus as f64)))
                .min_by_key(|(g, _)| *g)
                .map(|(_, per_gpu)| per_gpu)
        })
        .collect();
    for (row, base) in rows.iter_mut().zip(base) {
        let gpus = row.gpus as f64;
        if let (Outcome::Plan(p), Some(b)) = (&mut row.outcome, base) {
            p.scaling_efficiency = p.tokens_per_s / gpus / b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakdown(compute: f64, bubble: f64, dp: f64) -> Breakdown {
        Breakdown {
            compute,
            bubble,
            tp_comm: 0.0,
            ep_comm: 0.0,
            ep_comm_hidden: 0.0,
            pp_comm: 0.0,
            dp_comm: dp,
            optimizer: 0.0,
        }
    }

    #[test]
    fn a_compute_bound_point_names_nothing_and_others_their_largest_term() {
        assert_eq!(binding(&breakdown(9.0, 0.5, 0.5), 10.0), None);
        let b = binding(&breakdown(6.0, 1.0, 3.0), 10.0).expect("binds");
        assert_eq!((b.term, b.share), ("dp-comm", 0.3));
        assert_eq!(b.to_string(), "dp-comm 30%");
    }
}
