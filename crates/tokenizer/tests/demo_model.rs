//! The full demo model (scripts/fetch-demo-model.sh) gives the same tokenizer
//! as the committed tokenizer-only fixture. Skipped when the model is absent.

mod common;

use std::path::PathBuf;

use redlite_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

fn demo_model() -> Option<PathBuf> {
    let dir = std::env::var_os("REDLITE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/redlite")))?;
    let p = dir.join("demo-model.gguf");
    p.exists().then_some(p)
}

#[test]
fn demo_model_tokenizer_matches_fixture() {
    let Some(path) = demo_model() else {
        eprintln!("demo model not found; run scripts/fetch-demo-model.sh (skipping)");
        return;
    };
    let file = redlite_gguf::GgufFile::open(&path).unwrap();
    let full = Tokenizer::from_gguf(file.metadata()).unwrap();
    let fixture = common::qwen2();
    assert_eq!(full.vocab_size(), fixture.vocab_size());
    let text = "<|im_start|>user\nfn main() { println!(\"héllo 世界 😀\"); }<|im_end|>\n";
    assert_eq!(full.encode(text, true), fixture.encode(text, true));
    let msgs = [ChatMessage::user("Hi")];
    let a = ChatTemplate::from_gguf(file.metadata())
        .unwrap()
        .render(&msgs, None, true, None)
        .unwrap();
    let b = common::qwen2_template()
        .render(&msgs, None, true, None)
        .unwrap();
    assert_eq!(a, b);
}
