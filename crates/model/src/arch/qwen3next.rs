//! Qwen3-Next: hybrid Gated DeltaNet + gated attention layers, each
//! followed by a 512-expert MoE with a shared expert.
//!
//! ```text
//! h = x + Mixer(RMSNorm_attn(x))      Mixer = GatedAttention | GatedDeltaNet
//! y = h + MoE(RMSNorm_post(h))
//! logits = output(RMSNorm(y_last_layer))
//! ```
//!
//! Everything comes from GGUF metadata (`qwen3next.*`); layer kinds from
//! `attention.recurrent_layers`, else `full_attention_interval`. In a GGUF
//! every norm is a plain `x̂·w` (the converter adds HF's `+1`, except to
//! `ssm_norm`, whose HF form is already plain).

use super::common::{self, Meta};
use super::limits::{
    self, MAX_CONTEXT, MAX_CONV_KERNEL, MAX_EXPERTS, MAX_HEADS, MAX_HEAD_DIM, MAX_LAYERS, MAX_WIDTH,
};
use super::qwen3next_mtp::MtpHead;
use crate::blocks::attention::{self, AttnParams, AttnWeights};
use crate::blocks::deltanet::{self, DeltaNetParams, DeltaNetWeights, InProj};
use crate::blocks::moe::{DenseFfn, ExpertsGateUp, MoeWeights, Route};
use crate::exec::Exec;
use crate::session::LayerState;
use crate::stages::TokenStages;
use crate::trace::Trace;
use crate::weights::{blk, load_f32, TensorSpec as S, Weight};
use crate::ModelError;
use redlite_cpu::attention::AttnShape;
use redlite_cpu::deltanet::GdnShape;
use redlite_cpu::ops::{add_inplace, rms_norm, Rope};
use redlite_expertcache::ExpertLayout;
use redlite_gguf::GgufFile;

/// The hyper-parameters, all from metadata.
#[derive(Clone, Debug)]
pub struct Config {
    /// Trunk layers: `block_count` less the NextN (MTP) blocks after them.
    pub n_layer: usize,
    /// NextN (MTP) blocks after the trunk (`nextn_predict_layers`, 0 when
    /// the file has none); their blocks are `blk.{n_layer}..`.
    pub n_nextn: usize,
    pub n_embd: usize,
    pub n_vocab: usize,
    pub context_length: usize,
    pub eps: f32,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub rope_base: f32,
    pub n_rot: usize,
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub ff_expert: usize,
    pub ff_shared: usize,
    pub ff_dense: usize,
    pub conv_kernel: usize,
    pub n_k_heads: usize,
    pub n_v_heads: usize,
    pub head_k_dim: usize,
    pub head_v_dim: usize,
    /// Per layer: true for Gated DeltaNet, false for full attention.
    pub recurrent: Vec<bool>,
}

impl Config {
    /// Every hyper-parameter, checked as a whole (ranges, divisibility,
    /// products, the recurrent state against the file's size) before
    /// anything is sized from them; tensor shapes are checked at load.
    pub fn from_gguf(file: &GgufFile) -> Result<Config, ModelError> {
        let m = Meta::new(file.metadata(), "qwen3next");
        let n_block = m.size("block_count", 1, MAX_LAYERS)?;
        limits::check_layers(file, &m.key("block_count"), n_block)?;
        // llama.cpp's converter appends the checkpoint's MTP block(s) as
        // NextN layers after the trunk (unless given `--no-mtp`) and counts
        // them in `block_count`; the trunk is what precedes them.
        let n_nextn = m.size_or("nextn_predict_layers", 0, 0, n_block)?;
        if n_nextn >= n_block {
            return Err(m.bad(
                "nextn_predict_layers",
                format!("{n_nextn} NextN (MTP) layers of {n_block} blocks leave no trunk layer (MTP-only files are not supported: load the full model)"),
            ));
        }
        let n_layer = n_block - n_nextn;
        let n_embd = m.size("embedding_length", 1, MAX_WIDTH)?;
        let n_head = m.size("attention.head_count", 1, MAX_HEADS)?;
        let head_dim = m.size_or("attention.key_length", n_embd / n_head, 1, MAX_HEAD_DIM)?;
        let recurrent = match m.bool_array("attention.recurrent_layers")? {
            // The converter writes one entry per block, NextN blocks
            // included (false: they are full attention).
            Some(mut v) if v.len() == n_block && n_nextn > 0 => {
                if let Some(j) = v[n_layer..].iter().position(|&r| r) {
                    return Err(m.bad(
                        "attention.recurrent_layers",
                        format!("marks block {} recurrent, but it is a NextN (MTP) block, which is full attention", n_layer + j),
                    ));
                }
                v.truncate(n_layer);
                v
            }
            Some(v) => v,
            None => {
                let iv = m
                    .size_or("full_attention_interval", 4, 0, MAX_LAYERS)?
                    .max(1);
                (0..n_layer).map(|i| (i + 1) % iv != 0).collect()
            }
        };
        if recurrent.len() != n_layer {
            return Err(m.bad(
                "attention.recurrent_layers",
                format!(
                    "has {} entries for {n_layer} trunk layers ({n_block} blocks, {n_nextn} NextN)",
                    recurrent.len()
                ),
            ));
        }
        let n_v_heads = m.size("ssm.time_step_rank", 1, MAX_HEADS)?;
        let d_inner = m.size("ssm.inner_size", 1, MAX_WIDTH)?;
        let n_k_heads = m.size("ssm.group_count", 1, MAX_HEADS)?;
        if n_v_heads % n_k_heads != 0 || d_inner % n_v_heads != 0 {
            return Err(m.bad(
                "ssm.group_count",
                format!("{n_k_heads} key heads, {n_v_heads} value heads, inner size {d_inner}: value heads must be a multiple of key heads and divide the inner size"),
            ));
        }
        let head_v_dim = limits::in_range(
            &format!(
                "{} / {}",
                m.key("ssm.inner_size"),
                m.key("ssm.time_step_rank")
            ),
            d_inner / n_v_heads,
            1,
            MAX_HEAD_DIM,
        )?;
        let head_k_dim = m.size("ssm.state_size", 1, MAX_HEAD_DIM)?;
        let conv_kernel = m.size("ssm.conv_kernel", 1, MAX_CONV_KERNEL)?;
        let n_head_kv = m.size_or("attention.head_count_kv", n_head, 1, MAX_HEADS)?;
        if n_head % n_head_kv != 0 {
            return Err(m.bad(
                "attention.head_count_kv",
                format!("{n_head_kv} does not divide {n_head} heads"),
            ));
        }
        // Gated attention projects queries and gates: 2 × heads × head dim.
        let q_key = format!(
            "2 × {} × {}",
            m.key("attention.head_count"),
            m.key("attention.key_length")
        );
        limits::product(&q_key, &[2, n_head, head_dim], MAX_WIDTH * 8)?;
        let n_rot = m.size_or("rope.dimension_count", head_dim, 0, head_dim)?;
        if n_rot % 2 != 0 {
            return Err(m.bad(
                "rope.dimension_count",
                format!("{n_rot} is odd: RoPE rotates pairs"),
            ));
        }
        let n_expert = m.size_or("expert_count", 0, 0, MAX_EXPERTS)?;
        let ff_dense = m.size_or("feed_forward_length", 0, 0, MAX_WIDTH)?;
        let n_expert_used = m.size_or("expert_used_count", 0, 0, n_expert)?;
        let ff_expert = m.size_or(
            "expert_feed_forward_length",
            ff_dense / n_expert_used.max(1),
            0,
            MAX_WIDTH,
        )?;
        let c = Config {
            n_layer,
            n_nextn,
            n_embd,
            n_vocab: common::vocab_size(file, n_embd)?,
            context_length: m.size_or("context_length", 4096, 1, MAX_CONTEXT)?,
            eps: m.positive_or("attention.layer_norm_rms_epsilon", 1e-6)?,
            n_head,
            n_head_kv,
            head_dim,
            rope_base: m.positive_or("rope.freq_base", 10000.0)?,
            n_rot,
            n_expert,
            n_expert_used,
            ff_expert,
            ff_shared: m.size_or("expert_shared_feed_forward_length", 0, 0, MAX_WIDTH)?,
            ff_dense,
            conv_kernel,
            n_k_heads,
            n_v_heads,
            head_k_dim,
            head_v_dim,
            recurrent,
        };
        limits::check_state(file, &m.key("ssm.*"), c.recurrent_state_bytes())?;
        Ok(c)
    }

    /// Bytes of f32 state the DeltaNet layers of one session hold (the
    /// conv window and the per-head state matrices), `None` on overflow.
    pub fn recurrent_state_bytes(&self) -> Option<u64> {
        let conv_dim = (2 * self.n_k_heads)
            .checked_mul(self.head_k_dim)?
            .checked_add(self.n_v_heads.checked_mul(self.head_v_dim)?)?;
        let conv = (self.conv_kernel - 1).checked_mul(conv_dim)?;
        let ssm = self
            .n_v_heads
            .checked_mul(self.head_k_dim)?
            .checked_mul(self.head_v_dim)?;
        let per_layer = (conv.checked_add(ssm)? as u64).checked_mul(4)?;
        let n = self.recurrent.iter().filter(|&&r| r).count() as u64;
        per_layer.checked_mul(n)
    }

    pub fn deltanet(&self) -> DeltaNetParams {
        DeltaNetParams {
            shape: GdnShape {
                n_k_heads: self.n_k_heads,
                n_v_heads: self.n_v_heads,
                dk: self.head_k_dim,
                dv: self.head_v_dim,
            },
            conv_kernel: self.conv_kernel,
            eps: self.eps,
        }
    }

    pub fn attention(&self) -> AttnParams {
        AttnParams {
            shape: AttnShape {
                n_head: self.n_head,
                n_kv_head: self.n_head_kv,
                head_dim: self.head_dim,
            },
            rope: Rope::new(self.n_rot, self.rope_base),
            eps: self.eps,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
        }
    }
}

/// The token mixer of one layer.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Mixer {
    Attention(AttnWeights),
    DeltaNet(DeltaNetWeights),
}

/// The feed-forward part of one layer. (Built once per layer at load, so
/// the size difference of the variants does not matter.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Ffn {
    Moe(MoeWeights),
    Dense(DenseFfn),
}

#[derive(Debug)]
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub post_norm: Vec<f32>,
    pub mixer: Mixer,
    pub ffn: Ffn,
}

/// A loaded Qwen3-Next.
#[derive(Debug)]
pub struct Qwen3Next {
    pub cfg: Config,
    pub tok_embd: Weight,
    pub output_norm: Vec<f32>,
    pub output: Weight,
    /// The trunk: what a forward runs.
    pub layers: Vec<Layer>,
    /// The NextN (MTP) blocks, a draft head each; not part of the trunk.
    pub mtp: Vec<MtpHead>,
    pub(super) attn: AttnParams,
    dn: DeltaNetParams,
}

pub(super) fn load_attention(
    f: &GgufFile,
    c: &Config,
    i: usize,
) -> Result<AttnWeights, ModelError> {
    let (d, hd) = (c.n_embd, c.head_dim);
    Ok(AttnWeights {
        wq: Weight::require(f, S::req(blk(i, "attn_q.weight"), &[d, hd * c.n_head * 2]))?,
        wk: Weight::require(f, S::req(blk(i, "attn_k.weight"), &[d, hd * c.n_head_kv]))?,
        wv: Weight::require(f, S::req(blk(i, "attn_v.weight"), &[d, hd * c.n_head_kv]))?,
        wo: Weight::require(f, S::req(blk(i, "attn_output.weight"), &[hd * c.n_head, d]))?,
        bq: None,
        bk: None,
        bv: None,
        q_norm: Some(load_f32(f, S::req(blk(i, "attn_q_norm.weight"), &[hd]))?),
        k_norm: Some(load_f32(f, S::req(blk(i, "attn_k_norm.weight"), &[hd]))?),
        gated: true,
    })
}

fn load_deltanet(
    f: &GgufFile,
    c: &Config,
    p: &DeltaNetParams,
    i: usize,
) -> Result<DeltaNetWeights, ModelError> {
    let (d, kd, vd, nv) = (c.n_embd, p.key_dim(), p.value_dim(), c.n_v_heads);
    let qkv = Weight::load(f, &S::opt(blk(i, "attn_qkv.weight"), &[d, 2 * kd + vd]))?;
    let gate = Weight::load(f, &S::opt(blk(i, "attn_gate.weight"), &[d, vd]))?;
    let in_proj = match (qkv, gate) {
        (Some(qkv), Some(gate)) => InProj::Split { qkv, gate },
        (None, None) => InProj::Fused(Weight::require(
            f,
            S::req(blk(i, "ssm_in.weight"), &[d, 2 * kd + 2 * vd]),
        )?),
        _ => return Err(ModelError::Layer {
            layer: i,
            what: "has only one of attn_qkv and attn_gate (both, or the legacy ssm_in, are needed)"
                .into(),
        }),
    };
    Ok(DeltaNetWeights {
        in_proj,
        ba: Weight::require(f, S::req(blk(i, "ssm_ba.weight"), &[d, 2 * nv]))?,
        conv: load_f32(
            f,
            S::req(blk(i, "ssm_conv1d.weight"), &[c.conv_kernel, p.conv_dim()]),
        )?,
        dt_bias: load_f32(f, S::req(blk(i, "ssm_dt.bias"), &[nv]))?,
        ssm_a: load_f32(f, S::req(blk(i, "ssm_a"), &[nv]))?,
        norm: load_f32(f, S::req(blk(i, "ssm_norm.weight"), &[c.head_v_dim]))?,
        out: Weight::require(f, S::req(blk(i, "ssm_out.weight"), &[vd, d]))?,
    })
}

pub(super) fn load_ffn(f: &GgufFile, c: &Config, i: usize) -> Result<Ffn, ModelError> {
    let (d, e, ff) = (c.n_embd, c.n_expert, c.ff_expert);
    let router = Weight::load(f, &S::opt(blk(i, "ffn_gate_inp.weight"), &[d, e]))?;
    let Some(router) = router else {
        return Ok(Ffn::Dense(common::load_dense_ffn(f, i, d, c.ff_dense)?));
    };
    if c.n_expert_used == 0 || c.n_expert_used > e {
        return Err(ModelError::Metadata {
            key: "qwen3next.expert_used_count".into(),
            what: format!("{} experts used of {e}", c.n_expert_used),
        });
    }
    let gate_up = match Weight::load(
        f,
        &S::opt(blk(i, "ffn_gate_up_exps.weight"), &[d, 2 * ff, e]),
    )? {
        Some(gu) => ExpertsGateUp::Merged(gu),
        None => ExpertsGateUp::Separate {
            gate: Weight::require(f, S::req(blk(i, "ffn_gate_exps.weight"), &[d, ff, e]))?,
            up: Weight::require(f, S::req(blk(i, "ffn_up_exps.weight"), &[d, ff, e]))?,
        },
    };
    let fs = c.ff_shared;
    let shared = if f.tensor_info(&blk(i, "ffn_up_shexp.weight")).is_some() {
        Some(common::load_dense_ffn_named(f, i, d, fs, "shexp")?)
    } else {
        None
    };
    Ok(Ffn::Moe(MoeWeights {
        router,
        gate_up,
        down: Weight::require(f, S::req(blk(i, "ffn_down_exps.weight"), &[ff, d, e]))?,
        n_expert: e,
        n_used: c.n_expert_used,
        ff,
        norm_topk: true,
        shared_gate: Weight::load(f, &S::opt(blk(i, "ffn_gate_inp_shexp.weight"), &[d]))?,
        shared,
    }))
}

impl Qwen3Next {
    pub fn load(f: &GgufFile) -> Result<Qwen3Next, ModelError> {
        let c = Config::from_gguf(f)?;
        let dn = c.deltanet();
        let d = c.n_embd;
        let mut layers = Vec::with_capacity(c.n_layer);
        for i in 0..c.n_layer {
            let mixer = if c.recurrent[i] {
                Mixer::DeltaNet(load_deltanet(f, &c, &dn, i)?)
            } else {
                Mixer::Attention(load_attention(f, &c, i)?)
            };
            layers.push(Layer {
                attn_norm: load_f32(f, S::req(blk(i, "attn_norm.weight"), &[d]))?,
                post_norm: load_f32(f, S::req(blk(i, "post_attention_norm.weight"), &[d]))?,
                mixer,
                ffn: load_ffn(f, &c, i)?,
            });
        }
        let (tok_embd, output_norm, output) = common::load_embd_head(f, d, c.n_vocab)?;
        let mtp = (c.n_layer..c.n_layer + c.n_nextn)
            .map(|b| MtpHead::load(f, &c, b))
            .collect::<Result<Vec<_>, _>>()?;
        let m = Qwen3Next {
            attn: c.attention(),
            dn,
            cfg: c,
            tok_embd,
            output_norm,
            output,
            layers,
            mtp,
        };
        m.check_types()?;
        Ok(m)
    }

    fn check_types(&self) -> Result<(), ModelError> {
        let mut ws: Vec<&Weight> = vec![&self.output];
        for h in &self.mtp {
            ws.push(&h.eh_proj);
            ws.extend(h.head.iter());
        }
        let mtp_layers = self.mtp.iter().map(|h| &h.layer);
        for l in self.layers.iter().chain(mtp_layers) {
            match &l.mixer {
                Mixer::Attention(a) => ws.extend([&a.wq, &a.wk, &a.wv, &a.wo]),
                Mixer::DeltaNet(n) => {
                    ws.extend([&n.ba, &n.out]);
                    match &n.in_proj {
                        InProj::Split { qkv, gate } => ws.extend([qkv, gate]),
                        InProj::Fused(w) => ws.push(w),
                    }
                }
            }
            match &l.ffn {
                Ffn::Dense(fd) => ws.extend([&fd.gate, &fd.up, &fd.down]),
                Ffn::Moe(m) => {
                    ws.extend([&m.router, &m.down]);
                    match &m.gate_up {
                        ExpertsGateUp::Separate { gate, up } => ws.extend([gate, up]),
                        ExpertsGateUp::Merged(w) => ws.push(w),
                    }
                    if let Some(s) = &m.shared {
                        ws.extend([&s.gate, &s.up, &s.down]);
                    }
                    ws.extend(m.shared_gate.iter());
                }
            }
        }
        ws.iter().try_for_each(|w| w.check_matmul_type())
    }

    /// The first MoE layer after layer `i`.
    fn next_moe(&self, i: usize) -> Option<(usize, &Layer)> {
        self.layers
            .iter()
            .enumerate()
            .skip(i + 1)
            .find(|(_, l)| matches!(l.ffn, Ffn::Moe(_)))
    }

    /// Where every layer's routed experts lie in the file.
    pub fn expert_layout(&self) -> Result<ExpertLayout, ModelError> {
        let layers = self
            .layers
            .iter()
            .map(|l| match &l.ffn {
                Ffn::Moe(m) => m.expert_layout().map(Some),
                Ffn::Dense(_) => Ok(None),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ExpertLayout { layers })
    }

    /// Experts a token uses per MoE layer.
    pub fn n_expert_used(&self) -> usize {
        self.cfg.n_expert_used
    }

    /// A fresh state per layer, matching its mixer.
    pub fn new_states(&self) -> Vec<LayerState> {
        self.layers
            .iter()
            .map(|l| match l.mixer {
                Mixer::Attention(_) => LayerState::Kv(Default::default()),
                Mixer::DeltaNet(_) => {
                    LayerState::Recurrent(deltanet::RecurrentState::new(&self.dn))
                }
            })
            .collect()
    }

    pub fn deltanet_params(&self) -> DeltaNetParams {
        self.dn
    }

    /// One decode token as stages: the same layer order as
    /// [`Self::forward_hidden`], for backends that record a token once and
    /// replay it (see [`crate::stages`]).
    pub fn decode_stages(&self, s: &mut dyn TokenStages) -> Result<(), ModelError> {
        let eps = self.cfg.eps;
        s.embed(&self.tok_embd)?;
        for (i, l) in self.layers.iter().enumerate() {
            s.norm(&l.attn_norm, eps, false)?;
            match &l.mixer {
                Mixer::Attention(w) => s.attention(i, w, &self.attn)?,
                Mixer::DeltaNet(w) => s.deltanet(i, w, &self.dn)?,
            }
            s.norm(&l.post_norm, eps, true)?;
            match &l.ffn {
                Ffn::Moe(m) => s.moe(i, m)?,
                Ffn::Dense(d) => s.dense_ffn(i, d)?,
            }
        }
        s.head(&self.output_norm, eps, &self.output)
    }

    /// Run the layers over `n` embedded tokens `x` at positions `pos0..`;
    /// returns the final-normed hidden states and the routes per layer.
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
        let mut all_routes = Vec::with_capacity(c.n_layer);
        for (i, (l, st)) in self.layers.iter().zip(states.iter_mut()).enumerate() {
            let t = Some(i);
            let mut h = x.clone();
            rms_norm(&mut h, &l.attn_norm, c.eps);
            trace.record(t, "attn_norm", n, &h);
            let mixed = match (&l.mixer, st) {
                (Mixer::Attention(w), LayerState::Kv(kv)) => {
                    attention::forward(ex, w, &self.attn, &h, n, pos0, kv, trace, i)?
                }
                (Mixer::DeltaNet(w), LayerState::Recurrent(rs)) => {
                    deltanet::forward(ex, w, &self.dn, &h, n, rs, trace, i)?
                }
                _ => {
                    return Err(ModelError::Layer {
                        layer: i,
                        what: "session state does not match the layer kind".into(),
                    })
                }
            };
            add_inplace(&mut x, &mixed);
            trace.record(t, "attn_residual", n, &x);
            let mut h = x.clone();
            rms_norm(&mut h, &l.post_norm, c.eps);
            trace.record(t, "attn_post_norm", n, &h);
            let y = match &l.ffn {
                Ffn::Moe(m) => {
                    let routes = m.route(ex, &h, n, trace, i)?;
                    m.demand(ex, i, &routes);
                    if n == 1 && ex.experts.is_some() && ex.pregate > 0 {
                        // Pre-gating: the next MoE layer's router on this
                        // residual, normed as that layer will norm its own.
                        if let Some((j, next)) = self.next_moe(i) {
                            let Ffn::Moe(nm) = &next.ffn else {
                                unreachable!("next_moe returns MoE layers")
                            };
                            let mut hn = x.clone();
                            rms_norm(&mut hn, &next.post_norm, c.eps);
                            nm.pregate(ex, j, &hn)?;
                        }
                    }
                    let y = m.forward_routed(ex, &h, n, &routes, trace, i)?;
                    all_routes.push(routes);
                    y
                }
                Ffn::Dense(fd) => {
                    all_routes.push(Vec::new());
                    fd.forward(ex, &h, n)?
                }
            };
            trace.record(t, "ffn_out", n, &y);
            add_inplace(&mut x, &y);
            trace.record(t, "l_out", n, &x);
        }
        rms_norm(&mut x, &self.output_norm, c.eps);
        trace.record(None, "result_norm", n, &x);
        Ok((x, all_routes))
    }
}
