//! What the machine has: RAM and the cgroup limit, for the start-up
//! statement of what will be resident and the refusal of runs that cannot fit.

pub use redlite_model::expertcache::plan::human;
pub use redlite_model::expertcache::residency::{available_bytes, cgroup_limit_bytes};

/// How the model file's bytes are held: `--mmap` maps it (pages read on
/// demand, evictable), `--no-mmap` reads it into anonymous memory with
/// transparent huge pages (not evictable; faster streaming), and the default
/// reads it in when it takes at most half of the available memory, or of
/// the `--memory` budget when that is smaller. With `--expert-cache` the
/// file is always mapped: the experts the cache does not hold must stay
/// out of memory.
pub fn open_model(
    path: &std::path::Path,
    mmap: bool,
    no_mmap: bool,
    mem: &crate::residency::MemoryArgs,
) -> anyhow::Result<redlite_gguf::GgufFile> {
    use anyhow::Context;
    let budget = match (available_bytes(), mem.memory) {
        (Some(a), Some(m)) => Some(a.min(m)),
        (a, m) => a.or(m),
    };
    let file = if mmap || mem.expert_cache.is_some() {
        redlite_gguf::GgufFile::open(path)
    } else if no_mmap {
        redlite_gguf::GgufFile::open_in_memory(path)
    } else {
        redlite_gguf::GgufFile::open_auto(path, budget)
    };
    file.with_context(|| format!("opening model {}", path.display()))
}

/// How the start-up line names where the weights are.
pub fn weights_residency(file: &redlite_gguf::GgufFile) -> &'static str {
    if file.is_in_memory() {
        "read into memory (huge pages)"
    } else {
        "mapped from the file"
    }
}
