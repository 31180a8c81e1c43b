//! Shared helpers of the integration tests: a small deterministic RNG and
//! random valid blocks for every format this crate's legacy and K-quant
//! modules handle.
#![allow(dead_code)]

use redlite_quant::GgmlType;
use std::path::PathBuf;

pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// xorshift64* — deterministic, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    pub fn range(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.f32()
    }
    /// Approximately standard normal (sum of uniforms).
    pub fn normal(&mut self) -> f32 {
        (0..4).map(|_| self.f32()).sum::<f32>() * 1.732 - 3.464
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// Finite f16 of magnitude 2^-8 .. 1, random sign.
    pub fn moderate_f16(&mut self) -> [u8; 2] {
        let mag = 2f32.powf(self.range(-8.0, 0.0));
        let v = if self.f32() < 0.5 { -mag } else { mag };
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }
}

/// Byte offsets of the f16 scale fields of one block (as in
/// scripts/make_quant_fixtures.py).
pub fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        _ => &[],
    }
}

/// `n` elements of `ty` as random valid bytes: random payload, moderate
/// finite scales (floats: finite values of moderate size).
pub fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    assert_eq!(n % bs, 0);
    match ty {
        GgmlType::F32 => (0..n)
            .flat_map(|_| (rng.normal() * 2.0).to_le_bytes())
            .collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| {
                half::f16::from_f32(rng.normal() * 2.0)
                    .to_bits()
                    .to_le_bytes()
            })
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| {
                half::bf16::from_f32(rng.normal() * 2.0)
                    .to_bits()
                    .to_le_bytes()
            })
            .collect(),
        _ => {
            let mut v = rng.bytes(n / bs * ts);
            for blk in v.chunks_exact_mut(ts) {
                for &o in f16_fields(ty) {
                    blk[o..o + 2].copy_from_slice(&rng.moderate_f16());
                }
            }
            v
        }
    }
}

/// Random activations with a per-call magnitude.
pub fn random_acts(rng: &mut Rng, n: usize) -> Vec<f32> {
    let scale = 2f32.powf(rng.range(-4.0, 4.0));
    (0..n).map(|_| rng.normal() * scale).collect()
}

pub fn read_f32(path: &std::path::Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Every weight type the legacy and K-quant modules provide.
pub const MY_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];
