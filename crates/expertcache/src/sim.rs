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

/// [`simulate`] with one cache of `slots_per_layer` slots per MoE layer
/// instead of one shared cache: the device cache's arrangement (each
/// layer's experts live in that layer's own slot pool). Hits and misses
/// are summed over the layers.
pub fn simulate_per_layer(
    trace: &RouteTrace,
    slots_per_layer: usize,
    policy: PolicyKind,
    warmup: usize,
) -> (u64, u64) {
    let n_layers = trace.iter().map(Vec::len).max().unwrap_or(0);
    let (mut hits, mut misses) = (0u64, 0u64);
    for layer in 0..n_layers {
        let one: RouteTrace = trace
            .iter()
            .map(|t| vec![t.get(layer).cloned().unwrap_or_default()])
            .collect();
        let st = simulate(&one, slots_per_layer, policy, warmup);
        hits += st.hits;
        misses += st.misses;
    }
    (hits, misses)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_layer_pools_by_hand() {
        // Two layers, one slot each. Layer 0 asks 1, 1: miss, hit. Layer 1
        // asks 1, 2: miss, miss (its only slot held expert 1).
        let trace = parse_trace("1;1\n1;2\n").unwrap();
        assert_eq!(simulate_per_layer(&trace, 1, PolicyKind::Lru, 0), (1, 3));
        // With the first token as warm-up only the second counts.
        assert_eq!(simulate_per_layer(&trace, 1, PolicyKind::Lru, 1), (1, 1));
    }
}
