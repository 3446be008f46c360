//! [`ExecError`]: why a run could not start or did not finish.

use autopp_profiler::device::{DeviceError, TransportError};
use autopp_schedule::{CheckError, ScheduleError, SimError, SplitError};

/// Why the executor refused a configuration or a run failed. One line each, naming the flag
/// or the rank at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    /// A flag's value cannot run (e.g. a split that does not match the stages).
    #[error("{flag}: {message}")]
    Invalid {
        /// The flag at fault.
        flag: String,
        /// What is wrong and what would be right.
        message: String,
    },
    /// The model uses something the executor does not implement, or is too large for the CPU.
    #[error("{0}")]
    Unsupported(String),
    /// The plan's schedule cannot be generated ([`ScheduleError::field`] names the input).
    #[error(transparent)]
    ScheduleSpec(#[from] ScheduleError),
    /// The layer split cannot be made or used ([`SplitError::field`] names the input).
    #[error(transparent)]
    Split(#[from] SplitError),
    /// The schedule is incomplete, inconsistent or deadlocks.
    #[error("the schedule cannot run: {0}")]
    Schedule(#[from] CheckError),
    /// The simulator cannot time the schedule for the prediction.
    #[error("the schedule cannot run: {0}")]
    Simulation(#[from] SimError),
    /// A rank failed while running: `rank 1 (replica 0, pipeline rank 1) failed at step 2,
    /// action 1B3: …`.
    #[error(
        "rank {rank} (replica {replica}, pipeline rank {pp_rank}) failed at step {step}{}: {message}",
        at_action(.action)
    )]
    Rank {
        /// World rank.
        rank: usize,
        /// Data-parallel replica.
        replica: usize,
        /// Pipeline rank.
        pp_rank: usize,
        /// Training step (1-based).
        step: usize,
        /// The action it was running (`1B3`), if it failed inside one.
        action: Option<String>,
        /// What happened.
        message: String,
    },
}

impl ExecError {
    /// An [`ExecError::Invalid`] for `flag`.
    pub fn invalid(flag: &str, message: impl Into<String>) -> Self {
        ExecError::Invalid {
            flag: flag.to_string(),
            message: message.into(),
        }
    }
}

fn at_action(action: &Option<String>) -> String {
    action
        .as_ref()
        .map(|a| format!(", action {a}"))
        .unwrap_or_default()
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// `panicked: <the panic's message>`.
pub(crate) fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    format!("panicked: {}", panic_message(payload))
}

/// What went wrong inside one rank, before the rank is known to the message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum RankError {
    #[error(transparent)]
    Transport(#[from] TransportError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("{0}")]
    Schedule(String),
    /// `--inject-failure` asked for this failure.
    #[error("{0}")]
    Injected(String),
    /// Another rank failed first (the start-of-step barrier was aborted).
    #[error("{0}")]
    Aborted(String),
}

impl RankError {
    /// Whether this rank stopped because another rank failed (not a root cause).
    pub(crate) fn is_secondary(&self) -> bool {
        matches!(
            self,
            RankError::Aborted(_)
                | RankError::Transport(TransportError::Aborted { .. })
                | RankError::Device(DeviceError::Collective(TransportError::Aborted { .. }))
        )
    }
}
