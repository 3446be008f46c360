//! [`PipelinePlan`]: what a plan says about the pipeline, in the IR's terms — everything a
//! runner needs besides the model.

use serde::{Deserialize, Serialize};

use crate::generators::ScheduleSpec;

/// The pipeline a plan describes: the schedule to generate, the data-parallel replicas of the
/// pipeline, the micro-batch size and the layer split.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PipelinePlan {
    /// The schedule: kind, pipeline ranks `p`, stages per rank `v`, micro-batches per
    /// iteration per replica `m` and, for interleaved 1F1B, the group size.
    pub spec: ScheduleSpec,
    /// Data-parallel replicas of the pipeline.
    pub dp: usize,
    /// Sequences per micro-batch.
    pub micro_batch_size: usize,
    /// Layer-list entries (embedding, layers, head) per global stage, in stage order; `None`
    /// for the default split ([`default_split`](crate::default_split)).
    pub split: Option<Vec<usize>>,
}
