// One Gated DeltaNet decode step, fused (crates/model/src/blocks/deltanet.rs
// and crates/cpu/src/deltanet.rs for one token): causal depthwise conv over
// q|k|v with the conv window, SiLU, L2 norm of q and k per head (eps
// l2_eps, sum of squares in f64), q * 1/sqrt(dk), beta = sigmoid(b),
// g = ssm_a * softplus(a + dt_bias), the state update
//     S <- e^g S;  u = S^T k;  delta = beta (v - u);  S <- S + k delta^T;  o = S^T q
// and the gated RMSNorm o <- RMSNorm(o) * norm_w * SiLU(z) (sum in f64).
//
// Work split: value head h (key head kh = h / (n_v / n_k)) is spread over a
// thread-block cluster of C blocks (gdn_step_c4 / _c2 / _c1, C = 4, 2, 1;
// the launcher picks the largest that fits, GdnDims::split). Block
// c = blockIdx.x % C of head h = blockIdx.x / C owns the W = dv / C state
// columns j0 = c*W .. j0+W-1. Columns are independent in the update, so a
// block needs only its own columns plus the head's q, k (each block redoes
// the cheap conv + L2 norm of the key head's 2*dk channels), its W v
// channels and the gates. One block per head (the first version) left 100
// of 132 SMs idle and moved each head's 128 KiB of state serially; with
// C = 4 there are 4x the blocks, each with a quarter of the traffic.
// Only the gated RMSNorm needs all dv outputs of the head: the C partial
// f64 sums of squares are exchanged through distributed shared memory of
// the cluster (sm_90). Why a cluster and not a "last block finishes"
// atomic counter in global memory: no counter buffer to allocate and reset
// between graph replays (a stale counter after an aborted launch would
// silently break every later token), no output round trip through global
// memory and no extra pass by one block: every block gets the head's sum
// after one cluster barrier and writes its own normed columns itself.
//
// Inputs:
//   qkv   conv input of this token: [q (n_k*dk) | k (n_k*dk) | v (n_v*dv)]
//   z     n_v*dv;  ba: per key head [b (r) | a (r)], r = n_v / n_k
//   conv_w [conv_dim][K] taps, oldest first
//   ring  [K][conv_dim]: the last inputs, position p in slot p % K; slots
//         of positions < 0 are zero. This token's input goes to slot
//         pos % K, which no block reads this step (the window is
//         pos-K+1..pos-1), so blocks can run in any order. Each entry has
//         one writer: a v channel is written by the block owning its column,
//         the q/k channels of a key head by block 0 of the first value head
//         sharing it (the other blocks reading them compute the same conv).
//   state [n_v][dk][dv] (S[i][j]: key index i, value index j)
// Output: out[h*dv + j]; q8, q8d (nullable): also as int8 activations for
// the ssm_out GEMV (common.cuh warp_q8; needs W % 32 == 0 so that a warp's
// 32 columns are one 32-aligned quantization group).
//
// Threads: (j = t % W, p = t / W): column j0+j of the state, rows p, p+P,
// ... (P = blockDim / W), held in registers across the update.
// Limits (checked by the launcher, GdnDims::check / split): dv divides
// blockDim, dk <= P*MAXR, dk <= 256, dv <= 512, K <= 8.
#include "common.cuh"

#define GDN_THREADS 512

__device__ __forceinline__ float softplus_f(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Thread-block cluster helpers (sm_90), as PTX: NVRTC here has no CUDA
// headers (no cooperative_groups). Every thread of every block of the
// cluster must execute each barrier (.aligned: warp-uniformly).
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
}
__device__ __forceinline__ void cluster_wait_acquire() {
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The double at shared address `p` of this block, read in the cluster's
// block `rank` (the same variable there).
__device__ __forceinline__ double ld_cluster_f64(const double* p, u32 rank) {
    u32 a, ra;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(a), "r"(rank));
    double v;
    asm volatile("ld.shared::cluster.f64 %0, [%1];" : "=d"(v) : "r"(ra) : "memory");
    return v;
}

template <int C, int MAXR>
__device__ __forceinline__ void gdn_step_body(
    const float* __restrict__ qkv, const float* __restrict__ z, const float* __restrict__ ba,
    const float* __restrict__ conv_w, const float* __restrict__ dt_bias,
    const float* __restrict__ ssm_a, const float* __restrict__ norm_w, float* __restrict__ ring,
    float* __restrict__ state, float* __restrict__ out, signed char* __restrict__ q8,
    float* __restrict__ q8d, const int* __restrict__ pos_p, int n_k, int n_v, int dk, int dv,
    int K, float eps, float l2_eps) {
    // part: this block's partial sums of squares of the norm, one per warp
    // of the p == 0 threads (W <= 512: at most 16), read by the cluster.
    __shared__ double scratch2[64], part[16];
    __shared__ float sq[256], sk[256], sv[512], red[GDN_THREADS], red2[GDN_THREADS];
    const int h = blockIdx.x / C, c = blockIdx.x % C, t = threadIdx.x;
    const int r = n_v / n_k, kh = h / r;
    const int kd = n_k * dk, cd = 2 * kd + n_v * dv;
    const int W = dv / C, j0 = c * W;
    const int pos = *pos_p;
    const int cur = pos % K;
    const int j = t % W, p = t / W, P = blockDim.x / W;
    const int nw = (int)(blockDim.x >> 5);
    float* st = state + (long long)h * dk * dv + j0;

    // 0. Issue the loads that do not depend on the conv first (the state
    // column slice and the gate inputs), so their latency overlaps steps 1-2.
    float sr[MAXR];
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        const int i = p + P * q;
        if (i < dk) sr[q] = st[(long long)i * dv + j];
    }
    const int jj = h % r;
    const float b_in = ba[kh * 2 * r + jj], a_in = ba[kh * 2 * r + r + jj];
    const float dtb = dt_bias[h], sa_h = ssm_a[h];

    // 1. conv + SiLU for the channels this block reads: the key head's q
    // and k, this block's v columns; the sums of squares of q and k on the
    // way (f64).
    double a = 0.0, b = 0.0;
    for (int c0 = t; c0 < 2 * dk + W; c0 += blockDim.x) {
        const int ch = c0 < dk       ? kh * dk + c0
                       : c0 < 2 * dk ? kd + kh * dk + (c0 - dk)
                                     : 2 * kd + h * dv + j0 + (c0 - 2 * dk);
        const float* wc = conv_w + (long long)ch * K;
        // The window taps' loads three at a time, then their sum in tap
        // order: a rolled loop waited for each tap's loads in turn (K-1
        // memory round trips in series). Three: all of them for the usual
        // K = 4 in one round trip; four spilled under the 64-register cap.
        const float x = qkv[ch], wl = wc[K - 1];
        float s = 0.0f;
        const int s0 = (pos + 1) % K;  // slot of the oldest window position
        for (int k0 = 0; k0 < K - 1; k0 += 3) {
            float wk[3], rk[3];
#pragma unroll
            for (int k = 0; k < 3; k++) {
                if (k0 + k < K - 1) {
                    const int slot = s0 + k0 + k;
                    wk[k] = wc[k0 + k];
                    rk[k] = ring[(slot < K ? slot : slot - K) * cd + ch];
                }
            }
#pragma unroll
            for (int k = 0; k < 3; k++)
                if (k0 + k < K - 1) s = __fadd_rn(s, __fmul_rn(wk[k], rk[k]));
        }
        s = __fadd_rn(s, __fmul_rn(wl, x));
        if (c0 >= 2 * dk || (jj == 0 && c == 0)) ring[(long long)cur * cd + ch] = x;
        const float y = silu_f(s);
        if (c0 < dk) {
            sq[c0] = y;
            a += (double)y * y;
        } else if (c0 < 2 * dk) {
            sk[c0 - dk] = y;
            b += (double)y * y;
        } else {
            sv[c0 - 2 * dk] = y;
        }
    }
    // 2. L2 norms of q and k (applied on the fly below, with the same
    // roundings as scaling q and k in place: k*sb, (q*sa)*1/sqrt(dk)).
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    if ((t & 31) == 0) {
        scratch2[t >> 5] = a;
        scratch2[32 + (t >> 5)] = b;
    }
    // 3. gates (independent of the conv; overlap the barrier).
    const float beta = sigmoid_f(b_in);
    const float g = __fmul_rn(sa_h, softplus_f(__fadd_rn(a_in, dtb)));
    const float decay = expf(g);
    __syncthreads();  // sq, sk, sv and scratch2 complete
    a = 0.0;
    b = 0.0;
    for (int w = 0; w < nw; w++) {
        a += scratch2[w];
        b += scratch2[32 + w];
    }
    const float sa = (float)(1.0 / sqrt(a + (double)l2_eps));
    const float sb = (float)(1.0 / sqrt(b + (double)l2_eps));
    const float qscale = 1.0f / sqrtf((float)dk);

    // Needed only for the output: loaded here rather than with the state
    // above, so they do not hold registers across the conv (the update
    // below still hides their latency).
    const float zz = p == 0 ? z[(long long)h * dv + j0 + j] : 0.0f;
    const float nw_j = p == 0 ? norm_w[j0 + j] : 0.0f;

    // 4. state update.
    float u = 0.0f;
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        const int i = p + P * q;
        if (i < dk) {
            sr[q] = __fmul_rn(sr[q], decay);
            u = fmaf(sr[q], __fmul_rn(sk[i], sb), u);
        }
    }
    red[t] = u;
    __syncthreads();
    // Every thread sums its column's partials itself (same order in all of
    // them): one barrier fewer than a delta broadcast through shared memory.
    float uu = 0.0f;
    for (int pp = 0; pp < P; pp++) uu += red[pp * W + j];
    const float dj = __fmul_rn(beta, __fsub_rn(sv[j], uu));
    float o = 0.0f;
#pragma unroll
    for (int q = 0; q < MAXR; q++) {
        const int i = p + P * q;
        if (i < dk) {
            sr[q] = fmaf(__fmul_rn(sk[i], sb), dj, sr[q]);
            st[(long long)i * dv + j] = sr[q];
            o = fmaf(sr[q], __fmul_rn(__fmul_rn(sq[i], sa), qscale), o);
        }
    }
    red2[t] = o;  // a second buffer: red may still be read above
    __syncthreads();

    // 5. gated RMSNorm over the head's dv outputs: this block's W columns
    // (threads p == 0, warps 0 .. ceil(W/32)-1), then the cluster's blocks.
    float oj = 0.0f;
    if (p == 0) {
        for (int pp = 0; pp < P; pp++) oj += red2[pp * W + j];
    }
    const int nwp = (W + 31) >> 5;
    if (t < nwp * 32) {
        double v = p == 0 ? (double)oj * oj : 0.0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if ((t & 31) == 0) part[t >> 5] = v;
    }
    // Release part to the cluster, acquire the other blocks' (also the
    // block's own barrier for part).
    cluster_arrive_release();
    cluster_wait_acquire();
    double ss = 0.0;
    if (p == 0) {
        // Same order (block 0's warps first) in every block of the head.
        for (int cc = 0; cc < C; cc++)
            for (int w = 0; w < nwp; w++) ss += ld_cluster_f64(&part[w], (u32)cc);
    }
    // Done with the other blocks' shared memory; they must not exit before
    // these reads are performed (their part would go away): release orders
    // the reads before the arrival, the wait before returning.
    cluster_arrive_release();
    if (p == 0) {
        const float s = (float)(1.0 / sqrt(ss / (double)dv + (double)eps));
        const float y = __fmul_rn(__fmul_rn(__fmul_rn(oj, s), nw_j), silu_f(zz));
        out[(long long)h * dv + j0 + j] = y;
        // threads 0..W-1: whole warps of consecutive, 32-aligned indices
        // (W % 32 == 0 where q8 is given)
        if (q8) warp_q8(y, h * dv + j0 + j, q8, q8d);
    }
    cluster_wait_acquire();
}

// Before the PDL wait: this block's state slice (dk rows of W = dv / C
// floats, dv apart) into L2. The state is only written by this layer's
// step, tokens ago, so the lines are current. (Also prefetching the conv
// taps and window measured 2% slower: docs/what-did-not-work.md.) Not
// inlined: inlined, its loop cost gdn_step_c4 spills under the 64-register
// cap.
template <int C>
__device__ __noinline__ void gdn_prefetch(const float* state, int dk, int dv) {
    const int h = blockIdx.x / C, c = blockIdx.x % C, W = dv / C;
    const float* st = state + (long long)h * dk * dv + c * W;
    const int lpr = (W + 31) / 32;  // 128-byte lines per row slice
    for (int e = threadIdx.x; e < dk * lpr; e += blockDim.x)
        l2_prefetch_line(st + (long long)(e / lpr) * dv + 32 * (e % lpr));
}

#define GDN_PARAMS                                                                                \
    const float *__restrict__ qkv, const float *__restrict__ z, const float *__restrict__ ba,    \
        const float *__restrict__ conv_w, const float *__restrict__ dt_bias,                      \
        const float *__restrict__ ssm_a, const float *__restrict__ norm_w,                        \
        float *__restrict__ ring, float *__restrict__ state, float *__restrict__ out,             \
        signed char *__restrict__ q8, float *__restrict__ q8d, const int *__restrict__ pos_p,     \
        int n_k, int n_v, int dk, int dv, int K, float eps, float l2_eps
#define GDN_ARGS                                                                               \
    qkv, z, ba, conv_w, dt_bias, ssm_a, norm_w, ring, state, out, q8, q8d, pos_p, n_k, n_v, dk, \
        dv, K, eps, l2_eps

// Grid n_v * C, cluster (C, 1, 1) fixed at compile time, so the plain
// launch paths (with or without PDL) need no cluster attribute. MAXR, the
// state rows a thread holds (dk <= MAXR * 512 / W): 8 for C = 4 (dk <= 128
// at dv = 128, the models' shape), 16 for C = 2, 32 for C = 1.
// gdn_step_c4 at two blocks per SM (<= 64 registers, which hold its 8 rows
// without spills): a cluster's blocks must fit in one GPC at once, and at
// one block per SM the 32 clusters of 4 of a 32-head layer would need
// every GPC's SMs in groups of 4, which the 132-SM H200 may not offer (a
// second wave would double the time); it also leaves room for the
// neighbouring kernels' blocks that PDL overlaps with it. C = 2 and 1 (test
// shapes, small dv) need more registers and take one block per SM.
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 2) __cluster_dims__(4, 1, 1)
    gdn_step_c4(GDN_PARAMS) {
    gdn_prefetch<4>(state, dk, dv);
    PDL_PROLOGUE();
    gdn_step_body<4, 8>(GDN_ARGS);
}
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 1) __cluster_dims__(2, 1, 1)
    gdn_step_c2(GDN_PARAMS) {
    gdn_prefetch<2>(state, dk, dv);
    PDL_PROLOGUE();
    gdn_step_body<2, 16>(GDN_ARGS);
}
extern "C" __global__ void __launch_bounds__(GDN_THREADS, 1) __cluster_dims__(1, 1, 1)
    gdn_step_c1(GDN_PARAMS) {
    gdn_prefetch<1>(state, dk, dv);
    PDL_PROLOGUE();
    gdn_step_body<1, 32>(GDN_ARGS);
}
