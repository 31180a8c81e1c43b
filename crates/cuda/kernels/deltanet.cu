// One Gated DeltaNet decode step, fused (crates/model/src/blocks/deltanet.rs
// and crates/cpu/src/deltanet.rs for one token): causal depthwise conv over
// q|k|v with the conv window, SiLU, L2 norm of q and k per head (eps
// l2_eps, sum of squares in f64), q * 1/sqrt(dk), beta = sigmoid(b),
// g = ssm_a * softplus(a + dt_bias), the state update
//     S <- e^g S;  u = S^T k;  delta = beta (v - u);  S <- S + k delta^T;  o = S^T q
// and the gated RMSNorm o <- RMSNorm(o) * norm_w * SiLU(z) (sum in f64).
//
// One block per value head h (key head kh = h / (n_v / n_k)). Inputs:
//   qkv   conv input of this token: [q (n_k*dk) | k (n_k*dk) | v (n_v*dv)]
//   z     n_v*dv;  ba: per key head [b (r) | a (r)], r = n_v / n_k
//   conv_w [conv_dim][K] taps, oldest first
//   ring  [K][conv_dim]: the last inputs, position p in slot p % K; slots
//         of positions < 0 are zero. This token's input goes to slot
//         pos % K, which no block reads this step (the window is
//         pos-K+1..pos-1), so the value heads sharing a key head can run in
//         any order; the q/k channels are written by the first of them.
//   state [n_v][dk][dv] (S[i][j]: key index i, value index j)
// Output: out[h*dv + j]; q8, q8d (nullable): also as int8 activations for
// the ssm_out GEMV (common.cuh warp_q8; dv % 32 == 0).
//
// Threads: (j = t % dv, p = t / dv): column j of the state, rows p, p+P, ...
// (P = blockDim / dv), held in registers across the update.
// Limits (checked by the launcher): dv divides blockDim, dk <= P*GDN_MAXR,
// dk <= 256, dv <= 512, K <= 8.
#include "common.cuh"

#define GDN_THREADS 512
#define GDN_MAXR 32

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

extern "C" __global__ void __launch_bounds__(GDN_THREADS)
    gdn_step(const float* __restrict__ qkv, const float* __restrict__ z,
             const float* __restrict__ ba, const float* __restrict__ conv_w,
             const float* __restrict__ dt_bias, const float* __restrict__ ssm_a,
             const float* __restrict__ norm_w, float* __restrict__ ring,
             float* __restrict__ state, float* __restrict__ out, signed char* __restrict__ q8,
             float* __restrict__ q8d, const int* __restrict__ pos_p,
             int n_k, int n_v, int dk, int dv, int K, float eps, float l2_eps) {
    PDL_PROLOGUE();
    __shared__ double scratch[32], scratch2[64];
    __shared__ float sq[256], sk[256], sv[512], red[GDN_THREADS], sdelta[512];
    const int h = blockIdx.x, t = threadIdx.x;
    const int r = n_v / n_k, kh = h / r;
    const int kd = n_k * dk, cd = 2 * kd + n_v * dv;
    const int pos = *pos_p;
    const int cur = pos % K;
    const int j = t % dv, p = t / dv, P = blockDim.x / dv;
    const bool active = p < P;  // blockDim a multiple of dv: always
    float* st = state + (long long)h * dk * dv;

    // 0. Issue the loads that do not depend on the conv first (the state
    // column slice, the gate inputs, z and the norm weight), so their
    // latency overlaps steps 1-3.
    float sr[GDN_MAXR];
#pragma unroll
    for (int q = 0; q < GDN_MAXR; q++) {
        const int i = p + P * q;
        if (active && i < dk) sr[q] = st[(long long)i * dv + j];
    }
    const int jj = h % r;
    const float b_in = ba[kh * 2 * r + jj], a_in = ba[kh * 2 * r + r + jj];
    const float dtb = dt_bias[h], sa_h = ssm_a[h];
    const float zz = p == 0 ? z[(long long)h * dv + j] : 0.0f;
    const float nw = p == 0 ? norm_w[j] : 0.0f;

    // 1. conv + SiLU for the channels this head reads.
    for (int c0 = t; c0 < 2 * dk + dv; c0 += blockDim.x) {
        const int c = c0 < dk ? kh * dk + c0 : c0 < 2 * dk ? kd + kh * dk + (c0 - dk)
                                                           : 2 * kd + h * dv + (c0 - 2 * dk);
        const float* wc = conv_w + (long long)c * K;
        float s = 0.0f;
        for (int j = 0; j < K - 1; j++)
            s = __fadd_rn(s, __fmul_rn(wc[j], ring[(long long)((pos + 1 + j) % K) * cd + c]));
        const float x = qkv[c];
        s = __fadd_rn(s, __fmul_rn(wc[K - 1], x));
        if (c0 >= 2 * dk || h % r == 0) ring[(long long)cur * cd + c] = x;
        const float y = silu_f(s);
        if (c0 < dk) sq[c0] = y;
        else if (c0 < 2 * dk) sk[c0 - dk] = y;
        else sv[c0 - 2 * dk] = y;
    }
    __syncthreads();

    // 2. L2 norms of q and k, q scaled by 1/sqrt(dk).
    double a = 0.0, b = 0.0;
    if (t < dk) {
        a = (double)sq[t] * sq[t];
        b = (double)sk[t] * sk[t];
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if ((t & 31) == 0) {
        scratch2[t >> 5] = a;
        scratch2[32 + (t >> 5)] = b;
    }
    __syncthreads();
    a = 0.0;
    b = 0.0;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
        a += scratch2[w];
        b += scratch2[32 + w];
    }
    const float sa = (float)(1.0 / sqrt(a + (double)l2_eps));
    const float sb = (float)(1.0 / sqrt(b + (double)l2_eps));
    const float qscale = 1.0f / sqrtf((float)dk);
    __syncthreads();
    if (t < dk) {
        sq[t] = __fmul_rn(__fmul_rn(sq[t], sa), qscale);
        sk[t] = __fmul_rn(sk[t], sb);
    }
    // 3. gates.
    const float beta = sigmoid_f(b_in);
    const float g = __fmul_rn(sa_h, softplus_f(__fadd_rn(a_in, dtb)));
    const float decay = expf(g);
    __syncthreads();

    // 4. state update.
    float u = 0.0f;
#pragma unroll
    for (int q = 0; q < GDN_MAXR; q++) {
        const int i = p + P * q;
        if (active && i < dk) {
            sr[q] = __fmul_rn(sr[q], decay);
            u = fmaf(sr[q], sk[i], u);
        }
    }
    red[t] = u;
    __syncthreads();
    if (p == 0) {
        float uu = 0.0f;
        for (int pp = 0; pp < P; pp++) uu += red[pp * dv + j];
        sdelta[j] = __fmul_rn(beta, __fsub_rn(sv[j], uu));
    }
    __syncthreads();
    const float dj = sdelta[j];
    float o = 0.0f;
#pragma unroll
    for (int q = 0; q < GDN_MAXR; q++) {
        const int i = p + P * q;
        if (active && i < dk) {
            sr[q] = fmaf(sk[i], dj, sr[q]);
            st[(long long)i * dv + j] = sr[q];
            o = fmaf(sr[q], sq[i], o);
        }
    }
    __syncthreads();
    red[t] = o;
    __syncthreads();

    // 5. gated RMSNorm over the head's dv outputs.
    float oj = 0.0f;
    if (p == 0) {
        for (int pp = 0; pp < P; pp++) oj += red[pp * dv + j];
    }
    const double ss = block_sum_f64(p == 0 ? (double)oj * oj : 0.0, scratch);
    const float s = (float)(1.0 / sqrt(ss / (double)dv + (double)eps));
    if (p == 0) {
        const float y = __fmul_rn(__fmul_rn(__fmul_rn(oj, s), nw), silu_f(zz));
        out[(long long)h * dv + j] = y;
        // threads 0..dv-1: whole warps of consecutive j (dv % 32 == 0)
        if (q8) warp_q8(y, h * dv + j, q8, q8d);
    }
}
