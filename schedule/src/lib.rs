//! Schedules as data: the IR, the generators, the checker, the event simulator and the
//! pictures (ASCII timeline, SVG Gantt chart, Chrome trace).
//!
//! A [`Schedule`] is one ordered list of [`Step`]s per pipeline rank. Everything else reads
//! those lists: [`check`] proves them complete and deadlock-free, [`simulate`] times them,
//! [`ascii::timeline`], [`svg::gantt`] and [`trace::chrome_trace`] draw them. A new schedule
//! is one generator function.
//!
//! ```
//! use autopp_schedule::{check, generate, simulate, ScheduleKind, ScheduleSpec, SimCosts};
//!
//! let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 4, 8).with_virtual_stages(2);
//! let s = generate(&spec).unwrap();
//! check(&s).unwrap();
//! let r = simulate(&s, &SimCosts::uniform(s.num_stages(), 1.0, 1.0, 1.0, 1.0, 0.0)).unwrap();
//! // (p − 1)/(v·m + p − 1) with equal stage costs and no communication
//! assert!((r.bubble_fraction - 3.0 / 19.0).abs() < 1e-12);
//! ```

#![warn(missing_docs)]

pub mod ascii;
pub mod checker;
pub mod deps;
pub mod generators;
pub mod inflight;
pub mod ir;
pub mod pipeline;
pub mod report;
pub mod simulator;
pub mod split;
pub mod svg;
pub mod trace;

pub use checker::{check, CheckError};
pub use generators::{
    check_spec, generate, resolve_group_size, ScheduleError, ScheduleSpec, MAX_PP,
    MAX_STAGE_MICROBATCHES,
};
pub use ir::{
    parse_steps, Action, ActionKind, ParseStepError, Placement, Schedule, ScheduleKind, Step,
};
pub use pipeline::PipelinePlan;
pub use simulator::{
    simulate, simulate_metrics, CostsError, SimCosts, SimError, SimMetrics, SimResult, StageCosts,
    TimedStep, UniformCosts,
};
pub use split::{check_split, default_split, stage_ranges, SplitError};

/// An input of a schedule or a split, named as the IR names it. Errors say which one is at
/// fault; the CLI turns it into its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpecField {
    /// Pipeline ranks `p`.
    Pp,
    /// Stages per rank `v`.
    VirtualStages,
    /// Micro-batches per iteration `m`.
    NumMicrobatches,
    /// Interleaved 1F1B's micro-batch group size `G`.
    GroupSize,
    /// The layer-list entries of each stage.
    Split,
}

impl SpecField {
    /// The `autopp` flag that sets this input (`--pp`, `--virtual`, `--microbatches`,
    /// `--group-size`, `--split`).
    pub fn flag(self) -> &'static str {
        match self {
            SpecField::Pp => "--pp",
            SpecField::VirtualStages => "--virtual",
            SpecField::NumMicrobatches => "--microbatches",
            SpecField::GroupSize => "--group-size",
            SpecField::Split => "--split",
        }
    }
}
