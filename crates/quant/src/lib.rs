//! llama.cpp block formats.

pub use redlite_gguf::GgmlType;
