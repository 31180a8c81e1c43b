//! `redlite bench kernels`: GB/s of weights per kernel and shape against
//! the card's device-to-device copy bandwidth measured in the same run.
//! CUDA graphs of 32 launches timed with events, warm-up first, medians; the
//! weights rotate over enough copies (>= 512 MiB together) that L2 (60 MB
//! on an H200) cannot hold them.

use crate::device::Gpu;
use crate::error::{CudaError, Result};
use crate::gemv::{
    kernel_name, q8_label, DeviceMatrix, ExpertStack, Q8Variant, Q8Vec, Variant, Q8_TYPES,
};
use crate::layout::{layout, GEMV_TYPES};
use crate::testdata::{random_vec, random_weights, Rng};
use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaSlice;
use redlite_gguf::GgmlType;

const BATCH: usize = 32;
const BATCHES: usize = 15;
const ROTATE_BYTES: usize = 512 << 20;

/// One measured kernel configuration.
#[derive(Debug, Clone)]
pub struct BenchRow {
    pub kernel: String,
    pub shape: String,
    pub bytes: usize,
    pub us: f64,
    pub gbps: f64,
}

/// Median seconds per call of `f`: BATCH calls are captured into one CUDA
/// graph (so host launch overhead is not measured: decode will run as
/// graphs), the graph is replayed once to warm up, then BATCHES times, each
/// between two events. `f(i)` gets a running index (to rotate buffers).
fn time(gpu: &Gpu, mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    gpu.sync()?;
    gpu.stream
        .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
    for i in 0..BATCH {
        if let Err(e) = f(i) {
            let _ = gpu.stream.end_capture(CUgraphInstantiate_flags(0));
            return Err(e);
        }
    }
    let graph = gpu
        .stream
        .end_capture(CUgraphInstantiate_flags(0))?
        .ok_or_else(|| CudaError::Invalid("empty graph".into()))?;
    graph.launch()?;
    gpu.sync()?;
    let mut ts = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let a = gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        graph.launch()?;
        let b = gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        ts.push(a.elapsed_ms(&b)? as f64 * 1e-3 / BATCH as f64);
    }
    gpu.sync()?;
    ts.sort_by(f64::total_cmp);
    Ok(ts[ts.len() / 2])
}

/// Device-to-device copy of 1 GiB; GB/s counting bytes read plus written.
pub fn copy_bandwidth(gpu: &Gpu) -> Result<f64> {
    let n = 1usize << 30;
    let src: CudaSlice<u8> = gpu.stream.alloc_zeros(n)?;
    let mut dst: CudaSlice<u8> = gpu.stream.alloc_zeros(n)?;
    // Plain stream copies, not a graph: a memcpy node captured into a graph
    // ran at 2.8 TB/s on the H200 against 4.3 TB/s for the same copy issued
    // to the stream (2026-11-30), and the stream copy is the ceiling the
    // GPU machine notes quote. 1 GiB copies take ~0.5 ms, so host launch
    // overhead does not enter.
    for _ in 0..3 {
        gpu.stream.memcpy_dtod(&src, &mut dst)?;
    }
    let mut ts = Vec::with_capacity(BATCHES);
    for _ in 0..BATCHES {
        let a = gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        for _ in 0..4 {
            gpu.stream.memcpy_dtod(&src, &mut dst)?;
        }
        let b = gpu
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        ts.push(a.elapsed_ms(&b)? as f64 * 1e-3 / 4.0);
    }
    ts.sort_by(f64::total_cmp);
    let t = ts[ts.len() / 2];
    Ok(2.0 * n as f64 / t / 1e9)
}

/// The shapes of a decode step: (name, rows, cols).
pub const SHAPES: &[(&str, usize, usize)] = &[
    ("ssm_out 2048x4096", 2048, 4096),
    ("attn_qkv 8192x2048", 8192, 2048),
    ("head 151936x2048", 151936, 2048),
];

pub fn run(gpu: &Gpu, nrs: &[Variant]) -> Result<Vec<BenchRow>> {
    let mut rng = Rng(0x5eed);
    let mut out = Vec::new();
    for ty in GEMV_TYPES {
        let l = layout(ty)?;
        for &(name, rows, cols) in SHAPES {
            let w = random_weights(&l, rows, cols, &mut rng);
            let copies = (ROTATE_BYTES / w.len()).clamp(1, 64);
            let mats: Vec<DeviceMatrix> = (0..copies)
                .map(|_| DeviceMatrix::upload(gpu, ty, rows, cols, &w))
                .collect::<Result<_>>()?;
            drop(w);
            let x = gpu.stream.clone_htod(&random_vec(cols, &mut rng))?;
            let mut y: CudaSlice<f32> = gpu.stream.alloc_zeros(rows)?;
            for &nr in nrs {
                let t = time(gpu, |i| mats[i % copies].gemv(gpu, &x, &mut y, nr))?;
                let bytes = mats[0].bytes();
                out.push(BenchRow {
                    kernel: kernel_name(ty, nr)?,
                    shape: name.to_string(),
                    bytes,
                    us: t * 1e6,
                    gbps: bytes as f64 / t / 1e9,
                });
            }
        }
        // Routed experts: 512 slots, 10 routed per call (random, rotating
        // over 64 precomputed sets), gate/up (512x2048, shared x) and down
        // (2048x512, one x per expert).
        for (name, rows, cols, per_x) in [
            ("10 experts 512x2048 (up)", 512, 2048, false),
            ("10 experts 2048x512 (down)", 2048, 512, true),
        ] {
            let n_slots = 512;
            let mut stack = ExpertStack::new(gpu, ty, rows, cols, n_slots)?;
            let w = random_weights(&l, rows, cols, &mut rng);
            for s in 0..n_slots {
                stack.upload(gpu, s, &w)?;
            }
            let sets: Vec<CudaSlice<u32>> = (0..64)
                .map(|_| {
                    let v: Vec<u32> = (0..10).map(|_| rng.below(n_slots) as u32).collect();
                    Ok(gpu.stream.clone_htod(&v)?)
                })
                .collect::<Result<_>>()?;
            let x = gpu.stream.clone_htod(&random_vec(cols * 10, &mut rng))?;
            let mut y: CudaSlice<f32> = gpu.stream.alloc_zeros(rows * 10)?;
            let xs = if per_x { cols } else { 0 };
            for &nr in nrs {
                let t = time(gpu, |i| {
                    stack.gemv(gpu, &sets[i % 64], 10, &x, xs, &mut y, nr)
                })?;
                let bytes = 10 * l.matrix_bytes(rows, cols)?;
                out.push(BenchRow {
                    kernel: kernel_name(ty, nr)?,
                    shape: name.to_string(),
                    bytes,
                    us: t * 1e6,
                    gbps: bytes as f64 / t / 1e9,
                });
            }
        }
    }
    run_q8(gpu, &mut rng, &mut out)?;
    out.extend(run_decode_ops(gpu)?);
    Ok(out)
}

/// Decode attention (Qwen3-Next's 16 query / 2 KV heads x 256, f32 and f16
/// KV) at several lengths, bytes = K and V read once (at their element
/// size); the fused DeltaNet step
/// (32 value heads of 128 x 128), bytes = the state read and written. Both
/// rotate over copies so L2 does not hold them.
pub fn run_decode_ops(gpu: &Gpu) -> Result<Vec<BenchRow>> {
    let rng = &mut Rng(0xa77e);
    let mut out = Vec::new();
    use crate::ops::{self, AttnDims, AttnScratch, GdnDims, GdnWeights, KvCache, KvType};
    let a = AttnDims {
        n_head: 16,
        n_kv: 2,
        hd: 256,
        n_rot: 64,
        gated: true,
    };
    for (n, ty) in [4096usize, 16384, 65536, 131072, 262144]
        .into_iter()
        .flat_map(|n| [KvType::F32, KvType::F16].map(|t| (n, t)))
    {
        let nsplit = ops::default_nsplit(&a, ty, gpu.sms);
        let kv_bytes = 2 * n * a.n_kv * a.hd * ty.bytes();
        let copies = (ROTATE_BYTES / kv_bytes).clamp(1, 12);
        let caches: Vec<KvCache> = (0..copies)
            .map(|_| {
                let k = random_vec(n * a.n_kv * a.hd, rng);
                let v = random_vec(n * a.n_kv * a.hd, rng);
                KvCache::upload(gpu, ty, &k, &v)
            })
            .collect::<Result<_>>()?;
        let q = gpu.stream.clone_htod(&random_vec(a.n_head * a.hd, rng))?;
        let qf = gpu
            .stream
            .clone_htod(&random_vec(2 * a.n_head * a.hd, rng))?;
        let pos = gpu.stream.clone_htod(&[(n - 1) as i32])?;
        let sc = AttnScratch::new(gpu, &a, nsplit)?;
        let o: CudaSlice<f32> = gpu.stream.alloc_zeros(a.n_head * a.hd)?;
        let t = time(gpu, |i| {
            ops::attention(
                gpu,
                &a,
                &q,
                &caches[i % copies],
                &pos,
                &sc,
                Some((&qf, 0)),
                &o,
                None,
                0.0625,
            )
        })?;
        out.push(BenchRow {
            kernel: format!(
                "{} + attn_merge ({nsplit} slices)",
                ops::split_kernel(&a, ty)
            ),
            shape: format!("16q/2kv x 256, {} KV, n {n}", ty.name()),
            bytes: kv_bytes,
            us: t * 1e6,
            gbps: kv_bytes as f64 / t / 1e9,
        });
    }
    let d = GdnDims {
        n_k: 16,
        n_v: 32,
        dk: 128,
        dv: 128,
        conv_kernel: 4,
    };
    let copies = 36;
    let states: Vec<(CudaSlice<f32>, CudaSlice<f32>)> = (0..copies)
        .map(|_| {
            let st = gpu.stream.clone_htod(&random_vec(d.state_len(), rng))?;
            let ring = gpu.stream.alloc_zeros(d.conv_kernel * d.conv_dim())?;
            Ok((st, ring))
        })
        .collect::<Result<_>>()?;
    let f = |n: usize, rng: &mut Rng| gpu.stream.clone_htod(&random_vec(n, rng));
    let (qkv, z, ba) = (f(d.conv_dim(), rng)?, f(32 * 128, rng)?, f(64, rng)?);
    let (cw, dtb, sa, nw) = (
        f(4 * d.conv_dim(), rng)?,
        f(32, rng)?,
        f(32, rng)?,
        f(128, rng)?,
    );
    let o: CudaSlice<f32> = gpu.stream.alloc_zeros(32 * 128)?;
    let pos = gpu.stream.clone_htod(&[7i32])?;
    let w = GdnWeights {
        conv_w: &cw,
        dt_bias: &dtb,
        ssm_a: &sa,
        norm_w: &nw,
    };
    let t = time(gpu, |i| {
        let (st, ring) = &states[i % copies];
        ops::gdn_step(
            gpu,
            &d,
            &w,
            (&qkv, 0),
            (&z, 0),
            (&ba, 0),
            ring,
            st,
            &o,
            None,
            &pos,
            1e-6,
            1e-6,
        )
    })?;
    let bytes = 2 * d.state_len() * 4;
    out.push(BenchRow {
        kernel: d.split().map_or("gdn_step", |s| s.1).into(),
        shape: "32 value heads x 128x128 (state read + written)".into(),
        bytes,
        us: t * 1e6,
        gbps: bytes as f64 / t / 1e9,
    });
    Ok(out)
}

/// The int8-activation kernels ([`Q8_TYPES`]) on the same shapes (x quantized once
/// beforehand, not timed with them), gate+up of 10 experts in one launch,
/// and the quantization itself.
fn run_q8(gpu: &Gpu, rng: &mut Rng, out: &mut Vec<BenchRow>) -> Result<()> {
    for ty in Q8_TYPES {
        run_q8_type(gpu, ty, rng, out)?;
    }
    Ok(())
}

fn run_q8_type(gpu: &Gpu, ty: GgmlType, rng: &mut Rng, out: &mut Vec<BenchRow>) -> Result<()> {
    let l = layout(ty)?;
    let nrs: Vec<Q8Variant> = crate::selftest::q8_variants()
        .into_iter()
        .filter(|v| v.0 == ty)
        .map(|v| v.1)
        .collect();
    for &(name, rows, cols) in SHAPES {
        let w = random_weights(&l, rows, cols, rng);
        let copies = (ROTATE_BYTES / w.len()).clamp(1, 64);
        let mats: Vec<DeviceMatrix> = (0..copies)
            .map(|_| DeviceMatrix::upload(gpu, ty, rows, cols, &w))
            .collect::<Result<_>>()?;
        drop(w);
        let x = gpu.stream.clone_htod(&random_vec(cols, rng))?;
        let mut xq = Q8Vec::new(gpu, cols)?;
        xq.quantize(gpu, &x)?;
        let mut y: CudaSlice<f32> = gpu.stream.alloc_zeros(rows)?;
        for &nr in &nrs {
            let t = time(gpu, |i| mats[i % copies].gemv_q8(gpu, &xq, &mut y, nr))?;
            let bytes = mats[0].bytes();
            out.push(BenchRow {
                kernel: q8_label(ty, nr)?,
                shape: name.to_string(),
                bytes,
                us: t * 1e6,
                gbps: bytes as f64 / t / 1e9,
            });
        }
        if cols == 2048 && rows == 8192 && ty == GgmlType::IQ2_XXS {
            let t = time(gpu, |_| xq.quantize(gpu, &x))?;
            out.push(BenchRow {
                kernel: "quantize_q8_32".into(),
                shape: "x 2048 (f32 read)".into(),
                bytes: cols * 4,
                us: t * 1e6,
                gbps: (cols * 4) as f64 / t / 1e9,
            });
        }
    }
    let n_slots = 512;
    let (rows, cols) = (512, 2048);
    let mut gate = ExpertStack::new(gpu, ty, rows, cols, n_slots)?;
    let mut up = ExpertStack::new(gpu, ty, rows, cols, n_slots)?;
    let w = random_weights(&l, rows, cols, rng);
    for s in 0..n_slots {
        gate.upload(gpu, s, &w)?;
        up.upload(gpu, s, &w)?;
    }
    let mut down = ExpertStack::new(gpu, ty, cols, rows, n_slots)?;
    let wd = random_weights(&l, cols, rows, rng);
    for s in 0..n_slots {
        down.upload(gpu, s, &wd)?;
    }
    let sets: Vec<CudaSlice<u32>> = (0..64)
        .map(|_| {
            let v: Vec<u32> = (0..10).map(|_| rng.below(n_slots) as u32).collect();
            Ok(gpu.stream.clone_htod(&v)?)
        })
        .collect::<Result<_>>()?;
    let x = gpu.stream.clone_htod(&random_vec(cols * 10, rng))?;
    let mut xq = Q8Vec::new(gpu, cols * 10)?;
    xq.quantize(gpu, &x)?;
    let mut y: CudaSlice<f32> = gpu.stream.alloc_zeros((rows * 20).max(cols * 10))?;
    let mb = l.matrix_bytes(rows, cols)?;
    for &nr in &nrs {
        let mut push = |shape: &str, bytes: usize, t: f64| -> Result<()> {
            out.push(BenchRow {
                kernel: q8_label(ty, nr)?,
                shape: shape.to_string(),
                bytes,
                us: t * 1e6,
                gbps: bytes as f64 / t / 1e9,
            });
            Ok(())
        };
        let t = time(gpu, |i| {
            gate.gemv_q8(gpu, &sets[i % 64], 10, &xq, 0, &mut y, nr)
        })?;
        push("10 experts 512x2048 (up)", 10 * mb, t)?;
        let t = time(gpu, |i| {
            down.gemv_q8(gpu, &sets[i % 64], 10, &xq, rows, &mut y, nr)
        })?;
        push("10 experts 2048x512 (down)", 10 * mb, t)?;
        let t = time(gpu, |i| {
            ExpertStack::gemv_gate_up_q8(&gate, &up, gpu, &sets[i % 64], 10, &xq, &mut y, nr)
        })?;
        push("10 experts gate+up fused 2x512x2048", 20 * mb, t)?;
    }
    Ok(())
}

pub fn print(gpu: &Gpu, copy_gbps: f64, rows: &[BenchRow]) {
    println!("# redlite bench kernels on {}", gpu.name);
    println!(
        "device-to-device copy: {copy_gbps:.0} GB/s (1 GiB stream copies, read + write, median of {BATCHES} x 4)"
    );
    println!("| kernel | shape | weights MiB | µs (median) | GB/s | % of copy |");
    println!("|---|---|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.1} | {:.2} | {:.0} | {:.0}% |",
            r.kernel,
            r.shape,
            r.bytes as f64 / (1 << 20) as f64,
            r.us,
            r.gbps,
            100.0 * r.gbps / copy_gbps
        );
    }
}
