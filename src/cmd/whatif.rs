//! `autopp whatif`: the planner over a grid of clusters, with time and cost to train.

use anyhow::{Context, Result};
use autopp_hardware::Precision;
use autopp_planner::calibration::CalibrationFile;
use autopp_planner::runtime::Stack;
use autopp_planner::whatif::{self, BatchPolicy, Prices, Sweep};
use clap::Args;

use super::common::{load_model_at, write_atomic, BatchArgs, Progress};

/// Sweep clusters: the best plan at every GPU count × GPU kind × network, with tokens/s, MFU,
/// scaling efficiency, time, GPU-hours and cost to train a token budget, and what binds.
#[derive(Args, Debug)]
pub struct WhatifArgs {
    /// A preset name (see `autopp models`) or a path to a model.json or Hugging Face config.
    pub model: String,
    /// GPU counts: a list (64,128,256) or a doubling range (64..4096).
    #[arg(long, value_name = "N,…|A..B")]
    pub gpus: String,
    /// GPU kinds to sweep (see `autopp gpus`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "h100-sxm",
        value_name = "KIND,…"
    )]
    pub gpu: Vec<String>,
    /// NIC bandwidths per GPU to sweep, Gbit/s [default: each kind's usual NIC].
    #[arg(long, value_delimiter = ',', value_name = "X,…")]
    pub nic_gbps: Option<Vec<f64>>,
    /// GPUs per node (NVLink domain sizes) to sweep [default: each kind's NVLink domain].
    #[arg(long, value_delimiter = ',', value_name = "K,…")]
    pub gpus_per_node: Option<Vec<u64>>,
    /// cluster.json files (GPU, NVLink domain, NIC, latencies) to sweep instead of --gpu,
    /// --nic-gbps and --gpus-per-node.
    #[arg(long, value_delimiter = ',', value_name = "FILE,…", conflicts_with_all = ["nic_gbps"])]
    pub cluster: Option<Vec<String>>,
    // a fixed global batch at every point: --global-batch or --global-batch-tokens, as plan's
    #[command(flatten)]
    pub batch: BatchArgs,
    /// A batch that grows with the cluster: tokens per GPU per iteration.
    #[arg(long, value_name = "TOKENS", conflicts_with_all = ["global_batch", "global_batch_tokens"])]
    pub batch_per_gpu: Option<String>,
    /// Sequence length in tokens [default: the model's, at most 8192].
    #[arg(long, value_name = "S")]
    pub seq_len: Option<u64>,
    /// Token budget to train (15T, 300B, …): adds days, GPU-hours and cost.
    #[arg(long, value_name = "TOKENS", visible_alias = "train-tokens")]
    pub tokens: Option<String>,
    /// A price file: {"usd_per_gpu_hour": {"h100-sxm": 2.5}} [default with --tokens: the
    /// example table shipped in planner/data/example-prices.json, clearly an example].
    #[arg(long, value_name = "FILE", conflicts_with = "price")]
    pub prices: Option<String>,
    /// Prices on the command line: KIND=USD_PER_GPU_HOUR,…
    #[arg(long, value_name = "KIND=USD,…")]
    pub price: Option<String>,
    /// The framework whose space and runtime every point uses, as plan's: any (the best plan
    /// one framework runs; the runs-on column says which), any-mix, megatron, torchtitan, ….
    #[arg(long, default_value = "any", value_name = "NAME")]
    pub framework: Stack,
    /// Math precision: bf16, fp16, or FP8 for the linear layers: fp8 (delayed scaling), fp8-tensorwise, fp8-rowwise, mxfp8 (Blackwell).
    #[arg(long, default_value = "bf16", value_name = "P")]
    pub precision: Precision,
    /// A directory for rows.json, rows.csv, table.txt and the pictures (SVG and PNG).
    #[arg(long, value_name = "DIR")]
    pub out: Option<String>,
    /// A calibration file from `autopp calibrate` to use instead of the shipped knobs.
    #[arg(long, value_name = "FILE")]
    pub calibration: Option<String>,
    /// Print the rows as JSON.
    #[arg(long, conflicts_with = "csv")]
    pub json: bool,
    /// Print the rows as CSV.
    #[arg(long)]
    pub csv: bool,
}

/// Runs `autopp whatif`.
pub fn run(args: &WhatifArgs) -> Result<()> {
    let (model, _) = load_model_at(&args.model, args.seq_len)?;
    let counts = whatif::parse_gpu_counts(&args.gpus)?;
    let batch = match &args.batch_per_gpu {
        Some(t) => BatchPolicy::TokensPerGpu {
            tokens: whatif::parse_tokens(t, "--batch-per-gpu")?.round() as u64,
        },
        None => BatchPolicy::Fixed {
            sequences: args.batch.sequences(&model)?,
        },
    };
    let calibration = args.calibration.as_deref().map(CalibrationFile::load);
    let sweep = Sweep {
        framework: args.framework,
        precision: args.precision,
        batch,
        train_tokens: args
            .tokens
            .as_deref()
            .map(|t| whatif::parse_tokens(t, "--tokens"))
            .transpose()?,
        prices: Prices::choose(
            args.prices.as_deref(),
            args.price.as_deref(),
            args.tokens.is_some(),
        )?,
        calibration: calibration.transpose()?,
    };
    let templates = match &args.cluster {
        Some(files) => whatif::cluster_files(files)?,
        None => whatif::machines(
            &args.gpu,
            args.gpus_per_node.as_deref(),
            args.nic_gbps.as_deref(),
        )?,
    };
    let points = whatif::points(&templates, &counts);
    let rows = {
        let bar = Progress::new("points");
        whatif::sweep(&model, &points, &sweep, &|d, t| bar.update(d, t))?
    };
    let table = whatif::to_table(&rows);
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir).with_context(|| format!("--out: cannot create '{dir}'"))?;
        let path = |f: &str| format!("{}/{f}", dir.trim_end_matches('/'));
        write_atomic(
            &path("rows.json"),
            serde_json::to_string_pretty(&rows)?.as_bytes(),
        )?;
        write_atomic(&path("rows.csv"), whatif::to_csv(&rows).as_bytes())?;
        write_atomic(&path("table.txt"), table.as_bytes())?;
        for p in whatif::plot::pictures(&rows, model.name())? {
            write_atomic(&path(&format!("{}.svg", p.stem)), p.svg.as_bytes())?;
            write_atomic(&path(&format!("{}.png", p.stem)), &p.png)?;
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else if args.csv {
        print!("{}", whatif::to_csv(&rows));
    } else {
        let cal = sweep
            .calibration
            .as_ref()
            .map(|c| format!(" · {}", c.label()));
        println!(
            "{} · {} · {}{}",
            model.name(),
            batch.describe(),
            args.framework,
            cal.unwrap_or_default()
        );
        if sweep.train_tokens.is_some() && !sweep.prices.source.is_empty() {
            println!("prices: {}", sweep.prices.source);
        }
        print!("\n{table}");
        if let Some(dir) = &args.out {
            println!("\nwrote rows.json, rows.csv, table.txt and the pictures to {dir}");
        }
    }
    Ok(())
}
