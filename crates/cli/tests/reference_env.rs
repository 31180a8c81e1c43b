//! `REDLITE_REFERENCE` is parsed once at start-up (redlite_quant's
//! `ReferenceMode`): a value that names no mode stops every command with
//! an error naming the variable, before any work.

use std::path::Path;
use std::process::Command;

fn inspect_with(value: &str) -> std::process::Output {
    let model = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/qwen3next/tiny-qwen3next-f32.gguf");
    Command::new(env!("CARGO_BIN_EXE_redlite"))
        .arg("inspect")
        .arg(model)
        .env("REDLITE_REFERENCE", value)
        .output()
        .expect("running redlite")
}

#[test]
fn a_bad_reference_value_is_an_error_naming_the_variable() {
    let out = inspect_with("yes");
    assert!(!out.status.success(), "REDLITE_REFERENCE=yes was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("REDLITE_REFERENCE") && err.contains("yes"),
        "{err}"
    );
}

#[test]
fn the_named_modes_are_accepted() {
    for v in ["", "0", "1", "f32", "F32"] {
        let out = inspect_with(v);
        assert!(
            out.status.success(),
            "REDLITE_REFERENCE={v:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
