// GEMV, Q6_K weights (crates/quant/src/kquants/q6_k.rs). The 210-byte GGUF
// block is split: payload ql[128] | qh[64] | scales[16] (208 bytes, aligned)
// and its f16 d in the matrix's scale array. In half h (128 values) value
// 128h+32j+l has its low nibble in ql[64h + l + 32(j%2)] (low nibble for
// j < 2, high for j >= 2), its high 2 bits at 2j of qh[32h+l]; it is
// d * scales[(128h+32j+l)/16] * (q - 32).
//
// Lane chunk `sub` (8 per block): h = sub/4, l0 = (sub%4)*8, all four j:
// three 8-byte loads (ql, ql+32, qh) and one 8-byte load of the scales.
#include "gemm_common.cuh"

struct Q6K {
    static constexpr int QK = 256, LPB = 8, PAYLOAD = 208;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int sub, float* v) {
        const int h = sub >> 2, l0 = (sub & 3) * 8;
#pragma unroll
        for (int j = 0; j < 4; j++) load8(xb + 128 * h + 32 * j + l0, v + 8 * j);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__ dd,
                                                int sub, const float* v) {
        const int h = sub >> 2, l0 = (sub & 3) * 8;
        const uint2 a = __ldg(reinterpret_cast<const uint2*>(blk + 64 * h + l0));
        const uint2 b = __ldg(reinterpret_cast<const uint2*>(blk + 64 * h + 32 + l0));
        const uint2 qh = __ldg(reinterpret_cast<const uint2*>(blk + 128 + 32 * h + l0));
        const uint2 sc = __ldg(reinterpret_cast<const uint2*>(blk + 192 + 8 * h));
        const int hi = l0 >> 4;
        const u32 lo[4] = {a.x, b.x, a.x, b.x};
        const u32 lo2[4] = {a.y, b.y, a.y, b.y};
        float total = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int shift = j < 2 ? 0 : 4;
            float s = 0.f;
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const u32 lw = half ? lo2[j] : lo[j];
                const u32 hw = half ? qh.y : qh.x;
                // four 6-bit values q (0..63), one per byte
                const u32 q = ((lw >> shift) & 0x0f0f0f0fu) | (((hw >> (2 * j)) & 0x03030303u) << 4);
#pragma unroll
                for (int k = 0; k < 4; k++)
                    s = fmaf(__int_as_float(__byte_perm(q, 0x4B000000u, 0x7540u | (u32)k)) - 8388640.0f,
                             v[8 * j + 4 * half + k], s);  // 2^23 + q, minus 2^23 + 32
            }
            const int si = 2 * j + hi;  // scale byte within this half's 8
            const u32 sw = si < 4 ? sc.x : sc.y;
            const int scale = (int)(signed char)((sw >> (8 * (si & 3))) & 0xff);
            total = fmaf((float)scale, s, total);
        }
        return h2f(__ldg(dd)) * total;
    }
    // Values 8j..8j+8 of the chunk in `load_x` order (columns col(sub, 8j)..+8), for the prefill
    // GEMM's per-lane fragments (gemm_common.cuh), in two parts: the loads
    // (`fetch8`, issued chunks ahead) and the decode.
    struct Raw {
        uint2 lw, qh;
        u32 sw;
        u16 d;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__ dd, int sub,
                                                int j) {
        const int h = sub >> 2, l0 = (sub & 3) * 8;
        const int si = 2 * j + (l0 >> 4);
        return {__ldg(reinterpret_cast<const uint2*>(blk + 64 * h + 32 * (j & 1) + l0)),
                __ldg(reinterpret_cast<const uint2*>(blk + 128 + 32 * h + l0)),
                __ldg(reinterpret_cast<const u32*>(blk + 192 + 8 * h + 4 * (si >> 2))), __ldg(dd)};
    }
    // As f16x2 words, GEMM_SCALE times the weights (gemm_common.cuh's
    // `codes_h2`: (q - 32) * f16(S d scale); d scale is exact in f32).
    static __device__ __forceinline__ void dec8h(const Raw& r, int sub, int j, u32* h, const u64*) {
        const int si = 2 * j + (((sub & 3) * 8) >> 4);
        const float ds = GEMM_SCALE * h2f(r.d) * (float)(int)(signed char)((r.sw >> (8 * (si & 3))) & 0xff);
        const int shift = j < 2 ? 0 : 4;
        u32 q[2];
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const u32 lw = half ? r.lw.y : r.lw.x;
            const u32 hw = half ? r.qh.y : r.qh.x;
            q[half] = ((lw >> shift) & 0x0f0f0f0fu) | (((hw >> (2 * j)) & 0x03030303u) << 4);
        }
        codes_h2(q[0], q[1], 0x64206420u, pack_h2(ds, ds), 0u, h);
    }
    static constexpr bool GEMM_SCALED = true;
    // Steps in pairs (gemm_common.cuh): the scale bytes a constant.
    static constexpr bool GEMM_HALVES = true;
    static __device__ __forceinline__ int col(int sub, int i) {
        return 128 * (sub >> 2) + 32 * (i >> 3) + (sub & 3) * 8 + (i & 7);
    }
};

GEMV_KERNELS(gemv_q6_k, Q6K)
GEMM_KERNEL(gemm_q6_k, Q6K)
