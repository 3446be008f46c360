//! Schedules as data: the IR, the generators, the checker, the event simulator and the
//! pictures (ASCII timeline, SVG Gantt chart, Chrome trace).
//!
//! A [`Schedule`] is one ordered list of [`Step`]s per pipeline rank. Everything else reads
//! those lists: [`check`] proves them complete and deadlock-free, [`simulate`] times them,
//! [`ascii::timeline`], [`svg::gantt`] and [`trace::chrome_trace`] draw them. A new schedule
//! is one generator function.
//!
//! ```
//! use autopp_planner::schedule::{check, generate, simulate, ScheduleKind, ScheduleSpec, SimCosts};
//!
//! let spec = ScheduleSpec::new(ScheduleKind::Interleaved1F1B, 4, 8).with_virtual_stages(2);
//! let s = generate(&spec).unwrap();
//! check(&s).unwrap();
//! let r = simulate(&s, &SimCosts::uniform(s.num_stages(), 1.0, 1.0, 1.0, 1.0, 0.0)).unwrap();
//! // (p − 1)/(v·m + p − 1) with equal stage costs and no communication
//! assert!((r.bubble_fraction - 3.0 / 19.0).abs() < 1e-12);
//! ```

pub mod ascii;
pub mod checker;
pub mod generators;
pub mod ir;
pub mod simulator;
pub mod svg;
pub mod trace;

pub use checker::{check, CheckError};
pub use generators::{
    check_spec, generate, resolve_group_size, ScheduleError, ScheduleSpec, MAX_STAGE_MICROBATCHES,
};
pub use ir::{
    parse_steps, Action, ActionKind, ParseStepError, Placement, Schedule, ScheduleKind, Step,
};
pub use simulator::{
    simulate, simulate_metrics, SimCosts, SimError, SimMetrics, SimResult, StageCosts, TimedStep,
};
