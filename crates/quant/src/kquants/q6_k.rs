//! Q6_K: 6-bit values (4 low bits in `ql`, 2 high bits in `qh`) in 16
//! groups of 16 with signed 8-bit scales, times the f16 `d`.
//!
//! In half `h` (128 elements), element `128h + 32j + l` has its low nibble
//! in `ql[64h + l + 32·(j%2)]` (low nibble for j < 2, high for j ≥ 2) and
//! its high bits at `2j..2j+2` of `qh[32h + l]`; the value is `q - 32`.

use super::q8_k::{BlockQ8K, QK_K};
use super::quant_util::{make_qx_quants, nearest_int};
use crate::block::{cast_blocks, cast_blocks_mut, f16_le, f16_le_from, Block};

#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: [u8; 2],
}
const _: () = assert!(core::mem::size_of::<BlockQ6K>() == 210);
// SAFETY: `#[repr(C)]`, byte arrays only: alignment 1, no padding, every
// bit pattern valid.
unsafe impl Block for BlockQ6K {}

/// The unsigned 6-bit value (0..=63) of element `i`.
#[inline(always)]
fn q_at(b: &BlockQ6K, i: usize) -> u8 {
    let (h, j, l) = (i / 128, (i % 128) / 32, i % 32);
    let byte = b.ql[64 * h + l + 32 * (j % 2)];
    let lo = if j < 2 { byte & 0x0F } else { byte >> 4 };
    lo | (((b.qh[32 * h + l] >> (2 * j)) & 3) << 4)
}

pub fn dequantize_q6_k(src: &[u8], dst: &mut [f32]) {
    let blocks = cast_blocks::<BlockQ6K>(src);
    assert_eq!(dst.len(), blocks.len() * QK_K, "Q6_K: element count");
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (i, o) in y.iter_mut().enumerate() {
            let dl = d * b.scales[i / 16] as f32;
            *o = dl * (q_at(b, i) as i32 - 32) as f32;
        }
    }
}

/// Quantize like ggml's `quantize_row_q6_K_ref`: per group of 16 an
/// iterative scale search (`make_qx_quants`, x²-weighted), 8-bit group
/// scales relative to the largest, then values re-rounded against the
/// stored scales.
pub fn quantize_q6_k(src: &[f32], dst: &mut [u8]) {
    let blocks = cast_blocks_mut::<BlockQ6K>(dst);
    assert_eq!(src.len(), blocks.len() * QK_K, "Q6_K: element count");
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
        for g in 0..16 {
            let s = make_qx_quants(32, &x[16 * g..16 * g + 16], &mut l[16 * g..16 * g + 16]);
            scales[g] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        if max_abs_scale < super::quant_util::GROUP_MAX_EPS {
            *b = BlockQ6K {
                ql: [0; 128],
                qh: [0; 64],
                scales: [0; 16],
                d: [0; 2],
            };
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f16_le_from(1.0 / iscale);
        for (o, &s) in b.scales.iter_mut().zip(&scales) {
            *o = nearest_int(iscale * s).min(127) as i8;
        }
        let d = f16_le(b.d);
        for g in 0..16 {
            let dl = d * b.scales[g] as f32;
            if dl == 0.0 {
                continue;
            }
            for i in 16 * g..16 * g + 16 {
                l[i] = (nearest_int(x[i] / dl).clamp(-32, 31) + 32) as u8;
            }
        }
        for h in 0..2 {
            let lh = &l[128 * h..128 * h + 128];
            for i in 0..32 {
                b.ql[64 * h + i] = (lh[i] & 0x0F) | ((lh[i + 64] & 0x0F) << 4);
                b.ql[64 * h + 32 + i] = (lh[i + 32] & 0x0F) | ((lh[i + 96] & 0x0F) << 4);
                b.qh[32 * h + i] = (lh[i] >> 4)
                    | ((lh[i + 32] >> 4) << 2)
                    | ((lh[i + 64] >> 4) << 4)
                    | ((lh[i + 96] >> 4) << 6);
            }
        }
    }
}

pub fn dot_q6_k_ref(row: &[u8], act: &[u8]) -> f32 {
    let x = cast_blocks::<BlockQ6K>(row);
    let y = cast_blocks::<BlockQ8K>(act);
    assert_eq!(x.len(), y.len(), "Q6_K dot: block counts");
    let mut sum = 0f32;
    for (a, b) in x.iter().zip(y) {
        let mut isum = 0i32;
        for g in 0..16 {
            let gsum: i32 = (16 * g..16 * g + 16)
                .map(|i| (q_at(a, i) as i32 - 32) * b.qs[i] as i32)
                .sum();
            isum += a.scales[g] as i32 * gsum;
        }
        sum += f16_le(a.d) * b.d() * isum as f32;
    }
    sum
}

pub fn dot_q6_k_fast(row: &[u8], act: &[u8]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::legacy::x86::has_avx2_fma() {
        // SAFETY: the CPU supports AVX2 and FMA (checked just above).
        return unsafe { avx2::dot_q6_k(row, act) };
    }
    dot_q6_k_ref(row, act)
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::*;
    use crate::kquants::x86::*;
    use crate::legacy::x86::*;
    use core::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn dot_q6_k(row: &[u8], act: &[u8]) -> f32 {
        let x = cast_blocks::<BlockQ6K>(row);
        let y = cast_blocks::<BlockQ8K>(act);
        assert_eq!(x.len(), y.len(), "Q6_K dot: block counts");
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        let mut acc = _mm256_setzero_ps();
        for (a, b) in x.iter().zip(y) {
            // SAFETY: `scales` is 16 readable bytes, `bsums` 32.
            let (sc16, bs) = unsafe {
                (
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(a.scales.as_ptr().cast())),
                    load32(b.bsums.as_ptr()),
                )
            };
            // Σ_g sc_g·Σ(q - 32)·y = Σ_g sc_g·Σ q·y - 32·Σ_g sc_g·bsum_g.
            let off = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
            let mut isum = _mm256_sub_epi32(_mm256_setzero_si256(), off);
            for h in 0..2 {
                // SAFETY: `ql` holds 128 bytes (read at 64h and 64h + 32
                // <= 96), `qh` 64 (read at 32h <= 32).
                let (ql0, ql1, qh) = unsafe {
                    (
                        load32(a.ql.as_ptr().add(64 * h)),
                        load32(a.ql.as_ptr().add(64 * h + 32)),
                        load32(a.qh.as_ptr().add(32 * h)),
                    )
                };
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(ql0, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<4>(qh), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(ql1, m4),
                        _mm256_and_si256(_mm256_slli_epi16::<2>(qh), m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                        _mm256_and_si256(qh, m30),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                        _mm256_and_si256(_mm256_srli_epi16::<2>(qh), m30),
                    ),
                ];
                let sch = half_scales(sc16, h);
                for (j, &qj) in q.iter().enumerate() {
                    // SAFETY: `b.qs` holds 256 bytes; 32 are read at
                    // 128h + 32j <= 224.
                    let yv = unsafe { load32(b.qs.as_ptr().add(128 * h + 32 * j).cast()) };
                    let p = _mm256_maddubs_epi16(qj, yv);
                    isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, pair_scales(sch, j)));
                }
            }
            acc = _mm256_fmadd_ps(
                _mm256_set1_ps(f16c(a.d) * b.d()),
                _mm256_cvtepi32_ps(isum),
                acc,
            );
        }
        hsum_ps(acc)
    }
}
