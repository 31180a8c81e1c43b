#include "q8act.cuh"

// Gate, up and SwiGLU of the routed experts in one launch (int8 mode):
// out[m*rows + r] = SiLU(gate_m . x) * (up_m . x) for the n experts m of
// `slots` and their int8 form (q, qd; per 32 values, common.cuh warp_q8),
// the input of the down projection. The dots are gemv_q8_body's, step for
// step (same chunks per lane, same order, same shuffle reduction), and
// the product is swiglu's (elementwise.cu), so the result is the bits of
// gemv_gate_up_q8 followed by swiglu, one launch fewer.
//
// Work split: a warp owns NR rows of gate and the same NR rows of up
// (2*NR dots sharing each activation load); a block is 32/NR warps, i.e.
// 32 consecutive rows: one int8 block, quantized from shared memory by
// warp 0. Needs rows % 32 == 0 and a full warp per row (spr = 32: at
// least 32 chunks per row, e.g. 2048 columns of IQ2_XXS or Q4_K; the
// launcher checks and otherwise runs the two-launch path).
// Launch: grid (rows / 32, n), block 32*32/NR.
template <class T, int NR, bool SG>
__device__ __forceinline__ void gate_up_swiglu_body(
    const u8* __restrict__ wg, const u8* __restrict__ wu, u64 mat_bytes,
    const u32* __restrict__ slots, const signed char* __restrict__ xq,
    const float* __restrict__ xd, float* __restrict__ out, signed char* __restrict__ q,
    float* __restrict__ qd, int rows, int nb) {
    constexpr int XV = T::XV, DX = T::DX;
    __shared__ uint2 sgrid[SG ? 256 : 1];
    __shared__ float sv[32];
    const uint2* grid = reinterpret_cast<const uint2*>(iq2xxs_grid);
    if (SG) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) sgrid[i] = __ldg(grid + i);
        __syncthreads();
        grid = sgrid;
    }
    const int m = blockIdx.y;
    const u64 off = (u64)slots[m] * mat_bytes;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row0 = blockIdx.x * 32 + warp * NR;
    const int nch = nb * T::CPB;
    const u8* rp[2 * NR];
    const u16* dp[2 * NR];
    float acc[2 * NR];
#pragma unroll
    for (int r = 0; r < 2 * NR; r++) {
        const u8* base = (r < NR ? wg : wu) + off;
        const u16* dd = reinterpret_cast<const u16*>(base + (u64)rows * nb * T::PAYLOAD);
        const int row = row0 + (r % NR);
        acc[r] = 0.f;
        rp[r] = base + (u64)row * nb * T::PAYLOAD;
        dp[r] = dd + (u64)row * nb;
    }
    const int4* xp = reinterpret_cast<const int4*>(xq);
    for (int c = lane; c < nch; c += 64) {
        const int c2 = c + 32;
        const bool two = c2 < nch;
        typename T::WT wa[2 * NR], wb[2 * NR];
        u16 da[2 * NR], db[2 * NR];
#pragma unroll
        for (int r = 0; r < 2 * NR; r++) {
            T::load_w(rp[r], dp[r], c, wa[r], da[r]);
            if (two) T::load_w(rp[r], dp[r], c2, wb[r], db[r]);
        }
        int4 xa[XV], xb[XV];
        float dxa[DX], dxb[DX];
        T::load_x(xp, xd, c, xa, dxa);
        if (two) T::load_x(xp, xd, c2, xb, dxb);
#pragma unroll
        for (int r = 0; r < 2 * NR; r++) acc[r] += T::dot(wa[r], h2f(da[r]), xa, dxa, grid, c);
        if (two) {
#pragma unroll
            for (int r = 0; r < 2 * NR; r++)
                acc[r] += T::dot(wb[r], h2f(db[r]), xb, dxb, grid, c2);
        }
    }
#pragma unroll
    for (int r = 0; r < 2 * NR; r++) acc[r] = warp_sum(acc[r]);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < NR; r++) {
            const float v = __fmul_rn(silu_f(acc[r]), acc[NR + r]);
            out[(u64)m * rows + row0 + r] = v;
            sv[warp * NR + r] = v;
        }
    }
    __syncthreads();
    if (warp == 0) warp_q8(sv[lane], m * rows + blockIdx.x * 32 + lane, q, qd);
}

#define GATE_UP_SWIGLU_KERNEL(NAME, T, NR, SG)                                                \
    extern "C" __global__ void __launch_bounds__(1024 / NR)                                   \
        NAME(const u8* __restrict__ wg, const u8* __restrict__ wu, u64 mat_bytes,             \
             const u32* __restrict__ slots, const signed char* __restrict__ xq,               \
             const float* __restrict__ xd, float* __restrict__ out,                           \
             signed char* __restrict__ q, float* __restrict__ qd, int rows, int nb) {         \
        PDL_PROLOGUE();                                                                       \
        gate_up_swiglu_body<T, NR, SG>(wg, wu, mat_bytes, slots, xq, xd, out, q, qd, rows, nb); \
    }

#define GATE_UP_SWIGLU_KERNELS(PREFIX, T, SG)          \
    GATE_UP_SWIGLU_KERNEL(PREFIX##_r1, T, 1, SG)       \
    GATE_UP_SWIGLU_KERNEL(PREFIX##_r2, T, 2, SG)       \
    GATE_UP_SWIGLU_KERNEL(PREFIX##_r4, T, 4, SG)

GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_iq2_xxs_q8, Iq2Q8<false>, false)
GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_iq2_xxs_q8s, Iq2Q8<true>, true)
GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_q8_0_q8, Q80Q8, false)
GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_q4_k_q8, Q4KQ8, false)
GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_iq4_nl_q8, Iq4NlQ8, false)
GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_q6_k_q8, Q6KQ8, false)
GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_iq2_xs_q8, Iq2XsQ8, false)
GATE_UP_SWIGLU_KERNELS(gate_up_swiglu_iq1_m_q8, Iq1MQ8, false)
