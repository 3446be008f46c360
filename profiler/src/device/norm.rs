//! LayerNorm over the feature dimension (Ba, Kiros & Hinton 2016):
//! `y = x̂ ∘ γ + β` with `x̂ = (x − μ) · rstd`, `rstd = 1/√(σ² + ε)` per row.
//!
//! Backward (per row, `d = dy ∘ γ`, `n` features):
//! `dx = rstd · (d − mean(d) − x̂ · mean(d ∘ x̂))`; `dγ = Σ_rows dy ∘ x̂`, `dβ = Σ_rows dy`.

use super::tensor::{Tensor, Tensor64};

/// The ε added to the variance (PyTorch's default).
pub const LAYER_NORM_EPS: f32 = 1e-5;

/// A LayerNorm's parameters: scale `γ` and shift `β`, both `1 × features` — or, as
/// `LayerNorm<Tensor64>`, their gradients.
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
        let mut xhat = Tensor::zeros(rows, n);
        let mut rstd = Tensor::zeros(rows, 1);
        let mut y = Tensor::zeros(rows, n);
        for i in 0..rows {
            let xr = x.row(i);
            let mean = xr.iter().sum::<f32>() / n as f32;
            let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n as f32;
            let r = 1.0 / (var + LAYER_NORM_EPS).sqrt();
            rstd.data_mut()[i] = r;
            let hr = xhat.row_mut(i);
            for (h, v) in hr.iter_mut().zip(xr) {
                *h = (v - mean) * r;
            }
            let yr = y.row_mut(i);
            for (j, yv) in yr.iter_mut().enumerate() {
                *yv = xhat.data()[i * n + j] * self.gamma.data()[j] + self.beta.data()[j];
            }
        }
        (y, NormSaved { xhat, rstd })
    }

    /// The gradient with respect to the input.
    pub fn backward_input(&self, saved: &NormSaved, dy: &Tensor) -> Tensor {
        let (rows, n) = dy.shape();
        let gamma = self.gamma.data();
        let mut dx = Tensor::zeros(rows, n);
        let mut d = vec![0.0f32; n];
        for i in 0..rows {
            let xh = saved.xhat.row(i);
            for ((dv, g), dyv) in d.iter_mut().zip(gamma).zip(dy.row(i)) {
                *dv = dyv * g;
            }
            let mean_d = d.iter().sum::<f32>() / n as f32;
            let mean_dx = d.iter().zip(xh).map(|(a, b)| a * b).sum::<f32>() / n as f32;
            let r = saved.rstd.data()[i];
            for ((o, dv), h) in dx.row_mut(i).iter_mut().zip(&d).zip(xh) {
                *o = r * (dv - mean_d - h * mean_dx);
            }
        }
        dx
    }

    /// Adds this micro-batch's `dγ` and `dβ` into `grads`.
    pub fn backward_weight(xhat: &Tensor, dy: &Tensor, grads: &mut LayerNorm<Tensor64>) {
        let n = dy.cols();
        let dg = grads.gamma.data_mut();
        for i in 0..dy.rows() {
            let (xh, d) = (xhat.row(i), dy.row(i));
            for j in 0..n {
                dg[j] += f64::from(d[j]) * f64::from(xh[j]);
            }
        }
        grads.beta.add_column_sums(dy);
    }

    /// Zero gradients of the same shapes.
    pub fn zeros_like(&self) -> LayerNorm<Tensor64> {
        LayerNorm {
            gamma: Tensor64::zeros(1, self.gamma.cols()),
            beta: Tensor64::zeros(1, self.beta.cols()),
        }
    }
}
