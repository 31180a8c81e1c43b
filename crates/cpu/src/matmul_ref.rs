//! The reference matmul by ggml's definition of a quantized matmul.
//!
//! ggml (and so llama.cpp) never multiplies a quantized weight row with f32
//! activations: it first converts each activation row to the weight type's
//! `vec_dot_type` (`Q8_K` for K-quants and the 256-element IQ formats,
//! `Q8_0` for Q4_0/Q5_0/Q8_0/IQ4_NL/MXFP4, `F16` for F16 weights, `BF16`
//! for BF16 weights, nothing for F32), then dots the two. The function it
//! computes is therefore `Σ w_deq · a_deq`, where `a_deq` is the activation
//! after that round trip. [`matmul_reference_ggml`] computes exactly that
//! function, plainly: every weight row dequantized to f32, every activation
//! row converted to its `vec_dot_type` with the same quantizer the fast path
//! uses and decoded back (exactly, in f64), one f64 accumulation, one thread.
//! It differs from the fast path only by float rounding (the fast kernels
//! scale integer block sums in f32), which is what the model crate's
//! reference-vs-fast checks measure.
//!
//! Q4_1 and Q5_1 are the exception to "same function as ggml": ggml pairs
//! them with `Q8_1` (whose per-block sum is stored in f16), Red Lite with
//! `Q8_0`; the two differ by that f16 rounding of the block sum.

use crate::matmul::QMatrix;
use crate::CpuError;
use redlite_gguf::GgmlType;

/// The activation format ggml's CPU matmul converts activations to for
/// weights of `ty`.
pub fn activation_type(ty: GgmlType) -> Result<GgmlType, CpuError> {
    Ok(match ty {
        GgmlType::F32 => GgmlType::F32,
        GgmlType::F16 => GgmlType::F16,
        GgmlType::BF16 => GgmlType::BF16,
        _ => redlite_quant::kernels(ty)?.vec_dot_type,
    })
}

/// `x` rounded to f16 (round to nearest even), back to f32.
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// `x` rounded to bf16 as ggml's `GGML_FP32_TO_BF16` does (round to nearest
/// even; NaN kept quiet), back to f32.
pub fn round_bf16(x: f32) -> f32 {
    let u = x.to_bits();
    let b = if x.is_nan() {
        (u >> 16) | 64
    } else {
        (u + (0x7fff + ((u >> 16) & 1))) >> 16
    };
    f32::from_bits(b << 16)
}

/// The values ggml multiplies for one activation row `x` against weights
/// of `ty`: `x` converted to [`activation_type`]`(ty)` and decoded back,
/// exactly, into `out` (f64, so the decoded `d · q` is not rounded again).
pub fn activation_values(ty: GgmlType, x: &[f32], out: &mut [f64]) -> Result<(), CpuError> {
    if out.len() != x.len() {
        return Err(CpuError::Shape {
            what: "activation values",
            expected: x.len(),
            found: out.len(),
        });
    }
    let act = activation_type(ty)?;
    match act {
        GgmlType::F32 => out.iter_mut().zip(x).for_each(|(o, &v)| *o = v as f64),
        GgmlType::F16 => out
            .iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = round_f16(v) as f64),
        GgmlType::BF16 => out
            .iter_mut()
            .zip(x)
            .for_each(|(o, &v)| *o = round_bf16(v) as f64),
        GgmlType::Q8_0 | GgmlType::Q8_K => {
            let nbytes =
                act.bytes_for(x.len() as u64)
                    .ok_or(redlite_quant::QuantError::Unsupported(act))? as usize;
            let mut q = vec![0u8; nbytes];
            redlite_quant::quantize(act, x, &mut q)?;
            let (bs, ts) = (act.block_size(), act.type_size());
            for (blk, o) in q.chunks_exact(ts).zip(out.chunks_exact_mut(bs)) {
                // Q8_0: f16 scale then 32 i8; Q8_K: f32 scale, 256 i8, then
                // the 16 i16 group sums (not needed to decode).
                let (d, qs) = if act == GgmlType::Q8_0 {
                    let d = half::f16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
                    (d, &blk[2..2 + bs])
                } else {
                    (
                        f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
                        &blk[4..4 + bs],
                    )
                };
                for (v, &b) in o.iter_mut().zip(qs) {
                    *v = d as f64 * (b as i8) as f64;
                }
            }
        }
        other => return Err(redlite_quant::QuantError::Unsupported(other).into()),
    }
    Ok(())
}

/// `ys[t] = W · a(xs[t])` by ggml's definition (see the module docs): rows
/// dequantized to f32, activations through their `vec_dot_type` round trip,
/// f64 accumulation, one thread.
pub fn matmul_reference_ggml(
    w: &QMatrix,
    xs: &[f32],
    n: usize,
    ys: &mut [f32],
) -> Result<(), CpuError> {
    if xs.len() != n * w.cols || ys.len() != n * w.rows {
        return Err(CpuError::Shape {
            what: "reference matmul activations/output",
            expected: n * w.cols,
            found: xs.len(),
        });
    }
    let mut acts = vec![0f64; n * w.cols];
    for (x, a) in xs.chunks_exact(w.cols).zip(acts.chunks_exact_mut(w.cols)) {
        activation_values(w.ty, x, a)?;
    }
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        w.dequantize_row(r, &mut row)?;
        for (t, a) in acts.chunks_exact(w.cols).enumerate() {
            let s: f64 = row.iter().zip(a).map(|(&wv, &av)| wv as f64 * av).sum();
            ys[t * w.rows + r] = s as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::matmul;
    use crate::Pool;

    fn rand_vec(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// For every weight type with a quantizer here, the fast matmul (its
    /// own activation quantization, SIMD integer dots, f32 block scaling)
    /// equals this reference up to f32 rounding: |Δ| ≤ 1e-5 · Σ|w|·|a|,
    /// not the ~1/127 of activation rounding that separates both from f32
    /// activations.
    #[test]
    fn fast_matmul_equals_ggml_reference_up_to_rounding() {
        let pool = Pool::new(2);
        for ty in [
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::BF16,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_NL,
        ] {
            let Ok(k) = redlite_quant::kernels(ty) else {
                continue;
            };
            if k.quantize.is_none() {
                continue;
            }
            let cols = 512;
            let rows = 24usize;
            let mut seed = 5u64;
            let wv = rand_vec(rows * cols, &mut seed);
            let mut bytes = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
            redlite_quant::quantize(ty, &wv, &mut bytes).unwrap();
            let w = QMatrix::new(ty, &bytes, rows, cols).unwrap();
            for n in [1usize, 5, 17] {
                let xs = rand_vec(n * cols, &mut seed);
                let mut fast = vec![0f32; n * rows];
                let mut refr = vec![0f32; n * rows];
                let mut xs_fast = xs.clone();
                // The model crate rounds F16/BF16 activations before the
                // float dot; do the same here.
                match ty {
                    GgmlType::F16 => xs_fast.iter_mut().for_each(|v| *v = round_f16(*v)),
                    GgmlType::BF16 => xs_fast.iter_mut().for_each(|v| *v = round_bf16(*v)),
                    _ => {}
                }
                matmul(&pool, &w, &xs_fast, n, &mut fast).unwrap();
                matmul_reference_ggml(&w, &xs, n, &mut refr).unwrap();
                let mut deq = vec![0f32; cols];
                let mut a = vec![0f64; cols];
                for t in 0..n {
                    activation_values(ty, &xs[t * cols..(t + 1) * cols], &mut a).unwrap();
                    for r in 0..rows {
                        w.dequantize_row(r, &mut deq).unwrap();
                        let mag: f64 = deq.iter().zip(&a).map(|(&x, y)| (x as f64 * y).abs()).sum();
                        let e = (fast[t * rows + r] - refr[t * rows + r]).abs() as f64;
                        assert!(
                            e <= 1e-5 * mag + 1e-7,
                            "{ty} n {n} row {r} token {t}: |Δ| {e:.3e} vs Σ|w·a| {mag:.3e}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(round_bf16(1.0), 1.0);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(round_bf16(1.0 + 1.0 / 256.0), 1.0);
        assert_eq!(round_bf16(1.0 + 3.0 / 256.0), 1.0 + 4.0 / 256.0);
        assert!(round_bf16(f32::NAN).is_nan());
    }
}
