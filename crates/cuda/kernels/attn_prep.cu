// Attention input for one decode token (crates/model/src/blocks/attention.rs):
// per head RMSNorm of q and k over head_dim (weights q_norm / k_norm,
// nullable: no norm), NeoX RoPE on the first n_rot dims (pairs (j,
// j + n_rot/2); cos/sin of pos * inv_freq[j] in f64, rounded to f32, as
// crates/cpu/src/ops.rs `Rope` does), the other dims passed through; the
// rotated k and the v of this position appended to the caches.
//
// q_full: per query head `hd` query values, then (gated) `hd` gate values.
// Caches: [ctx][n_kv][hd], f32 (attn_prep) or f16 (attn_prep_kvf16: k and v
// rounded to nearest even once, when stored; q and every step before the
// store stay f32, so both variants compute the same f32 values); the
// position comes from *pos_p (device memory, so a captured graph replays
// with the current position).
//
// Launch: grid n_head + n_kv (query heads, then KV heads), block 256.
#include "common.cuh"

#define PREP_MAX_HD 1024

// A cache element from its f32 value.
__device__ __forceinline__ void kv_store(float* p, float x) { *p = x; }
__device__ __forceinline__ void kv_store(u16* p, float x) { *p = f2h(x); }

// One value of a head's output: q_out for query heads (qdst set), the cache
// for KV heads.
template <typename T>
__device__ __forceinline__ void prep_put(float* qdst, T* kdst, int j, float x) {
    if (qdst)
        qdst[j] = x;
    else
        kv_store(kdst + j, x);
}

template <typename T>
__device__ __forceinline__ void attn_prep_body(
    const float* __restrict__ q_full, const float* __restrict__ k, const float* __restrict__ v,
    const float* __restrict__ q_norm, const float* __restrict__ k_norm,
    const double* __restrict__ inv_freq, int n_rot, int pos, float* __restrict__ q_out,
    T* __restrict__ k_cache, T* __restrict__ v_cache, int n_head, int n_kv, int hd, int gated,
    float eps) {
    __shared__ double scratch[32];
    __shared__ float buf[PREP_MAX_HD];
    const int b = blockIdx.x;
    const float* src;
    const float* w;
    float* qdst = nullptr;
    T* kdst = nullptr;
    if (b < n_head) {
        src = q_full + (long long)b * (gated ? 2 * hd : hd);
        w = q_norm;
        qdst = q_out + (long long)b * hd;
    } else {
        const int g = b - n_head;
        const long long at = ((long long)pos * n_kv + g) * hd;
        src = k + (long long)g * hd;
        w = k_norm;
        kdst = k_cache + at;
        for (int j = threadIdx.x; j < hd; j += blockDim.x)
            kv_store(v_cache + at + j, __ldg(&v[(long long)g * hd + j]));
    }
    float s = 1.0f;
    if (w) {
        double ss = 0.0;
        for (int j = threadIdx.x; j < hd; j += blockDim.x) {
            const double x = __ldg(&src[j]);
            ss += x * x;
        }
        ss = block_sum_f64(ss, scratch);
        s = (float)(1.0 / sqrt(ss / (double)hd + (double)eps));
    }
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        const float x = __ldg(&src[j]);
        buf[j] = w ? __fmul_rn(__fmul_rn(x, s), __ldg(&w[j])) : x;
    }
    __syncthreads();
    const int half = n_rot / 2;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        if (j < half) {
            double sd, cd;
            sincos((double)pos * __ldg(&inv_freq[j]), &sd, &cd);
            const float c = (float)cd, sn = (float)sd;
            const float a = buf[j], bb = buf[j + half];
            prep_put(qdst, kdst, j, __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, sn)));
            prep_put(qdst, kdst, j + half, __fadd_rn(__fmul_rn(bb, c), __fmul_rn(a, sn)));
        } else if (j >= n_rot) {
            prep_put(qdst, kdst, j, buf[j]);
        }
    }
}

// Kernel arguments of all four kernels, one struct passed by value
// (mirrored by `AttnPrepArgs` in src/ops/attn_prep.rs, #[repr(C)]: same
// field order and types). The one-token kernels read the position from
// *pos_p (ld_* and pos0 unused), the chunk kernels token t's rows at
// t * ld_* and its position at pos0 + t (pos_p unused). The caches are
// float or u16 (f16 bits) by kernel. NVRTC applies `__restrict__` only to
// kernel parameters, not to struct members, so attn_prep_body reads its
// read-only inputs through __ldg explicitly.
struct AttnPrepArgs {
    const float* q_full;
    const float* k;
    const float* v;
    const float* q_norm;
    const float* k_norm;
    const double* inv_freq;
    const int* pos_p;
    float* q_out;
    void* k_cache;
    void* v_cache;
    long long ld_q, ld_k, ld_v;
    int n_rot, pos0, n_head, n_kv, hd, gated;
    float eps;
    int pad;
};
static_assert(sizeof(AttnPrepArgs) == 136, "AttnPrepArgs: layout differs from src/ops/attn_prep.rs");

#define ATTN_PREP(NAME, T)                                                                       \
    extern "C" __global__ void __launch_bounds__(256) NAME(__grid_constant__ const AttnPrepArgs a) {               \
        PDL_PROLOGUE();                                                                          \
        attn_prep_body<T>(a.q_full, a.k, a.v, a.q_norm, a.k_norm, a.inv_freq, a.n_rot,          \
                          __ldg(a.pos_p), a.q_out, (T*)a.k_cache, (T*)a.v_cache, a.n_head,      \
                          a.n_kv, a.hd, a.gated, a.eps);                                         \
    }

ATTN_PREP(attn_prep, float)
ATTN_PREP(attn_prep_kvf16, u16)

// The prep of a chunk of tokens (prefill): token t = blockIdx.y at
// position pos0 + t, its q_full / k / v rows ld_q / ld_k / ld_v floats
// apart (the projections' output rows), its rotated q at q_out + t * n_head * hd.
// Grid (n_head + n_kv, tokens), block 256.
#define ATTN_PREP_CHUNK(NAME, T)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(__grid_constant__ const AttnPrepArgs a) {               \
        PDL_PROLOGUE();                                                                          \
        const long long t = blockIdx.y;                                                          \
        attn_prep_body<T>(a.q_full + t * a.ld_q, a.k + t * a.ld_k, a.v + t * a.ld_v, a.q_norm,  \
                          a.k_norm, a.inv_freq, a.n_rot, a.pos0 + (int)t,                        \
                          a.q_out + t * a.n_head * a.hd, (T*)a.k_cache, (T*)a.v_cache,           \
                          a.n_head, a.n_kv, a.hd, a.gated, a.eps);                               \
    }

ATTN_PREP_CHUNK(attn_prep_chunk, float)
ATTN_PREP_CHUNK(attn_prep_chunk_kvf16, u16)
