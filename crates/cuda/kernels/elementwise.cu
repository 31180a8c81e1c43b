// Element-wise decode helpers, each with the CPU's operation order
// (crates/cpu/src/ops.rs, crates/model/src/blocks/moe.rs).
//
// swiglu:      out[i] = SiLU(g[i]) * u[i]; q, qd (nullable): out also as
//              int8 activations (common.cuh warp_q8; n % 32 == 0)
// add_inplace: x[i] += y[i]
// moe_combine: x[j] += (sum_i w[i] * ys[i*d + j]) + sh[j] * sigmoid(*sh_logit)
//              (the routed sum in the router's ascending expert order; sh
//              and sh_logit nullable: no shared expert / no gate)
// Launch: grid ceil(n / 256), block 256.
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256)
    swiglu(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ out,
           signed char* __restrict__ q, float* __restrict__ qd, int n) {
    PDL_PROLOGUE();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;  // whole warps when q is given (n % 32 == 0)
    const float v = __fmul_rn(silu_f(g[i]), u[i]);
    out[i] = v;
    if (q) warp_q8(v, i, q, qd);
}

extern "C" __global__ void __launch_bounds__(256)
    add_inplace(float* __restrict__ x, const float* __restrict__ y, int n) {
    PDL_PROLOGUE();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = __fadd_rn(x[i], y[i]);
}

extern "C" __global__ void __launch_bounds__(256)
    moe_combine(float* __restrict__ x, const float* __restrict__ ys, const float* __restrict__ w,
                int k, int d, const float* __restrict__ sh, const float* __restrict__ sh_logit) {
    PDL_PROLOGUE();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    float acc = 0.0f;
    for (int i = 0; i < k; i++) acc = __fadd_rn(acc, __fmul_rn(w[i], ys[(long long)i * d + j]));
    if (sh) {
        const float s = sh_logit ? sigmoid_f(*sh_logit) : 1.0f;
        acc = __fadd_rn(acc, __fmul_rn(sh[j], s));
    }
    x[j] = __fadd_rn(x[j], acc);
}

// moe_combine_norm: moe_combine, then the next block's RMSNorm of the new x
// in the same launch (norm.cu's arithmetic): h = x * s * norm_w, and h as
// int8 activations when q is given (d % 32 == 0). One block of 1024
// threads (the norm needs every x): grid 1. A thread keeps its first
// CMB_MAXV values of x in registers between the two passes, and the
// expert loop is unrolled so its loads are in flight together: the block
// is one L2 round trip per pass, not one per value. (A version over
// several blocks, the norm finished by the last one, measured slower on
// the H200: docs/what-did-not-work.md.)
#define CMB_MAXV 4

// moe_combine_norm's and moe_combine_norm_v8's arguments, one struct
// passed by value (mirrored by `MoeCombineNormArgs` in
// src/ops/elementwise.rs, #[repr(C)]: same field order and types; `mix`
// is read by the _v8 kernel only). NVRTC applies `__restrict__` only to
// kernel parameters, so the read-only inputs are read through __ldg
// explicitly (load8 already is); x is read and written and keeps plain
// loads.
struct MoeCombineNormArgs {
    float* x;
    const float* ys;
    const float* w;
    const float* sh;
    const float* sh_logit;
    const float* norm_w;
    float* h;
    signed char* q;
    float* qd;
    const float* mix;
    int k, d;
    float eps;
    int pad;
};
static_assert(sizeof(MoeCombineNormArgs) == 96,
              "MoeCombineNormArgs: layout differs from src/ops/elementwise.rs");

extern "C" __global__ void __launch_bounds__(1024)
    moe_combine_norm(__grid_constant__ const MoeCombineNormArgs a) {
    PDL_PROLOGUE();
    float* x = a.x;
    const float *ys = a.ys, *w = a.w, *sh = a.sh, *sh_logit = a.sh_logit, *norm_w = a.norm_w;
    float* h = a.h;
    signed char* q = a.q;
    float* qd = a.qd;
    const int k = a.k, d = a.d;
    __shared__ double scratch[32];
    const float s_sh = sh && sh_logit ? sigmoid_f(__ldg(sh_logit)) : 1.0f;
    double ss = 0.0;
    float xv[CMB_MAXV];
#pragma unroll
    for (int u = 0; u < CMB_MAXV; u++) {
        const int j = threadIdx.x + u * blockDim.x;
        if (j < d) {
            float acc = 0.0f;
#pragma unroll 8
            for (int i = 0; i < k; i++)
                acc = __fadd_rn(acc, __fmul_rn(__ldg(&w[i]), __ldg(&ys[(long long)i * d + j])));
            if (sh) acc = __fadd_rn(acc, __fmul_rn(__ldg(&sh[j]), s_sh));
            const float v = __fadd_rn(x[j], acc);
            x[j] = v;
            xv[u] = v;
            ss += (double)v * (double)v;
        }
    }
    for (int j = threadIdx.x + CMB_MAXV * blockDim.x; j < d; j += blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < k; i++) acc = __fadd_rn(acc, __fmul_rn(__ldg(&w[i]), __ldg(&ys[(long long)i * d + j])));
        if (sh) acc = __fadd_rn(acc, __fmul_rn(__ldg(&sh[j]), s_sh));
        const float v = __fadd_rn(x[j], acc);
        x[j] = v;
        ss += (double)v * (double)v;
    }
    ss = block_sum_f64(ss, scratch);
    const float s = (float)(1.0 / sqrt(ss / (double)d + (double)a.eps));
#pragma unroll
    for (int u = 0; u < CMB_MAXV; u++) {
        const int j = threadIdx.x + u * blockDim.x;
        if (j < d) {  // whole warps when q is given (d % 32 == 0)
            const float v = __fmul_rn(__fmul_rn(xv[u], s), __ldg(&norm_w[j]));
            h[j] = v;
            if (q) warp_q8(v, j, q, qd);
        }
    }
    for (int j = threadIdx.x + CMB_MAXV * blockDim.x; j < d; j += blockDim.x) {
        const float v = __fmul_rn(__fmul_rn(x[j], s), __ldg(&norm_w[j]));
        h[j] = v;
        if (q) warp_q8(v, j, q, qd);
    }
}

// moe_combine_norm_v8: moe_combine_norm for d % 32 == 0 and d <= 8 *
// blockDim (<= 4096), a thread holding 8 consecutive values (the layout of
// norm.cu's rms_norm_v8): the expert outputs are loaded CMB_GROUP experts
// at a time (16-byte loads, all of a group in flight before its adds), the
// adds in the same order and rounding as moe_combine_norm. `mix`
// (nullable): the mixer's output, added to x first (x + mix, then the
// experts: the order of rms_norm's residual add and a combine after it),
// for the layers whose post-mixer RMSNorm runs inside router_gemv_topk,
// which leaves x as it was. One block: grid 1, block a multiple of 32 with
// 8 * blockDim >= d.
#define CMB_GROUP 6
extern "C" __global__ void __launch_bounds__(512)
    moe_combine_norm_v8(__grid_constant__ const MoeCombineNormArgs a) {
    PDL_PROLOGUE();
    float* x = a.x;
    const float *ys = a.ys, *w = a.w, *sh = a.sh, *sh_logit = a.sh_logit, *norm_w = a.norm_w;
    const float* mix = a.mix;
    const int k = a.k, d = a.d;
    __shared__ double scratch[32];
    const int i = 8 * threadIdx.x;
    const bool act = i < d;
    float acc[8], v[8], nw[8], sv[8];
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] = v[e] = nw[e] = sv[e] = 0.f;
    float s_sh = 1.0f;
    if (act) {
        ld8_plain(x + i, v);
        if (mix) {  // the mixer's residual add, deferred to here (router.cu)
            float m8[8];
            load8(mix + i, m8);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = __fadd_rn(v[e], m8[e]);
        }
        load8(norm_w + i, nw);
        if (sh) {
            load8(sh + i, sv);
            if (sh_logit) s_sh = sigmoid_f(__ldg(sh_logit));
        }
        for (int i0 = 0; i0 < k; i0 += CMB_GROUP) {
            float yv[CMB_GROUP][8], wi[CMB_GROUP];
#pragma unroll
            for (int u = 0; u < CMB_GROUP; u++) {
                if (i0 + u < k) {
                    wi[u] = __ldg(&w[i0 + u]);
                    load8(ys + (long long)(i0 + u) * d + i, yv[u]);
                }
            }
#pragma unroll
            for (int u = 0; u < CMB_GROUP; u++) {
                if (i0 + u < k) {
#pragma unroll
                    for (int e = 0; e < 8; e++)
                        acc[e] = __fadd_rn(acc[e], __fmul_rn(wi[u], yv[u][e]));
                }
            }
        }
#pragma unroll
        for (int e = 0; e < 8; e++) {
            if (sh) acc[e] = __fadd_rn(acc[e], __fmul_rn(sv[e], s_sh));
            v[e] = __fadd_rn(v[e], acc[e]);
        }
        st8(x + i, v);
    }
    norm8_store(v, nw, d, a.eps, i, act, scratch, a.h, a.q, a.qd);
}

// Prefill (a chunk of tokens):
// add_bias_rows: y[t*ld + j] += b[j] for j < n, every token t (qwen2's
//   q/k/v biases on the projections' output rows). Grid (ceil(n/256), tokens).
extern "C" __global__ void __launch_bounds__(256)
    add_bias_rows(float* __restrict__ y, long long ld, const float* __restrict__ b, int n) {
    PDL_PROLOGUE();
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j < n) {
        float* r = y + (long long)blockIdx.y * ld;
        r[j] = __fadd_rn(r[j], b[j]);
    }
}

// to_f16_rows: y[t*cols + j] = f16(x[t*ld + j]) for j < cols (a multiple
//   of 4), every token t: a prefill GEMM's input converted once instead of
//   once per tile of weight rows (gemm_common.cuh). Round to nearest even,
//   as the GEMM's own conversion. Grid (ceil(cols/1024), tokens), block
//   256, 4 values a thread.
extern "C" __global__ void __launch_bounds__(256)
    to_f16_rows(const float* __restrict__ x, long long ld, u16* __restrict__ y, int cols) {
    PDL_PROLOGUE();
    const int j = 4 * (blockIdx.x * blockDim.x + threadIdx.x);
    if (j < cols) {
        const float4 f = *reinterpret_cast<const float4*>(x + (long long)blockIdx.y * ld + j);
        uint2 h;
        h.x = pack_h2(f.x, f.y);
        h.y = pack_h2(f.z, f.w);
        *reinterpret_cast<uint2*>(y + (long long)blockIdx.y * cols + j) = h;
    }
}

// moe_combine_chunk: moe_combine for every token t of the chunk (grid
//   (ceil(d/256), tokens)): x[t][j] += sum_i w[t*k+i] * ys[pair[t*k+i]*d + j]
//   (+ sh[t*d + j] * sigmoid(sh_logit[t*sh_ld])), the routed sum in the
//   router's ascending expert order; `pair` maps a token's i-th choice to
//   its row of the grouped GEMM's output.
// moe_combine_chunk's arguments (mirrored by `MoeCombineChunkArgs` in
// src/ops/chunk.rs): the read-only inputs through __ldg, x plain.
struct MoeCombineChunkArgs {
    float* x;
    const float* ys;
    const int* pair;
    const float* w;
    const float* sh;
    const float* sh_logit;
    long long sh_ld;
    int k, d;
};
static_assert(sizeof(MoeCombineChunkArgs) == 64,
              "MoeCombineChunkArgs: layout differs from src/ops/chunk.rs");

extern "C" __global__ void __launch_bounds__(256)
    moe_combine_chunk(__grid_constant__ const MoeCombineChunkArgs a) {
    PDL_PROLOGUE();
    float* x = a.x;
    const float *ys = a.ys, *w = a.w, *sh = a.sh, *sh_logit = a.sh_logit;
    const int* pair = a.pair;
    const int k = a.k, d = a.d;
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= d) return;
    const long long t = blockIdx.y;
    float acc = 0.0f;
    for (int i = 0; i < k; i++)
        acc = __fadd_rn(acc, __fmul_rn(__ldg(&w[t * k + i]), __ldg(&ys[(long long)__ldg(&pair[t * k + i]) * d + j])));
    if (sh) {
        const float s = sh_logit ? sigmoid_f(__ldg(&sh_logit[t * a.sh_ld])) : 1.0f;
        acc = __fadd_rn(acc, __fmul_rn(__ldg(&sh[t * d + j]), s));
    }
    x[t * d + j] = __fadd_rn(x[t * d + j], acc);
}
