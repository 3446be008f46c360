//! # autopp-planner
pub mod schedule;
