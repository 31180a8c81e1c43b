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

impl<D: Drafter + ?Sized> Drafter for &mut D {
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
    /// `--spec mtp` (or a request's `speculative.type: mtp`) on a model
    /// file without a NextN block.
    #[error("--spec mtp: this {arch} model has no multi-token-prediction layer (GGUF key `{arch}.nextn_predict_layers`; llama.cpp's converter writes it unless given --no-mtp)")]
    NoMtpLayer { arch: &'static str },
}

/// The drafter `opts` ask for where no model is needed to make it (prompt
/// lookup; `none` drafts nothing). None for MTP, whose drafter reads the
/// model ([`mtp_drafter`]).
pub fn drafter(opts: &SpecOptions) -> Option<Box<dyn Drafter + Send>> {
    match opts.mode {
        SpecMode::None => Some(Box::new(NoDrafts)),
        SpecMode::Lookup => Some(Box::new(PromptLookup::new(opts.ngram_min, opts.ngram_max))),
        SpecMode::Mtp => None,
    }
}

/// A drafter from `model`'s MTP head with room for `ctx` positions, or the
/// error naming what the file lacks.
pub fn mtp_drafter(
    model: &std::sync::Arc<redlite_model::Model>,
    ctx: usize,
) -> Result<mtp::MtpDrafter, SpecError> {
    mtp::MtpDrafter::new(model.clone(), ctx).ok_or_else(|| SpecError::NoMtpLayer {
        arch: model.arch().name(),
    })
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
        SpecMode::Mtp => Box::new(mtp_drafter(model, ctx)?),
        SpecMode::Lookup => Box::new(PromptLookup::new(opts.ngram_min, opts.ngram_max)),
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
    /// Whether speculation is paying here (see [`Payoff`]).
    payoff: Payoff,
    pub stats: SpecStats,
}

/// Whether verify passes pay on this backend and this text, measured as the
/// run goes: seconds per emitted token of plain steps and of speculative
/// steps (drafting, the pass, the rollback), as moving averages. While the
/// speculative steps cost more per token than plain ones, the speculator
/// takes plain steps, 1, 2, 4, … up to [`MAX_BACKOFF`] at a time, probing in
/// between. Text that does not repeat itself yields passes of two or three
/// tokens, which on two CPU cores cost more than decoding them; a GPU
/// verify pass costs k + 1 decode steps. Only which steps speculate
/// depends on the timing: the tokens never do.
#[derive(Clone, Copy, Debug, Default)]
struct Payoff {
    plain: Option<f64>,
    spec: Option<f64>,
    cooldown: usize,
    backoff: usize,
}

/// The longest run of plain steps between probes.
const MAX_BACKOFF: usize = 16;

impl Payoff {
    fn record(avg: &mut Option<f64>, secs_per_token: f64) {
        *avg = Some(match *avg {
            None => secs_per_token,
            Some(a) => 0.7 * a + 0.3 * secs_per_token,
        });
    }

    /// Whether to draft this step (false: a plain step).
    fn draft_now(&mut self) -> bool {
        if self.cooldown > 0 {
            self.cooldown -= 1;
            return false;
        }
        true
    }

    /// After a speculative step: back off while it costs more per token.
    fn after_spec(&mut self, secs: f64, tokens: usize) {
        Self::record(&mut self.spec, secs / tokens.max(1) as f64);
        match (self.plain, self.spec) {
            (Some(p), Some(s)) if s > p => {
                self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
                self.cooldown = self.backoff;
            }
            (None, _) => {
                // No plain step measured yet: take one to compare.
                self.cooldown = 1;
            }
            _ => self.backoff = 0,
        }
    }
}

impl<D: Drafter> Speculator<D> {
    pub fn new(drafter: D, opts: SpecOptions) -> Speculator<D> {
        let draft_len = opts.draft_max.div_ceil(2).max(opts.draft_min).max(1);
        Speculator {
            drafter,
            opts,
            draft_len,
            carry: None,
            payoff: Payoff::default(),
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
        let t0 = std::time::Instant::now();
        let draft = if max > 0 && (!self.opts.adaptive || self.payoff.draft_now()) {
            self.drafter.draft(history, max)
        } else {
            Vec::new()
        };
        if draft.is_empty() || draft.len() < self.opts.draft_min {
            self.stats.plain += 1;
            *logits = seq.prefill(&[next], Logits::Last)?;
            Payoff::record(&mut self.payoff.plain, t0.elapsed().as_secs_f64());
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
        self.payoff.after_spec(t0.elapsed().as_secs_f64(), 1 + kept);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payoff_backs_off_while_speculating_costs_more_and_probes_again() {
        let mut p = Payoff::default();
        // No plain step measured yet: one plain step to compare.
        p.after_spec(0.010, 1);
        assert!(!p.draft_now());
        assert!(p.draft_now());
        Payoff::record(&mut p.plain, 0.004);
        // Speculative steps at 10 ms a token against plain at 4 ms: 1, 2,
        // 4, … plain steps between probes, capped.
        let mut runs = Vec::new();
        for _ in 0..7 {
            p.after_spec(0.010, 1);
            let mut n = 0;
            while !p.draft_now() {
                n += 1;
            }
            runs.push(n);
        }
        assert_eq!(runs, vec![1, 2, 4, 8, 16, 16, 16]);
        // Passes that pay (1 ms a token) end the back-off once the average
        // has come down below the plain steps' 4 ms.
        for _ in 0..6 {
            while !p.draft_now() {}
            p.after_spec(0.004, 4);
        }
        assert_eq!(p.backoff, 0);
        assert!(p.draft_now());
    }
}
