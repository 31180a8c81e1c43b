//! The batched prefill's input rows: each prompt token's embedding row,
//! dequantized on the host with the decode's own `dequantize_row` (so the
//! values are bit for bit those a decode step uploads), on several threads
//! over ranges of rows, into a page-locked buffer kept from chunk to chunk
//! that one asynchronous copy takes to the device. Before, the rows were
//! dequantized one after another into a fresh pageable buffer per chunk
//! and copied synchronously: 5.35 us of the 119.9 a prompt token of a
//! 2048-token prompt took on the H200 machine (`bench model --profile`).
//! A chunk's rows can now be written while the device still runs the
//! chunk before (at full residency nothing in a chunk waits for the
//! device).

use crate::device::{dptr, Gpu};
use crate::error::{ensure, CudaError, Result};
use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice};
use redlite_cpu::QMatrix;

/// Most threads that dequantize one chunk's rows: past this the copy and
/// the memory bandwidth dominate, and the machine has other work.
const MAX_THREADS: usize = 16;

/// Fewest rows a thread takes: a short chunk's rows are cheaper than
/// starting threads for them.
const MIN_ROWS_PER_THREAD: usize = 16;

/// Threads for `n_rows` rows: the machine's parallelism, at most
/// [`MAX_THREADS`], at least [`MIN_ROWS_PER_THREAD`] rows each.
pub(super) fn threads_for(n_rows: usize) -> usize {
    let avail = std::thread::available_parallelism().map_or(1, |n| n.get());
    avail
        .min(MAX_THREADS)
        .min(n_rows.div_ceil(MIN_ROWS_PER_THREAD))
        .max(1)
}

/// `tokens`' rows of `m` into `out` (token t's row at `t * m.cols`), on
/// `threads` threads each taking a contiguous range of tokens. A token
/// outside the vocabulary is refused before any row is dequantized.
pub(super) fn dequantize_rows(
    m: &QMatrix,
    tokens: &[u32],
    out: &mut [f32],
    threads: usize,
) -> Result<()> {
    let d = m.cols;
    ensure!(
        out.len() >= tokens.len() * d,
        "{} embedding rows of {d} values into {} floats",
        tokens.len(),
        out.len()
    );
    for &tok in tokens {
        ensure!(
            (tok as usize) < m.rows,
            "token {tok} outside the vocabulary"
        );
    }
    if tokens.is_empty() || d == 0 {
        return Ok(());
    }
    let out = &mut out[..tokens.len() * d];
    let per = tokens.len().div_ceil(threads.clamp(1, tokens.len()));
    let range = |toks: &[u32], rows: &mut [f32]| -> Result<()> {
        for (&tok, row) in toks.iter().zip(rows.chunks_exact_mut(d)) {
            m.dequantize_row(tok as usize, row)?;
        }
        Ok(())
    };
    if per == tokens.len() {
        return range(tokens, out);
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = tokens
            .chunks(per)
            .zip(out.chunks_mut(per * d))
            .map(|(toks, rows)| s.spawn(move || range(toks, rows)))
            .collect();
        // Every thread is joined before the first error is returned (the
        // scope would join them anyway).
        let mut res = Ok(());
        for h in hs {
            let r = h
                .join()
                .map_err(|_| CudaError::Invalid("an embedding thread panicked".into()))
                .and_then(|r| r);
            if res.is_ok() {
                res = r;
            }
        }
        res
    })
}

/// The page-locked buffer a chunk's rows go up from, reused chunk after
/// chunk.
pub(super) struct EmbedRows {
    host: PinnedHostSlice<f32>,
    /// Recorded on the stream after the last copy out of `host`: the rows
    /// of the next chunk are written only once it has passed.
    copied: Option<CudaEvent>,
}

impl EmbedRows {
    /// Room for `len` floats (a chunk's `cap * d`).
    pub(super) fn new(gpu: &Gpu, len: usize) -> Result<Self> {
        // SAFETY: the memory starts uninitialized; f32 has no invalid bit
        // patterns, and `upload` copies out only the rows it has just
        // written. Flags 0: cached (not write-combined) host memory, as
        // dequantize_row may read back what it writes.
        let host = unsafe { gpu.ctx.alloc_pinned_with_flags::<f32>(len.max(1), 0) }?;
        Ok(Self { host, copied: None })
    }

    /// `tokens`' embedding rows of `m` into the first `tokens.len()` rows
    /// of `dst` (asynchronously, on `gpu.stream`).
    pub(super) fn upload(
        &mut self,
        gpu: &Gpu,
        m: &QMatrix,
        tokens: &[u32],
        dst: &CudaSlice<f32>,
    ) -> Result<()> {
        let len = tokens.len() * m.cols;
        ensure!(
            len <= self.host.len() && len <= dst.len(),
            "{} embedding rows for a chunk of {} floats",
            tokens.len(),
            self.host.len().min(dst.len())
        );
        if let Some(ev) = self.copied.take() {
            ev.synchronize()?;
        }
        // cudarc's own event on the buffer is never recorded (the copy
        // below is issued directly), so this waits for nothing.
        let buf = &mut self.host.as_mut_slice()?[..len];
        dequantize_rows(m, tokens, buf, threads_for(tokens.len()))?;
        // SAFETY: `buf` is page-locked memory this struct owns; the copy
        // reads it asynchronously, and nothing writes it or frees it until
        // the event recorded right after the copy has passed (the next
        // `upload` and `drop` wait for it). The destination holds `len`
        // floats (checked above) and is only used on `gpu.stream`.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                dptr(gpu, Some(dst)),
                &*buf,
                gpu.stream.cu_stream(),
            )
        }?;
        self.copied = Some(gpu.stream.record_event(None)?);
        Ok(())
    }
}

impl Drop for EmbedRows {
    /// The copy still reading the buffer finishes before it is freed.
    fn drop(&mut self) {
        if let Some(ev) = &self.copied {
            // An error here is the context's, and surfaces at its next
            // call; the buffer is freed either way.
            let _ = ev.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testdata::{random_weights, Rng};
    use redlite_gguf::GgmlType;

    /// The rows on any number of threads are bit for bit those of
    /// dequantize_row one after another, for a block format and F32; a
    /// token past the vocabulary is refused with the decode's message.
    #[test]
    fn rows_match_the_serial_dequantization() {
        let mut rng = Rng(7);
        for ty in [GgmlType::Q4_K, GgmlType::IQ2_XXS, GgmlType::F32] {
            let (rows, cols) = (300, 512);
            let l = crate::layout::layout(ty).unwrap();
            let bytes = random_weights(&l, rows, cols, &mut rng);
            let m = QMatrix::new(ty, &bytes, rows, cols).unwrap();
            for n in [1usize, 7, 33, 257] {
                let tokens: Vec<u32> = (0..n).map(|_| rng.below(rows) as u32).collect();
                let mut want = vec![0f32; n * cols];
                for (t, &tok) in tokens.iter().enumerate() {
                    m.dequantize_row(tok as usize, &mut want[t * cols..][..cols])
                        .unwrap();
                }
                for threads in [1, 2, 3, 16, 1000] {
                    let mut got = vec![f32::NAN; n * cols + 5];
                    dequantize_rows(&m, &tokens, &mut got, threads).unwrap();
                    let same = got[..n * cols]
                        .iter()
                        .zip(&want)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "{ty:?} n={n} threads={threads}");
                    assert!(got[n * cols..].iter().all(|v| v.is_nan()), "wrote past");
                }
            }
            let mut out = vec![0f32; 3 * cols];
            let e = dequantize_rows(&m, &[0, rows as u32, 1], &mut out, 2).unwrap_err();
            assert!(
                e.to_string()
                    .contains(&format!("token {rows} outside the vocabulary")),
                "{e}"
            );
            assert!(dequantize_rows(&m, &[0, 1], &mut out[..cols], 2).is_err());
        }
    }

    #[test]
    fn thread_counts() {
        assert_eq!(threads_for(1), 1);
        assert_eq!(threads_for(16), 1);
        assert!(threads_for(17) <= 2);
        assert!((1..=MAX_THREADS).contains(&threads_for(4096)));
    }
}
