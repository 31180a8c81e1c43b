//! Replaying routing traces through the cache, to choose the eviction
//! policy and size by measurement rather than by guess.
//!
//! Trace format (text, one line per decoded token): the layers' chosen
//! experts separated by `;`, the experts of a layer by `,` (an empty field
//! for a layer without routed experts). `redlite bench model --dump-routes`
//! writes it.

use crate::cache::{CacheConfig, CacheStats, ExpertCache, ExpertKey, ExpertLoader};
use crate::error::CacheError;
use crate::policy::PolicyKind;
use std::sync::Arc;

/// Per token, per layer, the chosen experts.
pub type RouteTrace = Vec<Vec<Vec<u32>>>;

/// One token's line of the trace format.
pub fn format_token(layers: &[Vec<u32>]) -> String {
    layers
        .iter()
        .map(|l| {
            l.iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// Parse a whole trace.
pub fn parse_trace(text: &str) -> Result<RouteTrace, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, line)| {
            line.split(';')
                .map(|f| {
                    f.split(',')
                        .filter(|x| !x.trim().is_empty())
                        .map(|x| {
                            x.trim()
                                .parse::<u32>()
                                .map_err(|_| format!("line {}: `{x}` is not an expert id", i + 1))
                        })
                        .collect()
                })
                .collect()
        })
        .collect()
}

struct NullLoader;

impl ExpertLoader for NullLoader {
    fn load(&self, _: ExpertKey, buf: &mut [u8]) -> Result<u64, CacheError> {
        Ok(buf.len() as u64)
    }
}

/// How a cache of `slots` slots under `policy` would have done on `trace`:
/// each token's layers in order, one `demand` per layer then a `get` per
/// expert (the engine's call pattern), reads instantaneous.
/// `warmup` tokens are replayed first and not counted.
pub fn simulate(trace: &RouteTrace, slots: usize, policy: PolicyKind, warmup: usize) -> CacheStats {
    let cache = ExpertCache::new(
        CacheConfig {
            slots,
            slot_bytes: 1,
            policy,
            io_threads: 0,
        },
        Arc::new(NullLoader),
    )
    .expect("slots > 0");
    for (t, token) in trace.iter().enumerate() {
        if t == warmup {
            cache.reset_stats();
        }
        for (layer, experts) in token.iter().enumerate() {
            if experts.is_empty() {
                continue;
            }
            let keys: Vec<ExpertKey> = experts
                .iter()
                .map(|&e| ExpertKey::new(layer, e as usize))
                .collect();
            cache.demand(&keys);
            for &k in &keys {
                drop(cache.get(k).expect("a null load cannot fail"));
            }
        }
    }
    if warmup >= trace.len() {
        cache.reset_stats();
    }
    cache.stats()
}
