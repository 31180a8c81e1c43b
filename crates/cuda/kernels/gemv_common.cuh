// Decode GEMV (one activation vector) over quantized weights held in the
// device layout of src/layout.rs: a matrix of `rows` x `nb` blocks is
//
//     [rows*nb payload blocks of T::PAYLOAD bytes][rows*nb f16 scales]
//
// (Q5_0: side entries of 3 u16, d and the fifth bits; see side_words)
//
// where the payload is the GGUF block with its f16 `d` moved out (so every
// payload is 16-byte aligned and read with 128/64-bit loads); Q4_K keeps its
// block whole (144 bytes, already aligned) and has no scale array.
//
// Launch: grid (ceil(rows / (GEMV_WARPS*NR)), n_mats), block GEMV_WARPS*32.
// Matrix m = blockIdx.y starts at w + (slots ? slots[m] : m) * mat_bytes
// (the expert slot table: kernels see slots, never expert ids), reads
// x + m*x_stride (x_stride 0: one shared vector) and writes y + m*rows.
//
// Work split: each warp owns NR consecutive rows. A row's blocks are cut
// into T::LPB lane chunks of 32 values each; the warp's 32 lanes walk the
// chunks of its rows in step (lane c takes chunk c, c+32, ...), load the 32
// activations of their chunk once (float4 loads) and reuse them for the NR
// rows, then each row is reduced with warp shuffles.
#pragma once
#include "common.cuh"

#define GEMV_WARPS 4

// u16 words of the side array per block (`moved / 2` in src/layout.rs): 1
// (the f16 d) unless the format says otherwise with `SIDE_WORDS` (Q5_0: 3,
// d and the fifth bits; 0: blocks kept whole, no side array). T::dot gets
// its block's side entry.
template <class T, class = void>
struct side_words {
    static constexpr int v = 1;
};
template <class T>
struct side_words<T, decltype(void(T::SIDE_WORDS))> {
    static constexpr int v = T::SIDE_WORDS;
};

// Rows [r0, r1) of the matrix at `base` (rows x nb blocks) into L2: their
// payload, then their side entries (`side_bytes` per block; 0 where the
// format keeps its blocks whole). Issued before the PDL wait (common.cuh).
__device__ __forceinline__ void gemv_prefetch_rows(const u8* base, int rows, int nb, int payload,
                                                   int side_bytes, int r0, int r1) {
    if (r0 >= r1) return;
    l2_prefetch(base + (u64)r0 * nb * payload, (u64)(r1 - r0) * nb * payload);
    if (side_bytes)
        l2_prefetch(base + (u64)rows * nb * payload + (u64)r0 * nb * side_bytes,
                    (u64)(r1 - r0) * nb * side_bytes);
}

// The rows a block of gemv_body reads, into L2 (the slot read as a hint).
template <class T, int NR>
__device__ __forceinline__ void gemv_prefetch(const u8* w, u64 mat_bytes, const u32* slots,
                                              int rows, int nb) {
    const int m = blockIdx.y;
    const u8* base = w + (u64)slot_hint(slots, m) * mat_bytes;
    const int r0 = blockIdx.x * GEMV_WARPS * NR;
    gemv_prefetch_rows(base, rows, nb, T::PAYLOAD, 2 * side_words<T>::v, r0,
                       min(r0 + GEMV_WARPS * NR, rows));
}

template <class T, int NR, int U>
__device__ __forceinline__ void gemv_body(const u8* __restrict__ w, u64 mat_bytes,
                                          const u32* __restrict__ slots,
                                          const float* __restrict__ x, long long x_stride,
                                          float* __restrict__ y, int rows, int nb) {
    const int m = blockIdx.y;
    const u8* base = w + (u64)(slots ? slots[m] : (u32)m) * mat_bytes;
    const u16* dd = reinterpret_cast<const u16*>(base + (u64)rows * nb * T::PAYLOAD);
    x += (long long)m * x_stride;
    y += (u64)m * rows;
    const int lane = threadIdx.x & 31;
    const int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * NR;
    if (row0 >= rows) return;
    float acc[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) acc[r] = 0.0f;
    const int nchunks = nb * T::LPB;
    // U = 2: chunks c and c+32 in one straight-line body (the second
    // clamped to the last chunk and weighted 0 past the end), so the loads
    // of both are issued before the math of either.
    for (int c = lane; c < nchunks; c += 32 * U) {
        float xv[U][32];
        int cc[U];
        float keep[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            cc[u] = min(c + 32 * u, nchunks - 1);
            keep[u] = (c + 32 * u < nchunks) ? 1.0f : 0.0f;
            T::load_x(x + (u64)(cc[u] / T::LPB) * T::QK, cc[u] % T::LPB, xv[u]);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const int row = min(row0 + r, rows - 1);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const u64 bi = (u64)row * nb + cc[u] / T::LPB;
                const float d = T::dot(base + bi * T::PAYLOAD, dd + bi * side_words<T>::v,
                                      cc[u] % T::LPB, xv[u]);
                acc[r] = U == 1 ? acc[r] + d : fmaf(keep[u], d, acc[r]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        const float s = warp_sum(acc[r]);
        if (lane == 0 && row0 + r < rows) y[row0 + r] = s;
    }
}

#define GEMV_KERNEL(NAME, T, NR, U)                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                          \
        NAME(const u8* __restrict__ w, u64 mat_bytes, const u32* __restrict__ slots,        \
             const float* __restrict__ x, long long x_stride, float* __restrict__ y,        \
             int rows, int nb) {                                                            \
        gemv_prefetch<T, NR>(w, mat_bytes, slots, rows, nb);                                \
        PDL_PROLOGUE();                                                                     \
        gemv_body<T, NR, U>(w, mat_bytes, slots, x, x_stride, y, rows, nb);                   \
    }

// Rows per warp 1, 2 and 4, one chunk per step (`_rN`) or two (`_rNx2`):
// `redlite bench kernels` measures all six.
#define GEMV_KERNELS(PREFIX, T)          \
    GEMV_KERNEL(PREFIX##_r1, T, 1, 1)    \
    GEMV_KERNEL(PREFIX##_r2, T, 2, 1)    \
    GEMV_KERNEL(PREFIX##_r4, T, 4, 1)    \
    GEMV_KERNEL(PREFIX##_r1x2, T, 1, 2)  \
    GEMV_KERNEL(PREFIX##_r2x2, T, 2, 2)  \
    GEMV_KERNEL(PREFIX##_r4x2, T, 4, 2)
