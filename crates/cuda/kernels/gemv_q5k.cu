// GEMV, Q5_K weights (crates/quant/src/kquants/q5_k.rs): 176-byte blocks of
// 256 values kept whole: f16 d, f16 dmin, 12 bytes of packed 6-bit scales and
// minimums (as Q4_K), qh[32], qs[128]. Value i of sub-block j (32 values
// each, i = 32j + l): d*sc[j]*q - dmin*m[j], q = nibble | bit j of qh[l] << 4;
// sub-block 2c is the low nibbles of qs[32c..32c+32], 2c+1 their high
// nibbles.
//
// Lane chunk `sub` (8 per block): pair c = sub/2, bytes l0 = (sub%2)*16:
// 16-byte loads of the header, of qh[l0..l0+16] and of qs[32c+l0..+16]
// give 16 values of sub-block 2c and 16 of 2c+1.
#include "gemm_common.cuh"

// Scale and minimum of sub-block j from the 12 packed bytes s0|s1|s2
// (q4_k.rs `scales_mins_k4`, shared by Q5_K).
__device__ __forceinline__ void scale_min_k5(int j, u32 s0, u32 s1, u32 s2, int* sc, int* mn) {
    if (j < 4) {
        *sc = byte_of(s0, j) & 63;
        *mn = byte_of(s1, j) & 63;
    } else {
        const int k = j - 4;
        *sc = (byte_of(s2, k) & 0x0f) | ((byte_of(s0, k) >> 6) << 4);
        *mn = (byte_of(s2, k) >> 4) | ((byte_of(s1, k) >> 6) << 4);
    }
}

struct Q5K {
    static constexpr int QK = 256, LPB = 8, PAYLOAD = 176, SIDE_WORDS = 0;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int sub, float* v) {
        const int c = sub >> 1, l0 = (sub & 1) * 16;
        load8(xb + 64 * c + l0, v);
        load8(xb + 64 * c + l0 + 8, v + 8);
        load8(xb + 64 * c + 32 + l0, v + 16);
        load8(xb + 64 * c + 32 + l0 + 8, v + 24);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__,
                                                int sub, const float* v) {
        const int c = sub >> 1, l0 = (sub & 1) * 16;
        const uint4 h = __ldg(reinterpret_cast<const uint4*>(blk));
        const uint4 qh = __ldg(reinterpret_cast<const uint4*>(blk + 16 + l0));
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(blk + 48 + 32 * c + l0));
        const float d = h2f((u16)(h.x & 0xffff)), dmin = h2f((u16)(h.x >> 16));
        int sc0, m0, sc1, m1;
        scale_min_k5(2 * c, h.y, h.z, h.w, &sc0, &m0);
        scale_min_k5(2 * c + 1, h.y, h.z, h.w, &sc1, &m1);
        const u32 qw[4] = {q.x, q.y, q.z, q.w};
        const u32 hw[4] = {qh.x, qh.y, qh.z, qh.w};
        float sq0 = 0.f, sq1 = 0.f, sx0 = 0.f, sx1 = 0.f;
#pragma unroll
        for (int w = 0; w < 4; w++) {
            const u32 lo = (qw[w] & 0x0f0f0f0fu) | (((hw[w] >> (2 * c)) & 0x01010101u) << 4);
            const u32 hi = ((qw[w] >> 4) & 0x0f0f0f0fu) | (((hw[w] >> (2 * c + 1)) & 0x01010101u) << 4);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int i = 4 * w + k;
                sq0 = fmaf(ubyte_f(lo, k), v[i], sq0);
                sq1 = fmaf(ubyte_f(hi, k), v[16 + i], sq1);
                sx0 += v[i];
                sx1 += v[16 + i];
            }
        }
        return d * ((float)sc0 * sq0 + (float)sc1 * sq1) - dmin * ((float)m0 * sx0 + (float)m1 * sx1);
    }
    // Values 8r..8r+8 of the chunk in `load_x` order (columns col(sub,
    // 8r)..+8) (bytes 8(r%2).. of the chunk's 16, sub-block 2c for r < 2, 2c+1
    // after), for the prefill GEMM's per-lane fragments (gemm_common.cuh), in
    // two parts: the loads (`fetch8`, issued chunks ahead) and the decode.
    struct Raw {
        uint4 h;
        uint2 qh, q;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__, int sub,
                                                int r) {
        const int c = sub >> 1, l0 = (sub & 1) * 16;
        return {__ldg(reinterpret_cast<const uint4*>(blk)),
                __ldg(reinterpret_cast<const uint2*>(blk + 16 + l0 + 8 * (r & 1))),
                __ldg(reinterpret_cast<const uint2*>(blk + 48 + 32 * c + l0 + 8 * (r & 1)))};
    }
    // As f16x2 words, GEMM_SCALE times the weights (gemm_common.cuh's
    // `codes_h2`, as Q4_K with 5-bit codes).
    static __device__ __forceinline__ void dec8h(const Raw& raw, int sub, int r, u32* h, const u64*) {
        const int c = sub >> 1, hi = r >> 1;
        const float d = h2f((u16)(raw.h.x & 0xffff)), dmin = h2f((u16)(raw.h.x >> 16));
        int sc, mn;
        scale_min_k5(2 * c + hi, raw.h.y, raw.h.z, raw.h.w, &sc, &mn);
        const float a = GEMM_SCALE * d * (float)sc, b = GEMM_SCALE * dmin * (float)mn;
        u32 q[2];
#pragma unroll
        for (int w = 0; w < 2; w++) {
            const u32 word = w ? raw.q.y : raw.q.x;
            const u32 hw = w ? raw.qh.y : raw.qh.x;
            q[w] = ((hi ? word >> 4 : word) & 0x0f0f0f0fu) | (((hw >> (2 * c + hi)) & 0x01010101u) << 4);
        }
        codes_h2(q[0], q[1], 0x64006400u, pack_h2(a, a), pack_h2(-b, -b), h);
    }
    static constexpr bool GEMM_SCALED = true;
    // Steps in pairs (gemm_common.cuh): the scale bytes a constant.
    static constexpr bool GEMM_HALVES = true;
    static __device__ __forceinline__ int col(int sub, int i) {
        return 64 * (sub >> 1) + (sub & 1) * 16 + (i < 16 ? i : 16 + i);
    }
};

GEMV_KERNELS(gemv_q5_k, Q5K)
GEMM_KERNEL(gemm_q5_k, Q5K)
