//! Prefill GEMM launches (`kernels/gemm_common.cuh`, the `gemm_*` kernels
//! of each GEMV file): a chunk of activation rows times one matrix, or the
//! (token, expert) pairs of a chunk times their experts (grouped, one tile
//! list over the layer's experts).

use super::{DeviceMatrix, ExpertStack};
use crate::device::{cfg, dptr, Gpu};
use crate::error::{bail, ensure, Result};
use crate::layout::DeviceLayout;
use cudarc::driver::{CudaSlice, DeviceRepr};
use redlite_gguf::GgmlType;

/// Activation rows of one GEMM tile (`GEMM_BN`; `gemm_f32` uses the same):
/// the routed tile lists split an expert's pairs into tiles of this many.
pub const GEMM_TILE: usize = 64;

/// Weight rows of one warp of the tensor-core GEMMs (a block of w warps
/// covers 32 w rows).
const GEMM_WARP_ROWS: usize = 32;

/// Warps of a tensor-core GEMM block (`GEMM_THREADS`).
const GEMM_WARPS: usize = 4;

/// Weight rows of one block of the exact f32 GEMM (`gemm_f32`).
const GEMM_F32_ROWS: usize = 64;

/// The kernel's argument struct (`GemmArgs` in `gemm_common.cuh`: same
/// field order and types; 8-byte pointers and i64s first, the i32s last,
/// padded to a multiple of 8 bytes). `n_tiles_dev`: where a tile list
/// built on the device keeps its count (0: the grid's y is the count).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GemmArgs {
    pub w: u64,
    pub mat_bytes: u64,
    pub slots: u64,
    pub tiles: u64,
    pub x: u64,
    pub xh: u64,
    pub gather: u64,
    pub y: u64,
    pub n_tiles_dev: u64,
    pub ldx: i64,
    pub ldy: i64,
    pub rows: i32,
    pub nb: i32,
    pub n: i32,
    pub ksplit: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers, passed to the kernel by
// value as the `GemmArgs` it mirrors (checked field by field in the tests).
unsafe impl DeviceRepr for GemmArgs {}

/// Activation rows in: `x` (device address of f32 values, or of f16 ones
/// when `f16`) rows `ldx` values apart, row p read from `gather[p]` when a
/// gather list is given.
#[derive(Clone, Copy, Debug)]
pub struct GemmIn {
    pub x: u64,
    pub ldx: usize,
    pub gather: Option<u64>,
    pub f16: bool,
}

/// Output rows: `y` (f32 device address) rows `ldy` floats apart.
#[derive(Clone, Copy, Debug)]
pub struct GemmOut {
    pub y: u64,
    pub ldy: usize,
}

/// How many tiles of a tile list in device memory a grouped GEMM runs.
#[derive(Clone, Copy, Debug)]
pub enum TileCount<'a> {
    /// Known on the host (the list was built there): the grid runs them.
    Host(usize),
    /// Written to `count[0]` on the device by the kernel that built the
    /// list ([`crate::ops::route_tiles_device`]), before the GEMM on the
    /// same stream: the grid runs `bound` tiles (the most the list can
    /// have) and the blocks past the count return at once, so the host
    /// never waits to learn it.
    Device {
        count: &'a CudaSlice<i32>,
        bound: usize,
    },
}

/// Which kernel multiplies a matrix of `ty`: the tensor-core kernel of its
/// format, or for F32 either the exact SIMT kernel (`exact`: routers) or
/// the f16 one.
pub fn gemm_kernel(ty: GgmlType, exact: bool) -> Result<&'static str> {
    Ok(match ty {
        GgmlType::F32 if exact => "gemm_f32",
        GgmlType::F32 => "gemm_f32h",
        GgmlType::Q4_K => "gemm_q4_k",
        GgmlType::Q6_K => "gemm_q6_k",
        GgmlType::IQ2_XXS => "gemm_iq2_xxs",
        GgmlType::Q8_0 => "gemm_q8_0",
        GgmlType::Q5_0 => "gemm_q5_0",
        GgmlType::Q5_K => "gemm_q5_k",
        GgmlType::IQ4_NL => "gemm_iq4_nl",
        GgmlType::IQ2_XS => "gemm_iq2_xs",
        GgmlType::IQ1_M => "gemm_iq1_m",
        other => bail!("no CUDA GEMM kernel for {other:?}"),
    })
}

/// How a tensor-core GEMM launch splits a 32-row group's K over warps
/// (`gemm_body`'s KS): from the grid's size ([`gemm_ksplit`]), or forced
/// to 1 or 4 (the selftest runs both bodies on every shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KSplit {
    Auto,
    Force(usize),
}

/// One launch: the matrix (or stack) at `w`, `tiles` either the device
/// tile list and its count or None (one matrix, `n` rows in tiles of 64).
#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    layout: &DeviceLayout,
    exact: bool,
    w: &CudaSlice<u8>,
    mat_bytes: usize,
    slots: u64,
    rows: usize,
    cols: usize,
    tiles: Option<(&CudaSlice<i32>, TileCount)>,
    n: usize,
    input: GemmIn,
    out: GemmOut,
    split: KSplit,
) -> Result<()> {
    let nb = layout.blocks_per_row(cols)?;
    ensure!(
        input.ldx >= cols && out.ldy >= rows,
        "gemm: rows of {} / {} floats for a {rows} x {cols} matrix",
        input.ldx,
        out.ldy
    );
    // 16-byte loads of 4 f32 or 8 f16 values.
    let per_load = if input.f16 { 8 } else { 4 };
    ensure!(
        input.x.is_multiple_of(16) && input.ldx.is_multiple_of(per_load),
        "gemm: activation rows must be 16-byte aligned"
    );
    ensure!(
        !(input.f16 && exact),
        "gemm: the exact f32 kernel reads f32 activations"
    );
    ensure!(rows >= 1 && rows <= i32::MAX as usize && nb <= i32::MAX as usize);
    // The grid's tiles, and where the kernel reads how many of them run.
    let (n_tiles, count) = match tiles {
        Some((t, TileCount::Host(len))) => {
            ensure!(t.len() >= 3 * len, "gemm: short tile list");
            (len, 0)
        }
        Some((t, TileCount::Device { count, bound })) => {
            ensure!(t.len() >= 3 * bound, "gemm: short tile list");
            ensure!(!count.is_empty(), "gemm: no tile count word");
            // gemm_f32 (the routers' exact kernel) has no such early exit.
            ensure!(
                !exact,
                "gemm: the exact f32 kernel takes no device tile count"
            );
            (bound, dptr(gpu, Some(count)))
        }
        None => (n.div_ceil(GEMM_TILE), 0),
    };
    if n_tiles == 0 {
        return Ok(());
    }
    ensure!(n_tiles <= 65535, "gemm: {n_tiles} tiles in one launch");
    ensure!(n <= i32::MAX as usize);
    let name = gemm_kernel(layout.ty, exact)?;
    let args = GemmArgs {
        w: dptr(gpu, Some(w)),
        mat_bytes: mat_bytes as u64,
        slots,
        tiles: tiles.map_or(0, |(t, _)| dptr(gpu, Some(t))),
        x: if input.f16 { 0 } else { input.x },
        xh: if input.f16 { input.x } else { 0 },
        gather: input.gather.unwrap_or(0),
        y: out.y,
        n_tiles_dev: count,
        ldx: input.ldx as i64,
        ldy: out.ldy as i64,
        rows: rows as i32,
        nb: nb as i32,
        n: n as i32,
        ksplit: 1,
    };
    let (threads, block_rows, args) = if name == "gemm_f32" {
        (256, GEMM_F32_ROWS, args)
    } else {
        let ksplit = match split {
            KSplit::Auto => gemm_ksplit(rows, n_tiles, gpu.sms),
            KSplit::Force(k) => {
                ensure!(k == 1 || k == GEMM_WARPS, "gemm: K split {k}");
                k
            }
        };
        let block_rows = GEMM_WARP_ROWS * GEMM_WARPS / ksplit;
        let args = GemmArgs {
            ksplit: ksplit as i32,
            ..args
        };
        (32 * GEMM_WARPS as u32, block_rows, args)
    };
    // SAFETY: gemm_*(GemmArgs) by value (the struct mirrors the kernel's);
    // the weights hold every matrix a tile names, directly or through the
    // slot table when one is given (the callers check the tile list and
    // the table's entries against the buffer), x holds every row the tiles (or n)
    // read, through gather where given, of ldx >= cols floats, y every
    // row they write of ldy >= rows floats (the callers' contract, checked
    // against their buffer sizes); all on `gpu.stream`. With a device
    // count the list holds `bound` triples (checked above) and its builder
    // writes at most that many and a count <= bound (route_tiles.cu); the
    // blocks past the count return before reading a tile.
    unsafe {
        gpu.launch(
            name,
            cfg(
                ((rows as u32).div_ceil(block_rows as u32), n_tiles as u32),
                threads,
            ),
            &[&args],
        )
    }
}

/// How many warps share a 32-row group of a tensor-core GEMM block (its
/// K split between them, `gemm_body`'s KS): 1 (4 groups, 128 weight rows
/// a block: the activation tile shared by the most MMAs) unless the grid
/// would then leave SMs without a block; then 4, so that small matrices
/// (the shared expert's 512 rows, a 512-token chunk's output projections)
/// still reach every SM without any weight dequantized twice. (At fewer
/// than 4 blocks an SM, 4 lost on the H200: a 2048-token chunk's 2048-row
/// DeltaNet output projections took 9.78 us a prompt token at KS 4, 5.65
/// in 4-warp blocks of 128 rows (this kernel's first form, without the
/// weight prefetch); each KS 4 block stages the whole activation tile for
/// a quarter of the rows.)
fn gemm_ksplit(rows: usize, n_tiles: usize, sms: usize) -> usize {
    if rows.div_ceil(GEMM_WARP_ROWS * GEMM_WARPS) * n_tiles < sms {
        GEMM_WARPS
    } else {
        1
    }
}

impl DeviceMatrix {
    /// `y[p] = W x[p]` for the `n` activation rows of `input` (f16
    /// tensor cores; F32 matrices exactly in f32 when `exact`).
    pub fn gemm(
        &self,
        gpu: &Gpu,
        exact: bool,
        n: usize,
        input: GemmIn,
        out: GemmOut,
    ) -> Result<()> {
        self.gemm_split(gpu, exact, n, input, out, KSplit::Auto)
    }

    /// [`Self::gemm`] with the K split given.
    pub(crate) fn gemm_split(
        &self,
        gpu: &Gpu,
        exact: bool,
        n: usize,
        input: GemmIn,
        out: GemmOut,
        split: KSplit,
    ) -> Result<()> {
        launch(
            gpu,
            &self.layout,
            exact,
            &self.buf,
            self.bytes(),
            0,
            self.rows,
            self.cols,
            None,
            n,
            input,
            out,
            split,
        )
    }
}

impl ExpertStack {
    /// `y[p] = W_e x[gather[p]]` for every tile (e, p0, p1) of `tiles`
    /// (`n_tiles` of them; expert e's matrix in slot e: full residency).
    /// `max_expert`: the largest expert id the tiles name (from the host's
    /// list, or the layer's last expert for a list built on the device).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_grouped(
        &self,
        gpu: &Gpu,
        tiles: &CudaSlice<i32>,
        n_tiles: TileCount,
        max_expert: usize,
        n_pairs: usize,
        input: GemmIn,
        out: GemmOut,
    ) -> Result<()> {
        self.gemm_grouped_split(
            gpu,
            tiles,
            n_tiles,
            max_expert,
            n_pairs,
            input,
            out,
            KSplit::Auto,
        )
    }

    /// [`Self::gemm_grouped`] with the K split given.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_grouped_split(
        &self,
        gpu: &Gpu,
        tiles: &CudaSlice<i32>,
        n_tiles: TileCount,
        max_expert: usize,
        n_pairs: usize,
        input: GemmIn,
        out: GemmOut,
        split: KSplit,
    ) -> Result<()> {
        ensure!(
            max_expert < self.n_slots,
            "gemm: expert {max_expert} of {} slots",
            self.n_slots
        );
        launch(
            gpu,
            &self.layout,
            false,
            &self.buf,
            self.stride,
            0,
            self.rows,
            self.cols,
            Some((tiles, n_tiles)),
            n_pairs,
            input,
            out,
            split,
        )
    }

    /// [`Self::gemm_grouped`] with expert e's matrix read from entry
    /// `table[e]` of `src` (entries of this stack's stride) instead of
    /// slot e of this stack: the bounded cache's slots (`table` its
    /// `slot_of`) or a prefill staging image (`table` its `stage_of`).
    /// `max_entry`: the largest entry the tiles' experts map to (checked
    /// by the caller that split them on the host, [`crate::prefill_experts::split_tiles`]).
    #[allow(clippy::too_many_arguments)]
    pub fn gemm_grouped_via(
        &self,
        gpu: &Gpu,
        src: &CudaSlice<u8>,
        table: &CudaSlice<u32>,
        max_entry: usize,
        tiles: &CudaSlice<i32>,
        n_tiles: usize,
        n_pairs: usize,
        input: GemmIn,
        out: GemmOut,
    ) -> Result<()> {
        ensure!(
            (max_entry + 1) * self.stride <= src.len(),
            "gemm: entry {max_entry} of a buffer of {} bytes at {} a matrix",
            src.len(),
            self.stride
        );
        launch(
            gpu,
            &self.layout,
            false,
            src,
            self.stride,
            dptr(gpu, Some(table)),
            self.rows,
            self.cols,
            Some((tiles, TileCount::Host(n_tiles))),
            n_pairs,
            input,
            out,
            KSplit::Auto,
        )
    }
}

/// The tile list of a chunk's routed pairs: `experts[t*k + i]` is token
/// t's i-th expert. Pairs are ordered by expert, then token; returns
/// (tiles as (expert, p0, p1) triples, the token of each pair, each
/// (token, choice)'s pair index, the largest expert id).
pub fn route_tiles(experts: &[u32], k: usize, n_expert: usize) -> Result<RouteTiles> {
    ensure!(k >= 1 && experts.len().is_multiple_of(k), "route tiles: k");
    let mut count = vec![0usize; n_expert];
    for &e in experts {
        ensure!(
            (e as usize) < n_expert,
            "router chose expert {e} of {n_expert}"
        );
        count[e as usize] += 1;
    }
    let mut start = vec![0usize; n_expert + 1];
    for e in 0..n_expert {
        start[e + 1] = start[e] + count[e];
    }
    let mut next = start.clone();
    let mut gather = vec![0i32; experts.len()];
    let mut pair_of = vec![0i32; experts.len()];
    for (j, &e) in experts.iter().enumerate() {
        let p = next[e as usize];
        next[e as usize] += 1;
        gather[p] = (j / k) as i32;
        pair_of[j] = p as i32;
    }
    let mut tiles = Vec::new();
    let mut max_expert = 0;
    for e in 0..n_expert {
        let mut p = start[e];
        while p < start[e + 1] {
            let end = (p + GEMM_TILE).min(start[e + 1]);
            tiles.extend_from_slice(&[e as i32, p as i32, end as i32]);
            max_expert = e;
            p = end;
        }
    }
    Ok(RouteTiles {
        tiles,
        gather,
        pair_of,
        max_expert,
    })
}

/// See [`route_tiles`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteTiles {
    pub tiles: Vec<i32>,
    pub gather: Vec<i32>,
    pub pair_of: Vec<i32>,
    pub max_expert: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct the kernel reads by value: 9 pointers, 2 i64, 4 i32 =
    /// 104 bytes, fields at the offsets C gives the same declaration.
    #[test]
    fn gemm_args_layout_matches_the_kernel_struct() {
        assert_eq!(std::mem::size_of::<GemmArgs>(), 104);
        assert_eq!(std::mem::align_of::<GemmArgs>(), 8);
        let a = GemmArgs::default();
        let base = &a as *const GemmArgs as usize;
        assert_eq!(&a.xh as *const u64 as usize - base, 40);
        assert_eq!(&a.n_tiles_dev as *const u64 as usize - base, 64);
        assert_eq!(&a.ldx as *const i64 as usize - base, 72);
        assert_eq!(&a.rows as *const i32 as usize - base, 88);
        assert_eq!(&a.ksplit as *const i32 as usize - base, 100);
    }

    /// Every (token, choice) lands in exactly one tile of its expert, the
    /// tiles of an expert are contiguous, at most 64 rows, and cover its
    /// pairs in token order.
    #[test]
    fn gemm_ksplit_keeps_small_grids_filling_the_card() {
        // H200: 132 SMs. The routed gate of a 2048-token chunk (512 rows,
        // ~644 tiles), a dense projection and 2048-row outputs over 64 or
        // 32 tiles keep one warp a row group ...
        assert_eq!(gemm_ksplit(512, 644, 132), 1);
        assert_eq!(gemm_ksplit(12352, 32, 132), 1);
        assert_eq!(gemm_ksplit(2048, 64, 132), 1);
        assert_eq!(gemm_ksplit(2048, 32, 132), 1);
        // ... the shared expert's 512 rows over 32 tiles (128 blocks <
        // 132), a 2048-row output of a 512-token chunk and a single row
        // split K four ways.
        assert_eq!(gemm_ksplit(512, 32, 132), 4);
        assert_eq!(gemm_ksplit(2048, 8, 132), 4);
        assert_eq!(gemm_ksplit(1, 1, 132), 4);
    }

    #[test]
    fn route_tiles_cover_every_pair_once() {
        let k = 2;
        // 70 tokens: expert 3 chosen by all (two tiles), 0 and 5 by halves
        let mut experts = Vec::new();
        for t in 0..70u32 {
            experts.push(if t % 2 == 0 { 0 } else { 3 });
            experts.push(if t % 2 == 0 { 3 } else { 5 });
        }
        let r = route_tiles(&experts, k, 8).unwrap();
        assert_eq!(r.max_expert, 5);
        let tiles: Vec<[i32; 3]> = r.tiles.chunks(3).map(|c| [c[0], c[1], c[2]]).collect();
        assert_eq!(
            tiles,
            vec![[0, 0, 35], [3, 35, 99], [3, 99, 105], [5, 105, 140]]
        );
        for (j, &e) in experts.iter().enumerate() {
            let p = r.pair_of[j] as usize;
            assert_eq!(r.gather[p] as usize, j / k, "pair {p} reads its token");
            let tile = tiles
                .iter()
                .find(|t| (t[1] as usize..t[2] as usize).contains(&p))
                .unwrap();
            assert_eq!(tile[0] as u32, e);
        }
        // pairs of one expert in token order
        assert!(r.gather[35..105].windows(2).all(|w| w[0] < w[1]));
        assert!(route_tiles(&[9], 1, 8).is_err());
    }
}
