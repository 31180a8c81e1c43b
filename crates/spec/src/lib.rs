//! Speculative decoding over any [`Sequence`].
//!
//! Each step drafts up to k tokens after the next one, runs the next token
//! and the draft as one verify pass (every position's logits at once; on
//! the CPU the weights are read once for the k + 1 tokens), and keeps the
//! longest prefix of the draft that the target model itself would have
//! produced. The sequence then drops the rest ([`Sequence::accept`]: KV
//! rows truncated, DeltaNet state rolled back).
//!
//! Greedy: a draft token is kept when it is the sampler's choice at its
//! position, so the output is token for token what plain decoding gives
//! (the verify pass's logits are bit for bit the decode ones). Sampling:
//! the standard speculative-sampling rule for a deterministic draft — keep
//! draft token d with probability p(d) under the sampler's distribution,
//! else draw from p with d removed — whose output distribution is the
//! sampler's own.

pub mod lookup;
pub mod mtp;
mod options;

pub use lookup::PromptLookup;
pub use options::{SpecArgs, SpecMode, SpecOptions, DRAFT_MAX_LIMIT};

use redlite_model::sample::Sampler;
use redlite_model::sequence::Sequence;
use redlite_model::{Logits, ModelError};

/// Where draft tokens come from.
pub trait Drafter {
    /// Up to `max` tokens likely to follow `history` (the whole sequence,
    /// ending with the token about to be run).
    fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32>;

    /// Whether the drafter reads the trunk's hidden rows (the sequence must
    /// keep them, [`Sequence::keep_hidden`], from before the prompt).
    fn needs_hidden(&self) -> bool {
        false
    }

    /// The sequence has just prefilled `prompt` from position 0.
    fn prime(&mut self, seq: &mut dyn Sequence, prompt: &[u32]) -> Result<(), ModelError> {
        let _ = (seq, prompt);
        Ok(())
    }

    /// The sequence ran `ran` and kept its first `kept` tokens.
    fn observe(
        &mut self,
        seq: &mut dyn Sequence,
        ran: &[u32],
        kept: usize,
    ) -> Result<(), ModelError> {
        let _ = (seq, ran, kept);
        Ok(())
    }
}

impl<D: Drafter + ?Sized> Drafter for Box<D> {
    fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        (**self).draft(history, max)
    }
    fn needs_hidden(&self) -> bool {
        (**self).needs_hidden()
    }
    fn prime(&mut self, seq: &mut dyn Sequence, prompt: &[u32]) -> Result<(), ModelError> {
        (**self).prime(seq, prompt)
    }
    fn observe(
        &mut self,
        seq: &mut dyn Sequence,
        ran: &[u32],
        kept: usize,
    ) -> Result<(), ModelError> {
        (**self).observe(seq, ran, kept)
    }
}

/// A speculator whose drafter was chosen at run time.
pub type DynSpeculator = Speculator<Box<dyn Drafter + Send>>;

/// Errors of setting speculation up.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("--spec mtp: {0}")]
    NoMtp(String),
}

/// The drafter `opts` ask for, where no model is needed to make it
/// (prompt lookup; `none` drafts nothing).
pub fn drafter(opts: &SpecOptions) -> Result<Box<dyn Drafter + Send>, SpecError> {
    match opts.mode {
        SpecMode::None => Ok(Box::new(NoDrafts)),
        SpecMode::Lookup => Ok(Box::new(PromptLookup::new(opts.ngram_min, opts.ngram_max))),
        SpecMode::Mtp => Err(SpecError::NoMtp(
            "the server does not draft with the MTP layer yet (its prompt cache skips the hidden rows the head needs); use lookup".into(),
        )),
    }
}

/// Drafts nothing: every step is a plain decode.
pub struct NoDrafts;

impl Drafter for NoDrafts {
    fn draft(&mut self, _history: &[u32], _max: usize) -> Vec<u32> {
        Vec::new()
    }
}

/// The speculator `opts` ask for (None for `--spec none`), for sequences
/// of `ctx` positions of `model`.
pub fn from_options(
    opts: &SpecOptions,
    model: &std::sync::Arc<redlite_model::Model>,
    ctx: usize,
) -> Result<Option<DynSpeculator>, SpecError> {
    let drafter: Box<dyn Drafter + Send> = match opts.mode {
        SpecMode::None => return Ok(None),
        SpecMode::Lookup => Box::new(PromptLookup::new(opts.ngram_min, opts.ngram_max)),
        SpecMode::Mtp => match mtp::MtpDrafter::new(model.clone(), ctx) {
            Some(d) => Box::new(d),
            None => {
                return Err(SpecError::NoMtp(format!(
                    "this {} model has no multi-token-prediction layer (GGUF key `<arch>.nextn_predict_layers`; llama.cpp's converter writes it unless given --no-mtp)",
                    model.arch().name()
                )))
            }
        },
    };
    Ok(Some(Speculator::new(drafter, *opts)))
}

impl Drafter for PromptLookup {
    fn draft(&mut self, history: &[u32], max: usize) -> Vec<u32> {
        PromptLookup::draft(self, history, max)
    }
}

/// Counters of a speculative run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Verify passes run (steps that had a draft).
    pub passes: u64,
    /// Draft tokens proposed and kept.
    pub drafted: u64,
    pub accepted: u64,
    /// Steps without a draft (a plain decode).
    pub plain: u64,
}

impl SpecStats {
    /// Kept / proposed (0 with no drafts).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens per verify pass: the next token plus the kept drafts.
    pub fn mean_accepted_len(&self) -> f64 {
        if self.passes == 0 {
            0.0
        } else {
            (self.passes + self.accepted) as f64 / self.passes as f64
        }
    }

    /// One line for logs.
    pub fn line(&self) -> String {
        format!(
            "speculative: {} passes, {} drafted, {} accepted ({:.1}%), {:.2} tokens per pass, {} plain steps",
            self.passes,
            self.drafted,
            self.accepted,
            100.0 * self.acceptance(),
            self.mean_accepted_len(),
            self.plain
        )
    }
}

/// What one [`Speculator::step`] produced.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Tokens to emit, in order (appended to the history already).
    pub tokens: Vec<u32>,
    /// A stop token was chosen next (not emitted, not run).
    pub stop: Option<u32>,
    /// Whether the sequence has run every emitted token (false only when
    /// the budget ended the step on a token it did not run, as plain
    /// decoding does not run its last token).
    pub all_run: bool,
}

/// The speculative decoding loop's state for one generation.
pub struct Speculator<D: Drafter> {
    drafter: D,
    opts: SpecOptions,
    /// The draft length now (adapted to recent acceptance).
    draft_len: usize,
    /// The next token when the last pass already chose it (a rejected
    /// draft's replacement).
    carry: Option<u32>,
    pub stats: SpecStats,
}

impl<D: Drafter> Speculator<D> {
    pub fn new(drafter: D, opts: SpecOptions) -> Speculator<D> {
        let draft_len = opts.draft_max.div_ceil(2).max(opts.draft_min).max(1);
        Speculator {
            drafter,
            opts,
            draft_len,
            carry: None,
            stats: SpecStats::default(),
        }
    }

    /// One step. `logits` is the distribution of the next token (the
    /// sequence has run all of `history`); on return it is the
    /// distribution after the last token the sequence ran. `budget` is how
    /// many tokens may still be emitted (≥ 1); `is_stop` says which tokens
    /// end the generation.
    pub fn step(
        &mut self,
        seq: &mut dyn Sequence,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        logits: &mut Vec<f32>,
        budget: usize,
        is_stop: &dyn Fn(u32) -> bool,
    ) -> Result<Step, ModelError> {
        let next = match self.carry.take() {
            Some(t) => t,
            None => sampler.sample(logits, history),
        };
        if is_stop(next) {
            return Ok(Step {
                stop: Some(next),
                all_run: true,
                ..Default::default()
            });
        }
        history.push(next);
        if budget <= 1 {
            return Ok(Step {
                tokens: vec![next],
                all_run: false,
                ..Default::default()
            });
        }
        let room = seq.ctx_len().saturating_sub(seq.pos() + 1);
        let max = self.draft_len.min(budget - 1).min(room);
        let draft = if max > 0 {
            self.drafter.draft(history, max)
        } else {
            Vec::new()
        };
        if draft.is_empty() || draft.len() < self.opts.draft_min {
            self.stats.plain += 1;
            *logits = seq.prefill(&[next], Logits::Last)?;
            self.drafter.observe(seq, &[next], 1)?;
            return Ok(Step {
                tokens: vec![next],
                all_run: true,
                ..Default::default()
            });
        }
        let mut pass = Vec::with_capacity(draft.len() + 1);
        pass.push(next);
        pass.extend_from_slice(&draft);
        let rows = seq.verify(&pass)?;
        let n_vocab = rows.len() / pass.len();
        let row = |i: usize| &rows[i * n_vocab..(i + 1) * n_vocab];
        let mut tokens = vec![next];
        let mut kept = 0;
        for (i, &d) in draft.iter().enumerate() {
            if is_stop(d) {
                // The stop is chosen afresh from this row next step.
                break;
            }
            let choice = if sampler.cfg.is_greedy() {
                sampler.sample(row(i), history)
            } else {
                let dist = sampler.distribution(row(i), history);
                let p = dist.iter().find(|x| x.0 == d).map_or(0.0, |x| x.1);
                if sampler.uniform() < p {
                    d
                } else {
                    // The residual distribution: p without d, renormalised.
                    let rest: Vec<(u32, f64)> = dist.into_iter().filter(|x| x.0 != d).collect();
                    if rest.is_empty() {
                        d
                    } else {
                        sampler.pick(&rest)
                    }
                }
            };
            if choice != d {
                self.carry = Some(choice);
                break;
            }
            tokens.push(d);
            history.push(d);
            kept += 1;
        }
        seq.accept(1 + kept)?;
        self.drafter.observe(seq, &pass, 1 + kept)?;
        *logits = row(kept).to_vec();
        self.stats.passes += 1;
        self.stats.drafted += draft.len() as u64;
        self.stats.accepted += kept as u64;
        self.adapt(kept, draft.len());
        Ok(Step {
            tokens,
            all_run: true,
            ..Default::default()
        })
    }

    /// Longer drafts after a fully kept one, shorter after a rejection.
    fn adapt(&mut self, kept: usize, drafted: usize) {
        let lo = self.opts.draft_min.max(1);
        self.draft_len = if kept == drafted {
            (self.draft_len * 2).min(self.opts.draft_max)
        } else {
            (kept + 1).max(self.draft_len / 2).max(lo)
        }
        .max(lo);
    }

    /// Whether the sequence must keep hidden rows for this drafter (call
    /// [`Sequence::keep_hidden`] before the prompt, then
    /// [`Speculator::prime`]).
    pub fn needs_hidden(&self) -> bool {
        self.drafter.needs_hidden()
    }

    /// The sequence has just prefilled `prompt` from position 0 (a drafter
    /// that reads hidden rows catches up on them).
    pub fn prime(&mut self, seq: &mut dyn Sequence, prompt: &[u32]) -> Result<(), ModelError> {
        self.drafter.prime(seq, prompt)
    }

    /// The counters so far.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// The drafter (its index, for inspection).
    pub fn drafter(&self) -> &D {
        &self.drafter
    }
}
