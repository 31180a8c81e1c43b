//! GGUF: the file format of llama.cpp models.

pub mod types;

pub use types::GgmlType;
