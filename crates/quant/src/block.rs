//! Sound views of raw bytes as block structs.
//!
//! Tensor data comes from memory-mapped files with no alignment promise
//! beyond 32 bytes for the tensor start, and rows inside a tensor start at
//! arbitrary multiples of the block size. Every block struct in this crate
//! is therefore built from byte arrays only (alignment 1) and multi-byte
//! fields are decoded explicitly as little-endian.

use core::mem::{align_of, size_of};

/// A block layout that may be viewed in place over any bytes.
///
/// # Safety
///
/// Implementors must be `#[repr(C)]` structs made only of `u8`/`i8` arrays
/// (so alignment is 1, there is no padding, and every bit pattern is a valid
/// value). [`cast_blocks`] also checks the alignment at compile time.
pub unsafe trait Block: Copy + 'static {}

/// View `bytes` as a slice of blocks.
///
/// Panics if `bytes.len()` is not a whole number of blocks.
#[inline]
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> &[B] {
    const { assert!(align_of::<B>() == 1 && size_of::<B>() > 0) };
    let size = size_of::<B>();
    assert!(
        bytes.len().is_multiple_of(size),
        "{} bytes are not a whole number of {size}-byte blocks",
        bytes.len()
    );
    // SAFETY: `B: Block` promises a padding-free struct of byte arrays, so
    // any initialized bytes form valid values and alignment 1 (checked at
    // compile time above) is satisfied by every address. The length is
    // exactly `bytes.len() / size` blocks (checked above), so the new slice
    // covers the same memory with the same lifetime and mutability.
    unsafe { core::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / size) }
}

/// View `bytes` as a mutable slice of blocks.
///
/// Panics if `bytes.len()` is not a whole number of blocks.
#[inline]
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> &mut [B] {
    const { assert!(align_of::<B>() == 1 && size_of::<B>() > 0) };
    let size = size_of::<B>();
    assert!(
        bytes.len().is_multiple_of(size),
        "{} bytes are not a whole number of {size}-byte blocks",
        bytes.len()
    );
    let n = bytes.len() / size;
    // SAFETY: as in `cast_blocks`; additionally every bit pattern written
    // through `&mut B` is a valid `u8` sequence, and the exclusive borrow of
    // `bytes` is moved into the result, so no aliasing is created.
    unsafe { core::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<B>(), n) }
}

/// View blocks as their bytes.
#[inline]
pub fn blocks_as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    const { assert!(align_of::<B>() == 1 && size_of::<B>() > 0) };
    // SAFETY: `B: Block` has no padding, so all `size_of_val(blocks)` bytes
    // are initialized; `u8` has alignment 1; the borrow is carried over.
    unsafe {
        core::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), core::mem::size_of_val(blocks))
    }
}

/// Little-endian `u16` from two bytes.
#[inline(always)]
pub fn le_u16(b: [u8; 2]) -> u16 {
    u16::from_le_bytes(b)
}

/// f16 (IEEE half, little-endian bytes) to f32.
#[inline(always)]
pub fn f16_le(b: [u8; 2]) -> f32 {
    crate::f16util::f16_to_f32(u16::from_le_bytes(b))
}

/// f32 to f16 little-endian bytes (round to nearest even).
#[inline(always)]
pub fn f16_le_from(x: f32) -> [u8; 2] {
    crate::f16util::f32_to_f16(x).to_le_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy)]
    #[repr(C)]
    struct Three {
        a: [u8; 2],
        b: [u8; 1],
    }
    // SAFETY: byte arrays only.
    unsafe impl Block for Three {}

    #[test]
    fn cast_at_every_offset() {
        let buf: Vec<u8> = (0..64u8).collect();
        for off in 0..7 {
            let s = &buf[off..off + 3 * 5];
            let b = cast_blocks::<Three>(s);
            assert_eq!(b.len(), 5);
            for (i, blk) in b.iter().enumerate() {
                assert_eq!(blk.a, [s[3 * i], s[3 * i + 1]]);
                assert_eq!(blk.b, [s[3 * i + 2]]);
            }
            assert_eq!(blocks_as_bytes(b), s);
        }
        let mut buf2 = buf.clone();
        let m = cast_blocks_mut::<Three>(&mut buf2[1..10]);
        m[2].b = [200];
        assert_eq!(buf2[9], 200);
    }

    #[test]
    #[should_panic(expected = "whole number")]
    fn cast_rejects_partial() {
        let buf = [0u8; 7];
        let _ = cast_blocks::<Three>(&buf);
    }
}
