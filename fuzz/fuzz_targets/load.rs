//! Fuzz the model loader: any bytes through the GGUF parser, the config
//! extraction of every supported architecture (qwen2, qwen3next), the
//! tensor-spec checks and the memory plan (`redlite_model::check_model_bytes`).
//! Every input must give `Ok` or a typed error: no panic (overflow checks
//! are on), no out-of-bounds read (AddressSanitizer), no allocation past
//! the RSS limit.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = redlite_model::check_model_bytes(data);
});
