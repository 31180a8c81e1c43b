// Prefill GEMM on tensor cores: a chunk of activation rows times one
// quantized matrix (a dense projection), or the (token, expert) pairs of a
// chunk times their experts' matrices (grouped: one tile list over every
// expert of a layer).
//
//     y[p*ldy + row] = sum_k W_m[row][k] * x[src(p)*ldx + k]
//
// W_m: matrix m of a stack in the device layout of gemv_common.cuh (the
// slot table maps m to its slot; null: m itself); src(p) = gather[p] when a
// gather list is given (the pairs' tokens), else p.
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
// Grid: (ceil(rows / 64), tiles); tile y is (m, p0, p1) from `tiles` (3
// ints each), or with tiles null m = 0, p0 = 64*y, p1 = min(p0 + 64, n).
// Block 128. Activations in f16 (llama.cpp's cuBLAS path rounds them the
// same way); the weights' f16 images are exact for the 2-8 bit formats'
// products of small integers and f16 scales up to f16's range.
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
    const int* gather;
    float* y;
    long long ldx;
    long long ldy;
    int rows;
    int nb;
    int n;
    int pad;
};

template <class T>
__device__ __forceinline__ void gemm_body(const GemmArgs& a) {
    __shared__ __align__(16) u16 As[GEMM_BM * GEMM_LDS];
    __shared__ __align__(16) u16 Bs[GEMM_BN * GEMM_LDS];
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

    // This thread's activation row of the tile (two threads a row, 64
    // values each).
    const int brow = tid >> 1, bk = (tid & 1) * 64;
    const int bp = p0 + brow;
    const float* xrow = nullptr;
    if (bp < p1) xrow = a.x + (long long)(a.gather ? __ldg(a.gather + bp) : bp) * a.ldx;

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
                T::deq(base + bi * T::PAYLOAD, dd + bi * side_words<T>::v, sub, v);
            } else {
#pragma unroll
                for (int i = 0; i < 32; i++) v[i] = 0.0f;
            }
            const int cb = (ch / T::LPB) * T::QK - k0;  // the block's first column in the tile
            u16* dst = As + rr * GEMM_LDS + cb;
#pragma unroll
            for (int i = 0; i < 32; i += 2)
                *reinterpret_cast<u32*>(dst + T::col(sub, i)) = pack_h2(v[i], v[i + 1]);
        }
        // Activations: 64 values of this thread's row.
        {
            u16* dst = Bs + brow * GEMM_LDS + bk;
#pragma unroll
            for (int q = 0; q < 16; q++) {
                const int k = k0 + bk + 4 * q;
                float4 f = {0.f, 0.f, 0.f, 0.f};
                if (xrow && k < K) f = __ldg(reinterpret_cast<const float4*>(xrow + k));
                uint2 h;
                h.x = pack_h2(f.x, f.y);
                h.y = pack_h2(f.z, f.w);
                *reinterpret_cast<uint2*>(dst + 4 * q) = h;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_BK; kk += 16) {
            u32 af[2][4], bf[4][2];
#pragma unroll
            for (int mi = 0; mi < 2; mi++) {
                const u16* r_lo = As + (wm + mi * 16 + g) * GEMM_LDS + kk + 2 * c;
                const u16* r_hi = r_lo + 8 * GEMM_LDS;
                af[mi][0] = *reinterpret_cast<const u32*>(r_lo);
                af[mi][1] = *reinterpret_cast<const u32*>(r_hi);
                af[mi][2] = *reinterpret_cast<const u32*>(r_lo + 8);
                af[mi][3] = *reinterpret_cast<const u32*>(r_hi + 8);
            }
#pragma unroll
            for (int ni = 0; ni < 4; ni++) {
                const u16* r = Bs + (wn + ni * 8 + g) * GEMM_LDS + kk + 2 * c;
                bf[ni][0] = *reinterpret_cast<const u32*>(r);
                bf[ni][1] = *reinterpret_cast<const u32*>(r + 8);
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
