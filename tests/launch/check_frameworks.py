"""Feeds `autopp launch`'s files to the frameworks' own code, on the CPU.

    python tests/launch/check_frameworks.py MANIFEST.json RESULTS.jsonl

MANIFEST lists cases: {"name", "framework", "dir"}; each dir holds plan.json (the plan file),
launch.json (`autopp launch --json`) and the emitted files. For every case this script computes,
with the framework's own functions, which layers each stage holds and on which pipeline rank,
and compares that with the plan file's ranks, stage by stage. It also checks degrees, batching,
recompute and precision as the framework reads them. Expectations come from plan.json alone,
never from the emitter.

Writes one JSON object per case ({"name", "framework", "ok", "checked", "error"}) and a last
one {"versions": {...}} to RESULTS (one per line; the frameworks log to stdout themselves);
exits 1 when a case fails.
"""

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import shlex
import sys
import traceback
import warnings

warnings.filterwarnings("ignore")
os.environ.setdefault("DS_BUILD_OPS", "0")


# ---------------------------------------------------------------- the plan's own split


def expected(plan_file, mtp_ids=False):
    """Per global stage: (rank, has embedding, decoder layer ids, has head), from plan.json;
    with mtp_ids, (rank, has embedding, decoder ids, MTP layer ids, has head). Entries are the
    embedding, the decoder layers, the MTP layers, the head."""
    plan = plan_file["plan"]
    num_layers = plan_file["model"]["num_layers"]
    mtp = plan_file["model"].get("mtp_num_layers", 0)
    stages = []
    for r in plan["ranks"]:
        for first, last in r["stages"]:
            stages.append((first, last, r["rank"]))
    stages.sort()
    out = []
    for first, last, rank in stages:
        decoders = [e - 1 for e in range(first, last + 1) if 1 <= e <= num_layers]
        mtps = [e - 1 - num_layers for e in range(first, last + 1)
                if num_layers < e <= num_layers + mtp]
        head = last == num_layers + mtp + 1
        out.append((rank, first == 0, decoders, mtps, head) if mtp_ids
                   else (rank, first == 0, decoders, head))
    return out


def same(what, got, want):
    if got != want:
        raise AssertionError(f"{what}: the framework computes {got!r}, the plan says {want!r}")


# ---------------------------------------------------------------- Megatron-LM

# pretrain_gpt.py's flags that autopp emits, with their types (Megatron-LM main
# megatron/training/arguments.py and the dataclass fields it generates flags from)
MEGATRON_FLAGS = {
    "--num-layers": int, "--hidden-size": int, "--ffn-hidden-size": int,
    "--num-attention-heads": int, "--group-query-attention": bool, "--num-query-groups": int,
    "--seq-length": int, "--max-position-embeddings": int, "--position-embedding-type": str,
    "--rotary-base": int, "--swiglu": bool, "--normalization": str, "--norm-epsilon": float,
    "--untie-embeddings-and-output-weights": bool, "--disable-bias-linear": bool,
    "--add-qkv-bias": bool, "--attention-dropout": float, "--hidden-dropout": float,
    "--make-vocab-size-divisible-by": int, "--attention-backend": str,
    "--tensor-model-parallel-size": int, "--pipeline-model-parallel-size": int,
    "--context-parallel-size": int, "--sequence-parallel": bool,
    "--pipeline-model-parallel-layout": str, "--num-virtual-stages-per-pipeline-rank": int,
    "--decoder-first-pipeline-num-layers": int, "--decoder-last-pipeline-num-layers": int,
    "--micro-batch-size": int, "--global-batch-size": int,
    "--microbatch-group-size-per-virtual-pipeline-stage": int,
    "--recompute-granularity": str, "--recompute-method": str, "--recompute-num-layers": int,
    "--use-distributed-optimizer": bool, "--overlap-grad-reduce": bool,
    "--overlap-param-gather": bool, "--bf16": bool,
    "--fp16": bool, "--accumulate-allreduce-grads-in-fp32": bool, "--clip-grad": float,
    # mixtures of experts, MLA, MTP and Qwen3 attention: Megatron-Core 0.16.1's
    # TransformerConfig / MLATransformerConfig / ModelParallelConfig fields as flags
    # (--num-experts is num_moe_experts; --moe-layer-freq a Python list expression)
    "--kv-channels": int, "--qk-layernorm": bool, "--multi-latent-attention": bool,
    "--q-lora-rank": int, "--kv-lora-rank": int, "--qk-head-dim": int,
    "--qk-pos-emb-head-dim": int, "--v-head-dim": int, "--num-experts": int,
    "--moe-router-topk": int, "--moe-ffn-hidden-size": int,
    "--moe-shared-expert-intermediate-size": int, "--moe-layer-freq": str,
    "--expert-model-parallel-size": int, "--expert-tensor-parallel-size": int,
    "--moe-grouped-gemm": bool, "--moe-token-dispatcher-type": str, "--mtp-num-layers": int,
    "--overlap-moe-expert-parallel-comm": bool,
    # FP8 through Transformer Engine: TransformerConfig.fp8 (--fp8-format), fp8_recipe,
    # fp8_amax_history_len, fp8_amax_compute_algo; --fp8-param-gather is fp8_param
    # (core_transformer_config_from_args)
    "--fp8-format": str, "--fp8-recipe": str, "--fp8-amax-history-len": int,
    "--fp8-amax-compute-algo": str, "--fp8-param-gather": bool,
}

# autopp's FP8 precisions as Transformer Engine recipes (TransformerConfig.fp8_recipe)
MEGATRON_FP8_RECIPES = {"fp8": "delayed", "fp8-tensorwise": "tensorwise", "mxfp8": "mxfp8"}


def moe_layer_freq(text):
    """Megatron-LM's moe_freq_type: an int, or a Python list expression such as ([0]*3+[1]*58)."""
    if text.startswith(("(", "[")):
        value = eval(text, {"__builtins__": {}})  # what arguments.py does with the string
        return list(value)
    return int(text)


def moe_kwargs(a):
    """TransformerConfig fields of the MoE, MLA, MTP and Qwen3 flags that were given."""
    names = {"kv_channels": "kv_channels", "qk_layernorm": "qk_layernorm",
             "num_experts": "num_moe_experts", "moe_router_topk": "moe_router_topk",
             "moe_ffn_hidden_size": "moe_ffn_hidden_size",
             "moe_shared_expert_intermediate_size": "moe_shared_expert_intermediate_size",
             "expert_model_parallel_size": "expert_model_parallel_size",
             "expert_tensor_parallel_size": "expert_tensor_parallel_size",
             "moe_grouped_gemm": "moe_grouped_gemm",
             "moe_token_dispatcher_type": "moe_token_dispatcher_type",
             "mtp_num_layers": "mtp_num_layers",
             "overlap_moe_expert_parallel_comm": "overlap_moe_expert_parallel_comm",
             "q_lora_rank": "q_lora_rank", "kv_lora_rank": "kv_lora_rank",
             "qk_head_dim": "qk_head_dim", "qk_pos_emb_head_dim": "qk_pos_emb_head_dim",
             "v_head_dim": "v_head_dim"}
    kw = {field: a[flag] for flag, field in names.items() if flag in a}
    if "moe_layer_freq" in a:
        kw["moe_layer_freq"] = moe_layer_freq(a["moe_layer_freq"])
    return kw


def parse_megatron(args):
    """The emitted argument vector as Megatron-LM's argparse reads it (flags as dest names)."""
    out, i = {}, 0
    while i < len(args):
        flag = args[i]
        if flag not in MEGATRON_FLAGS:
            raise AssertionError(f"{flag} is not a pretrain_gpt.py flag autopp knows")
        if flag.replace("--", "").replace("-", "_") in out:
            raise AssertionError(f"{flag} given twice")
        kind = MEGATRON_FLAGS[flag]
        key = flag[2:].replace("-", "_")
        if kind is bool:
            out[key] = True
            i += 1
        else:
            out[key] = kind(args[i + 1])
            i += 2
    vpp_sources = [k for k in ("pipeline_model_parallel_layout",
                               "num_virtual_stages_per_pipeline_rank",
                               "num_layers_per_virtual_pipeline_stage") if k in out]
    if len(vpp_sources) > 1:
        raise AssertionError(f"more than one virtual-pipeline source: {vpp_sources}")
    return out


def megatron_config(a, gpus):
    """TransformerConfig from the arguments, as Megatron-LM's core_transformer_config_from_args."""
    import torch
    import torch.nn.functional as F
    from megatron.core.transformer.enums import AttnBackend
    from megatron.core.transformer.transformer_config import TransformerConfig

    tp, pp, cp = (a["tensor_model_parallel_size"], a["pipeline_model_parallel_size"],
                  a["context_parallel_size"])
    if gpus % (tp * pp * cp):
        raise AssertionError(f"world size {gpus} is not a multiple of tp*pp*cp")
    dtype = torch.bfloat16 if a.get("bf16") else torch.half if a.get("fp16") else torch.float
    vpp = a.get("num_virtual_stages_per_pipeline_rank")
    kw = dict(
        num_layers=a["num_layers"], hidden_size=a["hidden_size"],
        ffn_hidden_size=a["ffn_hidden_size"], num_attention_heads=a["num_attention_heads"],
        num_query_groups=a.get("num_query_groups") if a.get("group_query_attention") else None,
        gated_linear_unit=a.get("swiglu", False),
        activation_func=F.silu if a.get("swiglu") else F.gelu,
        normalization=a.get("normalization", "LayerNorm"),
        layernorm_epsilon=a.get("norm_epsilon", 1e-5),
        add_bias_linear=not a.get("disable_bias_linear", False),
        add_qkv_bias=a.get("add_qkv_bias", False),
        attention_dropout=a.get("attention_dropout", 0.1),
        hidden_dropout=a.get("hidden_dropout", 0.1),
        attention_backend=AttnBackend[a.get("attention_backend", "auto")],
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        context_parallel_size=cp, sequence_parallel=a.get("sequence_parallel", False) and tp > 1,
        pipeline_model_parallel_layout=a.get("pipeline_model_parallel_layout"),
        virtual_pipeline_model_parallel_size=vpp if vpp and vpp > 1 else None,
        num_layers_in_first_pipeline_stage=a.get("decoder_first_pipeline_num_layers"),
        num_layers_in_last_pipeline_stage=a.get("decoder_last_pipeline_num_layers"),
        microbatch_group_size_per_vp_stage=a.get(
            "microbatch_group_size_per_virtual_pipeline_stage"),
        recompute_granularity=a.get("recompute_granularity"),
        recompute_method=a.get("recompute_method"),
        recompute_num_layers=a.get("recompute_num_layers"),
        bf16=a.get("bf16", False), fp16=a.get("fp16", False),
        params_dtype=dtype, pipeline_dtype=dtype,
        fp8=a.get("fp8_format"), fp8_recipe=a.get("fp8_recipe", "delayed"),
        fp8_amax_history_len=a.get("fp8_amax_history_len", 1),
        fp8_amax_compute_algo=a.get("fp8_amax_compute_algo", "most_recent"),
        fp8_param=a.get("fp8_param_gather", False),
    )
    kw.update(moe_kwargs(a))
    if a.get("multi_latent_attention"):
        from megatron.core.transformer.transformer_config import MLATransformerConfig
        return MLATransformerConfig(**kw)
    return TransformerConfig(**kw)


def megatron_stages(config):
    """Per global stage (vpp-major): (rank, embedding, decoder ids, loss), from Megatron-Core."""
    from megatron.core import parallel_state
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    pp = config.pipeline_model_parallel_size
    layout = config.pipeline_model_parallel_layout
    mtp = config.mtp_num_layers or 0
    if layout is not None:
        layout.validate_layer_layout(num_layers=config.num_layers, mtp_num_layers=mtp)
        vpp = len(layout.layout[0])
    else:
        vpp = config.virtual_pipeline_model_parallel_size or 1
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp if vpp > 1 else None)
    out = []
    for v in range(vpp):
        for r in range(pp):
            vp_stage = v if vpp > 1 else None
            if layout is not None:
                ids = layout.get_layer_id_list(LayerType.decoder, vp_stage=vp_stage, pp_rank=r)
                mtps = layout.get_layer_id_list(LayerType.mtp, vp_stage=vp_stage, pp_rank=r)
                kinds = layout.layout[r][v]
                emb, loss = LayerType.embedding in kinds, LayerType.loss in kinds
            else:
                n = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=r)
                offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=r)
                ids = list(range(offset, offset + n))
                emb, loss = (r, v) == (0, 0), (r, v) == (pp - 1, vpp - 1)
                # without a layout Megatron builds the MTP block on the last stage
                mtps = list(range(mtp)) if loss else []
            out.append((r, emb, ids, mtps, loss) if mtp else (r, emb, ids, loss))
    parallel_state.set_virtual_pipeline_model_parallel_world_size(None)
    return out, vpp


def check_megatron(case, plan_file, launch, files):
    plan = plan_file["plan"]
    a = parse_megatron(launch["args"])
    config = megatron_config(a, plan["gpus"])
    stages, vpp = megatron_stages(config)
    mtp = bool(config.mtp_num_layers)
    same("stages (rank, embedding, decoder layers, loss)", stages, expected(plan_file, mtp))
    same("virtual stages", vpp, plan["virtual_stages"])
    dp = plan["gpus"] // (config.tensor_model_parallel_size
                          * config.pipeline_model_parallel_size * config.context_parallel_size)
    same("dp", dp, plan["dp"])
    gbs, mbs = a["global_batch_size"], a["micro_batch_size"]
    if gbs % (mbs * dp):  # validate_args
        raise AssertionError(f"global batch {gbs} is not divisible by micro batch {mbs} x dp {dp}")
    m = gbs // (mbs * dp)
    same("micro-batches", m, plan["num_microbatches"])
    if vpp > 1:  # schedules.py, forward_backward_pipelining_with_interleaving
        g = config.microbatch_group_size_per_vp_stage or config.pipeline_model_parallel_size
        pp = config.pipeline_model_parallel_size
        if not (pp <= g <= m) or (m % g and m % g < pp):
            raise AssertionError(f"interleaving: pp={pp} group={g} micro-batches={m}")
    check_megatron_recompute(config, plan, plan_file["model"]["num_layers"])
    theta, eps = rope_and_eps(plan_file["model"])
    same("norm eps", config.layernorm_epsilon, eps)
    if a.get("position_embedding_type") == "rope":
        same("RoPE base", a.get("rotary_base", 10000), theta)
    same("sequence parallel", config.sequence_parallel,
         plan["sequence_parallel"] and plan["tp"] > 1)
    same("distributed optimizer", a.get("use_distributed_optimizer", False),
         plan["zero_stage"] == 1)
    checked = ["TransformerConfig", "layer layout" if config.pipeline_model_parallel_layout
               else "even/uneven split"]
    checked += check_megatron_precision(config, plan_file)
    alt = [l for l in files["launch.sh"].splitlines() if l.startswith("# equivalent: ")]
    if alt:  # the offered --decoder-first/last form gives the same split
        args = list(launch["args"])
        i = args.index("--pipeline-model-parallel-layout")
        del args[i:i + 2]
        args += shlex.split(alt[0][len("# equivalent: "):])
        config2 = megatron_config(parse_megatron(args), plan["gpus"])
        same("stages with --decoder-first/last", megatron_stages(config2)[0],
             expected(plan_file, mtp))
        checked.append("decoder-first/last")
    if "moe" in plan_file["model"]:
        checked += check_megatron_moe(config, plan, plan_file["model"], dp)
    return checked


def check_megatron_precision(config, plan_file):
    """The precision as Megatron-Core reads it: bf16 or fp16, and for an FP8 plan Transformer
    Engine's recipe (E4M3 throughout for MXFP8, E5M2 gradients otherwise) and the input rows
    and widths its FP8 GEMMs take (transformer_engine.pytorch.utils.assert_dim_for_fp8_exec on
    the rank's own rows, s/(cp*tp) * b under sequence parallelism: rows a multiple of 8, columns
    of 16; MXFP8 blocks of 32)."""
    precision = plan_file["settings"]["precision"]
    same("fp16", config.fp16, precision == "fp16")
    same("bf16", config.bf16, precision != "fp16")
    recipe = MEGATRON_FP8_RECIPES.get(precision)
    if recipe is None:
        same("fp8", config.fp8, None)
        return []
    same("fp8 recipe", (config.fp8, config.fp8_recipe),
         ("e4m3" if recipe == "mxfp8" else "hybrid", recipe))
    plan, model = plan_file["plan"], plan_file["model"]
    row, col = (32, 32) if recipe == "mxfp8" else (8, 16)
    tp = config.tensor_model_parallel_size
    # under sequence parallelism TE checks (and all-gathers in FP8) each rank's slice
    split = config.context_parallel_size * (tp if config.sequence_parallel else 1)
    if model["seq_length"] % split:
        raise AssertionError(f"FP8 GEMM shapes: {model['seq_length']} tokens over {split}")
    rows = model["seq_length"] // split * plan["micro_batch_size"]
    widths = {"hidden": config.hidden_size, "attention/tp": config.kv_channels
              * config.num_attention_heads // tp, "ffn/tp": config.ffn_hidden_size // tp}
    if rows % row or any(w % col for w in widths.values()):
        raise AssertionError(f"FP8 GEMM shapes: {rows} rows, widths {widths}")
    return ["fp8 " + recipe]


def check_megatron_moe(config, plan, model, dp):
    """The experts as Megatron-Core reads them: counts, degrees and the parallel folding."""
    moe = model["moe"]
    same("experts", config.num_moe_experts, moe["num_experts"])
    same("top-k", config.moe_router_topk, moe["num_experts_per_tok"])
    same("expert FFN", config.moe_ffn_hidden_size, moe["moe_ffn_hidden_size"])
    dense = moe.get("first_k_dense_layers", 0)
    freq = config.moe_layer_freq
    moe_layers = freq if isinstance(freq, list) else [1] * config.num_layers
    same("MoE layers", moe_layers, [0] * dense + [1] * (config.num_layers - dense))
    ep, etp = config.expert_model_parallel_size, config.expert_tensor_parallel_size
    same("ep, etp", (ep, etp), (plan.get("ep", 1), plan.get("etp", 1)))
    # parallel_state.initialize_model_parallel: expert groups fold onto tp*cp*dp of a pp rank
    folded = config.tensor_model_parallel_size * config.context_parallel_size * dp
    if folded % (ep * etp):
        raise AssertionError(f"ep*etp = {ep * etp} does not divide tp*cp*dp = {folded}")
    if model.get("mla"):
        same("MLA kv rank", config.kv_lora_rank, model["mla"]["kv_lora_rank"])
    return ["experts"]


def check_megatron_recompute(config, plan, num_layers):
    ranks = plan["ranks"]
    partial = any(r["recompute"] == "partial" for r in ranks)
    if partial:
        same("recompute", (config.recompute_granularity, config.recompute_method),
             ("full", "block"))
        n = config.recompute_num_layers
        for r in ranks:
            for (first, last), k in zip(r["stages"], r["recompute_num_layers_per_stage"]):
                layers = sum(1 for e in range(first, last + 1) if 1 <= e <= num_layers)
                same(f"recomputed layers of stage {first}-{last}", min(n, layers), k)
        return
    want = {"none": None, "selective": "selective", "full": "full"}[plan["recompute"]]
    same("recompute granularity", config.recompute_granularity, want)


# ---------------------------------------------------------------- torchtitan

TITAN_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved-1f1b": "Interleaved1F1B",
                   "looped-bfs": "LoopedBFS", "interleaved-zb": "InterleavedZeroBubble",
                   "zb-v": "ZBVZeroBubble", "dualpipe-v": "DualPipeV"}


def titan_contents(names, num_layers):
    emb = "tok_embeddings" in names
    head = "norm" in names and "lm_head" in names
    ids = sorted(int(n.split(".")[1]) for n in names if n.startswith("layers."))
    unknown = [n for n in names if n not in ("tok_embeddings", "norm", "lm_head")
               and not n.startswith("layers.")]
    if unknown or any(i >= num_layers for i in ids):
        raise AssertionError(f"modules the model does not have: {unknown or ids}")
    return emb, ids, head


def rope_and_eps(m):
    """The RoPE base and norm eps of the plan's model family (plan.json names neither): Qwen3,
    the family with qk-norm, 1e6 and 1e-6 (rope_theta and rms_norm_eps of Qwen3's dense and first
    MoE config.json files);
    Llama 3 (its name or its 128,256-token vocabulary) 500,000 and 1e-5; else 10,000 and 1e-5."""
    if m.get("qk_norm"):
        return 1000000, 1e-6
    if m["name"].startswith("llama3") or m["vocab_size"] == 128256:
        return 500000, 1e-5
    return 10000, 1e-5


def decoder_params(m):
    """Parameters of the plan's Llama 3- or Qwen3-style model (SwiGLU, RMSNorm, no biases, untied
    head; Qwen3's heads of head_dim with an RMSNorm on each head's queries and keys), counted
    from plan.json's sizes: embedding, layers, final norm and LM head."""
    h, a, v = m["hidden_size"], m["num_attention_heads"], m["vocab_size"]
    g, f = m.get("num_kv_heads") or a, m.get("ffn_hidden_size") or 4 * h
    d = m.get("head_dim") or h // a
    qk_norm = 2 * d if m.get("qk_norm") else 0
    layer = h * (a * d + 2 * g * d) + a * d * h + 3 * h * f + 2 * h + qk_norm
    return v * h + m["num_layers"] * layer + h + v * h


def check_titan_model(m, c):
    """The config torchtitan loads builds the plan's model: its sizes, head size and qk-norm,
    RoPE base and norm eps, and, built on the meta device by torchtitan's own classes, the plan's
    parameter count."""
    import torch

    model = c.model_spec.model
    model.update_from_config(config=c)  # the Trainer's checks: tp | heads, seq_len <= RoPE's
    attention, ffn = model.layers[0].attention, model.layers[0].feed_forward
    same("(layers, hidden, heads, kv heads, ffn, vocabulary)",
         (len(model.layers), model.dim, attention.n_heads, attention.n_kv_heads or attention.n_heads,
          ffn.w1.out_features, model.vocab_size),
         (m["num_layers"], m["hidden_size"], m["num_attention_heads"],
          m.get("num_kv_heads") or m["num_attention_heads"],
          m.get("ffn_hidden_size") or 4 * m["hidden_size"], m["vocab_size"]))
    same("(head size, qk-norm)",
         (attention.head_dim or model.dim // attention.n_heads, attention.qk_norm is not None),
         (m.get("head_dim") or m["hidden_size"] // m["num_attention_heads"], bool(m.get("qk_norm"))))
    theta, eps = rope_and_eps(m)
    same("RoPE base", attention.rope.theta, theta)
    norms = [model.norm.eps, model.layers[0].attention_norm.eps, model.layers[0].ffn_norm.eps]
    if attention.qk_norm is not None:
        norms.append(attention.qk_norm.eps)
    same("norm eps", norms, [eps] * len(norms))
    same("loss vocabulary", c.loss.loss_fn.global_vocab_size, m["vocab_size"])
    with torch.device("meta"):
        built = model.build()
    same("parameters (built on the meta device)", sum(p.numel() for p in built.parameters()),
         decoder_params(m))


@contextlib.contextmanager
def titan_gpu_capability(precision):
    """torchtitan's float8 and MXFP8 converters refuse to build without an SM89 or SM100 GPU,
    which this CPU check has not: for an FP8 plan, the capability test says yes while the
    config is built (the plan is for the GPU it names), and nothing else changes."""
    if precision not in ("fp8-rowwise", "mxfp8"):
        yield
        return
    import torchtitan.components.quantization.float8 as f8
    import torchtitan.components.quantization.mx as mx

    saved = (f8.has_cuda_capability, mx.has_cuda_capability)
    f8.has_cuda_capability = mx.has_cuda_capability = lambda major, minor: True
    try:
        yield
    finally:
        f8.has_cuda_capability, mx.has_cuda_capability = saved


def check_titan_precision(plan_file, c):
    """The linear layers torchtitan builds are in the plan's precision: every linear of the
    decoder blocks a float8 (torchao, rowwise recipe) or MXFP8 linear, the LM head bf16; and the
    GEMM shapes are ones the FP8 kernels take (rows s/cp * b and every converted linear's sizes
    in multiples of 16, or 32 for MXFP8)."""
    from torchao.float8 import Float8LinearConfig
    from torchtitan.components.quantization import Float8Linear, MXFP8Linear
    from torchtitan.models.common.linear import Linear

    plan, precision = plan_file["plan"], plan_file["settings"]["precision"]
    want = {"bf16": Linear.Config, "fp8-rowwise": Float8Linear.Config,
            "mxfp8": MXFP8Linear.Config}[precision]
    layers = list(c.model_spec.model.traverse(Linear.Config))
    blocks = [(f, cfg) for f, cfg, _, _ in layers if f.startswith("layers.")]
    others = [(f, cfg) for f, cfg, _, _ in layers if not f.startswith("layers.")]
    if not blocks or not any(f == "lm_head" for f, _ in others):
        raise AssertionError(f"linear layers not found: {[f for f, *_ in layers]}")
    for f, cfg in blocks:
        same(f"{f}'s linear", type(cfg).__qualname__, want.__qualname__)
    for f, cfg in others:
        same(f"{f}'s linear (bf16)", type(cfg).__qualname__, Linear.Config.__qualname__)
    if precision == "bf16":
        return
    if precision == "fp8-rowwise":
        same("float8 recipe", blocks[0][1]._torchao_config,
             Float8LinearConfig.from_recipe_name("rowwise"))
    tile = 32 if precision == "mxfp8" else 16
    rows = plan_file["model"]["seq_length"] // plan["cp"] * plan["micro_batch_size"]
    same(f"rows of a linear's input (s/cp * b) mod {tile}", rows % tile, 0)
    for f, cfg in blocks:
        same(f"{f}'s sizes mod {tile}", (cfg.in_features % tile, cfg.out_features % tile), (0, 0))


def check_torchtitan(case, plan_file, launch, files):
    from torchtitan.config import ConfigManager
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import pipeline_parallel as tpp

    plan = plan_file["plan"]
    # a config module written beside the launch files: this case's, not an earlier case's
    sys.path.insert(0, os.getcwd())
    for name in [n for n in sys.modules if n.split(".")[0] == "autopp_torchtitan"]:
        del sys.modules[name]
    precision = plan_file["settings"]["precision"]
    with contextlib.redirect_stdout(io.StringIO()), titan_gpu_capability(precision):
        c = ConfigManager().parse_args(list(launch["args"]))
    p, t = c.parallelism, c.training
    dims = ParallelDims.from_config(p, plan["gpus"])  # validates the mesh
    same("(dp, tp, pp, cp)", (dims.dp_replicate * dims.dp_shard, dims.tp, dims.pp, dims.cp),
         (plan["dp"], plan["tp"], plan["pp"], plan["cp"]))
    model = c.model_spec.model
    check_titan_model(plan_file["model"], c)
    check_titan_precision(plan_file, c)
    same("sequence length", t.seq_len, plan_file["model"]["seq_length"])
    dp = dims.dp_replicate * dims.dp_shard  # Trainer: the "batch" mesh
    if t.global_batch_size % (t.local_batch_size * dp):
        raise AssertionError("global batch is not a multiple of local batch x dp")
    accumulation = t.global_batch_size // (t.local_batch_size * dp)
    if dims.pp > 1:
        same("micro-batches", t.local_batch_size // p.pipeline_parallel_microbatch_size,
             plan["num_microbatches"])
        same("micro-batch size", p.pipeline_parallel_microbatch_size, plan["micro_batch_size"])
        same("gradient accumulation", accumulation, 1)
        checked = check_titan_pipeline(plan_file, c, dims, files, tpp)
    else:
        same("gradient accumulation", accumulation, plan["num_microbatches"])
        fqns = tpp._generate_llm_fqn_per_model_part(1, len(model.layers), 1, 1)
        emb, ids, head = titan_contents(fqns[0], len(model.layers))
        same("stages", [(0, emb, ids, head)], expected(plan_file))
        checked = ["ConfigManager", "ParallelDims", "single stage"]
    checked.insert(1, f"{c.model_spec.flavor} built on meta")
    checked.insert(2, f"{precision} linear layers")
    ac = c.activation_checkpoint
    ac = type(ac).__qualname__.split(".")[0] if ac is not None else "none"
    want = {"none": "none", "selective": "SelectiveAC", "full": "FullAC"}[plan["recompute"]]
    same("activation checkpointing", ac, want)
    # autopp plans torchtitan's blocks compiled and its loss eager
    same("compile (enable, components)", (c.compile.enable, list(c.compile.components)),
         (True, ["model"]))
    return checked


def check_titan_pipeline(plan_file, c, dims, files, tpp):
    import torch
    import torch.distributed.pipelining.schedules as S
    from types import SimpleNamespace

    plan, p = plan_file["plan"], c.parallelism
    meta = tpp._get_pipeline_metadata(dims, p, c.model_spec.model)
    fqns = p.module_fqns_per_model_part or tpp._generate_llm_fqn_per_model_part(*meta)
    n, pp = len(fqns), dims.pp
    rank_of = {}
    for r in range(pp):
        for s in tpp._get_pp_rank_to_stage_indices_mapping(r, pp, p.pipeline_parallel_schedule, n):
            rank_of[s] = r
    got = []
    for s, names in enumerate(fqns):
        emb, ids, head = titan_contents(names, len(c.model_spec.model.layers))
        got.append((rank_of[s], emb, ids, head))
    same("stages (rank, embedding, layers, head)", got, expected(plan_file))
    m = c.training.local_batch_size // p.pipeline_parallel_microbatch_size

    def stages_of(rank):
        idx = tpp._get_pp_rank_to_stage_indices_mapping(rank, pp, p.pipeline_parallel_schedule, n)
        return [SimpleNamespace(num_stages=n, group_size=pp, group_rank=rank, stage_index=i,
                                is_first=i == 0, is_last=i == n - 1,
                                submod=torch.nn.Linear(1, 1)) for i in idx]

    if p.pipeline_parallel_schedule_csv:
        csv = os.path.basename(p.pipeline_parallel_schedule_csv)
        path = os.path.join(os.getcwd(), csv)
        same("CSV file", csv in files, True)
        sched = S._PipelineScheduleRuntime(stages_of(0), n_microbatches=m, loss_fn=lambda *a: 0)
        sched._load_csv(path)  # validates the order, then lowers it to sends and receives
        to_rank = sched.stage_index_to_group_rank
        same("CSV stage placement", to_rank, {s: r for s, r in rank_of.items()})
        # PyTorch's dry run of the compute and point-to-point actions: raises on a deadlock
        comms = S._add_send_recv(dict(sched.pipeline_order), lambda s: to_rank[s], n)
        S._simulate_comms_compute(comms, lambda s: to_rank[s], n)
        return ["ConfigManager", "ParallelDims", "module_fqns", "CSV schedule (lowered, simulated)"]
    same("schedule", p.pipeline_parallel_schedule, TITAN_SCHEDULES[plan["schedule"]])
    cls = S.get_schedule_class(p.pipeline_parallel_schedule)
    for r in range(pp):
        st = stages_of(r)
        if issubclass(cls, S.PipelineScheduleSingle):
            same("stages per rank", len(st), 1)
            cls(st[0], n_microbatches=m, loss_fn=lambda *a: 0)
        else:
            cls(st, n_microbatches=m, loss_fn=lambda *a: 0)
    return ["ConfigManager", "ParallelDims", "module_fqns", f"{cls.__name__} on every rank"]


# ---------------------------------------------------------------- DeepSpeed


class DataParallelMpu:
    """The `mpu` DeepSpeedConfig asks for the data-parallel size."""

    def __init__(self, dp):
        self.dp = dp

    def get_data_parallel_world_size(self):
        return self.dp


def init_deepspeed():
    """A one-process gloo world, so that DeepSpeedConfig reads the data-parallel size from the
    mpu (without one it takes a world size of 1)."""
    import deepspeed
    import deepspeed.comm.torch  # noqa: F401 - the module, not `torch`, which comm also binds

    # the CPU shared-memory all-reduce op would be compiled on first use; one process needs none
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    if not deepspeed.comm.is_initialized():
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("DS_PORT", "29533"))
        with contextlib.redirect_stdout(io.StringIO()):
            deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False,
                                       verbose=False)


def check_deepspeed(case, plan_file, launch, files):
    import torch.nn as nn
    from deepspeed.runtime.config import DeepSpeedConfig
    from deepspeed.runtime.pipe.module import LayerSpec
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    plan = plan_file["plan"]
    init_deepspeed()
    args = launch["args"]
    config_path = os.path.join(os.getcwd(), args[args.index("--deepspeed_config") + 1])
    ds = DeepSpeedConfig(config_path, mpu=DataParallelMpu(plan["dp"]))  # asserts the batch rule
    same("(batch, micro, accumulation)",
         (ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps),
         (plan["global_batch_size"], plan["micro_batch_size"], plan["num_microbatches"]))
    if ds.zero_optimization_stage >= 2:  # PipelineEngine's assertion
        raise AssertionError("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
    same("ZeRO stage", ds.zero_optimization_stage, plan["zero_stage"])
    same("precision", "bf16" if ds.bfloat16_config.enabled else "fp16" if ds.float16_config.enabled
         else "fp32", plan_file["settings"]["precision"])
    spec = importlib.util.spec_from_file_location("autopp_pipeline", "autopp_pipeline.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    kwargs, topo = mod.PIPELINE_MODULE_ARGS, mod.TOPOLOGY
    same("world size of the topology",
         PipeModelDataParallelTopology(**topo).world_size(), plan["gpus"])
    same("num_stages", kwargs["num_stages"], plan["pp"])
    classes = {n: type(n, (nn.Module,), {}) for n in set(mod.LAYERS)}
    # DeepSpeed's own partitioning ("uniform", "type:"), or the plan's boundaries ("autopp")
    module = mod.PlannedPipelineModule.__new__(mod.PlannedPipelineModule)
    nn.Module.__init__(module)
    module.num_stages, module.global_rank, module.loss_fn = plan["pp"], 0, None
    module._topo = PipeModelDataParallelTopology(**topo)
    module._layer_specs = [LayerSpec(classes[n]) for n in mod.LAYERS]
    with contextlib.redirect_stdout(io.StringIO()):
        module._partition_layers(method=kwargs["partition_method"])
    parts = [int(x) for x in module.parts]
    same("parts", parts, mod.PARTS)
    num_layers = plan_file["model"]["num_layers"]
    got = []
    for s in range(plan["pp"]):
        entries = range(parts[s], parts[s + 1])
        got.append((s, 0 in entries, [e - 1 for e in entries if 1 <= e <= num_layers],
                    num_layers + 1 in entries))
    same("stages (stage, embedding, layers, head)", got, expected(plan_file))
    interval = 1 if plan["recompute"] == "full" else 0
    same("activation_checkpoint_interval", kwargs["activation_checkpoint_interval"], interval)
    return ["DeepSpeedConfig (batch rule)", f"PipelineModule._partition_layers "
            f"({kwargs['partition_method']})"]


# ---------------------------------------------------------------- driver

CHECKS = {"megatron": check_megatron, "torchtitan": check_torchtitan,
          "deepspeed": check_deepspeed}


def versions():
    import megatron.core.package_info as mc
    return {"megatron-core": mc.__version__,
            "torchtitan": importlib.metadata.version("torchtitan"),
            "torchao": importlib.metadata.version("torchao"),
            "deepspeed": importlib.metadata.version("deepspeed"),
            "torch": importlib.metadata.version("torch")}


def main(manifest_path, results_path):
    with open(manifest_path) as f:
        cases = json.load(f)
    out = open(results_path, "w")
    failed = 0
    home = os.getcwd()
    for case in cases:
        os.chdir(case["dir"])
        result = {"name": case["name"], "framework": case["framework"]}
        try:
            with open("plan.json") as f:
                plan_file = json.load(f)
            with open("launch.json") as f:
                launch = json.load(f)
            result["checked"] = CHECKS[case["framework"]](case, plan_file, launch,
                                                          launch["files"])
            result["ok"] = True
        except Exception as e:  # noqa: BLE001 - every failure is reported per case
            failed += 1
            result["ok"] = False
            result["error"] = f"{type(e).__name__}: {e}"
            result["trace"] = traceback.format_exc(limit=4)
        finally:
            os.chdir(home)
        out.write(json.dumps(result) + "\n")
        out.flush()
    out.write(json.dumps({"versions": versions()}) + "\n")
    out.close()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
