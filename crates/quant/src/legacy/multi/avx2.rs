//! The AVX2 kernels of Q4_0, Q5_0 and Q8_0 weights against Q8_0 records.
//!
//! Two summation orders, each used by every kernel of its formats, so that
//! a (row, record) value does not depend on which kernel computed it (a
//! speculative verify pass batches tokens that decoding computes one by
//! one, and must give the same bits):
//!
//! - **Q4_0, Q5_0: the half-block fold.** A block's integer dot is split
//!   into the sums over its low and high 16 bytes (exact integers); per
//!   (row, record) two f32 lanes accumulate `fma(dx · dy, half_sum, acc)`
//!   block after block, and the result is `acc_lo + acc_hi`. Four rows or
//!   four records share one vector (two `hadd` rounds put the four low
//!   halves in lanes 0..4 and the high halves in lanes 4..8), so one
//!   convert, one multiply and one FMA serve four dots. The GEMM folds four
//!   records per weight row, the decode kernel four weight rows per record,
//!   the single dot one record: same lanes, same operations, same order.
//! - **Q8_0: eight lanes per (row, record)**, each the sum of four byte
//!   products of a block, one accumulator over the blocks, then the lanes
//!   summed by [`hsum_ps`]. Prompts keep this order (the tiny Qwen3-Next
//!   Q8_0 fixture is compared with llama.cpp's activations, see
//!   `super::gemm_fn`), so the decode kernels take it too.
//!
//! Integer block dots are exact in every form (signed weights with `sign`,
//! or unsigned weights with `OFF · Σv` subtracted), so only the f32
//! operations above decide the bits.

use super::{check_multi, records};
use crate::block::cast_blocks;
use crate::legacy::q4::BlockQ40;
use crate::legacy::q5::BlockQ50;
use crate::legacy::q8_0::BlockQ80;
use crate::legacy::x86::*;
use core::arch::x86_64::*;

/// A decoder: a weight block's 32 values as bytes and its scale (f16).
/// Signed decoders give the values (never -128); unsigned ones the values
/// plus the format's offset.
trait Decode<B>: Fn(&B) -> (__m256i, [u8; 2]) + Copy {}
impl<B, F: Fn(&B) -> (__m256i, [u8; 2]) + Copy> Decode<B> for F {}

/// Four 8-lane integer dots folded: lane `j` is the sum of `p[j]`'s lanes
/// 0..4 (bytes 0..16 of the block), lane `j + 4` of its lanes 4..8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn fold4(p: [__m256i; 4]) -> __m256i {
    _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]))
}

/// Four f32 values in lanes 0..4 and again in lanes 4..8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn twice(v: [f32; 4]) -> __m256 {
    let h = _mm_setr_ps(v[0], v[1], v[2], v[3]);
    _mm256_set_m128(h, h)
}

/// The four results of a folded accumulator: lane `j` plus lane `j + 4`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn unfold(acc: __m256) -> [f32; 4] {
    let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    let mut v = [0f32; 4];
    // SAFETY: `v` is 4 writable f32.
    unsafe { _mm_storeu_ps(v.as_mut_ptr(), s) };
    v
}

/// Signed 8-lane integer dot of one decoded weight block `q` (absolute
/// value `ax`) with a record block's bytes `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_signed(ax: __m256i, q: __m256i, v: __m256i) -> __m256i {
    _mm256_madd_epi16(
        _mm256_maddubs_epi16(ax, _mm256_sign_epi8(v, q)),
        _mm256_set1_epi16(1),
    )
}

/// Q8_0 order: `G` records, one 8-lane accumulator each (a single chain
/// over the blocks, also for one record, so that every kernel of the
/// format sums the same way).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile<const G: usize, B, D: Decode<B>>(x: &[B], ys: [&[BlockQ80]; G], decode: D) -> [f32; G] {
    let nb = x.len();
    for y in &ys {
        assert_eq!(y.len(), nb, "dot: block counts");
    }
    let mut acc = [_mm256_setzero_ps(); G];
    let f16 = crate::f16util::f16_table();
    for i in 0..nb {
        let (q, dx) = decode(&x[i]);
        let ax = _mm256_sign_epi8(q, q);
        let dx = f16[u16::from_le_bytes(dx) as usize];
        for t in 0..G {
            let b = &ys[t][i];
            // SAFETY: `b.qs` is 32 readable bytes.
            let v = unsafe { load32(b.qs.as_ptr().cast()) };
            let d = _mm256_set1_ps(dx * f16[u16::from_le_bytes(b.d) as usize]);
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_signed(ax, q, v)), acc[t]);
        }
    }
    core::array::from_fn(|t| hsum_ps(acc[t]))
}

/// Half-block fold order (Q4_0, Q5_0): `G <= 4` records of one row,
/// signed decoder.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tile_fold<const G: usize, B, D: Decode<B>>(
    x: &[B],
    ys: [&[BlockQ80]; G],
    decode: D,
) -> [f32; G] {
    let nb = x.len();
    for y in &ys {
        assert_eq!(y.len(), nb, "dot: block counts");
    }
    let mut acc = _mm256_setzero_ps();
    let f16 = crate::f16util::f16_table();
    for i in 0..nb {
        let (q, dx) = decode(&x[i]);
        let ax = _mm256_sign_epi8(q, q);
        let mut p = [_mm256_setzero_si256(); 4];
        let mut dy = [0f32; 4];
        for t in 0..G {
            let b = &ys[t][i];
            // SAFETY: `b.qs` is 32 readable bytes.
            let v = unsafe { load32(b.qs.as_ptr().cast()) };
            p[t] = dot_signed(ax, q, v);
            dy[t] = f16[u16::from_le_bytes(b.d) as usize];
        }
        let d = _mm256_mul_ps(
            _mm256_set1_ps(f16[u16::from_le_bytes(dx) as usize]),
            twice(dy),
        );
        acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(fold4(p)), acc);
    }
    let v = unfold(acc);
    core::array::from_fn(|t| v[t])
}

/// Run a tile over all records of a multi call, four at a time (`FOLD`:
/// [`tile_fold`], else [`tile`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn multi<const FOLD: bool, B, D: Decode<B>>(
    x: &[B],
    acts: &[u8],
    stride: usize,
    out: &mut [f32],
    decode: D,
) {
    let nb = x.len();
    let n = out.len();
    check_multi(acts, stride, nb * core::mem::size_of::<BlockQ80>(), n);
    let mut t0 = 0;
    while t0 < n {
        let g = (n - t0).min(4);
        let r: [f32; 4] = match (FOLD, g) {
            (true, 1) => {
                let [a] = tile_fold::<1, B, D>(x, records(acts, stride, t0, 1, nb), decode);
                [a, 0.0, 0.0, 0.0]
            }
            (true, 2) => {
                let [a, b] = tile_fold::<2, B, D>(x, records(acts, stride, t0, 2, nb), decode);
                [a, b, 0.0, 0.0]
            }
            (true, 3) => {
                let [a, b, c] = tile_fold::<3, B, D>(x, records(acts, stride, t0, 3, nb), decode);
                [a, b, c, 0.0]
            }
            (true, _) => tile_fold::<4, B, D>(x, records(acts, stride, t0, 4, nb), decode),
            (false, 1) => {
                let [a] = tile::<1, B, D>(x, records(acts, stride, t0, 1, nb), decode);
                [a, 0.0, 0.0, 0.0]
            }
            (false, 2) => {
                let [a, b] = tile::<2, B, D>(x, records(acts, stride, t0, 2, nb), decode);
                [a, b, 0.0, 0.0]
            }
            // Three records: the fourth repeats the third (dropped).
            (false, _) => tile::<4, B, D>(x, records(acts, stride, t0, g, nb), decode),
        };
        out[t0..t0 + g].copy_from_slice(&r[..g]);
        t0 += g;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
fn decode_q8_0(a: &BlockQ80) -> (__m256i, [u8; 2]) {
    // SAFETY: `a.qs` is 32 readable bytes.
    (unsafe { load32(a.qs.as_ptr().cast()) }, a.d)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn decode_q5_0(a: &BlockQ50) -> (__m256i, [u8; 2]) {
    // SAFETY: `a.qs` is 16 readable bytes.
    let q = unsafe { nibbles_lo_hi(a.qs.as_ptr()) };
    // value - 16 = nibble when the fifth bit is set, else nibble | 0xF0
    // read as i8 (nibble - 16).
    let bits = bits_to_bytes(u32::from_le_bytes(a.qh));
    let hi = _mm256_set1_epi8(0xF0u8 as i8);
    (_mm256_or_si256(q, _mm256_andnot_si256(bits, hi)), a.d)
}

#[target_feature(enable = "avx2,fma,f16c")]
fn decode_q4_0(a: &BlockQ40) -> (__m256i, [u8; 2]) {
    // SAFETY: `a.qs` is 16 readable bytes.
    let q = unsafe { nibbles_lo_hi(a.qs.as_ptr()) };
    (_mm256_sub_epi8(q, _mm256_set1_epi8(8)), a.d)
}

/// Q5_0 values + 16 (0..=31) as bytes.
#[target_feature(enable = "avx2,fma,f16c")]
fn decode_q5_0_u(a: &BlockQ50) -> (__m256i, [u8; 2]) {
    // SAFETY: `a.qs` is 16 readable bytes.
    let q = unsafe { nibbles_lo_hi(a.qs.as_ptr()) };
    let bits = bits_to_bytes(u32::from_le_bytes(a.qh));
    let b4 = _mm256_and_si256(bits, _mm256_set1_epi8(0x10));
    (_mm256_or_si256(q, b4), a.d)
}

/// Q4_0 values + 8 (0..=15) as bytes.
#[target_feature(enable = "avx2,fma,f16c")]
fn decode_q4_0_u(a: &BlockQ40) -> (__m256i, [u8; 2]) {
    // SAFETY: `a.qs` is 16 readable bytes.
    (unsafe { nibbles_lo_hi(a.qs.as_ptr()) }, a.d)
}

/// `R` weight rows × one record (decode), Q8_0 order: the activation block
/// and its scale are loaded once per block for all rows; one accumulator
/// per row (the arithmetic of [`tile`] per row).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_signed<const R: usize, B, D: Decode<B>>(
    x: [&[B]; R],
    y: &[BlockQ80],
    pf: *const u8,
    decode: D,
) -> [f32; R] {
    let nb = y.len();
    for r in &x {
        assert_eq!(r.len(), nb, "dot: block counts");
    }
    let mut acc = [_mm256_setzero_ps(); R];
    let f16 = crate::f16util::f16_table();
    for i in 0..nb {
        prefetch::<R, B>(pf, i);
        let b = &y[i];
        // SAFETY: `b.qs` is 32 readable bytes.
        let v = unsafe { load32(b.qs.as_ptr().cast()) };
        let dy = f16[u16::from_le_bytes(b.d) as usize];
        for r in 0..R {
            let (q, dx) = decode(&x[r][i]);
            let p = dot_signed(_mm256_sign_epi8(q, q), q, v);
            let d = _mm256_set1_ps(f16[u16::from_le_bytes(dx) as usize] * dy);
            acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
        }
    }
    core::array::from_fn(|r| hsum_ps(acc[r]))
}

/// `R <= 4` weight rows × one record (decode), half-block fold order with
/// unsigned weights: `decode` gives value + `OFF` as bytes, which
/// `maddubs` takes as they are; `OFF · Σv` of the activation block is
/// subtracted in the integer domain. The four
/// rows' dots share one folded vector: lane `r` / `r + 4` is row `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_fold<const R: usize, const OFF: i8, B, D: Decode<B>>(
    x: [&[B]; R],
    y: &[BlockQ80],
    pf: *const u8,
    decode: D,
) -> [f32; R] {
    let nb = y.len();
    for r in &x {
        assert_eq!(r.len(), nb, "dot: block counts");
    }
    let mut acc = _mm256_setzero_ps();
    let ones = _mm256_set1_epi16(1);
    let off = _mm256_set1_epi8(OFF);
    let f16 = crate::f16util::f16_table();
    for i in 0..nb {
        prefetch::<R, B>(pf, i);
        let b = &y[i];
        // SAFETY: `b.qs` is 32 readable bytes.
        let v = unsafe { load32(b.qs.as_ptr().cast()) };
        // Subtracted per row before the fold (one `vpsubd` each, any ALU
        // port) rather than folded once and subtracted after (three more
        // `hadd`s on the shuffle port); the integers are the same.
        let c = _mm256_madd_epi16(_mm256_maddubs_epi16(off, v), ones);
        let dy = f16[u16::from_le_bytes(b.d) as usize];
        let mut p = [_mm256_setzero_si256(); 4];
        let mut d = [0f32; 4];
        for r in 0..R {
            let (q, dx) = decode(&x[r][i]);
            p[r] = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(q, v), ones), c);
            d[r] = f16[u16::from_le_bytes(dx) as usize] * dy;
        }
        acc = _mm256_fmadd_ps(twice(d), _mm256_cvtepi32_ps(fold4(p)), acc);
    }
    let v = unfold(acc);
    core::array::from_fn(|r| v[r])
}

/// Software prefetch for the multi-row kernels: rows are short (a few
/// hundred bytes), so four interleaved rows never look like a stream to
/// the hardware prefetcher; while block `i` of this group is computed,
/// the next group's bytes (contiguous from `pf`) are requested at the
/// same pace (`R` blocks per step).
#[inline(always)]
fn prefetch<const R: usize, B>(pf: *const u8, i: usize) {
    let step = R * core::mem::size_of::<B>();
    let p = pf.wrapping_add(i * step);
    // SAFETY: a prefetch is a hint; it never faults, whatever the
    // address (wrapping_add keeps the pointer arithmetic defined).
    unsafe {
        _mm_prefetch::<_MM_HINT_T0>(p.cast());
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
    }
}

/// Rows of `rows` (`row_bytes` each) against one record, four rows at
/// a time, then the remainder one by one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn rows_run<B, K4, K1>(
    rows: &[u8],
    row_bytes: usize,
    y: &[BlockQ80],
    out: &mut [f32],
    k4: K4,
    k1: K1,
) where
    B: crate::block::Block,
    K4: Fn([&[B]; 4], &[BlockQ80], *const u8) -> [f32; 4],
    K1: Fn([&[B]; 1], &[BlockQ80], *const u8) -> [f32; 1],
{
    assert!(rows.len() >= out.len() * row_bytes, "dot_rows: row bytes");
    let row = |r: usize| cast_blocks::<B>(&rows[r * row_bytes..(r + 1) * row_bytes]);
    let mut r = 0;
    while r + 4 <= out.len() {
        let pf = rows.as_ptr().wrapping_add((r + 4) * row_bytes);
        let v = k4([row(r), row(r + 1), row(r + 2), row(r + 3)], y, pf);
        out[r..r + 4].copy_from_slice(&v);
        r += 4;
    }
    while r < out.len() {
        let pf = rows.as_ptr().wrapping_add((r + 1) * row_bytes);
        out[r] = k1([row(r)], y, pf)[0];
        r += 1;
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows_q5_0(rows: &[u8], row_bytes: usize, act: &[u8], out: &mut [f32]) {
    let y = cast_blocks::<BlockQ80>(act);
    let d = |a: &BlockQ50| decode_q5_0_u(a);
    rows_run(
        rows,
        row_bytes,
        y,
        out,
        |x, y, pf| rows_fold::<4, 16, _, _>(x, y, pf, d),
        |x, y, pf| rows_fold::<1, 16, _, _>(x, y, pf, d),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows_q4_0(rows: &[u8], row_bytes: usize, act: &[u8], out: &mut [f32]) {
    let y = cast_blocks::<BlockQ80>(act);
    let d = |a: &BlockQ40| decode_q4_0_u(a);
    rows_run(
        rows,
        row_bytes,
        y,
        out,
        |x, y, pf| rows_fold::<4, 8, _, _>(x, y, pf, d),
        |x, y, pf| rows_fold::<1, 8, _, _>(x, y, pf, d),
    )
}

#[target_feature(enable = "avx2,fma,f16c")]
pub fn rows_q8_0(rows: &[u8], row_bytes: usize, act: &[u8], out: &mut [f32]) {
    let y = cast_blocks::<BlockQ80>(act);
    let d = |a: &BlockQ80| decode_q8_0(a);
    rows_run(
        rows,
        row_bytes,
        y,
        out,
        |x, y, pf| rows_signed::<4, _, _>(x, y, pf, d),
        |x, y, pf| rows_signed::<1, _, _>(x, y, pf, d),
    )
}

/// Records per block of the record loop in [`gemm`]: 16 groups of four.
/// Each panel of weight rows is decoded once per block of records, and
/// the records' scales and corrections of a block (16 · 28 · 64 bytes
/// for a 896-wide matrix) stay in L1/L2 while the panels stream past.
const GROUPS_PER_BLOCK: usize = 16;
/// Weight rows decoded together into one panel.
const PANEL: usize = 4;

/// `nr` weight rows × `n` records into `out` (`nr × n`, token-major):
/// prompt processing, half-block fold order. Records in groups of four
/// (the last group may hold fewer), folded into one vector per row and
/// block, so each row-block needs one convert, one multiply by `dx ·
/// [dy0..dy3]` and one FMA instead of four of each. Loop order: blocks of
/// [`GROUPS_PER_BLOCK`] groups outside; inside, panels of [`PANEL`] weight
/// rows are decoded once (to 32 bytes and an f32 scale per block) and
/// reused by every group of the block. The record scales and `OFF · Σv`
/// corrections are built once per group. With `OFF > 0`, `decode` gives
/// unsigned weights (value + `OFF`) and `OFF · Σv` (per record and block,
/// folded the same way) is subtracted in the integer domain. The
/// arithmetic per (row, record) does not depend on the loop order, the
/// group size, `nr`, `n` or the panel a row falls in, and is the one of
/// [`rows_fold`] and [`tile_fold`].
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn gemm<const OFF: i8, B, D>(
    rows: &[u8],
    row_bytes: usize,
    nr: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
    decode: D,
) where
    B: crate::block::Block,
    D: Decode<B>,
{
    let nb = row_bytes / core::mem::size_of::<B>();
    let act_len = nb * core::mem::size_of::<BlockQ80>();
    assert!(rows.len() >= nr * row_bytes, "gemm: row bytes");
    assert!(out.len() >= nr * n, "gemm: output");
    assert!(
        n == 0 || (stride >= act_len && acts.len() >= (n - 1) * stride + act_len),
        "gemm: records"
    );
    let row = |r: usize| cast_blocks::<B>(&rows[r * row_bytes..(r + 1) * row_bytes]);
    let f16 = crate::f16util::f16_table();
    let ones = _mm256_set1_epi16(1);
    let off = _mm256_set1_epi8(OFF);
    let groups = n.div_ceil(4);
    // Records in group `g` (the last may be short; `records` repeats its
    // last record into the missing lanes, whose results are dropped).
    let count = |g: usize| (n - g * 4).min(4);
    let gpb = GROUPS_PER_BLOCK.min(groups.max(1));
    let mut dyv: Vec<__m256> = Vec::with_capacity(gpb * nb);
    let mut corr: Vec<__m256i> = Vec::with_capacity(gpb * nb);
    let mut panel = Panel {
        w: vec![_mm256_setzero_si256(); PANEL * nb],
        dx: vec![0f32; PANEL * nb],
    };
    let store = |out: &mut [f32], r: usize, t0: usize, cnt: usize, acc: __m256| {
        let v = unfold(acc);
        for (j, &x) in v.iter().enumerate().take(cnt) {
            out[(t0 + j) * nr + r] = x;
        }
    };
    let mut g0 = 0;
    while g0 < groups {
        let g1 = (g0 + gpb).min(groups);
        dyv.clear();
        corr.clear();
        for g in g0..g1 {
            let ys = records::<4>(acts, stride, g * 4, count(g), nb);
            dyv.extend((0..nb).map(|i| {
                twice(core::array::from_fn(|t| {
                    f16[u16::from_le_bytes(ys[t][i].d) as usize]
                }))
            }));
            if OFF != 0 {
                // `OFF · Σv` per record and block, folded like the dots.
                corr.extend((0..nb).map(|i| {
                    fold4(core::array::from_fn(|t| {
                        // SAFETY: `qs` is 32 readable bytes.
                        let v = unsafe { load32(ys[t][i].qs.as_ptr().cast()) };
                        _mm256_madd_epi16(_mm256_maddubs_epi16(off, v), ones)
                    }))
                }));
            }
        }
        let mut r = 0;
        while r < nr {
            let pr = PANEL.min(nr - r);
            panel.fill(&row, r, pr, nb, decode);
            for g in g0..g1 {
                let cnt = count(g);
                let ys = records::<4>(acts, stride, g * 4, cnt, nb);
                let k = (g - g0) * nb;
                let (dy, cr) = (
                    &dyv[k..k + nb],
                    if OFF != 0 { &corr[k..k + nb] } else { &[][..] },
                );
                let t = (&panel, nb, &ys, dy, cr, cnt);
                match pr {
                    4 => {
                        let acc = panel_group::<4, OFF>(t);
                        (0..4).for_each(|j| store(out, r + j, g * 4, cnt, acc[j]));
                    }
                    3 => {
                        let acc = panel_group::<3, OFF>(t);
                        (0..3).for_each(|j| store(out, r + j, g * 4, cnt, acc[j]));
                    }
                    2 => {
                        let acc = panel_group::<2, OFF>(t);
                        (0..2).for_each(|j| store(out, r + j, g * 4, cnt, acc[j]));
                    }
                    _ => {
                        let acc = panel_group::<1, OFF>(t);
                        store(out, r, g * 4, cnt, acc[0]);
                    }
                }
            }
            r += pr;
        }
        g0 = g1;
    }
}

/// Up to [`PANEL`] weight rows decoded block by block: `w[i * PANEL +
/// j]` is row `j`'s block `i` as the decoder gives it, `dx` its scale.
struct Panel {
    w: Vec<__m256i>,
    dx: Vec<f32>,
}

impl Panel {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fill<'a, B, D>(
        &mut self,
        row: &impl Fn(usize) -> &'a [B],
        r0: usize,
        pr: usize,
        nb: usize,
        decode: D,
    ) where
        B: 'a,
        D: Decode<B>,
    {
        let f16 = crate::f16util::f16_table();
        for j in 0..pr {
            let x = row(r0 + j);
            for (i, b) in x.iter().enumerate().take(nb) {
                let (v, d) = decode(b);
                self.w[i * PANEL + j] = v;
                self.dx[i * PANEL + j] = f16[u16::from_le_bytes(d) as usize];
            }
        }
    }
}

/// A panel against one group: (panel, blocks, the group's four record
/// slices, its folded scales, its folded corrections, records in it).
type Group<'a> = (
    &'a Panel,
    usize,
    &'a [&'a [BlockQ80]; 4],
    &'a [__m256],
    &'a [__m256i],
    usize,
);

/// [`panel_tile`] for a group of 1..=4 records.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn panel_group<const R: usize, const OFF: i8>(g: Group<'_>) -> [__m256; R] {
    let (panel, nb, ys, dy, cr, cnt) = g;
    match cnt {
        4 => panel_tile::<R, 4, OFF>(panel, nb, ys, dy, cr),
        3 => panel_tile::<R, 3, OFF>(panel, nb, ys, dy, cr),
        2 => panel_tile::<R, 2, OFF>(panel, nb, ys, dy, cr),
        _ => panel_tile::<R, 1, OFF>(panel, nb, ys, dy, cr),
    }
}

/// The first `R` rows of a decoded panel against the first `G` records of
/// a group of [`gemm`]: per row the folded accumulator whose lanes `t` and
/// `t + 4` sum to record `t`'s dot (lanes of records past `G` hold
/// nothing of use).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn panel_tile<const R: usize, const G: usize, const OFF: i8>(
    panel: &Panel,
    nb: usize,
    ys: &[&[BlockQ80]; 4],
    dyv: &[__m256],
    corr: &[__m256i],
) -> [__m256; R] {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); R];
    for i in 0..nb {
        let mut v = [_mm256_setzero_si256(); 4];
        for t in 0..G {
            // SAFETY: `qs` is 32 readable bytes.
            v[t] = unsafe { load32(ys[t][i].qs.as_ptr().cast()) };
        }
        for (r, a) in acc.iter_mut().enumerate() {
            let w = panel.w[i * PANEL + r];
            let mut p = [_mm256_setzero_si256(); 4];
            for t in 0..G {
                p[t] = if OFF != 0 {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(w, v[t]), ones)
                } else {
                    dot_signed(_mm256_sign_epi8(w, w), w, v[t])
                };
            }
            let mut h = fold4(p);
            if OFF != 0 {
                h = _mm256_sub_epi32(h, corr[i]);
            }
            let dx = _mm256_set1_ps(panel.dx[i * PANEL + r]);
            *a = _mm256_fmadd_ps(_mm256_mul_ps(dx, dyv[i]), _mm256_cvtepi32_ps(h), *a);
        }
    }
    acc
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn gemm_q5_0(
    rows: &[u8],
    row_bytes: usize,
    nr: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    let u = |a: &BlockQ50| decode_q5_0_u(a);
    gemm::<16, _, _>(rows, row_bytes, nr, acts, stride, n, out, u)
}

/// Q8_0 weights in the fold order: faster than [`multi_q8_0`] but not the
/// order of the format's decode kernels, so not registered (see
/// `super::gemm_fn`); kept for kbench comparisons.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn gemm_q8_0(
    rows: &[u8],
    row_bytes: usize,
    nr: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    let d = |a: &BlockQ80| decode_q8_0(a);
    gemm::<0, _, _>(rows, row_bytes, nr, acts, stride, n, out, d)
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub fn gemm_q4_0(
    rows: &[u8],
    row_bytes: usize,
    nr: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
) {
    let u = |a: &BlockQ40| decode_q4_0_u(a);
    gemm::<8, _, _>(rows, row_bytes, nr, acts, stride, n, out, u)
}

macro_rules! entry {
    ($dot:ident, $multi:ident, $blk:ty, $decode:ident, $fold:literal) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub fn $dot(row: &[u8], act: &[u8]) -> f32 {
            let x = cast_blocks::<$blk>(row);
            let y = cast_blocks::<BlockQ80>(act);
            let d = |a: &$blk| $decode(a);
            let [r] = if $fold {
                tile_fold::<1, _, _>(x, [y], d)
            } else {
                tile::<1, _, _>(x, [y], d)
            };
            r
        }

        #[target_feature(enable = "avx2,fma,f16c")]
        pub fn $multi(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
            multi::<$fold, _, _>(cast_blocks::<$blk>(row), acts, stride, out, |a: &$blk| {
                $decode(a)
            })
        }
    };
}

entry!(dot_q8_0, multi_q8_0, BlockQ80, decode_q8_0, false);
entry!(dot_q5_0, multi_q5_0, BlockQ50, decode_q5_0, true);
entry!(dot_q4_0, multi_q4_0, BlockQ40, decode_q4_0, true);
