//! Qwen2 (and Qwen2.5, Qwen2.5-Coder): a dense pre-norm transformer.
//!
//! ```text
//! h = x + Attn(RMSNorm_attn(x))       q/k/v projections with biases,
//!                                      NeoX RoPE over the whole head, GQA
//! y = h + SwiGLU(RMSNorm_ffn(h))      down(SiLU(gate h) ⊙ up h)
//! logits = output(RMSNorm(y_last_layer))   output tied to token_embd if absent
//! ```
//!
//! Everything comes from GGUF metadata (`qwen2.*`). llama.cpp runs `qwen2`
//! with `LLAMA_ROPE_TYPE_NEOX` (pairs `(j, j + n_rot/2)`, which is what
//! [`Rope`] does) and asserts `n_rot == head_dim`; so do we. RoPE scaling
//! (YaRN, linear) is not implemented: a file that asks for it is refused
//! at load rather than run with the wrong positions.

use super::common::{self, Meta};
use super::limits::{self, MAX_CONTEXT, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_WIDTH};
use crate::blocks::attention::{self, AttnParams, AttnWeights};
use crate::blocks::moe::{DenseFfn, Route};
use crate::exec::Exec;
use crate::session::LayerState;
use crate::stages::TokenStages;
use crate::trace::Trace;
use crate::weights::{blk, load_f32, TensorSpec as S, Weight};
use crate::ModelError;
use redlite_cpu::attention::AttnShape;
use redlite_cpu::ops::{add_inplace, rms_norm, Rope};
use redlite_gguf::GgufFile;

const ARCH: &str = "qwen2";

/// The hyper-parameters, all from metadata.
#[derive(Clone, Debug)]
pub struct Config {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub eps: f32,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_base: f32,
    pub n_ff: usize,
}

impl Config {
    pub fn from_gguf(file: &GgufFile) -> Result<Config, ModelError> {
        let md = file.metadata();
        let m = Meta::new(md, ARCH);
        let n_layer = m.size("block_count", 1, MAX_LAYERS)?;
        limits::check_layers(file, &m.key("block_count"), n_layer)?;
        let n_embd = m.size("embedding_length", 1, MAX_WIDTH)?;
        let n_head = m.size("attention.head_count", 1, MAX_HEADS)?;
        let n_head_kv = m.size_or("attention.head_count_kv", n_head, 1, MAX_HEADS)?;
        if n_head % n_head_kv != 0 {
            return Err(m.bad(
                "attention.head_count_kv",
                format!("{n_head_kv} does not divide {n_head} heads"),
            ));
        }
        let head_dim = m.size_or("attention.key_length", n_embd / n_head, 1, MAX_HEAD_DIM)?;
        let v_dim = m.size_or("attention.value_length", head_dim, 1, MAX_HEAD_DIM)?;
        if v_dim != head_dim || head_dim % 2 != 0 {
            return Err(m.bad(
                "attention.value_length",
                format!("key length {head_dim} and value length {v_dim} must be equal and even"),
            ));
        }
        let q_key = format!(
            "{} × {}",
            m.key("attention.head_count"),
            m.key("attention.key_length")
        );
        limits::product(&q_key, &[n_head, head_dim], MAX_WIDTH * 4)?;
        let n_rot = m.usize_or("rope.dimension_count", head_dim)?;
        if n_rot != head_dim {
            return Err(m.bad(
                "rope.dimension_count",
                format!("{n_rot}: qwen2 rotates the whole head ({head_dim})"),
            ));
        }
        let scaling_key = format!("{ARCH}.rope.scaling.type");
        if md.contains_key(&scaling_key) {
            let ty = md.get_str(&scaling_key)?;
            if ty != "none" {
                return Err(m.bad(
                    "rope.scaling.type",
                    format!("`{ty}` RoPE scaling is not implemented"),
                ));
            }
        }
        Ok(Config {
            n_layer,
            n_embd,
            n_vocab: common::vocab_size(file, n_embd)?,
            context_length: m.size_or("context_length", 4096, 1, MAX_CONTEXT)?,
            eps: m.positive_or("attention.layer_norm_rms_epsilon", 1e-6)?,
            n_head,
            n_head_kv,
            head_dim,
            rope_base: m.positive_or("rope.freq_base", 10000.0)?,
            n_ff: m.size("feed_forward_length", 1, MAX_WIDTH)?,
        })
    }

    pub fn attention(&self) -> AttnParams {
        AttnParams {
            shape: AttnShape {
                n_head: self.n_head,
                n_kv_head: self.n_head_kv,
                head_dim: self.head_dim,
            },
            rope: Rope::new(self.head_dim, self.rope_base),
            eps: self.eps,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }
}

/// One transformer block.
#[derive(Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub attn: AttnWeights,
    pub ffn_norm: Vec<f32>,
    pub ffn: DenseFfn,
}

/// A loaded Qwen2.
#[derive(Debug)]
pub struct Qwen2 {
    pub cfg: Config,
    pub tok_embd: Weight,
    pub output_norm: Vec<f32>,
    /// `output.weight`, or `token_embd.weight` when the head is tied.
    pub output: Weight,
    pub layers: Vec<Layer>,
    attn: AttnParams,
}

/// An optional small tensor (a bias) as f32.
fn load_f32_opt(f: &GgufFile, spec: S) -> Result<Option<Vec<f32>>, ModelError> {
    Weight::load(f, &spec)?.map(|w| w.to_f32(f)).transpose()
}

/// The tensor specs of one block's attention: q/k/v projections with their
/// biases (optional, as in llama.cpp, but every Qwen2 checkpoint has them)
/// and the output projection (no bias).
fn load_attention(f: &GgufFile, c: &Config, i: usize) -> Result<AttnWeights, ModelError> {
    let (d, q, kv) = (c.n_embd, c.head_dim * c.n_head, c.head_dim * c.n_head_kv);
    Ok(AttnWeights {
        wq: Weight::require(f, S::req(blk(i, "attn_q.weight"), &[d, q]))?,
        wk: Weight::require(f, S::req(blk(i, "attn_k.weight"), &[d, kv]))?,
        wv: Weight::require(f, S::req(blk(i, "attn_v.weight"), &[d, kv]))?,
        wo: Weight::require(f, S::req(blk(i, "attn_output.weight"), &[q, d]))?,
        bq: load_f32_opt(f, S::opt(blk(i, "attn_q.bias"), &[q]))?,
        bk: load_f32_opt(f, S::opt(blk(i, "attn_k.bias"), &[kv]))?,
        bv: load_f32_opt(f, S::opt(blk(i, "attn_v.bias"), &[kv]))?,
        q_norm: None,
        k_norm: None,
        gated: false,
    })
}

impl Qwen2 {
    pub fn load(f: &GgufFile) -> Result<Qwen2, ModelError> {
        let c = Config::from_gguf(f)?;
        let d = c.n_embd;
        if f.tensor_info("output.bias").is_some() {
            return Err(ModelError::Metadata {
                key: "output.bias".into(),
                what: "a bias on the output head is not implemented".into(),
            });
        }
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            layers.push(Layer {
                attn_norm: load_f32(f, S::req(blk(i, "attn_norm.weight"), &[d]))?,
                attn: load_attention(f, &c, i)?,
                ffn_norm: load_f32(f, S::req(blk(i, "ffn_norm.weight"), &[d]))?,
                ffn: common::load_dense_ffn(f, i, d, c.n_ff)?,
            });
        }
        let (tok_embd, output_norm, output) = common::load_embd_head(f, d, c.n_vocab)?;
        let m = Qwen2 {
            attn: c.attention(),
            cfg: c,
            tok_embd,
            output_norm,
            output,
            layers,
        };
        m.check_types()?;
        Ok(m)
    }

    fn check_types(&self) -> Result<(), ModelError> {
        let mut ws: Vec<&Weight> = vec![&self.output];
        for l in &self.layers {
            let (a, fd) = (&l.attn, &l.ffn);
            ws.extend([&a.wq, &a.wk, &a.wv, &a.wo, &fd.gate, &fd.up, &fd.down]);
        }
        ws.iter().try_for_each(|w| w.check_matmul_type())
    }

    /// An empty KV cache per layer.
    pub fn new_states(&self) -> Vec<LayerState> {
        (0..self.layers.len())
            .map(|_| LayerState::Kv(Default::default()))
            .collect()
    }

    /// Run the layers over `n` embedded tokens `x` at positions `pos0..`;
    /// returns the final-normed hidden states and (no routing in a dense
    /// model) an empty route list per layer. Trace names follow llama.cpp's
    /// graph callbacks.
    /// One decode token as stages: the same layer order as
    /// [`Self::forward_hidden`], for backends that record a token once and
    /// replay it (see [`crate::stages`]).
    pub fn decode_stages(&self, s: &mut dyn TokenStages) -> Result<(), ModelError> {
        let eps = self.cfg.eps;
        s.embed(&self.tok_embd)?;
        for (i, l) in self.layers.iter().enumerate() {
            s.norm(&l.attn_norm, eps, false)?;
            s.attention(i, &l.attn, &self.attn)?;
            s.norm(&l.ffn_norm, eps, true)?;
            s.dense_ffn(i, &l.ffn)?;
        }
        s.head(&self.output_norm, eps, &self.output)
    }

    pub fn forward_hidden(
        &self,
        ex: &Exec,
        states: &mut [LayerState],
        mut x: Vec<f32>,
        n: usize,
        pos0: usize,
        trace: &mut Trace,
    ) -> Result<(Vec<f32>, Vec<Vec<Route>>), ModelError> {
        let c = &self.cfg;
        if states.len() != self.layers.len() {
            return Err(ModelError::Layer {
                layer: states.len().min(self.layers.len()),
                what: format!(
                    "session has {} layer states for {} layers",
                    states.len(),
                    self.layers.len()
                ),
            });
        }
        for (i, (l, st)) in self.layers.iter().zip(states.iter_mut()).enumerate() {
            let t = Some(i);
            let LayerState::Kv(kv) = st else {
                return Err(ModelError::Layer {
                    layer: i,
                    what: "session state does not match the layer kind".into(),
                });
            };
            let mut h = x.clone();
            rms_norm(&mut h, &l.attn_norm, c.eps);
            trace.record(t, "attn_norm", n, &h);
            let a = attention::forward(ex, &l.attn, &self.attn, &h, n, pos0, kv, trace, i)?;
            add_inplace(&mut x, &a);
            trace.record(t, "ffn_inp", n, &x);
            let mut h = x.clone();
            rms_norm(&mut h, &l.ffn_norm, c.eps);
            trace.record(t, "ffn_norm", n, &h);
            let y = l.ffn.forward(ex, &h, n)?;
            trace.record(t, "ffn_out", n, &y);
            add_inplace(&mut x, &y);
            trace.record(t, "l_out", n, &x);
        }
        rms_norm(&mut x, &self.output_norm, c.eps);
        trace.record(None, "result_norm", n, &x);
        Ok((x, vec![Vec::new(); c.n_layer]))
    }
}
