//! The cluster: a GPU kind × GPUs per node × nodes, the links between them, and where each
//! parallel group's members sit.

use serde::{Deserialize, Serialize};

use crate::hardware::{self, GpuSpec};
use crate::HardwareError;

/// Default latency of one step of a collective inside a node, in seconds (NVLink, NCCL).
pub const DEFAULT_INTRA_NODE_LATENCY_S: f64 = 6e-6;
/// Default latency of one step of a collective across nodes, in seconds (InfiniBand, NCCL).
pub const DEFAULT_INTER_NODE_LATENCY_S: f64 = 12e-6;

/// The slowest link a cluster may have, Gbit/s (NIC) or GB/s (NVLink): below it transfer times
/// leave any float.
pub const MIN_GBPS: f64 = 1e-3;
/// The fastest link a cluster may have, Gbit/s or GB/s: a thousand times today's.
pub const MAX_GBPS: f64 = 1e6;
/// The longest collective step latency a cluster may have, microseconds (a second).
pub const MAX_LATENCY_US: f64 = 1e6;

/// A homogeneous GPU cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// The GPU kind every node has.
    pub gpu: GpuSpec,
    /// GPUs per node (an NVLink domain).
    pub gpus_per_node: u64,
    /// Number of nodes.
    pub nodes: u64,
    /// Network bandwidth per GPU (one NIC per GPU), per direction, in bytes/s.
    pub nic_bw_bytes_per_s: f64,
    /// Latency of one collective step inside a node, in seconds.
    pub intra_node_latency_s: f64,
    /// Latency of one collective step across nodes, in seconds.
    pub inter_node_latency_s: f64,
}

/// `cluster.json`: the machine a plan is for. Unknown keys are rejected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// A catalog GPU name, or a full GPU description.
    pub gpu: GpuRef,
    /// GPUs per node.
    pub gpus_per_node: u64,
    /// Number of nodes.
    pub nodes: u64,
    /// NIC bandwidth per GPU in Gbit/s (default: the GPU generation's usual NIC).
    #[serde(default)]
    pub nic_gbps: Option<f64>,
    /// NVLink bandwidth per GPU per direction in GB/s (default: the GPU kind's).
    #[serde(default)]
    pub nvlink_gbps_per_direction: Option<f64>,
    /// Collective step latency inside a node, microseconds.
    #[serde(default)]
    pub intra_node_latency_us: Option<f64>,
    /// Collective step latency across nodes, microseconds.
    #[serde(default)]
    pub inter_node_latency_us: Option<f64>,
}

/// A GPU named from the catalog or described in full.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GpuRef {
    /// A catalog name such as `a100-80g`.
    Name(String),
    /// A full description.
    Spec(GpuSpec),
}

impl Cluster {
    /// A cluster of `num_gpus` GPUs of `gpu`, `gpus_per_node` to a node. Fewer GPUs than a node
    /// make one partial node; more must fill whole nodes.
    pub fn new(
        gpu: GpuSpec,
        num_gpus: u64,
        gpus_per_node: u64,
        nic_gbps: Option<f64>,
    ) -> Result<Cluster, HardwareError> {
        gpu.validate()?;
        if num_gpus == 0 {
            return Err(HardwareError::invalid("--gpus", "must be at least 1"));
        }
        if gpus_per_node == 0 {
            return Err(HardwareError::invalid(
                "--gpus-per-node",
                "must be at least 1",
            ));
        }
        let (per_node, nodes) = if num_gpus <= gpus_per_node {
            (num_gpus, 1)
        } else if num_gpus.is_multiple_of(gpus_per_node) {
            (gpus_per_node, num_gpus / gpus_per_node)
        } else {
            // the next whole number of nodes, where it is a number
            let example = num_gpus
                .div_ceil(gpus_per_node)
                .checked_mul(gpus_per_node)
                .map_or_else(String::new, |n| format!(" (e.g. {n})"));
            return Err(HardwareError::invalid(
                "--gpus",
                &format!(
                    "{num_gpus} GPUs do not fill whole nodes of {gpus_per_node}: use a multiple of --gpus-per-node{example}"
                ),
            ));
        };
        let nic_gbps = nic_gbps.unwrap_or(gpu.default_nic_gbps);
        if !(nic_gbps.is_finite() && nic_gbps > 0.0) {
            return Err(HardwareError::invalid(
                "--nic-gbps",
                "must be a positive number of Gbit/s",
            ));
        }
        if !(MIN_GBPS..=MAX_GBPS).contains(&nic_gbps) {
            return Err(HardwareError::invalid(
                "--nic-gbps",
                &format!("must be from {MIN_GBPS} to {MAX_GBPS} Gbit/s"),
            ));
        }
        Ok(Cluster {
            gpu,
            gpus_per_node: per_node,
            nodes,
            nic_bw_bytes_per_s: nic_gbps * 1e9 / 8.0,
            intra_node_latency_s: DEFAULT_INTRA_NODE_LATENCY_S,
            inter_node_latency_s: DEFAULT_INTER_NODE_LATENCY_S,
        })
    }

    /// Builds a cluster from a `cluster.json` text; `origin` names the file in errors.
    pub fn from_json(text: &str, origin: &str) -> Result<Cluster, HardwareError> {
        let file: ClusterFile = serde_json::from_str(text).map_err(|e| HardwareError::Json {
            origin: origin.to_string(),
            message: e.to_string(),
        })?;
        // a value out of range is the file's key, named with the file
        Self::from_file(file).map_err(|e| match e {
            HardwareError::Invalid { field, message } => {
                let key = match field.as_str() {
                    "--gpus-per-node" => "gpus_per_node",
                    "--nic-gbps" => "nic_gbps",
                    "--gpus" => "nodes",
                    other => other,
                };
                HardwareError::Invalid {
                    field: format!("{origin}: '{key}'"),
                    message,
                }
            }
            e => e,
        })
    }

    /// [`Cluster::from_json`] once the file is parsed; errors name the keys.
    fn from_file(file: ClusterFile) -> Result<Cluster, HardwareError> {
        let gpu = match file.gpu {
            GpuRef::Name(name) => hardware::gpu(&name)?,
            GpuRef::Spec(spec) => spec,
        };
        if file.nodes == 0 {
            return Err(HardwareError::invalid("nodes", "must be at least 1"));
        }
        if file.gpus_per_node == 0 {
            return Err(HardwareError::invalid(
                "gpus_per_node",
                "must be at least 1",
            ));
        }
        let mut cluster = Cluster::new(
            gpu,
            file.nodes.checked_mul(file.gpus_per_node).ok_or_else(|| {
                HardwareError::invalid("nodes", "nodes × gpus_per_node is too large")
            })?,
            file.gpus_per_node,
            file.nic_gbps,
        )?;
        if let Some(gbps) = file.nvlink_gbps_per_direction {
            if !(gbps.is_finite() && gbps > 0.0) {
                return Err(HardwareError::invalid(
                    "nvlink_gbps_per_direction",
                    "must be a positive number of GB/s",
                ));
            }
            if !(MIN_GBPS..=MAX_GBPS).contains(&gbps) {
                return Err(HardwareError::invalid(
                    "nvlink_gbps_per_direction",
                    &format!("must be from {MIN_GBPS} to {MAX_GBPS} GB/s"),
                ));
            }
            cluster.gpu.nvlink_bw_bytes_per_s = gbps * 1e9;
        }
        for (field, value, slot) in [
            (
                "intra_node_latency_us",
                file.intra_node_latency_us,
                &mut cluster.intra_node_latency_s,
            ),
            (
                "inter_node_latency_us",
                file.inter_node_latency_us,
                &mut cluster.inter_node_latency_s,
            ),
        ] {
            if let Some(us) = value {
                if !(us.is_finite() && us >= 0.0) {
                    return Err(HardwareError::invalid(
                        field,
                        "must be zero or more microseconds",
                    ));
                }
                if us > MAX_LATENCY_US {
                    return Err(HardwareError::invalid(
                        field,
                        &format!("must be at most {MAX_LATENCY_US} microseconds (a second)"),
                    ));
                }
                *slot = us * 1e-6;
            }
        }
        Ok(cluster)
    }

    /// Restricts the cluster to its first `num_gpus` GPUs (whole nodes, or part of one node).
    pub fn with_gpus(&self, num_gpus: u64) -> Result<Cluster, HardwareError> {
        if num_gpus > self.num_gpus() {
            return Err(HardwareError::invalid(
                "--gpus",
                &format!(
                    "{num_gpus} is more than the cluster's {} GPUs",
                    self.num_gpus()
                ),
            ));
        }
        self.resized(num_gpus)
    }

    /// The same machine (GPU kind, GPUs per node, NIC, latencies) at `num_gpus` GPUs, more or
    /// fewer than this cluster has: whole nodes, or part of one node.
    pub fn resized(&self, num_gpus: u64) -> Result<Cluster, HardwareError> {
        let mut c = Cluster::new(
            self.gpu.clone(),
            num_gpus,
            self.gpus_per_node,
            Some(self.nic_bw_bytes_per_s * 8.0 / 1e9),
        )?;
        c.intra_node_latency_s = self.intra_node_latency_s;
        c.inter_node_latency_s = self.inter_node_latency_s;
        Ok(c)
    }

    /// Total GPUs.
    pub fn num_gpus(&self) -> u64 {
        self.gpus_per_node.saturating_mul(self.nodes)
    }

    /// Checks a cluster read whole from a file (a plan file's): what [`Cluster::new`] and
    /// [`Cluster::from_json`] check of the clusters they build, with `origin` naming the file.
    pub fn validate(&self, origin: &str) -> Result<(), HardwareError> {
        let bad = |field: &str, message: String| HardwareError::Invalid {
            field: format!("{origin}: 'cluster.{field}'"),
            message,
        };
        self.gpu.validate()?;
        if self.gpus_per_node == 0 || self.nodes == 0 {
            return Err(bad("nodes", "and gpus_per_node must be at least 1".into()));
        }
        if self.gpus_per_node.checked_mul(self.nodes).is_none() {
            return Err(bad("nodes", "× gpus_per_node is too large".into()));
        }
        let gbps = self.nic_bw_bytes_per_s * 8.0 / 1e9;
        if !(MIN_GBPS..=MAX_GBPS).contains(&gbps) {
            return Err(bad(
                "nic_bw_bytes_per_s",
                format!("must be from {MIN_GBPS} to {MAX_GBPS} Gbit/s"),
            ));
        }
        for (field, s) in [
            ("intra_node_latency_s", self.intra_node_latency_s),
            ("inter_node_latency_s", self.inter_node_latency_s),
        ] {
            if !(s.is_finite() && (0.0..=MAX_LATENCY_US * 1e-6).contains(&s)) {
                return Err(bad(field, "must be from 0 to 1 second".into()));
            }
        }
        Ok(())
    }

    /// The node a global GPU index sits on.
    pub fn node_of(&self, gpu_index: u64) -> u64 {
        gpu_index / self.gpus_per_node
    }

    /// Whether any group of `size` GPUs with members `stride` apart spans more than one node.
    /// Groups tile the GPUs in blocks of `size · stride`: block `b`, offset `o < stride` holds
    /// GPUs `b·size·stride + o + k·stride`. The layout repeats every `lcm(block, node)` GPUs, so
    /// the blocks up to there are checked.
    pub fn group_spans_nodes(&self, size: u64, stride: u64) -> bool {
        if size <= 1 {
            return false;
        }
        let stride = stride.max(1);
        let block = size * stride;
        let gcd = |mut a: u64, mut b: u64| {
            while b != 0 {
                (a, b) = (b, a % b);
            }
            a
        };
        let period = block / gcd(block, self.gpus_per_node) * self.gpus_per_node;
        let blocks = (period / block).clamp(1, self.num_gpus().div_ceil(block).max(1));
        (0..blocks).any(|b| {
            (0..stride).any(|offset| {
                let first = b * block + offset;
                let node = self.node_of(first);
                (1..size).any(|k| self.node_of(first + k * stride) != node)
            })
        })
    }

    /// The link between two GPUs (by global index): NVLink inside a node, the NIC across
    /// nodes.
    pub fn link_between(&self, gpu_a: u64, gpu_b: u64) -> Link {
        if self.node_of(gpu_a) == self.node_of(gpu_b) {
            self.intra_node_link()
        } else {
            self.inter_node_link()
        }
    }

    /// NVLink inside a node.
    fn intra_node_link(&self) -> Link {
        Link {
            bw_bytes_per_s: self.gpu.nvlink_bw_bytes_per_s,
            latency_s: self.intra_node_latency_s,
            inter_node: false,
        }
    }

    /// The NIC (capped by NVLink) across nodes.
    fn inter_node_link(&self) -> Link {
        Link {
            bw_bytes_per_s: self.nic_bw_bytes_per_s.min(self.gpu.nvlink_bw_bytes_per_s),
            latency_s: self.inter_node_latency_s,
            inter_node: true,
        }
    }

    /// A parallel group's link: bandwidth per direction per GPU in bytes/s and per-step latency.
    /// Across nodes this is one GPU's NIC: right for sends and all-to-alls, where each GPU's
    /// own traffic leaves through its own NIC; ring collectives use [`Cluster::ring_link`].
    pub fn group_link(&self, size: u64, stride: u64) -> Link {
        if self.group_spans_nodes(size, stride) {
            self.inter_node_link()
        } else {
            self.intra_node_link()
        }
    }

    /// Members of a group of `size` GPUs `stride` apart that share one node (at least 1).
    pub fn members_per_node(&self, size: u64, stride: u64) -> u64 {
        let stride = stride.max(1);
        if stride >= self.gpus_per_node {
            1
        } else {
            (self.gpus_per_node / stride).clamp(1, size.max(1))
        }
    }

    /// The link a ring collective (all-reduce, all-gather, reduce-scatter) of a group runs
    /// over. Inside a node, NVLink. Across nodes NCCL builds one ring per rail: with `d`
    /// members of the group on each node, `d` rings (channels) run at once, each leaving the
    /// node through a different member's NIC, and each carries `1/d` of the data; the data
    /// that stays inside a node crosses NVLink meanwhile. A ring step then moves `d` NICs'
    /// worth per node, so the group's bus bandwidth is `min(d · NIC, NVLink)` per GPU
    /// (NVIDIA/nccl#412, S. Jeaugey: inter-node bus bandwidth grows with the NICs a node
    /// uses, "up to … the NVLink intra-node bandwidth"; NVIDIA/nccl#1168: 4 GPUs per node
    /// measure half the all-reduce bus bandwidth of 8 on the same network). A data-parallel
    /// group under tp 8 has one member per node (`d` = 1): one NIC, as before.
    pub fn ring_link(&self, size: u64, stride: u64) -> Link {
        let link = self.group_link(size, stride);
        if !link.inter_node {
            return link;
        }
        let d = self.members_per_node(size, stride) as f64;
        Link {
            bw_bytes_per_s: (d * self.nic_bw_bytes_per_s).min(self.gpu.nvlink_bw_bytes_per_s),
            ..link
        }
    }
}

/// A link a collective or a send runs over.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Link {
    /// Bandwidth per GPU per direction in bytes/s.
    pub bw_bytes_per_s: f64,
    /// Latency per step in seconds.
    pub latency_s: f64,
    /// Whether the link leaves the node.
    pub inter_node: bool,
}

/// Where the parallel groups sit: Megatron's rank order, tensor-parallel fastest, then
/// context-, data- and pipeline-parallel (`tp-cp-dp-pp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Layout {
    /// Tensor-parallel degree.
    pub tp: u64,
    /// Context-parallel degree.
    pub cp: u64,
    /// Data-parallel degree.
    pub dp: u64,
    /// Pipeline ranks.
    pub pp: u64,
}

impl Layout {
    /// Stride between members of the tensor-parallel group.
    pub fn tp_stride(&self) -> u64 {
        1
    }
    /// Stride between members of the context-parallel group.
    pub fn cp_stride(&self) -> u64 {
        self.tp
    }
    /// Stride between members of the data-parallel group.
    pub fn dp_stride(&self) -> u64 {
        self.tp * self.cp
    }
    /// Stride between consecutive pipeline ranks.
    pub fn pp_stride(&self) -> u64 {
        self.tp * self.cp * self.dp
    }
    /// Whether the send from pipeline rank `r` to rank `r + 1` (wrapping to 0 after the last
    /// rank) leaves the node.
    pub fn pp_boundary_inter_node(&self, cluster: &Cluster, r: u64) -> bool {
        let next = (r + 1) % self.pp.max(1);
        cluster.node_of(r * self.pp_stride()) != cluster.node_of(next * self.pp_stride())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100(n: u64) -> Cluster {
        Cluster::new(hardware::gpu("a100-80g").unwrap(), n, 8, None).unwrap()
    }

    #[test]
    fn partial_and_whole_nodes() {
        let c = a100(4);
        assert_eq!((c.gpus_per_node, c.nodes), (4, 1));
        let c = a100(64);
        assert_eq!((c.gpus_per_node, c.nodes), (8, 8));
        let err = Cluster::new(hardware::gpu("a100-80g").unwrap(), 12, 8, None).unwrap_err();
        assert!(err.to_string().contains("--gpus"), "{err}");
    }

    #[test]
    fn hdr_nic_is_25_gb_per_s() {
        assert_eq!(a100(16).nic_bw_bytes_per_s, 25e9);
    }

    #[test]
    fn group_spans() {
        let c = a100(64);
        // tp=8 inside a node; dp with stride 8 spans nodes; tp=2,dp=4 stride 2 stays inside
        assert!(!c.group_spans_nodes(8, 1));
        assert!(c.group_spans_nodes(2, 8));
        assert!(!c.group_spans_nodes(4, 2));
        assert!(c.group_spans_nodes(8, 2));
        // tp = 6 on 8-GPU nodes: the first group (0..5) stays inside, the second (6..11) does not
        assert!(c.group_spans_nodes(6, 1));
        assert!(!c.group_spans_nodes(4, 1));
        assert!(c.group_link(2, 8).inter_node);
        assert!(!c.link_between(3, 7).inter_node);
        assert!(c.link_between(7, 8).inter_node);
        assert_eq!(c.link_between(7, 8).bw_bytes_per_s, 25e9);
        assert_eq!(c.group_link(8, 1).bw_bytes_per_s, 300e9);
    }

    /// Ring collectives across nodes run one ring per rail (`ring_link`'s sources): on A100
    /// nodes of 8 with 25 GB/s HDR NICs, a data-parallel group of 64 under tp 1 has 8 members
    /// per node, 8 × 25 = 200 GB/s (under NVLink's 300); under tp 2, 4 × 25 = 100 GB/s; under
    /// tp 8 one member per node, one NIC (25 GB/s). Inside a node, NVLink (300 GB/s).
    #[test]
    fn rings_across_nodes_use_one_nic_per_member_on_a_node() {
        let c = a100(64);
        assert_eq!(c.members_per_node(64, 1), 8);
        assert_eq!(c.ring_link(64, 1).bw_bytes_per_s, 200e9);
        assert_eq!(c.ring_link(32, 2).bw_bytes_per_s, 100e9);
        assert_eq!(c.ring_link(8, 8).bw_bytes_per_s, 25e9);
        assert_eq!(c.members_per_node(8, 16), 1);
        assert!(c.ring_link(64, 1).inter_node);
        assert_eq!(c.ring_link(8, 1).bw_bytes_per_s, 300e9);
        assert!(!c.ring_link(8, 1).inter_node);
        // GPUs 0 and 4 share node 0: NVLink
        assert!(!c.ring_link(2, 4).inter_node);
    }

    #[test]
    fn pipeline_boundaries() {
        let c = a100(16);
        // tp=2, dp=1, pp=8: ranks 0..3 on node 0, 4..7 on node 1
        let l = Layout {
            tp: 2,
            cp: 1,
            dp: 1,
            pp: 8,
        };
        let inter: Vec<bool> = (0..7).map(|r| l.pp_boundary_inter_node(&c, r)).collect();
        assert_eq!(inter, vec![false, false, false, true, false, false, false]);
    }

    #[test]
    fn cluster_json_rejects_unknown_keys() {
        let err = Cluster::from_json(
            r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "nics": 8}"#,
            "c.json",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("nics"), "{err}");
        let c = Cluster::from_json(
            r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "nic_gbps": 200}"#,
            "c.json",
        )
        .unwrap();
        assert_eq!(c.num_gpus(), 16);
        assert_eq!(c.nic_bw_bytes_per_s, 25e9);
    }

    /// A GPU count past the last whole number of nodes that `u64` holds is refused without an
    /// overflow (it once advised "e.g. 0"; a debug build panicked).
    #[test]
    fn the_largest_gpu_counts_are_refused_without_overflow() {
        let gpu = crate::hardware::gpu("h100-sxm").unwrap();
        let err = Cluster::new(gpu.clone(), u64::MAX, 8, None)
            .unwrap_err()
            .to_string();
        assert!(err.ends_with("use a multiple of --gpus-per-node"), "{err}");
        let err = Cluster::new(gpu, 12, 8, None).unwrap_err().to_string();
        assert!(err.ends_with("(e.g. 16)"), "{err}");
    }

    /// A value out of range in a `cluster.json` is named by the file and its key, not by the
    /// command-line flag it stands for.
    #[test]
    fn cluster_json_errors_name_the_file_and_key() {
        for (json, want) in [
            (
                r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 0}"#,
                "c.json: 'nodes' must be at least 1",
            ),
            (
                r#"{"gpu": "h100-sxm", "gpus_per_node": 0, "nodes": 2}"#,
                "c.json: 'gpus_per_node' must be at least 1",
            ),
            (
                r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "nic_gbps": -1}"#,
                "c.json: 'nic_gbps' must be a positive number of Gbit/s",
            ),
            (
                r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "inter_node_latency_us": -3}"#,
                "c.json: 'inter_node_latency_us' must be zero or more microseconds",
            ),
            // values once accepted that put times past any float (the fuzzer's panics)
            (
                r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "intra_node_latency_us": 1e300}"#,
                "c.json: 'intra_node_latency_us' must be at most 1000000 microseconds (a second)",
            ),
            (
                r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "nic_gbps": 1e-300}"#,
                "c.json: 'nic_gbps' must be from 0.001 to 1000000 Gbit/s",
            ),
            (
                r#"{"gpu": "h100-sxm", "gpus_per_node": 8, "nodes": 2, "nvlink_gbps_per_direction": 1e300}"#,
                "c.json: 'nvlink_gbps_per_direction' must be from 0.001 to 1000000 GB/s",
            ),
        ] {
            let err = Cluster::from_json(json, "c.json").unwrap_err().to_string();
            assert_eq!(err, want);
        }
    }
}
