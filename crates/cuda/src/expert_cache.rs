//! The bounded device expert cache (issue 8): per MoE layer a pool of
//! expert slots in device memory, every expert in pinned host memory (or,
//! when RAM is short, staging entries the host fills from the model file:
//! [`HostSet::Staged`]), and two kernels (`kernels/expert_cache.cu`) that
//! decide hits and evictions and copy the misses on the device, inside the
//! token's CUDA graph.
//!
//! Why on the device: the routing is known only on the device, mid-token.
//! Asking the host would cut the graph at every MoE layer (a launch, a
//! synchronisation and a small copy back, 48 times a token); instead
//! `expert_plan` (one warp) maps the chosen experts to slots, evicting the
//! least recently used, and `expert_fetch` reads the missing experts from
//! their pinned host copies over PCIe into the slots. The GEMV kernels see
//! slot indices as at full residency: no kernel change.
//!
//! Why per layer: each MoE layer is visited exactly once per token with
//! the same number of experts, so one LRU over all layers would give each
//! layer about the same share anyway; separate pools keep the plan to a
//! scan of one layer's slots and let a prefetch for layer L+1 run beside
//! layer L's compute without touching the slots layer L reads.
//!
//! Prefetch (pre-gating): layer L's router matrix is stacked with layer
//! L+1's, so one GEMV yields L+1's router logits on L's hidden state; a
//! side branch of the graph (its own stream, joined before L+1's plan)
//! runs top-k on them and plans and fetches those experts while L's
//! experts and L+1's mixer compute.
//!
//! `crate::selftest::expert_cache::PlanModel` is the host statement of the
//! plan kernel's rules: unit tests check it against eviction orders worked
//! out by hand, and `redlite selftest` checks the kernel against it.

use crate::device::dptr;
use crate::device::Gpu;
use crate::error::{ensure, Result};
use crate::gemv::ExpertStack;
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig, PinnedHostSlice};
use rayon::prelude::*;

/// `slot_of` / `expert_in` value of an empty entry.
pub const SLOT_NONE: u32 = u32::MAX;

/// The argument struct of `expert_plan` (`ExpertPlanArgs` in
/// `kernels/expert_cache.cu`: same field order and types, device addresses
/// as u64; the `.cu` asserts the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertPlanArgs {
    pub experts: u64,
    pub clock: u64,
    pub slot_of: u64,
    pub expert_in: u64,
    pub stamp: u64,
    pub used: u64,
    pub pref: u64,
    pub slots_out: u64,
    pub miss: u64,
    pub counters: u64,
    pub k: i32,
    pub n_slots: i32,
    pub prefetch: i32,
    pub pad: i32,
}

/// One projection of an `expert_fetch` (`FetchProj` in the `.cu`): the
/// host copy (expert e at `src + e * stride`), the slot stack (slot s at
/// `dst + s * stride`), the stride in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FetchProj {
    pub src: u64,
    pub dst: u64,
    pub stride: u64,
}

/// The argument struct of `expert_fetch` (`ExpertFetchArgs` in the `.cu`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ExpertFetchArgs {
    pub miss: u64,
    pub proj: [FetchProj; 3],
}

// SAFETY: plain `#[repr(C)]` structs of integers, passed to the kernels by
// value as the structs they mirror (offsets checked in the tests, sizes by
// static_asserts in the `.cu`).
unsafe impl DeviceRepr for ExpertPlanArgs {}
unsafe impl DeviceRepr for ExpertFetchArgs {}

/// Counters of one layer (or summed): routed hits and misses, prefetches
/// issued and prefetched experts a routed plan then used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheCounters {
    pub hits: u64,
    pub misses: u64,
    pub prefetched: u64,
    pub prefetch_used: u64,
}

impl CacheCounters {
    pub fn add(&mut self, o: &CacheCounters) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.prefetched += o.prefetched;
        self.prefetch_used += o.prefetch_used;
    }

    pub fn hit_rate(&self) -> f64 {
        self.hits as f64 / (self.hits + self.misses).max(1) as f64
    }

    /// Experts copied over PCIe (routed misses and prefetches).
    pub fn fetched(&self) -> u64 {
        self.misses + self.prefetched
    }
}

/// Every expert of one projection of one layer in the device layout,
/// page-locked and mapped into the device's address space.
pub struct HostExperts {
    buf: PinnedHostSlice<u8>,
    dev_ptr: u64,
    pub stride: usize,
    pub n: usize,
}

impl HostExperts {
    /// `n` experts of `stride` bytes each, filled by `fill(expert, bytes)`
    /// on rayon's workers.
    pub fn new(
        gpu: &Gpu,
        stride: usize,
        n: usize,
        fill: impl Fn(usize, &mut [u8]) -> Result<()> + Sync,
    ) -> Result<Self> {
        ensure!(
            stride.is_multiple_of(16) && n >= 1,
            "host experts: stride {stride}"
        );
        let flags = cudarc::driver::sys::CU_MEMHOSTALLOC_DEVICEMAP
            | cudarc::driver::sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: the memory is uninitialised after the call; every byte is
        // written by `fill` below before anything reads it (each expert's
        // `stride` bytes are handed to `fill` whole).
        let mut buf = unsafe { gpu.ctx.alloc_pinned_with_flags::<u8>(stride * n, flags) }?;
        buf.as_mut_slice()?
            .par_chunks_mut(stride)
            .enumerate()
            .try_for_each(|(e, dst)| fill(e, dst))?;
        let host = buf.as_ptr()? as *mut std::ffi::c_void;
        let mut dev: cudarc::driver::sys::CUdeviceptr = 0;
        // SAFETY: `host` was returned by cuMemHostAlloc with DEVICEMAP in
        // this context; the call writes the device address of the same
        // bytes into `dev`.
        unsafe { cudarc::driver::sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }.result()?;
        Ok(Self {
            buf,
            dev_ptr: dev,
            stride,
            n,
        })
    }

    /// The device address of the first entry.
    pub fn dev_ptr(&self) -> u64 {
        self.dev_ptr
    }

    /// The first `n` entries at a stride of `stride` (at most the
    /// allocation's): the host writes file reads there for the device to
    /// fetch.
    pub fn entries_mut(&mut self, n: usize, stride: usize) -> Result<Vec<&mut [u8]>> {
        ensure!(
            stride <= self.stride && n <= self.n,
            "{n} staging entries of {}",
            self.n
        );
        Ok(self.buf.as_mut_slice()?[..n * stride]
            .chunks_mut(stride)
            .collect())
    }

    /// Every expert's bytes (expert e at `e * stride`): what the batched
    /// prefill copies into its staging image.
    pub fn bytes(&self) -> Result<&[u8]> {
        Ok(self.buf.as_slice()?)
    }

    /// The first `n` experts' bytes (to preload slots 0..n).
    pub fn prefix(&self, n: usize) -> Result<&[u8]> {
        ensure!(n <= self.n, "prefix of {n} experts");
        Ok(&self.buf.as_slice()?[..n * self.stride])
    }
}

/// One MoE layer's slot pool state on the device.
pub struct LayerCache {
    pub n_slots: usize,
    pub n_expert: usize,
    slot_of: CudaSlice<u32>,
    expert_in: CudaSlice<u32>,
    stamp: CudaSlice<u32>,
    used: CudaSlice<u32>,
    pref: CudaSlice<u32>,
    /// Routed plan's miss list, and the prefetch plan's.
    miss: CudaSlice<u32>,
    miss_pre: CudaSlice<u32>,
    /// Where gate, up and down are fetched from: (device address, stride,
    /// entries).
    src: [(u64, usize, usize); 3],
    /// Every expert in pinned host memory ([`HostSet::Pinned`]).
    pinned: Option<[HostExperts; 3]>,
}

/// Where a layer's misses are copied from.
pub enum HostSet {
    /// Every expert of gate, up, down, page-locked (the fetch kernel reads
    /// expert e at e * stride).
    Pinned([HostExperts; 3]),
    /// Staging entries the host fills with the misses it reads from the
    /// model file (device address and entries per projection); the host
    /// rewrites each miss's expert id to its staging entry before the
    /// fetch ([`LayerCache::point_misses_at_staging`]).
    Staged([(u64, usize); 3]),
}

impl LayerCache {
    /// `n_slots` slots holding experts `0..n_slots` (the stacks must have
    /// been loaded with them, e.g. from [`HostExperts::prefix`]).
    pub fn new(
        gpu: &Gpu,
        n_expert: usize,
        n_slots: usize,
        k: usize,
        strides: [usize; 3],
        host: HostSet,
    ) -> Result<Self> {
        ensure!(
            n_slots >= k && n_slots <= n_expert && k <= 32,
            "expert cache: {n_slots} slots for {k} of {n_expert} experts"
        );
        let slot_of: Vec<u32> = (0..n_expert)
            .map(|e| if e < n_slots { e as u32 } else { SLOT_NONE })
            .collect();
        let expert_in: Vec<u32> = (0..n_slots as u32).collect();
        let (src, pinned) = match host {
            HostSet::Pinned(h) => {
                for (x, &st) in h.iter().zip(&strides) {
                    ensure!(
                        x.stride == st && x.n == n_expert,
                        "pinned experts: stride or count"
                    );
                }
                (
                    [
                        (h[0].dev_ptr, strides[0], n_expert),
                        (h[1].dev_ptr, strides[1], n_expert),
                        (h[2].dev_ptr, strides[2], n_expert),
                    ],
                    Some(h),
                )
            }
            HostSet::Staged(p) => {
                ensure!(
                    p.iter().all(|x| x.1 >= k),
                    "staging holds fewer than {k} experts"
                );
                (
                    [
                        (p[0].0, strides[0], p[0].1),
                        (p[1].0, strides[1], p[1].1),
                        (p[2].0, strides[2], p[2].1),
                    ],
                    None,
                )
            }
        };
        let s = &gpu.stream;
        Ok(Self {
            n_slots,
            n_expert,
            slot_of: s.clone_htod(&slot_of)?,
            expert_in: s.clone_htod(&expert_in)?,
            stamp: s.alloc_zeros(n_slots)?,
            used: s.alloc_zeros(n_slots)?,
            pref: s.alloc_zeros(n_slots)?,
            miss: s.alloc_zeros(1 + 2 * k)?,
            miss_pre: s.alloc_zeros(1 + 2 * k)?,
            src,
            pinned,
        })
    }

    /// Map the `k` chosen `experts` to slots (routed: into `slots_out`;
    /// prefetch: only bring them in), counting into `counters` (4 u64).
    #[allow(clippy::too_many_arguments)]
    pub fn plan(
        &self,
        gpu: &Gpu,
        experts: &CudaSlice<u32>,
        k: usize,
        clock: &CudaSlice<i32>,
        prefetch: bool,
        slots_out: &CudaSlice<u32>,
        counters: (&CudaSlice<u64>, usize),
    ) -> Result<()> {
        ensure!(
            experts.len() >= k
                && slots_out.len() >= k
                && clock.len() >= 2
                && k <= 32
                && k <= self.n_slots,
            "expert_plan: buffers"
        );
        ensure!(counters.0.len() >= counters.1 + 4, "expert_plan: counters");
        let miss = if prefetch { &self.miss_pre } else { &self.miss };
        let args = ExpertPlanArgs {
            experts: dptr(gpu, Some(experts)),
            clock: dptr(gpu, Some(clock)),
            slot_of: dptr(gpu, Some(&self.slot_of)),
            expert_in: dptr(gpu, Some(&self.expert_in)),
            stamp: dptr(gpu, Some(&self.stamp)),
            used: dptr(gpu, Some(&self.used)),
            pref: dptr(gpu, Some(&self.pref)),
            slots_out: dptr(gpu, Some(slots_out)),
            miss: dptr(gpu, Some(miss)),
            counters: dptr(gpu, Some(counters.0)) + 8 * counters.1 as u64,
            k: k as i32,
            n_slots: self.n_slots as i32,
            prefetch: prefetch as i32,
            pad: 0,
        };
        let cfg = LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: expert_plan(ExpertPlanArgs) by value (the struct mirrors
        // the kernel's): experts[k], clock[2], slot_of[n_expert],
        // expert_in[S], stamp[S], used[S], pref[S], slots_out[k],
        // miss[1 + 2k], counters[4]; every buffer holds what the kernel
        // touches (checked above; the tables were sized in `new`); expert
        // ids come from the router (< n_expert).
        unsafe { gpu.launch("expert_plan", cfg, &[&args]) }
    }

    /// Copy the experts of the last plan's miss list (routed or prefetch)
    /// from host memory into `stacks`' slots, on `blocks` thread blocks.
    pub fn fetch(
        &self,
        gpu: &Gpu,
        prefetch: bool,
        stacks: [&ExpertStack; 3],
        blocks: u32,
    ) -> Result<()> {
        for (h, s) in self.src.iter().zip(stacks) {
            ensure!(
                h.1 == s.stride && s.n_slots == self.n_slots,
                "expert_fetch: host copy and slot stack disagree"
            );
        }
        ensure!(
            self.pinned.is_some() || !prefetch,
            "expert_fetch: a prefetch needs every expert in pinned memory"
        );
        let miss = dptr(
            gpu,
            Some(if prefetch { &self.miss_pre } else { &self.miss }),
        );
        let mut args = ExpertFetchArgs {
            miss,
            ..Default::default()
        };
        for ((h, s), p) in self.src.iter().zip(stacks).zip(&mut args.proj) {
            *p = FetchProj {
                src: h.0,
                dst: dptr(gpu, Some(&s.buf)),
                stride: h.1 as u64,
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: expert_fetch(ExpertFetchArgs) by value (the struct
        // mirrors the kernel's) reads miss[0] entries of (e, slot <
        // n_slots) written by expert_plan (e < n_expert) or by
        // point_misses_at_staging (e a staging entry < its count), and
        // copies `stride` bytes from src + e * stride (the mapped host copy
        // of n_expert experts, or the staging entries) to dst + s * stride
        // (a stack of n_slots slots of the same stride): checked above.
        unsafe { gpu.launch("expert_fetch", cfg, &[&args]) }
    }

    /// Every expert's pinned host copy of projection `p`, when pinned.
    pub fn pinned(&self, p: usize) -> Option<&HostExperts> {
        self.pinned.as_ref().map(|h| &h[p])
    }

    /// Staged mode, once the host has written the images of the routed
    /// plan's `misses` (from [`Self::misses`]) into staging entries 0.. in
    /// order: rewrite the miss list on the device to name those entries
    /// instead of the experts, for the fetch that follows.
    pub fn point_misses_at_staging(&mut self, gpu: &Gpu, misses: &[(u32, u32)]) -> Result<()> {
        ensure!(
            self.pinned.is_none(),
            "point_misses_at_staging: experts are pinned"
        );
        if misses.is_empty() {
            return Ok(());
        }
        ensure!(
            misses.len() <= self.src[0].2,
            "more misses than staging entries"
        );
        let mut list = vec![misses.len() as u32];
        for (i, &(_, s)) in misses.iter().enumerate() {
            list.extend([i as u32, s]);
        }
        gpu.stream
            .memcpy_htod(&list, &mut self.miss.slice_mut(..list.len()))?;
        Ok(())
    }

    /// The device table of each expert's slot (`SLOT_NONE`: not resident),
    /// as the plan kernel keeps it: the batched prefill's GEMMs read the
    /// resident experts through it.
    pub fn slot_table(&self) -> &CudaSlice<u32> {
        &self.slot_of
    }

    /// [`Self::slot_table`] read back (waits for the stream).
    pub fn read_slot_of(&self, gpu: &Gpu) -> Result<Vec<u32>> {
        gpu.sync()?;
        Ok(gpu.stream.clone_dtoh(&self.slot_of)?)
    }

    /// The pool's tables, for tests: (slot_of, expert_in, stamp).
    pub fn tables(&self, gpu: &Gpu) -> Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
        gpu.sync()?;
        let s = &gpu.stream;
        Ok((
            s.clone_dtoh(&self.slot_of)?,
            s.clone_dtoh(&self.expert_in)?,
            s.clone_dtoh(&self.stamp)?,
        ))
    }

    /// The routed plan's miss list (expert, slot), for tests.
    pub fn misses(&self, gpu: &Gpu, prefetch: bool) -> Result<Vec<(u32, u32)>> {
        gpu.sync()?;
        let m = gpu
            .stream
            .clone_dtoh(if prefetch { &self.miss_pre } else { &self.miss })?;
        Ok((0..m[0] as usize)
            .map(|i| (m[1 + 2 * i], m[2 + 2 * i]))
            .collect())
    }
}

/// Read `n_layers` layers' counters (4 u64 each) back.
pub fn read_counters(gpu: &Gpu, c: &CudaSlice<u64>) -> Result<Vec<CacheCounters>> {
    gpu.sync()?;
    let v = gpu.stream.clone_dtoh(c)?;
    Ok(v.chunks_exact(4)
        .map(|c| CacheCounters {
            hits: c[0],
            misses: c[1],
            prefetched: c[2],
            prefetch_used: c[3],
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    /// The structs the kernels read by value, at the sizes the `.cu`
    /// asserts and the offsets C gives the same declarations: 10 pointers
    /// and 4 i32 = 96 bytes; a pointer and three (u64, u64, u64) = 80.
    #[test]
    fn expert_cache_args_layout_matches_the_kernel_structs() {
        assert_eq!(size_of::<ExpertPlanArgs>(), 96);
        assert_eq!(align_of::<ExpertPlanArgs>(), 8);
        assert_eq!(offset_of!(ExpertPlanArgs, counters), 72);
        assert_eq!(offset_of!(ExpertPlanArgs, k), 80);
        assert_eq!(offset_of!(ExpertPlanArgs, prefetch), 88);
        assert_eq!(size_of::<FetchProj>(), 24);
        assert_eq!(offset_of!(FetchProj, stride), 16);
        assert_eq!(size_of::<ExpertFetchArgs>(), 80);
        assert_eq!(offset_of!(ExpertFetchArgs, proj), 8);
    }
}
