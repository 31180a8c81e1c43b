//! `redlite selftest`, part two: the decode kernels of [`crate::ops`]
//! against the float64 references of [`crate::reference`] on random inputs
//! at several sizes (the model's shapes and the tiny fixtures'), outputs
//! poisoned with NaN first.

use crate::device::Gpu;
use crate::error::Result;
use crate::gemv::{DeviceMatrix, Q8Vec};
use crate::ops::{self, f16_round, AttnDims, GdnDims, GdnWeights, KvCache, KvType};
use crate::reference::{self as r, GdnShape, GdnStepInputs};
use crate::selftest::{compare, fold, Worst};
use crate::testdata::{random_vec, reference_gemv, Rng};
use cudarc::driver::CudaSlice;
use redlite_gguf::GgmlType;

pub(super) fn up<T: cudarc::driver::DeviceRepr>(gpu: &Gpu, v: &[T]) -> Result<CudaSlice<T>> {
    Ok(gpu.stream.clone_htod(v)?)
}

pub(super) fn nan(gpu: &Gpu, n: usize) -> Result<CudaSlice<f32>> {
    up(gpu, &vec![f32::NAN; n])
}

pub(super) fn down(gpu: &Gpu, s: &CudaSlice<f32>) -> Result<Vec<f32>> {
    gpu.sync()?;
    Ok(gpu.stream.clone_dtoh(s)?)
}

pub(super) fn scaled(n: usize, lo: f32, hi: f32, rng: &mut Rng) -> Vec<f32> {
    (0..n)
        .map(|_| lo + (hi - lo) * 0.5 * (rng.uniform() + 1.0))
        .collect()
}

/// Every decode kernel; rows appended to `out`.
pub fn run(gpu: &Gpu, rng: &mut Rng, out: &mut Vec<Worst>) -> Result<()> {
    let mut q8w = Worst::new(
        "int8 outputs fused into rms_norm, swiglu, gdn_step, attn_merge (abs: worst |q - q_cpu|)"
            .into(),
    );
    out.push(rms_norm(gpu, rng)?);
    rms_norm_q8(gpu, rng, &mut q8w)?;
    out.extend(attn_prep(gpu, rng)?);
    out.extend(super::attention::attention(gpu, rng, &mut q8w)?);
    out.push(deltanet(gpu, rng, &mut q8w)?);
    out.push(router(gpu, rng)?);
    out.push(router_gemv(gpu, rng)?);
    out.push(elementwise(gpu, rng, &mut q8w)?);
    out.push(q8w);
    out.extend(super::expert_cache::run(gpu, rng)?);
    Ok(())
}

/// q and d of a fused int8 output against the CPU model of
/// quantize_q8_32 applied to the kernel's own f32 output (q within 1: a
/// rounding tie; rel = worst relative difference of d).
pub(super) fn check_q8(gpu: &Gpu, out: &[f32], q8: &Q8Vec, w: &mut Worst) -> Result<()> {
    gpu.sync()?;
    let (q, qd) = (gpu.stream.clone_dtoh(&q8.q)?, gpu.stream.clone_dtoh(&q8.d)?);
    let (cq, cd) = crate::testdata::quantize_q8_32(&out[..q8.n]);
    let dq = q
        .iter()
        .zip(&cq)
        .map(|(&a, &b)| (a as i32 - b as i32).abs())
        .max()
        .unwrap_or(0);
    let dd = qd
        .iter()
        .zip(&cd)
        .map(|(&a, &b)| ((a - b) as f64).abs() / (b as f64).max(1e-30))
        .fold(0f64, |w, d| if d.is_nan() || d > w { d } else { w });
    fold(w, (dq as f64, dd, dq <= 1));
    Ok(())
}

fn rms_norm(gpu: &Gpu, rng: &mut Rng) -> Result<Worst> {
    let mut w = Worst::new("rms_norm (+residual, (1+w))".into());
    // rms_norm_v8 up to 4096 (d % 8 == 0), rms_norm beyond or otherwise.
    for (rows, d) in [
        (1, 2048),
        (4, 256),
        (16, 64),
        (3, 4096),
        (32, 128),
        (2, 100),
        (1, 8192),
    ] {
        for (with_res, add_one) in [(false, false), (true, false), (false, true), (true, true)] {
            let x = random_vec(rows * d, rng);
            let res = random_vec(rows * d, rng);
            let wt = scaled(d, 0.5, 1.5, rng);
            let (xs, want) = r::rms_norm(&x, with_res.then_some(&res[..]), &wt, d, 1e-6, add_one);
            let (xd, rd, wd, od) = (
                up(gpu, &x)?,
                up(gpu, &res)?,
                up(gpu, &wt)?,
                nan(gpu, rows * d)?,
            );
            let rdo = with_res.then_some(&rd);
            ops::rms_norm(gpu, &xd, rdo, &wd, Some(&od), None, rows, d, 1e-6, add_one)?;
            fold(&mut w, compare(&down(gpu, &od)?, &want));
            fold(&mut w, compare(&down(gpu, &xd)?, &xs));
        }
    }
    Ok(w)
}

/// rms_norm with the int8 output fused: the f32 output against the f64
/// reference, q and d against the CPU model of quantize_q8_32 applied to
/// that output (abs = worst |q - q_cpu|, at most 1 at a rounding tie).
fn rms_norm_q8(gpu: &Gpu, rng: &mut Rng, w: &mut Worst) -> Result<()> {
    for (rows, d) in [(1, 2048), (4, 256), (2, 4096), (1, 8192)] {
        let x = random_vec(rows * d, rng);
        let wt = scaled(d, 0.5, 1.5, rng);
        let (_, want) = r::rms_norm(&x, None, &wt, d, 1e-6, false);
        let (xd, wd, od) = (up(gpu, &x)?, up(gpu, &wt)?, nan(gpu, rows * d)?);
        let q8 = Q8Vec::new(gpu, rows * d)?;
        ops::rms_norm(
            gpu,
            &xd,
            None,
            &wd,
            Some(&od),
            Some(&q8),
            rows,
            d,
            1e-6,
            false,
        )?;
        let out = down(gpu, &od)?;
        let (_, rel, ok) = compare(&out, &want);
        w.all_written &= ok && rel < 1e-4;
        check_q8(gpu, &out, &q8, w)?;
    }
    Ok(())
}

/// Bit-for-bit equality (NaN-safe).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The f32-cache kernel against the float64 reference; the f16-cache one
/// on the same inputs: its q and every value before the store are the same
/// f32 math, so q must equal the f32 variant's bit for bit and the stored k
/// and v must be exactly the f16 rounding (host `half`, nearest even) of
/// the f32 variant's k and of the input v (a mismatch fails the row as
/// "not all written").
fn attn_prep(gpu: &Gpu, rng: &mut Rng) -> Result<Vec<Worst>> {
    let mut w = Worst::new("attn_prep (q/k RMSNorm + partial RoPE + KV append)".into());
    let mut wh = Worst::new(
        "attn_prep_kvf16 (the same, K and V stored as f16: exact rounding of the f32 variant's)"
            .into(),
    );
    let shapes = [
        (
            AttnDims {
                n_head: 16,
                n_kv: 2,
                hd: 256,
                n_rot: 64,
                gated: true,
            },
            1e7,
        ),
        (
            AttnDims {
                n_head: 4,
                n_kv: 2,
                hd: 64,
                n_rot: 16,
                gated: true,
            },
            1e7,
        ),
        (
            AttnDims {
                n_head: 8,
                n_kv: 8,
                hd: 128,
                n_rot: 128,
                gated: false,
            },
            1e4,
        ),
    ];
    for (a, base) in shapes {
        let inv: Vec<f64> = (0..a.n_rot / 2)
            .map(|i| (base as f32 as f64).powf(-(2.0 * i as f64) / a.n_rot as f64))
            .collect();
        for pos in [0usize, 1, 1000, 70_000] {
            let (ctx, slot) = (pos + 1, pos);
            let qf = random_vec(a.n_head * a.hd * (1 + a.gated as usize), rng);
            let (k, v) = (
                random_vec(a.n_kv * a.hd, rng),
                random_vec(a.n_kv * a.hd, rng),
            );
            let (qn, kn) = (scaled(a.hd, 0.5, 1.5, rng), scaled(a.hd, 0.5, 1.5, rng));
            let q: Vec<f32> = qf
                .chunks_exact(a.hd * (1 + a.gated as usize))
                .flat_map(|h| h[..a.hd].to_vec())
                .collect();
            let want_q = r::norm_rope(&q, Some(&qn), a.hd, a.n_rot, base as f32 as f64, pos, 1e-6);
            let want_k = r::norm_rope(&k, Some(&kn), a.hd, a.n_rot, base as f32 as f64, pos, 1e-6);
            let inv_use = &inv;
            let (qfd, kd, vd) = (up(gpu, &qf)?, up(gpu, &k)?, up(gpu, &v)?);
            let (qnd, knd, invd) = (up(gpu, &qn)?, up(gpu, &kn)?, up(gpu, inv_use)?);
            let posd = up(gpu, &[slot as i32])?;
            let row = slot * a.n_kv * a.hd..(slot + 1) * a.n_kv * a.hd;
            let run = |ty: KvType| -> Result<(Vec<f32>, Vec<f32>, Vec<f32>)> {
                let qo = nan(gpu, a.n_head * a.hd)?;
                let kv = KvCache::new(gpu, ty, ctx * a.n_kv * a.hd)?;
                ops::attn_prep(
                    gpu,
                    &a,
                    (&qfd, 0),
                    (&kd, 0),
                    (&vd, 0),
                    Some((&qnd, &knd)),
                    &invd,
                    &posd,
                    &qo,
                    &kv,
                    1e-6,
                )?;
                let q = down(gpu, &qo)?;
                let (kc, vc) = kv.download(gpu)?;
                Ok((q, kc[row.clone()].to_vec(), vc[row.clone()].to_vec()))
            };
            let (q32, k32, v32) = run(KvType::F32)?;
            fold(&mut w, compare(&q32, &want_q));
            fold(&mut w, compare(&k32, &want_k));
            let vw: Vec<f64> = v.iter().map(|&x| x as f64).collect();
            fold(&mut w, compare(&v32, &vw));
            let (q16, k16, v16) = run(KvType::F16)?;
            let round = |x: &[f32]| -> Vec<f32> { x.iter().map(|&y| f16_round(y)).collect() };
            let (want_k16, want_v16) = (round(&k32), round(&v));
            let wide = |x: &[f32]| -> Vec<f64> { x.iter().map(|&y| y as f64).collect() };
            fold(&mut wh, compare(&q16, &want_q));
            fold(&mut wh, compare(&k16, &wide(&want_k16)));
            fold(&mut wh, compare(&v16, &wide(&want_v16)));
            wh.all_written &=
                same_bits(&q16, &q32) && same_bits(&k16, &want_k16) && same_bits(&v16, &want_v16);
        }
    }
    Ok(vec![w, wh])
}

fn deltanet(gpu: &Gpu, rng: &mut Rng, q8w: &mut Worst) -> Result<Worst> {
    let mut w = Worst::new(
        "gdn_step (conv+SiLU, L2 norms, gates, state, gated norm; out and state)".into(),
    );
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
            n_k: 4,
            n_v: 4,
            dk: 32,
            dv: 128,
            conv_kernel: 3,
        },
        // dv 32: the one-block-per-head kernel (gdn_step_c1); K 5: two
        // rounds of window tap loads.
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
        let conv_w = scaled(cd * k, -0.5, 0.5, rng);
        let dt_bias = random_vec(s.n_v, rng);
        let ssm_a = scaled(s.n_v, -1.1, -0.1, rng);
        let norm_w = scaled(s.dv, 0.5, 1.5, rng);
        let st0 = scaled(d.state_len(), -0.5, 0.5, rng);
        let win0 = random_vec((k - 1) * cd, rng);
        let p0 = 5usize;
        // The ring: position p in slot p % K; the window rows are positions
        // p0-K+1 .. p0-1.
        let mut ring = vec![0f32; k * cd];
        for j in 0..k - 1 {
            let p = p0 + j + 1 - k; // >= 0 as p0 >= K-1
            ring[(p % k) * cd..][..cd].copy_from_slice(&win0[j * cd..][..cd]);
        }
        let cw = up(gpu, &conv_w)?;
        let (dtb, sa, nw) = (up(gpu, &dt_bias)?, up(gpu, &ssm_a)?, up(gpu, &norm_w)?);
        let (ringd, std) = (up(gpu, &ring)?, up(gpu, &st0)?);
        let mut win: Vec<f64> = win0.iter().map(|&v| v as f64).collect();
        let mut st: Vec<f64> = st0.iter().map(|&v| v as f64).collect();
        for step in 0..6 {
            let pos = p0 + step;
            let qkv = random_vec(cd, rng);
            let z = random_vec(vd, rng);
            let ba = random_vec(2 * s.n_v, rng);
            let x = GdnStepInputs {
                qkv: &qkv,
                z: &z,
                ba: &ba,
                conv_w: &conv_w,
                dt_bias: &dt_bias,
                ssm_a: &ssm_a,
                norm_w: &norm_w,
            };
            let want = r::gdn_step(&s, &x, &mut win, &mut st, 1e-6, 1e-6);
            let (qd, zd, bd) = (up(gpu, &qkv)?, up(gpu, &z)?, up(gpu, &ba)?);
            let posd = up(gpu, &[pos as i32])?;
            let od = nan(gpu, vd)?;
            let q8 = (s.dv % 32 == 0).then(|| Q8Vec::new(gpu, vd)).transpose()?;
            let wts = GdnWeights {
                conv_w: &cw,
                dt_bias: &dtb,
                ssm_a: &sa,
                norm_w: &nw,
            };
            ops::gdn_step(
                gpu,
                &d,
                &wts,
                (&qd, 0),
                (&zd, 0),
                (&bd, 0),
                &ringd,
                &std,
                &od,
                q8.as_ref(),
                &posd,
                1e-6,
                1e-6,
            )?;
            let o = down(gpu, &od)?;
            fold(&mut w, compare(&o, &want));
            if let Some(q8) = &q8 {
                check_q8(gpu, &o, q8, q8w)?;
            }
        }
        fold(&mut w, compare(&down(gpu, &std)?, &st));
    }
    Ok(w)
}

fn router(gpu: &Gpu, rng: &mut Rng) -> Result<Worst> {
    let mut w =
        Worst::new("router_topk (softmax, top-k, renorm, slots; abs err of weights)".into());
    // n not a multiple of 32 (a partial last warp), n = k, k = 1 and 32,
    // the largest n; `ties`: logits on a coarse grid, so the k-th largest
    // p is tied with others and the lower expert indices must win (equal
    // logits give equal p on the device and in the f64 reference alike).
    for (n, k, norm, ties) in [
        (512, 10, true, false),
        (16, 4, true, false),
        (128, 8, false, false),
        (1000, 32, true, false),
        (64, 1, true, false),
        (513, 10, true, false),
        (1024, 32, false, false),
        (33, 32, true, false),
        (32, 32, true, false),
        (5, 5, false, false),
        (512, 10, true, true),
        (100, 8, true, true),
        (1024, 32, true, true),
        (7, 3, false, true),
    ] {
        for _ in 0..4 {
            let logits: Vec<f32> = random_vec(n, rng)
                .iter()
                .map(|v| {
                    if ties {
                        (v * 3.0).round() * 0.5
                    } else {
                        v * 4.0
                    }
                })
                .collect();
            let want = r::route(&logits, k, norm);
            let slot_of: Vec<u32> = (0..n as u32).map(|e| (e * 7 + 3) % n as u32).collect();
            let (ld, sod) = (up(gpu, &logits)?, up(gpu, &slot_of)?);
            let (sd, ed) = (up(gpu, &vec![u32::MAX; k])?, up(gpu, &vec![u32::MAX; k])?);
            let wd = nan(gpu, k)?;
            ops::router_topk(gpu, (&ld, 0), n, k, norm, Some(&sod), &sd, &ed, &wd)?;
            let wv = down(gpu, &wd)?;
            let (sv, ev) = (gpu.stream.clone_dtoh(&sd)?, gpu.stream.clone_dtoh(&ed)?);
            let ids_ok = want.iter().zip(&ev).all(|(c, &e)| c.0 == e)
                && ev.iter().zip(&sv).all(|(&e, &s)| slot_of[e as usize] == s);
            let ww: Vec<f64> = want.iter().map(|c| c.1).collect();
            let (a, rel, written) = compare(&wv, &ww);
            fold(&mut w, (a, rel, written && ids_ok));
        }
    }
    Ok(w)
}

/// `router_gemv_topk`: its logits against an f64 GEMV, its choice against
/// the host's route of those logits, and exactly what `router_topk` makes
/// of them; every case launched twice (the second launch finds the block
/// counter the first left, so a counter left non-zero would show as
/// outputs never written).
fn router_gemv(gpu: &Gpu, rng: &mut Rng) -> Result<Worst> {
    let mut w = Worst::new(
        "router_gemv_topk (router GEMV + top-k in one launch, and with its input RMSNorm: logits rel err; choice = route of them, bits = router_topk's and rms_norm's)".into(),
    );
    // (n, extra stacked rows, cols, k, norm): Qwen3-Next's 512 x 2048 with
    // the shared-expert gate row; a row longer than the preloaded 4 float4s
    // a thread (2080); n not a multiple of 128 (one block of 1024 threads
    // for n = 1000); narrow rows; k = n.
    for (n, extra, cols, k, norm) in [
        (512, 1, 2048, 10, true),
        (512, 0, 2080, 8, false),
        (1000, 3, 256, 32, true),
        (16, 1, 96, 4, true),
        (130, 0, 32, 7, true),
        (5, 2, 64, 5, false),
    ] {
        let rows = n + extra;
        for _ in 0..3 {
            let mat = random_vec(rows * cols, rng);
            let x = random_vec(cols, rng);
            let bytes: Vec<u8> = mat.iter().flat_map(|v| v.to_le_bytes()).collect();
            let want = reference_gemv(GgmlType::F32, &bytes, rows, cols, &x);
            let m = DeviceMatrix::upload(gpu, GgmlType::F32, rows, cols, &bytes)?;
            let (xd, ld) = (up(gpu, &x)?, nan(gpu, rows)?);
            let counter = gpu.stream.alloc_zeros::<u32>(1)?;
            let route = ops::Route { n, k, norm };
            let mut ok = true;
            let mut first = None;
            for _ in 0..2 {
                let (sd, ed) = (up(gpu, &vec![u32::MAX; k])?, up(gpu, &vec![u32::MAX; k])?);
                let wd = nan(gpu, k)?;
                ops::router_gemv_topk(gpu, &m, &xd, None, &ld, &counter, route, &sd, &ed, &wd)?;
                let logits = down(gpu, &ld)?;
                let (a, rel, written) = compare(&logits, &want);
                fold(&mut w, (a, rel, written));
                // what the standalone top-k makes of the same logits
                let (sd2, ed2) = (up(gpu, &vec![u32::MAX; k])?, up(gpu, &vec![u32::MAX; k])?);
                let wd2 = nan(gpu, k)?;
                ops::router_topk(gpu, (&ld, 0), n, k, norm, None, &sd2, &ed2, &wd2)?;
                let (wv, ev, sv) = (
                    down(gpu, &wd)?,
                    gpu.stream.clone_dtoh(&ed)?,
                    gpu.stream.clone_dtoh(&sd)?,
                );
                let chosen = r::route(&logits[..n], k, norm);
                ok &= chosen.iter().zip(&ev).all(|(c, &e)| c.0 == e)
                    && sv == ev
                    && same_bits(&wv, &down(gpu, &wd2)?)
                    && gpu.stream.clone_dtoh(&ed2)? == ev
                    && gpu.stream.clone_dtoh(&counter)? == [0];
                // the second launch: the same bits again
                match &first {
                    None => first = Some((logits, wv)),
                    Some((l0, w0)) => ok &= same_bits(l0, &logits) && same_bits(w0, &wv),
                }
            }
            // The post-mixer RMSNorm in front (where it fits): x, its
            // int8 form and the residual exactly as rms_norm (with the
            // residual add) makes them, except that the residual stays.
            if ops::router_in_norm_fits(cols, n) {
                ok &= router_in_norm_case(gpu, rng, (&m, &bytes), route, &counter, &mut w)?;
            }
            if !ok {
                fold(&mut w, (0.0, 0.0, false));
            }
        }
    }
    Ok(w)
}

/// One `router_gemv_topk` launch with its input's RMSNorm fused: whether
/// h, its int8 form and the choice match rms_norm + router_topk bit for
/// bit and the residual is untouched; the logits against an f64 GEMV of
/// that h go into `w`. `m`: the router matrix and its GGUF bytes.
fn router_in_norm_case(
    gpu: &Gpu,
    rng: &mut Rng,
    (m, bytes): (&DeviceMatrix, &[u8]),
    route: ops::Route,
    counter: &CudaSlice<u32>,
    w: &mut Worst,
) -> Result<bool> {
    let (d, k) = (m.cols, route.k);
    let (resid, mix) = (random_vec(d, rng), random_vec(d, rng));
    let nw = scaled(d, 0.5, 1.5, rng);
    let (rd, md, nwd) = (up(gpu, &resid)?, up(gpu, &mix)?, up(gpu, &nw)?);
    let (hd, ld, q8) = (nan(gpu, d)?, nan(gpu, m.rows)?, Q8Vec::new(gpu, d)?);
    let (sd, ed, wd) = (
        up(gpu, &vec![u32::MAX; k])?,
        up(gpu, &vec![u32::MAX; k])?,
        nan(gpu, k)?,
    );
    let norm = ops::InNorm {
        resid: &rd,
        mix: &md,
        w: &nwd,
        eps: 1e-6,
        q8: Some(&q8),
    };
    ops::router_gemv_topk(gpu, m, &hd, Some(norm), &ld, counter, route, &sd, &ed, &wd)?;
    // rms_norm with the residual add: x += mix, h = RMSNorm(x)·w
    let (xr, hr, q8r) = (up(gpu, &resid)?, nan(gpu, d)?, Q8Vec::new(gpu, d)?);
    ops::rms_norm(
        gpu,
        &xr,
        Some(&md),
        &nwd,
        Some(&hr),
        Some(&q8r),
        1,
        d,
        1e-6,
        false,
    )?;
    let h = down(gpu, &hd)?;
    let mut ok = same_bits(&h, &down(gpu, &hr)?)
        && gpu.stream.clone_dtoh(&q8.q)? == gpu.stream.clone_dtoh(&q8r.q)?
        && same_bits(&down(gpu, &q8.d)?, &down(gpu, &q8r.d)?)
        && same_bits(&down(gpu, &rd)?, &resid);
    let want = reference_gemv(GgmlType::F32, bytes, m.rows, d, &h);
    let logits = down(gpu, &ld)?;
    fold(w, compare(&logits, &want));
    let chosen = r::route(&logits[..route.n], k, route.norm);
    ok &= chosen
        .iter()
        .zip(&gpu.stream.clone_dtoh(&ed)?)
        .all(|(c, &e)| c.0 == e)
        && gpu.stream.clone_dtoh(counter)? == [0];
    Ok(ok)
}

fn elementwise(gpu: &Gpu, rng: &mut Rng, q8w: &mut Worst) -> Result<Worst> {
    let mut w = Worst::new(
        "swiglu, moe_combine (+ fused next RMSNorm, + deferred residual add), add_inplace".into(),
    );
    for n in [1usize, 100, 2048, 10 * 512] {
        let (g, u) = (scaled(n, -6.0, 6.0, rng), random_vec(n, rng));
        let (gd, ud, od) = (up(gpu, &g)?, up(gpu, &u)?, nan(gpu, n)?);
        let q8 = (n % 32 == 0).then(|| Q8Vec::new(gpu, n)).transpose()?;
        ops::swiglu(gpu, (&gd, 0), (&ud, 0), &od, q8.as_ref(), n)?;
        let o = down(gpu, &od)?;
        fold(&mut w, compare(&o, &r::swiglu(&g, &u)));
        if let Some(q8) = &q8 {
            check_q8(gpu, &o, q8, q8w)?;
        }
        let x = random_vec(n, rng);
        let xd = up(gpu, &x)?;
        ops::add_inplace(gpu, &xd, &ud, n)?;
        let want: Vec<f64> = x
            .iter()
            .zip(&u)
            .map(|(&a, &b)| a as f64 + b as f64)
            .collect();
        fold(&mut w, compare(&down(gpu, &xd)?, &want));
    }
    // 5120: more values than the combine keeps in registers (4 per thread)
    // and than moe_combine_norm_v8 takes; 4096 with 13 experts: three
    // groups of its expert loop, the last partial.
    for (d, k) in [(2048, 10), (256, 4), (64, 1), (5120, 3), (4096, 13)] {
        for shared in [false, true] {
            let x = random_vec(d, rng);
            let ys = random_vec(k * d, rng);
            let wt = scaled(k, 0.0, 0.3, rng);
            let sh = random_vec(d, rng);
            let sl = [rng.uniform() * 3.0];
            let want = r::moe_combine(
                &x,
                &ys,
                &wt,
                shared.then_some(&sh[..]),
                shared.then_some(sl[0]),
            );
            let (xd, yd, wd, shd, sld) = (
                up(gpu, &x)?,
                up(gpu, &ys)?,
                up(gpu, &wt)?,
                up(gpu, &sh)?,
                up(gpu, &sl)?,
            );
            let combine = |xd, norm, mix| {
                ops::moe_combine(
                    gpu,
                    xd,
                    &yd,
                    &wd,
                    k,
                    d,
                    shared.then_some(&shd),
                    shared.then_some((&sld, 0)),
                    norm,
                    mix,
                )
            };
            combine(&xd, None, None)?;
            fold(&mut w, compare(&down(gpu, &xd)?, &want));
            // The same with the next RMSNorm fused (and its int8 output).
            let xd = up(gpu, &x)?;
            let nw = scaled(d, 0.5, 1.5, rng);
            let (nwd, hd) = (up(gpu, &nw)?, nan(gpu, d)?);
            let q8 = Q8Vec::new(gpu, d)?;
            let next_norm = |h, q| ops::NextNorm {
                w: &nwd,
                eps: 1e-6,
                h,
                q8: Some(q),
            };
            combine(&xd, Some(next_norm(&hd, &q8)), None)?;
            let xn: Vec<f32> = want.iter().map(|&v| v as f32).collect();
            let (_, want_h) = r::rms_norm(&xn, None, &nw, d, 1e-6, false);
            fold(&mut w, compare(&down(gpu, &xd)?, &want));
            let h = down(gpu, &hd)?;
            fold(&mut w, compare(&h, &want_h));
            check_q8(gpu, &h, &q8, q8w)?;
            // The residual add deferred into the combine (mix): the same
            // bits as the combine on x + mix rounded to f32 first (what
            // rms_norm's residual add leaves in x).
            if ops::v8_block(d).is_some() {
                let mix = random_vec(d, rng);
                let xm: Vec<f32> = x.iter().zip(&mix).map(|(a, b)| a + b).collect();
                let (xd2, mixd, hd2) = (up(gpu, &x)?, up(gpu, &mix)?, nan(gpu, d)?);
                let q82 = Q8Vec::new(gpu, d)?;
                combine(&xd2, Some(next_norm(&hd2, &q82)), Some(&mixd))?;
                let (xd3, hd3, q83) = (up(gpu, &xm)?, nan(gpu, d)?, Q8Vec::new(gpu, d)?);
                combine(&xd3, Some(next_norm(&hd3, &q83)), None)?;
                let same = same_bits(&down(gpu, &xd2)?, &down(gpu, &xd3)?)
                    && same_bits(&down(gpu, &hd2)?, &down(gpu, &hd3)?)
                    && gpu.stream.clone_dtoh(&q82.q)? == gpu.stream.clone_dtoh(&q83.q)?;
                if !same {
                    fold(&mut w, (0.0, 0.0, false));
                }
            }
        }
    }
    Ok(w)
}
