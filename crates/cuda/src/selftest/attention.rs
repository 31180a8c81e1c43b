//! Decode attention against the float64 reference: the split-K kernels
//! and their merge over f32 and f16 KV caches, short contexts of several
//! head layouts and the long rows (64K to 256K positions, a planted
//! peak so the softmax is not flat).

use super::chunk::F16_GEMM_TOL;
use super::ops::{check_q8, down, nan, up};
use crate::device::Gpu;
use crate::error::Result;
use crate::gemv::Q8Vec;
use crate::ops::{self, f16_round, AttnDims, AttnScratch, KvCache, KvType};
use crate::reference as r;
use crate::selftest::{compare, fold, Worst};
use crate::testdata::{random_vec, Rng};

pub(super) fn attention(gpu: &Gpu, rng: &mut Rng, q8w: &mut Worst) -> Result<Vec<Worst>> {
    let mut rows = Vec::new();
    let shapes = [
        AttnDims {
            n_head: 16,
            n_kv: 2,
            hd: 256,
            n_rot: 64,
            gated: true,
        },
        AttnDims {
            n_head: 4,
            n_kv: 2,
            hd: 64,
            n_rot: 16,
            gated: true,
        },
        AttnDims {
            n_head: 8,
            n_kv: 8,
            hd: 128,
            n_rot: 128,
            gated: false,
        },
        AttnDims {
            n_head: 12,
            n_kv: 2,
            hd: 128,
            n_rot: 32,
            gated: false,
        },
        // Qwen2.5-0.5B's: a group of 7 (the f16 kernel's blocks take all 7).
        AttnDims {
            n_head: 14,
            n_kv: 2,
            hd: 64,
            n_rot: 64,
            gated: false,
        },
    ];
    // Every shape with both cache types; for f16 the reference takes K and V
    // rounded as the cache stores them (the kernel widens them exactly), so
    // the same tolerance holds.
    for (a, ty) in shapes
        .into_iter()
        .flat_map(|a| [KvType::F32, KvType::F16].map(|t| (a, t)))
    {
        let lens: &[usize] = if a.hd == 256 {
            &[1, 7, 100, 1000, 4097, 32768]
        } else {
            &[1, 33, 1000, 5000]
        };
        let mut w = Worst::new(format!(
            "{} + attn_merge ({}q/{}kv x {}, {} KV, n up to {})",
            attn_kernel(&a, ty),
            a.n_head,
            a.n_kv,
            a.hd,
            ty.name(),
            lens.last().unwrap()
        ));
        gate_f16(&mut w, ty);
        for &n in lens {
            for nsplit in [ops::default_nsplit(&a, ty, gpu.sms), 1, 37] {
                attention_case(gpu, rng, &a, ty, n, nsplit, false, &mut w, q8w)?;
                if n > 4097 {
                    break; // one split count at the longest length (the f64 reference is slow)
                }
            }
        }
        rows.push(w);
    }
    // Qwen3-Next's shape at the lengths its training covers (262,144), one
    // row per length so each worst error shows. Random keys make the
    // softmax nearly flat at these lengths, which hides lost rows; planted
    // keys aligned with the query near the start, the middle and the end
    // put peaks that a kernel skipping or double-counting a slice misses.
    let qwen = shapes[0];
    for n in LONG_ATTENTION_LENS {
        for ty in [KvType::F32, KvType::F16] {
            let mut w = Worst::new(format!(
                "{} + attn_merge (16q/2kv x 256, {} KV, n {n}, planted peaks)",
                attn_kernel(&qwen, ty),
                ty.name()
            ));
            gate_f16(&mut w, ty);
            let nsplit = ops::default_nsplit(&qwen, ty, gpu.sms);
            attention_case(gpu, rng, &qwen, ty, n, nsplit, true, &mut w, q8w)?;
            rows.push(w);
        }
    }
    Ok(rows)
}

/// The decode attention's long-context lengths checked (64K, 128K and the
/// trained 262,144).
pub const LONG_ATTENTION_LENS: [usize; 3] = [65536, 131072, 262144];

/// The f16 caches' kernel rounds Q and P to f16 for its tensor cores
/// (llama.cpp's tensor-core attention does the same): the prefill flash
/// kernel's gate, not the f32-math REL_TOL.
fn gate_f16(w: &mut Worst, ty: KvType) {
    if ty == KvType::F16 {
        w.tol = F16_GEMM_TOL;
    }
}

fn attn_kernel(a: &AttnDims, ty: KvType) -> String {
    ops::split_kernel(a, ty)
}

/// One decode attention over `n` random cached rows (with `peaks`, a few
/// rows planted to score high) against the float64 reference.
#[allow(clippy::too_many_arguments)]
fn attention_case(
    gpu: &Gpu,
    rng: &mut Rng,
    a: &AttnDims,
    ty: KvType,
    n: usize,
    nsplit: usize,
    peaks: bool,
    w: &mut Worst,
    q8w: &mut Worst,
) -> Result<()> {
    let hd = a.hd;
    let qf = random_vec(a.n_head * hd * 2, rng);
    let q: Vec<f32> = random_vec(a.n_head * hd, rng)
        .iter()
        .map(|v| v * 3.0)
        .collect();
    let (mut k, mut v) = (
        random_vec(n * a.n_kv * hd, rng),
        random_vec(n * a.n_kv * hd, rng),
    );
    if peaks {
        // Each KV head's planted key is the mean of its query heads' rows,
        // scaled so its score (~18) stands far above the random keys'
        // (spread ~1, so ~5 at most over 262,144 rows): the three peaks
        // carry nearly all the softmax mass.
        let group = a.n_head / a.n_kv;
        for p in [3, n / 2 + 1, n - 2] {
            for kvh in 0..a.n_kv {
                let row = &mut k[(p * a.n_kv + kvh) * hd..][..hd];
                for (j, x) in row.iter_mut().enumerate() {
                    let mean: f32 = (0..group)
                        .map(|g| q[(kvh * group + g) * hd + j])
                        .sum::<f32>()
                        / group as f32;
                    *x = mean * 3.0;
                }
            }
        }
    }
    if ty == KvType::F16 {
        for x in k.iter_mut().chain(v.iter_mut()) {
            *x = f16_round(*x);
        }
    }
    let gate: Vec<f32> = qf
        .chunks_exact(2 * hd)
        .flat_map(|h| h[hd..].to_vec())
        .collect();
    let scale = 1.0 / (hd as f32).sqrt();
    let want = r::attention(
        &q,
        &k,
        &v,
        n,
        a.n_head,
        a.n_kv,
        hd,
        scale,
        a.gated.then_some(&gate[..]),
    );
    let (qd, qfd) = (up(gpu, &q)?, up(gpu, &qf)?);
    let kv = KvCache::upload(gpu, ty, &k, &v)?;
    let posd = up(gpu, &[(n - 1) as i32])?;
    let sc = AttnScratch::new(gpu, a, nsplit)?;
    let od = nan(gpu, a.n_head * hd)?;
    let q8 = Q8Vec::new(gpu, a.n_head * hd)?;
    ops::attention(
        gpu,
        a,
        &qd,
        &kv,
        &posd,
        &sc,
        a.gated.then_some((&qfd, 0)),
        &od,
        Some(&q8),
        scale,
    )?;
    let o = down(gpu, &od)?;
    fold(w, compare(&o, &want));
    check_q8(gpu, &o, &q8, q8w)
}
