//! `redlite selftest` rows of the bounded expert cache, and
//! [`PlanModel`], the host statement of the plan kernel's rules
//! (`kernels/expert_cache.cu`) that the rows and the unit tests check
//! against.

use crate::device::Gpu;
use crate::error::{Context, Result};
use crate::expert_cache::{
    read_counters, CacheCounters, HostExperts, HostSet, LayerCache, SLOT_NONE,
};
use crate::gemv::ExpertStack;
use cudarc::driver::CudaSlice;

/// The plan kernel's rules on the host (see `kernels/expert_cache.cu`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanModel {
    pub slot_of: Vec<u32>,
    pub expert_in: Vec<u32>,
    pub stamp: Vec<u32>,
    pub used: Vec<u32>,
    pub pref: Vec<bool>,
    pub counters: CacheCounters,
}

impl PlanModel {
    /// Slots 0..n_slots holding experts 0..n_slots, never used.
    pub fn new(n_expert: usize, n_slots: usize) -> Self {
        Self {
            slot_of: (0..n_expert)
                .map(|e| if e < n_slots { e as u32 } else { SLOT_NONE })
                .collect(),
            expert_in: (0..n_slots as u32).collect(),
            stamp: vec![0; n_slots],
            used: vec![0; n_slots],
            pref: vec![false; n_slots],
            counters: CacheCounters::default(),
        }
    }

    /// One plan at `tick`: returns (slots of the chosen experts for a
    /// routed plan, the miss list).
    pub fn plan(
        &mut self,
        experts: &[u32],
        tick: u32,
        prefetch: bool,
    ) -> (Vec<u32>, Vec<(u32, u32)>) {
        let mut slots = vec![SLOT_NONE; experts.len()];
        let hit: Vec<u32> = experts.iter().map(|&e| self.slot_of[e as usize]).collect();
        for (i, &s) in hit.iter().enumerate() {
            if s == SLOT_NONE {
                continue;
            }
            let s = s as usize;
            self.stamp[s] = tick;
            if !prefetch {
                self.used[s] = tick;
                slots[i] = s as u32;
                self.counters.hits += 1;
                if self.pref[s] {
                    self.pref[s] = false;
                    self.counters.prefetch_used += 1;
                }
            }
        }
        let mut misses = Vec::new();
        for (i, &e) in experts.iter().enumerate() {
            if hit[i] != SLOT_NONE {
                continue;
            }
            let victim = (0..self.stamp.len())
                .filter(|&s| {
                    if prefetch {
                        self.stamp[s] != tick
                    } else {
                        self.used[s] != tick
                    }
                })
                .min_by_key(|&s| (self.stamp[s], s));
            let Some(s) = victim else { break };
            let old = self.expert_in[s];
            if old != SLOT_NONE {
                self.slot_of[old as usize] = SLOT_NONE;
            }
            self.expert_in[s] = e;
            self.slot_of[e as usize] = s as u32;
            self.stamp[s] = tick;
            if prefetch {
                self.pref[s] = true;
            } else {
                self.used[s] = tick;
                self.pref[s] = false;
                slots[i] = s as u32;
            }
            misses.push((e, s as u32));
        }
        if prefetch {
            self.counters.prefetched += misses.len() as u64;
        } else {
            self.counters.misses += misses.len() as u64;
        }
        (slots, misses)
    }
}

/// `k` distinct experts of `n`, ascending (as the router writes them).
fn pick(rng: &mut crate::testdata::Rng, n: usize, k: usize) -> Vec<u32> {
    let mut v: Vec<u32> = Vec::with_capacity(k);
    while v.len() < k {
        let e = rng.below(n) as u32;
        if !v.contains(&e) {
            v.push(e);
        }
    }
    v.sort_unstable();
    v
}

/// `redlite selftest` rows: `expert_plan` against [`PlanModel`] (every
/// routed slot, miss list, table and counter, over random token streams
/// with prefetches; "abs" = mismatches), and `expert_fetch` (slot images
/// byte-equal to the host copies; "abs" = differing bytes).
pub fn run(gpu: &Gpu, rng: &mut crate::testdata::Rng) -> Result<Vec<crate::selftest::Worst>> {
    use crate::selftest::Worst;
    use redlite_gguf::GgmlType;
    let mut plan_w = Worst::new("expert_plan (LRU slots, prefetch) vs the host model".into());
    let mut fetch_w = Worst::new("expert_fetch (pinned host -> slots, byte-equal)".into());
    // (experts, slots, k, f32 rows, cols): the 80B shape's pool sizes and
    // small pools where every token evicts.
    for (n, slots, k, rows, cols) in [
        (512usize, 150usize, 10usize, 4usize, 64usize),
        (64, 12, 8, 3, 32),
        (16, 4, 4, 2, 32),
        (40, 33, 6, 5, 96),
    ] {
        let src: Vec<Vec<u8>> = (0..3)
            .map(|p| {
                let r = rows + p;
                (0..n * r * cols)
                    .flat_map(|_| rng.uniform().to_le_bytes())
                    .collect()
            })
            .collect();
        let mut stacks = Vec::new();
        let mut hosts = Vec::new();
        for (p, bytes) in src.iter().enumerate() {
            let (st, h) = ExpertStack::cached(
                gpu,
                GgmlType::F32,
                rows + p,
                0,
                rows + p,
                cols,
                n,
                bytes,
                slots,
            )?;
            stacks.push(st);
            hosts.push(h);
        }
        let hosts: [HostExperts; 3] = hosts
            .try_into()
            .map_err(|_| crate::CudaError::Invalid("three stacks".into()))?;
        let strides = [stacks[0].stride, stacks[1].stride, stacks[2].stride];
        let cache = LayerCache::new(gpu, n, slots, k, strides, HostSet::Pinned(hosts))?;
        let mut model = PlanModel::new(n, slots);
        let counters: CudaSlice<u64> = gpu.stream.alloc_zeros(4)?;
        let mut clock: CudaSlice<i32> = gpu.stream.alloc_zeros(2)?;
        let slots_out: CudaSlice<u32> = gpu.stream.clone_htod(&vec![SLOT_NONE; k])?;
        let mut bad = 0usize;
        for tick in 1..=60u32 {
            gpu.stream.memcpy_htod(&[0i32, tick as i32], &mut clock)?;
            // a prefetch of a half-overlapping set, then the routed plan
            let routed = pick(rng, n.min(3 * k), k);
            let guess = if tick % 3 == 0 {
                pick(rng, n, k)
            } else {
                routed.clone()
            };
            for (experts, prefetch) in [(&guess, true), (&routed, false)] {
                let ed = gpu.stream.clone_htod(experts)?;
                cache.plan(gpu, &ed, k, &clock, prefetch, &slots_out, (&counters, 0))?;
                cache.fetch(gpu, prefetch, [&stacks[0], &stacks[1], &stacks[2]], 7)?;
                let (want_slots, want_miss) = model.plan(experts, tick, prefetch);
                let got_miss = cache.misses(gpu, prefetch)?;
                bad += (got_miss != want_miss) as usize;
                if !prefetch {
                    gpu.sync()?;
                    let got = gpu.stream.clone_dtoh(&slots_out)?;
                    bad += got.iter().zip(&want_slots).filter(|(a, b)| a != b).count();
                }
            }
            plan_w.cases += 1;
        }
        let (slot_of, expert_in, stamp) = cache.tables(gpu)?;
        bad += (slot_of != model.slot_of) as usize
            + (expert_in != model.expert_in) as usize
            + (stamp != model.stamp) as usize;
        let c = read_counters(gpu, &counters)?;
        bad += (c[0] != model.counters) as usize;
        plan_w.max_abs = plan_w.max_abs.max(bad as f64);
        plan_w.all_written &= bad == 0;
        // Every slot's image equals its expert's host copy.
        let mut diff = 0usize;
        for (p, st) in stacks.iter().enumerate() {
            gpu.sync()?;
            let dev = gpu.stream.clone_dtoh(&st.buf)?;
            let host = cache.pinned(p).context("pinned")?.prefix(n)?;
            for (slot, &e) in model.expert_in.iter().enumerate() {
                let a = &dev[slot * st.stride..][..st.stride];
                let b = &host[e as usize * st.stride..][..st.stride];
                diff += a.iter().zip(b).filter(|(x, y)| x != y).count();
            }
        }
        fetch_w.cases += 1;
        fetch_w.max_abs = fetch_w.max_abs.max(diff as f64);
        fetch_w.all_written &= diff == 0;
    }
    Ok(vec![plan_w, fetch_w])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 8 experts, 3 slots (experts 0, 1, 2 preloaded, never used), k = 2.
    /// Every expected value below is worked out by hand from the rules.
    #[test]
    fn lru_order_by_hand() {
        let mut m = PlanModel::new(8, 3);
        // tick 1: 0 hits (slot 0); 5 misses, smallest stamp among the slots
        // not used this tick: slots 1 and 2 (stamp 0) -> slot 1.
        let (s, miss) = m.plan(&[0, 5], 1, false);
        assert_eq!((s, miss), (vec![0, 1], vec![(5, 1)]));
        assert_eq!(m.slot_of[1], SLOT_NONE, "expert 1 evicted");
        // tick 2: 6 and 7 miss: slot 2 (stamp 0) first, then the older of
        // slots 0 and 1 (both stamp 1) -> the lower, slot 0.
        let (s, miss) = m.plan(&[6, 7], 2, false);
        assert_eq!(s, vec![2, 0]);
        assert_eq!(miss, vec![(6, 2), (7, 0)]);
        // tick 3: 5 hits (slot 1), 0 misses: slots 0 and 2 have stamp 2 ->
        // slot 0 (expert 7 out).
        let (s, miss) = m.plan(&[5, 0], 3, false);
        assert_eq!((s, miss), (vec![1, 0], vec![(0, 0)]));
        assert_eq!(m.expert_in, vec![0, 5, 6]);
        assert_eq!(
            m.counters,
            CacheCounters {
                hits: 2,
                misses: 4,
                prefetched: 0,
                prefetch_used: 0
            }
        );
    }

    #[test]
    fn prefetch_rules_by_hand() {
        let mut m = PlanModel::new(8, 2);
        // tick 1, prefetch [3, 4]: 3 -> slot 0 (stamp 0, lower), 4 -> slot
        // 1; neither counts as a hit or a miss.
        let (_, miss) = m.plan(&[3, 4], 1, true);
        assert_eq!(miss, vec![(3, 0), (4, 1)]);
        // tick 1, routed [4, 6]: 4 hits a prefetched slot (prefetch used);
        // 6 misses and may take slot 0 (stamped this tick by the prefetch
        // but not used by a routed expert).
        let (s, miss) = m.plan(&[4, 6], 1, false);
        assert_eq!((s, miss), (vec![1, 0], vec![(6, 0)]));
        // tick 2, prefetch [1, 2, 5] into 2 slots: 1 -> slot 0 (stamps 1, 1:
        // lower), 2 -> slot 1, 5 finds every slot stamped this tick: stop.
        let (_, miss) = m.plan(&[1, 2, 5], 2, true);
        assert_eq!(miss, vec![(1, 0), (2, 1)]);
        assert_eq!(
            m.counters,
            CacheCounters {
                hits: 1,
                misses: 1,
                prefetched: 4,
                prefetch_used: 1
            }
        );
    }
}
