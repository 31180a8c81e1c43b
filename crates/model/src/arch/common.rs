//! Pieces every architecture loads the same way: metadata access with
//! named errors, embeddings and head, dense FFNs.

use super::limits;
use crate::blocks::moe::DenseFfn;
use crate::weights::{blk, check_finite, check_sampled_rows, load_f32, TensorSpec as S, Weight};
use crate::ModelError;
use redlite_gguf::{GgufFile, Metadata};

/// Metadata under one architecture prefix.
pub struct Meta<'a> {
    md: &'a Metadata,
    arch: &'a str,
}

impl<'a> Meta<'a> {
    pub fn new(md: &'a Metadata, arch: &'a str) -> Meta<'a> {
        Meta { md, arch }
    }

    /// The full key: `{arch}.{k}`.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// A required size in `lo..=hi`.
    pub fn size(&self, k: &str, lo: usize, hi: usize) -> Result<usize, ModelError> {
        limits::in_range(&self.key(k), self.usize(k)?, lo, hi)
    }

    /// An optional size in `lo..=hi` (the default is checked too: it is
    /// often derived from other values).
    pub fn size_or(
        &self,
        k: &str,
        default: usize,
        lo: usize,
        hi: usize,
    ) -> Result<usize, ModelError> {
        limits::in_range(&self.key(k), self.usize_or(k, default)?, lo, hi)
    }

    /// An optional float that must be finite and positive.
    pub fn positive_or(&self, k: &str, default: f32) -> Result<f32, ModelError> {
        limits::positive(&self.key(k), self.f32_or(k, default)?)
    }

    pub fn bad(&self, k: &str, what: String) -> ModelError {
        ModelError::Metadata {
            key: self.key(k),
            what,
        }
    }

    pub fn usize(&self, k: &str) -> Result<usize, ModelError> {
        let v = self.md.get_u64(&self.key(k))?;
        usize::try_from(v).map_err(|_| self.bad(k, format!("{v} does not fit in memory sizes")))
    }

    pub fn usize_or(&self, k: &str, default: usize) -> Result<usize, ModelError> {
        if self.md.contains_key(&self.key(k)) {
            self.usize(k)
        } else {
            Ok(default)
        }
    }

    pub fn f32_or(&self, k: &str, default: f32) -> Result<f32, ModelError> {
        let key = self.key(k);
        if self.md.contains_key(&key) {
            Ok(self.md.get_f32(&key)?)
        } else {
            Ok(default)
        }
    }

    pub fn bool_array(&self, k: &str) -> Result<Option<Vec<bool>>, ModelError> {
        let key = self.key(k);
        if self.md.contains_key(&key) {
            Ok(Some(self.md.get_bool_array(&key)?))
        } else {
            Ok(None)
        }
    }
}

/// The vocabulary size: `token_embd`'s second dim. The tokenizer's
/// vocabulary (`tokenizer.ggml.tokens`, when present) must not be larger:
/// a token without an embedding row would fail only when someone sends it.
/// (Smaller is fine: embeddings are often padded to a round row count.)
pub fn vocab_size(file: &GgufFile, n_embd: usize) -> Result<usize, ModelError> {
    let info = file
        .tensor_info("token_embd.weight")
        .ok_or_else(|| ModelError::MissingTensor {
            name: "token_embd.weight".into(),
            expected: vec![n_embd as u64, 0],
        })?;
    if info.dims.len() != 2 || info.dims[0] != n_embd as u64 {
        return Err(ModelError::TensorShape {
            name: "token_embd.weight".into(),
            expected: vec![n_embd as u64, 0],
            found: info.dims.clone(),
        });
    }
    let n_vocab = usize::try_from(info.dims[1]).unwrap_or(usize::MAX);
    if n_vocab > limits::MAX_VOCAB {
        return Err(ModelError::TensorShape {
            name: "token_embd.weight".into(),
            expected: vec![n_embd as u64, limits::MAX_VOCAB as u64],
            found: info.dims.clone(),
        });
    }
    if let Some(redlite_gguf::MetadataValue::Array(a)) = file.metadata().get(TOKENS) {
        if a.values.len() > n_vocab {
            return Err(ModelError::VocabMismatch {
                tokens: a.values.len(),
                rows: n_vocab,
            });
        }
    }
    Ok(n_vocab)
}

/// The tokenizer's vocabulary key.
const TOKENS: &str = "tokenizer.ggml.tokens";

/// `token_embd`, `output_norm`, and `output` (tied to `token_embd` when absent).
pub fn load_embd_head(
    file: &GgufFile,
    d: usize,
    n_vocab: usize,
) -> Result<(Weight, Vec<f32>, Weight), ModelError> {
    let tok = Weight::require(file, S::req("token_embd.weight", &[d, n_vocab]))?;
    check_sampled_rows(file, &tok)?;
    let norm = load_f32(file, S::req("output_norm.weight", &[d]))?;
    let out = match Weight::load(file, &S::opt("output.weight", &[d, n_vocab]))? {
        Some(out) => {
            check_sampled_rows(file, &out)?;
            out
        }
        None => tok.clone(),
    };
    Ok((tok, norm, out))
}

/// `ffn_{gate,up,down}.weight` of layer `i`.
pub fn load_dense_ffn(f: &GgufFile, i: usize, d: usize, ff: usize) -> Result<DenseFfn, ModelError> {
    Ok(DenseFfn {
        gate: Weight::require(f, S::req(blk(i, "ffn_gate.weight"), &[d, ff]))?,
        up: Weight::require(f, S::req(blk(i, "ffn_up.weight"), &[d, ff]))?,
        down: Weight::require(f, S::req(blk(i, "ffn_down.weight"), &[ff, d]))?,
    })
}

/// `ffn_{gate,up,down}_{suffix}.weight` of layer `i` (the shared expert).
pub fn load_dense_ffn_named(
    f: &GgufFile,
    i: usize,
    d: usize,
    ff: usize,
    suffix: &str,
) -> Result<DenseFfn, ModelError> {
    Ok(DenseFfn {
        gate: Weight::require(
            f,
            S::req(blk(i, &format!("ffn_gate_{suffix}.weight")), &[d, ff]),
        )?,
        up: Weight::require(
            f,
            S::req(blk(i, &format!("ffn_up_{suffix}.weight")), &[d, ff]),
        )?,
        down: Weight::require(
            f,
            S::req(blk(i, &format!("ffn_down_{suffix}.weight")), &[ff, d]),
        )?,
    })
}

/// Embed tokens: dequantized rows of `token_embd` (`n × d`).
pub fn embed(file: &GgufFile, tok_embd: &Weight, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
    let m = tok_embd.matrix(file)?;
    let d = m.cols;
    let mut x = vec![0f32; tokens.len() * d];
    for (i, &t) in tokens.iter().enumerate() {
        if t as usize >= m.rows {
            return Err(ModelError::BadToken {
                token: t,
                n_vocab: m.rows,
            });
        }
        let row = &mut x[i * d..(i + 1) * d];
        m.dequantize_row(t as usize, row)?;
        check_finite(&tok_embd.name, row, t as usize * d)?;
    }
    Ok(x)
}
