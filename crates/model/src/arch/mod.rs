//! One file per architecture; this enum picks one from
//! `general.architecture`. A new architecture adds a file, a
//! variant, and an arm in each match below.

pub mod common;
pub mod limits;
pub mod qwen2;
pub mod qwen3next;
pub mod qwen3next_mtp;

use crate::blocks::moe::Route;
use crate::exec::Exec;
use crate::session::LayerState;
use crate::stages::TokenStages;
use crate::trace::Trace;
use crate::weights::Weight;
use crate::ModelError;
use redlite_expertcache::ExpertLayout;
use redlite_gguf::GgufFile;

/// A loaded architecture.
#[derive(Debug)]
pub enum Arch {
    Qwen3Next(qwen3next::Qwen3Next),
    Qwen2(qwen2::Qwen2),
}

impl Arch {
    pub fn load(file: &GgufFile) -> Result<Arch, ModelError> {
        let name = file.metadata().architecture()?;
        match name {
            "qwen3next" => Ok(Arch::Qwen3Next(qwen3next::Qwen3Next::load(file)?)),
            "qwen2" => Ok(Arch::Qwen2(qwen2::Qwen2::load(file)?)),
            other => Err(ModelError::UnsupportedArch(other.to_string())),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Arch::Qwen3Next(_) => "qwen3next",
            Arch::Qwen2(_) => "qwen2",
        }
    }

    pub fn n_vocab(&self) -> usize {
        match self {
            Arch::Qwen3Next(m) => m.cfg.n_vocab,
            Arch::Qwen2(m) => m.cfg.n_vocab,
        }
    }

    pub fn n_embd(&self) -> usize {
        match self {
            Arch::Qwen3Next(m) => m.cfg.n_embd,
            Arch::Qwen2(m) => m.cfg.n_embd,
        }
    }

    pub fn context_length(&self) -> usize {
        match self {
            Arch::Qwen3Next(m) => m.cfg.context_length,
            Arch::Qwen2(m) => m.cfg.context_length,
        }
    }

    pub fn n_layer(&self) -> usize {
        match self {
            Arch::Qwen3Next(m) => m.cfg.n_layer,
            Arch::Qwen2(m) => m.cfg.n_layer,
        }
    }

    /// (KV heads, head dimension) of the attention layers: what one
    /// position of the KV cache holds per layer, for K and for V.
    pub fn kv_dims(&self) -> (usize, usize) {
        match self {
            Arch::Qwen3Next(m) => (m.cfg.n_head_kv, m.cfg.head_dim),
            Arch::Qwen2(m) => (m.cfg.n_head_kv, m.cfg.head_dim),
        }
    }

    pub fn tok_embd(&self) -> &Weight {
        match self {
            Arch::Qwen3Next(m) => &m.tok_embd,
            Arch::Qwen2(m) => &m.tok_embd,
        }
    }

    pub fn output(&self) -> &Weight {
        match self {
            Arch::Qwen3Next(m) => &m.output,
            Arch::Qwen2(m) => &m.output,
        }
    }

    /// Where the routed experts lie in the file (no layers with experts
    /// for dense architectures).
    pub fn expert_layout(&self) -> Result<ExpertLayout, ModelError> {
        match self {
            Arch::Qwen3Next(m) => m.expert_layout(),
            Arch::Qwen2(m) => Ok(ExpertLayout {
                layers: vec![None; m.cfg.n_layer],
            }),
        }
    }

    /// Experts a token uses per MoE layer (0 for dense architectures).
    pub fn n_expert_used(&self) -> usize {
        match self {
            Arch::Qwen3Next(m) => m.n_expert_used(),
            Arch::Qwen2(_) => 0,
        }
    }

    /// The DeltaNet layers' shapes (None for architectures without them).
    pub fn deltanet_params(&self) -> Option<crate::blocks::deltanet::DeltaNetParams> {
        match self {
            Arch::Qwen3Next(m) => Some(m.deltanet_params()),
            Arch::Qwen2(_) => None,
        }
    }

    pub fn new_states(&self) -> Vec<LayerState> {
        match self {
            Arch::Qwen3Next(m) => m.new_states(),
            Arch::Qwen2(m) => m.new_states(),
        }
    }

    /// One decode token as stages (see [`crate::stages`]).
    pub fn decode_stages(&self, s: &mut dyn TokenStages) -> Result<(), ModelError> {
        match self {
            Arch::Qwen3Next(m) => m.decode_stages(s),
            Arch::Qwen2(m) => m.decode_stages(s),
        }
    }

    /// The layers and the final norm over embedded tokens.
    pub fn forward_hidden(
        &self,
        ex: &Exec,
        states: &mut [LayerState],
        x: Vec<f32>,
        n: usize,
        pos0: usize,
        trace: &mut Trace,
    ) -> Result<(Vec<f32>, Vec<Vec<Route>>), ModelError> {
        match self {
            Arch::Qwen3Next(m) => m.forward_hidden(ex, states, x, n, pos0, trace),
            Arch::Qwen2(m) => m.forward_hidden(ex, states, x, n, pos0, trace),
        }
    }
}
