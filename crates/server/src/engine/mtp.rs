//! The MTP drafter kept in step with the engine's sequence.
//!
//! The head has an entry (its own KV row) for every position the trunk
//! ran, made from the trunk's hidden row at the position before, so the
//! drafter's state belongs to the sequence's state: each prompt-cache
//! checkpoint keeps an [`MtpSnapshot`] taken with it, and a job that
//! resumes from the checkpoint restores both. The alternative, rebuilding
//! the head's entries from the checkpoint's tokens, needs the trunk's
//! hidden rows of every one of those positions, which only a new prefill of
//! the whole prefix gives: the work the checkpoint is there to save. The
//! snapshot costs the head's one attention layer's K and V rows (on the
//! 80B shapes 4 KiB a position in f32, against the trunk's twelve
//! attention layers and 36 DeltaNet states).
//!
//! A job keeps the drafter in step ("tracks") when it drafts with MTP, and
//! every job does when the server's default is `--spec mtp`, so that the
//! checkpoints of a conversation's `none` or `lookup` turns serve its next
//! MTP turn. With `--state-dir` the snapshot is saved beside the state
//! file and loaded with it. A checkpoint without a snapshot (made while not
//! tracking, or loaded from a state file whose MTP file is missing or does
//! not load) is not resumed by a tracking job, which computes the prefix
//! instead: the drafter is never out of step.

use redlite_model::sequence::Sequence;
use redlite_model::{Model, ModelError};
use redlite_spec::mtp::{MtpDrafter, MtpSnapshot};
use redlite_spec::Drafter;
use std::sync::Arc;

/// The engine's MTP drafter and whether the current job keeps it in step.
pub(super) struct MtpTrack {
    drafter: MtpDrafter,
    on: bool,
}

impl MtpTrack {
    /// A tracker for `model`'s head over `ctx` positions, when the model
    /// has one and `seq`'s backend keeps hidden rows; else why not.
    pub(super) fn open(
        model: &Arc<Model>,
        ctx: usize,
        seq: &mut dyn Sequence,
    ) -> Result<MtpTrack, String> {
        let drafter = redlite_spec::mtp_drafter(model, ctx).map_err(|e| e.to_string())?;
        // Off until a job tracks; an error says the backend cannot keep
        // the rows at all.
        seq.keep_hidden(false)
            .map_err(|e| format!("--spec mtp: {e}"))?;
        Ok(MtpTrack { drafter, on: false })
    }

    /// Start a job that tracks (`on`) or not, the drafter matching the
    /// state the sequence was just restored to (`from`, the checkpoint's
    /// snapshot) or reset to (`None`).
    pub(super) fn begin(
        &mut self,
        seq: &mut dyn Sequence,
        on: bool,
        from: Option<&MtpSnapshot>,
    ) -> Result<(), ModelError> {
        if on != self.on {
            seq.keep_hidden(on)?;
            self.on = on;
        }
        if on {
            match from {
                Some(s) => self.drafter.restore(s)?,
                None => self.drafter.reset(),
            }
            if self.drafter.pos() != seq.pos() {
                return Err(ModelError::Rollback(format!(
                    "the MTP drafter is at position {}, the sequence at {}",
                    self.drafter.pos(),
                    seq.pos()
                )));
            }
        }
        Ok(())
    }

    pub(super) fn on(&self) -> bool {
        self.on
    }

    /// The sequence has just run `tokens` and kept them all (a prompt
    /// chunk, a plain decode step).
    pub(super) fn ran(&mut self, seq: &mut dyn Sequence, tokens: &[u32]) -> Result<(), ModelError> {
        if self.on {
            self.drafter.observe(seq, tokens, tokens.len())?;
        }
        Ok(())
    }

    /// The snapshot to keep with a checkpoint of `seq` taken now (None
    /// while not tracking).
    pub(super) fn snapshot(&self, seq: &dyn Sequence) -> Option<MtpSnapshot> {
        if !self.on {
            return None;
        }
        if self.drafter.pos() != seq.pos() {
            tracing::warn!(
                "the MTP drafter is at position {}, the sequence at {}: the checkpoint keeps no MTP state",
                self.drafter.pos(),
                seq.pos()
            );
            return None;
        }
        Some(self.drafter.snapshot())
    }

    pub(super) fn drafter(&mut self) -> &mut MtpDrafter {
        &mut self.drafter
    }
}

/// Drafts with `inner` (prompt lookup) while keeping the MTP drafter in
/// step with every pass: a lookup job of a server that tracks.
pub(super) struct AlsoTrack<'a> {
    pub inner: &'a mut (dyn Drafter + Send),
    pub mtp: &'a mut MtpDrafter,
}

impl Drafter for AlsoTrack<'_> {
    fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        self.inner.draft(history, max)
    }

    fn observe(
        &mut self,
        seq: &mut dyn Sequence,
        ran: &[u32],
        kept: usize,
    ) -> Result<(), ModelError> {
        self.inner.observe(seq, ran, kept)?;
        self.mtp.observe(seq, ran, kept)
    }
}
