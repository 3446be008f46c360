//! `autopp exec`: train a small model for real with a pipeline schedule, one thread per rank,
//! and report losses, step times, bubble and peak activation memory next to the simulator's
//! prediction; `--check` compares with single-worker training.

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use autopp_executor::{
    check, run, scale, trace, Backend, ExecConfig, ExecReport, InjectedFailure, StepSummary,
};
use autopp_models::Model;
use autopp_planner::PlanFile;
use autopp_schedule::{PipelinePlan, ScheduleKind, ScheduleSpec};
use clap::Args;

use super::common::{load_model_at, write_atomic};

/// Train a small model (such as tiny-gpt) on the CPU with a pipeline schedule: one thread per
/// rank, real activations and gradients between them, AdamW; report losses, step times, the
/// measured bubble and peak activation memory per rank next to the simulator's prediction.
/// The global batch is microbatches × mbs × dp sequences of synthetic, learnable data. With
/// --backend cuda (a build with `--features cuda`) the GEMMs run on NVIDIA GPUs.
///
/// Example: autopp exec tiny-gpt --pp 2 --microbatches 8 --mbs 2 --schedule 1f1b --check
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// A preset name (see `autopp models`) or a path to a model.json.
    #[arg(required_unless_present = "plan")]
    pub model: Option<String>,
    /// A plan file from `autopp plan --out`: runs its model, tensor-parallel degree, pipeline
    /// ranks, data-parallel degree, stages per rank, micro-batching, schedule and split
    /// (and its sequence parallelism; context parallelism is refused, recompute is not applied).
    #[arg(long, value_name = "FILE", conflicts_with_all = [
        "model", "pp", "dp", "tp", "virtual_stages", "microbatches", "mbs", "schedule", "group_size",
        "split", "sequence_parallel",
    ])]
    pub plan: Option<String>,
    /// With --plan: run the plan's degrees, schedule, micro-batching and split shape on a
    /// small model of exec's subset (fewer, narrower layers; sequences of --seq-len tokens,
    /// 16 unless given), for plans of models too large for this machine. The output says what
    /// was scaled.
    #[arg(long, requires = "plan")]
    pub scale_down: bool,
    /// Pipeline ranks.
    #[arg(long, value_name = "P", required_unless_present = "plan")]
    pub pp: Option<usize>,
    /// Data-parallel replicas of the pipeline [default: 1].
    #[arg(long, value_name = "D")]
    pub dp: Option<usize>,
    /// Tensor-parallel ranks per pipeline rank, Megatron-style (heads, FFN columns and the
    /// vocabulary split over them; threads or MPI) [default: 1]. Must divide the heads, the FFN
    /// width and the vocabulary. World rank = (replica · pp + pipeline rank) · tp + tp rank.
    #[arg(long, value_name = "T")]
    pub tp: Option<usize>,
    /// Megatron's sequence parallelism within the tensor-parallel group: between the
    /// tensor-parallel regions each rank holds 1/T of every sequence (norms and residuals run
    /// on it), all-gathers and reduce-scatters replace the all-reduces. The sequence length
    /// must be divisible by --tp.
    #[arg(long)]
    pub sequence_parallel: bool,
    /// Stages per rank (interleaved and V schedules) [default: 2 for zb-v and dualpipe-v, 1
    /// otherwise].
    #[arg(long = "virtual", value_name = "V")]
    pub virtual_stages: Option<usize>,
    /// Micro-batches per step per replica.
    #[arg(long, value_name = "M", required_unless_present = "plan")]
    pub microbatches: Option<usize>,
    /// Sequences per micro-batch.
    #[arg(long, value_name = "B", required_unless_present = "plan")]
    pub mbs: Option<usize>,
    /// Schedule: gpipe, 1f1b, interleaved-1f1b, looped-bfs.
    #[arg(long, value_name = "KIND", required_unless_present = "plan")]
    pub schedule: Option<ScheduleKind>,
    /// Micro-batch group size of interleaved-1f1b [default: pp].
    #[arg(long, value_name = "G")]
    pub group_size: Option<usize>,
    /// Layer-list entries per stage, comma-separated, in stage order (the embedding and the
    /// head count as one each) [default: even].
    #[arg(long, value_delimiter = ',', value_name = "N,N,…")]
    pub split: Option<Vec<usize>>,
    /// Run at this sequence length instead of the model's.
    #[arg(long, value_name = "S")]
    pub seq_len: Option<u64>,
    /// Training steps.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub steps: usize,
    /// Seed of the initial weights and the synthetic data.
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub seed: u64,
    /// Seconds a rank waits for a tensor from another rank before it fails, naming the peer.
    /// When a rank fails, the others stop at once instead.
    #[arg(long, default_value_t = 60.0, value_name = "S")]
    pub recv_timeout: f64,
    /// Make world rank RANK fail on purpose in step STEP (1-based), at the middle action of its
    /// list — with an error, or with a panic given `:panic` — to test failure handling: every
    /// rank stops, the command exits 2 naming the rank and its action, and writes no files.
    /// Given `:kill` (--transport mpi only), the rank's process dies at once instead, as if
    /// killed (SIGKILL), printing nothing: mpirun ends the other processes, names the dead rank
    /// and exits non-zero.
    #[arg(long, value_name = "RANK:STEP[:panic|:kill]")]
    pub inject_failure: Option<InjectedFailure>,
    /// AdamW learning rate.
    #[arg(long, default_value_t = 3e-3, value_name = "LR")]
    pub lr: f64,
    /// Also train on one worker with the whole batch at once and compare losses and weights
    /// (fails unless max_rel_err <= 1e-5).
    #[arg(long)]
    pub check: bool,
    /// Write a Chrome trace (opens in Perfetto) of every action on every rank to FILE.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<String>,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// How ranks run and talk: threads of this process with in-process channels; one process
    /// per rank under `mpirun -np <pp × dp>` (needs a build with `--features mpi`; rank 0
    /// prints the report); or threads with one GPU each, tensors moving between GPUs over NCCL
    /// (needs `--backend cuda` and pp × dp GPUs).
    #[arg(long, value_enum, default_value_t = TransportKind::Threads)]
    pub transport: TransportKind,
    /// Where the GEMMs run: this machine's CPU, or NVIDIA GPUs through cuBLAS (rank r on GPU
    /// r mod GPUs; needs a build with `--features cuda`). Everything else — norms, softmax,
    /// the loss, AdamW — runs on the CPU either way, and --check compares with CPU training.
    #[arg(long, value_enum, default_value_t = BackendKind::Cpu)]
    pub backend: BackendKind,
}

/// Where the GEMMs of `exec` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BackendKind {
    /// faer on the CPU, one thread per rank.
    Cpu,
    /// cuBLAS on NVIDIA GPUs through CUDA.
    Cuda,
}

/// Refuses what this build or machine cannot run, in one line; with `--backend cuda`, the
/// name of GPU 0.
#[cfg(feature = "cuda")]
fn check_backend(args: &ExecArgs) -> Result<Option<String>> {
    use autopp_profiler::device::cuda;
    if args.transport == TransportKind::Nccl {
        if args.backend != BackendKind::Cuda {
            bail!("--transport nccl: NCCL moves tensors between GPUs; add --backend cuda");
        }
        // before the first CUDA call, while this is the only thread
        cuda::prefer_eager_module_loading();
    }
    if args.backend == BackendKind::Cuda {
        return match cuda::device_name(0) {
            Err(e) => bail!("--backend cuda: {e}; use --backend cpu"),
            Ok(name) => Ok(Some(name)),
        };
    }
    Ok(None)
}

#[cfg(not(feature = "cuda"))]
fn check_backend(args: &ExecArgs) -> Result<Option<String>> {
    if args.backend == BackendKind::Cuda {
        bail!(
            "--backend cuda: this autopp was built without CUDA; build it with `cargo build --release --features cuda`"
        );
    }
    if args.transport == TransportKind::Nccl {
        bail!(
            "--transport nccl: this autopp was built without CUDA; build it with `cargo build --release --features cuda` and add --backend cuda"
        );
    }
    Ok(None)
}

/// How the ranks of `exec` run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    /// One thread per rank, channels between them.
    Threads,
    /// One process per rank (MPI): pipeline neighbours send point-to-point, data-parallel
    /// groups all-reduce in their own communicators.
    Mpi,
    /// One thread per rank, each on its own GPU: NCCL between GPUs (needs --backend cuda).
    Nccl,
}

/// Runs `cfg` over NCCL, one GPU per rank.
#[cfg(feature = "cuda")]
fn run_nccl(cfg: &ExecConfig, on_step: &mut dyn FnMut(StepSummary)) -> Result<ExecReport> {
    Ok(autopp_executor::run_nccl(cfg, on_step)?)
}

#[cfg(not(feature = "cuda"))]
fn run_nccl(_cfg: &ExecConfig, _on_step: &mut dyn FnMut(StepSummary)) -> Result<ExecReport> {
    bail!("--transport nccl: this autopp was built without CUDA")
}

/// The executor's backend for the flag.
fn backend(kind: BackendKind) -> Backend {
    match kind {
        BackendKind::Cpu => Backend::Cpu,
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => Backend::Cuda,
        // refused by `check_backend` in a build without CUDA
        #[cfg(not(feature = "cuda"))]
        BackendKind::Cuda => Backend::Cpu,
    }
}

/// Runs this process's rank under MPI; `None` on ranks other than 0. On a failure it prints
/// the error and ends the whole job (`MPI_Abort`, exit 2), so no rank waits for a dead one.
#[cfg(feature = "mpi")]
fn run_mpi(cfg: &ExecConfig, on_step: &mut dyn FnMut(StepSummary)) -> Result<Option<ExecReport>> {
    use autopp_profiler::device::mpi::Mpi;
    let mut mpi = Mpi::init(
        cfg.pp(),
        cfg.tp,
        std::time::Duration::from_secs_f64(cfg.recv_timeout_s),
        cfg.pipeline_messages_per_step(),
        cfg.pipeline_message_bytes(),
    )?;
    // a panic is reported as the rank's error line
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = autopp_executor::run_rank(cfg, &mut mpi, on_step);
    std::panic::set_hook(hook);
    match r {
        Ok(r) => Ok(r),
        Err(e) => {
            super::common::print_stderr_line(&format!("error: {e}"));
            mpi.abort(2)
        }
    }
}

#[cfg(not(feature = "mpi"))]
fn run_mpi(_cfg: &ExecConfig, _on_step: &mut dyn FnMut(StepSummary)) -> Result<Option<ExecReport>> {
    bail!(
        "--transport mpi: this autopp was built without MPI; build it with `cargo build --release --features mpi` (needs libopenmpi-dev, openmpi-bin and libclang-dev) and run it under `mpirun -np <pp × dp>`"
    )
}

/// The configuration the flags or the plan file describe.
fn config(args: &ExecArgs) -> Result<ExecConfig> {
    let (model, pipeline, tp, sp) = match &args.plan {
        Some(path) => {
            let (model, pipeline, tp, sp, note) = PlanFile::load(path)?.exec_parts()?;
            if let (Some(note), false) = (note, args.json) {
                super::common::note(note);
            }
            let model: Model = match (args.seq_len, args.scale_down) {
                (Some(s), false) => model.with_seq_length(s).context("--seq-len")?,
                _ => model,
            };
            (model, pipeline, tp, sp)
        }
        None => {
            let (model, pipeline) = from_flags(args)?;
            let tp = args.tp.unwrap_or(1);
            (model, pipeline, tp, args.sequence_parallel)
        }
    };
    let (model, pipeline) = match (&model, args.scale_down) {
        (Model::Transformer(spec), true) => {
            let s = scale::scale_down(spec, &pipeline, tp, args.seq_len.unwrap_or(16))?;
            // on stderr, also with --json: what ran is not the plan's model
            super::common::print_stderr_line(&format!("note: {}", s.note));
            (Model::Transformer(s.model), s.pipeline)
        }
        (_, true) => bail!("--scale-down: the plan's model is a layer list, which exec cannot run; scale down transformers only"),
        (_, false) => (model, pipeline),
    };
    let mut cfg = ExecConfig::from_plan(&model, &pipeline)?;
    cfg.tp = tp;
    cfg.sequence_parallel = sp && tp > 1;
    cfg.steps = args.steps;
    cfg.seed = args.seed;
    if !(args.lr > 0.0 && args.lr.is_finite()) {
        bail!("--lr must be a positive number (got {})", args.lr);
    }
    cfg.optimizer.lr = args.lr;
    cfg.recv_timeout_s = args.recv_timeout;
    cfg.inject_failure = args.inject_failure;
    cfg.validate()?;
    Ok(cfg)
}

/// The model and pipeline the flags describe.
fn from_flags(args: &ExecArgs) -> Result<(Model, PipelinePlan)> {
    let (Some(name), Some(pp), Some(m), Some(mbs), Some(kind)) = (
        &args.model,
        args.pp,
        args.microbatches,
        args.mbs,
        args.schedule,
    ) else {
        bail!("give MODEL, --pp, --microbatches, --mbs and --schedule, or --plan FILE");
    };
    let pipeline = PipelinePlan {
        spec: ScheduleSpec {
            kind,
            pp,
            virtual_stages: args.virtual_stages.unwrap_or(kind.default_virtual_stages()),
            num_microbatches: m,
            group_size: args.group_size,
        },
        dp: args.dp.unwrap_or(1),
        micro_batch_size: mbs,
        split: args.split.clone(),
    };
    Ok((load_model_at(name, args.seq_len)?.0, pipeline))
}

/// Runs `autopp exec`.
pub fn run_exec(args: &ExecArgs) -> Result<()> {
    let gpu = check_backend(args)?;
    let mut cfg = config(args)?;
    cfg.backend = backend(args.backend);
    autopp_executor::run::quiet_rank_panics();
    let Some((report, lines)) = train(args, &cfg)? else {
        return Ok(()); // not rank 0: rank 0 reports
    };
    let checked = if args.check {
        let reference = check::train_single_worker(&cfg)?;
        Some(check::compare(
            &report,
            &reference,
            check::DEFAULT_TOLERANCE,
        ))
    } else {
        None
    };
    if let Some(path) = &args.trace {
        let text = serde_json::to_string(&trace::chrome_trace(&report))?;
        write_atomic(path, text.as_bytes()).context("--trace")?;
    }
    if args.json {
        let out = report.to_json(&cfg, checked.as_ref(), gpu.as_deref());
        println!("{}", serde_json::to_string(&out)?);
    } else {
        let transport = match args.transport {
            TransportKind::Threads => "threads",
            TransportKind::Mpi => "MPI processes",
            TransportKind::Nccl => "threads, NCCL between GPUs",
        };
        let c = checked.as_ref();
        print!(
            "{}",
            report.to_text(&cfg, &lines, c, transport, gpu.as_deref())
        );
        if let Some(path) = &args.trace {
            println!("wrote Chrome trace to {path}");
        }
    }
    if let Some(c) = checked.filter(|c| !c.passed) {
        bail!(
            "--check failed: max_rel_err {:.3e} > {:.0e} at {}",
            c.max_rel_err,
            c.tolerance,
            c.worst
        );
    }
    Ok(())
}

/// Trains `cfg` over the transport `args` name, with a progress bar on a terminal: the report
/// and the steps' summaries, or `None` on an MPI rank other than 0 (rank 0 reports).
fn train(args: &ExecArgs, cfg: &ExecConfig) -> Result<Option<(ExecReport, Vec<StepSummary>)>> {
    let bar = (std::io::stderr().is_terminal() && !args.json).then(|| {
        let b = indicatif::ProgressBar::new(cfg.steps as u64);
        b.set_message("steps");
        b
    });
    let mut lines: Vec<StepSummary> = Vec::new();
    let mut on_step = |s: StepSummary| {
        if let Some(b) = &bar {
            b.set_message(format!("loss {:.4}", s.loss));
            b.inc(1);
        }
        lines.push(s);
    };
    let report = match args.transport {
        TransportKind::Threads => run(cfg, &mut on_step)?,
        TransportKind::Mpi => match run_mpi(cfg, &mut on_step)? {
            Some(r) => r,
            None => return Ok(None),
        },
        TransportKind::Nccl => run_nccl(cfg, &mut on_step)?,
    };
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    Ok(Some((report, lines)))
}
