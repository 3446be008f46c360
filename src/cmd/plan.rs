//! `autopp plan`: the best plan, why, and the alternatives.

use anyhow::{bail, Result};
use autopp_hardware::{AnalyticProfile, Cluster, Precision};
use autopp_models::Model;
use autopp_planner::calibration::calibrated;
use autopp_planner::report::{self, Margin};
use autopp_planner::search::{self, SearchOptions};
use autopp_planner::{batch, requested};
use autopp_planner::{cost_profile, Framework, PlanFile, Stack};
use autopp_schedule::ScheduleKind;
use clap::Args;

use super::common::{load_model_at, reserve_bytes, write_atomic, BatchArgs, ClusterArgs};
use super::common::{Progress, TrainArgs};

/// Find the fastest plan that fits: degrees, schedule, micro-batching, recompute, sharding and
/// the layer split, searched jointly, with the reasons and the runner-ups.
///
/// Example: autopp plan gpt3-175b --gpus 1024 --gpu a100-80g --global-batch 1536
#[derive(Args, Debug, Clone)]
pub struct PlanArgs {
    /// A preset name (see `autopp models`) or a path to a model.json, a Hugging Face
    /// config.json or a layer list.
    pub model: String,
    /// Number of GPUs [default with --cluster: all of the cluster's].
    #[arg(long, value_name = "N")]
    pub gpus: Option<u64>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub batch: BatchArgs,
    #[command(flatten)]
    pub train: TrainArgs,
    /// Sequence length in tokens [default: the model's, at most 8192].
    #[arg(long, value_name = "S")]
    pub seq_len: Option<u64>,
    /// Schedules to consider, comma-separated [default: all: gpipe, 1f1b, interleaved-1f1b,
    /// looped-bfs, zb-h1, zb-h2, zb-v, dualpipe-v, interleaved-zb].
    #[arg(long, value_delimiter = ',', value_name = "A,B,…")]
    pub schedules: Option<Vec<ScheduleKind>>,
    /// Largest tensor-parallel degree [default: GPUs per node].
    #[arg(long, value_name = "T")]
    pub max_tp: Option<u64>,
    /// Largest micro-batch size to try.
    #[arg(long, default_value_t = search::DEFAULT_MAX_MICRO_BATCH_SIZE, value_name = "B")]
    pub max_mbs: u64,
    /// Largest number of stages per rank to try for interleaved schedules.
    #[arg(long, default_value_t = search::DEFAULT_MAX_VIRTUAL_STAGES, value_name = "V")]
    pub max_virtual: u64,
    /// Pin fields: KEY=VALUE pairs, comma-separated; keys tp, pp, dp, cp, virtual_stages,
    /// micro_batch_size, schedule, recompute, zero_stage, sequence_parallel, ep, etp.
    #[arg(long, value_name = "KEY=VALUE,…")]
    pub fix: Option<String>,
    /// Load of the busiest expert rank over the balanced share (1.0: forced balance).
    #[arg(long, default_value_t = 1.0, value_name = "X")]
    pub moe_imbalance: f64,
    /// Alternatives to list.
    #[arg(long, default_value_t = search::DEFAULT_TOP_K, value_name = "K")]
    pub top: usize,
    /// Math precision: bf16, fp16, or FP8 for the linear layers: fp8 (delayed scaling), fp8-tensorwise, fp8-rowwise, mxfp8 (Blackwell).
    #[arg(long, default_value = "bf16", value_name = "P")]
    pub precision: Precision,
    /// Memory kept free per GPU for the CUDA context, NCCL and fragmentation, GiB.
    #[arg(long, default_value_t = 1.0, value_name = "R")]
    pub memory_reserve_gib: f64,
    /// Model the attention core without a fused (FlashAttention) kernel.
    #[arg(long)]
    pub no_flash_attention: bool,
    /// Memory kept free below the GPU's limit, beyond the predicted peak: GiB (`4`, `4GiB`) or
    /// a share of the GPU's memory (`8%`) [default: the memory band of the GPU kind, from
    /// docs/validation.md; the widest band for kinds without rows].
    #[arg(long, value_name = "GIB|N%")]
    pub memory_margin: Option<String>,
    /// Plans within this many percent of the fastest count as equally fast; the simplest of
    /// them wins (fewer stages per rank, plain 1F1B, an even layer split, fewer pipeline ranks,
    /// smaller tp, then memory headroom: peak under 90% of the GPU's).
    #[arg(long, default_value_t = 1.0, value_name = "PCT")]
    pub tolerance: f64,
    /// Only Megatron's default even layer split (no uneven stage layouts).
    #[arg(long)]
    pub even_split: bool,
    /// The framework that will run the plan: megatron (1f1b and interleaved 1F1B, ZeRO ≤ 1,
    /// recompute of the first N layers of every stage), torchtitan (its schedules, FSDP2,
    /// uniform activation checkpointing), deepspeed (1F1B, ZeRO ≤ 1, even layers), any (the
    /// best plan that one of them runs: each searched with its own runtime, the answers ranked
    /// together and each marked with the frameworks that run it), or any-mix (everything autopp
    /// models, features of different frameworks mixed, e.g. a different recompute count per
    /// rank, ZeRO 2 with tp and sequence parallelism: plans no framework may run). See
    /// docs/frameworks.md. A version where behaviour changed names its runtime: megatron is
    /// megatron-core (overlapped gradient reduce and parameter gather), megatron-core-ep-overlap (also
    /// the MoE all-to-alls), megatron-lm-2021, nemo (also tensor-parallel overlap); any: every overlap on.
    #[arg(long, default_value = "any", value_name = "NAME")]
    pub framework: Stack,
    /// A measured profile from `autopp profile`: its per-layer F / I / W times replace the
    /// analytic profile's (scaled to each layer's shape); collectives and sends stay analytic.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<String>,
    /// Print one JSON object: plan, predicted, search, alternatives, batch (with seq_len_source),
    /// calibration (null: the shipped knobs) and time_to_train (null without --train-tokens).
    #[arg(long)]
    pub json: bool,
    /// Write the plan file (plan, prediction, model, cluster) here; `estimate --plan` and
    /// `schedule --plan` read it. With --emit: a directory for plan.json and the launch files.
    #[arg(long, value_name = "FILE")]
    pub out: Option<String>,
    /// Also write the launch files for this framework (megatron, torchtitan, deepspeed) into
    /// the --out directory; the search is made for it unless --framework names another.
    #[arg(long, value_name = "FRAMEWORK", requires = "out")]
    pub emit: Option<Framework>,
}

impl PlanArgs {
    /// What to search: the framework's defaults with these flags' limits, pins and settings.
    fn options(&self, model: &Model, cluster: &Cluster) -> Result<SearchOptions> {
        let global_batch_size = self.batch.sequences(model)?;
        requested::check_batch(global_batch_size, cluster.num_gpus())?;
        let memory_reserve_bytes = reserve_bytes(self.memory_reserve_gib)?;
        for (flag, v) in [
            ("--max-mbs", self.max_mbs),
            ("--max-virtual", self.max_virtual),
        ] {
            if v == 0 {
                bail!("{flag}: must be at least 1");
            }
        }
        let framework = self.framework.family();
        let mut opts = SearchOptions::new(framework, global_batch_size, cluster.gpus_per_node);
        opts.limits.schedules = framework.schedules_to_search(self.schedules.as_deref())?;
        opts.fixed = requested::pins(self.fix.as_deref(), framework, model, cluster)?;
        if let Some(max_tp) = self.max_tp {
            opts.limits.max_tp = max_tp;
        }
        opts.limits.max_micro_batch_size = self.max_mbs;
        opts.limits.max_virtual_stages = self.max_virtual;
        opts.top_k = self.top;
        if !(self.tolerance.is_finite() && (0.0..100.0).contains(&self.tolerance)) {
            bail!("--tolerance: must be a percentage from 0 to below 100, e.g. 1");
        }
        opts.tolerance = self.tolerance / 100.0;
        opts.settings.runtime = self.framework.runtime();
        opts.settings.precision = self.precision;
        opts.settings.memory_reserve_bytes = memory_reserve_bytes;
        opts.settings.memory_margin_bytes = self.margin(cluster)?.mem_bytes;
        opts.settings.flash_attention = !self.no_flash_attention;
        opts.even_split_only |= self.even_split;
        opts.moe_imbalance = autopp_planner::experts::check_imbalance(self.moe_imbalance)?;
        Ok(opts)
    }
}

impl PlanArgs {
    /// The memory margin a plan must keep, and where it comes from.
    fn margin(&self, cluster: &Cluster) -> Result<Margin> {
        Margin::new(
            self.memory_margin.as_deref(),
            &cluster.gpu.name,
            cluster.gpu.memory_bytes,
        )
        .map_err(|e| anyhow::anyhow!("--memory-margin: {e}"))
    }
}

/// Runs `autopp plan`.
pub fn run(args: &PlanArgs) -> Result<()> {
    let args = &PlanArgs {
        framework: super::launch::plan_framework(args.framework, args.emit),
        ..args.clone()
    };
    let (model, seq) = load_model_at(&args.model, args.seq_len)?;
    // a model the framework cannot run is refused before the search, not after it
    autopp_planner::launch::check_model(&model, args.precision, args.framework.family())?;
    if let Some(f) = args.emit {
        autopp_planner::launch::check_emittable(&model, f)?;
    }
    let cluster = args.cluster.build(args.gpus)?;
    let opts = args.options(&model, &cluster)?;
    let profile = cost_profile(
        cluster.clone(),
        args.precision,
        args.profile.as_deref(),
        &model,
    )?;
    let (profile, cal) = calibrated(profile, args.cluster.calibration.as_deref())?;
    let runnable = args.framework == Stack::Any;
    let plans = search_with_progress(&model, &profile, &opts, runnable)?;
    let (best, config) = (&plans.result.best, plans.answers[0].config.clone());
    if let Some(path) = &args.out {
        let file = PlanFile::new(best, &model, &cluster, &config)?
            .with_framework(args.framework.family())
            .with_runs_on();
        match args.emit {
            Some(f) => super::launch::write_plan_and_launch(&file, f, path)?,
            None => write_atomic(path, serde_json::to_string_pretty(&file)?.as_bytes())?,
        }
    }
    let train = args.train.time(&best.result.predicted, config.num_gpus())?;
    if args.json {
        let inputs = report::Inputs {
            global_batch: opts.global_batch_size,
            seq_len: model.seq_length(),
            seq_len_source: seq,
            calibration: cal.as_ref(),
            train: train.as_ref(),
        };
        let json = report::plan_json(&plans, &opts, &inputs);
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let margin = args.margin(&cluster)?;
    let text = report::plan_text(&model, seq, &profile, &config, &plans, &margin);
    let train = train.as_ref().map(batch::train_line);
    print!("{text}{}", train.unwrap_or_default());
    if let Some(path) = &args.out {
        println!("\nplan written to {path}");
    }
    Ok(())
}

/// The search, with a progress bar on a terminal once it has run for a second.
fn search_with_progress(
    model: &Model,
    profile: &AnalyticProfile,
    opts: &SearchOptions,
    runnable: bool,
) -> Result<search::Plans> {
    let bar = Progress::new("configurations");
    Ok(search::plans(model, profile, opts, runnable, &|d, t| {
        bar.update(d, t)
    })?)
}
