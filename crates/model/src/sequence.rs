//! The backend-neutral sequence: what every front end (generate, bench,
//! parity, the server) runs a model through, whichever backend holds the
//! state.
//!
//! A backend opens a [`Sequence`] with its own options; the front end then
//! only prefills, decodes, reads the position and takes or restores
//! [`Checkpoint`]s of the whole state (KV rows and DeltaNet conv and
//! recurrent state). The CPU implementation is [`CpuSequence`]; the CUDA
//! decoder implements the same trait in its own crate.

use crate::image::{KvElem, StateImage};
use crate::session::{Logits, Session};
use crate::trace::TraceRecord;
use crate::{Model, ModelError};
use std::any::Any;
use std::sync::Arc;

/// A snapshot of a sequence's whole state, held where the backend keeps
/// its state (host memory for the CPU, device memory for a GPU). Only the
/// backend that made it can restore it.
pub struct Checkpoint {
    pos: usize,
    bytes: u64,
    backend: &'static str,
    state: Box<dyn Any>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("pos", &self.pos)
            .field("bytes", &self.bytes)
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

impl Checkpoint {
    /// A checkpoint of `backend` at `pos` holding `bytes` of state.
    pub fn new(backend: &'static str, pos: usize, bytes: u64, state: Box<dyn Any>) -> Checkpoint {
        Checkpoint {
            pos,
            bytes,
            backend,
            state,
        }
    }

    /// The position the sequence had (tokens it holds).
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes of state held (for the memory accounting of a prompt cache).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The backend's state, when this checkpoint is `backend`'s.
    pub fn state<T: 'static>(&self, backend: &'static str) -> Result<&T, ModelError> {
        if self.backend != backend {
            return Err(ModelError::Backend {
                backend,
                what: format!("a checkpoint made by the {} backend", self.backend),
            });
        }
        self.state
            .downcast_ref::<T>()
            .ok_or_else(|| ModelError::Backend {
                backend,
                what: "a checkpoint of another sequence type".into(),
            })
    }
}

/// A bounded expert cache's counters (summed over layers), whichever
/// backend keeps the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    pub hits: u64,
    pub misses: u64,
    /// Experts brought in ahead of use (pre-gating), and of those used.
    pub prefetched: u64,
    pub prefetch_used: u64,
    /// Bytes copied into the cache (file reads or PCIe copies).
    pub bytes_moved: u64,
}

/// Where one decode token's time goes on a backend that can say.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TokenProfile {
    /// (kernel class, µs per token, kernels per token).
    pub rows: Vec<(&'static str, f64, usize)>,
    /// µs per token with the timing events, and without.
    pub total_us: f64,
    pub plain_us: f64,
}

/// One sequence on some backend.
pub trait Sequence {
    /// Run `tokens` at the current position and return the wanted logits
    /// (`n_vocab` values for [`Logits::Last`], one row per token for
    /// [`Logits::All`]).
    fn prefill(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, ModelError>;

    /// Run one token and return its logits.
    fn decode(&mut self, token: u32) -> Result<Vec<f32>, ModelError> {
        self.prefill(&[token], Logits::Last)
    }

    /// Run draft tokens from the current position as one verify pass and
    /// return every position's logits (`tokens.len() × n_vocab`), each the
    /// value decoding the tokens one by one would give. Afterwards
    /// [`accept`](Sequence::accept) keeps a prefix of them; anything else
    /// run on the sequence first keeps them all.
    fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let _ = tokens;
        Err(self.unsupported("verifying draft tokens"))
    }

    /// Keep the first `keep` tokens of the last verify pass and discard
    /// the rest (KV rows dropped, recurrent state rolled back to the last
    /// kept token without recomputing the kept ones).
    fn accept(&mut self, keep: usize) -> Result<(), ModelError> {
        let _ = keep;
        Err(self.unsupported("rolling back draft tokens"))
    }

    /// Keep every token's final-normed hidden row of each forward from now
    /// on (what a multi-token-prediction head reads).
    fn keep_hidden(&mut self, on: bool) -> Result<(), ModelError> {
        let _ = on;
        Err(self.unsupported("keeping hidden rows (MTP drafts)"))
    }

    /// The last forward's (or verify pass's) hidden rows, `n × n_embd`.
    fn last_hidden(&self) -> Result<&[f32], ModelError> {
        Err(self.unsupported("keeping hidden rows (MTP drafts)"))
    }

    /// Positions used so far.
    fn pos(&self) -> usize;

    /// Positions this sequence can hold.
    fn ctx_len(&self) -> usize;

    /// Forget everything: position 0, empty caches, zero states.
    fn reset(&mut self) -> Result<(), ModelError>;

    /// A snapshot of the whole state at the current position.
    fn checkpoint(&mut self) -> Result<Checkpoint, ModelError>;

    /// Go back (or forward) to a snapshot this sequence's backend made.
    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ModelError>;

    /// The element type this backend keeps K and V rows in (what its
    /// state files hold).
    fn kv_elem(&self) -> KvElem {
        KvElem::F32
    }

    /// A checkpoint this backend made, in host memory in the shared layout
    /// (for a state file). A GPU copies its device buffers to the host.
    fn export_checkpoint<'a>(
        &self,
        checkpoint: &'a Checkpoint,
    ) -> Result<StateImage<'a>, ModelError> {
        let _ = checkpoint;
        Err(self.unsupported("saving a state file"))
    }

    /// A checkpoint of this sequence's backend from an image (read from a
    /// state file), to [`restore`](Sequence::restore). The image is checked
    /// against the model's layout first.
    fn import_checkpoint(&self, image: StateImage<'_>) -> Result<Checkpoint, ModelError> {
        let _ = image;
        Err(self.unsupported("loading a state file"))
    }

    /// Jump to `pos` without computing the tokens before it, for timing
    /// decode at a depth (the state is whatever it holds). Backends that
    /// cannot say so.
    fn skip_to(&mut self, pos: usize) -> Result<(), ModelError> {
        let _ = pos;
        Err(self.unsupported("jumping to a position without computing it"))
    }

    /// Record named intermediates from now on.
    fn enable_trace(&mut self) -> Result<(), ModelError> {
        Err(self.unsupported("named-intermediate traces"))
    }

    /// The records since the last call.
    fn take_trace(&mut self) -> Vec<TraceRecord> {
        Vec::new()
    }

    /// The experts the last token chose, per MoE layer in layer order
    /// (ascending ids; dense layers are left out).
    fn last_routes(&self) -> Result<Vec<Vec<u32>>, ModelError>;

    /// The bounded expert cache's counters since the backend was opened
    /// (None without one).
    fn cache_counters(&self) -> Result<Option<CacheCounters>, ModelError> {
        Ok(None)
    }

    /// Time `reps` decode steps of `token` per kernel class.
    /// Where a prompt's time goes (µs per prompt token by step class),
    /// prefilling `tokens` from the current position; for timing only: the
    /// state afterwards is not meaningful.
    fn profile_prefill(&mut self, tokens: &[u32]) -> Result<TokenProfile, ModelError> {
        let _ = tokens;
        Err(self.unsupported("a prefill profile"))
    }

    fn profile(&mut self, token: u32, reps: usize) -> Result<TokenProfile, ModelError> {
        let _ = (token, reps);
        Err(self.unsupported("a per-kernel profile"))
    }

    /// The backend's name, for messages.
    fn backend(&self) -> &'static str;

    /// An error for what this backend does not do.
    fn unsupported(&self, what: &str) -> ModelError {
        ModelError::Backend {
            backend: self.backend(),
            what: format!("{what} is not supported"),
        }
    }
}

/// The CPU backend's sequence: a [`Session`] with the model it runs.
#[derive(Debug)]
pub struct CpuSequence {
    model: Arc<Model>,
    session: Session,
}

/// The CPU backend's name in messages and checkpoints.
pub const CPU: &str = "cpu";

impl CpuSequence {
    /// A sequence of `ctx_len` positions (0: the trained context).
    pub fn new(model: Arc<Model>, ctx_len: usize) -> CpuSequence {
        let session = model.new_session(ctx_len);
        CpuSequence { model, session }
    }

    /// The session underneath (CPU-only tools: traces, routes with weights).
    pub fn session(&self) -> &Session {
        &self.session
    }
}

impl Sequence for CpuSequence {
    fn prefill(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, ModelError> {
        self.session.forward(&self.model, tokens, want)
    }

    fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.session.verify(&self.model, tokens)
    }

    fn keep_hidden(&mut self, on: bool) -> Result<(), ModelError> {
        self.session.set_keep_hidden(on);
        Ok(())
    }

    fn last_hidden(&self) -> Result<&[f32], ModelError> {
        Ok(self.session.last_hidden())
    }

    fn accept(&mut self, keep: usize) -> Result<(), ModelError> {
        self.session.keep(&self.model, keep)
    }

    fn pos(&self) -> usize {
        self.session.pos()
    }

    fn ctx_len(&self) -> usize {
        self.session.ctx_len()
    }

    fn reset(&mut self) -> Result<(), ModelError> {
        self.session.clear();
        Ok(())
    }

    fn checkpoint(&mut self) -> Result<Checkpoint, ModelError> {
        let (per_pos, fixed) = self.model.state_bytes();
        let pos = self.session.pos();
        Ok(Checkpoint::new(
            CPU,
            pos,
            per_pos * pos as u64 + fixed,
            Box::new(self.session.clone()),
        ))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ModelError> {
        let s: &Session = checkpoint.state(CPU)?;
        if s.ctx_len() != self.session.ctx_len() {
            return Err(ModelError::Backend {
                backend: CPU,
                what: format!(
                    "a checkpoint of a {}-position sequence restored into one of {}",
                    s.ctx_len(),
                    self.session.ctx_len()
                ),
            });
        }
        self.session.clone_from(s);
        Ok(())
    }

    fn export_checkpoint<'a>(
        &self,
        checkpoint: &'a Checkpoint,
    ) -> Result<StateImage<'a>, ModelError> {
        let s: &Session = checkpoint.state(CPU)?;
        Ok(crate::image::session_image(s))
    }

    fn import_checkpoint(&self, image: StateImage<'_>) -> Result<Checkpoint, ModelError> {
        let s = crate::image::session_from_image(&self.model, image, self.session.ctx_len())?;
        let (per_pos, fixed) = self.model.state_bytes();
        let pos = s.pos();
        Ok(Checkpoint::new(
            CPU,
            pos,
            per_pos * pos as u64 + fixed,
            Box::new(s),
        ))
    }

    fn enable_trace(&mut self) -> Result<(), ModelError> {
        self.session.enable_trace();
        Ok(())
    }

    fn take_trace(&mut self) -> Vec<TraceRecord> {
        self.session.trace.take()
    }

    fn last_routes(&self) -> Result<Vec<Vec<u32>>, ModelError> {
        Ok(self
            .session
            .last_routes()
            .iter()
            .filter(|layer| !layer.is_empty())
            .map(|layer| {
                let mut e: Vec<u32> = layer
                    .last()
                    .map_or(Vec::new(), |r| r.iter().map(|&(e, _)| e as u32).collect());
                e.sort_unstable();
                e
            })
            .collect())
    }

    fn cache_counters(&self) -> Result<Option<CacheCounters>, ModelError> {
        Ok(self.model.expert_cache().map(|c| {
            let s = c.stats();
            CacheCounters {
                hits: s.hits + s.prefetch_hits,
                misses: s.misses,
                prefetched: s.prefetch_issued,
                prefetch_used: s.prefetch_issued.saturating_sub(s.prefetch_unused),
                bytes_moved: s.bytes_read,
            }
        }))
    }

    fn backend(&self) -> &'static str {
        CPU
    }
}
