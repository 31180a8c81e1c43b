//! Eviction policies: which occupied slot gives way to a new expert.
//!
//! A policy sees only slot numbers and three events (a slot got a new key,
//! a slot's key was used, pick a victim among the slots the cache allows).
//! The cache decides which slots may be evicted (not pinned, not loading,
//! not wanted by the current layer); the policy only orders them.

use std::str::FromStr;

/// Orders occupied slots for eviction.
pub trait Policy: Send + std::fmt::Debug {
    /// `slot` now holds a newly inserted key.
    fn inserted(&mut self, slot: usize);
    /// `slot`'s key was used again.
    fn accessed(&mut self, slot: usize);
    /// The slot to evict among those with `evictable(slot)` true, or `None`
    /// when there is none.
    fn victim(&mut self, evictable: &mut dyn FnMut(usize) -> bool) -> Option<usize>;
}

/// The policies the cache can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PolicyKind {
    /// Least recently used.
    Lru,
    /// Least frequently used; every `slots` events all counts are halved,
    /// so old popularity fades; ties go to the least recently used.
    LfuAging,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 2] = [PolicyKind::Lru, PolicyKind::LfuAging];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Lru => "lru",
            PolicyKind::LfuAging => "lfu",
        }
    }

    /// A fresh policy for `slots` slots.
    pub fn build(self, slots: usize) -> Box<dyn Policy> {
        match self {
            PolicyKind::Lru => Box::new(Lru::new(slots)),
            PolicyKind::LfuAging => Box::new(LfuAging::new(slots, slots.max(1) as u64)),
        }
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "lru" => Ok(PolicyKind::Lru),
            "lfu" => Ok(PolicyKind::LfuAging),
            other => Err(format!("unknown eviction policy `{other}` (lru, lfu)")),
        }
    }
}

/// Least recently used: each event stamps the slot with a rising tick; the
/// victim is the evictable slot with the oldest stamp.
#[derive(Debug)]
pub struct Lru {
    tick: u64,
    last: Vec<u64>,
}

impl Lru {
    pub fn new(slots: usize) -> Lru {
        Lru {
            tick: 0,
            last: vec![0; slots],
        }
    }
    fn stamp(&mut self, slot: usize) {
        self.tick += 1;
        self.last[slot] = self.tick;
    }
}

impl Policy for Lru {
    fn inserted(&mut self, slot: usize) {
        self.stamp(slot);
    }
    fn accessed(&mut self, slot: usize) {
        self.stamp(slot);
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(usize) -> bool) -> Option<usize> {
        (0..self.last.len())
            .filter(|&s| evictable(s))
            .min_by_key(|&s| self.last[s])
    }
}

/// Least frequently used with aging. An insert counts 1, an access adds 1;
/// after every `period` events every count is halved (integer shift). The
/// victim is the evictable slot with the smallest count, ties to the least
/// recently stamped.
#[derive(Debug)]
pub struct LfuAging {
    tick: u64,
    period: u64,
    events: u64,
    count: Vec<u32>,
    last: Vec<u64>,
}

impl LfuAging {
    pub fn new(slots: usize, period: u64) -> LfuAging {
        LfuAging {
            tick: 0,
            period: period.max(1),
            events: 0,
            count: vec![0; slots],
            last: vec![0; slots],
        }
    }
    fn event(&mut self) {
        self.tick += 1;
        self.events += 1;
        if self.events >= self.period {
            self.events = 0;
            self.count.iter_mut().for_each(|c| *c >>= 1);
        }
    }
}

impl Policy for LfuAging {
    fn inserted(&mut self, slot: usize) {
        self.event();
        self.count[slot] = 1;
        self.last[slot] = self.tick;
    }
    fn accessed(&mut self, slot: usize) {
        self.event();
        self.count[slot] = self.count[slot].saturating_add(1);
        self.last[slot] = self.tick;
    }
    fn victim(&mut self, evictable: &mut dyn FnMut(usize) -> bool) -> Option<usize> {
        (0..self.count.len())
            .filter(|&s| evictable(s))
            .min_by_key(|&s| (self.count[s], self.last[s]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(_: usize) -> bool {
        true
    }

    #[test]
    fn lru_evicts_least_recent_first() {
        let mut p = Lru::new(3);
        p.inserted(0);
        p.inserted(1);
        p.inserted(2);
        p.accessed(0); // order now 1, 2, 0
        assert_eq!(p.victim(&mut all), Some(1));
        p.inserted(1); // slot 1 reused: order 2, 0, 1
        assert_eq!(p.victim(&mut all), Some(2));
        // the cache may forbid a slot: the next oldest goes
        assert_eq!(p.victim(&mut |s| s != 2), Some(0));
        assert_eq!(p.victim(&mut |_| false), None);
    }

    #[test]
    fn lfu_evicts_least_frequent_then_oldest() {
        let mut p = LfuAging::new(3, 1000);
        p.inserted(0);
        p.inserted(1);
        p.inserted(2);
        p.accessed(0);
        p.accessed(0);
        p.accessed(2); // counts 3, 1, 2
        assert_eq!(p.victim(&mut all), Some(1));
        p.accessed(1); // counts 3, 2, 2: tie between 1 and 2, slot 2 is older
        assert_eq!(p.victim(&mut all), Some(2));
        assert_eq!(p.victim(&mut |s| s != 2), Some(1));
    }

    #[test]
    fn lfu_aging_halves_counts() {
        // period 4: the 4th event halves every count
        let mut p = LfuAging::new(2, 4);
        p.inserted(0); // e1: [1, 0]
        p.accessed(0); // e2: [2, 0]
        p.accessed(0); // e3: [3, 0]
        p.inserted(1); // e4: halve to [1, 0], then slot 1 = 1 -> [1, 1]
        assert_eq!(p.count, vec![1, 1]);
        // equal counts: the older stamp (slot 0) goes first
        assert_eq!(p.victim(&mut all), Some(0));
        p.accessed(1); // e5: [1, 2]
        assert_eq!(p.victim(&mut all), Some(0));
    }

    #[test]
    fn kinds_parse_and_build() {
        for k in PolicyKind::ALL {
            assert_eq!(k.name().parse::<PolicyKind>().unwrap(), k);
            let mut p = k.build(2);
            p.inserted(0);
            p.inserted(1);
            assert_eq!(p.victim(&mut all), Some(0));
        }
        assert!("fifo".parse::<PolicyKind>().is_err());
    }
}
