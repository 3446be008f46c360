//! # autopp-planner
//!
//! Configurations and the frameworks that run them, the cost and memory model, and the search.
//! Given a model, a profile of the cluster and a full parallel configuration,
//! [`estimate::evaluate`] predicts the iteration time with its breakdown and each rank's peak
//! memory; [`search::search`] finds the fastest configuration that fits.
//!
//! This crate never runs kernels: it reads costs from the profiler and hands plans to the
//! executor.

pub use autopp_schedule as schedule;

pub mod advice;
pub mod bands;
pub mod batch;
pub mod calibration;
pub mod config;
pub mod degrees;
mod describe;
pub mod estimate;
pub mod experts;
pub mod files;
pub mod framework;
pub mod launch;
pub mod layout;
pub mod memory;
pub mod pins;
pub mod plan;
pub mod planfile;
pub mod profile;
pub mod report;
pub mod requested;
pub mod runtime;
pub mod search;
pub mod stages;
pub mod whatif;

pub use config::{
    EvalSettings, ParallelConfig, PlanError, DEFAULT_MEMORY_RESERVE_BYTES, MAX_MEMORY_SETTING_BYTES,
};
pub use degrees::Degrees;
pub use estimate::{evaluate, Estimate};
pub use experts::ExpertParallel;
pub use framework::Framework;
pub use pins::Fixed;
pub use plan::{
    Breakdown, Plan, PlanAndPrediction, Predicted, RankPlan, RankRecompute, FORMAT_VERSION,
};
pub use planfile::PlanFile;
pub use profile::cost_profile;
pub use runtime::Stack;
