//! LayerNorm over the feature dimension (Ba, Kiros & Hinton 2016):
//! `y = x̂ ∘ γ + β` with `x̂ = (x − μ) · rstd`, `rstd = 1/√(σ² + ε)` per row.
//!
//! Backward (per row, `d = dy ∘ γ`, `n` features):
//! `dx = rstd · (d − mean(d) − x̂ · mean(d ∘ x̂))`; `dγ = Σ_rows dy ∘ x̂`, `dβ = Σ_rows dy`.

use std::ops::Range;

use super::kernels;
use super::tensor::Tensor;

/// The ε added to the variance (PyTorch's default).
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// A LayerNorm's parameters: scale `γ` and shift `β`, both `1 × features` — or, as a second
/// `LayerNorm`, their gradients.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerNorm<T = Tensor> {
    /// Scale `γ`.
    pub gamma: T,
    /// Shift `β`.
    pub beta: T,
}

/// What a LayerNorm's forward keeps for its backward: `x̂` (`rows × features`) and `rstd`
/// (`rows × 1`).
#[derive(Debug, Clone, PartialEq)]
pub struct NormSaved {
    /// The normalised input `x̂`.
    pub xhat: Tensor,
    /// `1/√(σ² + ε)` per row.
    pub rstd: Tensor,
}

impl NormSaved {
    /// Bytes held.
    pub fn bytes(&self) -> u64 {
        self.xhat.bytes() + self.rstd.bytes()
    }
}

impl LayerNorm {
    /// The identity-initialised norm (`γ = 1`, `β = 0`) over `features`.
    pub fn new(features: usize) -> Self {
        LayerNorm {
            gamma: Tensor::full(1, features, 1.0),
            beta: Tensor::zeros(1, features),
        }
    }

    /// Normalises every row of `x`.
    pub fn forward(&self, x: &Tensor) -> (Tensor, NormSaved) {
        let (rows, n) = x.shape();
        let mut xhat = Tensor::scratch(rows, n);
        let mut rstd = Tensor::scratch(rows, 1);
        let mut y = Tensor::scratch(rows, n);
        if rows > 0 {
            kernels::layer_norm_forward(
                x.data(),
                self.gamma.data(),
                self.beta.data(),
                LAYER_NORM_EPS,
                xhat.data_mut(),
                rstd.data_mut(),
                y.data_mut(),
            );
        }
        (y, NormSaved { xhat, rstd })
    }

    /// The gradient with respect to the input.
    pub fn backward_input(&self, saved: &NormSaved, dy: &Tensor) -> Tensor {
        let (rows, n) = dy.shape();
        let mut dx = Tensor::scratch(rows, n);
        if rows > 0 {
            kernels::layer_norm_backward(
                dy.data(),
                self.gamma.data(),
                saved.xhat.data(),
                saved.rstd.data(),
                dx.data_mut(),
            );
        }
        dx
    }

    /// Adds the `dγ` and `dβ` of the tokens `rows` into `grads`.
    pub fn backward_weight(xhat: &Tensor, dy: &Tensor, grads: &mut LayerNorm, rows: Range<usize>) {
        if rows.is_empty() {
            return;
        }
        let d = dy.rows_slice(rows.clone());
        kernels::add_column_dots(d, xhat.rows_slice(rows), grads.gamma.data_mut());
        kernels::add_column_sums(d, grads.beta.data_mut());
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> LayerNorm {
        LayerNorm {
            gamma: Tensor::zeros(1, self.gamma.cols()),
            beta: Tensor::zeros(1, self.beta.cols()),
        }
    }
}
