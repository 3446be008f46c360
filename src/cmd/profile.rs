//! `autopp profile`: time every layer of a small model on this machine's CPU (the device layer
//! the executor runs) and write a measured profile for `estimate --profile` and
//! `plan --profile`.

use anyhow::{Context, Result};
use autopp_profiler::profile_layers;
use clap::{Args, ValueEnum};

use super::common::{load_model_at, write_atomic};
use autopp_models::units::secs;

/// What `profile` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// The fp32 CPU layers `exec` runs, one thread.
    Cpu,
}

/// Measure the forward, backward-input and backward-weight time of every layer of a small
/// model (such as tiny-gpt) on this machine and write them as a profile file (JSON, format
/// `autopp-profile/1`, see docs/executor.md) that `estimate --profile` and `plan --profile` use
/// instead of the analytic profile's layer times.
///
/// Example: autopp profile --backend cpu tiny-gpt --mbs 2 --out tiny-gpt.profile.json
#[derive(Args, Debug)]
pub struct ProfileArgs {
    /// A preset name (see `autopp models`) or a path to a model.json.
    pub model: String,
    /// What to time.
    #[arg(long, value_enum, default_value_t = Backend::Cpu)]
    pub backend: Backend,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 1, value_name = "B")]
    pub mbs: usize,
    /// Time at this sequence length instead of the model's.
    #[arg(long, value_name = "S")]
    pub seq_len: Option<u64>,
    /// Timed repetitions per layer (after one warm-up); each time is their median.
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub repetitions: usize,
    /// Seed of the weights and the data.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,
    /// Where to write the profile (written whole or not at all).
    #[arg(long, value_name = "FILE")]
    pub out: String,
    /// Print the profile as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs `autopp profile`.
pub fn run(args: &ProfileArgs) -> Result<()> {
    let (model, _) = load_model_at(&args.model, args.seq_len)?;
    let p = profile_layers(&model, args.mbs, args.repetitions, args.seed)?;
    let text = p.to_json();
    write_atomic(&args.out, text.as_bytes()).context("--out")?;
    if args.json {
        println!("{text}");
        return Ok(());
    }
    println!(
        "{} · cpu · micro-batch {} × {} tokens · median of {} repetitions\n",
        p.model, p.micro_batch_size, p.seq_length, p.repetitions
    );
    println!("{:<10} {:>10} {:>10} {:>10}", "layer", "F", "I", "W");
    for l in &p.layers {
        println!(
            "{:<10} {:>10} {:>10} {:>10}",
            l.name,
            secs(l.forward_s),
            secs(l.backward_input_s),
            secs(l.backward_weight_s)
        );
    }
    println!("\nwrote {}", args.out);
    Ok(())
}
