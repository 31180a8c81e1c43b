//! Routed experts' GEMVs: the slot stacks of one stacked expert tensor,
//! how an expert becomes its slot image, and the launches through slot
//! indices.

use super::{launch, launch_q8, Q8Launch, Q8Variant, Q8Vec, Variant};
use crate::device::Gpu;
use crate::error::{ensure, Result};
use crate::layout::{layout, to_device_bytes, upload_layout, DeviceLayout};
use cudarc::driver::CudaSlice;
use redlite_gguf::GgmlType;

/// The experts of one stacked tensor (e.g. `blk.N.ffn_up_exps`), each a
/// `rows` x `cols` matrix in its own slot of `stride` bytes (256-byte
/// aligned). Which expert sits in which slot is the router's (identity)
/// or the [`crate::expert_cache`]'s business; kernels see slot indices
/// only.
pub struct ExpertStack {
    pub layout: DeviceLayout,
    pub rows: usize,
    pub cols: usize,
    pub n_slots: usize,
    pub stride: usize,
    pub buf: CudaSlice<u8>,
}

/// Expert `e`'s slot image (device layout, `dst.len()` = the stack's
/// stride) from a stacked GGUF tensor's bytes, as [`ExpertStack::from_gguf`]
/// lays it out.
#[allow(clippy::too_many_arguments)]
pub fn expert_image(
    ty: GgmlType,
    rows_total: usize,
    row0: usize,
    rows: usize,
    cols: usize,
    n: usize,
    gguf: &[u8],
    e: usize,
    dst: &mut [u8],
) -> Result<()> {
    ensure!(e < n, "expert {e} of {n}");
    StackSource::new(ty, rows_total, row0, rows, cols, n, gguf)?.fill(e, dst)
}

/// Where the experts of a stacked GGUF tensor come from, and how one
/// expert becomes its slot image (device layout, zero-padded to `stride`).
struct StackSource<'a> {
    layout: DeviceLayout,
    ty: GgmlType,
    stride: usize,
    per: usize,
    row_bytes: usize,
    row0: usize,
    rows: usize,
    cols: usize,
    gguf: &'a [u8],
}

impl<'a> StackSource<'a> {
    fn new(
        ty: GgmlType,
        rows_total: usize,
        row0: usize,
        rows: usize,
        cols: usize,
        n: usize,
        gguf: &'a [u8],
    ) -> Result<Self> {
        ensure!(n >= 1 && row0 + rows <= rows_total && gguf.len().is_multiple_of(n * rows_total));
        let layout = upload_layout(ty, cols)?;
        let per = gguf.len() / n;
        Ok(Self {
            stride: layout.matrix_bytes(rows, cols)?.next_multiple_of(256),
            layout,
            ty,
            per,
            row_bytes: per / rows_total,
            row0,
            rows,
            cols,
            gguf,
        })
    }

    /// A stack of `n_slots` slots whose first slots hold `images` (whole
    /// slot images, experts 0.. in order).
    fn stack(&self, gpu: &Gpu, n_slots: usize, images: &[u8]) -> Result<ExpertStack> {
        ensure!(images.len() == n_slots * self.stride, "slot images");
        Ok(ExpertStack {
            layout: self.layout,
            rows: self.rows,
            cols: self.cols,
            n_slots,
            stride: self.stride,
            buf: gpu.stream.clone_htod(images)?,
        })
    }

    /// Expert `e`'s image into `dst` (`stride` bytes).
    fn fill(&self, e: usize, dst: &mut [u8]) -> Result<()> {
        ensure!(
            dst.len() == self.stride,
            "expert image: {} bytes",
            dst.len()
        );
        let src =
            &self.gguf[e * self.per + self.row0 * self.row_bytes..][..self.rows * self.row_bytes];
        let dev = to_device_bytes(&self.layout, self.ty, src, self.rows, self.cols)?;
        dst[..dev.len()].copy_from_slice(&dev);
        dst[dev.len()..].fill(0);
        Ok(())
    }
}

impl ExpertStack {
    /// `n_slots` empty slots (zeroed).
    pub fn new(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, n_slots: usize) -> Result<Self> {
        let layout = layout(ty)?;
        let stride = layout.matrix_bytes(rows, cols)?.next_multiple_of(256);
        Ok(Self {
            layout,
            rows,
            cols,
            n_slots,
            stride,
            buf: gpu.stream.alloc_zeros(stride * n_slots)?,
        })
    }

    /// Every expert of a stacked GGUF `ty` tensor (`n` experts of
    /// `rows_total` rows each, expert index slowest), rows
    /// `row0..row0 + rows` of each (a merged gate|up tensor gives gate and
    /// up separately), expert e in slot e (full residency). Formats without
    /// a kernel are dequantized to F32 ([`upload_layout`]).
    #[allow(clippy::too_many_arguments)]
    pub fn from_gguf(
        gpu: &Gpu,
        ty: GgmlType,
        rows_total: usize,
        row0: usize,
        rows: usize,
        cols: usize,
        n: usize,
        gguf: &[u8],
    ) -> Result<Self> {
        Self::preloaded(gpu, ty, rows_total, row0, rows, cols, n, gguf, n)
    }

    /// [`Self::from_gguf`] for a bounded cache: every expert goes into
    /// pinned host memory (device layout), the stack gets `n_slots` slots
    /// holding experts `0..n_slots`.
    #[allow(clippy::too_many_arguments)]
    pub fn cached(
        gpu: &Gpu,
        ty: GgmlType,
        rows_total: usize,
        row0: usize,
        rows: usize,
        cols: usize,
        n: usize,
        gguf: &[u8],
        n_slots: usize,
    ) -> Result<(Self, crate::expert_cache::HostExperts)> {
        ensure!(
            n_slots >= 1 && n_slots <= n,
            "{n_slots} slots for {n} experts"
        );
        let src = StackSource::new(ty, rows_total, row0, rows, cols, n, gguf)?;
        let host =
            crate::expert_cache::HostExperts::new(gpu, src.stride, n, |e, dst| src.fill(e, dst))?;
        let stack = src.stack(gpu, n_slots, host.prefix(n_slots)?)?;
        Ok((stack, host))
    }

    /// [`Self::from_gguf`] with only `n_slots` slots, holding experts
    /// `0..n_slots`: a bounded cache whose misses are read from the file
    /// ([`expert_image`]).
    #[allow(clippy::too_many_arguments)]
    pub fn preloaded(
        gpu: &Gpu,
        ty: GgmlType,
        rows_total: usize,
        row0: usize,
        rows: usize,
        cols: usize,
        n: usize,
        gguf: &[u8],
        n_slots: usize,
    ) -> Result<Self> {
        ensure!(
            n_slots >= 1 && n_slots <= n,
            "{n_slots} slots for {n} experts"
        );
        let src = StackSource::new(ty, rows_total, row0, rows, cols, n, gguf)?;
        let mut host = vec![0u8; src.stride * n_slots];
        for (e, dst) in host.chunks_mut(src.stride).enumerate() {
            src.fill(e, dst)?;
        }
        src.stack(gpu, n_slots, &host)
    }

    /// Write one expert's GGUF-order bytes into `slot`.
    pub fn upload(&mut self, gpu: &Gpu, slot: usize, gguf: &[u8]) -> Result<()> {
        ensure!(slot < self.n_slots, "slot {slot} out of range");
        let dev = self.layout.repack(gguf, self.rows, self.cols)?;
        let mut dst = self
            .buf
            .slice_mut(slot * self.stride..slot * self.stride + dev.len());
        gpu.stream.memcpy_htod(&dev, &mut dst)?;
        Ok(())
    }

    /// For each i < n: `y[i*rows..][..rows] = W[slots[i]] · x[i*x_stride..]`
    /// (`x_stride` 0: every expert reads the same vector, as gate/up do;
    /// `cols`: one vector per expert, as down does). Slot indices must be
    /// `< n_slots` (checked on the host by the caller that built them from
    /// the slot table; the kernel trusts them).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        gpu: &Gpu,
        slots: &CudaSlice<u32>,
        n: usize,
        x: &CudaSlice<f32>,
        x_stride: usize,
        y: &mut CudaSlice<f32>,
        v: impl Into<Variant>,
    ) -> Result<()> {
        ensure!(
            slots.len() >= n,
            "gemv_experts: {n} experts, {} slots given",
            slots.len()
        );
        ensure!(
            x.len() >= (n - 1) * x_stride + self.cols,
            "gemv_experts: short x"
        );
        ensure!(y.len() >= n * self.rows, "gemv_experts: short y");
        launch(
            gpu,
            &self.layout,
            v.into(),
            &self.buf,
            self.stride as u64,
            Some(slots),
            n,
            x,
            x_stride,
            y,
            self.rows,
            self.cols,
        )
    }

    /// [`Self::gemv`] with int8 activations ([`super::Q8_TYPES`]): `x_stride`
    /// (values) 0 or `cols`, a multiple of 32.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_q8(
        &self,
        gpu: &Gpu,
        slots: &CudaSlice<u32>,
        n: usize,
        x: &Q8Vec,
        x_stride: usize,
        y: &mut CudaSlice<f32>,
        nr: impl Into<Q8Variant>,
    ) -> Result<()> {
        ensure!(slots.len() >= n && n >= 1, "gemv_q8: {n} experts");
        ensure!(
            x.n >= (n - 1) * x_stride + self.cols,
            "gemv_q8 experts: short x"
        );
        ensure!(y.len() >= n * self.rows, "gemv_q8 experts: short y");
        launch_q8(
            gpu,
            Q8Launch {
                layout: &self.layout,
                v: nr.into(),
                w0: &self.buf,
                w1: &self.buf,
                n_first: n,
                mat_bytes: self.stride as u64,
                slots: Some(slots),
                n_mats: n,
                x,
                x_stride,
                rows: self.rows,
                cols: self.cols,
            },
            y,
        )
    }

    /// Gate and up of the `n` routed experts in one launch (int8
    /// activations, one shared x): `y[..n*rows]` = gate outputs,
    /// `y[n*rows..2*n*rows]` = up outputs, expert i at `i*rows`.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_gate_up_q8(
        gate: &ExpertStack,
        up: &ExpertStack,
        gpu: &Gpu,
        slots: &CudaSlice<u32>,
        n: usize,
        x: &Q8Vec,
        y: &mut CudaSlice<f32>,
        nr: impl Into<Q8Variant>,
    ) -> Result<()> {
        ensure!(
            gate.layout == up.layout
                && (gate.rows, gate.cols, gate.stride) == (up.rows, up.cols, up.stride),
            "gate_up: gate and up stacks differ in shape"
        );
        ensure!(gate.n_slots == up.n_slots, "gate_up: slot counts differ");
        ensure!(slots.len() >= n && n >= 1, "gate_up: {n} experts");
        ensure!(x.n >= gate.cols, "gate_up: short x");
        ensure!(y.len() >= 2 * n * gate.rows, "gate_up: short y");
        launch_q8(
            gpu,
            Q8Launch {
                layout: &gate.layout,
                v: nr.into(),
                w0: &gate.buf,
                w1: &up.buf,
                n_first: n,
                mat_bytes: gate.stride as u64,
                slots: Some(slots),
                n_mats: 2 * n,
                x,
                x_stride: 0,
                rows: gate.rows,
                cols: gate.cols,
            },
            y,
        )
    }
}
