// GEMV, F32 weights (routers, the shared-expert gate, norms-free small
// matrices, and every tensor whose format has no device kernel: those are
// dequantized to F32 on upload, src/layout.rs). Device layout: the GGUF
// rows as they are, seen as blocks of 32 floats (128 bytes, no scale), so
// the matrix fits gemv_common.cuh's chunk split: lane chunk = one block,
// eight 16-byte loads of weights against 32 activations.
#include "gemv_common.cuh"

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
};

GEMV_KERNELS(gemv_f32, F32W)
