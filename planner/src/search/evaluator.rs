//! Exact evaluation of search candidates through `estimate`'s code path, with each schedule
//! shape generated once per search and shared by every configuration of that shape.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use autopp_models::Model;
use autopp_profiler::AnalyticProfile;

use super::{config_of, Key, LayerTable, SearchOptions};
use crate::config::ParallelConfig;
use crate::estimate::{evaluate_scheduled, schedule_for, Detail, Estimate};
use crate::schedule::{Schedule, ScheduleKind};

/// A schedule's shape: kind, pipeline ranks, stages per rank, micro-batches.
pub(crate) type ScheduleShape = (ScheduleKind, u64, u64, u64);

/// Evaluates candidates of one search.
pub(crate) struct Evaluator<'a> {
    pub model: &'a Model,
    pub profile: &'a AnalyticProfile,
    pub opts: &'a SearchOptions,
    /// Generated schedules by shape (`None`: the generator rejects the shape).
    schedules: Mutex<HashMap<ScheduleShape, Option<Arc<Schedule>>>>,
}

impl<'a> Evaluator<'a> {
    /// An evaluator with an empty schedule cache.
    pub fn new(model: &'a Model, profile: &'a AnalyticProfile, opts: &'a SearchOptions) -> Self {
        Evaluator {
            model,
            profile,
            opts,
            schedules: Mutex::new(HashMap::new()),
        }
    }

    /// The schedule of a configuration the search built (no group size), generated on first use.
    fn schedule(&self, c: &ParallelConfig) -> Option<Arc<Schedule>> {
        let shape = (c.schedule, c.pp, c.virtual_stages, c.num_microbatches());
        if let Some(found) = self.schedules.lock().ok()?.get(&shape) {
            return found.clone();
        }
        // generated outside the lock: two threads may both build a shape, with the same result
        let made = schedule_for(c).ok().map(Arc::new);
        self.schedules.lock().ok()?.insert(shape, made.clone());
        made
    }

    /// Evaluates a key with a split (`None`: the even split) at the given detail.
    pub fn evaluate(
        &self,
        key: &Key,
        table: &LayerTable,
        split: Option<Vec<usize>>,
        detail: Detail,
    ) -> Option<Estimate> {
        let c = config_of(key, self.opts, split);
        let sched = self.schedule(&c)?;
        evaluate_scheduled(self.model, self.profile, &c, &table.layers, detail, sched).ok()
    }

    /// Iteration time and memory of a key with a split (the search's inner loop).
    pub fn time_and_memory(
        &self,
        key: &Key,
        table: &LayerTable,
        split: Option<Vec<usize>>,
    ) -> Option<Estimate> {
        self.evaluate(key, table, split, Detail::TimeAndMemory)
    }
}
