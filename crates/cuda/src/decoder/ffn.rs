//! A SwiGLU FFN of whole matrices: a dense layer's, or a MoE layer's
//! shared expert.

use super::proj::{mv, q8vec, quantize, upload};
use super::CudaTuning;
use crate::device::Gpu;
use crate::error::Result;
use crate::gemv::{DeviceMatrix, Q8Vec, Q8_TYPES};
use crate::ops;
use cudarc::driver::CudaSlice;
use redlite_gguf::GgufFile;
use redlite_model::blocks::moe::DenseFfn;

pub(super) struct FfnOp {
    pub(super) gate: DeviceMatrix,
    pub(super) up: DeviceMatrix,
    pub(super) down: DeviceMatrix,
    pub(super) g: CudaSlice<f32>,
    pub(super) u: CudaSlice<f32>,
    pub(super) gq: Option<Q8Vec>,
    /// int8 mode: gate|up in one launch.
    pub(super) gu: Option<CudaSlice<f32>>,
    pub(super) out: CudaSlice<f32>,
}

impl FfnOp {
    pub(super) fn new(gpu: &Gpu, f: &GgufFile, w: &DenseFfn, int8: bool) -> Result<Self> {
        let gate = upload(gpu, f, &w.gate)?;
        let up = upload(gpu, f, &w.up)?;
        let down = upload(gpu, f, &w.down)?;
        Ok(Self {
            g: gpu.stream.alloc_zeros(gate.rows)?,
            u: gpu.stream.alloc_zeros(up.rows)?,
            out: gpu.stream.alloc_zeros(down.rows)?,
            gq: q8vec(gpu, int8, gate.rows)?,
            gu: if int8
                && Q8_TYPES.contains(&gate.layout.ty)
                && gate.layout == up.layout
                && (gate.rows, gate.cols) == (up.rows, up.cols)
            {
                Some(gpu.stream.alloc_zeros(2 * gate.rows)?)
            } else {
                None
            },
            gate,
            up,
            down,
        })
    }

    /// `out = down(SiLU(gate h) * up h)`.
    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        t: &CudaTuning,
        h: &CudaSlice<f32>,
        hq: Option<&Q8Vec>,
    ) -> Result<()> {
        let ff = self.gate.rows;
        match (&mut self.gu, hq) {
            (Some(gu), Some(hq)) if hq.n >= self.gate.cols => {
                let v = t.q8_config(&self.gate.layout, self.gate.cols)?;
                self.gate.gemv_q8_pair(&self.up, gpu, hq, gu, v)?;
                ops::swiglu(gpu, (gu, 0), (gu, ff), &self.g, self.gq.as_ref(), ff)?;
            }
            _ => {
                mv(gpu, t, &self.gate, h, hq, &mut self.g)?;
                mv(gpu, t, &self.up, h, hq, &mut self.u)?;
                ops::swiglu(gpu, (&self.g, 0), (&self.u, 0), &self.g, None, ff)?;
                quantize(gpu, &mut self.gq, &self.g)?;
            }
        }
        mv(gpu, t, &self.down, &self.g, self.gq.as_ref(), &mut self.out)
    }
}
