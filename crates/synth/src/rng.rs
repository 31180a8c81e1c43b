//! A counter-based random generator: every block of every tensor gets its
//! own stream, keyed by (seed, tensor name) and counted by block index, so
//! the bytes do not depend on thread count, chunking, tensor order or how
//! many layers the file has.

/// SplitMix64's finaliser: a bijective 64-bit mixer.
#[inline]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of one tensor: the seed mixed with an FNV-1a hash of its name.
pub fn tensor_key(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(seed ^ mix64(h))
}

/// One stream (wyrand), started from (key, counter).
#[derive(Clone, Debug)]
pub struct BlockRng {
    state: u64,
}

impl BlockRng {
    #[inline]
    pub fn new(key: u64, counter: u64) -> BlockRng {
        BlockRng {
            state: mix64(key ^ mix64(counter.wrapping_add(0x9e37_79b9_7f4a_7c15))),
        }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.state) * u128::from(self.state ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Fill `out` with random bytes.
    #[inline]
    pub fn fill(&mut self, out: &mut [u8]) {
        let mut chunks = out.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let v = self.next_u64().to_le_bytes();
            rest.copy_from_slice(&v[..rest.len()]);
        }
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    #[inline]
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform integer in [lo, hi] (hi - lo small).
    #[inline]
    pub fn int_in(&mut self, lo: u32, hi: u32) -> u32 {
        let span = u64::from(hi - lo + 1);
        lo + (((self.next_u64() >> 32) * span) >> 32) as u32
    }

    /// Standard normal (Box-Muller, one value per call).
    #[inline]
    pub fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.unit(); // (0, 1]
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_differ_and_repeat() {
        let k = tensor_key(1, "blk.0.ffn_up_exps.weight");
        assert_ne!(k, tensor_key(2, "blk.0.ffn_up_exps.weight"));
        assert_ne!(k, tensor_key(1, "blk.1.ffn_up_exps.weight"));
        let a: Vec<u64> = (0..4).map(|_| BlockRng::new(k, 7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(
            BlockRng::new(k, 7).next_u64(),
            BlockRng::new(k, 8).next_u64()
        );
        let mut r = BlockRng::new(k, 0);
        let n = 100_000;
        let (mut s, mut s2) = (0.0, 0.0);
        for _ in 0..n {
            let x = r.normal();
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(
            mean.abs() < 0.02 && (var - 1.0).abs() < 0.02,
            "{mean} {var}"
        );
        for _ in 0..1000 {
            let v = r.int_in(3, 9);
            assert!((3..=9).contains(&v));
        }
    }
}
