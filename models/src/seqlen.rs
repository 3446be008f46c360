//! Where a model's sequence length comes from (`--seq-len`, the preset, a model file's key, a
//! plan file, or autopp's default), for the reports to say next to the length.

use serde_json::{Map, Value};

use crate::defaults::MAX_DEFAULT_SEQ_LENGTH;
use crate::load::{detect_format, ModelFormat};
use crate::presets::preset;
use crate::{Defaulted, Model, ModelError};

/// Where a sequence length comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeqLenSource {
    /// The `--seq-len` flag.
    Flag,
    /// The preset's `seq_length`.
    Preset,
    /// A model file's key: `seq_length` (autopp's `model.json`, a layer list, or a Hugging Face
    /// config that has one), or a Hugging Face config's
    /// `rope_scaling.original_max_position_embeddings`, `max_position_embeddings`,
    /// `n_positions` or `n_ctx` (see [`hf`](crate::hf)).
    ModelFile {
        /// The key the length was read from.
        field: &'static str,
    },
    /// The model a plan file holds (`estimate --plan`).
    PlanFile,
    /// autopp's default: the model's own length of `capped_from` tokens capped at
    /// [`MAX_DEFAULT_SEQ_LENGTH`], or, with `None`, the family's length for a config that records
    /// none (BLOOM's 2,048).
    Default {
        /// The model's own length, tokens, when it was capped.
        capped_from: Option<u64>,
    },
}

impl SeqLenSource {
    /// The source as one word for JSON: `flag`, `preset`, `model_file`, `plan_file`, `default`.
    pub fn key(&self) -> &'static str {
        match self {
            SeqLenSource::Flag => "flag",
            SeqLenSource::Preset => "preset",
            SeqLenSource::ModelFile { .. } => "model_file",
            SeqLenSource::PlanFile => "plan_file",
            SeqLenSource::Default { .. } => "default",
        }
    }

    /// The model file's key the length was read from, for [`SeqLenSource::ModelFile`].
    pub fn field(&self) -> Option<&'static str> {
        match self {
            SeqLenSource::ModelFile { field } => Some(field),
            _ => None,
        }
    }

    /// The source in words, for the batching line: `--seq-len`, `the preset`, `the model file's
    /// max_position_embeddings`, `the plan file`, `the default cap of 8,192, not the model's
    /// 131,072`, `the family's default`.
    pub fn describe(&self) -> String {
        use crate::units::thousands;
        match self {
            SeqLenSource::Flag => "--seq-len".into(),
            SeqLenSource::Preset => "the preset".into(),
            SeqLenSource::ModelFile { field } => format!("the model file's {field}"),
            SeqLenSource::PlanFile => "the plan file".into(),
            SeqLenSource::Default {
                capped_from: Some(own),
            } => format!(
                "the default cap of {}, not the model's {}",
                thousands(MAX_DEFAULT_SEQ_LENGTH as f64),
                thousands(*own as f64)
            ),
            SeqLenSource::Default { capped_from: None } => "the family's default".into(),
        }
    }
}

/// Loads a model by preset name or path ([`load`](fn@crate::load)), with where its own sequence
/// length comes from.
pub fn load_with_source(name_or_path: &str) -> Result<(Model, SeqLenSource), ModelError> {
    let model = crate::load(name_or_path)?;
    let own = match preset(name_or_path) {
        Some(_) => SeqLenSource::Preset,
        None => file_source(name_or_path, model.seq_length()),
    };
    Ok((model, own))
}

impl SeqLenSource {
    /// Where the length of a model whose own length comes from `self` comes from once
    /// [`Model::at_seq_length`] was asked for `asked` tokens and reported `defaulted`.
    pub fn at(self, asked: Option<u64>, defaulted: &Defaulted) -> SeqLenSource {
        match (asked, defaulted.seq_length_capped_from) {
            (Some(_), _) => SeqLenSource::Flag,
            (None, Some(own)) => SeqLenSource::Default {
                capped_from: Some(own),
            },
            (None, None) => self,
        }
    }
}

/// The key of the model file at `path` (or of a checkpoint directory's `config.json`) that
/// holds `seq_length`. A file that was just loaded parses again.
fn file_source(path: &str, seq_length: u64) -> SeqLenSource {
    let p = std::path::Path::new(path);
    let file = match p.is_dir() {
        true => p.join("config.json"),
        false => p.to_path_buf(),
    };
    let object = std::fs::read_to_string(file)
        .ok()
        .and_then(|t| serde_json::from_str::<Map<String, Value>>(&t).ok());
    match object {
        Some(o) if detect_format(&o) == ModelFormat::HuggingFace => hf_field(&o, seq_length),
        _ => SeqLenSource::ModelFile {
            field: "seq_length",
        },
    }
}

/// The first key of a Hugging Face config, in the order the loader reads them (the
/// [`hf`](crate::hf) module's rule), whose value is `seq_length`; none: the family's default.
pub fn hf_field(config: &Map<String, Value>, seq_length: u64) -> SeqLenSource {
    let rope = config
        .get("rope_scaling")
        .and_then(|r| r.get("original_max_position_embeddings"));
    let keys = [
        ("seq_length", config.get("seq_length")),
        ("rope_scaling.original_max_position_embeddings", rope),
        (
            "max_position_embeddings",
            config.get("max_position_embeddings"),
        ),
        ("n_positions", config.get("n_positions")),
        ("n_ctx", config.get("n_ctx")),
    ];
    keys.into_iter()
        .find(|(_, v)| v.and_then(Value::as_u64) == Some(seq_length))
        .map_or(SeqLenSource::Default { capped_from: None }, |(field, _)| {
            SeqLenSource::ModelFile { field }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(text: &str) -> Map<String, Value> {
        serde_json::from_str(text).expect("test JSON")
    }

    #[test]
    fn hf_keys_in_the_loaders_order() {
        // Llama 3.1: max_position_embeddings 131072, pre-trained at rope_scaling's 8192
        let llama31 = object(
            r#"{"max_position_embeddings": 131072, "rope_scaling": {"original_max_position_embeddings": 8192}}"#,
        );
        assert_eq!(
            hf_field(&llama31, 8192).field(),
            Some("rope_scaling.original_max_position_embeddings")
        );
        let plain = object(r#"{"max_position_embeddings": 4096}"#);
        assert_eq!(
            hf_field(&plain, 4096).field(),
            Some("max_position_embeddings")
        );
        let gpt2 = object(r#"{"n_positions": 1024, "n_ctx": 1024}"#);
        assert_eq!(hf_field(&gpt2, 1024).field(), Some("n_positions"));
        // BLOOM records no length: the family's 2,048
        let bloom = object(r#"{"n_layer": 70}"#);
        assert_eq!(
            hf_field(&bloom, 2048),
            SeqLenSource::Default { capped_from: None }
        );
    }

    #[test]
    fn presets_flags_and_caps() {
        let (m, own) = load_with_source("llama3-70b").expect("preset");
        assert_eq!((m.seq_length(), own), (8192, SeqLenSource::Preset));
        let (m, d) = m.at_seq_length(Some(4096)).expect("4096 tokens");
        let s = own.at(Some(4096), &d);
        assert_eq!((m.seq_length(), s), (4096, SeqLenSource::Flag));
        assert_eq!(s.describe(), "--seq-len");
        assert_eq!(own.at(None, &Defaulted::default()), SeqLenSource::Preset);
        let d = Defaulted {
            seq_length_capped_from: Some(131_072),
            global_batch: None,
        };
        let capped = own.at(None, &d);
        assert_eq!(
            capped,
            SeqLenSource::Default {
                capped_from: Some(131_072)
            }
        );
        assert_eq!(
            capped.describe(),
            "the default cap of 8,192, not the model's 131,072"
        );
        assert_eq!((capped.key(), capped.field()), ("default", None));
    }
}
