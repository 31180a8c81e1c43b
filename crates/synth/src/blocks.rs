//! Random but valid quantized blocks, built directly (no quantizer).
//!
//! Every block draws its bits from its own [`BlockRng`] stream (key of the
//! tensor, block index as counter). Index, sign and sub-scale fields are
//! uniformly random — every bit pattern of those fields is a valid grid
//! index, sign pattern or scale in these formats — and the block's f16
//! super-scale `d` is one per tensor, chosen from a calibration so that the
//! dequantized weights have the wanted standard deviation:
//!
//! | type | random fields | set fields |
//! |---|---|---|
//! | Q4_K | 4-bit quants; 6-bit sub-scales in 16..=47 | `d`; `dmin = 8d`; 6-bit mins `round(sc·7.5/8)` (zero mean) |
//! | Q6_K | 6-bit quants; i8 sub-scales in 16..=63 | `d` |
//! | IQ2_XXS | grid indices, sign indices, 4-bit scales | `d` |
//! | IQ2_XS | grid indices, sign indices, 4-bit scales | `d` |
//! | IQ1_M | grid indices, shift signs, 3-bit scales | the f16 `d` spread over the scales' top nibbles |

use crate::rng::BlockRng;
use crate::SynthError;
use redlite_gguf::GgmlType;
use redlite_quant::f16util::{f16_to_f32, f32_to_f16};

/// The types this module can generate.
pub const TYPES: &[GgmlType] = &[
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ1_M,
];

/// Fill one block of `ty` (its `type_size()` bytes) with super-scale `d`
/// (as f16 bits).
#[inline]
fn fill_block(ty: GgmlType, d: u16, rng: &mut BlockRng, b: &mut [u8]) {
    match ty {
        GgmlType::Q4_K => {
            // d, dmin, scales[12], qs[128]
            let dmin = f32_to_f16(f16_to_f32(d) * 8.0);
            b[0..2].copy_from_slice(&d.to_le_bytes());
            b[2..4].copy_from_slice(&dmin.to_le_bytes());
            let mut sc = [0u8; 8];
            let mut mn = [0u8; 8];
            let r = rng.next_u64();
            for j in 0..8 {
                let s = 16 + ((r >> (5 * j)) & 31) as u8; // 16..=47
                sc[j] = s;
                mn[j] = ((f32::from(s) * 7.5 / 8.0).round() as u8).min(63);
            }
            let scales = &mut b[4..16];
            scales.fill(0);
            // Packing of ggml's quantize_row_q4_K_ref.
            for j in 0..8 {
                let (ls, lm) = (sc[j], mn[j]);
                if j < 4 {
                    scales[j] = ls;
                    scales[j + 4] = lm;
                } else {
                    scales[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
                    scales[j - 4] |= (ls >> 4) << 6;
                    scales[j] |= (lm >> 4) << 6;
                }
            }
            rng.fill(&mut b[16..144]);
        }
        GgmlType::Q6_K => {
            // ql[128], qh[64], scales[16] (i8), d
            rng.fill(&mut b[0..192]);
            let r = [rng.next_u64(), rng.next_u64()];
            for k in 0..16 {
                let byte = (r[k / 8] >> (8 * (k % 8))) as u8;
                b[192 + k] = 16 + byte % 48; // 16..=63
            }
            b[208..210].copy_from_slice(&d.to_le_bytes());
        }
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS => {
            b[0..2].copy_from_slice(&d.to_le_bytes());
            rng.fill(&mut b[2..]);
        }
        GgmlType::IQ1_M => {
            // qs[32], qh[16], scales[8] = four u16 whose top nibbles hold d.
            rng.fill(b);
            for k in 0..4 {
                let off = 48 + 2 * k;
                let v = u16::from_le_bytes([b[off], b[off + 1]]);
                let v = (v & 0x0fff) | (((d >> (4 * k)) & 0xf) << 12);
                b[off..off + 2].copy_from_slice(&v.to_le_bytes());
            }
        }
        _ => unreachable!("fill_block called for a type outside TYPES"),
    }
}

/// Fill whole blocks `first_block..` of a tensor whose key is `key`.
pub fn fill_blocks(
    ty: GgmlType,
    d: u16,
    key: u64,
    first_block: u64,
    out: &mut [u8],
) -> Result<(), SynthError> {
    fill_blocks_with(ty, |_| d, key, first_block, out)
}

/// [`fill_blocks`] with the super-scale of block `b` given by `d(b)`
/// (0 gives an all-zero block; the random fields are the same).
pub fn fill_blocks_with(
    ty: GgmlType,
    d: impl Fn(u64) -> u16,
    key: u64,
    first_block: u64,
    out: &mut [u8],
) -> Result<(), SynthError> {
    if !TYPES.contains(&ty) {
        return Err(SynthError::NoGenerator(ty));
    }
    let ts = ty.type_size();
    if !out.len().is_multiple_of(ts) {
        return Err(SynthError::Io(format!(
            "{} bytes are not whole {ty} blocks",
            out.len()
        )));
    }
    for (i, b) in out.chunks_exact_mut(ts).enumerate() {
        let bi = first_block + i as u64;
        let mut rng = BlockRng::new(key, bi);
        fill_block(ty, d(bi), &mut rng, b);
    }
    Ok(())
}

/// The RMS of dequantized weights of `ty` generated with `d = 1`
/// (measured on 2048 blocks with a fixed key, through `redlite_quant`).
pub fn unit_rms(ty: GgmlType) -> Result<f64, SynthError> {
    const N: usize = 2048;
    let mut bytes = vec![0u8; N * ty.type_size()];
    fill_blocks(ty, f32_to_f16(1.0), 0x5eed_ca1b, 0, &mut bytes)?;
    let mut y = vec![0f32; N * ty.block_size()];
    redlite_quant::dequantize(ty, &bytes, &mut y)?;
    let ss: f64 = y.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
    Ok((ss / y.len() as f64).sqrt())
}

/// The f16 bits of the super-scale that gives weights of standard
/// deviation `std` in `ty`.
pub fn scale_for(ty: GgmlType, std: f64) -> Result<u16, SynthError> {
    Ok(f32_to_f16((std / unit_rms(ty)?) as f32))
}
