//! The CUDA device (feature `cuda`, through `cudarc`). The driver (`libcuda.so`) is loaded at
//! run time, so a build with the feature compiles and runs on machines without a GPU and says
//! so in one line. Today this finds the GPU; the executor's layers run on the CPU only (cuBLAS
//! GEMMs and an NCCL [`Transport`](super::Transport) are the next step).

/// Why the CUDA device cannot be used.
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
}

/// The name of GPU `ordinal` (e.g. `NVIDIA H100 80GB HBM3`), loading the CUDA driver.
pub fn device_name(ordinal: usize) -> Result<String, CudaError> {
    // SAFETY: only tries to open the driver library under its usual names; cudarc would
    // panic on first use without it, so this is checked first.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    let no_device = |e: cudarc::driver::DriverError| CudaError::NoDevice {
        ordinal,
        message: e.to_string(),
    };
    let ctx = cudarc::driver::CudaContext::new(ordinal).map_err(no_device)?;
    ctx.name().map_err(no_device)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver, the answer is an error, not a panic; with one, a name.
    #[test]
    fn finding_the_gpu_never_panics() {
        match device_name(0) {
            Ok(name) => assert!(!name.is_empty()),
            Err(e) => assert!(e.to_string().contains("GPU"), "{e}"),
        }
    }
}
