//! The slot cache: a fixed number of equal slots in anonymous memory, keyed
//! by (layer, expert), filled by an [`ExpertLoader`].
//!
//! Use, per MoE layer: [`ExpertCache::demand`] with the experts the router
//! chose (classifies each as hit or miss and starts the misses on the I/O
//! threads, all at once), then [`ExpertCache::get`] per expert (waits for
//! its load if needed) and compute on the pinned bytes. A slot stays pinned
//! while its [`SlotRef`] lives and cannot be evicted. Between two `demand`
//! calls the experts of the last one are protected from eviction by
//! [`ExpertCache::prefetch`] (speculative loads for a later layer), so a
//! prefetch never pushes out an expert the current layer is about to use.
//!
//! Statistics count every demanded (layer, expert) once: `hits` (resident
//! before), `prefetch_hits` (brought in by a prefetch, ready in time),
//! `prefetch_late` (brought in by a prefetch still loading: the compute
//! waits for it), `misses` (read on demand).

use crate::error::CacheError;
use crate::policy::{Policy, PolicyKind};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard};
use std::thread::JoinHandle;
use std::time::Instant;

/// One routed expert of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExpertKey {
    pub layer: u32,
    pub expert: u32,
}

impl ExpertKey {
    pub fn new(layer: usize, expert: usize) -> ExpertKey {
        ExpertKey {
            layer: layer as u32,
            expert: expert as u32,
        }
    }
}

/// Fills a slot with an expert's bytes.
pub trait ExpertLoader: Send + Sync {
    /// Write the expert's bytes to the start of `buf`; returns how many
    /// bytes were read.
    fn load(&self, key: ExpertKey, buf: &mut [u8]) -> Result<u64, CacheError>;
}

/// Size and behaviour of a cache.
#[derive(Clone, Copy, Debug)]
pub struct CacheConfig {
    pub slots: usize,
    pub slot_bytes: usize,
    pub policy: PolicyKind,
    /// Threads that read demanded and prefetched experts in parallel (0:
    /// every miss is read by the thread that asks for it, in `get`).
    pub io_threads: usize,
}

/// Counters since creation (or the last [`ExpertCache::reset_stats`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Demanded (layer, expert) pairs.
    pub lookups: u64,
    pub hits: u64,
    pub prefetch_hits: u64,
    pub prefetch_late: u64,
    pub misses: u64,
    pub evictions: u64,
    /// Completed loads (demand and prefetch).
    pub loads: u64,
    pub bytes_read: u64,
    pub prefetch_issued: u64,
    /// Prefetched experts evicted before any use.
    pub prefetch_unused: u64,
    pub load_errors: u64,
    /// Time callers spent in `get` waiting for loads (ns).
    pub wait_ns: u64,
    /// Time spent in the loader, summed over threads (ns).
    pub load_ns: u64,
}

impl CacheStats {
    /// Share of lookups that needed no read after the demand: plain hits and
    /// timely prefetches.
    pub fn hit_rate(&self) -> f64 {
        (self.hits + self.prefetch_hits) as f64 / self.lookups.max(1) as f64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Origin {
    Demand,
    Prefetch,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Empty,
    Loading(Origin),
    Ready,
}

#[derive(Debug)]
struct Entry {
    key: Option<ExpertKey>,
    state: State,
    pins: u32,
    /// Loaded by a prefetch and not used since.
    fresh_prefetch: bool,
    /// The `demand` generation that asked for it and has not used it yet.
    pending: u64,
    /// How that `demand` counted it.
    counted: Class,
}

/// How a demanded expert was counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    Hit,
    PrefetchHit,
    PrefetchLate,
    Miss,
}

impl Entry {
    fn empty() -> Entry {
        Entry {
            key: None,
            state: State::Empty,
            pins: 0,
            fresh_prefetch: false,
            pending: 0,
            counted: Class::Miss,
        }
    }
}

struct Inner {
    entries: Vec<Entry>,
    map: HashMap<ExpertKey, usize>,
    free: Vec<usize>,
    policy: Box<dyn Policy>,
    demand_q: VecDeque<(ExpertKey, usize)>,
    prefetch_q: VecDeque<(ExpertKey, usize)>,
    /// Demanded in the current generation, absent, and not started (no
    /// free slot or no I/O threads): `get` reads them without counting again.
    deferred: HashSet<ExpertKey>,
    gen: u64,
    stats: CacheStats,
    shutdown: bool,
}

impl Inner {
    /// A slot for `key`: a free one, else the policy's victim among ready,
    /// unpinned slots (with `strict`, also not pending for the current
    /// generation). The slot comes back `Loading(origin)` with one pin.
    fn claim(&mut self, key: ExpertKey, origin: Origin, strict: bool) -> Option<usize> {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                let (entries, gen) = (&self.entries, self.gen);
                let s = self.policy.victim(&mut |s| {
                    let e = &entries[s];
                    e.pins == 0 && e.state == State::Ready && (!strict || e.pending != gen)
                })?;
                let old = &self.entries[s];
                if let Some(k) = old.key {
                    self.map.remove(&k);
                    if old.pending == gen {
                        // Demanded and not used yet (only without `strict`,
                        // when nothing else can go): it will be read again,
                        // so it is a miss after all.
                        let st = &mut self.stats;
                        match old.counted {
                            Class::Hit => st.hits -= 1,
                            Class::PrefetchHit => st.prefetch_hits -= 1,
                            Class::PrefetchLate => st.prefetch_late -= 1,
                            Class::Miss => st.misses -= 1,
                        }
                        st.misses += 1;
                        self.deferred.insert(k);
                    }
                }
                self.stats.evictions += 1;
                if old.fresh_prefetch {
                    self.stats.prefetch_unused += 1;
                }
                s
            }
        };
        self.entries[slot] = Entry {
            key: Some(key),
            state: State::Loading(origin),
            pins: 1,
            fresh_prefetch: false,
            pending: 0,
            counted: Class::Miss,
        };
        self.map.insert(key, slot);
        self.policy.inserted(slot);
        Some(slot)
    }

    /// Undo a claim whose load failed.
    fn release_failed(&mut self, slot: usize) {
        if let Some(k) = self.entries[slot].key {
            self.map.remove(&k);
        }
        self.entries[slot] = Entry::empty();
        self.free.push(slot);
    }

    fn any_loading(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.state, State::Loading(_)))
    }
}

struct Shared {
    inner: Mutex<Inner>,
    cv: Condvar,
    slots: Vec<RwLock<Box<[u8]>>>,
    loader: Arc<dyn ExpertLoader>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves counters, never memory,
        // inconsistent: keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        self.cv.wait(g).unwrap_or_else(|p| p.into_inner())
    }

    /// Run the loader into `slot` (which the caller holds `Loading`).
    fn fill(&self, key: ExpertKey, slot: usize) -> (Result<u64, CacheError>, u64) {
        let t = Instant::now();
        let res = {
            let mut buf = self.slots[slot].write().unwrap_or_else(|p| p.into_inner());
            self.loader.load(key, &mut buf)
        };
        (res, t.elapsed().as_nanos() as u64)
    }

    fn worker(&self) {
        loop {
            let (key, slot) = {
                let mut g = self.lock();
                loop {
                    if g.shutdown {
                        return;
                    }
                    if let Some(job) = g.demand_q.pop_front().or_else(|| g.prefetch_q.pop_front()) {
                        break job;
                    }
                    g = self.wait(g);
                }
            };
            let (res, ns) = self.fill(key, slot);
            let mut g = self.lock();
            g.stats.load_ns += ns;
            match res {
                Ok(n) => {
                    g.stats.loads += 1;
                    g.stats.bytes_read += n;
                    let e = &mut g.entries[slot];
                    e.fresh_prefetch = e.state == State::Loading(Origin::Prefetch);
                    e.state = State::Ready;
                    e.pins -= 1;
                }
                Err(err) => {
                    tracing::warn!("expert cache: {err}");
                    g.stats.load_errors += 1;
                    g.release_failed(slot);
                }
            }
            drop(g);
            self.cv.notify_all();
        }
    }
}

/// A bounded cache of experts. See the module documentation.
pub struct ExpertCache {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    slot_bytes: usize,
    policy: PolicyKind,
}

impl std::fmt::Debug for ExpertCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExpertCache")
            .field("slots", &self.slots())
            .field("slot_bytes", &self.slot_bytes)
            .field("policy", &self.policy)
            .field("io_threads", &self.workers.len())
            .finish()
    }
}

impl ExpertCache {
    /// Make the slots (anonymous memory, committed by the kernel as slots
    /// are first filled) and start the I/O threads.
    pub fn new(cfg: CacheConfig, loader: Arc<dyn ExpertLoader>) -> Result<ExpertCache, CacheError> {
        if cfg.slots == 0 || cfg.slot_bytes == 0 {
            return Err(CacheError::Empty {
                slots: cfg.slots,
                slot_bytes: cfg.slot_bytes,
            });
        }
        let slots = (0..cfg.slots)
            .map(|_| RwLock::new(vec![0u8; cfg.slot_bytes].into_boxed_slice()))
            .collect();
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                entries: (0..cfg.slots).map(|_| Entry::empty()).collect(),
                map: HashMap::with_capacity(cfg.slots),
                // pop() takes the lowest slot first
                free: (0..cfg.slots).rev().collect(),
                policy: cfg.policy.build(cfg.slots),
                demand_q: VecDeque::new(),
                prefetch_q: VecDeque::new(),
                deferred: HashSet::new(),
                gen: 1,
                stats: CacheStats::default(),
                shutdown: false,
            }),
            cv: Condvar::new(),
            slots,
            loader,
        });
        let workers = (0..cfg.io_threads)
            .map(|i| {
                let s = shared.clone();
                std::thread::Builder::new()
                    .name(format!("redlite-expert-io-{i}"))
                    .spawn(move || s.worker())
                    .expect("spawning an expert I/O thread")
            })
            .collect();
        Ok(ExpertCache {
            shared,
            workers,
            slot_bytes: cfg.slot_bytes,
            policy: cfg.policy,
        })
    }

    pub fn slots(&self) -> usize {
        self.shared.slots.len()
    }

    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    pub fn policy(&self) -> PolicyKind {
        self.policy
    }

    pub fn io_threads(&self) -> usize {
        self.workers.len()
    }

    pub fn stats(&self) -> CacheStats {
        self.shared.lock().stats
    }

    pub fn reset_stats(&self) {
        self.shared.lock().stats = CacheStats::default();
    }

    /// The keys held by ready slots, sorted.
    pub fn resident(&self) -> Vec<ExpertKey> {
        let g = self.shared.lock();
        let mut v: Vec<ExpertKey> = g
            .entries
            .iter()
            .filter(|e| e.state == State::Ready)
            .filter_map(|e| e.key)
            .collect();
        v.sort();
        v
    }

    /// The experts one layer is about to use: count each as hit or miss,
    /// protect the resident ones from prefetch evictions until the next
    /// `demand`, and start reading the absent ones on the I/O threads.
    pub fn demand(&self, keys: &[ExpertKey]) {
        let mut g = self.shared.lock();
        g.gen += 1;
        let gen = g.gen;
        g.deferred.clear();
        let mut absent = Vec::new();
        for &key in keys {
            let Some(&slot) = g.map.get(&key) else {
                if !absent.contains(&key) {
                    absent.push(key);
                }
                continue;
            };
            let inner = &mut *g;
            let e = &mut inner.entries[slot];
            if e.pending == gen {
                continue; // listed twice
            }
            e.pending = gen;
            inner.stats.lookups += 1;
            e.counted = match e.state {
                State::Ready if e.fresh_prefetch => Class::PrefetchHit,
                State::Ready => Class::Hit,
                State::Loading(Origin::Prefetch) => Class::PrefetchLate,
                State::Loading(Origin::Demand) => Class::Miss,
                State::Empty => unreachable!("mapped slots are never empty"),
            };
            match e.state {
                State::Ready if e.fresh_prefetch => {
                    e.fresh_prefetch = false;
                    inner.stats.prefetch_hits += 1;
                }
                State::Ready => inner.stats.hits += 1,
                State::Loading(Origin::Prefetch) => {
                    inner.stats.prefetch_late += 1;
                    // still queued: read it before the other prefetches
                    if let Some(i) = inner.prefetch_q.iter().position(|&(k, _)| k == key) {
                        let job = inner.prefetch_q.remove(i).expect("position is in range");
                        inner.demand_q.push_back(job);
                    }
                }
                // demanded earlier and still loading
                State::Loading(Origin::Demand) => inner.stats.misses += 1,
                State::Empty => unreachable!("mapped slots are never empty"),
            }
            inner.policy.accessed(slot);
        }
        let threads = !self.workers.is_empty();
        for key in absent {
            g.stats.lookups += 1;
            g.stats.misses += 1;
            let claimed = if threads {
                g.claim(key, Origin::Demand, true)
            } else {
                None
            };
            match claimed {
                Some(slot) => {
                    g.entries[slot].pending = gen;
                    g.entries[slot].counted = Class::Miss;
                    g.demand_q.push_back((key, slot));
                }
                None => {
                    g.deferred.insert(key);
                }
            }
        }
        drop(g);
        self.shared.cv.notify_all();
    }

    /// Speculative reads (pre-gating): start loading the absent keys while
    /// a slot can be had without evicting anything pinned, loading or
    /// demanded by the last `demand`. Never counts lookups.
    pub fn prefetch(&self, keys: &[ExpertKey]) {
        if self.workers.is_empty() {
            return;
        }
        let mut g = self.shared.lock();
        let mut issued = 0;
        for &key in keys {
            if g.map.contains_key(&key) {
                continue;
            }
            let Some(slot) = g.claim(key, Origin::Prefetch, true) else {
                break;
            };
            g.prefetch_q.push_back((key, slot));
            issued += 1;
        }
        g.stats.prefetch_issued += issued;
        drop(g);
        if issued > 0 {
            self.shared.cv.notify_all();
        }
    }

    /// The bytes of `key`, pinned: a resident slot, or one it waits for, or
    /// one it reads here (counted as a miss unless `demand` counted it).
    pub fn get(&self, key: ExpertKey) -> Result<SlotRef<'_>, CacheError> {
        let sh = &*self.shared;
        let mut g = sh.lock();
        let mut waited = 0u64;
        let mut counted = false;
        loop {
            if let Some(&slot) = g.map.get(&key) {
                let inner = &mut *g;
                let gen = inner.gen;
                let e = &mut inner.entries[slot];
                match e.state {
                    State::Ready => {
                        if e.pending == gen || counted {
                            e.pending = 0; // counted already
                        } else {
                            inner.stats.lookups += 1;
                            if e.fresh_prefetch {
                                inner.stats.prefetch_hits += 1;
                            } else {
                                inner.stats.hits += 1;
                            }
                            inner.policy.accessed(slot);
                        }
                        e.fresh_prefetch = false;
                        e.pins += 1;
                        inner.stats.wait_ns += waited;
                        drop(g);
                        return Ok(SlotRef::new(sh, slot));
                    }
                    State::Loading(_) => {
                        let t = Instant::now();
                        g = sh.wait(g);
                        waited += t.elapsed().as_nanos() as u64;
                        continue;
                    }
                    State::Empty => unreachable!("mapped slots are never empty"),
                }
            }
            // Absent: read it here.
            if !counted {
                if !g.deferred.remove(&key) {
                    g.stats.lookups += 1;
                    g.stats.misses += 1;
                }
                counted = true;
            }
            let slot = loop {
                if let Some(s) = g
                    .claim(key, Origin::Demand, true)
                    .or_else(|| g.claim(key, Origin::Demand, false))
                {
                    break s;
                }
                if !g.any_loading() {
                    return Err(CacheError::AllPinned {
                        slots: sh.slots.len(),
                    });
                }
                let t = Instant::now();
                g = sh.wait(g);
                waited += t.elapsed().as_nanos() as u64;
                if g.map.contains_key(&key) {
                    break usize::MAX; // someone else started it meanwhile
                }
            };
            if slot == usize::MAX {
                continue;
            }
            drop(g);
            let (res, ns) = sh.fill(key, slot);
            g = sh.lock();
            g.stats.load_ns += ns;
            g.stats.wait_ns += waited + ns;
            match res {
                Ok(n) => {
                    g.stats.loads += 1;
                    g.stats.bytes_read += n;
                    g.entries[slot].state = State::Ready;
                    // keep the claim's pin: it is the caller's now
                    drop(g);
                    sh.cv.notify_all();
                    return Ok(SlotRef::new(sh, slot));
                }
                Err(err) => {
                    g.stats.load_errors += 1;
                    g.release_failed(slot);
                    drop(g);
                    sh.cv.notify_all();
                    return Err(err);
                }
            }
        }
    }

    /// The bytes of `key` if it is resident and ready now (counted as
    /// `get` counts it), else `None` without waiting or reading.
    pub fn try_get(&self, key: ExpertKey) -> Option<SlotRef<'_>> {
        {
            let g = self.shared.lock();
            let &slot = g.map.get(&key)?;
            if g.entries[slot].state != State::Ready {
                return None;
            }
        }
        // Ready a moment ago; `get` re-checks under the lock (should another
        // thread have evicted it meanwhile, `get` reads it again: slower,
        // still correct).
        self.get(key).ok()
    }
}

impl Drop for ExpertCache {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.cv.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

/// A pinned slot's bytes (the whole slot; the expert's bytes are at its
/// start). The slot cannot be evicted while this lives.
pub struct SlotRef<'a> {
    shared: &'a Shared,
    slot: usize,
    bytes: Option<RwLockReadGuard<'a, Box<[u8]>>>,
}

impl<'a> SlotRef<'a> {
    fn new(shared: &'a Shared, slot: usize) -> SlotRef<'a> {
        let bytes = shared.slots[slot].read().unwrap_or_else(|p| p.into_inner());
        SlotRef {
            shared,
            slot,
            bytes: Some(bytes),
        }
    }
}

impl std::ops::Deref for SlotRef<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes.as_deref().expect("present until drop")
    }
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        self.bytes = None;
        let mut g = self.shared.lock();
        g.entries[self.slot].pins -= 1;
        drop(g);
        self.shared.cv.notify_all();
    }
}
