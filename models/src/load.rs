//! Loading a model by preset name or path.
//!
//! [`load`] tries a bundled preset first (case-sensitive), then a file. The file's format is
//! told from its JSON:
//!
//! 1. a `layers` key: an explicit layer list ([`LayerListSpec`]);
//! 2. a Hugging Face marker (`model_type`, `architectures`, `num_hidden_layers`, `n_layer`,
//!    `n_embd`, `n_head`; see [`hf`]): a Hugging Face `config.json`;
//! 3. anything else: autopp's `model.json` ([`TransformerSpec`]), whose errors then name the
//!    missing or unknown keys.

use std::path::Path;

use serde_json::Value;

use crate::json::{from_value, parse_object};
use crate::presets::{preset, preset_names};
use crate::{hf, LayerListSpec, Model, ModelError, TransformerSpec};

/// The format of a model file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelFormat {
    /// autopp's `model.json` (a transformer's shape).
    ModelJson,
    /// An explicit layer list.
    LayerList,
    /// A Hugging Face `config.json`.
    HuggingFace,
}

/// Loads a model: a preset name (see [`presets`](crate::presets::presets)), a path to a
/// `model.json`, a Hugging Face `config.json` or a layer list, or a directory holding a
/// `config.json` (a Hugging Face checkpoint).
pub fn load(name_or_path: &str) -> Result<Model, ModelError> {
    if let Some(p) = preset(name_or_path) {
        return p.load();
    }
    let path = Path::new(name_or_path);
    if path.is_file() {
        return load_file(name_or_path);
    }
    // a Hugging Face checkpoint directory
    let config = path.join("config.json");
    if path.is_dir() && config.is_file() {
        return load_file(&config.to_string_lossy());
    }
    Err(ModelError::UnknownModel {
        name: name_or_path.to_string(),
        available: preset_names(),
    })
}

/// Loads a model file of any supported format.
pub fn load_file(path: &str) -> Result<Model, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_string(),
        source,
    })?;
    load_str(&text, path)
}

/// Tells the format of a parsed JSON object (see the module documentation).
pub fn detect_format(object: &serde_json::Map<String, Value>) -> ModelFormat {
    if object.contains_key("layers") {
        ModelFormat::LayerList
    } else if hf::is_hf_config(object) {
        ModelFormat::HuggingFace
    } else {
        ModelFormat::ModelJson
    }
}

/// Parses model JSON of any supported format and validates it; `origin` (a path or a preset
/// name) names it in errors and, for a Hugging Face config without `_name_or_path`, gives the
/// model its name.
pub fn load_str(text: &str, origin: &str) -> Result<Model, ModelError> {
    let object = parse_object(text, origin)?;
    match detect_format(&object) {
        ModelFormat::LayerList => {
            let spec: LayerListSpec = from_value(&Value::Object(object))?;
            spec.validate()?;
            Ok(Model::Layers(spec))
        }
        ModelFormat::HuggingFace => {
            let name = object
                .get("_name_or_path")
                .and_then(Value::as_str)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| name_from_origin(origin));
            Ok(Model::Transformer(hf::spec_from_config(&object, &name)?))
        }
        ModelFormat::ModelJson => {
            let spec: TransformerSpec = from_value(&Value::Object(object))?;
            spec.validate()?;
            Ok(Model::Transformer(spec))
        }
    }
}

/// A model name from a file path: the directory's name for `…/<model>/config.json`, else the
/// file stem.
fn name_from_origin(origin: &str) -> String {
    let path = Path::new(origin);
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    let dir = path
        .parent()
        .and_then(Path::file_name)
        .and_then(|s| s.to_str());
    match (stem, dir) {
        ("config", Some(dir)) if !dir.is_empty() => dir.to_string(),
        ("", _) => String::from("model"),
        (stem, _) => stem.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::name_from_origin;

    #[test]
    fn names_from_paths() {
        assert_eq!(
            name_from_origin("/m/Llama-2-7b-hf/config.json"),
            "Llama-2-7b-hf"
        );
        assert_eq!(name_from_origin("config.json"), "config");
        assert_eq!(name_from_origin("fixtures/gpt2.json"), "gpt2");
        assert_eq!(name_from_origin(""), "model");
    }
}
