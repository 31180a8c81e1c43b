//! Named intermediates, recorded by (layer, stage) when tracing is on.
//!
//! Stage names follow llama.cpp's graph callback names where one exists
//! (`attn_norm`, `attn_residual`, `attn_post_norm`, `ffn_out`, `l_out`,
//! `result_norm`, `result_output`, ...), so a run here can be diffed layer
//! by layer against `llama-eval-callback` or transformers hidden states.

/// One recorded tensor: `n_tokens` rows of `data.len() / n_tokens` values.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceRecord {
    /// `None` for stages outside the layers (embeddings, final norm, logits).
    pub layer: Option<usize>,
    pub name: String,
    pub n_tokens: usize,
    pub data: Vec<f32>,
}

/// The recorder. Off by default: `record` then costs one branch.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    enabled: bool,
    records: Vec<TraceRecord>,
}

impl Trace {
    pub fn enabled() -> Trace {
        Trace {
            enabled: true,
            records: Vec::new(),
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Record a copy of `data` when tracing is on.
    pub fn record(&mut self, layer: Option<usize>, name: &str, n_tokens: usize, data: &[f32]) {
        if self.enabled {
            self.records.push(TraceRecord {
                layer,
                name: name.to_string(),
                n_tokens,
                data: data.to_vec(),
            });
        }
    }

    pub fn records(&self) -> &[TraceRecord] {
        &self.records
    }

    /// The last record of (layer, name).
    pub fn get(&self, layer: Option<usize>, name: &str) -> Option<&TraceRecord> {
        self.records
            .iter()
            .rev()
            .find(|r| r.layer == layer && r.name == name)
    }

    /// Take the records, leaving the recorder on and empty.
    pub fn take(&mut self) -> Vec<TraceRecord> {
        std::mem::take(&mut self.records)
    }
}
