//! The memory margin a plan keeps free: the GPU kind's memory band by default, or what
//! `--memory-margin` says (GiB, or a share of the GPU's memory).

use crate::bands;

/// The memory a plan must leave free on every GPU, and where that figure comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Margin {
    /// Bytes that must stay free per GPU.
    pub mem_bytes: u64,
    /// Where the figure comes from, as printed after it (`±7.6%: …`, `--memory-margin 8%`).
    pub source: String,
}

/// A `--memory-margin` value that is neither GiB (at most
/// [`crate::config::MAX_MEMORY_SETTING_BYTES`]) nor a percentage below 100.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "'{0}' is not a margin; give GiB (e.g. 4) or a share of the GPU's memory below 100% (e.g. 8%)"
)]
pub struct BadMargin(pub String);

impl Margin {
    /// The margin for a GPU kind `gpu` of `capacity_bytes`: `flag` (`4`, `4GiB`, `8%`) when given,
    /// else the kind's bundled memory band (none when no band is bundled).
    pub fn new(flag: Option<&str>, gpu: &str, capacity_bytes: u64) -> Result<Margin, BadMargin> {
        let Some(text) = flag else {
            return Ok(match bands::memory_band(gpu) {
                Some((f, why)) => Margin {
                    mem_bytes: bands::margin_bytes(f, capacity_bytes),
                    source: format!("±{:.1}%: {why}", 100.0 * f),
                },
                None => Margin {
                    mem_bytes: 0,
                    source: "no memory band bundled".to_string(),
                },
            });
        };
        let t = text.trim();
        let number = |s: &str| {
            s.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
        };
        let bad = || BadMargin(text.to_string());
        let source = format!("--memory-margin {t}");
        if let Some(pct) = t.strip_suffix('%') {
            let p = number(pct).filter(|p| *p < 100.0).ok_or_else(bad)?;
            return Ok(Margin {
                mem_bytes: bands::margin_bytes(p / 100.0, capacity_bytes),
                source,
            });
        }
        let g = t
            .strip_suffix("GiB")
            .or_else(|| t.strip_suffix("gib"))
            .unwrap_or(t);
        let g = number(g).ok_or_else(bad)?;
        let mem_bytes = (g * (1u64 << 30) as f64).round();
        if mem_bytes > crate::config::MAX_MEMORY_SETTING_BYTES as f64 {
            return Err(bad());
        }
        Ok(Margin {
            mem_bytes: mem_bytes as u64,
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_margin_is_gib_or_a_share_of_memory() {
        let cap = 80u64 << 30;
        // 4 GiB = 4 × 2^30 bytes; 8% of 80 GiB = 6.4 GiB, rounded up to a whole byte
        assert_eq!(
            Margin::new(Some("4"), "h100-sxm", cap).unwrap().mem_bytes,
            4 << 30
        );
        assert_eq!(
            Margin::new(Some("4GiB"), "h100-sxm", cap)
                .unwrap()
                .mem_bytes,
            4 << 30
        );
        let pct = Margin::new(Some("8%"), "h100-sxm", cap).unwrap();
        assert_eq!(pct.mem_bytes, (0.08 * cap as f64).ceil() as u64);
        assert_eq!(pct.source, "--memory-margin 8%");
        for bad in ["-1", "100%", "four", "nan"] {
            assert!(Margin::new(Some(bad), "h100-sxm", cap).is_err(), "{bad}");
        }
    }
}
