//! Decode GEMV launches: one matrix, or routed experts through slots.

use crate::device::dptr;
use crate::device::Gpu;
use crate::error::{bail, ensure, Result};
use crate::layout::{layout, to_device_bytes, upload_layout, DeviceLayout};
use cudarc::driver::{CudaSlice, DeviceRepr, LaunchConfig};
use redlite_gguf::GgmlType;

mod experts;
mod gemm;
pub use experts::{expert_image, ExpertStack};
pub use gemm::{
    gemm_kernel, route_tiles, GemmArgs, GemmIn, GemmOut, KSplit, RouteTiles, TileCount, GEMM_TILE,
};

/// Warps per thread block (`GEMV_WARPS` in `kernels/gemv_common.cuh`).
pub const GEMV_WARPS: u32 = 4;
/// Rows per warp the wrappers pick by default (see `redlite bench kernels`).
pub const DEFAULT_NR: u32 = 2;

/// One configuration of the f32-activation GEMV kernels: `nr` rows per
/// warp; `x2`: each lane handles two chunks per loop step (loads of both
/// issued before the math).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    pub nr: u32,
    pub x2: bool,
}

impl Variant {
    pub const fn new(nr: u32, x2: bool) -> Self {
        Self { nr, x2 }
    }
    /// Every compiled configuration.
    pub const ALL: [Variant; 6] = [
        Variant::new(1, false),
        Variant::new(2, false),
        Variant::new(4, false),
        Variant::new(1, true),
        Variant::new(2, true),
        Variant::new(4, true),
    ];
}

impl From<u32> for Variant {
    fn from(nr: u32) -> Self {
        Self::new(nr, false)
    }
}

/// Kernel name for `ty` in configuration `v`.
pub fn kernel_name(ty: GgmlType, v: impl Into<Variant>) -> Result<String> {
    let Variant { nr, x2 } = v.into();
    let tag = match ty {
        GgmlType::F32 => "f32",
        GgmlType::Q4_K => "q4_k",
        GgmlType::Q6_K => "q6_k",
        GgmlType::IQ2_XXS => "iq2_xxs",
        GgmlType::Q8_0 => "q8_0",
        GgmlType::Q5_0 => "q5_0",
        GgmlType::Q5_K => "q5_k",
        GgmlType::IQ4_NL => "iq4_nl",
        GgmlType::IQ2_XS => "iq2_xs",
        GgmlType::IQ1_M => "iq1_m",
        other => bail!("no CUDA GEMV kernel for {other:?}"),
    };
    ensure!(matches!(nr, 1 | 2 | 4), "rows per warp must be 1, 2 or 4");
    Ok(format!("gemv_{tag}_r{nr}{}", if x2 { "x2" } else { "" }))
}

/// The formats with int8-activation kernels (`kernels/gemv_q8act.cuh`).
pub const Q8_TYPES: [GgmlType; 7] = [
    GgmlType::IQ2_XXS,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::IQ4_NL,
    GgmlType::Q6_K,
    GgmlType::IQ2_XS,
    GgmlType::IQ1_M,
];

/// One configuration of the int8-activation kernels: `nr` rows per lane
/// group; `smem_grid`: IQ2_XXS grid looked up in shared memory (`_q8s`);
/// `max_lanes`: at most this many lanes (4, 8, 16 or 32) serve one row
/// (fewer lanes per row: each walks more chunks, and a launch needs fewer
/// blocks; a run-time argument of the same kernels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Q8Variant {
    pub nr: u32,
    pub smem_grid: bool,
    pub max_lanes: u32,
}

impl From<u32> for Q8Variant {
    fn from(nr: u32) -> Self {
        Self {
            nr,
            smem_grid: false,
            max_lanes: 32,
        }
    }
}

/// Name of the int8-activation kernel for `ty` in configuration `v`.
pub fn q8_kernel_name(ty: GgmlType, v: impl Into<Q8Variant>) -> Result<String> {
    let Q8Variant { nr, smem_grid, .. } = v.into();
    ensure!(matches!(nr, 1 | 2 | 4), "rows per warp must be 1, 2 or 4");
    match ty {
        GgmlType::IQ2_XXS => Ok(format!(
            "gemv_iq2_xxs_q8{}_r{nr}",
            if smem_grid { "s" } else { "" }
        )),
        GgmlType::Q8_0 if !smem_grid => Ok(format!("gemv_q8_0_q8_r{nr}")),
        GgmlType::Q4_K if !smem_grid => Ok(format!("gemv_q4_k_q8_r{nr}")),
        GgmlType::IQ4_NL if !smem_grid => Ok(format!("gemv_iq4_nl_q8_r{nr}")),
        GgmlType::Q6_K if !smem_grid => Ok(format!("gemv_q6_k_q8_r{nr}")),
        GgmlType::IQ2_XS if !smem_grid => Ok(format!("gemv_iq2_xs_q8_r{nr}")),
        GgmlType::IQ1_M if !smem_grid => Ok(format!("gemv_iq1_m_q8_r{nr}")),
        other => bail!("no int8-activation kernel for {other:?} (smem_grid {smem_grid})"),
    }
}

/// The kernel name of `v` for reports, with its lanes cap when it has one.
pub fn q8_label(ty: GgmlType, v: impl Into<Q8Variant>) -> Result<String> {
    let v = v.into();
    let name = q8_kernel_name(ty, v)?;
    Ok(if v.max_lanes < 32 {
        format!("{name} (<= {} lanes a row)", v.max_lanes)
    } else {
        name
    })
}

/// Lane chunks per block of the int8-activation kernels (`T::CPB`).
pub(crate) fn q8_chunks_per_block(ty: GgmlType) -> usize {
    match ty {
        GgmlType::IQ2_XXS | GgmlType::Q6_K | GgmlType::IQ2_XS | GgmlType::IQ1_M => 4,
        GgmlType::Q4_K => 8,
        _ => 1,
    }
}

/// Lanes serving one row in `gemv_q8act.cuh` (`q8_lanes_per_row` there):
/// the largest power of two <= the row's lane chunks, in 4..=32, and at
/// most `max_lanes`.
pub fn q8_lanes_per_row(nch: usize, max_lanes: u32) -> u32 {
    let l = match nch {
        n if n >= 32 => 32,
        n if n >= 16 => 16,
        n if n >= 8 => 8,
        _ => 4,
    };
    l.min(max_lanes)
}

/// An activation vector quantized for the int8 kernels
/// (`kernels/quantize_q8.cu`): `n` int8 values and one f32 scale per 32.
pub struct Q8Vec {
    pub n: usize,
    pub q: CudaSlice<i8>,
    pub d: CudaSlice<f32>,
}

impl Q8Vec {
    /// Room for `n` values (`n` a multiple of 32).
    pub fn new(gpu: &Gpu, n: usize) -> Result<Self> {
        ensure!(
            n > 0 && n.is_multiple_of(32) && n <= i32::MAX as usize,
            "Q8Vec: {n} values"
        );
        Ok(Self {
            n,
            q: gpu.stream.alloc_zeros(n)?,
            d: gpu.stream.alloc_zeros(n / 32)?,
        })
    }

    /// Quantize the first `self.n` values of `x` (one launch).
    pub fn quantize(&mut self, gpu: &Gpu, x: &CudaSlice<f32>) -> Result<()> {
        ensure!(x.len() >= self.n, "Q8Vec::quantize: short x");
        let cfg = LaunchConfig {
            grid_dim: ((self.n as u32).div_ceil(256), 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let n = self.n as i32;
        let (xp, qp, dp) = (
            dptr(gpu, Some(x)),
            dptr(gpu, Some(&self.q)),
            dptr(gpu, Some(&self.d)),
        );
        // SAFETY: quantize_q8_32(const float*, i8*, float*, int) reads n
        // floats of x and writes n bytes of q and n/32 floats of d, all of
        // which the buffers hold (n % 32 == 0 checked in `new`); one stream.
        unsafe { gpu.launch("quantize_q8_32", cfg, &[&xp, &qp, &dp, &n]) }?;
        Ok(())
    }
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

    /// Upload a GGUF `ty` tensor of `rows` x `cols`: in its own layout when
    /// a kernel reads it, else dequantized to F32 ([`upload_layout`]).
    pub fn from_gguf(
        gpu: &Gpu,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        gguf: &[u8],
    ) -> Result<Self> {
        let layout = upload_layout(ty, cols)?;
        let dev = to_device_bytes(&layout, ty, gguf, rows, cols)?;
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
        v: impl Into<Variant>,
    ) -> Result<()> {
        ensure!(
            x.len() >= self.cols && y.len() >= self.rows,
            "gemv: short x or y"
        );
        launch(
            gpu,
            &self.layout,
            v.into(),
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

    /// `y = W x` with int8 activations ([`Q8_TYPES`]; `x` quantized by
    /// [`Q8Vec::quantize`], `x.n >= cols`).
    pub fn gemv_q8(
        &self,
        gpu: &Gpu,
        x: &Q8Vec,
        y: &mut CudaSlice<f32>,
        nr: impl Into<Q8Variant>,
    ) -> Result<()> {
        ensure!(
            x.n >= self.cols && y.len() >= self.rows,
            "gemv_q8: short x or y"
        );
        launch_q8(
            gpu,
            Q8Launch {
                layout: &self.layout,
                v: nr.into(),
                w0: &self.buf,
                w1: &self.buf,
                n_first: 1,
                mat_bytes: self.bytes() as u64,
                slots: None,
                n_mats: 1,
                x,
                x_stride: 0,
                rows: self.rows,
                cols: self.cols,
            },
            y,
        )
    }
}

impl DeviceMatrix {
    /// `y[..rows] = self·x` and `y[rows..2*rows] = other·x` in one launch
    /// (int8 activations; both matrices of one format and shape: an FFN's
    /// gate and up).
    pub fn gemv_q8_pair(
        &self,
        other: &DeviceMatrix,
        gpu: &Gpu,
        x: &Q8Vec,
        y: &mut CudaSlice<f32>,
        nr: impl Into<Q8Variant>,
    ) -> Result<()> {
        ensure!(
            self.layout == other.layout
                && (self.rows, self.cols, self.bytes()) == (other.rows, other.cols, other.bytes()),
            "gemv_q8_pair: the matrices differ in format or shape"
        );
        ensure!(
            x.n >= self.cols && y.len() >= 2 * self.rows,
            "gemv_q8_pair: short x or y"
        );
        launch_q8(
            gpu,
            Q8Launch {
                layout: &self.layout,
                v: nr.into(),
                w0: &self.buf,
                w1: &other.buf,
                n_first: 1,
                mat_bytes: self.bytes() as u64,
                slots: None,
                n_mats: 2,
                x,
                x_stride: 0,
                rows: self.rows,
                cols: self.cols,
            },
            y,
        )
    }
}

struct Q8Launch<'a> {
    layout: &'a DeviceLayout,
    v: Q8Variant,
    w0: &'a CudaSlice<u8>,
    w1: &'a CudaSlice<u8>,
    n_first: usize,
    mat_bytes: u64,
    slots: Option<&'a CudaSlice<u32>>,
    n_mats: usize,
    x: &'a Q8Vec,
    x_stride: usize,
    rows: usize,
    cols: usize,
}

/// The grid of the int8-activation kernels (`gemv_q8act.cuh`): blocks of
/// GEMV_WARPS warps, each warp `nr` rows per lane group, over `n_mats`
/// matrices of `rows` x `nb` blocks of format `ty`.
fn q8_grid(
    ty: GgmlType,
    v: Q8Variant,
    nb: usize,
    rows: usize,
    n_mats: usize,
) -> Result<LaunchConfig> {
    ensure!((1..=65535).contains(&n_mats), "gemv: {n_mats} matrices");
    ensure!((1..=i32::MAX as usize).contains(&rows) && nb <= i32::MAX as usize / 4);
    ensure!(
        matches!(v.max_lanes, 4 | 8 | 16 | 32),
        "gemv_q8: lanes per row must be 4, 8, 16 or 32"
    );
    let nr = v.nr;
    let spr = q8_lanes_per_row(nb * q8_chunks_per_block(ty), v.max_lanes);
    let rows_per_block = GEMV_WARPS * nr * (32 / spr);
    Ok(LaunchConfig {
        grid_dim: ((rows as u32).div_ceil(rows_per_block), n_mats as u32, 1),
        block_dim: (GEMV_WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    })
}

fn launch_q8(gpu: &Gpu, a: Q8Launch<'_>, y: &mut CudaSlice<f32>) -> Result<()> {
    ensure!(a.x_stride.is_multiple_of(32), "gemv_q8: x_stride % 32");
    let nb = a.layout.blocks_per_row(a.cols)?;
    let name = q8_kernel_name(a.layout.ty, a.v)?;
    let cfg = q8_grid(a.layout.ty, a.v, nb, a.rows, a.n_mats)?;
    let args = GemvQ8Args {
        w0: dptr(gpu, Some(a.w0)),
        w1: dptr(gpu, Some(a.w1)),
        mat_bytes: a.mat_bytes,
        slots: dptr(gpu, a.slots),
        xq: dptr(gpu, Some(&a.x.q)),
        xd: dptr(gpu, Some(&a.x.d)),
        x_stride: a.x_stride as i64,
        y: dptr(gpu, Some(&*y)),
        n_first: a.n_first as i32,
        rows: a.rows as i32,
        nb: nb as i32,
        max_lanes: a.v.max_lanes as i32,
    };
    // SAFETY: gemv_*_q8*(GemvQ8Args) by value (the struct mirrors the
    // kernels'; the grid from q8_grid with the same lanes cap). w0 holds
    // the first n_first matrices (or slots), w1 the rest, each of
    // `mat_bytes` >= rows*nb*block bytes in the device layout of
    // `a.layout` (a format with a q8 kernel, checked by q8_kernel_name);
    // the Q8Vec holds (n-1)*x_stride + cols values and their scales, y
    // n_mats*rows floats (checked by the callers); one stream orders
    // everything.
    unsafe { gpu.launch(&name, cfg, &[&args]) }?;
    Ok(())
}

/// The argument struct of the int8-activation GEMVs (`GemvQ8Args` in
/// `kernels/gemv_q8act.cuh`: same field order and types, device addresses
/// as u64; the `.cuh` asserts the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GemvQ8Args {
    pub w0: u64,
    pub w1: u64,
    pub mat_bytes: u64,
    pub slots: u64,
    pub xq: u64,
    pub xd: u64,
    pub x_stride: i64,
    pub y: u64,
    pub n_first: i32,
    pub rows: i32,
    pub nb: i32,
    pub max_lanes: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers, passed to the kernels
// by value as the `GemvQ8Args` it mirrors (offsets checked in the tests,
// the size by a static_assert in the `.cuh`).
unsafe impl DeviceRepr for GemvQ8Args {}

#[allow(clippy::too_many_arguments)]
fn launch(
    gpu: &Gpu,
    layout: &DeviceLayout,
    v: Variant,
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
    let name = kernel_name(layout.ty, v)?;
    let rows_per_block = GEMV_WARPS * v.nr;
    let cfg = LaunchConfig {
        grid_dim: ((rows as u32).div_ceil(rows_per_block), n_mats as u32, 1),
        block_dim: (GEMV_WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    };
    let (rows_i, nb_i, xs) = (rows as i32, nb as i32, x_stride as i64);
    let (wp, sp, xp, yp) = (
        dptr(gpu, Some(w)),
        dptr(gpu, slots),
        dptr(gpu, Some(x)),
        dptr(gpu, Some(&*y)),
    );
    // SAFETY: the argument list matches the kernel signature in
    // gemv_common.cuh (u8*, u64, u32* or null, f32*, i64, f32*, i32, i32);
    // the matrix buffers hold n_mats (or, with slots, every slot index the
    // caller passes) matrices of `mat_bytes` >= rows*nb*block bytes in the
    // layout the kernel reads; x holds (n_mats-1)*x_stride + cols floats and
    // y n_mats*rows floats (checked by the callers); every buffer lives on
    // `gpu.stream`, which orders this launch after their uploads.
    unsafe {
        gpu.launch(
            &name,
            cfg,
            &[&wp, &mat_bytes, &sp, &xp, &xs, &yp, &rows_i, &nb_i],
        )
    }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The struct the int8-activation GEMVs read by value: 8 pointers and
    /// u64/i64s, 4 i32 = 80 bytes (the `.cuh` asserts the same size), each
    /// field at the offset C gives the same declaration.
    #[test]
    fn gemv_q8_args_layout_matches_the_kernel_struct() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(size_of::<GemvQ8Args>(), 80);
        assert_eq!(align_of::<GemvQ8Args>(), 8);
        assert_eq!(offset_of!(GemvQ8Args, mat_bytes), 16);
        assert_eq!(offset_of!(GemvQ8Args, x_stride), 48);
        assert_eq!(offset_of!(GemvQ8Args, n_first), 64);
        assert_eq!(offset_of!(GemvQ8Args, max_lanes), 76);
    }

    /// The grid of the int8 kernels under a lanes cap: a block covers
    /// GEMV_WARPS warps of nr rows per lane group, 32 / lanes groups a warp
    /// (the kernel's `wrow0`), so every row is covered exactly once.
    #[test]
    fn q8_grid_under_a_lanes_cap() {
        // IQ2_XXS, 2048 columns: 8 blocks of 4 chunks = 32 chunks a row.
        let v = |nr, max_lanes| Q8Variant {
            nr,
            smem_grid: false,
            max_lanes,
        };
        for (lanes, rows_per_block) in [(32, 8), (16, 16), (8, 32), (4, 64)] {
            assert_eq!(q8_lanes_per_row(32, lanes), lanes);
            let g = q8_grid(GgmlType::IQ2_XXS, v(2, lanes), 8, 10240, 3).unwrap();
            assert_eq!(g.grid_dim, (10240u32.div_ceil(rows_per_block), 3, 1));
        }
        // A narrow row (8 chunks) is not widened by the cap.
        assert_eq!(q8_lanes_per_row(8, 32), 8);
        assert_eq!(q8_lanes_per_row(8, 16), 8);
        assert_eq!(q8_lanes_per_row(8, 4), 4);
        assert!(q8_grid(GgmlType::IQ2_XXS, v(2, 12), 8, 64, 1).is_err());
        assert_eq!(
            q8_label(GgmlType::Q8_0, v(2, 16)).unwrap(),
            "gemv_q8_0_q8_r2 (<= 16 lanes a row)"
        );
        assert_eq!(
            q8_label(GgmlType::Q8_0, v(2, 32)).unwrap(),
            "gemv_q8_0_q8_r2"
        );
    }
}
