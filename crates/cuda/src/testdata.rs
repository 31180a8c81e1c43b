//! Random test inputs: quantized weights with every bit pattern of the
//! payload and sane f16 scales, and activations.

use crate::layout::DeviceLayout;
use half::f16;
use redlite_gguf::GgmlType;

/// splitmix64: small, seedable, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Offsets of the f16 scale fields in a GGUF block of `ty`.
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::Q8_0
        | GgmlType::Q5_0
        | GgmlType::IQ4_NL => &[0],
        _ => &[],
    }
}

/// GGUF bytes of a random `rows` x `cols` matrix: random payload bytes (every
/// nibble, index, sign code and sub-scale pattern is a valid block) and f16
/// scales uniform in ±0.01 (Q4_K's and Q5_K's `d`, `dmin` positive, as quantizers write).
pub fn random_weights(l: &DeviceLayout, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    if l.ty == GgmlType::F32 {
        return (0..rows * cols)
            .flat_map(|_| (0.05 * rng.uniform()).to_le_bytes())
            .collect();
    }
    let n = l.matrix_bytes(rows, cols).expect("whole blocks");
    let mut out = vec![0u8; n];
    for c in out.chunks_mut(8) {
        let v = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&v[..c.len()]);
    }
    let fields = f16_fields(l.ty);
    for blk in out.chunks_exact_mut(l.block_bytes) {
        for &at in fields {
            let mut v = 0.01 * rng.uniform();
            if matches!(l.ty, GgmlType::Q4_K | GgmlType::Q5_K) {
                v = v.abs() + 1e-4;
            }
            blk[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
        }
        if l.ty == GgmlType::IQ1_M {
            // IQ1_M's f16 d is the top nibbles of its four scale words.
            let d = f16::from_f32(0.01 * rng.uniform()).to_bits();
            for i in 0..4 {
                let at = 48 + 2 * i + 1;
                blk[at] = (blk[at] & 0x0f) | ((((d >> (4 * i)) & 0xf) as u8) << 4);
            }
        }
    }
    out
}

/// A chunk's top-k as the router writes it: `n` tokens, each `k`
/// distinct experts of `n_expert` in ascending order, token after token.
/// Each `(e, c)` of `fixed` is chosen by exactly `c` tokens (at random);
/// the other choices are drawn from the experts not in `fixed`.
pub fn random_routes(
    rng: &mut Rng,
    n: usize,
    k: usize,
    n_expert: usize,
    fixed: &[(u32, usize)],
) -> Vec<u32> {
    assert!(
        fixed.len() <= k && n_expert >= fixed.len() + k,
        "{} fixed experts, k {k} of {n_expert}",
        fixed.len()
    );
    let mut sets = vec![Vec::with_capacity(k); n];
    let mut order: Vec<usize> = (0..n).collect();
    for &(e, c) in fixed {
        assert!(
            c <= n && (e as usize) < n_expert,
            "expert {e} by {c} of {n} tokens"
        );
        // The first c of a fresh shuffle of the tokens.
        for i in 0..c {
            let r = i + rng.below(n - i);
            order.swap(i, r);
            sets[order[i]].push(e);
        }
    }
    for set in &mut sets {
        while set.len() < k {
            let e = rng.below(n_expert) as u32;
            if !set.contains(&e) && !fixed.iter().any(|f| f.0 == e) {
                set.push(e);
            }
        }
        set.sort_unstable();
    }
    sets.concat()
}

pub fn random_vec(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.uniform()).collect()
}

/// The float64 reference: every row dequantized by `redlite_quant`
/// (the CPU code checked against the gguf package), dotted in f64.
pub fn reference_gemv(ty: GgmlType, gguf: &[u8], rows: usize, cols: usize, x: &[f32]) -> Vec<f64> {
    reference_gemv_f64(ty, gguf, rows, cols, &widen(x))
}

/// [`reference_gemv`] and, per row, the dot product's condition bound
/// sum |w_i x_i|: a product whose terms carry a relative error e each is off
/// by at most e times that sum, whatever the cancellation in the result.
pub fn reference_gemv_bounded(
    ty: GgmlType,
    gguf: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
) -> (Vec<f64>, Vec<f64>) {
    let abs_x: Vec<f64> = x.iter().map(|&v| (v as f64).abs()).collect();
    let sums = reference_gemv(ty, gguf, rows, cols, x);
    let bounds = rows_map(ty, gguf, rows, cols, |w| {
        w.iter()
            .zip(&abs_x)
            .map(|(&a, &b)| (a as f64).abs() * b)
            .sum()
    });
    (sums, bounds)
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// `f` of every dequantized row of the matrix.
fn rows_map(
    ty: GgmlType,
    gguf: &[u8],
    rows: usize,
    cols: usize,
    mut f: impl FnMut(&[f32]) -> f64,
) -> Vec<f64> {
    let row_bytes = gguf.len() / rows;
    let mut w = vec![0f32; cols];
    (0..rows)
        .map(|r| {
            redlite_cpu::matmul::dequantize_into(ty, &gguf[r * row_bytes..][..row_bytes], &mut w)
                .expect("whole blocks");
            f(&w)
        })
        .collect()
}

/// [`reference_gemv`] with an f64 activation vector (the int8 kernels'
/// reference: x as the device quantized it, q * d exactly).
pub fn reference_gemv_f64(
    ty: GgmlType,
    gguf: &[u8],
    rows: usize,
    cols: usize,
    x: &[f64],
) -> Vec<f64> {
    rows_map(ty, gguf, rows, cols, |w| {
        w.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()
    })
}

/// The CPU model of `quantize_q8_32`: per 32 values d = max|x| / 127,
/// q = round(x * 127 / max|x|) (the device rounds half to even; a tie may
/// differ by one).
pub fn quantize_q8_32(x: &[f32]) -> (Vec<i8>, Vec<f32>) {
    let mut q = Vec::with_capacity(x.len());
    let mut d = Vec::with_capacity(x.len() / 32);
    for b in x.chunks_exact(32) {
        let a = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        let id = if a > 0.0 { 127.0 / a } else { 0.0 };
        q.extend(b.iter().map(|&v| (v * id).round_ties_even() as i8));
        d.push(a / 127.0);
    }
    (q, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{layout, GEMV_TYPES};

    #[test]
    fn random_weights_dequantize_to_finite_values() {
        let mut rng = Rng(1);
        for ty in GEMV_TYPES {
            let l = layout(ty).unwrap();
            let w = random_weights(&l, 3, 512, &mut rng);
            let x = random_vec(512, &mut rng);
            let y = reference_gemv(ty, &w, 3, 512, &x);
            assert!(
                y.iter().all(|v| v.is_finite() && *v != 0.0),
                "{ty:?}: {y:?}"
            );
        }
    }
}
