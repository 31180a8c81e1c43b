use redlite_gguf::GgmlType;

/// Errors of the block-format layer. Every variant names the type involved.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantError {
    #[error("tensor type {0} is not supported by this build")]
    Unsupported(GgmlType),
    #[error("tensor type {ty}: {what}")]
    Shape { ty: GgmlType, what: String },
    #[error("tensor type {0} cannot be quantized by this build")]
    NoQuantizer(GgmlType),
}
