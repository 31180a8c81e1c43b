//! `--memory` / `--expert-cache`: the memory plan of a run, printed in one
//! line at start-up, and the bounded expert cache it may install.

use crate::memory;
use anyhow::Result;
use redlite_model::expertcache::{parse_size, CacheStats, PolicyKind};
use redlite_model::{CacheCounters, ExpertCacheOptions, MemoryRequest, Model};

fn size(s: &str) -> Result<u64, String> {
    parse_size(s)
}

/// The memory flags shared by `generate` and `bench model`.
#[derive(clap::Args, Debug, Clone)]
pub struct MemoryArgs {
    /// Memory budget of this run (e.g. 8G, 6GiB, 4096M): dense weights,
    /// state, expert cache. Default: what is available (MemAvailable, and
    /// the cgroup limit if lower).
    #[arg(long, value_parser = size)]
    pub memory: Option<u64>,
    /// Size of the bounded expert cache (default: what the budget leaves
    /// when the whole model does not fit; none when it does).
    #[arg(long, value_parser = size)]
    pub expert_cache: Option<u64>,
    /// Expert cache eviction policy: lru, or lfu (least frequently used
    /// with aging).
    #[arg(long, default_value = "lru")]
    pub cache_policy: PolicyKind,
    /// Threads that read expert misses and prefetches in parallel.
    #[arg(long, default_value_t = 8)]
    pub io_threads: usize,
    /// Pre-gating: experts of the next MoE layer prefetched per decode
    /// step from the current hidden state (default: as many as a token
    /// uses; 0: off).
    #[arg(long)]
    pub pregate: Option<usize>,
}

/// `--no-mmap` read the whole file into anonymous memory: a bounded
/// expert cache or a smaller budget cannot undo that, so such a request is
/// refused before the plan.
pub fn check_in_memory(model: &Model, args: &MemoryArgs) -> Result<()> {
    if model.file().is_in_memory() {
        let size = model.file().file_size();
        if args.expert_cache.is_some() || args.memory.is_some_and(|m| m < size) {
            anyhow::bail!(
                "--no-mmap read the whole file ({}) into memory, which a bounded expert cache or a smaller --memory cannot undo: drop --no-mmap",
                memory::human(size)
            );
        }
    }
    Ok(())
}

/// One line of a backend's expert cache counters (a device cache).
pub fn counters_line(c: &CacheCounters) -> String {
    format!(
        "expert cache: hit rate {:.1}% ({} hits, {} misses), prefetched {} ({} used), {} copied",
        100.0 * c.hits as f64 / (c.hits + c.misses).max(1) as f64,
        c.hits,
        c.misses,
        c.prefetched,
        c.prefetch_used,
        memory::human(c.bytes_moved)
    )
}

impl MemoryArgs {
    /// The model's memory request for `sessions` states of `ctx` positions.
    pub fn request(&self, ctx: usize, sessions: usize) -> MemoryRequest {
        MemoryRequest {
            memory: self.memory,
            expert_cache: self.expert_cache,
            available: memory::available_bytes(),
            ctx,
            sessions,
            cache: ExpertCacheOptions {
                slots: 0,
                policy: self.cache_policy,
                io_threads: self.io_threads,
                pregate: self.pregate.unwrap_or(usize::MAX),
            },
            draft_kv_layers: 0,
        }
    }

    /// [`MemoryArgs::request`], with the MTP head's KV counted per
    /// session when `mtp` (it drafts at the same context).
    pub fn request_with_draft(&self, ctx: usize, sessions: usize, mtp: bool) -> MemoryRequest {
        MemoryRequest {
            draft_kv_layers: mtp as usize,
            ..self.request(ctx, sessions)
        }
    }
}

/// What the plan counted for a draft head's KV, as a clause for the
/// start-up line ("" when none).
pub fn draft_kv_line(model: &Model, req: &MemoryRequest) -> String {
    if req.draft_kv_layers == 0 {
        return String::new();
    }
    let bytes = model.draft_kv_bytes_per_position()
        * req.draft_kv_layers as u64
        * req.ctx as u64
        * req.sessions.max(1) as u64;
    format!(
        " (state includes the MTP head's KV: {} for {} positions x {} sessions)",
        memory::human(bytes),
        req.ctx,
        req.sessions.max(1)
    )
}

/// One line of cache counters, per token where `tokens` > 0.
pub fn stats_line(s: &CacheStats, tokens: usize) -> String {
    let per = |v: u64| v as f64 / tokens.max(1) as f64;
    format!(
        "expert cache: {} lookups, hit rate {:.1}% ({} hits, {} prefetched in time, {} prefetched late, {} misses), {} evictions, {} read ({}/token), prefetch {} issued / {} unused, waited {:.2} s",
        s.lookups,
        100.0 * s.hit_rate(),
        s.hits,
        s.prefetch_hits,
        s.prefetch_late,
        s.misses,
        s.evictions,
        memory::human(s.bytes_read),
        memory::human(per(s.bytes_read) as u64),
        s.prefetch_issued,
        s.prefetch_unused,
        s.wait_ns as f64 / 1e9
    )
}

/// The counters as JSON (for `bench model -o json`).
pub fn stats_json(s: &CacheStats) -> serde_json::Value {
    serde_json::json!({
        "lookups": s.lookups,
        "hits": s.hits,
        "prefetch_hits": s.prefetch_hits,
        "prefetch_late": s.prefetch_late,
        "misses": s.misses,
        "evictions": s.evictions,
        "loads": s.loads,
        "bytes_read": s.bytes_read,
        "prefetch_issued": s.prefetch_issued,
        "prefetch_unused": s.prefetch_unused,
        "wait_ns": s.wait_ns,
        "load_ns": s.load_ns,
        "hit_rate": s.hit_rate(),
    })
}
