//! Synthetic full-size Qwen3-Next GGUF files for speed work.
//!
//! No Qwen3-Next weights can be downloaded where Red Lite is developed, so
//! speed is measured on files with the exact Qwen3-Next-80B-A3B shapes and
//! metadata, realistic quantization layouts, and random but valid blocks —
//! files that llama.cpp loads too, so both engines run the same bytes.
//!
//! * [`Plan`]: shapes ([`Shapes`]), layout ([`Layout`]), every tensor's
//!   name, shape, type and initialisation ([`spec::tensors`]), the
//!   `qwen3next.*` metadata ([`spec::metadata`]) and the tokenizer copied
//!   from a real Qwen2 GGUF (by default the committed fixture, embedded).
//! * [`Plan::fill`]: the bytes of any range of any tensor, from a
//!   counter-based generator keyed by (seed, tensor name) and counted by
//!   block, so bytes do not depend on threads, chunking or layer count
//!   (layer i of a 4-layer file equals layer i of the 48-layer file).
//! * [`write`]: generates chunks on worker threads and streams them in
//!   order through [`redlite_gguf::GgufStreamWriter`].
//! * [`report`]: expert-usage histograms from the router weights.
//!
//! Scales (why activations stay finite through 48 layers): every norm
//! weight is U(0.9, 1.1); every projection has std 1/√fan_in, so with
//! RMS-normed inputs every mixer and FFN output has RMS ≲ 1 and the
//! residual grows like √(2·layers); `ssm_a` is −U(1, 16) and `ssm_dt.bias`
//! the inverse softplus of a log-uniform dt in [1e-3, 1e-1] (the
//! initialisation of transformers' Qwen3-Next), so DeltaNet decays stay in
//! (0, 1); `ssm_conv1d` is U(−0.5, 0.5); the head has std 3/√2048, giving
//! logits with std ≈ 3. See docs/synth.md.
//!
//! Context subspace (why routing changes slowly from token to token):
//! residual dims `0..n_embd/8` ([`Shapes::ctx_dim`]) are written only by the
//! attention layers (`attn_output` rows there ×[`spec::stds::CTX_ATTN_GAIN`]
//! /√(k+1) in the k-th attention layer;
//! the embedding, `ssm_out` and the FFN down projections are zero there),
//! `attn_q_norm` is small so attention is near uniform and its output a
//! running mean over the context, and the routers weight those dims by
//! [`ROUTER_CTX`]: from the first attention layer on, consecutive tokens
//! share ~20–35% of their experts in the real forward.

pub mod blocks;
pub mod cli;
mod error;
pub mod report;
pub mod rng;
pub mod spec;
mod write;

pub use error::SynthError;
pub use spec::{Ctx, Init, Layout, Shapes, TensorSpec};
pub use write::{write, write_checked, WriteOptions, WriteStats};

use redlite_gguf::{GgmlType, GgufFile, Metadata, MetadataValue};
use rng::{tensor_key, BlockRng};
use std::collections::HashMap;
use std::path::PathBuf;

/// Most layers `--layers` accepts.
pub const MAX_LAYERS: usize = 4096;
/// Most NextN (MTP) blocks (the released Qwen3-Next has one).
pub const MAX_MTP_LAYERS: usize = 16;

/// Elements per random stream in F32 tensors.
pub const F32_UNIT: u64 = 256;

/// The tokenizer-only GGUF committed with the tokenizer crate (Qwen2
/// byte-level BPE, 151936 tokens, with chat template), embedded so the
/// `redlite` binary is self-contained.
pub static EMBEDDED_TOKENIZER: &[u8] =
    include_bytes!("../../tokenizer/tests/fixtures/qwen2-tokenizer.gguf");

/// Where the `tokenizer.*` metadata comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum TokenizerSource {
    /// The embedded Qwen2 tokenizer fixture.
    #[default]
    Embedded,
    /// Any GGUF with a 151936-token Qwen tokenizer (e.g. the demo model).
    File(PathBuf),
}

/// Router row scale for the expert of popularity rank `rank` (1-based):
/// `ROUTER_GAIN · rank^(−ROUTER_ZIPF)`. Router row e is drawn N(0, 1) and
/// multiplied by `router_row_scale(rank_e) / √n_embd`, so on a unit-RMS
/// hidden state logit e has std `router_row_scale(rank_e)`: experts with
/// wider logits land in the top 10 more often.
pub const ROUTER_GAIN: f64 = 2.0;
/// See [`ROUTER_GAIN`].
pub const ROUTER_ZIPF: f64 = 0.12;
/// Router weights on the context subspace (dims `0..ctx_dim`): std
/// `router_row_scale(rank) · ROUTER_CTX / √ctx_dim`, against
/// `router_row_scale(rank) / √n_embd` elsewhere, so routing follows the
/// slow context component written by the attention layers.
pub const ROUTER_CTX: f64 = 2.5;

pub fn router_row_scale(rank: u64) -> f64 {
    ROUTER_GAIN * (rank as f64).powf(-ROUTER_ZIPF)
}

/// Everything needed to produce a file.
#[derive(Debug, Clone)]
pub struct Plan {
    pub shapes: Shapes,
    pub layout: Layout,
    pub seed: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorSpec>,
    /// f16 super-scale bits per tensor (quantized tensors only).
    scales: Vec<u16>,
    /// Whether the context subspace is on (see [`Plan::without_context`]).
    context: bool,
}

impl Plan {
    /// The plan for `layers` layers of Qwen3-Next-80B-A3B in `layout`, with
    /// its one MTP block after them (as the released model converts).
    pub fn new(
        layout: Layout,
        layers: usize,
        seed: u64,
        tokenizer: &TokenizerSource,
    ) -> Result<Plan, SynthError> {
        Plan::with_mtp(layout, layers, 1, seed, tokenizer)
    }

    /// [`Plan::new`] with `mtp_layers` NextN (MTP) blocks (0: the file
    /// llama.cpp's converter writes with `--no-mtp`).
    pub fn with_mtp(
        layout: Layout,
        layers: usize,
        mtp_layers: usize,
        seed: u64,
        tokenizer: &TokenizerSource,
    ) -> Result<Plan, SynthError> {
        let mut shapes = Shapes::qwen3_next_80b();
        if layers == 0 || layers > MAX_LAYERS {
            return Err(SynthError::BadLayers(layers));
        }
        if mtp_layers > MAX_MTP_LAYERS {
            return Err(SynthError::BadMtpLayers(mtp_layers));
        }
        shapes.n_layer = layers;
        shapes.n_nextn = mtp_layers;
        Plan::with_shapes(shapes, layout, seed, tokenizer)
    }

    /// A plan for other shapes (tests); the tokenizer must match n_vocab.
    pub fn with_shapes(
        shapes: Shapes,
        layout: Layout,
        seed: u64,
        tokenizer: &TokenizerSource,
    ) -> Result<Plan, SynthError> {
        let mut metadata = spec::metadata(&shapes, layout, seed);
        for (k, v) in tokenizer_metadata(tokenizer, shapes.n_vocab)? {
            metadata.insert(k, v);
        }
        let tensors = spec::tensors(&shapes, layout);
        let mut unit: HashMap<GgmlType, f64> = HashMap::new();
        let mut scales = Vec::with_capacity(tensors.len());
        for t in &tensors {
            let row = t.dims[0];
            if row % t.ty.block_size() as u64 != 0 {
                return Err(SynthError::BadRow {
                    tensor: t.name.clone(),
                    ty: t.ty,
                    row,
                });
            }
            let bits = match t.init {
                Init::Random { std } if t.ty.is_quantized() => {
                    let u = match unit.get(&t.ty) {
                        Some(&u) => u,
                        None => {
                            let u = blocks::unit_rms(t.ty)?;
                            unit.insert(t.ty, u);
                            u
                        }
                    };
                    redlite_quant::f16util::f32_to_f16((std / u) as f32)
                }
                _ => 0,
            };
            scales.push(bits);
        }
        Ok(Plan {
            shapes,
            layout,
            seed,
            metadata,
            tensors,
            scales,
            context: true,
        })
    }

    /// The plan as it was before the context subspace (for before/after
    /// measurements): every tensor [`Ctx::Full`], `attn_q_norm` U(0.9, 1.1),
    /// routers without the context weights.
    pub fn without_context(mut self) -> Plan {
        self.context = false;
        for t in &mut self.tensors {
            t.ctx = Ctx::Full;
            if t.name.ends_with("attn_q_norm.weight") {
                t.init = Init::Uniform { lo: 0.9, hi: 1.1 };
            }
        }
        self
    }

    /// Dims of the context subspace in this plan (0 when off).
    pub fn ctx_dim(&self) -> u64 {
        if self.context {
            self.shapes.ctx_dim()
        } else {
            0
        }
    }

    /// Bytes of the NextN (MTP) blocks' tensors.
    pub fn mtp_bytes(&self) -> u64 {
        let prefixes: Vec<String> = (self.shapes.n_layer..self.shapes.n_block())
            .map(|b| format!("blk.{b}."))
            .collect();
        self.tensors
            .iter()
            .filter(|t| prefixes.iter().any(|p| t.name.starts_with(p.as_str())))
            .map(|t| t.n_bytes())
            .sum()
    }

    /// Total bytes of tensor data (without header and padding).
    pub fn data_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes()).sum()
    }

    /// Index of a tensor by name.
    pub fn index_of(&self, name: &str) -> Result<usize, SynthError> {
        self.tensors
            .iter()
            .position(|t| t.name == name)
            .ok_or_else(|| SynthError::NoSuchTensor(name.to_string()))
    }

    /// The generation unit of tensor `idx`: (elements per unit, bytes per unit).
    /// A unit is one block for quantized types, [`F32_UNIT`] elements for F32.
    pub fn unit(&self, idx: usize) -> (u64, u64) {
        let t = &self.tensors[idx];
        if t.ty.is_quantized() {
            (t.ty.block_size() as u64, t.ty.type_size() as u64)
        } else {
            let n = F32_UNIT.min(t.n_elements());
            (n, n * 4)
        }
    }

    /// Fill `out` with the bytes of tensor `idx` starting at unit
    /// `first_unit` (`out.len()` a whole number of units, or the tail).
    pub fn fill(&self, idx: usize, first_unit: u64, out: &mut [u8]) -> Result<(), SynthError> {
        let t = self
            .tensors
            .get(idx)
            .ok_or_else(|| SynthError::NoSuchTensor(format!("#{idx}")))?;
        let key = tensor_key(self.seed, &t.name);
        match (t.ty, t.init) {
            (ty, Init::Random { .. }) if ty.is_quantized() => {
                let ctx = self.ctx_dim();
                let (row, bs) = (t.dims[0], ty.block_size() as u64);
                let out_dim = t.dims.get(1).copied().unwrap_or(1);
                let d = self.scales[idx];
                let scale = |b: u64| -> u16 {
                    match t.ctx {
                        Ctx::Full => d,
                        Ctx::ZeroCols => {
                            if (b * bs) % row < ctx {
                                0
                            } else {
                                d
                            }
                        }
                        Ctx::RowGain(g) => {
                            if ((b * bs) / row) % out_dim < ctx {
                                let v = f64::from(redlite_quant::f16util::f16_to_f32(d)) * g;
                                redlite_quant::f16util::f32_to_f16(v as f32)
                            } else {
                                d
                            }
                        }
                    }
                };
                blocks::fill_blocks_with(ty, scale, key, first_unit, out)
            }
            (GgmlType::F32, init) => {
                self.fill_f32(t, init, key, first_unit * F32_UNIT, out);
                Ok(())
            }
            (ty, _) => Err(SynthError::NoGenerator(ty)),
        }
    }

    fn fill_f32(&self, t: &TensorSpec, init: Init, key: u64, first: u64, out: &mut [u8]) {
        let row = t.dims[0];
        let ranks = match init {
            Init::Router => Some(router_ranks(key, t.dims.get(1).copied().unwrap_or(1))),
            _ => None,
        };
        let mut rng = BlockRng::new(key, first / F32_UNIT);
        for (i, o) in out.chunks_exact_mut(4).enumerate() {
            let j = first + i as u64;
            if j.is_multiple_of(F32_UNIT) {
                rng = BlockRng::new(key, j / F32_UNIT);
            }
            let v = match init {
                Init::Normal { std } => rng.normal() * std,
                Init::Random { std } => rng.normal() * std,
                Init::Uniform { lo, hi } => rng.uniform(lo, hi),
                Init::DtBias => {
                    let dt = rng.uniform(1e-3f64.ln(), 1e-1f64.ln()).exp();
                    // inverse softplus: dt + ln(1 - e^-dt)
                    dt + (-(-dt).exp_m1()).ln()
                }
                Init::Router => {
                    let e = (j / row) as usize;
                    let rank = ranks.as_ref().map_or(1, |r| r[e.min(r.len() - 1)]);
                    let ctx = self.ctx_dim();
                    let x = rng.normal() * router_row_scale(rank);
                    if j % row < ctx {
                        x * ROUTER_CTX / (ctx as f64).sqrt()
                    } else {
                        x / (row as f64).sqrt()
                    }
                }
            };
            o.copy_from_slice(&(v as f32).to_le_bytes());
        }
    }

    /// The whole of tensor `idx` (tests and reports; tensors can be large).
    pub fn tensor_bytes(&self, idx: usize) -> Result<Vec<u8>, SynthError> {
        let mut out = vec![0u8; self.tensors[idx].n_bytes() as usize];
        self.fill(idx, 0, &mut out)?;
        Ok(out)
    }
}

/// The popularity rank (1-based) of each expert of one router, a
/// permutation drawn from the router tensor's key.
pub fn router_ranks(key: u64, n_expert: u64) -> Vec<u64> {
    let mut ranks: Vec<u64> = (1..=n_expert).collect();
    let mut rng = BlockRng::new(key, u64::MAX);
    for i in (1..ranks.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        ranks.swap(i, j);
    }
    ranks
}

/// The `tokenizer.*` key/values of a source, checked against `n_vocab`.
pub fn tokenizer_metadata(
    src: &TokenizerSource,
    n_vocab: u64,
) -> Result<Vec<(String, MetadataValue)>, SynthError> {
    let (file, name) = match src {
        TokenizerSource::Embedded => (
            GgufFile::from_bytes(EMBEDDED_TOKENIZER.to_vec())?,
            "<embedded qwen2-tokenizer.gguf>".to_string(),
        ),
        TokenizerSource::File(p) => (GgufFile::open(p)?, p.display().to_string()),
    };
    let kv: Vec<(String, MetadataValue)> = file
        .metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("tokenizer."))
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let n_tokens = kv
        .iter()
        .find(|(k, _)| k == "tokenizer.ggml.tokens")
        .and_then(|(_, v)| match v {
            MetadataValue::Array(a) => Some(a.values.len()),
            _ => None,
        })
        .ok_or_else(|| SynthError::NoTokenizer {
            source_name: name.clone(),
        })?;
    if n_tokens as u64 != n_vocab {
        return Err(SynthError::VocabMismatch {
            source_name: name,
            got: n_tokens,
            want: n_vocab as usize,
        });
    }
    Ok(kv)
}
