//! AdamW (Loshchilov & Hutter 2019) over a stage's parameters:
//! `m ← β₁m + (1−β₁)g`, `v ← β₂v + (1−β₂)g²`, `m̂ = m/(1−β₁ᵗ)`, `v̂ = v/(1−β₂ᵗ)`,
//! `p ← p − lr·(m̂/(√v̂ + ε) + λ·p)`, with the decay `λ` on matrices only.

use autopp_profiler::device::Tensor;

use crate::config::AdamWConfig;
use crate::stage::Stage;

/// The moments of one stage's parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamState {
    m: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    t: i32,
}

impl AdamState {
    /// Zero moments for `stage`'s parameters.
    pub fn new(stage: &Stage) -> Self {
        let sizes: Vec<usize> = stage
            .layers
            .iter()
            .flat_map(|l| l.params().into_iter().map(|(_, t)| t.len()))
            .collect();
        AdamState {
            m: sizes.iter().map(|&n| vec![0.0; n]).collect(),
            v: sizes.iter().map(|&n| vec![0.0; n]).collect(),
            t: 0,
        }
    }

    /// One AdamW step on `stage` with its accumulated gradients (which it leaves untouched).
    pub fn step(&mut self, cfg: &AdamWConfig, stage: &mut Stage) {
        self.t += 1;
        let (b1, b2) = (cfg.beta1 as f32, cfg.beta2 as f32);
        let c1 = 1.0 - cfg.beta1.powi(self.t);
        let c2 = 1.0 - cfg.beta2.powi(self.t);
        let (lr, eps, wd) = (cfg.lr as f32, cfg.eps as f32, cfg.weight_decay as f32);
        let (c1, c2) = (c1 as f32, c2 as f32);
        let grads: Vec<&Tensor> = stage
            .grads
            .iter()
            .flat_map(|g| g.params().into_iter().map(|(_, t)| t))
            .collect();
        let params: Vec<&mut Tensor> = stage
            .layers
            .iter_mut()
            .flat_map(|l| l.params_mut())
            .collect();
        for (k, (p, g)) in params.into_iter().zip(grads).enumerate() {
            let decay = if p.rows() > 1 { wd } else { 0.0 };
            let (m, v) = (&mut self.m[k], &mut self.v[k]);
            for (((x, &gv), mv), vv) in p.data_mut().iter_mut().zip(g.data()).zip(m).zip(v) {
                *mv = b1 * *mv + (1.0 - b1) * gv;
                *vv = b2 * *vv + (1.0 - b2) * gv * gv;
                let update = (*mv / c1) / ((*vv / c2).sqrt() + eps);
                *x -= lr * (update + decay * *x);
            }
        }
    }
}
