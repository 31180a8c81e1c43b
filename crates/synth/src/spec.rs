//! What a synthetic file holds: the Qwen3-Next-80B-A3B shapes, the
//! `qwen3next.*` metadata, and per layout the type and initialisation of
//! every tensor.

use crate::SynthError;
use redlite_gguf::{GgmlType, Metadata, MetadataArray, MetadataValue, ValueType};
use std::fmt;
use std::str::FromStr;

/// The hyper-parameters of Qwen3-Next-80B-A3B (`--layers` changes only
/// `n_layer`).
#[derive(Clone, Debug, PartialEq)]
pub struct Shapes {
    pub n_layer: usize,
    pub n_embd: u64,
    pub n_vocab: u64,
    pub context_length: u32,
    pub ff_dense: u32,
    pub n_head: u64,
    pub n_head_kv: u64,
    pub head_dim: u64,
    pub n_rot: u32,
    pub rope_base: f32,
    pub eps: f32,
    pub n_expert: u64,
    pub n_expert_used: u32,
    pub ff_expert: u64,
    pub ff_shared: u64,
    pub conv_kernel: u64,
    /// DeltaNet key heads (`ssm.group_count`).
    pub n_k_heads: u64,
    /// DeltaNet value heads (`ssm.time_step_rank`).
    pub n_v_heads: u64,
    /// DeltaNet head size (`ssm.state_size`), keys and values alike.
    pub ssm_head: u64,
    pub full_attention_interval: u32,
    /// NextN (MTP) blocks after the trunk: 1 in the released checkpoints
    /// and in what llama.cpp's converter writes from them without
    /// `--no-mtp` (block `n_layer`, counted in `block_count`).
    pub n_nextn: usize,
}

impl Shapes {
    pub fn qwen3_next_80b() -> Shapes {
        Shapes {
            n_layer: 48,
            n_embd: 2048,
            n_vocab: 151_936,
            context_length: 262_144,
            ff_dense: 5120,
            n_head: 16,
            n_head_kv: 2,
            head_dim: 256,
            n_rot: 64,
            rope_base: 1.0e7,
            eps: 1e-6,
            n_expert: 512,
            n_expert_used: 10,
            ff_expert: 512,
            ff_shared: 512,
            conv_kernel: 4,
            n_k_heads: 16,
            n_v_heads: 32,
            ssm_head: 128,
            full_attention_interval: 4,
            n_nextn: 1,
        }
    }

    /// Layer `i` is Gated DeltaNet (true) or full attention (false); the
    /// NextN blocks after the trunk are full attention.
    pub fn is_recurrent(&self, i: usize) -> bool {
        i < self.n_layer && !(i + 1).is_multiple_of((self.full_attention_interval as usize).max(1))
    }

    /// Blocks in the file: the trunk and the NextN blocks (`block_count`).
    pub fn n_block(&self) -> usize {
        self.n_layer + self.n_nextn
    }

    pub fn key_dim(&self) -> u64 {
        self.n_k_heads * self.ssm_head
    }

    /// Dims of the context subspace (residual dims `0..ctx_dim`): an
    /// eighth of `n_embd` when that is a whole number of 256-blocks, else 0
    /// (no context subspace, tiny test shapes).
    pub fn ctx_dim(&self) -> u64 {
        let c = self.n_embd / 8;
        if c > 0 && c.is_multiple_of(256) {
            c
        } else {
            0
        }
    }

    pub fn value_dim(&self) -> u64 {
        self.n_v_heads * self.ssm_head
    }

    pub fn conv_dim(&self) -> u64 {
        2 * self.key_dim() + self.value_dim()
    }
}

/// A quantization layout (which type each kind of tensor gets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Experts IQ2_XXS, dense Q4_K, token_embd Q4_K, head Q6_K (~21 GB).
    Iq2,
    /// Experts IQ1_M gate/up + IQ2_XS down, dense Q4_K, head Q6_K (~19 GB).
    Cf2,
    /// Experts Q4_K gate/up + Q6_K down, dense Q4_K, head Q6_K (~51 GB).
    Q4km,
}

impl Layout {
    pub const ALL: [Layout; 3] = [Layout::Iq2, Layout::Cf2, Layout::Q4km];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Iq2 => "iq2",
            Layout::Cf2 => "cf2",
            Layout::Q4km => "q4km",
        }
    }

    pub fn types(self) -> Types {
        let base = Types {
            embd: GgmlType::Q4_K,
            dense: GgmlType::Q4_K,
            head: GgmlType::Q6_K,
            router: GgmlType::F32,
            small: GgmlType::F32,
            gate_exps: GgmlType::IQ2_XXS,
            up_exps: GgmlType::IQ2_XXS,
            down_exps: GgmlType::IQ2_XXS,
        };
        match self {
            Layout::Iq2 => base,
            Layout::Cf2 => Types {
                gate_exps: GgmlType::IQ1_M,
                up_exps: GgmlType::IQ1_M,
                down_exps: GgmlType::IQ2_XS,
                ..base
            },
            Layout::Q4km => Types {
                gate_exps: GgmlType::Q4_K,
                up_exps: GgmlType::Q4_K,
                down_exps: GgmlType::Q6_K,
                ..base
            },
        }
    }

    /// llama.cpp's `general.file_type` for the dominant expert type.
    fn file_type(self) -> u32 {
        match self {
            Layout::Iq2 => 19,  // LLAMA_FTYPE_MOSTLY_IQ2_XXS
            Layout::Cf2 => 31,  // LLAMA_FTYPE_MOSTLY_IQ1_M
            Layout::Q4km => 15, // LLAMA_FTYPE_MOSTLY_Q4_K_M
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Layout {
    type Err = SynthError;
    fn from_str(s: &str) -> Result<Layout, SynthError> {
        Layout::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| SynthError::UnknownLayout(s.to_string()))
    }
}

/// The type of each kind of tensor in a layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Types {
    pub embd: GgmlType,
    /// Attention, DeltaNet and shared-expert projections.
    pub dense: GgmlType,
    pub head: GgmlType,
    pub router: GgmlType,
    /// Norms, `ssm_a`, `ssm_dt.bias`, `ssm_conv1d`, the shared-expert gate.
    pub small: GgmlType,
    pub gate_exps: GgmlType,
    pub up_exps: GgmlType,
    pub down_exps: GgmlType,
}

/// How a tensor's values are drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// Quantized blocks whose dequantized values have this std.
    Random { std: f64 },
    /// F32 normal with this std.
    Normal { std: f64 },
    /// F32 uniform in [lo, hi).
    Uniform { lo: f64, hi: f64 },
    /// `ssm_dt.bias`: inverse softplus of dt, dt log-uniform in [1e-3, 1e-1].
    DtBias,
    /// Router (`ffn_gate_inp`): row e (expert e) normal with std
    /// `router_row_scale(rank_e) / sqrt(n_embd)`, ranks a per-layer
    /// permutation; on the context dims (`0..ctx_dim`) std
    /// `router_row_scale(rank_e) · ROUTER_CTX / sqrt(ctx_dim)`.
    Router,
}

/// One tensor of the plan.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    /// ggml order: dims[0] is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub init: Init,
    /// How the tensor treats the context subspace of the residual
    /// (quantized tensors only; see [`Ctx`]).
    pub ctx: Ctx,
}

/// The context subspace: residual dims `0..Shapes::ctx_dim()`. Only the
/// attention layers write there (their outputs are running means over the
/// context, so slow); the routers read it strongly. See docs/synth.md.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ctx {
    /// Unchanged.
    Full,
    /// Rows are residual vectors (`token_embd`): the blocks holding the
    /// context dims are zero.
    ZeroCols,
    /// Rows are residual output dims (`dims[1]`): rows in the context
    /// subspace get their super-scale multiplied by this (0: zero rows).
    RowGain(f64),
}

impl TensorSpec {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    pub fn n_bytes(&self) -> u64 {
        self.ty.bytes_for(self.n_elements()).unwrap_or(0)
    }
}

/// Standard deviations (see docs/synth.md for the reasoning).
pub mod stds {
    /// Token embeddings.
    pub const EMBD: f64 = 0.5;
    /// Output head: logits with std ~3 on a unit-RMS hidden state.
    pub const HEAD_GAIN: f64 = 3.0;
    /// `attn_output` rows in the context subspace: std multiplied by this
    /// over √(k+1) in the k-th attention layer (k = 0, 1, …).
    pub const CTX_ATTN_GAIN: f64 = 8.0;
    /// `attn_q_norm`: small, so attention is near uniform (logit std
    /// ≈ 0.08) and its output a running mean over the context.
    pub const Q_NORM: super::Init = super::Init::Uniform { lo: 0.05, hi: 0.1 };
}

/// All tensors of a file, in file order.
pub fn tensors(s: &Shapes, layout: Layout) -> Vec<TensorSpec> {
    let t = layout.types();
    let d = s.n_embd;
    let inv = |fan_in: u64| 1.0 / (fan_in as f64).sqrt();
    let mut v = Vec::new();
    let mut add = |name: String, dims: &[u64], ty: GgmlType, init: Init| {
        v.push(TensorSpec {
            name,
            dims: dims.to_vec(),
            ty,
            init,
            ctx: Ctx::Full,
        })
    };

    let norm = Init::Uniform { lo: 0.9, hi: 1.1 };
    add(
        "token_embd.weight".into(),
        &[d, s.n_vocab],
        t.embd,
        Init::Random { std: stds::EMBD },
    );
    for i in 0..s.n_block() {
        let b = |n: &str| format!("blk.{i}.{n}");
        add(b("attn_norm.weight"), &[d], t.small, norm);
        if s.is_recurrent(i) {
            let (kd, vd, nv) = (s.key_dim(), s.value_dim(), s.n_v_heads);
            add(
                b("attn_qkv.weight"),
                &[d, 2 * kd + vd],
                t.dense,
                Init::Random { std: inv(d) },
            );
            add(
                b("attn_gate.weight"),
                &[d, vd],
                t.dense,
                Init::Random { std: inv(d) },
            );
            add(
                b("ssm_conv1d.weight"),
                &[s.conv_kernel, s.conv_dim()],
                t.small,
                Init::Uniform { lo: -0.5, hi: 0.5 },
            );
            add(b("ssm_dt.bias"), &[nv], t.small, Init::DtBias);
            add(
                b("ssm_a"),
                &[nv],
                t.small,
                Init::Uniform {
                    lo: -16.0,
                    hi: -1.0,
                },
            );
            add(
                b("ssm_ba.weight"),
                &[d, 2 * nv],
                t.dense,
                Init::Random { std: inv(d) },
            );
            add(b("ssm_norm.weight"), &[s.ssm_head], t.small, norm);
            add(
                b("ssm_out.weight"),
                &[vd, d],
                t.dense,
                Init::Random { std: inv(vd) },
            );
        } else {
            let hd = s.head_dim;
            add(
                b("attn_q.weight"),
                &[d, hd * s.n_head * 2],
                t.dense,
                Init::Random { std: inv(d) },
            );
            add(
                b("attn_k.weight"),
                &[d, hd * s.n_head_kv],
                t.dense,
                Init::Random { std: inv(d) },
            );
            add(
                b("attn_v.weight"),
                &[d, hd * s.n_head_kv],
                t.dense,
                Init::Random { std: inv(d) },
            );
            add(
                b("attn_output.weight"),
                &[hd * s.n_head, d],
                t.dense,
                Init::Random {
                    std: inv(hd * s.n_head),
                },
            );
            add(b("attn_q_norm.weight"), &[hd], t.small, stds::Q_NORM);
            add(b("attn_k_norm.weight"), &[hd], t.small, norm);
        }
        add(b("post_attention_norm.weight"), &[d], t.small, norm);
        let (e, ff, fs) = (s.n_expert, s.ff_expert, s.ff_shared);
        add(b("ffn_gate_inp.weight"), &[d, e], t.router, Init::Router);
        add(
            b("ffn_gate_exps.weight"),
            &[d, ff, e],
            t.gate_exps,
            Init::Random { std: inv(d) },
        );
        add(
            b("ffn_up_exps.weight"),
            &[d, ff, e],
            t.up_exps,
            Init::Random { std: inv(d) },
        );
        add(
            b("ffn_down_exps.weight"),
            &[ff, d, e],
            t.down_exps,
            Init::Random { std: inv(ff) },
        );
        add(
            b("ffn_gate_inp_shexp.weight"),
            &[d],
            t.small,
            Init::Normal { std: inv(d) },
        );
        add(
            b("ffn_gate_shexp.weight"),
            &[d, fs],
            t.dense,
            Init::Random { std: inv(d) },
        );
        add(
            b("ffn_up_shexp.weight"),
            &[d, fs],
            t.dense,
            Init::Random { std: inv(d) },
        );
        add(
            b("ffn_down_shexp.weight"),
            &[fs, d],
            t.dense,
            Init::Random { std: inv(fs) },
        );
        if i >= s.n_layer {
            // The NextN (MTP) block's own tensors (llama.cpp's names): the
            // projection of [enorm(embedding) ‖ hnorm(hidden)] and its
            // norms; it shares token_embd and output (no embed_tokens or
            // shared_head_head, as in the 80B checkpoints).
            add(
                b("nextn.eh_proj.weight"),
                &[2 * d, d],
                t.dense,
                Init::Random { std: inv(2 * d) },
            );
            add(b("nextn.enorm.weight"), &[d], t.small, norm);
            add(b("nextn.hnorm.weight"), &[d], t.small, norm);
            add(b("nextn.shared_head_norm.weight"), &[d], t.small, norm);
        }
    }
    add("output_norm.weight".into(), &[d], t.small, norm);
    add(
        "output.weight".into(),
        &[d, s.n_vocab],
        t.head,
        Init::Random {
            std: stds::HEAD_GAIN * inv(d),
        },
    );
    if s.ctx_dim() > 0 {
        for t in &mut v {
            let n = t.name.as_str();
            t.ctx = if n == "token_embd.weight" {
                Ctx::ZeroCols
            } else if n.ends_with(".attn_output.weight") {
                // The k-th attention layer (k = layer / 4): gain 8/√(k+1), so
                // that the context part, which adds up coherently over the
                // attention layers, keeps pace with the √(2·layers) residual.
                let layer: f64 = n
                    .trim_start_matches("blk.")
                    .split('.')
                    .next()
                    .and_then(|x| x.parse().ok())
                    .unwrap_or(0.0);
                let k = (layer / s.full_attention_interval as f64).floor();
                Ctx::RowGain(stds::CTX_ATTN_GAIN / (k + 1.0).sqrt())
            } else if n.ends_with(".ssm_out.weight")
                || n.ends_with(".ffn_down_exps.weight")
                || n.ends_with(".ffn_down_shexp.weight")
            {
                Ctx::RowGain(0.0)
            } else {
                Ctx::Full
            };
        }
    }
    v
}

/// The `general.*` and `qwen3next.*` key/values (no tokenizer).
pub fn metadata(s: &Shapes, layout: Layout, seed: u64) -> Metadata {
    let mut m = Metadata::new();
    let a = |k: &str| format!("qwen3next.{k}");
    m.insert("general.architecture", "qwen3next");
    m.insert(
        "general.name",
        format!(
            "redlite-synth Qwen3-Next-80B-A3B shapes, {} layers + {} MTP, layout {layout}, seed {seed}",
            s.n_layer, s.n_nextn
        )
        .as_str(),
    );
    m.insert("general.file_type", layout.file_type());
    m.insert("general.quantization_version", 2u32);
    m.insert(a("block_count"), s.n_block() as u32);
    if s.n_nextn > 0 {
        m.insert(a("nextn_predict_layers"), s.n_nextn as u32);
    }
    m.insert(a("context_length"), s.context_length);
    m.insert(a("embedding_length"), s.n_embd as u32);
    m.insert(a("feed_forward_length"), s.ff_dense);
    m.insert(a("attention.head_count"), s.n_head as u32);
    m.insert(a("attention.head_count_kv"), s.n_head_kv as u32);
    m.insert(a("attention.key_length"), s.head_dim as u32);
    m.insert(a("attention.value_length"), s.head_dim as u32);
    m.insert(a("attention.layer_norm_rms_epsilon"), s.eps);
    m.insert(a("rope.freq_base"), s.rope_base);
    m.insert(a("rope.dimension_count"), s.n_rot);
    m.insert(a("expert_count"), s.n_expert as u32);
    m.insert(a("expert_used_count"), s.n_expert_used);
    m.insert(a("expert_feed_forward_length"), s.ff_expert as u32);
    m.insert(a("expert_shared_feed_forward_length"), s.ff_shared as u32);
    m.insert(a("ssm.conv_kernel"), s.conv_kernel as u32);
    m.insert(a("ssm.inner_size"), s.value_dim() as u32);
    m.insert(a("ssm.state_size"), s.ssm_head as u32);
    m.insert(a("ssm.time_step_rank"), s.n_v_heads as u32);
    m.insert(a("ssm.group_count"), s.n_k_heads as u32);
    m.insert(a("full_attention_interval"), s.full_attention_interval);
    m.insert(
        a("attention.recurrent_layers"),
        MetadataValue::Array(MetadataArray::new(
            ValueType::Bool,
            (0..s.n_block())
                .map(|i| MetadataValue::Bool(s.is_recurrent(i)))
                .collect(),
        )),
    );
    m.insert("redlite.synth.layout", layout.name());
    m.insert("redlite.synth.seed", seed);
    m
}
