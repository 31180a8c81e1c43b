//! Projections: uploads, the GEMV choice of one matrix (`mv`), and
//! several projections of one input stacked into one GEMV (`Proj`).

use super::CudaTuning;
use crate::device::Gpu;
use crate::error::{ensure, Context, Result};
use crate::gemv::{DeviceMatrix, Q8Vec, DEFAULT_NR, Q8_TYPES};
use cudarc::driver::CudaSlice;
use redlite_gguf::{GgmlType, GgufFile};
use redlite_model::weights::Weight;

/// `y = W x`, through the int8 kernel when `xq` is given and W's format has
/// one.
pub(super) fn mv(
    gpu: &Gpu,
    t: &CudaTuning,
    m: &DeviceMatrix,
    x: &CudaSlice<f32>,
    xq: Option<&Q8Vec>,
    y: &mut CudaSlice<f32>,
) -> Result<()> {
    match xq {
        Some(q) if Q8_TYPES.contains(&m.layout.ty) && q.n >= m.cols => {
            m.gemv_q8(gpu, q, y, t.q8_config(&m.layout, m.cols)?)
        }
        _ if m.layout.ty == GgmlType::F32 => m.gemv(gpu, x, y, t.f32_gemv),
        _ => m.gemv(gpu, x, y, DEFAULT_NR),
    }
}

/// Room for `n` int8 activations when `on` (and `n` is whole blocks of 32).
pub(super) fn q8vec(gpu: &Gpu, on: bool, n: usize) -> Result<Option<Q8Vec>> {
    if on && n.is_multiple_of(32) {
        Ok(Some(Q8Vec::new(gpu, n)?))
    } else {
        Ok(None)
    }
}

pub(super) fn quantize(gpu: &Gpu, q: &mut Option<Q8Vec>, x: &CudaSlice<f32>) -> Result<()> {
    if let Some(q) = q {
        q.quantize(gpu, x)?;
    }
    Ok(())
}

/// Several projections of one input (q|k|v; qkv|z|ba; router|shared
/// gate). Consecutive ones of one format and width are uploaded as one
/// matrix (their rows stacked) and run as one GEMV, so a layer launches
/// fewer kernels; part i's output is `part(i)`.
pub(super) struct Proj {
    pub(super) groups: Vec<(DeviceMatrix, CudaSlice<f32>)>,
    /// Per part: (group, offset in the group's output).
    pub(super) at: Vec<(usize, usize)>,
    /// Per group, when any of its parts has one: the parts' biases
    /// stacked like their rows (zeros for a part without), added after
    /// the GEMV as the CPU adds them (qwen2's q, k and v).
    pub(super) biases: Vec<Option<CudaSlice<f32>>>,
}

impl Proj {
    pub(super) fn new(gpu: &Gpu, f: &GgufFile, parts: &[&Weight]) -> Result<Self> {
        Self::with_biases(gpu, f, parts, &vec![None; parts.len()])
    }

    pub(super) fn with_biases(
        gpu: &Gpu,
        f: &GgufFile,
        parts: &[&Weight],
        biases: &[Option<&[f32]>],
    ) -> Result<Self> {
        ensure!(biases.len() == parts.len(), "a bias slot per projection");
        for (w, b) in parts.iter().zip(biases) {
            if let Some(b) = b {
                ensure!(
                    b.len() == w.rows(),
                    "bias of {}: {} values for {} rows",
                    w.name,
                    b.len(),
                    w.rows()
                );
            }
        }
        let mut groups: Vec<Vec<&Weight>> = Vec::new();
        for w in parts {
            match groups.last_mut() {
                Some(g) if g[0].ty == w.ty && g[0].cols() == w.cols() => g.push(w),
                _ => groups.push(vec![w]),
            }
        }
        let (mut out, mut at, mut group_biases) = (Vec::new(), Vec::new(), Vec::new());
        let mut part = 0;
        for (gi, g) in groups.iter().enumerate() {
            let of_group = &biases[part..part + g.len()];
            part += g.len();
            group_biases.push(if of_group.iter().any(Option::is_some) {
                let stacked: Vec<f32> = g
                    .iter()
                    .zip(of_group)
                    .flat_map(|(w, b)| match b {
                        Some(b) => b.to_vec(),
                        None => vec![0.0; w.rows()],
                    })
                    .collect();
                Some(gpu.stream.clone_htod(&stacked)?)
            } else {
                None
            });
            let rows: usize = g.iter().map(|w| w.rows()).sum();
            let bytes: Vec<u8> = g.iter().flat_map(|w| w.bytes(f).iter().copied()).collect();
            let names: Vec<&str> = g.iter().map(|w| w.name.as_str()).collect();
            let m = DeviceMatrix::from_gguf(gpu, g[0].ty, rows, g[0].cols(), &bytes)
                .with_context(|| format!("uploading {}", names.join(" + ")))?;
            let mut off = 0;
            for w in g {
                at.push((gi, off));
                off += w.rows();
            }
            out.push((m, gpu.stream.alloc_zeros(rows)?));
        }
        Ok(Self {
            groups: out,
            at,
            biases: group_biases,
        })
    }

    pub(super) fn part(&self, i: usize) -> (&CudaSlice<f32>, usize) {
        let (g, off) = self.at[i];
        (&self.groups[g].1, off)
    }

    pub(super) fn run(
        &mut self,
        gpu: &Gpu,
        t: &CudaTuning,
        x: &CudaSlice<f32>,
        xq: Option<&Q8Vec>,
    ) -> Result<()> {
        for ((m, y), b) in self.groups.iter_mut().zip(&self.biases) {
            mv(gpu, t, m, x, xq, y)?;
            if let Some(b) = b {
                crate::ops::add_inplace(gpu, y, b, b.len())?;
            }
        }
        Ok(())
    }
}

pub(super) fn upload(gpu: &Gpu, f: &GgufFile, w: &Weight) -> Result<DeviceMatrix> {
    DeviceMatrix::from_gguf(gpu, w.ty, w.rows(), w.cols(), w.bytes(f))
        .with_context(|| format!("uploading {}", w.name))
}

pub(super) fn f32s(gpu: &Gpu, v: &[f32]) -> Result<CudaSlice<f32>> {
    Ok(gpu.stream.clone_htod(v)?)
}
