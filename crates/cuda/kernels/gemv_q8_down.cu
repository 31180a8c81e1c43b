#include "q8act.cuh"

// The routed experts' down projection, the MoE combine and the next
// RMSNorm in one launch (int8 mode). For each output row j:
//   y_m[j] = down_m . a_m  (a_m = int8 activations xq + m*x_stride,
//            down_m = slot slots[m] of the stack), the dot of
//            gemv_q8_body step for step (same chunks per lane, same order,
//            same shuffle reduction);
//   x[j] += (sum over m = 0..k-1 of wts[m] * y_m[j]) + sh[j] * sigmoid(*sh_logit)
//            with elementwise.cu moe_combine's operation order;
// then h = RMSNorm(x) * norm_w (and its int8 form) by the last block
// (common.cuh tail_rms_norm). The same bits as gemv_q8 over the k
// experts followed by moe_combine_norm, one launch and one pass over the
// k*d outputs fewer.
// Work split: a block owns the RB = NR*32/spr rows one warp covers; its
// warps share the experts (warp w takes m = w, w+GEMV_WARPS, ...) and
// leave y_m in shared memory; then one thread per row adds them up in
// expert order. k <= DOWN_MAX_K.
// Launch: grid ceil(rows / RB), block GEMV_WARPS*32.
#define DOWN_MAX_K 32
template <class T, int NR, bool SG>
__device__ __forceinline__ void down_combine_body(
    const u8* __restrict__ w, u64 mat_bytes, const u32* __restrict__ slots, int k,
    const signed char* __restrict__ xq, const float* __restrict__ xd, long long x_stride,
    int rows, int nb, const float* __restrict__ wts, const float* __restrict__ sh,
    const float* __restrict__ sh_logit, const NormTail* __restrict__ tail) {
    constexpr int XV = T::XV, DX = T::DX;
    __shared__ uint2 sgrid[SG ? 256 : 1];
    __shared__ float ys[DOWN_MAX_K][32];
    const uint2* grid = reinterpret_cast<const uint2*>(iq2xxs_grid);
    if (SG) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) sgrid[i] = __ldg(grid + i);
        __syncthreads();
        grid = sgrid;
    }
    const int nch = nb * T::CPB;
    const int spr = q8_lanes_per_row(nch);
    const int lane = threadIdx.x & 31, cl = lane & (spr - 1), warp = threadIdx.x >> 5;
    const int rb = NR * (32 / spr);
    const int brow0 = blockIdx.x * rb;
    const int lrow0 = (lane / spr) * NR;  // this lane group's first row in the block
    const int row0 = brow0 + lrow0;
    for (int m = warp; m < k; m += GEMV_WARPS) {
        const u8* base = w + (u64)slots[m] * mat_bytes;
        const u16* dd = reinterpret_cast<const u16*>(base + (u64)rows * nb * T::PAYLOAD);
        const int4* xp = reinterpret_cast<const int4*>(xq + (long long)m * x_stride);
        const float* xdm = xd + (long long)m * (x_stride / 32);
        float acc[NR];
        const u8* rp[NR];
        const u16* dp[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) {
            acc[r] = 0.f;
            const int row = min(row0 + r, rows - 1);
            rp[r] = base + (u64)row * nb * T::PAYLOAD;
            dp[r] = dd + (u64)row * nb;
        }
        for (int c = cl; c < nch; c += 2 * spr) {
            const int c2 = c + spr;
            const bool two = c2 < nch;
            typename T::WT wa[NR], wb[NR];
            u16 da[NR], db[NR];
#pragma unroll
            for (int r = 0; r < NR; r++) {
                T::load_w(rp[r], dp[r], c, wa[r], da[r]);
                if (two) T::load_w(rp[r], dp[r], c2, wb[r], db[r]);
            }
            int4 xa[XV], xb[XV];
            float dxa[DX], dxb[DX];
            T::load_x(xp, xdm, c, xa, dxa);
            if (two) T::load_x(xp, xdm, c2, xb, dxb);
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] += T::dot(wa[r], h2f(da[r]), xa, dxa, grid, c);
            if (two) {
#pragma unroll
                for (int r = 0; r < NR; r++)
                    acc[r] += T::dot(wb[r], h2f(db[r]), xb, dxb, grid, c2);
            }
        }
#pragma unroll
        for (int r = 0; r < NR; r++) {
            float s = acc[r];
            for (int o = spr >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (cl == 0) ys[m][lrow0 + r] = s;
        }
    }
    __syncthreads();
    double ss = 0.0;
    const int t = threadIdx.x, row = brow0 + t;
    if (t < rb && row < rows) {
        float acc = 0.0f;
        for (int m = 0; m < k; m++) acc = __fadd_rn(acc, __fmul_rn(wts[m], ys[m][t]));
        if (sh) {
            const float s_sh = sh_logit ? sigmoid_f(*sh_logit) : 1.0f;
            acc = __fadd_rn(acc, __fmul_rn(sh[row], s_sh));
        }
        const float v = __fadd_rn(tail->x[row], acc);
        tail->x[row] = v;
        ss = (double)v * (double)v;
    }
    tail_rms_norm(ss, tail->counter, tail->partial, gridDim.x, blockIdx.x, tail->x, tail->norm_w,
                  tail->eps, rows, tail->h, tail->q, tail->qd);
}

#define DOWN_COMBINE_KERNEL(NAME, T, NR, SG)                                                  \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                             \
        NAME(const u8* __restrict__ w, u64 mat_bytes, const u32* __restrict__ slots, int k,   \
             const signed char* __restrict__ xq, const float* __restrict__ xd,                \
             long long x_stride, int rows, int nb, const float* __restrict__ wts,             \
             const float* __restrict__ sh, const float* __restrict__ sh_logit,                \
             const NormTail* __restrict__ tail) {                                             \
        PDL_PROLOGUE();                                                                       \
        down_combine_body<T, NR, SG>(w, mat_bytes, slots, k, xq, xd, x_stride, rows, nb, wts, \
                                     sh, sh_logit, tail);                                     \
    }

#define DOWN_COMBINE_KERNELS(PREFIX, T, SG)      \
    DOWN_COMBINE_KERNEL(PREFIX##_r1, T, 1, SG)   \
    DOWN_COMBINE_KERNEL(PREFIX##_r2, T, 2, SG)   \
    DOWN_COMBINE_KERNEL(PREFIX##_r4, T, 4, SG)

DOWN_COMBINE_KERNELS(down_combine_iq2_xxs_q8, Iq2Q8<false>, false)
DOWN_COMBINE_KERNELS(down_combine_iq2_xxs_q8s, Iq2Q8<true>, true)
DOWN_COMBINE_KERNELS(down_combine_q8_0_q8, Q80Q8, false)
DOWN_COMBINE_KERNELS(down_combine_q4_k_q8, Q4KQ8, false)
DOWN_COMBINE_KERNELS(down_combine_iq4_nl_q8, Iq4NlQ8, false)
DOWN_COMBINE_KERNELS(down_combine_q6_k_q8, Q6KQ8, false)
DOWN_COMBINE_KERNELS(down_combine_iq2_xs_q8, Iq2XsQ8, false)
DOWN_COMBINE_KERNELS(down_combine_iq1_m_q8, Iq1MQ8, false)
