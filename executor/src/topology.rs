//! Which world rank is which, and what travels between them. Ranks are numbered as Megatron
//! does, tensor-parallel fastest: `rank = (replica · pp + pp_rank) · tp + tp_rank`, so a
//! tensor-parallel group is `tp` consecutive ranks. A pipeline's neighbouring stages on
//! different ranks are linked both ways, tensor-parallel rank to the same tensor-parallel
//! rank; the replicas of each (pipeline rank, tensor-parallel rank) form its data-parallel
//! group.

use crate::config::ExecConfig;
use crate::error::ExecError;

/// Where a world rank sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// World rank, `(replica · pp + pp_rank) · tp + tp_rank`.
    pub rank: usize,
    /// Data-parallel replica.
    pub replica: usize,
    /// Pipeline rank.
    pub pp_rank: usize,
    /// Tensor-parallel rank.
    pub tp_rank: usize,
}

impl Place {
    /// The failure of this rank in step `step` (1-based), in `action` (`1B3`) if it was
    /// running one.
    pub fn failure(self, step: usize, action: Option<String>, message: String) -> ExecError {
        ExecError::Rank {
            rank: self.rank,
            replica: self.replica,
            pp_rank: self.pp_rank,
            step,
            action,
            message,
        }
    }
}

impl ExecConfig {
    /// Where world rank `rank` sits.
    pub fn place(&self, rank: usize) -> Place {
        let tp = self.tp.max(1);
        let pipeline = rank / tp;
        Place {
            rank,
            replica: pipeline / self.pp(),
            pp_rank: pipeline % self.pp(),
            tp_rank: rank % tp,
        }
    }

    /// The world rank of tensor-parallel rank `tp_rank` of pipeline rank `pp_rank` in replica
    /// `replica`.
    pub fn world_rank(&self, replica: usize, pp_rank: usize, tp_rank: usize) -> usize {
        (replica * self.pp() + pp_rank) * self.tp.max(1) + tp_rank
    }

    /// The data-parallel group of (pipeline rank `pp_rank`, tensor-parallel rank `tp_rank`):
    /// its world rank in every replica, in replica order.
    pub fn data_parallel_group(&self, pp_rank: usize, tp_rank: usize) -> Vec<usize> {
        (0..self.dp)
            .map(|d| self.world_rank(d, pp_rank, tp_rank))
            .collect()
    }

    /// The tensor-parallel group of pipeline rank `pp_rank` in replica `replica`, in
    /// tensor-parallel rank order.
    pub fn tensor_parallel_group(&self, replica: usize, pp_rank: usize) -> Vec<usize> {
        (0..self.tp.max(1))
            .map(|t| self.world_rank(replica, pp_rank, t))
            .collect()
    }

    /// The most bytes one pipeline message carries: a micro-batch's hidden states, fp32
    /// (`mbs · seq_len · hidden · 4`).
    pub fn pipeline_message_bytes(&self) -> usize {
        self.micro_batch_size * self.seq_len() * self.model.hidden_size as usize * 4
    }

    /// The most pipeline messages a rank sends in one step: an activation and a gradient for
    /// each (stage, micro-batch) it holds (`2 · m · v`).
    pub fn pipeline_messages_per_step(&self) -> usize {
        2 * self.num_microbatches() * self.schedule.virtual_stages
    }
}

/// The directed links of `cfg`'s pipelines, in world ranks: for each replica, both directions
/// between the ranks of every two consecutive stages on different ranks.
pub fn pipeline_links(cfg: &ExecConfig) -> Vec<(usize, usize)> {
    let mut links = Vec::new();
    for replica in 0..cfg.dp {
        for s in 0..cfg.num_stages().saturating_sub(1) {
            let (a, b) = (cfg.schedule.rank_of(s), cfg.schedule.rank_of(s + 1));
            if a != b {
                for t in 0..cfg.tp.max(1) {
                    let (a, b) = (cfg.world_rank(replica, a, t), cfg.world_rank(replica, b, t));
                    links.push((a, b));
                    links.push((b, a));
                }
            }
        }
    }
    links.sort_unstable();
    links.dedup();
    links
}

/// The data-parallel groups of `cfg` (the replicas of each pipeline and tensor-parallel rank,
/// in replica order), when there is more than one replica.
pub fn data_parallel_groups(cfg: &ExecConfig) -> Vec<Vec<usize>> {
    if cfg.dp < 2 {
        return Vec::new();
    }
    (0..cfg.pp())
        .flat_map(|p| (0..cfg.tp.max(1)).map(move |t| cfg.data_parallel_group(p, t)))
        .collect()
}

/// The tensor-parallel groups of `cfg` (each pipeline rank of each replica), when `tp > 1`.
pub fn tensor_parallel_groups(cfg: &ExecConfig) -> Vec<Vec<usize>> {
    if cfg.tp < 2 {
        return Vec::new();
    }
    (0..cfg.dp)
        .flat_map(|d| (0..cfg.pp()).map(move |p| cfg.tensor_parallel_group(d, p)))
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use autopp_schedule::{generate, ScheduleKind, ScheduleSpec};

    /// tiny-gpt at 8 tokens under `kind` on `pp` ranks, `v` stages per rank, `dp` replicas,
    /// 4 micro-batches of 1 sequence.
    pub(crate) fn cfg(kind: ScheduleKind, pp: usize, v: usize, dp: usize) -> ExecConfig {
        let model = autopp_models::load("tiny-gpt")
            .unwrap()
            .with_seq_length(8)
            .unwrap();
        let spec = ScheduleSpec::new(kind, pp, 4).with_virtual_stages(v);
        ExecConfig::new(&model, generate(&spec).unwrap(), dp, 1, None).unwrap()
    }

    #[test]
    fn links_join_consecutive_stages_both_ways_in_each_replica() {
        let c = cfg(ScheduleKind::OneFOneB, 2, 1, 2);
        assert_eq!(pipeline_links(&c), [(0, 1), (1, 0), (2, 3), (3, 2)]);
        assert_eq!(data_parallel_groups(&c), [vec![0, 2], vec![1, 3]]);
        assert_eq!(
            c.place(3),
            Place {
                rank: 3,
                replica: 1,
                pp_rank: 1,
                tp_rank: 0,
            }
        );
        // tp fastest: pp 2 × tp 2, replica 0 is ranks 0..4
        let mut c = cfg(ScheduleKind::OneFOneB, 2, 1, 2);
        c.tp = 2;
        assert_eq!(c.world_size(), 8);
        assert_eq!(c.place(5).tp_rank, 1);
        assert_eq!((c.place(5).replica, c.place(5).pp_rank), (1, 0));
        assert_eq!(c.tensor_parallel_group(1, 0), [4, 5]);
        assert_eq!(data_parallel_groups(&c)[1], [1, 5]);
        assert_eq!(pipeline_links(&c)[..4], [(0, 2), (1, 3), (2, 0), (3, 1)]);
        assert_eq!(tensor_parallel_groups(&c).len(), 4);
        // interleaved: stage 3 (rank 1) feeds stage 4 (rank 0) too, which 0 ↔ 1 covers
        let c = cfg(ScheduleKind::Interleaved1F1B, 2, 2, 1);
        assert_eq!(pipeline_links(&c), [(0, 1), (1, 0)]);
        assert!(data_parallel_groups(&c).is_empty());
        let c = cfg(ScheduleKind::OneFOneB, 4, 1, 1);
        assert_eq!(pipeline_links(&c).len(), 6);
    }
}
