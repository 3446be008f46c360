//! # autopp-hardware
//!
//! What the planner knows about hardware, without running anything on it: the GPU catalog
//! (peak FLOP/s per precision, memory, HBM and NVLink bandwidth), clusters and where a parallel
//! group sits in them, the analytic profile (seconds per op, collective and send: a roofline with
//! calibrated, shape-dependent efficiencies), and the measured-profile file format that
//! `autopp profile` writes and the analytic profile can take its layer times from.
//!
//! This crate runs nothing: it answers "how long would this take there".
//!
//! ```
//! use autopp_hardware::{hardware, AnalyticProfile, Cluster, Precision};
//! use autopp_models::CollectiveKind;
//!
//! let cluster = Cluster::new(hardware::gpu("h100-sxm").unwrap(), 16, 8, None).unwrap();
//! let profile = AnalyticProfile::new(cluster, Precision::Bf16).unwrap();
//! // a 1 GB all-reduce over the two nodes' NICs
//! let link = profile.cluster.group_link(2, 8);
//! let t_s = profile.collective_time_s(CollectiveKind::AllReduce, 1_000_000_000, 2, &link);
//! assert!(t_s > 0.02 && t_s < 0.03);
//! ```

#![warn(missing_docs)]

pub mod analytic;
pub mod cluster;
pub mod hardware;
pub mod measured;

pub use analytic::{AnalyticProfile, Efficiency, LayerTimes};
pub use cluster::{Cluster, Layout, Link};
pub use hardware::{GpuSpec, Precision, PRECISIONS};
pub use measured::{MeasuredLayer, MeasuredProfile, PROFILE_FORMAT};

/// Why a cluster or profile could not be built. Messages name the flag or key and the fix.
#[derive(Debug, thiserror::Error)]
pub enum HardwareError {
    /// A GPU kind not in the catalog.
    #[error("unknown GPU kind '{name}' (--gpu): use one of {available}")]
    UnknownGpu {
        /// What was asked for.
        name: String,
        /// The catalog names, comma-separated.
        available: String,
    },
    /// A flag or key with a value out of range.
    #[error("{field} {message}")]
    Invalid {
        /// The flag or key at fault.
        field: String,
        /// What is wrong and what would be right.
        message: String,
    },
    /// Malformed `cluster.json`.
    #[error("{origin}: {message}")]
    Json {
        /// The file.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// The hardware cannot do what was asked (e.g. bf16 on V100).
    #[error("{0}")]
    Unsupported(String),
}

impl HardwareError {
    /// An [`HardwareError::Invalid`] for `field`.
    pub fn invalid(field: &str, message: &str) -> Self {
        HardwareError::Invalid {
            field: field.to_string(),
            message: message.to_string(),
        }
    }
}
