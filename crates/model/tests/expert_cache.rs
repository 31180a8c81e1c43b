//! Bounded expert residency changes nothing but residency: on the tiny
//! Qwen3-Next fixture (16 experts × 8 layers, 4 used per token), greedy
//! tokens and every logit are bit-identical to the memory-mapped run for
//! every cache size from the minimum (4 slots: one token's experts of one
//! layer) to every expert resident (128 slots), with both eviction
//! policies, with and without pre-gating, with and without I/O threads.

use redlite_gguf::GgufFile;
use redlite_model::expertcache::PolicyKind;
use redlite_model::{ExpertCacheOptions, LoadOptions, Logits, Model};
use std::path::PathBuf;
use std::sync::Arc;

const PROMPT: [u32; 16] = [
    49, 337, 220, 43, 325, 68, 220, 81, 374, 82, 220, 48, 86, 263, 18, 12,
];
const N_GEN: usize = 6;

fn fixture() -> Option<PathBuf> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-q4_k_m.gguf");
    if p.exists() {
        Some(p)
    } else {
        eprintln!("skipped: no {}", p.display());
        None
    }
}

fn load(path: &PathBuf, ubatch: usize) -> Model {
    let f = Arc::new(GgufFile::open(path).unwrap());
    Model::load(
        f,
        LoadOptions {
            threads: 2,
            reference: false,
            ubatch,
        },
    )
    .unwrap()
}

fn argmax(x: &[f32]) -> u32 {
    x.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(&a.0)))
        .unwrap()
        .0 as u32
}

/// Every prompt position's logits (the prompt in batches of 7, so batches
/// touch more experts than the smallest caches hold), then greedy steps.
fn run(m: &Model) -> (Vec<u32>, Vec<u32>) {
    let mut s = m.new_session(64);
    let mut bits: Vec<u32> = Vec::new();
    let l = s.forward(m, &PROMPT, Logits::All).unwrap();
    bits.extend(l.iter().map(|v| v.to_bits()));
    let mut tok = argmax(&l[l.len() - m.n_vocab()..]);
    let mut toks = vec![tok];
    for _ in 1..N_GEN {
        let l = s.forward(m, &[tok], Logits::Last).unwrap();
        bits.extend(l.iter().map(|v| v.to_bits()));
        tok = argmax(&l);
        toks.push(tok);
    }
    (toks, bits)
}

#[test]
fn every_cache_size_is_bit_identical_to_mapped() {
    let Some(path) = fixture() else { return };
    let mapped = load(&path, 7);
    let layout = mapped.expert_layout().unwrap();
    assert_eq!(layout.n_experts(), 128);
    assert_eq!(mapped.n_expert_used(), 4);
    let (want_toks, want_bits) = run(&mapped);
    assert_eq!(want_toks.len(), N_GEN);

    let mut checked = 0;
    for slots in 4..=128usize {
        // every size with LRU, pre-gating and I/O threads; the other
        // combinations on a spread of sizes
        let mut variants = vec![(PolicyKind::Lru, 2, 4)];
        if slots % 9 == 4 || slots == 128 {
            variants.extend([
                (PolicyKind::LfuAging, 2, 4),
                (PolicyKind::Lru, 0, 0),
                (PolicyKind::LfuAging, 1, 0),
            ]);
        }
        for (policy, io_threads, pregate) in variants {
            let mut m = load(&path, 7);
            m.set_expert_cache(ExpertCacheOptions {
                slots,
                policy,
                io_threads,
                pregate,
            })
            .unwrap();
            let (toks, bits) = run(&m);
            let what = format!("slots {slots}, {policy:?}, io {io_threads}, pregate {pregate}");
            assert_eq!(toks, want_toks, "greedy tokens, {what}");
            let diff = bits.iter().zip(&want_bits).filter(|(a, b)| a != b).count();
            assert_eq!(diff, 0, "logits differ in {diff} places, {what}");
            let st = m.expert_cache().unwrap().stats();
            assert!(st.lookups > 0 && st.loads > 0, "{what}: {st:?}");
            if slots < 16 {
                assert!(st.evictions > 0, "{what}: a small cache must evict");
            }
            if slots == 128 {
                assert_eq!(st.evictions, 0, "{what}: everything fits");
            }
            checked += 1;
        }
    }
    assert!(checked > 125);
}

#[test]
fn dense_model_has_no_experts_and_cache_needs_a_file() {
    let Some(path) = fixture() else { return };
    let m = load(&path, 512);
    let (dense, experts) = m.weight_split().unwrap();
    let total: u64 = m.file().tensors().iter().map(|t| t.n_bytes).sum();
    assert_eq!(dense + experts, total);
    assert!(experts > 0 && dense > 0);
    // a model held in memory has no file to read experts from
    let bytes = std::fs::read(&path).unwrap();
    let f = Arc::new(GgufFile::from_bytes(bytes).unwrap());
    let mut m = Model::load(f, LoadOptions::default()).unwrap();
    let e = m
        .set_expert_cache(ExpertCacheOptions {
            slots: 8,
            ..Default::default()
        })
        .unwrap_err();
    assert!(e.to_string().contains("not opened from a file"), "{e}");
}

#[test]
fn plan_memory_installs_a_cache_or_refuses() {
    use redlite_model::expertcache::plan::DEFAULT_RESERVE;
    use redlite_model::expertcache::{ExpertResidency, PlanError};
    use redlite_model::{MemoryRequest, ModelError};
    let Some(path) = fixture() else { return };
    let mut m = load(&path, 512);
    let (dense, experts) = m.weight_split().unwrap();
    let slot = m.expert_layout().unwrap().slot_bytes();
    let (kv, rec) = m.state_bytes();
    let state = |sessions: u64| (kv * 64 + rec) * sessions;
    // room for dense + 3 sessions' state + reserve + exactly 10 slots
    let budget = dense + state(3) + DEFAULT_RESERVE + 10 * slot;
    let req = MemoryRequest {
        memory: Some(budget),
        ctx: 64,
        sessions: 3,
        cache: ExpertCacheOptions {
            pregate: usize::MAX,
            ..Default::default()
        },
        ..Default::default()
    };
    let p = m.plan_memory(&req).unwrap();
    assert_eq!(p.experts, ExpertResidency::Cached { slots: 10 });
    assert_eq!(m.expert_cache().unwrap().slots(), 10);
    assert_eq!(m.pregate(), 4, "default pre-gating: experts per token");
    // one more session's state no longer leaves the 4-slot minimum
    let mut m = load(&path, 512);
    let e = m
        .plan_memory(&MemoryRequest {
            memory: Some(dense + state(3) + DEFAULT_RESERVE + 3 * slot),
            ..req
        })
        .unwrap_err();
    assert!(
        matches!(e, ModelError::Plan(PlanError::TooSmall { .. })),
        "{e}"
    );
    assert!(m.expert_cache().is_none());
    // enough for everything: mapped, no cache
    let p = m
        .plan_memory(&MemoryRequest {
            memory: Some(dense + experts + state(3) + DEFAULT_RESERVE),
            ..req
        })
        .unwrap();
    assert_eq!(p.experts, ExpertResidency::Mapped);
    assert!(m.expert_cache().is_none());
}
