//! What a configuration's memory is made of, and whether it fits, decided before simulating:
//! each rank's activation peak walked along its list of the schedule.

use super::Evaluation;
use crate::memory::{self, MemoryContext};
use crate::stages::StageCost;

impl Evaluation<'_> {
    /// Everything besides the stages that decides a rank's memory.
    pub(super) fn memory_context(&self) -> MemoryContext {
        let (c, d) = (self.c, &self.c.degrees);
        MemoryContext {
            zero_stage: c.zero_stage,
            zero_shard: d.data_parallel_gpus(),
            expert_zero_shard: c.experts.expert_dp(d),
            comm_groups: d.num_comm_groups(),
            reserve_bytes: c.settings.memory_reserve_bytes,
            fp32_main_grads: c.settings.runtime.fp32_main_grads,
            // FP8 parameters: the FP8 weight and its transpose (2 B) take the 16-bit weight's
            // place (2 B), with no copy beside it
            fp8_copy_bytes_per_param: if c.settings.runtime.fp8_params {
                0
            } else {
                c.settings.precision.fp8_weight_copy_bytes_per_param()
            },
            stack: memory::StackMemory::of(c.settings.runtime.stack),
            optimizer_states: c.settings.runtime.optimizer_states,
            pp: d.pp,
        }
    }

    /// Each rank's peak activation bytes, walked along its list of the schedule
    /// ([`Schedule::peak_activation_bytes`]): the simulation's figure, without simulating.
    pub fn peak_activation_bytes(&self, costs: &[StageCost]) -> Vec<u64> {
        let bytes: Vec<(u64, u64)> = costs
            .iter()
            .map(|s| (s.activation_bytes, s.weight_grad_bytes))
            .collect();
        self.sched.peak_activation_bytes(&bytes)
    }

    /// Whether the configuration fits with its safety margin (`estimate`'s `fits`), from the
    /// walked activation peaks: what the simulation would say, at a fraction of its cost.
    pub fn fits_unsimulated(&self, costs: &[StageCost]) -> bool {
        self.peak_memory_unsimulated(costs) + self.c.settings.memory_margin_bytes
            <= self.profile.cluster.gpu.memory_bytes
    }

    /// The busiest rank's peak memory, bytes (`estimate`'s `peak_memory_bytes`), from the
    /// walked activation peaks, without simulating.
    pub fn peak_memory_unsimulated(&self, costs: &[StageCost]) -> u64 {
        let mem_ctx = self.memory_context();
        let peaks = self.peak_activation_bytes(costs);
        self.rank_stages
            .iter()
            .zip(&peaks)
            .map(|(ks, &peak)| {
                let st: Vec<&StageCost> = ks.iter().map(|&k| &costs[k]).collect();
                memory::rank_memory(&st, peak, &mem_ctx).total_bytes()
            })
            .max()
            .unwrap_or(0)
    }
}
