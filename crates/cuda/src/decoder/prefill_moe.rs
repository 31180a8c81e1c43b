//! The batched prefill's routed experts under a bounded expert cache
//! (the host rules and why: [`crate::prefill_experts`]): two staging
//! images in device memory, a copy stream that fills them from the
//! experts' pinned host copies, and the grouped GEMMs split between the
//! cache's slots and the image.
//!
//! Ordering (the copy stream runs beside the main one; event tracking is
//! off, so every dependency is an explicit event or a host wait):
//! - layer L's GEMMs wait for the event recorded on the copy stream after
//!   L's last upload;
//! - an image is written again only for MoE layer L+2, and the host issues
//!   those copies after it has waited for layer L+1's routing on the main
//!   stream, which is behind layer L's GEMMs: the image's readers are done;
//! - the image's `stage_of` table is written on the main stream itself.

use super::moe::LayerExperts;
use super::stages::Op;
use crate::device::{dptr, Gpu};
use crate::error::{ensure, Context, Result};
use crate::expert_cache::SLOT_NONE;
use crate::gemv::{GemmIn, GemmOut};
use crate::prefill_experts::{runs, split_tiles, staging_entries, PrefillUploads, StageTable};
use cudarc::driver::{CudaEvent, CudaSlice};

/// One staging image: per projection (gate, up, down) `cap` entries of
/// the widest stride of any layer, its table on the host and the device.
struct Image {
    parts: [CudaSlice<u8>; 3],
    table: StageTable,
    dev: CudaSlice<u32>,
    /// Experts of the owner uploaded before its routing was known.
    ahead: Vec<bool>,
    ready: Option<CudaEvent>,
}

/// The staging images and their copy stream, for every cached MoE layer.
pub(super) struct Staging {
    copy: Gpu,
    images: [Image; 2],
    /// Per MoE layer (`moe_index`) its cache's `slot_of`, read when a
    /// prefill starts (nothing changes it during one: no plan runs).
    resident: Vec<Vec<u32>>,
    pub(super) uploads: PrefillUploads,
    /// Device bytes of the images and tables.
    pub(super) bytes: usize,
}

/// Device bytes of the two images for `ops` (0 without a cached layer):
/// per image `n_expert - n_slots` entries of each projection's widest
/// stride, and an entry of `stage_of` per expert.
pub(super) fn staging_bytes(ops: &[Op]) -> usize {
    match shape(ops) {
        Some((e, cap, st)) => 2 * (cap * st.iter().sum::<usize>() + 4 * e),
        None => 0,
    }
}

/// (experts of the widest layer, entries, widest strides) over the cached
/// layers.
fn shape(ops: &[Op]) -> Option<(usize, usize, [usize; 3])> {
    let mut out: Option<(usize, usize, [usize; 3])> = None;
    for op in ops {
        let Op::Moe(m) = op else { continue };
        let Some(c) = &m.x.cache else { continue };
        let x = &m.x;
        let o = out.get_or_insert((0, 0, [0; 3]));
        o.0 = o.0.max(x.n_expert);
        o.1 = o.1.max(staging_entries(c.n_expert, c.n_slots));
        for (s, st) in o.2.iter_mut().zip([&x.gate, &x.up, &x.down]) {
            *s = (*s).max(st.stride);
        }
    }
    out
}

impl Staging {
    /// The images for `ops`' cached layers (None without one).
    pub(super) fn new(gpu: &Gpu, ops: &[Op]) -> Result<Option<Self>> {
        let Some((e, cap, st)) = shape(ops) else {
            return Ok(None);
        };
        let n_moe = ops.iter().filter(|op| matches!(op, Op::Moe(_))).count();
        let s = &gpu.stream;
        let image = || -> Result<Image> {
            Ok(Image {
                parts: [
                    s.alloc_zeros((cap * st[0]).max(1))?,
                    s.alloc_zeros((cap * st[1]).max(1))?,
                    s.alloc_zeros((cap * st[2]).max(1))?,
                ],
                table: StageTable::new(e, cap),
                dev: s.alloc_zeros(e.max(1))?,
                ahead: vec![false; e],
                ready: None,
            })
        };
        let images = [image()?, image()?];
        Ok(Some(Self {
            copy: gpu.side()?,
            images,
            resident: vec![Vec::new(); n_moe],
            uploads: PrefillUploads::default(),
            bytes: staging_bytes(ops),
        }))
    }

    /// At the start of a prefill: every cached layer's slot table, and
    /// the images emptied (a decode step since the last prefill may have
    /// moved experts in or out of slots).
    pub(super) fn begin(&mut self, gpu: &Gpu, ops: &[Op]) -> Result<()> {
        for op in ops {
            let Op::Moe(m) = op else { continue };
            if let Some(c) = &m.x.cache {
                let i = m.x.moe_index;
                ensure!(i < self.resident.len(), "MoE layer {i} out of range");
                self.resident[i] = c.read_slot_of(gpu)?;
            }
        }
        for im in &mut self.images {
            im.table.owner = None;
            im.ready = None;
        }
        Ok(())
    }

    /// Copy the experts of `x` in `want` that are neither in a slot nor in
    /// the image yet into `x`'s image, on the copy stream (`ahead`: before
    /// the layer's routing is known); records the image's ready event.
    pub(super) fn upload(&mut self, x: &LayerExperts, want: &[bool], ahead: bool) -> Result<()> {
        let cache = x
            .cache
            .as_ref()
            .context("staging for a layer without a cache")?;
        let li = x.moe_index;
        let resident = self
            .resident
            .get(li)
            .filter(|r| r.len() == x.n_expert)
            .context("the layer's slot table was not read")?;
        let im = &mut self.images[li % 2];
        if im.table.owner != Some(li) {
            im.table.reset(li, x.n_expert)?;
            im.ahead.iter_mut().for_each(|a| *a = false);
        }
        let list = im.table.add(want, resident)?;
        let stacks = [&x.gate, &x.up, &x.down];
        let cu = self.copy.stream.cu_stream();
        for (p, st) in stacks.iter().enumerate() {
            let host = cache.pinned(p).context("staging needs pinned experts")?;
            ensure!(host.stride == st.stride, "pinned and slot strides differ");
            let src = host.bytes()?;
            let dst = dptr(&self.copy, Some(&im.parts[p]));
            for &(e0, i0, len) in &runs(&list) {
                let (e0, i0, len) = (e0 as usize, i0 as usize, len as usize);
                let bytes = len * st.stride;
                let from = src
                    .get(e0 * st.stride..e0 * st.stride + bytes)
                    .context("expert outside its pinned copy")?;
                ensure!(
                    (i0 + len) * st.stride <= im.parts[p].len(),
                    "staging entry {} of {} bytes",
                    i0 + len,
                    im.parts[p].len()
                );
                // SAFETY: `from` is page-locked host memory owned by the
                // layer's cache, which outlives the copy (the decoder owns
                // both, and every prefill waits for its streams before it
                // returns); the destination range lies inside image part
                // `p` (checked above), which only this copy stream writes
                // and whose readers are done (the module comment's order).
                unsafe {
                    cudarc::driver::result::memcpy_htod_async(
                        dst + (i0 * st.stride) as u64,
                        from,
                        cu,
                    )
                }?;
                self.uploads.bytes += bytes as u64;
            }
        }
        self.uploads.uploaded += list.len() as u64;
        if ahead {
            self.uploads.ahead += list.len() as u64;
            for &(e, _) in &list {
                im.ahead[e as usize] = true;
            }
        }
        im.ready = Some(self.copy.stream.record_event(None)?);
        Ok(())
    }

    /// Before a chunk's routed GEMMs of layer `x`: upload what the routing
    /// (`want`) adds, make the main stream wait for the image, write the
    /// image's table and split `tiles` (the chunk's tile list) into the
    /// resident and the staged ones (`dev_tiles`, in that order).
    pub(super) fn prepare(
        &mut self,
        gpu: &Gpu,
        x: &LayerExperts,
        want: &[bool],
        tiles: &[i32],
        dev_tiles: [&mut CudaSlice<i32>; 2],
    ) -> Result<Split> {
        self.upload(x, want, false)?;
        let li = x.moe_index;
        let resident = &self.resident[li];
        let im = &mut self.images[li % 2];
        for (e, &w) in want.iter().enumerate() {
            if !w {
                continue;
            }
            if resident[e] != SLOT_NONE {
                self.uploads.resident += 1;
            } else if im.ahead[e] {
                self.uploads.ahead_used += 1;
            }
        }
        if let Some(ev) = &im.ready {
            gpu.stream.wait(ev)?;
        }
        gpu.stream.memcpy_htod(&im.table.stage_of, &mut im.dev)?;
        let s = split_tiles(tiles, resident, &im.table.stage_of)?;
        let [t_res, t_stage] = dev_tiles;
        ensure!(
            t_res.len() >= s.resident.len() && t_stage.len() >= s.staged.len(),
            "short tile buffers"
        );
        if !s.resident.is_empty() {
            gpu.stream
                .memcpy_htod(&s.resident, &mut t_res.slice_mut(0..s.resident.len()))?;
        }
        if !s.staged.is_empty() {
            gpu.stream
                .memcpy_htod(&s.staged, &mut t_stage.slice_mut(0..s.staged.len()))?;
        }
        Ok(Split {
            layer: li,
            n_resident: s.resident.len() / 3,
            n_staged: s.staged.len() / 3,
            max_slot: s.max_slot,
            max_entry: s.max_entry,
        })
    }

    /// Where projection `p` (0 gate, 1 up, 2 down) of the layer `split`
    /// was prepared for is read: (experts, tile list, tiles) for the
    /// resident tiles and for the staged ones, the empty lists left out.
    pub(super) fn sources<'a>(
        &'a self,
        x: &'a LayerExperts,
        split: &Split,
        p: usize,
        tiles: [&'a CudaSlice<i32>; 2],
    ) -> Result<Vec<(ExpertsAt<'a>, &'a CudaSlice<i32>, usize)>> {
        ensure!(
            split.layer == x.moe_index && p < 3,
            "staging: another layer"
        );
        let cache = x
            .cache
            .as_ref()
            .context("staging for a layer without a cache")?;
        let st = [&x.gate, &x.up, &x.down][p];
        let im = &self.images[x.moe_index % 2];
        let mut out = Vec::with_capacity(2);
        if split.n_resident > 0 {
            let at = ExpertsAt {
                buf: &st.buf,
                table: cache.slot_table(),
                max_entry: split.max_slot,
            };
            out.push((at, tiles[0], split.n_resident));
        }
        if split.n_staged > 0 {
            let at = ExpertsAt {
                buf: &im.parts[p],
                table: &im.dev,
                max_entry: split.max_entry,
            };
            out.push((at, tiles[1], split.n_staged));
        }
        Ok(out)
    }

    /// Wait for the copy stream (the end of a prefill).
    pub(super) fn sync(&self) -> Result<()> {
        self.copy.sync()
    }
}

/// A layer's routed tiles as [`Staging::prepare`] split them.
pub(super) struct Split {
    layer: usize,
    n_resident: usize,
    n_staged: usize,
    max_slot: usize,
    max_entry: usize,
}

/// Where one projection's experts are read: entry `table[e]` of `buf`.
pub(super) struct ExpertsAt<'a> {
    pub(super) buf: &'a CudaSlice<u8>,
    pub(super) table: &'a CudaSlice<u32>,
    pub(super) max_entry: usize,
}

impl ExpertsAt<'_> {
    /// One grouped GEMM of stack `st` over `n_tiles` tiles of `tiles`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn gemm(
        &self,
        gpu: &Gpu,
        st: &crate::gemv::ExpertStack,
        tiles: &CudaSlice<i32>,
        n_tiles: usize,
        n_pairs: usize,
        input: GemmIn,
        out: GemmOut,
    ) -> Result<()> {
        st.gemm_grouped_via(
            gpu,
            self.buf,
            self.table,
            self.max_entry,
            tiles,
            n_tiles,
            n_pairs,
            input,
            out,
        )
    }
}
