//! Pins for some of a configuration's fields (`--fix KEY=VALUE`): what the search must keep
//! and what a framework's rules check ([`crate::Framework::check_pins`]).

use autopp_models::{Model, Recompute};
use serde::{Deserialize, Serialize};

use crate::config::PlanError;
use crate::degrees::Degrees;
use crate::framework::Framework;
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
    /// Expert-parallel degree (mixtures of experts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ep: Option<u64>,
    /// Expert-tensor-parallel degree (mixtures of experts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etp: Option<u64>,
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
                "ep" => f.ep = Some(num()?),
                "etp" => f.etp = Some(num()?),
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
                        "unknown key '{other}': use tp, pp, dp, cp, virtual_stages, micro_batch_size, schedule, recompute, zero_stage, sequence_parallel, ep, etp"
                    ))
                }
            }
        }
        Ok(f)
    }

    /// Refuses `ep`/`etp` pins the search could never honour for `model` on `gpus` GPUs under
    /// `framework`, naming the pin and the fix: expert parallelism on a dense model, an ep that
    /// is not a power of two dividing the routed experts (the space's ep values,
    /// [`crate::search::space::expert_degrees`]), an etp that does not split the expert FFN or
    /// is neither 1 nor a pinned tp, and `ep · etp` not dividing the GPUs of a pipeline rank
    /// (`gpus / pp` with pp pinned, `gpus` otherwise; Megatron's parallel folding).
    pub fn check_experts(
        &self,
        model: &Model,
        gpus: u64,
        framework: Framework,
    ) -> Result<(), PlanError> {
        let (ep, etp) = (self.ep.unwrap_or(1), self.etp.unwrap_or(1));
        let pin = |text: String| PlanError::invalid(&format!("--fix {}", pin_text(self)), text);
        let moe = match model {
            Model::Transformer(t) => t.moe.as_ref(),
            Model::Layers(_) => None,
        };
        let Some(moe) = moe else {
            if ep > 1 || etp > 1 {
                let name = model.name();
                return Err(pin(format!(
                    "model '{name}' has no experts: leave ep and etp out"
                )));
            }
            return Ok(());
        };
        let e = moe.num_experts;
        if !e.is_multiple_of(ep) || !ep.is_power_of_two() {
            let ok: Vec<String> = (0..64)
                .map(|i| 1u64 << i)
                .take_while(|&p| p <= e)
                .filter(|p| e.is_multiple_of(*p))
                .map(|p| p.to_string())
                .collect();
            return Err(pin(format!(
                "ep must be a power of two dividing {}'s {e} routed experts: use one of {}",
                model.name(),
                ok.join(", ")
            )));
        }
        let ffn = moe.moe_ffn_hidden_size;
        if !ffn.is_multiple_of(etp) {
            return Err(pin(format!(
                "etp must divide the expert FFN size {ffn}: use a divisor of it"
            )));
        }
        if etp > 1 && framework == Framework::Deepspeed {
            return Err(pin(
                "DeepSpeed-MoE does not split experts over tensor-parallel ranks: use etp=1".into(),
            ));
        }
        if let Some(tp) = self.degrees.tp.filter(|&tp| etp > 1 && etp != tp) {
            return Err(pin(format!(
                "etp must be 1 or tp ({tp}), the expert layouts the search tries: use etp=1 or etp={tp}"
            )));
        }
        let rank = self.degrees.pp.map_or(gpus, |pp| gpus / pp.max(1));
        let n = ep.saturating_mul(etp);
        if n > rank || !rank.is_multiple_of(n) {
            return Err(pin(format!(
                "ep · etp = {n} does not divide the {rank} GPUs of a pipeline rank the experts fold onto (tp · cp · dp): choose ep and etp whose product divides {rank}"
            )));
        }
        Ok(())
    }

    /// Of the (ep, etp) pairs the search space offers, those the pins keep.
    pub fn expert_pairs(&self, all: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
        all.into_iter()
            .filter(|&(ep, etp)| {
                self.ep.is_none_or(|f| f == ep) && self.etp.is_none_or(|f| f == etp)
            })
            .collect()
    }
}

/// The expert pins as `--fix` wrote them (`ep=8,etp=2`).
fn pin_text(f: &Fixed) -> String {
    let pins = [("ep", f.ep), ("etp", f.etp)];
    let given: Vec<String> = pins
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
        .collect();
    given.join(",")
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

    #[test]
    fn expert_pins_filter_the_pairs() {
        let f = Fixed::parse("ep=4").unwrap();
        assert_eq!((f.ep, f.etp), (Some(4), None));
        let all = vec![(1, 1), (2, 1), (4, 1), (1, 2), (4, 2)];
        assert_eq!(f.expert_pairs(all.clone()), [(4, 1), (4, 2)]);
        let f = Fixed::parse("ep=4,etp=2").unwrap();
        assert_eq!(f.expert_pairs(all.clone()), [(4, 2)]);
        assert_eq!(Fixed::default().expert_pairs(all.clone()), all);
        assert_eq!(pin_text(&f), "ep=4,etp=2");
    }
}
