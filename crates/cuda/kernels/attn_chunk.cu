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
        if (gate) y = __fmul_rn(y, sigmoid_f(__ldg(&gate[t * gate_ld + (long long)h * 2 * HD + lane * DPL + i])));
        dst[i] = y;
    }
}

// The arguments of every attn_chunk_* and attn_flash_* kernel, one struct
// passed by value (mirrored by `AttnChunkArgs` in src/ops/chunk.rs,
// #[repr(C)]: same field order and types; the caches are float or u16 (f16
// bits) by kernel). NVRTC applies `__restrict__` only to kernel
// parameters, so the bodies read q, the caches and the gate through __ldg
// (ach_load, fa_kv2 and the gate and Q loads). The warp kernels take the
// struct as __grid_constant__, the flash kernels as a plain by-value
// parameter: each the form whose registers stay at the separate
// parameters' (docs/cuda.md, "Kernel arguments"; with __grid_constant__
// attn_flash_d64 took 118 registers instead of 96).
struct AttnChunkArgs {
    const float* q;
    const void* kc;
    const void* vc;
    const float* gate;
    long long gate_ld;
    float* out;
    int n_head, n_kv, pos0, tokens;
    float scale;
    int pad;
};
static_assert(sizeof(AttnChunkArgs) == 72, "AttnChunkArgs: layout differs from src/ops/chunk.rs");

#define ATTN_CHUNK(NAME, T, DPL)                                                                 \
    extern "C" __global__ void __launch_bounds__(ACH_WARPS * 32)                                 \
        NAME(__grid_constant__ const AttnChunkArgs a) {                                          \
        PDL_PROLOGUE();                                                                          \
        attn_chunk_body<T, DPL>(a.q, (const T*)a.kc, (const T*)a.vc, a.gate, a.gate_ld, a.out,   \
                                a.n_head, a.n_kv, a.pos0, a.tokens, a.scale);                    \
    }

ATTN_CHUNK(attn_chunk_d64, float, 2)
ATTN_CHUNK(attn_chunk_d128, float, 4)
ATTN_CHUNK(attn_chunk_d256, float, 8)
ATTN_CHUNK(attn_chunk_kvf16_d64, u16, 2)
ATTN_CHUNK(attn_chunk_kvf16_d128, u16, 4)
ATTN_CHUNK(attn_chunk_kvf16_d256, u16, 8)

// ---------------------------------------------------------------------------
// attn_flash[_kvf16]_d{64,128,256}: the same causal attention on tensor
// cores (flash attention: online softmax over key tiles), for chunks whose
// queries reuse each K/V row many times (long prompts, prompts at depth).
//
// Block: 64 query rows of one KV head (blockIdx.y), rows = (token, head in
// the group) token-major as above, 4 warps of 16 rows. Per tile of
// FA_BK = 32 keys: K (keys x hd) and V transposed (hd x keys) into shared
// memory as f16, S = Q K^T by mma.sync m16n8k16 (Q from shared memory, f16),
// scaled and causally masked, the online softmax in registers (each thread
// holds two rows, g and g+8 of its warp's 16, the four threads of a quad
// sharing a row), P rounded to f16 as the A operand of O += P V (the
// accumulator layout of S is the A-fragment layout), O in f32 registers.
// Dynamic shared memory: (64 + FA_BK) * (hd + 8) + hd * (FA_BK + 8) halves.
// Grid (ceil(tokens * n_head/n_kv / 64), n_kv), block 128.
#define FA_BK 32

// Two consecutive cache values as f16 bits (one word).
__device__ __forceinline__ u32 fa_kv2(const u16* __restrict__ p) {
    return __ldg(reinterpret_cast<const unsigned int*>(p));
}
__device__ __forceinline__ u32 fa_kv2(const float* __restrict__ p) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(p));
    return pack_h2(v.x, v.y);
}

template <typename T, int HD>
__device__ __forceinline__ void attn_flash_body(const float* __restrict__ q,
                                                const T* __restrict__ kc,
                                                const T* __restrict__ vc,
                                                const float* __restrict__ gate, long long gate_ld,
                                                float* __restrict__ out, int n_head, int n_kv,
                                                int pos0, int tokens, float scale) {
    constexpr int LQ = HD + 8, LV = FA_BK + 8, NT = HD / 8;
    extern __shared__ __align__(16) u16 fa_smem[];
    u16* Qs = fa_smem;             // [64][LQ]
    u16* Ks = Qs + 64 * LQ;        // [FA_BK][LQ]
    u16* Vt = Ks + FA_BK * LQ;     // [HD][LV]
    const int r = n_head / n_kv, g_kv = blockIdx.y;
    const int rows = tokens * r;
    const int row0 = blockIdx.x * 64;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    // Q rows into shared memory (f16); rows past the end are zero.
    for (int e = tid; e < 64 * (HD / 2); e += 128) {
        const int rr = e / (HD / 2), d2 = 2 * (e % (HD / 2));
        const int row = row0 + rr;
        u32 v = 0;
        if (row < rows) {
            const int t = row / r, h = g_kv * r + row % r;
            const float2 x =
                __ldg(reinterpret_cast<const float2*>(q + ((long long)t * n_head + h) * HD + d2));
            v = pack_h2(x.x, x.y);
        }
        *reinterpret_cast<u32*>(Qs + rr * LQ + d2) = v;
    }
    // This thread's two rows (g and g+8 of its warp's 16) and their
    // positions (rows past the end take the last row's, and are not stored).
    int qpos[2];
#pragma unroll
    for (int hrow = 0; hrow < 2; hrow++) {
        const int row = min(row0 + warp * 16 + g + 8 * hrow, rows - 1);
        qpos[hrow] = pos0 + row / r;
    }
    const int last_row = min(row0 + 63, rows - 1);
    const int n_keys = pos0 + last_row / r + 1;  // keys 0 .. the block's last position
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const long long kstride = (long long)n_kv * HD;
    for (int k0 = 0; k0 < n_keys; k0 += FA_BK) {
        __syncthreads();  // the previous tile's K and V are no longer read
        for (int e = tid; e < FA_BK * (HD / 2); e += 128) {
            const int kr = e / (HD / 2), d2 = 2 * (e % (HD / 2));
            const int key = k0 + kr;
            u32 kv = 0, vv = 0;
            if (key < n_keys) {
                const long long at = (long long)key * kstride + (long long)g_kv * HD + d2;
                kv = fa_kv2(kc + at);
                vv = fa_kv2(vc + at);
            }
            *reinterpret_cast<u32*>(Ks + kr * LQ + d2) = kv;
            Vt[d2 * LV + kr] = (u16)(vv & 0xffffu);
            Vt[(d2 + 1) * LV + kr] = (u16)(vv >> 16);
        }
        __syncthreads();
        // S = Q K^T for this warp's 16 rows x 32 keys.
        float s[FA_BK / 8][4];
#pragma unroll
        for (int ni = 0; ni < FA_BK / 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[ni][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD; kk += 16) {
            const u16* qa = Qs + (warp * 16 + g) * LQ + kk + 2 * c;
            u32 a[4];
            a[0] = *reinterpret_cast<const u32*>(qa);
            a[1] = *reinterpret_cast<const u32*>(qa + 8 * LQ);
            a[2] = *reinterpret_cast<const u32*>(qa + 8);
            a[3] = *reinterpret_cast<const u32*>(qa + 8 * LQ + 8);
#pragma unroll
            for (int ni = 0; ni < FA_BK / 8; ni++) {
                const u16* kb = Ks + (ni * 8 + g) * LQ + kk + 2 * c;
                u32 b[2];
                b[0] = *reinterpret_cast<const u32*>(kb);
                b[1] = *reinterpret_cast<const u32*>(kb + 8);
                mma_16816(s[ni], a, b);
            }
        }
        // Scale, mask, online softmax (row hrow: elements e = 2*hrow, 2*hrow+1).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int ni = 0; ni < FA_BK / 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hrow = e >> 1;
                const int key = k0 + ni * 8 + 2 * c + (e & 1);
                const float v = key <= qpos[hrow] ? s[ni][e] * scale : -INFINITY;
                s[ni][e] = v;
                mx[hrow] = fmaxf(mx[hrow], v);
            }
        float corr[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int hrow = 0; hrow < 2; hrow++) {
            mx[hrow] = fmaxf(mx[hrow], __shfl_xor_sync(0xffffffffu, mx[hrow], 1));
            mx[hrow] = fmaxf(mx[hrow], __shfl_xor_sync(0xffffffffu, mx[hrow], 2));
            // Every row sees key 0 in the first tile, so mx is finite from
            // there on; m = -inf only before it (corr = e^-inf = 0).
            corr[hrow] = expf(m[hrow] - mx[hrow]);
            m[hrow] = mx[hrow];
        }
        u32 pa[FA_BK / 16][4];
#pragma unroll
        for (int ni = 0; ni < FA_BK / 8; ni++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = expf(s[ni][e] - m[e >> 1]);
                rs[e >> 1] += p[e];
            }
            // tile ni is keys 8ni..: k16 step ni/2, A regs (ni%2)*2 + row half
            pa[ni >> 1][(ni & 1) * 2 + 0] = pack_h2(p[0], p[1]);
            pa[ni >> 1][(ni & 1) * 2 + 1] = pack_h2(p[2], p[3]);
        }
#pragma unroll
        for (int hrow = 0; hrow < 2; hrow++) {
            rs[hrow] += __shfl_xor_sync(0xffffffffu, rs[hrow], 1);
            rs[hrow] += __shfl_xor_sync(0xffffffffu, rs[hrow], 2);
            l[hrow] = l[hrow] * corr[hrow] + rs[hrow];
        }
#pragma unroll
        for (int j = 0; j < NT; j++) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        // O += P V: k = keys (two k16 steps), n = head dims.
#pragma unroll
        for (int ks = 0; ks < FA_BK / 16; ks++) {
            // A regs: a0 (row g, keys 2c..) = tile 2ks rows g, a1 = its rows
            // g+8, a2 = tile 2ks+1 rows g, a3 = its rows g+8.
            const u32 a[4] = {pa[ks][0], pa[ks][1], pa[ks][2], pa[ks][3]};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const u16* vb = Vt + (j * 8 + g) * LV + ks * 16 + 2 * c;
                u32 b[2];
                b[0] = *reinterpret_cast<const u32*>(vb);
                b[1] = *reinterpret_cast<const u32*>(vb + 8);
                mma_16816(o[j], a, b);
            }
        }
    }
    // Normalise, gate, store.
#pragma unroll
    for (int hrow = 0; hrow < 2; hrow++) {
        const int row = row0 + warp * 16 + g + 8 * hrow;
        if (row >= rows) continue;
        const int t = row / r, h = g_kv * r + row % r;
        const float inv = 1.0f / l[hrow];
        float* dst = out + ((long long)t * n_head + h) * HD;
        const float* gt = gate ? gate + t * gate_ld + (long long)h * 2 * HD : nullptr;
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = j * 8 + 2 * c + e;
                float y = o[j][2 * hrow + e] * inv;
                if (gt) y = __fmul_rn(y, sigmoid_f(__ldg(&gt[col])));
                dst[col] = y;
            }
    }
}

#define ATTN_FLASH(NAME, T, HD)                                                                  \
    extern "C" __global__ void __launch_bounds__(128) NAME(const AttnChunkArgs a) {              \
        PDL_PROLOGUE();                                                                          \
        attn_flash_body<T, HD>(a.q, (const T*)a.kc, (const T*)a.vc, a.gate, a.gate_ld, a.out,    \
                               a.n_head, a.n_kv, a.pos0, a.tokens, a.scale);                     \
    }

ATTN_FLASH(attn_flash_d64, float, 64)
ATTN_FLASH(attn_flash_d128, float, 128)
ATTN_FLASH(attn_flash_d256, float, 256)
ATTN_FLASH(attn_flash_kvf16_d64, u16, 64)
ATTN_FLASH(attn_flash_kvf16_d128, u16, 128)
ATTN_FLASH(attn_flash_kvf16_d256, u16, 256)
