//! Which world rank is which, and what travels between them: ranks are numbered replica-major
//! (`rank = replica · pp + pp_rank`); a pipeline's neighbouring stages on different ranks are
//! linked both ways; the replicas of each pipeline rank form its data-parallel group.

use crate::config::ExecConfig;
use crate::error::ExecError;

/// Where a world rank sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// World rank, `replica · pp + pp_rank`.
    pub rank: usize,
    /// Data-parallel replica.
    pub replica: usize,
    /// Pipeline rank.
    pub pp_rank: usize,
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
        Place {
            rank,
            replica: rank / self.pp(),
            pp_rank: rank % self.pp(),
        }
    }

    /// The world rank of pipeline rank `pp_rank` in replica `replica`.
    pub fn world_rank(&self, replica: usize, pp_rank: usize) -> usize {
        replica * self.pp() + pp_rank
    }

    /// The data-parallel group of pipeline rank `pp_rank`: its world rank in every replica,
    /// in replica order.
    pub fn data_parallel_group(&self, pp_rank: usize) -> Vec<usize> {
        (0..self.dp).map(|d| self.world_rank(d, pp_rank)).collect()
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
                let (a, b) = (cfg.world_rank(replica, a), cfg.world_rank(replica, b));
                links.push((a, b));
                links.push((b, a));
            }
        }
    }
    links.sort_unstable();
    links.dedup();
    links
}

/// The data-parallel groups of `cfg` (the replicas of each pipeline rank, in replica order),
/// when there is more than one replica.
pub fn data_parallel_groups(cfg: &ExecConfig) -> Vec<Vec<usize>> {
    if cfg.dp < 2 {
        return Vec::new();
    }
    (0..cfg.pp()).map(|p| cfg.data_parallel_group(p)).collect()
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
                pp_rank: 1
            }
        );
        // interleaved: stage 3 (rank 1) feeds stage 4 (rank 0) too, which 0 ↔ 1 covers
        let c = cfg(ScheduleKind::Interleaved1F1B, 2, 2, 1);
        assert_eq!(pipeline_links(&c), [(0, 1), (1, 0)]);
        assert!(data_parallel_groups(&c).is_empty());
        let c = cfg(ScheduleKind::OneFOneB, 4, 1, 1);
        assert_eq!(pipeline_links(&c).len(), 6);
    }
}
