//! A sequence's state (KV caches and DeltaNet states) and the forward call.

use crate::arch::common::embed;
use crate::blocks::attention::KvCache;
use crate::blocks::deltanet::RecurrentState;
use crate::blocks::moe::Route;
use crate::trace::Trace;
use crate::{Model, ModelError};
use redlite_cpu::matmul::Batching;

/// The state of one layer, matching its mixer.
#[derive(Clone, Debug)]
pub enum LayerState {
    Kv(KvCache),
    Recurrent(RecurrentState),
}

/// Which logits a forward returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// The last token's: `n_vocab` values.
    Last,
    /// Every token's: `n_tokens × n_vocab` values, token-major.
    All,
}

/// One sequence.
#[derive(Clone, Debug)]
pub struct Session {
    states: Vec<LayerState>,
    pos: usize,
    ctx_len: usize,
    /// The trace recorder (off unless [`Session::enable_trace`]).
    pub trace: Trace,
    routes: Vec<Vec<Route>>,
    /// Keep the last forward's hidden rows (see [`Session::set_keep_hidden`]).
    keep_hidden: bool,
    hidden: Vec<f32>,
    /// The verify pass [`Session::keep`] applies to.
    pending: Option<Pending>,
}

/// Where the last verify pass started and how many tokens it ran.
#[derive(Clone, Copy, Debug)]
struct Pending {
    start: usize,
    n: usize,
}

impl Session {
    pub(crate) fn new(states: Vec<LayerState>, ctx_len: usize) -> Session {
        Session {
            states,
            pos: 0,
            ctx_len,
            trace: Trace::default(),
            routes: Vec::new(),
            keep_hidden: false,
            hidden: Vec::new(),
            pending: None,
        }
    }

    /// A session holding `states` at `pos` (a restored state file).
    pub(crate) fn from_states(states: Vec<LayerState>, pos: usize, ctx_len: usize) -> Session {
        let mut s = Session::new(states, ctx_len);
        s.pos = pos;
        s
    }

    /// Every layer's state, in layer order.
    pub fn states(&self) -> &[LayerState] {
        &self.states
    }

    /// Positions used so far.
    pub fn pos(&self) -> usize {
        self.pos
    }

    pub fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    /// Forget everything: position 0, empty caches, zero states.
    pub fn clear(&mut self) {
        self.pos = 0;
        self.pending = None;
        self.routes.clear();
        for s in &mut self.states {
            match s {
                LayerState::Kv(kv) => kv.clear(),
                LayerState::Recurrent(r) => r.clear(),
            }
        }
    }

    /// Record named intermediates from now on.
    pub fn enable_trace(&mut self) {
        self.trace = Trace::enabled();
    }

    /// The experts chosen by the last forward: per layer (empty for dense
    /// layers), per token of that forward, (expert, weight) pairs.
    pub fn last_routes(&self) -> &[Vec<Route>] {
        &self.routes
    }

    /// Keep every token's hidden state of each forward from now on (`on`),
    /// or stop and free them: what an MTP draft head reads (see
    /// [`crate::MtpHead::forward`]).
    pub fn set_keep_hidden(&mut self, on: bool) {
        self.keep_hidden = on;
        if !on {
            self.hidden = Vec::new();
        }
    }

    /// The last forward's hidden rows, `n_tokens × n_embd`, after the final
    /// norm (what the LM head multiplies; llama.cpp's `h_nextn`); empty
    /// unless [`Session::set_keep_hidden`] is on.
    pub fn last_hidden(&self) -> &[f32] {
        &self.hidden
    }

    /// Run draft tokens as one verify pass: every position's logits
    /// (`tokens.len() × n_vocab`), each the value a token-by-token decode
    /// gives, and a record from which [`Session::keep`] drops any suffix.
    pub fn verify(&mut self, model: &Model, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.pending = None;
        for s in &mut self.states {
            if let LayerState::Recurrent(r) = s {
                r.arm_rollback();
            }
        }
        let start = self.pos;
        let out = model
            .pool()
            .install(|| self.forward_on_pool(model, tokens, Logits::All, Batching::AsDecode));
        match out {
            Ok(l) => {
                self.pending = Some(Pending {
                    start,
                    n: tokens.len(),
                });
                Ok(l)
            }
            Err(e) => {
                // The pass did not complete: no prefix of it can be kept.
                for s in &mut self.states {
                    if let LayerState::Recurrent(r) = s {
                        r.end_rollback();
                    }
                }
                Err(e)
            }
        }
    }

    /// Keep the first `keep` tokens of the last [`Session::verify`] and
    /// drop the rest: KV rows truncated, DeltaNet states rolled back (the
    /// accepted tokens are replayed through the recurrence only).
    pub fn keep(&mut self, model: &Model, keep: usize) -> Result<(), ModelError> {
        let Some(p) = self.pending.take() else {
            return Err(ModelError::Rollback(
                "keep without a verify pass before it".into(),
            ));
        };
        if keep > p.n {
            return Err(ModelError::Rollback(format!(
                "keeping {keep} tokens of a pass of {}",
                p.n
            )));
        }
        let params = model.arch().deltanet_params();
        let pool = model.pool();
        for s in &mut self.states {
            match s {
                LayerState::Kv(kv) => kv.truncate(p.start + keep),
                LayerState::Recurrent(r) => {
                    let params = params.as_ref().ok_or_else(|| {
                        ModelError::Rollback("a recurrent layer in a model without DeltaNet".into())
                    })?;
                    r.roll_back(pool, params, keep)?;
                }
            }
        }
        for layer in &mut self.routes {
            layer.truncate(keep);
        }
        self.pos = p.start + keep;
        Ok(())
    }

    /// Run `tokens` (a prompt in batches of the model's `ubatch`, or one
    /// token) and return the wanted logits.
    ///
    /// The whole forward runs on one of the model's pool workers, so the
    /// ~100 parallel regions of a token start from a worker (its siblings
    /// steal the split work) instead of each being injected into the pool
    /// from outside and waited for with a sleep and a wake-up.
    pub fn forward(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
    ) -> Result<Vec<f32>, ModelError> {
        if self.pending.take().is_some() {
            // A forward after a verify pass keeps all of it.
            for s in &mut self.states {
                if let LayerState::Recurrent(r) = s {
                    r.end_rollback();
                }
            }
        }
        model
            .pool()
            .install(|| self.forward_on_pool(model, tokens, want, Batching::Gemm))
    }

    fn forward_on_pool(
        &mut self,
        model: &Model,
        tokens: &[u32],
        want: Logits,
        batching: Batching,
    ) -> Result<Vec<f32>, ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::NoTokens);
        }
        if self.pos + tokens.len() > self.ctx_len {
            return Err(ModelError::ContextOverflow {
                pos: self.pos,
                n_tokens: tokens.len(),
                ctx_len: self.ctx_len,
            });
        }
        let n_vocab = model.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::BadToken {
                token: bad,
                n_vocab,
            });
        }
        let mut ex = model.exec();
        ex.batching = batching;
        let arch = model.arch();
        let d = arch.n_embd();
        let mut logits = Vec::new();
        let mut routes: Vec<Vec<Route>> = vec![Vec::new(); arch.n_layer()];
        let chunks: Vec<&[u32]> = tokens.chunks(model.ubatch()).collect();
        self.hidden.clear();
        for (ci, chunk) in chunks.iter().enumerate() {
            let n = chunk.len();
            let x = embed(model.file(), arch.tok_embd(), chunk)?;
            self.trace.record(None, "inp_embd", n, &x);
            let (h, r) =
                arch.forward_hidden(&ex, &mut self.states, x, n, self.pos, &mut self.trace)?;
            for (acc, lr) in routes.iter_mut().zip(r) {
                acc.extend(lr);
            }
            self.pos += n;
            if self.keep_hidden {
                self.hidden.extend_from_slice(&h);
            }
            let last_chunk = ci + 1 == chunks.len();
            match want {
                Logits::All => {
                    let l = ex.linear(arch.output(), &h, n)?;
                    self.trace.record(None, "result_output", n, &l);
                    logits.extend(l);
                }
                Logits::Last if last_chunk => {
                    let l = ex.linear(arch.output(), &h[(n - 1) * d..], 1)?;
                    self.trace.record(None, "result_output", 1, &l);
                    logits = l;
                }
                Logits::Last => {}
            }
        }
        self.routes = routes;
        Ok(logits)
    }
}
