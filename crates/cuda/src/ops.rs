//! Launch wrappers of the decode kernels other than the GEMVs: RMSNorm,
//! the attention input (norm + RoPE + KV append), split-K grouped decode
//! attention and its merge, the fused Gated DeltaNet step, the router
//! top-k and the element-wise helpers. Each checks the sizes it can see and
//! passes raw device pointers (the kernels take plain pointers; buffers
//! live on the one stream of [`Gpu`], so no cross-stream ordering is
//! needed, see `device.rs`).
//!
//! The float64 references of every kernel are in [`crate::reference`].

use crate::device::Gpu;
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};

/// The raw device address of a buffer (0 for `None`: a null pointer).
pub fn dptr<T>(gpu: &Gpu, s: Option<&CudaSlice<T>>) -> u64 {
    match s {
        Some(s) => s.device_ptr(&gpu.stream).0,
        None => 0,
    }
}

/// A vector inside a buffer: the buffer and the offset (in floats) where
/// the vector starts (several GEMV outputs share one buffer when their
/// matrices are uploaded as one).
pub type At<'a> = (&'a CudaSlice<f32>, usize);

/// The raw address of `a` (checked to hold `n` floats).
fn at_ptr(gpu: &Gpu, a: At, n: usize) -> Result<u64> {
    ensure!(
        a.0.len() >= a.1 + n,
        "buffer of {} floats holds no {n} at {}",
        a.0.len(),
        a.1
    );
    Ok(dptr(gpu, Some(a.0)) + 4 * a.1 as u64)
}

/// Raw pointers of an int8 activation buffer (null, null for `None`).
fn q8ptrs(gpu: &Gpu, q8: Option<&Q8Vec>) -> (u64, u64) {
    (dptr(gpu, q8.map(|q| &q.q)), dptr(gpu, q8.map(|q| &q.d)))
}

fn cfg(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn i32_of(n: usize) -> Result<i32> {
    ensure!(n <= i32::MAX as usize, "size {n} exceeds i32");
    Ok(n as i32)
}

/// `out[r] = x[r] * s * w` per row of `d` (rows = x.len() / d); with `res`,
/// `x += res` first (written back). `out` None: in place. `q8`: the output
/// also quantized for the int8 kernels (one launch for both).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    res: Option<&CudaSlice<f32>>,
    w: &CudaSlice<f32>,
    out: Option<&CudaSlice<f32>>,
    q8: Option<&Q8Vec>,
    rows: usize,
    d: usize,
    eps: f32,
    add_one: bool,
) -> Result<()> {
    ensure!(rows >= 1 && d >= 1 && x.len() >= rows * d && w.len() >= d);
    ensure!(q8.is_none_or(|q| q.n >= rows * d && d.is_multiple_of(32)));
    ensure!(res.is_none_or(|r| r.len() >= rows * d));
    ensure!(out.is_none_or(|o| o.len() >= rows * d));
    let (xp, rp, wp) = (dptr(gpu, Some(x)), dptr(gpu, res), dptr(gpu, Some(w)));
    let op = out.map_or(xp, |o| dptr(gpu, Some(o)));
    let (d_i, one) = (i32_of(d)?, add_one as i32);
    let (qp, qdp) = (dptr(gpu, q8.map(|q| &q.q)), dptr(gpu, q8.map(|q| &q.d)));
    // 8 values a thread in registers where the shape allows (norm.cu).
    let (name, block) = match v8_block(d) {
        Some(b) => ("rms_norm_v8", b),
        None => ("rms_norm", if d >= 1024 { 1024 } else { 256 }),
    };
    // SAFETY: rms_norm(float* x, const float* res, const float* w, float*
    // out, i8* q, float* qd, int d, float eps, int add_one), rms_norm_v8
    // the same with 8 * block >= d and d % 8 == 0 (v8_block); x, res, out
    // hold rows*d floats, w d floats, q rows*d bytes and qd rows*d/32
    // floats with d % 32 == 0 (checked above).
    unsafe {
        gpu.launch(
            name,
            cfg((rows as u32, 1), block),
            &[&xp, &rp, &wp, &op, &qp, &qdp, &d_i, &eps, &one],
        )
    }
}

/// The block of the 8-values-a-thread kernels (`rms_norm_v8`,
/// `moe_combine_norm_v8`) for rows of `d`: whole warps covering d, when d
/// is whole 16-byte pairs and fits their launch bound (512 threads).
pub fn v8_block(d: usize) -> Option<u32> {
    (d.is_multiple_of(8) && d <= 8 * 512).then(|| (d / 8).div_ceil(32).max(1) as u32 * 32)
}

/// Shapes of one attention layer on the device.
#[derive(Clone, Copy, Debug)]
pub struct AttnDims {
    pub n_head: usize,
    pub n_kv: usize,
    pub hd: usize,
    pub n_rot: usize,
    pub gated: bool,
}

impl AttnDims {
    /// Query heads per block of `attn_split` (the largest power of two
    /// <= 8 dividing the GQA group).
    pub fn heads_per_block(&self) -> usize {
        let g = self.n_head / self.n_kv;
        [8, 4, 2, 1]
            .into_iter()
            .find(|b| g.is_multiple_of(*b))
            .unwrap_or(1)
    }

    pub fn check(&self) -> Result<()> {
        ensure!(
            self.n_kv >= 1 && self.n_head.is_multiple_of(self.n_kv),
            "attention: {} heads, {} KV heads",
            self.n_head,
            self.n_kv
        );
        ensure!(
            matches!(self.hd, 64 | 128 | 256),
            "attention: head_dim {} (the device kernels take 64, 128, 256)",
            self.hd
        );
        ensure!(self.n_rot <= self.hd && self.n_rot.is_multiple_of(2));
        Ok(())
    }
}

/// Element type of the KV cache. F16 halves the bytes the decode attention
/// reads (its cost grows with depth: ~134 MB a layer per token at 32K in
/// f32); each K and V value is rounded to nearest even once, when stored,
/// and widened exactly when read, so everything else stays f32 math.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
}

impl KvType {
    /// Bytes of one cached value.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }

    /// The default for an activation mode: f16 with int8 activations (the
    /// fast path, llama.cpp's default KV type too); f32 with f32
    /// activations, whose parity path stays bit-close to the CPU reference.
    pub fn default_for(int8: bool) -> Self {
        if int8 {
            KvType::F16
        } else {
            KvType::F32
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvType::F32 => "f32",
            KvType::F16 => "f16",
        }
    }

    /// `kernel` for this cache type: the f16 kernels carry `_kvf16` after
    /// the family (`attn_prep_kvf16`, `attn_split_kvf16_g8_d8`).
    pub fn kernel(self, family: &str, rest: &str) -> String {
        match self {
            KvType::F32 => format!("{family}{rest}"),
            KvType::F16 => format!("{family}_kvf16{rest}"),
        }
    }
}

/// `x` rounded to the nearest f16 (ties to even; overflow to infinity),
/// as the f16 cache stores it (`cvt.rn.f16.f32`), widened back exactly.
pub fn f16_round(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// K and V caches, `[positions][n_kv][hd]` each, of one element type (f16
/// as its bits: the kernels take raw pointers).
pub enum KvCache {
    F32 {
        k: CudaSlice<f32>,
        v: CudaSlice<f32>,
    },
    F16 {
        k: CudaSlice<u16>,
        v: CudaSlice<u16>,
    },
}

impl KvCache {
    /// Zeroed caches of `n` values each.
    pub fn new(gpu: &Gpu, ty: KvType, n: usize) -> Result<Self> {
        Ok(match ty {
            KvType::F32 => KvCache::F32 {
                k: gpu.stream.alloc_zeros(n)?,
                v: gpu.stream.alloc_zeros(n)?,
            },
            KvType::F16 => KvCache::F16 {
                k: gpu.stream.alloc_zeros(n)?,
                v: gpu.stream.alloc_zeros(n)?,
            },
        })
    }

    /// Caches holding `k` and `v` (rounded to f16 for F16): selftest, bench.
    pub fn upload(gpu: &Gpu, ty: KvType, k: &[f32], v: &[f32]) -> Result<Self> {
        ensure!(k.len() == v.len());
        let bits = |x: &[f32]| -> Vec<u16> {
            x.iter()
                .map(|&a| half::f16::from_f32(a).to_bits())
                .collect()
        };
        Ok(match ty {
            KvType::F32 => KvCache::F32 {
                k: gpu.stream.clone_htod(k)?,
                v: gpu.stream.clone_htod(v)?,
            },
            KvType::F16 => KvCache::F16 {
                k: gpu.stream.clone_htod(&bits(k))?,
                v: gpu.stream.clone_htod(&bits(v))?,
            },
        })
    }

    /// (k, v) widened to f32 (exact for f16): selftest.
    pub fn download(&self, gpu: &Gpu) -> Result<(Vec<f32>, Vec<f32>)> {
        gpu.sync()?;
        let wide = |x: Vec<u16>| -> Vec<f32> {
            x.into_iter()
                .map(|b| half::f16::from_bits(b).to_f32())
                .collect()
        };
        Ok(match self {
            KvCache::F32 { k, v } => (gpu.stream.clone_dtoh(k)?, gpu.stream.clone_dtoh(v)?),
            KvCache::F16 { k, v } => (
                wide(gpu.stream.clone_dtoh(k)?),
                wide(gpu.stream.clone_dtoh(v)?),
            ),
        })
    }

    pub fn ty(&self) -> KvType {
        match self {
            KvCache::F32 { .. } => KvType::F32,
            KvCache::F16 { .. } => KvType::F16,
        }
    }

    /// Values in each of K and V.
    pub fn len(&self) -> usize {
        match self {
            KvCache::F32 { k, .. } => k.len(),
            KvCache::F16 { k, .. } => k.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Device bytes of K and V together.
    pub fn bytes(&self) -> usize {
        2 * self.len() * self.ty().bytes()
    }

    /// Raw addresses of K and V.
    fn ptrs(&self, gpu: &Gpu) -> (u64, u64) {
        match self {
            KvCache::F32 { k, v } => (dptr(gpu, Some(k)), dptr(gpu, Some(v))),
            KvCache::F16 { k, v } => (dptr(gpu, Some(k)), dptr(gpu, Some(v))),
        }
    }
}

/// Attention input for one token at position `*pos`: per head RMSNorm
/// (weights optional) and RoPE of q (from `q_full`, per head `hd` query
/// values then, gated, `hd` gate values) into `q_out`; k normed, rotated and
/// v appended to the caches at `pos` (`[ctx][n_kv][hd]`).
#[allow(clippy::too_many_arguments)]
pub fn attn_prep(
    gpu: &Gpu,
    a: &AttnDims,
    q_full: At,
    k: At,
    v: At,
    norms: Option<(&CudaSlice<f32>, &CudaSlice<f32>)>,
    inv_freq: &CudaSlice<f64>,
    pos: &CudaSlice<i32>,
    q_out: &CudaSlice<f32>,
    kv: &KvCache,
    eps: f32,
) -> Result<()> {
    a.check()?;
    let (nh, nkv, hd) = (a.n_head, a.n_kv, a.hd);
    ensure!(q_out.len() >= nh * hd);
    let (qfp, kp, vp) = (
        at_ptr(gpu, q_full, nh * hd * (1 + a.gated as usize))?,
        at_ptr(gpu, k, nkv * hd)?,
        at_ptr(gpu, v, nkv * hd)?,
    );
    ensure!(kv.len().is_multiple_of(nkv * hd));
    let (kcp, vcp) = kv.ptrs(gpu);
    ensure!(inv_freq.len() >= a.n_rot / 2 && !pos.is_empty());
    ensure!(norms.is_none_or(|(q, k)| q.len() >= hd && k.len() >= hd));
    let args: [u64; 10] = [
        qfp,
        kp,
        vp,
        dptr(gpu, norms.map(|n| n.0)),
        dptr(gpu, norms.map(|n| n.1)),
        dptr(gpu, Some(inv_freq)),
        dptr(gpu, Some(pos)),
        dptr(gpu, Some(q_out)),
        kcp,
        vcp,
    ];
    let (n_rot, nh_i, nkv_i, hd_i, gated) = (
        a.n_rot as i32,
        nh as i32,
        nkv as i32,
        hd as i32,
        a.gated as i32,
    );
    let name = kv.ty().kernel("attn_prep", "");
    // SAFETY: attn_prep[_kvf16](q_full, k, v, q_norm, k_norm, inv_freq,
    // n_rot, pos, q_out, k_cache, v_cache, n_head, n_kv, hd, gated, eps),
    // the variant of the caches' element type (KvCache keeps K and V of
    // one type); sizes checked above. The caller keeps *pos < ctx (the
    // cache's positions): the kernel writes position *pos of the caches.
    unsafe {
        gpu.launch(
            &name,
            cfg(((nh + nkv) as u32, 1), 256),
            &[
                &args[0], &args[1], &args[2], &args[3], &args[4], &args[5], &n_rot, &args[6],
                &args[7], &args[8], &args[9], &nh_i, &nkv_i, &hd_i, &gated, &eps,
            ],
        )
    }
}

/// Scratch of the split attention: per query head and slice, (m, l) and
/// the unnormalised output.
pub struct AttnScratch {
    pub nsplit: usize,
    pub part_o: CudaSlice<f32>,
    pub part_ml: CudaSlice<f32>,
}

impl AttnScratch {
    pub fn new(gpu: &Gpu, a: &AttnDims, nsplit: usize) -> Result<Self> {
        ensure!((1..=65535).contains(&nsplit));
        Ok(Self {
            nsplit,
            part_o: gpu.stream.alloc_zeros(a.n_head * nsplit * a.hd)?,
            part_ml: gpu.stream.alloc_zeros(a.n_head * nsplit * 2)?,
        })
    }
}

/// Slices for a device with `sms` multiprocessors: one wave of blocks (one
/// block per SM over the KV heads and head groups: the 8-head kernel holds
/// ~200 registers a thread, one 256-thread block per SM).
pub fn default_nsplit(a: &AttnDims, sms: usize) -> usize {
    let groups = a.n_kv * (a.n_head / a.n_kv / a.heads_per_block());
    sms.div_ceil(groups).clamp(1, 256)
}

/// Decode attention of the query `q` (`n_head x hd`) over positions
/// `0..=*pos` of the caches; `gate` (the q_full buffer, gated layers):
/// out *= sigmoid(gate) in the merge.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    gpu: &Gpu,
    a: &AttnDims,
    q: &CudaSlice<f32>,
    kv: &KvCache,
    pos: &CudaSlice<i32>,
    scratch: &AttnScratch,
    gate: Option<At>,
    out: &CudaSlice<f32>,
    q8: Option<&Q8Vec>,
    scale: f32,
) -> Result<()> {
    a.check()?;
    ensure!(q8.is_none_or(|q| q.n >= a.n_head * a.hd));
    let (qp, qdp) = q8ptrs(gpu, q8);
    let (nh, nkv, hd) = (a.n_head, a.n_kv, a.hd);
    ensure!(q.len() >= nh * hd && out.len() >= nh * hd && !pos.is_empty());
    ensure!(kv.len().is_multiple_of(nkv * hd));
    let (kcp, vcp) = kv.ptrs(gpu);
    ensure!(scratch.part_o.len() >= nh * scratch.nsplit * hd);
    let gb = a.heads_per_block();
    let name = kv
        .ty()
        .kernel("attn_split", &format!("_g{gb}_d{}", hd / 32));
    let ns = scratch.nsplit;
    let grid = ((nkv * (nh / nkv / gb)) as u32, ns as u32);
    let p: [u64; 6] = [
        dptr(gpu, Some(q)),
        kcp,
        vcp,
        dptr(gpu, Some(pos)),
        dptr(gpu, Some(&scratch.part_o)),
        dptr(gpu, Some(&scratch.part_ml)),
    ];
    let (nh_i, nkv_i, ns_i) = (nh as i32, nkv as i32, ns as i32);
    // SAFETY: attn_split[_kvf16]_gGB_dDPL(q, k_cache, v_cache, pos, part_o,
    // part_ml, n_head, n_kv, nsplit, scale), the variant of the caches'
    // element type (KvCache keeps K and V of one type), with hd = 32*DPL and GB
    // dividing the group (heads_per_block); the scratch holds n_head *
    // nsplit slices; the caller keeps *pos < the caches' positions.
    unsafe {
        gpu.launch(
            &name,
            cfg(grid, 256),
            &[
                &p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &nh_i, &nkv_i, &ns_i, &scale,
            ],
        )
    }?;
    let gp = match gate {
        Some(g) => at_ptr(gpu, g, 2 * nh * hd)? + 4 * hd as u64,
        None => 0,
    };
    let op = dptr(gpu, Some(out));
    let (gs, hd_i) = (2 * hd as i32, hd as i32);
    // SAFETY: attn_merge(part_o, part_ml, gate, gate_stride, out, q8,
    // q8d, nsplit, hd) (q8: n_head*hd values, checked above), grid (n_head, hd/64) with hd a multiple of 64 (AttnDims::check):
    // gate (when given) points at the first gate value of q_full
    // (query values of head 0 skipped), head h's at h*2*hd; out holds
    // n_head*hd floats (checked above).
    unsafe {
        gpu.launch(
            "attn_merge",
            cfg((nh as u32, (hd / 64) as u32), 256),
            &[&p[4], &p[5], &gp, &gs, &op, &qp, &qdp, &ns_i, &hd_i],
        )
    }
}

/// Shapes of one Gated DeltaNet layer on the device.
#[derive(Clone, Copy, Debug)]
pub struct GdnDims {
    pub n_k: usize,
    pub n_v: usize,
    pub dk: usize,
    pub dv: usize,
    pub conv_kernel: usize,
}

/// Threads of a `gdn_step_c*` block (`GDN_THREADS`).
pub const GDN_THREADS: usize = 512;

/// The `gdn_step` variants (kernels/deltanet.cu), most blocks per value head
/// first: (blocks per head C = the cluster size, rows of the state a thread
/// holds at most, kernel). Each block owns dv / C columns of its head.
const GDN_SPLITS: [(usize, usize, &str); 3] = [
    (4, 8, "gdn_step_c4"),
    (2, 16, "gdn_step_c2"),
    (1, 32, "gdn_step_c1"),
];

impl GdnDims {
    pub fn key_dim(&self) -> usize {
        self.n_k * self.dk
    }
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.n_v * self.dv
    }
    pub fn state_len(&self) -> usize {
        self.n_v * self.dk * self.dv
    }
    /// The kernel for these shapes and its blocks per value head: the most
    /// blocks whose column slice is still whole warps of 32 (the int8
    /// output quantizes 32 consecutive columns in one warp) and whose
    /// threads can hold the dk rows; the one-block kernel otherwise.
    /// None: no variant fits.
    pub fn split(&self) -> Option<(usize, &'static str)> {
        GDN_SPLITS
            .iter()
            .find(|&&(c, maxr, _)| {
                let w = self.dv / c;
                let whole = c == 1 || (self.dv.is_multiple_of(c) && w.is_multiple_of(32));
                whole
                    && self.dv >= 1
                    && GDN_THREADS.is_multiple_of(w)
                    && self.dk <= GDN_THREADS / w * maxr
            })
            .map(|&(c, _, name)| (c, name))
    }
    pub fn check(&self) -> Result<()> {
        let s = self;
        ensure!(
            s.n_k >= 1 && s.n_v.is_multiple_of(s.n_k),
            "deltanet: {} key heads, {} value heads",
            s.n_k,
            s.n_v
        );
        ensure!(
            s.dv >= 1 && GDN_THREADS.is_multiple_of(s.dv) && s.dv <= 512,
            "deltanet: value head dim {} must divide {GDN_THREADS}",
            s.dv
        );
        ensure!(
            s.dk >= 1 && s.dk <= 256 && s.split().is_some(),
            "deltanet: key head dim {} too large for the device kernel",
            s.dk
        );
        ensure!((2..=8).contains(&s.conv_kernel), "deltanet: conv kernel");
        // The kernel indexes the ring with 32-bit ints.
        ensure!(
            s.conv_kernel * s.conv_dim() <= i32::MAX as usize,
            "deltanet: conv window too large"
        );
        Ok(())
    }
}

/// Per-layer weights of the DeltaNet step (f32, on the device).
pub struct GdnWeights<'a> {
    pub conv_w: &'a CudaSlice<f32>,
    pub dt_bias: &'a CudaSlice<f32>,
    pub ssm_a: &'a CudaSlice<f32>,
    pub norm_w: &'a CudaSlice<f32>,
}

/// One fused Gated DeltaNet step at position `*pos`: conv window `ring`
/// (`K x conv_dim`, position p in slot p % K), state (`n_v x dk x dv`);
/// `out` = gated-normed output (`n_v x dv`).
#[allow(clippy::too_many_arguments)]
pub fn gdn_step(
    gpu: &Gpu,
    s: &GdnDims,
    w: &GdnWeights,
    qkv: At,
    z: At,
    ba: At,
    ring: &CudaSlice<f32>,
    state: &CudaSlice<f32>,
    out: &CudaSlice<f32>,
    q8: Option<&Q8Vec>,
    pos: &CudaSlice<i32>,
    eps: f32,
    l2_eps: f32,
) -> Result<()> {
    s.check()?;
    ensure!(q8.is_none_or(|q| q.n >= s.n_v * s.dv && s.dv.is_multiple_of(32)));
    let (split, kernel) = s.split().expect("checked");
    let (qp, qdp) = q8ptrs(gpu, q8);
    let (cd, vd) = (s.conv_dim(), s.n_v * s.dv);
    ensure!(out.len() >= vd);
    let (qkvp, zp, bap) = (
        at_ptr(gpu, qkv, cd)?,
        at_ptr(gpu, z, vd)?,
        at_ptr(gpu, ba, 2 * s.n_v)?,
    );
    ensure!(ring.len() >= s.conv_kernel * cd && state.len() >= s.state_len());
    ensure!(w.conv_w.len() >= cd * s.conv_kernel && w.norm_w.len() >= s.dv);
    ensure!(w.dt_bias.len() >= s.n_v && w.ssm_a.len() >= s.n_v && !pos.is_empty());
    let p: [u64; 11] = [
        qkvp,
        zp,
        bap,
        dptr(gpu, Some(w.conv_w)),
        dptr(gpu, Some(w.dt_bias)),
        dptr(gpu, Some(w.ssm_a)),
        dptr(gpu, Some(w.norm_w)),
        dptr(gpu, Some(ring)),
        dptr(gpu, Some(state)),
        dptr(gpu, Some(out)),
        dptr(gpu, Some(pos)),
    ];
    let d: [i32; 5] = [
        s.n_k as i32,
        s.n_v as i32,
        s.dk as i32,
        s.dv as i32,
        s.conv_kernel as i32,
    ];
    // SAFETY: gdn_step_c*(qkv, z, ba, conv_w, dt_bias, ssm_a, norm_w, ring,
    // state, out, q8, q8d, pos, n_k, n_v, dk, dv, K, eps, l2_eps); every buffer's
    // size is checked above against the shapes, and the shapes against the
    // kernel's limits (GdnDims::check, split); the grid is `split` blocks
    // per value head, a whole number of the kernel's compile-time clusters
    // of `split` blocks.
    unsafe {
        gpu.launch(
            kernel,
            cfg(((s.n_v * split) as u32, 1), GDN_THREADS as u32),
            &[
                &p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6], &p[7], &p[8], &p[9], &qp, &qdp,
                &p[10], &d[0], &d[1], &d[2], &d[3], &d[4], &eps, &l2_eps,
            ],
        )
    }
}

/// Router softmax + top-k over `n` logits: chosen experts (ascending),
/// their slots (`slot_of` None: identity) and weights.
#[allow(clippy::too_many_arguments)]
pub fn router_topk(
    gpu: &Gpu,
    logits: At,
    n: usize,
    k: usize,
    norm: bool,
    slot_of: Option<&CudaSlice<u32>>,
    slots: &CudaSlice<u32>,
    experts: &CudaSlice<u32>,
    w: &CudaSlice<f32>,
) -> Result<()> {
    ensure!(
        (1..=ROUTER_MAX_N).contains(&n) && (1..=32).contains(&k) && k <= n,
        "router: {k} of {n} experts (device kernel: n <= {ROUTER_MAX_N}, k <= 32)"
    );
    ensure!(slots.len() >= k && experts.len() >= k && w.len() >= k);
    ensure!(slot_of.is_none_or(|s| s.len() >= n));
    let p: [u64; 5] = [
        at_ptr(gpu, logits, n)?,
        dptr(gpu, slot_of),
        dptr(gpu, Some(slots)),
        dptr(gpu, Some(experts)),
        dptr(gpu, Some(w)),
    ];
    let (n_i, k_i, norm_i) = (n as i32, k as i32, norm as i32);
    // One thread per logit, whole warps: the kernel's barriers cost less
    // with fewer warps, so no more than n needs.
    let threads = n.div_ceil(32) as u32 * 32;
    // SAFETY: router_topk(logits, n, k, norm, slot_of, slots_out,
    // experts_out, w_out); sizes checked above; the kernel needs
    // 32 * ceil(n / 32) threads (<= its launch bound of 1024, as n <= 1024).
    unsafe {
        gpu.launch(
            "router_topk",
            cfg((1, 1), threads),
            &[&p[0], &n_i, &k_i, &norm_i, &p[1], &p[2], &p[3], &p[4]],
        )
    }
}

/// Most logits the device top-k takes (`ROUTER_MAX_N` in router.cu).
pub const ROUTER_MAX_N: usize = 1024;

/// The router GEMV and [`router_topk`] in one launch
/// (`router_gemv_topk`): `logits = W x` over all rows of the f32 matrix
/// `w` (the router's `n` rows first, then any stacked rows), then the
/// softmax + top-k of `logits[0..n)` in the grid's last block. `counter`:
/// a word that is 0 between launches (the kernel leaves it so). With
/// `in_norm`, x is not read but written: `x = RMSNorm(resid + mix)·w`
/// (and as int8 into `q8`), computed in the same launch; `resid` is left
/// as it was (the combine adds `mix`: [`moe_combine`]).
#[allow(clippy::too_many_arguments)]
pub fn router_gemv_topk(
    gpu: &Gpu,
    w: &crate::gemv::DeviceMatrix,
    x: &CudaSlice<f32>,
    in_norm: Option<InNorm>,
    logits: &CudaSlice<f32>,
    counter: &CudaSlice<u32>,
    route: Route,
    slots: &CudaSlice<u32>,
    experts: &CudaSlice<u32>,
    w_out: &CudaSlice<f32>,
) -> Result<()> {
    let Route { n, k, norm } = route;
    ensure!(
        router_gemv_topk_fits(w, n),
        "router_gemv_topk: a {}x{} {:?} matrix for {n} experts (needs F32, columns a multiple of 4, n <= rows, n <= {ROUTER_MAX_N})",
        w.rows,
        w.cols,
        w.layout.ty
    );
    ensure!(
        (1..=32).contains(&k) && k <= n,
        "router: {k} of {n} experts"
    );
    ensure!(w.buf.len() >= 4 * w.rows * w.cols && x.len() >= w.cols && logits.len() >= w.rows);
    ensure!(!counter.is_empty() && slots.len() >= k && experts.len() >= k && w_out.len() >= k);
    let threads = n.div_ceil(RG_THREADS_PER_ROW) * RG_THREADS_PER_ROW;
    let blocks = w.rows.div_ceil(threads / RG_THREADS_PER_ROW);
    let mut np = [0u64; 5];
    let mut eps = 0f32;
    if let Some(nm) = &in_norm {
        ensure!(
            router_in_norm_fits(w.cols, n),
            "router_gemv_topk: no fused RMSNorm for {} columns and {n} experts",
            w.cols
        );
        ensure!(nm.resid.len() >= w.cols && nm.mix.len() >= w.cols && nm.w.len() >= w.cols);
        ensure!(nm.q8.is_none_or(|q| q.n >= w.cols));
        let (qp, qdp) = q8ptrs(gpu, nm.q8);
        np = [
            dptr(gpu, Some(nm.resid)),
            dptr(gpu, Some(nm.mix)),
            dptr(gpu, Some(nm.w)),
            qp,
            qdp,
        ];
        eps = nm.eps;
    }
    let p: [u64; 7] = [
        dptr(gpu, Some(&w.buf)),
        dptr(gpu, Some(x)),
        dptr(gpu, Some(logits)),
        dptr(gpu, Some(counter)),
        dptr(gpu, Some(slots)),
        dptr(gpu, Some(experts)),
        dptr(gpu, Some(w_out)),
    ];
    let (rows, cols) = (i32_of(w.rows)?, i32_of(w.cols)?);
    let (n_i, k_i, norm_i, no_table) = (n as i32, k as i32, norm as i32, 0u64);
    // SAFETY: router_gemv_topk(w, x, rows, cols, logits, counter, n, k,
    // norm, slot_of, slots_out, experts_out, w_out): w holds rows x cols
    // f32 (cols % 4 == 0: 16-byte row starts), x cols floats, logits rows
    // floats, counter a word that every launch leaves at 0, the outputs k
    // entries (checked above); no slot table (slot = expert). The block
    // has 128 * ceil(n / 128) <= 1024 threads (its launch bound), at least
    // one per logit, and the grid covers every row. With the fused norm
    // (router_in_norm_fits: cols % 32 == 0, cols <= 8 * threads and <= the
    // kernel's 4096-float shared buffer) resid, mix and norm_w hold cols
    // floats and q8 (when given) cols values; else those pointers are null.
    unsafe {
        gpu.launch(
            "router_gemv_topk",
            cfg((blocks as u32, 1), threads as u32),
            &[
                &p[0], &p[1], &rows, &cols, &p[2], &p[3], &n_i, &k_i, &norm_i, &no_table, &p[4],
                &p[5], &p[6], &np[0], &np[1], &np[2], &eps, &np[3], &np[4],
            ],
        )
    }
}

/// The post-mixer RMSNorm that [`router_gemv_topk`] computes in front of
/// the router: `x = RMSNorm(resid + mix)·w`, also as int8 into `q8`.
pub struct InNorm<'a> {
    pub resid: &'a CudaSlice<f32>,
    pub mix: &'a CudaSlice<f32>,
    pub w: &'a CudaSlice<f32>,
    pub eps: f32,
    pub q8: Option<&'a Q8Vec>,
}

/// Whether [`router_gemv_topk`] can compute its input's RMSNorm for a
/// `cols`-wide input and `n` experts (its block of 128·ceil(n/128) threads
/// holds 8 values a thread; a 4096-float shared buffer).
pub fn router_in_norm_fits(cols: usize, n: usize) -> bool {
    let threads = n.div_ceil(RG_THREADS_PER_ROW) * RG_THREADS_PER_ROW;
    cols.is_multiple_of(32) && cols >= 32 && cols <= 8 * threads && cols <= 4096
}

/// Threads per row of `router_gemv_topk` (`RG_TPR` in router.cu).
const RG_THREADS_PER_ROW: usize = 128;

/// Whether [`router_gemv_topk`] takes this router matrix for `n` experts.
pub fn router_gemv_topk_fits(w: &crate::gemv::DeviceMatrix, n: usize) -> bool {
    w.layout.ty == redlite_gguf::GgmlType::F32
        && w.cols.is_multiple_of(4)
        && w.cols >= 4
        && (1..=ROUTER_MAX_N).contains(&n)
        && n <= w.rows
}

/// What a router selects: `k` of `n` experts, renormalised when `norm`.
#[derive(Clone, Copy, Debug)]
pub struct Route {
    pub n: usize,
    pub k: usize,
    pub norm: bool,
}

/// `out = SiLU(g) * u` over `n` values (out may be g); `q8`: out also as
/// int8 activations.
pub fn swiglu(
    gpu: &Gpu,
    g: (&CudaSlice<f32>, usize),
    u: (&CudaSlice<f32>, usize),
    out: &CudaSlice<f32>,
    q8: Option<&Q8Vec>,
    n: usize,
) -> Result<()> {
    ensure!(g.0.len() >= g.1 + n && u.0.len() >= u.1 + n && out.len() >= n && n >= 1);
    ensure!(q8.is_none_or(|q| q.n >= n && n.is_multiple_of(32)));
    let (qp, qdp) = q8ptrs(gpu, q8);
    let gp = dptr(gpu, Some(g.0)) + 4 * g.1 as u64;
    let up = dptr(gpu, Some(u.0)) + 4 * u.1 as u64;
    let op = dptr(gpu, Some(out));
    let n_i = i32_of(n)?;
    // SAFETY: swiglu(g, u, out, q, qd, n): g and u hold n floats from
    // their offsets, out n floats, q/qd (when given) n values with n % 32
    // == 0 (checked above).
    unsafe {
        gpu.launch(
            "swiglu",
            cfg(((n as u32).div_ceil(256), 1), 256),
            &[&gp, &up, &op, &qp, &qdp, &n_i],
        )
    }
}

/// `x += y` over `n` values.
pub fn add_inplace(gpu: &Gpu, x: &CudaSlice<f32>, y: &CudaSlice<f32>, n: usize) -> Result<()> {
    ensure!(x.len() >= n && y.len() >= n && n >= 1);
    let (xp, yp, n_i) = (dptr(gpu, Some(x)), dptr(gpu, Some(y)), i32_of(n)?);
    // SAFETY: add_inplace(x, y, n); both hold n floats (checked above).
    unsafe {
        gpu.launch(
            "add_inplace",
            cfg(((n as u32).div_ceil(256), 1), 256),
            &[&xp, &yp, &n_i],
        )
    }
}

/// The next block's RMSNorm fused into [`moe_combine`]: weights, eps, the
/// normed output and optionally its int8 form.
pub struct NextNorm<'a> {
    pub w: &'a CudaSlice<f32>,
    pub eps: f32,
    pub h: &'a CudaSlice<f32>,
    pub q8: Option<&'a Q8Vec>,
}

/// `x += Σ_i w[i]·ys[i] + sh·sigmoid(sh_logit)` (`k` routed outputs of
/// `d` values; the shared expert and its gate optional); with `norm`, also
/// `h = RMSNorm(x)·norm.w` in the same launch. `mix` (with `norm`, d % 8
/// == 0 and d <= 4096 only): the mixer's output, added to x first, for a
/// layer whose post-mixer norm ran in [`router_gemv_topk`].
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    gpu: &Gpu,
    x: &CudaSlice<f32>,
    ys: &CudaSlice<f32>,
    w: &CudaSlice<f32>,
    k: usize,
    d: usize,
    sh: Option<&CudaSlice<f32>>,
    sh_logit: Option<At>,
    norm: Option<NextNorm>,
    mix: Option<&CudaSlice<f32>>,
) -> Result<()> {
    ensure!(x.len() >= d && ys.len() >= k * d && w.len() >= k && d >= 1);
    ensure!(mix.is_none_or(|m| m.len() >= d));
    ensure!(
        mix.is_none() || (norm.is_some() && v8_block(d).is_some()),
        "moe_combine: a deferred residual add (mix) needs the fused next norm and d % 8 == 0, d <= 4096"
    );
    let mixp = dptr(gpu, mix);
    ensure!(sh.is_none_or(|s| s.len() >= d));
    let slp = match sh_logit {
        Some(a) => at_ptr(gpu, a, 1)?,
        None => 0,
    };
    let p: [u64; 5] = [
        dptr(gpu, Some(x)),
        dptr(gpu, Some(ys)),
        dptr(gpu, Some(w)),
        dptr(gpu, sh),
        slp,
    ];
    let (k_i, d_i) = (i32_of(k)?, i32_of(d)?);
    if let Some(n) = norm {
        ensure!(n.w.len() >= d && n.h.len() >= d);
        ensure!(n.q8.is_none_or(|q| q.n >= d && d.is_multiple_of(32)));
        let (wp, hp) = (dptr(gpu, Some(n.w)), dptr(gpu, Some(n.h)));
        let (qp, qdp) = q8ptrs(gpu, n.q8);
        let (name, block) = match v8_block(d) {
            Some(b) => ("moe_combine_norm_v8", b),
            None => ("moe_combine_norm", 1024),
        };
        // moe_combine_norm_v8 takes one more argument: mix.
        let mut args: Vec<&dyn crate::device::KernelArg> = vec![
            &p[0], &p[1], &p[2], &k_i, &d_i, &p[3], &p[4], &wp, &n.eps, &hp, &qp, &qdp,
        ];
        if name == "moe_combine_norm_v8" {
            args.push(&mixp);
        }
        // SAFETY: moe_combine_norm(x, ys, w, k, d, sh, sh_logit, norm_w,
        // eps, h, q, qd), moe_combine_norm_v8 the same plus mix, with 8 *
        // block >= d and d % 8 == 0 (v8_block); x, h, norm_w hold d floats,
        // ys k*d, w k, q/qd d values with d % 32 == 0, mix (null when not
        // given; only the v8 kernel, checked above) d floats; one block.
        return unsafe { gpu.launch(name, cfg((1, 1), block), &args) };
    }
    // SAFETY: moe_combine(x, ys, w, k, d, sh, sh_logit); sizes checked above.
    unsafe {
        gpu.launch(
            "moe_combine",
            cfg(((d as u32).div_ceil(256), 1), 256),
            &[&p[0], &p[1], &p[2], &k_i, &d_i, &p[3], &p[4]],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// router_gemv_topk's fused input norm: 8 values a thread of its
    /// 128·ceil(n/128)-thread block, whole 32-value groups, at most its
    /// 4096-float shared buffer.
    #[test]
    fn router_in_norm_shapes() {
        assert!(router_in_norm_fits(2048, 512)); // Qwen3-Next
        assert!(router_in_norm_fits(4096, 512));
        assert!(router_in_norm_fits(256, 16)); // the tiny fixtures
        assert!(router_in_norm_fits(1024, 100));
        assert!(!router_in_norm_fits(2048, 100)); // 128 threads hold 1024
        assert!(!router_in_norm_fits(2050, 512));
        assert!(!router_in_norm_fits(8192, 1024)); // the shared buffer
        assert!(!router_in_norm_fits(0, 16));
    }

    /// The 8-values-a-thread kernels: whole warps covering d, only for
    /// d % 8 == 0 up to their 512-thread bound; the 1024-thread kernels
    /// otherwise.
    #[test]
    fn v8_block_shapes() {
        assert_eq!(v8_block(2048), Some(256));
        assert_eq!(v8_block(64), Some(32));
        assert_eq!(v8_block(264), Some(64)); // 33 threads -> two warps
        assert_eq!(v8_block(4096), Some(512));
        assert_eq!(v8_block(4104), None);
        assert_eq!(v8_block(100), None);
        for d in (8..=4096).step_by(8) {
            let b = v8_block(d).unwrap() as usize;
            assert!(
                b.is_multiple_of(32) && 8 * b >= d && 8 * (b - 32) < d,
                "{d}"
            );
        }
    }

    fn bits(x: f32) -> u16 {
        half::f16::from_f32(x).to_bits()
    }

    /// The host rounding of the f16 cache (selftest uploads and
    /// references) is IEEE 754 binary16 round-to-nearest-even, as the
    /// kernels' `cvt.rn.f16.f32`: known bit patterns, ties, subnormals,
    /// overflow.
    #[test]
    fn f16_rounding_is_ieee_nearest_even() {
        assert_eq!(bits(1.0), 0x3c00);
        assert_eq!(bits(-2.0), 0xc000);
        assert_eq!(bits(65504.0), 0x7bff); // largest finite
        assert_eq!(bits(2f32.powi(-14)), 0x0400); // smallest normal
        assert_eq!(bits(2f32.powi(-24)), 0x0001); // smallest subnormal
                                                  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties to even (1).
        assert_eq!(bits(1.0 + 2f32.powi(-11)), 0x3c00);
        // 1 + 3*2^-11: halfway between 0x3c01 and 0x3c02: to even 0x3c02.
        assert_eq!(bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        // Just above the tie rounds up.
        assert_eq!(bits(1.0 + 2f32.powi(-11) + 2f32.powi(-20)), 0x3c01);
        // 2^-25 is half the smallest subnormal: ties to even (0); just above
        // it rounds to 0x0001.
        assert_eq!(bits(2f32.powi(-25)), 0x0000);
        assert_eq!(bits(2f32.powi(-25) * 1.5), 0x0001);
        // 65520 is halfway between 65504 and 2^16 (out of range): to
        // infinity, as IEEE rounding of the unbounded exponent gives.
        assert_eq!(bits(65519.0), 0x7bff);
        assert_eq!(bits(65520.0), 0x7c00);
        assert!(bits(f32::NAN) & 0x7c00 == 0x7c00 && bits(f32::NAN) & 0x03ff != 0);
        assert_eq!(f16_round(0.1), 0.099975586);
    }

    #[test]
    fn kv_type_sizes_and_kernel_names() {
        assert_eq!((KvType::F32.bytes(), KvType::F16.bytes()), (4, 2));
        assert_eq!(KvType::F32.kernel("attn_prep", ""), "attn_prep");
        assert_eq!(
            KvType::F16.kernel("attn_split", "_g8_d8"),
            "attn_split_kvf16_g8_d8"
        );
        let all: Vec<&str> = crate::kernels::FILES
            .iter()
            .flat_map(|f| f.kernels.iter().copied())
            .collect();
        for ty in [KvType::F32, KvType::F16] {
            assert!(all.contains(&ty.kernel("attn_prep", "").as_str()));
            for gb in [1, 2, 4, 8] {
                for d in [2, 4, 8] {
                    let k = ty.kernel("attn_split", &format!("_g{gb}_d{d}"));
                    assert!(all.contains(&k.as_str()), "{k}");
                }
            }
        }
        assert_eq!(KvType::default_for(true), KvType::F16);
        assert_eq!(KvType::default_for(false), KvType::F32);
    }

    fn dims(dk: usize, dv: usize) -> GdnDims {
        GdnDims {
            n_k: 2,
            n_v: 4,
            dk,
            dv,
            conv_kernel: 4,
        }
    }

    /// The most blocks per head whose column slice is whole warps and whose
    /// threads hold the rows; the selftest shapes reach every variant.
    #[test]
    fn gdn_split_picks_the_widest_kernel_that_fits() {
        let name = |dk, dv| dims(dk, dv).split().map(|s| s.1);
        assert_eq!(dims(128, 128).split(), Some((4, "gdn_step_c4")));
        assert_eq!(name(32, 128), Some("gdn_step_c4"));
        assert_eq!(name(64, 64), Some("gdn_step_c2"));
        assert_eq!(name(256, 64), Some("gdn_step_c2"));
        assert_eq!(name(128, 32), Some("gdn_step_c1"));
        assert_eq!(name(16, 16), Some("gdn_step_c1"));
        // dk 256 at dv 128: 8 rows x 16 per c4 block too few, c2 and c1 too
        assert_eq!(name(256, 128), None);
        assert!(dims(256, 128).check().is_err());
        // dv 256: 64 columns x 8 rows per c4 block (the old one-block
        // kernel's limit too)
        assert_eq!(name(64, 256), Some("gdn_step_c4"));
        assert_eq!(name(128, 256), None);
        assert!(dims(128, 128).check().is_ok());
    }
}
