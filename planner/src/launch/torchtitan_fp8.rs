//! torchtitan's FP8 training: torchao's float8 (rowwise scaling) or MXFP8 linear layers, set by
//! converters in a Python config function (torchtitan 0.3.0 has no command-line flag for them).
//!
//! The launch writes a config function that calls the plan's base config (torchtitan's own
//! `llama3_8b`/`llama3_70b`, or autopp's in the same module) and converts the decoder blocks'
//! linear layers with `Float8LinearConverter` (`recipe_name="rowwise"`, the LM head filtered
//! out) or `MXFP8LinearConverter` (`fqns=["layers."]`), the converters' `model_compile_enabled`
//! set since the launch compiles the blocks. autopp predicts the LM head in bf16 for every
//! framework, and torchtitan's `llama3_405b` filters it the same way.

use autopp_hardware::Precision;

use super::torchtitan::TITAN;
use super::torchtitan_models::{Selected, CUSTOM_MODULE};
use super::view::PlanView;

/// The text appended to (or making up) [`super::torchtitan_models::CONFIG_MODULE`], with `@key@` where [`converted`]
/// puts the names.
const TEMPLATE: &str = include_str!("autopp_torchtitan_fp8.py.in");

/// The docstring of [`super::torchtitan_models::CONFIG_MODULE`] when the base config is torchtitan's own.
const HEADER: &str = r#""""torchtitan config for autopp's plan: @BASE@ with FP8 linear layers.

Written by `autopp launch --framework torchtitan`. torchtitan 0.3.0 sets FP8 training through
model converters in a config function; @FUNCTION@ below is torchtitan's @BASE@ with them.
Select it with `--module autopp_torchtitan --config @FUNCTION@` (this directory on PYTHONPATH).
"""
"#;

/// The converter class, its options and the function's name for `precision`, or `None` for a
/// precision without a torchtitan converter autopp writes (bf16 needs none).
fn converter(precision: Precision) -> Option<(&'static str, &'static str, &'static str)> {
    match precision {
        Precision::Fp8Rowwise => Some((
            "Float8LinearConverter",
            r#"recipe_name="rowwise", filter_fqns=["lm_head"]"#,
            "autopp_float8",
        )),
        Precision::Mxfp8 => Some((
            "MXFP8LinearConverter",
            r#"fqns=["layers."]"#,
            "autopp_mxfp8",
        )),
        _ => None,
    }
}

/// `selected` with its linear layers converted for `view`'s precision: a config function in
/// [`super::torchtitan_models::CONFIG_MODULE`] that wraps the selected one (appended to autopp's module, or in a module
/// of its own over torchtitan's). `selected` as it is for bf16.
pub(super) fn converted(view: &PlanView, selected: Selected) -> Selected {
    let Some((class, options, function)) = converter(view.precision) else {
        return selected;
    };
    let base = selected.function;
    let import = match selected.file {
        Some(_) => String::new(),
        None => format!(
            "    from torchtitan.models.{}.config_registry import {base}\n",
            selected.module
        ),
    };
    let fills = [
        ("FUNCTION", function.to_string()),
        ("BASE", base.to_string()),
        ("PRECISION", view.precision.to_string()),
        ("TITAN", TITAN.to_string()),
        ("CONVERTER", class.to_string()),
        ("OPTIONS", options.to_string()),
        ("IMPORT", import),
    ];
    let fill = |template: &str| {
        fills.iter().fold(template.to_string(), |text, (k, v)| {
            text.replace(&format!("@{k}@"), v)
        })
    };
    // the base module's text is not filled again: a model's name may hold an `@key@`
    let head = selected.file.unwrap_or_else(|| fill(HEADER));
    Selected {
        module: CUSTOM_MODULE,
        function,
        file: Some(head + &fill(TEMPLATE)),
    }
}
