//! Training defaults for models whose file says how long a sequence *may* be and names no batch
//! (a Hugging Face `config.json` of a long-context model: Qwen2.5's 131,072 tokens).
//!
//! - **Sequence length**: a model longer than [`MAX_DEFAULT_SEQ_LENGTH`] tokens is planned at
//!   [`MAX_DEFAULT_SEQ_LENGTH`] (the pre-training length of Llama 3 and Qwen2.5) unless a length
//!   is asked for; the CLI says so and names `--seq-len`.
//! - **Global batch**: a model that names none gets about [`DEFAULT_BATCH_TOKENS`] tokens per
//!   step (Llama 2's and GPT-3's ~4M-token batches), as a power of two of sequences so that it
//!   divides by the usual data-parallel and micro-batch sizes.

use crate::{Model, ModelError};

/// The longest sequence planned by default, tokens.
pub const MAX_DEFAULT_SEQ_LENGTH: u64 = 8192;

/// Tokens per global batch when the model names no batch: 2²² ≈ 4.2M.
pub const DEFAULT_BATCH_TOKENS: u64 = 1 << 22;

/// The default global batch in sequences for `seq_length`-token sequences: the power of two
/// nearest [`DEFAULT_BATCH_TOKENS`] / `seq_length` (at least 1). 8192 tokens → 512, 4096 →
/// 1024, 1000 → 4096.
pub fn default_global_batch(seq_length: u64) -> u64 {
    let exact = DEFAULT_BATCH_TOKENS as f64 / seq_length.max(1) as f64;
    if exact <= 1.0 {
        return 1;
    }
    let below = 1u64 << (exact.log2().floor() as u32);
    let above = below * 2;
    // nearest on a log scale
    if exact / below as f64 <= above as f64 / exact {
        below
    } else {
        above
    }
}

/// What [`Model::at_seq_length`] chose, for the CLI to print with the flag that
/// changes it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Defaulted {
    /// The model's own sequence length (tokens) when it was capped at
    /// [`MAX_DEFAULT_SEQ_LENGTH`]; `None` when the length was asked for or kept.
    pub seq_length_capped_from: Option<u64>,
    /// The global batch (sequences) chosen because neither the request nor the model named one.
    pub global_batch: Option<u64>,
}

impl Model {
    /// The model at `seq_length` tokens when given, else at its own length capped at
    /// [`MAX_DEFAULT_SEQ_LENGTH`] (a layer list keeps its own length: its costs hold for that
    /// length only).
    pub fn at_seq_length(self, seq_length: Option<u64>) -> Result<(Model, Defaulted), ModelError> {
        let mut defaulted = Defaulted::default();
        let model = match seq_length {
            Some(s) => self.with_seq_length(s)?,
            None => {
                let own = self.seq_length();
                if own > MAX_DEFAULT_SEQ_LENGTH && matches!(self, Model::Transformer(_)) {
                    defaulted.seq_length_capped_from = Some(own);
                    self.with_seq_length(MAX_DEFAULT_SEQ_LENGTH)?
                } else {
                    self
                }
            }
        };
        Ok((model, defaulted))
    }

    /// The global batch in sequences: `requested`, else the model's, else
    /// [`default_global_batch`] of its sequence length (reported in `defaulted`). Zero is an
    /// error naming `global_batch_size`.
    pub fn global_batch_or_default(
        &self,
        requested: Option<u64>,
        defaulted: &mut Defaulted,
    ) -> Result<u64, ModelError> {
        match requested.or(self.default_global_batch()) {
            Some(0) => Err(ModelError::invalid(
                "global_batch_size",
                "must be at least 1",
            )),
            Some(g) => Ok(g),
            None => {
                let g = default_global_batch(self.seq_length());
                defaulted.global_batch = Some(g);
                Ok(g)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_batches_are_about_4m_tokens_in_powers_of_two() {
        assert_eq!(default_global_batch(8192), 512);
        assert_eq!(default_global_batch(4096), 1024);
        assert_eq!(default_global_batch(2048), 2048);
        assert_eq!(default_global_batch(1000), 4096);
        assert_eq!(default_global_batch(3000), 1024); // 1398 is nearer 1024 than 2048 on a log scale
        assert_eq!(default_global_batch(1 << 23), 1);
        assert_eq!(default_global_batch(0), 1 << 22);
    }

    #[test]
    fn long_contexts_are_capped_unless_asked_for() {
        let model = crate::load("llama3-8b")
            .unwrap()
            .with_seq_length(131_072)
            .unwrap();
        let (m, d) = model.clone().at_seq_length(None).unwrap();
        assert_eq!(m.seq_length(), MAX_DEFAULT_SEQ_LENGTH);
        assert_eq!(d.seq_length_capped_from, Some(131_072));
        let (m, d) = model.at_seq_length(Some(32_768)).unwrap();
        assert_eq!(m.seq_length(), 32_768);
        assert_eq!(d.seq_length_capped_from, None);
    }
}
