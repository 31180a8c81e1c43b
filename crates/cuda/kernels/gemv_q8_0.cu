// GEMV, Q8_0 weights (crates/quant/src/legacy/q8_0.rs). The 34-byte GGUF
// block is split: payload qs[32] (i8) and its f16 d in the matrix's scale
// array. Value: d * q.
//
// One lane chunk per 32-value block (LPB = 1): two 16-byte loads; the 32
// lanes of a warp read 32 consecutive blocks (1 KiB, coalesced).
#include "gemm_common.cuh"

struct Q80 {
    static constexpr int QK = 32, LPB = 1, PAYLOAD = 32;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int, float* v) {
#pragma unroll
        for (int l = 0; l < 4; l++) load8(xb + 8 * l, v + 8 * l);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__ dd,
                                                int, const float* v) {
        const uint4 q0 = __ldg(reinterpret_cast<const uint4*>(blk));
        const uint4 q1 = __ldg(reinterpret_cast<const uint4*>(blk) + 1);
        const u32 qw[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < 32; i++) s = fmaf(sbyte_f(qw[i >> 2] ^ 0x80808080u, i & 3), v[i], s);
        return h2f(__ldg(dd)) * s;
    }
    // Values 8r..8r+8 of the chunk in `load_x` order (columns col(sub,
    // 8r)..+8), for the prefill GEMM's per-lane fragments (gemm_common.cuh),
    // in two parts: the loads (`fetch8`, issued chunks ahead) and the decode.
    struct Raw {
        uint2 q;
        u16 d;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__ dd, int,
                                                int r) {
        return {__ldg(reinterpret_cast<const uint2*>(blk + 8 * r)), __ldg(dd)};
    }
    // As f16x2 words, GEMM_SCALE times the weights (gemm_common.cuh's
    // `codes_h2` on the codes plus 128: (q + 128 - 128) * f16(S d)).
    static __device__ __forceinline__ void dec8h(const Raw& r, int, int, u32* h, const u64*) {
        const float d = GEMM_SCALE * h2f(r.d);
        codes_h2(r.q.x ^ 0x80808080u, r.q.y ^ 0x80808080u, 0x64806480u, pack_h2(d, d), 0u, h);
    }
    static constexpr bool GEMM_SCALED = true;
    static __device__ __forceinline__ int col(int, int i) { return i; }
};

GEMV_KERNELS(gemv_q8_0, Q80)
GEMM_KERNEL(gemm_q8_0, Q80)
