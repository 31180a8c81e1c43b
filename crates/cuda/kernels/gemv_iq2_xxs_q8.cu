// GEMV, IQ2_XXS weights x int8 activations (quantize_q8.cu). Weight layout
// as gemv_iq2_xxs.cu: payload qs[64] per block (8 groups of 8 bytes: four
// grid indices, then `aux` = four 7-bit sign codes and the 4-bit scale s),
// f16 d in the scale array. Value = d * (2s+1)/8 * grid * sign.
//
// Integer dot per 32-value group: the 4 grid entries (8 magnitudes each,
// all < 64) get their signs (8 sign bits -> byte masks m; a byte g becomes
// (g ^ m) + (m & 1), i.e. -g where m = 0xff: no borrow crosses bytes since
// grid magnitudes are never 0) and go through 8 __dp4a with the group's 32
// int8 activations; the group's float factor d_w * d_x * (2s+1) is applied
// once to the exact integer sum.
//
// Work split: a lane chunk is 2 groups = 16 payload bytes (one 128-bit
// load) and 64 activations (four 128-bit loads + one float2). A row of nb
// blocks has 4*nb chunks, laid out contiguously, so the lanes of a row read
// consecutive 16-byte pieces. `spr` lanes serve one row (spr = the largest
// power of two <= 4*nb, at most 32): narrow rows (experts' down, 512
// columns = 8 chunks) put 32/spr row groups in one warp instead of leaving
// lanes idle. Each lane owns NR rows (x loaded once for them) and walks its
// chunks two at a time: the weight, scale and activation loads of both
// chunks are issued before the math of either (2 x NR 16-byte weight loads
// in flight per lane).
//
// Launch: grid (ceil(rows / (GEMV_WARPS * NR * 32/spr)), n_mats), block
// GEMV_WARPS*32. Matrix m < n_first reads w0, the others w1 (gate and up of
// the routed experts in one launch); mi = m or m - n_first picks the slot
// slots[mi] (or mi without slots) and the activation vector mi*x_stride;
// y + m*rows is written.
#define WANT_IQ2XXS_GRID
#include "gemv_common.cuh"
#include "iq_tables.cuh"

// Byte masks of 4 sign bits: bit k -> byte k = 1 (t) ; 0xff (t * 0xff).
__device__ __forceinline__ int iq2_signed(u32 g, u32 bits4) {
    const u32 t = (bits4 * 0x00204081u) & 0x01010101u;
    return (int)((g ^ (t * 0xffu)) + t);
}

// Integer dot of one 32-value group (grid bytes `gx`, aux) with 8 words
// of int8 activations.
__device__ __forceinline__ int iq2_group(u32 gx, u32 aux, const int* xw) {
    int s = 0;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const uint2 gr = __ldg(reinterpret_cast<const uint2*>(&iq2xxs_grid[(gx >> (8 * l)) & 0xff]));
        const u32 code = (aux >> (7 * l)) & 127u;
        const u32 signs = code | ((__popc(code) & 1u) << 7);
        s = __dp4a(iq2_signed(gr.x, signs & 15u), xw[2 * l], s);
        s = __dp4a(iq2_signed(gr.y, signs >> 4), xw[2 * l + 1], s);
    }
    return s;
}

// One chunk (16 weight bytes = groups 2k, 2k+1 of a block) -> float.
__device__ __forceinline__ float iq2_chunk(uint4 w, float dw, const int4* xq, float2 dx) {
    const int x0[8] = {xq[0].x, xq[0].y, xq[0].z, xq[0].w, xq[1].x, xq[1].y, xq[1].z, xq[1].w};
    const int x1[8] = {xq[2].x, xq[2].y, xq[2].z, xq[2].w, xq[3].x, xq[3].y, xq[3].z, xq[3].w};
    const int s0 = iq2_group(w.x, w.y, x0) * (int)(2u * (w.y >> 28) + 1u);
    const int s1 = iq2_group(w.z, w.w, x1) * (int)(2u * (w.w >> 28) + 1u);
    return 0.125f * dw * ((float)s0 * dx.x + (float)s1 * dx.y);  // (2s+1)/8
}

__device__ __forceinline__ int iq2_lanes_per_row(int nch) {
    return nch >= 32 ? 32 : nch >= 16 ? 16 : nch >= 8 ? 8 : 4;
}

template <int NR>
__device__ __forceinline__ void gemv_iq2q8_body(const u8* __restrict__ w0, const u8* __restrict__ w1,
                                                int n_first, u64 mat_bytes,
                                                const u32* __restrict__ slots,
                                                const signed char* __restrict__ xq,
                                                const float* __restrict__ xd, long long x_stride,
                                                float* __restrict__ y, int rows, int nb) {
    const int m = blockIdx.y;
    const bool second = m >= n_first;
    const int mi = second ? m - n_first : m;
    const u8* base = (second ? w1 : w0) + (u64)(slots ? slots[mi] : (u32)mi) * mat_bytes;
    const u16* dd = reinterpret_cast<const u16*>(base + (u64)rows * nb * 64);
    xq += (long long)mi * x_stride;
    xd += (long long)mi * (x_stride / 32);
    y += (u64)m * rows;
    const int nch = nb * 4;
    const int spr = iq2_lanes_per_row(nch);
    const int lane = threadIdx.x & 31, cl = lane & (spr - 1);
    const int warp_rows = NR * (32 / spr);
    const int wrow0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * warp_rows;
    if (wrow0 >= rows) return;  // warp-uniform
    const int row0 = wrow0 + (lane / spr) * NR;
    float acc[NR];
    const u8* rp[NR];
    const u16* dp[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        acc[r] = 0.f;
        const int row = min(row0 + r, rows - 1);
        rp[r] = base + (u64)row * nb * 64;
        dp[r] = dd + (u64)row * nb;
    }
    for (int c = cl; c < nch; c += 2 * spr) {
        const int c2 = c + spr;
        const bool two = c2 < nch;
        uint4 wa[NR], wb[NR];
        u16 da[NR], db[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) {
            wa[r] = __ldg(reinterpret_cast<const uint4*>(rp[r]) + c);
            da[r] = __ldg(dp[r] + (c >> 2));
            if (two) {
                wb[r] = __ldg(reinterpret_cast<const uint4*>(rp[r]) + c2);
                db[r] = __ldg(dp[r] + (c2 >> 2));
            }
        }
        int4 xa[4], xb[4];
        const int4* xp = reinterpret_cast<const int4*>(xq);
#pragma unroll
        for (int k = 0; k < 4; k++) xa[k] = __ldg(xp + 4 * c + k);
        const float2 dxa = __ldg(reinterpret_cast<const float2*>(xd) + c);
        float2 dxb = make_float2(0.f, 0.f);
        if (two) {
#pragma unroll
            for (int k = 0; k < 4; k++) xb[k] = __ldg(xp + 4 * c2 + k);
            dxb = __ldg(reinterpret_cast<const float2*>(xd) + c2);
        }
#pragma unroll
        for (int r = 0; r < NR; r++) acc[r] += iq2_chunk(wa[r], h2f(da[r]), xa, dxa);
        if (two) {
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] += iq2_chunk(wb[r], h2f(db[r]), xb, dxb);
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        float s = acc[r];
        for (int o = spr >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (cl == 0 && row0 + r < rows) y[row0 + r] = s;
    }
}

#define GEMV_IQ2Q8_KERNEL(NAME, NR)                                                             \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                               \
        NAME(const u8* __restrict__ w0, const u8* __restrict__ w1, int n_first, u64 mat_bytes,  \
             const u32* __restrict__ slots, const signed char* __restrict__ xq,                 \
             const float* __restrict__ xd, long long x_stride, float* __restrict__ y, int rows, \
             int nb) {                                                                          \
        gemv_iq2q8_body<NR>(w0, w1, n_first, mat_bytes, slots, xq, xd, x_stride, y, rows, nb); \
    }

GEMV_IQ2Q8_KERNEL(gemv_iq2_xxs_q8_r1, 1)
GEMV_IQ2Q8_KERNEL(gemv_iq2_xxs_q8_r2, 2)
GEMV_IQ2Q8_KERNEL(gemv_iq2_xxs_q8_r4, 4)
