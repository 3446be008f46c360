//! The search made for a framework at an FP8 precision leaves out the shapes its FP8 GEMMs
//! refuse ([`launch::fp8_gemm_fault`]: Transformer Engine's under Megatron-LM, torchao's under
//! torchtitan): `autopp launch` would refuse them, so that every plan of `plan --framework
//! megatron --precision fp8` (or torchtitan's `fp8-rowwise`) launches, and `--framework any`
//! never answers such a plan "runs on none" when another runs.

use autopp_hardware::Precision;
use autopp_models::{Model, TransformerSpec};

use super::{space, Key, SearchOptions};
use crate::config::PlanError;
use crate::framework::Framework;
use crate::launch::{self, Fp8GemmFault, GemmShape};

/// The rule a search keeps to: the framework, model and precision whose GEMMs must run.
pub(super) struct Fp8Gemms<'a> {
    framework: Framework,
    model: &'a TransformerSpec,
    precision: Precision,
}

impl<'a> Fp8Gemms<'a> {
    /// The rule of `opts`' framework and precision, or `None` when every shape runs: a
    /// precision whose GEMMs take any shape, a framework without FP8 kernels autopp launches
    /// (`any-mix`, DeepSpeed), a layer list.
    pub fn of(model: &'a Model, opts: &SearchOptions) -> Option<Self> {
        let Model::Transformer(t) = model else {
            return None;
        };
        let (framework, precision) = (opts.limits.framework, opts.settings.precision);
        launch::fp8_gemm_multiples(framework, precision).map(|_| Fp8Gemms {
            framework,
            model: t,
            precision,
        })
    }

    /// Why the framework's FP8 GEMMs refuse `k`'s shapes, or `None` when they run them.
    pub fn fault(&self, k: &Key) -> Option<Fp8GemmFault> {
        let shape = GemmShape {
            tp: k.degrees.tp,
            cp: k.degrees.cp,
            micro_batch_size: k.micro_batch_size,
            sequence_parallel: k.sequence_parallel,
        };
        launch::fp8_gemm_fault(self.framework, self.model, self.precision, shape)
    }
}

/// Whether the search leaves `k` out under `rule`.
pub(super) fn refused(rule: Option<&Fp8Gemms<'_>>, k: &Key) -> bool {
    rule.is_some_and(|r| r.fault(k).is_some())
}

/// The error when the rule left out every configuration the pins and batch allow on `gpus`
/// GPUs (`None` when some configuration runs, or none was there to leave out): the first
/// configuration's fault, which names the sizes and the fix.
pub(super) fn all_refused(model: &Model, gpus: u64, opts: &SearchOptions) -> Option<PlanError> {
    let rule = Fp8Gemms::of(model, opts)?;
    let (mut first, mut runs) = (None, false);
    space::visit(
        model,
        gpus,
        opts.global_batch_size,
        &opts.limits,
        &opts.fixed,
        &mut |k| match rule.fault(&k) {
            Some(f) => {
                first.get_or_insert(f);
            }
            None => runs = true,
        },
    );
    let fault = first.filter(|_| !runs)?;
    let framework = launch::name(rule.framework);
    Some(PlanError::invalid(
        "--precision",
        format!(
            "{framework} cannot run any of these plans: {}",
            fault.message()
        ),
    ))
}
