#include "gemv_q8act.cuh"

// The down projection with the SwiGLU in its prologue (`*_q8_r2_swiglu`):
// each block computes out = SiLU(g) * u for its matrix's `cols` inputs
// (g and u at blockIdx.y * gu_stride) and quantizes them to int8 in shared
// memory, with swiglu's and quantize_q8_32's arithmetic (elementwise.cu,
// common.cuh warp_q8), then runs the GEMV on them: bit for bit the
// results of swiglu + gemv_*_q8_r2 (gemv_q8act.cu), one launch fewer a layer. Every block
// redoes the SwiGLU of its matrix (cols values, a few KB from L2): the
// work is cheaper than the dependent launch it replaces, and no block
// waits for another (the "last block finishes" fusions measured slower,
// docs/what-did-not-work.md). cols % 32 == 0, cols <= SWIGLU_MAX_COLS and
// cols = the matrix's columns (checked by the launcher); all matrices from
// w (n_first = the grid's y).
#define SWIGLU_MAX_COLS 2048
template <class T, int NR>
__device__ __forceinline__ void gemv_q8_swiglu_body(const u8* __restrict__ w, u64 mat_bytes,
                                                    const u32* __restrict__ slots,
                                                    const float* __restrict__ g,
                                                    const float* __restrict__ u,
                                                    long long gu_stride, int cols,
                                                    float* __restrict__ y, int rows, int nb) {
    __shared__ __align__(16) signed char sxq[SWIGLU_MAX_COLS];
    __shared__ __align__(16) float sxd[SWIGLU_MAX_COLS / 32];
    const long long off = (long long)blockIdx.y * gu_stride;
    // Whole warps per step (blockDim and cols are multiples of 32), as
    // warp_q8 needs.
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = __fmul_rn(silu_f(g[off + i]), u[off + i]);
        warp_q8(v, i, sxq, sxd);
    }
    __syncthreads();
    gemv_q8_body<T, NR, false, true>(w, w, (int)gridDim.y, mat_bytes, slots, sxq, sxd, 0, y, rows,
                                     nb);
}

#define GEMV_Q8_SWIGLU_KERNEL(NAME, T, NR)                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                               \
        NAME(const u8* __restrict__ w, u64 mat_bytes, const u32* __restrict__ slots,            \
             const float* __restrict__ g, const float* __restrict__ u, long long gu_stride,     \
             int cols, float* __restrict__ y, int rows, int nb) {                               \
        gemv_q8_prefetch<T, NR>(w, w, (int)gridDim.y, mat_bytes, slots, rows, nb);              \
        PDL_PROLOGUE();                                                                         \
        gemv_q8_swiglu_body<T, NR>(w, mat_bytes, slots, g, u, gu_stride, cols, y, rows, nb);   \
    }

GEMV_Q8_SWIGLU_KERNEL(gemv_iq2_xxs_q8_r2_swiglu, Iq2Q8<false>, 2)
GEMV_Q8_SWIGLU_KERNEL(gemv_q8_0_q8_r2_swiglu, Q80Q8, 2)
GEMV_Q8_SWIGLU_KERNEL(gemv_q4_k_q8_r2_swiglu, Q4KQ8, 2)
GEMV_Q8_SWIGLU_KERNEL(gemv_iq4_nl_q8_r2_swiglu, Iq4NlQ8, 2)
GEMV_Q8_SWIGLU_KERNEL(gemv_q6_k_q8_r2_swiglu, Q6KQ8, 2)
GEMV_Q8_SWIGLU_KERNEL(gemv_iq2_xs_q8_r2_swiglu, Iq2XsQ8, 2)
GEMV_Q8_SWIGLU_KERNEL(gemv_iq1_m_q8_r2_swiglu, Iq1MQ8, 2)
