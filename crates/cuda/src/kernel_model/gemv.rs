//! Host models of the GEMV kernels' bit manipulation (Q5_0, Q5_K, IQ4_NL,
//! IQ2_XS, IQ1_M) and of the int8-activation dots (`gemv_q8act.cuh`),
//! checked against `redlite_quant`.

use crate::gemv::q8_chunks_per_block;
use crate::layout::layout;
use crate::testdata::{quantize_q8_32, random_weights, Rng};
use redlite_gguf::GgmlType;
use redlite_quant::iquants::tables::{IQ1S_GRID, IQ2XS_GRID, IQ2XXS_GRID, KVALUES_IQ4NL};

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
    let w = |i: usize| u32::from_le_bytes(core::array::from_fn(|k| KVALUES_IQ4NL[4 * i + k] as u8));
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

// ---- int8-activation kernels (`kernels/gemv_q8act.cuh`) ------------
//
// Each `*_chunk` below is the kernel's `load_w` + `load_x` + `dot` for
// one lane chunk, with the same byte offsets, word extractions and
// __dp4a arithmetic, reading the device layout (`DeviceLayout::repack`)
// and int8 activations with one f32 scale per 32 values. A row's dot is
// the sum over its `nb * q8_chunks_per_block` chunks (the lane split
// and the shuffle reduction are the shared body's, tested on the GPU).

/// `__dp4a(a, b, c)`: c + the dot of the four signed bytes of a and b.
fn dp4a(a: u32, b: u32, c: i32) -> i32 {
    (0..4).fold(c, |s, k| {
        s + ((a >> (8 * k)) as u8 as i8 as i32) * ((b >> (8 * k)) as u8 as i8 as i32)
    })
}

/// `iq2_signed`: bytes of g negated where the 4 sign bits say so.
fn iq2_signed(g: u32, bits4: u32) -> u32 {
    let t = bits4.wrapping_mul(0x0020_4081) & 0x0101_0101;
    (g ^ t.wrapping_mul(0xff)).wrapping_add(t)
}

/// One row as a kernel sees it: its payloads, its side entries (f16 d),
/// its int8 activations (as bytes) and their scales.
struct Row<'a> {
    pay: &'a [u8],
    side: &'a [u8],
    xq: &'a [u8],
    xd: &'a [f32],
}

impl Row<'_> {
    /// Word k of the activations' int4 number i.
    fn x(&self, i: usize, k: usize) -> u32 {
        word(self.xq, 16 * i + 4 * k)
    }
    /// The f16 side entry of block b.
    fn d(&self, b: usize) -> f32 {
        f16(self.side, 2 * b)
    }
}

fn q6k_chunk(r: &Row, c: usize) -> f32 {
    let blk = &r.pay[(c >> 2) * 208..];
    let (h, l0) = ((c >> 1) & 1, 16 * (c & 1));
    let a: [u32; 4] = core::array::from_fn(|k| word(blk, 64 * h + l0 + 4 * k));
    let b: [u32; 4] = core::array::from_fn(|k| word(blk, 64 * h + 32 + l0 + 4 * k));
    let qh: [u32; 4] = core::array::from_fn(|k| word(blk, 128 + 32 * h + l0 + 4 * k));
    let sc = [word(blk, 192 + 8 * h), word(blk, 196 + 8 * h)];
    let bi = c >> 2;
    let dx: [f32; 4] = core::array::from_fn(|j| r.xd[4 * (2 * bi + h) + j]);
    let sub_shift = 8 * (c & 1);
    let mut acc = 0f32;
    for (j, &dxj) in dx.iter().enumerate() {
        let lw = if j & 1 == 1 { &b } else { &a };
        let xi = 16 * bi + 8 * h + 2 * j + (c & 1);
        let (mut s, mut sx) = (0, 0);
        for k in 0..4 {
            let q = ((lw[k] >> (4 * (j >> 1))) & 0x0f0f_0f0f)
                | (((qh[k] >> (2 * j)) & 0x0303_0303) << 4);
            s = dp4a(q, r.x(xi, k), s);
            sx = dp4a(0x0101_0101, r.x(xi, k), sx);
        }
        let sw = if j < 2 { sc[0] } else { sc[1] };
        let scv = ((sw >> (16 * (j & 1) + sub_shift)) & 0xff) as u8 as i8 as i32;
        acc = dxj.mul_add((scv * (s - 32 * sx)) as f32, acc);
    }
    r.d(bi) * acc
}

fn iq2_xs_chunk(r: &Row, c: usize) -> f32 {
    let at = (c >> 2) * 72 + 16 * (c & 3);
    let qw: [u32; 4] = core::array::from_fn(|k| word(r.pay, at + 4 * k));
    let scb = (c >> 2) * 72 + 64 + 2 * (c & 3);
    let sc = u16::from_le_bytes([r.pay[scb], r.pay[scb + 1]]) as u32;
    // ContigX<4, 2>: int4 4c..4c+4, scales 2c, 2c+1.
    let xw: [u32; 16] = core::array::from_fn(|i| r.x(4 * c + i / 4, i % 4));
    let mut acc = 0f32;
    for a in 0..2 {
        let mut s16 = [0i32; 2];
        for g in 0..4 {
            let q = (qw[2 * a + (g >> 1)] >> (16 * (g & 1))) & 0xffff;
            let gr = IQ2XS_GRID[(q & 511) as usize];
            let code = q >> 9;
            let signs = code | ((code.count_ones() & 1) << 7);
            let mut s = s16[g >> 1];
            s = dp4a(iq2_signed(gr as u32, signs & 15), xw[8 * a + 2 * g], s);
            s = dp4a(
                iq2_signed((gr >> 32) as u32, signs >> 4),
                xw[8 * a + 2 * g + 1],
                s,
            );
            s16[g >> 1] = s;
        }
        let sb = (sc >> (8 * a)) & 0xff;
        let isum = (2 * (sb & 15) + 1) as i32 * s16[0] + (2 * (sb >> 4) + 1) as i32 * s16[1];
        acc = r.xd[2 * c + a].mul_add(isum as f32, acc);
    }
    0.125 * r.d(c >> 2) * acc
}

fn iq1_m_chunk(r: &Row, c: usize) -> f32 {
    let blk = &r.pay[(c >> 2) * 56..];
    let k = c & 3;
    let qsw = [word(blk, 8 * k), word(blk, 8 * k + 4)];
    let qh = word(blk, 32 + 4 * k);
    let (sx0, sx1) = (word(blk, 48), word(blk, 52));
    let dbits = ((sx0 & 0xffff) >> 12)
        | ((sx0 >> 24) & 0xf0)
        | (((sx1 & 0xffff) >> 4) & 0xf00)
        | ((sx1 >> 16) & 0xf000);
    let scw = (if k >> 1 == 1 { sx1 } else { sx0 }) >> (16 * (k & 1));
    let xw: [u32; 16] = core::array::from_fn(|i| r.x(4 * c + i / 4, i % 4));
    let mut acc = 0f32;
    for a in 0..2 {
        let mut isum = 0i32;
        for h in 0..2 {
            let mut s = 0i32;
            for g in 0..2 {
                let l = 4 * a + 2 * h + g;
                let nib = (qh >> (4 * l)) & 15;
                let idx = ((qsw[l >> 2] >> (8 * (l & 3))) & 0xff) | ((nib & 7) << 8);
                let gr = IQ1S_GRID[idx as usize];
                let sg = dp4a(
                    (gr >> 32) as u32,
                    xw[2 * l + 1],
                    dp4a(gr as u32, xw[2 * l], 0),
                );
                let sx = dp4a(0x0101_0101, xw[2 * l + 1], dp4a(0x0101_0101, xw[2 * l], 0));
                s += 8 * sg + if nib & 8 != 0 { -sx } else { sx };
            }
            isum += (2 * ((scw >> (3 * (2 * a + h))) & 7) + 1) as i32 * s;
        }
        acc = r.xd[2 * c + a].mul_add(isum as f32, acc);
    }
    0.125 * half::f16::from_bits(dbits as u16).to_f32() * acc
}

fn dequant_row(ty: GgmlType, row: &[u8], cols: usize) -> Vec<f32> {
    let mut w = vec![0f32; cols];
    redlite_cpu::matmul::dequantize_into(ty, row, &mut w).unwrap();
    w
}

const Q8_MODELLED: [GgmlType; 3] = [GgmlType::Q6_K, GgmlType::IQ2_XS, GgmlType::IQ1_M];

/// The modelled kernel's dot of every row of a GGUF `ty` matrix with
/// int8 activations `xq` (scales `xd`, one per 32 values).
fn model_gemv(
    ty: GgmlType,
    gguf: &[u8],
    rows: usize,
    cols: usize,
    xq: &[i8],
    xd: &[f32],
) -> Vec<f32> {
    let l = layout(ty).unwrap();
    let dev = l.repack(gguf, rows, cols).unwrap();
    let nb = l.blocks_per_row(cols).unwrap();
    let (pay, side) = dev.split_at(rows * nb * l.payload);
    let xq: Vec<u8> = xq.iter().map(|&v| v as u8).collect();
    let chunk = match ty {
        GgmlType::Q6_K => q6k_chunk,
        GgmlType::IQ2_XS => iq2_xs_chunk,
        GgmlType::IQ1_M => iq1_m_chunk,
        other => panic!("no model of the {other:?} int8 kernel"),
    };
    let nch = nb * q8_chunks_per_block(ty);
    (0..rows)
        .map(|row| {
            let r = Row {
                pay: &pay[row * nb * l.payload..][..nb * l.payload],
                side: &side[(row * nb * l.moved).min(side.len())..],
                xq: &xq,
                xd,
            };
            (0..nch).map(|c| chunk(&r, c)).sum()
        })
        .collect()
}

/// |got - want| within 1e-5 of Σ|w_i·x_i| (f32 rounding of a few
/// hundred terms); one wrong bit of a value or a sub-scale moves the dot
/// by ~1e-3 of that sum or more.
fn assert_close(ty: GgmlType, got: f32, want: f64, mag: f64, what: &str) {
    assert!(
        (got as f64 - want).abs() <= 1e-5 * mag,
        "{ty:?} {what}: model {got}, reference {want} (Σ|w·x| {mag})"
    );
}

/// Against `redlite_quant`'s scalar Q8_K dot: the 8 activation blocks of
/// each 256 share one scale (Q8_K has one per 256), which the model
/// gets per 32.
#[test]
fn q8act_models_match_the_cpu_q8k_dot() {
    let mut rng = Rng(11);
    for ty in Q8_MODELLED {
        let l = layout(ty).unwrap();
        let (rows, cols) = (6, 1024);
        let g = random_weights(&l, rows, cols, &mut rng);
        let xq: Vec<i8> = (0..cols)
            .map(|_| (rng.below(255) as i32 - 127) as i8)
            .collect();
        let dk: Vec<f32> = (0..cols / 256)
            .map(|_| 0.001 + rng.uniform().abs() * 0.05)
            .collect();
        let xd: Vec<f32> = (0..cols / 32).map(|i| dk[i / 8]).collect();
        let mut act = Vec::new();
        for (b, q) in xq.chunks_exact(256).enumerate() {
            act.extend_from_slice(&dk[b].to_le_bytes());
            act.extend(q.iter().map(|&v| v as u8));
            for s in q.chunks_exact(16) {
                let sum: i16 = s.iter().map(|&v| v as i16).sum();
                act.extend_from_slice(&sum.to_le_bytes());
            }
        }
        let k = redlite_quant::kernels(ty).unwrap();
        assert_eq!(k.vec_dot_type, GgmlType::Q8_K);
        let got = model_gemv(ty, &g, rows, cols, &xq, &xd);
        let row_bytes = g.len() / rows;
        for (row, &y) in got.iter().enumerate() {
            let rb = &g[row * row_bytes..][..row_bytes];
            let want = (k.dot_reference)(rb, &act) as f64;
            let w = dequant_row(ty, rb, cols);
            let mag: f64 = (0..cols)
                .map(|i| (w[i] as f64 * xq[i] as f64 * xd[i / 32] as f64).abs())
                .sum();
            assert_close(ty, y, want, mag, &format!("row {row}"));
        }
    }
}

/// Against the dequantized weights dotted in f64 with x as
/// `quantize_q8_32` gives it: a different scale per 32 values, so a
/// chunk that scaled a 32-value piece by its neighbour's scale fails.
#[test]
fn q8act_models_match_the_dequantized_reference() {
    let mut rng = Rng(12);
    for ty in Q8_MODELLED {
        let l = layout(ty).unwrap();
        for (rows, cols) in [(1, 256), (5, 768), (4, 2048)] {
            let g = random_weights(&l, rows, cols, &mut rng);
            // Scale each 32 differently so the per-block scales differ
            // by orders of magnitude.
            let x: Vec<f32> = (0..cols)
                .map(|i| rng.uniform() * (1 + (i / 32) % 7) as f32)
                .collect();
            let (xq, xd) = quantize_q8_32(&x);
            let got = model_gemv(ty, &g, rows, cols, &xq, &xd);
            let row_bytes = g.len() / rows;
            for (row, &y) in got.iter().enumerate() {
                let w = dequant_row(ty, &g[row * row_bytes..][..row_bytes], cols);
                let terms = (0..cols).map(|i| w[i] as f64 * xq[i] as f64 * xd[i / 32] as f64);
                let want: f64 = terms.clone().sum();
                let mag: f64 = terms.map(f64::abs).sum();
                assert_close(ty, y, want, mag, &format!("{rows}x{cols} row {row}"));
            }
        }
    }
}

/// `grid_h2` (gemm_common.cuh), word for word: PRMT under the high byte
/// 0x50 (32 + x/32), the f16 subtraction of 32 and product with 32 times
/// the scale (each rounded to nearest even: f32 holds the exact results,
/// so one rounding to f16 is the device's), the sign bits by the
/// 0x40008000 multiply.
fn grid_h2(grid: u64, signs: u32, scale: f32) -> [f32; 8] {
    let d2 = half::f16::from_f32(32.0 * scale);
    let mut out = [0f32; 8];
    for w in 0..4 {
        let g4 = if w < 2 {
            grid as u32
        } else {
            (grid >> 32) as u32
        };
        let sel = if w & 1 == 1 { 0x4342 } else { 0x4140 };
        let biased = byte_perm(g4, 0x5050_5050, sel);
        let mask = (signs >> (2 * w)).wrapping_mul(0x4000_8000) & 0x8000_8000;
        for half_i in 0..2 {
            let h = half::f16::from_bits((biased >> (16 * half_i)) as u16);
            let mag = half::f16::from_f32(h.to_f32() - 32.0);
            let prod = half::f16::from_f32(mag.to_f32() * d2.to_f32());
            let bits = prod.to_bits() ^ ((mask >> (16 * half_i)) as u16);
            out[2 * w + half_i] = half::f16::from_bits(bits).to_f32();
        }
    }
    out
}

/// Two roundings to f16 (the scale, then the product): within one f16 ulp
/// of the exact value (2^-10 relative), or of f16's subnormal spacing.
fn assert_f16_close(got: f32, want: f32, what: &str) {
    let tol = want.abs() * (1.0 / 1024.0) + 6.0e-8;
    assert!((got - want).abs() <= tol, "{what}: {got} vs {want}");
}

#[test]
fn iq2_xxs_f16_fragments_match_the_cpu() {
    let l = layout(GgmlType::IQ2_XXS).unwrap();
    let g = random_weights(&l, 1, 256 * 32, &mut Rng(8));
    for blk in g.chunks_exact(66) {
        let want = dequant(GgmlType::IQ2_XXS, blk);
        let d = f16(blk, 0);
        for sub in 0..8 {
            let (idx, aux) = (word(blk, 2 + 8 * sub), word(blk, 2 + 8 * sub + 4));
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for l in 0..4 {
                let code = (aux >> (7 * l)) & 127;
                let signs = code | ((code.count_ones() & 1) << 7);
                let grid = IQ2XXS_GRID[((idx >> (8 * l)) & 0xff) as usize];
                for (k, v) in grid_h2(grid, signs, db).into_iter().enumerate() {
                    let i = 32 * sub + 8 * l + k;
                    assert_f16_close(v, want[i], &format!("iq2_xxs value {i}"));
                }
            }
        }
    }
}

#[test]
fn iq2_xs_f16_fragments_match_the_cpu() {
    let l = layout(GgmlType::IQ2_XS).unwrap();
    let g = random_weights(&l, 1, 256 * 32, &mut Rng(9));
    for blk in g.chunks_exact(74) {
        let want = dequant(GgmlType::IQ2_XS, blk);
        let d = f16(blk, 0);
        for sub in 0..8 {
            let sc = blk[2 + 64 + sub] as u32;
            let w = word(blk, 2 + 8 * sub);
            let w2 = word(blk, 2 + 8 * sub + 4);
            for l in 0..4 {
                let r = if l < 2 { w } else { w2 };
                let q = (r >> (16 * (l & 1))) & 0xffff;
                let s = d * 0.25 * (0.5 + ((if l < 2 { sc } else { sc >> 4 }) & 15) as f32);
                let code = q >> 9;
                let signs = code | ((code.count_ones() & 1) << 7);
                let grid = IQ2XS_GRID[(q & 511) as usize];
                for (k, v) in grid_h2(grid, signs, s).into_iter().enumerate() {
                    let i = 32 * sub + 8 * l + k;
                    assert_f16_close(v, want[i], &format!("iq2_xs value {i}"));
                }
            }
        }
    }
}
