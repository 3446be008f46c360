//! A linear layer `y = x·W + b` with `W` stored `in × out`.
//!
//! Backward: `dx = dy·Wᵀ` (backward-input); `dW += xᵀ·dy`, `db += Σ_rows dy` (backward-weight).

use super::gemm::{matmul, matmul_tn_acc_f64};
use super::rng::Rng;
use super::tensor::{Tensor, Tensor64};

/// Weights `in × out` and an optional `1 × out` bias — or, as `Linear<Tensor64>`, their
/// gradients.
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
    pub fn backward_weight(x: &Tensor, dy: &Tensor, grads: &mut Linear<Tensor64>) {
        matmul_tn_acc_f64(&mut grads.weight, x, dy);
        if let Some(db) = &mut grads.bias {
            db.add_column_sums(dy);
        }
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> Linear<Tensor64> {
        Linear {
            weight: Tensor64::zeros(self.weight.rows(), self.weight.cols()),
            bias: self.bias.as_ref().map(|b| Tensor64::zeros(1, b.cols())),
        }
    }
}
