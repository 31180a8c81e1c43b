//! Bounds on hyper-parameters, checked at load before anything is sized
//! from them.
//!
//! GGUF files come from strangers. A layer count of 10⁹ sized a `Vec` of
//! 680 GB; a key length near 2⁶³ made `head_dim × n_head` wrap so that every
//! shape check passed. The caps below are generous (several times the
//! largest released models: Qwen3-Next-80B has 48 layers, 2048 wide, heads
//! of 256, 512 experts, a 151 936-token vocabulary, 262 144 trained
//! positions) and exist so that every product of them fits `usize` with
//! room to spare; the tensor-shape checks then tie them to bytes that are
//! actually in the file.

use crate::ModelError;
use redlite_gguf::GgufFile;

/// Most layers (also bounded by the tensors present, see [`check_layers`]).
pub const MAX_LAYERS: usize = 4096;
/// Widest hidden state, inner size or feed-forward width.
pub const MAX_WIDTH: usize = 1 << 20;
/// Most attention or recurrent heads.
pub const MAX_HEADS: usize = 4096;
/// Widest head (key, value or state dimension).
pub const MAX_HEAD_DIM: usize = 1 << 14;
/// Most routed experts per layer.
pub const MAX_EXPERTS: usize = 1 << 16;
/// Largest vocabulary.
pub const MAX_VOCAB: usize = 1 << 24;
/// Longest trained context.
pub const MAX_CONTEXT: usize = u32::MAX as usize;
/// Longest causal convolution.
pub const MAX_CONV_KERNEL: usize = 1024;
/// The fixed per-session state (recurrent layers) a file may ask for
/// beyond [`STATE_PER_FILE_BYTE`] times its own size.
pub const STATE_FLOOR: u64 = 64 << 20;
/// See [`STATE_FLOOR`]: real models need well under one byte of recurrent
/// state per byte of weights (Qwen3-Next-80B: 36 × 2.3 MiB for 40 GiB).
pub const STATE_PER_FILE_BYTE: u64 = 4;

/// A metadata value checked against `lo..=hi`; `key` is the full key.
pub fn in_range(key: &str, v: usize, lo: usize, hi: usize) -> Result<usize, ModelError> {
    if v < lo || v > hi {
        return Err(ModelError::Metadata {
            key: key.to_string(),
            what: format!("{v} is outside the supported range {lo}..={hi}"),
        });
    }
    Ok(v)
}

/// `a × b × ...` with overflow and `hi` as errors naming what is multiplied.
pub fn product(what: &str, factors: &[usize], hi: usize) -> Result<usize, ModelError> {
    let p = factors
        .iter()
        .try_fold(1usize, |acc, &f| acc.checked_mul(f))
        .filter(|&p| p <= hi);
    p.ok_or_else(|| ModelError::Metadata {
        key: what.to_string(),
        what: format!("the product {factors:?} exceeds {hi}"),
    })
}

/// The layer count against the tensors present: every layer has at least
/// two tensors (its norms), so more layers than tensors cannot load, and
/// saying so here costs nothing while sizing per-layer tables would.
pub fn check_layers(file: &GgufFile, key: &str, n_layer: usize) -> Result<(), ModelError> {
    let n_tensors = file.tensors().len();
    if n_layer > n_tensors {
        return Err(ModelError::Metadata {
            key: key.to_string(),
            what: format!("{n_layer} layers, but the file has only {n_tensors} tensors"),
        });
    }
    Ok(())
}

/// A float hyper-parameter that must be finite and positive.
pub fn positive(key: &str, v: f32) -> Result<f32, ModelError> {
    if !(v.is_finite() && v > 0.0) {
        return Err(ModelError::Metadata {
            key: key.to_string(),
            what: format!("{v} must be a finite number above 0"),
        });
    }
    Ok(v)
}

/// The fixed state one session holds, against the file's size.
pub fn check_state(file: &GgufFile, what: &str, bytes: Option<u64>) -> Result<u64, ModelError> {
    let cap = STATE_FLOOR.saturating_add(file.file_size().saturating_mul(STATE_PER_FILE_BYTE));
    match bytes {
        Some(b) if b <= cap => Ok(b),
        _ => Err(ModelError::Metadata {
            key: what.to_string(),
            what: format!(
                "the recurrent state of one session ({}) is more than {cap} bytes, {STATE_PER_FILE_BYTE}× a file of {} bytes plus {STATE_FLOOR}",
                bytes.map_or("more than 2^64 bytes".to_string(), |b| format!("{b} bytes")),
                file.file_size()
            ),
        }),
    }
}
