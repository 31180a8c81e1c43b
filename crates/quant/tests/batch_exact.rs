//! The batched kernels of the formats that `batch_matches_decode` names
//! give, per (row, record), exactly the bits of the single-record kernels:
//! the GEMM (`gemm_fn`) or the multi tile (`dot_multi`, in groups of
//! `MULTI_MAX` as the CPU matmul runs it) against the multi-row decode
//! kernel (`dot_rows_fn`, where the format has one) and the single dot
//! (`dot_fast`). A speculative verify pass relies on it to return the
//! tokens plain decoding returns.
//!
//! Shapes: rows of 1 to 128 blocks, 2 to 19 records (full and short groups
//! of four, more than one `MULTI_MAX` group), row counts that are not
//! multiples of the four-row panel, records at an odd stride. Each batched
//! value is also checked against the scalar reference within the
//! fast-kernel budget, so kernels that agreed with each other but computed
//! something else would fail too.

mod common;

use common::{random_acts, random_row, Rng};
use redlite_quant::{
    batch_matches_decode, dot_rows_fn, gemm_fn, kernels, quantize_activations, GgmlType, MULTI_MAX,
};

const EXACT: [GgmlType; 5] = [
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Row lengths and row counts per format (block sizes 32 and 256).
fn shapes(ty: GgmlType) -> &'static [(usize, usize)] {
    if ty.block_size() == 32 {
        &[(32, 5), (64, 1), (160, 7), (896, 6), (1024, 3), (4096, 9)]
    } else {
        &[(256, 3), (768, 5), (4096, 2)]
    }
}

/// `nr × n` results (token-major) as the CPU matmul's batched path computes
/// them: the GEMM kernel when the format has one, else `dot_multi` per row
/// in groups of at most `MULTI_MAX` records.
fn batched(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    nr: usize,
    acts: &[u8],
    stride: usize,
    n: usize,
) -> Vec<f32> {
    let mut out = vec![f32::NAN; nr * n];
    if let Some(gemm) = gemm_fn(ty) {
        gemm(rows, rb, nr, acts, stride, n, &mut out);
        return out;
    }
    let multi = kernels(ty).unwrap().dot_multi.expect("dot_multi");
    let mut t0 = 0;
    while t0 < n {
        let g = (n - t0).min(MULTI_MAX);
        let mut tmp = [f32::NAN; MULTI_MAX];
        for r in 0..nr {
            multi(
                &rows[r * rb..(r + 1) * rb],
                &acts[t0 * stride..],
                stride,
                &mut tmp[..g],
            );
            for j in 0..g {
                out[(t0 + j) * nr + r] = tmp[j];
            }
        }
        t0 += g;
    }
    out
}

#[test]
fn batched_equals_single_token_bitwise() {
    let mut rng = Rng::new(21);
    for ty in EXACT {
        assert!(batch_matches_decode(ty), "{ty}");
        let k = kernels(ty).unwrap();
        // The decode path: the multi-row kernel where the format has one,
        // else `dot_fast` per row (what the CPU matmul runs for one token).
        let rows_fn = dot_rows_fn(ty);
        assert_eq!(
            rows_fn.is_some(),
            ty.block_size() == 32,
            "{ty}: dot_rows_fn"
        );
        for &(cols, nr) in shapes(ty) {
            let rows: Vec<u8> = (0..nr)
                .flat_map(|_| random_row(&mut rng, ty, cols))
                .collect();
            let rb = rows.len() / nr;
            for n in 2..=19usize {
                let recs: Vec<Vec<u8>> = (0..n)
                    .map(|_| quantize_activations(ty, &random_acts(&mut rng, cols)).unwrap())
                    .collect();
                let len = recs[0].len();
                let stride = len + 3;
                let mut acts = vec![0u8; n * stride];
                for (t, a) in recs.iter().enumerate() {
                    acts[t * stride..t * stride + len].copy_from_slice(a);
                }
                let got = batched(ty, &rows, rb, nr, &acts, stride, n);
                for (t, a) in recs.iter().enumerate() {
                    let mut dec = vec![f32::NAN; nr];
                    match rows_fn {
                        Some(f) => f(&rows, rb, a, &mut dec),
                        None => {
                            for (r, d) in dec.iter_mut().enumerate() {
                                *d = (k.dot_fast)(&rows[r * rb..(r + 1) * rb], a);
                            }
                        }
                    }
                    for r in 0..nr {
                        let row = &rows[r * rb..(r + 1) * rb];
                        let b = got[t * nr + r];
                        let one = (k.dot_fast)(row, a);
                        assert_eq!(
                            b.to_bits(),
                            dec[r].to_bits(),
                            "{ty} cols {cols} rows {nr} n {n} ({r},{t}): batch {b} vs dot_rows {}",
                            dec[r]
                        );
                        assert_eq!(
                            b.to_bits(),
                            one.to_bits(),
                            "{ty} cols {cols} rows {nr} n {n} ({r},{t}): batch {b} vs dot_fast {one}"
                        );
                        // Not only self-consistent: near the scalar
                        // reference (same exact integer block dots, f32
                        // accumulation order only).
                        let want = (k.dot_reference)(row, a);
                        let mut w = vec![0f32; cols];
                        (k.dequantize)(row, &mut w);
                        let mut av = vec![0f32; cols];
                        (kernels(k.vec_dot_type).unwrap().dequantize)(a, &mut av);
                        let mag: f32 = w.iter().zip(&av).map(|(p, q)| (p * q).abs()).sum();
                        assert!(
                            (b - want).abs() <= mag * 2e-5 + 1e-6,
                            "{ty} ({r},{t}): {b} vs reference {want}"
                        );
                    }
                }
            }
        }
    }
}

/// `dot_multi` with 1..=MULTI_MAX records at any offset in the batch gives
/// the single dot's bits for every record (the multi tile's group size and
/// the record's lane in it do not matter).
#[test]
fn multi_equals_dot_fast_bitwise_for_every_group_size() {
    let mut rng = Rng::new(22);
    for ty in EXACT {
        let k = kernels(ty).unwrap();
        let multi = k.dot_multi.unwrap();
        for cols in [256usize, 512, 2048] {
            let row = random_row(&mut rng, ty, cols);
            let recs: Vec<Vec<u8>> = (0..MULTI_MAX)
                .map(|_| quantize_activations(ty, &random_acts(&mut rng, cols)).unwrap())
                .collect();
            let stride = recs[0].len();
            let acts: Vec<u8> = recs.concat();
            for t0 in 0..MULTI_MAX {
                for g in 1..=MULTI_MAX - t0 {
                    let mut out = vec![f32::NAN; g];
                    multi(&row, &acts[t0 * stride..], stride, &mut out);
                    for (j, o) in out.iter().enumerate() {
                        let one = (k.dot_fast)(&row, &recs[t0 + j]);
                        assert_eq!(
                            o.to_bits(),
                            one.to_bits(),
                            "{ty} cols {cols} t0 {t0} g {g} record {j}"
                        );
                    }
                }
            }
        }
    }
}

/// Formats outside the list are not claimed (their batches run through
/// `dot_fast` per token in the CPU matmul's exact mode; no batched kernel
/// of theirs is checked here).
#[test]
fn only_tested_formats_are_claimed() {
    for ty in [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_1,
        GgmlType::Q5_1,
        GgmlType::Q2_K,
        GgmlType::Q5_K,
    ] {
        assert!(!batch_matches_decode(ty), "{ty}");
    }
}
