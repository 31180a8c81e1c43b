// Attention input for one decode token (crates/model/src/blocks/attention.rs):
// per head RMSNorm of q and k over head_dim (weights q_norm / k_norm,
// nullable: no norm), NeoX RoPE on the first n_rot dims (pairs (j,
// j + n_rot/2); cos/sin of pos * inv_freq[j] in f64, rounded to f32, as
// crates/cpu/src/ops.rs `Rope` does), the other dims passed through; the
// rotated k and the v of this position appended to the caches.
//
// q_full: per query head `hd` query values, then (gated) `hd` gate values.
// Caches: [ctx][n_kv][hd]; the position comes from *pos_p (device memory,
// so a captured graph replays with the current position).
//
// Launch: grid n_head + n_kv (query heads, then KV heads), block 256.
#include "common.cuh"

#define PREP_MAX_HD 1024

extern "C" __global__ void __launch_bounds__(256)
    attn_prep(const float* __restrict__ q_full, const float* __restrict__ k,
              const float* __restrict__ v, const float* __restrict__ q_norm,
              const float* __restrict__ k_norm, const double* __restrict__ inv_freq, int n_rot,
              const int* __restrict__ pos_p, float* __restrict__ q_out, float* __restrict__ k_cache,
              float* __restrict__ v_cache, int n_head, int n_kv, int hd, int gated, float eps) {
    PDL_PROLOGUE();
    __shared__ double scratch[32];
    __shared__ float buf[PREP_MAX_HD];
    const int b = blockIdx.x;
    const int pos = *pos_p;
    const float* src;
    const float* w;
    float* dst;
    if (b < n_head) {
        src = q_full + (long long)b * (gated ? 2 * hd : hd);
        w = q_norm;
        dst = q_out + (long long)b * hd;
    } else {
        const int g = b - n_head;
        const long long at = ((long long)pos * n_kv + g) * hd;
        src = k + (long long)g * hd;
        w = k_norm;
        dst = k_cache + at;
        for (int j = threadIdx.x; j < hd; j += blockDim.x) v_cache[at + j] = v[(long long)g * hd + j];
    }
    float s = 1.0f;
    if (w) {
        double ss = 0.0;
        for (int j = threadIdx.x; j < hd; j += blockDim.x) {
            const double x = src[j];
            ss += x * x;
        }
        ss = block_sum_f64(ss, scratch);
        s = (float)(1.0 / sqrt(ss / (double)hd + (double)eps));
    }
    for (int j = threadIdx.x; j < hd; j += blockDim.x)
        buf[j] = w ? __fmul_rn(__fmul_rn(src[j], s), w[j]) : src[j];
    __syncthreads();
    const int half = n_rot / 2;
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        if (j < half) {
            double sd, cd;
            sincos((double)pos * inv_freq[j], &sd, &cd);
            const float c = (float)cd, sn = (float)sd;
            const float a = buf[j], bb = buf[j + half];
            dst[j] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(bb, sn));
            dst[j + half] = __fadd_rn(__fmul_rn(bb, c), __fmul_rn(a, sn));
        } else if (j >= n_rot) {
            dst[j] = buf[j];
        }
    }
}
