//! The network between nodes as a published row describes it, in Gbit/s per GPU.

/// The first number in `text` after `from`, if any.
fn number_in(text: &str) -> Option<f64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// NIC bandwidth per GPU in Gbit/s from the row's description of the network between nodes:
/// `8x … 200 Gb/s HDR InfiniBand HCAs per node`, `1600 Gbps node-node`, `4 OPA links per node`
/// (Omni-Path: 100 Gbit/s a link). `None` when the row does not say.
pub fn nic_gbps_per_gpu(text: &str, gpus_per_node: u64) -> Option<f64> {
    let t = text.to_ascii_lowercase();
    let per_node = if t.contains("opa") || t.contains("omni-path") {
        let links = t.find("opa link").and_then(|i| {
            let head = &t[..i];
            let start = head.trim_end().rfind(' ').map_or(0, |j| j + 1);
            number_in(&head[start..])
        })?;
        links * 100.0
    } else if let Some(x) = t
        .find("x ")
        .filter(|&i| i > 0 && t[..i].chars().all(|c| c.is_ascii_digit()))
    {
        let count: f64 = t[..x].parse().ok()?;
        let rate_at = t.find("gb/s").or_else(|| t.find("gbps"))?;
        let head = &t[x + 1..rate_at];
        let start = head.trim_end().rfind(' ').map_or(0, |j| j + 1);
        count * number_in(&head[start..])?
    } else if t.contains("per gpu") {
        let rate_at = t.find("gbps").or_else(|| t.find("gb/s"))?;
        number_in(&t[..rate_at])? * gpus_per_node as f64
    } else if t.contains("node-node") || t.contains("per node") {
        let rate_at = t.find("gbps").or_else(|| t.find("gb/s"))?;
        number_in(&t[..rate_at])?
    } else {
        return None;
    };
    (per_node > 0.0).then_some(per_node / gpus_per_node.max(1) as f64)
}

/// Factor on the inter-node bandwidth of BigScience's Jean Zay A100 nodes in the runs measured
/// before their PCIe/NUMA setup was fixed on 2022-02-25 ([`before_jean_zay_pcie_fix`]).
///
/// Source: BigScience `train/tr11-176B-ml/chronicles-prequel.md`, section "GBS Variations"
/// (02-25): "A100s PCI-Express/NUMA was improved today so all TFLOPs have changed for the
/// better (1-5%) - thus do not compare today's numbers to yesterday's." The GPUs reach their
/// NICs over PCIe, so the traffic between nodes (pipeline sends, data-parallel reductions)
/// is what a PCIe/NUMA placement slows; inside a node the GPUs talk over NVLink. Not fitted:
/// the largest slowdown the source's range allows. With 0.6 the earlier runs of the
/// calibration set are predicted 3.2–4.8% slower than with the full rate (every other knob
/// shipped), inside the stated 1–5%; 0.5 would give 4.7–7.3%, beyond it.
pub const JEAN_ZAY_BEFORE_PCIE_FIX: f64 = 0.6;

/// Whether a row's `source` is BigScience's tr11 chronicle of its pre-launch benchmarks on Jean
/// Zay (`train/tr11-176B-ml/chronicles-prequel.md`).
pub fn from_bigscience_chronicle(source: &str) -> bool {
    source.contains("chronicles-prequel")
}

/// Whether a row is one of BigScience's pre-launch benchmarks (`chronicles-prequel.md`)
/// measured before 2022-02-25, the day Jean Zay's A100 nodes had their PCIe/NUMA setup fixed:
/// its `source` names the chronicle and its `notes` date it `Date MM-DD (YYYY)`.
pub fn before_jean_zay_pcie_fix(source: &str, notes: &str) -> bool {
    if !from_bigscience_chronicle(source) {
        return false;
    }
    let Some(at) = notes.find("Date ") else {
        return false;
    };
    let date = &notes[at + "Date ".len()..];
    let field = |range: std::ops::Range<usize>| date.get(range).and_then(|t| t.parse::<u32>().ok());
    match (field(0..2), field(3..5), field(7..11)) {
        (Some(month), Some(day), Some(year)) if date.get(2..3) == Some("-") => {
            (year, month, day) < (2022, 2, 25)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks() {
        let hdr = "8x NVIDIA Mellanox 200 Gb/s HDR InfiniBand HCAs per node (Selene)";
        assert_eq!(nic_gbps_per_gpu(hdr, 8), Some(200.0));
        let opa =
            "Omni-Path Architecture, 4 OPA links per node (Jean Zay); NCCL on dedicated subnet";
        assert_eq!(nic_gbps_per_gpu(opa, 8), Some(50.0));
        assert_eq!(
            nic_gbps_per_gpu("1600 Gbps node-node (RoCE)", 8),
            Some(200.0)
        );
        assert_eq!(nic_gbps_per_gpu("not stated", 8), None);
        assert_eq!(
            nic_gbps_per_gpu("RDMA backend 400 Gb/s per GPU", 8),
            Some(400.0)
        );
    }

    #[test]
    fn jean_zay_runs_before_the_pcie_fix() {
        let prequel = "bigscience-workshop/bigscience train/tr11-176B-ml/chronicles-prequel.md";
        let dated = |d: &str| format!("Date {d} (2022). Snapshot of iteration 2 only");
        assert!(before_jean_zay_pcie_fix(prequel, &dated("02-20")));
        assert!(before_jean_zay_pcie_fix(prequel, &dated("02-24")));
        // the fix is dated 02-25: that day's runs and later ones ran on the fixed nodes
        assert!(!before_jean_zay_pcie_fix(prequel, &dated("02-25")));
        assert!(!before_jean_zay_pcie_fix(prequel, &dated("02-28")));
        assert!(!before_jean_zay_pcie_fix(prequel, &dated("03-01")));
        // another source, or no date, is not one of those runs
        assert!(!before_jean_zay_pcie_fix(
            "NVIDIA/NeMo docs",
            &dated("02-20")
        ));
        assert!(!before_jean_zay_pcie_fix(
            prequel,
            "Snapshot of iteration 2"
        ));
        assert!(!before_jean_zay_pcie_fix(prequel, "Date 2-20 (2022)"));
    }
}
