//! One decode token as a sequence of stages, for backends that run a whole
//! token below the model (a device that records the stages once into a
//! command graph and replays it per token).
//!
//! The architecture walks its layers and calls the stages in order
//! ([`crate::arch::Arch::decode_stages`]); it never learns which backend
//! listens. A backend keeps its own activations: the residual stream `x`,
//! the normed input `h` of the next block, the mixer output `mix`, and the
//! logits. State (KV caches, DeltaNet states) belongs to the backend too,
//! one per layer index.
//!
//! The token itself and its position arrive when the backend runs the
//! recorded stages, not here.

use crate::blocks::attention::{AttnParams, AttnWeights};
use crate::blocks::deltanet::{DeltaNetParams, DeltaNetWeights};
use crate::blocks::moe::{DenseFfn, MoeWeights};
use crate::weights::Weight;
use crate::ModelError;

/// The stages of one decode token, called in order once per layer.
pub trait TokenStages {
    /// `x ← token_embd[token]` (the token is supplied at run time).
    fn embed(&mut self, w: &Weight) -> Result<(), ModelError>;
    /// `h ← RMSNorm(x)·w`; with `add_mix`, first `x += mix`.
    fn norm(&mut self, w: &[f32], eps: f32, add_mix: bool) -> Result<(), ModelError>;
    /// `mix ← attention(h)` of layer `layer` (appends to its KV cache).
    fn attention(
        &mut self,
        layer: usize,
        w: &AttnWeights,
        p: &AttnParams,
    ) -> Result<(), ModelError>;
    /// `mix ← deltanet(h)` of layer `layer` (updates its recurrent state).
    fn deltanet(
        &mut self,
        layer: usize,
        w: &DeltaNetWeights,
        p: &DeltaNetParams,
    ) -> Result<(), ModelError>;
    /// `x += moe(h)`.
    fn moe(&mut self, layer: usize, w: &MoeWeights) -> Result<(), ModelError>;
    /// `x += ffn(h)`.
    fn dense_ffn(&mut self, layer: usize, w: &DenseFfn) -> Result<(), ModelError>;
    /// `logits ← w · (RMSNorm(x)·norm)`.
    fn head(&mut self, norm: &[f32], eps: f32, w: &Weight) -> Result<(), ModelError>;
}
