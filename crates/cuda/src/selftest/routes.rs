//! `redlite selftest` row of the prefill's routed tile list built on the
//! device (`kernels/route_tiles.cu`, [`crate::ops::route_tiles_device`])
//! against the host's [`route_tiles`], on random top-k routes, and
//! [`route_violations`], the checks themselves (host code, unit-tested).

use super::ops::up;
use crate::device::Gpu;
use crate::error::Result;
use crate::gemv::{route_tiles, RouteTiles, GEMM_TILE};
use crate::ops::{self, DeviceRoutes};
use crate::selftest::Worst;
use crate::testdata::{random_routes, Rng};

/// A tile list as read back: its triples (`count` of them), the pairs'
/// tokens and each (token, choice)'s pair.
pub struct Routes<'a> {
    pub count: i32,
    pub tiles: &'a [i32],
    pub gather: &'a [i32],
    pub pair_of: &'a [i32],
}

/// What is wrong with `got` as the routes of `experts` (top-`k` over
/// `n_expert`), against the host's `want`: 0 when the tile count is the
/// host's, every tile names one expert and at most 64 pairs, the tiles
/// cover every pair once, `pair_of[j]` names a pair of token j / k whose
/// tile is expert `experts[j]`'s (each pair named once), every expert has
/// the host's multiset of tokens, and the lists equal the host's entry for
/// entry (the kernel keeps the host's order). Each wrong entry counts one.
pub fn route_violations(
    experts: &[u32],
    k: usize,
    n_expert: usize,
    got: &Routes,
    want: &RouteTiles,
) -> usize {
    let np = experts.len();
    let mut bad = 0;
    let want_count = want.tiles.len() / 3;
    if got.count as usize != want_count {
        bad += 1;
    }
    let count = got.count.max(0) as usize;
    if 3 * count > got.tiles.len() || got.gather.len() < np || got.pair_of.len() < np {
        return bad + 1;
    }
    // The expert each pair's tile names (None: no tile covers it).
    let mut owner: Vec<Option<u32>> = vec![None; np];
    for t in got.tiles[..3 * count].chunks_exact(3) {
        let (e, p0, p1) = (t[0], t[1], t[2]);
        let ok = e >= 0
            && (e as usize) < n_expert
            && p0 >= 0
            && p0 < p1
            && p1 as usize <= np
            && (p1 - p0) as usize <= GEMM_TILE;
        if !ok {
            bad += 1;
            continue;
        }
        for o in &mut owner[p0 as usize..p1 as usize] {
            if o.is_some() {
                bad += 1;
            }
            *o = Some(e as u32);
        }
    }
    bad += owner.iter().filter(|o| o.is_none()).count();
    let mut named = vec![false; np];
    for (j, &e) in experts.iter().enumerate() {
        let p = got.pair_of[j];
        if p < 0 || p as usize >= np {
            bad += 1;
            continue;
        }
        let p = p as usize;
        bad += named[p] as usize;
        named[p] = true;
        bad += (owner[p] != Some(e)) as usize;
        bad += (got.gather[p] != (j / k) as i32) as usize;
    }
    // Each expert's tokens, as a sorted list, against the host's.
    let tokens_of = |tiles: &[i32], gather: &[i32], n: usize| {
        let mut per = vec![Vec::new(); n_expert];
        for t in tiles[..3 * n].chunks_exact(3) {
            if let Some(v) = per.get_mut(t[0].max(0) as usize) {
                for p in t[1].max(0)..t[2].min(np as i32) {
                    v.push(gather[p as usize]);
                }
            }
        }
        per.iter_mut().for_each(|v| v.sort_unstable());
        per
    };
    let (a, b) = (
        tokens_of(got.tiles, got.gather, count),
        tokens_of(&want.tiles, &want.gather, want_count),
    );
    bad += a.iter().zip(&b).filter(|(x, y)| x != y).count();
    // Entry for entry the host's.
    let differ = |x: &[i32], y: &[i32]| {
        x.iter().zip(y).filter(|(a, b)| a != b).count() + x.len().abs_diff(y.len())
    };
    bad += differ(&got.tiles[..3 * count], &want.tiles);
    bad += differ(&got.gather[..np], &want.gather);
    bad += differ(&got.pair_of[..np], &want.pair_of);
    bad
}

/// One case of random routes: `n` tokens' top-`k` of `n_expert`
/// experts, the experts of `fixed` chosen by that many tokens each.
pub struct RouteCase {
    pub n: usize,
    pub k: usize,
    pub n_expert: usize,
    pub fixed: Vec<(u32, usize)>,
}

/// The selftest's cases: 512 experts with top-10 (Qwen3-Next's) at 2048
/// and 4096 tokens and at few; experts of 0, 1, 64 and 65 pairs and of
/// several tiles; 1024 experts (a block of 16 warps), 700 (23, not a
/// power of two), 8 (every tile full).
pub fn route_cases() -> Vec<RouteCase> {
    let sizes = vec![(3, 0), (17, 1), (100, 64), (101, 65), (511, 200)];
    let case = |n, k, n_expert, fixed| RouteCase {
        n,
        k,
        n_expert,
        fixed,
    };
    vec![
        case(2048, 10, 512, sizes.clone()),
        case(4096, 10, 512, sizes),
        case(1, 10, 512, vec![]),
        case(7, 10, 512, vec![(5, 0), (6, 1), (7, 7)]),
        case(37, 10, 512, vec![(0, 37), (1, 1)]),
        case(300, 8, 1024, vec![(1023, 65), (0, 64), (512, 0)]),
        case(130, 1, 700, vec![(699, 65)]),
        case(100, 2, 8, vec![(7, 100), (0, 0)]),
    ]
}

/// `route_tiles` on the device against the host's over [`route_cases`], each
/// run twice (identical: no order that varies between runs); outputs
/// poisoned with -1 first. "abs": the worst case's wrong entries.
pub fn run(gpu: &Gpu, rng: &mut Rng) -> Result<Worst> {
    let mut w = Worst::new(
        "route_tiles (prefill routed tiles on the device) vs the host's route_tiles, entry for entry"
            .into(),
    );
    for RouteCase {
        n,
        k,
        n_expert,
        fixed,
    } in route_cases()
    {
        let experts = random_routes(rng, n, k, n_expert, &fixed);
        let want = route_tiles(&experts, k, n_expert)?;
        let np = n * k;
        let bound = ops::max_route_tiles(np, n_expert);
        let ed = up(gpu, &experts)?;
        let mut runs = Vec::new();
        for _ in 0..2 {
            let (td, gd, pd, cd) = (
                up(gpu, &vec![-1i32; 3 * bound.max(1)])?,
                up(gpu, &vec![-1i32; np])?,
                up(gpu, &vec![-1i32; np])?,
                up(gpu, &[-1i32])?,
            );
            let out = DeviceRoutes {
                tiles: &td,
                gather: &gd,
                pair_of: &pd,
                count: &cd,
            };
            let b = ops::route_tiles_device(gpu, &ed, np, k, n_expert, &out)?;
            crate::error::ensure!(b == bound, "route tiles: bound {b}, expected {bound}");
            gpu.sync()?;
            let s = &gpu.stream;
            runs.push((
                s.clone_dtoh(&cd)?[0],
                s.clone_dtoh(&td)?,
                s.clone_dtoh(&gd)?,
                s.clone_dtoh(&pd)?,
            ));
        }
        let (count, tiles, gather, pair_of) = &runs[0];
        let got = Routes {
            count: *count,
            tiles,
            gather,
            pair_of,
        };
        let mut bad = route_violations(&experts, k, n_expert, &got, &want);
        bad += (runs[0] != runs[1]) as usize;
        w.cases += 1;
        w.max_abs = w.max_abs.max(bad as f64);
        w.all_written &= bad == 0;
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(experts: &[u32], k: usize, n_expert: usize, got: &RouteTiles) -> usize {
        let want = route_tiles(experts, k, n_expert).unwrap();
        let r = Routes {
            count: (got.tiles.len() / 3) as i32,
            tiles: &got.tiles,
            gather: &got.gather,
            pair_of: &got.pair_of,
        };
        route_violations(experts, k, n_expert, &r, &want)
    }

    /// The host's own lists pass on every case's routes; each kind of
    /// damage is caught.
    #[test]
    fn violations_catch_each_kind_of_damage() {
        let mut rng = Rng(3);
        for RouteCase {
            n,
            k,
            n_expert: e,
            fixed,
        } in route_cases()
        {
            let experts = random_routes(&mut rng, n, k, e, &fixed);
            // The fixed experts' counts hold, every token's set is distinct.
            for &(fe, c) in &fixed {
                assert_eq!(experts.iter().filter(|&&x| x == fe).count(), c);
            }
            for t in experts.chunks(k) {
                assert!(t.windows(2).all(|w| w[0] < w[1]), "{t:?}");
            }
            let rt = route_tiles(&experts, k, e).unwrap();
            assert_eq!(check(&experts, k, e, &rt), 0, "n {n} k {k} e {e}");
            assert!(rt.tiles.len() / 3 <= ops::max_route_tiles(n * k, e));
        }
        let experts = random_routes(&mut rng, 200, 4, 16, &[(3, 130)]);
        let rt = route_tiles(&experts, 4, 16).unwrap();
        // A tile of 65 pairs: the expert of 130 pairs has tiles of 64, 64
        // and 2; the first's end and the second's start moved by one.
        let mut t = rt.clone();
        let i = t.tiles.chunks(3).position(|c| c[0] == 3).unwrap();
        t.tiles[3 * i + 2] += 1;
        t.tiles[3 * i + 4] += 1;
        assert!(check(&experts, 4, 16, &t) > 0, "65-pair tile");
        // Two pairs swapped in the gather list only.
        let mut t = rt.clone();
        let (a, b) = (0, t.gather.iter().position(|&g| g != t.gather[0]).unwrap());
        t.gather.swap(a, b);
        assert!(check(&experts, 4, 16, &t) > 0, "gather");
        // pair_of naming another pair.
        let mut t = rt.clone();
        t.pair_of[5] = t.pair_of[6];
        assert!(check(&experts, 4, 16, &t) > 0, "pair_of");
        // A tile dropped (count one short).
        let mut t = rt.clone();
        t.tiles.truncate(t.tiles.len() - 3);
        assert!(check(&experts, 4, 16, &t) > 0, "dropped tile");
        // The pairs of one expert in another order: everything but the
        // entry-for-entry comparison holds.
        let mut t = rt.clone();
        let (p0, p1) = (t.tiles[3 * i + 1] as usize, t.tiles[3 * i + 2] as usize);
        t.gather[p0..p1].reverse();
        for (j, &e) in experts.iter().enumerate() {
            let p = t.pair_of[j] as usize;
            if e == 3 && (p0..p1).contains(&p) {
                t.pair_of[j] = (p0 + p1 - 1 - p) as i32;
            }
        }
        let want = route_tiles(&experts, 4, 16).unwrap();
        let r = Routes {
            count: (t.tiles.len() / 3) as i32,
            tiles: &t.tiles,
            gather: &t.gather,
            pair_of: &t.pair_of,
        };
        let bad = route_violations(&experts, 4, 16, &r, &want);
        assert_eq!(bad, 2 * (p1 - p0 - (p1 - p0) % 2), "only the order differs");
    }
}
