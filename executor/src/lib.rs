//! # autopp-executor
//!
//! Runs a plan's schedule IR for real: one worker per rank executing its action list over the
//! profiler's device layer. This crate is an empty placeholder until the executor issue lands; it
//! exists so the workspace has its final shape and dependency direction
//! (`models ← profiler ← planner ← executor ← autopp`).

/// The executor's version, the crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
