//! Errors of this crate.

use thiserror::Error;

/// Errors from building a tokenizer or rendering a chat template.
#[derive(Debug, Error)]
pub enum TokenizerError {
    /// A required metadata key is absent.
    #[error("GGUF metadata key `{key}` is missing")]
    MissingKey { key: &'static str },

    /// A metadata key has the wrong type.
    #[error("GGUF metadata key `{key}` has type {found}, expected {expected}")]
    WrongType {
        key: &'static str,
        expected: &'static str,
        found: String,
    },

    /// A metadata value is not supported (e.g. an unknown tokenizer model).
    #[error("GGUF metadata key `{key}`: unsupported value {value:?} ({why})")]
    Unsupported {
        key: &'static str,
        value: String,
        why: &'static str,
    },

    /// A metadata value is malformed (bad id, length mismatch, ...).
    #[error("GGUF metadata key `{key}`: {why}")]
    Invalid { key: &'static str, why: String },

    /// The chat template failed to compile or render.
    #[error("chat template: {0}")]
    Template(String),
}

impl From<minijinja::Error> for TokenizerError {
    fn from(e: minijinja::Error) -> Self {
        // Include the chain of causes: minijinja puts details there.
        let mut msg = e.to_string();
        let mut src = std::error::Error::source(&e);
        while let Some(s) = src {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            src = s.source();
        }
        TokenizerError::Template(msg)
    }
}
