// The int8-activation GEMV's formats, body and launch macro (the kernels
// are instantiated in gemv_q8act.cu).
#pragma once
// GEMV with int8 activations (quantize_q8.cu): IQ2_XXS, Q8_0, Q4_K,
// IQ4_NL, Q6_K, IQ2_XS and IQ1_M weights.
// Q8_0 (`gemv_q8_0_q8_*`): a lane chunk is one block, 32 int8 weights (two
// 16-byte loads) dotted with 32 int8 activations by 8 __dp4a, times
// d_w * d_x; the work split below is shared (chunks of 32 values, 1 per
// block). The f32-activation kernels spend most of their L1 traffic on x
// (128 bytes of f32 per 32 values, against 32 of int8 here).
//
// IQ2_XXS (`gemv_iq2_xxs_q8*`). Weight layout
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
// power of two <= 4*nb, at most 32 and
// at most the launch's max_lanes): narrow rows (experts' down, 512
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
#define WANT_IQ2XS_GRID
#define WANT_IQ1S_GRID
#define WANT_KVALUES_IQ4NL
#include "gemv_common.cuh"
#include "iq_tables.cuh"
#include "iq4nl.cuh"

// Byte masks of 4 sign bits: bit k -> byte k = 1 (t) ; 0xff (t * 0xff).
__device__ __forceinline__ int iq2_signed(u32 g, u32 bits4) {
    const u32 t = (bits4 * 0x00204081u) & 0x01010101u;
    return (int)((g ^ (t * 0xffu)) + t);
}

// Integer dot of one 32-value group (grid bytes `gx`, aux) with 8 words
// of int8 activations; grid entries from `grid` (shared memory when SG).
template <bool SG>
__device__ __forceinline__ int iq2_group(u32 gx, u32 aux, const int* xw, const uint2* grid) {
    int s = 0;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        const u32 idx = (gx >> (8 * l)) & 0xff;
        const uint2 gr = SG ? grid[idx] : __ldg(grid + idx);
        const u32 code = (aux >> (7 * l)) & 127u;
        const u32 signs = code | ((__popc(code) & 1u) << 7);
        s = __dp4a(iq2_signed(gr.x, signs & 15u), xw[2 * l], s);
        s = __dp4a(iq2_signed(gr.y, signs >> 4), xw[2 * l + 1], s);
    }
    return s;
}

// A lane chunk of N 16-byte weight pieces.
template <int N>
struct WChunk {
    uint4 v[N];
};

// IQ2_XXS: a chunk is 2 groups (16 weight bytes, 64 values); 4 per block.
// Contiguous chunks: weight chunk c at rp + c*16*W16 (payloads are
// back to back), its block's f16 d at dp[c / CPB]; activations 16*XV
// bytes at c*16*XV and DX scales at c*DX.
// Contiguous activations: chunk c's 16*XV int8 values start at value
// c*16*XV, its DX scales at c*DX (every format whose chunks cover
// consecutive values of the row).
template <int XV, int DX>
struct ContigX {
    static __device__ __forceinline__ void load_x(const int4* xp, const float* xd, int c, int4* x,
                                                  float* dx) {
#pragma unroll
        for (int k = 0; k < XV; k++) x[k] = __ldg(xp + XV * c + k);
#pragma unroll
        for (int k = 0; k < DX; k++) dx[k] = __ldg(xd + DX * c + k);
    }
};

// `WT` is the type a lane's chunk of weights is loaded into (the body
// keeps 2*NR of them in registers).
template <int CPB, int W16, int XV, int DX>
struct Contig : ContigX<XV, DX> {
    using WT = WChunk<W16>;
    static __device__ __forceinline__ void load_w(const u8* rp, const u16* dp, int c, WT& w,
                                                  u16& d) {
#pragma unroll
        for (int k = 0; k < W16; k++)
            w.v[k] = __ldg(reinterpret_cast<const uint4*>(rp + (u64)c * 16 * W16) + k);
        d = __ldg(dp + c / CPB);
    }
};

template <bool SG>
struct Iq2Q8 : Contig<4, 1, 4, 2> {
    static constexpr int CPB = 4, PAYLOAD = 64, W16 = 1, XV = 4, DX = 2;
    static __device__ __forceinline__ float dot(const WChunk<1>& wc, float dw, const int4* xq,
                                                const float* dx, const uint2* grid, int) {
        const uint4 w = wc.v[0];
        const int x0[8] = {xq[0].x, xq[0].y, xq[0].z, xq[0].w, xq[1].x, xq[1].y, xq[1].z, xq[1].w};
        const int x1[8] = {xq[2].x, xq[2].y, xq[2].z, xq[2].w, xq[3].x, xq[3].y, xq[3].z, xq[3].w};
        const int s0 = iq2_group<SG>(w.x, w.y, x0, grid) * (int)(2u * (w.y >> 28) + 1u);
        const int s1 = iq2_group<SG>(w.z, w.w, x1, grid) * (int)(2u * (w.w >> 28) + 1u);
        return 0.125f * dw * ((float)s0 * dx[0] + (float)s1 * dx[1]);  // (2s+1)/8
    }
};

// Q8_0: a chunk is one block (32 int8 weights, two 16-byte pieces).
struct Q80Q8 : Contig<1, 2, 2, 1> {
    static constexpr int CPB = 1, PAYLOAD = 32, W16 = 2, XV = 2, DX = 1;
    static __device__ __forceinline__ float dot(const WChunk<2>& wc, float dw, const int4* xq,
                                                const float* dx, const uint2*, int) {
        int s = 0;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            s = __dp4a((int)wc.v[k].x, xq[k].x, s);
            s = __dp4a((int)wc.v[k].y, xq[k].y, s);
            s = __dp4a((int)wc.v[k].z, xq[k].z, s);
            s = __dp4a((int)wc.v[k].w, xq[k].w, s);
        }
        return dw * dx[0] * (float)s;
    }
};

// IQ4_NL (`gemv_iq4_nl_q8_*`): as Q8_0, a chunk is one block (16 bytes of
// nibble indices, d in the scale array); the indices become their int8
// values (iq4nl.cuh) and go through 8 __dp4a: low nibbles against
// activations 0..16, high nibbles against 16..32.
struct Iq4NlQ8 : Contig<1, 1, 2, 1> {
    static constexpr int CPB = 1, PAYLOAD = 16, W16 = 1, XV = 2, DX = 1;
    static __device__ __forceinline__ float dot(const WChunk<1>& wc, float dw, const int4* xq,
                                                const float* dx, const uint2*, int) {
        const u32 qw[4] = {wc.v[0].x, wc.v[0].y, wc.v[0].z, wc.v[0].w};
        const int xa[4] = {xq[0].x, xq[0].y, xq[0].z, xq[0].w};
        const int xb[4] = {xq[1].x, xq[1].y, xq[1].z, xq[1].w};
        int s = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s = __dp4a((int)iq4nl_lookup(qw[k] & 0x0f0f0f0fu), xa[k], s);
            s = __dp4a((int)iq4nl_lookup((qw[k] >> 4) & 0x0f0f0f0fu), xb[k], s);
        }
        return dw * dx[0] * (float)s;
    }
};

// Q4_K (`gemv_q4_k_q8_*`): blocks kept whole (144 bytes: 16-byte header
// d, dmin, packed scales; 128 bytes of nibbles). A chunk is the old f32
// kernel's: pair p = sub/2, l0 = (sub%2)*16, 16 bytes of qs = 16 values of
// sub-block 2p (low nibbles) and 16 of 2p+1 (high nibbles), 8 per block,
// plus the block header (one 16-byte load shared by 8 lanes). Sub-block j
// is activation block j, so per chunk: Σq·qx (4 dp4a each half) and Σqx
// (dp4a with 0x01010101) give d·sc·dx·Σq·qx - dmin·m·dx·Σqx.
__device__ __forceinline__ void scale_min_k4(int j, u32 s0, u32 s1, u32 s2, int* sc, int* mn) {
    if (j < 4) {
        *sc = byte_of(s0, j) & 63;
        *mn = byte_of(s1, j) & 63;
    } else {
        const int k = j - 4;
        *sc = (byte_of(s2, k) & 0x0f) | ((byte_of(s0, k) >> 6) << 4);
        *mn = (byte_of(s2, k) >> 4) | ((byte_of(s1, k) >> 6) << 4);
    }
}

struct Q4KQ8 {
    static constexpr int CPB = 8, PAYLOAD = 144, W16 = 2, XV = 2, DX = 2, SIDE_WORDS = 0;
    using WT = WChunk<2>;
    static __device__ __forceinline__ void load_w(const u8* rp, const u16*, int c, WChunk<2>& w,
                                                  u16& d) {
        const u8* blk = rp + (u64)(c >> 3) * 144;
        const int sub = c & 7;
        w.v[0] = __ldg(reinterpret_cast<const uint4*>(blk + 16 + 32 * (sub >> 1) + 16 * (sub & 1)));
        w.v[1] = __ldg(reinterpret_cast<const uint4*>(blk));
        d = 0;
    }
    static __device__ __forceinline__ void load_x(const int4* xp, const float* xd, int c, int4* x,
                                                  float* dx) {
        // values 256b + 64p + l0 (sub-block 2p) and +32 (sub-block 2p+1)
        const int b = c >> 3, sub = c & 7, p = sub >> 1, l0 = 16 * (sub & 1);
        x[0] = __ldg(xp + (256 * b + 64 * p + l0) / 16);
        x[1] = __ldg(xp + (256 * b + 64 * p + 32 + l0) / 16);
        const float2 d = __ldg(reinterpret_cast<const float2*>(xd) + 4 * b + p);
        dx[0] = d.x;
        dx[1] = d.y;
    }
    static __device__ __forceinline__ float dot(const WChunk<2>& w, float, const int4* xq,
                                                const float* dx, const uint2*, int c) {
        const uint4 q = w.v[0], h = w.v[1];
        const int p = (c & 7) >> 1;
        const float d = h2f((u16)(h.x & 0xffff)), dmin = h2f((u16)(h.x >> 16));
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * p, h.y, h.z, h.w, &sc0, &m0);
        scale_min_k4(2 * p + 1, h.y, h.z, h.w, &sc1, &m1);
        const u32 qw[4] = {q.x, q.y, q.z, q.w};
        const int xa[4] = {xq[0].x, xq[0].y, xq[0].z, xq[0].w};
        const int xb[4] = {xq[1].x, xq[1].y, xq[1].z, xq[1].w};
        int s0 = 0, s1 = 0, x0 = 0, x1 = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            s0 = __dp4a((int)(qw[k] & 0x0f0f0f0fu), xa[k], s0);
            s1 = __dp4a((int)((qw[k] >> 4) & 0x0f0f0f0fu), xb[k], s1);
            x0 = __dp4a(0x01010101, xa[k], x0);
            x1 = __dp4a(0x01010101, xb[k], x1);
        }
        return d * (dx[0] * (float)(sc0 * s0) + dx[1] * (float)(sc1 * s1)) -
               dmin * (dx[0] * (float)(m0 * x0) + dx[1] * (float)(m1 * x1));
    }
};

// The three formats below have 256-value blocks and 32-value activation
// blocks, each with its own f32 scale dx: every 32 values' integer dot is
// kept apart and scaled by its own dx (and the weight's sub-scales) before
// the sum.

// Q6_K (`gemv_q6_k_q8_*`): payload ql[128] | qh[64] | scales[16] (208
// bytes, 16-byte aligned), f16 d in the scale array (gemv_q6k.cu). In half
// h, value 128h + 32j + l has its low nibble in ql[64h + 32(j%2) + l]
// (nibble j/2), its top 2 bits at 2j of qh[32h + l], sub-scale (int8)
// scales[8h + 2j + l/16]; value d * sc * (q - 32).
//
// A chunk (4 per block) is h = (c/2)%2, l0 = 16(c%2): for all four j the
// 16 values l0..l0+16, so its three 16-byte loads (ql, ql+32, qh) are used
// whole; plus the half's 8 scale bytes. The 4 pieces of 16 values lie in 4
// activation blocks (8b + 4h + j: one float4 of dx) and have one sub-scale
// each. Σ(q-32)x = Σqx - 32Σx: q (0..63) goes straight into __dp4a and Σx
// (__dp4a with ones) depends on x only, so it is shared by the NR rows.
struct Q6KW {
    uint4 lo0, lo1, hi;
    uint2 sc;
};

struct Q6KQ8 {
    static constexpr int CPB = 4, PAYLOAD = 208, XV = 4, DX = 4;
    using WT = Q6KW;
    static __device__ __forceinline__ void load_w(const u8* rp, const u16* dp, int c, WT& w,
                                                  u16& d) {
        const u8* blk = rp + (u64)(c >> 2) * 208;
        const int h = (c >> 1) & 1, l0 = 16 * (c & 1);
        w.lo0 = __ldg(reinterpret_cast<const uint4*>(blk + 64 * h + l0));
        w.lo1 = __ldg(reinterpret_cast<const uint4*>(blk + 64 * h + 32 + l0));
        w.hi = __ldg(reinterpret_cast<const uint4*>(blk + 128 + 32 * h + l0));
        w.sc = __ldg(reinterpret_cast<const uint2*>(blk + 192 + 8 * h));
        d = __ldg(dp + (c >> 2));
    }
    static __device__ __forceinline__ void load_x(const int4* xp, const float* xd, int c, int4* x,
                                                  float* dx) {
        // piece j: values 256b + 128h + 32j + l0.. = int4 16b + 8h + 2j + c%2
        const int b = c >> 2, h = (c >> 1) & 1;
#pragma unroll
        for (int j = 0; j < 4; j++) x[j] = __ldg(xp + 16 * b + 8 * h + 2 * j + (c & 1));
        const float4 d4 = __ldg(reinterpret_cast<const float4*>(xd) + 2 * b + h);
        dx[0] = d4.x;
        dx[1] = d4.y;
        dx[2] = d4.z;
        dx[3] = d4.w;
    }
    static __device__ __forceinline__ float dot(const WT& w, float dw, const int4* xq,
                                                const float* dx, const uint2*, int c) {
        const u32 a[4] = {w.lo0.x, w.lo0.y, w.lo0.z, w.lo0.w};
        const u32 b[4] = {w.lo1.x, w.lo1.y, w.lo1.z, w.lo1.w};
        const u32 qh[4] = {w.hi.x, w.hi.y, w.hi.z, w.hi.w};
        const int sub_shift = 8 * (c & 1);  // scale byte 2j + c%2 of the 8
        float acc = 0.f;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const u32* lw = (j & 1) ? b : a;
            const int xw[4] = {xq[j].x, xq[j].y, xq[j].z, xq[j].w};
            int s = 0, sx = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const u32 q = ((lw[k] >> (4 * (j >> 1))) & 0x0f0f0f0fu) |
                              (((qh[k] >> (2 * j)) & 0x03030303u) << 4);
                s = __dp4a((int)q, xw[k], s);
                sx = __dp4a(0x01010101, xw[k], sx);
            }
            const u32 sw = j < 2 ? w.sc.x : w.sc.y;
            const int sc = (int)(signed char)((sw >> (16 * (j & 1) + sub_shift)) & 0xffu);
            acc = fmaf(dx[j], (float)(sc * (s - 32 * sx)), acc);  // exact: |.| < 2^24
        }
        return dw * acc;
    }
};

// IQ2_XS (`gemv_iq2_xs_q8_*`): payload qs[32 u16] | scales[8] (72 bytes,
// 8-byte aligned: loads of <= 8 bytes), f16 d in the scale array
// (gemv_iq2_xs.cu). Group l (8 values) is qs[l]: 9-bit grid index, 7-bit
// sign code (sign byte = code | parity << 7); 16-value group k has the
// 4-bit s = nibble k%2 of scales[k/2]. Value d * (2s+1)/8 * grid * sign.
//
// A chunk (4 per block) is activation blocks 2k, 2k+1 (k = c%4): two
// 8-byte loads of 8 u16, one u16 of scales; signs applied to the grid
// bytes (iq2_signed: magnitudes are never 0), 2 __dp4a per group.
struct Iq2XsW {
    uint2 q0, q1;
    u32 sc;
};

struct Iq2XsQ8 : ContigX<4, 2> {
    static constexpr int CPB = 4, PAYLOAD = 72, XV = 4, DX = 2;
    using WT = Iq2XsW;
    static __device__ __forceinline__ void load_w(const u8* rp, const u16* dp, int c, WT& w,
                                                  u16& d) {
        const u8* blk = rp + (u64)(c >> 2) * 72 + 16 * (c & 3);
        w.q0 = __ldg(reinterpret_cast<const uint2*>(blk));
        w.q1 = __ldg(reinterpret_cast<const uint2*>(blk + 8));
        w.sc = __ldg(reinterpret_cast<const u16*>(rp + (u64)(c >> 2) * 72 + 64 + 2 * (c & 3)));
        d = __ldg(dp + (c >> 2));
    }
    static __device__ __forceinline__ float dot(const WT& w, float dw, const int4* xq,
                                                const float* dx, const uint2*, int) {
        const u32 qw[4] = {w.q0.x, w.q0.y, w.q1.x, w.q1.y};
        const int xw[16] = {xq[0].x, xq[0].y, xq[0].z, xq[0].w, xq[1].x, xq[1].y,
                            xq[1].z, xq[1].w, xq[2].x, xq[2].y, xq[2].z, xq[2].w,
                            xq[3].x, xq[3].y, xq[3].z, xq[3].w};
        float acc = 0.f;
#pragma unroll
        for (int a = 0; a < 2; a++) {  // activation block 2k + a
            int s16[2] = {0, 0};
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const u32 q = (qw[2 * a + (g >> 1)] >> (16 * (g & 1))) & 0xffffu;
                const u64 gr = __ldg(&iq2xs_grid[q & 511u]);
                const u32 code = q >> 9;
                const u32 signs = code | ((__popc(code) & 1u) << 7);
                int s = s16[g >> 1];
                s = __dp4a(iq2_signed((u32)gr, signs & 15u), xw[8 * a + 2 * g], s);
                s = __dp4a(iq2_signed((u32)(gr >> 32), signs >> 4), xw[8 * a + 2 * g + 1], s);
                s16[g >> 1] = s;
            }
            const u32 sb = (w.sc >> (8 * a)) & 0xffu;
            const int isum =
                (int)(2u * (sb & 15u) + 1u) * s16[0] + (int)(2u * (sb >> 4) + 1u) * s16[1];
            acc = fmaf(dx[a], (float)isum, acc);
        }
        return 0.125f * dw * acc;
    }
};

// IQ1_M (`gemv_iq1_m_q8_*`): 56-byte blocks kept whole (8-byte aligned),
// qs[32] | qh[16] | scales[8] (gemv_iq1_m.cu). Group l (8 values): grid
// index qs[l] | (nibble & 7) << 8 into iq1s_grid (bytes -1, 0, 1), shift
// sign = bit 3 of the nibble (nibble l%2 of qh[l/2]); 16-value group m has
// the 3-bit s at 3(m%4) of u16 scale word m/4, whose top nibbles hold the
// f16 d. Value d * (2s+1) * (g ± 1/8) = d * (2s+1) * (8g ± 1) / 8, so the
// integer dot of a group is 8·Σgx ± Σx (Σx again shared by the rows).
//
// A chunk (4 per block) is activation blocks 2k, 2k+1 (k = c%4): 8 bytes
// of indices, 4 bytes of nibbles, all 8 scale bytes (its scales are word
// k, d needs all four).
struct Iq1MW {
    uint2 qs, sw;
    u32 qh;
};

struct Iq1MQ8 : ContigX<4, 2> {
    static constexpr int CPB = 4, PAYLOAD = 56, XV = 4, DX = 2, SIDE_WORDS = 0;
    using WT = Iq1MW;
    static __device__ __forceinline__ void load_w(const u8* rp, const u16*, int c, WT& w,
                                                  u16& d) {
        const u8* blk = rp + (u64)(c >> 2) * 56;
        const int k = c & 3;
        w.qs = __ldg(reinterpret_cast<const uint2*>(blk + 8 * k));
        w.qh = __ldg(reinterpret_cast<const u32*>(blk + 32 + 4 * k));
        w.sw = __ldg(reinterpret_cast<const uint2*>(blk + 48));
        d = 0;  // no scale array: d is in the scale words
    }
    static __device__ __forceinline__ float dot(const WT& w, float, const int4* xq,
                                                const float* dx, const uint2*, int c) {
        const u32 sx0 = w.sw.x, sx1 = w.sw.y;
        const u32 dbits = ((sx0 & 0xffffu) >> 12) | ((sx0 >> 24) & 0xf0u) |
                          (((sx1 & 0xffffu) >> 4) & 0xf00u) | ((sx1 >> 16) & 0xf000u);
        const int k = c & 3;
        const u32 scw = ((k >> 1) ? sx1 : sx0) >> (16 * (k & 1));
        const u32 qsw[2] = {w.qs.x, w.qs.y};
        const int xw[16] = {xq[0].x, xq[0].y, xq[0].z, xq[0].w, xq[1].x, xq[1].y,
                            xq[1].z, xq[1].w, xq[2].x, xq[2].y, xq[2].z, xq[2].w,
                            xq[3].x, xq[3].y, xq[3].z, xq[3].w};
        float acc = 0.f;
#pragma unroll
        for (int a = 0; a < 2; a++) {  // activation block 2k + a
            int isum = 0;
#pragma unroll
            for (int h = 0; h < 2; h++) {  // 16-value group m = 2a + h of the chunk
                int s = 0;
#pragma unroll
                for (int g = 0; g < 2; g++) {
                    const int l = 4 * a + 2 * h + g;  // 8-value group of the chunk
                    const u32 nib = (w.qh >> (4 * l)) & 15u;
                    const u32 idx = byte_of(qsw[l >> 2], l & 3) | ((nib & 7u) << 8);
                    const u64 gr = __ldg(&iq1s_grid[idx]);
                    const int sg = __dp4a((int)(u32)(gr >> 32), xw[2 * l + 1],
                                          __dp4a((int)(u32)gr, xw[2 * l], 0));
                    const int sx =
                        __dp4a(0x01010101, xw[2 * l + 1], __dp4a(0x01010101, xw[2 * l], 0));
                    s += 8 * sg + ((nib & 8u) ? -sx : sx);
                }
                isum += (int)(2u * ((scw >> (3 * (2 * a + h))) & 7u) + 1u) * s;
            }
            acc = fmaf(dx[a], (float)isum, acc);
        }
        return 0.125f * h2f((u16)dbits) * acc;
    }
};

// Lanes per row: the largest power of two <= the row's chunks, in 4..32,
// and at most max_lanes (a power of two in 4..32; src/gemv.rs
// `q8_lanes_per_row`, whose grid the launch has).
__device__ __forceinline__ int q8_lanes_per_row(int nch, int max_lanes) {
    return min(max_lanes, nch >= 32 ? 32 : nch >= 16 ? 16 : nch >= 8 ? 8 : 4);
}

// The rows a block of gemv_q8_body reads, into L2, before the PDL wait.
// The slot is read as a hint: right after the top-k it is still the
// previous token's (the body reads it again after the wait). That launch
// is the routed gate|up; at full residency its prefetch is of the previous
// token's experts. Skipping it there measured the same on a synthetic file
// (whose routing shares few experts between tokens), and consecutive
// tokens of a real model share some, so it stays (bench/RESULTS.md).
template <class T, int NR>
__device__ __forceinline__ void gemv_q8_prefetch(const u8* w0, const u8* w1, int n_first,
                                                 u64 mat_bytes, const u32* slots, int rows,
                                                 int nb, int max_lanes) {
    const int m = blockIdx.y;
    const bool second = m >= n_first;
    const int mi = second ? m - n_first : m;
    const u8* base = (second ? w1 : w0) + (u64)slot_hint(slots, mi) * mat_bytes;
    const int brows = GEMV_WARPS * NR * (32 / q8_lanes_per_row(nb * T::CPB, max_lanes));
    const int r0 = blockIdx.x * brows;
    gemv_prefetch_rows(base, rows, nb, T::PAYLOAD, 2 * side_words<T>::v, r0,
                       min(r0 + brows, rows));
}

template <class T, int NR, bool SG>
__device__ __forceinline__ void gemv_q8_body(const u8* __restrict__ w0, const u8* __restrict__ w1,
                                             int n_first, u64 mat_bytes,
                                             const u32* __restrict__ slots,
                                             const signed char* __restrict__ xq,
                                             const float* __restrict__ xd, long long x_stride,
                                             float* __restrict__ y, int rows, int nb,
                                             int max_lanes) {
    constexpr int XV = T::XV, DX = T::DX;
    __shared__ uint2 sgrid[SG ? 256 : 1];
    const uint2* grid = reinterpret_cast<const uint2*>(iq2xxs_grid);
    if (SG) {
        for (int i = threadIdx.x; i < 256; i += blockDim.x) sgrid[i] = __ldg(grid + i);
        __syncthreads();
        grid = sgrid;
    }
    const int m = blockIdx.y;
    const bool second = m >= n_first;
    const int mi = second ? m - n_first : m;
    const u8* base = (second ? w1 : w0) + (u64)(slots ? slots[mi] : (u32)mi) * mat_bytes;
    const u16* dd = reinterpret_cast<const u16*>(base + (u64)rows * nb * T::PAYLOAD);
    xq += (long long)mi * x_stride;
    xd += (long long)mi * (x_stride / 32);
    y += (u64)m * rows;
    const int nch = nb * T::CPB;
    const int spr = q8_lanes_per_row(nch, max_lanes);
    const int lane = threadIdx.x & 31, cl = lane & (spr - 1);
    const int warp_rows = NR * (32 / spr);
    const int wrow0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * warp_rows;
    if (wrow0 >= rows) return;  // warp-uniform, after the only barrier
    const int row0 = wrow0 + (lane / spr) * NR;
    float acc[NR];
    const u8* rp[NR];
    const u16* dp[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        acc[r] = 0.f;
        const int row = min(row0 + r, rows - 1);
        rp[r] = base + (u64)row * nb * T::PAYLOAD;
        dp[r] = dd + (u64)row * nb;
    }
    const int4* xp = reinterpret_cast<const int4*>(xq);
    for (int c = cl; c < nch; c += 2 * spr) {
        const int c2 = c + spr;
        const bool two = c2 < nch;
        typename T::WT wa[NR], wb[NR];
        u16 da[NR], db[NR];
#pragma unroll
        for (int r = 0; r < NR; r++) {
            T::load_w(rp[r], dp[r], c, wa[r], da[r]);
            if (two) T::load_w(rp[r], dp[r], c2, wb[r], db[r]);
        }
        int4 xa[XV], xb[XV];
        float dxa[DX], dxb[DX];
        T::load_x(xp, xd, c, xa, dxa);
        if (two) T::load_x(xp, xd, c2, xb, dxb);
#pragma unroll
        for (int r = 0; r < NR; r++) acc[r] += T::dot(wa[r], h2f(da[r]), xa, dxa, grid, c);
        if (two) {
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] += T::dot(wb[r], h2f(db[r]), xb, dxb, grid, c2);
        }
    }
#pragma unroll
    for (int r = 0; r < NR; r++) {
        float s = acc[r];
        for (int o = spr >> 1; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (cl == 0 && row0 + r < rows) y[row0 + r] = s;
    }
}

// The kernels' arguments, one struct passed by value (mirrored by
// `GemvQ8Args` in src/gemv/mod.rs, #[repr(C)]: same field order and
// types). NVRTC applies `__restrict__` only to kernel parameters, so every
// read-only load of the body goes through __ldg (the formats' load_w /
// load_x, the slot table).
struct GemvQ8Args {
    const u8* w0;
    const u8* w1;
    u64 mat_bytes;
    const u32* slots;
    const signed char* xq;
    const float* xd;
    long long x_stride;
    float* y;
    int n_first, rows, nb, max_lanes;
};
static_assert(sizeof(GemvQ8Args) == 80, "GemvQ8Args: layout differs from src/gemv/mod.rs");

#define GEMV_Q8_KERNEL(NAME, T, NR, SG)                                                         \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                               \
        NAME(__grid_constant__ const GemvQ8Args a) {                                            \
        gemv_q8_prefetch<T, NR>(a.w0, a.w1, a.n_first, a.mat_bytes, a.slots, a.rows, a.nb,      \
                                a.max_lanes);                                                   \
        PDL_PROLOGUE();                                                                         \
        gemv_q8_body<T, NR, SG>(a.w0, a.w1, a.n_first, a.mat_bytes, a.slots, a.xq, a.xd,        \
                                a.x_stride, a.y, a.rows, a.nb, a.max_lanes);                    \
    }
