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

// The arguments of every attn_chunk_*, attn_flash_* and attn_flash_merge_*
// kernel, one struct passed by value (mirrored by `AttnChunkArgs` in
// src/ops/chunk.rs, #[repr(C)]: same field order and types; the caches are
// float or u16 (f16 bits) by kernel). NVRTC applies `__restrict__` only to
// kernel parameters, so the bodies read q, the caches and the gate through
// __ldg (ach_load, the gate and Q loads) or cp.async. The warp kernels
// take the struct as __grid_constant__, the flash kernels as a plain
// by-value parameter: each the form whose registers stay at the separate
// parameters' (docs/cuda.md, "Kernel arguments").
//
// part / n_split (flash kernels only): with n_split > 1 the keys of every
// block are split into n_split ranges (blockIdx.z), each written
// unnormalised to `part` ([n_split][n_kv][rows][hd] floats, then
// [n_split][n_kv][rows] (m, l) pairs) and combined by attn_flash_merge_*.
struct AttnChunkArgs {
    const float* q;
    const void* kc;
    const void* vc;
    const float* gate;
    long long gate_ld;
    float* out;
    float* part;
    int n_head, n_kv, pos0, tokens;
    float scale;
    int n_split;
};
static_assert(sizeof(AttnChunkArgs) == 80, "AttnChunkArgs: layout differs from src/ops/chunk.rs");

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
// Block: FA_ROWS (64) query rows of one KV head (blockIdx.y), rows =
// (token, head in the group) token-major as above, 4 warps of 16 rows;
// blockIdx.z: which of n_split ranges of the block's keys it takes. Per
// tile of BK keys (32 at hd 256, else 64) the K and V rows are copied into
// shared memory by cp.async as the cache stores them (f16 or f32), two
// tiles in flight: the next tile's copy runs under this tile's math.
// S = Q K^T by mma.sync m16n8k16 (Q f16 in shared memory, A fragments by
// ldmatrix; K's B fragments by ldmatrix from f16 rows, or f32 pairs
// rounded to f16), scaled and causally masked, the online softmax in
// registers (each thread holds rows g and g+8 of its warp's 16, the four
// threads of a quad sharing a row; exponents in base 2 with the scale
// folded in), P rounded to f16 as the A operand of O += P V (the
// accumulator layout of S is the A-fragment layout; V's B fragments by
// ldmatrix.trans from f16 rows, or f32 pairs), O in f32 registers.
// Grid (ceil(tokens * n_head/n_kv / FA_ROWS), n_kv, n_split), block 128,
// dynamic shared memory: Q [FA_ROWS][hd+8] halves, then two stages of
// K [BK][LK] and V [BK][LV] elements of the cache type (flash_smem_bytes
// in src/ops/chunk.rs sums the same).
#define FA_WARPS 4
#define FA_ROWS (16 * FA_WARPS)

template <int HD>
struct FaShape {
    static constexpr int BK = HD == 256 ? 32 : 64;
    static constexpr int LQ = HD + 8;
};
// Row strides of the K and V tiles, in elements: f16 rows padded by 16
// bytes (the 8 rows of an ldmatrix land in distinct bank groups); f32 K
// rows by 8 floats (a half-warp's float2 reads at 8g + 2c: distinct
// banks), f32 V rows by 4 (scalar reads at rows 2c: banks 8c + g).
template <typename T, int HD>
struct FaTile;
template <int HD>
struct FaTile<u16, HD> {
    static constexpr int LK = HD + 8, LV = HD + 8;
};
template <int HD>
struct FaTile<float, HD> {
    static constexpr int LK = HD + 8, LV = HD + 4;
};

// Keys k0 .. k0+BK of KV head g_kv into the K and V tiles: cp.async for
// keys below k_end, zeros past it (never-written cache rows may hold NaN,
// and P = 0 times NaN is NaN).
template <typename T, int HD>
__device__ __forceinline__ void fa_load_tile(T* ks, T* vs, const T* kc, const T* vc,
                                             long long kstride, int g_kv, int k0, int k_end,
                                             int tid) {
    constexpr int EPC = 16 / (int)sizeof(T), CPR = HD / EPC, BK = FaShape<HD>::BK;
    constexpr int LK = FaTile<T, HD>::LK, LV = FaTile<T, HD>::LV;
    for (int e = tid; e < BK * CPR; e += 32 * FA_WARPS) {
        const int kr = e / CPR, col = (e % CPR) * EPC;
        const int key = k0 + kr;
        T* kd = ks + kr * LK + col;
        T* vd = vs + kr * LV + col;
        if (key < k_end) {
            const long long at = (long long)key * kstride + (long long)g_kv * HD + col;
            cp_async16(kd, kc + at);
            cp_async16(vd, vc + at);
        } else {
            *reinterpret_cast<uint4*>(kd) = make_uint4(0u, 0u, 0u, 0u);
            *reinterpret_cast<uint4*>(vd) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// B fragments of K^T for keys n0..n0+15 (two n-tiles: b[0..1] keys n0..,
// b[2..3] keys n0+8..) at dims kk..kk+15.
template <int LK>
__device__ __forceinline__ void fa_kfrag(u32* b, const u16* ks, int n0, int kk, int lane) {
    const int mi = lane >> 3;
    ldmatrix_x4(b, ks + (n0 + (mi >> 1) * 8 + (lane & 7)) * LK + kk + (mi & 1) * 8);
}
template <int LK>
__device__ __forceinline__ void fa_kfrag(u32* b, const float* ks, int n0, int kk, int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const float* p = ks + (n0 + 8 * half + g) * LK + kk + 2 * c;
        const float2 x = *reinterpret_cast<const float2*>(p);
        const float2 y = *reinterpret_cast<const float2*>(p + 8);
        b[2 * half] = pack_h2(x.x, x.y);
        b[2 * half + 1] = pack_h2(y.x, y.y);
    }
}

// B fragments of V for keys k0..k0+15 at dims n0..n0+15 (two n-tiles:
// b[0..1] dims n0.., b[2..3] dims n0+8..).
template <int LV>
__device__ __forceinline__ void fa_vfrag(u32* b, const u16* vs, int k0, int n0, int lane) {
    const int mi = lane >> 3;
    ldmatrix_x4_trans(b, vs + (k0 + (mi & 1) * 8 + (lane & 7)) * LV + n0 + (mi >> 1) * 8);
}
template <int LV>
__device__ __forceinline__ void fa_vfrag(u32* b, const float* vs, int k0, int n0, int lane) {
    const int g = lane >> 2, c = lane & 3;
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const float* p = vs + (k0 + 2 * c) * LV + n0 + 8 * half + g;
        b[2 * half] = pack_h2(p[0], p[LV]);
        b[2 * half + 1] = pack_h2(p[8 * LV], p[9 * LV]);
    }
}

template <typename T, int HD>
__device__ __forceinline__ void attn_flash_body(const AttnChunkArgs& a) {
    constexpr int BK = FaShape<HD>::BK, LQ = FaShape<HD>::LQ, NT = HD / 8;
    constexpr int LK = FaTile<T, HD>::LK, LV = FaTile<T, HD>::LV;
    constexpr int STAGE = BK * (LK + LV);
    extern __shared__ __align__(16) unsigned char fa_smem[];
    u16* qs = reinterpret_cast<u16*>(fa_smem);  // [FA_ROWS][LQ]
    T* tiles = reinterpret_cast<T*>(fa_smem + FA_ROWS * LQ * 2);
    const T* kc = reinterpret_cast<const T*>(a.kc);
    const T* vc = reinterpret_cast<const T*>(a.vc);
    const int n_head = a.n_head, n_kv = a.n_kv;
    const int r = n_head / n_kv, g_kv = blockIdx.y;
    const int rows = a.tokens * r;
    const int row0 = blockIdx.x * FA_ROWS;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    // The block's keys (0 .. the position of its last row) and this
    // split's whole tiles of them.
    const int last_row = min(row0 + FA_ROWS - 1, rows - 1);
    const int n_keys = a.pos0 + last_row / r + 1;
    const int n_tiles = (n_keys + BK - 1) / BK;
    const int per = (n_tiles + a.n_split - 1) / a.n_split;
    const int t_begin = blockIdx.z * per, t_end = min(n_tiles, t_begin + per);
    const int k_end = min(n_keys, t_end * BK);
    const long long kstride = (long long)n_kv * HD;
    if (t_begin < t_end)
        fa_load_tile<T, HD>(tiles, tiles + BK * LK, kc, vc, kstride, g_kv, t_begin * BK, k_end, tid);
    cp_async_commit();
    // Q rows into shared memory (f16) while the first tile is in flight;
    // rows past the end are zero.
    for (int e = tid; e < FA_ROWS * (HD / 2); e += 32 * FA_WARPS) {
        const int rr = e / (HD / 2), d2 = 2 * (e % (HD / 2));
        const int row = row0 + rr;
        u32 v = 0;
        if (row < rows) {
            const int t = row / r, h = g_kv * r + row % r;
            const float2 x = __ldg(
                reinterpret_cast<const float2*>(a.q + ((long long)t * n_head + h) * HD + d2));
            v = pack_h2(x.x, x.y);
        }
        *reinterpret_cast<u32*>(qs + rr * LQ + d2) = v;
    }
    // This thread's two rows (g and g+8 of its warp's 16) and their
    // positions (rows past the end take the last row's, and are not stored).
    int qpos[2];
#pragma unroll
    for (int hrow = 0; hrow < 2; hrow++) {
        const int row = min(row0 + warp * 16 + g + 8 * hrow, rows - 1);
        qpos[hrow] = a.pos0 + row / r;
    }
    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    const float scale2 = a.scale * 1.4426950408889634f;  // base-2 exponents
    for (int t = t_begin; t < t_end; t++) {
        const int st = (t - t_begin) & 1;
        if (t + 1 < t_end) {
            T* nk = tiles + (st ^ 1) * STAGE;
            fa_load_tile<T, HD>(nk, nk + BK * LK, kc, vc, kstride, g_kv, (t + 1) * BK, k_end, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();  // this thread's copies of tile t have landed
        __syncthreads();     // everyone's (and, the first time, Q)
        const T* ks = tiles + st * STAGE;
        const T* vs = ks + BK * LK;
        const int k0 = t * BK;
        // S = Q K^T for this warp's 16 rows x BK keys.
        float s[BK / 8][4];
#pragma unroll
        for (int ni = 0; ni < BK / 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[ni][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HD; kk += 16) {
            u32 qa[4];
            ldmatrix_x4(qa, qs + (warp * 16 + (lane & 15)) * LQ + kk + 8 * (lane >> 4));
#pragma unroll
            for (int np = 0; np < BK / 16; np++) {
                u32 b[4];
                fa_kfrag<LK>(b, ks, np * 16, kk, lane);
                mma_16816(s[2 * np], qa, b);
                mma_16816(s[2 * np + 1], qa, b + 2);
            }
        }
        // Scale, mask (causal, and this split's end), online softmax (row
        // hrow: elements e = 2*hrow, 2*hrow+1).
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int ni = 0; ni < BK / 8; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int hrow = e >> 1;
                const int key = k0 + ni * 8 + 2 * c + (e & 1);
                const float v = key <= qpos[hrow] && key < k_end ? s[ni][e] * scale2 : -INFINITY;
                s[ni][e] = v;
                mx[hrow] = fmaxf(mx[hrow], v);
            }
        float corr[2], mref[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int hrow = 0; hrow < 2; hrow++) {
            mx[hrow] = fmaxf(mx[hrow], __shfl_xor_sync(0xffffffffu, mx[hrow], 1));
            mx[hrow] = fmaxf(mx[hrow], __shfl_xor_sync(0xffffffffu, mx[hrow], 2));
            // A row that has seen no key yet (a split past its position)
            // keeps m = -inf: exponents against 0 then give p = 0 and
            // corr = 0 instead of -inf - -inf = NaN.
            mref[hrow] = mx[hrow] == -INFINITY ? 0.0f : mx[hrow];
            corr[hrow] = exp2f(m[hrow] - mref[hrow]);
            m[hrow] = mx[hrow];
        }
        u32 pa[BK / 16][4];
#pragma unroll
        for (int ni = 0; ni < BK / 8; ni++) {
            float p[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[e] = exp2f(s[ni][e] - mref[e >> 1]);
                rs[e >> 1] += p[e];
            }
            // n-tile ni is keys 8ni..: k16 step ni/2, A regs (ni%2)*2 + row half
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
        // O += P V: k = keys (BK/16 k16 steps), n = head dims.
#pragma unroll
        for (int ks16 = 0; ks16 < BK / 16; ks16++) {
#pragma unroll
            for (int jp = 0; jp < NT / 2; jp++) {
                u32 b[4];
                fa_vfrag<LV>(b, vs, ks16 * 16, jp * 16, lane);
                mma_16816(o[2 * jp], pa[ks16], b);
                mma_16816(o[2 * jp + 1], pa[ks16], b + 2);
            }
        }
        __syncthreads();  // this stage is free for the copy two tiles on
    }
    // One split: normalise, gate, store. Several: the unnormalised O and
    // (m, l) of each row, for attn_flash_merge_*.
    const long long total = (long long)n_kv * rows;
#pragma unroll
    for (int hrow = 0; hrow < 2; hrow++) {
        const int row = row0 + warp * 16 + g + 8 * hrow;
        if (row >= rows) continue;
        const int t = row / r, h = g_kv * r + row % r;
        if (a.n_split > 1) {
            const long long idx = (long long)blockIdx.z * total + (long long)g_kv * rows + row;
            float* dst = a.part + idx * HD;
#pragma unroll
            for (int j = 0; j < NT; j++)
                *reinterpret_cast<float2*>(dst + j * 8 + 2 * c) =
                    make_float2(o[j][2 * hrow], o[j][2 * hrow + 1]);
            if (c == 0) {
                float* ml = a.part + (long long)a.n_split * total * HD + 2 * idx;
                ml[0] = m[hrow];
                ml[1] = l[hrow];
            }
            continue;
        }
        const float inv = 1.0f / l[hrow];
        float* dst = a.out + ((long long)t * n_head + h) * HD;
        const float* gt = a.gate ? a.gate + t * a.gate_ld + (long long)h * 2 * HD : nullptr;
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
    extern "C" __global__ void __launch_bounds__(32 * FA_WARPS) NAME(const AttnChunkArgs a) {    \
        PDL_PROLOGUE();                                                                          \
        attn_flash_body<T, HD>(a);                                                               \
    }

ATTN_FLASH(attn_flash_d64, float, 64)
ATTN_FLASH(attn_flash_d128, float, 128)
ATTN_FLASH(attn_flash_d256, float, 256)
ATTN_FLASH(attn_flash_kvf16_d64, u16, 64)
ATTN_FLASH(attn_flash_kvf16_d128, u16, 128)
ATTN_FLASH(attn_flash_kvf16_d256, u16, 256)

// attn_flash_merge_d{64,128,256}: the n_split partial results of every row
// combined: M = max m_s, O = sum 2^(m_s - M) O_s / sum 2^(m_s - M) l_s
// (a split that saw none of a row's keys has m = -inf and weighs 0; the
// first split always holds key 0), gated and stored as attn_flash_* would.
// One warp per row (lane: dims lane*DPL..), grid (ceil(rows / ACH_WARPS),
// n_kv), block ACH_WARPS*32.
template <int DPL>
__device__ __forceinline__ void attn_flash_merge_body(const AttnChunkArgs& a) {
    constexpr int HD = 32 * DPL;
    const int r = a.n_head / a.n_kv, rows = a.tokens * r, g_kv = blockIdx.y;
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * ACH_WARPS + (threadIdx.x >> 5);
    if (row >= rows) return;
    const long long total = (long long)a.n_kv * rows, at = (long long)g_kv * rows + row;
    const float* ml = a.part + (long long)a.n_split * total * HD;
    float mmax = -INFINITY;
    for (int s = 0; s < a.n_split; s++) mmax = fmaxf(mmax, __ldg(&ml[2 * (s * total + at)]));
    float o[DPL], lsum = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; i++) o[i] = 0.0f;
    for (int s = 0; s < a.n_split; s++) {
        const long long idx = s * total + at;
        const float w = exp2f(__ldg(&ml[2 * idx]) - mmax);
        lsum = fmaf(w, __ldg(&ml[2 * idx + 1]), lsum);
        float v[DPL];
        ach_load<DPL>(a.part + idx * HD + lane * DPL, v);
#pragma unroll
        for (int i = 0; i < DPL; i++) o[i] = fmaf(w, v[i], o[i]);
    }
    const int t = row / r, h = g_kv * r + row % r;
    const float inv = 1.0f / lsum;
    float* dst = a.out + ((long long)t * a.n_head + h) * HD + lane * DPL;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        float y = o[i] * inv;
        if (a.gate)
            y = __fmul_rn(y, sigmoid_f(__ldg(&a.gate[t * a.gate_ld + (long long)h * 2 * HD +
                                                     lane * DPL + i])));
        dst[i] = y;
    }
}

#define ATTN_FLASH_MERGE(NAME, DPL)                                                              \
    extern "C" __global__ void __launch_bounds__(ACH_WARPS * 32)                                 \
        NAME(__grid_constant__ const AttnChunkArgs a) {                                          \
        PDL_PROLOGUE();                                                                          \
        attn_flash_merge_body<DPL>(a);                                                           \
    }

ATTN_FLASH_MERGE(attn_flash_merge_d64, 2)
ATTN_FLASH_MERGE(attn_flash_merge_d128, 4)
ATTN_FLASH_MERGE(attn_flash_merge_d256, 8)
