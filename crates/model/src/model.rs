//! The loaded model: the file, the architecture, the thread pool and the
//! path switch.

use crate::arch::Arch;
use crate::exec::Exec;
use crate::session::Session;
use crate::ModelError;
use redlite_cpu::Pool;
use redlite_gguf::GgufFile;
use std::sync::Arc;

/// How to load and run.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Worker threads (0: one per CPU).
    pub threads: usize,
    /// Force the reference path (also forced by `REDLITE_REFERENCE=1`; `=f32`
    /// keeps f32 activations in its matmuls, see `exec`).
    pub reference: bool,
    /// Tokens per forward batch when a prompt is longer.
    pub ubatch: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            threads: 0,
            reference: false,
            ubatch: 512,
        }
    }
}

/// Whether `REDLITE_REFERENCE` asks for the reference path.
pub fn reference_from_env() -> bool {
    std::env::var_os("REDLITE_REFERENCE").is_some_and(|v| v != "0" && !v.is_empty())
}

/// A model ready to run.
#[derive(Debug)]
pub struct Model {
    file: Arc<GgufFile>,
    arch: Arch,
    pool: Pool,
    reference: bool,
    ubatch: usize,
}

impl Model {
    /// Read the config from metadata, check every tensor against its spec.
    pub fn load(file: Arc<GgufFile>, opts: LoadOptions) -> Result<Model, ModelError> {
        let arch = Arch::load(&file)?;
        Ok(Model {
            arch,
            pool: Pool::new(opts.threads),
            reference: opts.reference || reference_from_env(),
            ubatch: opts.ubatch.max(1),
            file,
        })
    }

    pub fn arch(&self) -> &Arch {
        &self.arch
    }

    /// Bytes one session holds: (f32 K and V per position over all
    /// attention layers, fixed recurrent state over all DeltaNet layers).
    /// Callers multiply the first by the context length to size a session.
    pub fn state_bytes(&self) -> (u64, u64) {
        let meta = self.file.metadata();
        let arch = self.arch.name();
        let key = |k: &str| format!("{arch}.{k}");
        let n_embd = meta.get_u64(&key("embedding_length")).unwrap_or(0);
        let n_head = meta
            .get_u64(&key("attention.head_count"))
            .unwrap_or(1)
            .max(1);
        let n_kv = meta
            .get_u64(&key("attention.head_count_kv"))
            .unwrap_or(n_head);
        let k_len = meta
            .get_u64(&key("attention.key_length"))
            .unwrap_or(n_embd / n_head);
        let v_len = meta
            .get_u64(&key("attention.value_length"))
            .unwrap_or(n_embd / n_head);
        let (mut per_position, mut fixed) = (0u64, 0u64);
        for state in self.arch.new_states() {
            match state {
                crate::LayerState::Kv(_) => per_position += n_kv * (k_len + v_len) * 4,
                crate::LayerState::Recurrent(r) => fixed += (r.conv.len() + r.ssm.len()) as u64 * 4,
            }
        }
        (per_position, fixed)
    }

    /// Touch every page of the mapped weights so the first token is not
    /// timed on page faults. `progress` gets the bytes covered so far and
    /// the total, about once per MiB.
    pub fn touch_weights(&self, mut progress: impl FnMut(u64, u64)) {
        let total: u64 = self.file.tensors().iter().map(|t| t.n_bytes).sum();
        let (mut done, mut sink) = (0u64, 0u8);
        for t in self.file.tensors() {
            if let Ok(v) = self.file.tensor(&t.name) {
                for chunk in v.data.chunks(1 << 20) {
                    for page in chunk.iter().step_by(4096) {
                        sink = sink.wrapping_add(*page);
                    }
                    done += chunk.len() as u64;
                    progress(done, total);
                }
            }
        }
        std::hint::black_box(sink);
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    pub fn n_vocab(&self) -> usize {
        self.arch.n_vocab()
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Whether this model runs the float reference path.
    pub fn is_reference(&self) -> bool {
        self.reference
    }

    /// Switch between the reference and the fast path.
    pub fn set_reference(&mut self, on: bool) {
        self.reference = on;
    }

    pub fn ubatch(&self) -> usize {
        self.ubatch
    }

    pub fn set_ubatch(&mut self, n: usize) {
        self.ubatch = n.max(1);
    }

    /// A session with room for `ctx_len` positions (0: the model's trained context).
    pub fn new_session(&self, ctx_len: usize) -> Session {
        let ctx = if ctx_len == 0 {
            self.arch.context_length()
        } else {
            ctx_len
        };
        Session::new(self.arch.new_states(), ctx)
    }

    /// The worker pool the kernels run on.
    pub(crate) fn pool(&self) -> &redlite_cpu::Pool {
        &self.pool
    }

    pub(crate) fn exec(&self) -> Exec<'_> {
        Exec {
            file: &self.file,
            pool: &self.pool,
            reference: self.reference,
        }
    }
}
