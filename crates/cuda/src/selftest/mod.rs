//! `redlite selftest`: every kernel against a float64 CPU reference on
//! fresh random inputs at several sizes, outputs poisoned with NaN first.
//! The GEMVs here; [`ops`] the other decode kernels, [`expert_cache`] the
//! bounded cache's plan and fetch.

pub mod attention;
pub mod chunk;
pub mod expert_cache;
pub mod ops;
pub mod routes;

use crate::device::Gpu;
use crate::error::Result;
use crate::gemv::{
    kernel_name, q8_label, DeviceMatrix, ExpertStack, Q8Variant, Q8Vec, Variant, Q8_TYPES,
};
use crate::layout::{layout, GEMV_TYPES};
use crate::testdata::{
    quantize_q8_32, random_vec, random_weights, reference_gemv, reference_gemv_f64, Rng,
};
use cudarc::driver::CudaSlice;
use redlite_gguf::GgmlType;

/// Gate: max|gpu - ref| / max|ref| over one case.
pub const REL_TOL: f64 = 1e-4;
/// Gate of the int8-activation kernels against the pure-f32 reference
/// (x not quantized). A sanity gate (a wrong scale or sign gives ~1): int8
/// x costs 0.6-1.9e-2 of max|y| at worst on the selftest's cases (H200,
/// 2026-11-30; the worst are the 1-row cases, where max|y| is one value).
/// 1-row cases are left out of it: on the host, 1x256 draws exceed 5e-2 in
/// ~5% of cases for every format (max|y| cancels), 7x512 reach 3.3e-2 at
/// worst in 3000. Precision is gated by REL_TOL against the
/// device-quantized x.
pub const Q8_VS_F32_TOL: f64 = 5e-2;

/// One kernel's worst case over all its sizes.
#[derive(Debug, Clone)]
pub struct Worst {
    pub kernel: String,
    pub cases: usize,
    pub max_abs: f64,
    pub max_rel: f64,
    pub all_written: bool,
    /// Gate on `max_rel`.
    pub tol: f64,
    /// Int8 kernels: worst rel err against the f64 reference with the
    /// unquantized f32 x (the selftest's main reference uses x as the
    /// device quantized it).
    pub vs_f32: Option<f64>,
}

impl Worst {
    pub(crate) fn new(kernel: String) -> Self {
        Self {
            kernel,
            cases: 0,
            max_abs: 0.0,
            max_rel: 0.0,
            all_written: true,
            tol: REL_TOL,
            vs_f32: None,
        }
    }
    pub fn ok(&self) -> bool {
        self.all_written && self.max_rel < self.tol && self.vs_f32.is_none_or(|v| v < Q8_VS_F32_TOL)
    }
}

pub(crate) fn compare(gpu_y: &[f32], want: &[f64]) -> (f64, f64, bool) {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    let mut max_abs = 0f64;
    let mut written = true;
    for (&g, &w) in gpu_y.iter().zip(want) {
        if !g.is_finite() {
            written = false;
            continue;
        }
        max_abs = max_abs.max((g as f64 - w).abs());
    }
    (max_abs, max_abs / scale, written)
}

pub(crate) fn fold(w: &mut Worst, (a, r, ok): (f64, f64, bool)) {
    w.cases += 1;
    w.max_abs = w.max_abs.max(a);
    w.max_rel = w.max_rel.max(r);
    w.all_written &= ok;
}

/// Sizes (rows, cols) per block size: odd row counts, one-block rows, the
/// model's shapes.
fn sizes(qk: usize) -> Vec<(usize, usize)> {
    let mut v = vec![
        (1, 256),
        (7, 512),
        (33, 1024),
        (512, 2048),
        (2048, 4096),
        (4097, 2048),
    ];
    if qk == 32 {
        v.extend([(5, 32), (9, 96)]);
    }
    v
}

/// Run every GEMV kernel (plain and through expert slots) and return the
/// worst error per kernel.
pub fn run(gpu: &Gpu, seed: u64) -> Result<Vec<Worst>> {
    let mut rng = Rng(seed);
    let mut out = Vec::new();
    for ty in GEMV_TYPES {
        let l = layout(ty)?;
        for nr in Variant::ALL {
            let mut worst = Worst::new(kernel_name(ty, nr)?);
            for (rows, cols) in sizes(l.qk) {
                let w = random_weights(&l, rows, cols, &mut rng);
                let x = random_vec(cols, &mut rng);
                let want = reference_gemv(ty, &w, rows, cols, &x);
                let m = DeviceMatrix::upload(gpu, ty, rows, cols, &w)?;
                let xd = gpu.stream.clone_htod(&x)?;
                let mut yd = gpu.stream.clone_htod(&vec![f32::NAN; rows])?;
                m.gemv(gpu, &xd, &mut yd, nr)?;
                gpu.sync()?;
                fold(&mut worst, compare(&gpu.stream.clone_dtoh(&yd)?, &want));
            }
            // Routed experts through the slot table: 12 slots, 5 routed
            // (one twice), shared x (gate/up) and one x per expert (down).
            let (rows, cols, n_slots) = (96, 2 * l.qk.max(256), 12);
            let mut stack = ExpertStack::new(gpu, ty, rows, cols, n_slots)?;
            let mut host = Vec::new();
            for s in 0..n_slots {
                let w = random_weights(&l, rows, cols, &mut rng);
                stack.upload(gpu, s, &w)?;
                host.push(w);
            }
            let routed: Vec<u32> = vec![11, 0, 5, 5, 7];
            let sd = gpu.stream.clone_htod(&routed)?;
            for per_expert_x in [false, true] {
                let x_stride = if per_expert_x { cols } else { 0 };
                let x = random_vec(cols * routed.len(), &mut rng);
                let xd = gpu.stream.clone_htod(&x)?;
                let mut yd = gpu
                    .stream
                    .clone_htod(&vec![f32::NAN; rows * routed.len()])?;
                stack.gemv(gpu, &sd, routed.len(), &xd, x_stride, &mut yd, nr)?;
                gpu.sync()?;
                let y = gpu.stream.clone_dtoh(&yd)?;
                for (i, &s) in routed.iter().enumerate() {
                    let xi = &x[i * x_stride..][..cols];
                    let want = reference_gemv(ty, &host[s as usize], rows, cols, xi);
                    fold(&mut worst, compare(&y[i * rows..][..rows], &want));
                }
            }
            out.push(worst);
        }
    }
    run_q8(gpu, &mut rng, &mut out)?;
    ops::run(gpu, &mut rng, &mut out)?;
    chunk::run(gpu, &mut rng, &mut out)?;
    Ok(out)
}

/// Quantize `x` on the device; returns the Q8Vec and x as the device
/// quantized it (q * d, exact in f64), after checking q and d against
/// [`quantize_q8_32`] (d equal, q within 1) into `qw`.
fn device_q8(gpu: &Gpu, x: &[f32], qw: &mut Worst) -> Result<(Q8Vec, Vec<f64>)> {
    let xd = gpu.stream.clone_htod(x)?;
    let mut v = Q8Vec::new(gpu, x.len())?;
    v.quantize(gpu, &xd)?;
    gpu.sync()?;
    let q = gpu.stream.clone_dtoh(&v.q)?;
    let d = gpu.stream.clone_dtoh(&v.d)?;
    let (cq, cd) = quantize_q8_32(x);
    let dq = q
        .iter()
        .zip(&cq)
        .map(|(&a, &b)| (a as i32 - b as i32).abs())
        .max()
        .unwrap_or(0);
    let dd = d
        .iter()
        .zip(&cd)
        .map(|(&a, &b)| ((a - b) as f64).abs() / (b as f64).max(1e-30))
        .fold(0f64, |w, d| if d.is_nan() || d > w { d } else { w });
    qw.cases += 1;
    qw.max_abs = qw.max_abs.max(dq as f64);
    qw.max_rel = qw.max_rel.max(dd);
    qw.all_written &= dq <= 1;
    let xq = q
        .iter()
        .enumerate()
        .map(|(i, &qi)| qi as f64 * d[i / 32] as f64)
        .collect();
    Ok((v, xq))
}

/// Every int8-activation kernel configuration.
pub fn q8_variants() -> Vec<(GgmlType, Q8Variant)> {
    let mut v = Vec::new();
    for ty in Q8_TYPES {
        for smem_grid in [false, true] {
            if smem_grid && ty != GgmlType::IQ2_XXS {
                continue;
            }
            for nr in [1, 2, 4] {
                v.push((
                    ty,
                    Q8Variant {
                        nr,
                        smem_grid,
                        max_lanes: 32,
                    },
                ));
            }
            // The lanes cap (`REDLITE_CUDA_Q8_LANES`): each lane walks more
            // chunks of a row.
            for max_lanes in [16, 8] {
                v.push((
                    ty,
                    Q8Variant {
                        nr: 2,
                        smem_grid,
                        max_lanes,
                    },
                ));
            }
        }
    }
    v
}

/// The int8-activation kernels (every format of [`Q8_TYPES`], every
/// variant of [`q8_variants`]): plain, routed experts (shared and
/// per-expert x) and gate+up fused, against the f64 reference on the
/// device-quantized x (gate REL_TOL) and on the f32 x (Q8_VS_F32_TOL).
fn run_q8(gpu: &Gpu, rng: &mut Rng, out: &mut Vec<Worst>) -> Result<()> {
    // quantize_q8_32: max_abs = worst |q_gpu - q_cpu| (<= 1 allowed:
    // round-half ties), max_rel = worst relative difference of d.
    let mut qw = Worst::new("quantize_q8_32".into());
    qw.tol = 1e-6;
    let fold2 = |w: &mut Worst, y: &[f32], want_q: &[f64], want_f: &[f64]| {
        fold(w, compare(y, want_q));
        let r = compare(y, want_f).1;
        w.vs_f32 = Some(w.vs_f32.unwrap_or(0.0).max(r));
    };
    for (ty, nr) in q8_variants() {
        let l = layout(ty)?;
        let mut worst = Worst::new(q8_label(ty, nr)?);
        worst.vs_f32 = Some(0.0);
        let mut sz = sizes(l.qk);
        sz.push((100, 768)); // 12 chunks per row: a partial second step
        for (rows, cols) in sz {
            let w = random_weights(&l, rows, cols, rng);
            let x = random_vec(cols, rng);
            let (xq, xqf) = device_q8(gpu, &x, &mut qw)?;
            let want_q = reference_gemv_f64(ty, &w, rows, cols, &xqf);
            let want_f = reference_gemv(ty, &w, rows, cols, &x);
            let m = DeviceMatrix::upload(gpu, ty, rows, cols, &w)?;
            let mut yd = gpu.stream.clone_htod(&vec![f32::NAN; rows])?;
            m.gemv_q8(gpu, &xq, &mut yd, nr)?;
            gpu.sync()?;
            let y = gpu.stream.clone_dtoh(&yd)?;
            if rows > 1 {
                fold2(&mut worst, &y, &want_q, &want_f);
            } else {
                // One output may cancel to near zero, and its int8 error
                // relative to itself is then arbitrary (over 5e-2 in ~5% of
                // random draws, every format alike): gated on want_q only.
                fold(&mut worst, compare(&y, &want_q));
            }
        }
        // Routed experts (12 slots, 5 routed, one twice) for gate/up
        // (512 columns: 8 lanes per row) and down-like shapes.
        for (rows, cols) in [(96, 512), (40, 2048)] {
            let n_slots = 12;
            let mut gate = ExpertStack::new(gpu, ty, rows, cols, n_slots)?;
            let mut up = ExpertStack::new(gpu, ty, rows, cols, n_slots)?;
            let (mut hg, mut hu) = (Vec::new(), Vec::new());
            for s in 0..n_slots {
                let w = random_weights(&l, rows, cols, rng);
                gate.upload(gpu, s, &w)?;
                hg.push(w);
                let w = random_weights(&l, rows, cols, rng);
                up.upload(gpu, s, &w)?;
                hu.push(w);
            }
            let routed: Vec<u32> = vec![11, 0, 5, 5, 7];
            let n = routed.len();
            let sd = gpu.stream.clone_htod(&routed)?;
            for per_expert_x in [false, true] {
                let x_stride = if per_expert_x { cols } else { 0 };
                let x = random_vec(cols * n, rng);
                let (xq, xqf) = device_q8(gpu, &x, &mut qw)?;
                let mut yd: CudaSlice<f32> = gpu.stream.clone_htod(&vec![f32::NAN; rows * n])?;
                gate.gemv_q8(gpu, &sd, n, &xq, x_stride, &mut yd, nr)?;
                gpu.sync()?;
                let y = gpu.stream.clone_dtoh(&yd)?;
                for (i, &s) in routed.iter().enumerate() {
                    let w = &hg[s as usize];
                    let wq = reference_gemv_f64(ty, w, rows, cols, &xqf[i * x_stride..][..cols]);
                    let wf = reference_gemv(ty, w, rows, cols, &x[i * x_stride..][..cols]);
                    fold2(&mut worst, &y[i * rows..][..rows], &wq, &wf);
                }
            }
            // gate + up in one launch, shared x.
            let x = random_vec(cols, rng);
            let (xq, xqf) = device_q8(gpu, &x, &mut qw)?;
            let mut yd: CudaSlice<f32> = gpu.stream.clone_htod(&vec![f32::NAN; 2 * rows * n])?;
            ExpertStack::gemv_gate_up_q8(&gate, &up, gpu, &sd, n, &xq, &mut yd, nr)?;
            gpu.sync()?;
            let y = gpu.stream.clone_dtoh(&yd)?;
            for (i, &s) in routed.iter().enumerate() {
                for (k, host) in [&hg, &hu].into_iter().enumerate() {
                    let w = &host[s as usize];
                    let wq = reference_gemv_f64(ty, w, rows, cols, &xqf);
                    let wf = reference_gemv(ty, w, rows, cols, &x);
                    fold2(&mut worst, &y[(k * n + i) * rows..][..rows], &wq, &wf);
                }
            }
        }
        out.push(worst);
    }
    out.push(qw);
    Ok(())
}

/// Print the table; returns whether every kernel passed.
pub fn print(gpu: &Gpu, rows: &[Worst]) -> bool {
    println!(
        "# redlite selftest on {} (NVRTC + load {:.2} s)",
        gpu.name, gpu.compile_s
    );
    println!(
        "| kernel | cases | worst abs err | worst rel err | gate | rel err vs f32 x | verdict |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    let mut all = true;
    for w in rows {
        all &= w.ok();
        println!(
            "| {} | {} | {:.3e} | {:.3e} | {:.0e} | {} | {} |",
            w.kernel,
            w.cases,
            w.max_abs,
            w.max_rel,
            w.tol,
            w.vs_f32.map_or("-".to_string(), |v| format!("{v:.3e}")),
            if !w.all_written {
                "FAIL (unwritten/NaN output)"
            } else if w.ok() {
                "ok"
            } else {
                "FAIL"
            }
        );
    }
    println!(
        "rel err = max|gpu - f64 ref| / max|ref| per case (the f16 prefill GEMMs: max over outputs of |gpu - ref| / sum|w x|); cases include routed-expert launches (slots, shared and per-expert x). int8-activation kernels (*_q8*): ref on x as quantized by quantize_q8_32 (gate {REL_TOL:e}), and on the f32 x (gate {Q8_VS_F32_TOL:e}); quantize_q8_32: abs = worst |q - q_cpu| (<= 1), rel = worst d difference; route_tiles: abs = wrong entries of the worst case (0 passes)"
    );
    all
}
