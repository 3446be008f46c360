//! `autopp estimate`: time and memory of one full configuration.

use anyhow::{bail, Result};
use autopp_hardware::Precision;
use autopp_models::{Model, Recompute, SeqLenSource};

use autopp_planner::calibration::calibrated;
use autopp_planner::report::{self, estimate_text};
use autopp_planner::requested::{self, Given, Requested};
use autopp_planner::Stack;
use autopp_planner::{advice, batch};
use autopp_planner::{cost_profile, evaluate, ExpertParallel, ParallelConfig, PlanFile};
use autopp_schedule::ScheduleKind;
use clap::Args;

use super::common::{load_model_at, reserve_bytes, BatchArgs, ClusterArgs, TrainArgs};

/// Predict the iteration time and per-GPU memory of one parallel configuration.
///
/// Example: autopp estimate gpt3-175b --gpus 1024 --tp 8 --pp 16 --mbs 1 --global-batch 1536
/// --gpu a100-80g --recompute full
#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// A preset name (see `autopp models`) or a path to a model.json, a Hugging Face
    /// config.json or a layer list.
    #[arg(required_unless_present = "plan")]
    pub model: Option<String>,
    /// A plan file from `autopp plan --out`: evaluates exactly that plan (model, cluster,
    /// configuration and split); change it with --set, not configuration flags.
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "model", "gpus", "tp", "pp", "dp", "cp", "mbs", "global_batch", "global_batch_tokens", "seq_len", "virtual_stages",
        "schedule", "group_size", "recompute", "sequence_parallel", "zero_stage", "split",
        "precision", "memory_reserve_gib", "no_flash_attention", "gpu", "gpus_per_node",
        "nic_gbps", "cluster", "ep", "etp", "moe_imbalance",
    ])]
    pub plan: Option<String>,
    /// With --plan: change the plan, KEY=VALUE pairs, comma-separated; keys tp, pp, dp, cp, mbs,
    /// ep, etp, v, schedule, recompute, sp, zero, precision, global_batch.
    #[arg(long, value_name = "KEY=VALUE,…")]
    pub set: Option<String>,
    /// Number of GPUs [default with --cluster: all of the cluster's].
    #[arg(long, value_name = "N")]
    pub gpus: Option<u64>,
    /// Tensor-parallel degree (within a node, normally).
    #[arg(long, default_value_t = 1, value_name = "T")]
    pub tp: u64,
    /// Pipeline-parallel degree: the number of pipeline ranks.
    #[arg(long, default_value_t = 1, value_name = "P")]
    pub pp: u64,
    /// Data-parallel degree [default: GPUs / (tp · pp · cp)].
    #[arg(long, value_name = "D")]
    pub dp: Option<u64>,
    /// Context-parallel degree (the sequence split over GPUs).
    #[arg(long, default_value_t = 1, value_name = "C")]
    pub cp: u64,
    /// Micro-batch size in sequences.
    #[arg(long, default_value_t = 1, value_name = "B")]
    pub mbs: u64,
    /// Expert-parallel degree of a mixture of experts: each GPU holds E/ep routed experts
    /// (ep · etp must divide tp · cp · dp).
    #[arg(long, default_value_t = 1, value_name = "E")]
    pub ep: u64,
    /// Expert-tensor-parallel degree: each routed expert's FFN split over T GPUs.
    #[arg(long, default_value_t = 1, value_name = "T")]
    pub etp: u64,
    /// Load of the busiest expert rank over the balanced share (1.0: forced balance).
    #[arg(long, default_value_t = 1.0, value_name = "X")]
    pub moe_imbalance: f64,
    #[command(flatten)]
    pub batch: BatchArgs,
    #[command(flatten)]
    pub train: TrainArgs,
    /// Sequence length in tokens [default: the model's, at most 8192].
    #[arg(long, value_name = "S")]
    pub seq_len: Option<u64>,
    /// Stages (model chunks) per pipeline rank; more than 1 needs an interleaved or V schedule
    /// [default: 2 for zb-v and dualpipe-v, 1 otherwise].
    #[arg(long = "virtual", value_name = "V")]
    pub virtual_stages: Option<u64>,
    /// Pipeline schedule: gpipe, 1f1b, interleaved-1f1b, looped-bfs, zb-h1, zb-h2, zb-v,
    /// dualpipe-v, interleaved-zb [default: 1f1b, or interleaved-1f1b with --virtual > 1].
    #[arg(long, value_name = "KIND")]
    pub schedule: Option<ScheduleKind>,
    /// Micro-batch group size of interleaved schedules [default: pp].
    #[arg(long, value_name = "G")]
    pub group_size: Option<u64>,
    /// Activation recomputation of transformer layers: none, selective (attention core) or
    /// full (keep only each layer's input) [default: none].
    #[arg(long, value_name = "MODE")]
    pub recompute: Option<Recompute>,
    /// Partial recompute: fully recompute the first N transformer layers of every stage (one
    /// number, capped at each stage's layers: Megatron-LM's `--recompute-method block
    /// --recompute-num-layers N`) or of each stage (one number per stage, in stage order); the
    /// other layers use --recompute.
    #[arg(long, value_delimiter = ',', value_name = "N[,N,…]")]
    pub recompute_num_layers: Option<Vec<u64>>,
    /// Megatron sequence parallelism (needs --tp ≥ 2): on or off [default: on with tp ≥ 2, as
    /// plan chooses].
    #[arg(long, num_args = 0..=1, default_missing_value = "on", value_name = "on|off",
        value_parser = clap::builder::BoolishValueParser::new())]
    pub sequence_parallel: Option<bool>,
    /// ZeRO stage: 0 none, 1 optimizer states (Megatron's distributed optimizer), 2 +
    /// gradients, 3 + weights [default: 1 with more than one replica, as plan chooses].
    #[arg(long = "zero", value_name = "0|1|2|3")]
    pub zero_stage: Option<u8>,
    /// An explicit layer split: layer-list entries per stage, comma-separated, in stage order
    /// (the embedding and the head count as one entry each).
    #[arg(long, value_delimiter = ',', value_name = "N,N,…")]
    pub split: Option<Vec<usize>>,
    /// Math precision: bf16, fp16, or FP8 for the linear layers: fp8 (delayed scaling), fp8-tensorwise, fp8-rowwise, mxfp8 (Blackwell) [default: bf16].
    #[arg(long, value_name = "P")]
    pub precision: Option<Precision>,
    /// Headroom kept free per GPU, GiB, beyond the modelled CUDA context, NCCL, framework
    /// buffers and allocator fragmentation (the "runtime" column).
    #[arg(long, default_value_t = 1.0, value_name = "R")]
    pub memory_reserve_gib: f64,
    /// Model the attention core without a fused (FlashAttention) kernel.
    #[arg(long)]
    pub no_flash_attention: bool,
    /// The software stack that runs it, with its overlaps and memory facts: megatron
    /// (= megatron-core), megatron-core-ep-overlap (MoE all-to-alls hidden), megatron-lm-2021, nemo,
    /// torchtitan, deepspeed, megatron-deepspeed, composer, or any; a named one must run --schedule [default:
    /// megatron-core's runtime, any schedule].
    #[arg(long, value_name = "NAME")]
    pub framework: Option<Stack>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// A measured profile from `autopp profile`: its per-layer F / I / W times replace the
    /// analytic profile's (scaled to each layer's shape); collectives and sends stay analytic.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<String>,
    /// Print one JSON object {"plan", "predicted", "defaults_used", "gap", "fix", "batch",
    /// "calibration", "time_to_train"} instead (as plan --json's).
    #[arg(long)]
    pub json: bool,
    /// Skip the advice: the search for the best plan and the cheapest fix.
    #[arg(long)]
    pub no_advice: bool,
}

impl EstimateArgs {
    /// The configuration these flags describe, for `gpus` GPUs.
    fn config(&self, model: &Model, gpus: u64) -> Result<(ParallelConfig, Vec<String>)> {
        let given = Given {
            sequence_parallel: self.sequence_parallel,
            zero_stage: self.zero_stage,
            recompute: self.recompute,
            precision: self.precision,
            framework: self.framework,
        };
        let requested = Requested {
            tp: self.tp,
            pp: self.pp,
            dp: self.dp,
            cp: self.cp,
            micro_batch_size: self.mbs,
            virtual_stages: self.virtual_stages,
            schedule: self.schedule,
            group_size: self.group_size,
            recompute_layers: self.recompute_num_layers.clone(),
            split: self.split.clone(),
            experts: ExpertParallel {
                ep: self.ep,
                etp: self.etp,
                imbalance: self.moe_imbalance,
            },
            global_batch_size: self.batch.sequences(model)?,
            memory_reserve_bytes: reserve_bytes(self.memory_reserve_gib)?,
            flash_attention: !self.no_flash_attention,
            given,
        };
        Ok(requested.build(gpus)?)
    }
}

/// Runs `autopp estimate`.
pub fn run(args: &EstimateArgs) -> Result<()> {
    let ((model, seq), cluster, (config, used)) = match (&args.plan, &args.model) {
        (Some(path), _) => {
            let file = PlanFile::load(path)?;
            let mut config = file.config()?;
            requested::set(&mut config, args.set.as_deref().unwrap_or_default())?;
            let model = (file.model()?, SeqLenSource::PlanFile);
            (model, file.cluster.clone(), (config, vec![]))
        }
        (None, Some(_)) if args.set.is_some() => bail!(
            "--set: changes a plan file (--plan FILE); without one, use the configuration flags"
        ),
        (None, Some(name)) => {
            let model = load_model_at(name, args.seq_len)?;
            let cluster = args.cluster.build(args.gpus)?;
            let config = args.config(&model.0, cluster.num_gpus())?;
            (model, cluster, config)
        }
        (None, None) => bail!("MODEL: give a model, or --plan FILE"),
    };
    let precision = config.settings.precision;
    let profile = cost_profile(cluster, precision, args.profile.as_deref(), &model)?;
    let (profile, cal) = calibrated(profile, args.cluster.calibration.as_deref())?;
    let estimate = evaluate(&model, &profile, &config)?;
    let advice = (!args.no_advice)
        .then(|| advice::advise(&model, &profile, &config, &estimate))
        .transpose()?;
    let p = &estimate.result.predicted;
    let train = args.train.time(p, config.num_gpus())?;
    if args.json {
        let inputs = report::Inputs {
            global_batch: config.global_batch_size,
            seq_len: model.seq_length(),
            seq_len_source: seq,
            calibration: cal.as_ref(),
            train: train.as_ref(),
        };
        let json = advice::json(&estimate.result, &used, advice.as_ref(), &inputs);
        println!("{}", serde_json::to_string_pretty(&json)?);
    } else {
        let advice = advice.map(|a| report::advice_text(&a, p.iteration_time_s));
        let report = estimate_text(&model, seq, &profile, &config, &estimate);
        let defaults = report::defaults_line(&used);
        let train = train.as_ref().map(batch::train_line).unwrap_or_default();
        print!("{report}{defaults}{train}{}", advice.unwrap_or_default());
    }
    for w in &estimate.warnings {
        super::common::print_stderr_line(&format!("warning: {w}"));
    }
    if let Some(w) = autopp_planner::bands::uncertainty(&profile.cluster.gpu.name).warning {
        super::common::print_stderr_line(&format!("warning: {w}"));
    }
    Ok(())
}
