//! `--memory` / `--expert-cache`: the memory plan of a run, printed in one
//! line at start-up, and the bounded expert cache it may install.

use crate::memory;
use anyhow::Result;
use redlite_model::expertcache::{parse_size, CacheStats, ExpertCache, Plan, PolicyKind};
use redlite_model::{ExpertCacheOptions, MemoryRequest, Model};

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
    /// With --device cuda and a bounded expert cache: where misses are
    /// copied from. pinned: every expert in page-locked host memory (fast;
    /// needs RAM for all experts); file: read from the model file by the
    /// host (through the page cache) when RAM cannot hold them; auto:
    /// pinned when the experts fit in the available RAM.
    #[arg(long, default_value = "auto", value_parser = ["auto", "pinned", "file"])]
    pub expert_source: String,
}

/// Plan the run's memory for `ctx` positions; print the plan line; install
/// the expert cache when the plan has one. Fails, with the numbers, before
/// any weight is read when the configuration cannot fit.
pub fn apply(model: &mut Model, args: &MemoryArgs, ctx: usize) -> Result<Plan> {
    if model.file().is_in_memory() {
        // The whole file is already in anonymous memory: a cache of its
        // experts would only add to it.
        let size = model.file().file_size();
        if args.expert_cache.is_some() || args.memory.is_some_and(|m| m < size) {
            anyhow::bail!(
                "--no-mmap read the whole file ({}) into memory, which a bounded expert cache or a smaller --memory cannot undo: drop --no-mmap",
                memory::human(size)
            );
        }
    }
    let p = model.plan_memory(&args.request(ctx, 1))?;
    eprintln!("redlite: {p}");
    if let Some(c) = model.expert_cache() {
        eprintln!("redlite: {}, pre-gating {}", cache_line(c), model.pregate());
    }
    Ok(p)
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
        }
    }
}

/// How the cache runs, in words.
pub fn cache_line(c: &ExpertCache) -> String {
    format!(
        "expert cache {} policy, {} I/O threads",
        c.policy().name(),
        c.io_threads()
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
