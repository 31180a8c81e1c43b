//! Host models of the bit manipulation in the Q5_0, Q5_K, IQ4_NL, IQ2_XS
//! and IQ1_M GEMV kernels (`kernels/gemv_{q5_0,q5k,iq4_nl,iq2_xs,iq1_m}.cu`), word for word, checked
//! against `redlite_quant`'s dequantization: the integer logic is tested
//! here without a GPU; `redlite selftest` tests the kernels themselves.

#[cfg(test)]
mod tests {
    use crate::layout::layout;
    use crate::testdata::{random_weights, Rng};
    use redlite_gguf::GgmlType;
    use redlite_quant::iquants::tables::{IQ1S_GRID, IQ2XS_GRID, KVALUES_IQ4NL};

    fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
        let b = (x as u64) | ((y as u64) << 32);
        (0..4).fold(0, |acc, k| {
            let sel = (s >> (4 * k)) & 7;
            acc | ((((b >> (8 * sel)) & 0xff) as u32) << (8 * k))
        })
    }

    fn bits_to_b4(nib: u32) -> u32 {
        ((nib.wrapping_mul(0x0020_4081)) & 0x0101_0101) << 4
    }

    fn iq4nl_lookup(q: u32) -> u32 {
        let w =
            |i: usize| u32::from_le_bytes(core::array::from_fn(|k| KVALUES_IQ4NL[4 * i + k] as u8));
        let t = (q & 0x0707_0707) | ((q & 0x0707_0707) >> 4);
        let sel = (t & 0xff) | ((t >> 8) & 0xff00);
        let lo = byte_perm(w(0), w(1), sel);
        let hi = byte_perm(w(2), w(3), sel);
        let m = ((q >> 3) & 0x0101_0101) * 0xff;
        (lo & !m) | (hi & m)
    }

    fn word(b: &[u8], at: usize) -> u32 {
        u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
    }

    fn dequant(ty: GgmlType, blk: &[u8]) -> Vec<f32> {
        let mut w = vec![0f32; ty.block_size()];
        redlite_cpu::matmul::dequantize_into(ty, blk, &mut w).unwrap();
        w
    }

    fn f16(b: &[u8], at: usize) -> f32 {
        half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
    }

    #[test]
    fn q5_0_unpacking_matches_the_cpu() {
        let l = layout(GgmlType::Q5_0).unwrap();
        let g = random_weights(&l, 1, 32 * 64, &mut Rng(3));
        for blk in g.chunks_exact(22) {
            let want = dequant(GgmlType::Q5_0, blk);
            let (d, qh) = (f16(blk, 0), word(blk, 2));
            for w in 0..4 {
                let qw = word(blk, 6 + 4 * w);
                let lo = (qw & 0x0f0f_0f0f) | bits_to_b4((qh >> (4 * w)) & 15);
                let hi = ((qw >> 4) & 0x0f0f_0f0f) | bits_to_b4((qh >> (16 + 4 * w)) & 15);
                for k in 0..4 {
                    let ql = ((lo >> (8 * k)) & 0xff) as f32 - 16.0;
                    let qhv = ((hi >> (8 * k)) & 0xff) as f32 - 16.0;
                    assert_eq!(d * ql, want[4 * w + k]);
                    assert_eq!(d * qhv, want[16 + 4 * w + k]);
                }
            }
        }
    }

    #[test]
    fn q5_k_unpacking_matches_the_cpu() {
        let l = layout(GgmlType::Q5_K).unwrap();
        let g = random_weights(&l, 1, 256 * 16, &mut Rng(4));
        for blk in g.chunks_exact(176) {
            let want = dequant(GgmlType::Q5_K, blk);
            let (d, dmin) = (f16(blk, 0), f16(blk, 2));
            let (s0, s1, s2) = (word(blk, 4), word(blk, 8), word(blk, 12));
            let scale_min = |j: usize| {
                let by = |w: u32, k: usize| (w >> (8 * k)) & 0xff;
                if j < 4 {
                    (by(s0, j) & 63, by(s1, j) & 63)
                } else {
                    let k = j - 4;
                    (
                        (by(s2, k) & 15) | ((by(s0, k) >> 6) << 4),
                        (by(s2, k) >> 4) | ((by(s1, k) >> 6) << 4),
                    )
                }
            };
            for sub in 0..8 {
                let (c, l0) = (sub / 2, (sub % 2) * 16);
                for w in 0..4 {
                    let qw = word(blk, 48 + 32 * c + l0 + 4 * w);
                    let hw = word(blk, 16 + l0 + 4 * w);
                    let lo = (qw & 0x0f0f_0f0f) | (((hw >> (2 * c)) & 0x0101_0101) << 4);
                    let hi = ((qw >> 4) & 0x0f0f_0f0f) | (((hw >> (2 * c + 1)) & 0x0101_0101) << 4);
                    for k in 0..4 {
                        for (j, v) in [(2 * c, lo), (2 * c + 1, hi)] {
                            let (sc, m) = scale_min(j);
                            let q = ((v >> (8 * k)) & 0xff) as f32;
                            let i = 32 * j + l0 + 4 * w + k;
                            let got = d * sc as f32 * q - dmin * m as f32;
                            assert!((got - want[i]).abs() <= 1e-6 * want[i].abs().max(1e-3));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn iq4_nl_lookup_matches_the_cpu() {
        let l = layout(GgmlType::IQ4_NL).unwrap();
        let g = random_weights(&l, 1, 32 * 64, &mut Rng(5));
        for blk in g.chunks_exact(18) {
            let want = dequant(GgmlType::IQ4_NL, blk);
            let d = f16(blk, 0);
            for w in 0..4 {
                let qw = word(blk, 2 + 4 * w);
                let lo = iq4nl_lookup(qw & 0x0f0f_0f0f);
                let hi = iq4nl_lookup((qw >> 4) & 0x0f0f_0f0f);
                for k in 0..4 {
                    let vl = ((lo >> (8 * k)) & 0xff) as u8 as i8 as f32;
                    let vh = ((hi >> (8 * k)) & 0xff) as u8 as i8 as f32;
                    assert_eq!(d * vl, want[4 * w + k]);
                    assert_eq!(d * vh, want[16 + 4 * w + k]);
                }
            }
        }
    }

    #[test]
    fn iq2_xs_unpacking_matches_the_cpu() {
        let l = layout(GgmlType::IQ2_XS).unwrap();
        let g = random_weights(&l, 1, 256 * 16, &mut Rng(6));
        for blk in g.chunks_exact(74) {
            let want = dequant(GgmlType::IQ2_XS, blk);
            let d = f16(blk, 0) * 0.25;
            for sub in 0..8 {
                let sc = blk[2 + 64 + sub] as u32;
                for l in 0..4 {
                    let q = word(blk, 2 + 8 * sub + 4 * (l / 2)) >> (16 * (l % 2)) & 0xffff;
                    let grid = IQ2XS_GRID[(q & 511) as usize];
                    let code = q >> 9;
                    let signs = code | ((code.count_ones() & 1) << 7);
                    let s = if l < 2 { sc & 15 } else { sc >> 4 };
                    for k in 0..8 {
                        let mag = ((grid >> (8 * k)) & 0xff) as f32;
                        let v = if signs >> k & 1 == 1 { -mag } else { mag };
                        let got = d * (0.5 + s as f32) * v;
                        let i = 32 * sub + 8 * l + k;
                        assert!(
                            (got - want[i]).abs() <= 1e-6 * want[i].abs().max(1e-3),
                            "{i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn iq1_m_unpacking_matches_the_cpu() {
        let l = layout(GgmlType::IQ1_M).unwrap();
        let g = random_weights(&l, 1, 256 * 16, &mut Rng(7));
        for blk in g.chunks_exact(56) {
            let want = dequant(GgmlType::IQ1_M, blk);
            let (swx, swy) = (word(blk, 48), word(blk, 52));
            let dbits = ((swx & 0xffff) >> 12)
                | ((swx >> 24) & 0xf0)
                | (((swy & 0xffff) >> 4) & 0xf00)
                | ((swy >> 16) & 0xf000);
            let d = half::f16::from_bits(dbits as u16).to_f32();
            for sub in 0..8 {
                let qs = word(blk, 4 * sub);
                let qh = u16::from_le_bytes([blk[32 + 2 * sub], blk[33 + 2 * sub]]) as u32;
                let scw = match sub >> 1 {
                    0 => swx,
                    1 => swx >> 16,
                    2 => swy,
                    _ => swy >> 16,
                } & 0xffff;
                let sh = 6 * (sub & 1);
                for l in 0..4 {
                    let nib = (qh >> (4 * l)) & 15;
                    let grid = IQ1S_GRID[((qs >> (8 * l)) & 0xff | ((nib & 7) << 8)) as usize];
                    let delta = if nib & 8 != 0 { -0.125 } else { 0.125 };
                    let sc = 2 * ((scw >> (sh + 3 * (l / 2))) & 7) + 1;
                    for k in 0..8 {
                        let gv = ((grid >> (8 * k)) & 0xff) as u8 as i8 as f32;
                        let got = d * sc as f32 * (gv + delta);
                        let i = 32 * sub + 8 * l + k;
                        assert!(
                            (got - want[i]).abs() <= 1e-6 * want[i].abs().max(1e-6),
                            "{i}"
                        );
                    }
                }
            }
        }
    }
}
