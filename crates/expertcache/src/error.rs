use std::path::PathBuf;

/// Errors of the expert cache and its file loader. Each names what it is about.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(
        "reading expert {expert} of layer {layer} from `{file}`: tensor `{tensor}`, {len} bytes at offset {offset}: {source}"
    )]
    Read {
        file: PathBuf,
        tensor: String,
        layer: usize,
        expert: usize,
        offset: u64,
        len: u64,
        source: std::io::Error,
    },
    #[error("opening `{file}` for expert reads: {source}")]
    Open {
        file: PathBuf,
        source: std::io::Error,
    },
    #[error("layer {layer} has no routed experts in the expert layout")]
    NoExperts { layer: usize },
    #[error("expert {expert} of layer {layer} is out of range ({n_expert} experts)")]
    ExpertRange {
        layer: usize,
        expert: usize,
        n_expert: usize,
    },
    #[error("an expert of layer {layer} needs {need} bytes but a cache slot holds {slot}")]
    SlotTooSmall { layer: usize, need: u64, slot: u64 },
    #[error(
        "an expert cache needs at least one slot of at least one byte (got {slots} × {slot_bytes})"
    )]
    Empty { slots: usize, slot_bytes: usize },
    #[error("every one of the {slots} cache slots is pinned and none is loading: nothing can be evicted")]
    AllPinned { slots: usize },
}
