use redlite_gguf::{GgmlType, GgufError};

/// Errors of loading and running a model. Each names what it is about.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Cpu(#[from] redlite_cpu::CpuError),
    #[error("architecture `{0}` is not supported (supported: qwen3next, qwen2)")]
    UnsupportedArch(String),
    #[error("metadata `{key}`: {what}")]
    Metadata { key: String, what: String },
    #[error("tensor `{name}` is missing (expected dims {expected:?})")]
    MissingTensor { name: String, expected: Vec<u64> },
    #[error("tensor `{name}`: expected dims {expected:?}, found {found:?}")]
    TensorShape {
        name: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },
    #[error("tensor `{name}`: type {ty} {what}")]
    TensorType {
        name: String,
        ty: GgmlType,
        what: String,
    },
    #[error(
        "tensor `{name}` has a non-finite value ({value}) at element {index}: the file is corrupt"
    )]
    NonFinite {
        name: String,
        index: usize,
        value: f32,
    },
    #[error("`tokenizer.ggml.tokens` has {tokens} tokens but `token_embd.weight` has only {rows} rows: tokens past the last row could not be embedded")]
    VocabMismatch { tokens: usize, rows: usize },
    #[error("layer {layer}: {what}")]
    Layer { layer: usize, what: String },
    #[error(
        "context overflow: {pos} positions used + {n_tokens} new tokens > context length {ctx_len}"
    )]
    ContextOverflow {
        pos: usize,
        n_tokens: usize,
        ctx_len: usize,
    },
    #[error("token id {token} is outside the vocabulary of {n_vocab}")]
    BadToken { token: u32, n_vocab: usize },
    #[error("empty token list")]
    NoTokens,
    #[error(transparent)]
    Experts(#[from] redlite_expertcache::CacheError),
    #[error("memory plan: {0}")]
    Plan(#[from] redlite_expertcache::PlanError),
    #[error("an expert cache reads the model file, but this model was not opened from a file")]
    NoFilePath,
    #[error("rolling back a verify pass: {0}")]
    Rollback(String),
    #[error("{backend} backend: {what}")]
    Backend { backend: &'static str, what: String },
}
