// Prefill GEMM on tensor cores: a chunk of activation rows times one
// quantized matrix (a dense projection), or the (token, expert) pairs of a
// chunk times their experts' matrices (grouped: one tile list over every
// expert of a layer).
//
//     y[p*ldy + row] = sum_k W_m[row][k] * x[src(p)*ldx + k]
//
// W_m: matrix m of a stack in the device layout of gemv_common.cuh (the
// slot table maps m to its slot; null: m itself); src(p) = gather[p] when a
// gather list is given (the pairs' tokens), else p. x is f32, or f16 when
// `xh` is given instead (the prefill converts each GEMM input once:
// to_f16_rows in elementwise.cu), with ldx in elements either way.
//
// Tiles: BM = 128 weight rows (32 a warp, 4 warps) x BN = 64 activation
// rows, K in steps of BK = 128 values (four 32-value chunks: half a
// 256-value block, or four 32-value blocks). mma.sync m16n8k16, f16 in,
// f32 accumulate.
//
// The weights never pass through shared memory. A sum over k does not
// depend on the order of k, so each 32-value chunk is fed to its two k16
// MMAs in a permuted order in which lane (g, c) = (lane/4, lane%4) holds
// exactly run c of the chunk: the 8 consecutive columns the format's
// `col(sub, 8c)` names (every format keeps runs of 8 together). The lane
// dequantizes its 4 rows' run c (`deq8`, the same decode as the GEMV's
// `dot`, rounded to f16 once) straight into its A fragments, and reads
// the matching 8 activations of a token as one 16-byte shared load that
// is its B fragment for both MMAs. Each weight is dequantized once per
// block, as before, but the shared-memory traffic of a step drops from
// 96 KB per MFLOP (dequantized weights stored and read back by ldmatrix,
// activations likewise) to 40 KB (activations only), which was the limit
// (Nsight Compute on the H200: L1/TEX throughput 97% at 33% SM issue).
//
// Activations: the tile's 64 rows of a step go to shared memory by
// cp.async (f16 input; two steps in flight) laid out [chunk][row][run] in
// 16-byte pieces, so a warp's fragment loads read 512 contiguous bytes
// (no bank conflicts for any format's `col`). The tile's row offsets
// (gathered for the routed experts) are looked up once. A warp skips the
// n8 column groups past the tile's last row: a routed tile holds ~32 pairs
// on average at 2048 tokens, 512 experts, top-10.
//
// The codebook formats (IQ2_XXS, IQ2_XS: `GEMM_TABLE` entries of
// `T::table`) read their grid from a copy in shared memory rather than
// through L1, where a warp's random entries of a 2-4 KB table cost up to
// 32 wavefronts a lookup.
#pragma once
#include "gemv_common.cuh"

#define GEMM_BM 128
#define GEMM_BN 64
#define GEMM_BK 128
#define GEMM_THREADS 128
// 16-byte activation pieces of one step: 4 chunks x 64 rows x 4 runs.
#define GEMM_BPIECES (4 * GEMM_BN * 4)

// Kernel arguments, one struct (mirrored by `GemmArgs` in
// src/gemv/gemm.rs, #[repr(C)]; field order and types must match). The
// read-only pointers are read through __ldg explicitly: NVRTC drops
// __restrict__ on struct members.
struct GemmArgs {
    const u8* w;
    u64 mat_bytes;
    const u32* slots;
    const int* tiles;
    const float* x;
    const u16* xh;
    const int* gather;
    float* y;
    const int* n_tiles_dev;  // the tile count, written on the device (null: the grid's)
    long long ldx;
    long long ldy;
    int rows;
    int nb;
    int n;
    int ksplit;  // warps a 32-row group's K is split over: 1 or 4 (gemm_body)
};

// Entries of the format's codebook staged into shared memory (0: none;
// a format with `TABLE` entries has `table()` and a `dec8` that takes the
// staged copy).
template <class T, class = void>
struct gemm_table {
    static constexpr int n = 0;
};
template <class T>
struct gemm_table<T, decltype(void(T::TABLE))> {
    static constexpr int n = T::TABLE;
};

// 8 codebook magnitudes (bytes of `grid`, each < 128) with their signs
// (bit k of `signs`: value k negative) times the scale `d` (f32), as 4
// f16x2 words (values 2w, 2w+1 in word w). Each pair of bytes x becomes
// 32 + x/32 in f16 (one PRMT under the high byte 0x50), 32 is subtracted
// (exact: x/32 has 7 significant bits), the product with the scale times
// 32 (rounded to f16 once, like the f32 path's value) is rounded to
// nearest, and the signs are XORed into the halves' sign bits (bit 2w of
// signs -> bit 15, bit 2w + 1 -> bit 31: the multiply by 0x40008000
// places them there without carries, since signs < 256). Against the f32
// path (`sbyte_f`, a multiply, the pair's rounding) this drops two of
// every word's eleven instructions and the sign words' byte subtraction.
// Two roundings, within an f16 ulp of the value; the factor 32 keeps the
// rounded scale normal for scales from 1.9e-6 up (0x64, 1024 + x, would
// leave it subnormal, ~1e-3 off, below 6.1e-5) and finite to 2047.
// kernel_model::gemv models it word for word.
__device__ __forceinline__ void grid_h2(u64 grid, u32 signs, float d, u32* h) {
    const u32 d2 = pack_h2(32.0f * d, 32.0f * d);
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const u32 g4 = w < 2 ? (u32)grid : (u32)(grid >> 32);
        const u32 biased = __byte_perm(g4, 0x50505050u, (w & 1) ? 0x4342u : 0x4140u);
        u32 mag, scaled;
        asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(mag) : "r"(biased), "r"(0x50005000u));
        asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(scaled) : "r"(mag), "r"(d2));
        h[w] = scaled ^ (((signs >> (2 * w)) * 0x40008000u) & 0x80008000u);
    }
}

// The integer-coded formats' f16 fragments are GEMM_SCALE times the
// weights (the store multiplies by its inverse, exact: a power of two), so
// that a small block scale stays a normal f16: f16 keeps 11 bits down to
// 6.1e-5, and a Q8_0 block of weights under 7.7e-3 has a scale below that.
// 16 keeps scales normal from 3.8e-6 and weights finite to 4,094.
#define GEMM_SCALE 16.0f

// 8 unsigned byte codes (bytes 0-3 of q0, then of q1) as 4 f16x2 words
// (values 2w, 2w+1 in word w): (code - off) * s + t, with s2 = s|s and t2 =
// t|t as f16x2 and bias2 = 1024 + off as f16x2. Each pair of bytes becomes
// 1024 + code by one PRMT under the high byte 0x64 (f16's spacing is 1
// from 1024 to 2048), the subtraction of 1024 + off is exact (an integer
// under 256 in magnitude), and the fma rounds once. Against the f32 path
// (per value a PRMT, an FADD and an FFMA, and a conversion per pair) this
// is 3 instructions a pair. kernel_model::gemv models it word for word.
__device__ __forceinline__ void codes_h2(u32 q0, u32 q1, u32 bias2, u32 s2, u32 t2, u32* h) {
#pragma unroll
    for (int w = 0; w < 4; w++) {
        const u32 biased = __byte_perm(w < 2 ? q0 : q1, 0x64646464u, (w & 1) ? 0x4342u : 0x4140u);
        u32 mag;
        asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(mag) : "r"(biased), "r"(bias2));
        asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(h[w]) : "r"(mag), "r"(s2), "r"(t2));
    }
}

// The factor a format's fragments carry (`GEMM_SCALED` set: GEMM_SCALE;
// else 1), undone at the store.
template <class T, class = void>
struct gemm_scaled {
    static constexpr bool v = false;
};
template <class T>
struct gemm_scaled<T, decltype(void(T::GEMM_SCALED))> {
    static constexpr bool v = T::GEMM_SCALED;
};

// Blocks an SM the kernel is compiled for (`__launch_bounds__`'s minimum):
// a format's `GEMM_BLOCKS` where it sets one (4: at most 128 registers a
// thread, 16 warps an SM; such a format's weight loads run one chunk
// ahead, not three, to fit), else 0: no minimum, ptxas's choice (3 blocks
// at ~168 registers; an explicit 1 lets it take more).
template <class T, class = void>
struct gemm_blocks {
    static constexpr int n = 0;
};
template <class T>
struct gemm_blocks<T, decltype(void(T::GEMM_BLOCKS))> {
    static constexpr int n = T::GEMM_BLOCKS;
};

// A format's 8 values of run `l` as 4 f16x2 words (values 2w, 2w+1 in word
// w), for the A fragments. A format with its own `dec8h` (the codebook
// formats: `grid_h2`) decodes straight to f16; the others decode to f32
// (`dec8`) and are rounded in pairs.
template <class T, class = void>
struct gemm_has_dec8h {
    static constexpr bool v = false;
};
template <class T>
struct gemm_has_dec8h<T, decltype(void(&T::dec8h))> {
    static constexpr bool v = true;
};
template <class T>
__device__ __forceinline__ void gemm_dec8h(const typename T::Raw& raw, int sub, int l, u32* h, const u64* stab) {
    if constexpr (gemm_has_dec8h<T>::v) {
        T::dec8h(raw, sub, l, h, stab);
    } else {
        float v[8];
        if constexpr (gemm_table<T>::n > 0)
            T::dec8(raw, sub, l, v, stab);
        else
            T::dec8(raw, sub, l, v);
#pragma unroll
        for (int w = 0; w < 4; w++) h[w] = pack_h2(v[2 * w], v[2 * w + 1]);
    }
}

// The block's shared memory (declared once in the kernel: each of its two
// bodies would otherwise get its own).
template <class T>
struct GemmSmem {
    // Two steps of activations, [chunk][row][run] pieces of 8 values.
    uint4 Bs[2][GEMM_BPIECES];
    // Element offset of each activation row of the tile (-1: past its end).
    long long xoff[GEMM_BN];
    // The codebook, for the formats that have one.
    u64 stab[gemm_table<T>::n > 0 ? gemm_table<T>::n : 1];
};

// Steps and chunks. A step is 4 chunks: half of a 256-value block (LPB 8:
// step s is half s % 2 of block s / 2) or 4 blocks of 32 (LPB 1). The
// loop over steps runs in pairs for LPB 8, its two halves unrolled apart
// (`half` 0 / 1, a constant in each copy), so that every chunk's sub-block
// index, and what a format derives from it (the K-quants' scale bytes, the
// load offsets), is a constant: with it runtime, the scale unpacking took
// both branches' selects and the addresses a 64-bit multiply a row and
// chunk.
//
// Chunk q of a step whose first block is `blk0` (q may run past the step:
// the prefetch): its block and its sub-block.
template <class T>
__device__ __forceinline__ int gemm_chunk_block(int half, int blk0, int q) {
    return blk0 + ((T::LPB == 8 ? 4 * half : 0) + q) / T::LPB;
}
template <class T>
__device__ __forceinline__ int gemm_chunk_sub(int half, int q) {
    return ((T::LPB == 8 ? 4 * half : 0) + q) % T::LPB;
}
// Whether a format's steps are unrolled in pairs (`GEMM_HALVES`: the
// K-quants, whose scale unpacking depends on the sub-block; the codebook
// formats only offset their loads by it, and the second copy of the loop
// costs them registers: IQ2_XXS spilled 40 bytes at its 128).
template <class T, class = void>
struct gemm_halves {
    static constexpr bool v = false;
};
template <class T>
struct gemm_halves<T, decltype(void(T::GEMM_HALVES))> {
    static constexpr bool v = T::LPB == 8 && T::GEMM_HALVES;
};
// The first block of step s.
template <class T>
__device__ __forceinline__ int gemm_step_block(int s) {
    return T::LPB == 8 ? s >> 1 : 4 * s;
}

// The tile's activations of step `s` (half `half` of its block, LPB 8)
// into `dst` ([chunk][row][run] pieces of 8 values; zeros past the tile's
// rows or the matrix's blocks).
template <class T>
__device__ __forceinline__ void gemm_load_b(const GemmArgs& a, const long long* xoff, int s, int half, uint4* dst) {
    const int blk0 = gemm_step_block<T>(s);
#pragma unroll 1
    for (int i = 0; i < GEMM_BPIECES / GEMM_THREADS; i++) {
        const int q = threadIdx.x + i * GEMM_THREADS;
        const int j = q >> 8, t = (q >> 2) & (GEMM_BN - 1), r = q & 3;
        const int blk = gemm_chunk_block<T>(half, blk0, j);
        const long long off = xoff[t];
        if (off >= 0 && blk < a.nb) {
            const long long k = off + (long long)blk * T::QK + T::col(gemm_chunk_sub<T>(half, j), 8 * r);
            if (a.xh) {
                cp_async16(dst + q, a.xh + k);
            } else {
                const float4 f0 = __ldg(reinterpret_cast<const float4*>(a.x + k));
                const float4 f1 = __ldg(reinterpret_cast<const float4*>(a.x + k) + 1);
                dst[q] = make_uint4(pack_h2(f0.x, f0.y), pack_h2(f0.z, f0.w), pack_h2(f1.x, f1.y),
                                    pack_h2(f1.z, f1.w));
            }
        } else {
            dst[q] = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

// The loads of this lane's 4 rows (first blocks `rowblk`: row * nb, under
// 2^32 for any matrix the device holds) of sub-block `sub` of block `blk`
// (clamped to the last block: the prefetch past the end reads what exists
// and is not used).
template <class T>
__device__ __forceinline__ void gemm_load_a(const u8* base, const u16* dd, const u32* rowblk, int blk, int sub,
                                            int nb, int run, typename T::Raw* dst) {
    blk = min(blk, nb - 1);
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const u32 bi = rowblk[r] + (u32)blk;
        dst[r] = T::fetch8(base + (u64)bi * T::PAYLOAD, dd + (u64)bi * side_words<T>::v, sub, run);
    }
}

// KS = 1: a block of 4 warps (GEMM_THREADS, the only launch shape) covers
// 128 rows, each warp every chunk of its 32. KS = 4 (small grids: the launch's choice): the
// block's 4 warps share 32 rows and each takes one chunk of every step,
// their sums added through shared memory at the end: 4x the warps of a
// KS = 1 grid of 4-warp blocks, with no weight dequantized twice.
template <class T, int KS>
__device__ __forceinline__ void gemm_body(const GemmArgs& a, GemmSmem<T>& sm) {
    if (a.n_tiles_dev && (int)blockIdx.y >= __ldg(a.n_tiles_dev)) return;
    uint4 (&Bs)[2][GEMM_BPIECES] = sm.Bs;
    long long* xoff = sm.xoff;
    constexpr int NTAB = gemm_table<T>::n;
    u64* stab = sm.stab;
    // Weight loads in flight ahead of their chunk's MMAs: 3 chunks for the
    // formats whose loads fit in 16 bytes a row, else 1 (a ring of 4 or 2
    // entries: a divisor of the 4 chunks of a step, so every entry's index
    // is a constant after unrolling).
    using Raw = typename T::Raw;
    constexpr int AHEAD = sizeof(Raw) <= 16 && gemm_blocks<T>::n < 4 ? 3 : 1;
    constexpr int RING = AHEAD + 1;
    const int ty = blockIdx.y;
    int m = 0, p0, p1;
    if (a.tiles) {
        m = __ldg(a.tiles + 3 * ty);
        p0 = __ldg(a.tiles + 3 * ty + 1);
        p1 = __ldg(a.tiles + 3 * ty + 2);
    } else {
        p0 = ty * GEMM_BN;
        p1 = min(p0 + GEMM_BN, a.n);
    }
    const int cnt = p1 - p0;
    const u8* base = a.w + (u64)(a.slots ? __ldg(a.slots + m) : (u32)m) * a.mat_bytes;
    const u16* dd = reinterpret_cast<const u16*>(base + (u64)a.rows * a.nb * T::PAYLOAD);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    // A block covers GEMM_BM = 4 x 32 rows (KS = 1) or 32 (KS = 4).
    const int wr = KS == 1 ? blockIdx.x * GEMM_BM + warp * 32 : blockIdx.x * 32;
    // KS = 4: this warp's chunk of each step, and its weights' prefetch
    // distance (the next step's chunk).
    const int kpart = KS == 1 ? 0 : warp;
    const int nsteps = (a.nb * T::LPB + 3) / 4;
    // This lane's rows (mi*16 + hr*8 + g of the warp's 32, index 2 mi + hr):
    // the first block of each. Rows past the matrix read the last row: real
    // weights whose products stay in their own accumulator rows (an MMA's
    // rows never mix) and are never stored, so they need no zeroing.
    u32 rowblk[4];
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int row = wr + (r >> 1) * 16 + (r & 1) * 8 + g;
        rowblk[r] = (u32)min(row, a.rows - 1) * (u32)a.nb;
    }
    float acc[2][8][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;

    for (int i = tid; i < GEMM_BN; i += GEMM_THREADS) {
        const int bp = p0 + i;
        xoff[i] = bp < p1 ? (long long)(a.gather ? __ldg(a.gather + bp) : bp) * a.ldx : -1;
    }
    if constexpr (NTAB > 0) {
        for (int i = tid; i < NTAB; i += GEMM_THREADS) stab[i] = T::table(i);
    }
    Raw ring[RING][4];
    if constexpr (KS == 1) {
#pragma unroll
        for (int k = 0; k < AHEAD; k++)
            gemm_load_a<T>(base, dd, rowblk, gemm_chunk_block<T>(0, 0, k), gemm_chunk_sub<T>(0, k), a.nb, c,
                           ring[k]);
    } else {
        gemm_load_a<T>(base, dd, rowblk, gemm_chunk_block<T>(0, 0, kpart), gemm_chunk_sub<T>(0, kpart), a.nb, c,
                       ring[0]);
    }
    __syncthreads();
    gemm_load_b<T>(a, xoff, 0, 0, Bs[0]);
    cp_async_commit();

    // Steps a loop iteration: 2 for the formats that ask for the halves
    // apart (`gemm_halves`; nsteps = 2 nb), else 1.
    constexpr int SPI = gemm_halves<T>::v ? 2 : 1;
    for (int s0 = 0; s0 < nsteps; s0 += SPI) {
#pragma unroll
      for (int i = 0; i < SPI; i++) {
        const int s = s0 + i;
        const int half = s & 1;  // a constant where SPI = 2
        const int blk0 = gemm_step_block<T>(s);
        const int buf = s & 1;
        // The next step's activations go in flight before this one's wait.
        if (s + 1 < nsteps) gemm_load_b<T>(a, xoff, s + 1, half ^ 1, Bs[buf ^ 1]);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const uint4* bs = Bs[buf];
#pragma unroll
        for (int jj = 0; jj < (KS == 1 ? 4 : 1); jj++) {
            const int j = KS == 1 ? jj : kpart;
            if (gemm_chunk_block<T>(half, blk0, j) >= a.nb) break;
            // KS = 1: chunk j's weights were loaded AHEAD chunks ago, into
            // entry j % RING (RING divides 4); chunk j + AHEAD's go out now.
            // KS = 4: entry 0 holds this step's chunk; the next step's goes
            // to entry 1 and moves down after the MMAs.
            if constexpr (KS == 1)
                gemm_load_a<T>(base, dd, rowblk, gemm_chunk_block<T>(half, blk0, j + AHEAD),
                               gemm_chunk_sub<T>(half, j + AHEAD), a.nb, c, ring[(j + AHEAD) % RING]);
            else
                gemm_load_a<T>(base, dd, rowblk, gemm_chunk_block<T>(half, blk0, j + 4),
                               gemm_chunk_sub<T>(half, j + 4), a.nb, c, ring[1]);
            const int sub = gemm_chunk_sub<T>(half, j);
            // This lane's B fragments (row nt*8 + g's run c) are read two
            // column groups ahead of their MMAs, the first two before the
            // decode (the buffer holds all 64 rows: the reads past the
            // tile's last pair are not used). Not measured alone (history
            // 32: it shipped with the 4-blocks change); ptxas moves most of
            // these loads back towards their use.
            const uint4* bj = bs + j * (GEMM_BN * 4) + g * 4 + c;
            uint4 bq[2] = {bj[0], bj[32]};
            // A fragments of the chunk's two k16 MMAs: [m16 tile][mma][reg]
            // (regs 0/1: rows g / g+8 at the MMA's k 2c, 2c+1; regs 2/3:
            // the same rows at k 2c+8, 2c+9), values 0-3 of the run in
            // the first MMA and 4-7 in the second.
            u32 af[2][2][4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int mi = r >> 1, hr = r & 1;
                u32 h[4];
                gemm_dec8h<T>(ring[KS == 1 ? j % RING : 0][r], sub, c, h, stab);
                af[mi][0][hr] = h[0];
                af[mi][0][2 + hr] = h[1];
                af[mi][1][hr] = h[2];
                af[mi][1][2 + hr] = h[3];
            }
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                if (nt * 8 >= cnt) break;
                // Row nt*8 + g's run c: its B fragment for both MMAs.
                const uint4 b = bq[nt & 1];
                if (nt + 2 < 8) bq[nt & 1] = bj[(nt + 2) * 32];
                const u32 b0[2] = {b.x, b.y}, b1[2] = {b.z, b.w};
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    mma_16816(acc[mi][nt], af[mi][0], b0);
                    mma_16816(acc[mi][nt], af[mi][1], b1);
                }
            }
            if constexpr (KS == 4) {
#pragma unroll
                for (int r = 0; r < 4; r++) ring[0][r] = ring[1][r];
            }
        }
        // Every warp is done with this buffer before step s + 2 fills it.
        __syncthreads();
      }
    }
    if constexpr (KS == 4) {
        // Warps 1-3 leave their partial sums in the activation buffers
        // (free now: the loop ended on a barrier), lane-minor, and warp 0
        // adds them and stores.
        float* red = reinterpret_cast<float*>(&Bs[0][0]);
        if (warp > 0) {
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        red[(((warp - 1) * 64) + (mi * 8 + nt) * 4 + e) * 32 + lane] = acc[mi][nt][e];
        }
        __syncthreads();
        if (warp > 0) return;
#pragma unroll
        for (int w = 0; w < 3; w++)
#pragma unroll
            for (int mi = 0; mi < 2; mi++)
#pragma unroll
                for (int nt = 0; nt < 8; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[mi][nt][e] += red[((w * 64) + (mi * 8 + nt) * 4 + e) * 32 + lane];
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int row = wr + mi * 16 + g + (e >> 1) * 8;
                const int p = p0 + nt * 8 + 2 * c + (e & 1);
                const float v = gemm_scaled<T>::v ? acc[mi][nt][e] * (1.0f / GEMM_SCALE) : acc[mi][nt][e];
                if (row < a.rows && p < p1) a.y[(long long)p * a.ldy + row] = v;
            }
}

#define GEMM_KERNEL(NAME, T)                                                          \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, gemm_blocks<T>::n) NAME(const GemmArgs a) { \
        PDL_PROLOGUE();                                                               \
        __shared__ __align__(16) GemmSmem<T> sm;                                      \
        if (a.ksplit == 4)                                                            \
            gemm_body<T, 4>(a, sm);                                                   \
        else                                                                          \
            gemm_body<T, 1>(a, sm);                                                   \
    }
