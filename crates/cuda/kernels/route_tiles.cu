// The routed tile list of a prefill chunk, built on the device from the
// chunk's top-k (full expert residency: nothing goes to the host, so the
// grouped GEMMs follow the top-k on the stream without a host round trip).
// The result is entry for entry that of the host's `route_tiles`
// (crates/cuda/src/gemv/gemm.rs):
//
//   pairs sorted by expert, then by (token, choice) index j = t*k + i;
//   gather[p] = the token of pair p; pair_of[j] = the pair of (t, i);
//   tiles = (expert, p0, p1) of at most RT_TILE pairs, experts ascending;
//   *n_tiles = their count.
//
// One block. The pairs are cut into one contiguous segment per warp. Pass
// 1: each warp walks its segment 32 pairs at a time and counts each
// expert's pairs into its own row of shared counters (`__match_any_sync`
// groups the lanes of one expert; the lowest of them adds the group's
// size). Then per expert an exclusive sum down the warps' rows (where each
// warp's pairs of it start within the expert) and a block-wide exclusive
// sum over experts of the pair counts (where each expert starts) and of
// the tile counts (where its tiles start). Pass 2: each warp walks its
// segment again in the same order and places pair j at expert start +
// the warp's offset + the pairs of that expert it placed before, + the
// lane's rank in its group: so within an expert the pairs keep their
// order of j, as the host's counting sort leaves them, and every run
// places them alike (no atomics whose order could vary).
//
// Counters are u16 (RT_SHARED of them: warps * n_expert <= RT_SHARED):
// exact while no expert has more than 65535 pairs, which holds for chunks
// of up to 65535 tokens as a token's k choices are distinct experts (the
// launcher checks the chunk). An expert id >= n_expert (the router never
// writes one) is read as n_expert - 1: wrong but in bounds.
//
// Launch: one block of 32 * warps threads, warps = min(32, RT_SHARED /
// n_expert); 1 <= n_expert <= RT_MAX_EXPERT, k >= 1, n_pairs a multiple
// of k; tiles holds ceil(n_pairs / RT_TILE) + min(n_pairs, n_expert)
// triples (the most a list can have: an expert of c pairs has ceil(c /
// RT_TILE) <= c / RT_TILE + 1 tiles), gather and pair_of n_pairs ints.
#include "common.cuh"

#define RT_TILE 64
#define RT_SHARED 16384
#define RT_MAX_EXPERT 1024
// Expert ids loaded ahead per lane: the loads of a batch are in flight at
// once instead of one load latency per 32 pairs.
#define RT_BATCH 8
#define RT_NONE 0xffffffffu

// The ids of pairs base + 32 u + lane (u < RT_BATCH) below j1, clamped to
// the expert range; RT_NONE past j1 (a key no expert has).
__device__ __forceinline__ void rt_load(const u32* experts, int base, int j1, int n_expert,
                                        u32 (&ids)[RT_BATCH]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < RT_BATCH; u++) {
        const int j = base + 32 * u + lane;
        ids[u] = j < j1 ? min(__ldg(experts + j), (u32)(n_expert - 1)) : RT_NONE;
    }
}

// Inclusive scan of a pair of counts across one warp.
__device__ __forceinline__ void rt_warp_scan2(int& x, int& y, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int xu = __shfl_up_sync(0xffffffffu, x, o);
        const int yu = __shfl_up_sync(0xffffffffu, y, o);
        if (lane >= o) {
            x += xu;
            y += yu;
        }
    }
}

// Exclusive block-wide sums of a and b in thread order (in place);
// returns the total of b (every thread). `ws`: 64 ints of shared scratch.
__device__ __forceinline__ int rt_scan2(int& a, int& b, int* ws) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = a, y = b;
    rt_warp_scan2(x, y, lane);
    if (lane == 31) {
        ws[warp] = x;
        ws[32 + warp] = y;
    }
    __syncthreads();
    if (warp == 0) {
        int wx = lane < nw ? ws[lane] : 0, wy = lane < nw ? ws[32 + lane] : 0;
        rt_warp_scan2(wx, wy, lane);
        ws[lane] = wx;
        ws[32 + lane] = wy;
    }
    __syncthreads();
    a = (warp > 0 ? ws[warp - 1] : 0) + x - a;
    b = (warp > 0 ? ws[32 + warp - 1] : 0) + y - b;
    return ws[32 + nw - 1];
}

extern "C" __global__ void __launch_bounds__(1024)
    route_tiles(const u32* __restrict__ experts, int n_pairs, int k, int n_expert,
                int* __restrict__ tiles, int* __restrict__ gather, int* __restrict__ pair_of,
                int* __restrict__ n_tiles) {
    PDL_PROLOGUE();
    // cnt[w * n_expert + e]: after pass 1 the pairs of expert e in warp
    // w's segment; then where those start within the expert's pairs; in
    // pass 2 advanced by each group placed.
    __shared__ unsigned short cnt[RT_SHARED];
    // Per expert its pair count, then where its pairs start.
    __shared__ int start[RT_MAX_EXPERT];
    __shared__ int ws[64];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const int E = n_expert;
    for (int i = tid; i < nw * E; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    const int seg = (n_pairs + nw - 1) / nw;
    const int j0 = min(warp * seg, n_pairs), j1 = min(j0 + seg, n_pairs);
    unsigned short* mine = cnt + warp * E;
    const unsigned below = (1u << lane) - 1;
    for (int base = j0; base < j1; base += 32 * RT_BATCH) {
        u32 ids[RT_BATCH];
        rt_load(experts, base, j1, E, ids);
#pragma unroll
        for (int u = 0; u < RT_BATCH; u++) {
            const u32 e = ids[u];
            const unsigned same = __match_any_sync(0xffffffffu, e);
            if (e != RT_NONE && (same & below) == 0) mine[e] += __popc(same);
            // The same expert's next group may have another lane as its
            // leader: this update must be visible to it.
            __syncwarp();
        }
    }
    __syncthreads();
    // Thread tid owns the experts [e0, e1): the warps' offsets within each
    // (a sum down its column), then the pair and tile counts of its
    // experts, summed over the block in expert order.
    const int per = (E + blockDim.x - 1) / blockDim.x;
    const int e0 = min(tid * per, E), e1 = min(e0 + per, E);
    int pairs = 0, ntile = 0;
    for (int e = e0; e < e1; e++) {
        int c = 0;
        for (int w = 0; w < nw; w++) {
            const int v = cnt[w * E + e];
            cnt[w * E + e] = (unsigned short)c;
            c += v;
        }
        start[e] = c;
        pairs += c;
        ntile += (c + RT_TILE - 1) / RT_TILE;
    }
    const int total_tiles = rt_scan2(pairs, ntile, ws);
    // pairs, ntile: where the first of this thread's experts starts.
    for (int e = e0; e < e1; e++) {
        const int c = start[e], end = pairs + c;
        start[e] = pairs;
        for (int p = pairs; p < end; p += RT_TILE, ntile++) {
            tiles[3 * ntile] = e;
            tiles[3 * ntile + 1] = p;
            tiles[3 * ntile + 2] = min(p + RT_TILE, end);
        }
        pairs = end;
    }
    if (tid == 0) *n_tiles = total_tiles;
    __syncthreads();
    for (int base = j0; base < j1; base += 32 * RT_BATCH) {
        u32 ids[RT_BATCH];
        rt_load(experts, base, j1, E, ids);
#pragma unroll
        for (int u = 0; u < RT_BATCH; u++) {
            const u32 e = ids[u];
            const unsigned same = __match_any_sync(0xffffffffu, e);
            if (e != RT_NONE) {
                const int j = base + 32 * u + lane;
                const int p = start[e] + mine[e] + __popc(same & below);
                gather[p] = j / k;
                pair_of[j] = p;
            }
            // Every lane of the group has read mine[e] before its leader
            // advances it, and the advance is visible to the next group.
            __syncwarp();
            if (e != RT_NONE && (same & below) == 0) mine[e] += __popc(same);
            __syncwarp();
        }
    }
}
