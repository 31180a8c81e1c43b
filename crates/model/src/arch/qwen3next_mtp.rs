//! Qwen3-Next's multi-token-prediction (MTP) head: one extra decoder block
//! that drafts the token after next from the trunk's hidden state and the
//! next token's embedding.
//!
//! llama.cpp's converter writes the checkpoint's `mtp.*` block (unless
//! given `--no-mtp`) as NextN block `blk.{n_layer}` after the trunk, counts
//! it in `block_count` and says how many there are in
//! `qwen3next.nextn_predict_layers`. Its tensors: `nextn.eh_proj`
//! (`[2d, d]`), `nextn.enorm`, `nextn.hnorm`, optionally
//! `nextn.embed_tokens`, `nextn.shared_head_head`, `nextn.shared_head_norm`
//! (else the model's `token_embd`, `output`, `output_norm`), plus a full
//! gated-attention layer and its MoE under the usual names.
//!
//! The computation (llama.cpp `src/models/qwen3next.cpp`, `graph_mtp`), for
//! the entry at position p with the trunk's hidden state `h` of position
//! p-1 (after `output_norm`, as the LM head sees it) and the token `x` at p:
//!
//! ```text
//! u = eh_proj · [enorm(embed(x)) ‖ hnorm(h)]      embedding first
//! u = u + Attn(attn_norm(u))                       its own KV cache, RoPE at p
//! u = u + MoE(post_attention_norm(u))
//! h' = head_norm(u)                                 the MTP's output hidden
//! logits = head · h'                                drafts the token at p+1
//! ```
//!
//! `h'` stands in for the trunk's hidden state when drafting deeper: the
//! next step takes (h', the drafted token) at p+1, as llama.cpp's draft-mtp
//! loop does. At p = 0 there is no previous hidden state: llama.cpp feeds
//! zeros there (its driver's pending row starts zeroed).

use super::qwen3next::{load_attention, load_ffn, Config, Ffn, Layer, Mixer, Qwen3Next};
use crate::arch::common::embed;
use crate::blocks::attention::{self, KvCache};
use crate::exec::Exec;
use crate::session::Logits;
use crate::trace::Trace;
use crate::weights::{blk, load_f32, TensorSpec as S, Weight};
use crate::{Model, ModelError};
use redlite_cpu::ops::{add_inplace, rms_norm};
use redlite_gguf::GgufFile;

/// The weights of one NextN (MTP) block.
#[derive(Debug)]
pub struct MtpHead {
    /// Its block index in the file (`blk.{block}.*`).
    pub block: usize,
    /// `[2d, d]`: the normed embedding and the normed hidden state, in that
    /// order, to one hidden row.
    pub eh_proj: Weight,
    pub enorm: Vec<f32>,
    pub hnorm: Vec<f32>,
    /// Its own embedding table, when the file has one (else `token_embd`).
    pub embed_tokens: Option<Weight>,
    /// Its own head norm, when the file has one (else `output_norm`).
    pub head_norm: Option<Vec<f32>>,
    /// Its own LM head, when the file has one (else `output`).
    pub head: Option<Weight>,
    /// The decoder block: full gated attention and the MoE.
    pub layer: Layer,
}

impl MtpHead {
    /// Block `b`'s tensors, each checked against its spec; a missing or
    /// misshapen one is an error naming it.
    pub fn load(f: &GgufFile, c: &Config, b: usize) -> Result<MtpHead, ModelError> {
        let (d, v) = (c.n_embd, c.n_vocab);
        let layer = Layer {
            attn_norm: load_f32(f, S::req(blk(b, "attn_norm.weight"), &[d]))?,
            post_norm: load_f32(f, S::req(blk(b, "post_attention_norm.weight"), &[d]))?,
            mixer: Mixer::Attention(load_attention(f, c, b)?),
            ffn: load_ffn(f, c, b)?,
        };
        let head_norm = match f.tensor_info(&blk(b, "nextn.shared_head_norm.weight")) {
            Some(_) => Some(load_f32(
                f,
                S::req(blk(b, "nextn.shared_head_norm.weight"), &[d]),
            )?),
            None => None,
        };
        Ok(MtpHead {
            block: b,
            eh_proj: Weight::require(f, S::req(blk(b, "nextn.eh_proj.weight"), &[2 * d, d]))?,
            enorm: load_f32(f, S::req(blk(b, "nextn.enorm.weight"), &[d]))?,
            hnorm: load_f32(f, S::req(blk(b, "nextn.hnorm.weight"), &[d]))?,
            embed_tokens: Weight::load(f, &S::opt(blk(b, "nextn.embed_tokens.weight"), &[d, v]))?,
            head_norm,
            head: Weight::load(f, &S::opt(blk(b, "nextn.shared_head_head.weight"), &[d, v]))?,
            layer,
        })
    }

    /// A fresh state (an empty KV cache of its attention layer) with room
    /// for `ctx_len` positions.
    pub fn new_state(&self, ctx_len: usize) -> MtpState {
        MtpState {
            kv: KvCache::default(),
            ctx_len,
        }
    }

    /// Floats per position in each of the head's K and V rows
    /// (`n_kv_head × head_dim`).
    pub fn kv_row(&self, model: &Model) -> usize {
        match model.arch() {
            crate::arch::Arch::Qwen3Next(q) => q.attn.shape.n_kv_head * q.attn.shape.head_dim,
            _ => 0,
        }
    }

    /// A state of `k.len() / kv_row` positions from saved K and V rows
    /// (`pos × kv_row` each, as [`MtpState::rows`] gives them), with room
    /// for `ctx_len`; rows of another width or count are an error.
    pub fn state_from_rows(
        &self,
        model: &Model,
        ctx_len: usize,
        k: Vec<f32>,
        v: Vec<f32>,
    ) -> Result<MtpState, ModelError> {
        let row = self.kv_row(model);
        let bad = |what: String| ModelError::Layer {
            layer: self.block,
            what: format!("MTP state: {what}"),
        };
        if row == 0 || !k.len().is_multiple_of(row) || k.len() != v.len() {
            return Err(bad(format!(
                "{} K and {} V values, not whole rows of {row}",
                k.len(),
                v.len()
            )));
        }
        let pos = k.len() / row;
        if pos > ctx_len {
            return Err(bad(format!("{pos} positions in a context of {ctx_len}")));
        }
        Ok(MtpState {
            kv: KvCache { k, v, len: pos },
            ctx_len,
        })
    }

    /// Run the head over `n = tokens.len()` entries at positions
    /// `st.pos()..`: entry i pairs `hidden` row i (the trunk's output after
    /// `output_norm` at position `st.pos() + i - 1`, or the previous draft
    /// step's [`MtpOutput::hidden`] row; zeros at position 0) with
    /// `tokens[i]` (the token at position `st.pos() + i`). Appends the n
    /// positions to `st`. Logits row i drafts the token at `st.pos() + i + 1`.
    pub fn forward(
        &self,
        model: &Model,
        st: &mut MtpState,
        hidden: &[f32],
        tokens: &[u32],
        want: Logits,
    ) -> Result<MtpOutput, ModelError> {
        self.run(model, st, hidden, tokens, Some(want))
    }

    /// [`MtpHead::forward`] without the LM head: appends the entries (what
    /// catching up on positions the trunk ran needs; their drafts are not
    /// read, and the LM head is the head's largest matmul).
    pub fn append(
        &self,
        model: &Model,
        st: &mut MtpState,
        hidden: &[f32],
        tokens: &[u32],
    ) -> Result<(), ModelError> {
        self.run(model, st, hidden, tokens, None).map(|_| ())
    }

    fn run(
        &self,
        model: &Model,
        st: &mut MtpState,
        hidden: &[f32],
        tokens: &[u32],
        want: Option<Logits>,
    ) -> Result<MtpOutput, ModelError> {
        let crate::arch::Arch::Qwen3Next(q) = model.arch() else {
            return Err(ModelError::Backend {
                backend: "cpu",
                what: "an MTP head belongs to a qwen3next model".into(),
            });
        };
        model
            .pool()
            .install(|| self.forward_on_pool(model, q, st, hidden, tokens, want))
    }

    fn forward_on_pool(
        &self,
        model: &Model,
        q: &Qwen3Next,
        st: &mut MtpState,
        hidden: &[f32],
        tokens: &[u32],
        want: Option<Logits>,
    ) -> Result<MtpOutput, ModelError> {
        let (n, d, eps) = (tokens.len(), q.cfg.n_embd, q.cfg.eps);
        if n == 0 {
            return Err(ModelError::NoTokens);
        }
        if hidden.len() != n * d {
            return Err(ModelError::Layer {
                layer: self.block,
                what: format!(
                    "MTP input: {} hidden values for {n} tokens of width {d} (need {})",
                    hidden.len(),
                    n * d
                ),
            });
        }
        let pos0 = st.pos();
        if pos0 + n > st.ctx_len {
            return Err(ModelError::ContextOverflow {
                pos: pos0,
                n_tokens: n,
                ctx_len: st.ctx_len,
            });
        }
        // The block's experts are not in the expert cache's layout (that
        // covers the trunk): they are read from the mapped file.
        let base = model.exec();
        let ex = Exec {
            experts: None,
            pregate: 0,
            ..base
        };
        let mut trace = Trace::default();
        let emb = embed(
            model.file(),
            self.embed_tokens.as_ref().unwrap_or(&q.tok_embd),
            tokens,
        )?;
        let mut cat = vec![0f32; n * 2 * d];
        for i in 0..n {
            let (e, h) = cat[i * 2 * d..(i + 1) * 2 * d].split_at_mut(d);
            e.copy_from_slice(&emb[i * d..(i + 1) * d]);
            rms_norm(e, &self.enorm, eps);
            h.copy_from_slice(&hidden[i * d..(i + 1) * d]);
            rms_norm(h, &self.hnorm, eps);
        }
        let mut x = ex.linear(&self.eh_proj, &cat, n)?;
        let l = &self.layer;
        let mut h = x.clone();
        rms_norm(&mut h, &l.attn_norm, eps);
        let Mixer::Attention(w) = &l.mixer else {
            unreachable!("MtpHead::load builds an attention block")
        };
        let mixed = attention::forward(
            &ex, w, &q.attn, &h, n, pos0, &mut st.kv, &mut trace, self.block,
        )?;
        add_inplace(&mut x, &mixed);
        let mut h = x.clone();
        rms_norm(&mut h, &l.post_norm, eps);
        let y = match &l.ffn {
            Ffn::Moe(m) => m.forward(&ex, &h, n, &mut trace, self.block)?.0,
            Ffn::Dense(fd) => fd.forward(&ex, &h, n)?,
        };
        add_inplace(&mut x, &y);
        rms_norm(
            &mut x,
            self.head_norm.as_ref().unwrap_or(&q.output_norm),
            eps,
        );
        let head = self.head.as_ref().unwrap_or(&q.output);
        let logits = match want {
            Some(Logits::All) => ex.linear(head, &x, n)?,
            Some(Logits::Last) => ex.linear(head, &x[(n - 1) * d..], 1)?,
            None => Vec::new(),
        };
        Ok(MtpOutput { logits, hidden: x })
    }
}

/// What one [`MtpHead::forward`] gives.
#[derive(Clone, Debug)]
pub struct MtpOutput {
    /// `n × n_vocab` (or the last row's `n_vocab` with [`Logits::Last`]).
    pub logits: Vec<f32>,
    /// `n × d`: the head's output hidden rows (after its head norm), the
    /// `hidden` input of the next draft step.
    pub hidden: Vec<f32>,
}

/// A sequence's MTP state: the keys and values of the head's attention
/// layer, one position per entry it has run. Clone it for a checkpoint;
/// [`MtpState::truncate`] drops rejected draft positions.
#[derive(Clone, Debug)]
pub struct MtpState {
    kv: KvCache,
    ctx_len: usize,
}

impl MtpState {
    /// Positions held (the next entry's position).
    pub fn pos(&self) -> usize {
        self.kv.len
    }

    pub fn ctx_len(&self) -> usize {
        self.ctx_len
    }

    /// Keep positions `0..pos` (no-op when `pos >= self.pos()`).
    pub fn truncate(&mut self, pos: usize) {
        self.kv.truncate(pos);
    }

    /// Forget everything (position 0).
    pub fn clear(&mut self) {
        self.kv.clear();
    }

    /// The K and V rows of its positions (`pos() × row` each, f32).
    pub fn rows(&self) -> (&[f32], &[f32]) {
        (&self.kv.k, &self.kv.v)
    }

    /// Bytes held (f32 K and V).
    pub fn bytes(&self) -> usize {
        (self.kv.k.len() + self.kv.v.len()) * 4
    }
}
