//! Half-precision helpers shared by the formats.

#[inline(always)]
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

#[inline(always)]
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

#[inline(always)]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// All 65536 f16 values as f32, built on first use (256 KiB). The tile
/// kernels look scales up here instead of converting them one by one: a
/// table load is one instruction where a lone F16C conversion is four, and
/// the values are the same (f16 → f32 is exact either way).
pub fn f16_table() -> &'static [f32; 65536] {
    static TABLE: std::sync::OnceLock<Box<[f32; 65536]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let v: Vec<f32> = (0..=u16::MAX).map(f16_to_f32).collect();
        v.into_boxed_slice().try_into().expect("65536 values")
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_table_is_exact() {
        let t = super::f16_table();
        for bits in 0..=u16::MAX {
            let a = t[bits as usize];
            let b = super::f16_to_f32(bits);
            assert!(
                a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                "{bits:#x}"
            );
        }
    }
}
