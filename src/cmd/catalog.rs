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
pub fn models(model: Option<&str>, json: bool) -> Result<()> {
    let rows: Vec<(String, String, autopp_models::Model)> = match model {
        Some(name) => {
            let m = autopp_models::load(name)?;
            let description = autopp_models::presets::preset(name)
                .map(|p| p.description.to_string())
                .unwrap_or_else(|| format!("from {name}"));
            vec![(m.name().to_string(), description, m)]
        }
        None => autopp_models::presets::presets()
            .iter()
            .map(|p| Ok((p.name.to_string(), p.description.to_string(), p.load()?)))
            .collect::<Result<_>>()?,
    };
    if json {
        let list: Vec<serde_json::Value> = rows
            .iter()
            .map(|(name, description, m)| {
                serde_json::json!({
                    "name": name,
                    "description": description,
                    "num_params": m.num_params(),
                    "parameters": m.num_params(),
                    "active_parameters": m.active_params(),
                    "seq_length": m.seq_length(),
                    "global_batch_size": m.default_global_batch(),
                    "model": m,
                })
            })
            .collect();
        let out = match (model, list.as_slice()) {
            (Some(_), [one]) => serde_json::to_string_pretty(one)?,
            _ => serde_json::to_string_pretty(&list)?,
        };
        println!("{out}");
        return Ok(());
    }
    println!(
        "{:<16} {:>8} {:>8} {:>7} {:>7} {:>6} {:>8} {:>6} {:>7}  description",
        "preset", "params", "active", "layers", "hidden", "heads", "vocab", "seq", "batch"
    );
    for (name, description, m) in rows {
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
        println!(
            "{:<16} {:>8} {:>8} {:>7} {:>7} {:>6} {:>8} {:>6} {:>7}  {}",
            name,
            billions(m.num_params()),
            billions(m.active_params()),
            layers,
            hidden,
            heads,
            vocab,
            m.seq_length(),
            m.default_global_batch()
                .map(|b| b.to_string())
                .unwrap_or_else(|| "—".into()),
            description
        );
    }
    Ok(())
}

/// A parameter count in billions (or millions below one billion), one decimal.
fn billions(params: u64) -> String {
    let params = params as f64;
    if params >= 1e9 {
        format!("{:.1} B", params / 1e9)
    } else {
        format!("{:.1} M", params / 1e6)
    }
}
