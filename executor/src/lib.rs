//! # autopp-executor
//!
//! Runs a schedule IR for real: one worker thread per rank (`pp × dp × tp`) executing its action
//! list over the profiler's device layer — fp32 layers with explicit forward /
//! backward-input / backward-weight, their GEMMs on the CPU or (feature `cuda`, [`Backend`])
//! cuBLAS, an in-process [`Transport`] between ranks (or NCCL: `run_nccl`) — with saved
//! activations per (stage, micro-batch), gradients accumulated over micro-batches and scaled as
//! one full-batch step, a data-parallel all-reduce, and AdamW. [`check`] trains the same model
//! on one worker with the whole batch at once and compares losses and weights.
//!
//! The schedule IR is the only thing the executor is told about order: any [`Schedule`] that
//! passes the checker runs, including split backwards (`I`, `W`) and overlapped pairs.
//!
//! ```
//! use autopp_executor::{check, run, ExecConfig};
//! use autopp_schedule::{generate, ScheduleKind, ScheduleSpec};
//!
//! let model = autopp_models::load("tiny-gpt").unwrap().with_seq_length(8).unwrap();
//! let schedule = generate(&ScheduleSpec::new(ScheduleKind::OneFOneB, 2, 4)).unwrap();
//! let mut cfg = ExecConfig::new(&model, schedule, 1, 1, None).unwrap();
//! cfg.steps = 2;
//! let report = run(&cfg, &mut |_| {}).unwrap();
//! let reference = check::train_single_worker(&cfg).unwrap();
//! let c = check::compare(&report, &reference, check::DEFAULT_TOLERANCE);
//! assert!(c.passed, "{}: {}", c.worst, c.max_rel_err);
//! assert_eq!(report.peak_activation_bytes, report.predicted_peak_activation_bytes);
//! ```
//!
//! [`Transport`]: autopp_profiler::device::Transport
//! [`Schedule`]: autopp_schedule::Schedule

#![warn(missing_docs)]

pub mod backend;
mod barrier;
pub mod check;
pub mod config;
mod error;
pub mod measure;
pub mod multiprocess;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod optim;
pub mod predict;
pub mod record;
pub mod report;
pub mod run;
pub mod scale;
pub mod stage;
mod summary;
pub mod topology;
pub mod trace;
mod worker;

pub use autopp_profiler::device::MAX_PARAMS;
pub use backend::Backend;
pub use check::{compare, train_single_worker, CheckReport, Reference};
pub use config::{AdamWConfig, ExecConfig, FailureMode, InjectedFailure};
pub use error::ExecError;
pub use measure::Measured;
pub use multiprocess::run_rank;
#[cfg(feature = "cuda")]
pub use nccl::run_nccl;
pub use record::{ActionEvent, RankStep, RankTrace, StepSummary};
pub use report::ExecReport;
pub use run::run;
pub use topology::Place;
