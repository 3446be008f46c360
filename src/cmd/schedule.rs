//! `autopp schedule` (placeholder).
