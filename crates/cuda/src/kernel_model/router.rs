//! Host model of `router_topk` (`kernels/router.cu`), step for step: the
//! softmax with the kernel's f64 summation order, the bitwise search for
//! the k-th largest key with its early stop, the tie rule, the block prefix
//! counts that order the chosen by expert, and the selection-order renorm.
//! `f32::exp` stands in for the device's `expf`: the model checks the
//! selection and ordering logic, which is exact, not the exp.

use crate::testdata::Rng;

/// p's order as an unsigned integer (NaN lowest), as `router_key`.
fn key(p: f32) -> u32 {
    if p.is_nan() {
        0
    } else {
        p.to_bits()
    }
}

/// The kernel's p: max, then lane L adds e[L], e[L+32], ... in f64,
/// then the xor tree over the 32 lanes (lane 0's result).
fn softmax(logits: &[f32]) -> (Vec<f32>, f32) {
    let mx = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let e: Vec<f32> = logits.iter().map(|&x| (x - mx).exp()).collect();
    let mut lane: Vec<f64> = (0..32)
        .map(|l| e.iter().skip(l).step_by(32).fold(0.0, |s, &v| s + v as f64))
        .collect();
    for o in [16, 8, 4, 2, 1] {
        lane = (0..32).map(|l| lane[l] + lane[l ^ o]).collect();
    }
    let inv = (1.0 / lane[0]) as f32;
    (e.iter().map(|&v| v * inv).collect(), inv)
}

/// What the kernel selects from `p`, ascending by expert; how many
/// barriers its bitwise search took, and whether it needed the tie rule.
fn select(p: &[f32], inv: f32, k: usize, norm: bool) -> (Vec<(u32, f32)>, usize, bool) {
    let keys: Vec<u32> = p.iter().map(|&v| key(v)).collect();
    let count = |f: &dyn Fn(u32) -> bool| keys.iter().filter(|&&x| f(x)).count();
    let (mut thr, mut cnt, mut bits) = (0u32, p.len(), 0);
    let key_max = key(inv);
    if key_max != 0 {
        let mut b = 31 - key_max.leading_zeros() as i32;
        while b >= 0 && cnt != k {
            let c = thr | (1 << b);
            let m = count(&|x| x >= c);
            bits += 1;
            if m >= k {
                thr = c;
                cnt = m;
            }
            b -= 1;
        }
    }
    let chosen: Vec<bool> = if cnt == k {
        keys.iter().map(|&x| x >= thr).collect()
    } else {
        let above = count(&|x| x > thr);
        let mut ties_before = 0;
        keys.iter()
            .map(|&x| {
                let tie = x == thr;
                let c = x > thr || (tie && ties_before < k - above);
                ties_before += tie as usize;
                c
            })
            .collect()
    };
    // the block prefix count: chosen in ascending expert order
    let win: Vec<(u32, f32)> = (0..p.len())
        .filter(|&e| chosen[e])
        .map(|e| (e as u32, p[e]))
        .collect();
    assert_eq!(win.len(), k, "exactly k chosen");
    // lane i's rank in selection order, then the sum in that order
    let mut ord = vec![f32::NAN; k];
    for (i, &(_, pi)) in win.iter().enumerate() {
        let ki = key(pi);
        let rank = (0..k)
            .filter(|&j| {
                let kj = key(win[j].1);
                kj > ki || (kj == ki && j < i)
            })
            .count();
        ord[rank] = pi;
    }
    let s = ord.iter().fold(0.0f32, |s, &v| s + v);
    let out = win
        .iter()
        .map(|&(e, pi)| (e, if norm { pi / s } else { pi }))
        .collect();
    (out, bits, cnt != k)
}

/// The old one-warp kernel's semantics, by sorting: p descending, ties
/// to the lower index; the renorm sum in that order; by expert id.
fn by_sort(p: &[f32], k: usize, norm: bool) -> Vec<(u32, f32)> {
    let mut idx: Vec<usize> = (0..p.len()).collect();
    idx.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
    let chosen = &idx[..k];
    let s = chosen.iter().fold(0.0f32, |s, &e| s + p[e]);
    let mut out: Vec<(u32, f32)> = chosen
        .iter()
        .map(|&e| (e as u32, if norm { p[e] / s } else { p[e] }))
        .collect();
    out.sort_by_key(|c| c.0);
    out
}

/// Model and sort agree bit for bit (weights compared as bits).
fn check(logits: &[f32], k: usize, norm: bool, what: &str) -> (usize, bool) {
    let (p, inv) = softmax(logits);
    let (got, bits, tied) = select(&p, inv, k, norm);
    let want = by_sort(&p, k, norm);
    let bits_of = |v: &[(u32, f32)]| v.iter().map(|&(e, w)| (e, w.to_bits())).collect::<Vec<_>>();
    assert_eq!(
        bits_of(&got),
        bits_of(&want),
        "{what}: n {} k {k}",
        logits.len()
    );
    (bits, tied)
}

const SIZES: [usize; 14] = [1, 2, 5, 31, 32, 33, 64, 100, 128, 257, 512, 513, 1000, 1024];
const KS: [usize; 7] = [1, 2, 4, 8, 10, 31, 32];

#[test]
fn random_logits_match_a_sort() {
    let mut rng = Rng(21);
    for n in SIZES {
        for k in KS.into_iter().filter(|&k| k <= n).chain([n.min(32)]) {
            for (scale, norm) in [(1.0, true), (4.0, false), (30.0, true)] {
                for _ in 0..3 {
                    let l: Vec<f32> = (0..n).map(|_| scale * rng.uniform()).collect();
                    check(&l, k, norm, &format!("random x{scale}"));
                }
            }
        }
    }
}

/// Ties: few distinct logits, all equal, exact duplicates of the top,
/// and p underflowing to 0 (or denormals) for most experts, so the k-th
/// largest is tied with many.
#[test]
fn ties_match_a_sort() {
    let mut rng = Rng(22);
    let mut tied = 0;
    for n in SIZES {
        for k in KS.into_iter().filter(|&k| k <= n).chain([n.min(32)]) {
            let few: Vec<f32> = (0..n).map(|_| rng.below(3) as f32).collect();
            tied += check(&few, k, true, "three values").1 as usize;
            tied += check(&vec![0.5; n], k, true, "all equal").1 as usize;
            let mut dup: Vec<f32> = (0..n).map(|_| rng.uniform()).collect();
            for _ in 0..k.min(n) {
                let (a, b) = (rng.below(n), rng.below(n));
                dup[a] = 2.0;
                dup[b] = 2.0;
            }
            tied += check(&dup, k, false, "duplicated top").1 as usize;
            let spike: Vec<f32> = (0..n)
                .map(|i| {
                    if i % 7 == 3 {
                        200.0
                    } else {
                        rng.uniform() * 100.0 - 10.0
                    }
                })
                .collect();
            tied += check(&spike, k, true, "underflow").1 as usize;
            let steps: Vec<f32> = (0..n)
                .map(|_| (rng.uniform() * 4.0).round() * 0.25)
                .collect();
            tied += check(&steps, k, true, "quarter steps").1 as usize;
        }
    }
    assert!(tied > 100, "the tie rule was exercised {tied} times");
}

/// The early stop is what makes the kernel fast: on router-like logits
/// the search takes far fewer than the ~30 bits (barriers) of p.
#[test]
fn search_stops_early_on_random_logits() {
    let mut rng = Rng(23);
    for (n, k) in [(128, 8), (512, 10), (256, 8), (1024, 32)] {
        let runs = 50;
        let total: usize = (0..runs)
            .map(|_| {
                let l: Vec<f32> = (0..n).map(|_| 3.0 * rng.uniform()).collect();
                check(&l, k, true, "early stop").0
            })
            .sum();
        let mean = total as f64 / runs as f64;
        eprintln!("router search, n {n} k {k}: {mean:.1} bits on average");
        assert!(mean < 20.0, "n {n} k {k}: {mean} bits on average");
    }
}
