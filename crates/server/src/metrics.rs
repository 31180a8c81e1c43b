//! Counters and gauges, rendered as Prometheus text for `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Everything `/metrics` reports. Shared by the HTTP side and the engine.
#[derive(Debug, Default)]
pub struct Metrics {
    /// (endpoint, status) → count.
    requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Jobs waiting for the engine.
    pub queued: AtomicUsize,
    /// Jobs the engine is running (0 or 1).
    pub processing: AtomicUsize,
    pub prompt_tokens: AtomicU64,
    pub cached_tokens: AtomicU64,
    pub generated_tokens: AtomicU64,
    pub cancelled: AtomicU64,
    /// Prompt tokens computed and seconds spent on them (f64 bits).
    speeds: Mutex<Speeds>,
    /// Positions in the live session.
    pub kv_tokens: AtomicU64,
    pub ctx: AtomicU64,
    pub checkpoints: AtomicU64,
    pub checkpoint_tokens: AtomicU64,
    pub checkpoint_bytes: AtomicU64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Speeds {
    prompt_tokens: u64,
    prompt_secs: f64,
    decode_tokens: u64,
    decode_secs: f64,
    last_prompt_tps: f64,
    last_decode_tps: f64,
}

impl Metrics {
    pub fn count_request(&self, endpoint: &str, status: u16) {
        if let Ok(mut m) = self.requests.lock() {
            *m.entry((endpoint.to_string(), status)).or_insert(0) += 1;
        }
    }

    /// Requests answered so far with `status` at `endpoint`.
    pub fn requests(&self, endpoint: &str, status: u16) -> u64 {
        self.requests
            .lock()
            .ok()
            .and_then(|m| m.get(&(endpoint.to_string(), status)).copied())
            .unwrap_or(0)
    }

    /// One job's timings: prompt tokens computed in `prompt_secs`, decode
    /// steps in `decode_secs`.
    pub fn record_speeds(
        &self,
        prompt_tokens: usize,
        prompt_secs: f64,
        decode_tokens: usize,
        decode_secs: f64,
    ) {
        if let Ok(mut s) = self.speeds.lock() {
            if prompt_tokens > 0 && prompt_secs > 0.0 {
                s.prompt_tokens += prompt_tokens as u64;
                s.prompt_secs += prompt_secs;
                s.last_prompt_tps = prompt_tokens as f64 / prompt_secs;
            }
            if decode_tokens > 0 && decode_secs > 0.0 {
                s.decode_tokens += decode_tokens as u64;
                s.decode_secs += decode_secs;
                s.last_decode_tps = decode_tokens as f64 / decode_secs;
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: Vec<(String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, v) in lines {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let requests: Vec<(String, f64)> = self
            .requests
            .lock()
            .map(|m| {
                m.iter()
                    .map(|((e, s), n)| (format!("{{endpoint=\"{e}\",status=\"{s}\"}}"), *n as f64))
                    .collect()
            })
            .unwrap_or_default();
        metric(
            "redlite_requests_total",
            "counter",
            "HTTP requests answered, by endpoint and status.",
            requests,
        );
        let g = |a: &AtomicU64| vec![(String::new(), a.load(Ordering::Relaxed) as f64)];
        let gu = |a: &AtomicUsize| vec![(String::new(), a.load(Ordering::Relaxed) as f64)];
        metric(
            "redlite_prompt_tokens_total",
            "counter",
            "Prompt tokens of finished requests (computed or cached).",
            g(&self.prompt_tokens),
        );
        metric(
            "redlite_prompt_tokens_cached_total",
            "counter",
            "Prompt tokens served from the prompt cache.",
            g(&self.cached_tokens),
        );
        metric(
            "redlite_generated_tokens_total",
            "counter",
            "Tokens generated.",
            g(&self.generated_tokens),
        );
        metric(
            "redlite_requests_cancelled_total",
            "counter",
            "Generations stopped because the client went away.",
            g(&self.cancelled),
        );
        let s = self.speeds.lock().map(|s| *s).unwrap_or_default();
        metric(
            "redlite_prompt_seconds_total",
            "counter",
            "Seconds spent computing prompts.",
            vec![(String::new(), s.prompt_secs)],
        );
        metric(
            "redlite_decode_seconds_total",
            "counter",
            "Seconds spent generating tokens.",
            vec![(String::new(), s.decode_secs)],
        );
        let avg = |t: u64, secs: f64| if secs > 0.0 { t as f64 / secs } else { 0.0 };
        metric(
            "redlite_prompt_tokens_per_second",
            "gauge",
            "Prompt processing speed: the last request's, and the average.",
            vec![
                ("{window=\"last\"}".into(), s.last_prompt_tps),
                (
                    "{window=\"all\"}".into(),
                    avg(s.prompt_tokens, s.prompt_secs),
                ),
            ],
        );
        metric(
            "redlite_decode_tokens_per_second",
            "gauge",
            "Decode speed: the last request's, and the average.",
            vec![
                ("{window=\"last\"}".into(), s.last_decode_tps),
                (
                    "{window=\"all\"}".into(),
                    avg(s.decode_tokens, s.decode_secs),
                ),
            ],
        );
        metric(
            "redlite_queue_depth",
            "gauge",
            "Requests waiting for the engine.",
            gu(&self.queued),
        );
        metric(
            "redlite_requests_processing",
            "gauge",
            "Requests the engine is running.",
            gu(&self.processing),
        );
        let ctx = self.ctx.load(Ordering::Relaxed);
        let kv = self.kv_tokens.load(Ordering::Relaxed);
        metric(
            "redlite_kv_cache_tokens",
            "gauge",
            "Positions held by the live session.",
            vec![(String::new(), kv as f64)],
        );
        metric(
            "redlite_kv_cache_capacity_tokens",
            "gauge",
            "Context size of a session.",
            vec![(String::new(), ctx as f64)],
        );
        metric(
            "redlite_kv_cache_usage_ratio",
            "gauge",
            "Live session positions over the context size.",
            vec![(
                String::new(),
                if ctx > 0 { kv as f64 / ctx as f64 } else { 0.0 },
            )],
        );
        metric(
            "redlite_prompt_cache_checkpoints",
            "gauge",
            "Session checkpoints kept for prompt reuse.",
            g(&self.checkpoints),
        );
        metric(
            "redlite_prompt_cache_tokens",
            "gauge",
            "Tokens held by the checkpoints.",
            g(&self.checkpoint_tokens),
        );
        metric(
            "redlite_prompt_cache_bytes",
            "gauge",
            "Bytes held by the checkpoints (KV, recurrent state, logits).",
            g(&self.checkpoint_bytes),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.count_request("/v1/chat/completions", 200);
        m.count_request("/v1/chat/completions", 200);
        m.count_request("/v1/completions", 400);
        m.record_speeds(100, 0.5, 9, 0.3);
        m.queued.store(2, Ordering::Relaxed);
        let t = m.render();
        assert!(t.contains(
            "redlite_requests_total{endpoint=\"/v1/chat/completions\",status=\"200\"} 2\n"
        ));
        assert!(
            t.contains("redlite_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1\n")
        );
        assert!(t.contains("redlite_prompt_tokens_per_second{window=\"last\"} 200\n"));
        assert!(t.contains("redlite_queue_depth 2\n"));
        assert!(t.contains("# TYPE redlite_generated_tokens_total counter\n"));
        // Every sample line is `name{labels} number`.
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let v = line.rsplit(' ').next().unwrap();
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
        assert_eq!(m.requests("/v1/chat/completions", 200), 2);
    }
}
