//! Pins for some of a configuration's fields (`--fix KEY=VALUE`): what the search must keep
//! and what a framework's rules check ([`crate::Framework::check_pins`]).

use autopp_models::Recompute;
use serde::{Deserialize, Serialize};

use crate::degrees::Degrees;
use crate::schedule::ScheduleKind;

/// Pins for some of a configuration's fields (`--fix KEY=VALUE`); `None` leaves a field free.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Fixed {
    /// Pinned degrees (tensor, pipeline, data, context parallelism; stages per rank).
    #[serde(flatten)]
    pub degrees: Degrees<Option<u64>>,
    /// Sequences per micro-batch.
    pub micro_batch_size: Option<u64>,
    /// Schedule.
    pub schedule: Option<ScheduleKind>,
    /// Recompute mode.
    pub recompute: Option<Recompute>,
    /// ZeRO stage.
    pub zero_stage: Option<u8>,
    /// Sequence parallelism.
    pub sequence_parallel: Option<bool>,
}

impl Fixed {
    /// Parses `KEY=VALUE,KEY=VALUE`; errors name the key and list the valid ones.
    pub fn parse(text: &str) -> Result<Fixed, String> {
        let mut f = Fixed::default();
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("'{item}' is not KEY=VALUE"))?;
            let (key, value) = (key.trim(), value.trim());
            let num = || {
                value
                    .parse::<u64>()
                    .ok()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| format!("{key}={value}: expected a positive whole number"))
            };
            match key {
                "tp" => f.degrees.tp = Some(num()?),
                "pp" => f.degrees.pp = Some(num()?),
                "dp" => f.degrees.dp = Some(num()?),
                "cp" => f.degrees.cp = Some(num()?),
                "virtual_stages" | "virtual" => f.degrees.virtual_stages = Some(num()?),
                "micro_batch_size" | "mbs" => f.micro_batch_size = Some(num()?),
                "schedule" => f.schedule = Some(value.parse()?),
                "recompute" => f.recompute = Some(value.parse()?),
                "zero_stage" | "zero" => {
                    let z = value
                        .parse::<u8>()
                        .ok()
                        .filter(|&z| z <= 3)
                        .ok_or_else(|| format!("{key}={value}: expected 0, 1, 2 or 3"))?;
                    f.zero_stage = Some(z);
                }
                "sequence_parallel" | "sp" => {
                    f.sequence_parallel = Some(match value {
                        "true" | "on" | "1" => true,
                        "false" | "off" | "0" => false,
                        _ => return Err(format!("{key}={value}: expected true or false")),
                    })
                }
                other => {
                    return Err(format!(
                        "unknown key '{other}': use tp, pp, dp, cp, virtual_stages, micro_batch_size, schedule, recompute, zero_stage, sequence_parallel"
                    ))
                }
            }
        }
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fix_parses_and_rejects_unknown_keys() {
        let f = Fixed::parse("tp=8, pp=16,recompute=full,schedule=1f1b,sp=true,zero=1").unwrap();
        assert_eq!(f.degrees.tp, Some(8));
        assert_eq!(f.degrees.pp, Some(16));
        assert_eq!(f.recompute, Some(Recompute::Full));
        assert_eq!(f.schedule, Some(ScheduleKind::OneFOneB));
        assert_eq!(f.sequence_parallel, Some(true));
        assert_eq!(f.zero_stage, Some(1));
        assert!(Fixed::parse("tensor=8")
            .unwrap_err()
            .contains("unknown key 'tensor'"));
        assert!(Fixed::parse("tp=0").unwrap_err().contains("tp=0"));
        assert!(Fixed::parse("zero=5").is_err());
    }
}
