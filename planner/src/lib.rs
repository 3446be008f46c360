//! # autopp-planner
//!
//! The cost and memory model, the schedule IR with its generators, checker and event simulator,
//! and (next) the search. Given a model, a profile of the cluster and a full parallel
//! configuration, [`estimate::evaluate`] predicts the iteration time with its breakdown and each
//! rank's peak memory.
//!
//! This crate never runs kernels: it reads costs from the profiler and hands plans to the
//! executor.

pub use autopp_schedule as schedule;

pub mod bands;
pub mod config;
pub mod estimate;
pub mod framework;
pub mod launch;
pub mod layout;
pub mod memory;
pub mod plan;
pub mod planfile;
pub mod search;
pub mod stages;

pub use config::{ParallelConfig, PlanError, DEFAULT_MEMORY_RESERVE_BYTES};
pub use estimate::{evaluate, Estimate};
pub use framework::Framework;
pub use plan::{Breakdown, Plan, PlanAndPrediction, Predicted, RankPlan, FORMAT_VERSION};
pub use planfile::PlanFile;
