//! Red Lite tokenizer: byte-level BPE with the Qwen2 pre-tokenizer, read
//! from GGUF metadata, plus chat-template rendering.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = redlite_gguf::GgufFile::open("model.gguf")?;
//! let tok = redlite_tokenizer::Tokenizer::from_gguf(file.metadata())?;
//! let ids = tok.encode("Hello world", true);
//! assert_eq!(tok.decode(&ids), "Hello world");
//! # Ok(()) }
//! ```

mod bpe;
mod bytelevel;
mod chat;
mod error;
mod pretok;
mod stream;
mod tokenizer;

pub use chat::{
    ChatMessage, ChatTemplate, FunctionCall, ToolCall, ToolCallFormat, DEFAULT_FUEL,
    DEFAULT_MAX_OUTPUT,
};
pub use error::TokenizerError;
pub use stream::StreamDecoder;
pub use tokenizer::{keys, TokenType, Tokenizer};
