//! The cache without a model: hits, misses, eviction order (derived by hand
//! from each policy's definition), prefetch accounting, concurrency, and
//! the file loader.

use redlite_expertcache::sim::{format_token, parse_trace, simulate};
use redlite_expertcache::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Fills a slot with bytes derived from the key; counts loads; can be slow
/// and can fail for one key.
#[derive(Default)]
struct Pattern {
    loads: AtomicU64,
    delay_ms: u64,
    fail: Option<ExpertKey>,
    log: Mutex<Vec<ExpertKey>>,
}

fn byte(k: ExpertKey, i: usize) -> u8 {
    (k.layer as usize * 31 + k.expert as usize * 7 + i) as u8
}

impl ExpertLoader for Pattern {
    fn load(&self, key: ExpertKey, buf: &mut [u8]) -> Result<u64, CacheError> {
        if self.delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.delay_ms));
        }
        if self.fail == Some(key) {
            return Err(CacheError::NoExperts {
                layer: key.layer as usize,
            });
        }
        for (i, b) in buf.iter_mut().enumerate() {
            *b = byte(key, i);
        }
        self.loads.fetch_add(1, Ordering::Relaxed);
        self.log.lock().unwrap().push(key);
        Ok(buf.len() as u64)
    }
}

fn k(l: usize, e: usize) -> ExpertKey {
    ExpertKey::new(l, e)
}

fn cache(slots: usize, policy: PolicyKind, io: usize, loader: Arc<Pattern>) -> ExpertCache {
    ExpertCache::new(
        CacheConfig {
            slots,
            slot_bytes: 64,
            policy,
            io_threads: io,
        },
        loader,
    )
    .unwrap()
}

fn touch(c: &ExpertCache, key: ExpertKey) {
    let s = c.get(key).unwrap();
    assert!(s.iter().enumerate().all(|(i, &b)| b == byte(key, i)));
}

#[test]
fn lru_hits_misses_and_eviction_order() {
    let l = Arc::new(Pattern::default());
    let c = cache(3, PolicyKind::Lru, 0, l.clone());
    for e in [1, 2, 3] {
        touch(&c, k(0, e)); // 3 misses fill the slots
    }
    touch(&c, k(0, 1)); // hit; recency now 2, 3, 1
    touch(&c, k(0, 4)); // miss: evicts 2 (least recent)
    assert_eq!(c.resident(), vec![k(0, 1), k(0, 3), k(0, 4)]);
    touch(&c, k(0, 3)); // hit; recency 1, 4, 3
    touch(&c, k(0, 5)); // evicts 1
    assert_eq!(c.resident(), vec![k(0, 3), k(0, 4), k(0, 5)]);
    let s = c.stats();
    assert_eq!((s.lookups, s.hits, s.misses, s.evictions), (7, 2, 5, 2));
    assert_eq!(s.loads, 5);
    assert_eq!(s.bytes_read, 5 * 64);
    assert_eq!(l.loads.load(Ordering::Relaxed), 5);
}

#[test]
fn lfu_keeps_the_frequent_expert() {
    // LRU would evict 1 at the last miss (its last use is oldest); LFU
    // keeps it (count 3) and evicts 2 (count 1, older than 3).
    let seq = [1, 1, 1, 2, 3, 4];
    for (policy, want) in [
        (PolicyKind::Lru, vec![k(0, 3), k(0, 4), k(0, 2)]),
        (PolicyKind::LfuAging, vec![k(0, 1), k(0, 3), k(0, 4)]),
    ] {
        let c = cache(3, policy, 0, Arc::new(Pattern::default()));
        for e in seq {
            touch(&c, k(0, e));
        }
        let mut want = want;
        want.sort();
        assert_eq!(c.resident(), want, "{policy:?}");
    }
}

#[test]
fn demand_counts_once_and_reads_in_parallel() {
    let l = Arc::new(Pattern {
        delay_ms: 50,
        ..Default::default()
    });
    let c = cache(8, PolicyKind::Lru, 4, l.clone());
    let keys: Vec<_> = (0..4).map(|e| k(2, e)).collect();
    let t = std::time::Instant::now();
    c.demand(&keys);
    for &key in &keys {
        touch(&c, key);
    }
    // four 50 ms reads on four threads: well under 4 × 50 ms
    assert!(
        t.elapsed() < Duration::from_millis(190),
        "{:?}",
        t.elapsed()
    );
    let s = c.stats();
    assert_eq!((s.lookups, s.misses, s.hits, s.loads), (4, 4, 0, 4));
    // the same layer again: hits, counted once each (demand, then get)
    c.demand(&keys);
    for &key in &keys {
        touch(&c, key);
    }
    let s = c.stats();
    assert_eq!((s.lookups, s.misses, s.hits), (8, 4, 4));
    // a key listed twice counts once
    c.demand(&[k(2, 0), k(2, 0)]);
    touch(&c, k(2, 0));
    assert_eq!(c.stats().lookups, 9);
}

#[test]
fn prefetch_hits_late_and_unused() {
    let l = Arc::new(Pattern {
        delay_ms: 20,
        ..Default::default()
    });
    let c = cache(4, PolicyKind::Lru, 2, l.clone());
    c.prefetch(&[k(1, 0), k(1, 1)]);
    std::thread::sleep(Duration::from_millis(120));
    c.demand(&[k(1, 0)]);
    touch(&c, k(1, 0));
    let s = c.stats();
    assert_eq!((s.prefetch_issued, s.prefetch_hits, s.misses), (2, 1, 0));
    // a prefetch still loading when demanded counts late, not as a miss
    c.prefetch(&[k(1, 2)]);
    c.demand(&[k(1, 2)]);
    touch(&c, k(1, 2));
    let s = c.stats();
    assert_eq!((s.prefetch_late, s.misses), (1, 0));
    // k(1,1) was never used; demanding 3 new experts evicts it unused
    c.demand(&[k(1, 5), k(1, 6), k(1, 7)]);
    for e in [5, 6, 7] {
        touch(&c, k(1, e));
    }
    let s = c.stats();
    assert_eq!(s.prefetch_unused, 1, "{s:?}");
    assert!(!c.resident().contains(&k(1, 1)));
}

#[test]
fn prefetch_never_evicts_what_the_layer_demanded() {
    let l = Arc::new(Pattern::default());
    let c = cache(2, PolicyKind::Lru, 1, l.clone());
    touch(&c, k(0, 0));
    touch(&c, k(0, 1));
    // layer demands 0 and 1 (both resident), then a prefetch for the next
    // layer must not take their slots before they are used
    c.demand(&[k(0, 0), k(0, 1)]);
    c.prefetch(&[k(1, 9)]);
    assert_eq!(c.stats().prefetch_issued, 0);
    touch(&c, k(0, 0));
    touch(&c, k(0, 1));
    assert_eq!(c.stats().misses, 2, "only the two first reads");
}

#[test]
fn smaller_than_a_layer_still_correct() {
    // 2 slots, a layer wants 5 experts: demand starts what fits, get reads
    // the rest one at a time (evicting what was used)
    let l = Arc::new(Pattern::default());
    let c = cache(2, PolicyKind::Lru, 2, l.clone());
    let keys: Vec<_> = (0..5).map(|e| k(3, e)).collect();
    for _ in 0..3 {
        c.demand(&keys);
        for &key in &keys {
            touch(&c, key);
        }
    }
    let s = c.stats();
    assert_eq!(s.lookups, 15);
    assert_eq!(s.hits + s.misses + s.prefetch_hits + s.prefetch_late, 15);
}

#[test]
fn concurrent_gets_see_their_own_bytes() {
    let l = Arc::new(Pattern {
        delay_ms: 1,
        ..Default::default()
    });
    let c = Arc::new(cache(6, PolicyKind::LfuAging, 3, l.clone()));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let mut x = 12345u64 + t;
                for _ in 0..300 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let key = k((x >> 40) as usize % 3, (x >> 20) as usize % 8);
                    if x.is_multiple_of(7) {
                        c.prefetch(&[k((x >> 10) as usize % 3, (x >> 30) as usize % 8)]);
                    }
                    let s = c.get(key).unwrap();
                    assert!(s.iter().enumerate().all(|(i, &b)| b == byte(key, i)));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = c.stats();
    assert_eq!(s.lookups, 1200);
    assert_eq!(s.hits + s.misses + s.prefetch_hits + s.prefetch_late, 1200);
    assert!(c.resident().len() <= 6);
}

#[test]
fn a_failed_read_is_an_error_and_frees_the_slot() {
    let l = Arc::new(Pattern {
        fail: Some(k(0, 3)),
        ..Default::default()
    });
    let c = cache(1, PolicyKind::Lru, 1, l.clone());
    assert!(c.get(k(0, 3)).is_err());
    c.demand(&[k(0, 3)]); // read on the I/O thread, fails there
    assert!(c.get(k(0, 3)).is_err());
    touch(&c, k(0, 4)); // the slot is usable again
    assert!(c.stats().load_errors >= 2);
}

#[test]
fn file_loader_reads_parts_and_names_the_tensor_on_error() {
    let dir = std::env::temp_dir().join(format!("redlite-ec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("experts.bin");
    let bytes: Vec<u8> = (0..4096u32).map(|i| (i * 13 % 251) as u8).collect();
    std::fs::write(&path, &bytes).unwrap();
    // 4 experts; part a: 16 B each at 100, part b: 8 B each at 1000
    let layout = Arc::new(ExpertLayout {
        layers: vec![
            None,
            Some(LayerExperts {
                n_expert: 4,
                parts: vec![
                    ExpertPart {
                        tensor: "blk.1.a".into(),
                        offset: 100,
                        stride: 16,
                    },
                    ExpertPart {
                        tensor: "blk.1.b".into(),
                        offset: 1000,
                        stride: 8,
                    },
                ],
            }),
            Some(LayerExperts {
                n_expert: 2,
                parts: vec![ExpertPart {
                    tensor: "blk.2.past_end".into(),
                    offset: 4090,
                    stride: 24,
                }],
            }),
        ],
    });
    assert_eq!(layout.slot_bytes(), 24);
    assert_eq!(layout.n_experts(), 6);
    assert_eq!(layout.total_bytes(), 4 * 24 + 2 * 24);
    assert_eq!(
        layout.layer(1).unwrap().slot_ranges(),
        vec![(0, 16), (16, 8)]
    );
    for drop_cache in [true, false] {
        let f = FileLoader::open(&path, layout.clone(), drop_cache).unwrap();
        let mut buf = vec![0u8; 30];
        assert_eq!(f.load(k(1, 2), &mut buf).unwrap(), 24);
        assert_eq!(&buf[..16], &bytes[132..148]);
        assert_eq!(&buf[16..24], &bytes[1016..1024]);
        let e = f.load(k(2, 1), &mut buf).unwrap_err().to_string();
        assert!(
            e.contains("experts.bin")
                && e.contains("blk.2.past_end")
                && e.contains("expert 1 of layer 2"),
            "{e}"
        );
        assert!(matches!(
            f.load(k(0, 0), &mut buf),
            Err(CacheError::NoExperts { layer: 0 })
        ));
        assert!(matches!(
            f.load(k(1, 4), &mut buf),
            Err(CacheError::ExpertRange { .. })
        ));
        assert!(matches!(
            f.load(k(1, 0), &mut buf[..10]),
            Err(CacheError::SlotTooSmall { .. })
        ));
    }
    let e = FileLoader::open(&dir.join("missing.gguf"), layout, true).unwrap_err();
    assert!(e.to_string().contains("missing.gguf"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn traces_round_trip_and_simulate() {
    let trace = vec![
        vec![vec![1, 2], vec![], vec![5]],
        vec![vec![1, 3], vec![], vec![5]],
    ];
    let text: String = trace.iter().map(|t| format_token(t) + "\n").collect();
    assert_eq!(text, "1,2;;5\n1,3;;5\n");
    assert_eq!(parse_trace(&text).unwrap(), trace);
    assert!(parse_trace("1,x").is_err());
    // 3 slots, LRU: token 0 misses 3; token 1: (0,1) hit, (0,3) miss
    // evicting (0,2), (2,5) hit
    let s = simulate(&trace, 3, PolicyKind::Lru, 0);
    assert_eq!((s.lookups, s.hits, s.misses, s.evictions), (6, 2, 4, 1));
    let s = simulate(&trace, 3, PolicyKind::Lru, 1);
    assert_eq!((s.lookups, s.hits, s.misses), (3, 2, 1));
}
