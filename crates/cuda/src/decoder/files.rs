//! Expert-cache misses served from the model file by the host: where a
//! layer's experts lie in the file, and the host step between the token's
//! graphs that repacks each miss into pinned staging.

use super::stages::Op;
use super::CudaDecoder;
use crate::error::{bail, Context, Result};
use crate::gemv::expert_image;
use rayon::prelude::*;
use redlite_model::weights::Weight;
use redlite_model::Model;
use std::sync::Arc;

/// One projection of a layer's experts in the model file.
pub(super) struct FilePart {
    pub(super) w: Weight,
    pub(super) rows_total: usize,
    pub(super) row0: usize,
    pub(super) rows: usize,
    pub(super) n: usize,
    pub(super) stride: usize,
}

/// A layer's experts in the file, and the staging buffers its misses go
/// through (an index into the decoder's staging sets).
pub(super) struct FileExperts {
    pub(super) parts: [FilePart; 3],
    pub(super) staging: usize,
}

impl CudaDecoder {
    /// Serve the misses of op `i`'s routed plan from the file: each missed
    /// expert's images into the staging entries, the miss list pointed at
    /// them (the stream is idle: the graph before this ended with the plan).
    pub(super) fn serve_misses(&mut self, i: usize, model: &Model) -> Result<()> {
        let Self {
            ops, staging, gpu, ..
        } = self;
        let Some(Op::Moe(m)) = ops.get_mut(i) else {
            bail!("host point {i} is not a MoE op");
        };
        let fx = m.file.as_ref().context("no file experts")?;
        let set = staging.get_mut(fx.staging).context("staging set")?;
        let x = Arc::get_mut(&mut m.x).context("experts shared while serving misses")?;
        let cache = x.cache.as_mut().context("no cache")?;
        let misses = cache.misses(gpu, false)?;
        if misses.is_empty() {
            return Ok(());
        }
        // One task per (miss, projection), spread over threads: the reads
        // (page cache or disk) and the repacking are the host's whole cost.
        let file = model.file();
        let mut tasks = Vec::new();
        for (p, (part, st)) in fx.parts.iter().zip(set.iter_mut()).enumerate() {
            for (i, dst) in st
                .entries_mut(misses.len(), part.stride)?
                .into_iter()
                .enumerate()
            {
                tasks.push((p, misses[i].0, dst));
            }
        }
        let parts = &fx.parts;
        tasks.par_iter_mut().try_for_each(|(p, e, dst)| {
            let part = &parts[*p];
            expert_image(
                part.w.ty,
                part.rows_total,
                part.row0,
                part.rows,
                part.w.cols(),
                part.n,
                part.w.bytes(file),
                *e as usize,
                dst,
            )
            .with_context(|| format!("reading expert {e} of {}", part.w.name))
        })?;
        cache.point_misses_at_staging(gpu, &misses)
    }
}
