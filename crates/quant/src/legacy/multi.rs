//! One weight row against several Q8_0 activation records (Q4_0, Q5_0,
//! Q8_0 weights): the tile kernel of prompt processing.
//!
//! Each weight block is decoded once into 32 signed bytes and reused for
//! every record; scales come from the f16 table. The single-row dot
//! products of these formats (`dot_*_fast`) are the same tile with one
//! record: blocks alternate between two accumulators (even and odd block
//! index) to break the FMA latency chain. Tiles of four records use one
//! accumulator per record (four chains are enough, and eight accumulators
//! would spill), so their results differ from `dot_fast` by f32 rounding
//! only (tested within the fast-kernel budget).

use super::q8_0::BlockQ80;
use crate::block::cast_blocks;
use crate::registry::MULTI_MAX;

/// The records `t0..t0+g` of `acts` as Q8_0 blocks (`nb` each); records past
/// the end repeat the last one (their results are dropped).
pub(crate) fn records<const G: usize>(
    acts: &[u8],
    stride: usize,
    t0: usize,
    g: usize,
    nb: usize,
) -> [&[BlockQ80]; G] {
    let len = nb * core::mem::size_of::<BlockQ80>();
    core::array::from_fn(|i| cast_blocks(&acts[(t0 + i.min(g - 1)) * stride..][..len]))
}

/// Shape checks shared by the multi kernels: `out.len() <= MULTI_MAX`
/// records of `act_len` bytes at `stride` fit in `acts`.
pub(crate) fn check_multi(acts: &[u8], stride: usize, act_len: usize, n: usize) {
    assert!(n <= MULTI_MAX, "dot_multi: {n} records > {MULTI_MAX}");
    assert!(
        n == 0 || (stride >= act_len && acts.len() >= (n - 1) * stride + act_len),
        "dot_multi: {n} records of {act_len} bytes at stride {stride} in {} bytes",
        acts.len()
    );
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;
    use crate::legacy::q4::BlockQ40;
    use crate::legacy::q5::BlockQ50;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    /// `G` records at once: `decode` gives a weight block's 32 signed values
    /// (never -128) and its scale (f16 bytes).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn tile<const G: usize, B, D>(x: &[B], ys: [&[BlockQ80]; G], decode: D) -> [f32; G]
    where
        D: Fn(&B) -> (__m256i, [u8; 2]),
    {
        let nb = x.len();
        for y in &ys {
            assert_eq!(y.len(), nb, "dot: block counts");
        }
        let mut acc0 = [_mm256_setzero_ps(); G];
        let mut acc1 = [_mm256_setzero_ps(); G];
        let ones = _mm256_set1_epi16(1);
        let f16 = crate::f16util::f16_table();
        let step = |acc: &mut [__m256; G], i: usize| {
            let (q, dx) = decode(&x[i]);
            let ax = _mm256_sign_epi8(q, q);
            let dx = _mm256_set1_ps(f16[u16::from_le_bytes(dx) as usize]);
            for t in 0..G {
                let b = &ys[t][i];
                // SAFETY: `b.qs` is 32 readable bytes.
                let v = unsafe { load32(b.qs.as_ptr().cast()) };
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(ax, _mm256_sign_epi8(v, q)), ones);
                let d = _mm256_mul_ps(dx, _mm256_set1_ps(f16[u16::from_le_bytes(b.d) as usize]));
                acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[t]);
            }
        };
        if G >= 4 {
            // Enough independent chains already; a second set of
            // accumulators would spill (AVX2 has 16 vector registers).
            for i in 0..nb {
                step(&mut acc0, i);
            }
            return core::array::from_fn(|t| hsum_ps(acc0[t]));
        }
        let mut i = 0;
        while i + 2 <= nb {
            step(&mut acc0, i);
            step(&mut acc1, i + 1);
            i += 2;
        }
        if i < nb {
            step(&mut acc0, i);
        }
        core::array::from_fn(|t| hsum_ps(_mm256_add_ps(acc0[t], acc1[t])))
    }

    /// Run `tile` over all records of a multi call, four at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn multi<B, D>(x: &[B], acts: &[u8], stride: usize, out: &mut [f32], decode: D)
    where
        D: Fn(&B) -> (__m256i, [u8; 2]) + Copy,
    {
        let nb = x.len();
        let n = out.len();
        check_multi(acts, stride, nb * core::mem::size_of::<BlockQ80>(), n);
        let mut t0 = 0;
        while t0 < n {
            let g = (n - t0).min(4);
            let r: [f32; 4] = match g {
                1 => {
                    let [a] = tile::<1, B, D>(x, records(acts, stride, t0, 1, nb), decode);
                    [a, 0.0, 0.0, 0.0]
                }
                2 => {
                    let [a, b] = tile::<2, B, D>(x, records(acts, stride, t0, 2, nb), decode);
                    [a, b, 0.0, 0.0]
                }
                _ => tile::<4, B, D>(x, records(acts, stride, t0, g, nb), decode),
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

    /// `R` weight rows × one record (decode): the activation block and its
    /// scale are loaded once per block for all rows; one accumulator per
    /// row. Signed weights (`decode` as for [`tile`]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_signed<const R: usize, B, D>(
        x: [&[B]; R],
        y: &[BlockQ80],
        pf: *const u8,
        decode: D,
    ) -> [f32; R]
    where
        D: Fn(&B) -> (__m256i, [u8; 2]),
    {
        let nb = y.len();
        for r in &x {
            assert_eq!(r.len(), nb, "dot: block counts");
        }
        let mut acc = [_mm256_setzero_ps(); R];
        let ones = _mm256_set1_epi16(1);
        let f16 = crate::f16util::f16_table();
        for i in 0..nb {
            prefetch::<R, B>(pf, i);
            let b = &y[i];
            // SAFETY: `b.qs` is 32 readable bytes.
            let v = unsafe { load32(b.qs.as_ptr().cast()) };
            let dy = f16[u16::from_le_bytes(b.d) as usize];
            for r in 0..R {
                let (q, dx) = decode(&x[r][i]);
                let p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(v, q)),
                    ones,
                );
                let d = _mm256_set1_ps(f16[u16::from_le_bytes(dx) as usize] * dy);
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
            }
        }
        core::array::from_fn(|r| hsum_ps(acc[r]))
    }

    /// `R` weight rows × one record with unsigned weights: `decode` gives
    /// the 32 values as bytes `0..=2·OFF-1` (value + `OFF`), which
    /// `maddubs` takes as they are; `OFF · Σv` (per 8 lanes, once per
    /// activation block) is subtracted in the integer domain, so each
    /// block's integer dot is exact as in the signed form.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn rows_unsigned<const R: usize, const OFF: i8, B, D>(
        x: [&[B]; R],
        y: &[BlockQ80],
        pf: *const u8,
        decode: D,
    ) -> [f32; R]
    where
        D: Fn(&B) -> (__m256i, [u8; 2]),
    {
        let nb = y.len();
        for r in &x {
            assert_eq!(r.len(), nb, "dot: block counts");
        }
        let mut acc = [_mm256_setzero_ps(); R];
        let ones = _mm256_set1_epi16(1);
        let off = _mm256_set1_epi8(OFF);
        let f16 = crate::f16util::f16_table();
        for i in 0..nb {
            prefetch::<R, B>(pf, i);
            let b = &y[i];
            // SAFETY: `b.qs` is 32 readable bytes.
            let v = unsafe { load32(b.qs.as_ptr().cast()) };
            let corr = _mm256_madd_epi16(_mm256_maddubs_epi16(off, v), ones);
            let dy = f16[u16::from_le_bytes(b.d) as usize];
            for r in 0..R {
                let (q, dx) = decode(&x[r][i]);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(q, v), ones);
                let p = _mm256_sub_epi32(p, corr);
                let d = _mm256_set1_ps(f16[u16::from_le_bytes(dx) as usize] * dy);
                acc[r] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r]);
            }
        }
        core::array::from_fn(|r| hsum_ps(acc[r]))
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
            |x, y, pf| rows_unsigned::<4, 16, _, _>(x, y, pf, d),
            |x, y, pf| rows_unsigned::<1, 16, _, _>(x, y, pf, d),
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
            |x, y, pf| rows_unsigned::<4, 8, _, _>(x, y, pf, d),
            |x, y, pf| rows_unsigned::<1, 8, _, _>(x, y, pf, d),
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

    /// `nr` weight rows × `n` records into `out` (`nr × n`, row-major by
    /// weight row): prompt processing. Four records at a time: the four
    /// per-record integer block dots are folded into one vector by two
    /// `hadd` rounds (lanes 0..4 and 4..8 hold halves of records 0..4), so
    /// each row-block needs one convert, one multiply by `dx · [dy0..dy3]`
    /// and one FMA instead of four of each. Loop order: blocks of
    /// [`GROUPS_PER_BLOCK`] four-record groups outside; inside, panels of
    /// [`PANEL`] weight rows are decoded once (to 32 bytes and an f32 scale
    /// per block) and reused by every group of the block, so decoding costs
    /// 1/64 of what it did when each group decoded the rows again. The
    /// record scales and `OFF · Σv` corrections are built once per group.
    /// Leftover records (< 4) go through [`multi`] with the signed decoder
    /// `signed`. With `OFF > 0`, `decode` gives unsigned weights (value +
    /// `OFF`, as in the decode kernels) and `OFF · Σv` (per record and
    /// block, folded the same way) is subtracted in the integer domain: no
    /// sign instructions per record. The arithmetic per (row, record) — the
    /// integer dots, the fold, the scale product and the FMA order over
    /// blocks — does not depend on the loop order, so results do not
    /// depend on `nr`, `n` or the panel a row falls in.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn gemm<const OFF: i8, B, D, S>(
        rows: &[u8],
        row_bytes: usize,
        nr: usize,
        acts: &[u8],
        stride: usize,
        n: usize,
        out: &mut [f32],
        decode: D,
        signed: S,
    ) where
        B: crate::block::Block,
        D: Fn(&B) -> (__m256i, [u8; 2]) + Copy,
        S: Fn(&B) -> (__m256i, [u8; 2]) + Copy,
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
        let groups = n / 4;
        let gpb = GROUPS_PER_BLOCK.min(groups.max(1));
        let mut dyv: Vec<__m256> = Vec::with_capacity(gpb * nb);
        let mut corr: Vec<__m256i> = Vec::with_capacity(gpb * nb);
        let mut panel = Panel {
            w: vec![_mm256_setzero_si256(); PANEL * nb],
            dx: vec![0f32; PANEL * nb],
        };
        let store = |out: &mut [f32], r: usize, t0: usize, acc: __m256| {
            let s = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
            let mut v = [0f32; 4];
            // SAFETY: `v` is 4 writable f32.
            unsafe { _mm_storeu_ps(v.as_mut_ptr(), s) };
            for (j, &x) in v.iter().enumerate() {
                out[(t0 + j) * nr + r] = x;
            }
        };
        let mut g0 = 0;
        while g0 < groups {
            let g1 = (g0 + gpb).min(groups);
            dyv.clear();
            corr.clear();
            for g in g0..g1 {
                let ys = records::<4>(acts, stride, g * 4, 4, nb);
                dyv.extend((0..nb).map(|i| {
                    let d: [f32; 4] =
                        core::array::from_fn(|t| f16[u16::from_le_bytes(ys[t][i].d) as usize]);
                    _mm256_setr_ps(d[0], d[1], d[2], d[3], d[0], d[1], d[2], d[3])
                }));
                if OFF != 0 {
                    // `OFF · Σv` per record and block, folded like the dots.
                    corr.extend((0..nb).map(|i| {
                        let c: [__m256i; 4] = core::array::from_fn(|t| {
                            // SAFETY: `qs` is 32 readable bytes.
                            let v = unsafe { load32(ys[t][i].qs.as_ptr().cast()) };
                            _mm256_madd_epi16(_mm256_maddubs_epi16(off, v), ones)
                        });
                        _mm256_hadd_epi32(
                            _mm256_hadd_epi32(c[0], c[1]),
                            _mm256_hadd_epi32(c[2], c[3]),
                        )
                    }));
                }
            }
            let mut r = 0;
            while r < nr {
                let pr = PANEL.min(nr - r);
                panel.fill(&row, r, pr, nb, decode);
                for g in g0..g1 {
                    let ys = records::<4>(acts, stride, g * 4, 4, nb);
                    let k = (g - g0) * nb;
                    let (dy, cr) = (
                        &dyv[k..k + nb],
                        if OFF != 0 { &corr[k..k + nb] } else { &[][..] },
                    );
                    match pr {
                        4 => {
                            let acc = panel_tile::<4, OFF>(&panel, nb, &ys, dy, cr);
                            (0..4).for_each(|j| store(out, r + j, g * 4, acc[j]));
                        }
                        3 => {
                            let acc = panel_tile::<3, OFF>(&panel, nb, &ys, dy, cr);
                            (0..3).for_each(|j| store(out, r + j, g * 4, acc[j]));
                        }
                        2 => {
                            let acc = panel_tile::<2, OFF>(&panel, nb, &ys, dy, cr);
                            (0..2).for_each(|j| store(out, r + j, g * 4, acc[j]));
                        }
                        _ => {
                            let acc = panel_tile::<1, OFF>(&panel, nb, &ys, dy, cr);
                            store(out, r, g * 4, acc[0]);
                        }
                    }
                }
                r += pr;
            }
            g0 = g1;
        }
        let t0 = groups * 4;
        if t0 < n {
            let g = n - t0;
            let mut tmp = [0f32; 4];
            for r in 0..nr {
                multi(row(r), &acts[t0 * stride..], stride, &mut tmp[..g], signed);
                for (j, &x) in tmp[..g].iter().enumerate() {
                    out[(t0 + j) * nr + r] = x;
                }
            }
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
            D: Fn(&B) -> (__m256i, [u8; 2]),
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

    /// The first `R` rows of a decoded panel against one four-record group
    /// of [`gemm`]: per row the 8-lane accumulator whose lanes `t` and
    /// `t + 4` sum to record `t`'s dot.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn panel_tile<const R: usize, const OFF: i8>(
        panel: &Panel,
        nb: usize,
        ys: &[&[BlockQ80]; 4],
        dyv: &[__m256],
        corr: &[__m256i],
    ) -> [__m256; R] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); R];
        for i in 0..nb {
            // SAFETY: `qs` is 32 readable bytes.
            let v: [__m256i; 4] =
                core::array::from_fn(|t| unsafe { load32(ys[t][i].qs.as_ptr().cast()) });
            for (r, a) in acc.iter_mut().enumerate() {
                let w = panel.w[i * PANEL + r];
                let ax = if OFF != 0 { w } else { _mm256_sign_epi8(w, w) };
                let p: [__m256i; 4] = core::array::from_fn(|t| {
                    let vr = if OFF != 0 {
                        v[t]
                    } else {
                        _mm256_sign_epi8(v[t], w)
                    };
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, vr), ones)
                });
                let mut h =
                    _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
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
        let (u, d) = (
            |a: &BlockQ50| decode_q5_0_u(a),
            |a: &BlockQ50| decode_q5_0(a),
        );
        gemm::<16, _, _, _>(rows, row_bytes, nr, acts, stride, n, out, u, d)
    }

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
        gemm::<0, _, _, _>(rows, row_bytes, nr, acts, stride, n, out, d, d)
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
        let (u, d) = (
            |a: &BlockQ40| decode_q4_0_u(a),
            |a: &BlockQ40| decode_q4_0(a),
        );
        gemm::<8, _, _, _>(rows, row_bytes, nr, acts, stride, n, out, u, d)
    }

    macro_rules! entry {
        ($dot:ident, $multi:ident, $blk:ty, $decode:ident) => {
            #[target_feature(enable = "avx2,fma,f16c")]
            pub fn $dot(row: &[u8], act: &[u8]) -> f32 {
                let x = cast_blocks::<$blk>(row);
                let y = cast_blocks::<BlockQ80>(act);
                let [r] = tile::<1, _, _>(x, [y], |a: &$blk| $decode(a));
                r
            }

            #[target_feature(enable = "avx2,fma,f16c")]
            pub fn $multi(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
                multi(cast_blocks::<$blk>(row), acts, stride, out, |a: &$blk| {
                    $decode(a)
                })
            }
        };
    }

    entry!(dot_q8_0, multi_q8_0, BlockQ80, decode_q8_0);
    entry!(dot_q5_0, multi_q5_0, BlockQ50, decode_q5_0);
    entry!(dot_q4_0, multi_q4_0, BlockQ40, decode_q4_0);
}

macro_rules! dispatch {
    ($dot:ident, $avx_dot:ident, $multi:ident, $blk:ty, $reference:path) => {
        /// The AVX2 tile with one record, else the scalar reference.
        pub fn $dot(row: &[u8], act: &[u8]) -> f32 {
            #[cfg(target_arch = "x86_64")]
            if super::x86::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
                return unsafe { avx2::$avx_dot(row, act) };
            }
            $reference(row, act)
        }

        /// The AVX2 tile over all records, else the reference per record.
        pub fn $multi(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]) {
            #[cfg(target_arch = "x86_64")]
            if super::x86::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
                return unsafe { avx2::$multi(row, acts, stride, out) };
            }
            let len = row.len() / core::mem::size_of::<$blk>() * core::mem::size_of::<BlockQ80>();
            check_multi(acts, stride, len, out.len());
            for (t, o) in out.iter_mut().enumerate() {
                *o = $reference(row, &acts[t * stride..t * stride + len]);
            }
        }
    };
}

dispatch!(
    dot_q8_0_fast,
    dot_q8_0,
    multi_q8_0,
    BlockQ80,
    super::q8_0::dot_q8_0_ref
);
dispatch!(
    dot_q5_0_fast,
    dot_q5_0,
    multi_q5_0,
    super::q5::BlockQ50,
    super::q5::dot_q5_0_ref
);
dispatch!(
    dot_q4_0_fast,
    dot_q4_0,
    multi_q4_0,
    super::q4::BlockQ40,
    super::q4::dot_q4_0_ref
);

/// Several weight rows against one activation record (decode): `out[r] =
/// dot(rows[r * row_bytes..][..row_bytes], act)`.
pub type DotRowsFn = fn(rows: &[u8], row_bytes: usize, act: &[u8], out: &mut [f32]);

macro_rules! rows_dispatch {
    ($name:ident, $avx:ident, $reference:path) => {
        /// The AVX2 multi-row kernel (four rows share each activation
        /// block), else the reference per row.
        pub fn $name(rows: &[u8], row_bytes: usize, act: &[u8], out: &mut [f32]) {
            assert!(rows.len() >= out.len() * row_bytes, "dot_rows: row bytes");
            #[cfg(target_arch = "x86_64")]
            if super::x86::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
                return unsafe { avx2::$avx(rows, row_bytes, act, out) };
            }
            for (r, o) in out.iter_mut().enumerate() {
                *o = $reference(&rows[r * row_bytes..(r + 1) * row_bytes], act);
            }
        }
    };
}

rows_dispatch!(rows_q8_0_fast, rows_q8_0, super::q8_0::dot_q8_0_ref);
rows_dispatch!(rows_q5_0_fast, rows_q5_0, super::q5::dot_q5_0_ref);
rows_dispatch!(rows_q4_0_fast, rows_q4_0, super::q4::dot_q4_0_ref);

/// `nr` weight rows × `n` activation records (any `n`), token-major: `out[t * nr + r] =
/// dot(rows[r * row_bytes..][..row_bytes], acts[t * stride..][..act_len])`.
pub type GemmFn = fn(
    rows: &[u8],
    row_bytes: usize,
    nr: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
);

/// The portable GEMM: the multi kernel per row, in groups of at most
/// [`MULTI_MAX`] records, into the token-major output of [`GemmFn`].
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_by_rows(
    rows: &[u8],
    row_bytes: usize,
    nr: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
    out: &mut [f32],
    multi: fn(&[u8], &[u8], usize, &mut [f32]),
) {
    assert!(out.len() >= nr * n, "gemm: output");
    for r in 0..nr {
        let row = &rows[r * row_bytes..(r + 1) * row_bytes];
        let mut t0 = 0;
        while t0 < n {
            let g = (n - t0).min(MULTI_MAX);
            let mut tmp = [0f32; MULTI_MAX];
            multi(row, &acts[t0 * stride..], stride, &mut tmp[..g]);
            for (j, &x) in tmp[..g].iter().enumerate() {
                out[(t0 + j) * nr + r] = x;
            }
            t0 += g;
        }
    }
}

/// A [`GemmFn`] named `$name`: the AVX2 kernel `avx2::$avx` of the calling
/// module, else [`gemm_by_rows`] over `$multi`.
macro_rules! gemm_dispatch {
    ($name:ident, $avx:ident, $multi:ident) => {
        /// The AVX2 GEMM kernel, else the multi kernel per row.
        pub fn $name(
            rows: &[u8],
            row_bytes: usize,
            nr: usize,
            acts: &[u8],
            stride: usize,
            n: usize,
            out: &mut [f32],
        ) {
            #[cfg(target_arch = "x86_64")]
            if crate::legacy::x86::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2, FMA and F16C (checked just above).
                return unsafe { avx2::$avx(rows, row_bytes, nr, acts, stride, n, out) };
            }
            crate::legacy::multi::gemm_by_rows(rows, row_bytes, nr, acts, stride, n, out, $multi)
        }
    };
}
pub(crate) use gemm_dispatch;

gemm_dispatch!(gemm_q8_0_fast, gemm_q8_0, multi_q8_0);
gemm_dispatch!(gemm_q5_0_fast, gemm_q5_0, multi_q5_0);
gemm_dispatch!(gemm_q4_0_fast, gemm_q4_0, multi_q4_0);

/// The GEMM kernel of `ty` (prompt processing), if it has one.
///
/// Q8_0 weights keep the [`multi_q8_0`] tile: `gemm_q8_0_fast` is 14%
/// faster in kbench but sums in another f32 order, and on the tiny
/// Qwen3-Next Q8_0 fixture that moved one activation across a Q8_0
/// rounding boundary at token 2 (`fixture_parity`'s
/// `quantized_layers_match_llama_cpp` wants llama.cpp's values for all 8
/// tokens there). The demo model's only Q8_0 matrix is the head, which
/// prompt processing runs for the last token only.
pub fn gemm_fn(ty: redlite_gguf::GgmlType) -> Option<GemmFn> {
    use redlite_gguf::GgmlType as T;
    Some(match ty {
        T::Q5_0 => gemm_q5_0_fast,
        T::Q4_0 => gemm_q4_0_fast,
        T::Q4_K => crate::kquants::multi::gemm_q4_k_fast,
        T::Q6_K => crate::kquants::multi::gemm_q6_k_fast,
        _ => return None,
    })
}

/// The multi-row decode kernel of `ty`, if it has one.
pub fn dot_rows_fn(ty: redlite_gguf::GgmlType) -> Option<DotRowsFn> {
    use redlite_gguf::GgmlType as T;
    Some(match ty {
        T::Q8_0 => rows_q8_0_fast,
        T::Q5_0 => rows_q5_0_fast,
        T::Q4_0 => rows_q4_0_fast,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlite_gguf::GgmlType;

    /// The GEMM kernels against the scalar reference per (row, record):
    /// exact integer block dots, f32 accumulation order only (bound 1e-5 ·
    /// Σ|w·a| over the dequantized values). Records 1..=11 cover the
    /// four-record groups and the leftover path; rows 1..=5.
    #[test]
    fn gemm_matches_reference() {
        let mut seed = 23u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let cols = 32 * 28;
        let fs: [(GgmlType, GemmFn); 3] = [
            (GgmlType::Q8_0, gemm_q8_0_fast),
            (GgmlType::Q5_0, gemm_q5_0_fast),
            (GgmlType::Q4_0, gemm_q4_0_fast),
        ];
        for (ty, f) in fs {
            let k = crate::kernels(ty).unwrap();
            for (nr, n) in [
                (1usize, 1usize),
                (3, 4),
                (5, 7),
                (2, 8),
                (4, 11),
                (9, 70),
                (6, 133),
            ] {
                let w: Vec<f32> = (0..nr * cols).map(|_| next()).collect();
                let mut wb = vec![0u8; ty.bytes_for((nr * cols) as u64).unwrap() as usize];
                crate::quantize(ty, &w, &mut wb).unwrap();
                let rb = wb.len() / nr;
                let acts: Vec<Vec<u8>> = (0..n)
                    .map(|_| {
                        let x: Vec<f32> = (0..cols).map(|_| next() * 2.0).collect();
                        crate::quantize_activations(ty, &x).unwrap()
                    })
                    .collect();
                let stride = acts[0].len() + 6;
                let mut flat = vec![0u8; n * stride];
                for (t, a) in acts.iter().enumerate() {
                    flat[t * stride..t * stride + a.len()].copy_from_slice(a);
                }
                let mut out = vec![0f32; nr * n];
                f(&wb, rb, nr, &flat, stride, n, &mut out);
                let mut deq = vec![0f32; cols];
                let mut adeq = vec![0f32; cols];
                for r in 0..nr {
                    let row = &wb[r * rb..(r + 1) * rb];
                    crate::dequantize(ty, row, &mut deq).unwrap();
                    for (t, a) in acts.iter().enumerate() {
                        crate::dequantize(GgmlType::Q8_0, a, &mut adeq).unwrap();
                        let want = (k.dot_reference)(row, a);
                        let mag: f32 = deq.iter().zip(&adeq).map(|(a, b)| (a * b).abs()).sum();
                        let e = (out[t * nr + r] - want).abs();
                        assert!(e <= mag * 1e-5 + 1e-6, "{ty} {nr}x{n} ({r},{t}): {e}");
                    }
                }
            }
        }
    }

    /// The multi-row kernels against the scalar reference per row: the
    /// integer block dots are exact in both, so the difference is f32
    /// accumulation order only (bound: 1e-5 · Σ|block terms|, checked as
    /// 1e-5 · Σ|w|·|a| over the dequantized values). Row counts 1..=9
    /// cover the four-row groups and the remainder.
    #[test]
    fn dot_rows_match_reference() {
        let mut seed = 17u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let cols = 32 * 28;
        for ty in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0] {
            let f = dot_rows_fn(ty).unwrap();
            let k = crate::kernels(ty).unwrap();
            for nrows in 1..=9usize {
                let w: Vec<f32> = (0..nrows * cols).map(|_| next()).collect();
                let mut wb = vec![0u8; ty.bytes_for((nrows * cols) as u64).unwrap() as usize];
                crate::quantize(ty, &w, &mut wb).unwrap();
                let x: Vec<f32> = (0..cols).map(|_| next() * 3.0).collect();
                let act = crate::quantize_activations(ty, &x).unwrap();
                let rb = wb.len() / nrows;
                let mut out = vec![0f32; nrows];
                f(&wb, rb, &act, &mut out);
                let mut deq = vec![0f32; cols];
                let mut adeq = vec![0f32; cols];
                crate::dequantize(GgmlType::Q8_0, &act, &mut adeq).unwrap();
                for r in 0..nrows {
                    let row = &wb[r * rb..(r + 1) * rb];
                    let want = (k.dot_reference)(row, &act);
                    crate::dequantize(ty, row, &mut deq).unwrap();
                    let mag: f32 = deq.iter().zip(&adeq).map(|(a, b)| (a * b).abs()).sum();
                    let e = (out[r] - want).abs();
                    assert!(
                        e <= mag * 1e-5 + 1e-6,
                        "{ty} rows {nrows} row {r}: {e} vs {mag}"
                    );
                }
            }
        }
    }
}
