//! Everything loading does with a file short of running it, on bytes: for
//! the loader fuzz target (`fuzz/fuzz_targets/load.rs`) and the test that
//! replays its corpus in the workspace's test run.

use crate::arch::Arch;
use crate::model::{plan_for, MemoryRequest};
use crate::ModelError;
use redlite_gguf::GgufFile;

/// Contexts the memory plan is asked about: the smallest, the trained
/// one, and sizes whose state does not fit 64 bits.
const PROBE_CONTEXTS: [usize; 3] = [1, usize::MAX / 2, 1 << 62];

/// Parse `bytes`, extract the config of its architecture (qwen2 or
/// qwen3next), check every tensor against its spec (and the small ones
/// for non-finite values), size one session's state, and plan memory for
/// a few contexts and budgets. Any input gives `Ok` or an error; a panic,
/// abort or huge allocation is a bug.
pub fn check_model_bytes(bytes: &[u8]) -> Result<(), ModelError> {
    let file = GgufFile::from_bytes(bytes.to_vec())?;
    let arch = Arch::load(&file)?;
    let trained = arch.context_length();
    for ctx in std::iter::once(trained).chain(PROBE_CONTEXTS) {
        for (memory, available) in [
            (None, None),
            (Some(1 << 30), Some(16 << 30)),
            (Some(1), None),
        ] {
            let req = MemoryRequest {
                ctx,
                memory,
                available,
                sessions: 1,
                ..MemoryRequest::default()
            };
            // Refusals are expected answers here; only the absence of a
            // panic matters.
            let _ = plan_for(&file, &arch, &req);
        }
    }
    let _ = arch.expert_layout()?;
    let _ = crate::model::session_state_bytes(&arch, trained, 1, 0)?;
    Ok(())
}
