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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// bfloat16 mixed precision (fp32 master weights).
    #[default]
    Bf16,
    /// fp16 mixed precision (fp32 master weights, loss scaling).
    Fp16,
}

impl Precision {
    /// Bytes per weight / activation element.
    pub fn bytes(self) -> u64 {
        2
    }
    /// The name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Bf16 => "bf16",
            Precision::Fp16 => "fp16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bf16" => Ok(Precision::Bf16),
            "fp16" => Ok(Precision::Fp16),
            other => Err(format!("unknown precision '{other}': use bf16 or fp16")),
        }
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
        };
        if peak > 0.0 {
            Ok(peak)
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
        Ok(())
    }
}

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// The built-in GPU kinds, in catalog order.
pub fn catalog() -> Vec<GpuSpec> {
    vec![
        GpuSpec {
            name: "v100-32g".into(),
            peak_bf16_flops: 0.0,
            peak_fp16_flops: 125e12,
            peak_fp8_flops: 0.0,
            memory_bytes: 32 * GIB,
            hbm_bw_bytes_per_s: 900e9,
            nvlink_bw_bytes_per_s: 150e9,
            default_nic_gbps: 100.0,
            nvlink_domain: 8,
        },
        GpuSpec {
            name: "a100-40g".into(),
            peak_bf16_flops: 312e12,
            peak_fp16_flops: 312e12,
            peak_fp8_flops: 0.0,
            memory_bytes: 40 * GIB,
            hbm_bw_bytes_per_s: 1555e9,
            nvlink_bw_bytes_per_s: 300e9,
            default_nic_gbps: 200.0,
            nvlink_domain: 8,
        },
        GpuSpec {
            name: "a100-80g".into(),
            peak_bf16_flops: 312e12,
            peak_fp16_flops: 312e12,
            peak_fp8_flops: 0.0,
            memory_bytes: 80 * GIB,
            hbm_bw_bytes_per_s: 2039e9,
            nvlink_bw_bytes_per_s: 300e9,
            default_nic_gbps: 200.0,
            nvlink_domain: 8,
        },
        GpuSpec {
            name: "h100-sxm".into(),
            peak_bf16_flops: 989e12,
            peak_fp16_flops: 989e12,
            peak_fp8_flops: 1979e12,
            memory_bytes: 81559 * MIB,
            hbm_bw_bytes_per_s: 3350e9,
            nvlink_bw_bytes_per_s: 450e9,
            default_nic_gbps: 400.0,
            nvlink_domain: 8,
        },
        GpuSpec {
            name: "h200".into(),
            peak_bf16_flops: 989e12,
            peak_fp16_flops: 989e12,
            peak_fp8_flops: 1979e12,
            memory_bytes: 143771 * MIB,
            hbm_bw_bytes_per_s: 4800e9,
            nvlink_bw_bytes_per_s: 450e9,
            default_nic_gbps: 400.0,
            nvlink_domain: 8,
        },
        // NVIDIA HGX B200 datasheet (2025): per GPU 2.25 PFLOP/s dense FP16/BF16 and 4.5 dense
        // FP8 (the sheet's 4.5 / 9 are with sparsity), 180 GB HBM3e at 8 TB/s (1.44 TB and
        // 64 TB/s per 8-GPU board), fifth-generation NVLink 1.8 TB/s both ways, ConnectX-7 at
        // 400 Gb/s per GPU.
        GpuSpec {
            name: "b200".into(),
            peak_bf16_flops: 2.25e15,
            peak_fp16_flops: 2.25e15,
            peak_fp8_flops: 4.5e15,
            memory_bytes: 180_000_000_000,
            hbm_bw_bytes_per_s: 8e12,
            nvlink_bw_bytes_per_s: 900e9,
            default_nic_gbps: 400.0,
            nvlink_domain: 8,
        },
        // NVIDIA GB200 NVL72 datasheet (2025), per GPU of the rack: 180 PFLOP/s dense
        // FP16/BF16 and 360 dense FP8 over 72 GPUs (2.5 and 5.0 each), 13.4 TB of HBM3e (186 GB
        // each) at 8 TB/s, one NVLink domain of 72 GPUs at 1.8 TB/s both ways, ConnectX-7 at
        // 400 Gb/s per GPU between racks.
        GpuSpec {
            name: "gb200".into(),
            peak_bf16_flops: 2.5e15,
            peak_fp16_flops: 2.5e15,
            peak_fp8_flops: 5e15,
            memory_bytes: 186_000_000_000,
            hbm_bw_bytes_per_s: 8e12,
            nvlink_bw_bytes_per_s: 900e9,
            default_nic_gbps: 400.0,
            nvlink_domain: 72,
        },
        // NVIDIA HGX B300 (Blackwell Ultra) datasheet (2025): dense FP16/BF16 and FP8 as B200
        // (Blackwell Ultra raises FP4, not 8- or 16-bit, throughput), 288 GB HBM3e at 8 TB/s,
        // NVLink 1.8 TB/s both ways, ConnectX-8 at 800 Gb/s per GPU.
        GpuSpec {
            name: "b300".into(),
            peak_bf16_flops: 2.25e15,
            peak_fp16_flops: 2.25e15,
            peak_fp8_flops: 4.5e15,
            memory_bytes: 288_000_000_000,
            hbm_bw_bytes_per_s: 8e12,
            nvlink_bw_bytes_per_s: 900e9,
            default_nic_gbps: 800.0,
            nvlink_domain: 8,
        },
        // NVIDIA GB300 NVL72 datasheet (2025), per GPU of the rack: dense FP16/BF16 and FP8 as
        // GB200 (2.5 and 5.0 PFLOP/s), 20.7 TB of HBM3e (288 GB each) at 8 TB/s, one NVLink
        // domain of 72 at 1.8 TB/s both ways, ConnectX-8 at 800 Gb/s per GPU.
        GpuSpec {
            name: "gb300".into(),
            peak_bf16_flops: 2.5e15,
            peak_fp16_flops: 2.5e15,
            peak_fp8_flops: 5e15,
            memory_bytes: 288_000_000_000,
            hbm_bw_bytes_per_s: 8e12,
            nvlink_bw_bytes_per_s: 900e9,
            default_nic_gbps: 800.0,
            nvlink_domain: 72,
        },
        // AMD Instinct MI300X datasheet (2023): 1307.4 TFLOP/s dense FP16/BF16 and 2614.9 dense
        // FP8, 192 GB HBM3 at 5.3 TB/s; 7 Infinity Fabric links of 64 GB/s each way to the
        // other 7 GPUs of the platform (448 GB/s each way in all; a ring reaches less, which
        // the calibrated intra-node efficiency must absorb); 400 Gb/s NICs per GPU.
        GpuSpec {
            name: "mi300x".into(),
            peak_bf16_flops: 1307.4e12,
            peak_fp16_flops: 1307.4e12,
            peak_fp8_flops: 2614.9e12,
            memory_bytes: 192_000_000_000,
            hbm_bw_bytes_per_s: 5.3e12,
            nvlink_bw_bytes_per_s: 448e9,
            default_nic_gbps: 400.0,
            nvlink_domain: 8,
        },
    ]
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

    #[test]
    fn catalog_names_are_unique_and_valid() {
        let all = catalog();
        for g in &all {
            g.validate().unwrap();
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
    }

    #[test]
    fn v100_rejects_bf16() {
        let v100 = gpu("v100-32g").unwrap();
        assert!(v100.peak_flops(Precision::Bf16).is_err());
        assert_eq!(v100.peak_flops(Precision::Fp16).unwrap(), 125e12);
    }
}
