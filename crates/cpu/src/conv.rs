//! Causal depthwise 1-D convolution with a carried state (the short conv
//! of Gated DeltaNet / Mamba).
//!
//! `x` is `T × C` (token-major), `w` is `C × K` (each channel's `K` taps,
//! oldest first, as ggml stores `ssm_conv1d` with `dims = [K, C]`), `state`
//! is `(K-1) × C`: the last `K-1` inputs before this call, oldest first.
//! `out[t][c] = Σ_j w[c][j] · in[t - (K-1) + j]`, where inputs before the
//! call come from the state. Afterwards the state holds the last `K-1`
//! inputs.

use crate::CpuError;

pub fn conv1d_causal(
    state: &mut [f32],
    w: &[f32],
    k: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), CpuError> {
    if k == 0 || !w.len().is_multiple_of(k) {
        return Err(CpuError::Shape {
            what: "conv taps",
            expected: k,
            found: w.len(),
        });
    }
    let c = w.len() / k;
    let bad = |what, expected, found| {
        Err(CpuError::Shape {
            what,
            expected,
            found,
        })
    };
    if state.len() != (k - 1) * c {
        return bad("conv state", (k - 1) * c, state.len());
    }
    if !x.len().is_multiple_of(c) || out.len() != x.len() {
        return bad("conv input/output", x.len(), out.len());
    }
    let t_len = x.len() / c;
    // The window: state rows then input rows, indexed from the oldest.
    let input = |row: usize, ch: usize| -> f32 {
        if row < k - 1 {
            state[row * c + ch]
        } else {
            x[(row - (k - 1)) * c + ch]
        }
    };
    for t in 0..t_len {
        for ch in 0..c {
            let taps = &w[ch * k..(ch + 1) * k];
            let mut s = 0f32;
            for (j, &wj) in taps.iter().enumerate() {
                s += wj * input(t + j, ch);
            }
            out[t * c + ch] = s;
        }
    }
    // New state: the last K-1 rows of (state ‖ x).
    let total = k - 1 + t_len;
    let new: Vec<f32> = (total - (k - 1)..total)
        .flat_map(|row| (0..c).map(move |ch| (row, ch)))
        .map(|(row, ch)| input(row, ch))
        .collect();
    state.copy_from_slice(&new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batched_equals_stepwise_and_f64() {
        let (c, k, t) = (3usize, 4usize, 6usize);
        let w: Vec<f32> = (0..c * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let x: Vec<f32> = (0..c * t).map(|i| (i as f32 * 0.71).cos()).collect();
        let mut st_a = vec![0.1f32; (k - 1) * c];
        let mut st_b = st_a.clone();
        let init = st_a.clone();
        let mut out_a = vec![0f32; c * t];
        conv1d_causal(&mut st_a, &w, k, &x, &mut out_a).unwrap();
        let mut out_b = vec![0f32; c * t];
        for i in 0..t {
            conv1d_causal(
                &mut st_b,
                &w,
                k,
                &x[i * c..(i + 1) * c],
                &mut out_b[i * c..(i + 1) * c],
            )
            .unwrap();
        }
        assert_eq!(out_a, out_b);
        assert_eq!(st_a, st_b);
        assert_eq!(
            &st_a[..],
            &x[(t - 3) * c..],
            "state keeps the last K-1 inputs"
        );
        // f64 check
        let seq: Vec<f32> = init.iter().chain(&x).copied().collect();
        for i in 0..t {
            for ch in 0..c {
                let e: f64 = (0..k)
                    .map(|j| w[ch * k + j] as f64 * seq[(i + j) * c + ch] as f64)
                    .sum();
                assert!((out_a[i * c + ch] as f64 - e).abs() < 1e-6);
            }
        }
    }
}
