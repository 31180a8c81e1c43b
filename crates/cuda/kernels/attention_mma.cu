// Decode attention (one query token) over an f16 KV cache on tensor cores,
// split over the KV length like attention.cu's attn_split (the same
// AttnSplitArgs, the same partial results, merged by attn_merge).
//
// Why: the f32-math kernel spends the same instructions on a row whatever
// its element size (one FMA per value and head, a conversion per value, a
// warp reduction and an exponential per head), so over f16 rows it reads
// half the bytes in the same time: 46% of the card's copy bandwidth at
// 262,144 positions against 91% for f32 rows (bench/RESULTS.md). Here a
// warp scores 8 positions for all of a KV head's query heads with 16
// MMAs (head_dim 256) and adds their values with 16 more, so the loop is
// bound by the cache's bytes again.
//
// Grid (n_kv * G / HB, nsplit), MMA_WARPS warps a block: a block serves HB
// query heads of one KV head (HB: the largest divisor of the group size G
// that is at most 8; the MMA's 8 columns and rows hold them, the rest
// zero) over slice blockIdx.y of the positions, as attn_split does.
// The slice's positions go in tiles of 8, tile i to warp i % MMA_WARPS;
// each warp copies its tiles' K and V rows into its own shared stages by
// cp.async, MMA_STAGES - 1 tiles ahead.
//
// Per tile (f16 products, f32 sums; Q and P rounded to f16, as llama.cpp's
// tensor-core attention rounds them):
//   S = Q K^T (m16n8k16: A = the queries, one head a row, rows 8-15 zero;
//       B = K^T, column n = the tile's row n). A sum over dims does not
//       depend on their order, so lane (g, t) feeds each MMA pair from one
//       16-byte load of K row g (dims 8(t + 4i) .. +8), and its query
//       fragments hold the same dims. The queries are pre-scaled by
//       scale * log2(e): scores in log2 units, exp2 for exponentials.
//   online softmax per head: lane (g, t) holds head g's scores of
//       positions 2t, 2t + 1 (the accumulator layout).
//   O^T += V^T P^T (m16n8k8: A = V^T, row m a dim, column k a position;
//       B = P^T, column n a head). The accumulator layout of S is exactly
//       B's (lane (g, t): head g, positions 2t, 2t + 1), so P never moves
//       between lanes. Lane (g, t)'s A fragment is dims (d, d + 1) of
//       positions 2t and 2t + 1: one 16-byte load from each of the two V
//       rows gives 4 dim pairs (d = 64q + 8g + 2j, j = 0..3), paired across
//       the rows by PRMT.
// The warps then merge in shared memory in a fixed order (the result does
// not depend on scheduling) and write (m, l) in natural-log units and o
// per head and slice, as attn_split does.
#include "common.cuh"
#include "attn_args.cuh"

#define MMA_WARPS 4
#define MMA_STAGES 4
#define MMA_TILE 8

// Row strides of the shared stages, in halves. The padding makes the
// fragment loads conflict-free: a K row is 2 HD + 64 bytes (64 mod 128:
// the two rows of a quarter-warp's 16-byte loads fill the 128 bytes of
// the banks), a V row 2 HD + 16 bytes (16 mod 128: a quarter-warp's rows
// 2t (or 2t + 1) and dim groups g land on 8 different 16-byte slots).
template <int HD>
struct MmaRows {
    static constexpr int K = HD + 32;
    static constexpr int V = HD + 8;
    static constexpr int STAGE = MMA_TILE * (K + V);
};

// D = A*B + D, m16n8k8, A row-major f16 (2 words), B column-major f16 (1
// word), f32 accumulators (4).
__device__ __forceinline__ void mma_1688(float* d, u32 a0, u32 a1, u32 b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

// The heads a block serves: the largest divisor of the group size G that
// is at most 8 (ops::attention computes the same for the grid).
__device__ __forceinline__ int mma_heads_per_block(int G) {
    int hb = G < 8 ? G : 8;
    while (G % hb) hb--;
    return hb;
}

template <int HD>
__device__ __forceinline__ void attn_mma_body(const AttnSplitArgs& a, u16* smem) {
    constexpr int NP = HD / 32;  // 16-byte pieces of a K row a lane loads
    constexpr int NQ = HD / 64;  // 64-dim groups of a V row
    using RW = MmaRows<HD>;
    __shared__ float s_m[MMA_WARPS][8], s_l[MMA_WARPS][8];
    __shared__ float s_o[8 * HD];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int G = a.n_head / a.n_kv, hb = mma_heads_per_block(G), ngroups = G / hb;
    const int kvh = blockIdx.x / ngroups, h0 = kvh * G + (blockIdx.x % ngroups) * hb;
    const int split = blockIdx.y;
    const int n = __ldg(a.pos_p) + 1;
    const int chunk = (n + a.nsplit - 1) / a.nsplit;
    const int start = split * chunk, end = min(n, start + chunk);
    if (start >= end) {
        if (threadIdx.x < hb) {
            const long long at = ((long long)(h0 + threadIdx.x) * a.nsplit + split) * 2;
            a.part_ml[at] = -INFINITY;
            a.part_ml[at + 1] = 0.0f;
        }
        return;
    }
    const u16* kc = (const u16*)a.kc;
    const u16* vc = (const u16*)a.vc;
    // Head g's query, dims 8(t + 4i) .. +8 for piece i, as 4 f16x2 words
    // (zero for the padding heads g >= hb).
    const float qs = a.scale * 1.4426950408889634f;
    u32 qa[NP][4];
#pragma unroll
    for (int i = 0; i < NP; i++) {
        float v[8];
        if (g < hb) {
            const float* qp = a.q + (long long)(h0 + g) * HD + 8 * (t + 4 * i);
            const float4 x0 = __ldg(reinterpret_cast<const float4*>(qp));
            const float4 x1 = __ldg(reinterpret_cast<const float4*>(qp) + 1);
            v[0] = x0.x, v[1] = x0.y, v[2] = x0.z, v[3] = x0.w;
            v[4] = x1.x, v[5] = x1.y, v[6] = x1.z, v[7] = x1.w;
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = 0.0f;
        }
#pragma unroll
        for (int w = 0; w < 4; w++) qa[i][w] = pack_h2(v[2 * w] * qs, v[2 * w + 1] * qs);
    }

    u16* stages = smem + warp * MMA_STAGES * RW::STAGE;
    const int ntiles = (end - start + MMA_TILE - 1) / MMA_TILE;
    const int mine = warp < ntiles ? (ntiles - warp + MMA_WARPS - 1) / MMA_WARPS : 0;
    // Tile k of this warp into stage k % MMA_STAGES: its 8 K and V rows
    // (zeros past the slice: a V row of garbage would give NaN * 0).
    auto issue = [&](int k) {
        const int p0 = start + (warp + k * MMA_WARPS) * MMA_TILE;
        u16* ks = stages + (k % MMA_STAGES) * RW::STAGE;
        u16* vs = ks + MMA_TILE * RW::K;
#pragma unroll
        for (int c = lane; c < MMA_TILE * HD / 8; c += 32) {
            const int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
            if (p0 + r < end) {
                const long long off = ((long long)(p0 + r) * a.n_kv + kvh) * HD + col;
                cp_async16(ks + r * RW::K + col, kc + off);
                cp_async16(vs + r * RW::V + col, vc + off);
            } else {
                *reinterpret_cast<uint4*>(ks + r * RW::K + col) = make_uint4(0, 0, 0, 0);
                *reinterpret_cast<uint4*>(vs + r * RW::V + col) = make_uint4(0, 0, 0, 0);
            }
        }
    };
#pragma unroll
    for (int k = 0; k < MMA_STAGES - 1; k++) {
        if (k < mine) issue(k);
        cp_async_commit();
    }
    // Lane (g, t): the running max and (partial) sum of head g, and
    // O[head 2t + (e & 1)][dim 64q + 8g + 2j + (e >> 1)] in o[4q + j][e].
    float m_run = -INFINITY, l_run = 0.0f;
    float o[4 * NQ][4];
#pragma unroll
    for (int j = 0; j < 4 * NQ; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) o[j][e] = 0.0f;
    for (int k = 0; k < mine; k++) {
        // The stage refilled here was read in step k - 1, which every lane
        // left through the __syncwarp at its end.
        if (k + MMA_STAGES - 1 < mine) issue(k + MMA_STAGES - 1);
        cp_async_commit();
        cp_async_wait<MMA_STAGES - 1>();
        __syncwarp();
        const u16* ks = stages + (k % MMA_STAGES) * RW::STAGE;
        const u16* vs = ks + MMA_TILE * RW::K;
        const int p0 = start + (warp + k * MMA_WARPS) * MMA_TILE;
        float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < NP; i++) {
            const uint4 kk = *reinterpret_cast<const uint4*>(ks + g * RW::K + 8 * (t + 4 * i));
            const u32 a0[4] = {qa[i][0], 0u, qa[i][1], 0u}, b0[2] = {kk.x, kk.y};
            mma_16816(s, a0, b0);
            const u32 a1[4] = {qa[i][2], 0u, qa[i][3], 0u}, b1[2] = {kk.z, kk.w};
            mma_16816(s, a1, b1);
        }
        const int pa = p0 + 2 * t;
        const float sa = pa < end ? s[0] : -INFINITY;
        const float sb = pa + 1 < end ? s[1] : -INFINITY;
        float mt = fmaxf(sa, sb);
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float m_new = fmaxf(m_run, mt);
        float corr = 1.0f, ea = 0.0f, eb = 0.0f;
        if (m_new != -INFINITY) {
            corr = exp2f(m_run - m_new);
            ea = exp2f(sa - m_new);
            eb = exp2f(sb - m_new);
        }
        l_run = l_run * corr + ea + eb;
        m_run = m_new;
        // The accumulators of heads 2t and 2t + 1 take those heads'
        // factors (from lanes 8t and 8t + 4); a warp whose maxima all stay
        // skips the multiplies.
        const float ca = __shfl_sync(0xffffffffu, corr, 8 * t);
        const float cb = __shfl_sync(0xffffffffu, corr, 8 * t + 4);
        if (__any_sync(0xffffffffu, ca != 1.0f || cb != 1.0f)) {
#pragma unroll
            for (int j = 0; j < 4 * NQ; j++) {
                o[j][0] *= ca;
                o[j][1] *= cb;
                o[j][2] *= ca;
                o[j][3] *= cb;
            }
        }
        const u32 pb = pack_h2(ea, eb);
#pragma unroll
        for (int q = 0; q < NQ; q++) {
            const uint4 va = *reinterpret_cast<const uint4*>(vs + (2 * t) * RW::V + 64 * q + 8 * g);
            const uint4 vb = *reinterpret_cast<const uint4*>(vs + (2 * t + 1) * RW::V + 64 * q + 8 * g);
            const u32 wa[4] = {va.x, va.y, va.z, va.w}, wb[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
            for (int j = 0; j < 4; j++)
                mma_1688(o[4 * q + j], __byte_perm(wa[j], wb[j], 0x5410), __byte_perm(wa[j], wb[j], 0x7632), pb);
        }
        __syncwarp();
    }
    // Head g's sum over the lanes t; the warps' (m, l) for the merge.
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
    l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
    if (t == 0) {
        s_m[warp][g] = m_run;
        s_l[warp][g] = l_run;
    }
    for (int i = threadIdx.x; i < 8 * HD; i += blockDim.x) s_o[i] = 0.0f;
    __syncthreads();
    float f[2];
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int h = 2 * t + e;
        float M = -INFINITY;
        for (int w = 0; w < MMA_WARPS; w++) M = fmaxf(M, s_m[w][h]);
        f[e] = s_m[warp][h] == -INFINITY ? 0.0f : exp2f(s_m[warp][h] - M);
    }
    for (int w = 0; w < MMA_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int q = 0; q < NQ; q++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int d = 64 * q + 8 * g + 2 * j;
                    const float* c = o[4 * q + j];
                    s_o[(2 * t) * HD + d] += f[0] * c[0];
                    s_o[(2 * t + 1) * HD + d] += f[1] * c[1];
                    s_o[(2 * t) * HD + d + 1] += f[0] * c[2];
                    s_o[(2 * t + 1) * HD + d + 1] += f[1] * c[3];
                }
        }
        __syncthreads();
    }
    if (threadIdx.x < hb) {
        const int h = threadIdx.x;
        float M = -INFINITY;
        for (int w = 0; w < MMA_WARPS; w++) M = fmaxf(M, s_m[w][h]);
        float L = 0.0f;
        for (int w = 0; w < MMA_WARPS; w++)
            if (s_m[w][h] != -INFINITY) L += s_l[w][h] * exp2f(s_m[w][h] - M);
        const long long at = ((long long)(h0 + h) * a.nsplit + split) * 2;
        // Natural-log units, as attn_split writes and attn_merge reads.
        a.part_ml[at] = M * 0.6931471805599453f;
        a.part_ml[at + 1] = L;
    }
    for (int i = threadIdx.x; i < hb * HD; i += blockDim.x) {
        const int h = i / HD, d = i % HD;
        a.part_o[((long long)(h0 + h) * a.nsplit + split) * HD + d] = s_o[i];
    }
}

// attn_split_mma_kvf16_dDPL (head_dim 32 * DPL), MMA_WARPS * 32 threads,
// dynamic shared memory MMA_WARPS * MMA_STAGES * MmaRows<HD>::STAGE halves
// (ops::attention sets the attribute; src/ops/attention.rs
// `mma_smem_bytes` computes the same).
#define ATTN_SPLIT_MMA(DPL)                                                                      \
    extern "C" __global__ void __launch_bounds__(MMA_WARPS * 32)                                \
        attn_split_mma_kvf16_d##DPL(__grid_constant__ const AttnSplitArgs a) {                   \
        PDL_PROLOGUE();                                                                          \
        extern __shared__ __align__(16) u16 attn_mma_smem[];                                     \
        attn_mma_body<32 * DPL>(a, attn_mma_smem);                                               \
    }

ATTN_SPLIT_MMA(2)
ATTN_SPLIT_MMA(4)
ATTN_SPLIT_MMA(8)
