//! `redlite serve` without `-c` on the demo model: the trained context
//! when the memory plan allows it, else the largest multiple of 1024 that
//! fits the budget.
//!
//! Expected values come from the model's published config
//! (Qwen2.5-Coder-0.5B-Instruct's config.json: max_position_embeddings
//! 32768, num_hidden_layers 24, num_key_value_heads 2, hidden_size 896 over
//! 14 attention heads, so 64 dimensions per head).

mod common;

use redlite_server::{load, ServeArgs};

fn args() -> Option<ServeArgs> {
    let Some(model) = common::demo_model() else {
        if std::env::var_os("CI").is_some() {
            panic!("CI is set but the demo model is missing");
        }
        eprintln!("SKIPPED: the demo model is missing (bash scripts/fetch-demo-model.sh)");
        return None;
    };
    let mut a = ServeArgs::for_model(model);
    a.no_warmup = true;
    a.port = 0;
    Some(a)
}

/// 24 layers × 2 KV heads × 64 dims × (K, V) × 4 bytes.
const KV_PER_POSITION: u64 = 24 * 2 * 64 * 2 * 4;

#[test]
fn without_c_the_trained_context_is_used_when_it_fits() {
    let Some(mut a) = args() else { return };
    // A budget that holds 5 sessions (live + 4 checkpoints) of 32768
    // positions: 5 × 768 MiB + the weights + the reserve.
    a.memory = Some(8 << 30);
    assert_eq!(a.ctx_size, 0, "the default is the planned context");
    let s = load(&a).expect("load");
    assert_eq!(s.limits.ctx, 32768);
}

#[test]
fn a_small_budget_gives_the_largest_multiple_of_1024_that_fits() {
    let Some(mut a) = args() else { return };
    a.memory = Some(2 << 30);
    let s = load(&a).expect("load");
    // The plan's sum (crates/expertcache plan.rs): weights (every
    // tensor's bytes) + 5 sessions (live + 4 checkpoints) × KV + the
    // 512 MiB reserve within 2 GiB, in whole steps of 1024 positions.
    let f = redlite_gguf::GgufFile::open(&a.model).unwrap();
    let weights: u64 = f.tensors().iter().map(|t| t.n_bytes).sum();
    let room = (2u64 << 30) - weights - (512 << 20);
    let want = room / (5 * KV_PER_POSITION) / 1024 * 1024;
    assert_eq!(s.limits.ctx as u64, want);
    assert!(want > 1024 && want < 32768, "{want}");
    // Not even the smallest context fits: the plan's refusal, with numbers.
    a.memory = Some(600 << 20);
    let e = load(&a).err().expect("refused");
    assert!(e.to_string().contains("does not fit"), "{e}");
}
