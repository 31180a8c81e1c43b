// Gated DeltaNet state recurrence over a prefill chunk in the chunkwise
// (WY) form: sub-chunks of GDN_SUB tokens, the state carried only from one
// sub-chunk to the next (src/gdn_wy_model.rs derives it and models both
// kernels step for step). With G_t the log decays summed inside the
// sub-chunk, gamma_t = e^{G_t}, A_ts = b_t e^{G_t-G_s} k_t.k_s (s < t) and
// T = (I + A)^-1:
//     D = U - W S,  U = T (b v),  W = T (b gamma k)
//     O = diag(gamma) Q S + P D,   P_ts = e^{G_t-G_s} q_t.k_s (s <= t)
//     S' = gamma_C S + (diag(e^{G_C-G}) K)^T D
//
// gdn_wy_prep: per (sub-chunk, value head), all at once: the gates, G,
//   the dot products K K^T and Q K^T, A and P, and W, U by forward
//   substitution (a thread a column), into the scratch block of the pair
//   (wy_block floats: W^T dk x C | gamma Q^T dk x C | e^{G_C-G} K C x dk |
//   U C x dv | P^T C x C | G C). Grid (n_sub, n_v), block 256.
// gdn_wy_state_k{32,64,128}: per (32 state columns, value head), the
//   three products sub-chunk after sub-chunk, the state slice in registers
//   (and mirrored in shared memory for the products that read it whole);
//   the next sub-chunk's blocks copied in (cp.async) while the current one
//   computes, each buffer refilled as soon as its phase is done. Writes
//   o_t (unnormalised) into raw[t][h*dv + j] and the state at the end.
//   Grid (dv/32, n_v), block 256, gdn_wy_smem_floats(dk) of dynamic
//   shared memory.
//
// Tokens past the chunk's end pad the last sub-chunk with b = g = 0 and
// zero vectors: their rows of W, U, P, Q and K are zero, so they leave the
// state unchanged and only the real tokens' outputs are written.
#include "common.cuh"

#define GDN_SUB 64
// Shared rows of a 32-dimension slab in gdn_wy_prep: 64 tokens, padded to
// keep float4 alignment.
#define WY_LD 68

struct GdnWyArgs {
    const float* conv;
    const float* ba;
    long long ld_ba;
    const float* dt_bias;
    const float* ssm_a;
    float* wy;
    float* state;
    float* raw;
    int n_k, n_v, dk, dv, tokens, n_sub;
};
static_assert(sizeof(GdnWyArgs) == 88, "GdnWyArgs: layout differs from src/ops/gdn_wy.rs");

__device__ __forceinline__ float softplus_wy(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

// Floats of one (head, sub-chunk) scratch block (wy_block_floats in
// src/ops/gdn_wy.rs).
__device__ __forceinline__ long long wy_block(int dk, int dv) {
    return (long long)GDN_SUB * (3 * dk + dv + GDN_SUB + 1);
}

extern "C" __global__ void __launch_bounds__(256)
    gdn_wy_prep(__grid_constant__ const GdnWyArgs a) {
    PDL_PROLOGUE();
    __shared__ __align__(16) float sKt[32][WY_LD];
    __shared__ __align__(16) float sQt[32][WY_LD];
    __shared__ __align__(16) float sA[GDN_SUB][GDN_SUB];
    __shared__ float sG[GDN_SUB], sB[GDN_SUB];
    const int c = blockIdx.x, h = blockIdx.y, tid = threadIdx.x;
    const int r = a.n_v / a.n_k, kh = h / r, jj = h % r;
    const int dk = a.dk, dv = a.dv, kd = a.n_k * dk;
    const long long cd = 2 * kd + (long long)a.n_v * dv;
    const int t0 = c * GDN_SUB, nt = min(GDN_SUB, a.tokens - t0);
    float* blk = a.wy + ((long long)h * a.n_sub + c) * wy_block(dk, dv);
    float* wt = blk;
    float* qt = blk + dk * GDN_SUB;
    float* ks = blk + 2 * dk * GDN_SUB;
    float* u = blk + 3 * dk * GDN_SUB;
    float* pt = u + GDN_SUB * dv;
    float* gg = pt + GDN_SUB * GDN_SUB;
    const float* kbase = a.conv + kd + kh * dk;
    const float* qbase = a.conv + kh * dk;
    const float* vbase = a.conv + 2 * kd + h * dv;

    if (tid < GDN_SUB) {
        float b = 0.0f, g = 0.0f;
        if (tid < nt) {
            const float* row = a.ba + (long long)(t0 + tid) * a.ld_ba + kh * 2 * r;
            b = sigmoid_f(row[jj]);
            g = __fmul_rn(a.ssm_a[h], softplus_wy(__fadd_rn(row[r + jj], a.dt_bias[h])));
        }
        sB[tid] = b;
        sG[tid] = g;
    }
    __syncthreads();
    if (tid == 0) {
        float acc = 0.0f;
        for (int t = 0; t < GDN_SUB; t++) {
            acc = __fadd_rn(acc, sG[t]);
            sG[t] = acc;
        }
    }
    __syncthreads();
    const float g_last = sG[GDN_SUB - 1];

    // K K^T and Q K^T, 4x4 of each a thread (rows 4ti.., columns 4tj..),
    // over slabs of 32 dimensions; each slab's K and gamma Q also written
    // to the scratch in the layouts gdn_wy_state copies in.
    const int ti = tid >> 4, tj = tid & 15;
    float kk[4][4], qk[4][4];
#pragma unroll
    for (int m = 0; m < 4; m++)
#pragma unroll
        for (int n = 0; n < 4; n++) kk[m][n] = qk[m][n] = 0.0f;
    for (int e0 = 0; e0 < dk; e0 += 32) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int idx = tid + 256 * i, t = idx >> 3, e = 4 * (idx & 7);
            float4 k4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f), q4 = k4;
            if (t < nt) {
                k4 = *reinterpret_cast<const float4*>(kbase + (t0 + t) * cd + e0 + e);
                q4 = *reinterpret_cast<const float4*>(qbase + (t0 + t) * cd + e0 + e);
            }
            sKt[e][t] = k4.x, sKt[e + 1][t] = k4.y, sKt[e + 2][t] = k4.z, sKt[e + 3][t] = k4.w;
            sQt[e][t] = q4.x, sQt[e + 1][t] = q4.y, sQt[e + 2][t] = q4.z, sQt[e + 3][t] = q4.w;
            const float gk = expf(__fsub_rn(g_last, sG[t]));
            *reinterpret_cast<float4*>(ks + t * dk + e0 + e) =
                make_float4(__fmul_rn(gk, k4.x), __fmul_rn(gk, k4.y), __fmul_rn(gk, k4.z),
                            __fmul_rn(gk, k4.w));
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int idx = tid + 256 * i, e = idx >> 4, t = 4 * (idx & 15);
            const float4 q4 = *reinterpret_cast<const float4*>(&sQt[e][t]);
            *reinterpret_cast<float4*>(qt + (e0 + e) * GDN_SUB + t) =
                make_float4(__fmul_rn(expf(sG[t]), q4.x), __fmul_rn(expf(sG[t + 1]), q4.y),
                            __fmul_rn(expf(sG[t + 2]), q4.z), __fmul_rn(expf(sG[t + 3]), q4.w));
        }
#pragma unroll 8
        for (int e = 0; e < 32; e++) {
            const float4 ki = *reinterpret_cast<const float4*>(&sKt[e][4 * ti]);
            const float4 kj = *reinterpret_cast<const float4*>(&sKt[e][4 * tj]);
            const float4 qi = *reinterpret_cast<const float4*>(&sQt[e][4 * ti]);
            const float kiv[4] = {ki.x, ki.y, ki.z, ki.w}, kjv[4] = {kj.x, kj.y, kj.z, kj.w};
            const float qiv[4] = {qi.x, qi.y, qi.z, qi.w};
#pragma unroll
            for (int m = 0; m < 4; m++)
#pragma unroll
                for (int n = 0; n < 4; n++) {
                    kk[m][n] = fmaf(kiv[m], kjv[n], kk[m][n]);
                    qk[m][n] = fmaf(qiv[m], kjv[n], qk[m][n]);
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < 4; n++) {
        const int j = 4 * tj + n;
        float p[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int i = 4 * ti + m;
            // e^{G_i - G_j} only where j <= i (it may overflow above).
            const float decay = j <= i ? expf(__fsub_rn(sG[i], sG[j])) : 0.0f;
            sA[i][j] = j < i ? __fmul_rn(__fmul_rn(sB[i], decay), kk[m][n]) : 0.0f;
            p[m] = j <= i ? __fmul_rn(decay, qk[m][n]) : 0.0f;
        }
        *reinterpret_cast<float4*>(pt + j * GDN_SUB + 4 * ti) = make_float4(p[0], p[1], p[2], p[3]);
    }
    if (tid < GDN_SUB) gg[tid] = sG[tid];
    __syncthreads();

    // W | U by forward substitution, a column a thread:
    // x_t = rhs_t - sum_{s<t} A_ts x_s.
    for (int col = tid; col < dk + dv; col += blockDim.x) {
        float x[GDN_SUB];
        const bool is_w = col < dk;
#pragma unroll
        for (int t = 0; t < GDN_SUB; t++) {
            float v = 0.0f;
            if (t < nt) {
                if (is_w)
                    v = __fmul_rn(__fmul_rn(sB[t], expf(sG[t])), kbase[(t0 + t) * cd + col]);
                else
                    v = __fmul_rn(sB[t], vbase[(t0 + t) * cd + col - dk]);
            }
            x[t] = v;
        }
#pragma unroll
        for (int t = 1; t < GDN_SUB; t++) {
            float acc = x[t];
#pragma unroll
            for (int s = 0; s < t; s++) acc = fmaf(-sA[t][s], x[s], acc);
            x[t] = acc;
        }
        if (is_w) {
#pragma unroll
            for (int t = 0; t < GDN_SUB; t += 4)
                *reinterpret_cast<float4*>(wt + col * GDN_SUB + t) =
                    make_float4(x[t], x[t + 1], x[t + 2], x[t + 3]);
        } else {
#pragma unroll
            for (int t = 0; t < GDN_SUB; t++) u[t * dv + col - dk] = x[t];
        }
    }
}

#define WY_COLS 32

template <int RE>
__device__ __forceinline__ void gdn_wy_state_body(const GdnWyArgs& a) {
    constexpr int DK = 32 * RE, C = GDN_SUB, WC = WY_COLS;
    extern __shared__ __align__(16) float wy_smem[];
    float* bW = wy_smem;      // W^T, DK x C
    float* bQ = bW + DK * C;  // gamma Q^T, DK x C
    float* bK = bQ + DK * C;  // e^{G_C-G} K, C x DK
    float* bP = bK + C * DK;  // P^T, C x C
    float* bU = bP + C * C;   // U's columns of this block, C x WC
    float* sS = bU + C * WC;  // the state slice, DK x WC
    float* sD = sS + DK * WC; // D, C x WC
    const int jb = blockIdx.x * WC, h = blockIdx.y, tid = threadIdx.x;
    const int dv = a.dv;
    const long long nvdv = (long long)a.n_v * dv, bsz = wy_block(DK, dv);
    const float* blk0 = a.wy + (long long)h * a.n_sub * bsz;
    float* st = a.state + (long long)h * DK * dv;

    // The state update's ownership: rows eg + 32m, columns jc..jc+3.
    const int eg = tid >> 3, jc = 4 * (tid & 7);
    float S[RE][4];
#pragma unroll
    for (int m = 0; m < RE; m++) {
#pragma unroll
        for (int n = 0; n < 4; n++) S[m][n] = st[(long long)(eg + 32 * m) * dv + jb + jc + n];
        *reinterpret_cast<float4*>(&sS[(eg + 32 * m) * WC + jc]) =
            make_float4(S[m][0], S[m][1], S[m][2], S[m][3]);
    }
    // The products' ownership: rows (tokens) 4tt.., columns 2tj, 2tj+1.
    const int tt = tid >> 4, tj = tid & 15;

    auto load_wu = [&](int c) {
        const float* b = blk0 + c * bsz;
        for (int i = tid; i < DK * C / 4; i += 256) cp_async16(bW + 4 * i, b + 4 * i);
        const float* ub = b + 3 * DK * C + jb;
        for (int i = tid; i < C * WC / 4; i += 256) {
            const int t = i / (WC / 4), q = 4 * (i % (WC / 4));
            cp_async16(bU + t * WC + q, ub + (long long)t * dv + q);
        }
    };
    auto load_qp = [&](int c) {
        const float* b = blk0 + c * bsz;
        for (int i = tid; i < DK * C / 4; i += 256) cp_async16(bQ + 4 * i, b + DK * C + 4 * i);
        const float* pb = b + 3 * DK * C + (long long)C * dv;
        for (int i = tid; i < C * C / 4; i += 256) cp_async16(bP + 4 * i, pb + 4 * i);
    };
    auto load_k = [&](int c) {
        const float* b = blk0 + c * bsz + 2 * DK * C;
        for (int i = tid; i < C * DK / 4; i += 256) cp_async16(bK + 4 * i, b + 4 * i);
    };
    load_wu(0);
    cp_async_commit();
    load_qp(0);
    cp_async_commit();
    load_k(0);
    cp_async_commit();
    for (int c = 0; c < a.n_sub; c++) {
        const bool more = c + 1 < a.n_sub;
        const float gc = expf(blk0[c * bsz + 3 * DK * C + (long long)C * dv + C * C + C - 1]);
        cp_async_wait<2>();
        __syncthreads();
        // D = U - W S.
        {
            float acc[4][2] = {};
#pragma unroll 8
            for (int e = 0; e < DK; e++) {
                const float4 w4 = *reinterpret_cast<const float4*>(&bW[e * C + 4 * tt]);
                const float2 s2 = *reinterpret_cast<const float2*>(&sS[e * WC + 2 * tj]);
                const float wv[4] = {w4.x, w4.y, w4.z, w4.w};
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    acc[m][0] = fmaf(wv[m], s2.x, acc[m][0]);
                    acc[m][1] = fmaf(wv[m], s2.y, acc[m][1]);
                }
            }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int t = 4 * tt + m;
                const float2 u2 = *reinterpret_cast<const float2*>(&bU[t * WC + 2 * tj]);
                *reinterpret_cast<float2*>(&sD[t * WC + 2 * tj]) =
                    make_float2(__fsub_rn(u2.x, acc[m][0]), __fsub_rn(u2.y, acc[m][1]));
            }
        }
        __syncthreads();
        if (more) load_wu(c + 1);
        cp_async_commit();
        cp_async_wait<2>();
        __syncthreads();
        // O = gamma Q S + P D.
        {
            float acc[4][2] = {};
#pragma unroll 8
            for (int e = 0; e < DK; e++) {
                const float4 q4 = *reinterpret_cast<const float4*>(&bQ[e * C + 4 * tt]);
                const float2 s2 = *reinterpret_cast<const float2*>(&sS[e * WC + 2 * tj]);
                const float qv[4] = {q4.x, q4.y, q4.z, q4.w};
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    acc[m][0] = fmaf(qv[m], s2.x, acc[m][0]);
                    acc[m][1] = fmaf(qv[m], s2.y, acc[m][1]);
                }
            }
#pragma unroll 8
            for (int s = 0; s < C; s++) {
                const float4 p4 = *reinterpret_cast<const float4*>(&bP[s * C + 4 * tt]);
                const float2 d2 = *reinterpret_cast<const float2*>(&sD[s * WC + 2 * tj]);
                const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int m = 0; m < 4; m++) {
                    acc[m][0] = fmaf(pv[m], d2.x, acc[m][0]);
                    acc[m][1] = fmaf(pv[m], d2.y, acc[m][1]);
                }
            }
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int tok = c * C + 4 * tt + m;
                if (tok < a.tokens)
                    *reinterpret_cast<float2*>(&a.raw[tok * nvdv + h * dv + jb + 2 * tj]) =
                        make_float2(acc[m][0], acc[m][1]);
            }
        }
        __syncthreads();
        if (more) load_qp(c + 1);
        cp_async_commit();
        cp_async_wait<2>();
        __syncthreads();
        // S' = gamma_C S + K^T D (K already scaled by e^{G_C-G}).
        {
            float acc[RE][4] = {};
#pragma unroll 4
            for (int t = 0; t < C; t++) {
                const float4 d4 = *reinterpret_cast<const float4*>(&sD[t * WC + jc]);
#pragma unroll
                for (int m = 0; m < RE; m++) {
                    const float kv = bK[t * DK + eg + 32 * m];
                    acc[m][0] = fmaf(kv, d4.x, acc[m][0]);
                    acc[m][1] = fmaf(kv, d4.y, acc[m][1]);
                    acc[m][2] = fmaf(kv, d4.z, acc[m][2]);
                    acc[m][3] = fmaf(kv, d4.w, acc[m][3]);
                }
            }
#pragma unroll
            for (int m = 0; m < RE; m++) {
#pragma unroll
                for (int n = 0; n < 4; n++) S[m][n] = fmaf(S[m][n], gc, acc[m][n]);
                *reinterpret_cast<float4*>(&sS[(eg + 32 * m) * WC + jc]) =
                    make_float4(S[m][0], S[m][1], S[m][2], S[m][3]);
            }
        }
        __syncthreads();
        if (more) load_k(c + 1);
        cp_async_commit();
    }
#pragma unroll
    for (int m = 0; m < RE; m++)
#pragma unroll
        for (int n = 0; n < 4; n++) st[(long long)(eg + 32 * m) * dv + jb + jc + n] = S[m][n];
}

#define GDN_WY_STATE(NAME, RE)                                                                \
    extern "C" __global__ void __launch_bounds__(256) NAME(__grid_constant__ const GdnWyArgs a) { \
        PDL_PROLOGUE();                                                                       \
        gdn_wy_state_body<RE>(a);                                                             \
    }

// RE = dk / 32 state rows a thread (the launcher picks the variant).
GDN_WY_STATE(gdn_wy_state_k32, 1)
GDN_WY_STATE(gdn_wy_state_k64, 2)
GDN_WY_STATE(gdn_wy_state_k128, 4)
