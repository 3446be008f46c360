//! One module per subcommand.
pub mod schedule;
