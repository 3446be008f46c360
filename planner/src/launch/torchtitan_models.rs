//! Which torchtitan config function builds a plan's model: torchtitan's own where it ships the
//! plan's model (Llama 3 8B and 70B, Qwen3 14B and 32B), else a config module autopp writes
//! beside the launch files, the model built from the plan's sizes by torchtitan's own Llama 3
//! or Qwen3 classes.

use autopp_models::{Norm, PositionEmbedding, TransformerSpec};

use super::torchtitan::TITAN;
use super::view::{PlanView, LLAMA3_ROPE_THETA, QWEN3_ROPE_THETA};
use super::Refusal;
use crate::framework::Framework;

const FW: Framework = Framework::Torchtitan;

/// The torchtitan model family whose classes build a plan's model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    /// `torchtitan.models.llama3`: grouped-query attention with the head size `h / a`.
    Llama3,
    /// `torchtitan.models.qwen3`: RMSNorm on each head's queries and keys (qk-norm) and a head
    /// size of its own.
    Qwen3,
}

/// A torchtitan config function and the model it defines.
struct Config {
    family: Family,
    module: &'static str,
    function: &'static str,
    /// layers, hidden, heads, key/value heads, head size, FFN, vocabulary
    shape: [u64; 7],
    /// The RoPE base θ (dimensionless).
    rope_theta: u64,
    /// The longest sequence its RoPE table holds, tokens (`max_seq_len`).
    max_seq_len: u64,
}

/// The config function a launch selects, and the module to write beside the launch files when
/// torchtitan does not ship it.
pub(super) struct Selected {
    /// `--module`.
    pub module: &'static str,
    /// `--config`.
    pub function: &'static str,
    /// The text of [`CONFIG_MODULE`], when the function is autopp's.
    pub file: Option<String>,
}

/// File name of the config module written when torchtitan's own config does not fit the plan.
pub(super) const CONFIG_MODULE: &str = "autopp_torchtitan.py";

/// torchtitan's `llama3_405b` converts linear layers to float8 (and refuses to build below
/// NVIDIA SM89) and compiles; autopp plans bf16, so the launch uses this bf16 config: the
/// `llama3_70b` recipe with the 405B model and `llama3_405b`'s optimizer settings.
const LLAMA3_405B_BF16: &str = r#""""torchtitan config for autopp's plan: Llama 3 405B in bf16.

Written by `autopp launch --framework torchtitan`. torchtitan's own llama3_405b converts linear
layers to float8 and compiles the model; autopp planned bf16 GEMMs, so this is the llama3_70b
recipe with the 405B model and llama3_405b's optimizer settings. Select it with
`--module autopp_torchtitan --config llama3_405b_bf16` (this directory on PYTHONPATH).
"""

from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
from torchtitan.components.optimizer import default_adamw, LRSchedulersContainer
from torchtitan.models.common.config_utils import decoder_vocab_size
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_70b


def llama3_405b_bf16():
    """llama3_70b's recipe with the 405B model, in bf16."""
    config = llama3_70b()
    config.model_spec = model_registry("405B")
    config.hf_assets_path = "./assets/hf/Llama-3.1-405B"
    config.optimizer = default_adamw(lr=8e-5)
    config.lr_scheduler = LRSchedulersContainer.Config(warmup_steps=600)
    config.loss = ChunkedLossWrapper.Config(
        loss_fn=CrossEntropyLoss.Config(
            global_vocab_size=decoder_vocab_size(config.model_spec),
        ),
    )
    return config
"#;

/// The configs torchtitan 0.3.0 ships for models autopp plans
/// (`torchtitan/models/llama3/config_registry.py`, `torchtitan/models/qwen3/config_registry.py`;
/// Llama 3's RoPE tables hold 131,072 positions, Qwen3's 40,960), and autopp's bf16 405B.
const CONFIGS: [Config; 5] = [
    Config {
        family: Family::Llama3,
        module: "llama3",
        function: "llama3_8b",
        shape: [32, 4096, 32, 8, 128, 14336, 128256],
        rope_theta: LLAMA3_ROPE_THETA,
        max_seq_len: 131_072,
    },
    Config {
        family: Family::Llama3,
        module: "llama3",
        function: "llama3_70b",
        shape: [80, 8192, 64, 8, 128, 28672, 128256],
        rope_theta: LLAMA3_ROPE_THETA,
        max_seq_len: 131_072,
    },
    Config {
        family: Family::Llama3,
        module: "autopp_torchtitan",
        function: "llama3_405b_bf16",
        shape: [126, 16384, 128, 8, 128, 53248, 128256],
        rope_theta: LLAMA3_ROPE_THETA,
        max_seq_len: 131_072,
    },
    Config {
        family: Family::Qwen3,
        module: "qwen3",
        function: "qwen3_14b",
        shape: [40, 5120, 40, 8, 128, 17408, 151936],
        rope_theta: QWEN3_ROPE_THETA,
        max_seq_len: 40_960,
    },
    Config {
        family: Family::Qwen3,
        module: "qwen3",
        function: "qwen3_32b",
        shape: [64, 5120, 64, 8, 128, 25600, 151936],
        rope_theta: QWEN3_ROPE_THETA,
        max_seq_len: 40_960,
    },
];

/// The config function that defines the plan's model: torchtitan's own when it ships the
/// plan's shape, RoPE base and a RoPE table as long as the plan's sequences, else
/// [`CUSTOM_FUNCTION`] in a [`CONFIG_MODULE`] built from the plan's sizes.
pub(super) fn config_for(view: &PlanView) -> Result<Selected, Refusal> {
    let model = &view.model;
    let family = family(model).map_err(|why| Refusal::Model(FW, why))?;
    let shape = [
        model.num_layers,
        model.hidden_size,
        model.num_attention_heads,
        model.kv_heads(),
        model.head_dim(),
        model.ffn(),
        model.vocab_size,
    ];
    let shipped = CONFIGS.iter().find(|c| {
        c.family == family
            && c.shape == shape
            && c.rope_theta == view.rope_theta()
            && model.seq_length <= c.max_seq_len
    });
    Ok(match shipped {
        Some(c) => Selected {
            module: c.module,
            function: c.function,
            file: (c.module == CUSTOM_MODULE).then(|| LLAMA3_405B_BF16.to_string()),
        },
        None => Selected {
            module: CUSTOM_MODULE,
            function: CUSTOM_FUNCTION,
            file: Some(custom_module(view, family)),
        },
    })
}

/// The family whose torchtitan classes build `model` — Qwen3's for a model with qk-norm,
/// Llama 3's otherwise — or why neither can: both build decoders with SwiGLU, RMSNorm, rotary
/// positions (no position parameters), no biases, whole heads per key/value head, and an LM
/// head of its own (torchtitan ties weights only without a pipeline); Llama 3's heads are
/// `h / a` wide.
pub(super) fn family(model: &TransformerSpec) -> Result<Family, String> {
    let mut differs = Vec::new();
    if !model.gated_mlp {
        differs.push("a plain (not SwiGLU) MLP");
    }
    if model.bias || model.has_qkv_bias() {
        differs.push("biases");
    }
    if model.norm != Norm::Rmsnorm {
        differs.push("LayerNorm");
    }
    if model.position_embedding != PositionEmbedding::None {
        differs.push("learned positions");
    }
    if model.tied_embeddings {
        differs.push("a tied LM head");
    }
    if !model.num_attention_heads.is_multiple_of(model.kv_heads()) {
        differs.push("heads that do not group evenly over the key/value heads");
    }
    let family = if model.qk_norm {
        Family::Qwen3
    } else {
        Family::Llama3
    };
    if family == Family::Llama3 && model.head_dim() * model.num_attention_heads != model.hidden_size
    {
        differs.push("a head size apart from hidden / heads without Qwen3's qk-norm");
    }
    if differs.is_empty() {
        return Ok(family);
    }
    // autopp writes DeepSpeed no head size of its own and no qk-norm (`launch::not_written_yet`)
    let others = if model.head_dim.is_some() || model.qk_norm {
        "megatron"
    } else {
        "megatron or deepspeed"
    };
    Err(format!(
        "0.3.0 builds Llama 3- and Qwen3-style decoders only (SwiGLU, RMSNorm, rotary positions, no biases, untied LM head; a head size of its own with qk-norm), and {} has {}; re-plan with --framework {others}",
        model.name,
        differs.join(", ")
    ))
}

/// The module name of [`CONFIG_MODULE`].
pub(super) const CUSTOM_MODULE: &str = "autopp_torchtitan";

/// The config function autopp writes for a model torchtitan ships no config for.
const CUSTOM_FUNCTION: &str = "autopp_model";

/// The text of [`CONFIG_MODULE`] for a Llama 3-style model, with `@key@` where
/// [`custom_module`] puts the plan's sizes.
const LLAMA3_TEMPLATE: &str = include_str!("autopp_torchtitan.py.in");

/// The text of [`CONFIG_MODULE`] for a Qwen3-style model.
const QWEN3_TEMPLATE: &str = include_str!("autopp_torchtitan_qwen3.py.in");

/// [`CONFIG_MODULE`] for a model torchtitan ships no config for: the model built with
/// torchtitan's own Llama 3 or Qwen3 classes from the plan's sizes (the FFN width passed as
/// is, not through `compute_ffn_hidden_dim`), in `llama3_8b`'s or `qwen3_32b`'s recipe.
fn custom_module(view: &PlanView, family: Family) -> String {
    let m = &view.model;
    let theta = view.rope_theta();
    // Llama 3.1's frequency scaling goes with Llama 3's base, as in torchtitan's configs
    let scaling = if theta == LLAMA3_ROPE_THETA {
        "llama"
    } else {
        "none"
    };
    let eps = format!("{:e}", view.norm_eps());
    let fills = [
        ("TITAN", TITAN.to_string()),
        ("CUSTOM_MODULE", CUSTOM_MODULE.to_string()),
        ("CUSTOM_FUNCTION", CUSTOM_FUNCTION.to_string()),
        ("layers", m.num_layers.to_string()),
        ("dim", m.hidden_size.to_string()),
        ("heads", m.num_attention_heads.to_string()),
        ("kv_heads", m.kv_heads().to_string()),
        ("head_dim", m.head_dim().to_string()),
        ("ffn", m.ffn().to_string()),
        ("vocab", m.vocab_size.to_string()),
        ("seq", m.seq_length.to_string()),
        ("theta", theta.to_string()),
        ("scaling", scaling.to_string()),
        ("eps", eps),
        // last, so that a name cannot hold a key: a JSON string is a Python string literal;
        // the docstring gets the name without quotes
        (
            "quoted",
            serde_json::Value::from(m.name.as_str()).to_string(),
        ),
        ("name", m.name.replace(['"', '\\'], "_")),
    ];
    let template = match family {
        Family::Llama3 => LLAMA3_TEMPLATE,
        Family::Qwen3 => QWEN3_TEMPLATE,
    };
    fills.iter().fold(template.to_string(), |text, (k, v)| {
        text.replace(&format!("@{k}@"), v)
    })
}
