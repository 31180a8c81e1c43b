// RMSNorm over rows (crates/cpu/src/ops.rs `rms_norm`): out = x * s * w with
// s = 1 / sqrt(mean(x^2) + eps), the sum of squares in f64 (as the CPU
// does: f32 squares are exact in f64), products rounded one at a time as
// the CPU rounds them. `add_one`: HF's (1 + w) weight form (GGUF files
// carry w + 1 already, so the engine passes 0; kept for HF-layout weights).
// `res` (nullable): the residual add fused in front: x += res first, and
// the sum is written back to x (h = x + mixer; out = norm(h)).
//
// `q`, `qd` (nullable): the output also quantized for the int8 GEMV
// kernels, as quantize_q8.cu does (per 32 values d = max|v| / 127, q =
// round(v / d)), so no separate launch is needed; needs d % 32 == 0.
//
// Launch: grid rows, block a multiple of 32 (<= 1024).
//
// rms_norm_v8: the same for d % 8 == 0 and d <= 8 * blockDim (<= 4096):
// a thread holds 8 consecutive values in registers (two 16-byte loads of
// x, res and w each, all issued before the reduction), so the launch is
// one memory round trip, one block sum and one store pass; for decode
// (d = 2048: 256 threads) the block sum has 8 warps to add, not 32. The
// int8 output as quad_q8 (common.cuh), d % 32 == 0. Launch: grid rows,
// block a multiple of 32 with 8 * blockDim >= d.
#include "common.cuh"

// Both kernels' arguments, one struct passed by value (mirrored by
// `RmsNormArgs` in src/ops/norm.rs, #[repr(C)]: same field order and
// types). NVRTC applies `__restrict__` only to kernel parameters, so res
// and w are read through __ldg explicitly (load8 already is); x is read
// and written and keeps plain loads.
struct RmsNormArgs {
    float* x;
    const float* res;
    const float* w;
    float* out;
    signed char* q;
    float* qd;
    int d;
    float eps;
    int add_one, pad;
};
static_assert(sizeof(RmsNormArgs) == 64, "RmsNormArgs: layout differs from src/ops/norm.rs");

extern "C" __global__ void __launch_bounds__(512) rms_norm_v8(__grid_constant__ const RmsNormArgs a) {
    PDL_PROLOGUE();
    float* x = a.x;
    const float *res = a.res, *w = a.w;
    float* out = a.out;
    signed char* q = a.q;
    float* qd = a.qd;
    const int d = a.d, add_one = a.add_one;
    const float eps = a.eps;
    __shared__ double scratch[32];
    const long long row = blockIdx.x;
    const int i = 8 * threadIdx.x;
    const bool act = i < d;
    x += row * d;
    out += row * d;
    float v[8], wv[8];
#pragma unroll
    for (int e = 0; e < 8; e++) v[e] = wv[e] = 0.f;
    if (act) {
        ld8_plain(x + i, v);
        load8(w + i, wv);
        if (res) {
            float r8[8];
            load8(res + row * d + i, r8);
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = __fadd_rn(v[e], r8[e]);
            st8(x + i, v);
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++)
        if (add_one) wv[e] = __fadd_rn(1.0f, wv[e]);
    norm8_store(v, wv, d, eps, i, act, scratch, out, q ? q + row * d : q,
                q ? qd + row * (d / 32) : qd);
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm(__grid_constant__ const RmsNormArgs a) {
    PDL_PROLOGUE();
    float* x = a.x;
    const float *res = a.res, *w = a.w;
    float* out = a.out;
    signed char* q = a.q;
    float* qd = a.qd;
    const int d = a.d, add_one = a.add_one;
    const float eps = a.eps;
    __shared__ double scratch[32];
    const long long row = blockIdx.x;
    x += row * d;
    out += row * d;
    if (res) res += row * d;
    double ss = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        float v = x[j];
        if (res) {
            v = __fadd_rn(v, __ldg(&res[j]));
            x[j] = v;
        }
        ss += (double)v * (double)v;
    }
    ss = block_sum_f64(ss, scratch);
    const float s = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    if (q) {
        q += row * d;
        qd += row * (d / 32);
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const float wl = __ldg(&w[j]);
        const float wj = add_one ? __fadd_rn(1.0f, wl) : wl;
        const float v = __fmul_rn(__fmul_rn(x[j], s), wj);
        out[j] = v;
        if (q) warp_q8(v, j, q, qd);  // a warp: 32 consecutive, aligned j (d % 32 == 0)
    }
}
