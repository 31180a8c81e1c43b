// GEMV, IQ2_XS weights (crates/quant/src/iquants/iq2.rs). The 74-byte GGUF
// block d(f16) | qs[32] (u16) | scales[8] is split: payload qs | scales (72
// bytes, 8-byte aligned) and its f16 d in the matrix's scale array. Group
// l (8 values, 0..32) is the u16 qs[l]: bits 0..9 index iq2xs_grid (8
// magnitudes), bits 9..16 are a 7-bit sign code (sign byte = the code with
// its parity in bit 7, as in IQ2_XXS); its 4-bit scale s is nibble
// (l/2)%2 of scales[l/4]. Value: d*(0.5+s)*0.25 * grid * sign.
//
// Lane chunk `sub` (8 per block) = groups 4sub..4sub+4: one 8-byte load of
// their four u16 and one byte of scales (low nibble: groups 0, 1 of the
// chunk; high: 2, 3).
#define WANT_IQ2XS_GRID
#include "gemm_common.cuh"
#include "iq_tables.cuh"

struct Iq2Xs {
    static constexpr int QK = 256, LPB = 8, PAYLOAD = 72;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int sub, float* v) {
#pragma unroll
        for (int l = 0; l < 4; l++) load8(xb + 32 * sub + 8 * l, v + 8 * l);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__ dd,
                                                int sub, const float* v) {
        const uint2 g = __ldg(reinterpret_cast<const uint2*>(blk + 8 * sub));
        const u32 sc = __ldg(blk + 64 + sub);
        const u32 qw[2] = {g.x, g.y};
        float s[2] = {0.f, 0.f};
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const u32 q = (qw[l >> 1] >> (16 * (l & 1))) & 0xffffu;
            const u64 grid = __ldg(&iq2xs_grid[q & 511u]);
            const u32 code = q >> 9;
            const u32 signs = code | ((__popc(code) & 1) << 7);
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const u32 g4 = half ? (u32)(grid >> 32) : (u32)grid;
                // sign bits -> 0xff bytes, then negate those bytes of g4
                const u32 m = (((((signs >> (4 * half)) & 15u) * 0x00204081u) & 0x01010101u) * 0xffu);
                const u32 sg = __vsub4(g4 ^ m, m) ^ 0x80808080u;
#pragma unroll
                for (int k = 0; k < 4; k++)
                    s[l >> 1] = fmaf(sbyte_f(sg, k), v[8 * l + 4 * half + k], s[l >> 1]);
            }
        }
        const float d = h2f(__ldg(dd)) * 0.25f;
        return d * ((0.5f + (float)(sc & 15u)) * s[0] + (0.5f + (float)(sc >> 4)) * s[1]);
    }
    // The GEMM stages the grid in shared memory (gemm_common.cuh) and
    // passes it to `dec8`.
    static constexpr int TABLE = 512;
    static __device__ __forceinline__ u64 table(int i) { return iq2xs_grid[i]; }
    // Run `l` of chunk `sub` (values 8l..8l+8 in `load_x` order, columns
    // col(sub, 8l)..+8: grid entry l), for the prefill GEMM's per-lane
    // fragments (gemm_common.cuh), in two parts: the loads (`fetch8`, issued
    // chunks ahead) and the decode.
    struct Raw {
        u32 w, sc;
        u16 d;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__ dd, int sub,
                                                int l) {
        return {__ldg(reinterpret_cast<const u32*>(blk + 8 * sub + 4 * (l >> 1))), (u32)__ldg(blk + 64 + sub),
                __ldg(dd)};
    }
    static __device__ __forceinline__ void dec8(const Raw& r, int, int l, float* v, const u64* grid_tab) {
        const float s = h2f(r.d) * 0.25f * (0.5f + (float)((l < 2 ? r.sc : r.sc >> 4) & 15u));
        const u32 q = (r.w >> (16 * (l & 1))) & 0xffffu;
        const u64 grid = grid_tab[q & 511u];
        const u32 code = q >> 9;
        const u32 signs = code | ((__popc(code) & 1) << 7);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const u32 g4 = half ? (u32)(grid >> 32) : (u32)grid;
            const u32 m = (((((signs >> (4 * half)) & 15u) * 0x00204081u) & 0x01010101u) * 0xffu);
            const u32 sg = __vsub4(g4 ^ m, m) ^ 0x80808080u;
#pragma unroll
            for (int k = 0; k < 4; k++) v[4 * half + k] = s * sbyte_f(sg, k);
        }
    }
    // The same 8 values as f16x2 words (gemm_common.cuh's `grid_h2`).
    static __device__ __forceinline__ void dec8h(const Raw& r, int, int l, u32* h, const u64* grid_tab) {
        const float s = h2f(r.d) * 0.25f * (0.5f + (float)((l < 2 ? r.sc : r.sc >> 4) & 15u));
        const u32 q = (r.w >> (16 * (l & 1))) & 0xffffu;
        const u32 code = q >> 9;
        grid_h2(grid_tab[q & 511u], code | ((__popc(code) & 1) << 7), s, h);
    }
    static __device__ __forceinline__ int col(int sub, int i) { return 32 * sub + i; }
};

GEMV_KERNELS(gemv_iq2_xs, Iq2Xs)
GEMM_KERNEL(gemm_iq2_xs, Iq2Xs)
