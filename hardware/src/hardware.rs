//! The hardware catalog: GPU kinds with their peak throughput, memory and bandwidths.
//!
//! Figures are the vendors' dense (no sparsity) peaks; memory capacities are what
//! `nvidia-smi` reports as total memory. Sources: NVIDIA A100 datasheet (2020/2021), H100 SXM5
//! and H200 product briefs, V100 datasheet; link figures as in autopp's COST_MODEL.md.
//! Blackwell and MI300X (each entry cites its source): their capacities are the datasheets'
//! decimal GB, which `nvidia-smi`/`rocm-smi` report a little lower; no published run on them
//! calibrates autopp yet, so `estimate` and `plan` say so and use the widest bands.

use serde::{Deserialize, Serialize};

use crate::HardwareError;

/// Numeric precision of weights, activations and tensor-core math.
///
/// The FP8 recipes run the GEMMs of linear layers (attention projections, MLP and expert
/// FFNs) on the FP8 tensor cores; the attention core, the LM head, the router and every
/// element-wise op stay in bf16, and so do activations between layers, gradients sent between
/// GPUs and the master weights (Micikevicius et al. 2022, "FP8 formats for deep learning";
/// Transformer Engine's and torchao's float8 documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum Precision {
    /// bfloat16 mixed precision (fp32 master weights).
    #[default]
    #[serde(rename = "bf16")]
    Bf16,
    /// fp16 mixed precision (fp32 master weights, loss scaling).
    #[serde(rename = "fp16")]
    Fp16,
    /// FP8 with delayed scaling (Transformer Engine's default recipe, Megatron-Core's and
    /// NeMo's `--fp8-recipe delayed`): scales from an amax history, so a cast is one pass;
    /// FP8 copies of the weights and their transposes are kept between micro-batches.
    #[serde(rename = "fp8", alias = "fp8-delayed")]
    Fp8Delayed,
    /// FP8 with current per-tensor scaling (torchao's `tensorwise`, Transformer Engine's
    /// `Float8CurrentScaling`): an amax pass over each operand, then the cast; weights are
    /// cast on the fly, no FP8 copies kept.
    #[serde(rename = "fp8-tensorwise")]
    Fp8Tensorwise,
    /// FP8 with current per-row scaling (torchao's `rowwise`): as tensorwise, with a scale per
    /// row, which the GEMM epilogue applies.
    #[serde(rename = "fp8-rowwise")]
    Fp8Rowwise,
    /// MXFP8 block scaling (one E8M0 scale per 32 elements) on Blackwell tensor cores
    /// (Transformer Engine's `MXFP8BlockScaling`): a cast is one pass; row- and column-wise
    /// FP8 copies of the weights are kept.
    #[serde(rename = "mxfp8")]
    Mxfp8,
}

/// Every precision, in the order `--help` lists them.
pub const PRECISIONS: [Precision; 6] = [
    Precision::Bf16,
    Precision::Fp16,
    Precision::Fp8Delayed,
    Precision::Fp8Tensorwise,
    Precision::Fp8Rowwise,
    Precision::Mxfp8,
];

impl Precision {
    /// Bytes per weight / activation element as stored between layers and sent between GPUs
    /// (bf16 or fp16 under every recipe).
    pub fn bytes(self) -> u64 {
        2
    }
    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
            Precision::Fp8Delayed => "fp8",
            Precision::Fp8Tensorwise => "fp8-tensorwise",
            Precision::Fp8Rowwise => "fp8-rowwise",
            Precision::Mxfp8 => "mxfp8",
        }
    }
    /// Linear layers' GEMMs run in FP8.
    pub fn is_fp8(self) -> bool {
        !matches!(self, Precision::Bf16 | Precision::Fp16)
    }
    /// The precision of everything that is not an FP8 GEMM: bf16 under the FP8 recipes.
    pub fn high(self) -> Precision {
        match self {
            Precision::Fp16 => Precision::Fp16,
            _ => Precision::Bf16,
        }
    }
    /// HBM bytes a cast to FP8 moves per input element: the cast reads 2 bytes and writes 1;
    /// current scaling first reads the operand once more for its amax (2 bytes). 0 outside FP8.
    pub fn cast_bytes_per_element(self) -> u64 {
        match self {
            Precision::Bf16 | Precision::Fp16 => 0,
            Precision::Fp8Delayed | Precision::Mxfp8 => 3,
            Precision::Fp8Tensorwise | Precision::Fp8Rowwise => 5,
        }
    }
    /// Elements an `[m × k]·[k × n]` linear GEMM casts to FP8: the `[m × k]` operand (the
    /// activation or output gradient over a micro-batch's tokens; a weight, `k·n`, is small
    /// beside it). Rowwise scaling casts the `[k × n]` operand too: its scales run along the
    /// contraction dimension, so the weight gradient's `Xᵀ·dY` needs the output gradient
    /// scaled per column, a second cast from bf16 beside the per-row one of `dY·W` (torchao's
    /// training docs, "shown for fp8_rowwise": `grad_weight = to_fp8(input.t()) @
    /// to_fp8(grad_output)`), where a tensorwise FP8 copy is reused transposed.
    pub fn cast_elements(self, m: u64, n: u64, k: u64) -> u64 {
        match self {
            Precision::Bf16 | Precision::Fp16 => 0,
            Precision::Fp8Rowwise => m * k + k * n,
            _ => m * k,
        }
    }
    /// Bytes per linear-layer parameter of the FP8 weight copies kept between micro-batches:
    /// the FP8 weight and its transpose (delayed scaling, MXFP8's row- and column-wise copies);
    /// 0 where weights are cast on the fly.
    pub fn fp8_weight_copy_bytes_per_param(self) -> u64 {
        match self {
            Precision::Fp8Delayed | Precision::Mxfp8 => 2,
            _ => 0,
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        PRECISIONS
            .into_iter()
            .find(|p| p.as_str() == s)
            .or(match s {
                "fp8-delayed" => Some(Precision::Fp8Delayed),
                _ => None,
            })
            .ok_or_else(|| {
                format!(
                    "unknown precision '{s}': use bf16, fp16, fp8 (delayed scaling), fp8-tensorwise, fp8-rowwise or mxfp8"
                )
            })
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One GPU kind's figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuSpec {
    /// Catalog name, e.g. `a100-80g`.
    pub name: String,
    /// Dense bf16 tensor-core peak in FLOP/s (0 when the GPU has no bf16 tensor cores).
    pub peak_bf16_flops: f64,
    /// Dense fp16 tensor-core peak in FLOP/s.
    pub peak_fp16_flops: f64,
    /// Dense fp8 tensor-core peak in FLOP/s (0 when absent).
    #[serde(default)]
    pub peak_fp8_flops: f64,
    /// Memory capacity in bytes.
    pub memory_bytes: u64,
    /// HBM bandwidth in bytes/s.
    pub hbm_bw_bytes_per_s: f64,
    /// NVLink bandwidth per GPU per direction in bytes/s.
    pub nvlink_bw_bytes_per_s: f64,
    /// Default NIC bandwidth per GPU for this generation's clusters, in Gbit/s.
    pub default_nic_gbps: f64,
    /// GPUs in one NVLink (or Infinity Fabric) domain: the default GPUs per node (8 for HGX
    /// and DGX boards and MI300X platforms, 72 for GB200/GB300 NVL72 racks).
    #[serde(default = "eight")]
    pub nvlink_domain: u64,
    /// The tensor cores run MXFP8 (block-scaled FP8, Blackwell and later) at the FP8 peak.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mxfp8: bool,
    /// Where the figures come from (a datasheet), for the catalog's kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
}

fn eight() -> u64 {
    8
}

impl GpuSpec {
    /// Dense peak in FLOP/s for `precision`, or an error naming the fix when the GPU lacks it.
    pub fn peak_flops(&self, precision: Precision) -> Result<f64, HardwareError> {
        let peak = match precision {
            Precision::Bf16 => self.peak_bf16_flops,
            Precision::Fp16 => self.peak_fp16_flops,
            Precision::Mxfp8 if !self.mxfp8 => {
                return Err(HardwareError::Unsupported(format!(
                    "--precision mxfp8: {} has no block-scaled (MX) FP8 tensor cores (Blackwell and later have); use --precision fp8",
                    self.name
                )))
            }
            _ => self.peak_fp8_flops,
        };
        if peak > 0.0 {
            Ok(peak)
        } else if precision.is_fp8() {
            Err(HardwareError::Unsupported(format!(
                "--precision {precision}: {} has no FP8 tensor cores (Hopper and later have); use --precision bf16",
                self.name
            )))
        } else {
            Err(HardwareError::Unsupported(format!(
                "--precision {precision}: {} has no {precision} tensor cores; use --precision fp16",
                self.name
            )))
        }
    }

    /// Checks every figure is positive and finite; errors name the field.
    pub fn validate(&self) -> Result<(), HardwareError> {
        let figures = [
            ("peak_fp16_flops", self.peak_fp16_flops),
            ("hbm_bw_bytes_per_s", self.hbm_bw_bytes_per_s),
            ("nvlink_bw_bytes_per_s", self.nvlink_bw_bytes_per_s),
            ("default_nic_gbps", self.default_nic_gbps),
        ];
        for (field, value) in figures {
            if !(value.is_finite() && value > 0.0) {
                return Err(HardwareError::invalid(
                    &format!("gpu.{field}"),
                    "must be a positive number",
                ));
            }
        }
        for (field, value) in [
            ("peak_bf16_flops", self.peak_bf16_flops),
            ("peak_fp8_flops", self.peak_fp8_flops),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(HardwareError::invalid(
                    &format!("gpu.{field}"),
                    "must be zero or a positive number",
                ));
            }
        }
        if self.memory_bytes == 0 {
            return Err(HardwareError::invalid(
                "gpu.memory_bytes",
                "must be a positive number of bytes",
            ));
        }
        // past these, times and byte sums leave any float or u64 (a thousandth of today's
        // slowest figures, a thousand times today's fastest)
        if self.memory_bytes > MAX_GPU_MEMORY_BYTES {
            return Err(HardwareError::invalid(
                "gpu.memory_bytes",
                &format!("must be at most {MAX_GPU_MEMORY_BYTES} bytes (1 PiB)"),
            ));
        }
        for (field, value, lo, hi) in [
            ("peak_fp16_flops", self.peak_fp16_flops, 1e9, 1e19),
            ("peak_bf16_flops", self.peak_bf16_flops, 1e9, 1e19),
            ("peak_fp8_flops", self.peak_fp8_flops, 1e9, 1e19),
            ("hbm_bw_bytes_per_s", self.hbm_bw_bytes_per_s, 1e6, 1e16),
            (
                "nvlink_bw_bytes_per_s",
                self.nvlink_bw_bytes_per_s,
                1e6,
                1e16,
            ),
            ("default_nic_gbps", self.default_nic_gbps, 1e-3, 1e6),
        ] {
            // zero is allowed where it means "none" (no bf16 or FP8 tensor cores)
            if value != 0.0 && !(lo..=hi).contains(&value) {
                return Err(HardwareError::invalid(
                    &format!("gpu.{field}"),
                    &format!("must be from {lo:e} to {hi:e}"),
                ));
            }
        }
        Ok(())
    }
}

/// The most memory a GPU description may have, bytes (1 PiB).
pub const MAX_GPU_MEMORY_BYTES: u64 = 1 << 50;

/// The built-in GPU kinds, one JSON object per kind with its datasheet source
/// (`hardware/data/gpus.json`).
pub const BUNDLED_CATALOG: &str = include_str!("../data/gpus.json");

/// The built-in GPU kinds, in catalog order.
pub fn catalog() -> Vec<GpuSpec> {
    static CATALOG: std::sync::OnceLock<Vec<GpuSpec>> = std::sync::OnceLock::new();
    CATALOG
        .get_or_init(|| {
            // bundled with the binary and parsed by the tests below, so never user data
            serde_json::from_str(BUNDLED_CATALOG).expect("hardware/data/gpus.json parses")
        })
        .clone()
}

/// The catalog as `autopp gpus` prints it: one row per kind with its peaks, memory and
/// bandwidths.
pub fn catalog_table() -> String {
    let mut o = format!(
        "{:<10} {:>11} {:>11} {:>11} {:>10} {:>9} {:>13} {:>9} {:>7}\n",
        "gpu",
        "bf16 TF/s",
        "fp16 TF/s",
        "fp8 TF/s",
        "memory",
        "HBM TB/s",
        "NVLink GB/s",
        "NIC Gb/s",
        "domain"
    );
    let tf = |x: f64| {
        if x > 0.0 {
            format!("{:.0}", x / 1e12)
        } else {
            "—".into()
        }
    };
    for g in catalog() {
        o += &format!(
            "{:<10} {:>11} {:>11} {:>11} {:>6.1} GiB {:>9.2} {:>13.0} {:>9.0} {:>7}\n",
            g.name,
            tf(g.peak_bf16_flops),
            tf(g.peak_fp16_flops),
            tf(g.peak_fp8_flops),
            g.memory_bytes as f64 / (1u64 << 30) as f64,
            g.hbm_bw_bytes_per_s / 1e12,
            g.nvlink_bw_bytes_per_s / 1e9,
            g.default_nic_gbps,
            g.nvlink_domain
        );
    }
    o
}

/// Looks a GPU kind up by name; the error lists the kinds there are.
pub fn gpu(name: &str) -> Result<GpuSpec, HardwareError> {
    let all = catalog();
    let names: Vec<String> = all.iter().map(|g| g.name.clone()).collect();
    all.into_iter()
        .find(|g| g.name == name)
        .ok_or_else(|| HardwareError::UnknownGpu {
            name: name.to_string(),
            available: names.join(", "),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A described GPU's figures stay within what times and byte sums can hold: a thousandth
    /// of today's slowest, a thousand times today's fastest; zero where it means none.
    #[test]
    fn gpu_figures_out_of_range_are_refused() {
        let h100 = gpu("h100-sxm").unwrap();
        type Edit = fn(&mut GpuSpec);
        for (edit, want) in [
            (
                (|g: &mut GpuSpec| g.memory_bytes = u64::MAX) as Edit,
                "gpu.memory_bytes must be at most 1125899906842624 bytes (1 PiB)",
            ),
            (
                |g: &mut GpuSpec| g.nvlink_bw_bytes_per_s = 1e-300,
                "gpu.nvlink_bw_bytes_per_s must be from 1e6 to 1e16",
            ),
            (
                |g: &mut GpuSpec| g.peak_bf16_flops = 1e300,
                "gpu.peak_bf16_flops must be from 1e9 to 1e19",
            ),
        ] {
            let mut g = h100.clone();
            edit(&mut g);
            assert_eq!(g.validate().unwrap_err().to_string(), want);
        }
        let mut none = h100.clone();
        none.peak_fp8_flops = 0.0;
        assert!(none.validate().is_ok());
    }

    #[test]
    fn catalog_names_are_unique_and_valid() {
        let all: Vec<GpuSpec> = serde_json::from_str(BUNDLED_CATALOG).unwrap();
        assert_eq!(all.len(), 11);
        assert!(catalog_table().lines().count() == 12);
        for g in &all {
            g.validate().unwrap();
            assert!(
                g.source.as_deref().is_some_and(|s| s.contains("datasheet")),
                "{}",
                g.name
            );
            assert_eq!(all.iter().filter(|o| o.name == g.name).count(), 1);
        }
    }

    #[test]
    fn unknown_gpu_lists_the_catalog() {
        let err = gpu("b100").unwrap_err().to_string();
        assert!(err.contains("b100") && err.contains("a100-80g"), "{err}");
    }

    /// The published figures of the new kinds (sources beside each entry): GB200 NVL72's
    /// 180 PFLOP/s dense BF16 over 72 GPUs is 2.5 PFLOP/s each, in one NVLink domain of 72;
    /// GB300 NVL72's 72 × 288 GB = 20.7 TB; MI300X's 7 links × 64 GB/s = 448 GB/s.
    #[test]
    fn blackwell_and_mi300x_figures() {
        let gb200 = gpu("gb200").unwrap();
        assert_eq!(gb200.peak_bf16_flops * 72.0, 180e15);
        assert_eq!(gb200.nvlink_domain, 72);
        assert_eq!(gb200.peak_fp8_flops, 2.0 * gb200.peak_bf16_flops);
        assert_eq!(gpu("b200").unwrap().memory_bytes, 180_000_000_000);
        assert_eq!(gpu("gb300").unwrap().memory_bytes * 72, 20_736_000_000_000);
        let mi = gpu("mi300x").unwrap();
        assert_eq!(mi.peak_bf16_flops, 1307.4e12);
        assert_eq!(mi.nvlink_bw_bytes_per_s, 7.0 * 64e9);
        assert_eq!(gpu("h100-sxm").unwrap().nvlink_domain, 8);
        // 80 GB of HBM3 of which nvidia-smi reports 81,559 MiB; H200's 141 GB as 143,771 MiB
        assert_eq!(gpu("h100-sxm").unwrap().memory_bytes, 81_559 << 20);
        assert_eq!(gpu("h200").unwrap().memory_bytes, 143_771 << 20);
        assert_eq!(gpu("a100-80g").unwrap().memory_bytes, 80 << 30);
    }

    /// The power-capped Grand Teton H100 (its entry's sources): 886 = 835 + 154 × 100 / 300
    /// TFLOP/s, rounded; 2.4 TB/s of HBM2e; 97,871 MiB = 96 GiB × 81,559 / 81,920.
    #[test]
    fn grand_teton_h100_sits_between_nvl_and_sxm() {
        let gt = gpu("h100-hbm2e-500w").unwrap();
        let interpolated: f64 = 835e12 + (989e12 - 835e12) * (500.0 - 400.0) / (700.0 - 400.0);
        assert!((gt.peak_bf16_flops - interpolated).abs() < 0.5e12);
        assert_eq!(gt.peak_fp8_flops, 2.0 * gt.peak_bf16_flops);
        assert_eq!(gt.hbm_bw_bytes_per_s, 2.4e12);
        assert_eq!(gt.memory_bytes, 97_871 << 20);
        assert_eq!(
            gt.nvlink_bw_bytes_per_s,
            gpu("h100-sxm").unwrap().nvlink_bw_bytes_per_s
        );
    }

    #[test]
    fn v100_rejects_bf16() {
        let v100 = gpu("v100-32g").unwrap();
        assert!(v100.peak_flops(Precision::Bf16).is_err());
        assert!(v100.peak_flops(Precision::Fp8Delayed).is_err());
        assert_eq!(v100.peak_flops(Precision::Fp16).unwrap(), 125e12);
    }

    #[test]
    fn precisions_parse_print_and_serialize_alike() {
        for p in PRECISIONS {
            assert_eq!(p.as_str().parse::<Precision>().unwrap(), p);
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{p}\""));
            assert_eq!(serde_json::from_str::<Precision>(&json).unwrap(), p);
        }
        assert_eq!(
            "fp8-delayed".parse::<Precision>(),
            Ok(Precision::Fp8Delayed)
        );
        let err = "fp4".parse::<Precision>().unwrap_err();
        assert!(err.contains("fp8-tensorwise"), "{err}");
        assert!(!Precision::Bf16.is_fp8() && Precision::Mxfp8.is_fp8());
        assert_eq!(Precision::Fp8Rowwise.high(), Precision::Bf16);
    }
}
