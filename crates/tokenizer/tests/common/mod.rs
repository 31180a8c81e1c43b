#![allow(dead_code)]

use std::path::PathBuf;

use redlite_gguf::GgufFile;
use redlite_tokenizer::{ChatTemplate, Tokenizer};

pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(name)
}

pub fn qwen2_file() -> GgufFile {
    GgufFile::open(fixture("qwen2-tokenizer.gguf")).expect("open tokenizer fixture")
}

pub fn qwen2() -> Tokenizer {
    Tokenizer::from_gguf(qwen2_file().metadata()).expect("build tokenizer")
}

pub fn qwen2_template() -> ChatTemplate {
    ChatTemplate::from_gguf(qwen2_file().metadata()).expect("chat template")
}
