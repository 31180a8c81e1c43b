//! Tensor specs checked at load, and weights as byte ranges of the file.
//!
//! A [`Weight`] keeps the byte range of its data inside the file's bytes
//! (memory-mapped), so a model holds the file and its weights without
//! self-references; kernels read the bytes in place.

use crate::ModelError;
use redlite_cpu::matmul::dequantize_into;
use redlite_cpu::QMatrix;
use redlite_gguf::{GgmlType, GgufFile};
use std::ops::Range;

/// One expected tensor: its name, its dims in ggml order, and whether the
/// model can run without it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub required: bool,
}

impl TensorSpec {
    pub fn req(name: impl Into<String>, dims: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dims: dims.iter().map(|&d| d as u64).collect(),
            required: true,
        }
    }
    pub fn opt(name: impl Into<String>, dims: &[usize]) -> TensorSpec {
        TensorSpec {
            required: false,
            ..TensorSpec::req(name, dims)
        }
    }
}

/// The name of a per-layer tensor: `blk.{layer}.{suffix}`.
pub fn blk(layer: usize, suffix: &str) -> String {
    format!("blk.{layer}.{suffix}")
}

/// A tensor of the file: its type, dims and where its bytes are.
#[derive(Clone, Debug)]
pub struct Weight {
    pub name: String,
    pub ty: GgmlType,
    pub dims: Vec<u64>,
    range: Range<usize>,
}

fn trim(d: &[u64]) -> &[u64] {
    let mut n = d.len();
    while n > 1 && d[n - 1] == 1 {
        n -= 1;
    }
    &d[..n]
}

impl Weight {
    /// Look a spec up in the file: `Ok(None)` for a missing optional tensor,
    /// an error naming the tensor for a missing required one or wrong dims.
    pub fn load(file: &GgufFile, spec: &TensorSpec) -> Result<Option<Weight>, ModelError> {
        let Some(info) = file.tensor_info(&spec.name) else {
            return if spec.required {
                Err(ModelError::MissingTensor {
                    name: spec.name.clone(),
                    expected: spec.dims.clone(),
                })
            } else {
                Ok(None)
            };
        };
        if trim(&info.dims) != trim(&spec.dims) {
            return Err(ModelError::TensorShape {
                name: spec.name.clone(),
                expected: spec.dims.clone(),
                found: info.dims.clone(),
            });
        }
        let start = (file.data_offset() + info.offset) as usize;
        let range = start..start + info.n_bytes as usize;
        if range.end > file.bytes().len() {
            return Err(ModelError::TensorType {
                name: spec.name.clone(),
                ty: info.ty,
                what: "has bytes past the end of the file".into(),
            });
        }
        Ok(Some(Weight {
            name: spec.name.clone(),
            ty: info.ty,
            dims: info.dims.clone(),
            range,
        }))
    }

    /// A required tensor.
    pub fn require(file: &GgufFile, spec: TensorSpec) -> Result<Weight, ModelError> {
        Weight::load(file, &spec)?.ok_or(ModelError::MissingTensor {
            name: spec.name,
            expected: spec.dims,
        })
    }

    /// Row length (`dims[0]`).
    pub fn cols(&self) -> usize {
        self.dims[0] as usize
    }

    /// Number of rows (product of the other dims).
    pub fn rows(&self) -> usize {
        self.dims.iter().skip(1).product::<u64>() as usize
    }

    /// Where the bytes lie in the file (absolute offsets).
    pub fn file_range(&self) -> Range<usize> {
        self.range.clone()
    }

    /// The raw bytes.
    pub fn bytes<'f>(&self, file: &'f GgufFile) -> &'f [u8] {
        &file.bytes()[self.range.clone()]
    }

    /// The tensor as a matrix of `rows × cols`.
    pub fn matrix<'f>(&self, file: &'f GgufFile) -> Result<QMatrix<'f>, ModelError> {
        Ok(QMatrix::new(
            self.ty,
            self.bytes(file),
            self.rows(),
            self.cols(),
        )?)
    }

    /// The whole tensor dequantized to f32 (for small tensors: norms,
    /// biases, conv taps).
    pub fn to_f32(&self, file: &GgufFile) -> Result<Vec<f32>, ModelError> {
        let n = self.dims.iter().product::<u64>() as usize;
        let mut out = vec![0f32; n];
        dequantize_into(self.ty, self.bytes(file), &mut out).map_err(|e| {
            ModelError::TensorType {
                name: self.name.clone(),
                ty: self.ty,
                what: format!("cannot be read as f32: {e}"),
            }
        })?;
        Ok(out)
    }

    /// Check that the kernels can use this tensor's type for a matmul.
    pub fn check_matmul_type(&self) -> Result<(), ModelError> {
        match self.ty {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => Ok(()),
            ty => redlite_quant::kernels(ty)
                .map(|_| ())
                .map_err(|e| ModelError::TensorType {
                    name: self.name.clone(),
                    ty,
                    what: format!("has no kernels: {e}"),
                }),
        }
    }
}

/// Load a small tensor (a norm, bias, conv taps) as f32 in one step. A
/// NaN or infinity in one is refused with the tensor's name: it would turn
/// every activation after it into NaN and the output into garbage, with
/// nothing said. Scanning costs nothing next to dequantizing.
pub fn load_f32(file: &GgufFile, spec: TensorSpec) -> Result<Vec<f32>, ModelError> {
    let w = Weight::require(file, spec)?;
    let v = w.to_f32(file)?;
    check_finite(&w.name, &v, 0)?;
    Ok(v)
}

/// An error naming `name` at the first non-finite value of `v` (whose first
/// element is element `base` of the tensor).
pub fn check_finite(name: &str, v: &[f32], base: usize) -> Result<(), ModelError> {
    match v.iter().position(|x| !x.is_finite()) {
        None => Ok(()),
        Some(i) => Err(ModelError::NonFinite {
            name: name.to_string(),
            index: base + i,
            value: v[i],
        }),
    }
}

/// Rows checked by [`check_sampled_rows`].
pub const SAMPLED_ROWS: usize = 64;

/// Dequantize up to [`SAMPLED_ROWS`] rows spread evenly over a big matrix
/// (the first and last among them) and refuse non-finite values. A whole
/// corrupt or wrongly typed tensor is caught at load for a few hundred
/// kilobytes of reads; a single bad row is caught where rows are used
/// (the embedding checks each row it dequantizes).
pub fn check_sampled_rows(file: &GgufFile, w: &Weight) -> Result<(), ModelError> {
    let m = w.matrix(file)?;
    if m.rows == 0 {
        return Ok(());
    }
    let n = m.rows.min(SAMPLED_ROWS);
    let mut row = vec![0f32; m.cols];
    for k in 0..n {
        let r = if n == 1 {
            0
        } else {
            k * (m.rows - 1) / (n - 1)
        };
        m.dequantize_row(r, &mut row)?;
        check_finite(&w.name, &row, r * m.cols)?;
    }
    Ok(())
}
