//! Q4_0, Q5_0 and Q8_0 weights against Q8_0 activation records: the
//! single dot (`dot_*_fast`), one row against several records (`multi_*`),
//! several rows against one record (`rows_*_fast`, decode) and rows ×
//! records (`gemm_*_fast`, prompts).
//!
//! All kernels of a format sum in one f32 order per (row, record) (see
//! `avx2`), so a value is the same bits whichever kernel computed it and
//! whatever the batch around it: [`batch_matches_decode`] says so for the
//! engine, which then runs a speculative verify pass through the batched
//! kernels. Without AVX2 every kernel is the scalar reference per (row,
//! record), so the same holds.

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
mod avx2;

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

/// Whether the batched kernels of `ty` ([`gemm_fn`], else `dot_multi`)
/// give, per (row, record), the bits of its single-record kernels
/// ([`dot_rows_fn`], `dot_fast`): true for the formats of this module,
/// whose kernels share one summation order (tested bitwise in
/// `tests/batch_exact.rs`).
pub fn batch_matches_decode(ty: redlite_gguf::GgmlType) -> bool {
    use redlite_gguf::GgmlType as T;
    matches!(ty, T::Q8_0 | T::Q5_0 | T::Q4_0)
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
