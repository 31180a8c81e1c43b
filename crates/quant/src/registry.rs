//! The table from [`GgmlType`] to its kernels, and the checked entry points.

use crate::QuantError;
use redlite_gguf::GgmlType;

/// A quantizer: f32 values (whole blocks) into this format's bytes.
pub type QuantizeFn = fn(src: &[f32], dst: &mut [u8]);

/// One weight row against several activation records: `out[t] =
/// dot(row, acts[t * stride..][..act_len])` for `t < out.len()`
/// (`out.len() <= MULTI_MAX`), where `act_len` is the byte length of `row`'s
/// element count in the activation format. Each weight block is decoded once
/// and reused for every record (the GEMM kernel of prompt processing).
pub type DotMultiFn = fn(row: &[u8], acts: &[u8], stride: usize, out: &mut [f32]);

/// The most activation records one [`DotMultiFn`] call takes.
pub const MULTI_MAX: usize = 8;

/// The kernels of one block format. All slices hold whole blocks.
pub struct Kernels {
    pub ty: GgmlType,
    /// Dequantize `n` whole blocks (`src.len() == n * type_size`) into
    /// `dst` (`dst.len() == n * block_size`).
    pub dequantize: fn(src: &[u8], dst: &mut [f32]),
    /// The activation format the dot product takes: `Q8_0` for 32-element
    /// formats, `Q8_K` for 256-element formats, `F32` for float weights.
    pub vec_dot_type: GgmlType,
    /// Scalar reference: dot of one weight row (`row`, whole blocks) with
    /// activations quantized to `vec_dot_type` (`act`, same element count).
    pub dot_reference: fn(row: &[u8], act: &[u8]) -> f32,
    /// The fast dot product on this machine (SIMD picked at run time), or
    /// the reference when there is none.
    pub dot_fast: fn(row: &[u8], act: &[u8]) -> f32,
    /// Optional multi-record dot (see [`DotMultiFn`]); its reference is
    /// `dot_reference` applied to each record. `None`: callers loop over
    /// `dot_fast`.
    pub dot_multi: Option<DotMultiFn>,
    /// Quantize f32 values (whole blocks) into this format, if supported.
    pub quantize: Option<QuantizeFn>,
}

/// The kernels of `ty`, or `Unsupported`.
pub fn kernels(ty: GgmlType) -> Result<&'static Kernels, QuantError> {
    crate::legacy::kernels(ty)
        .or_else(|| crate::kquants::kernels(ty))
        .or_else(|| crate::iquants::kernels(ty))
        .ok_or(QuantError::Unsupported(ty))
}

fn check_blocks(ty: GgmlType, bytes: usize, elems: usize) -> Result<(), QuantError> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if !elems.is_multiple_of(bs) || !bytes.is_multiple_of(ts) || bytes / ts != elems / bs {
        return Err(QuantError::Shape {
            ty,
            what: format!(
                "{bytes} bytes do not hold {elems} elements (blocks of {bs} elements in {ts} bytes)"
            ),
        });
    }
    Ok(())
}

/// Dequantize whole blocks of `ty` into f32.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    let k = kernels(ty)?;
    check_blocks(ty, src.len(), dst.len())?;
    (k.dequantize)(src, dst);
    Ok(())
}

/// Quantize f32 values into `ty` (whole blocks).
pub fn quantize(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    let k = kernels(ty)?;
    let q = k.quantize.ok_or(QuantError::NoQuantizer(ty))?;
    check_blocks(ty, dst.len(), src.len())?;
    q(src, dst);
    Ok(())
}

/// Quantize an activation vector into the format `weight_ty`'s dot product
/// takes, returning the bytes.
pub fn quantize_activations(weight_ty: GgmlType, x: &[f32]) -> Result<Vec<u8>, QuantError> {
    let k = kernels(weight_ty)?;
    let act_ty = k.vec_dot_type;
    let n = act_ty
        .bytes_for(x.len() as u64)
        .ok_or_else(|| QuantError::Shape {
            ty: act_ty,
            what: format!("{} activations are not whole blocks", x.len()),
        })? as usize;
    let mut out = vec![0u8; n];
    quantize(act_ty, x, &mut out)?;
    Ok(out)
}

pub use crate::legacy::multi::DotRowsFn;

/// The multi-row decode kernel of `ty` (several weight rows against one
/// activation record, see [`DotRowsFn`]), if it has one and
/// `REDLITE_REFERENCE` is off; callers loop over `dot_fast` otherwise.
pub fn dot_rows_fn(ty: GgmlType) -> Option<DotRowsFn> {
    if use_reference() {
        return None;
    }
    crate::legacy::multi::dot_rows_fn(ty)
}

pub use crate::legacy::multi::GemmFn;

/// The GEMM kernel of `ty` (several weight rows × several activation
/// records, see [`GemmFn`]), if it has one and `REDLITE_REFERENCE` is off.
pub fn gemm_fn(ty: GgmlType) -> Option<GemmFn> {
    if use_reference() {
        return None;
    }
    crate::legacy::multi::gemm_fn(ty)
}

/// Whether a batch through the GEMM-shaped kernels of `ty` ([`gemm_fn`],
/// else `dot_multi`) gives, per (row, record), the bits that
/// [`dot_rows_fn`] or `dot_fast` give for the record alone (the kernels
/// of `ty` share one summation order). Callers that need single-token
/// results (a speculative verify pass) may batch such formats; the others
/// must run each token through the single-record kernels.
pub fn batch_matches_decode(ty: GgmlType) -> bool {
    crate::legacy::multi::batch_matches_decode(ty)
        || crate::kquants::multi::batch_matches_decode(ty)
}

/// Whether the process's [`crate::ReferenceMode`] forces the scalar
/// reference kernels.
pub(crate) fn use_reference() -> bool {
    crate::reference::reference_mode().is_on()
}

/// Dot product of one weight row of `ty` with activations already quantized
/// by [`quantize_activations`].
pub fn dot(ty: GgmlType, row: &[u8], act: &[u8]) -> Result<f32, QuantError> {
    let k = kernels(ty)?;
    let elems = row.len() / ty.type_size() * ty.block_size();
    check_blocks(ty, row.len(), elems)?;
    check_blocks(k.vec_dot_type, act.len(), elems)?;
    Ok(if use_reference() {
        (k.dot_reference)(row, act)
    } else {
        (k.dot_fast)(row, act)
    })
}

/// [`DotMultiFn`] through the table: the type's `dot_multi` when it has one
/// (and `REDLITE_REFERENCE` is off), else `dot_fast` (or `dot_reference`)
/// per record. Checks the shapes.
pub fn dot_multi(
    ty: GgmlType,
    row: &[u8],
    acts: &[u8],
    stride: usize,
    out: &mut [f32],
) -> Result<(), QuantError> {
    let k = kernels(ty)?;
    let elems = row.len() / ty.type_size() * ty.block_size();
    check_blocks(ty, row.len(), elems)?;
    let act_len = k
        .vec_dot_type
        .bytes_for(elems as u64)
        .ok_or(QuantError::Unsupported(k.vec_dot_type))? as usize;
    let n = out.len();
    if n > MULTI_MAX || (n > 0 && (stride < act_len || acts.len() < (n - 1) * stride + act_len)) {
        return Err(QuantError::Shape {
            ty,
            what: format!(
                "{n} activation records of {act_len} bytes at stride {stride} in {} bytes (at most {MULTI_MAX})",
                acts.len()
            ),
        });
    }
    match (use_reference(), k.dot_multi) {
        (false, Some(f)) => f(row, acts, stride, out),
        (reference, _) => {
            let dot = if reference {
                k.dot_reference
            } else {
                k.dot_fast
            };
            for (t, o) in out.iter_mut().enumerate() {
                *o = dot(row, &acts[t * stride..t * stride + act_len]);
            }
        }
    }
    Ok(())
}
