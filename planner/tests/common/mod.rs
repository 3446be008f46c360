//! What the planner's stage-cost tests share: a plain stage context that each test changes
//! with struct update syntax, so that a field added to `StageContext` is set here once.

use autopp_hardware::{AnalyticProfile, Link};
use autopp_models::Recompute;
use autopp_planner::stages::StageContext;

/// Megatron's layers at `tp` on `link` (tensor, context and expert groups alike) under `mode`:
/// no context or expert parallelism, no overlap beyond Megatron's own, a host that runs ahead.
pub fn plain_context(
    profile: &AnalyticProfile,
    tp: u64,
    link: Link,
    mode: Recompute,
) -> StageContext<'_> {
    StageContext {
        profile,
        tp,
        tp_link: link,
        recompute: mode,
        cp: 1,
        cp_link: link,
        cp_kv_bytes: 0,
        tp_comm_overlap: false,
        ep: 1,
        ep_link: link,
        ep_hidden_share: 0.0,
        ep_across_share: 1.0,
        selective_linear_share: 0.0,
        dtensor_tp: false,
        torch_native: false,
        torch_compiled: false,
        fused_qkv: false,
        compiled_loss: false,
        expert_host_launches: false,
        host_serialized: false,
    }
}
