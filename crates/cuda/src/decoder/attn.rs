//! Attention layers: q|k|v as one projection, the prep (q/k norm, RoPE,
//! KV append), split-K attention and its merge, the output projection.

use super::capture::Capture;
use super::proj::{f32s, mv, q8vec, upload, Proj};
use super::stages::{Builder, Op};
use super::Bufs;
use crate::device::Gpu;
use crate::error::{bail, Result};
use crate::gemv::{DeviceMatrix, Q8Vec};
use crate::ops::{self, AttnDims, AttnScratch, KvCache};
use cudarc::driver::CudaSlice;
use redlite_model::blocks::attention::{AttnParams, AttnWeights};

pub(super) struct AttnOp {
    pub(super) dims: AttnDims,
    /// q_full | k | v.
    pub(super) qkv: Proj,
    pub(super) wo: DeviceMatrix,
    pub(super) norms: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub(super) inv_freq: CudaSlice<f64>,
    pub(super) scale: f32,
    pub(super) eps: f32,
    pub(super) q: CudaSlice<f32>,
    pub(super) o: CudaSlice<f32>,
    pub(super) oq: Option<Q8Vec>,
    pub(super) kv: KvCache,
    pub(super) scratch: AttnScratch,
}

impl Builder<'_> {
    pub(super) fn attention(&mut self, w: &AttnWeights, p: &AttnParams) -> Result<Op> {
        let gpu = self.gpu;
        let s = p.shape;
        let dims = AttnDims {
            n_head: s.n_head,
            n_kv: s.n_kv_head,
            hd: s.head_dim,
            n_rot: p.rope.n_rot(),
            gated: w.gated,
        };
        dims.check()?;
        let norms = match (&w.q_norm, &w.k_norm) {
            (Some(q), Some(k)) => Some((f32s(gpu, q)?, f32s(gpu, k)?)),
            (None, None) => None,
            _ => bail!("only one of the q/k norms is present"),
        };
        let (nh, nkv, hd) = (dims.n_head, dims.n_kv, dims.hd);
        let nsplit = self
            .nsplit
            .unwrap_or_else(|| ops::default_nsplit(&dims, self.kv, gpu.sms));
        Ok(Op::Attn(Box::new(AttnOp {
            qkv: Proj::with_biases(
                gpu,
                self.file,
                &[&w.wq, &w.wk, &w.wv],
                &[w.bq.as_deref(), w.bk.as_deref(), w.bv.as_deref()],
            )?,
            wo: upload(gpu, self.file, &w.wo)?,
            norms,
            inv_freq: gpu.stream.clone_htod(p.rope.inv_freq())?,
            scale: p.scale,
            eps: p.eps,
            q: gpu.stream.alloc_zeros(nh * hd)?,
            o: gpu.stream.alloc_zeros(nh * hd)?,
            oq: q8vec(gpu, self.int8, nh * hd)?,
            kv: KvCache::new(gpu, self.kv, self.ctx * nkv * hd)?,
            scratch: AttnScratch::new(gpu, &dims, nsplit)?,
            dims,
        })))
    }
}

impl AttnOp {
    pub(super) fn run(&mut self, gpu: &Gpu, b: &mut Bufs, cap: &mut Capture) -> Result<()> {
        let a = self;
        cap.mark(gpu, "attention: q|k|v GEMV")?;
        a.qkv.run(gpu, cap.tuning, &b.h, b.hq.as_ref())?;
        cap.mark(
            gpu,
            "attention: q/k norm + RoPE + KV append, split-K attention, merge",
        )?;
        let norms = a.norms.as_ref().map(|(q, k)| (q, k));
        let (qf, k, v) = (a.qkv.part(0), a.qkv.part(1), a.qkv.part(2));
        ops::attn_prep(
            gpu,
            &a.dims,
            qf,
            k,
            v,
            norms,
            &a.inv_freq,
            &b.pos,
            &a.q,
            &a.kv,
            a.eps,
        )?;
        let gate = a.dims.gated.then_some(qf);
        ops::attention(
            gpu,
            &a.dims,
            &a.q,
            &a.kv,
            &b.pos,
            &a.scratch,
            gate,
            &a.o,
            a.oq.as_ref(),
            a.scale,
        )?;
        cap.mark(gpu, "attention: output GEMV")?;
        mv(gpu, cap.tuning, &a.wo, &a.o, a.oq.as_ref(), &mut b.mix)
    }
}
