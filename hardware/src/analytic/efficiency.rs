//! The efficiency knobs of the analytic profile ([`Efficiency`]), their shipped fit and the
//! constants behind the knobs that are set from sources rather than fitted.

use serde::{Deserialize, Serialize};

#[cfg(doc)]
use super::AnalyticProfile;
#[cfg(doc)]
use crate::hardware::Precision;
#[cfg(doc)]
use autopp_models::AttentionKernel;

/// The efficiency factors of the analytic profile: what fraction of a peak each kind of work
/// reaches. They are global (one set for every GPU kind) and their defaults are the result of
/// fitting every group of `validation/published-runs.json` at once
/// (`autopp validate validation/published-runs.json --fit`; `docs/validation.md` has the
/// in-sample and leave-one-group-out errors).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Efficiency {
    /// Fraction of the tensor-core peak that a large GEMM reaches.
    pub gemm_max: f64,
    /// A GEMM dimension of this size reaches half of `gemm_max` along that dimension; the
    /// efficiency is `gemm_max · Π x/(x + gemm_half_dim)` over `m`, `n`, `k`.
    pub gemm_half_dim: f64,
    /// Factor on the GEMM efficiency when a leading dimension (`n` or `k`, see
    /// [`Efficiency::gemm`]) is not a multiple of 8 elements (16 bytes): tensor-core kernels
    /// load aligned rows, and misaligned strides (e.g. a head size of 108 or 225) fall back to
    /// slower kernels.
    pub gemm_misaligned: f64,
    /// Fraction of the peak a fused attention kernel reaches on long sequences.
    pub attention_fused: f64,
    /// Factor on `attention_fused` for a FlashAttention-2-class kernel
    /// ([`AttentionKernel::Fa2`]) on a GPU with FP8 tensor cores (Hopper and later), against a
    /// kernel written for that GPU. Not fitted: [`ATTENTION_FA2_ON_HOPPER`].
    #[serde(default = "default_attention_fa2_on_hopper")]
    pub attention_fa2_on_hopper: f64,
    /// Factor on the GEMM and fused-attention efficiency of GPUs with FP8 tensor cores (Hopper
    /// and later). One knob per generation, for a physical reason: their dense peak grew 3.2×
    /// over Ampere's while HBM bandwidth grew 1.6× and the power limit lowers sustained clocks,
    /// so the same kernels reach a smaller fraction of the (higher) peak.
    pub hopper_compute: f64,
    /// Factor on a linear layer's GEMM efficiency when it runs in FP8, relative to the same
    /// GEMM in bf16: FP8 kernels double the tensor-core rate but not the HBM bandwidth, the
    /// power limit or the epilogue that applies the scales, so they reach a smaller fraction of
    /// their (doubled) peak. One global knob, set from the FP8 runs of the calibration file.
    #[serde(default = "default_fp8_gemm")]
    pub fp8_gemm: f64,
    /// Size, in elements, at which a linear GEMM run in FP8 with rowwise scaling
    /// ([`Precision::Fp8Rowwise`]) reaches half the efficiency of the same GEMM with
    /// tensorwise scaling, along its narrower operand dimension: the factor is
    /// `x / (x + fp8_rowwise_half_dim)` with `x = min(n, k)`. Not fitted:
    /// [`FP8_ROWWISE_HALF_DIM`].
    #[serde(default = "default_fp8_rowwise_half_dim")]
    pub fp8_rowwise_half_dim: f64,
    /// Size, in elements, at which a grouped GEMM — a linear op run `count > 1` times, the
    /// routed experts one GPU holds — reaches half the efficiency of one GEMM of the same
    /// shape along its smaller weight dimension: the factor is `x / (x + grouped_gemm_half_dim)`
    /// with `x = min(n, k)`. Narrow experts (Qwen3-30B's 768, DeepSeek-V3's 2048) leave the
    /// grouped kernels (Transformer Engine's `GroupedLinear`, CUTLASS grouped GEMM) few tiles
    /// per expert, with each expert's rows padded to the tile and, in FP8, its operands
    /// quantized apart. Set from the MoE runs of `validation/moe/runs.json`
    /// ([`GROUPED_GEMM_HALF_DIM`]).
    #[serde(default = "default_grouped_gemm_half_dim")]
    pub grouped_gemm_half_dim: f64,
    /// Seconds per mixture-of-experts layer per micro-batch, in the forward and again in the
    /// backward, that the GPU waits on the host: the dropless dispatcher copies the tokens per
    /// expert to the host (a synchronisation) before it can size the permutation and the
    /// grouped GEMMs, and launches the router, permutation and un-permutation kernels after
    /// it. Set from the MoE runs ([`MOE_LAYER_OVERHEAD_S`]).
    #[serde(default = "default_moe_layer_overhead_s")]
    pub moe_layer_overhead_s: f64,
    /// Rows per expert, `m`, at which a grouped GEMM reaches half the efficiency of the same
    /// grouped GEMM fed many rows per expert: the factor is `m / (m + grouped_gemm_half_rows)`,
    /// beside [`Efficiency::grouped_gemm_half_dim`]'s. Every expert's GEMM pays for its
    /// partly filled last tile row and wave, and Transformer Engine's `GroupedLinear` runs one
    /// cuBLAS GEMM per expert on a few streams, with per-GEMM host work (split, allocation,
    /// cast), so the fewer rows each expert gets the further it stays from a dense GEMM of the
    /// same FLOPs. Set from the MoE runs ([`GROUPED_GEMM_HALF_ROWS`]).
    #[serde(default = "default_grouped_gemm_half_rows")]
    pub grouped_gemm_half_rows: f64,
    /// Host seconds per expert GEMM of a grouped GEMM (a linear op run `count > 1` times):
    /// Transformer Engine's `GroupedLinear` issues one cuBLAS GEMM per expert, each with its own
    /// host work, so a mixture-of-experts layer's pass cannot run faster than the host issues
    /// it ([`AnalyticProfile::expert_host_s`]; the planner applies the floor where the stack
    /// launches the experts eagerly). Set from the MoE runs ([`GROUPED_GEMM_HOST_S`]).
    #[serde(default = "default_grouped_gemm_host_s")]
    pub grouped_gemm_host_s: f64,
    /// Fraction of the HBM bandwidth that memory-bound kernels reach.
    pub hbm: f64,
    /// Fraction of NVLink bandwidth a collective reaches inside a node.
    pub comm_intra: f64,
    /// Fraction of NIC bandwidth a collective reaches across nodes.
    pub comm_inter: f64,
    /// Fraction of the shorter of (communication, compute) that is hidden when the two
    /// overlap: overlapped they last `max(a, b) + (1 − comm_overlap)·min(a, b)`.
    pub comm_overlap: f64,
    /// Launch and scheduling overhead per kernel, seconds.
    pub kernel_overhead_s: f64,
    /// Host seconds to issue one transformer block's forward pass (its kernel launches and the
    /// Python and autograd work between them), paid by the GPU only where it waits for every
    /// launch: a host-serialized runtime (`planner::config::Runtime::host_serialized`). The
    /// backward issues about twice the kernels of the forward, a full recompute as many.
    #[serde(default = "default_host_block_s")]
    pub host_block_s: f64,
}

/// The default [`Efficiency::fp8_gemm`]: with every other knob at the shipped fit, the five
/// NeMo 24.07 FP8 runs of the calibration file (Megatron-Core, H100: GPT-3 175B on 128 and 512
/// GPUs, Llama 2 70B, Llama 3 8B and 70B) are predicted at +4.2, +6.4, +1.4, −13.8 and −1.9%
/// (median +1.4%, MAPE 5.6%); 0.75 gave +14.1, +17.1, +10.4, −7.3 and +6.2%. FP8 GEMMs on H100
/// reach about 1.7× their bf16 speed, not the 2× of the peaks.
pub const FP8_GEMM: f64 = 0.85;

fn default_fp8_gemm() -> f64 {
    FP8_GEMM
}

/// The default [`Efficiency::fp8_rowwise_half_dim`], elements. PyTorch's rowwise-scaled
/// `_scaled_mm` is a CUTLASS kernel of its own, not cuBLAS: "most shapes are within 90-100%
/// of tensor-wise efficiency, but there's a long tail going down to 50%" with fast
/// accumulation, and without it (the backward's GEMMs) so slow that torchao runs cuBLAS with
/// unit scales and rescales the output afterwards (pytorch/pytorch#147971; pytorch/ao PR
/// #1325). The loss grows as a GEMM narrows: torchao's auto filter leaves a linear in bf16
/// under rowwise when `N <= 2048`, `K <= 1024`, or `N <= 4096 and K <= 2048`
/// (`torchao/float8/float8_linear_utils.py`, `_auto_filter_for_rowwise`, from the rowwise
/// speedup table of its README), and torchtitan#1207 found Llama 3's narrow `wk` and `wv`
/// about 40% slower in rowwise float8 than in bf16. Set from one measurement outside the
/// validation file: torchao's float8 README, Llama 3 8B on 8 H100 with FSDP2, batch 1 of
/// 8192 tokens, per-op SAC, compiled — bf16 6150 tokens/s, tensorwise 7689.5 (+25.0%),
/// rowwise 6768 (+10.05%). autopp predicts +27.4% for tensorwise there, and +9.9% for
/// rowwise with 1024 (+27.4% without the factor). Every linear of that run has `min(n, k)`
/// of 4096 or more (factor 0.8 or more); sharded 8 ways Llama 3 8B's forward GEMMs have 512
/// to 3584 (factors 0.33 to 0.78).
pub const FP8_ROWWISE_HALF_DIM: f64 = 1024.0;

fn default_fp8_rowwise_half_dim() -> f64 {
    FP8_ROWWISE_HALF_DIM
}

/// The default [`Efficiency::attention_fa2_on_hopper`]: FlashAttention-2 on an H100 against a
/// Hopper-native kernel on the same GPU. Shah et al. 2024 (FlashAttention-3, arXiv 2407.08608):
/// "FlashAttention-2 achieving only 35% utilization on H100" (§1) while FlashAttention-3
/// reaches "up to 740 TFLOPs/s (75% utilization)" in BF16/FP16 and is "1.5-2.0× faster" than
/// FlashAttention-2 (abstract); cuDNN's fused attention runs at FlashAttention-3's speed in
/// the paper's figures. 35/75 = 0.47 and 1/2.0 = 0.5 at long sequences, where attention
/// dominates: 0.5. On Ampere FlashAttention-2 is the native kernel (up to 73% of the A100's
/// peak forward, Dao 2023, §4.1), so the factor is 1 there.
pub const ATTENTION_FA2_ON_HOPPER: f64 = 0.5;

fn default_attention_fa2_on_hopper() -> f64 {
    ATTENTION_FA2_ON_HOPPER
}

/// The default [`Efficiency::grouped_gemm_half_dim`], elements: the grid fit (0–4096 by 256,
/// with [`MOE_LAYER_OVERHEAD_S`] 0–4 ms by 0.25 ms) on the 86 mapped MoE runs of
/// `validation/moe/runs.json`, every other knob at its dense fit
/// (`autopp validate validation/moe/runs.json --fit`; `validation/README.md` has the errors in
/// sample and leaving each GPU × precision × family group out). MoE iteration-time MAPE:
/// 31.3% with neither MoE knob, 22.8% with 1024 and 1 ms; 20.1% with them once the
/// node-deduplicating dispatcher was modelled, where the refit moves to 1280 and 1 ms (20.0%,
/// 21.7% leaving each group out), within the grid's step, so 1024 is kept; the three-knob fit
/// with [`GROUPED_GEMM_HALF_ROWS`] keeps 1024 too; after the dense refit under `comm_inter`'s
/// floor the fit settles at 512 (14.9% → 14.7%, 15.6% leaving each group out). Qwen3-30B's
/// 768-wide experts run at 768/1280 = 60% of a dense GEMM's efficiency, DeepSeek-V3's
/// up-projection (k 7168, n 4096) at 89%.
pub const GROUPED_GEMM_HALF_DIM: f64 = 512.0;

/// The default [`Efficiency::moe_layer_overhead_s`], fitted with [`GROUPED_GEMM_HALF_DIM`] and
/// [`GROUPED_GEMM_HALF_ROWS`]: 0.75 ms per MoE layer per pass (1 ms before the rows-per-expert
/// factor, which now carries part of what it absorbed).
pub const MOE_LAYER_OVERHEAD_S: f64 = 0.75e-3;

fn default_grouped_gemm_half_dim() -> f64 {
    GROUPED_GEMM_HALF_DIM
}

fn default_moe_layer_overhead_s() -> f64 {
    MOE_LAYER_OVERHEAD_S
}

/// The default [`Efficiency::grouped_gemm_half_rows`], rows per expert, fitted with
/// [`GROUPED_GEMM_HALF_DIM`] and [`MOE_LAYER_OVERHEAD_S`] on the MoE runs
/// (`autopp validate validation/moe/runs.json --fit`; `validation/README.md`).
///
/// Evidence that rows per expert matter beside the FLOPs: DeepGEMM's README (Hopper, FP8,
/// n 4096, k 7168) measures its grouped GEMM at 1297 TFLOP/s with 8192 rows per group, 1233
/// with 1024, 1040 with 512 and 932 with 256 (a half size near 100 rows for one tuned
/// kernel); Transformer Engine's `GroupedLinear` is not one kernel but a cuBLAS GEMM per
/// expert on several streams (NVIDIA/TransformerEngine PR #853, issue #1386), whose CPU work
/// grows with the GEMM count (issue #1499: `torch.split`, `2·num_gemms` allocations) and which
/// a single-launch grouped kernel beats 1.5–3.9× at 128 rows per expert on Blackwell (PR
/// #3134). In the MoE runs the errors fall with the rows each expert gets (DeepSeek-V3 at ep
/// 8 on B200, 1024 rows, predicted 3–19% fast; at ep 32–64 on GB200, 4096–8192 rows, within
/// ±6%), which a factor with one global half size follows. The grid (0–2048 rows, with the
/// half size 0–4096 by 256 and the overhead 0–4 ms by 0.25 ms) settles at 768 rows, 1024
/// and 0.75 ms: MoE iteration-time MAPE 16.9% → 16.1% in sample, 18.5% → 17.6% leaving each
/// group out; after the dense refit of `comm_inter`'s floor, at 1024 rows with a half size of
/// 512 ([`GROUPED_GEMM_HALF_DIM`]). DeepSeek-V3's experts at 1024 rows then run at 1024/2048
/// = 50% of the many-rows grouped GEMM, at 8192 rows at 89%.
pub const GROUPED_GEMM_HALF_ROWS: f64 = 1024.0;

fn default_grouped_gemm_half_rows() -> f64 {
    GROUPED_GEMM_HALF_ROWS
}

/// The default [`Efficiency::grouped_gemm_host_s`], seconds of host work per expert GEMM.
///
/// Why a floor: Transformer Engine's `GroupedLinear` is not one kernel but a loop of cuBLAS
/// GEMMs, one per local expert, on a few streams (NVIDIA/TransformerEngine PR #853, issue
/// #1386), whose host work — splitting the input, allocating each output, quantizing each
/// expert's operands under FP8 — grows with the GEMM count (issue #1499); on Blackwell a
/// single-launch grouped kernel beats it 1.5–3.9× at 128 rows per expert (PR #3134), and the
/// GPU idles between the per-expert GEMMs when the host falls behind ("Partial CUDA Graph"
/// write-up of Megatron-LM, magic3007.github.io 2025-12-30: "the default grouped GEMM loops
/// over GEMM kernels … a bubble appears before the activation"). The dropless dispatcher also
/// syncs the host with the device once per MoE layer (Megatron-Core `MoEAlltoAllTokenDispatcher`:
/// `cuda_sync_point` `before_ep_alltoall` for the split sizes), so the host cannot run ahead
/// of a layer: each pass of a layer lasts at least the host time of its grouped GEMMs. A run
/// whose shapes are static (token drop padded to capacity) replays the iteration from a CUDA
/// graph instead (Megatron-Bridge's CUDA-graph guide: full-iteration capture needs static
/// shapes).
///
/// The evidence in the MoE runs: Megatron-Bridge publishes Qwen3-30B-A3B on 8 B200 (ep 8, 16
/// experts a GPU, micro-batch 1) at 18066 tokens/s/GPU with token drop (25.09) and 9299 and
/// 9691 dropless (25.11, 26.02), the same layout; its 25.09-era recipe captured the full
/// iteration (`scripts/performance/configs/qwen3/workload_base_configs.py`: `cuda_graph_impl`
/// `local`, `cuda_graph_scope` `full_iteration`). The grid fit (0–150 µs, with the three other
/// MoE knobs; `autopp validate validation/moe/runs.json --fit`, `validation/README.md`) settles
/// at 100 µs, the other knobs where they were: MoE iteration-time MAPE 16.0% → 14.7% (86 rows).
/// Qwen3-30B-A3B's 16 experts a GPU then take the host 3.2 ms a pass, 9.6 ms a layer and
/// micro-batch: the dropless B200 runs at micro-batch 1 (published 8.8–9.2 ms a layer and
/// micro-batch) go from −48 and −50% to +11 and +6%; 235B-A22B on B200 (16 experts a GPU) from
/// −15 and −27% to −1 and −15%. Larger micro-batches and fewer experts a GPU hide it: the GPU
/// outlasts the host.
pub const GROUPED_GEMM_HOST_S: f64 = 100e-6;

fn default_grouped_gemm_host_s() -> f64 {
    GROUPED_GEMM_HOST_S
}

/// The default [`Efficiency::host_block_s`], seconds: the all-groups fit (`calibrate::fit`),
/// which only BigScience's runs inform (the only host-serialized runs of the calibration set).
///
/// Why it exists: BigScience ran its 176B benchmarks and training on Jean Zay with
/// `CUDA_LAUNCH_BLOCKING=1` ("do not remove or the training will hang and nodes will be lost
/// w/o this workaround", `train/tr11-176B-ml/tr11-176B-ml.slurm`; `chronicles-prequel.md`,
/// "Hanging Issue": models over 100B on 20–40 nodes hung without it). Each launch then returns
/// only once its kernel has finished, so the host cannot run ahead of the GPU and its time to
/// issue each kernel (the Python, autograd and launch work between kernels) adds to the
/// GPU's. The chronicle's author measured no slowdown from the variable itself ("surprisingly
/// has no impact on this framework at this scale"), which is what a pipeline engine whose host
/// already waited on the GPU would show. The runs agree: under the knobs fitted before it,
/// BigScience's rows were predicted 14% fast at one sequence per micro-batch, 8% at two and 3%
/// at four — a fixed cost per block and micro-batch, which Megatron-LM's own runs at one
/// sequence per micro-batch (Narayanan et al. 2021, whose host runs ahead) do not show. The fit puts it at 2.2 ms per block forward (8.9 ms a block and micro-batch
/// under full recompute: forward, recompute and a backward of twice the kernels): BLOOM's
/// iteration-time MAPE 7.5% → 4.1%, and the held-out BigScience runs, never fitted, 7.7% →
/// 6.5% (fp16) and 4.9% → 4.4% (BF16 optimizer).
pub const HOST_BLOCK_S: f64 = 2.236e-3;

fn default_host_block_s() -> f64 {
    HOST_BLOCK_S
}

impl Default for Efficiency {
    /// The all-groups fit of `validation/published-runs.json` to four significant figures
    /// (`autopp validate validation/published-runs.json --fit`; knobs on a bound are marked in
    /// `docs/validation.md`). `hopper_compute` left its bound of 1 once the NeMo 24.07 and
    /// torchtitan H100 runs joined the file, `comm_intra` its bound of 0.95 with `comm_inter`'s
    /// floor of 0.5 (`calibrate::fit`); `gemm_half_dim` left its bound of 4 once BigScience's
    /// runs measured before Jean Zay's PCIe/NUMA fix ran on their slower network
    /// (`calibrate::network::JEAN_ZAY_BEFORE_PCIE_FIX`), and `gemm_max` rose from 0.63 to
    /// 0.70 once those runs paid their host time ([`HOST_BLOCK_S`]).
    fn default() -> Self {
        Efficiency {
            gemm_max: 0.6974,
            gemm_half_dim: 80.39,
            gemm_misaligned: 0.1000,
            attention_fused: 0.4137,
            attention_fa2_on_hopper: ATTENTION_FA2_ON_HOPPER,
            hopper_compute: 0.8925,
            fp8_gemm: FP8_GEMM,
            fp8_rowwise_half_dim: FP8_ROWWISE_HALF_DIM,
            grouped_gemm_half_dim: GROUPED_GEMM_HALF_DIM,
            moe_layer_overhead_s: MOE_LAYER_OVERHEAD_S,
            grouped_gemm_half_rows: GROUPED_GEMM_HALF_ROWS,
            grouped_gemm_host_s: GROUPED_GEMM_HOST_S,
            hbm: 0.9499,
            comm_intra: 0.8242,
            comm_inter: 0.8130,
            comm_overlap: 0.5737,
            kernel_overhead_s: 2.043e-6,
            host_block_s: HOST_BLOCK_S,
        }
    }
}

impl Efficiency {
    /// GEMM efficiency (fraction of peak) for an `[m × k]·[k × n]` product, `m` the rows
    /// (a layer's tokens).
    ///
    /// Only `n` and `k` must be multiples of 8 elements to escape [`Self::gemm_misaligned`]:
    /// they are the row strides of the operands and the output, row-major, in the forward
    /// (`[m × k]·[k × n]`), the input gradient (`[m × n]·[n × k]`) and the weight gradient
    /// (`[k × m]·[m × n]`, the transposed activation read with stride `k`) alike. The row count
    /// `m` is never a stride of a 16-bit GEMM: a sequence of 4,100 tokens only leaves its last
    /// tile part-full, as cuBLAS runs it (what `sat(m)` covers). FP8 GEMMs differ: Hopper's
    /// take transposed copies in the weight gradient, whose stride is `m`, and Transformer
    /// Engine and torchao refuse an `m` that is not a multiple of 8 (16) outright, so no
    /// factor models it: the planner's FP8 GEMM shape rule (`launch::fp8_gemm_fault`) keeps
    /// such plans out of the frameworks' searches and launches.
    pub fn gemm(&self, m: u64, n: u64, k: u64) -> f64 {
        let sat = |x: u64| x as f64 / (x as f64 + self.gemm_half_dim);
        let aligned = n.is_multiple_of(8) && k.is_multiple_of(8);
        let align = if aligned { 1.0 } else { self.gemm_misaligned };
        self.gemm_max * sat(m) * sat(n) * sat(k) * align
    }

    /// Seconds of `comm_s` left exposed when it overlaps `compute_s` of work:
    /// `max(comm − compute, 0) + (1 − comm_overlap)·min(comm, compute)`.
    pub fn exposed_comm_s(&self, comm_s: f64, compute_s: f64) -> f64 {
        let hidden = comm_s.min(compute_s.max(0.0));
        comm_s - hidden + (1.0 - self.comm_overlap) * hidden
    }
}
