//! Drafts from the model's multi-token-prediction (NextN) layer.
//!
//! The MTP head predicts the token after next from the trunk's final-normed
//! hidden row at one position and the token at the next (llama.cpp's
//! `draft-mtp`, vLLM's and SGLang's MTP). It keeps its own KV cache, which
//! has to hold an entry for every position the trunk ran: after each trunk
//! pass the drafter runs the head over the kept tokens with the pass's
//! hidden rows shifted by one position ([`MtpDrafter::observe`]). A draft
//! chains the head on its own output hidden row and argmax token, then
//! truncates its cache back, since the real entries come from the trunk.
//!
//! A front end that checkpoints the sequence (the server's prompt cache)
//! keeps an [`MtpSnapshot`] with each checkpoint and restores both
//! together: rebuilding the head's entries from the tokens alone would
//! need the trunk's hidden rows of every position again, that is the whole
//! prefill the checkpoint saved.

use crate::Drafter;
use redlite_model::arch::qwen3next_mtp::MtpState;
use redlite_model::sample::argmax;
use redlite_model::sequence::Sequence;
use redlite_model::{Logits, Model, ModelError};
use std::sync::Arc;

pub struct MtpDrafter {
    model: Arc<Model>,
    state: MtpState,
    /// The trunk's hidden row at the last position it ran (the input of the
    /// next entry).
    last_hidden: Vec<f32>,
}

/// The drafter at one point of a sequence: the head's KV rows of positions
/// `0..pos()` and the trunk's hidden row at `pos() - 1`.
#[derive(Clone, Debug)]
pub struct MtpSnapshot {
    state: MtpState,
    last_hidden: Vec<f32>,
}

impl MtpSnapshot {
    /// Positions it covers (the sequence's position when taken).
    pub fn pos(&self) -> usize {
        self.state.pos()
    }

    /// Bytes held (the head's K and V rows and the hidden row).
    pub fn bytes(&self) -> u64 {
        (self.state.bytes() + self.last_hidden.len() * 4) as u64
    }

    /// Its K rows, V rows (`pos() × row` each) and the hidden row, to save.
    pub fn parts(&self) -> (&[f32], &[f32], &[f32]) {
        let (k, v) = self.state.rows();
        (k, v, &self.last_hidden)
    }
}

impl MtpDrafter {
    /// A drafter for `model`'s first MTP head with room for `ctx` positions
    /// (None when the file has no NextN block).
    pub fn new(model: Arc<Model>, ctx: usize) -> Option<MtpDrafter> {
        let state = model.mtp()?.new_state(ctx);
        let d = model.arch().n_embd();
        Some(MtpDrafter {
            model,
            state,
            last_hidden: vec![0.0; d],
        })
    }

    /// Positions the head has entries for (in step with the trunk: the
    /// sequence's position).
    pub fn pos(&self) -> usize {
        self.state.pos()
    }

    /// Back to position 0 (a sequence that was reset).
    pub fn reset(&mut self) {
        self.state.clear();
        self.last_hidden.iter_mut().for_each(|x| *x = 0.0);
    }

    /// The drafter's state now, to keep with a checkpoint of the sequence.
    pub fn snapshot(&self) -> MtpSnapshot {
        MtpSnapshot {
            state: self.state.clone(),
            last_hidden: self.last_hidden.clone(),
        }
    }

    /// A snapshot for this drafter from saved parts ([`MtpSnapshot::parts`]),
    /// checked against the head's row width and the model's hidden width.
    pub fn snapshot_from_parts(
        &self,
        k: Vec<f32>,
        v: Vec<f32>,
        hidden: Vec<f32>,
    ) -> Result<MtpSnapshot, ModelError> {
        if hidden.len() != self.last_hidden.len() {
            return Err(ModelError::Rollback(format!(
                "an MTP hidden row of {} values for a model of width {}",
                hidden.len(),
                self.last_hidden.len()
            )));
        }
        let head = self.model.mtp().expect("checked at construction");
        let state = head.state_from_rows(&self.model, self.state.ctx_len(), k, v)?;
        Ok(MtpSnapshot {
            state,
            last_hidden: hidden,
        })
    }

    /// Floats per position of the head's K (and V) rows.
    pub fn kv_row(&self) -> usize {
        self.model
            .mtp()
            .expect("checked at construction")
            .kv_row(&self.model)
    }

    /// The model's hidden width.
    pub fn width(&self) -> usize {
        self.last_hidden.len()
    }

    /// Back to `snap` (taken from a drafter of the same model and
    /// context), as the sequence goes back to the matching checkpoint.
    pub fn restore(&mut self, snap: &MtpSnapshot) -> Result<(), ModelError> {
        if snap.state.ctx_len() != self.state.ctx_len()
            || snap.last_hidden.len() != self.last_hidden.len()
        {
            return Err(ModelError::Rollback(format!(
                "an MTP snapshot of {} positions × width {} restored into a drafter of {} × {}",
                snap.state.ctx_len(),
                snap.last_hidden.len(),
                self.state.ctx_len(),
                self.last_hidden.len()
            )));
        }
        self.state.clone_from(&snap.state);
        self.last_hidden.copy_from_slice(&snap.last_hidden);
        Ok(())
    }

    /// Run the head's entries for `tokens` at the positions the trunk just
    /// ran them, from its hidden rows `rows` (`tokens.len() × n_embd`).
    fn catch_up(&mut self, tokens: &[u32], rows: &[f32]) -> Result<(), ModelError> {
        let d = self.last_hidden.len();
        if tokens.is_empty() {
            return Ok(());
        }
        if rows.len() < tokens.len() * d {
            return Err(ModelError::Rollback(format!(
                "the MTP head needs {} hidden rows, the trunk kept {}",
                tokens.len(),
                rows.len() / d.max(1)
            )));
        }
        let mut input = Vec::with_capacity(tokens.len() * d);
        input.extend_from_slice(&self.last_hidden);
        input.extend_from_slice(&rows[..(tokens.len() - 1) * d]);
        let head = self.model.mtp().expect("checked at construction");
        head.append(&self.model, &mut self.state, &input, tokens)?;
        self.last_hidden
            .copy_from_slice(&rows[(tokens.len() - 1) * d..tokens.len() * d]);
        Ok(())
    }
}

impl Drafter for MtpDrafter {
    fn needs_hidden(&self) -> bool {
        true
    }

    fn prime(&mut self, seq: &mut dyn Sequence, prompt: &[u32]) -> Result<(), ModelError> {
        self.reset();
        let rows = seq.last_hidden()?.to_vec();
        self.catch_up(prompt, &rows)
    }

    fn observe(
        &mut self,
        seq: &mut dyn Sequence,
        ran: &[u32],
        kept: usize,
    ) -> Result<(), ModelError> {
        let rows = seq.last_hidden()?.to_vec();
        self.catch_up(&ran[..kept], &rows)
    }

    fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        let Some(&next) = history.last() else {
            return Vec::new();
        };
        let head = self.model.mtp().expect("checked at construction");
        let start = self.state.pos();
        let mut h = self.last_hidden.clone();
        let mut tok = next;
        let mut out = Vec::with_capacity(max);
        for _ in 0..max {
            if self.state.pos() + 1 >= self.state.ctx_len() {
                break;
            }
            match head.forward(&self.model, &mut self.state, &h, &[tok], Logits::Last) {
                Ok(o) => {
                    tok = argmax(&o.logits) as u32;
                    h = o.hidden;
                    out.push(tok);
                }
                Err(e) => {
                    tracing::warn!("MTP draft: {e}");
                    break;
                }
            }
        }
        self.state.truncate(start);
        out
    }
}
