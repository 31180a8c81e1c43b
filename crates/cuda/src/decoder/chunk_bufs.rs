//! The batched prefill's scratch: device buffers of a chunk of up to
//! `cap` tokens, sized from the ops, and their byte count without
//! allocating them (the chunk size under a bounded cache is fitted to what
//! the memory plan set aside); and the page-locked host buffer the chunk's
//! embedding rows go up from.

use super::embed_rows::EmbedRows;
use super::ffn::FfnOp;
use super::proj::Proj;
use super::stages::Op;
use crate::device::Gpu;
use crate::error::Result;
use crate::ops;
use cudarc::driver::CudaSlice;

/// Device buffers of a chunk of up to `cap` tokens, sized from the ops.
pub(super) struct ChunkBufs {
    pub(super) cap: usize,
    pub(super) x: CudaSlice<f32>,
    pub(super) h: CudaSlice<f32>,
    pub(super) mix: CudaSlice<f32>,
    /// Every projection's outputs (group after group, rows of the group's
    /// width), reused layer after layer.
    pub(super) proj: CudaSlice<f32>,
    pub(super) q: CudaSlice<f32>,
    pub(super) o: CudaSlice<f32>,
    pub(super) conv: CudaSlice<f32>,
    pub(super) raw: CudaSlice<f32>,
    pub(super) ffn_g: CudaSlice<f32>,
    pub(super) ffn_u: CudaSlice<f32>,
    pub(super) ffn_out: CudaSlice<f32>,
    pub(super) slots: CudaSlice<u32>,
    pub(super) experts: CudaSlice<u32>,
    pub(super) weights: CudaSlice<f32>,
    /// The next MoE layer's top-k on this layer's input (pre-gating under
    /// a bounded cache; one token's worth otherwise).
    pub(super) pre_slots: CudaSlice<u32>,
    pub(super) pre_experts: CudaSlice<u32>,
    pub(super) pre_weights: CudaSlice<f32>,
    pub(super) pair_g: CudaSlice<f32>,
    pub(super) pair_u: CudaSlice<f32>,
    /// The routed experts' down outputs; in a DeltaNet layer, the WY
    /// form's blocks.
    pub(super) pair_d: CudaSlice<f32>,
    pub(super) gather: CudaSlice<i32>,
    pub(super) pair_of: CudaSlice<i32>,
    /// The tile list; under a bounded cache the resident experts' tiles,
    /// and in `tiles_staged` the staged ones.
    pub(super) tiles: CudaSlice<i32>,
    pub(super) tiles_staged: CudaSlice<i32>,
    /// One word: the tile count of a list built on the device (full
    /// residency).
    pub(super) n_tiles: CudaSlice<i32>,
    /// The normed rows as f16 (the projections' and experts' input), and
    /// a second input's (attention or DeltaNet output, SwiGLU output).
    pub(super) xh_in: CudaSlice<u16>,
    pub(super) xh_tmp: CudaSlice<u16>,
    /// Device bytes of all of the above.
    pub(super) bytes: usize,
    /// The embedding rows' host buffer (`cap * d` floats of page-locked
    /// host memory, not in `bytes`).
    pub(super) embed: EmbedRows,
}

fn proj_rows(p: &Proj) -> usize {
    p.groups.iter().map(|(m, _)| m.rows).sum()
}

/// Element counts of every buffer of [`ChunkBufs`] for `cap` tokens.
struct Sizes {
    d: usize,
    cap: usize,
    proj: usize,
    qo: usize,
    conv: usize,
    raw: usize,
    ff: usize,
    kmax: usize,
    pre: usize,
    np: usize,
    pff: usize,
    pair_d: usize,
    n_tiles: usize,
    tmp_halves: usize,
    staged_tiles: bool,
}

impl Sizes {
    fn of(ops: &[Op], d: usize, cap: usize) -> Self {
        let (mut proj, mut qo, mut conv, mut raw, mut ff, mut wy) = (0, 0, 0, 0, 0, 0);
        let (mut pairs, mut pff, mut tiles, mut kmax) = (0, 0, 0, 1);
        let (mut pregate, mut cached) = (false, false);
        let ffn = |f: &FfnOp, ff: &mut usize| *ff = (*ff).max(f.gate.rows).max(f.up.rows);
        for op in ops {
            match op {
                Op::Attn(a) => {
                    proj = proj.max(proj_rows(&a.qkv));
                    qo = qo.max(a.dims.n_head * a.dims.hd);
                }
                Op::Gdn(g) => {
                    proj = proj.max(proj_rows(&g.inp));
                    conv = conv.max(g.dims.conv_dim());
                    raw = raw.max(g.dims.n_v * g.dims.dv);
                    wy = wy.max(ops::wy_scratch_floats(&g.dims, cap));
                }
                Op::Moe(m) => {
                    proj = proj.max(proj_rows(&m.router));
                    let x = &m.x;
                    kmax = kmax.max(x.k);
                    pairs = pairs.max(x.k);
                    pff = pff.max(x.gate.rows).max(x.up.rows);
                    tiles = tiles.max(x.n_expert);
                    pregate |= m.prefetch.is_some();
                    cached |= x.cache.is_some();
                    if let Some(s) = &m.shared {
                        ffn(s, &mut ff);
                    }
                }
                Op::Dense(f) => ffn(f, &mut ff),
                Op::Norm { .. } | Op::Head { .. } => {}
            }
        }
        let np = cap * pairs;
        Self {
            d,
            cap,
            proj,
            qo,
            conv,
            raw,
            ff,
            kmax,
            pre: if pregate && cached { cap * kmax } else { 1 },
            np,
            pff,
            // The experts' down outputs and the DeltaNet WY blocks share
            // one buffer (a layer uses one or the other).
            pair_d: (np * d).max(wy),
            // The most tiles any layer's list can have (built on the host
            // or the device alike).
            n_tiles: ops::max_route_tiles(np, tiles),
            tmp_halves: (cap * qo.max(raw).max(ff)).max(np * pff),
            staged_tiles: cached,
        }
    }

    fn bytes(&self) -> usize {
        let (cap, d) = (self.cap, self.d);
        let floats = 4 * cap * d
            + cap * (self.proj + 2 * self.qo.max(self.raw) + self.conv + self.raw + 2 * self.ff)
            + cap * self.kmax
            + self.pre
            + self.np * 2 * self.pff
            + self.pair_d;
        let staged = if self.staged_tiles { self.n_tiles } else { 1 };
        let words =
            2 * cap * self.kmax + 2 * self.pre + 2 * self.np + 3 * (self.n_tiles + staged) + 1;
        let halves = cap * d + self.tmp_halves;
        4 * (floats + words) + 2 * halves
    }
}

impl ChunkBufs {
    /// Device bytes of the buffers for `cap` tokens (what [`Self::new`]
    /// allocates).
    pub(super) fn bytes_for(ops: &[Op], d: usize, cap: usize) -> usize {
        Sizes::of(ops, d, cap).bytes()
    }

    pub(super) fn new(gpu: &Gpu, ops: &[Op], d: usize, cap: usize) -> Result<Self> {
        let z = Sizes::of(ops, d, cap);
        let np = z.np;
        let s = &gpu.stream;
        let f = |n: usize| s.alloc_zeros::<f32>(n.max(1));
        let staged = if z.staged_tiles { z.n_tiles } else { 1 };
        Ok(Self {
            cap,
            x: f(cap * d)?,
            h: f(cap * d)?,
            mix: f(cap * d)?,
            proj: f(cap * z.proj)?,
            q: f(cap * z.qo)?,
            o: f(cap * z.qo.max(z.raw))?,
            conv: f(cap * z.conv)?,
            raw: f(cap * z.raw)?,
            ffn_g: f(cap * z.ff)?,
            ffn_u: f(cap * z.ff)?,
            ffn_out: f(cap * d)?,
            slots: s.alloc_zeros(cap * z.kmax)?,
            experts: s.alloc_zeros(cap * z.kmax)?,
            weights: f(cap * z.kmax)?,
            pre_slots: s.alloc_zeros(z.pre)?,
            pre_experts: s.alloc_zeros(z.pre)?,
            pre_weights: f(z.pre)?,
            pair_g: f(np * z.pff)?,
            pair_u: f(np * z.pff)?,
            pair_d: f(z.pair_d)?,
            gather: s.alloc_zeros(np.max(1))?,
            pair_of: s.alloc_zeros(np.max(1))?,
            tiles: s.alloc_zeros(3 * z.n_tiles.max(1))?,
            tiles_staged: s.alloc_zeros(3 * staged)?,
            n_tiles: s.alloc_zeros(1)?,
            xh_in: s.alloc_zeros((cap * d).max(1))?,
            xh_tmp: s.alloc_zeros(z.tmp_halves.max(1))?,
            bytes: z.bytes(),
            embed: EmbedRows::new(gpu, cap * d)?,
        })
    }
}
