// Decode attention (one query token) over the KV cache, split over the KV
// length and grouped: a block serves GB query heads that share one KV head
// (GQA), so each K and V row is read once for all of them, over one slice
// of the positions; attn_merge then combines the slices.
//
// Caches [ctx][n_kv][hd], f32 (attn_split_g*; f16 caches take the
// tensor-core kernels of attention_mma.cu, which write the same partials); q [n_head][hd] (normed, rotated);
// n = *pos_p + 1 positions are visible. Slice s of nsplit covers
// [s*c, min(n, (s+1)*c)), c = ceil(n / nsplit): the grid is fixed (a graph
// replays it at every position) and the work per block grows with n.
//
// attn_split: grid (n_kv * G/GB, nsplit), block ATT_WARPS*32. Warp w takes
// positions start+w, start+w+ATT_WARPS, ...; lane l holds dims
// l*DPL..l*DPL+DPL of every row (hd = 32*DPL) and keeps, per head, the
// online-softmax max m, sum l and the unnormalised output. The GB partial
// dot products of a row are summed over the warp by a reduce-scatter
// (log2 GB exchange steps halve the values each lane keeps, then plain
// butterfly steps) and broadcast back: 5 + GB + ... shuffles instead of
// 5*GB. The warps then merge in shared memory (fixed order: the result does
// not depend on scheduling) and write (m, l) and o per head and slice.
//
// attn_merge: out = sum_s e^{m_s-M} o_s / sum_s e^{m_s-M} l_s over slices
// with l_s > 0, times sigmoid(gate) when gate is given (gate j of head h at
// gate[h*gate_stride + j]); q8, q8d (nullable): the output also as int8
// activations for the output projection (common.cuh warp_q8).
#include "common.cuh"
#include "attn_args.cuh"

#define ATT_WARPS 8

template <int GB>
__device__ __forceinline__ void allreduce_heads(float* s, int lane) {
    constexpr int LG = GB == 1 ? 0 : GB == 2 ? 1 : GB == 4 ? 2 : GB == 8 ? 3 : 4;
#pragma unroll
    for (int st = 0; st < LG; st++) {
        const int off = 16 >> st;
        const int half = GB >> (st + 1);
        const bool up = (lane & off) != 0;
#pragma unroll
        for (int i = 0; i < half; i++) {
            const float send = up ? s[i] : s[i + half];
            const float keep = up ? s[i + half] : s[i];
            s[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
        }
    }
#pragma unroll
    for (int off = 16 >> LG; off > 0; off >>= 1) s[0] += __shfl_xor_sync(0xffffffffu, s[0], off);
    const float mine = s[0];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        int src = 0;
#pragma unroll
        for (int st = 0; st < LG; st++) src |= ((g >> (LG - 1 - st)) & 1) * (16 >> st);
        s[g] = __shfl_sync(0xffffffffu, mine, src);
    }
}

// DPL consecutive floats of a row (16- or 8-byte aligned: rows start at
// multiples of 64 floats and lane l reads from l*DPL).
template <int DPL>
__device__ __forceinline__ void load_row(const float* __restrict__ p, float* v) {
    if (DPL % 4 == 0) {
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

// One lane's DPL values of a K or V row as loaded (one row a step ahead
// stays in flight). Only f32 rows here: f16 caches take attention_mma.cu.
template <typename T, int DPL>
struct KvRow;

template <int DPL>
struct KvRow<float, DPL> {
    float r[DPL];
    __device__ __forceinline__ void load(const float* __restrict__ p) { load_row<DPL>(p, r); }
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int i = 0; i < DPL; i++) r[i] = 0.0f;
    }
    __device__ __forceinline__ float get(int d) const { return r[d]; }
};

template <typename T, int GB, int DPL>
__device__ __forceinline__ void attn_split_body(const float* __restrict__ q,
                                                const T* __restrict__ kc,
                                                const T* __restrict__ vc,
                                                const int* __restrict__ pos_p,
                                                float* __restrict__ part_o,
                                                float* __restrict__ part_ml, int n_head, int n_kv,
                                                int nsplit, float scale) {
    constexpr int HD = 32 * DPL;
    __shared__ float so[GB * HD];
    __shared__ float sm[ATT_WARPS][GB], sl[ATT_WARPS][GB];
    const int G = n_head / n_kv, ngroups = G / GB;
    const int kvh = blockIdx.x / ngroups, h0 = kvh * G + (blockIdx.x % ngroups) * GB;
    const int split = blockIdx.y;
    const int n = __ldg(pos_p) + 1;
    const int chunk = (n + nsplit - 1) / nsplit;
    const int start = split * chunk, end = min(n, start + chunk);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (start >= end) {
        if (threadIdx.x < GB) {
            const long long at = ((long long)(h0 + threadIdx.x) * nsplit + split) * 2;
            part_ml[at] = -INFINITY;
            part_ml[at + 1] = 0.0f;
        }
        return;
    }
    float qr[GB][DPL], acc[GB][DPL], m[GB], l[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        m[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int d = 0; d < DPL; d++) {
            qr[g][d] = __ldg(&q[(long long)(h0 + g) * HD + lane * DPL + d]);
            acc[g][d] = 0.0f;
        }
    }
    const long long stride = (long long)n_kv * HD;
    const T* kb = kc + (long long)kvh * HD + lane * DPL;
    const T* vb = vc + (long long)kvh * HD + lane * DPL;
    // Two rows a step (positions p and p + ATT_WARPS): their scores, head
    // all-reduces and exponentials are independent, so each warp has two
    // chains in flight instead of one (at depth 32K the loop was bound by
    // that chain's latency, not by its bytes: an L2 prefetch of the rows
    // did not help, docs/what-did-not-work.md; one row a step was 2.4%
    // slower, bench/RESULTS.md). Both rows' K and V are
    // loaded one step ahead. A missing second row (odd tail) scores -inf
    // and weighs 0.
    KvRow<T, DPL> kna, vna, knb, vnb;
    kna.zero();
    vna.zero();
    knb.zero();
    vnb.zero();
    if (start + warp < end) {
        kna.load(kb + (start + warp) * stride);
        vna.load(vb + (start + warp) * stride);
    }
    if (start + warp + ATT_WARPS < end) {
        knb.load(kb + (start + warp + ATT_WARPS) * stride);
        vnb.load(vb + (start + warp + ATT_WARPS) * stride);
    }
    for (int p = start + warp; p < end; p += 2 * ATT_WARPS) {
        const KvRow<T, DPL> ka = kna, va = vna, kb2 = knb, vb2 = vnb;
        const bool has_b = p + ATT_WARPS < end;
        const int pa = p + 2 * ATT_WARPS, pb = p + 3 * ATT_WARPS;
        if (pa < end) {
            kna.load(kb + pa * stride);
            vna.load(vb + pa * stride);
        }
        if (pb < end) {
            knb.load(kb + pb * stride);
            vnb.load(vb + pb * stride);
        }
        float sa[GB], sb[GB];
#pragma unroll
        for (int g = 0; g < GB; g++) {
            float ta = 0.0f, tb = 0.0f;
#pragma unroll
            for (int d = 0; d < DPL; d++) {
                ta = fmaf(qr[g][d], ka.get(d), ta);
                tb = fmaf(qr[g][d], kb2.get(d), tb);
            }
            sa[g] = ta;
            sb[g] = tb;
        }
        allreduce_heads<GB>(sa, lane);
        allreduce_heads<GB>(sb, lane);
#pragma unroll
        for (int g = 0; g < GB; g++) {
            const float ca = sa[g] * scale;
            const float cb = has_b ? sb[g] * scale : -INFINITY;
            const float mx = fmaxf(ca, cb);
            if (mx > m[g]) {  // warp-uniform
                const float corr = expf(m[g] - mx);
                l[g] *= corr;
#pragma unroll
                for (int d = 0; d < DPL; d++) acc[g][d] *= corr;
                m[g] = mx;
            }
            const float ea = expf(ca - m[g]), eb = expf(cb - m[g]);
            l[g] += ea + eb;
#pragma unroll
            for (int d = 0; d < DPL; d++)
                acc[g][d] = fmaf(eb, vb2.get(d), fmaf(ea, va.get(d), acc[g][d]));
        }
    }
    // Merge the warps: M = max over warps, weights e^{m_w - M}.
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < GB; g++) {
            sm[warp][g] = m[g];
            sl[warp][g] = l[g];
        }
    }
    for (int i = threadIdx.x; i < GB * HD; i += blockDim.x) so[i] = 0.0f;
    __syncthreads();
    float f[GB];
#pragma unroll
    for (int g = 0; g < GB; g++) {
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w][g]);
        f[g] = m[g] == -INFINITY ? 0.0f : expf(m[g] - M);
    }
    for (int w = 0; w < ATT_WARPS; w++) {
        if (warp == w) {
#pragma unroll
            for (int g = 0; g < GB; g++)
#pragma unroll
                for (int d = 0; d < DPL; d++) so[g * HD + lane * DPL + d] += f[g] * acc[g][d];
        }
        __syncthreads();
    }
    if (threadIdx.x < GB) {
        const int g = threadIdx.x;
        float M = -INFINITY;
        for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm[w][g]);
        float L = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++)
            if (sm[w][g] != -INFINITY) L += sl[w][g] * expf(sm[w][g] - M);
        const long long at = ((long long)(h0 + g) * nsplit + split) * 2;
        part_ml[at] = M;
        part_ml[at + 1] = L;
    }
    for (int i = threadIdx.x; i < GB * HD; i += blockDim.x) {
        const int g = i / HD, d = i % HD;
        part_o[((long long)(h0 + g) * nsplit + split) * HD + d] = so[i];
    }
}

// The kernels' arguments: AttnSplitArgs (attn_args.cuh), shared with the
// tensor-core f16 kernels of attention_mma.cu. attn_split_gGB_dDPL: f32
// caches, GB query heads a block, head_dim 32 * DPL.
#define ATTN_SPLIT(GB, DPL)                                                                      \
    extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)                                \
        attn_split_g##GB##_d##DPL(__grid_constant__ const AttnSplitArgs a) {                     \
        PDL_PROLOGUE();                                                                          \
        attn_split_body<float, GB, DPL>(a.q, (const float*)a.kc, (const float*)a.vc, a.pos_p,    \
                                        a.part_o, a.part_ml, a.n_head, a.n_kv, a.nsplit, a.scale); \
    }

// Query heads per block 1, 2, 4, 8 (the largest power of two <= 8 dividing
// the GQA group) x head_dim 64, 128, 256 (2, 4, 8 dims per lane).
ATTN_SPLIT(1, 2)
ATTN_SPLIT(2, 2)
ATTN_SPLIT(4, 2)
ATTN_SPLIT(8, 2)
ATTN_SPLIT(1, 4)
ATTN_SPLIT(2, 4)
ATTN_SPLIT(4, 4)
ATTN_SPLIT(8, 4)
ATTN_SPLIT(1, 8)
ATTN_SPLIT(2, 8)
ATTN_SPLIT(4, 8)
ATTN_SPLIT(8, 8)

// attn_merge: grid (n_head, hd / 64), block 256 = 64 dims x 4 slice
// groups; group g sums slices g, g+4, ... (unrolled so the loads of several
// slices are in flight), then the 4 groups are added in shared memory in a
// fixed order. The max M over the slices is taken cooperatively first.
// attn_merge's arguments (mirrored by `AttnMergeArgs` in
// src/ops/attention.rs): the partial results and the gate are read through
// __ldg, as for attn_split.
struct AttnMergeArgs {
    const float* part_o;
    const float* part_ml;
    const float* gate;
    float* out;
    signed char* q8;
    float* q8d;
    int gate_stride, nsplit, hd, pad;
};
static_assert(sizeof(AttnMergeArgs) == 64, "AttnMergeArgs: layout differs from src/ops/attention.rs");

extern "C" __global__ void __launch_bounds__(256) attn_merge(__grid_constant__ const AttnMergeArgs a) {
    PDL_PROLOGUE();
    const float* gate = a.gate;
    float* out = a.out;
    signed char* q8 = a.q8;
    float* q8d = a.q8d;
    const int gate_stride = a.gate_stride, nsplit = a.nsplit, hd = a.hd;
    __shared__ float red[256];
    __shared__ float sacc[4][64], sl[4][64];
    const int h = blockIdx.x, t = threadIdx.x;
    const int j = blockIdx.y * 64 + (t & 63), grp = t >> 6;
    const float* ml = a.part_ml + (long long)h * nsplit * 2;
    float M = -INFINITY;
    for (int s = t; s < nsplit; s += 256) M = fmaxf(M, __ldg(&ml[2 * s]));
    red[t] = M;
    __syncthreads();
    for (int o = 128; o > 0; o >>= 1) {
        if (t < o) red[t] = fmaxf(red[t], red[t + o]);
        __syncthreads();
    }
    M = red[0];
    float L = 0.0f, acc = 0.0f;
    const float* po = a.part_o + (long long)h * nsplit * hd + j;
#pragma unroll 4
    for (int s = grp; s < nsplit; s += 4) {
        const float l = __ldg(&ml[2 * s + 1]);
        const float f = l > 0.0f ? expf(__ldg(&ml[2 * s]) - M) : 0.0f;
        const float o = l > 0.0f ? __ldg(&po[(long long)s * hd]) : 0.0f;
        L = fmaf(l, f, L);
        acc = fmaf(f, o, acc);
    }
    sacc[grp][t & 63] = acc;
    sl[grp][t & 63] = L;
    __syncthreads();
    if (grp == 0) {
        const int jj = t & 63;
        const float A = ((sacc[0][jj] + sacc[1][jj]) + sacc[2][jj]) + sacc[3][jj];
        const float LL = ((sl[0][jj] + sl[1][jj]) + sl[2][jj]) + sl[3][jj];
        float r = A / LL;
        if (gate) r = __fmul_rn(r, sigmoid_f(__ldg(&gate[(long long)h * gate_stride + j])));
        out[(long long)h * hd + j] = r;
        if (q8) warp_q8(r, h * hd + j, q8, q8d);  // threads 0..63: two whole warps
    }
}
