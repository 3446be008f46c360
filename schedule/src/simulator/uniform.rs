//! Uniform per-stage durations written as `F=1,B=2,I=1,W=1` (the `schedule` command's costs).

use std::str::FromStr;

/// The same duration for each action kind on every stage, in the caller's time unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UniformCosts {
    /// Forward.
    pub f: f64,
    /// Full backward.
    pub b: f64,
    /// Backward-input.
    pub i: f64,
    /// Backward-weight.
    pub w: f64,
}

impl Default for UniformCosts {
    /// `F=1 B=2 I=1 W=1`: a backward costs two forwards, split evenly into I and W.
    fn default() -> Self {
        UniformCosts {
            f: 1.0,
            b: 2.0,
            i: 1.0,
            w: 1.0,
        }
    }
}

/// Why a costs string cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CostsError {
    /// A part without `=`.
    #[error("`{0}` is not KIND=TIME; write e.g. F=1,B=2,I=1,W=1")]
    NotKeyValue(String),
    /// A time that is not a finite number ≥ 0.
    #[error("`{0}` needs a finite time >= 0; write e.g. F=1,B=2")]
    BadTime(String),
    /// An action other than F, B, I and W.
    #[error("unknown action `{action}` in `{part}`; the actions are F, B, I and W")]
    UnknownAction {
        /// The action given.
        action: String,
        /// The part it was in.
        part: String,
    },
}

impl FromStr for UniformCosts {
    type Err = CostsError;

    /// Parses `F=1,B=2,I=1,W=1`: any subset, in any order, case-insensitive; the rest keep
    /// their [`Default`] values.
    fn from_str(text: &str) -> Result<Self, CostsError> {
        let mut c = UniformCosts::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(CostsError::NotKeyValue(part.to_string()));
            };
            let value: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| CostsError::BadTime(part.to_string()))?;
            match key.trim().to_ascii_uppercase().as_str() {
                "F" => c.f = value,
                "B" => c.b = value,
                "I" => c.i = value,
                "W" => c.w = value,
                other => {
                    return Err(CostsError::UnknownAction {
                        action: other.to_string(),
                        part: part.to_string(),
                    })
                }
            }
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_parse_subsets_and_reject_bad_input() {
        assert_eq!(
            "F=1,B=2,I=1,W=1".parse::<UniformCosts>().unwrap(),
            UniformCosts::default()
        );
        let c: UniformCosts = "b=3, F=0.5".parse().unwrap();
        assert_eq!((c.f, c.b, c.i, c.w), (0.5, 3.0, 1.0, 1.0));
        for bad in ["F=1,X=2", "F", "F=-1", "F=nan", "B=abc"] {
            assert!(bad.parse::<UniformCosts>().is_err(), "{bad}");
        }
    }
}
