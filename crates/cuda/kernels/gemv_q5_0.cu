// GEMV, Q5_0 weights (crates/quant/src/legacy/q5.rs). The 22-byte GGUF
// block d(f16) | qh(4) | qs(16) is split: payload qs[16] and a 6-byte side
// entry d | qh (src/layout.rs, SIDE_WORDS = 3). Element i < 16 is the low
// nibble of qs[i], element 16 + i its high nibble; bit i of the
// little-endian u32 qh is element i's fifth bit. Value: d * (q - 16).
//
// One lane chunk per 32-value block (LPB = 1): one 16-byte load of the
// nibbles, three 2-byte loads of the side entry; the 32 lanes of a warp
// read 32 consecutive payloads (512 bytes, coalesced) and side entries.
#include "gemm_common.cuh"

// Bits 0..3 of `nib` to bit 4 of bytes 0..3 (the fifth bits of four values).
__device__ __forceinline__ u32 bits_to_b4(u32 nib) {
    return ((nib * 0x00204081u) & 0x01010101u) << 4;
}

struct Q50 {
    static constexpr int QK = 32, LPB = 1, PAYLOAD = 16, SIDE_WORDS = 3;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int, float* v) {
#pragma unroll
        for (int l = 0; l < 4; l++) load8(xb + 8 * l, v + 8 * l);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__ side,
                                                int, const float* v) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(blk));
        const float d = h2f(__ldg(side));
        const u32 qh = (u32)__ldg(side + 1) | ((u32)__ldg(side + 2) << 16);
        const u32 qw[4] = {q.x, q.y, q.z, q.w};
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            // values 4w..4w+3 (low nibbles) and 16+4w.. (high nibbles)
            const u32 lo = (qw[w] & 0x0f0f0f0fu) | bits_to_b4((qh >> (4 * w)) & 15u);
            const u32 hi = ((qw[w] >> 4) & 0x0f0f0f0fu) | bits_to_b4((qh >> (16 + 4 * w)) & 15u);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                // 2^23 + q, minus 2^23 + 16: q - 16 exactly
                s = fmaf(__int_as_float(__byte_perm(lo, 0x4B000000u, 0x7540u | (u32)k)) - 8388624.0f,
                         v[4 * w + k], s);
                s = fmaf(__int_as_float(__byte_perm(hi, 0x4B000000u, 0x7540u | (u32)k)) - 8388624.0f,
                         v[16 + 4 * w + k], s);
            }
        }
        return d * s;
    }
    // Values 8r..8r+8 of the chunk in `load_x` order (columns col(sub,
    // 8r)..+8) (low nibbles of bytes 0-7 / 8-15 for r = 0 / 1, high nibbles
    // for 2 / 3), for the prefill GEMM's per-lane fragments (gemm_common.cuh),
    // in two parts: the loads (`fetch8`, issued chunks ahead) and the decode.
    struct Raw {
        uint2 q;
        u32 qh;
        u16 d;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__ side, int,
                                                int r) {
        return {__ldg(reinterpret_cast<const uint2*>(blk + 8 * (r & 1))),
                (u32)__ldg(side + 1) | ((u32)__ldg(side + 2) << 16), __ldg(side)};
    }
    // As f16x2 words, GEMM_SCALE times the weights (gemm_common.cuh's
    // `codes_h2`: (q - 16) * f16(S d)).
    static __device__ __forceinline__ void dec8h(const Raw& raw, int, int r, u32* h, const u64*) {
        const float d = GEMM_SCALE * h2f(raw.d);
        const int hi = r >> 1;
        u32 q[2];
#pragma unroll
        for (int ww = 0; ww < 2; ww++) {
            const int w = 2 * (r & 1) + ww;
            const u32 word = ww ? raw.q.y : raw.q.x;
            q[ww] = ((hi ? word >> 4 : word) & 0x0f0f0f0fu) | bits_to_b4((raw.qh >> (16 * hi + 4 * w)) & 15u);
        }
        codes_h2(q[0], q[1], 0x64106410u, pack_h2(d, d), 0u, h);
    }
    static constexpr bool GEMM_SCALED = true;
    static __device__ __forceinline__ int col(int, int i) { return i; }
};

GEMV_KERNELS(gemv_q5_0, Q50)
GEMM_KERNEL(gemm_q5_0, Q50)
