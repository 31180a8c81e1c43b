//! Host model of the tensor-core f16 decode attention
//! (`kernels/attention_mma.cu`): every lane's fragments, the two MMA shapes
//! as PTX lays them out (m16n8k16 and m16n8k8, f16 in, f32 sums), the
//! online softmax across a warp's tiles and the merge of the warps, checked
//! against a float64 softmax attention. The kernel's index mapping (which
//! dims a lane's K and query fragments hold, which V dims and positions
//! its PRMT pairs make, which heads its accumulators are) is what this
//! tests without a GPU; `redlite selftest` tests the kernel itself.

// Loops over lane numbers index several per-lane arrays at once, as the
// kernel's lanes do.
#![allow(clippy::needless_range_loop)]

use crate::testdata::{random_vec, Rng};
use half::f16;

const WARPS: usize = 4;
const TILE: usize = 8;

fn h(x: f32) -> u32 {
    f16::from_f32(x).to_bits() as u32
}
fn pack(lo: f32, hi: f32) -> u32 {
    h(lo) | (h(hi) << 16)
}
fn lo(w: u32) -> f32 {
    f16::from_bits(w as u16).to_f32()
}
fn hi(w: u32) -> f32 {
    f16::from_bits((w >> 16) as u16).to_f32()
}
fn byte_perm(x: u32, y: u32, s: u32) -> u32 {
    let b = (x as u64) | ((y as u64) << 32);
    (0..4).fold(0, |acc, k| {
        let sel = (s >> (4 * k)) & 7;
        acc | ((((b >> (8 * sel)) & 0xff) as u32) << (8 * k))
    })
}

/// m16n8k16, A row-major (a0: row g cols 2t,2t+1; a1: row g+8; a2: row g
/// cols 2t+8,2t+9; a3: row g+8), B column-major (b0: rows 2t,2t+1 of
/// column g; b1: rows 2t+8,2t+9), D (d0,d1: row g cols 2t,2t+1; d2,d3:
/// row g+8).
fn mma_16816(d: &mut [[f32; 4]; 32], a: &[[u32; 4]; 32], b: &[[u32; 2]; 32]) {
    let (mut am, mut bm) = ([[0f32; 16]; 16], [[0f32; 8]; 16]);
    for l in 0..32 {
        let (g, t) = (l / 4, l % 4);
        for (r, c, w) in [
            (g, 2 * t, a[l][0]),
            (g + 8, 2 * t, a[l][1]),
            (g, 2 * t + 8, a[l][2]),
            (g + 8, 2 * t + 8, a[l][3]),
        ] {
            am[r][c] = lo(w);
            am[r][c + 1] = hi(w);
        }
        for (k, w) in [(2 * t, b[l][0]), (2 * t + 8, b[l][1])] {
            bm[k][g] = lo(w);
            bm[k + 1][g] = hi(w);
        }
    }
    for l in 0..32 {
        let (g, t) = (l / 4, l % 4);
        for (e, (r, c)) in [
            (g, 2 * t),
            (g, 2 * t + 1),
            (g + 8, 2 * t),
            (g + 8, 2 * t + 1),
        ]
        .into_iter()
        .enumerate()
        {
            d[l][e] += (0..16).map(|k| am[r][k] * bm[k][c]).sum::<f32>();
        }
    }
}

/// m16n8k8: A (a0: row g cols 2t,2t+1; a1: row g+8), B (b0: rows 2t,2t+1
/// of column g), D as m16n8k16's.
fn mma_1688(d: &mut [[f32; 4]; 32], a: &[[u32; 2]; 32], b: &[u32; 32]) {
    let (mut am, mut bm) = ([[0f32; 8]; 16], [[0f32; 8]; 8]);
    for l in 0..32 {
        let (g, t) = (l / 4, l % 4);
        for (r, w) in [(g, a[l][0]), (g + 8, a[l][1])] {
            am[r][2 * t] = lo(w);
            am[r][2 * t + 1] = hi(w);
        }
        bm[2 * t][g] = lo(b[l]);
        bm[2 * t + 1][g] = hi(b[l]);
    }
    for l in 0..32 {
        let (g, t) = (l / 4, l % 4);
        for (e, (r, c)) in [
            (g, 2 * t),
            (g, 2 * t + 1),
            (g + 8, 2 * t),
            (g + 8, 2 * t + 1),
        ]
        .into_iter()
        .enumerate()
        {
            d[l][e] += (0..8).map(|k| am[r][k] * bm[k][c]).sum::<f32>();
        }
    }
}

/// The f16 words of `row[at..at + 8]` (a 16-byte shared load).
fn words(row: &[f32], at: usize) -> [u32; 4] {
    core::array::from_fn(|w| pack(row[at + 2 * w], row[at + 2 * w + 1]))
}

/// One block of the kernel: heads h0..h0+hb of KV head `kvh` over
/// positions [start, end) of caches [pos][n_kv][hd] (f16 values as f32).
/// Returns (m in natural-log units, l, unnormalised o) per head.
#[allow(clippy::too_many_arguments)]
fn block(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_kv: usize,
    hd: usize,
    kvh: usize,
    h0: usize,
    hb: usize,
    start: usize,
    end: usize,
    scale: f32,
) -> Vec<(f32, f32, Vec<f32>)> {
    let (np, nq) = (hd / 32, hd / 64);
    let qs = scale * std::f32::consts::LOG2_E;
    // qa[lane][i]: head g's dims 8(t + 4i) .. +8, zero past hb.
    let qa: Vec<Vec<[u32; 4]>> = (0..32)
        .map(|l| {
            let (g, t) = (l / 4, l % 4);
            (0..np)
                .map(|i| {
                    let row: Vec<f32> = (0..hd)
                        .map(|d| {
                            if g < hb {
                                q[(h0 + g) * hd + d] * qs
                            } else {
                                0.0
                            }
                        })
                        .collect();
                    words(&row, 8 * (t + 4 * i))
                })
                .collect()
        })
        .collect();
    let row_of = |c: &[f32], p: usize| -> Vec<f32> {
        if p < end {
            c[(p * n_kv + kvh) * hd..][..hd].to_vec()
        } else {
            vec![0.0; hd]
        }
    };
    let ntiles = (end - start).div_ceil(TILE);
    let mut warps = Vec::new();
    for w in 0..WARPS {
        let (mut m, mut l) = ([f32::NEG_INFINITY; 32], [0f32; 32]);
        let mut o = vec![[[0f32; 4]; 32]; 4 * nq];
        for tile in (w..ntiles).step_by(WARPS) {
            let p0 = start + tile * TILE;
            let kt: Vec<Vec<f32>> = (0..TILE).map(|r| row_of(k, p0 + r)).collect();
            let vt: Vec<Vec<f32>> = (0..TILE).map(|r| row_of(v, p0 + r)).collect();
            let mut s = [[0f32; 4]; 32];
            for i in 0..np {
                let kk: Vec<[u32; 4]> = (0..32)
                    .map(|l| words(&kt[l / 4], 8 * (l % 4 + 4 * i)))
                    .collect();
                let a0: [[u32; 4]; 32] = core::array::from_fn(|l| [qa[l][i][0], 0, qa[l][i][1], 0]);
                let b0: [[u32; 2]; 32] = core::array::from_fn(|l| [kk[l][0], kk[l][1]]);
                mma_16816(&mut s, &a0, &b0);
                let a1: [[u32; 4]; 32] = core::array::from_fn(|l| [qa[l][i][2], 0, qa[l][i][3], 0]);
                let b1: [[u32; 2]; 32] = core::array::from_fn(|l| [kk[l][2], kk[l][3]]);
                mma_16816(&mut s, &a1, &b1);
            }
            let (mut corr, mut pb) = ([1f32; 32], [0u32; 32]);
            for ln in 0..32 {
                let (g, t) = (ln / 4, ln % 4);
                let sc = |e: usize| {
                    if p0 + 2 * t + e < end {
                        s[ln][e]
                    } else {
                        f32::NEG_INFINITY
                    }
                };
                // The tile max over the 4 lanes of head g (two xor shuffles).
                let mt = (0..4)
                    .flat_map(|tt| {
                        let p = p0 + 2 * tt;
                        let row = &s[4 * g + tt];
                        [
                            if p < end { row[0] } else { f32::NEG_INFINITY },
                            if p + 1 < end {
                                row[1]
                            } else {
                                f32::NEG_INFINITY
                            },
                        ]
                    })
                    .fold(f32::NEG_INFINITY, f32::max);
                let m_new = m[ln].max(mt);
                let (mut ea, mut eb) = (0.0, 0.0);
                if m_new != f32::NEG_INFINITY {
                    corr[ln] = (m[ln] - m_new).exp2();
                    ea = (sc(0) - m_new).exp2();
                    eb = (sc(1) - m_new).exp2();
                }
                l[ln] = l[ln] * corr[ln] + ea + eb;
                m[ln] = m_new;
                pb[ln] = pack(ea, eb);
            }
            for ln in 0..32 {
                let t = ln % 4;
                let (ca, cb) = (corr[8 * t], corr[8 * t + 4]);
                for acc in o.iter_mut() {
                    acc[ln][0] *= ca;
                    acc[ln][1] *= cb;
                    acc[ln][2] *= ca;
                    acc[ln][3] *= cb;
                }
            }
            for qq in 0..nq {
                let va: Vec<[u32; 4]> = (0..32)
                    .map(|l| words(&vt[2 * (l % 4)], 64 * qq + 8 * (l / 4)))
                    .collect();
                let vb: Vec<[u32; 4]> = (0..32)
                    .map(|l| words(&vt[2 * (l % 4) + 1], 64 * qq + 8 * (l / 4)))
                    .collect();
                for j in 0..4 {
                    let a: [[u32; 2]; 32] = core::array::from_fn(|l| {
                        [
                            byte_perm(va[l][j], vb[l][j], 0x5410),
                            byte_perm(va[l][j], vb[l][j], 0x7632),
                        ]
                    });
                    mma_1688(&mut o[4 * qq + j], &a, &pb);
                }
            }
        }
        // Head g's sum over its 4 lanes; its O from the lanes holding it.
        let mut ho = vec![vec![0f32; hd]; 8];
        for ln in 0..32 {
            let (g, t) = (ln / 4, ln % 4);
            for qq in 0..nq {
                for j in 0..4 {
                    let d = 64 * qq + 8 * g + 2 * j;
                    let c = o[4 * qq + j][ln];
                    ho[2 * t][d] = c[0];
                    ho[2 * t + 1][d] = c[1];
                    ho[2 * t][d + 1] = c[2];
                    ho[2 * t + 1][d + 1] = c[3];
                }
            }
        }
        let heads: Vec<(f32, f32)> = (0..8)
            .map(|g| (m[4 * g], (0..4).map(|t| l[4 * g + t]).sum()))
            .collect();
        warps.push((heads, ho));
    }
    (0..hb)
        .map(|hh| {
            let mx = warps
                .iter()
                .map(|w| w.0[hh].0)
                .fold(f32::NEG_INFINITY, f32::max);
            let f = |w: &(Vec<(f32, f32)>, Vec<Vec<f32>>)| {
                if w.0[hh].0 == f32::NEG_INFINITY {
                    0.0
                } else {
                    (w.0[hh].0 - mx).exp2()
                }
            };
            let lsum = warps.iter().map(|w| w.0[hh].1 * f(w)).sum();
            let o = (0..hd)
                .map(|d| warps.iter().map(|w| f(w) * w.1[hh][d]).sum())
                .collect();
            (mx * std::f32::consts::LN_2, lsum, o)
        })
        .collect()
}

/// Softmax attention of head `h` over positions 0..n in f64.
#[allow(clippy::too_many_arguments)]
fn reference(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_head: usize,
    n_kv: usize,
    hd: usize,
    n: usize,
    h: usize,
    scale: f64,
) -> Vec<f64> {
    let kvh = h / (n_head / n_kv);
    let s: Vec<f64> = (0..n)
        .map(|p| {
            (0..hd)
                .map(|d| q[h * hd + d] as f64 * k[(p * n_kv + kvh) * hd + d] as f64)
                .sum::<f64>()
                * scale
        })
        .collect();
    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|x| (x - mx).exp()).collect();
    let z: f64 = e.iter().sum();
    (0..hd)
        .map(|d| {
            (0..n)
                .map(|p| e[p] * v[(p * n_kv + kvh) * hd + d] as f64)
                .sum::<f64>()
                / z
        })
        .collect()
}

#[test]
fn tensor_core_decode_attention_matches_the_f64_softmax() {
    let rng = &mut Rng(0xa77);
    // (query heads, KV heads, head_dim, positions, slices): Qwen3-Next's
    // group of 8 at 256 dims, Qwen2.5's group of 7, a group of 2, partial
    // tiles, slices that leave warps or whole blocks without a tile.
    for (nh, nkv, hd, n, nsplit) in [
        (16, 2, 256, 77, 2),
        (14, 2, 64, 45, 1),
        (4, 2, 128, 203, 3),
        (8, 1, 64, 5, 4),
        (16, 2, 64, 61, 1),
    ] {
        let q: Vec<f32> = random_vec(nh * hd, rng).iter().map(|x| x * 3.0).collect();
        let f16v = |x: &f32| f16::from_f32(*x).to_f32();
        let k: Vec<f32> = random_vec(n * nkv * hd, rng).iter().map(f16v).collect();
        let v: Vec<f32> = random_vec(n * nkv * hd, rng).iter().map(f16v).collect();
        let scale = 1.0 / (hd as f32).sqrt();
        let g = nh / nkv;
        let hb = (1..=g.min(8)).rev().find(|b| g % b == 0).unwrap();
        let chunk = n.div_ceil(nsplit);
        for kvh in 0..nkv {
            for grp in 0..g / hb {
                let h0 = kvh * g + grp * hb;
                // attn_merge over the slices.
                let parts: Vec<_> = (0..nsplit)
                    .filter(|s| s * chunk < n)
                    .map(|s| {
                        block(
                            &q,
                            &k,
                            &v,
                            nkv,
                            hd,
                            kvh,
                            h0,
                            hb,
                            s * chunk,
                            n.min((s + 1) * chunk),
                            scale,
                        )
                    })
                    .collect();
                for hh in 0..hb {
                    let mx = parts
                        .iter()
                        .map(|p| p[hh].0)
                        .fold(f32::NEG_INFINITY, f32::max);
                    let w: Vec<f32> = parts.iter().map(|p| (p[hh].0 - mx).exp()).collect();
                    let z: f32 = parts.iter().zip(&w).map(|(p, w)| p[hh].1 * w).sum();
                    let want = reference(&q, &k, &v, nh, nkv, hd, n, h0 + hh, scale as f64);
                    let top = want.iter().fold(0f64, |a, b| a.max(b.abs()));
                    for d in 0..hd {
                        let got: f32 = parts
                            .iter()
                            .zip(&w)
                            .map(|(p, w)| p[hh].2[d] * w)
                            .sum::<f32>()
                            / z;
                        let err = (got as f64 - want[d]).abs() / top;
                        assert!(
                            err < 4e-3,
                            "{nh}q/{nkv}kv x {hd}, n {n}, head {}, dim {d}: {got} vs {} ({err:e})",
                            h0 + hh,
                            want[d]
                        );
                    }
                }
            }
        }
    }
}
