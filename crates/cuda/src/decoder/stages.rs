//! The ops of a token, built from the architecture's stages
//! ([`TokenStages`]): each stage uploads its weights, allocates its state
//! and becomes one `Op`; `Op::run` records its launches.

use super::attn::AttnOp;
use super::capture::{Capture, Phase};
use super::ffn::FfnOp;
use super::gdn::GdnOp;
use super::moe::MoeOp;
use super::proj::{f32s, mv, upload};
use super::{Bufs, ExpertCacheOptions};
use crate::device::Gpu;
use crate::error::{ensure, CudaError, Result};
use crate::expert_cache::HostExperts;
use crate::gemv::{DeviceMatrix, Q8_TYPES};
use crate::ops::{self, KvType};
use cudarc::driver::CudaSlice;
use redlite_gguf::GgufFile;
use redlite_model::blocks::attention::{AttnParams, AttnWeights};
use redlite_model::blocks::deltanet::{DeltaNetParams, DeltaNetWeights};
use redlite_model::blocks::moe::{DenseFfn, MoeWeights};
use redlite_model::stages::TokenStages;
use redlite_model::weights::Weight;
use redlite_model::ModelError;

/// One recorded stage.
pub(super) enum Op {
    Norm {
        w: CudaSlice<f32>,
        eps: f32,
        add_mix: bool,
    },
    Attn(Box<AttnOp>),
    Gdn(Box<GdnOp>),
    Moe(Box<MoeOp>),
    Dense(Box<FfnOp>),
    Head {
        /// None: the previous MoE op already wrote the normed h.
        norm: Option<CudaSlice<f32>>,
        eps: f32,
        w: DeviceMatrix,
    },
}

impl Op {
    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        b: &mut Bufs,
        cap: &mut Capture,
        phase: Phase,
    ) -> Result<()> {
        let d = b.x.len();
        ensure!(
            phase == Phase::All || matches!(self, Op::Moe(_)),
            "only a MoE op runs in two halves"
        );
        match self {
            Op::Norm { w, eps, add_mix } => {
                cap.mark(gpu, "RMSNorm (+ residual add)")?;
                let res = add_mix.then_some(&b.mix);
                ops::rms_norm(
                    gpu,
                    &b.x,
                    res,
                    w,
                    Some(&b.h),
                    b.hq.as_ref(),
                    1,
                    d,
                    *eps,
                    false,
                )
            }
            Op::Attn(a) => a.run(gpu, b, cap),
            Op::Gdn(g) => g.run(gpu, b, cap),
            Op::Moe(m) => m.run(gpu, b, cap, phase),
            Op::Dense(f) => {
                cap.mark(gpu, "dense FFN")?;
                f.run(gpu, cap.tuning, &b.h, b.hq.as_ref())?;
                ops::add_inplace(gpu, &b.x, &f.out, d)
            }
            Op::Head { norm, eps, w } => {
                cap.mark(gpu, "head: RMSNorm + output GEMV")?;
                let hq = if head_int8(w) { b.hq.as_ref() } else { None };
                if let Some(n) = norm {
                    ops::rms_norm(gpu, &b.x, None, n, Some(&b.h), hq, 1, d, *eps, false)?;
                }
                mv(gpu, cap.tuning, w, &b.h, hq, &mut b.logits)
            }
        }
    }
}

/// Whether the output head runs on int8 activations in int8 mode: when its
/// format has an int8 kernel (Q6_K in the synthetic layouts), as the CPU
/// fast path quantizes the activations of its head too. The norm before the
/// head then also writes the quantized h.
pub(super) fn head_int8(w: &DeviceMatrix) -> bool {
    Q8_TYPES.contains(&w.layout.ty) && w.cols.is_multiple_of(32)
}

/// Builds the ops from the architecture's stages.
pub(super) struct Builder<'a> {
    pub(super) gpu: &'a Gpu,
    pub(super) file: &'a GgufFile,
    pub(super) ctx: usize,
    pub(super) nsplit: Option<usize>,
    pub(super) int8: bool,
    pub(super) kv: KvType,
    pub(super) cache: Option<ExpertCacheOptions>,
    pub(super) n_moe: usize,
    /// Pinned staging sets for misses read from the file, one per distinct
    /// (gate, up, down) stride triple.
    pub(super) staging: Vec<([usize; 3], [HostExperts; 3])>,
    pub(super) ops: Vec<Op>,
    pub(super) embd: Option<Weight>,
    pub(super) n_vocab: usize,
}

pub(super) fn be(e: CudaError) -> ModelError {
    ModelError::Backend {
        backend: "cuda",
        what: format!("{e:#}"),
    }
}

impl TokenStages for Builder<'_> {
    fn embed(&mut self, w: &Weight) -> Result<(), ModelError> {
        self.embd = Some(w.clone());
        Ok(())
    }

    fn norm(&mut self, w: &[f32], eps: f32, add_mix: bool) -> Result<(), ModelError> {
        let w = f32s(self.gpu, w).map_err(be)?;
        self.ops.push(Op::Norm { w, eps, add_mix });
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        w: &AttnWeights,
        p: &AttnParams,
    ) -> Result<(), ModelError> {
        let op =
            Builder::attention(self, w, p).map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(op);
        Ok(())
    }

    fn deltanet(
        &mut self,
        layer: usize,
        w: &DeltaNetWeights,
        p: &DeltaNetParams,
    ) -> Result<(), ModelError> {
        let op =
            Builder::deltanet(self, w, p).map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(op);
        Ok(())
    }

    fn moe(&mut self, layer: usize, w: &MoeWeights) -> Result<(), ModelError> {
        let op = Builder::moe(self, w).map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(op);
        Ok(())
    }

    fn dense_ffn(&mut self, layer: usize, w: &DenseFfn) -> Result<(), ModelError> {
        let op = FfnOp::new(self.gpu, self.file, w, self.int8)
            .map_err(|e| be(e.context(format!("layer {layer}"))))?;
        self.ops.push(Op::Dense(Box::new(op)));
        Ok(())
    }

    fn head(&mut self, norm: &[f32], eps: f32, w: &Weight) -> Result<(), ModelError> {
        let norm = f32s(self.gpu, norm).map_err(be)?;
        let w = upload(self.gpu, self.file, w).map_err(be)?;
        self.n_vocab = w.rows;
        self.ops.push(Op::Head {
            norm: Some(norm),
            eps,
            w,
        });
        Ok(())
    }
}
