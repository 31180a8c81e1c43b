//! Launches of a prefill chunk's causal attention (`kernels/attn_chunk.cu`):
//! the warp kernels for short chunks, the tensor-core flash kernels for
//! long ones, with the keys of every block optionally split across blocks
//! and the partial results merged (`attn_flash_merge_*`).

use super::attention::{AttnDims, KvCache, KvType};
use super::chunk::Rows;
use crate::device::{cfg, i32_of, Gpu};
use crate::error::{ensure, Context, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};

/// Query rows (token, head) a flash-attention block takes (`FA_ROWS`).
pub const FLASH_ROWS: usize = 64;

/// The most ranges one flash block's keys are split into.
pub const FLASH_MAX_SPLIT: usize = 16;

/// Blocks per streaming multiprocessor a split aims for: the flash blocks
/// of the f32 cache take 155-168 KB of shared memory at hd 128/256, so one
/// is resident per SM, and two per SM keep the tail wave short.
const FLASH_BLOCKS_PER_SM: usize = 2;

/// Key tiles each split takes at least, so that the merge (a read of every
/// partial row) stays small beside the attention itself.
const FLASH_MIN_TILES_PER_SPLIT: usize = 8;

/// Keys per flash tile (`FaShape<HD>::BK`).
fn flash_tile_keys(hd: usize) -> usize {
    if hd == 256 {
        32
    } else {
        64
    }
}

/// Dynamic shared memory of `attn_flash[_kvf16]_d{hd}`: the Q tile (f16,
/// rows of hd + 8), then two stages of K and V tiles in the cache's type
/// (`FaTile`: f16 rows of hd + 8; f32 K rows of hd + 8 and V rows of
/// hd + 4).
pub fn flash_smem_bytes(hd: usize, ty: KvType) -> usize {
    let bk = flash_tile_keys(hd);
    let stage = match ty {
        KvType::F16 => bk * 2 * (hd + 8) * 2,
        KvType::F32 => bk * ((hd + 8) + (hd + 4)) * 4,
    };
    FLASH_ROWS * (hd + 8) * 2 + 2 * stage
}

/// Floats of the partial results of a `split`-way flash launch over
/// `tokens` queries: each (token, head) row's unnormalised output and its
/// (max, sum) per split.
pub fn flash_part_floats(a: &AttnDims, tokens: usize, split: usize) -> usize {
    if split <= 1 {
        0
    } else {
        split * tokens * a.n_head * (a.hd + 2)
    }
}

/// How many ways to split the keys of each flash block for a chunk of
/// `tokens` queries at `pos0`: enough blocks for FLASH_BLOCKS_PER_SM per SM
/// when the chunk alone gives fewer (short prompts over a deep cache),
/// each split at least FLASH_MIN_TILES_PER_SPLIT tiles of keys, and the
/// partials inside `part_floats`.
pub fn flash_splits(
    a: &AttnDims,
    pos0: usize,
    tokens: usize,
    sms: usize,
    part_floats: usize,
) -> usize {
    let blocks = (tokens * (a.n_head / a.n_kv)).div_ceil(FLASH_ROWS) * a.n_kv;
    let tiles = (pos0 + tokens).div_ceil(flash_tile_keys(a.hd));
    let want = (FLASH_BLOCKS_PER_SM * sms).div_ceil(blocks.max(1));
    let per_split = tokens * a.n_head * (a.hd + 2);
    let fits = part_floats.checked_div(per_split).unwrap_or(0);
    want.min(tiles / FLASH_MIN_TILES_PER_SPLIT)
        .min(fits)
        .clamp(1, FLASH_MAX_SPLIT)
}

/// Which kernel runs a chunk's attention.
#[derive(Clone, Copy)]
pub enum AttnKernel<'a> {
    /// A warp per (token, head) (`attn_chunk_*`): chunks too short to fill
    /// a flash block's 64 rows.
    Warp,
    /// Tensor cores (`attn_flash_*`, 64 query rows a block), every block's
    /// keys split `split` ways; with `split` > 1 the partial results go to
    /// `part` (at least [`flash_part_floats`] floats) and are merged.
    Flash {
        split: usize,
        part: Option<&'a CudaSlice<f32>>,
    },
}

/// The argument struct of every `attn_chunk_*`, `attn_flash_*` and
/// `attn_flash_merge_*` kernel (`AttnChunkArgs` in `kernels/attn_chunk.cu`:
/// same field order and types, device addresses as u64; the `.cu` asserts
/// the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct AttnChunkArgs {
    pub q: u64,
    pub kc: u64,
    pub vc: u64,
    pub gate: u64,
    pub gate_ld: i64,
    pub out: u64,
    pub part: u64,
    pub n_head: i32,
    pub n_kv: i32,
    pub pos0: i32,
    pub tokens: i32,
    pub scale: f32,
    pub n_split: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers and a float, passed to
// the kernels by value as the `AttnChunkArgs` it mirrors (offsets checked
// in the tests and by `arg_layouts`, the size by a static_assert in the
// `.cu`).
unsafe impl DeviceRepr for AttnChunkArgs {}

/// Causal attention of `tokens` queries (positions `pos0..`) over the
/// cache (their own K/V rows already appended); `gate`: the q_full rows
/// (gated layers), out *= sigmoid(gate).
#[allow(clippy::too_many_arguments)]
pub fn attn_chunk(
    gpu: &Gpu,
    a: &AttnDims,
    q: Rows,
    kv: &KvCache,
    gate: Option<Rows>,
    out: Rows,
    pos0: usize,
    tokens: usize,
    scale: f32,
    kernel: AttnKernel,
) -> Result<()> {
    a.check()?;
    let (nh, nkv, hd) = (a.n_head, a.n_kv, a.hd);
    ensure!(
        q.ld == nh * hd && out.ld == nh * hd,
        "attn_chunk: q/out rows"
    );
    let (qp, op) = (q.ptr(gpu, tokens, nh * hd)?, out.ptr(gpu, tokens, nh * hd)?);
    ensure!(
        (pos0 + tokens) * nkv * hd <= kv.len(),
        "attn_chunk: past the cache"
    );
    let (gp, gld) = match gate {
        Some(g) => (
            g.ptr(gpu, tokens, 2 * nh * hd)? + 4 * hd as u64,
            g.ld as i64,
        ),
        None => (0, 0),
    };
    let (kcp, vcp) = kv.ptrs(gpu);
    let rows = tokens * (nh / nkv);
    let mut args = AttnChunkArgs {
        q: qp,
        kc: kcp,
        vc: vcp,
        gate: gp,
        gate_ld: gld,
        out: op,
        part: 0,
        n_head: nh as i32,
        n_kv: nkv as i32,
        pos0: i32_of(pos0)?,
        tokens: i32_of(tokens)?,
        scale,
        n_split: 1,
    };
    let AttnKernel::Flash { split, part } = kernel else {
        let blocks = rows.div_ceil(8);
        ensure!(blocks <= i32::MAX as usize && nkv <= 65535);
        let name = kv.ty().kernel("attn_chunk", &format!("_d{hd}"));
        // SAFETY: attn_chunk[_kvf16]_d{hd}(AttnChunkArgs) by value (the
        // struct mirrors the kernel's); grid (ceil(tokens*G/8), n_kv), 8
        // warps a block (ACH_WARPS); rows and cache positions checked above
        // (hd is 64, 128 or 256: AttnDims::check).
        return unsafe { gpu.launch(&name, cfg((blocks as u32, nkv as u32), 256), &[&args]) };
    };
    ensure!(
        (1..=FLASH_MAX_SPLIT).contains(&split),
        "attn_chunk: {split} key splits (1..={FLASH_MAX_SPLIT})"
    );
    if split > 1 {
        let part = part.context("attn_chunk: a split without partials")?;
        let need = flash_part_floats(a, tokens, split);
        ensure!(
            part.len() >= need,
            "attn_chunk: partials of {} floats for {need}",
            part.len()
        );
        args.part = crate::device::dptr(gpu, Some(part));
        args.n_split = split as i32;
    }
    let name = kv.ty().kernel("attn_flash", &format!("_d{hd}"));
    let smem = flash_smem_bytes(hd, kv.ty());
    gpu.func(&name)?.set_attribute(
        cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )?;
    let blocks = rows.div_ceil(FLASH_ROWS);
    ensure!(blocks <= i32::MAX as usize && nkv <= 65535);
    let launch = cudarc::driver::LaunchConfig {
        grid_dim: (blocks as u32, nkv as u32, split as u32),
        block_dim: (128, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: attn_flash[_kvf16]_d{hd}(AttnChunkArgs) by value (the struct
    // mirrors the kernel's); grid (ceil(tokens*G/64), n_kv, split), 128
    // threads, the dynamic shared memory the kernel lays out
    // (flash_smem_bytes, allowed by the attribute set above); rows and
    // cache positions checked above, and with split > 1 the partials'
    // buffer holds flash_part_floats floats.
    unsafe { gpu.launch(&name, launch, &[&args])? };
    if split == 1 {
        return Ok(());
    }
    let merge = format!("attn_flash_merge_d{hd}");
    // SAFETY: attn_flash_merge_d{hd}(AttnChunkArgs) by value; grid
    // (ceil(rows/8), n_kv), 8 warps a block, one a row; it reads the
    // partials the launch above wrote (checked size) and writes the rows
    // of `out` checked above.
    unsafe {
        gpu.launch(
            &merge,
            cfg((rows.div_ceil(8) as u32, nkv as u32), 256),
            &[&args],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The struct at the size the `.cu` asserts and the offsets C gives
    /// the same declaration.
    #[test]
    fn attn_chunk_args_layout_matches_the_kernel_struct() {
        // 7 pointers and an i64, 4 i32, an f32 and an i32 = 80 bytes
        assert_eq!(size_of::<AttnChunkArgs>(), 80);
        assert_eq!(align_of::<AttnChunkArgs>(), 8);
        assert_eq!(offset_of!(AttnChunkArgs, gate_ld), 32);
        assert_eq!(offset_of!(AttnChunkArgs, part), 48);
        assert_eq!(offset_of!(AttnChunkArgs, n_head), 56);
        assert_eq!(offset_of!(AttnChunkArgs, scale), 72);
        assert_eq!(offset_of!(AttnChunkArgs, n_split), 76);
    }

    fn dims(n_head: usize, n_kv: usize, hd: usize) -> AttnDims {
        AttnDims {
            n_head,
            n_kv,
            hd,
            n_rot: hd,
            gated: true,
        }
    }

    /// The shared memory the kernel lays out, by hand for the 80B shape
    /// (hd 256, 32-key tiles) and checked against the 227 KB a block may
    /// opt into on sm_90.
    #[test]
    fn flash_shared_memory_fits_a_block() {
        // Q 64 x 264 halves; two stages of K 32 x 264 + V 32 x 260 floats.
        assert_eq!(
            flash_smem_bytes(256, KvType::F32),
            64 * 264 * 2 + 2 * 32 * (264 + 260) * 4
        );
        assert_eq!(
            flash_smem_bytes(256, KvType::F16),
            64 * 264 * 2 + 2 * 2 * 32 * 264 * 2
        );
        for hd in [64, 128, 256] {
            for ty in [KvType::F32, KvType::F16] {
                assert!(flash_smem_bytes(hd, ty) <= 227 * 1024, "hd {hd} {ty:?}");
            }
        }
    }

    /// Splits only where the chunk's blocks leave SMs idle, never below
    /// 8 tiles of keys each, never past the partials' buffer.
    #[test]
    fn flash_splits_fill_the_machine_within_their_limits() {
        let a = dims(16, 2, 256);
        let big = usize::MAX / 4;
        // pp2048 at depth 0: 512 blocks on 132 SMs, no split.
        assert_eq!(flash_splits(&a, 0, 2048, 132, big), 1);
        // pp512 over 32K cached positions: 128 blocks, 3 splits.
        assert_eq!(flash_splits(&a, 32768, 512, 132, big), 3);
        // 64 tokens at depth 32K: 16 blocks, 17 wanted, 16 at most.
        assert_eq!(flash_splits(&a, 32768, 64, 132, big), FLASH_MAX_SPLIT);
        // A short cache: 300 keys are 10 tiles, one split of 8 at least.
        assert_eq!(flash_splits(&a, 236, 64, 132, big), 1);
        // The buffer holds two splits' partials.
        let two = flash_part_floats(&a, 512, 2);
        assert_eq!(flash_splits(&a, 32768, 512, 132, two), 2);
        assert_eq!(flash_splits(&a, 32768, 512, 132, two - 1), 1);
        assert_eq!(flash_splits(&a, 32768, 512, 132, 0), 1);
        assert_eq!(flash_part_floats(&a, 512, 1), 0);
    }
}
