//! Exact evaluation of search candidates through `estimate`'s code path, with each schedule
//! shape generated once per search and shared by every configuration of that shape.

use std::sync::Arc;

use autopp_hardware::AnalyticProfile;
use autopp_models::Model;

use super::memo::Memo;
use super::table::LayerTable;
use super::{config_with, key_of, Key, SearchOptions};
use crate::config::ParallelConfig;
use crate::estimate::{
    busiest_rank_s, evaluate_scheduled_again, evaluate_scheduled_when, schedule_for, Detail,
    Estimate, Gate,
};
use crate::schedule::{Schedule, ScheduleKind};

/// A schedule's shape: kind, pipeline ranks, stages per rank, micro-batches.
pub(crate) type ScheduleShape = (ScheduleKind, u64, u64, u64);

/// Generated schedules by shape (`None`: the generator rejects the shape), shared by the
/// searches of one plan (a shape's schedule is the same for every framework).
pub(crate) type Schedules = Memo<ScheduleShape, Option<Arc<Schedule>>>;

/// Evaluates candidates of one search.
pub(crate) struct Evaluator<'a> {
    pub model: &'a Model,
    pub profile: &'a AnalyticProfile,
    pub opts: &'a SearchOptions,
    /// Generated schedules by shape, generated on first use.
    schedules: &'a Schedules,
    /// The model's FLOPs per sequence (`None`: the model cannot say).
    model_flops_per_sequence: Option<f64>,
}

impl<'a> Evaluator<'a> {
    /// An evaluator that generates schedules into `schedules`.
    pub fn new(
        model: &'a Model,
        profile: &'a AnalyticProfile,
        opts: &'a SearchOptions,
        schedules: &'a Schedules,
    ) -> Self {
        Evaluator {
            model,
            profile,
            opts,
            schedules,
            model_flops_per_sequence: model.model_flops_per_sequence().ok(),
        }
    }

    /// The schedule of a configuration the search built (no group size), generated on first use.
    fn schedule(&self, c: &ParallelConfig) -> Option<Arc<Schedule>> {
        let d = &c.degrees;
        let shape = (c.schedule, d.pp, d.virtual_stages, c.num_microbatches());
        self.schedules
            .get_or(shape, || schedule_for(c).ok().map(Arc::new))
    }

    /// Evaluates a key with a split (`None`: the even split) and, for partial recompute, the
    /// fully recomputed layers per stage, at the given detail; or `None` without simulating a
    /// configuration that cannot pass `gate`.
    fn evaluate_when(
        &self,
        key: &Key,
        table: &LayerTable,
        (split, recompute_layers): (Option<Vec<usize>>, Option<Vec<u64>>),
        detail: Detail,
        gate: Option<Gate>,
    ) -> Option<Estimate> {
        let c = config_with(key, self.opts, split, recompute_layers);
        let sched = self.schedule(&c)?;
        let flops = self.model_flops_per_sequence?;
        let args = (detail, sched, flops);
        evaluate_scheduled_when(self.model, self.profile, &c, table.list(), args, gate)
            .ok()
            .flatten()
    }

    /// A lower bound on the iteration time of a key with a split (`None`: the even split),
    /// seconds, without simulating ([`busiest_rank_s`]); `None` when it does not evaluate.
    pub fn lower_bound_s(
        &self,
        key: &Key,
        table: &LayerTable,
        split: Option<Vec<usize>>,
        recompute_layers: Option<Vec<u64>>,
    ) -> Option<f64> {
        let c = config_with(key, self.opts, split, recompute_layers);
        let sched = self.schedule(&c)?;
        busiest_rank_s(self.model, self.profile, &c, table.list(), &sched).ok()
    }

    /// Iteration time and memory of a key with a split, fitting or not, when it may take less
    /// than `time_s` seconds with a peak memory of at most `peak_bytes` ([`Gate::Beating`]);
    /// `None` without simulating when it cannot (or does not evaluate).
    pub fn beating(
        &self,
        key: &Key,
        table: &LayerTable,
        (split, recompute_layers): (Option<Vec<usize>>, Option<Vec<u64>>),
        (time_s, peak_bytes): (f64, u64),
    ) -> Option<Estimate> {
        let gate = Gate::Beating { time_s, peak_bytes };
        let choice = (split, recompute_layers);
        self.evaluate_when(key, table, choice, Detail::TimeAndMemory, Some(gate))
    }

    /// Iteration time and memory of a key with a split (the search's inner loop) when it fits
    /// with its margin; `None` without simulating when it does not (or does not evaluate).
    pub fn fitting(
        &self,
        key: &Key,
        table: &LayerTable,
        split: Option<Vec<usize>>,
        recompute_layers: Option<Vec<u64>>,
    ) -> Option<Estimate> {
        let choice = (split, recompute_layers);
        self.evaluate_when(
            key,
            table,
            choice,
            Detail::TimeAndMemory,
            Some(Gate::Fitting),
        )
    }

    /// Evaluates an estimate's configuration again, with its exact split and recompute; its
    /// pipeline simulation with sends is not run again (see [`evaluate_scheduled_again`]).
    pub fn again(&self, e: &Estimate, table: &LayerTable, detail: Detail) -> Option<Estimate> {
        let (split, recompute_layers) = choice_of(e);
        let c = config_with(&key_of(e), self.opts, Some(split), recompute_layers);
        let sched = self.schedule(&c)?;
        let flops = self.model_flops_per_sequence?;
        let args = (detail, sched, flops);
        let list = table.list();
        evaluate_scheduled_again(self.model, self.profile, &c, list, args, e).ok()
    }
}

/// An estimate's split (layer-list entries per stage) and, with partial recompute, its fully
/// recomputed layers per stage, both in global stage order.
pub(crate) fn choice_of(e: &Estimate) -> (Vec<usize>, Option<Vec<u64>>) {
    let split = e
        .stages
        .iter()
        .map(|s| s.layers[1] - s.layers[0] + 1)
        .collect();
    (split, e.result.plan.recompute_layers())
}
