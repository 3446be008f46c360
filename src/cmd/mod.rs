//! One module per subcommand, plus the flags and helpers they share.
pub mod catalog;
pub mod common;
pub mod compare;
pub mod estimate;
pub mod exec;
pub mod help;
pub mod launch;
pub mod plan;
pub mod profile;
pub mod schedule;
pub mod validate;
pub mod whatif;
