//! `autopp gpus` and `autopp models`: what the catalogs hold.

use anyhow::Result;
use autopp_hardware::hardware;

/// Prints the GPU catalog.
pub fn gpus(json: bool) -> Result<()> {
    let all = hardware::catalog();
    if json {
        println!("{}", serde_json::to_string_pretty(&all)?);
        return Ok(());
    }
    print!("{}", hardware::catalog_table());
    Ok(())
}

/// Prints the bundled model presets with their key figures.
pub fn models(json: bool) -> Result<()> {
    let presets = autopp_models::presets::presets();
    let mut rows = Vec::with_capacity(presets.len());
    for p in presets {
        let model = p.load()?;
        rows.push((p, model));
    }
    if json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(p, m)| {
                serde_json::json!({
                    "name": p.name,
                    "description": p.description,
                    "num_params": m.num_params(),
                    "seq_length": m.seq_length(),
                    "global_batch_size": m.default_global_batch(),
                    "model": m,
                })
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&list)?);
        return Ok(());
    }
    println!(
        "{:<12} {:>8} {:>7} {:>7} {:>6} {:>8} {:>6} {:>7}  description",
        "preset", "params", "layers", "hidden", "heads", "vocab", "seq", "batch"
    );
    for (p, m) in rows {
        let (layers, hidden, heads, vocab) = match &m {
            autopp_models::Model::Transformer(t) => (
                t.num_layers.to_string(),
                t.hidden_size.to_string(),
                format!("{}/{}", t.num_attention_heads, t.kv_heads()),
                t.vocab_size.to_string(),
            ),
            autopp_models::Model::Layers(l) => (
                l.layers.len().to_string(),
                "—".into(),
                "—".into(),
                "—".into(),
            ),
        };
        let params = m.num_params() as f64;
        let params = if params >= 1e9 {
            format!("{:.1} B", params / 1e9)
        } else {
            format!("{:.1} M", params / 1e6)
        };
        println!(
            "{:<12} {:>8} {:>7} {:>7} {:>6} {:>8} {:>6} {:>7}  {}",
            p.name,
            params,
            layers,
            hidden,
            heads,
            vocab,
            m.seq_length(),
            m.default_global_batch()
                .map(|b| b.to_string())
                .unwrap_or_else(|| "—".into()),
            p.description
        );
    }
    Ok(())
}
