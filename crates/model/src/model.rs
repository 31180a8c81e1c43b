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

    pub(crate) fn exec(&self) -> Exec<'_> {
        Exec {
            file: &self.file,
            pool: &self.pool,
            reference: self.reference,
        }
    }
}
