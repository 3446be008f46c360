//! Hugging Face `config.json` loading (placeholder).
