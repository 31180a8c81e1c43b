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

#[cfg(test)]
mod tests {
    //! The stage walk on the CPU against the model's own forward: a backend
    //! that runs each stage with the CPU blocks must give the logits of
    //! `Session::forward`, token by token. This checks the stage order of
    //! `decode_stages` (what the CUDA decoder records) without a GPU.
    use super::*;
    use crate::arch::common::embed;
    use crate::exec::Exec;
    use crate::session::LayerState;
    use crate::trace::Trace;
    use crate::{LoadOptions, Logits, Model};
    use redlite_cpu::ops::{add_inplace, rms_norm};
    use std::sync::Arc;

    struct CpuStages<'a> {
        ex: Exec<'a>,
        states: Vec<LayerState>,
        token: u32,
        pos: usize,
        x: Vec<f32>,
        h: Vec<f32>,
        mix: Vec<f32>,
        logits: Vec<f32>,
        trace: Trace,
    }

    impl TokenStages for CpuStages<'_> {
        fn embed(&mut self, w: &Weight) -> Result<(), ModelError> {
            self.x = embed(self.ex.file, w, &[self.token])?;
            Ok(())
        }
        fn norm(&mut self, w: &[f32], eps: f32, add_mix: bool) -> Result<(), ModelError> {
            if add_mix {
                add_inplace(&mut self.x, &self.mix);
            }
            self.h = self.x.clone();
            rms_norm(&mut self.h, w, eps);
            Ok(())
        }
        fn attention(
            &mut self,
            layer: usize,
            w: &AttnWeights,
            p: &AttnParams,
        ) -> Result<(), ModelError> {
            let LayerState::Kv(kv) = &mut self.states[layer] else {
                panic!("layer {layer} is not attention");
            };
            let (h, pos) = (&self.h, self.pos);
            self.mix = crate::blocks::attention::forward(
                &self.ex,
                w,
                p,
                h,
                1,
                pos,
                kv,
                &mut self.trace,
                layer,
            )?;
            Ok(())
        }
        fn deltanet(
            &mut self,
            layer: usize,
            w: &DeltaNetWeights,
            p: &DeltaNetParams,
        ) -> Result<(), ModelError> {
            let LayerState::Recurrent(rs) = &mut self.states[layer] else {
                panic!("layer {layer} is not DeltaNet");
            };
            self.mix = crate::blocks::deltanet::forward(
                &self.ex,
                w,
                p,
                &self.h,
                1,
                rs,
                &mut self.trace,
                layer,
            )?;
            Ok(())
        }
        fn moe(&mut self, layer: usize, w: &MoeWeights) -> Result<(), ModelError> {
            let (y, _) = w.forward(&self.ex, &self.h, 1, &mut self.trace, layer)?;
            add_inplace(&mut self.x, &y);
            Ok(())
        }
        fn dense_ffn(&mut self, _layer: usize, w: &DenseFfn) -> Result<(), ModelError> {
            let y = w.forward(&self.ex, &self.h, 1)?;
            add_inplace(&mut self.x, &y);
            Ok(())
        }
        fn head(&mut self, norm: &[f32], eps: f32, w: &Weight) -> Result<(), ModelError> {
            let mut h = self.x.clone();
            rms_norm(&mut h, norm, eps);
            self.logits = self.ex.linear(w, &h, 1)?;
            Ok(())
        }
    }

    /// The stage walk on the CPU against the model's own forward, token by
    /// token: bit-identical logits, so the walk a GPU records and the CPU
    /// forward cannot drift apart in layer order or wiring.
    fn check_walk(path: &std::path::Path, tokens: &[u32]) {
        let file = Arc::new(redlite_gguf::GgufFile::open(path).unwrap());
        let model = Model::load(file, LoadOptions::default()).unwrap();
        let mut session = model.new_session(64);
        let mut st = CpuStages {
            ex: model.exec(),
            states: model.arch().new_states(),
            token: 0,
            pos: 0,
            x: Vec::new(),
            h: Vec::new(),
            mix: Vec::new(),
            logits: Vec::new(),
            trace: Trace::default(),
        };
        for (pos, &token) in tokens.iter().enumerate() {
            let want = session.forward(&model, &[token], Logits::Last).unwrap();
            st.token = token;
            st.pos = pos;
            model.arch().decode_stages(&mut st).unwrap();
            assert_eq!(st.logits, want, "{}: position {pos}", path.display());
        }
    }

    #[test]
    fn the_stage_walk_gives_the_forward_logits() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../tests/fixtures/qwen3next/tiny-qwen3next-q8_0.gguf"
        );
        check_walk(path.as_ref(), &[5, 77, 300, 12, 511, 9, 64, 64]);
    }

    /// qwen2 (the demo model: biases, a dense FFN, a tied head).
    #[test]
    fn the_qwen2_stage_walk_gives_the_forward_logits() {
        let p = match std::env::var_os("REDLITE_DEMO_MODEL") {
            Some(p) => std::path::PathBuf::from(p),
            None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/redlite/demo-model.gguf"),
        };
        if !p.is_file() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI is set but the demo model is missing at {}",
                p.display()
            );
            eprintln!(
                "SKIPPED: the qwen2 stage walk needs the demo model at {}",
                p.display()
            );
            return;
        }
        check_walk(&p, &[151644, 872, 198, 9707, 0, 11, 1879]);
    }
}
