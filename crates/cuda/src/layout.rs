//! How a quantized matrix sits in device memory.
//!
//! GGUF blocks of Q6_K (210 bytes), IQ2_XXS (66) and Q8_0 (34) are not
//! 16-byte multiples, so a kernel reading them in place is held to 2-byte
//! loads. On upload each block is split into its *payload* (the block minus
//! its f16 `d`, a 16-byte multiple) and the `d`, and a matrix of `rows` x
//! `nb` blocks becomes
//!
//! ```text
//! [rows*nb payloads, row-major][rows*nb f16 d]
//! ```
//!
//! The same byte count as the GGUF tensor; every payload starts 16-byte
//! aligned. Q4_K (144 bytes) and Q5_K (176), `d` and `dmin` in their
//! 16-byte header, stay whole. Q5_0 moves its `d` and its 4 bytes of fifth
//! bits out (a 6-byte side entry per block), leaving the 16 bytes of
//! nibbles as the payload. IQ2_XS's payload is 72 bytes (8-byte aligned,
//! its kernel reads 8 bytes at a time); IQ1_M (56 bytes, no separate `d`)
//! stays whole. `kernels/gemv_common.cuh` reads exactly this.

use crate::error::{bail, CudaError, Result};
use redlite_gguf::GgmlType;

/// The device layout of one block format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLayout {
    pub ty: GgmlType,
    /// Values per block.
    pub qk: usize,
    /// Bytes of one GGUF block.
    pub block_bytes: usize,
    /// Bytes of one payload on the device.
    pub payload: usize,
    /// Offset of the bytes moved out of the block (the f16 `d` first), if
    /// any.
    pub d_at: Option<usize>,
    /// How many bytes are moved out at `d_at`: 2 (the `d`), or 6 for Q5_0
    /// (`d` and the 4 bytes of fifth bits, so that the 16 bytes of nibbles
    /// are the aligned payload). The side array holds `moved` bytes per
    /// block.
    pub moved: usize,
}

/// The formats with device GEMV kernels. F32 matrices are seen as blocks
/// of 32 floats (no scale); every other format is dequantized to F32 on
/// upload ([`upload_layout`]).
pub const GEMV_TYPES: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q5_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ2_XS,
    GgmlType::IQ1_M,
];

/// The layout of `ty`, or an error for formats without device kernels.
pub fn layout(ty: GgmlType) -> Result<DeviceLayout> {
    let (qk, block_bytes, payload, d_at) = match ty {
        GgmlType::F32 => {
            return Ok(DeviceLayout {
                ty,
                qk: 32,
                block_bytes: 128,
                payload: 128,
                d_at: None,
                moved: 0,
            })
        }
        GgmlType::Q4_K => (256, 144, 144, None),
        GgmlType::Q5_K => (256, 176, 176, None),
        GgmlType::Q6_K => (256, 210, 208, Some(208)),
        GgmlType::IQ2_XXS => (256, 66, 64, Some(0)),
        GgmlType::Q8_0 => (32, 34, 32, Some(0)),
        GgmlType::Q5_0 => (32, 22, 16, Some(0)),
        GgmlType::IQ4_NL => (32, 18, 16, Some(0)),
        GgmlType::IQ2_XS => (256, 74, 72, Some(0)),
        GgmlType::IQ1_M => (256, 56, 56, None),
        other => bail!("no CUDA GEMV kernel for {other:?} yet"),
    };
    debug_assert_eq!(ty.block_size(), qk);
    debug_assert_eq!(ty.type_size(), block_bytes);
    Ok(DeviceLayout {
        ty,
        qk,
        block_bytes,
        payload,
        d_at,
        moved: block_bytes - payload,
    })
}

/// The layout a `ty` matrix of `cols` columns is uploaded in: its own when
/// a kernel reads it, else F32 (dequantized on the host by
/// [`to_device_bytes`]).
pub fn upload_layout(ty: GgmlType, cols: usize) -> Result<DeviceLayout> {
    match layout(ty) {
        Ok(l) if cols.is_multiple_of(l.qk) => Ok(l),
        _ => layout(GgmlType::F32),
    }
}

/// GGUF bytes of a `rows` x `cols` `ty` tensor in the device layout `l`
/// (from [`upload_layout`]): repacked, or dequantized to F32.
pub fn to_device_bytes(
    l: &DeviceLayout,
    ty: GgmlType,
    gguf: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Vec<u8>> {
    if l.ty == ty {
        return l.repack(gguf, rows, cols);
    }
    let mut f = vec![0f32; rows * cols];
    redlite_cpu::matmul::dequantize_into(ty, gguf, &mut f).map_err(|e| {
        CudaError::from(e).context(format!("dequantizing a {ty:?} matrix for the device"))
    })?;
    l.repack(
        &f.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>(),
        rows,
        cols,
    )
}

impl DeviceLayout {
    /// Blocks per row of `cols` values (`cols` must be whole blocks).
    pub fn blocks_per_row(&self, cols: usize) -> Result<usize> {
        if cols == 0 || !cols.is_multiple_of(self.qk) {
            bail!(
                "{:?}: {cols} columns are not whole blocks of {}",
                self.ty,
                self.qk
            );
        }
        Ok(cols / self.qk)
    }

    /// Device bytes of a `rows` x `cols` matrix (equal to the GGUF bytes).
    pub fn matrix_bytes(&self, rows: usize, cols: usize) -> Result<usize> {
        Ok(rows * self.blocks_per_row(cols)? * self.block_bytes)
    }

    /// GGUF bytes (row-major blocks) into the device layout.
    pub fn repack(&self, gguf: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>> {
        let n = rows * self.blocks_per_row(cols)?;
        if gguf.len() != n * self.block_bytes {
            bail!(
                "{:?}: {} bytes for a {rows}x{cols} matrix, expected {}",
                self.ty,
                gguf.len(),
                n * self.block_bytes
            );
        }
        let Some(at) = self.d_at else {
            return Ok(gguf.to_vec());
        };
        let mut out = vec![0u8; gguf.len()];
        let mv = self.moved;
        let (pay, ds) = out.split_at_mut(n * self.payload);
        for (i, blk) in gguf.chunks_exact(self.block_bytes).enumerate() {
            let p = &mut pay[i * self.payload..][..self.payload];
            p[..at].copy_from_slice(&blk[..at]);
            p[at..].copy_from_slice(&blk[at + mv..]);
            ds[mv * i..mv * (i + 1)].copy_from_slice(&blk[at..at + mv]);
        }
        Ok(out)
    }

    /// The inverse of [`Self::repack`].
    pub fn unpack(&self, dev: &[u8], rows: usize, cols: usize) -> Result<Vec<u8>> {
        let n = rows * self.blocks_per_row(cols)?;
        if dev.len() != n * self.block_bytes {
            bail!("{:?}: device matrix has {} bytes", self.ty, dev.len());
        }
        let Some(at) = self.d_at else {
            return Ok(dev.to_vec());
        };
        let (pay, ds) = dev.split_at(n * self.payload);
        let mut out = Vec::with_capacity(dev.len());
        for i in 0..n {
            let p = &pay[i * self.payload..][..self.payload];
            out.extend_from_slice(&p[..at]);
            out.extend_from_slice(&ds[self.moved * i..self.moved * (i + 1)]);
            out.extend_from_slice(&p[at..]);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_match_the_quant_crate() {
        for ty in GEMV_TYPES {
            let l = layout(ty).unwrap();
            if ty == GgmlType::F32 {
                assert_eq!((l.qk, l.block_bytes, l.payload), (32, 128, 128));
                continue;
            }
            assert_eq!(l.qk, ty.block_size(), "{ty:?}");
            assert_eq!(l.block_bytes, ty.type_size(), "{ty:?}");
            // IQ2_XS (72 bytes) and IQ1_M (56): read with loads of <= 8 bytes.
            let align = if matches!(ty, GgmlType::IQ2_XS | GgmlType::IQ1_M) {
                8
            } else {
                16
            };
            assert_eq!(
                l.payload % align,
                0,
                "{ty:?} payload not {align}-byte aligned"
            );
            assert_eq!(l.payload + l.moved, l.block_bytes);
            assert_eq!(l.moved == 0, l.d_at.is_none(), "{ty:?}");
        }
    }

    #[test]
    fn repack_round_trips_and_moves_d() {
        for ty in GEMV_TYPES {
            let l = layout(ty).unwrap();
            let (rows, cols) = (3, 2 * l.qk);
            let src: Vec<u8> = (0..l.matrix_bytes(rows, cols).unwrap())
                .map(|i| (i * 7 + i / 13) as u8)
                .collect();
            let dev = l.repack(&src, rows, cols).unwrap();
            assert_eq!(l.unpack(&dev, rows, cols).unwrap(), src, "{ty:?}");
            if let Some(at) = l.d_at {
                let n = rows * 2;
                let mv = l.moved;
                for i in 0..n {
                    let blk = &src[i * l.block_bytes..];
                    assert_eq!(&dev[n * l.payload + mv * i..][..mv], &blk[at..at + mv]);
                }
            }
        }
        assert!(layout(GgmlType::Q4_K)
            .unwrap()
            .repack(&[0; 10], 1, 256)
            .is_err());
        assert!(layout(GgmlType::Q8_0).unwrap().blocks_per_row(33).is_err());
    }
}
