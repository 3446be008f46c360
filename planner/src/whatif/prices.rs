//! GPU prices for what-if costs: USD per GPU-hour by GPU kind, from a file or `--price`.
//!
//! Cost is GPU-hours × the kind's price; nothing else is added.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::PlanError;

/// The example price table shipped with autopp (`planner/data/example-prices.json`). It is an
/// example: the user's own prices go in a file of the same format or in `--price`.
pub const EXAMPLE_PRICES_JSON: &str = include_str!("../../data/example-prices.json");

/// USD per GPU-hour by GPU kind.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Prices {
    usd_per_gpu_hour: BTreeMap<String, f64>,
    /// Where the prices came from (a file's path, `--price`, or the example table).
    pub source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PriceFile {
    #[serde(default)]
    #[allow(dead_code)]
    note: Option<String>,
    usd_per_gpu_hour: BTreeMap<String, f64>,
}

impl Prices {
    /// `whatif`'s prices: the file at `path` (`--prices`), else `pairs` (`--price`), else the
    /// example table when a token budget is given (`with_tokens`), else none.
    pub fn from_flags(
        path: Option<&str>,
        pairs: Option<&str>,
        with_tokens: bool,
    ) -> Result<Self, PlanError> {
        Ok(match (path, pairs) {
            (Some(path), _) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    PlanError::invalid("--prices", format!("cannot read '{path}': {e}"))
                })?;
                Prices::from_json(&text, "--prices")?
            }
            (None, Some(pairs)) => Prices::from_pairs(pairs)?,
            (None, None) if with_tokens => Prices::example(),
            (None, None) => Prices::none(),
        })
    }

    /// No prices: costs are left empty.
    pub fn none() -> Self {
        Prices::default()
    }

    /// Reads a price file: `{"note": "...", "usd_per_gpu_hour": {"h100-sxm": 2.5, ...}}`.
    /// `origin` names the file (or flag) in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Self, PlanError> {
        let file: PriceFile = serde_json::from_str(text).map_err(|e| {
            PlanError::invalid(
                origin,
                format!(
                    "not a price file ({e}): write {{\"usd_per_gpu_hour\": {{\"h100-sxm\": 2.5}}}}"
                ),
            )
        })?;
        let prices = Prices {
            usd_per_gpu_hour: file.usd_per_gpu_hour,
            source: origin.to_string(),
        };
        prices.check_values(origin)?;
        Ok(prices)
    }

    /// Parses `--price KIND=USD_PER_GPU_HOUR,…`.
    pub fn from_pairs(text: &str) -> Result<Self, PlanError> {
        let mut usd_per_gpu_hour = BTreeMap::new();
        for pair in text.split(',') {
            let Some((kind, usd)) = pair.split_once('=') else {
                return Err(PlanError::invalid(
                    "--price",
                    format!("'{pair}' is not KIND=USD_PER_GPU_HOUR (e.g. h100-sxm=2.5)"),
                ));
            };
            let usd: f64 = usd.trim().parse().map_err(|_| {
                PlanError::invalid(
                    "--price",
                    format!("'{usd}' is not a number of USD per GPU-hour"),
                )
            })?;
            usd_per_gpu_hour.insert(kind.trim().to_string(), usd);
        }
        let prices = Prices {
            usd_per_gpu_hour,
            source: "--price".to_string(),
        };
        prices.check_values("--price")?;
        Ok(prices)
    }

    fn check_values(&self, origin: &str) -> Result<(), PlanError> {
        for (kind, usd) in &self.usd_per_gpu_hour {
            if !(usd.is_finite() && *usd > 0.0) {
                return Err(PlanError::invalid(
                    origin,
                    format!("the price of {kind} must be a positive number of USD per GPU-hour (got {usd})"),
                ));
            }
        }
        Ok(())
    }

    /// Refuses a price for a kind the sweep does not include (most likely a typo).
    pub fn check_kinds(&self, swept: &[&str]) -> Result<(), PlanError> {
        if self.source == EXAMPLE_SOURCE {
            return Ok(());
        }
        for kind in self.usd_per_gpu_hour.keys() {
            if !swept.contains(&kind.as_str()) {
                return Err(PlanError::invalid(
                    if self.source == "--price" { "--price" } else { "--prices" },
                    format!(
                        "a price for {kind}, which the sweep does not include (it sweeps {}): add it to --gpu or remove the price",
                        dedup(swept).join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The example table shipped with autopp.
    pub fn example() -> Self {
        let mut p = Prices::from_json(EXAMPLE_PRICES_JSON, EXAMPLE_SOURCE)
            .unwrap_or_else(|_| Prices::none());
        p.source = EXAMPLE_SOURCE.to_string();
        p
    }

    /// USD per GPU-hour of `kind`, if priced.
    pub fn usd_per_gpu_hour(&self, kind: &str) -> Option<f64> {
        self.usd_per_gpu_hour.get(kind).copied()
    }

    /// `gpu_hours` of `kind` in USD: GPU-hours × price, if priced.
    pub fn cost_usd(&self, kind: &str, gpu_hours: f64) -> Option<f64> {
        self.usd_per_gpu_hour(kind).map(|p| gpu_hours * p)
    }
}

/// The source name of the example table.
pub const EXAMPLE_SOURCE: &str = "the example price table (planner/data/example-prices.json)";

fn dedup<'a>(kinds: &[&'a str]) -> Vec<&'a str> {
    let mut v = kinds.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cost_is_gpu_hours_times_the_price_exactly() {
        let p = Prices::from_pairs("h100-sxm=2.5,a100-80g=1.75").expect("prices");
        assert_eq!(p.cost_usd("h100-sxm", 1000.0), Some(2500.0));
        assert_eq!(p.cost_usd("a100-80g", 3.0), Some(5.25));
        assert_eq!(p.cost_usd("b200", 3.0), None);
    }

    #[test]
    fn bad_prices_name_the_flag() {
        for bad in [
            "h100-sxm",
            "h100-sxm=x",
            "h100-sxm=0",
            "h100-sxm=-1",
            "h100-sxm=NaN",
        ] {
            let e = Prices::from_pairs(bad).expect_err(bad).to_string();
            assert!(e.starts_with("--price: "), "{e}");
        }
        let p = Prices::from_pairs("b200=5").expect("prices");
        let e = p
            .check_kinds(&["h100-sxm"])
            .expect_err("not swept")
            .to_string();
        assert!(e.contains("b200") && e.contains("h100-sxm"), "{e}");
        let e = Prices::from_json("{\"usd_per_gpu_hour\": 3}", "--prices")
            .expect_err("bad file")
            .to_string();
        assert!(e.starts_with("--prices: "), "{e}");
    }

    #[test]
    fn the_example_table_loads() {
        let p = Prices::example();
        assert!(p.usd_per_gpu_hour("h100-sxm").is_some_and(|u| u > 0.0));
    }
}
