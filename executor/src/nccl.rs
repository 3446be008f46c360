//! The run over NCCL (feature `cuda`): one thread per rank, each on its own GPU, tensors
//! moving between GPUs through one communicator per direction of each pipeline link and one
//! per data-parallel group.

use std::time::Duration;

use autopp_profiler::device::cuda::CudaError;
use autopp_profiler::device::nccl::NcclTransport;
use autopp_profiler::device::Abort;

use crate::backend::Backend;
use crate::config::ExecConfig;
use crate::error::ExecError;
use crate::record::StepSummary;
use crate::report::ExecReport;
use crate::run::run_world;
use crate::topology::{data_parallel_groups, pipeline_links};

/// Runs `cfg` like [`crate::run()`] with one thread per rank, each on its own GPU (rank `r` on
/// GPU `r`), tensors moving between GPUs over NCCL
/// ([`NcclTransport`](autopp_profiler::device::nccl::NcclTransport)): one communicator per
/// direction of each pipeline link, one per data-parallel group. Needs `cfg.backend` to be
/// CUDA and at least `pp × dp` GPUs.
pub fn run_nccl(
    cfg: &ExecConfig,
    on_step: &mut dyn FnMut(StepSummary),
) -> Result<ExecReport, ExecError> {
    cfg.validate()?;
    if cfg.tp > 1 {
        return Err(ExecError::invalid(
            "--tp",
            "the NCCL transport has no tensor-parallel communicators yet; run --tp with --transport threads",
        ));
    }
    if cfg.backend != Backend::Cuda {
        return Err(ExecError::invalid(
            "--transport nccl",
            "NCCL moves tensors between GPUs: add --backend cuda",
        ));
    }
    let abort = Abort::new();
    let timeout = Duration::from_secs_f64(cfg.recv_timeout_s);
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
    run_world(cfg, endpoints, abort, on_step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tests::passes_the_check;
    use crate::topology::tests::cfg;
    use autopp_schedule::ScheduleKind;

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
}
