//! Crafted model files: each is refused at load with an error naming the
//! metadata key or tensor, before anything is sized from the bad value.
//! (Before these checks: index out of bounds in RoPE, a 680 GB allocation,
//! a wrapped `head_dim × n_head`, NaN logits, a token without an embedding.)

mod common;

use common::qwen2::Qwen2Tiny;
use common::Tiny;
use redlite_gguf::{GgufFile, GgufWriter, MetadataValue};
use redlite_model::expertcache::PlanError;
use redlite_model::{check_model_bytes, LoadOptions, Logits, MemoryRequest, Model, ModelError};
use std::sync::Arc;

fn load(bytes: Vec<u8>) -> Result<Model, ModelError> {
    let opts = LoadOptions {
        threads: 1,
        ..LoadOptions::default()
    };
    Model::load(Arc::new(GgufFile::from_bytes(bytes).unwrap()), opts)
}

fn q3n_with(meta: impl FnOnce(&mut GgufWriter)) -> Result<Model, ModelError> {
    load(Tiny::small().bytes_edit(|_| {}, meta))
}

/// The load error's message, which must name `key`; also run through the
/// fuzz target's checks, which must give the same kind of answer.
fn refused(r: Result<Model, ModelError>, bytes_check: Result<(), ModelError>, key: &str) -> String {
    let msg = r
        .map(|_| ())
        .expect_err("the crafted file loaded")
        .to_string();
    assert!(msg.contains(key), "error does not name `{key}`: {msg}");
    let msg2 = bytes_check
        .expect_err("check_model_bytes accepted it")
        .to_string();
    assert!(msg2.contains(key), "{msg2}");
    msg
}

fn q3n_case(key: &str, v: impl Into<MetadataValue> + Clone) -> String {
    let k = format!("qwen3next.{key}");
    let bytes = Tiny::small().bytes_edit(|_| {}, |w| w.add_kv(k.clone(), v.clone()));
    refused(
        q3n_with(|w| w.add_kv(k.clone(), v)),
        check_model_bytes(&bytes),
        &k,
    )
}

fn q2_case(key: &str, v: impl Into<MetadataValue> + Clone) -> String {
    let k = format!("qwen2.{key}");
    let bytes = Qwen2Tiny::default().bytes_edit(|w| w.add_kv(k.clone(), v));
    refused(load(bytes.clone()), check_model_bytes(&bytes), &k)
}

#[test]
fn the_small_models_load_and_run() {
    let m = q3n_with(|_| {}).unwrap();
    let mut s = m.new_session(0);
    assert_eq!(s.forward(&m, &[1, 2], Logits::Last).unwrap().len(), 8);
    let bytes = Tiny::small().bytes_with(|_| {});
    check_model_bytes(&bytes).unwrap();
    let q2 = Qwen2Tiny::default().bytes_edit(|_| {});
    let m = load(q2.clone()).unwrap();
    let mut s = m.new_session(0);
    assert_eq!(s.forward(&m, &[3], Logits::Last).unwrap().len(), 8);
    check_model_bytes(&q2).unwrap();
}

#[test]
fn rope_dimension_above_head_dim_is_refused() {
    // Head dim 4: rotating 6 dims indexed past the head in ops.rs.
    let msg = q3n_case("rope.dimension_count", 6u32);
    assert!(msg.contains("0..=4"), "{msg}");
    q3n_case("rope.dimension_count", 3u32); // odd: RoPE rotates pairs
}

#[test]
fn absurd_layer_counts_are_refused_before_any_allocation() {
    for n in [1_000_000_000u64, 1 << 62, 0] {
        q3n_case("block_count", n);
        q2_case("block_count", n);
    }
    // Within the cap but more than the tensors present.
    let msg = q3n_case("block_count", 1000u32);
    assert!(msg.contains("tensors"), "{msg}");
}

#[test]
fn absurd_nextn_counts_are_refused() {
    // Tiny::small has 2 blocks: NextN counts that leave no trunk, or exceed
    // block_count, or do not fit in memory sizes.
    for n in [2u64, 3, 1 << 40, u64::MAX] {
        q3n_case("nextn_predict_layers", n);
    }
    // One NextN block of two: block 1 is then an MTP block and must have
    // its nextn.* tensors (the tiny model has none).
    let msg = q3n_with(|w| w.add_kv("qwen3next.nextn_predict_layers", 1u32))
        .expect_err("loaded without the MTP tensors")
        .to_string();
    assert!(msg.contains("blk.1."), "{msg}");
}

#[test]
fn head_sizes_that_would_wrap_are_refused() {
    let huge = (1u64 << 63) / 2 + 1;
    q3n_case("attention.key_length", huge);
    q2_case("attention.key_length", huge);
    q3n_case("attention.head_count", 1u64 << 40);
    q2_case("attention.head_count", 0u32);
    q3n_case("ssm.state_size", 1u64 << 33);
    q3n_case("ssm.time_step_rank", 0u32);
    q3n_case("ssm.conv_kernel", 0u32);
    q3n_case("embedding_length", u64::MAX);
    q2_case("feed_forward_length", 1u64 << 50);
}

#[test]
fn expert_counts_and_floats_are_checked() {
    let msg = q3n_case("expert_used_count", 3u32); // 2 experts
    assert!(msg.contains("0..=2"), "{msg}");
    q3n_case("expert_count", 1u64 << 20);
    q3n_case("attention.layer_norm_rms_epsilon", f32::NAN);
    q3n_case("rope.freq_base", -1.0f32);
    q2_case("rope.freq_base", f32::INFINITY);
    q3n_case("context_length", 0u32);
    q2_case("context_length", 1u64 << 40);
}

#[test]
fn recurrent_state_beyond_the_file_is_refused() {
    // 64 value heads × 16384 × 16384 floats: within each cap, 64 GiB of
    // state for a file of kilobytes (shapes are checked after config).
    let r = q3n_with(|w| {
        w.add_kv("qwen3next.ssm.time_step_rank", 64u32);
        w.add_kv("qwen3next.ssm.group_count", 64u32);
        w.add_kv("qwen3next.ssm.inner_size", 64u32 * 16384);
        w.add_kv("qwen3next.ssm.state_size", 16384u32);
    });
    let msg = r.map(|_| ()).unwrap_err().to_string();
    assert!(
        msg.contains("qwen3next.ssm") && msg.contains("recurrent state"),
        "{msg}"
    );
}

#[test]
fn non_finite_norm_weights_are_refused_with_the_tensor_name() {
    for (name, bad) in [
        ("blk.0.attn_norm.weight", f32::NAN),
        ("blk.1.attn_k_norm.weight", f32::INFINITY),
        ("output_norm.weight", f32::NEG_INFINITY),
        ("blk.0.ssm_norm.weight", f32::NAN),
    ] {
        let bytes = Tiny::small().bytes_with(|w| w.tensors.get_mut(name).unwrap().1[1] = bad);
        let err = load(bytes).unwrap_err();
        assert!(
            matches!(&err, ModelError::NonFinite { name: n, index: 1, .. } if n == name),
            "{err}"
        );
        assert!(err.to_string().contains(name), "{err}");
    }
}

#[test]
fn non_finite_embeddings_are_caught_at_load_or_when_embedded() {
    // A whole bad tensor (every row): the sampled scan at load sees it.
    let t = Tiny::default(); // 96 rows: more than the 64 sampled
    let bytes = t.bytes_with(|w| {
        let e = w.tensors.get_mut("token_embd.weight").unwrap();
        e.1.iter_mut().for_each(|x| *x = f32::NAN);
    });
    let err = load(bytes).unwrap_err().to_string();
    assert!(err.contains("token_embd.weight"), "{err}");
    // One bad row that the scan skips (rows 0, 1, 3, 4, 6, ... are sampled):
    // refused when that token is embedded, naming the tensor.
    let d = t.d;
    let bytes = t.bytes_with(|w| {
        let e = w.tensors.get_mut("token_embd.weight").unwrap();
        e.1[5 * d + 3] = f32::INFINITY;
    });
    let m = load(bytes).unwrap();
    let mut s = m.new_session(0);
    s.forward(&m, &[4], Logits::Last).unwrap();
    let err = s.forward(&m, &[5], Logits::Last).unwrap_err();
    assert!(
        matches!(&err, ModelError::NonFinite { name, index, .. } if name == "token_embd.weight" && *index == 5 * d + 3),
        "{err}"
    );
}

#[test]
fn a_tokenizer_larger_than_the_embedding_is_refused_at_load() {
    let tokens: Vec<String> = (0..9).map(|i| format!("t{i}")).collect(); // 8 rows
    let bytes = Tiny::small().bytes_edit(
        |_| {},
        |w| w.add_kv("tokenizer.ggml.tokens", MetadataValue::string_array(tokens)),
    );
    let err = load(bytes).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, ModelError::VocabMismatch { tokens: 9, rows: 8 }),
        "{msg}"
    );
    assert!(
        msg.contains("token_embd.weight") && msg.contains("tokenizer.ggml.tokens"),
        "{msg}"
    );
    // Fewer tokens than rows (a padded embedding) is fine.
    let bytes = Tiny::small().bytes_edit(
        |_| {},
        |w| {
            w.add_kv(
                "tokenizer.ggml.tokens",
                MetadataValue::string_array(["a", "b"]),
            )
        },
    );
    load(bytes).unwrap();
}

#[test]
fn a_context_whose_state_overflows_is_refused_naming_it() {
    let mut m = q3n_with(|_| {}).unwrap();
    for ctx in [4611686018427387904usize, usize::MAX] {
        let err = m
            .plan_memory(&MemoryRequest {
                ctx,
                sessions: 1,
                ..MemoryRequest::default()
            })
            .unwrap_err();
        assert!(
            matches!(err, ModelError::Plan(PlanError::StateOverflow { ctx: c, .. }) if c == ctx as u64),
            "{err}"
        );
        assert!(err.to_string().contains(&ctx.to_string()), "{err}");
    }
    // A large but representable context is planned (and its state is
    // counted, not wrapped to 0).
    let p = m
        .plan_memory(&MemoryRequest {
            ctx: 1 << 40,
            sessions: 1,
            ..MemoryRequest::default()
        })
        .unwrap();
    assert!(p.input.state_bytes >= 1 << 40);
}

#[test]
fn a_draft_heads_kv_is_counted_per_session_and_position() {
    let t = Tiny::small();
    let mut m = q3n_with(|_| {}).unwrap();
    // One attention layer's K and V rows at a position, f32: the file's
    // head_count_kv x key_length, twice, 4 bytes each.
    let per_position = (2 * t.n_kv * t.hd * 4) as u64;
    assert_eq!(m.draft_kv_bytes_per_position(), per_position);
    let req = |draft_kv_layers| MemoryRequest {
        ctx: 1000,
        sessions: 3,
        draft_kv_layers,
        ..MemoryRequest::default()
    };
    let plain = m.plan_memory(&req(0)).unwrap().input.state_bytes;
    let with_mtp = m.plan_memory(&req(1)).unwrap().input.state_bytes;
    assert_eq!(with_mtp - plain, 3 * 1000 * per_position);
}
