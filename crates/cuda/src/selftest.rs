//! `redlite selftest`: every kernel against a float64 CPU reference on
//! fresh random inputs at several sizes, outputs poisoned with NaN first.

use crate::device::Gpu;
use crate::error::Result;
use crate::gemv::{
    kernel_name, q8_kernel_name, CombineInputs, DeviceMatrix, ExpertStack, NormTail, NormTailArgs,
    Q8Variant, Q8Vec, Variant, Q8_TYPES,
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
    crate::selftest_ops::run(gpu, &mut rng, &mut out)?;
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
        .fold(0f64, f64::max);
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
                v.push((ty, Q8Variant { nr, smem_grid }));
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
    let mut fused = Worst::new(
        "gate_up_swiglu_* (every format, nr) against gate|up + swiglu (abs: differing bits)".into(),
    );
    let mut fused_q = Worst::new("gate_up_swiglu_*: int8 output (abs: worst |q - q_cpu|)".into());
    let mut down_comb = Worst::new(
        "down_combine_* (every format, nr) against gemv_q8 + moe_combine_norm: x, h, int8 h (abs: differing values)"
            .into(),
    );
    for (ty, nr) in q8_variants() {
        let l = layout(ty)?;
        let mut worst = Worst::new(q8_kernel_name(ty, nr)?);
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
            // down + combine + next norm in one launch against the
            // two-launch path (gemv_q8 of the experts, then moe_combine
            // with the norm): x, h and the int8 h bit for bit.
            if rows % 32 == 0 {
                for shared in [false, true] {
                    let d = rows;
                    let x = random_vec(cols * n, rng);
                    let (xq, _) = device_q8(gpu, &x, &mut qw)?;
                    let res = random_vec(d, rng);
                    let wts: Vec<f32> = (0..n).map(|i| 0.05 + 0.1 * i as f32).collect();
                    let sh = random_vec(d, rng);
                    let logit = [0.0f32, 0.7];
                    let nw: Vec<f32> = random_vec(d, rng).iter().map(|v| 1.0 + 0.5 * v).collect();
                    let (wd, shd, ld, nwd) = (
                        gpu.stream.clone_htod(&wts)?,
                        gpu.stream.clone_htod(&sh)?,
                        gpu.stream.clone_htod(&logit)?,
                        gpu.stream.clone_htod(&nw)?,
                    );
                    let mut outs = Vec::new();
                    for fused_launch in [false, true] {
                        let mut xr = gpu.stream.clone_htod(&res)?;
                        let hd = gpu.stream.clone_htod(&vec![f32::NAN; d])?;
                        let hq = Q8Vec::new(gpu, d)?;
                        if fused_launch {
                            let tail = NormTail::new(
                                gpu,
                                &NormTailArgs {
                                    x: &xr,
                                    norm_w: &nwd,
                                    h: &hd,
                                    q8: Some(&hq),
                                    eps: 1e-6,
                                },
                                d,
                            )?;
                            let c = CombineInputs {
                                wts: &wd,
                                shared: shared.then_some(&shd),
                                shared_logit: shared.then_some((&ld, 1)),
                            };
                            // Twice on one tail, x reset in between: the
                            // second launch needs the block count reset.
                            for _launch in 0..2 {
                                gpu.stream.memcpy_htod(&res, &mut xr)?;
                                let args = NormTailArgs {
                                    x: &xr,
                                    norm_w: &nwd,
                                    h: &hd,
                                    q8: Some(&hq),
                                    eps: 1e-6,
                                };
                                gate.down_combine_q8(gpu, &sd, n, &xq, cols, &c, &tail, &args, nr)?;
                            }
                        } else {
                            let mut yd: CudaSlice<f32> =
                                gpu.stream.clone_htod(&vec![f32::NAN; d * n])?;
                            gate.gemv_q8(gpu, &sd, n, &xq, cols, &mut yd, nr)?;
                            crate::ops::moe_combine(
                                gpu,
                                &xr,
                                &yd,
                                &wd,
                                n,
                                d,
                                shared.then_some(&shd),
                                shared.then_some((&ld, 1)),
                                Some(crate::ops::NextNorm {
                                    w: &nwd,
                                    eps: 1e-6,
                                    h: &hd,
                                    q8: Some(&hq),
                                }),
                            )?;
                        }
                        gpu.sync()?;
                        outs.push((
                            gpu.stream.clone_dtoh(&xr)?,
                            gpu.stream.clone_dtoh(&hd)?,
                            gpu.stream.clone_dtoh(&hq.q)?,
                        ));
                    }
                    let bits = |a: &[f32], b: &[f32]| {
                        a.iter()
                            .zip(b)
                            .filter(|(p, q)| p.to_bits() != q.to_bits())
                            .count()
                    };
                    let diff = bits(&outs[0].0, &outs[1].0)
                        + bits(&outs[0].1, &outs[1].1)
                        + outs[0]
                            .2
                            .iter()
                            .zip(&outs[1].2)
                            .filter(|(p, q)| p != q)
                            .count();
                    fold(&mut down_comb, (diff as f64, 0.0, diff == 0));
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
            // gate + up + SwiGLU in one launch: the bits of the two-launch
            // path just checked (its gate|up output through ops::swiglu),
            // and its int8 output the CPU's quantization of its f32 one.
            if ExpertStack::can_gate_up_swiglu(&gate, &up) {
                let kf = n * rows;
                let want_d = gpu.stream.clone_htod(&vec![f32::NAN; kf])?;
                crate::ops::swiglu(gpu, (&yd, 0), (&yd, kf), &want_d, None, kf)?;
                let od = gpu.stream.clone_htod(&vec![f32::NAN; kf])?;
                let oq = Q8Vec::new(gpu, kf)?;
                ExpertStack::gate_up_swiglu_q8(&gate, &up, gpu, &sd, n, &xq, &od, &oq, nr)?;
                gpu.sync()?;
                let (want, got) = (gpu.stream.clone_dtoh(&want_d)?, gpu.stream.clone_dtoh(&od)?);
                let diff = got
                    .iter()
                    .zip(&want)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                fold(&mut fused, (diff as f64, 0.0, diff == 0));
                crate::selftest_ops::check_q8(gpu, &got, &oq, &mut fused_q)?;
            }
        }
        out.push(worst);
    }
    out.push(qw);
    out.push(fused);
    out.push(fused_q);
    out.push(down_comb);
    out.extend(norm_tail(gpu, rng)?);
    Ok(())
}

/// The residual add + RMSNorm finished by a GEMV's last block
/// (`gemv_q8_norm`), every int8 format and variant: y must equal the plain
/// GEMV's bit for bit, x the f32 sum x + y, h the f64 RMSNorm of that x
/// (REL_TOL), and the int8 h the CPU's quantization of the kernel's own h
/// (q within 1). Each case launches twice on one tail: the second launch
/// checks that the last block reset the block count.
fn norm_tail(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Worst>> {
    let mut w = Worst::new("gemv_q8 + residual add + RMSNorm tail (x, h; every format, nr)".into());
    let mut same = Worst::new("gemv_q8 norm tail: y against the plain launch (abs: bits)".into());
    let mut qw = Worst::new("gemv_q8 norm tail: int8 h (abs: worst |q - q_cpu|)".into());
    for (ty, nr) in q8_variants() {
        let l = layout(ty)?;
        for (rows, cols) in [(2048, 512), (2048, 4096), (96, 2048)] {
            let wt = random_weights(&l, rows, cols, rng);
            let m = DeviceMatrix::upload(gpu, ty, rows, cols, &wt)?;
            let x = random_vec(cols, rng);
            let xd = gpu.stream.clone_htod(&x)?;
            let mut xq = Q8Vec::new(gpu, cols)?;
            xq.quantize(gpu, &xd)?;
            let mut y0d = gpu.stream.clone_htod(&vec![f32::NAN; rows])?;
            m.gemv_q8(gpu, &xq, &mut y0d, nr)?;
            gpu.sync()?;
            let y0 = gpu.stream.clone_dtoh(&y0d)?;
            let res = random_vec(rows, rng);
            let norm_w: Vec<f32> = random_vec(rows, rng)
                .iter()
                .map(|v| 1.0 + 0.5 * v)
                .collect();
            let want_x: Vec<f32> = res.iter().zip(&y0).map(|(&a, &b)| a + b).collect();
            let (_, want_h) = crate::reference::rms_norm(&want_x, None, &norm_w, rows, 1e-6, false);
            let mut resd = gpu.stream.clone_htod(&res)?;
            let nwd = gpu.stream.clone_htod(&norm_w)?;
            let mut hd = gpu.stream.clone_htod(&vec![f32::NAN; rows])?;
            let hq = Q8Vec::new(gpu, rows)?;
            let tail = NormTail::new(
                gpu,
                &NormTailArgs {
                    x: &resd,
                    norm_w: &nwd,
                    h: &hd,
                    q8: Some(&hq),
                    eps: 1e-6,
                },
                rows,
            )?;
            for _launch in 0..2 {
                gpu.stream.memcpy_htod(&res, &mut resd)?;
                gpu.stream.memcpy_htod(&vec![f32::NAN; rows], &mut hd)?;
                let mut yd = gpu.stream.clone_htod(&vec![f32::NAN; rows])?;
                let args = NormTailArgs {
                    x: &resd,
                    norm_w: &nwd,
                    h: &hd,
                    q8: Some(&hq),
                    eps: 1e-6,
                };
                m.gemv_q8_norm(gpu, &xq, &mut yd, nr, &tail, &args)?;
                gpu.sync()?;
                let y = gpu.stream.clone_dtoh(&yd)?;
                let diff = y
                    .iter()
                    .zip(&y0)
                    .filter(|(a, b)| a.to_bits() != b.to_bits())
                    .count();
                fold(&mut same, (diff as f64, 0.0, diff == 0));
                let xs = gpu.stream.clone_dtoh(&resd)?;
                let wx: Vec<f64> = want_x.iter().map(|&v| v as f64).collect();
                fold(&mut w, compare(&xs, &wx));
                let h = gpu.stream.clone_dtoh(&hd)?;
                fold(&mut w, compare(&h, &want_h));
                crate::selftest_ops::check_q8(gpu, &h, &hq, &mut qw)?;
            }
        }
    }
    Ok(vec![w, same, qw])
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
        "rel err = max|gpu - f64 ref| / max|ref| per case; cases include routed-expert launches (slots, shared and per-expert x). int8-activation kernels (*_q8*): ref on x as quantized by quantize_q8_32 (gate {REL_TOL:e}), and on the f32 x (gate {Q8_VS_F32_TOL:e}); quantize_q8_32: abs = worst |q - q_cpu| (<= 1), rel = worst d difference"
    );
    all
}
