//! Loading a model by preset name or path (placeholder).
use crate::{Model, ModelError, TransformerSpec};

/// Loads a model: a preset name or a path to a `model.json`, a Hugging Face `config.json` or a
/// layer list.
pub fn load(name_or_path: &str) -> Result<Model, ModelError> {
    load_file(name_or_path)
}

/// Loads a model file.
pub fn load_file(path: &str) -> Result<Model, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
        path: path.to_string(),
        source,
    })?;
    load_str(&text, path)
}

/// Parses model JSON of any supported format; `origin` names it in errors.
pub fn load_str(text: &str, origin: &str) -> Result<Model, ModelError> {
    let spec: TransformerSpec = serde_json::from_str(text).map_err(|e| ModelError::Json {
        origin: origin.to_string(),
        message: e.to_string(),
    })?;
    spec.validate()?;
    Ok(Model::Transformer(spec))
}
