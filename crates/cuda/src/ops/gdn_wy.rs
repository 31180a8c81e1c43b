//! Launches of the chunkwise (WY) DeltaNet recurrence of a prefill chunk
//! (`kernels/deltanet_wy.cu`; its algebra and a host model in
//! `src/gdn_wy_model.rs`): `gdn_wy_prep` for every (sub-chunk, value head)
//! at once, then `gdn_wy_state_k{dk}` carrying the state sub-chunk after
//! sub-chunk.

use super::deltanet::{GdnDims, GdnWeights};
use crate::device::{dptr, Gpu};
use crate::error::{ensure, Result};
use cudarc::driver::{CudaSlice, DeviceRepr};

/// Tokens a sub-chunk (`GDN_SUB` in the kernels).
pub const GDN_SUB: usize = 64;

/// State columns a block of `gdn_wy_state` (`WY_COLS`).
const WY_COLS: usize = 32;

/// The argument struct of the WY kernels (`GdnWyArgs` in
/// `kernels/deltanet_wy.cu`: same field order and types, device addresses
/// as u64; the `.cu` asserts the size).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct GdnWyArgs {
    pub conv: u64,
    pub ba: u64,
    pub ld_ba: i64,
    pub dt_bias: u64,
    pub ssm_a: u64,
    pub wy: u64,
    pub state: u64,
    pub raw: u64,
    pub n_k: i32,
    pub n_v: i32,
    pub dk: i32,
    pub dv: i32,
    pub tokens: i32,
    pub n_sub: i32,
}

// SAFETY: a plain `#[repr(C)]` struct of integers, passed to the kernels
// by value as the `GdnWyArgs` it mirrors (offsets checked in the tests, the
// size by a static_assert in the `.cu`).
unsafe impl DeviceRepr for GdnWyArgs {}

/// Floats of one (head, sub-chunk) block of the scratch: W^T, gamma Q^T
/// (dk x 64 each), the scaled K (64 x dk), U (64 x dv), P^T (64 x 64), G.
pub fn wy_block_floats(dk: usize, dv: usize) -> usize {
    GDN_SUB * (3 * dk + dv + GDN_SUB + 1)
}

/// Floats of scratch the WY form needs for `tokens` tokens of `s`.
pub fn wy_scratch_floats(s: &GdnDims, tokens: usize) -> usize {
    s.n_v * tokens.div_ceil(GDN_SUB) * wy_block_floats(s.dk, s.dv)
}

/// The state kernel for these head sizes, if the WY form takes them: dk
/// 32, 64 or 128 (dk/32 state rows a thread; 256 would not fit the shared
/// memory), dv a whole number of 32-column blocks.
pub fn wy_state_kernel(s: &GdnDims) -> Option<&'static str> {
    if !s.dv.is_multiple_of(WY_COLS) || s.dv == 0 {
        return None;
    }
    match s.dk {
        32 => Some("gdn_wy_state_k32"),
        64 => Some("gdn_wy_state_k64"),
        128 => Some("gdn_wy_state_k128"),
        _ => None,
    }
}

/// Dynamic shared memory of `gdn_wy_state` (its seven buffers).
pub fn wy_state_smem_bytes(dk: usize) -> usize {
    let c = GDN_SUB;
    4 * (3 * dk * c + c * c + c * WY_COLS + dk * WY_COLS + c * WY_COLS)
}

/// The device addresses of a chunk's DeltaNet inputs, checked by the
/// caller ([`super::gdn_chunk`]): the normed conv rows, the gate rows.
pub(super) struct WyInputs {
    pub conv: u64,
    pub ba: u64,
    pub ld_ba: usize,
    pub raw: u64,
}

/// The state recurrence of `tokens` tokens in the WY form; outputs
/// (unnormalised) into the rows at `x.raw`, `state` carried.
pub(super) fn gdn_wy_recurrence(
    gpu: &Gpu,
    s: &GdnDims,
    w: &GdnWeights,
    x: &WyInputs,
    state: &CudaSlice<f32>,
    wy: &CudaSlice<f32>,
    tokens: usize,
) -> Result<()> {
    let kernel = wy_state_kernel(s).ok_or_else(|| {
        crate::error::CudaError::Invalid(format!("DeltaNet WY form: no kernel for {s:?}"))
    })?;
    let n_sub = tokens.div_ceil(GDN_SUB);
    ensure!(
        wy.len() >= wy_scratch_floats(s, tokens),
        "DeltaNet WY scratch: {} floats for {} needed",
        wy.len(),
        wy_scratch_floats(s, tokens)
    );
    ensure!(state.len() >= s.state_len() && s.n_v <= 65535 && n_sub <= i32::MAX as usize);
    let args = GdnWyArgs {
        conv: x.conv,
        ba: x.ba,
        ld_ba: x.ld_ba as i64,
        dt_bias: dptr(gpu, Some(w.dt_bias)),
        ssm_a: dptr(gpu, Some(w.ssm_a)),
        wy: dptr(gpu, Some(wy)),
        state: dptr(gpu, Some(state)),
        raw: x.raw,
        n_k: s.n_k as i32,
        n_v: s.n_v as i32,
        dk: s.dk as i32,
        dv: s.dv as i32,
        tokens: tokens as i32,
        n_sub: n_sub as i32,
    };
    // SAFETY: gdn_wy_prep(GdnWyArgs) by value (the struct mirrors the
    // kernel's); grid (n_sub, n_v), 256 threads; reads `tokens` conv and
    // gate rows (checked by gdn_chunk), writes n_v*n_sub blocks of the
    // scratch (its length checked above).
    unsafe {
        gpu.launch(
            "gdn_wy_prep",
            crate::device::cfg((n_sub as u32, s.n_v as u32), 256),
            &[&args],
        )
    }?;
    let smem = wy_state_smem_bytes(s.dk);
    gpu.func(kernel)?.set_attribute(
        cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
        smem as i32,
    )?;
    let cfg = cudarc::driver::LaunchConfig {
        grid_dim: ((s.dv / WY_COLS) as u32, s.n_v as u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: smem as u32,
    };
    // SAFETY: gdn_wy_state_k{dk}(GdnWyArgs) by value; grid (dv/32, n_v),
    // 256 threads, the dynamic shared memory its buffers take (allowed by
    // the attribute set above; the variant matches dk: wy_state_kernel);
    // reads the scratch gdn_wy_prep wrote, updates the state (n_v*dk*dv)
    // and writes `tokens` rows of n_v*dv at raw.
    unsafe { gpu.launch(kernel, cfg, &[&args]) }
}
