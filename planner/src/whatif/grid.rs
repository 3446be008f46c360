//! The sweep's axes: GPU counts (`64,128,256` or a doubling range `64..4096`) and the batch
//! policy.

use autopp_hardware::{hardware, Cluster};

use super::Point;
use crate::PlanError;

/// Most points one `--gpus` value may give (a doubling range from 1 reaches 2^63 in 64).
const MAX_COUNTS: usize = 64;

/// The machines of a sweep from the catalog: every GPU kind of `kinds` with every GPUs-per-node
/// of `gpus_per_node` (default: the kind's NVLink domain) and every NIC of `nic_gbps` in Gbit/s
/// per GPU (default: the kind's).
pub fn machines(
    kinds: &[String],
    gpus_per_node: Option<&[u64]>,
    nic_gbps: Option<&[f64]>,
) -> Result<Vec<Cluster>, PlanError> {
    let nics: Vec<Option<f64>> = match nic_gbps {
        Some(v) => v.iter().map(|&x| Some(x)).collect(),
        None => vec![None],
    };
    let mut out = Vec::new();
    for kind in kinds {
        let gpu = hardware::gpu(kind).map_err(|e| PlanError::invalid("--gpu", e.to_string()))?;
        let domain = [gpu.nvlink_domain];
        for &gpn in gpus_per_node.unwrap_or(&domain) {
            for &nic in &nics {
                out.push(Cluster::new(gpu.clone(), gpn, gpn, nic)?);
            }
        }
    }
    Ok(out)
}

/// The machines of `files` (`--cluster`, cluster.json files), read in order.
pub fn cluster_files(files: &[String]) -> Result<Vec<Cluster>, PlanError> {
    files
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(|e| {
                PlanError::invalid("--cluster", format!("cannot read '{path}': {e}"))
            })?;
            Ok(Cluster::from_json(&text, path)?)
        })
        .collect()
}

/// Every machine of `templates` at every GPU count of `counts`.
pub fn points(templates: &[Cluster], counts: &[u64]) -> Vec<Point> {
    templates
        .iter()
        .flat_map(|t| {
            counts.iter().map(|&gpus| Point {
                template: t.clone(),
                gpus,
            })
        })
        .collect()
}

/// Parses `--gpus`: a comma-separated list of counts (`64,128,256`) or a doubling range
/// (`64..4096`: 64, 128, …, 4096; the upper end is included when the doubling reaches it).
/// Counts are positive, distinct and returned in increasing order.
pub fn parse_gpu_counts(text: &str) -> Result<Vec<u64>, PlanError> {
    let bad = |m: String| PlanError::invalid("--gpus", m);
    let count = |s: &str| -> Result<u64, PlanError> {
        match s.trim().parse::<u64>() {
            Ok(0) => Err(bad("a GPU count must be at least 1".into())),
            Ok(n) => Ok(n),
            Err(_) => Err(bad(format!(
                "'{}' is not a whole number of GPUs: write counts like 64,128 or a doubling range like 64..4096",
                s.trim()
            ))),
        }
    };
    let mut counts = if let Some((lo, hi)) = text.split_once("..") {
        let (lo, hi) = (count(lo)?, count(hi)?);
        if lo > hi {
            return Err(bad(format!(
                "the range {lo}..{hi} is empty: put the smaller count first"
            )));
        }
        let mut v = Vec::new();
        let mut n = lo;
        while n <= hi && v.len() < MAX_COUNTS {
            v.push(n);
            n = match n.checked_mul(2) {
                Some(m) => m,
                None => break,
            };
        }
        v
    } else {
        text.split(',').map(count).collect::<Result<Vec<_>, _>>()?
    };
    counts.sort_unstable();
    counts.dedup();
    if counts.len() > MAX_COUNTS {
        return Err(bad(format!("at most {MAX_COUNTS} counts per sweep")));
    }
    Ok(counts)
}

/// How the global batch follows the cluster.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BatchPolicy {
    /// The same global batch, in sequences, at every point.
    Fixed {
        /// Sequences per iteration.
        sequences: u64,
    },
    /// A batch that grows with the cluster: this many tokens per GPU per iteration, rounded to
    /// whole sequences (at least one).
    TokensPerGpu {
        /// Tokens per GPU per iteration.
        tokens: u64,
    },
}

impl BatchPolicy {
    /// The global batch, in sequences, at `gpus` GPUs for sequences of `seq_len` tokens.
    pub fn global_batch(self, gpus: u64, seq_len: u64) -> u64 {
        match self {
            BatchPolicy::Fixed { sequences } => sequences,
            BatchPolicy::TokensPerGpu { tokens } => {
                let total = tokens as u128 * gpus as u128;
                let seqs = (total + seq_len.max(1) as u128 / 2) / seq_len.max(1) as u128;
                seqs.clamp(1, u64::MAX as u128) as u64
            }
        }
    }

    /// The policy in words, for the table's header.
    pub fn describe(self) -> String {
        match self {
            BatchPolicy::Fixed { sequences } => {
                format!("fixed global batch of {sequences} sequences at every point")
            }
            BatchPolicy::TokensPerGpu { tokens } => format!(
                "global batch grows with the cluster: {tokens} tokens per GPU per iteration"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_doubling_ranges() {
        assert_eq!(parse_gpu_counts("128,64,64").expect("list"), vec![64, 128]);
        assert_eq!(
            parse_gpu_counts("64..512").expect("range"),
            vec![64, 128, 256, 512]
        );
        assert_eq!(parse_gpu_counts("64..100").expect("range"), vec![64]);
        for bad in ["", "0,8", "512..64", "x", "8..", "-8"] {
            let e = parse_gpu_counts(bad).expect_err(bad).to_string();
            assert!(e.starts_with("--gpus: "), "{e}");
        }
    }

    #[test]
    fn a_growing_batch_rounds_tokens_to_sequences() {
        // 64 GPUs × 65,536 tokens = 4,194,304 tokens = 512 sequences of 8,192
        let p = BatchPolicy::TokensPerGpu { tokens: 65_536 };
        assert_eq!(p.global_batch(64, 8192), 512);
        assert_eq!(p.global_batch(1, 8192), 8);
        assert_eq!(
            BatchPolicy::TokensPerGpu { tokens: 1 }.global_batch(1, 8192),
            1
        );
        assert_eq!(
            BatchPolicy::Fixed { sequences: 7 }.global_batch(4096, 8192),
            7
        );
    }
}

/// Parses a token count with an optional suffix: `15T`, `1.5T`, `300B`, `4M`, `4194304`
/// (K = 10³, M = 10⁶, B or G = 10⁹, T = 10¹²). `flag` names the flag in errors.
pub fn parse_tokens(text: &str, flag: &str) -> Result<f64, PlanError> {
    let t = text.trim();
    let (num, scale) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let scale = match c.to_ascii_uppercase() {
                'K' => 1e3,
                'M' => 1e6,
                'B' | 'G' => 1e9,
                'T' => 1e12,
                _ => {
                    return Err(PlanError::invalid(
                        flag,
                        format!("'{t}': unknown suffix '{c}' (use K, M, B or T, e.g. 15T)"),
                    ))
                }
            };
            (&t[..i], scale)
        }
        _ => (t, 1.0),
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * scale >= 1.0 => Ok(v * scale),
        Ok(_) => Err(PlanError::invalid(
            flag,
            format!("'{t}' must be a positive number of tokens (e.g. 15T)"),
        )),
        Err(_) => Err(PlanError::invalid(
            flag,
            format!("'{t}' is not a number of tokens (write e.g. 15T, 300B or 4M)"),
        )),
    }
}

#[cfg(test)]
mod token_tests {
    use super::*;

    #[test]
    fn token_counts_take_suffixes() {
        assert_eq!(parse_tokens("15T", "--tokens").expect("15T"), 15e12);
        assert_eq!(parse_tokens("1.5t", "--tokens").expect("1.5t"), 1.5e12);
        assert_eq!(parse_tokens("300B", "--tokens").expect("300B"), 300e9);
        assert_eq!(parse_tokens("4194304", "--tokens").expect("n"), 4_194_304.0);
        for bad in ["0", "0T", "-1T", "T", "NaN", "inf", "5X", ""] {
            let e = parse_tokens(bad, "--tokens").expect_err(bad).to_string();
            assert!(e.starts_with("--tokens: "), "{e}");
        }
    }
}
