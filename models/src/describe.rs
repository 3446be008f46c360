//! Models described as `autopp models` prints them: a table row per model (parameters, active
//! parameters, shape, sequence length, batch) or one JSON object each.

use serde_json::{json, Value};

use crate::{presets, Model, ModelError};

/// A model with the name and description it is listed under.
#[derive(Debug, Clone)]
pub struct Described {
    /// The preset name, or the model's own name for a file.
    pub name: String,
    /// The preset's description, or where the model came from.
    pub description: String,
    /// The model.
    pub model: Model,
}

impl Described {
    /// Every bundled preset, in catalog order.
    pub fn presets() -> Result<Vec<Described>, ModelError> {
        presets::presets()
            .iter()
            .map(|p| {
                Ok(Described {
                    name: p.name.to_string(),
                    description: p.description.to_string(),
                    model: p.load()?,
                })
            })
            .collect()
    }

    /// The preset or model file `name_or_path`.
    pub fn one(name_or_path: &str) -> Result<Described, ModelError> {
        let model = crate::load(name_or_path)?;
        let description = presets::preset(name_or_path)
            .map(|p| p.description.to_string())
            .unwrap_or_else(|| format!("from {name_or_path}"));
        Ok(Described {
            name: model.name().to_string(),
            description,
            model,
        })
    }

    /// The JSON object of `autopp models --json`: name, description, `parameters` and
    /// `active_parameters` (`num_params` too, its older name), sequence length, batch, the model.
    pub fn to_json(&self) -> Value {
        let m = &self.model;
        json!({
            "name": self.name,
            "description": self.description,
            "num_params": m.num_params(),
            "parameters": m.num_params(),
            "active_parameters": m.active_params(),
            "seq_length": m.seq_length(),
            "global_batch_size": m.default_global_batch(),
            "model": m,
        })
    }
}

/// The table of `autopp models`: one row per model.
pub fn table(rows: &[Described]) -> String {
    let mut o = format!(
        "{:<16} {:>8} {:>8} {:>7} {:>7} {:>6} {:>8} {:>6} {:>7}  description\n",
        "preset", "params", "active", "layers", "hidden", "heads", "vocab", "seq", "batch"
    );
    for Described {
        name,
        description,
        model: m,
    } in rows
    {
        let (layers, hidden, heads, vocab) = match m {
            Model::Transformer(t) => (
                t.num_layers.to_string(),
                t.hidden_size.to_string(),
                format!("{}/{}", t.num_attention_heads, t.kv_heads()),
                t.vocab_size.to_string(),
            ),
            Model::Layers(l) => (
                l.layers.len().to_string(),
                "—".into(),
                "—".into(),
                "—".into(),
            ),
        };
        o += &format!(
            "{:<16} {:>8} {:>8} {:>7} {:>7} {:>6} {:>8} {:>6} {:>7}  {}\n",
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
    o
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
