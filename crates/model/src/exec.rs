//! The stages the architectures ask for, run on the CPU kernels.
//!
//! Architectures call these and never branch on the backend or on the path:
//! the reference/fast switch lives here. Reference: ggml's definition of a
//! quantized matmul (activations through the weight type's `vec_dot_type`,
//! rows dequantized, f64 dot, one thread; see
//! [`redlite_cpu::matmul_ref`]), attention in f64, the DeltaNet token by
//! token. `REDLITE_REFERENCE=f32` keeps f32 activations instead (a
//! diagnostic: it measures what activation quantization itself costs).
//! Fast: quantized rows read in place, threaded, GEMM-shaped batches,
//! chunked DeltaNet; F16/BF16 weights see activations rounded to F16/BF16
//! as ggml's do.

use crate::weights::Weight;
use crate::ModelError;
use redlite_cpu::attention::{causal_attention, causal_attention_reference, AttnShape};
use redlite_cpu::attention_tiled::causal_attention_prefill;
use redlite_cpu::deltanet::{gdn_chunked, gdn_recurrent, GdnInputs, GdnShape};
use redlite_cpu::matmul::{matmul_batched, matmul_many_batched, matmul_reference, Batching};
use redlite_cpu::matmul_ref::{matmul_reference_ggml, round_bf16, round_f16};
use redlite_cpu::{Pool, QMatrix};
use redlite_expertcache::ExpertCache;
use redlite_gguf::{GgmlType, GgufFile};

/// [`redlite_quant::ReferenceMode::F32`] (`REDLITE_REFERENCE=f32`): the
/// reference path keeps f32 activations (matmuls as `Σ w_deq · x` instead
/// of ggml's quantized-activation form).
pub fn reference_f32_activations() -> bool {
    redlite_quant::reference_mode().f32_activations()
}

/// Chunk length of the chunked DeltaNet prefill.
pub const GDN_CHUNK: usize = 64;

/// One forward's execution context.
pub struct Exec<'a> {
    pub file: &'a GgufFile,
    pub pool: &'a Pool,
    pub reference: bool,
    /// Where routed experts' bytes come from: `None`, the mapped file;
    /// else this bounded cache.
    pub experts: Option<&'a ExpertCache>,
    /// Pre-gating: how many experts of the next MoE layer to prefetch from
    /// the current hidden state (0: off; only with a cache).
    pub pregate: usize,
    /// How batches of several tokens run: GEMM kernels for prompts, the
    /// decode kernels for a verify pass (see [`Batching`]).
    pub batching: Batching,
}

impl Exec<'_> {
    /// `gate ← SiLU(gate) ⊙ up`: scalar libm on the reference path,
    /// vectorised and threaded on the fast one.
    pub fn swiglu(&self, gate: &mut [f32], up: &[f32]) {
        if self.reference {
            redlite_cpu::ops::swiglu(gate, up)
        } else {
            redlite_cpu::ops::swiglu_fast(self.pool, gate, up)
        }
    }

    /// `W · x` for `n` tokens: `n × rows` out.
    pub fn linear(&self, w: &Weight, xs: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        let m = w.matrix(self.file)?;
        self.run(&m, xs, n)
    }

    /// `W_i · x` for several weights reading the same `n` tokens (q/k/v,
    /// gate/up): on the fast path the activations are quantized once and
    /// all rows run in one parallel region (values as [`Exec::linear`]
    /// gives them one by one).
    pub fn linear_many<const N: usize>(
        &self,
        ws: [&Weight; N],
        xs: &[f32],
        n: usize,
    ) -> Result<[Vec<f32>; N], ModelError> {
        let ms = ws
            .iter()
            .map(|w| w.matrix(self.file))
            .collect::<Result<Vec<_>, _>>()?;
        let simple = !self.reference
            && ms
                .iter()
                .all(|m| !matches!(m.ty, GgmlType::F16 | GgmlType::BF16));
        if !simple {
            let mut out: [Vec<f32>; N] = core::array::from_fn(|_| Vec::new());
            for (o, m) in out.iter_mut().zip(&ms) {
                *o = self.run(m, xs, n)?;
            }
            return Ok(out);
        }
        let mut out: [Vec<f32>; N] = core::array::from_fn(|i| vec![0f32; n * ms[i].rows]);
        let mut refs: Vec<&mut [f32]> = out.iter_mut().map(|v| v.as_mut_slice()).collect();
        matmul_many_batched(self.pool, &ms, xs, n, &mut refs, self.batching)?;
        Ok(out)
    }

    /// Rows `row0..row0+nrows` of `w` (one expert of a stacked tensor).
    pub fn linear_rows(
        &self,
        w: &Weight,
        row0: usize,
        nrows: usize,
        xs: &[f32],
        n: usize,
    ) -> Result<Vec<f32>, ModelError> {
        let m = w.matrix(self.file)?.sub_rows(row0, nrows);
        self.run(&m, xs, n)
    }

    /// `M · x` for a matrix given as bytes (an expert's rows from the
    /// mapped file or from a cache slot): the same kernels as [`Exec::linear`].
    pub fn linear_matrix(&self, m: &QMatrix, xs: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        self.run(m, xs, n)
    }

    fn run(&self, m: &QMatrix, xs: &[f32], n: usize) -> Result<Vec<f32>, ModelError> {
        let mut ys = vec![0f32; n * m.rows];
        if self.reference {
            if reference_f32_activations() {
                matmul_reference(m, xs, n, &mut ys)?;
            } else {
                matmul_reference_ggml(m, xs, n, &mut ys)?;
            }
            return Ok(ys);
        }
        // ggml converts activations to F16/BF16 for F16/BF16 weights.
        let rounded: Vec<f32>;
        let xs = match m.ty {
            GgmlType::F16 => {
                rounded = xs.iter().map(|&v| round_f16(v)).collect();
                &rounded
            }
            GgmlType::BF16 => {
                rounded = xs.iter().map(|&v| round_bf16(v)).collect();
                &rounded
            }
            _ => xs,
        };
        matmul_batched(self.pool, m, xs, n, &mut ys, self.batching)?;
        Ok(ys)
    }

    /// Causal GQA attention of `n_tok` queries at positions `pos0..` over
    /// the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        shape: &AttnShape,
        q: &[f32],
        k_cache: &[f32],
        v_cache: &[f32],
        pos0: usize,
        n_tok: usize,
        scale: f32,
    ) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; q.len()];
        if self.reference {
            causal_attention_reference(shape, q, k_cache, v_cache, pos0, n_tok, scale, &mut out)?;
        } else if self.batching == Batching::AsDecode {
            // A verify pass: every token's attention as its decode step
            // computes it, bit for bit.
            causal_attention(
                self.pool, shape, q, k_cache, v_cache, pos0, n_tok, scale, &mut out,
            )?;
        } else {
            causal_attention_prefill(
                self.pool, shape, q, k_cache, v_cache, pos0, n_tok, scale, &mut out,
            )?;
        }
        Ok(out)
    }

    /// The scan token by token whatever the batch (a verify pass, whose
    /// rollback replays it; see `blocks::deltanet`).
    pub fn gdn_stepwise(
        &self,
        shape: &GdnShape,
        x: &GdnInputs,
        state: &mut [f32],
    ) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; x.v.len()];
        gdn_recurrent(self.pool, shape, x, state, &mut out)?;
        Ok(out)
    }

    /// The Gated DeltaNet scan over a batch; updates `state`.
    pub fn gdn(
        &self,
        shape: &GdnShape,
        x: &GdnInputs,
        state: &mut [f32],
    ) -> Result<Vec<f32>, ModelError> {
        let mut out = vec![0f32; x.v.len()];
        let t = x.g.len() / shape.n_v_heads.max(1);
        if self.reference || t == 1 {
            gdn_recurrent(self.pool, shape, x, state, &mut out)?;
        } else {
            gdn_chunked(self.pool, shape, x, state, &mut out, GDN_CHUNK)?;
        }
        Ok(out)
    }
}
