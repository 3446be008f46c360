//! The device layer: what the executor runs and what a measured profile will time.
//!
//! - [`Tensor`]: dense row-major fp32 matrices, their buffers reused through a per-thread
//!   pool; [`gemm`] multiplies them on the engine each rank's thread chose: `faer` on the CPU,
//!   one thread per rank by default (more with [`set_thread_gemm_threads`]), or cuBLAS on a
//!   GPU (feature `cuda`: `cuda_gemm`). Everything else — norms, softmax, GeLU, the loss,
//!   the optimizer — runs on the CPU, the per-element work in [`kernels`] (vectorised,
//!   AVX2 + FMA or NEON chosen at run time).
//! - Layers with explicit gradients, each with `forward` (returning what it keeps for the
//!   backward), `backward_input` (`I`) and `backward_weight` (`W`); a full backward `B` is `I`
//!   then `W`: [`Embedding`], [`Block`] (pre-norm: LayerNorm, causal multi-head attention,
//!   GeLU MLP, residuals), [`Head`] (final norm, LM head, cross-entropy), behind the one
//!   interface of [`Layer`].
//! - [`Transport`]: point-to-point sends and receives of tagged tensors and all-reduce within
//!   a group, with the in-process implementation [`InProcess`] (and, with features, `mpi` and
//!   `nccl`).
//! - Tensor parallelism ([`tp`]): a rank's slices of each layer ([`Shard`]) and the
//!   collective its layers call ([`TpComm`]; `forward_tp`, `backward_input_tp`).
//! - [`Rng`]: the fixed generator weights and synthetic data are drawn from.
//!
//! ```
//! use autopp_profiler::device::{Block, Rng, Tensor};
//!
//! let mut rng = Rng::new(1);
//! let block = Block::init(&mut rng, 8, 2, 32, 1, true, true);
//! let x = Tensor::full(4, 8, 0.5); // one sequence of 4 tokens, hidden 8
//! let (y, saved) = block.forward(&x, 1);
//! let (dx, for_w) = block.backward_input(saved, Tensor::full(4, 8, 1.0));
//! let mut grads = block.zeros_like();
//! block.backward_weight(&for_w, &mut grads, 0..4); // the gradients of tokens 0..4
//! assert_eq!((y.shape(), dx.shape()), ((4, 8), (4, 8)));
//! ```

pub mod attention;
pub mod block;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(feature = "cuda")]
pub mod cuda_gemm;
pub mod embedding;
pub mod gemm;
pub mod group;
pub mod head;
pub mod inprocess;
pub mod kernels;
pub mod layer;
pub mod linear;
pub mod model;
#[cfg(feature = "mpi")]
pub mod mpi;
#[cfg(feature = "cuda")]
pub mod nccl;
pub mod norm;
pub mod rng;
pub mod sp;
pub mod tensor;
pub mod tp;
pub mod transport;

pub use block::{Block, BlockSaved, BlockWeightSaved};
pub use embedding::Embedding;
pub use gemm::{
    gemm_batched, matmul, matmul_into, matmul_tn_acc, set_thread_engine, set_thread_gemm_threads,
    Engine, Operand,
};
pub use group::GroupComm;
pub use head::Head;
pub use inprocess::InProcess;
pub use layer::{Flow, Layer, Saved, WeightSaved};
pub use linear::Linear;
pub use model::{check_model, init_layer, MAX_PARAMS};
pub use norm::LayerNorm;
pub use rng::Rng;
pub use tensor::{Tensor, DTYPE_BYTES};
pub use tp::{Emulated, Shard, TpComm};
pub use transport::{Abort, Direction, Tag, Transport, TransportError, ABORT_POLL};

/// A layer was handed input it cannot use (the wrong kind of flow, ids outside the vocabulary,
/// targets of the wrong length). The runtime checks its inputs, so this means a bug or a bad
/// schedule.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    /// What was wrong.
    #[error("{0}")]
    Input(String),
    /// The model uses something the device layers do not implement, or is too large for them.
    #[error("{0}")]
    Unsupported(String),
    /// A tensor-parallel collective inside a layer failed.
    #[error(transparent)]
    Collective(#[from] TransportError),
}
