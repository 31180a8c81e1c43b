//! Launches of `kernels/attention.cu` and the state they read: the
//! attention shapes, the KV cache (f32 or f16), the split-K scratch, the
//! split attention and its merge.

use super::q8ptrs;
use crate::device::{at_ptr, cfg, dptr, At, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::{CudaSlice, DeviceRepr};

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

    /// Query heads per block of the tensor-core f16 kernel
    /// (`attn_split_mma_kvf16_d*`): the largest divisor of the GQA group
    /// that is at most 8 (`mma_heads_per_block` in attention_mma.cu).
    pub fn mma_heads_per_block(&self) -> usize {
        let g = self.n_head / self.n_kv;
        (1..=g.min(8))
            .rev()
            .find(|b| g.is_multiple_of(*b))
            .unwrap_or(1)
    }

    /// Blocks a KV head takes in one slice of the decode attention over a
    /// `ty` cache.
    pub fn blocks_per_kv_head(&self, ty: KvType) -> usize {
        let g = self.n_head / self.n_kv;
        match ty {
            KvType::F32 => g / self.heads_per_block(),
            KvType::F16 => g / self.mma_heads_per_block(),
        }
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
    /// the family (`attn_prep_kvf16`, `attn_flash_kvf16_d256`; the split decode
    /// attention is named by `split_kernel`).
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
    pub(super) fn ptrs(&self, gpu: &Gpu) -> (u64, u64) {
        match self {
            KvCache::F32 { k, v } => (dptr(gpu, Some(k)), dptr(gpu, Some(v))),
            KvCache::F16 { k, v } => (dptr(gpu, Some(k)), dptr(gpu, Some(v))),
        }
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
/// block per SM over the KV heads and head groups: the f32 8-head kernel
/// holds ~200 registers a thread, one 256-thread block per SM; the f16
/// tensor-core kernel takes ~150 KB of shared memory at head_dim 256).
pub fn default_nsplit(a: &AttnDims, ty: KvType, sms: usize) -> usize {
    let groups = a.n_kv * a.blocks_per_kv_head(ty);
    sms.div_ceil(groups).clamp(1, 256)
}

/// The split kernel `attention` launches for a `ty` cache: f32,
/// `attn_split_gGB_dDPL` (f32 math, GB query heads a block); f16,
/// `attn_split_mma_kvf16_dDPL` (tensor cores, kernels/attention_mma.cu).
pub fn split_kernel(a: &AttnDims, ty: KvType) -> String {
    match ty {
        KvType::F32 => format!("attn_split_g{}_d{}", a.heads_per_block(), a.hd / 32),
        KvType::F16 => format!("attn_split_mma_kvf16_d{}", a.hd / 32),
    }
}

/// Warps a block and shared stages a warp of the f16 tensor-core kernel
/// (`MMA_WARPS`, `MMA_STAGES` in attention_mma.cu).
const MMA_WARPS: usize = 4;
const MMA_STAGES: usize = 4;

/// Dynamic shared memory of `attn_split_mma_kvf16_d*`: per warp and stage
/// 8 K rows of hd + 32 halves and 8 V rows of hd + 8 (`MmaRows`).
pub fn mma_smem_bytes(hd: usize) -> usize {
    MMA_WARPS * MMA_STAGES * 8 * ((hd + 32) + (hd + 8)) * 2
}

/// The argument struct of the `attn_split_*` kernels (`AttnSplitArgs` in
/// `kernels/attention.cu`: same field order and types, device addresses as
/// u64; the `.cu` asserts the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnSplitArgs {
    pub q: u64,
    pub kc: u64,
    pub vc: u64,
    pub pos: u64,
    pub part_o: u64,
    pub part_ml: u64,
    pub n_head: i32,
    pub n_kv: i32,
    pub nsplit: i32,
    pub scale: f32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers and a float, passed to
// the kernels by value as the `AttnSplitArgs` it mirrors (offsets checked
// in the tests, the size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for AttnSplitArgs {}

/// The argument struct of `attn_merge` (`AttnMergeArgs` in
/// `kernels/attention.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnMergeArgs {
    pub part_o: u64,
    pub part_ml: u64,
    pub gate: u64,
    pub out: u64,
    pub q8: u64,
    pub q8d: u64,
    pub gate_stride: i32,
    pub nsplit: i32,
    pub hd: i32,
    pub pad: i32,
}

// SAFETY: as AttnSplitArgs: plain integers, the layout of the `.cu`'s
// struct (checked in the tests and by its static_assert).
unsafe impl DeviceRepr for AttnMergeArgs {}

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
    let ty = kv.ty();
    let name = split_kernel(a, ty);
    let ns = scratch.nsplit;
    let grid = ((nkv * a.blocks_per_kv_head(ty)) as u32, ns as u32);
    let args = AttnSplitArgs {
        q: dptr(gpu, Some(q)),
        kc: kcp,
        vc: vcp,
        pos: dptr(gpu, Some(pos)),
        part_o: dptr(gpu, Some(&scratch.part_o)),
        part_ml: dptr(gpu, Some(&scratch.part_ml)),
        n_head: nh as i32,
        n_kv: nkv as i32,
        nsplit: ns as i32,
        scale,
    };
    match ty {
        // SAFETY: attn_split_gGB_dDPL(AttnSplitArgs) by value (the struct
        // mirrors the kernel's) over f32 caches, with hd = 32*DPL and GB
        // dividing the group (heads_per_block, the grid's x); the scratch
        // holds n_head * nsplit slices; the caller keeps *pos < the
        // caches' positions.
        KvType::F32 => unsafe { gpu.launch(&name, cfg(grid, 256), &[&args]) }?,
        KvType::F16 => {
            let smem = mma_smem_bytes(hd);
            let launch = cudarc::driver::LaunchConfig {
                grid_dim: (grid.0, grid.1, 1),
                block_dim: ((MMA_WARPS * 32) as u32, 1, 1),
                shared_mem_bytes: smem as u32,
            };
            // SAFETY: attn_split_mma_kvf16_dDPL(AttnSplitArgs) by value
            // over f16 caches, hd = 32*DPL; the grid's x is n_kv times the
            // groups of mma_heads_per_block heads (the kernel derives the
            // same from n_head / n_kv); MMA_WARPS warps and the dynamic
            // shared memory the kernel lays out (mma_smem_bytes, allowed
            // when the kernels were loaded: Gpu::new); scratch and
            // positions as for f32.
            unsafe { gpu.launch(&name, launch, &[&args]) }?
        }
    }
    let gp = match gate {
        Some(g) => at_ptr(gpu, g, 2 * nh * hd)? + 4 * hd as u64,
        None => 0,
    };
    let op = dptr(gpu, Some(out));
    let merge = AttnMergeArgs {
        part_o: args.part_o,
        part_ml: args.part_ml,
        gate: gp,
        out: op,
        q8: qp,
        q8d: qdp,
        gate_stride: 2 * hd as i32,
        nsplit: args.nsplit,
        hd: hd as i32,
        pad: 0,
    };
    // SAFETY: attn_merge(AttnMergeArgs) by value (the struct mirrors the
    // kernel's; q8: n_head*hd values, checked above), grid (n_head, hd/64)
    // with hd a multiple of 64 (AttnDims::check): gate (when given) points
    // at the first gate value of q_full (query values of head 0 skipped),
    // head h's at h*2*hd; out holds n_head*hd floats (checked above).
    unsafe {
        gpu.launch(
            "attn_merge",
            cfg((nh as u32, (hd / 64) as u32), 256),
            &[&merge],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct attn_split_* read by value: 6 pointers, 3 i32 and an
    /// f32 = 64 bytes (the `.cu` asserts the same size), each field at the
    /// offset C gives the same declaration.
    #[test]
    fn attn_split_args_layout_matches_the_kernel_struct() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(size_of::<AttnSplitArgs>(), 64);
        assert_eq!(align_of::<AttnSplitArgs>(), 8);
        assert_eq!(offset_of!(AttnSplitArgs, pos), 24);
        assert_eq!(offset_of!(AttnSplitArgs, part_ml), 40);
        assert_eq!(offset_of!(AttnSplitArgs, n_head), 48);
        assert_eq!(offset_of!(AttnSplitArgs, scale), 60);
        // attn_merge: 6 pointers, 4 i32 = 64 bytes
        assert_eq!(size_of::<AttnMergeArgs>(), 64);
        assert_eq!(offset_of!(AttnMergeArgs, q8d), 40);
        assert_eq!(offset_of!(AttnMergeArgs, gate_stride), 48);
        assert_eq!(offset_of!(AttnMergeArgs, hd), 56);
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
    fn tensor_core_blocks_take_the_largest_group_divisor_up_to_8() {
        // (query heads, KV heads) -> heads a block: Qwen3-Next's 16/2,
        // Qwen2.5-0.5B's 14/2, a group of 6, no grouping, a prime group.
        for (nh, nkv, hb, blocks) in [
            (16, 2, 8, 1),
            (14, 2, 7, 1),
            (12, 2, 6, 1),
            (8, 8, 1, 1),
            (22, 2, 1, 11),
        ] {
            let a = AttnDims {
                n_head: nh,
                n_kv: nkv,
                hd: 128,
                n_rot: 128,
                gated: false,
            };
            assert_eq!(a.mma_heads_per_block(), hb, "{nh}/{nkv}");
            assert_eq!(a.blocks_per_kv_head(KvType::F16), blocks, "{nh}/{nkv}");
        }
        // One wave on 132 SMs: Qwen3-Next's two KV heads take 66 slices.
        let q3n = AttnDims {
            n_head: 16,
            n_kv: 2,
            hd: 256,
            n_rot: 64,
            gated: true,
        };
        assert_eq!(default_nsplit(&q3n, KvType::F16, 132), 66);
        assert!(mma_smem_bytes(256) <= 227 * 1024 - 8 * 256 * 4 - 2 * 4 * 8 * 4);
    }

    #[test]
    fn kv_type_sizes_and_kernel_names() {
        assert_eq!((KvType::F32.bytes(), KvType::F16.bytes()), (4, 2));
        assert_eq!(KvType::F32.kernel("attn_prep", ""), "attn_prep");
        assert_eq!(
            KvType::F16.kernel("attn_prep_chunk", ""),
            "attn_prep_chunk_kvf16"
        );
        let all: Vec<&str> = crate::kernels::FILES
            .iter()
            .flat_map(|f| f.kernels.iter().copied())
            .collect();
        for ty in [KvType::F32, KvType::F16] {
            assert!(all.contains(&ty.kernel("attn_prep", "").as_str()));
            // Every head layout and head_dim the checks admit launches a
            // kernel the engine compiles.
            for (nh, nkv) in [(16, 2), (14, 2), (12, 2), (8, 8), (4, 2), (22, 2)] {
                for hd in [64, 128, 256] {
                    let a = AttnDims {
                        n_head: nh,
                        n_kv: nkv,
                        hd,
                        n_rot: hd,
                        gated: false,
                    };
                    let k = split_kernel(&a, ty);
                    assert!(all.contains(&k.as_str()), "{k}");
                }
            }
        }
        assert_eq!(KvType::default_for(true), KvType::F16);
        assert_eq!(KvType::default_for(false), KvType::F32);
    }
}
