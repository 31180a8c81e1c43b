//! Launch of `kernels/route_tiles.cu`: a prefill chunk's routed tile
//! list, pair gather list and (token, choice) -> pair map built on the
//! device from the chunk's top-k, entry for entry the host's
//! [`crate::gemv::route_tiles`], with the tile count left in device memory
//! for the grouped GEMMs ([`crate::gemv::TileCount::Device`]).

use crate::device::{cfg, dptr, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::GEMM_TILE;
use cudarc::driver::CudaSlice;

/// Most experts the kernel takes (`RT_MAX_EXPERT` in route_tiles.cu; the
/// chunk top-k takes no more either: [`super::ROUTER_MAX_N`]).
pub const ROUTE_MAX_EXPERT: usize = 1024;

/// The kernel's u16 counters per (warp, expert) (`RT_SHARED`).
const RT_SHARED: usize = 16384;

/// Most tokens in one launch: every expert's count fits the kernel's u16
/// counters, as a token's choices are distinct experts.
pub const ROUTE_MAX_TOKENS: usize = 65535;

/// The most tiles a chunk of `n_pairs` (token, expert) pairs over
/// `n_expert` experts can have: an expert of c pairs has ceil(c / 64) <=
/// c / 64 + 1 tiles, and at most min(n_pairs, n_expert) experts have any.
pub fn max_route_tiles(n_pairs: usize, n_expert: usize) -> usize {
    n_pairs.div_ceil(GEMM_TILE) + n_pairs.min(n_expert)
}

/// Warps of the kernel's block for `n_expert` experts: as many as its
/// shared counters hold a row of `n_expert` for, at most 32 (a block of
/// 1024 threads).
pub fn route_warps(n_expert: usize) -> usize {
    (RT_SHARED / n_expert.max(1)).clamp(1, 32)
}

/// Where [`route_tiles_device`] writes a chunk's routes.
pub struct DeviceRoutes<'a> {
    /// (expert, p0, p1) triples, [`max_route_tiles`] of room.
    pub tiles: &'a CudaSlice<i32>,
    /// The token of each pair.
    pub gather: &'a CudaSlice<i32>,
    /// The pair of each (token, choice).
    pub pair_of: &'a CudaSlice<i32>,
    /// One word: how many tiles the list has.
    pub count: &'a CudaSlice<i32>,
}

/// The routes of `n_pairs / k` tokens' top-k (`experts[t*k + i]`: token
/// t's i-th expert, each below `n_expert`) into `out`, on the stream with
/// no host wait; returns the bound on the tile count the grouped GEMMs'
/// grids take ([`max_route_tiles`]).
pub fn route_tiles_device(
    gpu: &Gpu,
    experts: &CudaSlice<u32>,
    n_pairs: usize,
    k: usize,
    n_expert: usize,
    out: &DeviceRoutes,
) -> Result<usize> {
    ensure!(
        k >= 1 && n_pairs.is_multiple_of(k),
        "route tiles: {n_pairs} pairs of top-{k}"
    );
    ensure!(
        (1..=ROUTE_MAX_EXPERT).contains(&n_expert),
        "route tiles: {n_expert} experts (the device kernel takes 1..={ROUTE_MAX_EXPERT})"
    );
    ensure!(
        n_pairs / k <= ROUTE_MAX_TOKENS && n_pairs <= i32::MAX as usize,
        "route tiles: {} tokens in one chunk (the device kernel takes {ROUTE_MAX_TOKENS})",
        n_pairs / k
    );
    let bound = max_route_tiles(n_pairs, n_expert);
    ensure!(
        experts.len() >= n_pairs
            && out.gather.len() >= n_pairs
            && out.pair_of.len() >= n_pairs
            && out.tiles.len() >= 3 * bound
            && !out.count.is_empty(),
        "route tiles: short buffers for {n_pairs} pairs and {bound} tiles"
    );
    let warps = route_warps(n_expert);
    let (np, k_i, e_i) = (n_pairs as i32, k as i32, n_expert as i32);
    let p = [
        dptr(gpu, Some(experts)),
        dptr(gpu, Some(out.tiles)),
        dptr(gpu, Some(out.gather)),
        dptr(gpu, Some(out.pair_of)),
        dptr(gpu, Some(out.count)),
    ];
    // SAFETY: route_tiles(experts, n_pairs, k, n_expert, tiles, gather,
    // pair_of, n_tiles): experts holds n_pairs ids, gather and pair_of
    // n_pairs ints, tiles 3 * max_route_tiles ints (the most the kernel
    // writes), count one (checked above); 1 <= n_expert <= RT_MAX_EXPERT
    // and warps * n_expert <= RT_SHARED (route_warps), so its shared
    // counters hold every (warp, expert); ids past n_expert are clamped
    // in the kernel; one block of 32 * warps <= 1024 threads (its launch
    // bound); all on `gpu.stream`.
    unsafe {
        gpu.launch(
            "route_tiles",
            cfg((1, 1), 32 * warps as u32),
            &[&p[0], &np, &k_i, &e_i, &p[1], &p[2], &p[3], &p[4]],
        )
    }?;
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's shared counters: 32 warps up to 512 experts, fewer
    /// above (16 at 1024), never more than RT_SHARED counters.
    #[test]
    fn warps_fit_the_shared_counters() {
        assert_eq!(route_warps(512), 32);
        assert_eq!(route_warps(8), 32);
        assert_eq!(route_warps(700), 23);
        assert_eq!(route_warps(1024), 16);
        for e in 1..=ROUTE_MAX_EXPERT {
            let w = route_warps(e);
            assert!((1..=32).contains(&w) && w * e <= RT_SHARED, "{e}");
        }
    }

    /// The bound covers the worst case: every expert one pair more than
    /// whole tiles.
    #[test]
    fn tile_bound() {
        assert_eq!(max_route_tiles(0, 512), 0);
        assert_eq!(max_route_tiles(10, 512), 11);
        // 2048 tokens x 10 over 512 experts: 320 + 512.
        assert_eq!(max_route_tiles(20480, 512), 832);
        // 8 experts of 65 pairs: 16 tiles.
        assert!(max_route_tiles(8 * 65, 8) >= 16);
    }
}
