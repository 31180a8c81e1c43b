//! `generate --save-state` / `--load-state`: a sequence's state to and
//! from a state file, through the backend-neutral sequence API.

use anyhow::{bail, Context, Result};
use redlite_engine::Sequence;
use redlite_model::Model;
use redlite_statefile::{Expect, ModelId, StateFile};
use std::path::Path;
use std::time::Instant;

/// The identity state files record for `model`.
pub fn model_id(model: &Model) -> ModelId {
    ModelId::of(model.file(), model.arch().name(), model.n_vocab())
}

/// What a state file read into `seq` must match.
pub fn expect(model: &Model, seq: &dyn Sequence) -> Expect {
    Expect {
        model: model_id(model),
        layout: redlite_model::StateLayout::of(model, seq.kv_elem()),
        ctx_len: seq.ctx_len(),
    }
}

/// What a loaded state gives the front end to continue with.
pub struct Loaded {
    pub tokens: Vec<u32>,
    pub rng: Option<u64>,
    pub logits: Vec<f32>,
}

/// Read `path`, check it against the model and `seq`, and restore it into
/// `seq`.
pub fn load(path: &Path, model: &Model, seq: &mut dyn Sequence) -> Result<Loaded> {
    let t0 = Instant::now();
    let sf = redlite_statefile::read(path, &expect(model, seq)).context("--load-state")?;
    let read_secs = t0.elapsed().as_secs_f64();
    let pos = sf.image.pos;
    let cp = seq
        .import_checkpoint(sf.image)
        .with_context(|| format!("--load-state {}", path.display()))?;
    let import_secs = t0.elapsed().as_secs_f64() - read_secs;
    seq.restore(&cp)
        .with_context(|| format!("--load-state {}", path.display()))?;
    let bytes = std::fs::metadata(path).map_or(0, |m| m.len());
    let restore_secs = t0.elapsed().as_secs_f64() - read_secs;
    eprintln!(
        "redlite: state loaded from {}: {pos} positions, {bytes} bytes, read in {read_secs:.3} s, restored in {restore_secs:.3} s (import into the {} backend {import_secs:.3} s)",
        path.display(),
        seq.backend()
    );
    Ok(Loaded {
        tokens: sf.tokens,
        rng: sf.rng,
        logits: sf.logits,
    })
}

/// Save `seq`'s state (covering `tokens`, with the last position's
/// `logits` and the sampler's `rng`) to `path`, atomically.
pub fn save(
    path: &Path,
    inputs: &[&Path],
    model: &Model,
    seq: &mut dyn Sequence,
    tokens: &[u32],
    rng: Option<u64>,
    logits: &[f32],
) -> Result<()> {
    if tokens.len() != seq.pos() {
        bail!(
            "--save-state {}: {} tokens for a sequence at position {}",
            path.display(),
            tokens.len(),
            seq.pos()
        );
    }
    let t0 = Instant::now();
    let cp = seq.checkpoint()?;
    let image = seq
        .export_checkpoint(&cp)
        .with_context(|| format!("--save-state {}", path.display()))?;
    let export_secs = t0.elapsed().as_secs_f64();
    let sf = StateFile {
        model: model_id(model),
        ctx_len: seq.ctx_len() as u64,
        tokens: tokens.to_vec(),
        rng,
        logits: if tokens.is_empty() {
            Vec::new()
        } else {
            logits.to_vec()
        },
        kv_elem: seq.kv_elem(),
        image,
    };
    let stats = redlite_statefile::write(path, inputs, &sf).context("--save-state")?;
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "redlite: state saved to {}: {} positions, {} bytes in {secs:.3} s (checkpoint and export {export_secs:.3} s, write {:.3} s)",
        path.display(),
        tokens.len(),
        stats.bytes,
        secs - export_secs
    );
    Ok(())
}
