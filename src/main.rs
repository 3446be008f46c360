//! `autopp`: plan and run pipeline-parallel training of large models.
//!
//! The binary parses flags, calls the libraries and renders their answers; it holds no domain
//! logic. Every error is one line on stderr and exit status 2.

mod cmd;

use clap::{Parser, Subcommand};

/// mimalloc: the planner allocates and frees many schedule-sized vectors from two threads, and
/// glibc's allocator returns them to the kernel and faults them back in; `autopp plan` runs
/// about 20% faster with mimalloc (`docs/planner.md`). Its 2.x line (feature `v2`): under 3.x a
/// fresh page's free list is written block by block, touching (and, with transparent huge
/// pages, zeroing) memory the search never uses; `plan qwen3-30b-a3b --gpus 32` peaks at 81
/// instead of 104 MB and runs about 10% faster.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Plan pipeline-parallel training: how to split a model over a GPU cluster, how fast it will
/// run, and whether it fits.
#[derive(Parser, Debug)]
#[command(name = "autopp", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Find the fastest plan that fits, explain it, and list the alternatives.
    #[command(before_help = cmd::help::PLAN)]
    Plan(cmd::plan::PlanArgs),
    /// Write a plan's launch files for Megatron-LM, torchtitan or DeepSpeed.
    #[command(before_help = cmd::help::LAUNCH)]
    Launch(cmd::launch::LaunchArgs),
    /// Predict time and memory of one parallel configuration.
    #[command(before_help = cmd::help::ESTIMATE)]
    Estimate(cmd::estimate::EstimateArgs),
    /// Two plan files side by side: every term of the iteration and the memory, with B − A.
    #[command(before_help = cmd::compare::HELP)]
    Compare(cmd::compare::CompareArgs),
    /// Generate, check, simulate and draw a pipeline schedule.
    #[command(before_help = cmd::help::SCHEDULE)]
    Schedule(cmd::schedule::ScheduleArgs),
    /// Sweep clusters: the best plan per GPU count, kind and network, with time and cost to train.
    #[command(before_help = cmd::help::WHATIF)]
    Whatif(cmd::whatif::WhatifArgs),
    /// Compare predictions with published, measured training runs.
    #[command(before_help = cmd::help::VALIDATE)]
    Validate(cmd::validate::ValidateArgs),
    /// Fit the efficiency knobs on your own measured runs (for --calibration).
    #[command(before_help = cmd::help::CALIBRATE)]
    Calibrate(cmd::validate::CalibrateArgs),
    /// Train a small model for real with a pipeline schedule, one thread per rank.
    #[command(before_help = cmd::help::EXEC)]
    Exec(cmd::exec::ExecArgs),
    /// Time every layer of a small model on this CPU and write a measured profile.
    #[command(before_help = cmd::help::PROFILE)]
    Profile(cmd::profile::ProfileArgs),
    /// List the bundled model presets, or describe one model (preset, model.json or Hugging Face
    /// config.json): its shape and its total and activated parameters.
    #[command(before_help = cmd::help::CATALOG)]
    Models {
        /// A preset name or a model file to describe instead of listing the presets.
        model: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the GPU kinds in the hardware catalog.
    #[command(before_help = cmd::help::CATALOG)]
    Gpus {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print a shell completion script to stdout.
    #[command(before_help = cmd::help::COMPLETIONS)]
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_name = "SHELL")]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) to stdout, or write one page per command into a directory.
    #[command(before_help = cmd::help::MAN)]
    Man {
        /// A directory for autopp.1 and autopp-COMMAND.1 instead of stdout.
        #[arg(long, value_name = "DIR")]
        out: Option<String>,
    },
}

/// Lets a closed pipe (`autopp plan … | head`) end the process quietly, as it does `cat` or
/// `grep`, instead of a panic in `println!`: Rust ignores `SIGPIPE` by default.
#[cfg(unix)]
fn default_sigpipe() {
    // SAFETY: called first thing in `main`, before any other thread exists; it only restores
    // the signal's default disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

#[cfg(not(unix))]
fn default_sigpipe() {}

/// The error line for a negative number given to a flag (`--global-batch -3`), which clap
/// reads as an unknown flag: what the flag takes instead. `None` for any other error.
fn negative_value(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(token)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    // clap names the first short flag it made of the value: `-1` of `-1.5`
    let negative = |a: &str| {
        a.strip_prefix('-')
            .is_some_and(|n| n.parse::<f64>().is_ok())
    };
    let args: Vec<String> = std::env::args().collect();
    let at = args
        .iter()
        .position(|a| a.starts_with(token.as_str()) && negative(a))?;
    let flag = args[..at].last().filter(|f| f.starts_with("--"))?;
    let value = &args[at];
    Some(format!(
        "error: {flag}: '{value}' is negative; give a positive value (see --help)"
    ))
}

fn main() {
    default_sigpipe();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                e.exit();
            }
            if let Some(line) = negative_value(&e) {
                cmd::common::print_stderr_line(&line);
                std::process::exit(2);
            }
            // One line: clap's message without its usage block, and where to look.
            let text = e.render().to_string();
            let message = text.split("\n\nUsage:").next().unwrap_or(&text);
            let line = message.split_whitespace().collect::<Vec<_>>().join(" ");
            cmd::common::print_stderr_line(&format!("{line} (see --help)"));
            std::process::exit(2);
        }
    };
    let result = match &cli.command {
        Command::Plan(args) => cmd::plan::run(args),
        Command::Launch(args) => cmd::launch::run(args),
        Command::Estimate(args) => cmd::estimate::run(args),
        Command::Compare(args) => cmd::compare::run(args),
        Command::Schedule(args) => cmd::schedule::run(args),
        Command::Validate(args) => cmd::validate::run(args),
        Command::Calibrate(args) => cmd::validate::calibrate(args),
        Command::Whatif(args) => cmd::whatif::run(args),
        Command::Exec(args) => cmd::exec::run_exec(args),
        Command::Profile(args) => cmd::profile::run(args),
        Command::Models { model, json } => cmd::catalog::models(model.as_deref(), *json),
        Command::Gpus { json } => cmd::catalog::gpus(*json),
        Command::Completions { shell } => cmd::help::completions::<Cli>(*shell),
        Command::Man { out } => cmd::help::man::<Cli>(out.as_deref()),
    };
    if let Err(e) = result {
        cmd::common::print_stderr_line(&format!("error: {}", cmd::common::error_line(&e)));
        std::process::exit(2);
    }
    for line in cmd::common::take_notes() {
        cmd::common::print_stderr_line(&format!("note: {line}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every example a `--help` opens with parses (files it names need not exist).
    #[test]
    fn help_examples_parse() {
        use cmd::help::*;
        for block in [
            PLAN,
            LAUNCH,
            ESTIMATE,
            cmd::compare::HELP,
            SCHEDULE,
            WHATIF,
            VALIDATE,
            CALIBRATE,
            EXEC,
            PROFILE,
            CATALOG,
            COMPLETIONS,
            MAN,
        ] {
            for line in block.lines().skip(1) {
                let command = line.trim().split(" > ").next().unwrap_or_default();
                let command = command.split(" && ").next().unwrap_or_default();
                let words: Vec<&str> = command.split_whitespace().collect();
                assert!(words.len() >= 2, "{line}");
                if let Err(e) = Cli::try_parse_from(&words) {
                    panic!("{line}: {e}");
                }
            }
        }
    }
}
