//! `--scale-down`: a plan for a model far too large for this machine, run with the plan's
//! structure on a small model of the executor's subset.
//!
//! Kept from the plan: the degrees (tp, pp, dp, stages per rank), the schedule, the
//! micro-batching (micro-batches, micro-batch size) and the split's shape — each stage keeps
//! its embedding or head and `⌈n/f⌉` of its `n` blocks, `f` chosen so the fullest stage keeps
//! [`MAX_BLOCKS_PER_STAGE`]. Replaced: the width (hidden `32·tp`, `2·tp` heads of 16, FFN
//! `4·hidden`, vocabulary `256·tp`), the sequence length (the caller's) and whatever the
//! executor does not implement (RMSNorm, gated MLPs, grouped-query attention, tied
//! embeddings, dropout become LayerNorm, a GeLU MLP, multi-head attention, an untied head, no
//! dropout). The run then has the plan's ranks, messages, collectives and order of actions, on
//! layers small enough for the CPU.

use autopp_models::{LayerKind, Norm, TransformerSpec};
use autopp_schedule::split::default_split;
use autopp_schedule::PipelinePlan;

use crate::error::ExecError;

/// Blocks the fullest stage keeps.
pub const MAX_BLOCKS_PER_STAGE: usize = 2;

/// A plan scaled down: the model and pipeline to run, and what changed, in one line.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledDown {
    /// The small model.
    pub model: TransformerSpec,
    /// The plan's pipeline with the split scaled.
    pub pipeline: PipelinePlan,
    /// What was kept and what was replaced (for the output).
    pub note: String,
}

/// `original` under `pipeline` with tensor-parallel degree `tp`, scaled down to sequences of
/// `seq_len` tokens (see the module's documentation).
pub fn scale_down(
    original: &TransformerSpec,
    pipeline: &PipelinePlan,
    tp: usize,
    seq_len: u64,
) -> Result<ScaledDown, ExecError> {
    let stages = pipeline.spec.pp * pipeline.spec.virtual_stages;
    let entries = original.num_layers as usize + 2;
    let split = match &pipeline.split {
        Some(s) => s.clone(),
        None => {
            let mut kinds = vec![LayerKind::Embedding];
            kinds.extend(std::iter::repeat_n(LayerKind::Transformer, entries - 2));
            kinds.push(LayerKind::Head);
            default_split(&kinds, stages)?
        }
    };
    // blocks per stage: the entries less the embedding (stage 0) and the head (the last)
    let last = split.len().saturating_sub(1);
    let ends = |s: usize| usize::from(s == 0) + usize::from(s == last);
    let blocks: Vec<usize> = split
        .iter()
        .enumerate()
        .map(|(s, &n)| n.saturating_sub(ends(s)))
        .collect();
    let most = blocks.iter().copied().max().unwrap_or(0);
    let f = most.div_ceil(MAX_BLOCKS_PER_STAGE).max(1);
    let kept: Vec<usize> = blocks.iter().map(|&b| b.div_ceil(f)).collect();
    let new_split: Vec<usize> = kept.iter().enumerate().map(|(s, &b)| b + ends(s)).collect();
    let tp64 = tp.max(1) as u64;
    let mut m = original.clone();
    m.name = format!("{} (scaled down)", original.name);
    m.num_layers = kept.iter().sum::<usize>() as u64;
    m.hidden_size = 32 * tp64;
    m.num_attention_heads = 2 * tp64;
    m.num_kv_heads = None;
    m.ffn_hidden_size = Some(4 * m.hidden_size);
    m.vocab_size = 256 * tp64;
    m.seq_length = seq_len;
    m.max_position_embeddings = None;
    m.gated_mlp = false;
    m.tied_embeddings = false;
    m.norm = Norm::Layernorm;
    m.dropout = false;
    m.qkv_bias = None;
    m.global_batch_size = None;
    let note = format!(
        "scaled down: {} ({} blocks, hidden {}, {} heads, vocabulary {}) runs as {} blocks split {:?} (the plan's {:?}, ÷{f} per stage), hidden {}, {} heads, FFN {}, vocabulary {}, {} tokens, LayerNorm and a GeLU MLP with multi-head attention; the plan's tp, pp, dp, stages per rank, schedule and micro-batching are kept",
        original.name,
        original.num_layers,
        original.hidden_size,
        original.num_attention_heads,
        original.vocab_size,
        m.num_layers,
        new_split,
        split,
        m.hidden_size,
        m.num_attention_heads,
        m.ffn(),
        m.vocab_size,
        seq_len,
    );
    let mut pipeline = pipeline.clone();
    pipeline.split = Some(new_split);
    Ok(ScaledDown {
        model: m,
        pipeline,
        note,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use autopp_models::Model;
    use autopp_schedule::{ScheduleKind, ScheduleSpec};

    /// An 80-layer plan over 8 stages keeps its shape at 2 blocks for the fullest stage.
    #[test]
    fn the_split_keeps_its_shape() {
        let Model::Transformer(llama) = autopp_models::load("llama3-70b").unwrap() else {
            panic!("a transformer")
        };
        let pipeline = PipelinePlan {
            spec: ScheduleSpec::new(ScheduleKind::OneFOneB, 8, 16),
            dp: 2,
            micro_batch_size: 1,
            split: Some(vec![10, 10, 10, 10, 11, 10, 11, 10]),
        };
        let s = scale_down(&llama, &pipeline, 4, 16).unwrap();
        // blocks 9, 10, 10, 10, 11, 10, 11, 9 ÷ 6 → 2, 2, 2, 2, 2, 2, 2, 2
        assert_eq!(s.pipeline.split, Some(vec![3, 2, 2, 2, 2, 2, 2, 3]));
        assert_eq!(s.model.num_layers, 16);
        assert_eq!((s.model.hidden_size, s.model.num_attention_heads), (128, 8));
        let mut cfg =
            crate::ExecConfig::from_plan(&Model::Transformer(s.model), &s.pipeline).unwrap();
        cfg.tp = 4;
        cfg.validate().unwrap();
        assert!(s.note.contains("llama3-70b (80 blocks"), "{}", s.note);
    }
}
