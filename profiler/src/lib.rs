//! # autopp-profiler
//!
//! What measures: the device layers — an embedding, pre-norm transformer blocks and a head, in
//! fp32 on the CPU (GEMMs through faer; through cuBLAS with the `cuda` feature), each with
//! explicit forward / backward-input / backward-weight passes — the transports between ranks
//! (in-process channels; MPI and NCCL behind features), the timing of each layer's passes that
//! `autopp profile` writes as a measured profile, and the byte accounting of what those layers
//! keep for backward. The executor runs exactly these layers, so a measured profile describes
//! what will execute.
//!
//! This crate never chooses plans.

#![warn(missing_docs)]

pub mod data;
pub mod device;
pub mod fp32_layers;
pub mod profile;

pub use fp32_layers::Fp32LayerBytes;
pub use profile::{median, profile_layers, ProfileError};
