//! Vectorised `exp` for the fast kernels (attention softmax, SwiGLU).

/// `exp` of eight f32 (Cephes' single-precision scheme: `x = n·ln2 + r`
/// with ln2 split in two, a degree-6 polynomial for `e^r` on
/// `|r| ≤ ln2/2`, `2^n` put in the exponent bits). Below -87.3 (where expf
/// is denormal or 0) and for -inf it gives 0; above 88.3 it is clamped.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn exp_avx2(x: core::arch::x86_64::__m256) -> core::arch::x86_64::__m256 {
    use core::arch::x86_64::*;
    let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.3));
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.3)),
        _mm256_set1_ps(88.3),
    );
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(core::f32::consts::LOG2_E),
    ));
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    let r2 = _mm256_mul_ps(r, r);
    y = _mm256_fmadd_ps(y, r2, _mm256_add_ps(r, _mm256_set1_ps(1.0)));
    let pow2n = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
        _mm256_cvtps_epi32(n),
        _mm256_set1_epi32(127),
    )));
    _mm256_andnot_ps(tiny, _mm256_mul_ps(y, pow2n))
}

/// `a ← SiLU(a) ⊙ b` with AVX2/FMA: `SiLU(g) = g / (1 + e^-g)` on eight
/// values at a time through [`exp_avx2`]; the tail through the scalar form.
///
/// # Safety
/// The CPU must support AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    use core::arch::x86_64::*;
    let n = gate.len().min(up.len());
    let body = n - n % 8;
    let one = _mm256_set1_ps(1.0);
    let mut i = 0;
    while i < body {
        // SAFETY: `i + 8 <= body <= n` elements of both slices.
        unsafe {
            let g = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let e = exp_avx2(_mm256_sub_ps(_mm256_setzero_ps(), g));
            let silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(silu, u));
        }
        i += 8;
    }
    for (g, &u) in gate[body..n].iter_mut().zip(&up[body..n]) {
        *g = crate::ops::silu(*g) * u;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn swiglu_avx2_matches_scalar() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return;
        }
        let g: Vec<f32> = (0..1003).map(|i| (i as f32 - 500.0) * 0.05).collect();
        let u: Vec<f32> = (0..1003)
            .map(|i| ((i * 7) % 13) as f32 * 0.3 - 2.0)
            .collect();
        let mut a = g.clone();
        crate::ops::swiglu(&mut a, &u);
        let mut b = g.clone();
        // SAFETY: AVX2 and FMA checked above.
        unsafe { super::swiglu_avx2(&mut b, &u) };
        for i in 0..g.len() {
            let tol = 4e-7 * a[i].abs().max(1e-3);
            assert!((a[i] - b[i]).abs() <= tol, "{i}: {} vs {}", a[i], b[i]);
        }
    }
}
