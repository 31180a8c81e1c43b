//! State files: one sequence's state, saved so a later run (or a restarted
//! server) continues exactly where this one stopped.
//!
//! A state file holds the tokens the state covers, every layer's state (K
//! and V rows of the filled positions, DeltaNet conv and recurrent state),
//! the sampler's RNG state and the logits of the last position. It is tied
//! to one model (architecture and a hash of the tensor table), one KV
//! element type and a format version, and ends in a CRC-32 of everything
//! before it; a file that differs in any of these, or is truncated or
//! corrupted, is refused with an error naming the file and the difference.
//! Files are written through [`redlite_outfile::Output`]: a temporary
//! beside the target, synced, renamed into place, the directory synced.
//!
//! The layout (all integers little-endian) is in `docs/state-files.md`.

mod format;
mod id;
mod mtp;

pub use format::{read, read_tokens, write, Expect, SaveStats};
pub use id::{fnv1a64, ModelId};
pub use mtp::{read_mtp, write_mtp, MtpExpect, MtpImage, MTP_MAGIC, MTP_VERSION};

use redlite_model::StateImage;
use std::path::PathBuf;

/// The first bytes of every state file.
pub const MAGIC: [u8; 8] = *b"RLSTATE\0";
/// The format version this build reads and writes.
pub const VERSION: u32 = 1;

/// A sequence state with what a front end needs to continue from it.
#[derive(Clone, Debug, PartialEq)]
pub struct StateFile<'a> {
    /// The model it was made with.
    pub model: ModelId,
    /// The sequence's context size when saved (informational: a state
    /// loads into any context that holds its positions).
    pub ctx_len: u64,
    /// The tokens the state covers (`image.pos` of them).
    pub tokens: Vec<u32>,
    /// The sampler's RNG state after the last sampled token (None: none
    /// was sampled, e.g. a prompt-only save).
    pub rng: Option<u64>,
    /// The last position's logits (`n_vocab`), to sample the next token
    /// without running the last token again; empty when `pos` is 0.
    pub logits: Vec<f32>,
    /// Every layer's state, with its KV element type.
    pub kv_elem: redlite_model::KvElem,
    pub image: StateImage<'a>,
}

/// Errors of reading or writing a state file; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Output(#[from] redlite_outfile::OutfileError),
    #[error("state file {}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("state file {}: not a Red Lite state file (the first bytes are {found:02x?}, expected \"RLSTATE\\0\")", path.display())]
    Magic { path: PathBuf, found: Vec<u8> },
    #[error("state file {}: format version {found}, this build reads version {VERSION}", path.display())]
    Version { path: PathBuf, found: u32 },
    #[error("state file {}: made with another model: {what}", path.display())]
    OtherModel { path: PathBuf, what: String },
    #[error("state file {}: KV rows are {found}, this backend keeps {expected} (a state is tied to its KV element type)", path.display())]
    KvType {
        path: PathBuf,
        found: &'static str,
        expected: &'static str,
    },
    #[error("state file {}: truncated: {what}", path.display())]
    Truncated { path: PathBuf, what: String },
    #[error("state file {}: checksum mismatch (stored {stored:08x}, computed {computed:08x}): the file is corrupted", path.display())]
    Checksum {
        path: PathBuf,
        stored: u32,
        computed: u32,
    },
    #[error("state file {}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
}
