//! Batch units and time to train: `--global-batch-tokens`, the refusal of a batch that is
//! probably tokens typed as sequences, and `--train-tokens` in days, GPU-hours and cost.

use autopp_models::units::thousands;
use autopp_models::Model;
use serde::Serialize;

use crate::config::PlanError;
use crate::whatif::parse_tokens;

/// The global batch in sequences of `model`: `--global-batch-tokens` (`tokens`) or
/// `--global-batch` (`sequences`), else the model's, else about 4M tokens, with a note saying
/// it was defaulted; refused above [`MAX_TOKENS_PER_ITERATION`] unless `huge`.
pub fn global_batch(
    model: &Model,
    tokens: Option<&str>,
    sequences: Option<u64>,
    huge: bool,
) -> Result<(u64, Option<String>), PlanError> {
    let seq = model.seq_length();
    let flag = tokens.map(|t| sequences_from_tokens(t, seq)).transpose()?;
    let mut defaulted = autopp_models::Defaulted::default();
    let g = model
        .global_batch_or_default(flag.or(sequences), &mut defaulted)
        .map_err(|_| PlanError::invalid("--global-batch", "must be at least 1"))?;
    check_huge(g, seq, huge, tokens.is_some())?;
    let note = defaulted.global_batch.map(|g| {
        format!(
            "global batch {g} sequences ({} tokens), as the model names none; change it with --global-batch",
            thousands(g.saturating_mul(seq) as f64)
        )
    });
    Ok((g, note))
}

/// More tokens per iteration than this (100M) is refused without `--huge-batch`: published
/// runs use 1–16M.
pub const MAX_TOKENS_PER_ITERATION: u64 = 100_000_000;

/// `--global-batch-tokens TEXT` (`4M`, `4194304`) in sequences of `seq_len` tokens; the
/// tokens must be a whole number of sequences.
pub fn sequences_from_tokens(text: &str, seq_len: u64) -> Result<u64, PlanError> {
    let flag = "--global-batch-tokens";
    let tokens = parse_tokens(text, flag)?;
    let seq = seq_len.max(1);
    if tokens.fract() != 0.0 || tokens > u64::MAX as f64 || !(tokens as u64).is_multiple_of(seq) {
        let near = ((tokens / seq as f64).round() as u64).max(1);
        return Err(PlanError::invalid(
            flag,
            format!(
                "{text} tokens is not a whole number of {seq}-token sequences; give a multiple of {seq}, e.g. {} ({near} sequences)",
                near.saturating_mul(seq)
            ),
        ));
    }
    Ok(tokens as u64 / seq)
}

/// Refuses `sequences` of `seq_len` tokens per iteration above [`MAX_TOKENS_PER_ITERATION`]
/// unless `huge` (`--huge-batch`), naming the flag that was probably meant.
pub fn check_huge(
    sequences: u64,
    seq_len: u64,
    huge: bool,
    from_tokens: bool,
) -> Result<(), PlanError> {
    let tokens = sequences as f64 * seq_len as f64;
    if huge || tokens <= MAX_TOKENS_PER_ITERATION as f64 {
        return Ok(());
    }
    let (flag, hint) = match from_tokens {
        true => ("--global-batch-tokens", "check the suffix".to_string()),
        false => (
            "--global-batch",
            format!("did you mean --global-batch-tokens {sequences}?"),
        ),
    };
    Err(PlanError::invalid(
        flag,
        format!(
            "{sequences} sequences × {seq_len} tokens = {:.1}B tokens per iteration; {hint} (--huge-batch if you mean it)",
            tokens / 1e9
        ),
    ))
}

/// How long a token budget takes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeToTrain {
    /// Tokens to train on.
    pub tokens: f64,
    /// Wall-clock days: tokens / (tokens per second) / 86,400.
    pub days: f64,
    /// GPU-hours: days × 24 × GPUs.
    pub gpu_hours: f64,
    /// The price given (`--price`), USD per GPU-hour.
    pub price_usd_per_gpu_hour: Option<f64>,
    /// GPU-hours × the price, USD, when a price is given.
    pub cost_usd: Option<f64>,
}

/// `--train-tokens TEXT` at `tokens_per_s` on `gpus` GPUs, priced at `usd_per_gpu_hour`.
pub fn time_to_train(
    text: &str,
    tokens_per_s: f64,
    gpus: u64,
    usd_per_gpu_hour: Option<f64>,
) -> Result<TimeToTrain, PlanError> {
    let tokens = parse_tokens(text, "--train-tokens")?;
    if let Some(p) = usd_per_gpu_hour.filter(|p| !(p.is_finite() && *p >= 0.0)) {
        return Err(PlanError::invalid(
            "--price",
            format!("{p} is not a price; give USD per GPU-hour, e.g. 2.5"),
        ));
    }
    let seconds = tokens / tokens_per_s.max(f64::MIN_POSITIVE);
    let gpu_hours = seconds * gpus as f64 / 3600.0;
    Ok(TimeToTrain {
        tokens,
        days: seconds / 86_400.0,
        gpu_hours,
        price_usd_per_gpu_hour: usd_per_gpu_hour,
        cost_usd: usd_per_gpu_hour.map(|p| p * gpu_hours),
    })
}

/// `  to train      1.0T tokens: 12.3 days · 9,431 GPU-hours · $23,578 at $2.50/GPU-hour`.
pub fn train_line(t: &TimeToTrain) -> String {
    let tokens = match t.tokens {
        x if x >= 1e12 => format!("{:.1}T", x / 1e12),
        x if x >= 1e9 => format!("{:.1}B", x / 1e9),
        x => format!("{:.1}M", x / 1e6),
    };
    let mut o = format!(
        "  to train      {tokens} tokens: {:.1} days · {} GPU-hours",
        t.days,
        thousands(t.gpu_hours)
    );
    if let (Some(c), Some(p)) = (t.cost_usd, t.price_usd_per_gpu_hour) {
        o += &format!(" · ${} at ${p:.2}/GPU-hour", thousands(c));
    }
    o + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_to_train_by_hand() {
        // 1T tokens at 1M tokens/s: 1e6 s = 11.574 days; on 1,024 GPUs 284,444.4 GPU-hours;
        // at $2/GPU-hour $568,888.9
        let t = time_to_train("1T", 1e6, 1024, Some(2.0)).expect("valid");
        assert!((t.days - 1e6 / 86_400.0).abs() < 1e-9);
        assert!((t.gpu_hours - 284_444.444_444).abs() < 1e-3);
        assert!((t.cost_usd.expect("priced") - 568_888.888_889).abs() < 1e-3);
        assert_eq!(
            train_line(&t),
            "  to train      1.0T tokens: 11.6 days · 284,444 GPU-hours · $568,889 at $2.00/GPU-hour\n"
        );
        assert!(time_to_train("1T", 1e6, 8, Some(f64::NAN)).is_err());
        let e = time_to_train("1X", 1e6, 8, None)
            .expect_err("bad suffix")
            .to_string();
        assert!(e.contains("--train-tokens"), "{e}");
    }

    #[test]
    fn batch_tokens_become_sequences_or_say_why_not() {
        // 4M = 4,000,000 tokens is 976.6 sequences of 4,096 (nearest: 977 = 4,001,792); 4194304 is 1,024
        assert_eq!(sequences_from_tokens("4194304", 4096).expect("exact"), 1024);
        assert_eq!(sequences_from_tokens("4096K", 4096).expect("exact"), 1000);
        let e = sequences_from_tokens("4M", 4096)
            .expect_err("not whole")
            .to_string();
        assert!(
            e.contains("give a multiple of 4096, e.g. 4001792 (977 sequences)"),
            "{e}"
        );
        assert!(sequences_from_tokens("abc", 4096).is_err());
    }

    #[test]
    fn global_batch_from_flags_model_or_default() {
        let m = autopp_models::load("llama3-70b").expect("preset");
        // 1,048,576 tokens = 128 sequences of 8,192 (1M = 10^6 is not whole); the preset's own
        // batch is 512
        let g = global_batch(&m, Some("1048576"), None, false).unwrap();
        assert_eq!(g, (128, None));
        assert!(global_batch(&m, Some("1M"), None, false).is_err());
        assert_eq!(global_batch(&m, None, None, false).unwrap(), (512, None));
        let e = global_batch(&m, None, Some(4_194_304), false).unwrap_err();
        assert!(
            e.to_string().contains("did you mean --global-batch-tokens"),
            "{e}"
        );
        let plain = r#"{"name": "m", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "vocab_size": 100, "seq_length": 4096}"#;
        let m = autopp_models::load_str(plain, "m.json").expect("model.json");
        // no batch named: 2^22 / 4,096 = 1,024 sequences, 4,194,304 tokens
        let (g, note) = global_batch(&m, None, None, false).unwrap();
        assert_eq!(g, 1024);
        assert!(note
            .expect("defaulted")
            .contains("1024 sequences (4,194,304 tokens)"));
        assert!(global_batch(&m, None, Some(0), false).is_err());
    }

    #[test]
    fn a_batch_of_tokens_typed_as_sequences_is_refused() {
        let e = check_huge(4_194_304, 4096, false, false)
            .expect_err("17.2B tokens")
            .to_string();
        assert!(
            e.contains("4194304 sequences × 4096 tokens = 17.2B tokens per iteration; did you mean --global-batch-tokens 4194304?"),
            "{e}"
        );
        assert!(check_huge(4_194_304, 4096, true, false).is_ok());
        // 100M tokens exactly is allowed: 24,414 × 4,096 = 99,999,744
        assert!(check_huge(24_414, 4096, false, false).is_ok());
        assert!(check_huge(24_415, 4096, false, false).is_err());
    }
}
