//! Where a run's GEMMs run ([`Backend`]) and, with the `cuda` feature, the NCCL world
//! (`run_nccl`, with the `cuda` feature).
//!
//! Each rank's thread installs its GEMM engine when it starts and puts the CPU engine back
//! when it ends (`EngineGuard`); everything but the GEMMs stays on the CPU either way (see
//! `autopp_profiler::device::gemm`).

use autopp_profiler::device::{set_thread_engine, set_thread_gemm_threads, Engine};
use serde::Serialize;

use crate::config::ExecConfig;
use crate::error::ExecError;

/// Where the GEMMs of every rank run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `faer` on each rank's thread.
    #[default]
    Cpu,
    /// cuBLAS on GPU `rank mod gpus`, one stream and handle per rank (feature `cuda`).
    #[cfg(feature = "cuda")]
    Cuda,
}

/// GPUs the backend spreads ranks over: 0 for the CPU; for CUDA, the driver's count, or the
/// one-line reason there is none.
pub(crate) fn gpus(backend: Backend) -> Result<usize, ExecError> {
    match backend {
        Backend::Cpu => Ok(0),
        #[cfg(feature = "cuda")]
        Backend::Cuda => {
            let n = autopp_profiler::device::cuda::device_count()
                .map_err(|e| ExecError::invalid("--backend cuda", e.to_string()))?;
            if n == 0 {
                return Err(ExecError::invalid(
                    "--backend cuda",
                    "the CUDA driver loaded but sees no GPU",
                ));
            }
            Ok(n)
        }
    }
}

/// The calling thread's GEMM engine for as long as it lives; dropping it puts the CPU engine
/// back (releasing the GPU's handle and stream on this thread).
pub(crate) struct EngineGuard(());

impl EngineGuard {
    /// Installs `backend`'s engine for world rank `rank` on the calling thread: GPU
    /// `rank mod gpus` for CUDA (`gpus` from [`gpus`]).
    pub(crate) fn install(backend: Backend, rank: usize, gpus: usize) -> Result<Self, String> {
        let engine = match backend {
            Backend::Cpu => Engine::Cpu,
            #[cfg(feature = "cuda")]
            Backend::Cuda => {
                let ordinal = rank % gpus.max(1);
                let g = autopp_profiler::device::cuda_gemm::CudaGemm::new(ordinal)
                    .map_err(|e| format!("cannot start its GEMM engine: {e}"))?;
                Engine::Cuda(Box::new(g))
            }
        };
        let _ = (rank, gpus);
        set_thread_engine(engine);
        Ok(EngineGuard(()))
    }
}

impl EngineGuard {
    /// Lets the calling thread's CPU GEMMs use `threads` threads until the guard drops (see
    /// [`gemm_threads_per_rank`]; the bits do not depend on it).
    pub(crate) fn with_gemm_threads(self, threads: usize) -> Self {
        set_thread_gemm_threads(threads);
        self
    }
}

impl Drop for EngineGuard {
    fn drop(&mut self) {
        // the engine this replaces (a GPU's handle and stream) is dropped here
        let _ = set_thread_engine(Engine::Cpu);
        set_thread_gemm_threads(1);
    }
}

/// Threads each rank's CPU GEMMs may use when `ranks` ranks share this machine: its cores
/// shared out evenly, at least one (so one each when there are as many ranks as cores or
/// more).
pub fn gemm_threads_per_rank(ranks: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / ranks.max(1)).max(1)
}

/// The directed links of `cfg`'s pipelines, in world ranks: for each replica, both directions
/// between the ranks of every two consecutive stages on different ranks.
pub fn pipeline_links(cfg: &ExecConfig) -> Vec<(usize, usize)> {
    let pp = cfg.pp();
    let mut links = Vec::new();
    for replica in 0..cfg.dp {
        for s in 0..cfg.num_stages().saturating_sub(1) {
            let (a, b) = (cfg.schedule.rank_of(s), cfg.schedule.rank_of(s + 1));
            if a != b {
                let (a, b) = (replica * pp + a, replica * pp + b);
                links.push((a, b));
                links.push((b, a));
            }
        }
    }
    links.sort_unstable();
    links.dedup();
    links
}

/// The data-parallel groups of `cfg` (the replicas of each pipeline rank, in replica order),
/// when there is more than one replica.
pub fn data_parallel_groups(cfg: &ExecConfig) -> Vec<Vec<usize>> {
    let pp = cfg.pp();
    if cfg.dp < 2 {
        return Vec::new();
    }
    (0..pp)
        .map(|p| (0..cfg.dp).map(|d| d * pp + p).collect())
        .collect()
}

/// Runs `cfg` like [`crate::run()`] with one thread per rank, each on its own GPU (rank `r` on
/// GPU `r`), tensors moving between GPUs over NCCL
/// ([`NcclTransport`](autopp_profiler::device::nccl::NcclTransport)): one communicator per
/// direction of each pipeline link, one per data-parallel group. Needs `cfg.backend` to be
/// CUDA and at least `pp × dp` GPUs.
#[cfg(feature = "cuda")]
pub fn run_nccl(
    cfg: &ExecConfig,
    on_step: &mut dyn FnMut(crate::run::StepSummary),
) -> Result<crate::run::ExecReport, ExecError> {
    use autopp_profiler::device::cuda::CudaError;
    use autopp_profiler::device::nccl::NcclTransport;
    use autopp_profiler::device::Abort;

    cfg.validate()?;
    if cfg.backend != Backend::Cuda {
        return Err(ExecError::invalid(
            "--transport nccl",
            "NCCL moves tensors between GPUs: add --backend cuda",
        ));
    }
    let abort = Abort::new();
    let timeout = std::time::Duration::from_secs_f64(cfg.recv_timeout_s);
    let endpoints = NcclTransport::world(
        cfg.world_size(),
        &pipeline_links(cfg),
        &data_parallel_groups(cfg),
        timeout,
        &abort,
    )
    .map_err(|e| match e {
        CudaError::TooFewGpus { .. } => ExecError::invalid(
            "--transport nccl",
            format!(
                "{e} (pp × dp = {}); use --transport threads (in-process channels, GEMMs still on the GPUs)",
                cfg.world_size()
            ),
        ),
        e => ExecError::invalid("--transport nccl", e.to_string()),
    })?;
    crate::run::run_world(cfg, endpoints, abort, on_step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopp_schedule::{generate, ScheduleKind, ScheduleSpec};

    fn cfg(kind: ScheduleKind, pp: usize, v: usize, dp: usize) -> ExecConfig {
        let model = autopp_models::load("tiny-gpt")
            .unwrap()
            .with_seq_length(8)
            .unwrap();
        let mut spec = ScheduleSpec::new(kind, pp, 4);
        spec.virtual_stages = v;
        ExecConfig::new(&model, generate(&spec).unwrap(), dp, 1, None).unwrap()
    }

    #[test]
    fn links_join_consecutive_stages_both_ways_in_each_replica() {
        let c = cfg(ScheduleKind::OneFOneB, 2, 1, 2);
        assert_eq!(pipeline_links(&c), [(0, 1), (1, 0), (2, 3), (3, 2)]);
        assert_eq!(data_parallel_groups(&c), [vec![0, 2], vec![1, 3]]);
        // interleaved: stage 3 (rank 1) feeds stage 4 (rank 0) too, which 0 ↔ 1 covers
        let c = cfg(ScheduleKind::Interleaved1F1B, 2, 2, 1);
        assert_eq!(pipeline_links(&c), [(0, 1), (1, 0)]);
        assert!(data_parallel_groups(&c).is_empty());
        let c = cfg(ScheduleKind::OneFOneB, 4, 1, 1);
        assert_eq!(pipeline_links(&c).len(), 6);
    }

    /// `cfg` trained on the GPU passes `--check` against CPU single-worker training.
    #[cfg(feature = "cuda")]
    fn passes_the_check(c: &ExecConfig, r: Result<crate::ExecReport, ExecError>) {
        let report = r.unwrap();
        let reference = crate::check::train_single_worker(c).unwrap();
        let cmp = crate::check::compare(&report, &reference, crate::check::DEFAULT_TOLERANCE);
        assert!(cmp.passed, "{}: {:.3e}", cmp.worst, cmp.max_rel_err);
    }

    /// With a GPU, a 2-rank run with cuBLAS GEMMs (ranks sharing GPUs when there are fewer)
    /// matches CPU training; without one, the run is refused in one line.
    #[cfg(feature = "cuda")]
    #[test]
    fn cublas_gemms_train_like_the_cpu_or_say_why_not() {
        let mut c = cfg(ScheduleKind::OneFOneB, 2, 1, 1);
        c.steps = 2;
        c.backend = Backend::Cuda;
        let r = crate::run::run(&c, &mut |_| {});
        match gpus(Backend::Cuda) {
            Ok(_) => passes_the_check(&c, r),
            Err(e) => {
                let text = e.to_string();
                assert!(text.starts_with("--backend cuda: no CUDA driver"), "{text}");
                assert_eq!(r.unwrap_err(), e);
                eprintln!("{text}: the cuBLAS run did not run");
            }
        }
    }

    /// With two GPUs, a 2-rank run over NCCL matches CPU training; with fewer, the refusal
    /// names the counts and the way out.
    #[cfg(feature = "cuda")]
    #[test]
    fn nccl_trains_like_the_cpu_or_says_why_not() {
        let mut c = cfg(ScheduleKind::OneFOneB, 2, 1, 1);
        c.steps = 2;
        let e = run_nccl(&c, &mut |_| {}).unwrap_err().to_string();
        assert!(e.contains("add --backend cuda"), "{e}");
        c.backend = Backend::Cuda;
        let r = run_nccl(&c, &mut |_| {});
        match autopp_profiler::device::cuda::device_count() {
            Ok(n) if n >= 2 => passes_the_check(&c, r),
            Ok(n) => {
                let text = r.unwrap_err().to_string();
                let want = format!("2 ranks but {n} GPU(s)");
                assert!(text.contains(&want), "{text}");
                assert!(text.contains("use --transport threads"), "{text}");
                eprintln!("{text}: the NCCL run did not run");
            }
            Err(_) => {
                let text = r.unwrap_err().to_string();
                assert!(
                    text.starts_with("--transport nccl: no CUDA driver"),
                    "{text}"
                );
                eprintln!("{text}: the NCCL run did not run");
            }
        }
    }

    #[test]
    fn the_cpu_engine_is_what_a_thread_starts_with_and_ends_with() {
        assert_eq!(gpus(Backend::Cpu), Ok(0));
        let g = EngineGuard::install(Backend::Cpu, 3, 0)
            .unwrap()
            .with_gemm_threads(3);
        assert_eq!(autopp_profiler::device::gemm::thread_engine_name(), "cpu");
        assert_eq!(autopp_profiler::device::gemm::thread_gemm_threads(), 3);
        drop(g);
        assert_eq!(autopp_profiler::device::gemm::thread_engine_name(), "cpu");
        assert_eq!(autopp_profiler::device::gemm::thread_gemm_threads(), 1);
        assert!(gemm_threads_per_rank(1) >= 1 && gemm_threads_per_rank(1 << 20) == 1);
    }
}
