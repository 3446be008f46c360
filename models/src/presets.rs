//! Bundled presets (placeholder).
