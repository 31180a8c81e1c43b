// GEMV, IQ1_M weights (crates/quant/src/iquants/iq1.rs): 56-byte blocks of
// 256 values kept whole (8-byte aligned): qs[32] | qh[16] | scales[8]. Group
// l (8 values, 0..32): grid index qs[l] | (nibble & 7) << 8 into iq1s_grid
// (bytes -1, 0, 1), shift sign = bit 3 of the nibble (nibble l%2 of
// qh[l/2]); 16-value group k has the 3-bit scale s = bits 3(k%4).. of the
// u16 scales word k/4, whose top nibbles hold the f16 d (word i: bits 4i..).
// Value: d*(2s+1) * (grid ± 1/8), minus for a set shift bit.
//
// Lane chunk `sub` (8 per block) = groups 4sub..4sub+4: a 4-byte load of
// their index bytes, a 2-byte load of their nibbles, an 8-byte load of the
// scale words (d and both scales of the chunk).
#define WANT_IQ1S_GRID
#include "gemm_common.cuh"
#include "iq_tables.cuh"

struct Iq1M {
    static constexpr int QK = 256, LPB = 8, PAYLOAD = 56, SIDE_WORDS = 0;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int sub, float* v) {
#pragma unroll
        for (int l = 0; l < 4; l++) load8(xb + 32 * sub + 8 * l, v + 8 * l);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__,
                                                int sub, const float* v) {
        const u32 qs = __ldg(reinterpret_cast<const u32*>(blk + 4 * sub));
        const u32 qh = __ldg(reinterpret_cast<const u16*>(blk + 32 + 2 * sub));
        const uint2 sw = __ldg(reinterpret_cast<const uint2*>(blk + 48));
        const u32 dbits = ((sw.x & 0xffffu) >> 12) | ((sw.x >> 24) & 0xf0u) | ((sw.y & 0xffffu) >> 4 & 0xf00u) |
                          ((sw.y >> 16) & 0xf000u);
        const u32 scw = ((sub >> 1) == 0 ? sw.x : (sub >> 1) == 1 ? sw.x >> 16 : (sub >> 1) == 2 ? sw.y : sw.y >> 16) &
                        0xffffu;
        const int sh = 6 * (sub & 1);  // 3-bit scales of groups k = 2sub, 2sub+1
        float s[2] = {0.f, 0.f};
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const u32 nib = (qh >> (4 * l)) & 15u;
            const u64 grid = __ldg(&iq1s_grid[byte_of(qs, l) | ((nib & 7u) << 8)]);
            const float delta = (nib & 8u) ? -0.125f : 0.125f;
            float sg = 0.f, sx = 0.f;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const u32 g4 = (half ? (u32)(grid >> 32) : (u32)grid) ^ 0x80808080u;
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    sg = fmaf(sbyte_f(g4, k), v[8 * l + 4 * half + k], sg);
                    sx += v[8 * l + 4 * half + k];
                }
            }
            s[l >> 1] += fmaf(delta, sx, sg);
        }
        const float d = h2f((u16)dbits);
        const float s0 = (float)(2 * ((scw >> sh) & 7u) + 1), s1 = (float)(2 * ((scw >> (sh + 3)) & 7u) + 1);
        return d * (s0 * s[0] + s1 * s[1]);
    }
    // Run `l` of chunk `sub` (values 8l..8l+8 in `load_x` order, columns
    // col(sub, 8l)..+8: grid entry l), for the prefill GEMM's per-lane
    // fragments (gemm_common.cuh), in two parts: the loads (`fetch8`, issued
    // chunks ahead) and the decode.
    struct Raw {
        u32 qs, qh;
        uint2 sw;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__, int sub, int) {
        return {__ldg(reinterpret_cast<const u32*>(blk + 4 * sub)),
                (u32)__ldg(reinterpret_cast<const u16*>(blk + 32 + 2 * sub)),
                __ldg(reinterpret_cast<const uint2*>(blk + 48))};
    }
    static __device__ __forceinline__ void dec8(const Raw& r, int sub, int l, float* v) {
        const uint2 sw = r.sw;
        const u32 dbits = ((sw.x & 0xffffu) >> 12) | ((sw.x >> 24) & 0xf0u) | ((sw.y & 0xffffu) >> 4 & 0xf00u) |
                          ((sw.y >> 16) & 0xf000u);
        const u32 scw = ((sub >> 1) == 0 ? sw.x : (sub >> 1) == 1 ? sw.x >> 16 : (sub >> 1) == 2 ? sw.y : sw.y >> 16) &
                        0xffffu;
        const int sh = 6 * (sub & 1) + (l < 2 ? 0 : 3);
        const float s = h2f((u16)dbits) * (float)(2 * ((scw >> sh) & 7u) + 1);
        const u32 nib = (r.qh >> (4 * l)) & 15u;
        const u64 grid = __ldg(&iq1s_grid[byte_of(r.qs, l) | ((nib & 7u) << 8)]);
        const float delta = (nib & 8u) ? -0.125f : 0.125f;
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const u32 g4 = (half ? (u32)(grid >> 32) : (u32)grid) ^ 0x80808080u;
#pragma unroll
            for (int k = 0; k < 4; k++) v[4 * half + k] = s * (sbyte_f(g4, k) + delta);
        }
    }
    static __device__ __forceinline__ int col(int sub, int i) { return 32 * sub + i; }
};

GEMV_KERNELS(gemv_iq1_m, Iq1M)
GEMM_KERNEL(gemm_iq1_m, Iq1M)
