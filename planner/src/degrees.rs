//! The degrees of parallelism: how a configuration splits its GPUs and its layers.

use autopp_hardware::Layout;
use serde::{Deserialize, Serialize};

use crate::config::PlanError;

/// How a configuration splits its GPUs (`tp · pp · dp · cp` of them) and its layers
/// (`pp · virtual_stages` stages). The same struct is the configuration's
/// ([`crate::ParallelConfig`]), the search's ([`crate::search::Key`]) and the plan's
/// ([`crate::Plan`], where it is serialised flattened: `"tp": 8, "pp": 4, …`);
/// `Degrees<Option<u64>>` pins some of them ([`crate::pins::Fixed`], `--fix`).
///
/// The micro-batch size is not a degree: it sets the batching (with the global batch), not how
/// the GPUs or the layers are split, and sits beside the degrees in each of those structs.
///
/// Field order is the search's tie-break order (see [`crate::search::Key`]).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize,
)]
pub struct Degrees<T = u64> {
    /// Tensor-parallel degree (`t`).
    pub tp: T,
    /// Pipeline ranks (`p`).
    pub pp: T,
    /// Data-parallel degree (`d`).
    pub dp: T,
    /// Context-parallel degree.
    pub cp: T,
    /// Stages per pipeline rank (`v`).
    pub virtual_stages: T,
}

impl Degrees {
    /// `tp`, `pp`, `cp` and `virtual_stages` with the data-parallel degree that fills `gpus`
    /// GPUs: `gpus / (tp · pp · cp)`; an error naming `--gpus` when that does not divide.
    pub fn filling(
        gpus: u64,
        tp: u64,
        pp: u64,
        cp: u64,
        virtual_stages: u64,
    ) -> Result<Degrees, PlanError> {
        let Some(per_replica) = tp.checked_mul(pp).and_then(|n| n.checked_mul(cp)) else {
            return Err(PlanError::invalid(
                "--gpus",
                format!("tp · pp · cp = {tp} · {pp} · {cp} is more than any cluster: use degrees whose product divides {gpus}"),
            ));
        };
        if !gpus.is_multiple_of(per_replica) {
            return Err(PlanError::invalid(
                "--gpus",
                format!("{gpus} is not divisible by tp · pp · cp = {per_replica}: use a multiple of {per_replica}, or other degrees"),
            ));
        }
        Ok(Degrees {
            tp,
            pp,
            dp: gpus / per_replica,
            cp,
            virtual_stages,
        })
    }

    /// GPUs used: `tp · pp · dp · cp` (saturating: degrees read from a file may be huge, and a
    /// saturated count matches no cluster).
    pub fn num_gpus(&self) -> u64 {
        self.tp
            .saturating_mul(self.pp)
            .saturating_mul(self.dp)
            .saturating_mul(self.cp)
    }

    /// Number of stages: `pp · virtual_stages` (saturating).
    pub fn num_stages(&self) -> u64 {
        self.pp.saturating_mul(self.virtual_stages)
    }

    /// Where the parallel groups sit on the cluster (Megatron's rank order tp-cp-dp-pp).
    pub fn layout(&self) -> Layout {
        Layout {
            tp: self.tp,
            cp: self.cp,
            dp: self.dp,
            pp: self.pp,
        }
    }

    /// The GPUs over which model states are sharded and gradients reduced: `dp · cp`.
    pub fn data_parallel_gpus(&self) -> u64 {
        self.dp * self.cp
    }

    /// Parallel groups of more than one GPU (each holds communication buffers).
    pub fn num_comm_groups(&self) -> u64 {
        [self.tp, self.cp, self.dp, self.pp]
            .iter()
            .filter(|&&d| d > 1)
            .count() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattened_json_keeps_the_plan_field_names() {
        #[derive(Serialize, Deserialize, PartialEq, Debug)]
        struct Outer {
            gpus: u64,
            #[serde(flatten)]
            degrees: Degrees,
            micro_batch_size: u64,
        }
        let o = Outer {
            gpus: 64,
            degrees: Degrees {
                tp: 8,
                pp: 4,
                dp: 2,
                cp: 1,
                virtual_stages: 2,
            },
            micro_batch_size: 1,
        };
        let text = serde_json::to_string(&o).unwrap();
        assert_eq!(
            text,
            r#"{"gpus":64,"tp":8,"pp":4,"dp":2,"cp":1,"virtual_stages":2,"micro_batch_size":1}"#
        );
        assert_eq!(serde_json::from_str::<Outer>(&text).unwrap(), o);
        assert_eq!(o.degrees.num_gpus(), 64);
        assert_eq!(o.degrees.num_stages(), 8);
    }
}
