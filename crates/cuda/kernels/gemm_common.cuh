// Prefill GEMM on tensor cores: a chunk of activation rows times one
// quantized matrix (a dense projection), or the (token, expert) pairs of a
// chunk times their experts' matrices (grouped: one tile list over every
// expert of a layer).
//
//     y[p*ldy + row] = sum_k W_m[row][k] * x[src(p)*ldx + k]
//
// W_m: matrix m of a stack in the device layout of gemv_common.cuh (the
// slot table maps m to its slot; null: m itself); src(p) = gather[p] when a
// gather list is given (the pairs' tokens), else p. x is f32, or f16 when
// `xh` is given instead (the prefill converts each GEMM input once:
// to_f16_rows in elementwise.cu), with ldx in elements either way.
//
// Tiles: BM = 64 weight rows x BN = 64 activation rows, K in steps of
// BK = 128 values (four 32-value lane chunks of a row: half a 256-value
// block, or four 32-value blocks). Per step every thread dequantizes two
// chunks of weights with the format's `deq` (the same decode as its GEMV's
// `dot`, one value per output) into shared memory as f16, and converts 64
// activations to f16; then each of the 4 warps multiplies its 32 x 32
// sub-tile with mma.sync m16n8k16 (f16 in, f32 accumulate). Shared rows
// are padded to 136 halves (68 words): the fragment loads of a warp's 8
// row groups x 4 column pairs then hit 32 distinct banks.
//
// The kernel is bound by the L1/shared-memory data path (Nsight Compute on
// the H200: L1/TEX throughput 97% at 33% SM issue), so the loads are laid
// out for few L1 wavefronts: a warp reads one activation row's 128 values
// of a step as 32 consecutive float4 (one request over four full lines;
// the tile's row offsets are looked up once, into shared memory), and the
// codebook formats (IQ2_XXS, IQ2_XS: `GEMM_TABLE` entries of `T::table`)
// read their grid from a copy in shared memory rather than through L1,
// where a warp's 32 random entries of a 2-4 KB table cost up to 32
// wavefronts a lookup; dequantized weights go to shared memory in 16-byte
// stores.
#pragma once
#include "gemv_common.cuh"

#define GEMM_BM 64
#define GEMM_BN 64
#define GEMM_BK 128
#define GEMM_LDS (GEMM_BK + 8)
#define GEMM_THREADS 128

// Kernel arguments, one struct (mirrored by `GemmArgs` in
// src/prefill/gemm.rs, #[repr(C)]; field order and types must match). The
// read-only pointers are read through __ldg explicitly: NVRTC drops
// __restrict__ on struct members.
struct GemmArgs {
    const u8* w;
    u64 mat_bytes;
    const u32* slots;
    const int* tiles;
    const float* x;
    const u16* xh;
    const int* gather;
    float* y;
    const int* n_tiles_dev;  // the tile count, written on the device (null: the grid's)
    long long ldx;
    long long ldy;
    int rows;
    int nb;
    int n;
    int pad;
};

// Entries of the format's codebook staged into shared memory (0: none;
// a format with `TABLE` entries has `table()` and a `deq` that takes the
// staged copy).
template <class T, class = void>
struct gemm_table {
    static constexpr int n = 0;
};
template <class T>
struct gemm_table<T, decltype(void(T::TABLE))> {
    static constexpr int n = T::TABLE;
};

template <class T>
__device__ __forceinline__ void gemm_body(const GemmArgs& a) {
    if (a.n_tiles_dev && (int)blockIdx.y >= __ldg(a.n_tiles_dev)) return;
    __shared__ __align__(16) u16 As[GEMM_BM * GEMM_LDS];
    __shared__ __align__(16) u16 Bs[GEMM_BN * GEMM_LDS];
    // Float offset of each activation row of the tile (-1: past its end).
    __shared__ long long xoff[GEMM_BN];
    constexpr int NTAB = gemm_table<T>::n;
    __shared__ __align__(16) u64 stab[NTAB > 0 ? NTAB : 1];
    const int ty = blockIdx.y;
    int m = 0, p0, p1;
    if (a.tiles) {
        m = __ldg(a.tiles + 3 * ty);
        p0 = __ldg(a.tiles + 3 * ty + 1);
        p1 = __ldg(a.tiles + 3 * ty + 2);
    } else {
        p0 = ty * GEMM_BN;
        p1 = min(p0 + GEMM_BN, a.n);
    }
    const u8* base = a.w + (u64)(a.slots ? __ldg(a.slots + m) : (u32)m) * a.mat_bytes;
    const u16* dd = reinterpret_cast<const u16*>(base + (u64)a.rows * a.nb * T::PAYLOAD);
    const int r0 = blockIdx.x * GEMM_BM;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    const int wm = (warp >> 1) * 32, wn = (warp & 1) * 32;
    const int K = a.nb * T::QK;
    const int nchunks = a.nb * T::LPB;
    float acc[2][4][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    if (tid < GEMM_BN) {
        const int bp = p0 + tid;
        xoff[tid] = bp < p1 ? (long long)(a.gather ? __ldg(a.gather + bp) : bp) * a.ldx : -1;
    }
    if constexpr (NTAB > 0) {
        for (int i = tid; i < NTAB; i += GEMM_THREADS) stab[i] = T::table(i);
    }
    __syncthreads();

    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        // Weights: 64 rows x 4 chunks, two chunks a thread.
#pragma unroll
        for (int jb = 0; jb < 2; jb++) {
            const int job = tid + jb * GEMM_THREADS;
            const int rr = job >> 2, cc = job & 3;
            const int row = r0 + rr;
            const int ch = k0 / 32 + cc;
            float v[32];
            const int sub = ch % T::LPB;
            if (row < a.rows && ch < nchunks) {
                const u64 bi = (u64)row * a.nb + ch / T::LPB;
                if constexpr (NTAB > 0)
                    T::deq(base + bi * T::PAYLOAD, dd + bi * side_words<T>::v, sub, v, stab);
                else
                    T::deq(base + bi * T::PAYLOAD, dd + bi * side_words<T>::v, sub, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.0f;
            }
            const int cb = (ch / T::LPB) * T::QK - k0;  // the block's first column in the tile
            u16* dst = As + rr * GEMM_LDS + cb;
            // 16-byte stores: every format's `col` keeps 8 consecutive
            // values in consecutive columns, 8-aligned. (32-bit stores of
            // this lane layout put a warp's 32 words in 8 banks.)
#pragma unroll
            for (int i = 0; i < 32; i += 8) {
                uint4 h;
                h.x = pack_h2(v[i], v[i + 1]);
                h.y = pack_h2(v[i + 2], v[i + 3]);
                h.z = pack_h2(v[i + 4], v[i + 5]);
                h.w = pack_h2(v[i + 6], v[i + 7]);
                *reinterpret_cast<uint4*>(dst + T::col(sub, i)) = h;
            }
        }
        if (a.xh) {
            // f16 activations (converted once per input, not once per
            // tile of weight rows): rows q*8 + 2*warp + lane/16, 8 values
            // a lane, two rows' 256 contiguous bytes a warp request.
#pragma unroll 4
            for (int q = 0; q < GEMM_BN / 8; q++) {
                const int brow = q * 8 + 2 * warp + (lane >> 4);
                const int k = k0 + 8 * (lane & 15);
                const long long off = xoff[brow];
                uint4 h = {0u, 0u, 0u, 0u};
                if (off >= 0 && k < K) h = __ldg(reinterpret_cast<const uint4*>(a.xh + off + k));
                *reinterpret_cast<uint4*>(Bs + brow * GEMM_LDS + 8 * (lane & 15)) = h;
            }
        } else {
            // f32 activations: row q*4 + warp of the tile, values
            // 4*lane.. of the step: a warp reads one row's 512 contiguous
            // bytes.
#pragma unroll 4
            for (int q = 0; q < GEMM_BN / 4; q++) {
                const int brow = q * 4 + warp;
                const int k = k0 + 4 * lane;
                const long long off = xoff[brow];
                float4 f = {0.f, 0.f, 0.f, 0.f};
                if (off >= 0 && k < K) f = __ldg(reinterpret_cast<const float4*>(a.x + off + k));
                uint2 h;
                h.x = pack_h2(f.x, f.y);
                h.y = pack_h2(f.z, f.w);
                *reinterpret_cast<uint2*>(Bs + brow * GEMM_LDS + 4 * lane) = h;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            // Fragments by ldmatrix: A's four 8x8 pieces are (rows 0-7 |
            // 8-15) x (k 0-7 | 8-15), lane l naming row l%16 at k 8(l/16);
            // B's are (n 0-7, k 0-7), (n 0-7, k 8-15), then the same for
            // n 8-15: two n8 fragments a load.
            u32 af[2][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
                ldmatrix_x4(af[mi], As + (wm + mi * 16 + (lane & 15)) * GEMM_LDS + kk + 8 * (lane >> 4));
#pragma unroll
            for (int nj = 0; nj < 2; nj++) {
                u32 r[4];
                const int j = lane >> 3;
                ldmatrix_x4(r, Bs + (wn + nj * 16 + 8 * (j >> 1) + (lane & 7)) * GEMM_LDS + kk + 8 * (j & 1));
                bf[2 * nj][0] = r[0];
                bf[2 * nj][1] = r[1];
                bf[2 * nj + 1][0] = r[2];
                bf[2 * nj + 1][1] = r[3];
            }
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int ni = 0; ni < 4; ni++) mma_16816(acc[mi][ni], af[mi], bf[ni]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 4; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = r0 + wm + mi * 16 + g + (e >> 1) * 8;
                const int p = p0 + wn + ni * 8 + 2 * c + (e & 1);
                if (row < a.rows && p < p1) a.y[(long long)p * a.ldy + row] = acc[mi][ni][e];
            }
}

#define GEMM_KERNEL(NAME, T)                                                          \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS) NAME(const GemmArgs a) { \
        PDL_PROLOGUE();                                                               \
        gemm_body<T>(a);                                                              \
    }
