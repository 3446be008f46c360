//! The CUDA device (feature `cuda`, through `cudarc`): finding GPUs, and the errors of the GPU
//! engine ([`CudaGemm`](super::cuda_gemm::CudaGemm)) and transport
//! ([`NcclTransport`](super::nccl::NcclTransport)).
//!
//! Every CUDA library — the driver (`libcuda.so`), cuBLAS (`libcublas.so`), NCCL
//! (`libnccl.so`) — is loaded at run time, so a build with the feature compiles and runs on
//! machines without a GPU; each entry point checks that its libraries load first and answers
//! [`CudaError`] in one line instead of the panic `cudarc` would raise on first use.

use std::sync::Arc;

use cudarc::driver::CudaContext;

/// Why the CUDA device cannot be used, or a CUDA call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// No driver library on this machine.
    #[error("no CUDA driver (libcuda.so) on this machine: it needs an NVIDIA GPU and its driver")]
    NoDriver,
    /// The driver loaded but the GPU could not be opened.
    #[error("the CUDA driver loaded but GPU {ordinal} cannot be used: {message}")]
    NoDevice {
        /// The GPU asked for.
        ordinal: usize,
        /// The driver's error.
        message: String,
    },
    /// The driver loaded but a CUDA library it needs did not.
    #[error("the CUDA driver loaded but {library} did not: install it or add its directory to LD_LIBRARY_PATH")]
    NoLibrary {
        /// The library, e.g. `cuBLAS (libcublas.so)`.
        library: &'static str,
    },
    /// NCCL runs one rank per GPU, and there are fewer GPUs than ranks.
    #[error("NCCL needs one GPU per rank: {ranks} ranks but {gpus} GPU(s) on this machine")]
    TooFewGpus {
        /// Ranks asked for.
        ranks: usize,
        /// GPUs the driver sees.
        gpus: usize,
    },
    /// A driver, cuBLAS or NCCL call failed.
    #[error("{what} on GPU {ordinal} failed: {message}")]
    Call {
        /// What was being done (`cuBLAS SGEMM`, `ncclRecv`).
        what: String,
        /// The GPU.
        ordinal: usize,
        /// The library's error.
        message: String,
    },
}

/// A CUDA library loaded at run time, checked before first use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Library {
    /// cuBLAS, for the GEMMs.
    Cublas,
    /// NCCL, for the transport.
    Nccl,
}

/// `Err(NoDriver)` unless the driver library loads.
pub(crate) fn require_driver() -> Result<(), CudaError> {
    // SAFETY: only tries to open the driver library under its usual names; cudarc would
    // panic on first use without it, so this is checked first.
    if unsafe { cudarc::driver::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(CudaError::NoDriver)
    }
}

/// `Err(NoLibrary)` unless `library` loads (the driver is checked separately).
pub(crate) fn require(library: Library) -> Result<(), CudaError> {
    // SAFETY: as in `require_driver`, each only tries to open its library.
    let (present, name) = match library {
        Library::Cublas => (
            unsafe { cudarc::cublas::sys::is_culib_present() },
            "cuBLAS (libcublas.so)",
        ),
        Library::Nccl => (
            unsafe { cudarc::nccl::sys::is_culib_present() },
            "NCCL (libnccl.so)",
        ),
    };
    if present {
        Ok(())
    } else {
        Err(CudaError::NoLibrary { library: name })
    }
}

/// The primary context of GPU `ordinal`, bound to the calling thread.
pub(crate) fn open(ordinal: usize) -> Result<Arc<CudaContext>, CudaError> {
    require_driver()?;
    CudaContext::new(ordinal).map_err(|e| CudaError::NoDevice {
        ordinal,
        message: e.to_string(),
    })
}

/// A [`CudaError::Call`] maker for `what` on GPU `ordinal`, from any error type.
pub(crate) fn call_failed<E: std::fmt::Debug>(
    what: &str,
    ordinal: usize,
) -> impl Fn(E) -> CudaError + '_ {
    move |e| CudaError::Call {
        what: what.to_string(),
        ordinal,
        message: format!("{e:?}"),
    }
}

/// Number of GPUs the driver sees.
pub fn device_count() -> Result<usize, CudaError> {
    require_driver()?;
    let n = CudaContext::device_count().map_err(|e| CudaError::NoDevice {
        ordinal: 0,
        message: e.to_string(),
    })?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The name of GPU `ordinal` (e.g. `NVIDIA H100 80GB HBM3`), loading the CUDA driver.
pub fn device_name(ordinal: usize) -> Result<String, CudaError> {
    let ctx = open(ordinal)?;
    ctx.name().map_err(|e| CudaError::NoDevice {
        ordinal,
        message: e.to_string(),
    })
}

/// Asks the driver to load every kernel of a library when the library loads
/// (`CUDA_MODULE_LOADING=EAGER`) unless the environment already says otherwise.
///
/// NCCL kernels wait on the GPU for their peers; a kernel loaded lazily (cuBLAS's, on first use)
/// may wait for the whole context to be idle, so it would wait for an NCCL kernel that waits
/// for this rank: a deadlock the CUDA programming guide describes under lazy loading. Call it
/// before any other CUDA call, while the process has one thread (it sets an environment
/// variable).
pub fn prefer_eager_module_loading() {
    if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        std::env::set_var("CUDA_MODULE_LOADING", "EAGER");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver, the answer is the one-line error, not a panic; with one, a name.
    #[test]
    fn finding_the_gpu_never_panics() {
        match device_name(0) {
            Ok(name) => assert!(!name.is_empty()),
            Err(CudaError::NoDriver) => {
                assert_eq!(device_count(), Err(CudaError::NoDriver));
                let e = CudaError::NoDriver.to_string();
                assert!(e.contains("no CUDA driver (libcuda.so)"), "{e}");
            }
            Err(e) => assert!(e.to_string().contains("GPU"), "{e}"),
        }
    }
}
