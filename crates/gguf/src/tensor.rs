//! Tensor infos and zero-copy views of tensor bytes.

use crate::types::GgmlType;

/// One entry of the tensor table, checked: the shape is 1 to 4 nonzero
/// dimensions, rows are whole blocks, and the bytes lie inside the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the contiguous row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the first byte, relative to the start of the data section.
    pub offset: u64,
    /// Bytes of data.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (the product of the dimensions).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Elements in one row (`dims[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (the product of `dims[1..]`).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes in one row.
    pub fn row_bytes(&self) -> usize {
        let blocks = self.row_len() / self.ty.block_size() as u64;
        (blocks as usize).saturating_mul(self.ty.type_size())
    }
}

/// The bytes of one tensor, borrowed from the file.
#[derive(Clone, Copy, Debug)]
pub struct TensorView<'a> {
    pub info: &'a TensorInfo,
    pub data: &'a [u8],
}

impl<'a> TensorView<'a> {
    /// Row `i`. Panics when `i >= n_rows()`, like slice indexing; see
    /// [`TensorView::get_row`] for the checked form.
    pub fn row(&self, i: usize) -> &'a [u8] {
        match self.get_row(i) {
            Some(r) => r,
            None => panic!(
                "row {i} out of range for tensor `{}` with {} rows",
                self.info.name,
                self.info.n_rows()
            ),
        }
    }

    /// Row `i`, or `None` when out of range.
    pub fn get_row(&self, i: usize) -> Option<&'a [u8]> {
        let rb = self.info.row_bytes();
        let start = i.checked_mul(rb)?;
        self.data.get(start..start.checked_add(rb)?)
    }

    /// The data as `f32`, without copying: `Some` when the tensor is `F32`
    /// and its bytes are 4-byte aligned in memory (always so for a
    /// memory-mapped file whose alignment is 4 or more) on a little-endian host.
    pub fn as_f32(&self) -> Option<&'a [f32]> {
        if self.info.ty != GgmlType::F32 || cfg!(target_endian = "big") {
            return None;
        }
        // SAFETY: every bit pattern is a valid f32, so reinterpreting
        // initialised bytes as f32 is sound; `align_to` only puts into the
        // middle slice the part that is correctly aligned for f32 and whose
        // length is a whole number of f32s, and the lifetime stays that of
        // the borrowed bytes. We accept the result only when nothing fell
        // into the unaligned prefix or the suffix.
        let (head, body, tail) = unsafe { self.data.align_to::<f32>() };
        (head.is_empty() && tail.is_empty()).then_some(body)
    }
}
