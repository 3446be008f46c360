//! Where a run's GEMMs run ([`Backend`]).
//!
//! Each rank's thread installs its GEMM engine when it starts and puts the CPU engine back
//! when it ends (`EngineGuard`); everything but the GEMMs stays on the CPU either way (see
//! `autopp_profiler::device::gemm`).

use autopp_profiler::device::{set_thread_engine, set_thread_gemm_threads, Engine};
use serde::Serialize;

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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    #[cfg(feature = "cuda")]
    use crate::config::ExecConfig;
    #[cfg(feature = "cuda")]
    use crate::topology::tests::cfg;
    #[cfg(feature = "cuda")]
    use autopp_schedule::ScheduleKind;

    /// `cfg` trained on the GPU passes `--check` against CPU single-worker training.
    #[cfg(feature = "cuda")]
    pub(crate) fn passes_the_check(c: &ExecConfig, r: Result<crate::ExecReport, ExecError>) {
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
