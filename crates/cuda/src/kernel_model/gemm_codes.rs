//! Host model of the prefill GEMM's f16 decode of the integer-coded formats
//! (`codes_h2` in `kernels/gemm_common.cuh`, and each format's `dec8h`:
//! Q8_0, Q5_0, Q4_K, Q5_K, Q6_K), word for word, checked against
//! `redlite_quant`'s dequantization. The fragments hold `GEMM_SCALE` times
//! the weights so that small block scales stay normal f16 numbers; the
//! GEMM's store divides by it.

use crate::layout::layout;
use crate::testdata::{random_weights, Rng};
use half::f16;
use redlite_gguf::GgmlType;

/// `GEMM_SCALE` in gemm_common.cuh.
const GEMM_SCALE: f32 = 16.0;

fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let b = (x as u64) | ((y as u64) << 32);
    (0..4).fold(0, |acc, k| {
        let sel = (s >> (4 * k)) & 7;
        acc | ((((b >> (8 * sel)) & 0xff) as u32) << (8 * k))
    })
}

fn word(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `pack_h2(v, v)`: cvt.rn.f16x2.f32, both halves the same.
fn splat(v: f32) -> u32 {
    let h = f16::from_f32(v).to_bits() as u32;
    h | (h << 16)
}

/// `codes_h2`, word for word: each byte pair under the high byte 0x64 by
/// PRMT (f16 1024 + code), `sub.rn.f16x2` of 1024 + off (exact), then
/// `fma.rn.f16x2` with the scale and the shift (one rounding: the f64
/// product and sum of two f16 numbers and an integer under 256 are exact).
fn codes_h2(q0: u32, q1: u32, bias2: u32, s2: u32, t2: u32) -> [f32; 8] {
    let lane = |x: u32, i: usize| f16::from_bits((x >> (16 * i)) as u16).to_f64();
    let mut out = [0f32; 8];
    for w in 0..4 {
        let sel = if w & 1 == 1 { 0x4342 } else { 0x4140 };
        let biased = byte_perm(if w < 2 { q0 } else { q1 }, 0x6464_6464, sel);
        for i in 0..2 {
            let mag = f16::from_f64(lane(biased, i) - lane(bias2, i));
            out[2 * w + i] = f16::from_f64(mag.to_f64() * lane(s2, i) + lane(t2, i)).to_f32();
        }
    }
    out
}

/// Three roundings (the scale, the shift, the result) to f16 at 2^-11 each,
/// and f16's subnormal spacing 2^-24 for each of the code's multiples of a
/// subnormal scale; all in the fragments' units, GEMM_SCALE times the
/// weights'.
fn assert_fragment(got: f32, want: f32, code: f32, scale: f32, shift: f32, what: &str) {
    let tol = ((code * scale).abs() + shift.abs() + (want * GEMM_SCALE).abs()) / 2048.0
        + (code.abs() + 2.0) / (1u32 << 24) as f32;
    let err = (got - want * GEMM_SCALE).abs();
    assert!(
        err <= tol,
        "{what}: {got} vs {} (error {err:e} over {tol:e})",
        want * GEMM_SCALE
    );
}

fn dequant(ty: GgmlType, blk: &[u8]) -> Vec<f32> {
    let mut w = vec![0f32; ty.block_size()];
    redlite_cpu::matmul::dequantize_into(ty, blk, &mut w).unwrap();
    w
}

fn blocks(ty: GgmlType, seed: u64) -> Vec<u8> {
    let l = layout(ty).unwrap();
    random_weights(&l, 4, 16 * ty.block_size(), &mut Rng(seed))
}

/// The 6-bit scale and minimum of sub-block j (Q4_K and Q5_K: `scale_min_k4`,
/// `scale_min_k5`).
fn scale_min(blk: &[u8], j: usize) -> (u32, u32) {
    let (s0, s1, s2) = (word(blk, 4), word(blk, 8), word(blk, 12));
    let by = |w: u32, k: usize| (w >> (8 * k)) & 0xff;
    if j < 4 {
        (by(s0, j) & 63, by(s1, j) & 63)
    } else {
        let k = j - 4;
        (
            (by(s2, k) & 15) | ((by(s0, k) >> 6) << 4),
            (by(s2, k) >> 4) | ((by(s1, k) >> 6) << 4),
        )
    }
}

/// The 4-bit `bits_to_b4` of common.cuh: bit i of the nibble to bit 4 of
/// byte i.
fn bits_to_b4(nib: u32) -> u32 {
    ((nib.wrapping_mul(0x0020_4081)) & 0x0101_0101) << 4
}

#[test]
fn q8_0_f16_fragments_match_the_cpu() {
    let ty = GgmlType::Q8_0;
    let g = blocks(ty, 21);
    for blk in g.chunks_exact(34) {
        let want = dequant(ty, blk);
        let s = GEMM_SCALE * f16_at(blk, 0);
        for r in 0..4 {
            let (q0, q1) = (
                word(blk, 2 + 8 * r) ^ 0x8080_8080,
                word(blk, 6 + 8 * r) ^ 0x8080_8080,
            );
            let got = codes_h2(q0, q1, 0x6480_6480, splat(s), 0);
            for (k, v) in got.into_iter().enumerate() {
                let code = blk[2 + 8 * r + k] as i8 as f32;
                assert_fragment(
                    v,
                    want[8 * r + k],
                    code,
                    s,
                    0.0,
                    &format!("q8_0 value {}", 8 * r + k),
                );
            }
        }
    }
}

#[test]
fn q5_0_f16_fragments_match_the_cpu() {
    let ty = GgmlType::Q5_0;
    let g = blocks(ty, 22);
    for blk in g.chunks_exact(22) {
        let want = dequant(ty, blk);
        let (s, qh) = (GEMM_SCALE * f16_at(blk, 0), word(blk, 2));
        for r in 0..4 {
            let hi = r >> 1;
            let q: [u32; 2] = core::array::from_fn(|ww| {
                let w = 2 * (r & 1) + ww;
                let qw = word(blk, 6 + 4 * w);
                ((if hi == 1 { qw >> 4 } else { qw }) & 0x0f0f_0f0f)
                    | bits_to_b4((qh >> (16 * hi + 4 * w)) & 15)
            });
            let got = codes_h2(q[0], q[1], 0x6410_6410, splat(s), 0);
            for (k, v) in got.into_iter().enumerate() {
                let code = ((q[k / 4] >> (8 * (k % 4))) & 0xff) as f32 - 16.0;
                assert_fragment(
                    v,
                    want[8 * r + k],
                    code,
                    s,
                    0.0,
                    &format!("q5_0 value {}", 8 * r + k),
                );
            }
        }
    }
}

/// Q4_K and Q5_K: sub-block pair c = sub / 2, bytes l0 = 16 (sub % 2) of
/// the pair's 32; run r < 2 the low nibbles (sub-block 2c), r >= 2 the high
/// ones (2c + 1); column `64 c + l0 + (i < 16 ? i : 16 + i)` for value i.
fn check_k_quant(ty: GgmlType, bpb: usize, seed: u64) {
    let g = blocks(ty, seed);
    let five = ty == GgmlType::Q5_K;
    for blk in g.chunks_exact(bpb) {
        let want = dequant(ty, blk);
        let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
        for sub in 0..8 {
            let (c, l0) = (sub >> 1, (sub & 1) * 16);
            for r in 0..4 {
                let hi = r >> 1;
                let (sc, mn) = scale_min(blk, 2 * c + hi);
                let a = GEMM_SCALE * d * sc as f32;
                let b = GEMM_SCALE * dmin * mn as f32;
                let qs_at = if five { 48 } else { 16 } + 32 * c + l0 + 8 * (r & 1);
                let q: [u32; 2] = core::array::from_fn(|w| {
                    let qw = word(blk, qs_at + 4 * w);
                    let nib = (if hi == 1 { qw >> 4 } else { qw }) & 0x0f0f_0f0f;
                    if five {
                        let hw = word(blk, 16 + l0 + 8 * (r & 1) + 4 * w);
                        nib | (((hw >> (2 * c + hi)) & 0x0101_0101) << 4)
                    } else {
                        nib
                    }
                });
                let got = codes_h2(q[0], q[1], 0x6400_6400, splat(a), splat(-b));
                for (k, v) in got.into_iter().enumerate() {
                    let i = 8 * r + k;
                    let col = 64 * c + l0 + if i < 16 { i } else { 16 + i };
                    let code = ((q[k / 4] >> (8 * (k % 4))) & 0xff) as f32;
                    assert_fragment(
                        v,
                        want[col],
                        code,
                        a,
                        b,
                        &format!("{ty:?} sub {sub} value {i}"),
                    );
                }
            }
        }
    }
}

#[test]
fn q4_k_f16_fragments_match_the_cpu() {
    check_k_quant(GgmlType::Q4_K, 144, 23);
}

#[test]
fn q5_k_f16_fragments_match_the_cpu() {
    check_k_quant(GgmlType::Q5_K, 176, 24);
}

#[test]
fn q6_k_f16_fragments_match_the_cpu() {
    let ty = GgmlType::Q6_K;
    let g = blocks(ty, 25);
    for blk in g.chunks_exact(210) {
        let want = dequant(ty, blk);
        let d = f16_at(blk, 208);
        for sub in 0..8 {
            let (h, l0) = (sub >> 2, (sub & 3) * 8);
            for j in 0..4 {
                let si = 2 * j + (l0 >> 4);
                let sw = word(blk, 192 + 8 * h + 4 * (si >> 2));
                let ds = GEMM_SCALE * d * ((sw >> (8 * (si & 3))) & 0xff) as u8 as i8 as f32;
                let shift = if j < 2 { 0 } else { 4 };
                let q: [u32; 2] = core::array::from_fn(|half| {
                    let lw = word(blk, 64 * h + 32 * (j & 1) + l0 + 4 * half);
                    let hw = word(blk, 128 + 32 * h + l0 + 4 * half);
                    ((lw >> shift) & 0x0f0f_0f0f) | (((hw >> (2 * j)) & 0x0303_0303) << 4)
                });
                let got = codes_h2(q[0], q[1], 0x6420_6420, splat(ds), 0);
                for (k, v) in got.into_iter().enumerate() {
                    let col = 128 * h + 32 * j + l0 + k;
                    let code = ((q[k / 4] >> (8 * (k % 4))) & 0xff) as f32 - 32.0;
                    assert_fragment(
                        v,
                        want[col],
                        code,
                        ds,
                        0.0,
                        &format!("q6_k sub {sub} run {j} value {k}"),
                    );
                }
            }
        }
    }
}

/// The reason for GEMM_SCALE: a Q8_0 block whose weights are all under
/// 7.7e-3 has a scale under f16's smallest normal number (6.1e-5); times
/// 16 it stays normal down to 3.8e-6, and its fragments keep f16's 11 bits.
#[test]
fn small_q8_0_scales_keep_full_precision() {
    for d in [5.0e-5f32, 1.0e-5, 4.0e-6] {
        let dh = f16::from_f32(d).to_f32();
        let mut blk = vec![0u8; 34];
        blk[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        for (i, b) in blk[2..].iter_mut().enumerate() {
            *b = (i as i32 * 37 % 255 - 127) as i8 as u8;
        }
        let want = dequant(GgmlType::Q8_0, &blk);
        let got = codes_h2(
            word(&blk, 2) ^ 0x8080_8080,
            word(&blk, 6) ^ 0x8080_8080,
            0x6480_6480,
            splat(16.0 * dh),
            0,
        );
        for (k, v) in got.into_iter().enumerate() {
            let err = (v / GEMM_SCALE - want[k]).abs();
            assert!(
                err <= want[k].abs() / 1024.0,
                "d {d}: value {k} {v} vs {} ({err:e})",
                want[k]
            );
        }
    }
}
