//! Set-up shared by the engine's integration tests: the tiny Qwen3-Next
//! fixtures opened as engines.
#![allow(dead_code)] // each test file uses part of it

use redlite_engine::{BackendOptions, Engine, MemoryRequest, Model};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A prompt of ids inside the fixtures' 512-token vocabulary.
pub const PROMPT: [u32; 9] = [1, 17, 33, 5, 250, 7, 91, 12, 3];

/// `tests/fixtures/qwen3next/<name>` of the repository.
pub fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next")
        .join(name)
}

/// The model at `path` (`reference`: the CPU's float64-accumulating
/// reference path) opened with `opts` for `sessions` sequences of `ctx`
/// positions.
pub fn open(
    path: &Path,
    reference: bool,
    opts: &BackendOptions,
    ctx: usize,
    sessions: usize,
) -> Engine {
    let file = Arc::new(redlite_gguf::GgufFile::open(path).expect("fixture opens"));
    let mut model = Model::load(file, Default::default()).expect("fixture loads");
    model.set_reference(reference);
    let mem = MemoryRequest {
        ctx,
        sessions,
        ..Default::default()
    };
    Engine::open(model, opts, &mem).expect("engine opens")
}

/// Fixture `name` on the default (CPU) backend.
pub fn cpu_engine(name: &str, ctx: usize, sessions: usize) -> Engine {
    open(
        &fixture(name),
        false,
        &BackendOptions::default(),
        ctx,
        sessions,
    )
}
