// GEMV, IQ2_XXS weights (crates/quant/src/iquants/iq2.rs). The 66-byte GGUF
// block is split: payload qs[64] (8 groups of 8 bytes, 32 values each) and
// its f16 d in the matrix's scale array. Group bytes 0..4 are grid indices
// (8 magnitudes each, iq2xxs_grid), bytes 4..8 a u32 `aux`: four 7-bit sign
// codes (bits 0..28) and the 4-bit scale s (bits 28..32). Value:
// d*(0.5+s)*0.25 * grid * sign, sign byte = ksigns_iq2xs[code], which is
// the code with its parity in bit 7 (checked against the table in
// src/tables_cuh.rs tests).
//
// Lane chunk `sub` (8 per block) = group `sub`: one 8-byte load.
#define WANT_IQ2XXS_GRID
#include "gemm_common.cuh"
#include "iq_tables.cuh"

struct Iq2Xxs {
    static constexpr int QK = 256, LPB = 8, PAYLOAD = 64;
    static __device__ __forceinline__ void load_x(const float* __restrict__ xb, int sub, float* v) {
#pragma unroll
        for (int l = 0; l < 4; l++) load8(xb + 32 * sub + 8 * l, v + 8 * l);
    }
    static __device__ __forceinline__ float dot(const u8* __restrict__ blk, const u16* __restrict__ dd,
                                                int sub, const float* v) {
        const uint2 g = __ldg(reinterpret_cast<const uint2*>(blk + 8 * sub));
        const u32 aux = g.y;
        const float db = h2f(__ldg(dd)) * (0.5f + (float)(aux >> 28)) * 0.25f;
        float s = 0.f;
#pragma unroll
        for (int l = 0; l < 4; l++) {
            const u64 grid = __ldg(&iq2xxs_grid[byte_of(g.x, l)]);
            const u32 code = (aux >> (7 * l)) & 127;
            const u32 signs = code | ((__popc(code) & 1) << 7);
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const u32 g4 = half ? (u32)(grid >> 32) : (u32)grid;
                // sign bits -> 0xff bytes, then negate those bytes of g4
                const u32 m = (((((signs >> (4 * half)) & 15u) * 0x00204081u) & 0x01010101u) * 0xffu);
                const u32 sg = __vsub4(g4 ^ m, m) ^ 0x80808080u;
#pragma unroll
                for (int k = 0; k < 4; k++) s = fmaf(sbyte_f(sg, k), v[8 * l + 4 * half + k], s);
            }
        }
        return db * s;
    }
    // Run `l` of chunk `sub` (values 8l..8l+8 in `load_x` order, columns
    // col(sub, 8l)..+8: grid entry l), for the prefill GEMM's per-lane
    // fragments (gemm_common.cuh), in two parts: the loads (`fetch8`, issued
    // chunks ahead) and the decode.
    struct Raw {
        uint2 g;
        u16 d;
    };
    static __device__ __forceinline__ Raw fetch8(const u8* __restrict__ blk, const u16* __restrict__ dd, int sub,
                                                int) {
        return {__ldg(reinterpret_cast<const uint2*>(blk + 8 * sub)), __ldg(dd)};
    }
    static __device__ __forceinline__ void dec8(const Raw& r, int, int l, float* v, const u64* grid_tab) {
        const u32 aux = r.g.y;
        const float db = h2f(r.d) * (0.5f + (float)(aux >> 28)) * 0.25f;
        const u64 grid = grid_tab[byte_of(r.g.x, l)];
        const u32 code = (aux >> (7 * l)) & 127;
        const u32 signs = code | ((__popc(code) & 1) << 7);
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const u32 g4 = half ? (u32)(grid >> 32) : (u32)grid;
            const u32 m = (((((signs >> (4 * half)) & 15u) * 0x00204081u) & 0x01010101u) * 0xffu);
            const u32 sg = __vsub4(g4 ^ m, m) ^ 0x80808080u;
#pragma unroll
            for (int k = 0; k < 4; k++) v[4 * half + k] = db * sbyte_f(sg, k);
        }
    }
    // The same 8 values as f16x2 words (gemm_common.cuh's `grid_h2`).
    static __device__ __forceinline__ void dec8h(const Raw& r, int, int l, u32* h, const u64* grid_tab) {
        const u32 aux = r.g.y;
        const float db = h2f(r.d) * (0.5f + (float)(aux >> 28)) * 0.25f;
        const u32 code = (aux >> (7 * l)) & 127;
        grid_h2(grid_tab[byte_of(r.g.x, l)], code | ((__popc(code) & 1) << 7), db, h);
    }
    // The GEMM stages the grid in shared memory (gemm_common.cuh) and
    // passes it to `dec8`.
    static constexpr int TABLE = 256;
    // Four GEMM blocks an SM (gemm_common.cuh's `gemm_blocks`).
    static constexpr int GEMM_BLOCKS = 4;
    static __device__ __forceinline__ u64 table(int i) { return iq2xxs_grid[i]; }
    static __device__ __forceinline__ int col(int sub, int i) { return 32 * sub + i; }
};

GEMV_KERNELS(gemv_iq2_xxs, Iq2Xxs)
GEMM_KERNEL(gemm_iq2_xxs, Iq2Xxs)
