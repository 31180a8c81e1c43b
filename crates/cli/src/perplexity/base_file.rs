//! KL base files in llama.cpp's format (`--kl-divergence-base`), so a base
//! written by either tool can be read by the other:
//!
//! ```text
//! "_logits_" | n_ctx i32 | n_vocab i32 | n_chunk i32 | tokens i32 × n_chunk·n_ctx
//! | per chunk, per scored position (n_ctx − 1 − n_ctx/2 of them):
//!   scale f32, min_log_prob f32, n_vocab u16 (padded to even)
//! ```
//!
//! All little-endian. Each u16 is `(log p − min_log_prob) / scale`; the
//! tokens identify the text and the tokenizer (a base from another model
//! or text is refused when they differ).

use super::stats::row_len;
use anyhow::{bail, Context, Result};
use redlite_outfile::Output;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::{Path, PathBuf};

pub const MAGIC: &[u8; 8] = b"_logits_";

/// A base file being written (through a temporary renamed into place
/// when complete).
pub struct BaseWriter {
    out: Output,
    row: Vec<u8>,
}

impl BaseWriter {
    pub fn create(
        path: &Path,
        inputs: &[&Path],
        n_ctx: usize,
        n_vocab: usize,
        n_chunk: usize,
        tokens: &[u32],
    ) -> Result<BaseWriter> {
        let mut out = Output::create(path, inputs).context("--kl-divergence-base")?;
        let mut h = Vec::with_capacity(20 + tokens.len() * 4);
        h.extend_from_slice(MAGIC);
        for x in [n_ctx, n_vocab, n_chunk] {
            h.extend_from_slice(&(x as i32).to_le_bytes());
        }
        for &t in &tokens[..n_chunk * n_ctx] {
            h.extend_from_slice(&(t as i32).to_le_bytes());
        }
        out.write_all(&h)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(BaseWriter {
            out,
            row: Vec::new(),
        })
    }

    /// One scored position's row (`row_len(n_vocab)` values).
    pub fn row(&mut self, q: &[u16]) -> Result<()> {
        self.row.clear();
        q.iter()
            .for_each(|x| self.row.extend_from_slice(&x.to_le_bytes()));
        let target = self.out.target().to_path_buf();
        self.out
            .write_all(&self.row)
            .with_context(|| format!("writing {}", target.display()))
    }

    pub fn commit(self) -> Result<()> {
        Ok(self.out.commit()?)
    }
}

/// A base file being read, its header checked.
pub struct BaseReader {
    path: PathBuf,
    r: BufReader<File>,
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    pub tokens: Vec<u32>,
    buf: Vec<u8>,
}

/// Context sizes past this are refused before the token table is sized.
const MAX_CTX: usize = 1 << 22;

impl BaseReader {
    /// Open `path` for a model of `n_vocab` logits: the header's sizes are
    /// checked against the file's length before anything is allocated.
    pub fn open(path: &Path, n_vocab: usize) -> Result<BaseReader> {
        let name = || format!("--kl-divergence-base {}", path.display());
        let f = File::open(path).with_context(name)?;
        let len = f.metadata().with_context(name)?.len();
        let mut r = BufReader::with_capacity(1 << 20, f);
        let mut head = [0u8; 20];
        if r.read_exact(&mut head).is_err() || &head[..8] != MAGIC {
            bail!(
                "{}: not a KL base file (written by `redlite perplexity --kl-divergence-base` or llama-perplexity's)",
                name()
            );
        }
        let int = |i: usize| i32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let (n_ctx, file_vocab, n_chunk) = (int(8), int(12), int(16));
        if n_ctx < 4 || n_ctx as usize > MAX_CTX || n_chunk < 1 {
            bail!("{}: a header of n_ctx {n_ctx}, {n_chunk} chunks", name());
        }
        if file_vocab as usize != n_vocab {
            bail!(
                "{}: made with a vocabulary of {file_vocab}, this model has {n_vocab}",
                name()
            );
        }
        let (n_ctx, n_chunk) = (n_ctx as usize, n_chunk as usize);
        let rows = (n_ctx - 1 - n_ctx / 2) as u64;
        let want = 20u64
            .saturating_add((n_chunk as u64).saturating_mul(n_ctx as u64 * 4))
            .saturating_add((n_chunk as u64).saturating_mul(rows * row_len(n_vocab) as u64 * 2));
        if len != want {
            bail!(
                "{}: the file is {len} bytes, its header ({n_chunk} chunks of {n_ctx}, {n_vocab} logits) describes {want}{}",
                name(),
                if len < want { " (truncated)" } else { "" }
            );
        }
        let mut tb = vec![0u8; n_chunk * n_ctx * 4];
        r.read_exact(&mut tb).with_context(name)?;
        let tokens: Vec<u32> = tb
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
            .collect();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            bail!("{}: token id {bad} is outside the vocabulary", name());
        }
        Ok(BaseReader {
            path: path.to_path_buf(),
            r,
            n_ctx,
            n_vocab,
            n_chunk,
            tokens,
            buf: Vec::new(),
        })
    }

    /// The next scored position's row into `q` (`row_len` values).
    pub fn row(&mut self, q: &mut [u16]) -> Result<()> {
        self.buf.resize(q.len() * 2, 0);
        self.r
            .read_exact(&mut self.buf)
            .with_context(|| format!("--kl-divergence-base {}", self.path.display()))?;
        for (o, c) in q.iter_mut().zip(self.buf.chunks_exact(2)) {
            *o = u16::from_le_bytes([c[0], c[1]]);
        }
        Ok(())
    }
}
