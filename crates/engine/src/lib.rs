//! The engine: the one API the front ends (CLI, server) run a model
//! through, whichever backend computes it.
//!
//! ```text
//! Engine::open(model, &BackendOptions { device, .. }, &MemoryRequest)
//!     ── plans memory for the device (or refuses, with the numbers)
//! engine.open_sequence(ctx) -> Box<dyn Sequence>
//!     ── prefill / decode / checkpoint / restore, the same on every backend
//! ```
//!
//! The backend is chosen once, here, from a [`Device`]; nothing above this
//! crate names a device or branches on one.

pub mod args;
mod backend;
pub mod context;
#[cfg(feature = "cuda")]
mod cuda;
pub mod parity;

pub use args::DeviceArgs;
pub use backend::{Activations, BackendOptions, Device, ExpertSource, KvType};
pub use context::{default_context, ContextChoice};
pub use redlite_model::sequence::{CacheCounters, Checkpoint, CpuSequence, Sequence};
pub use redlite_model::{Logits, MemoryRequest, Model, ModelError};

use std::sync::Arc;

/// Warn when a context is larger than the one the model was trained for
/// (`trained` 0: unknown): it is allowed, as llama.cpp allows it, but
/// output past the trained positions may degrade. Every front end calls it.
pub fn warn_context(ctx: usize, trained: usize) {
    if trained > 0 && ctx > trained {
        tracing::warn!(
            "--ctx-size {ctx} is above the model's trained context of {trained} tokens: output past {trained} positions may degrade"
        );
    }
}

/// Errors of opening an engine or a sequence.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The device was asked for but this build has no backend for it.
    #[error("--device {0}: this redlite was built without it (rebuild with `--features {0}`)")]
    NotBuilt(&'static str),
    /// A backend error while opening (device, memory plan, upload).
    #[error("{backend}: {what}")]
    Backend { backend: &'static str, what: String },
    /// An option that does not apply to the chosen device.
    #[error("{0}")]
    Options(String),
}

/// What the backend keeps between sequences.
enum Backend {
    Cpu,
    #[cfg(feature = "cuda")]
    Cuda(Box<cuda::CudaBackend>),
}

/// A model opened on a device, with its memory plan made.
pub struct Engine {
    model: Arc<Model>,
    backend: Backend,
    device: Device,
    plan: String,
    ctx: usize,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.device)
            .field("plan", &self.plan)
            .field("ctx", &self.ctx)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Plan memory for `mem` (its `ctx` positions and `sessions` states:
    /// the live sequence plus the checkpoints a prompt cache may hold) on
    /// `opts.device`, and get ready to open sequences. Refuses before any
    /// weight is read when the plan cannot fit.
    pub fn open(
        mut model: Model,
        opts: &BackendOptions,
        mem: &MemoryRequest,
    ) -> Result<Engine, EngineError> {
        opts.check()?;
        let (backend, plan) = match opts.device {
            Device::Cpu => {
                let plan = model.plan_memory(mem)?;
                let mut line = plan.to_string();
                if let Some(c) = model.expert_cache() {
                    line.push_str(&format!(
                        "; expert cache {} policy, {} I/O threads, pre-gating {}",
                        c.policy().name(),
                        c.io_threads(),
                        model.pregate()
                    ));
                }
                (Backend::Cpu, line)
            }
            Device::Cuda => {
                #[cfg(feature = "cuda")]
                {
                    let (b, line) = cuda::CudaBackend::open(&model, opts, mem)?;
                    (Backend::Cuda(Box::new(b)), line)
                }
                #[cfg(not(feature = "cuda"))]
                return Err(EngineError::NotBuilt("cuda"));
            }
        };
        Ok(Engine {
            model: Arc::new(model),
            backend,
            device: opts.device,
            plan,
            ctx: mem.ctx,
        })
    }

    /// The memory plan, in one line (print it at start-up).
    pub fn plan_line(&self) -> &str {
        &self.plan
    }

    /// The model (config, tokenizer metadata, file).
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    /// The device sequences run on.
    pub fn device(&self) -> Device {
        self.device
    }

    /// Positions the plan made room for.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Whether the weights are read from host memory while running (the
    /// CPU): then touching their pages before the first token pays.
    pub fn reads_host_weights(&self) -> bool {
        matches!(self.backend, Backend::Cpu)
    }

    /// A new sequence of `ctx` positions (at most what the plan made room
    /// for; 0: all of it). On a GPU this uploads the weights and captures
    /// the token graph (seconds), so open one and reuse it.
    pub fn open_sequence(&mut self, ctx: usize) -> Result<Box<dyn Sequence>, EngineError> {
        let ctx = if ctx == 0 { self.ctx } else { ctx };
        if ctx > self.ctx {
            return Err(EngineError::Options(format!(
                "a sequence of {ctx} positions, but the memory plan was made for {}",
                self.ctx
            )));
        }
        match &mut self.backend {
            Backend::Cpu => Ok(Box::new(CpuSequence::new(self.model.clone(), ctx))),
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.open_sequence(&self.model, ctx),
        }
    }

    /// One line on where sequences run (after [`Engine::open_sequence`] on
    /// a GPU: its name and the bytes uploaded).
    pub fn describe(&self) -> String {
        match &self.backend {
            Backend::Cpu => format!(
                "cpu: {} threads, {} path",
                self.model.threads(),
                if self.model.is_reference() {
                    "reference"
                } else {
                    "fast"
                }
            ),
            #[cfg(feature = "cuda")]
            Backend::Cuda(b) => b.describe(),
        }
    }
}
