//! Launches of `kernels/deltanet.cu`: the fused Gated DeltaNet step and
//! its shapes.

use super::q8ptrs;
use crate::device::{at_ptr, cfg, dptr, At, Gpu};
use crate::error::{ensure, Result};
use crate::gemv::Q8Vec;
use cudarc::driver::CudaSlice;

/// Shapes of one Gated DeltaNet layer on the device.
#[derive(Clone, Copy, Debug)]
pub struct GdnDims {
    pub n_k: usize,
    pub n_v: usize,
    pub dk: usize,
    pub dv: usize,
    pub conv_kernel: usize,
}

/// Threads of a `gdn_step_c*` block (`GDN_THREADS`).
pub const GDN_THREADS: usize = 512;

/// The `gdn_step` variants (kernels/deltanet.cu), most blocks per value head
/// first: (blocks per head C = the cluster size, rows of the state a thread
/// holds at most, kernel). Each block owns dv / C columns of its head.
const GDN_SPLITS: [(usize, usize, &str); 3] = [
    (4, 8, "gdn_step_c4"),
    (2, 16, "gdn_step_c2"),
    (1, 32, "gdn_step_c1"),
];

impl GdnDims {
    pub fn key_dim(&self) -> usize {
        self.n_k * self.dk
    }
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.n_v * self.dv
    }
    pub fn state_len(&self) -> usize {
        self.n_v * self.dk * self.dv
    }
    /// The kernel for these shapes and its blocks per value head: the most
    /// blocks whose column slice is still whole warps of 32 (the int8
    /// output quantizes 32 consecutive columns in one warp) and whose
    /// threads can hold the dk rows; the one-block kernel otherwise.
    /// None: no variant fits.
    pub fn split(&self) -> Option<(usize, &'static str)> {
        GDN_SPLITS
            .iter()
            .find(|&&(c, maxr, _)| {
                let w = self.dv / c;
                let whole = c == 1 || (self.dv.is_multiple_of(c) && w.is_multiple_of(32));
                whole
                    && self.dv >= 1
                    && GDN_THREADS.is_multiple_of(w)
                    && self.dk <= GDN_THREADS / w * maxr
            })
            .map(|&(c, _, name)| (c, name))
    }
    pub fn check(&self) -> Result<()> {
        let s = self;
        ensure!(
            s.n_k >= 1 && s.n_v.is_multiple_of(s.n_k),
            "deltanet: {} key heads, {} value heads",
            s.n_k,
            s.n_v
        );
        ensure!(
            s.dv >= 1 && GDN_THREADS.is_multiple_of(s.dv) && s.dv <= 512,
            "deltanet: value head dim {} must divide {GDN_THREADS}",
            s.dv
        );
        ensure!(
            s.dk >= 1 && s.dk <= 256 && s.split().is_some(),
            "deltanet: key head dim {} too large for the device kernel",
            s.dk
        );
        ensure!((2..=8).contains(&s.conv_kernel), "deltanet: conv kernel");
        // The kernel indexes the ring with 32-bit ints.
        ensure!(
            s.conv_kernel * s.conv_dim() <= i32::MAX as usize,
            "deltanet: conv window too large"
        );
        Ok(())
    }
}

/// Per-layer weights of the DeltaNet step (f32, on the device).
pub struct GdnWeights<'a> {
    pub conv_w: &'a CudaSlice<f32>,
    pub dt_bias: &'a CudaSlice<f32>,
    pub ssm_a: &'a CudaSlice<f32>,
    pub norm_w: &'a CudaSlice<f32>,
}

/// One fused Gated DeltaNet step at position `*pos`: conv window `ring`
/// (`K x conv_dim`, position p in slot p % K), state (`n_v x dk x dv`);
/// `out` = gated-normed output (`n_v x dv`).
#[allow(clippy::too_many_arguments)]
pub fn gdn_step(
    gpu: &Gpu,
    s: &GdnDims,
    w: &GdnWeights,
    qkv: At,
    z: At,
    ba: At,
    ring: &CudaSlice<f32>,
    state: &CudaSlice<f32>,
    out: &CudaSlice<f32>,
    q8: Option<&Q8Vec>,
    pos: &CudaSlice<i32>,
    eps: f32,
    l2_eps: f32,
) -> Result<()> {
    s.check()?;
    ensure!(q8.is_none_or(|q| q.n >= s.n_v * s.dv && s.dv.is_multiple_of(32)));
    let (split, kernel) = s.split().expect("checked");
    let (qp, qdp) = q8ptrs(gpu, q8);
    let (cd, vd) = (s.conv_dim(), s.n_v * s.dv);
    ensure!(out.len() >= vd);
    let (qkvp, zp, bap) = (
        at_ptr(gpu, qkv, cd)?,
        at_ptr(gpu, z, vd)?,
        at_ptr(gpu, ba, 2 * s.n_v)?,
    );
    ensure!(ring.len() >= s.conv_kernel * cd && state.len() >= s.state_len());
    ensure!(w.conv_w.len() >= cd * s.conv_kernel && w.norm_w.len() >= s.dv);
    ensure!(w.dt_bias.len() >= s.n_v && w.ssm_a.len() >= s.n_v && !pos.is_empty());
    let p: [u64; 11] = [
        qkvp,
        zp,
        bap,
        dptr(gpu, Some(w.conv_w)),
        dptr(gpu, Some(w.dt_bias)),
        dptr(gpu, Some(w.ssm_a)),
        dptr(gpu, Some(w.norm_w)),
        dptr(gpu, Some(ring)),
        dptr(gpu, Some(state)),
        dptr(gpu, Some(out)),
        dptr(gpu, Some(pos)),
    ];
    let d: [i32; 5] = [
        s.n_k as i32,
        s.n_v as i32,
        s.dk as i32,
        s.dv as i32,
        s.conv_kernel as i32,
    ];
    // SAFETY: gdn_step_c*(qkv, z, ba, conv_w, dt_bias, ssm_a, norm_w, ring,
    // state, out, q8, q8d, pos, n_k, n_v, dk, dv, K, eps, l2_eps); every buffer's
    // size is checked above against the shapes, and the shapes against the
    // kernel's limits (GdnDims::check, split); the grid is `split` blocks
    // per value head, a whole number of the kernel's compile-time clusters
    // of `split` blocks.
    unsafe {
        gpu.launch(
            kernel,
            cfg(((s.n_v * split) as u32, 1), GDN_THREADS as u32),
            &[
                &p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6], &p[7], &p[8], &p[9], &qp, &qdp,
                &p[10], &d[0], &d[1], &d[2], &d[3], &d[4], &eps, &l2_eps,
            ],
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(dk: usize, dv: usize) -> GdnDims {
        GdnDims {
            n_k: 2,
            n_v: 4,
            dk,
            dv,
            conv_kernel: 4,
        }
    }

    /// The most blocks per head whose column slice is whole warps and whose
    /// threads hold the rows; the selftest shapes reach every variant.
    #[test]
    fn gdn_split_picks_the_widest_kernel_that_fits() {
        let name = |dk, dv| dims(dk, dv).split().map(|s| s.1);
        assert_eq!(dims(128, 128).split(), Some((4, "gdn_step_c4")));
        assert_eq!(name(32, 128), Some("gdn_step_c4"));
        assert_eq!(name(64, 64), Some("gdn_step_c2"));
        assert_eq!(name(256, 64), Some("gdn_step_c2"));
        assert_eq!(name(128, 32), Some("gdn_step_c1"));
        assert_eq!(name(16, 16), Some("gdn_step_c1"));
        // dk 256 at dv 128: 8 rows x 16 per c4 block too few, c2 and c1 too
        assert_eq!(name(256, 128), None);
        assert!(dims(256, 128).check().is_err());
        // dv 256: 64 columns x 8 rows per c4 block (the old one-block
        // kernel's limit too)
        assert_eq!(name(64, 256), Some("gdn_step_c4"));
        assert_eq!(name(128, 256), None);
        assert!(dims(128, 128).check().is_ok());
    }
}
