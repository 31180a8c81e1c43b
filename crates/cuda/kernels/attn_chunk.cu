// Prefill attention: a chunk of query tokens over the KV cache, causal
// (token t at position pos0 + t sees positions 0..pos0+t, the chunk's own
// rows included: attn_prep_chunk appended them before this launch).
//
// One warp per (token, query head): lane l holds dims l*DPL..l*DPL+DPL of
// q and of the unnormalised output (hd = 32*DPL), and keeps the online
// softmax max m and sum l. Keys go four at a time (their loads issued
// together, four warp reductions interleaved). Rows are token-major over
// the query heads of one KV head (blockIdx.y), so the warps of a block
// share K and V rows through L1.
//
// q [tokens][n_head][hd] (normed, rotated); caches [ctx][n_kv][hd], f32 or
// f16; gate (nullable): head h's gate values of token t at
// gate[t*gate_ld + h*2*hd + j] (the q_full rows, gate part); out
// [tokens][n_head][hd] = softmax(q k^T * scale) v (* sigmoid(gate)).
//
// Grid (ceil(tokens * n_head/n_kv / ACH_WARPS), n_kv), block ACH_WARPS*32.
#include "common.cuh"

#define ACH_WARPS 8

template <int DPL>
__device__ __forceinline__ void ach_load(const float* __restrict__ p, float* v) {
    if constexpr (DPL % 4 == 0) {
#pragma unroll
        for (int i = 0; i < DPL / 4; i++) {
            const float4 a = __ldg(reinterpret_cast<const float4*>(p) + i);
            v[4 * i] = a.x;
            v[4 * i + 1] = a.y;
            v[4 * i + 2] = a.z;
            v[4 * i + 3] = a.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < DPL / 2; i++) {
            const float2 a = __ldg(reinterpret_cast<const float2*>(p) + i);
            v[2 * i] = a.x;
            v[2 * i + 1] = a.y;
        }
    }
}

template <int DPL>
__device__ __forceinline__ void ach_load(const u16* __restrict__ p, float* v) {
    u32 w[DPL / 2];
    if constexpr (DPL == 8) {
        const uint4 a = __ldg(reinterpret_cast<const uint4*>(p));
        w[0] = a.x;
        w[1] = a.y;
        w[2] = a.z;
        w[3] = a.w;
    } else if constexpr (DPL == 4) {
        const uint2 a = __ldg(reinterpret_cast<const uint2*>(p));
        w[0] = a.x;
        w[1] = a.y;
    } else {
        w[0] = __ldg(reinterpret_cast<const unsigned int*>(p));
    }
#pragma unroll
    for (int i = 0; i < DPL / 2; i++) {
        v[2 * i] = h2f((u16)(w[i] & 0xffffu));
        v[2 * i + 1] = h2f((u16)(w[i] >> 16));
    }
}

template <typename T, int DPL>
__device__ __forceinline__ void attn_chunk_body(const float* __restrict__ q,
                                                const T* __restrict__ kc,
                                                const T* __restrict__ vc,
                                                const float* __restrict__ gate, long long gate_ld,
                                                float* __restrict__ out, int n_head, int n_kv,
                                                int pos0, int tokens, float scale) {
    constexpr int HD = 32 * DPL;
    const int r = n_head / n_kv;
    const int g = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * ACH_WARPS + (threadIdx.x >> 5);
    if (row >= tokens * r) return;  // a whole warp; no block barriers below
    const int t = row / r, h = g * r + row % r;
    const int pos = pos0 + t;
    float qv[DPL], o[DPL];
    ach_load<DPL>(q + ((long long)t * n_head + h) * HD + lane * DPL, qv);
#pragma unroll
    for (int i = 0; i < DPL; i++) o[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    const long long stride = (long long)n_kv * HD;
    const T* kp = kc + (long long)g * HD + lane * DPL;
    const T* vp = vc + (long long)g * HD + lane * DPL;
    for (int j = 0; j <= pos; j += 4) {
        float s[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            s[u] = 0.0f;
            if (j + u <= pos) {
                float kv[DPL];
                ach_load<DPL>(kp + (long long)(j + u) * stride, kv);
#pragma unroll
                for (int i = 0; i < DPL; i++) s[u] = fmaf(qv[i], kv[i], s[u]);
            }
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int u = 0; u < 4; u++) s[u] += __shfl_xor_sync(0xffffffffu, s[u], off);
        float mn = m;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            s[u] = j + u <= pos ? s[u] * scale : -INFINITY;
            mn = fmaxf(mn, s[u]);
        }
        const float corr = expf(m - mn);  // m = -inf at the start: 0
        l *= corr;
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] *= corr;
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (j + u <= pos) {
                const float p = expf(s[u] - mn);
                l += p;
                float vv[DPL];
                ach_load<DPL>(vp + (long long)(j + u) * stride, vv);
#pragma unroll
                for (int i = 0; i < DPL; i++) o[i] = fmaf(p, vv[i], o[i]);
            }
        }
        m = mn;
    }
    const float inv = 1.0f / l;
    float* dst = out + ((long long)t * n_head + h) * HD + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        float y = o[i] * inv;
        if (gate) y = __fmul_rn(y, sigmoid_f(gate[t * gate_ld + (long long)h * 2 * HD + lane * DPL + i]));
        dst[i] = y;
    }
}

#define ATTN_CHUNK(NAME, T, DPL)                                                                 \
    extern "C" __global__ void __launch_bounds__(ACH_WARPS * 32)                                 \
        NAME(const float* __restrict__ q, const T* __restrict__ kc, const T* __restrict__ vc,    \
             const float* __restrict__ gate, long long gate_ld, float* __restrict__ out,         \
             int n_head, int n_kv, int pos0, int tokens, float scale) {                          \
        PDL_PROLOGUE();                                                                          \
        attn_chunk_body<T, DPL>(q, kc, vc, gate, gate_ld, out, n_head, n_kv, pos0, tokens,       \
                                scale);                                                          \
    }

ATTN_CHUNK(attn_chunk_d64, float, 2)
ATTN_CHUNK(attn_chunk_d128, float, 4)
ATTN_CHUNK(attn_chunk_d256, float, 8)
ATTN_CHUNK(attn_chunk_kvf16_d64, u16, 2)
ATTN_CHUNK(attn_chunk_kvf16_d128, u16, 4)
ATTN_CHUNK(attn_chunk_kvf16_d256, u16, 8)
