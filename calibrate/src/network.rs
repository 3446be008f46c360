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
}
