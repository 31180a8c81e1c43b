//! Host model of `route_tiles` (`kernels/route_tiles.cu`), step for step:
//! one contiguous segment of pairs per warp walked in batches of 32-lane
//! groups, the per-(warp, expert) u16 counters with their wrapping, the
//! sums down the warps and over the experts each thread owns, the tile
//! writes, and the second walk that places the pairs. Checked against the
//! host's `route_tiles` (entry for entry), and for memory safety where the
//! kernel's preconditions do not hold.

use crate::gemv::{route_tiles, GEMM_TILE};
use crate::ops::{max_route_tiles, route_warps};
use crate::selftest::routes::{route_cases, RouteCase};
use crate::testdata::{random_routes, Rng};

const BATCH: usize = 8;
const NONE: u32 = u32::MAX;

/// The kernel's (tiles of its count, gather, pair_of). Indexed loops
/// as the kernel's, so the two read side by side.
#[allow(clippy::needless_range_loop)]
fn model(
    experts: &[u32],
    k: usize,
    n_expert: usize,
    warps: usize,
) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let (np, e_n) = (experts.len(), n_expert);
    let mut cnt = vec![0u16; warps * e_n];
    let seg = np.div_ceil(warps);
    let bounds = |w: usize| {
        let j0 = (w * seg).min(np);
        (j0, (j0 + seg).min(np))
    };
    // The 32 lanes' ids of one group.
    let group = |base: usize, u: usize, j1: usize| -> [u32; 32] {
        std::array::from_fn(|lane| {
            let j = base + 32 * u + lane;
            if j < j1 {
                experts[j].min(e_n as u32 - 1)
            } else {
                NONE
            }
        })
    };
    // Lane `lane`'s __match_any_sync mask, and its rank below it.
    let matched = |ids: &[u32; 32], lane: usize| {
        let same = (0..32).filter(|&l| ids[l] == ids[lane]).count();
        let rank = (0..lane).filter(|&l| ids[l] == ids[lane]).count();
        (same, rank)
    };
    for w in 0..warps {
        let (j0, j1) = bounds(w);
        for base in (j0..j1).step_by(32 * BATCH) {
            for u in 0..BATCH {
                let ids = group(base, u, j1);
                for lane in 0..32 {
                    let (same, rank) = matched(&ids, lane);
                    if ids[lane] != NONE && rank == 0 {
                        let c = &mut cnt[w * e_n + ids[lane] as usize];
                        *c = c.wrapping_add(same as u16);
                    }
                }
            }
        }
    }
    let threads = 32 * warps;
    let per = e_n.div_ceil(threads);
    let mut start = vec![0i32; e_n];
    let (mut pairs, mut ntile) = (vec![0i32; threads], vec![0i32; threads]);
    for t in 0..threads {
        let e0 = (t * per).min(e_n);
        for e in e0..(e0 + per).min(e_n) {
            let mut c = 0i32;
            for w in 0..warps {
                let v = cnt[w * e_n + e] as i32;
                cnt[w * e_n + e] = c as u16;
                c += v;
            }
            start[e] = c;
            pairs[t] += c;
            ntile[t] += (c + GEMM_TILE as i32 - 1) / GEMM_TILE as i32;
        }
    }
    let total: i32 = ntile.iter().sum();
    let mut tiles = vec![-1i32; 3 * max_route_tiles(np, e_n)];
    let (mut p_at, mut t_at) = (0i32, 0i32);
    for t in 0..threads {
        let (mut pairs_t, mut tile_t) = (p_at, t_at);
        p_at += pairs[t];
        t_at += ntile[t];
        let e0 = (t * per).min(e_n);
        for e in e0..(e0 + per).min(e_n) {
            let (c, end) = (start[e], pairs_t + start[e]);
            start[e] = pairs_t;
            let mut p = pairs_t;
            while p < end {
                let at = 3 * tile_t as usize;
                tiles[at..at + 3].copy_from_slice(&[e as i32, p, (p + GEMM_TILE as i32).min(end)]);
                p += GEMM_TILE as i32;
                tile_t += 1;
            }
            pairs_t += c;
        }
    }
    tiles.truncate(3 * total as usize);
    let (mut gather, mut pair_of) = (vec![-1i32; np], vec![-1i32; np]);
    for w in 0..warps {
        let (j0, j1) = bounds(w);
        for base in (j0..j1).step_by(32 * BATCH) {
            for u in 0..BATCH {
                let ids = group(base, u, j1);
                let mine = |e: u32| w * e_n + e as usize;
                for lane in 0..32 {
                    if ids[lane] != NONE {
                        let (_, rank) = matched(&ids, lane);
                        let j = base + 32 * u + lane;
                        let p =
                            start[ids[lane] as usize] + cnt[mine(ids[lane])] as i32 + rank as i32;
                        // The kernel's writes: in bounds whatever the
                        // ids (the test below relies on this index).
                        gather[p as usize] = (j / k) as i32;
                        pair_of[j] = p;
                    }
                }
                for lane in 0..32 {
                    let (same, rank) = matched(&ids, lane);
                    if ids[lane] != NONE && rank == 0 {
                        let c = &mut cnt[mine(ids[lane])];
                        *c = c.wrapping_add(same as u16);
                    }
                }
            }
        }
    }
    (tiles, gather, pair_of)
}

/// The model gives the host's lists entry for entry on the selftest's
/// cases (Qwen3-Next's 512 experts and top-10 at 2048 and 4096 tokens,
/// few tokens: warps with no pairs, the 16- and 23-warp blocks of 1024
/// and 700 experts) and on pair counts that end mid-group and
/// mid-batch.
#[test]
fn model_matches_the_host_lists() {
    let mut rng = Rng(41);
    let mut cases = route_cases();
    cases.extend(
        [(3, 1, 512), (1001, 3, 64), (333, 5, 128)].map(|(n, k, n_expert)| RouteCase {
            n,
            k,
            n_expert,
            fixed: vec![],
        }),
    );
    for RouteCase {
        n,
        k,
        n_expert: e,
        fixed,
    } in cases
    {
        let experts = random_routes(&mut rng, n, k, e, &fixed);
        let want = route_tiles(&experts, k, e).unwrap();
        let (tiles, gather, pair_of) = model(&experts, k, e, route_warps(e));
        assert_eq!(tiles, want.tiles, "tiles: n {n} k {k} e {e}");
        assert_eq!(gather, want.gather, "gather: n {n} k {k} e {e}");
        assert_eq!(pair_of, want.pair_of, "pair_of: n {n} k {k} e {e}");
        assert!(tiles.len() / 3 <= max_route_tiles(n * k, e));
    }
    // No pairs: no tiles.
    assert!(model(&[], 10, 512, 32).0.is_empty());
}

/// Where the preconditions fail (ids past the experts; one expert with
/// more pairs than the u16 counters hold) the lists are wrong, but
/// every write stays in its array and the count within the bound: the
/// model panics on an index out of range.
#[test]
fn out_of_contract_routes_stay_in_bounds() {
    let mut rng = Rng(5);
    let garbage: Vec<u32> = (0..3000).map(|_| rng.below(2000) as u32).collect();
    let (tiles, ..) = model(&garbage, 3, 512, 32);
    assert!(tiles.len() / 3 <= max_route_tiles(3000, 512));
    // 70,000 pairs of one expert (k = 1, every token the same).
    let one = vec![2u32; 70_000];
    let (tiles, gather, pair_of) = model(&one, 1, 8, 32);
    assert!(tiles.len() / 3 <= max_route_tiles(70_000, 8));
    assert!(pair_of.iter().all(|&p| (0..70_000).contains(&p)));
    assert!(gather.iter().all(|&g| g >= -1));
}
