//! Expert parallelism: Megatron-Core's "parallel folding" (Liu et al. 2025, arXiv 2504.14960,
//! §3; `../shared/reference/megatron-lm.md`). The GPUs of one pipeline rank, `tp · cp · dp` of
//! them, run attention as `tp × cp × dp` and the MoE FFNs as `etp × ep × edp` (expert tensor,
//! expert and expert-data parallelism), so `ep · etp` must divide `tp · cp · dp` and
//! `edp = tp · cp · dp / (ep · etp)`. Expert groups are laid out etp fastest, then ep: the
//! expert-parallel group's members are `etp` ranks apart.

use autopp_models::Model;
use serde::{Deserialize, Serialize};

use crate::config::PlanError;
use crate::degrees::Degrees;

/// The expert degrees of a configuration and the routing load.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ExpertParallel {
    /// Expert-parallel degree: each GPU holds `E/ep` routed experts.
    pub ep: u64,
    /// Expert-tensor-parallel degree: each expert's FFN split `etp` ways.
    pub etp: u64,
    /// Busiest expert rank's tokens over the balanced share (1.0: forced balance).
    pub imbalance: f64,
}

impl Default for ExpertParallel {
    fn default() -> Self {
        ExpertParallel {
            ep: 1,
            etp: 1,
            imbalance: 1.0,
        }
    }
}

impl ExpertParallel {
    /// Whether this is the default (no expert parallelism, balanced).
    pub fn is_default(&self) -> bool {
        *self == ExpertParallel::default()
    }

    /// Expert-data-parallel degree: `tp · cp · dp / (ep · etp)` (at least 1).
    pub fn expert_dp(&self, d: &Degrees) -> u64 {
        (d.tp * d.cp * d.dp / (self.ep * self.etp).max(1)).max(1)
    }

    /// The imbalance in thousandths, as [`autopp_models::ShardSpec`] takes it.
    pub fn imbalance_milli(&self) -> u64 {
        (self.imbalance * 1000.0).round().max(1000.0) as u64
    }

    /// Checks the degrees against the model and the folding rule; errors name the flag.
    pub fn check(&self, model: &Model, d: &Degrees) -> Result<(), PlanError> {
        if self.ep == 0 || self.etp == 0 {
            return Err(PlanError::invalid(
                "--ep",
                "--ep and --etp must be at least 1",
            ));
        }
        check_imbalance(self.imbalance)?;
        let experts = match model {
            Model::Transformer(t) => t.moe.as_ref().map(|m| m.num_experts),
            Model::Layers(_) => None,
        };
        if experts.is_none() && (self.ep > 1 || self.etp > 1) {
            return Err(PlanError::invalid(
                "--ep",
                format!(
                    "{} (--etp {}): model '{}' has no experts; leave expert parallelism at 1",
                    self.ep,
                    self.etp,
                    model.name()
                ),
            ));
        }
        let folded = d.tp.saturating_mul(d.cp).saturating_mul(d.dp);
        let experts_gpus = self.ep.checked_mul(self.etp).filter(|&n| n <= folded);
        if !experts_gpus.is_some_and(|n| folded.is_multiple_of(n)) {
            return Err(PlanError::invalid(
                "--ep",
                format!(
                    "ep · etp = {} · {} does not divide tp · cp · dp = {folded}, the GPUs of a pipeline rank the experts fold onto: choose degrees whose product divides it",
                    self.ep, self.etp
                ),
            ));
        }
        Ok(())
    }
}

/// `--moe-imbalance`: the busiest expert rank's tokens over the balanced share, from 1.0
/// (forced balance) to 64; an error naming the flag otherwise (NaN included).
pub fn check_imbalance(imbalance: f64) -> Result<f64, PlanError> {
    if !(1.0..=64.0).contains(&imbalance) {
        return Err(PlanError::invalid(
            "--moe-imbalance",
            format!(
                "{imbalance} is out of range: the busiest expert rank's load over the balanced one, from 1.0 to 64"
            ),
        ));
    }
    Ok(imbalance)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V3's published layout (arXiv 2412.19437, §3.2: 2048 H800, PP 16, EP 64,
    /// ZeRO-1 DP): tp 1, cp 1, dp 128 per pipeline rank; ep 64 leaves edp = 128 / 64 = 2.
    #[test]
    fn expert_dp_hand_worked() {
        let d = Degrees {
            tp: 1,
            pp: 16,
            dp: 128,
            cp: 1,
            virtual_stages: 1,
        };
        let e = ExpertParallel {
            ep: 64,
            ..ExpertParallel::default()
        };
        assert_eq!(e.expert_dp(&d), 2);
        // Mixtral at tp 2, dp 4, ep 8: 8 GPUs of a rank, edp 1
        let d = Degrees { tp: 2, dp: 4, ..d };
        let e = ExpertParallel { ep: 8, ..e };
        assert_eq!(e.expert_dp(&d), 1);
    }
}
