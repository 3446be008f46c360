//! A configuration as `estimate`'s flags give it: the degrees, the batching and the settings
//! given, with `plan`'s choices for the settings left out (and said in words).

use autopp_hardware::{Cluster, Precision};
use autopp_models::{Model, Recompute};

use crate::config::{EvalSettings, ParallelConfig, PlanError};
use crate::degrees::Degrees;
use crate::experts::ExpertParallel;
use crate::framework::Framework;
use crate::pins::Fixed;
use crate::runtime::Stack;
use crate::schedule::ScheduleKind;

/// The settings `estimate`'s flags gave (`None`: left out).
#[derive(Debug, Clone, Copy, Default)]
pub struct Given {
    /// `--sequence-parallel`.
    pub sequence_parallel: Option<bool>,
    /// `--zero`.
    pub zero_stage: Option<u8>,
    /// `--recompute`.
    pub recompute: Option<Recompute>,
    /// `--precision`.
    pub precision: Option<Precision>,
    /// `--framework`.
    pub framework: Option<Stack>,
}

/// The settings `estimate` uses: the given ones, and `plan`'s choices for the others.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// Megatron sequence parallelism.
    pub sequence_parallel: bool,
    /// ZeRO stage.
    pub zero_stage: u8,
    /// Recompute mode.
    pub recompute: Recompute,
    /// Math precision.
    pub precision: Precision,
    /// The software stack whose runtime predicts it.
    pub framework: Stack,
    /// The settings chosen by default, in words (`sequence parallel on (tp ≥ 2)`).
    pub used: Vec<String>,
}

impl Given {
    /// Fills the settings left out as `plan`'s search almost always chooses them for a
    /// configuration of tensor-parallel degree `tp` and `replicas` (dp · cp) copies of the
    /// weights: sequence parallelism with tp ≥ 2 (it saves activation memory at the same
    /// communication volume), a sharded optimizer with more than one replica (ZeRO 1, Megatron's
    /// distributed optimizer, or the framework's first sharded stage), no recompute, bf16, and
    /// Megatron-Core's runtime.
    pub fn resolve(&self, tp: u64, replicas: u64) -> Chosen {
        let mut used = Vec::new();
        let framework = self.framework.unwrap_or_else(|| {
            used.push("megatron-core runtime".to_string());
            Stack::MegatronCore
        });
        let sequence_parallel = self.sequence_parallel.unwrap_or_else(|| {
            used.push(match tp > 1 {
                true => "sequence parallel on (tp ≥ 2)".to_string(),
                false => "sequence parallel off (tp 1)".to_string(),
            });
            tp > 1
        });
        let zero_stage = self.zero_stage.unwrap_or_else(|| {
            let sharded = framework
                .family()
                .zero_stages()
                .iter()
                .copied()
                .find(|&z| z > 0);
            let z = sharded.filter(|_| replicas > 1).unwrap_or(0);
            used.push(match z {
                0 => "ZeRO 0 (one replica)".to_string(),
                1 => "ZeRO 1 (distributed optimizer)".to_string(),
                z => format!("ZeRO {z}"),
            });
            z
        });
        let recompute = self.recompute.unwrap_or_else(|| {
            used.push("recompute none".to_string());
            Recompute::None
        });
        let precision = self.precision.unwrap_or_else(|| {
            used.push("bf16".to_string());
            Precision::Bf16
        });
        Chosen {
            sequence_parallel,
            zero_stage,
            recompute,
            precision,
            framework,
            used,
        }
    }
}

/// A configuration as flags give it, before the defaults.
#[derive(Debug, Clone, Default)]
pub struct Requested {
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Pipeline-parallel degree.
    pub pp: u64,
    /// Data-parallel degree (`None`: GPUs / (tp · pp · cp)).
    pub dp: Option<u64>,
    /// Context-parallel degree.
    pub cp: u64,
    /// Sequences per micro-batch.
    pub micro_batch_size: u64,
    /// Stages per pipeline rank (`None`: the schedule's default).
    pub virtual_stages: Option<u64>,
    /// Pipeline schedule (`None`: 1F1B, or interleaved 1F1B with stages per rank > 1).
    pub schedule: Option<ScheduleKind>,
    /// Micro-batch group size of interleaved schedules.
    pub group_size: Option<u64>,
    /// Fully recomputed layers per stage (partial recompute).
    pub recompute_layers: Option<Vec<u64>>,
    /// Layer-list entries per stage.
    pub split: Option<Vec<usize>>,
    /// Expert parallelism.
    pub experts: ExpertParallel,
    /// Sequences per iteration.
    pub global_batch_size: u64,
    /// Headroom kept free per GPU, bytes.
    pub memory_reserve_bytes: u64,
    /// A fused attention kernel.
    pub flash_attention: bool,
    /// The settings given.
    pub given: Given,
}

impl Requested {
    /// The configuration on `gpus` GPUs, and the settings chosen by default in words.
    pub fn build(&self, gpus: u64) -> Result<(ParallelConfig, Vec<String>), PlanError> {
        for (flag, v) in [
            ("--tp", self.tp),
            ("--pp", self.pp),
            ("--cp", self.cp),
            ("--mbs", self.micro_batch_size),
            ("--virtual", self.virtual_stages.unwrap_or(1)),
        ] {
            if v == 0 {
                return Err(PlanError::invalid(flag, "must be at least 1"));
            }
        }
        let (schedule, virtual_stages) =
            ParallelConfig::schedule_or_default(self.schedule, self.virtual_stages);
        let degrees = match self.dp {
            Some(dp) => Degrees {
                tp: self.tp,
                pp: self.pp,
                dp,
                cp: self.cp,
                virtual_stages,
            },
            None => Degrees::filling(gpus, self.tp, self.pp, self.cp, virtual_stages)?,
        };
        let chosen = self.given.resolve(degrees.tp, degrees.dp * degrees.cp);
        let settings = EvalSettings {
            precision: chosen.precision,
            memory_reserve_bytes: self.memory_reserve_bytes,
            // a configuration given whole: fits means fits in the GPU's memory
            memory_margin_bytes: 0,
            flash_attention: self.flash_attention,
            runtime: chosen.framework.runtime(),
        };
        if let Some(stack) = self.given.framework.filter(|s| !s.family().runs(schedule)) {
            return Err(PlanError::invalid(
                "--schedule",
                format!("{stack} does not run {schedule}; name another --framework or schedule"),
            ));
        }
        let config = ParallelConfig::new(degrees, self.micro_batch_size, self.global_batch_size)
            .with_schedule(schedule)
            .with_group_size(self.group_size)
            .with_recompute(chosen.recompute)
            .with_recompute_layers(self.recompute_layers.clone())
            .with_sequence_parallel(chosen.sequence_parallel)
            .with_zero_stage(chosen.zero_stage)
            .with_split(self.split.clone())
            .with_settings(settings)
            .with_experts(self.experts);
        Ok((config, chosen.used))
    }
}

/// The keys `estimate --plan FILE --set KEY=VALUE,…` takes.
pub const SET_KEYS: &str = "tp, pp, dp, cp, mbs, ep, etp, v (virtual_stages), schedule, recompute, sp (sequence_parallel), zero, precision, global_batch";

/// Changes `c` as `text` says (`tp=4,recompute=full`, `--set`): degrees left out keep theirs,
/// except dp, which refills the same GPUs when tp, pp or cp change; a new pp or stage count
/// drops the plan's split and recompute counts (the even split); a new recompute mode drops the
/// recompute counts.
pub fn set(c: &mut ParallelConfig, text: &str) -> Result<(), PlanError> {
    let gpus = c.num_gpus();
    let (mut dp_given, mut schedule_given, mut v_given) = (false, false, false);
    let before = c.degrees;
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            PlanError::invalid(
                "--set",
                format!("'{pair}' is not KEY=VALUE; keys: {SET_KEYS}"),
            )
        })?;
        let (key, value) = (key.trim(), value.trim());
        let bad = |what: &str| PlanError::invalid("--set", format!("{key}={value}: {what}"));
        let count = |most: u64| -> Result<u64, PlanError> {
            match value.parse::<u64>() {
                Ok(n) if (1..=most).contains(&n) => Ok(n),
                _ => Err(bad(&format!("give a whole number from 1 to {most}"))),
            }
        };
        match key {
            "tp" => c.degrees.tp = count(gpus)?,
            "pp" => c.degrees.pp = count(gpus)?,
            "cp" => c.degrees.cp = count(gpus)?,
            "dp" => (c.degrees.dp, dp_given) = (count(gpus)?, true),
            "v" | "virtual_stages" => (c.degrees.virtual_stages, v_given) = (count(1024)?, true),
            "mbs" | "micro_batch_size" => c.micro_batch_size = count(1 << 20)?,
            "ep" => c.experts.ep = count(gpus)?,
            "etp" => c.experts.etp = count(gpus)?,
            "global_batch" | "global_batch_size" => c.global_batch_size = count(1 << 40)?,
            "zero" | "zero_stage" => {
                c.zero_stage = match value.parse::<u8>() {
                    Ok(z) if z <= 3 => z,
                    _ => return Err(bad("give 0, 1, 2 or 3")),
                }
            }
            "sp" | "sequence_parallel" => {
                c.sequence_parallel = match value {
                    "on" | "true" | "1" | "yes" => true,
                    "off" | "false" | "0" | "no" => false,
                    _ => return Err(bad("give on or off")),
                }
            }
            "schedule" => {
                c.schedule = value
                    .parse::<ScheduleKind>()
                    .map_err(|e| bad(&e.to_string()))?;
                schedule_given = true;
            }
            "recompute" => {
                c.recompute = value
                    .parse::<Recompute>()
                    .map_err(|e| bad(&e.to_string()))?;
                c.recompute_layers = None;
            }
            "precision" => {
                c.settings.precision = value
                    .parse::<Precision>()
                    .map_err(|e| bad(&e.to_string()))?
            }
            _ => {
                return Err(PlanError::invalid(
                    "--set",
                    format!("unknown key '{key}'; keys: {SET_KEYS}"),
                ))
            }
        }
    }
    if schedule_given && !v_given {
        c.degrees.virtual_stages = ParallelConfig::schedule_or_default(Some(c.schedule), None).1;
    }
    if v_given && !schedule_given {
        c.schedule = ParallelConfig::schedule_or_default(None, Some(c.degrees.virtual_stages)).0;
    }
    let d = c.degrees;
    if !dp_given && (d.tp, d.pp, d.cp) != (before.tp, before.pp, before.cp) {
        let per_replica = d.tp.saturating_mul(d.pp).saturating_mul(d.cp);
        if !gpus.is_multiple_of(per_replica) {
            return Err(PlanError::invalid(
                "--set",
                format!("tp · pp · cp = {per_replica} does not divide the plan's {gpus} GPUs; change them, or give dp too"),
            ));
        }
        c.degrees.dp = gpus / per_replica;
    }
    if (d.pp, d.virtual_stages) != (before.pp, before.virtual_stages) {
        c.split = None;
        c.recompute_layers = None;
    }
    if c.degrees.pp == 1 {
        c.group_size = None;
    }
    Ok(())
}

/// `plan --fix TEXT` (or none) for `framework` on `model`: the pins, refused where the
/// framework cannot honour them (a pin it does not run, a tp that splits key/value heads, expert
/// degrees the model or the GPUs cannot take: [`Fixed::check_experts`]).
pub fn pins(
    text: Option<&str>,
    framework: Framework,
    model: &Model,
    cluster: &Cluster,
) -> Result<Fixed, PlanError> {
    let fixed = match text {
        Some(t) => Fixed::parse(t).map_err(|e| PlanError::invalid("--fix", e))?,
        None => Fixed::default(),
    };
    framework.check_pins(&fixed)?;
    fixed.check_experts(model, cluster.num_gpus(), framework)?;
    if let (Some(tp), Model::Transformer(t)) = (fixed.degrees.tp, model) {
        if framework.tp_splits_whole_kv_heads() && !t.kv_heads().is_multiple_of(tp) {
            return Err(PlanError::invalid(
                &format!("--fix tp={tp}"),
                format!(
                    "{framework} splits whole key/value heads over its tensor-parallel ranks, and {tp} does not divide {}'s {}",
                    t.name,
                    t.kv_heads()
                ),
            ));
        }
    }
    Ok(fixed)
}

/// Refuses `global_batch_size` sequences on `gpus` GPUs when that is more per GPU than the
/// search takes on ([`crate::search::MAX_SEQUENCES_PER_GPU`]).
pub fn check_batch(global_batch_size: u64, gpus: u64) -> Result<(), PlanError> {
    let most = crate::search::MAX_SEQUENCES_PER_GPU;
    if global_batch_size / gpus.max(1) > most {
        return Err(PlanError::invalid(
            "--global-batch",
            format!("{global_batch_size} sequences on {gpus} GPUs is more than {most} per GPU, the most the search takes on; use a smaller batch or more GPUs"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_32() -> ParallelConfig {
        let d = Degrees::filling(32, 4, 2, 1, 1).expect("degrees");
        ParallelConfig::new(d, 1, 1024).with_split(Some(vec![21, 21]))
    }

    #[test]
    fn set_refills_dp_and_drops_the_split_when_pp_changes() {
        let mut c = plan_32();
        set(&mut c, "tp=2,pp=4,recompute=full,sp=on,zero=1").expect("valid");
        assert_eq!((c.degrees.tp, c.degrees.pp, c.degrees.dp), (2, 4, 4));
        assert_eq!(c.split, None);
        assert_eq!(c.recompute, Recompute::Full);
        assert!(c.sequence_parallel);
        assert_eq!(c.zero_stage, 1);
        let mut c = plan_32();
        set(&mut c, "schedule=zb-v").expect("valid");
        assert_eq!(c.degrees.virtual_stages, 2, "zb-v's two stages per rank");
        let mut c = plan_32();
        set(&mut c, "v=3").expect("valid");
        assert_eq!(c.schedule, ScheduleKind::Interleaved1F1B);
    }

    #[test]
    fn set_names_the_key_and_the_valid_ones() {
        let e = set(&mut plan_32(), "tpp=4")
            .expect_err("unknown key")
            .to_string();
        assert!(e.contains("unknown key 'tpp'; keys: tp, pp"), "{e}");
        let e = set(&mut plan_32(), "tp=abc")
            .expect_err("bad value")
            .to_string();
        assert!(
            e.contains("tp=abc: give a whole number from 1 to 32"),
            "{e}"
        );
        let e = set(&mut plan_32(), "tp=3")
            .expect_err("not dividing")
            .to_string();
        assert!(e.contains("does not divide the plan's 32 GPUs"), "{e}");
        let e = set(&mut plan_32(), "zero=4")
            .expect_err("bad stage")
            .to_string();
        assert!(e.contains("zero=4: give 0, 1, 2 or 3"), "{e}");
    }
}
