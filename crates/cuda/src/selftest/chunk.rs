//! `redlite selftest`, part three: the prefill kernels (the GEMMs of every
//! format, dense and grouped through a routed tile list built on the host
//! or on the device; the chunk attention with its prep; the DeltaNet
//! chunk; the chunk top-k and combine; the device tile list itself,
//! [`super::routes`]) against the float64 references of
//! [`crate::reference`] and [`crate::testdata`], on random inputs, outputs
//! poisoned with NaN first.

use super::ops::{down, nan, scaled, up};
use crate::device::{dptr, Gpu};
use crate::error::Result;
use crate::gemv::{route_tiles, DeviceMatrix, ExpertStack, GemmIn, GemmOut, KSplit, TileCount};
use crate::layout::{layout, GEMV_TYPES};
use crate::ops::{
    self, f16_round, AttnDims, GdnChunkScratch, GdnDims, GdnForm, GdnWeights, KvCache, KvType, Rows,
};
use crate::reference::{self as r, GdnShape, GdnStepInputs};
use crate::selftest::{compare, fold, Worst, REL_TOL};
use crate::testdata::{random_vec, random_weights, reference_gemv, reference_gemv_bounded, Rng};
use redlite_gguf::GgmlType;

/// Gate of the f16 tensor-core attention against the f64 reference (f16
/// Q, K, V and P).
pub const F16_GEMM_TOL: f64 = 4e-3;

/// Gate of the f16 tensor-core GEMMs against the f64 product of the
/// dequantized weights and the f16-rounded activations, as the worst
/// |gpu - ref| / sum |w x| over the outputs: what is left is the weights'
/// own f16 rounding (a quantized value d*scale*q needs up to ~25 bits;
/// at most 2^-11 of each term, twice where the scale is rounded first)
/// and f32 accumulation. Relative to max |ref| instead, a case whose few
/// outputs cancel fails on correct code (gemm_q5_k's single-row case did
/// at 5.7e-3 when the random data moved). A wrong scale on one 32-value
/// block of a 2048-wide row is off by ~1.5% of the bound.
pub const F16_GEMM_BOUND_TOL: f64 = 2.5e-3;

/// `compare` against the per-output condition bound of
/// [`reference_gemv_bounded`]: (max abs, max |gpu - ref| / bound, all
/// finite).
fn compare_bounded(gpu_y: &[f32], (want, bound): &(Vec<f64>, Vec<f64>)) -> (f64, f64, bool) {
    let mut max_abs = 0f64;
    let mut max_rel = 0f64;
    let mut written = true;
    for ((&g, &w), &b) in gpu_y.iter().zip(want).zip(bound) {
        if !g.is_finite() {
            written = false;
            continue;
        }
        let e = (g as f64 - w).abs();
        max_abs = max_abs.max(e);
        max_rel = max_rel.max(e / b.max(1e-30));
    }
    (max_abs, max_rel, written)
}

fn rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| f16_round(v)).collect()
}

/// Every prefill kernel; rows appended to `out`.
pub fn run(gpu: &Gpu, rng: &mut Rng, out: &mut Vec<Worst>) -> Result<()> {
    gemm(gpu, rng, out)?;
    out.extend(attention(gpu, rng)?);
    out.push(deltanet(gpu, rng, GdnForm::Chunkwise)?);
    out.push(deltanet(gpu, rng, GdnForm::Sequential)?);
    out.push(route_combine(gpu, rng)?);
    out.push(super::routes::run(gpu, rng)?);
    Ok(())
}

fn gemm(gpu: &Gpu, rng: &mut Rng, out: &mut Vec<Worst>) -> Result<()> {
    for ty in GEMV_TYPES {
        let l = layout(ty)?;
        let variants: &[bool] = if ty == GgmlType::F32 {
            &[true, false]
        } else {
            &[false]
        };
        for &exact in variants {
            let name = crate::gemv::gemm_kernel(ty, exact)?;
            let mut w = Worst::new(format!("{name} (prefill GEMM, dense and grouped)"));
            if !exact {
                w.tol = F16_GEMM_BOUND_TOL;
            }
            let qk = l.qk.max(32);
            let shapes = [
                (1, qk, 1),
                (70, 4 * qk.max(128), 37),
                (130, 2048, 129),
                (64, 896.max(qk) / qk * qk, 64),
            ];
            // Both bodies of the tensor-core kernels on every shape: one
            // warp a 32-row group, and K split over four (the launch picks
            // one by the grid's size).
            let splits: &[KSplit] = if exact {
                &[KSplit::Auto]
            } else {
                &[KSplit::Force(1), KSplit::Force(4)]
            };
            for (&split, (rows, cols, n)) in splits
                .iter()
                .flat_map(|s| shapes.iter().map(move |sh| (s, *sh)))
            {
                if !cols.is_multiple_of(l.qk) {
                    continue;
                }
                let wb = random_weights(&l, rows, cols, rng);
                let m = DeviceMatrix::upload(gpu, ty, rows, cols, &wb)?;
                // Rows of cols + 4 floats: a row stride wider than the matrix.
                let ldx = cols + 4;
                let x = random_vec(n * ldx, rng);
                let xd = up(gpu, &x)?;
                let ldy = rows + 3;
                let yd = nan(gpu, n * ldy)?;
                m.gemm_split(
                    gpu,
                    exact,
                    n,
                    GemmIn {
                        x: dptr(gpu, Some(&xd)),
                        ldx,
                        gather: None,
                        f16: false,
                    },
                    GemmOut {
                        y: dptr(gpu, Some(&yd)),
                        ldy,
                    },
                    split,
                )?;
                let y = down(gpu, &yd)?;
                if !exact {
                    // The same product from f16 rows converted on the device
                    // (the prefill's path): the same f16 values into the
                    // same MMAs, so the same bits.
                    let xh = gpu.stream.alloc_zeros::<u16>(n * cols)?;
                    let xin = ops::to_f16_rows(gpu, Rows::new(&xd, 0, ldx), n, cols, &xh)?;
                    let yh = nan(gpu, n * ldy)?;
                    m.gemm_split(
                        gpu,
                        false,
                        n,
                        GemmIn {
                            x: xin,
                            ldx: cols,
                            gather: None,
                            f16: true,
                        },
                        GemmOut {
                            y: dptr(gpu, Some(&yh)),
                            ldy,
                        },
                        split,
                    )?;
                    let yh = down(gpu, &yh)?;
                    let differ = (0..n)
                        .flat_map(|p| (0..rows).map(move |r| p * ldy + r))
                        .filter(|&i| yh[i].to_bits() != y[i].to_bits())
                        .count();
                    if differ > 0 {
                        // Not wrong by itself (the gate below still holds
                        // it to the reference), but not expected either.
                        eprintln!(
                            "selftest: {name} {rows}x{cols} n={n}: the f16-input path differs from the f32 one in {differ} outputs"
                        );
                    }
                    for p in 0..n {
                        let xr = &x[p * ldx..][..cols];
                        let want = reference_gemv_bounded(ty, &wb, rows, cols, &rounded(xr));
                        fold(&mut w, compare_bounded(&yh[p * ldy..][..rows], &want));
                    }
                }
                for p in 0..n {
                    let xr = &x[p * ldx..][..cols];
                    let got = &y[p * ldy..][..rows];
                    if exact {
                        let want = reference_gemv(ty, &wb, rows, cols, xr);
                        fold(&mut w, compare(got, &want));
                    } else {
                        let want = reference_gemv_bounded(ty, &wb, rows, cols, &rounded(xr));
                        fold(&mut w, compare_bounded(got, &want));
                    }
                }
            }
            if !exact {
                grouped(gpu, ty, rng, &mut w, KSplit::Force(1))?;
                grouped(gpu, ty, rng, &mut w, KSplit::Force(4))?;
            }
            out.push(w);
        }
    }
    Ok(())
}

/// 70 tokens, 3 of 12 experts each (expert 4 by every token: more than
/// one tile), through the gather list: the host's tile list with f32 and
/// f16 rows, and the f16 rows again through the list built on the device
/// (its count in device memory, the grid over the bound, the tiles past
/// the count poisoned with one that would overwrite pairs 0..64 with an
/// expert no pair has).
fn grouped(gpu: &Gpu, ty: GgmlType, rng: &mut Rng, w: &mut Worst, split: KSplit) -> Result<()> {
    let l = layout(ty)?;
    let (rows, cols, n_slots, k, n) = (96, 2 * l.qk.max(256), 12, 3, 70);
    let mut stack = ExpertStack::new(gpu, ty, rows, cols, n_slots)?;
    let mut host = Vec::new();
    for s in 0..n_slots {
        let wb = random_weights(&l, rows, cols, rng);
        stack.upload(gpu, s, &wb)?;
        host.push(wb);
    }
    let mut experts = Vec::new();
    for _ in 0..n {
        let a = [1u32, 2, 3, 5][rng.below(4)];
        let b = 6 + rng.below(6) as u32;
        let mut e = [a, 4, b];
        e.sort();
        experts.extend(e);
    }
    let rt = route_tiles(&experts, k, n_slots)?;
    let x = random_vec(n * cols, rng);
    let (xd, td, gd) = (up(gpu, &x)?, up(gpu, &rt.tiles)?, up(gpu, &rt.gather)?);
    let np = n * k;
    let yd = nan(gpu, np * rows)?;
    stack.gemm_grouped_split(
        gpu,
        &td,
        TileCount::Host(rt.tiles.len() / 3),
        rt.max_expert,
        np,
        GemmIn {
            x: dptr(gpu, Some(&xd)),
            ldx: cols,
            gather: Some(dptr(gpu, Some(&gd))),
            f16: false,
        },
        GemmOut {
            y: dptr(gpu, Some(&yd)),
            ldy: rows,
        },
        split,
    )?;
    let y = down(gpu, &yd)?;
    // Again from f16 rows converted on the device (the prefill's path).
    let xh = gpu.stream.alloc_zeros::<u16>(n * cols)?;
    let xin = ops::to_f16_rows(gpu, Rows::new(&xd, 0, cols), n, cols, &xh)?;
    let yh = nan(gpu, np * rows)?;
    stack.gemm_grouped_split(
        gpu,
        &td,
        TileCount::Host(rt.tiles.len() / 3),
        rt.max_expert,
        np,
        GemmIn {
            x: xin,
            ldx: cols,
            gather: Some(dptr(gpu, Some(&gd))),
            f16: true,
        },
        GemmOut {
            y: dptr(gpu, Some(&yh)),
            ldy: rows,
        },
        split,
    )?;
    let yh = down(gpu, &yh)?;
    let bound = ops::max_route_tiles(np, n_slots);
    let poison: Vec<i32> = (0..bound).flat_map(|_| [0, 0, 64]).collect();
    let (ed, tdd) = (up(gpu, &experts)?, up(gpu, &poison)?);
    let (gdd, pdd, cdd) = (
        up(gpu, &vec![0i32; np])?,
        up(gpu, &vec![0i32; np])?,
        up(gpu, &[0i32])?,
    );
    let routes = ops::DeviceRoutes {
        tiles: &tdd,
        gather: &gdd,
        pair_of: &pdd,
        count: &cdd,
    };
    let bound = ops::route_tiles_device(gpu, &ed, np, k, n_slots, &routes)?;
    let yv = nan(gpu, np * rows)?;
    stack.gemm_grouped_split(
        gpu,
        &tdd,
        TileCount::Device { count: &cdd, bound },
        n_slots - 1,
        np,
        GemmIn {
            x: xin,
            ldx: cols,
            gather: Some(dptr(gpu, Some(&gdd))),
            f16: true,
        },
        GemmOut {
            y: dptr(gpu, Some(&yv)),
            ldy: rows,
        },
        split,
    )?;
    let yv = down(gpu, &yv)?;
    let pair_of_dev = gpu.stream.clone_dtoh(&pdd)?;
    let differ = yv
        .iter()
        .zip(&yh)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count();
    if differ > 0 {
        // A pair's product does not depend on its tile's other pairs, so
        // any list gives the same bits; the gate below still holds each
        // output to the reference.
        eprintln!(
            "selftest: {ty:?} grouped GEMM: the device tile list's outputs differ from the host list's in {differ}"
        );
    }
    for (j, &e) in experts.iter().enumerate() {
        let p = rt.pair_of[j] as usize;
        let xr = rounded(&x[(j / k) * cols..][..cols]);
        let want = reference_gemv_bounded(ty, &host[e as usize], rows, cols, &xr);
        fold(w, compare_bounded(&y[p * rows..][..rows], &want));
        fold(w, compare_bounded(&yh[p * rows..][..rows], &want));
        let pv = pair_of_dev[j].clamp(0, np as i32 - 1) as usize;
        fold(w, compare_bounded(&yv[pv * rows..][..rows], &want));
    }
    Ok(())
}

fn attention(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Worst>> {
    let shapes = [
        AttnDims {
            n_head: 16,
            n_kv: 2,
            hd: 256,
            n_rot: 64,
            gated: true,
        },
        AttnDims {
            n_head: 14,
            n_kv: 2,
            hd: 64,
            n_rot: 64,
            gated: false,
        },
        AttnDims {
            n_head: 8,
            n_kv: 4,
            hd: 128,
            n_rot: 32,
            gated: false,
        },
    ];
    let base = 1e6f32 as f64;
    let mut rows = Vec::new();
    // split 0: the warp kernel; 1..: the flash kernel with its keys split
    // that many ways (16 is FLASH_MAX_SPLIT: most splits of the short
    // cases are empty, the rows they leave at m = -inf weigh nothing).
    for (ty, split) in [
        (KvType::F32, 0usize),
        (KvType::F16, 0),
        (KvType::F32, 1),
        (KvType::F16, 1),
        (KvType::F32, 3),
        (KvType::F16, 3),
        (KvType::F32, 16),
        (KvType::F16, 16),
    ] {
        let flash = split > 0;
        let mut w = Worst::new(format!(
            "{} + {} (prefill chunk: prep, causal attention over cache + chunk{})",
            ty.kernel("attn_prep_chunk", ""),
            ty.kernel(if flash { "attn_flash" } else { "attn_chunk" }, "_d*"),
            match split {
                0 => String::new(),
                1 => "; tensor cores, f16 Q/K/V/P".into(),
                n => format!("; tensor cores, keys split {n} ways + attn_flash_merge_d*"),
            }
        ));
        if ty == KvType::F16 || flash {
            // The stored K rows against the unrounded reference; the flash
            // kernel's f16 Q and P.
            w.tol = F16_GEMM_TOL;
        }
        for (si, a) in shapes.iter().enumerate() {
            let (nh, nkv, hd) = (a.n_head, a.n_kv, a.hd);
            let inv: Vec<f64> = (0..a.n_rot / 2)
                .map(|i| base.powf(-(2.0 * i as f64) / a.n_rot as f64))
                .collect();
            let mut cases = vec![(0usize, 1usize), (0, 45), (300, 33), (70, 130)];
            if flash && si == 0 {
                // 64 tiles of keys: every split of 16 has some.
                cases.push((2000, 70));
            }
            for (p0, n) in cases {
                let ctx = p0 + n;
                // The cache before the chunk: random rows (as stored).
                let mut kc = rounded_if(ty, &random_vec(ctx * nkv * hd, rng));
                let mut vc = rounded_if(ty, &random_vec(ctx * nkv * hd, rng));
                let qw = nh * hd * (1 + a.gated as usize);
                let ld = qw + 2 * nkv * hd;
                let proj = random_vec(n * ld, rng);
                let (qn, kn) = (scaled(hd, 0.5, 1.5, rng), scaled(hd, 0.5, 1.5, rng));
                let kv = KvCache::upload(gpu, ty, &kc, &vc)?;
                let (pd, qnd, knd, invd) = (
                    up(gpu, &proj)?,
                    up(gpu, &qn)?,
                    up(gpu, &kn)?,
                    up(gpu, &inv)?,
                );
                let (qd, od) = (nan(gpu, n * nh * hd)?, nan(gpu, n * nh * hd)?);
                let qf = Rows::new(&pd, 0, ld);
                ops::attn_prep_chunk(
                    gpu,
                    a,
                    qf,
                    Rows::new(&pd, qw, ld),
                    Rows::new(&pd, qw + nkv * hd, ld),
                    Some((&qnd, &knd)),
                    &invd,
                    p0,
                    n,
                    Rows::new(&qd, 0, nh * hd),
                    &kv,
                    1e-6,
                )?;
                let scale = 1.0 / (hd as f32).sqrt();
                let part = nan(gpu, ops::flash_part_floats(a, n, split).max(1))?;
                let kernel = if flash {
                    ops::AttnKernel::Flash {
                        split,
                        part: Some(&part),
                    }
                } else {
                    ops::AttnKernel::Warp
                };
                ops::attn_chunk(
                    gpu,
                    a,
                    Rows::new(&qd, 0, nh * hd),
                    &kv,
                    a.gated.then_some(qf),
                    Rows::new(&od, 0, nh * hd),
                    p0,
                    n,
                    scale,
                    kernel,
                )?;
                let o = down(gpu, &od)?;
                let (kd, vd) = kv.download(gpu)?;
                // The reference: each token's prep, its K/V rows appended
                // (rounded as the cache stores them), then its attention.
                for t in 0..n {
                    let row = &proj[t * ld..][..ld];
                    let qs: Vec<f32> = row[..qw]
                        .chunks_exact(hd * (1 + a.gated as usize))
                        .flat_map(|h| h[..hd].to_vec())
                        .collect();
                    let gate: Option<Vec<f32>> = a.gated.then(|| {
                        row[..qw]
                            .chunks_exact(2 * hd)
                            .flat_map(|h| h[hd..].to_vec())
                            .collect()
                    });
                    let pos = p0 + t;
                    let q = r::norm_rope(&qs, Some(&qn), hd, a.n_rot, base, pos, 1e-6);
                    let k = r::norm_rope(
                        &row[qw..][..nkv * hd],
                        Some(&kn),
                        hd,
                        a.n_rot,
                        base,
                        pos,
                        1e-6,
                    );
                    let at = pos * nkv * hd..(pos + 1) * nkv * hd;
                    // The stored K row against the reference's (its own check).
                    fold(&mut w, compare(&kd[at.clone()], &k));
                    kc[at.clone()].copy_from_slice(&kd[at.clone()]);
                    vc[at.clone()]
                        .copy_from_slice(&rounded_if(ty, &row[qw + nkv * hd..][..nkv * hd]));
                    let qf32: Vec<f32> = q.iter().map(|&v| v as f32).collect();
                    let want = r::attention(
                        &qf32,
                        &kc,
                        &vc,
                        pos + 1,
                        nh,
                        nkv,
                        hd,
                        scale,
                        gate.as_deref(),
                    );
                    fold(&mut w, compare(&o[t * nh * hd..][..nh * hd], &want));
                }
                fold(
                    &mut w,
                    compare(&vd, &vc.iter().map(|&v| v as f64).collect::<Vec<_>>()),
                );
            }
        }
        rows.push(w);
    }
    Ok(rows)
}

fn rounded_if(ty: KvType, x: &[f32]) -> Vec<f32> {
    match ty {
        KvType::F32 => x.to_vec(),
        KvType::F16 => rounded(x),
    }
}

/// The chunk against `reference::gdn_step` token after token, from a
/// random state and window at position 5: every token's output, the final
/// state and the ring the decode step reads next; the recurrence in
/// `form` (the WY form's shapes; the sequential form also takes the
/// others).
fn deltanet(gpu: &Gpu, rng: &mut Rng, form: GdnForm) -> Result<Worst> {
    let recurrence = match form {
        GdnForm::Chunkwise => "gdn_wy_prep + gdn_wy_state_k*",
        GdnForm::Sequential => "gdn_recur_chunk_k*",
    };
    let mut w = Worst::new(format!(
        "gdn_conv_chunk + gdn_ring_chunk + gdn_qk_chunk + {recurrence} + gdn_norm_chunk (prefill chunk; outputs, state, ring)"
    ));
    let shapes = [
        GdnShape {
            n_k: 16,
            n_v: 32,
            dk: 128,
            dv: 128,
            conv_kernel: 4,
        },
        GdnShape {
            n_k: 2,
            n_v: 4,
            dk: 64,
            dv: 64,
            conv_kernel: 4,
        },
        GdnShape {
            n_k: 2,
            n_v: 4,
            dk: 128,
            dv: 32,
            conv_kernel: 5,
        },
    ];
    for s in shapes {
        let d = GdnDims {
            n_k: s.n_k,
            n_v: s.n_v,
            dk: s.dk,
            dv: s.dv,
            conv_kernel: s.conv_kernel,
        };
        let (cd, vd, k) = (d.conv_dim(), s.n_v * s.dv, s.conv_kernel);
        if form == GdnForm::Chunkwise && ops::wy_state_kernel(&d).is_none() {
            continue;
        }
        // Partial, whole and several WY sub-chunks of 64 tokens.
        for n in [1usize, 3, 21, 64, 65, 200] {
            let conv_w = scaled(cd * k, -0.5, 0.5, rng);
            let dt_bias = random_vec(s.n_v, rng);
            let ssm_a = scaled(s.n_v, -1.1, -0.1, rng);
            let norm_w = scaled(s.dv, 0.5, 1.5, rng);
            let st0 = scaled(d.state_len(), -0.5, 0.5, rng);
            let win0 = random_vec((k - 1) * cd, rng);
            let p0 = 5usize;
            let mut ring = vec![0f32; k * cd];
            for j in 0..k - 1 {
                let p = p0 + j + 1 - k;
                ring[(p % k) * cd..][..cd].copy_from_slice(&win0[j * cd..][..cd]);
            }
            // One projection row per token: qkv | z | ba, 8 floats of slack.
            let ld = cd + vd + 2 * s.n_v + 8;
            let proj = random_vec(n * ld, rng);
            let (cw, dtb, sa, nw) = (
                up(gpu, &conv_w)?,
                up(gpu, &dt_bias)?,
                up(gpu, &ssm_a)?,
                up(gpu, &norm_w)?,
            );
            let (ringd, std, pd) = (up(gpu, &ring)?, up(gpu, &st0)?, up(gpu, &proj)?);
            let (conv, raw, od) = (nan(gpu, n * cd)?, nan(gpu, n * vd)?, nan(gpu, n * vd)?);
            let wy = nan(gpu, ops::wy_scratch_floats(&d, n))?;
            let wts = GdnWeights {
                conv_w: &cw,
                dt_bias: &dtb,
                ssm_a: &sa,
                norm_w: &nw,
            };
            ops::gdn_chunk(
                gpu,
                &d,
                &wts,
                Rows::new(&pd, 0, ld),
                Rows::new(&pd, cd, ld),
                Rows::new(&pd, cd + vd, ld),
                &ringd,
                &std,
                &GdnChunkScratch {
                    conv: &conv,
                    raw: &raw,
                    wy: Some(&wy),
                },
                &od,
                p0,
                n,
                1e-6,
                1e-6,
                form,
            )?;
            let o = down(gpu, &od)?;
            let mut win: Vec<f64> = win0.iter().map(|&v| v as f64).collect();
            let mut st: Vec<f64> = st0.iter().map(|&v| v as f64).collect();
            for t in 0..n {
                let row = &proj[t * ld..][..ld];
                let x = GdnStepInputs {
                    qkv: &row[..cd],
                    z: &row[cd..][..vd],
                    ba: &row[cd + vd..][..2 * s.n_v],
                    conv_w: &conv_w,
                    dt_bias: &dt_bias,
                    ssm_a: &ssm_a,
                    norm_w: &norm_w,
                };
                let want = r::gdn_step(&s, &x, &mut win, &mut st, 1e-6, 1e-6);
                fold(&mut w, compare(&o[t * vd..][..vd], &want));
            }
            fold(&mut w, compare(&down(gpu, &std)?, &st));
            // The ring after the chunk: the last K-1 inputs in their slots
            // (win holds them oldest first).
            let ring_after = down(gpu, &ringd)?;
            let end = p0 + n;
            for j in 0..k - 1 {
                let p = end + j + 1 - k;
                let want: Vec<f64> = win[j * cd..][..cd].to_vec();
                fold(&mut w, compare(&ring_after[(p % k) * cd..][..cd], &want));
            }
        }
    }
    Ok(w)
}

/// router_topk_chunk against `reference::route` per token, and
/// moe_combine_chunk against the f64 weighted sum (with a gated shared
/// expert).
fn route_combine(gpu: &Gpu, rng: &mut Rng) -> Result<Worst> {
    let mut w = Worst::new("router_topk_chunk + moe_combine_chunk (prefill chunk)".into());
    w.tol = REL_TOL;
    let (n_exp, k, d, n) = (512, 10, 256, 37);
    let ld = n_exp + 3;
    let logits: Vec<f32> = (0..n * ld).map(|_| 4.0 * rng.uniform()).collect();
    let ld_d = up(gpu, &logits)?;
    let (slots, experts) = (up(gpu, &vec![0u32; n * k])?, up(gpu, &vec![0u32; n * k])?);
    let wd = nan(gpu, n * k)?;
    ops::router_topk_chunk(
        gpu,
        Rows::new(&ld_d, 0, ld),
        n_exp,
        k,
        true,
        n,
        &slots,
        &experts,
        &wd,
    )?;
    gpu.sync()?;
    let (ex, wts) = (gpu.stream.clone_dtoh(&experts)?, down(gpu, &wd)?);
    for t in 0..n {
        let want = r::route(&logits[t * ld..][..n_exp], k, true);
        let ids: Vec<u32> = want.iter().map(|e| e.0).collect();
        w.all_written &= ex[t * k..][..k] == ids[..];
        let ww: Vec<f64> = want.iter().map(|e| e.1).collect();
        fold(&mut w, compare(&wts[t * k..][..k], &ww));
    }
    let rt = route_tiles(&ex, k, n_exp)?;
    let np = n * k;
    let ys = random_vec(np * d, rng);
    let x0 = random_vec(n * d, rng);
    let sh = random_vec(n * d, rng);
    let (xd, ysd, pd) = (up(gpu, &x0)?, up(gpu, &ys)?, up(gpu, &rt.pair_of)?);
    let shd = up(gpu, &sh)?;
    ops::moe_combine_chunk(
        gpu,
        &xd,
        &ysd,
        &pd,
        np,
        &wd,
        k,
        d,
        n,
        Some(ops::SharedRows {
            out: &shd,
            logit: Some(Rows::new(&ld_d, 1, ld)),
        }),
    )?;
    let x = down(gpu, &xd)?;
    for t in 0..n {
        let sg = 1.0 / (1.0 + (-(logits[t * ld + 1] as f64)).exp());
        let want: Vec<f64> = (0..d)
            .map(|j| {
                let mut acc = x0[t * d + j] as f64 + sh[t * d + j] as f64 * sg;
                for i in 0..k {
                    let p = rt.pair_of[t * k + i] as usize;
                    acc += wts[t * k + i] as f64 * ys[p * d + j] as f64;
                }
                acc
            })
            .collect();
        fold(&mut w, compare(&x[t * d..][..d], &want));
    }
    Ok(w)
}
