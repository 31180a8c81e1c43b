//! Matrix × activations over rows stored in any ggml block format.
//!
//! A weight matrix is `rows` rows of `cols` elements each (ggml's `dims[0]`
//! is `cols`), read in place from the file. A batch of `n` tokens is an
//! `n × cols` activation matrix; the result is `n × rows`.
//!
//! Fast path: each token's activations are quantized once into the format
//! the weight's dot kernel takes; the rows are split into chunks over the
//! pool, and each row is dotted with every token of the batch while it is in
//! cache (GEMM-shaped). Float weights (F32) use a float dot; formats whose
//! dot takes float activations are dequantized row by row.
//!
//! Reference path: every row is dequantized to f32 and dotted in f64.

use crate::{CpuError, Pool};
use rayon::prelude::*;
use redlite_gguf::GgmlType;

/// A weight matrix of `rows` × `cols` elements stored as `ty` blocks.
#[derive(Clone, Copy, Debug)]
pub struct QMatrix<'a> {
    pub ty: GgmlType,
    pub data: &'a [u8],
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
}

impl<'a> QMatrix<'a> {
    /// Check that `data` holds exactly `rows` rows of `cols` elements.
    pub fn new(ty: GgmlType, data: &'a [u8], rows: usize, cols: usize) -> Result<Self, CpuError> {
        let bad = |expected| CpuError::MatrixBytes {
            ty,
            rows,
            cols,
            expected,
            found: data.len(),
        };
        let row_bytes = ty.bytes_for(cols as u64).ok_or_else(|| bad(0))? as usize;
        let expected = row_bytes.checked_mul(rows).ok_or_else(|| bad(usize::MAX))?;
        if expected != data.len() {
            return Err(bad(expected));
        }
        Ok(QMatrix {
            ty,
            data,
            rows,
            cols,
            row_bytes,
        })
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of row `i`.
    pub fn row(&self, i: usize) -> &'a [u8] {
        &self.data[i * self.row_bytes..(i + 1) * self.row_bytes]
    }

    /// Rows `start..start+n` as a matrix of their own (one expert of a
    /// stacked tensor, one part of a fused projection).
    pub fn sub_rows(&self, start: usize, n: usize) -> QMatrix<'a> {
        QMatrix {
            data: &self.data[start * self.row_bytes..(start + n) * self.row_bytes],
            rows: n,
            ..*self
        }
    }

    /// Dequantize row `i` into `out` (`cols` values).
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<(), CpuError> {
        dequantize_into(self.ty, self.row(i), out)
    }
}

/// Dequantize whole blocks of `ty` into `out`; float types are handled here,
/// block formats by `redlite_quant`.
pub fn dequantize_into(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), CpuError> {
    let check = |size: usize| {
        if bytes.len() != out.len() * size {
            Err(CpuError::Shape {
                what: "float row bytes",
                expected: out.len() * size,
                found: bytes.len(),
            })
        } else {
            Ok(())
        }
    };
    match ty {
        GgmlType::F32 => {
            check(4)?;
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        GgmlType::F16 => {
            check(2)?;
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        GgmlType::BF16 => {
            check(2)?;
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16);
            }
        }
        _ => redlite_quant::dequantize(ty, bytes, out)?,
    }
    Ok(())
}

/// View little-endian f32 bytes as `&[f32]` when they are aligned, else `None`.
pub fn f32_view(bytes: &[u8]) -> Option<&[f32]> {
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    // SAFETY: every bit pattern is a valid f32, `align_to` only yields the
    // middle part at a correct alignment, and we accept the result only when
    // nothing is left over before or after it (so it covers all of `bytes`).
    // The target is little-endian (checked below), the byte order of GGUF.
    let (head, mid, tail) = unsafe { bytes.align_to::<f32>() };
    if cfg!(target_endian = "little") && head.is_empty() && tail.is_empty() {
        Some(mid)
    } else {
        None
    }
}

/// Dot product of two f32 slices with eight independent accumulators (the
/// compiler turns them into vector lanes).
#[inline(always)]
pub fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        s += x * y;
    }
    (acc[0] + acc[4]) + (acc[1] + acc[5]) + (acc[2] + acc[6]) + (acc[3] + acc[7]) + s
}

/// How the activations of a batch are prepared for one weight type.
enum Prepared {
    /// Float dot (float weights, or formats whose dot takes f32).
    Float,
    /// Quantized activations, one `stride`-byte record per token.
    /// Shared by every matrix whose format takes this activation format;
    /// the dot kernels come from each matrix's own type.
    Quant { bytes: Vec<u8>, stride: usize },
}

fn prepare(pool: &Pool, w: &QMatrix, xs: &[f32], n: usize) -> Result<Prepared, CpuError> {
    if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Ok(Prepared::Float);
    }
    let k = redlite_quant::kernels(w.ty)?;
    if k.vec_dot_type == GgmlType::F32 {
        return Ok(Prepared::Float);
    }
    let act_ty = k.vec_dot_type;
    let stride = act_ty
        .bytes_for(w.cols as u64)
        .ok_or(redlite_quant::QuantError::Unsupported(act_ty))? as usize;
    let mut bytes = vec![0u8; n * stride];
    if n == 1 || stride == 0 {
        redlite_quant::quantize(act_ty, xs, &mut bytes)?;
    } else {
        // One token per task: the quantizers are per block, so the result is
        // the same as quantizing the tokens one after another.
        pool.install(|| {
            bytes
                .par_chunks_mut(stride)
                .zip(xs.par_chunks(w.cols))
                .try_for_each(|(dst, x)| redlite_quant::quantize(act_ty, x, dst))
        })?;
    }
    Ok(Prepared::Quant { bytes, stride })
}

fn check_shapes(w: &QMatrix, xs: &[f32], ys: &[f32], n: usize) -> Result<(), CpuError> {
    if xs.len() != n * w.cols {
        return Err(CpuError::Shape {
            what: "matmul activations",
            expected: n * w.cols,
            found: xs.len(),
        });
    }
    if ys.len() != n * w.rows {
        return Err(CpuError::Shape {
            what: "matmul output",
            expected: n * w.rows,
            found: ys.len(),
        });
    }
    Ok(())
}

/// How a batch of several tokens is computed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Batching {
    /// GEMM-shaped kernels (prompt processing).
    #[default]
    Gemm,
    /// Every token through the one-token (decode) kernels, a block of rows
    /// at a time so that the block comes from memory once for all tokens:
    /// each value is bit for bit what the token alone gives (a speculative
    /// verify pass, whose tokens must be the ones plain decoding picks).
    AsDecode,
}

/// A borrowed view of [`Prepared`] activations.
#[derive(Clone, Copy)]
enum Prep<'a> {
    Float,
    Quant { bytes: &'a [u8], stride: usize },
}

impl Prepared {
    fn view(&self) -> Prep<'_> {
        match self {
            Prepared::Float => Prep::Float,
            Prepared::Quant { bytes, stride } => Prep::Quant {
                bytes,
                stride: *stride,
            },
        }
    }
}

/// Compute rows `r0..r0+nr` for all `n` tokens into `out` (`n × nr`,
/// token-major).
#[allow(clippy::too_many_arguments)]
fn rows_block(
    w: &QMatrix,
    prep: Prep<'_>,
    xs: &[f32],
    n: usize,
    r0: usize,
    nr: usize,
    out: &mut [f32],
    scratch: &mut Vec<f32>,
    batching: Batching,
) -> Result<(), CpuError> {
    if batching == Batching::AsDecode && n > 1 {
        for t in 0..n {
            let (one, x) = match prep {
                Prep::Quant { bytes, stride } => (
                    Prep::Quant {
                        bytes: &bytes[t * stride..(t + 1) * stride],
                        stride,
                    },
                    &xs[t * w.cols..(t + 1) * w.cols],
                ),
                Prep::Float => (Prep::Float, &xs[t * w.cols..(t + 1) * w.cols]),
            };
            let o = &mut out[t * nr..(t + 1) * nr];
            rows_block(w, one, x, 1, r0, nr, o, scratch, Batching::Gemm)?;
        }
        return Ok(());
    }
    let kernels = match prep {
        Prep::Quant { .. } => Some(redlite_quant::kernels(w.ty)?),
        Prep::Float => None,
    };
    match (prep, kernels) {
        (
            Prep::Quant { bytes, stride },
            Some(redlite_quant::Kernels {
                dot_multi: Some(multi),
                ..
            }),
        ) if n > 1 => {
            if let Some(gemm) = redlite_quant::gemm_fn(w.ty) {
                // Rows × tokens in one call, written in place.
                let rb = w.row_bytes;
                let rows = &w.data[r0 * rb..(r0 + nr) * rb];
                gemm(rows, rb, nr, bytes, stride, n, &mut out[..nr * n]);
                return Ok(());
            }
            // Token groups outside, rows inside: a group's activations stay
            // in L1 while the rows stream past; each weight block is decoded
            // once per group.
            let mut t0 = 0;
            let mut tmp = [0f32; redlite_quant::MULTI_MAX];
            while t0 < n {
                let g = (n - t0).min(redlite_quant::MULTI_MAX);
                let acts = &bytes[t0 * stride..];
                for r in 0..nr {
                    multi(w.row(r0 + r), acts, stride, &mut tmp[..g]);
                    for (j, &x) in tmp[..g].iter().enumerate() {
                        out[(t0 + j) * nr + r] = x;
                    }
                }
                t0 += g;
            }
        }
        (Prep::Quant { bytes, stride }, Some(k)) => {
            if n == 1 {
                if let Some(rows) = redlite_quant::dot_rows_fn(w.ty) {
                    // Decode: several rows share each activation block.
                    let rb = w.row_bytes;
                    rows(
                        &w.data[r0 * rb..(r0 + nr) * rb],
                        rb,
                        &bytes[..stride],
                        &mut out[..nr],
                    );
                    return Ok(());
                }
            }
            let dot = k.dot_fast;
            for r in 0..nr {
                let row = w.row(r0 + r);
                for t in 0..n {
                    out[t * nr + r] = dot(row, &bytes[t * stride..(t + 1) * stride]);
                }
            }
        }
        _ => {
            for r in 0..nr {
                let bytes = w.row(r0 + r);
                let row: &[f32] = match (w.ty, f32_view(bytes)) {
                    (GgmlType::F32, Some(v)) => v,
                    _ => {
                        scratch.resize(w.cols, 0.0);
                        dequantize_into(w.ty, bytes, scratch)?;
                        scratch
                    }
                };
                for t in 0..n {
                    out[t * nr + r] = dot_f32(row, &xs[t * w.cols..(t + 1) * w.cols]);
                }
            }
        }
    }
    Ok(())
}

fn chunk_rows(rows: usize, threads: usize) -> usize {
    (rows / (threads * 4).max(1)).clamp(4, 256)
}

/// `ys[t] = W · xs[t]` for the `n` tokens of a batch (fast path, threaded).
pub fn matmul(
    pool: &Pool,
    w: &QMatrix,
    xs: &[f32],
    n: usize,
    ys: &mut [f32],
) -> Result<(), CpuError> {
    matmul_many(pool, &[*w], xs, n, &mut [ys])
}

/// `ys[m][t] = ws[m] · xs[t]` for several matrices reading the same
/// activations (q/k/v, gate/up): the activations are quantized once per
/// activation format and all rows of all matrices run in one parallel
/// region. Every output value is the one [`matmul`] gives for its matrix
/// alone (same quantized activations, same kernels).
pub fn matmul_many(
    pool: &Pool,
    ws: &[QMatrix],
    xs: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
) -> Result<(), CpuError> {
    matmul_many_batched(pool, ws, xs, n, ys, Batching::Gemm)
}

/// [`matmul`] with the batch computed as `batching` says.
pub fn matmul_batched(
    pool: &Pool,
    w: &QMatrix,
    xs: &[f32],
    n: usize,
    ys: &mut [f32],
    batching: Batching,
) -> Result<(), CpuError> {
    matmul_many_batched(pool, &[*w], xs, n, &mut [ys], batching)
}

/// [`matmul_many`] with the batch computed as `batching` says.
pub fn matmul_many_batched(
    pool: &Pool,
    ws: &[QMatrix],
    xs: &[f32],
    n: usize,
    ys: &mut [&mut [f32]],
    batching: Batching,
) -> Result<(), CpuError> {
    if ws.len() != ys.len() {
        return Err(CpuError::Shape {
            what: "matmul outputs",
            expected: ws.len(),
            found: ys.len(),
        });
    }
    for (w, y) in ws.iter().zip(ys.iter()) {
        check_shapes(w, xs, y, n)?;
    }
    if n == 0 {
        return Ok(());
    }
    // One preparation per distinct (activation format, cols).
    let mut preps: Vec<(GgmlType, usize, Prepared)> = Vec::new();
    let mut which = Vec::with_capacity(ws.len());
    for w in ws {
        let key = activation_key(w)?;
        let i = match preps.iter().position(|(t, c, _)| (*t, *c) == (key, w.cols)) {
            Some(i) => i,
            None => {
                preps.push((key, w.cols, prepare(pool, w, xs, n)?));
                preps.len() - 1
            }
        };
        which.push(i);
    }
    let threads = pool.threads();
    if n == 1 {
        // Output chunks of every matrix, one task each.
        let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
        for (m, y) in ys.iter_mut().enumerate() {
            let chunk = chunk_rows(ws[m].rows, threads);
            for (ci, out) in y.chunks_mut(chunk).enumerate() {
                tasks.push((m, ci * chunk, out));
            }
        }
        return pool.install(|| {
            tasks.into_par_iter().try_for_each_init(
                Vec::new,
                |scratch, (m, r0, out): (usize, usize, &mut [f32])| {
                    let nr = out.len();
                    let prep = preps[which[m]].2.view();
                    rows_block(&ws[m], prep, xs, 1, r0, nr, out, scratch, batching)
                },
            )
        });
    }
    // Each chunk of rows computes an `nr × n` block and places it into the
    // token-major output itself, in parallel (a serial transpose after the
    // parallel part cost ~5% of prompt time at one thread, twice that at two).
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (m, w) in ws.iter().enumerate() {
        let chunk = chunk_rows(w.rows, threads);
        for r0 in (0..w.rows).step_by(chunk.max(1)) {
            tasks.push((m, r0, chunk.min(w.rows - r0)));
        }
    }
    let outs: Vec<TokenMajorOut> = ys
        .iter_mut()
        .zip(ws)
        .map(|(y, w)| TokenMajorOut::new(y, w.rows, n))
        .collect();
    pool.install(|| {
        tasks
            .par_iter()
            .try_for_each_init(Vec::new, |scratch, &(m, r0, nr)| {
                BLOCK.with_borrow_mut(|block| {
                    // Every element is written by `rows_block`; the buffer is
                    // reused per thread because fresh multi-megabyte blocks
                    // cost more in page faults and kernel page clearing (~11%
                    // of prompt time) than the matmul work around them.
                    block.resize(nr * n, 0.0);
                    rows_block(
                        &ws[m],
                        preps[which[m]].2.view(),
                        xs,
                        n,
                        r0,
                        nr,
                        &mut block[..nr * n],
                        scratch,
                        batching,
                    )?;
                    // SAFETY: the tasks of matrix `m` cover disjoint row ranges
                    // `r0..r0 + nr`, so no two tasks write the same element, and
                    // `ys[m]` is not otherwise touched until `install` returns.
                    unsafe { outs[m].put_rows(r0, nr, &block[..nr * n]) };
                    Ok::<(), CpuError>(())
                })?;
                Ok(())
            })
    })
}

thread_local! {
    /// Each pool thread's `nr × n` block of the prompt matmul.
    static BLOCK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A token-major output (`n × rows`) that parallel tasks fill by disjoint
/// row ranges.
struct TokenMajorOut {
    ptr: *mut f32,
    rows: usize,
    n: usize,
}

// SAFETY: the pointer is only written through `put_rows`, whose callers
// guarantee disjoint row ranges; the borrow it came from outlives the
// parallel section (the struct lives inside `matmul_many`'s frame).
unsafe impl Sync for TokenMajorOut {}
unsafe impl Send for TokenMajorOut {}

impl TokenMajorOut {
    fn new(y: &mut [f32], rows: usize, n: usize) -> TokenMajorOut {
        assert_eq!(y.len(), rows * n, "token-major output");
        TokenMajorOut {
            ptr: y.as_mut_ptr(),
            rows,
            n,
        }
    }

    /// Writes `block` (`n × nr`, token-major) to rows `r0..r0 + nr` of
    /// every token.
    ///
    /// # Safety
    /// No other thread may access rows `r0..r0 + nr` of this output
    /// meanwhile.
    unsafe fn put_rows(&self, r0: usize, nr: usize, block: &[f32]) {
        assert!(
            r0 + nr <= self.rows && block.len() == nr * self.n,
            "put_rows bounds"
        );
        for (t, src) in block.chunks_exact(nr).enumerate() {
            // SAFETY: `t * rows + r0 + nr <= n * rows` (checked above), so the
            // run of `nr` elements is inside the output; the caller owns
            // these rows, and `block` is a different allocation.
            unsafe {
                core::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(t * self.rows + r0), nr)
            };
        }
    }
}

/// The format `w`'s activations are prepared in (`F32` for a float dot).
fn activation_key(w: &QMatrix) -> Result<GgmlType, CpuError> {
    if matches!(w.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return Ok(GgmlType::F32);
    }
    Ok(redlite_quant::kernels(w.ty)?.vec_dot_type)
}

/// The reference: every row dequantized to f32, dotted in f64, one thread.
pub fn matmul_reference(w: &QMatrix, xs: &[f32], n: usize, ys: &mut [f32]) -> Result<(), CpuError> {
    check_shapes(w, xs, ys, n)?;
    let mut row = vec![0f32; w.cols];
    for r in 0..w.rows {
        w.dequantize_row(r, &mut row)?;
        for t in 0..n {
            let x = &xs[t * w.cols..(t + 1) * w.cols];
            let s: f64 = row.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
            ys[t * w.rows + r] = s as f32;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

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

    #[test]
    fn f32_view_aligned_and_not() {
        let v = [1.0f32, 2.0, 3.0, 4.0];
        // SAFETY (test): the bytes of an f32 array are plain initialized
        // memory of 16 bytes at an f32 alignment.
        let raw = unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, 16) };
        assert_eq!(f32_view(raw).unwrap(), &v[..]);
        assert_eq!(f32_view(&raw[4..]).unwrap(), &v[1..]);
        assert!(f32_view(&raw[1..13]).is_none(), "misaligned start");
        assert!(f32_view(&raw[..11]).is_none(), "partial value");
    }

    #[test]
    fn f32_matmul_fast_matches_reference_and_f64() {
        let pool = Pool::new(2);
        let mut seed = 7;
        for &(rows, cols, n) in &[(1, 1, 1), (7, 33, 1), (64, 96, 3), (300, 128, 5)] {
            let wv = rand_vec(rows * cols, &mut seed);
            let xs = rand_vec(n * cols, &mut seed);
            let bytes = f32_bytes(&wv);
            let w = QMatrix::new(GgmlType::F32, &bytes, rows, cols).unwrap();
            let mut fast = vec![0f32; n * rows];
            let mut refr = vec![0f32; n * rows];
            matmul(&pool, &w, &xs, n, &mut fast).unwrap();
            matmul_reference(&w, &xs, n, &mut refr).unwrap();
            for t in 0..n {
                for r in 0..rows {
                    let exact: f64 = (0..cols)
                        .map(|c| wv[r * cols + c] as f64 * xs[t * cols + c] as f64)
                        .sum();
                    assert!((refr[t * rows + r] as f64 - exact).abs() < 1e-6);
                    assert!(
                        (fast[t * rows + r] as f64 - exact).abs() < 1e-4,
                        "{rows}x{cols}"
                    );
                }
            }
        }
    }

    #[test]
    fn shape_errors_are_reported() {
        let bytes = vec![0u8; 12];
        assert!(QMatrix::new(GgmlType::F32, &bytes, 2, 2).is_err());
        let w = QMatrix::new(GgmlType::F32, &bytes, 3, 1).unwrap();
        let mut y = vec![0f32; 2];
        assert!(matmul(&Pool::new(1), &w, &[1.0], 1, &mut y).is_err());
    }

    #[test]
    fn f16_rows_dequantize() {
        let v = [0.5f32, -2.0, 1.25];
        let bytes: Vec<u8> = v
            .iter()
            .flat_map(|x| half::f16::from_f32(*x).to_bits().to_le_bytes())
            .collect();
        let w = QMatrix::new(GgmlType::F16, &bytes, 1, 3).unwrap();
        let mut y = [0f32];
        matmul(&Pool::new(1), &w, &[1.0, 1.0, 1.0], 1, &mut y).unwrap();
        assert_eq!(y[0], -0.25);
    }
}

#[cfg(test)]
mod quant_tests {
    use super::*;

    /// `matmul_many` over matrices of different formats (sharing Q8_0 and
    /// Q8_K activations) gives exactly what `matmul` gives per matrix.
    #[test]
    fn matmul_many_equals_matmul_per_matrix() {
        let cols = 512;
        let mut seed = 3u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        };
        let specs = [
            (GgmlType::Q5_0, 70usize),
            (GgmlType::Q8_0, 9),
            (GgmlType::Q4_K, 33),
            (GgmlType::Q5_0, 5),
            (GgmlType::F32, 17),
        ];
        let data: Vec<Vec<u8>> = specs
            .iter()
            .map(|&(ty, rows)| {
                let wv: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
                if ty == GgmlType::F32 {
                    return wv.iter().flat_map(|x| x.to_le_bytes()).collect();
                }
                let mut b = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
                redlite_quant::quantize(ty, &wv, &mut b).unwrap();
                b
            })
            .collect();
        let ws: Vec<QMatrix> = specs
            .iter()
            .zip(&data)
            .map(|(&(ty, rows), b)| QMatrix::new(ty, b, rows, cols).unwrap())
            .collect();
        let pool = Pool::new(2);
        for n in [1usize, 2, 11] {
            let xs: Vec<f32> = (0..n * cols).map(|_| next()).collect();
            let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
            let mut refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_many(&pool, &ws, &xs, n, &mut refs).unwrap();
            for (w, got) in ws.iter().zip(&outs) {
                let mut one = vec![0f32; n * w.rows];
                matmul(&pool, w, &xs, n, &mut one).unwrap();
                assert_eq!(&one, got, "{} n {n}", w.ty);
            }
        }
    }

    /// Quantized rows through the registry's kernels: the fast path (8-bit
    /// activations; batches through the `dot_multi` tile kernels, in token
    /// groups of up to `MULTI_MAX`) stays within the activation-rounding
    /// bound of the reference (f32 activations), row by row and across
    /// batches of 1 to 19 tokens. A batch row equals the single-token result
    /// of the same token within f32 accumulation noise.
    #[test]
    fn quantized_fast_within_activation_rounding_of_reference() {
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let cols = if ty.block_size() == 256 { 512 } else { 128 };
            let rows = 40usize;
            let mut seed = 99u64;
            let mut next = || {
                seed = seed
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            };
            let wv: Vec<f32> = (0..rows * cols).map(|_| next()).collect();
            let mut bytes = vec![0u8; ty.bytes_for((rows * cols) as u64).unwrap() as usize];
            redlite_quant::quantize(ty, &wv, &mut bytes).unwrap();
            let w = QMatrix::new(ty, &bytes, rows, cols).unwrap();
            for n in [1usize, 3, 8, 19] {
                let xs: Vec<f32> = (0..n * cols).map(|_| next()).collect();
                let mut fast = vec![0f32; n * rows];
                let mut refr = vec![0f32; n * rows];
                matmul(&Pool::new(2), &w, &xs, n, &mut fast).unwrap();
                matmul_reference(&w, &xs, n, &mut refr).unwrap();
                let mut deq = vec![0f32; cols];
                for t in 0..n {
                    let x = &xs[t * cols..(t + 1) * cols];
                    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let mut single = vec![0f32; rows];
                    matmul(&Pool::new(1), &w, x, 1, &mut single).unwrap();
                    for r in 0..rows {
                        w.dequantize_row(r, &mut deq).unwrap();
                        let mag: f32 = deq.iter().map(|v| v.abs()).sum();
                        let bound = mag * amax / 127.0 + 1e-4;
                        let e = (fast[t * rows + r] - refr[t * rows + r]).abs();
                        assert!(
                            e <= bound,
                            "{ty} n {n} row {r} token {t}: |Δ| {e} > {bound}"
                        );
                        let e1 = (fast[t * rows + r] - single[r]).abs();
                        assert!(e1 <= mag * amax * 1e-5, "{ty} batch vs single: {e1}");
                    }
                }
            }
        }
    }
}
