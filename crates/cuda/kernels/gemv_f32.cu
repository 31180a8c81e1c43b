// GEMV, F32 weights (routers, the shared-expert gate, norms-free small
// matrices, and every tensor whose format has no device kernel: those are
// dequantized to F32 on upload, src/layout.rs). Device layout: the GGUF
// rows as they are, seen as blocks of 32 floats (128 bytes, no scale), so
// the matrix fits gemv_common.cuh's chunk split: lane chunk = one block,
// eight 16-byte loads of weights against 32 activations.
#include "gemm_common.cuh"

struct F32W {
    static constexpr int QK = 32, LPB = 1, PAYLOAD = 128, SIDE_WORDS = 0;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int, float* v) {
#pragma unroll
        for (int l = 0; l < 4; l++) load8(xb + 8 * l, v + 8 * l);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__,
                                                int, const float* v) {
        const float4* w = reinterpret_cast<const float4*>(blk);
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int l = 0; l < 8; l += 2) {
            const float4 a = __ldg(w + l), b = __ldg(w + l + 1);
            s0 = fmaf(a.x, v[4 * l + 0], s0);
            s0 = fmaf(a.y, v[4 * l + 1], s0);
            s0 = fmaf(a.z, v[4 * l + 2], s0);
            s0 = fmaf(a.w, v[4 * l + 3], s0);
            s1 = fmaf(b.x, v[4 * l + 4], s1);
            s1 = fmaf(b.y, v[4 * l + 5], s1);
            s1 = fmaf(b.z, v[4 * l + 6], s1);
            s1 = fmaf(b.w, v[4 * l + 7], s1);
        }
        return s0 + s1;
    }
    // Values 8r..8r+8 of the chunk in `load_x` order (columns col(sub,
    // 8r)..+8), for the prefill GEMM's per-lane fragments (gemm_common.cuh),
    // in two parts: the loads (`fetch8`, issued chunks ahead) and the decode.
    struct Raw {
        float4 a, b;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__, int, int r) {
        const float4* w = reinterpret_cast<const float4*>(blk) + 2 * r;
        return {__ldg(w), __ldg(w + 1)};
    }
    static __device__ __forceinline__ void dec8(const Raw& r, int, int, float* v) {
        v[0] = r.a.x;
        v[1] = r.a.y;
        v[2] = r.a.z;
        v[3] = r.a.w;
        v[4] = r.b.x;
        v[5] = r.b.y;
        v[6] = r.b.z;
        v[7] = r.b.w;
    }
    static __device__ __forceinline__ int col(int, int i) { return i; }
};

GEMV_KERNELS(gemv_f32, F32W)
GEMM_KERNEL(gemm_f32h, F32W)

// Prefill GEMM of an F32 matrix in f32 (the routers and the shared-expert
// gate: their top-k must see the decode's logits, not f16-rounded ones),
// SIMT: tiles of 64 rows x 64 activation rows, K in steps of 32, 256
// threads of 4 x 4 outputs. Arguments and tiles as gemm_common.cuh.
// A router's grid is small (512 rows x 2048 tokens: 256 blocks, two an
// SM), so the loads of step s + 1 are issued into registers before step
// s's products and stored into the other of two shared buffers after
// them: one barrier a step and the global latency under the FMAs. Every
// output is one f32 chain over k in order, whatever the tiling.
constexpr int GEMM_F32_KSTEP = 32;
extern "C" __global__ void __launch_bounds__(256) gemm_f32(const GemmArgs a) {
    PDL_PROLOGUE();
    __shared__ __align__(16) float Ws[2][GEMM_F32_KSTEP][68], Xs[2][GEMM_F32_KSTEP][68];
    const int ty = blockIdx.y;
    int m = 0, p0, p1;
    if (a.tiles) {
        m = __ldg(a.tiles + 3 * ty);
        p0 = __ldg(a.tiles + 3 * ty + 1);
        p1 = __ldg(a.tiles + 3 * ty + 2);
    } else {
        p0 = ty * 64;
        p1 = min(p0 + 64, a.n);
    }
    const float* base =
        reinterpret_cast<const float*>(a.w + (u64)(a.slots ? __ldg(a.slots + m) : (u32)m) * a.mat_bytes);
    const int K = a.nb * 32;
    const int r0 = blockIdx.x * 64, tid = threadIdx.x;
    const int tr = tid >> 4, tp = tid & 15;
    // Loader: row lr, k lk..lk+3 and lk+16..lk+19 of the step.
    const int lr = tid >> 2, lk = (tid & 3) * 4;
    const float* wrow = r0 + lr < a.rows ? base + (long long)(r0 + lr) * K : nullptr;
    const int lp = p0 + lr;
    const float* xrow =
        lp < p1 ? a.x + (long long)(a.gather ? __ldg(a.gather + lp) : lp) * a.ldx : nullptr;
    float4 wv[2], xv[2];
    auto load = [&](int k0) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int k = k0 + lk + 16 * h;
            wv[h] = wrow ? __ldg(reinterpret_cast<const float4*>(wrow + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
            xv[h] = xrow ? __ldg(reinterpret_cast<const float4*>(xrow + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
    };
    auto store = [&](int b) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int k = lk + 16 * h;
            Ws[b][k][lr] = wv[h].x;
            Ws[b][k + 1][lr] = wv[h].y;
            Ws[b][k + 2][lr] = wv[h].z;
            Ws[b][k + 3][lr] = wv[h].w;
            Xs[b][k][lr] = xv[h].x;
            Xs[b][k + 1][lr] = xv[h].y;
            Xs[b][k + 2][lr] = xv[h].z;
            Xs[b][k + 3][lr] = xv[h].w;
        }
    };
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int jx = 0; jx < 4; jx++) acc[i][jx] = 0.0f;
    load(0);
    store(0);
    __syncthreads();
    for (int k0 = 0, b = 0; k0 < K; k0 += GEMM_F32_KSTEP, b ^= 1) {
        const bool more = k0 + GEMM_F32_KSTEP < K;
        if (more) load(k0 + GEMM_F32_KSTEP);
#pragma unroll
        for (int kk = 0; kk < GEMM_F32_KSTEP; kk++) {
            // One 16-byte load each (rows of 68 floats keep them aligned).
            const float4 w4 = *reinterpret_cast<const float4*>(&Ws[b][kk][tr * 4]);
            const float4 x4 = *reinterpret_cast<const float4*>(&Xs[b][kk][tp * 4]);
            const float wr[4] = {w4.x, w4.y, w4.z, w4.w}, xr[4] = {x4.x, x4.y, x4.z, x4.w};
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int jx = 0; jx < 4; jx++) acc[i][jx] = fmaf(wr[i], xr[jx], acc[i][jx]);
        }
        // The other buffer was last read in step s - 1, before the barrier
        // that ended it.
        if (more) store(b ^ 1);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int jx = 0; jx < 4; jx++) {
            const int row = r0 + tr * 4 + i, p = p0 + tp * 4 + jx;
            if (row < a.rows && p < p1) a.y[(long long)p * a.ldy + row] = acc[i][jx];
        }
}
