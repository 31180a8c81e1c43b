// GEMV, IQ4_NL weights (crates/quant/src/iquants/iq4.rs). The 18-byte GGUF
// block is split: payload qs[16] and its f16 d in the matrix's scale array.
// Element i < 16 indexes kvalues_iq4nl with the low nibble of qs[i], element
// 16 + i with its high nibble. Value: d * kvalues[nibble].
//
// One lane chunk per 32-value block (LPB = 1): one 16-byte load. The table
// lives in four registers (iq4nl.cuh).
#include "gemm_common.cuh"
#include "iq4nl.cuh"

struct Iq4Nl {
    static constexpr int QK = 32, LPB = 1, PAYLOAD = 16;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int, float* v) {
#pragma unroll
        for (int l = 0; l < 4; l++) load8(xb + 8 * l, v + 8 * l);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__ dd,
                                                int, const float* v) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(blk));
        const u32 qw[4] = {q.x, q.y, q.z, q.w};
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const u32 lo = iq4nl_lookup(qw[w] & 0x0f0f0f0fu) ^ 0x80808080u;
            const u32 hi = iq4nl_lookup((qw[w] >> 4) & 0x0f0f0f0fu) ^ 0x80808080u;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                s = fmaf(sbyte_f(lo, k), v[4 * w + k], s);
                s = fmaf(sbyte_f(hi, k), v[16 + 4 * w + k], s);
            }
        }
        return h2f(__ldg(dd)) * s;
    }
    // Values 8r..8r+8 of the chunk in `load_x` order (columns col(sub,
    // 8r)..+8) (low nibbles of bytes 0-7 / 8-15 for r = 0 / 1, high nibbles
    // for 2 / 3), for the prefill GEMM's per-lane fragments (gemm_common.cuh),
    // in two parts: the loads (`fetch8`, issued chunks ahead) and the decode.
    struct Raw {
        uint2 q;
        u16 d;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__ dd, int,
                                                int r) {
        return {__ldg(reinterpret_cast<const uint2*>(blk + 8 * (r & 1))), __ldg(dd)};
    }
    static __device__ __forceinline__ void dec8(const Raw& raw, int, int r, float* v) {
        const float d = h2f(raw.d);
        const int hi = r >> 1;
#pragma unroll
        for (int ww = 0; ww < 2; ww++) {
            const u32 word = ww ? raw.q.y : raw.q.x;
            const u32 lv = iq4nl_lookup((hi ? word >> 4 : word) & 0x0f0f0f0fu) ^ 0x80808080u;
#pragma unroll
            for (int k = 0; k < 4; k++) v[4 * ww + k] = d * sbyte_f(lv, k);
        }
    }
    static __device__ __forceinline__ int col(int, int i) { return i; }
};

GEMV_KERNELS(gemv_iq4_nl, Iq4Nl)
GEMM_KERNEL(gemm_iq4_nl, Iq4Nl)
