//! A linear layer `y = x·W + b` with `W` stored `in × out`.
//!
//! Backward: `dx = dy·Wᵀ` (backward-input); `dW += xᵀ·dy`, `db += Σ_rows dy` (backward-weight).

use super::gemm::{matmul, matmul_into};
use super::rng::Rng;
use super::tensor::Tensor;

/// Weights `in × out` and an optional `1 × out` bias.
#[derive(Debug, Clone, PartialEq)]
pub struct Linear {
    /// `W`, `in × out`.
    pub weight: Tensor,
    /// `b`, `1 × out`, when the layer has one.
    pub bias: Option<Tensor>,
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
            let cols = y.cols();
            for row in y.data_mut().chunks_exact_mut(cols.max(1)) {
                for (v, bv) in row.iter_mut().zip(b.data()) {
                    *v += bv;
                }
            }
        }
        y
    }

    /// `dy·Wᵀ`.
    pub fn backward_input(&self, dy: &Tensor) -> Tensor {
        matmul(dy, false, &self.weight, true)
    }

    /// Adds `xᵀ·dy` into `grads.weight` and the column sums of `dy` into `grads.bias`.
    pub fn backward_weight(x: &Tensor, dy: &Tensor, grads: &mut Linear) {
        matmul_into(&mut grads.weight, x, true, dy, false, true);
        if let Some(db) = &mut grads.bias {
            dy.add_column_sums_into(db);
        }
    }

    /// The same shapes, all zero (a gradient accumulator).
    pub fn zeros_like(&self) -> Self {
        Linear {
            weight: Tensor::zeros(self.weight.rows(), self.weight.cols()),
            bias: self.bias.as_ref().map(|b| Tensor::zeros(1, b.cols())),
        }
    }
}
