//! Arguments and helpers shared by subcommands: the cluster flags, model loading, formatting.

use anyhow::{Context, Result};
use autopp_executor::ExecError;
use autopp_hardware::{hardware, Cluster};
use autopp_models::units::thousands;
use autopp_models::{Model, SeqLenSource};
use autopp_planner::batch::{self, TimeToTrain};
use autopp_planner::PlanError;
use autopp_schedule::{ScheduleError, SpecField, SplitError};
use clap::Args;

/// The cluster flags shared by `estimate` and `plan`.
#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// GPU kind (see `autopp gpus`).
    #[arg(long, default_value = "h100-sxm", value_name = "KIND")]
    pub gpu: String,
    /// GPUs per node (one NVLink domain) [default: the GPU kind's domain: 72 for gb200 and
    /// gb300, else 8].
    #[arg(long, value_name = "K")]
    pub gpus_per_node: Option<u64>,
    /// NIC bandwidth per GPU in Gbit/s [default: 200 for A100, 400 for H100/H200, 100 for V100].
    #[arg(long, value_name = "X")]
    pub nic_gbps: Option<f64>,
    /// A cluster.json describing the machine (replaces --gpu, --gpus-per-node, --nic-gbps).
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<String>,
    /// A calibration file from `autopp calibrate` (your own runs) instead of the shipped knobs.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<String>,
}

impl ClusterArgs {
    /// The cluster of `gpus` GPUs these flags describe.
    pub fn build(&self, gpus: Option<u64>) -> Result<Cluster> {
        if let Some(path) = &self.cluster {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--cluster: cannot read '{path}'"))?;
            let cluster = Cluster::from_json(&text, path)?;
            return Ok(match gpus {
                Some(n) => cluster.with_gpus(n)?,
                None => cluster,
            });
        }
        let gpus = gpus.ok_or_else(|| anyhow::anyhow!("--gpus: give the number of GPUs"))?;
        let gpu = hardware::gpu(&self.gpu)?;
        let per_node = self.gpus_per_node.unwrap_or(gpu.nvlink_domain);
        Ok(Cluster::new(gpu, gpus, per_node, self.nic_gbps)?)
    }
}

/// Prints `line` and a newline on stderr in one write. `eprintln!` writes each formatted piece
/// separately (stderr is unbuffered), so under `mpirun`, which forwards every write as it comes,
/// another process's output could land inside the line; one `write_all` keeps it whole.
pub fn print_stderr_line(line: &str) {
    use std::io::Write;
    // nothing to do if stderr is gone
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Notes for the user (a default chosen, a setting not applied), printed on stderr only when
/// the command succeeds, so that a failure stays one line.
static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// Keeps `line` to print as `note: line` if the command succeeds.
pub fn note(line: String) {
    if let Ok(mut notes) = NOTES.lock() {
        notes.push(line);
    }
}

/// The notes kept so far, emptied.
pub fn take_notes() -> Vec<String> {
    NOTES
        .lock()
        .map(|mut notes| std::mem::take(&mut *notes))
        .unwrap_or_default()
}

/// Loads a model at `--seq-len` tokens, or at its own length capped at
/// [`MAX_DEFAULT_SEQ_LENGTH`](autopp_models::defaults::MAX_DEFAULT_SEQ_LENGTH) with a note
/// saying so and how to change it; with where the length comes from.
pub fn load_model_at(name_or_path: &str, seq_len: Option<u64>) -> Result<(Model, SeqLenSource)> {
    let (model, own) = autopp_models::load_with_source(name_or_path)?;
    let (model, defaulted) = model.at_seq_length(seq_len).context("--seq-len")?;
    if let Some(own) = defaulted.seq_length_capped_from {
        note(format!(
            "training at {} tokens per sequence, not the model's {}-token maximum context; change it with --seq-len",
            thousands(model.seq_length() as f64),
            thousands(own as f64)
        ));
    }
    Ok((model, own.at(seq_len, &defaulted)))
}

/// The batch flags of `plan`, `estimate` and `whatif`.
#[derive(Args, Debug, Clone)]
pub struct BatchArgs {
    /// Global batch in sequences [default: the model's published batch, else about 4M tokens].
    #[arg(long, value_name = "G", conflicts_with = "global_batch_tokens")]
    pub global_batch: Option<u64>,
    /// Global batch in tokens, e.g. 4M (K, M, B, T suffixes): a whole number of sequences.
    #[arg(long, value_name = "TOKENS")]
    pub global_batch_tokens: Option<String>,
    /// Accept a batch of more than 100M tokens per iteration.
    #[arg(long)]
    pub huge_batch: bool,
}

impl BatchArgs {
    /// The global batch in sequences of `model` (a note when defaulted); over 100M tokens is
    /// refused.
    pub fn sequences(&self, model: &Model) -> Result<u64> {
        let tokens = self.global_batch_tokens.as_deref();
        let (g, n) = batch::global_batch(model, tokens, self.global_batch, self.huge_batch)?;
        n.into_iter().for_each(note);
        Ok(g)
    }
}

/// The training-length flags of `plan` and `estimate`.
#[derive(Args, Debug, Clone)]
pub struct TrainArgs {
    /// Tokens to train on, e.g. 1T: prints the days, GPU-hours and, with --price, the cost.
    #[arg(long, value_name = "TOKENS")]
    pub train_tokens: Option<String>,
    /// USD per GPU-hour, for the cost of --train-tokens.
    #[arg(long, value_name = "USD")]
    pub price: Option<f64>,
}

impl TrainArgs {
    /// The time to train --train-tokens at prediction `p` on `gpus` GPUs; none without it.
    pub fn time(&self, p: &autopp_planner::Predicted, gpus: u64) -> Result<Option<TimeToTrain>> {
        let t = self.train_tokens.as_deref();
        let f = |t| batch::time_to_train(t, p.tokens_per_s, gpus, self.price);
        Ok(t.map(f).transpose()?)
    }
}

/// `--memory-reserve-gib` in bytes; an error unless it is zero or a positive number.
pub fn reserve_bytes(gib: f64) -> Result<u64> {
    if !(gib.is_finite() && gib >= 0.0) {
        anyhow::bail!("--memory-reserve-gib: must be zero or a positive number of GiB");
    }
    const MAX_GIB: f64 = (autopp_planner::MAX_MEMORY_SETTING_BYTES >> 30) as f64;
    if gib > MAX_GIB {
        anyhow::bail!("--memory-reserve-gib: more than any GPU holds; give at most {MAX_GIB} GiB");
    }
    Ok((gib * (1u64 << 30) as f64) as u64)
}

pub use autopp_planner::files::write_atomic;

/// A progress bar on stderr, shown only on a terminal and only once the work has run for a
/// second; cleared when dropped.
pub struct Progress {
    started: std::time::Instant,
    bar: std::sync::OnceLock<indicatif::ProgressBar>,
    show: bool,
    message: &'static str,
}

impl Progress {
    /// A bar counting `message` (e.g. "configurations").
    pub fn new(message: &'static str) -> Self {
        use std::io::IsTerminal;
        Progress {
            started: std::time::Instant::now(),
            bar: std::sync::OnceLock::new(),
            show: std::io::stderr().is_terminal(),
            message,
        }
    }

    /// `done` of `total` finished.
    pub fn update(&self, done: usize, total: usize) {
        if self.show && self.started.elapsed().as_secs_f64() > 1.0 {
            let b = self.bar.get_or_init(|| {
                let b = indicatif::ProgressBar::new(total as u64);
                b.set_message(self.message);
                b
            });
            b.set_position(done as u64);
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = self.bar.get() {
            b.finish_and_clear();
        }
    }
}

/// One line for an error: the error and its causes, joined, with the flag named where the
/// library's error names an input field.
pub fn error_line(e: &anyhow::Error) -> String {
    let parts: Vec<String> = e
        .chain()
        .map(|c| match field_of(c) {
            Some(field) => format!("{}: {c}", field.flag()),
            None => c.to_string(),
        })
        .collect();
    parts.join(": ").replace('\n', " ")
}

/// The schedule or split input a library error is about, if it is one of those (directly, or
/// wrapped by the planner or the executor).
fn field_of(e: &(dyn std::error::Error + 'static)) -> Option<SpecField> {
    if let Some(s) = e.downcast_ref::<SplitError>() {
        return Some(s.field());
    }
    if let Some(s) = e.downcast_ref::<ScheduleError>() {
        return Some(s.field());
    }
    match e.downcast_ref::<PlanError>() {
        Some(PlanError::Split(s)) => return Some(s.field()),
        Some(PlanError::ScheduleSpec(s)) => return Some(s.field()),
        _ => {}
    }
    match e.downcast_ref::<ExecError>() {
        Some(ExecError::Split(s)) => Some(s.field()),
        Some(ExecError::ScheduleSpec(s)) => Some(s.field()),
        _ => None,
    }
}
