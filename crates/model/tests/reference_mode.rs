//! The process-wide `ReferenceMode` (set once by the binary from
//! `REDLITE_REFERENCE`) reaches the model: its own process, since the mode
//! is global to the process.

use redlite_model::{LoadOptions, Model};
use redlite_quant::{set_reference_mode, ReferenceMode};
use std::sync::Arc;

#[test]
fn the_process_mode_forces_the_reference_path() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/fixtures/qwen3next/tiny-qwen3next-f32.gguf"
    );
    let file = Arc::new(redlite_gguf::GgufFile::open(path).unwrap());
    let load = || Model::load(file.clone(), LoadOptions::default()).unwrap();
    assert!(!load().is_reference(), "off by default");
    for mode in [ReferenceMode::Ggml, ReferenceMode::F32] {
        set_reference_mode(mode);
        assert!(load().is_reference(), "{mode:?}");
        assert_eq!(
            redlite_model::exec::reference_f32_activations(),
            mode == ReferenceMode::F32
        );
    }
    set_reference_mode(ReferenceMode::Off);
    assert!(!load().is_reference());
}
