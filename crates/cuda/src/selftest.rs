//! `redlite selftest`: every kernel against a float64 CPU reference on
//! fresh random inputs at several sizes, outputs poisoned with NaN first.

use crate::device::Gpu;
use crate::gemv::{kernel_name, DeviceMatrix, ExpertStack};
use crate::layout::{layout, GEMV_TYPES};
use crate::testdata::{random_vec, random_weights, reference_gemv, Rng};
use anyhow::Result;

/// Gate: max|gpu - ref| / max|ref| over one case.
pub const REL_TOL: f64 = 1e-4;

/// One kernel's worst case over all its sizes.
#[derive(Debug, Clone)]
pub struct Worst {
    pub kernel: String,
    pub cases: usize,
    pub max_abs: f64,
    pub max_rel: f64,
    pub all_written: bool,
}

impl Worst {
    pub fn ok(&self) -> bool {
        self.all_written && self.max_rel < REL_TOL
    }
}

fn compare(gpu_y: &[f32], want: &[f64]) -> (f64, f64, bool) {
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

fn fold(w: &mut Worst, (a, r, ok): (f64, f64, bool)) {
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
        for nr in [1u32, 2, 4] {
            let mut worst = Worst {
                kernel: kernel_name(ty, nr)?,
                cases: 0,
                max_abs: 0.0,
                max_rel: 0.0,
                all_written: true,
            };
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
    Ok(out)
}

/// Print the table; returns whether every kernel passed.
pub fn print(gpu: &Gpu, rows: &[Worst]) -> bool {
    println!(
        "# redlite selftest on {} (NVRTC + load {:.2} s)",
        gpu.name, gpu.compile_s
    );
    println!("| kernel | cases | worst abs err | worst rel err | verdict |");
    println!("|---|---:|---:|---:|---|");
    let mut all = true;
    for w in rows {
        all &= w.ok();
        println!(
            "| {} | {} | {:.3e} | {:.3e} | {} |",
            w.kernel,
            w.cases,
            w.max_abs,
            w.max_rel,
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
        "rel err = max|gpu - f64 ref| / max|ref| per case (gate {REL_TOL:e}); cases include 2 routed-expert launches (slots, shared and per-expert x)"
    );
    all
}
