//! Byte-pair merging of one pre-token.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// A fast hasher for integer keys (multiply-rotate, like FxHash).
#[derive(Default, Clone, Copy)]
pub(crate) struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.write_u64(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 59));
        }
    }
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

pub(crate) type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// Merge table: (left id, right id) -> (rank, merged id).
pub(crate) struct Merges {
    map: IntMap<u64, (u32, u32)>,
}

fn key(a: u32, b: u32) -> u64 {
    (u64::from(a) << 32) | u64::from(b)
}

impl Merges {
    pub(crate) fn with_capacity(n: usize) -> Merges {
        Merges {
            map: IntMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Add a merge; an earlier merge of the same pair keeps its rank.
    pub(crate) fn insert(&mut self, a: u32, b: u32, rank: u32, merged: u32) {
        self.map.entry(key(a, b)).or_insert((rank, merged));
    }

    #[inline]
    fn get(&self, a: u32, b: u32) -> Option<(u32, u32)> {
        self.map.get(&key(a, b)).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: u32,
    next: u32,
    alive: bool,
}

const NONE: u32 = u32::MAX;

/// Reusable buffers for [`merge`].
#[derive(Default)]
pub(crate) struct BpeScratch {
    syms: Vec<Sym>,
    heap: BinaryHeap<Reverse<(u32, u32, u32, u32)>>,
}

/// Apply the merges to the symbol ids in `ids` (in place): always the pair
/// of lowest rank first, the leftmost one on ties.
pub(crate) fn merge(merges: &Merges, ids: &mut Vec<u32>, scratch: &mut BpeScratch) {
    let n = ids.len();
    if n < 2 {
        return;
    }
    if n == 2 {
        if let Some((_, m)) = merges.get(ids[0], ids[1]) {
            ids.truncate(1);
            ids[0] = m;
        }
        return;
    }
    let BpeScratch { syms, heap } = scratch;
    syms.clear();
    heap.clear();
    for (i, &id) in ids.iter().enumerate() {
        syms.push(Sym {
            id,
            prev: if i == 0 { NONE } else { i as u32 - 1 },
            next: if i + 1 == n { NONE } else { i as u32 + 1 },
            alive: true,
        });
    }
    for i in 0..n - 1 {
        if let Some((rank, _)) = merges.get(ids[i], ids[i + 1]) {
            heap.push(Reverse((rank, i as u32, ids[i], ids[i + 1])));
        }
    }
    while let Some(Reverse((_, pos, a, b))) = heap.pop() {
        let p = pos as usize;
        let left = syms[p];
        if !left.alive || left.id != a || left.next == NONE {
            continue;
        }
        let q = left.next as usize;
        if syms[q].id != b {
            continue;
        }
        // A pair's merge result is fixed, so look it up again.
        let Some((_, merged)) = merges.get(a, b) else {
            continue;
        };
        let after = syms[q].next;
        syms[q].alive = false;
        syms[p].id = merged;
        syms[p].next = after;
        if after != NONE {
            syms[after as usize].prev = pos;
            let r = syms[after as usize].id;
            if let Some((rank, _)) = merges.get(merged, r) {
                heap.push(Reverse((rank, pos, merged, r)));
            }
        }
        if left.prev != NONE {
            let l = syms[left.prev as usize].id;
            if let Some((rank, _)) = merges.get(l, merged) {
                heap.push(Reverse((rank, left.prev, l, merged)));
            }
        }
    }
    ids.clear();
    let mut i = 0u32;
    while i != NONE {
        let s = syms[i as usize];
        ids.push(s.id);
        i = s.next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_lowest_rank_leftmost() {
        // symbols: a=0 b=1 ab=2 aa=3 ; merges: (a,a)->aa rank 0, (a,b)->ab rank 1
        let mut m = Merges::with_capacity(2);
        m.insert(0, 0, 0, 3);
        m.insert(0, 1, 1, 2);
        let mut s = BpeScratch::default();
        let mut ids = vec![0, 0, 0, 1];
        merge(&m, &mut ids, &mut s);
        assert_eq!(ids, [3, 2]); // aa, ab
        let mut ids = vec![0, 0, 0];
        merge(&m, &mut ids, &mut s);
        assert_eq!(ids, [3, 0]); // leftmost first
        let mut ids = vec![0, 1];
        merge(&m, &mut ids, &mut s);
        assert_eq!(ids, [2]);
        let mut ids = vec![1];
        merge(&m, &mut ids, &mut s);
        assert_eq!(ids, [1]);
        assert_eq!(m.len(), 2);
    }
}
