//! Decode GEMV launches: one matrix, or routed experts through slots.

use crate::device::Gpu;
use crate::layout::{layout, DeviceLayout};
use anyhow::{bail, ensure, Result};
use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use redlite_gguf::GgmlType;

/// Warps per thread block (`GEMV_WARPS` in `kernels/gemv_common.cuh`).
pub const GEMV_WARPS: u32 = 4;
/// Rows per warp the wrappers pick by default (see `redlite bench kernels`).
pub const DEFAULT_NR: u32 = 2;

/// Kernel name for `ty` with `nr` rows per warp.
pub fn kernel_name(ty: GgmlType, nr: u32) -> Result<String> {
    let tag = match ty {
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::IQ2_XXS => "iq2_xxs",
        GgmlType::Q8_0 => "q8_0",
        other => bail!("no CUDA GEMV kernel for {other:?}"),
    };
    ensure!(matches!(nr, 1 | 2 | 4), "rows per warp must be 1, 2 or 4");
    Ok(format!("gemv_{tag}_r{nr}"))
}

/// One quantized matrix (`rows` x `cols`) in the device layout.
pub struct DeviceMatrix {
    pub layout: DeviceLayout,
    pub rows: usize,
    pub cols: usize,
    pub buf: CudaSlice<u8>,
}

impl DeviceMatrix {
    /// Upload GGUF-order bytes of a `rows` x `cols` tensor of `ty`.
    pub fn upload(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, gguf: &[u8]) -> Result<Self> {
        let layout = layout(ty)?;
        let dev = layout.repack(gguf, rows, cols)?;
        Ok(Self {
            layout,
            rows,
            cols,
            buf: gpu.stream.clone_htod(&dev)?,
        })
    }

    pub fn bytes(&self) -> usize {
        self.buf.len()
    }

    /// `y = W x` (`x.len() >= cols`, `y.len() >= rows`).
    pub fn gemv(
        &self,
        gpu: &Gpu,
        x: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        nr: u32,
    ) -> Result<()> {
        ensure!(
            x.len() >= self.cols && y.len() >= self.rows,
            "gemv: short x or y"
        );
        launch(
            gpu,
            &self.layout,
            nr,
            &self.buf,
            self.bytes() as u64,
            None,
            1,
            x,
            0,
            y,
            self.rows,
            self.cols,
        )
    }
}

/// The experts of one stacked tensor (e.g. `blk.N.ffn_up_exps`), each a
/// `rows` x `cols` matrix in its own slot of `stride` bytes (256-byte
/// aligned). Which expert sits in which slot is the
/// [`crate::slots::SlotTable`]'s business; kernels see slot indices only.
pub struct ExpertStack {
    pub layout: DeviceLayout,
    pub rows: usize,
    pub cols: usize,
    pub n_slots: usize,
    pub stride: usize,
    pub buf: CudaSlice<u8>,
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
        nr: u32,
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
            nr,
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
}

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    layout: &DeviceLayout,
    nr: u32,
    w: &CudaSlice<u8>,
    mat_bytes: u64,
    slots: Option<&CudaSlice<u32>>,
    n_mats: usize,
    x: &CudaSlice<f32>,
    x_stride: usize,
    y: &mut CudaSlice<f32>,
    rows: usize,
    cols: usize,
) -> Result<()> {
    let nb = layout.blocks_per_row(cols)?;
    ensure!((1..=65535).contains(&n_mats), "gemv: {n_mats} matrices");
    ensure!((1..=i32::MAX as usize).contains(&rows) && nb <= i32::MAX as usize);
    let f = gpu.func(&kernel_name(layout.ty, nr)?)?;
    let rows_per_block = GEMV_WARPS * nr;
    let cfg = LaunchConfig {
        grid_dim: ((rows as u32).div_ceil(rows_per_block), n_mats as u32, 1),
        block_dim: (GEMV_WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (rows_i, nb_i, xs) = (rows as i32, nb as i32, x_stride as i64);
    let null: u64 = 0;
    let mut b = gpu.stream.launch_builder(f);
    b.arg(w).arg(&mat_bytes);
    match slots {
        Some(s) => b.arg(s),
        None => b.arg(&null),
    };
    b.arg(x).arg(&xs).arg(y).arg(&rows_i).arg(&nb_i);
    // SAFETY: the argument list matches the kernel signature in
    // gemv_common.cuh (u8*, u64, u32* or null, f32*, i64, f32*, i32, i32);
    // the matrix buffers hold n_mats (or, with slots, every slot index the
    // caller passes) matrices of `mat_bytes` >= rows*nb*block bytes in the
    // layout the kernel reads; x holds (n_mats-1)*x_stride + cols floats and
    // y n_mats*rows floats (checked by the callers); every buffer lives on
    // `gpu.stream`, which orders this launch after their uploads.
    unsafe { b.launch(cfg) }?;
    Ok(())
}
