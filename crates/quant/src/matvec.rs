//! Single-threaded matrix × vector over quantized weight rows.

use crate::{kernels, GgmlType, QuantError};

/// `out[r] = dot(weights row r, act)` for `n_rows` rows of `row_len`
/// elements of `ty`, stored back to back in `weights`. `act` holds the
/// activations already quantized to the type's `vec_dot_type` (see
/// [`crate::quantize_activations`]). Honors `REDLITE_REFERENCE=1` like
/// [`crate::dot`].
pub fn matvec(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    row_len: usize,
    act: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let k = kernels(ty)?;
    let shape = |ty: GgmlType, what: String| QuantError::Shape { ty, what };
    let row_bytes = ty
        .bytes_for(row_len as u64)
        .ok_or_else(|| shape(ty, format!("row length {row_len} is not whole blocks")))?
        as usize;
    let act_bytes = k.vec_dot_type.bytes_for(row_len as u64).ok_or_else(|| {
        shape(
            k.vec_dot_type,
            format!("row length {row_len} is not whole blocks"),
        )
    })? as usize;
    if Some(weights.len()) != row_bytes.checked_mul(n_rows) {
        return Err(shape(
            ty,
            format!(
                "{} weight bytes are not {n_rows} rows of {row_bytes} bytes",
                weights.len()
            ),
        ));
    }
    if act.len() != act_bytes {
        return Err(shape(
            k.vec_dot_type,
            format!("{} activation bytes, expected {act_bytes}", act.len()),
        ));
    }
    if out.len() != n_rows {
        return Err(shape(
            ty,
            format!("{} outputs for {n_rows} rows", out.len()),
        ));
    }
    let dot = if crate::registry::use_reference() {
        k.dot_reference
    } else {
        k.dot_fast
    };
    if row_bytes == 0 {
        out.fill(0.0);
        return Ok(());
    }
    for (o, row) in out.iter_mut().zip(weights.chunks_exact(row_bytes)) {
        *o = dot(row, act);
    }
    Ok(())
}

/// [`matvec`] with f32 activations, quantized here first.
pub fn matvec_f32(
    ty: GgmlType,
    weights: &[u8],
    n_rows: usize,
    row_len: usize,
    x: &[f32],
    out: &mut [f32],
) -> Result<(), QuantError> {
    if x.len() != row_len {
        return Err(QuantError::Shape {
            ty,
            what: format!("{} activations for rows of {row_len}", x.len()),
        });
    }
    let act = crate::quantize_activations(ty, x)?;
    matvec(ty, weights, n_rows, row_len, &act, out)
}
