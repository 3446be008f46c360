//! A linear layer `y = x·W + b` with `W` stored `in × out`.
//!
//! Backward: `dx = dy·Wᵀ` (backward-input); `dW += xᵀ·dy`, `db += Σ_rows dy` (backward-weight).

use std::ops::Range;

use super::gemm::{matmul, matmul_into, matmul_tn_acc};
use super::kernels;
use super::rng::Rng;
use super::tensor::Tensor;

/// Weights `in × out` and an optional `1 × out` bias — or, as a second `Linear`, their
/// gradients (accumulated in f32).
#[derive(Debug, Clone, PartialEq)]
pub struct Linear<T = Tensor> {
    /// `W`, `in × out`.
    pub weight: T,
    /// `b`, `1 × out`, when the layer has one.
    pub bias: Option<T>,
}

impl Linear {
    /// Weights drawn from `N(0, std²)`, bias zero when `bias` is set.
    pub fn init(rng: &mut Rng, inputs: usize, outputs: usize, std: f64, bias: bool) -> Self {
        let w = (0..inputs * outputs)
            .map(|_| (rng.normal() * std) as f32)
            .collect();
        Linear {
            weight: Tensor::from_vec(inputs, outputs, w),
            bias: bias.then(|| Tensor::zeros(1, outputs)),
        }
    }

    /// `x·W + b`.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let mut y = matmul(x, false, &self.weight, false);
        if let Some(b) = &self.bias {
            kernels::add_bias(y.data_mut(), b.data());
        }
        y
    }

    /// `residual + b + x·W` (the bias added to the residual first, then the product added
    /// on): a projection that writes into the residual stream, in one pass over the output.
    ///
    /// # Panics
    /// If `residual` is not `x.rows() × out`.
    pub fn forward_residual(&self, x: &Tensor, residual: &Tensor) -> Tensor {
        assert_eq!(
            residual.shape(),
            (x.rows(), self.weight.cols()),
            "linear: residual shape"
        );
        let mut y = Tensor::scratch(x.rows(), self.weight.cols());
        y.data_mut().copy_from_slice(residual.data());
        if let Some(b) = &self.bias {
            kernels::add_bias(y.data_mut(), b.data());
        }
        matmul_into(&mut y, x, false, &self.weight, false, true);
        y
    }

    /// `dy·Wᵀ`.
    pub fn backward_input(&self, dy: &Tensor) -> Tensor {
        matmul(dy, false, &self.weight, true)
    }

    /// Adds `x[rows]ᵀ·dy[rows]` into `grads.weight` and the column sums of `dy[rows]` into
    /// `grads.bias` (`rows`: the tokens whose gradients to add).
    pub fn backward_weight(x: &Tensor, dy: &Tensor, grads: &mut Linear, rows: Range<usize>) {
        matmul_tn_acc(&mut grads.weight, x, dy, rows.clone());
        if let Some(db) = &mut grads.bias {
            if !rows.is_empty() {
                kernels::add_column_sums(dy.rows_slice(rows), db.data_mut());
            }
        }
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> Linear {
        Linear {
            weight: Tensor::zeros(self.weight.rows(), self.weight.cols()),
            bias: self.bias.as_ref().map(|b| Tensor::zeros(1, b.cols())),
        }
    }
}
