//! Counters and gauges, rendered as Prometheus text for `GET /metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Everything `/metrics` reports. Shared by the HTTP side and the engine.
#[derive(Debug)]
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
    /// Speculative decoding: verify passes, draft tokens proposed, kept.
    pub spec_passes: AtomicU64,
    pub spec_drafted: AtomicU64,
    pub spec_accepted: AtomicU64,
    /// Seconds from the engine taking a request to its first token.
    pub ttft: Histogram<12>,
    /// Seconds from one generated token to the next (one per token after
    /// the first).
    pub token_latency: Histogram<12>,
    /// Seconds computing a request's prompt (the part not cached).
    pub prompt_latency: Histogram<12>,
}

/// A Prometheus histogram with fixed upper bounds (seconds).
#[derive(Debug)]
pub struct Histogram<const N: usize> {
    bounds: [f64; N],
    inner: Mutex<(
        /* per bucket */ [u64; N],
        /* count */ u64,
        /* sum */ f64,
    )>,
}

/// Time to first token: 10 ms (a cached prompt) to a minute (a long one).
const TTFT_BOUNDS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Per-token decode latency: 1 ms (a small model on a GPU) to 2 s.
const TOKEN_BOUNDS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.25, 0.5, 2.0,
];

/// Prompt processing: 10 ms (a few new tokens) to two minutes (a long
/// prompt on a CPU).
const PROMPT_BOUNDS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0, 120.0,
];

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            requests: Default::default(),
            queued: Default::default(),
            processing: Default::default(),
            prompt_tokens: Default::default(),
            cached_tokens: Default::default(),
            generated_tokens: Default::default(),
            cancelled: Default::default(),
            speeds: Default::default(),
            kv_tokens: Default::default(),
            ctx: Default::default(),
            checkpoints: Default::default(),
            checkpoint_tokens: Default::default(),
            checkpoint_bytes: Default::default(),
            spec_passes: Default::default(),
            spec_drafted: Default::default(),
            spec_accepted: Default::default(),
            ttft: Histogram::new(TTFT_BOUNDS),
            token_latency: Histogram::new(TOKEN_BOUNDS),
            prompt_latency: Histogram::new(PROMPT_BOUNDS),
        }
    }
}

impl<const N: usize> Histogram<N> {
    pub fn new(bounds: [f64; N]) -> Histogram<N> {
        Histogram {
            bounds,
            inner: Mutex::new(([0; N], 0, 0.0)),
        }
    }

    /// Record `n` observations of `v` seconds.
    pub fn observe_n(&self, v: f64, n: u64) {
        if !v.is_finite() || n == 0 {
            return;
        }
        if let Ok(mut h) = self.inner.lock() {
            if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
                h.0[i] += n;
            }
            h.1 += n;
            h.2 += v * n as f64;
        }
    }

    pub fn observe(&self, v: f64) {
        self.observe_n(v, 1);
    }

    /// `name_bucket{le=..}` (cumulative, ending with `+Inf`), `name_sum`,
    /// `name_count`.
    fn render(&self, out: &mut String, name: &str, help: &str) {
        let (buckets, count, sum) = self.inner.lock().map(|h| *h).unwrap_or(([0; N], 0, 0.0));
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut acc = 0;
        for (b, n) in self.bounds.iter().zip(buckets) {
            acc += n;
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {acc}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
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
        metric(
            "redlite_speculative_passes_total",
            "counter",
            "Speculative decoding: verify passes run.",
            g(&self.spec_passes),
        );
        metric(
            "redlite_speculative_draft_tokens_total",
            "counter",
            "Speculative decoding: draft tokens proposed.",
            g(&self.spec_drafted),
        );
        metric(
            "redlite_speculative_accepted_tokens_total",
            "counter",
            "Speculative decoding: draft tokens kept (the model's own choice).",
            g(&self.spec_accepted),
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
        self.ttft.render(
            &mut out,
            "redlite_time_to_first_token_seconds",
            "Seconds from the engine taking a request up to its first generated token (prompt processing; queue wait not included).",
        );
        self.token_latency.render(
            &mut out,
            "redlite_token_latency_seconds",
            "Seconds from one generated token of a request to the next (one observation per token after the first; the tokens of a speculative step share its time evenly).",
        );
        self.prompt_latency.render(
            &mut out,
            "redlite_prompt_processing_seconds",
            "Seconds computing a request's prompt, the part the prompt cache did not hold (requests with an all-cached prompt are not observed).",
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

    #[test]
    fn histograms_are_cumulative_prometheus_buckets() {
        let m = Metrics::default();
        m.ttft.observe(0.2);
        m.ttft.observe(0.2);
        m.ttft.observe(100.0); // above every bound: only +Inf
        m.token_latency.observe_n(0.004, 3);
        m.prompt_latency.observe(3.0);
        let t = m.render();
        assert!(t.contains("# TYPE redlite_time_to_first_token_seconds histogram\n"));
        for line in [
            "redlite_time_to_first_token_seconds_bucket{le=\"0.1\"} 0\n",
            "redlite_time_to_first_token_seconds_bucket{le=\"0.25\"} 2\n",
            "redlite_time_to_first_token_seconds_bucket{le=\"60\"} 2\n",
            "redlite_time_to_first_token_seconds_bucket{le=\"+Inf\"} 3\n",
            "redlite_time_to_first_token_seconds_sum 100.4\n",
            "redlite_time_to_first_token_seconds_count 3\n",
            "redlite_token_latency_seconds_bucket{le=\"0.0025\"} 0\n",
            "redlite_token_latency_seconds_bucket{le=\"0.005\"} 3\n",
            "redlite_token_latency_seconds_count 3\n",
            "# TYPE redlite_prompt_processing_seconds histogram\n",
            "redlite_prompt_processing_seconds_bucket{le=\"2.5\"} 0\n",
            "redlite_prompt_processing_seconds_bucket{le=\"5\"} 1\n",
            "redlite_prompt_processing_seconds_sum 3\n",
        ] {
            assert!(t.contains(line), "{line} missing in\n{t}");
        }
        // Buckets never decrease.
        let counts: Vec<u64> = t
            .lines()
            .filter(|l| l.starts_with("redlite_time_to_first_token_seconds_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "{counts:?}");
    }
}
