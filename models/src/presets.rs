//! Bundled model presets, loadable by name (`autopp plan gpt3-175b …`).
//!
//! The files live in `models/presets/*.json` (autopp `model.json` format) and are embedded at
//! compile time, so the binary finds them from any directory. Their sources, per preset
//! (`models/presets/README.md` has the same list with the reasoning behind each global batch):
//!
//! * `gpt3-175b` — Brown et al. 2020 (GPT-3), Table 2.1: 96 layers, `h` 12288, 96 heads, `s`
//!   2048; GPT-2 BPE vocabulary of 50257; learned positions, LayerNorm, biases, tied embeddings.
//!   Global batch 1536 sequences as in Narayanan et al. 2021, Table 1 (175B row).
//! * `megatron-1t` — Narayanan et al. 2021, Table 1 (1008B row): 128 layers, `h` 25600, 160
//!   heads, `s` 2048, vocabulary 51200, global batch 3072.
//! * `mt-nlg-530b` — Smith et al. 2022 (Megatron-Turing NLG 530B), §3: 105 layers, `h` 20480,
//!   128 heads, `s` 2048, GPT-2 BPE vocabulary (50257), global batch 1920 (after the ramp-up).
//! * `bloom-176b` — BigScience 2022 (BLOOM), Table 3 and the `bigscience/bloom` config: 70
//!   layers, `h` 14336, 112 heads, `s` 2048, vocabulary 250880, ALiBi (no position parameters),
//!   no dropout, global batch 2048. BLOOM's extra LayerNorm after the word embedding (`2h` =
//!   28,672 parameters) is not modelled.
//! * `opt-175b` — Zhang et al. 2022 (OPT), Table 1: 96 layers, `h` 12288, 96 heads, `s` 2048,
//!   batch 2M tokens (1024 sequences of 2048 = 2,097,152 tokens); vocabulary 50272 and a learned
//!   position table of 2048 + 2 rows (the `facebook/opt-*` configs; OPT offsets positions by 2).
//! * `llama2-70b` — Touvron et al. 2023 (Llama 2), Table 1 and the `meta-llama/Llama-2-70b-hf`
//!   config: 80 layers, `h` 8192, 64 heads, 8 key/value heads, `f` 28672, vocabulary 32000,
//!   `s` 4096, untied; batch 4M tokens = 1024 sequences.
//! * `llama3-8b`, `llama3-70b`, `llama3-405b` — Llama Team 2024 ("The Llama 3 Herd of Models"),
//!   Table 3, and the `meta-llama/Meta-Llama-3-*` configs: 32 / 80 / 126 layers, `h` 4096 /
//!   8192 / 16384, 32 / 64 / 128 heads, 8 key/value heads, `f` 14336 / 28672 / 53248,
//!   vocabulary 128256, `s` 8192, untied. 405B: final batch 16M tokens = 2048 sequences (§3.4.1:
//!   4M tokens at 4096, then 8M at 8192, then 16M). Meta does not publish the 8B and 70B
//!   batches; autopp uses Llama 2's 4M tokens = 512 sequences of 8192.
//! * `llama2-7b`, `llama2-13b` — Touvron et al. 2023, Table 1, and the
//!   `meta-llama/Llama-2-7b-hf` / `-13b-hf` configs: 32 / 40 layers, `h` 4096 / 5120, 32 / 40
//!   heads (no GQA), `f` 11008 / 13824, vocabulary 32000, `s` 4096, untied; 6,738,415,616 and
//!   13,015,864,320 parameters; batch 4M tokens = 1024 sequences as for 70B.
//! * `gpt3-5b`, `gpt3-20b` — NeMo's `GPTConfig5B` / `GPTConfig20B`
//!   (`nemo/collections/llm/gpt/model/base.py`): 24 / 44 layers, `h` 4096 / 6144, 32 / 48 heads,
//!   `f` 4h, `s` 2048, Megatron-Core's GPT (learned positions, LayerNorm, biases, tied
//!   embeddings), GPT-2 BPE vocabulary (50257). Batches: those of NeMo 24.07's performance
//!   summary (`docs/source/performance/performance_summary.md`), 2048 and 256.
//! * `nemotron3-8b`, `nemotron3-22b`, `nemotron4-340b` — NeMo's `Nemotron3Config8B`,
//!   `Nemotron3Config22B` and `Nemotron4Config340B` (`nemo/collections/llm/gpt/model/nemotron.py`,
//!   the architectures NeMo 24.07's "Nemotron-8B / 22B / 340B" rows run): 32 / 40 / 96 layers,
//!   `h` 4096 / 6144 / 18432, 32 / 48 / 96 heads (8 key/value groups for 340B, none for the
//!   others), squared-ReLU MLP (not gated) with `f` 4h, LayerNorm (layernorm1p), no linear
//!   biases, rotary positions, untied embeddings, `s` 4096, vocabulary 256000 (Nemotron-4
//!   technical report, NVIDIA 2024, Table 1, for 340B: 341.0 B parameters). Batches: the
//!   performance summary's 256 for 8B and 22B; 340B's final 2304 (the report's §2.2 ramp).
//! * `tiny-gpt` — autopp's own: 8 layers, `h` 128, 4 heads, `s` 128, vocabulary 1024, GeLU MLP
//!   (`f` = 512), biases, LayerNorm, untied LM head, no position embedding, no dropout, batch 32;
//!   small enough to execute on a laptop CPU.

use crate::{load_str, Model, ModelError};

/// One bundled preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The name it is loaded by (case-sensitive).
    pub name: &'static str,
    /// One line for `autopp models`.
    pub description: &'static str,
    /// The `model.json` text.
    pub json: &'static str,
}

impl Preset {
    /// Parses the preset.
    pub fn load(&self) -> Result<Model, ModelError> {
        load_str(self.json, &format!("preset '{}'", self.name))
    }
}

macro_rules! preset {
    ($name:literal, $description:literal) => {
        Preset {
            name: $name,
            description: $description,
            json: include_str!(concat!("../presets/", $name, ".json")),
        }
    };
}

static PRESETS: [Preset; 24] = [
    preset!(
        "gpt3-175b",
        "GPT-3 175B: 96 layers, h 12288, 96 heads, s 2048, learned positions; batch 1536"
    ),
    preset!(
        "megatron-1t",
        "Megatron-LM 1T (Narayanan et al. 2021): 128 layers, h 25600, 160 heads, s 2048; batch 3072"
    ),
    preset!(
        "mt-nlg-530b",
        "Megatron-Turing NLG 530B: 105 layers, h 20480, 128 heads, s 2048; batch 1920"
    ),
    preset!(
        "bloom-176b",
        "BLOOM 176B: 70 layers, h 14336, 112 heads, ALiBi, vocab 250880, s 2048; batch 2048"
    ),
    preset!(
        "opt-175b",
        "OPT 175B: 96 layers, h 12288, 96 heads, learned positions, s 2048; batch 1024 (2M tokens)"
    ),
    preset!(
        "llama2-70b",
        "Llama 2 70B: 80 layers, h 8192, 64 heads / 8 KV, SwiGLU f 28672, s 4096; batch 1024 (4M tokens)"
    ),
    preset!(
        "llama3-8b",
        "Llama 3 8B: 32 layers, h 4096, 32 heads / 8 KV, SwiGLU f 14336, vocab 128256, s 8192; batch 512"
    ),
    preset!(
        "llama3-70b",
        "Llama 3 70B: 80 layers, h 8192, 64 heads / 8 KV, SwiGLU f 28672, vocab 128256, s 8192; batch 512"
    ),
    preset!(
        "llama3-405b",
        "Llama 3 405B: 126 layers, h 16384, 128 heads / 8 KV, SwiGLU f 53248, s 8192; batch 2048 (16M tokens)"
    ),
    preset!(
        "llama2-7b",
        "Llama 2 7B: 32 layers, h 4096, 32 heads, SwiGLU f 11008, vocab 32000, s 4096; batch 1024 (4M tokens)"
    ),
    preset!(
        "llama2-13b",
        "Llama 2 13B: 40 layers, h 5120, 40 heads, SwiGLU f 13824, vocab 32000, s 4096; batch 1024 (4M tokens)"
    ),
    preset!(
        "gpt3-5b",
        "NeMo GPT-3 5B: 24 layers, h 4096, 32 heads, learned positions, s 2048; batch 2048"
    ),
    preset!(
        "gpt3-20b",
        "NeMo GPT-3 20B: 44 layers, h 6144, 48 heads, learned positions, s 2048; batch 256"
    ),
    preset!(
        "nemotron3-8b",
        "Nemotron-3 8B: 32 layers, h 4096, 32 heads, squared-ReLU f 16384, vocab 256000, s 4096; batch 256"
    ),
    preset!(
        "nemotron3-22b",
        "Nemotron-3 22B: 40 layers, h 6144, 48 heads, squared-ReLU f 24576, vocab 256000, s 4096; batch 256"
    ),
    preset!(
        "nemotron4-340b",
        "Nemotron-4 340B: 96 layers, h 18432, 96 heads / 8 KV, squared-ReLU f 73728, vocab 256000, s 4096; batch 2304"
    ),
    preset!(
        "deepseek-v3",
        "DeepSeek-V3 671B (37B active): 61 layers (3 dense), MLA, 256 experts top-8 + 1 shared, 1 MTP; s 4096; batch 15360"
    ),
    preset!(
        "qwen3-235b-a22b",
        "Qwen3-235B-A22B: 94 layers, h 4096, 64 heads / 4 KV, 128 experts top-8 (f 1536); s 4096; batch 1024"
    ),
    preset!(
        "qwen3-30b-a3b",
        "Qwen3-30B-A3B: 48 layers, h 2048, 32 heads / 4 KV, 128 experts top-8 (f 768); s 4096; batch 1024"
    ),
    preset!(
        "qwen3-32b",
        "Qwen3-32B: 64 layers, h 5120, 64 heads / 8 KV of 128, qk-norm, SwiGLU f 25600; s 4096; batch 1024"
    ),
    preset!(
        "mixtral-8x7b",
        "Mixtral 8x7B: 32 layers, h 4096, 32 heads / 8 KV, 8 experts top-2 (f 14336); s 4096; batch 1024"
    ),
    preset!(
        "mixtral-8x22b",
        "Mixtral 8x22B: 56 layers, h 6144, 48 heads / 8 KV, 8 experts top-2 (f 16384); s 4096; batch 1024"
    ),
    preset!(
        "gpt-oss-120b",
        "gpt-oss-120b: 36 layers, h 2880, 64 heads / 8 KV, sliding/full, 128 experts top-4; s 4096; batch 1024"
    ),
    preset!(
        "tiny-gpt",
        "tiny GPT for CPU runs: 8 layers, h 128, 4 heads, vocab 1024, s 128; batch 32"
    ),
];

/// Every bundled preset, in a fixed order (largest families first, `tiny-gpt` last).
pub fn presets() -> &'static [Preset] {
    &PRESETS
}

/// The preset called `name` (case-sensitive).
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The preset names, comma-separated (for error messages).
pub fn preset_names() -> String {
    PRESETS
        .iter()
        .map(|p| p.name)
        .collect::<Vec<_>>()
        .join(", ")
}
