//! Gated DeltaNet layers: qkv|z|ba as one projection, the fused step
//! (conv, norms, gates, state update, gated norm), the output projection.

use super::capture::Capture;
use super::proj::{f32s, mv, q8vec, upload, Proj};
use super::stages::{Builder, Op};
use super::Bufs;
use crate::device::Gpu;
use crate::error::{bail, Result};
use crate::gemv::{DeviceMatrix, Q8Vec};
use crate::ops::{self, GdnDims, GdnWeights};
use cudarc::driver::CudaSlice;
use redlite_model::blocks::deltanet::{DeltaNetParams, DeltaNetWeights, InProj, L2_EPS};

pub(super) struct GdnOp {
    pub(super) dims: GdnDims,
    /// qkv | z | ba.
    pub(super) inp: Proj,
    pub(super) w_out: DeviceMatrix,
    pub(super) conv_w: CudaSlice<f32>,
    pub(super) dt_bias: CudaSlice<f32>,
    pub(super) ssm_a: CudaSlice<f32>,
    pub(super) norm_w: CudaSlice<f32>,
    pub(super) eps: f32,
    pub(super) o: CudaSlice<f32>,
    pub(super) oq: Option<Q8Vec>,
    pub(super) ring: CudaSlice<f32>,
    pub(super) state: CudaSlice<f32>,
}

impl Builder<'_> {
    pub(super) fn deltanet(&mut self, w: &DeltaNetWeights, p: &DeltaNetParams) -> Result<Op> {
        let gpu = self.gpu;
        let s = p.shape;
        let dims = GdnDims {
            n_k: s.n_k_heads,
            n_v: s.n_v_heads,
            dk: s.dk,
            dv: s.dv,
            conv_kernel: p.conv_kernel,
        };
        dims.check()?;
        let InProj::Split { qkv, gate } = &w.in_proj else {
            bail!("the legacy fused ssm_in projection is not supported on the device yet");
        };
        let vd = dims.n_v * dims.dv;
        Ok(Op::Gdn(Box::new(GdnOp {
            inp: Proj::new(gpu, self.file, &[qkv, gate, &w.ba])?,
            w_out: upload(gpu, self.file, &w.out)?,
            conv_w: f32s(gpu, &w.conv)?,
            dt_bias: f32s(gpu, &w.dt_bias)?,
            ssm_a: f32s(gpu, &w.ssm_a)?,
            norm_w: f32s(gpu, &w.norm)?,
            eps: p.eps,
            o: gpu.stream.alloc_zeros(vd)?,
            oq: q8vec(gpu, self.int8 && dims.dv.is_multiple_of(32), vd)?,
            ring: gpu.stream.alloc_zeros(dims.conv_kernel * dims.conv_dim())?,
            state: gpu.stream.alloc_zeros(dims.state_len())?,
            dims,
        })))
    }
}

impl GdnOp {
    pub(super) fn run(&mut self, gpu: &Gpu, b: &mut Bufs, cap: &mut Capture) -> Result<()> {
        let g = self;
        cap.mark(gpu, "DeltaNet: qkv|z|ba GEMV")?;
        g.inp.run(gpu, cap.tuning, &b.h, b.hq.as_ref())?;
        cap.mark(
            gpu,
            "DeltaNet: fused step (conv, norms, gates, state, gated norm)",
        )?;
        let w = GdnWeights {
            conv_w: &g.conv_w,
            dt_bias: &g.dt_bias,
            ssm_a: &g.ssm_a,
            norm_w: &g.norm_w,
        };
        ops::gdn_step(
            gpu,
            &g.dims,
            &w,
            g.inp.part(0),
            g.inp.part(1),
            g.inp.part(2),
            &g.ring,
            &g.state,
            &g.o,
            g.oq.as_ref(),
            &b.pos,
            g.eps,
            L2_EPS,
        )?;
        cap.mark(gpu, "DeltaNet: output GEMV")?;
        mv(gpu, cap.tuning, &g.w_out, &g.o, g.oq.as_ref(), &mut b.mix)
    }
}
