//! Dot products of the i-quant formats and MXFP4 with quantized
//! activations.
//!
//! 1. The scalar reference against an f64 dot of the dequantized row and the
//!    dequantized activations. Tolerance: `(nb + 5) · 2^-23 · Σ|w_i·a_i|`
//!    for `nb` blocks. Why: the reference sums each block exactly in i32 and
//!    then rounds four times per block in f32 (`d_w·d_a`, the i32→f32
//!    conversion, the product, the running sum: at most `(nb + 3)` unit
//!    roundings of 2^-24 relative to `Σ|w_i·a_i|`), and the dequantized f32
//!    weights themselves carry at most two roundings each; 2^-23 is twice
//!    the unit roundoff, a factor-two margin over that first-order bound.
//! 2. The AVX2 path against the reference: tolerance 0 (bit-identical).
//!    Why: the SIMD code computes the same exact per-block i32 sum and then
//!    performs the same scalar f32 operations in the same order.
//!
//! Activations are random Q8_0/Q8_K bytes with values in -127..=127 (the
//! range the activation quantizers produce; the IQ2/IQ3 AVX2 paths rely on
//! it), plus, where available, the crate's own activation quantizers.

use redlite_quant::{dequantize, kernels, quantize_activations, GgmlType};

const TYPES: &[GgmlType] = &[
    GgmlType::IQ1_S,
    GgmlType::IQ1_M,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ2_S,
    GgmlType::IQ3_XXS,
    GgmlType::IQ3_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

/// xorshift64* generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Finite f16 of magnitude 2^-8 .. 1, random sign.
    fn moderate_f16(&mut self) -> u16 {
        let mag = (2f64).powf(-8.0 * self.unit());
        let v = if self.next() & 1 == 0 { mag } else { -mag };
        half::f16::from_f64(v).to_bits()
    }
}

/// `nb` random valid blocks of `ty`.
fn random_row(ty: GgmlType, nb: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut row: Vec<u8> = (0..nb * ts).map(|_| rng.next() as u8).collect();
    for b in row.chunks_exact_mut(ts) {
        match ty {
            GgmlType::MXFP4 => b[0] = 118 + (rng.next() % 16) as u8,
            GgmlType::IQ1_M => {
                let h = rng.moderate_f16();
                for k in 0..4 {
                    let o = 48 + 2 * k;
                    let w = u16::from_le_bytes([b[o], b[o + 1]]);
                    let w = (w & 0x0FFF) | ((h >> (4 * k)) & 0xF) << 12;
                    b[o..o + 2].copy_from_slice(&w.to_le_bytes());
                }
            }
            _ => b[..2].copy_from_slice(&rng.moderate_f16().to_le_bytes()),
        }
    }
    row
}

/// Random activations in the format `ty` takes, with values from `val`.
fn random_act(
    ty: GgmlType,
    n: usize,
    rng: &mut Rng,
    val: &mut dyn FnMut(&mut Rng) -> i8,
) -> Vec<u8> {
    let k = kernels(ty).unwrap();
    let mut out = Vec::new();
    match k.vec_dot_type {
        GgmlType::Q8_K => {
            for _ in 0..n / 256 {
                let d = (0.001 + 0.05 * rng.unit()) as f32
                    * if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
                let qs: Vec<i8> = (0..256).map(|_| val(rng)).collect();
                out.extend_from_slice(&d.to_le_bytes());
                out.extend(qs.iter().map(|&q| q as u8));
                for g in qs.chunks_exact(16) {
                    let s: i32 = g.iter().map(|&q| q as i32).sum();
                    out.extend_from_slice(&(s as i16).to_le_bytes());
                }
            }
        }
        GgmlType::Q8_0 => {
            for _ in 0..n / 32 {
                out.extend_from_slice(&rng.moderate_f16().to_le_bytes());
                out.extend((0..32).map(|_| val(rng) as u8));
            }
        }
        other => panic!("unexpected activation type {other}"),
    }
    out
}

/// Dequantized activations in f64.
fn act_values(act_ty: GgmlType, act: &[u8]) -> Vec<f64> {
    let mut v = Vec::new();
    match act_ty {
        GgmlType::Q8_K => {
            for b in act.chunks_exact(292) {
                let d = f32::from_le_bytes(b[..4].try_into().unwrap()) as f64;
                v.extend(b[4..260].iter().map(|&q| d * q as i8 as f64));
            }
        }
        GgmlType::Q8_0 => {
            for b in act.chunks_exact(34) {
                let d = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f64();
                v.extend(b[2..].iter().map(|&q| d * q as i8 as f64));
            }
        }
        other => panic!("unexpected activation type {other}"),
    }
    v
}

/// (exact dot, Σ|w·a|) in f64 of the dequantized row and activations.
fn f64_dot(ty: GgmlType, row: &[u8], act: &[u8]) -> (f64, f64) {
    let n = row.len() / ty.type_size() * ty.block_size();
    let mut w = vec![0f32; n];
    dequantize(ty, row, &mut w).unwrap();
    let a = act_values(kernels(ty).unwrap().vec_dot_type, act);
    assert_eq!(a.len(), n);
    w.iter().zip(&a).fold((0.0, 0.0), |(s, m), (&w, &a)| {
        (s + w as f64 * a, m + (w as f64 * a).abs())
    })
}

fn lengths(ty: GgmlType) -> &'static [usize] {
    if ty.block_size() == 256 {
        &[1, 2, 3, 8, 17, 64]
    } else {
        &[1, 2, 7, 8, 33, 256]
    }
}

fn check_pair(ty: GgmlType, row: &[u8], act: &[u8], what: &str) {
    let k = kernels(ty).unwrap();
    let nb = row.len() / ty.type_size();
    let r = (k.dot_reference)(row, act);
    let (exact, mag) = f64_dot(ty, row, act);
    let tol = (nb as f64 + 5.0) * f32::EPSILON as f64 * mag;
    assert!(
        (r as f64 - exact).abs() <= tol,
        "{ty} {what} nb={nb}: reference {r:e} vs f64 {exact:e} (|diff| {:e} > tol {tol:e})",
        (r as f64 - exact).abs()
    );
    let f = (k.dot_fast)(row, act);
    assert_eq!(
        f.to_bits(),
        r.to_bits(),
        "{ty} {what} nb={nb}: fast {f:e} vs reference {r:e}"
    );
    // Through the checked entry point, at an odd byte offset.
    let mut rb = vec![0u8; row.len() + 1];
    rb[1..].copy_from_slice(row);
    let mut ab = vec![0u8; act.len() + 3];
    ab[3..].copy_from_slice(act);
    let g = redlite_quant::dot(ty, &rb[1..], &ab[3..]).unwrap();
    assert!(g.to_bits() == r.to_bits() || g.to_bits() == f.to_bits());
}

#[test]
fn iq_dot_reference_vs_f64_and_fast_vs_reference() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for &ty in TYPES {
        for &nb in lengths(ty) {
            for trial in 0..4 {
                let row = random_row(ty, nb, &mut rng);
                let n = nb * ty.block_size();
                let act = random_act(ty, n, &mut rng, &mut |r: &mut Rng| {
                    ((r.next() % 255) as i32 - 127) as i8
                });
                check_pair(ty, &row, &act, &format!("random #{trial}"));
            }
        }
    }
}

#[test]
fn iq_dot_extreme_values() {
    // Largest activations (±127) with all-zero, all-one and alternating
    // weight bytes: the pair sums closest to i16 saturation.
    let mut rng = Rng(42);
    for &ty in TYPES {
        let nb = 4;
        let n = nb * ty.block_size();
        for fill in [0x00u8, 0xFF, 0x55, 0xAA] {
            let mut row = random_row(ty, nb, &mut rng);
            let ts = ty.type_size();
            for b in row.chunks_exact_mut(ts) {
                let keep = match ty {
                    GgmlType::MXFP4 => 1,
                    GgmlType::IQ1_M => 0,
                    _ => 2,
                };
                for x in &mut b[keep..] {
                    *x = fill;
                }
                if ty == GgmlType::IQ1_M {
                    // Keep a moderate f16 in the top nibbles (0x3C00 = 1.0).
                    for (k, o) in (48..56).step_by(2).enumerate() {
                        let w = u16::from_le_bytes([b[o], b[o + 1]]);
                        let w = (w & 0x0FFF) | ((0x3C00u16 >> (4 * k)) & 0xF) << 12;
                        b[o..o + 2].copy_from_slice(&w.to_le_bytes());
                    }
                }
            }
            for sign in [1i8, -1] {
                let act = random_act(ty, n, &mut rng, &mut |_| 127 * sign);
                check_pair(
                    ty,
                    &row,
                    &act,
                    &format!("fill {fill:#04x} act {}", 127 * sign),
                );
                let act = random_act(ty, n, &mut rng, &mut |r: &mut Rng| {
                    if r.next() & 1 == 0 {
                        127
                    } else {
                        -127
                    }
                });
                check_pair(ty, &row, &act, &format!("fill {fill:#04x} act ±127"));
            }
        }
    }
}

#[test]
fn iq_dot_full_i8_range_where_supported() {
    // IQ1_*, IQ4_* and MXFP4 multiply with `|q| · sign(w, q)` and are exact
    // for every i8 activation, -128 included (the IQ2/IQ3 AVX2 paths need
    // -127..=127, which the activation quantizers guarantee).
    let mut rng = Rng(99);
    for ty in [
        GgmlType::IQ1_S,
        GgmlType::IQ1_M,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
        GgmlType::MXFP4,
    ] {
        for &nb in lengths(ty) {
            let row = random_row(ty, nb, &mut rng);
            let n = nb * ty.block_size();
            let act = random_act(ty, n, &mut rng, &mut |r: &mut Rng| r.next() as u8 as i8);
            check_pair(ty, &row, &act, "full i8 range");
            let act = random_act(ty, n, &mut rng, &mut |_| -128);
            check_pair(ty, &row, &act, "all -128");
        }
    }
}

#[test]
fn iq_dot_with_crate_activation_quantizers() {
    // Real activations from the crate's Q8_K / Q8_0 quantizers (skipped for a
    // format whose activation quantizer is not in this build yet).
    let mut rng = Rng(7);
    for &ty in TYPES {
        for &nb in &lengths(ty)[..4] {
            let n = nb * ty.block_size();
            let x: Vec<f32> = (0..n)
                .map(|i| ((rng.unit() - 0.5) * (1.0 + (i % 7) as f64)) as f32)
                .collect();
            let act = match quantize_activations(ty, &x) {
                Ok(a) => a,
                Err(e) => {
                    eprintln!("{ty}: skipped ({e})");
                    break;
                }
            };
            let row = random_row(ty, nb, &mut rng);
            check_pair(ty, &row, &act, "quantized activations");
        }
    }
}

#[test]
fn iq_kernel_table() {
    for &ty in TYPES {
        let k = kernels(ty).unwrap();
        assert_eq!(k.ty, ty);
        let want = if ty.block_size() == 32 {
            GgmlType::Q8_0
        } else {
            GgmlType::Q8_K
        };
        assert_eq!(k.vec_dot_type, want, "{ty}");
    }
    use redlite_quant::iquants::*;
    use std::mem::size_of;
    assert_eq!(size_of::<BlockIq1S>(), GgmlType::IQ1_S.type_size());
    assert_eq!(size_of::<BlockIq1M>(), GgmlType::IQ1_M.type_size());
    assert_eq!(size_of::<BlockIq2Xxs>(), GgmlType::IQ2_XXS.type_size());
    assert_eq!(size_of::<BlockIq2Xs>(), GgmlType::IQ2_XS.type_size());
    assert_eq!(size_of::<BlockIq2S>(), GgmlType::IQ2_S.type_size());
    assert_eq!(size_of::<BlockIq3Xxs>(), GgmlType::IQ3_XXS.type_size());
    assert_eq!(size_of::<BlockIq3S>(), GgmlType::IQ3_S.type_size());
    assert_eq!(size_of::<BlockIq4Nl>(), GgmlType::IQ4_NL.type_size());
    assert_eq!(size_of::<BlockIq4Xs>(), GgmlType::IQ4_XS.type_size());
    assert_eq!(size_of::<BlockMxfp4>(), GgmlType::MXFP4.type_size());
}
