//! The CUDA sequence's state in the layout every backend shares
//! ([`redlite_model::StateImage`]): the host-side conversions between the
//! device buffers' layout and the CPU's.
//!
//! What differs and what does not, per layer:
//!
//! - KV rows: the device caches are `[ctx][n_kv][hd]` (`ops::KvCache`,
//!   `attn_prep.cu`), K after its norm and RoPE, as the CPU's `KvCache`
//!   keeps `pos × (n_kv · hd)`: the first `pos` rows are the image as
//!   they are (f16 as its bits).
//! - The recurrent state: `[n_v][dk][dv]`, `S[i][j]` with key index `i`
//!   and value index `j` (`deltanet.cu`, `deltanet_chunk.cu`), which is
//!   the CPU's layout (`redlite_cpu::deltanet`): copied as it is, no
//!   transposition.
//! - The conv window: the CPU keeps the last `K - 1` inputs oldest first
//!   (`(K-1) × conv_dim`, `redlite_cpu::conv`); the device keeps a ring of
//!   `K` slots, position `p` in slot `p % K` (this token's input goes to
//!   slot `pos % K`, which the step does not read). [`ring_to_window`] and
//!   [`window_to_ring`] convert; the channel order (q | k | v, value heads
//!   in order) is the projection's on both.

use crate::error::{bail, ensure, Context, CudaError, Result};
use crate::ops::GdnDims;
use redlite_model::{KvData, LayerImage, LayerShape, StateImage, StateLayout};
use std::borrow::Cow;

/// A sequence state as the device keeps it, in host memory: the K and V
/// rows of the filled positions per attention layer and the conv ring and
/// recurrent state per DeltaNet layer, each list in layer order.
#[derive(Clone, Debug, PartialEq)]
pub struct HostState<'a> {
    pub pos: usize,
    pub kv: Vec<(KvData<'a>, KvData<'a>)>,
    pub gdn: Vec<(Vec<f32>, Cow<'a, [f32]>)>,
}

/// The image of `s` in the shared layout: its lists interleaved in the
/// model's layer order (`layout`), each ring turned into the CPU's window.
/// The result is checked against `layout` (KV element type included).
pub fn to_image<'a>(layout: &StateLayout, s: HostState<'a>) -> Result<StateImage<'a>> {
    let (mut kv, mut gdn) = (s.kv.into_iter(), s.gdn.into_iter());
    let mut layers = Vec::with_capacity(layout.layers.len());
    for (i, shape) in layout.layers.iter().enumerate() {
        layers.push(match *shape {
            LayerShape::Kv { .. } => {
                let (k, v) = kv.next().with_context(|| {
                    format!("layer {i}: the device state has fewer attention layers than the model")
                })?;
                LayerImage::Kv { k, v }
            }
            LayerShape::Recurrent { conv, .. } => {
                let (ring, ssm) = gdn.next().with_context(|| {
                    format!("layer {i}: the device state has fewer DeltaNet layers than the model")
                })?;
                LayerImage::Recurrent {
                    conv: Cow::Owned(
                        ring_to_window(&ring, conv, s.pos)
                            .map_err(|e| e.context(format!("layer {i}")))?,
                    ),
                    ssm,
                }
            }
        });
    }
    ensure!(
        kv.next().is_none() && gdn.next().is_none(),
        "the device state has more layers than the model"
    );
    let image = StateImage { pos: s.pos, layers };
    image
        .check(layout)
        .map_err(|e| CudaError::Invalid(format!("the exported state: {e}")))?;
    Ok(image)
}

/// The device form of `image` for a decoder of `ctx` positions whose
/// DeltaNet layers have the shapes `dims` (in layer order): checked
/// against `layout` (the model's layers and the sequence's KV element
/// type), the context and `dims` first; each window turned into a ring.
pub fn from_image<'a>(
    layout: &StateLayout,
    image: StateImage<'a>,
    ctx: usize,
    dims: &[GdnDims],
) -> Result<HostState<'a>> {
    image
        .check(layout)
        .map_err(|e| CudaError::Invalid(format!("the state does not fit this model: {e}")))?;
    ensure!(
        image.pos <= ctx,
        "a state of {} positions does not fit a context of {ctx}",
        image.pos
    );
    let n_rec = layout
        .layers
        .iter()
        .filter(|l| matches!(l, LayerShape::Recurrent { .. }))
        .count();
    ensure!(
        dims.len() == n_rec,
        "the decoder has {} DeltaNet layers, the model {n_rec}",
        dims.len()
    );
    let pos = image.pos;
    let mut dims = dims.iter();
    let (mut kv, mut gdn) = (Vec::new(), Vec::new());
    for (i, l) in image.layers.into_iter().enumerate() {
        match l {
            LayerImage::Kv { k, v } => {
                // check() held both to the layout's type.
                ensure!(
                    k.elem() == v.elem(),
                    "layer {i}: K and V rows of different types"
                );
                kv.push((k, v));
            }
            LayerImage::Recurrent { conv, ssm } => {
                let Some(d) = dims.next() else {
                    bail!("layer {i}: more DeltaNet layers than the decoder");
                };
                let want = (d.conv_kernel - 1) * d.conv_dim();
                ensure!(
                    conv.len() == want && ssm.len() == d.state_len(),
                    "layer {i}: a DeltaNet state of {} + {} values, the decoder's is {want} + {}",
                    conv.len(),
                    ssm.len(),
                    d.state_len()
                );
                let ring = window_to_ring(&conv, d.conv_kernel, pos)
                    .map_err(|e| e.context(format!("layer {i}")))?;
                gdn.push((ring, ssm));
            }
        }
    }
    Ok(HostState { pos, kv, gdn })
}

/// Conv channels and kernel size of a ring of `ring_len` values holding
/// a window of `window_len` (`K × cd` against `(K - 1) × cd`).
fn ring_shape(ring_len: usize, window_len: usize) -> Result<(usize, usize)> {
    ensure!(
        ring_len > window_len,
        "a conv ring of {ring_len} values for a window of {window_len}"
    );
    let cd = ring_len - window_len;
    let k = ring_len / cd;
    ensure!(
        k >= 2 && k * cd == ring_len && (k - 1) * cd == window_len,
        "a conv ring of {ring_len} values does not hold a window of {window_len} ({cd} channels)"
    );
    Ok((cd, k))
}

/// The CPU's conv window (`(K - 1) × cd`, oldest first) at position `pos`
/// from the device ring (`K × cd`, position `p` in slot `p % K`). Rows of
/// positions before 0 are zero, as on the CPU (and as the batched prefill
/// reads them).
pub fn ring_to_window(ring: &[f32], window_len: usize, pos: usize) -> Result<Vec<f32>> {
    let (cd, k) = ring_shape(ring.len(), window_len)?;
    let mut window = vec![0f32; window_len];
    for (r, row) in window.chunks_exact_mut(cd).enumerate() {
        // Window row r holds position pos - (K - 1) + r.
        if let Some(q) = (pos + r + 1).checked_sub(k) {
            let slot = q % k;
            row.copy_from_slice(&ring[slot * cd..(slot + 1) * cd]);
        }
    }
    Ok(window)
}

/// The device ring (`K × cd`) of conv kernel `k` at position `pos` from
/// the CPU's window (`(K - 1) × cd`, oldest first): window row `r` goes to
/// the slot the decode step reads for it, `(pos + 1 + r) % K`; the slot of
/// `pos` itself (written by the next step before it is read) is zero.
pub fn window_to_ring(window: &[f32], k: usize, pos: usize) -> Result<Vec<f32>> {
    ensure!(k >= 2, "conv kernel {k}");
    ensure!(
        window.len().is_multiple_of(k - 1),
        "a conv window of {} values for kernel {k}",
        window.len()
    );
    let cd = window.len() / (k - 1);
    let mut ring = vec![0f32; k * cd];
    for (r, row) in window.chunks_exact(cd).enumerate() {
        let slot = (pos + 1 + r) % k;
        ring[slot * cd..(slot + 1) * cd].copy_from_slice(row);
    }
    Ok(ring)
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlite_cpu::conv::conv1d_causal;

    fn inputs(n: usize, cd: usize) -> Vec<f32> {
        (0..n * cd)
            .map(|i| ((i * 7919 + 13) % 1000) as f32 / 1000.0 - 0.5)
            .collect()
    }

    /// The window the decode step (`deltanet.cu`, step 1) reads at `pos`:
    /// slots `(pos + 1 + r) % K`, oldest first.
    fn kernel_window(ring: &[f32], k: usize, cd: usize, pos: usize) -> Vec<f32> {
        let s0 = (pos + 1) % k;
        let mut w = Vec::with_capacity((k - 1) * cd);
        for r in 0..k - 1 {
            let slot = (s0 + r) % k;
            w.extend_from_slice(&ring[slot * cd..(slot + 1) * cd]);
        }
        w
    }

    /// The ring as the device steps leave it: input `p` in slot `p % K`
    /// (`deltanet.cu`'s store; `gdn_ring_chunk` writes the same slots).
    fn device_ring(x: &[f32], k: usize, cd: usize, upto: usize) -> Vec<f32> {
        let mut ring = vec![0f32; k * cd];
        for p in 0..upto {
            let slot = p % k;
            ring[slot * cd..(slot + 1) * cd].copy_from_slice(&x[p * cd..(p + 1) * cd]);
        }
        ring
    }

    /// Expected values: the CPU backend's own conv state after the same
    /// inputs (`redlite_cpu::conv::conv1d_causal`, the layout CPU state
    /// files hold), at every position from 0 past a few ring turns, for
    /// kernels 2, 4 (the models') and 5.
    #[test]
    fn the_ring_converts_to_the_cpu_conv_window_at_every_position() {
        for k in [2usize, 4, 5] {
            let cd = 6;
            let n = 3 * k + 2;
            let x = inputs(n, cd);
            let w: Vec<f32> = (0..cd * k).map(|i| 0.1 * i as f32).collect();
            let mut cpu = vec![0f32; (k - 1) * cd];
            for pos in 0..=n {
                let ring = device_ring(&x, k, cd, pos);
                let got = ring_to_window(&ring, cpu.len(), pos).unwrap();
                assert_eq!(got, cpu, "k {k} pos {pos}: ring to window");
                let back = window_to_ring(&cpu, k, pos).unwrap();
                assert_eq!(
                    kernel_window(&back, k, cd, pos),
                    cpu,
                    "k {k} pos {pos}: the decode step reads the CPU window"
                );
                assert_eq!(
                    ring_to_window(&back, cpu.len(), pos).unwrap(),
                    cpu,
                    "k {k} pos {pos}: round trip"
                );
                if pos < n {
                    let mut out = vec![0f32; cd];
                    conv1d_causal(&mut cpu, &w, k, &x[pos * cd..(pos + 1) * cd], &mut out).unwrap();
                }
            }
        }
    }

    /// A window imported into the ring and then stepped as the device does
    /// gives the CPU's window after the same step (the slot of `pos` is
    /// overwritten before it is read).
    #[test]
    fn an_imported_ring_continues_as_the_cpu_window_does() {
        let (k, cd) = (4usize, 5usize);
        let x = inputs(20, cd);
        let w: Vec<f32> = (0..cd * k).map(|i| 0.05 * i as f32).collect();
        let mut cpu = vec![0f32; (k - 1) * cd];
        let mut out = vec![0f32; 9 * cd];
        conv1d_causal(&mut cpu, &w, k, &x[..9 * cd], &mut out).unwrap();
        let mut ring = window_to_ring(&cpu, k, 9).unwrap();
        for p in 9..20 {
            let slot = p % k;
            ring[slot * cd..(slot + 1) * cd].copy_from_slice(&x[p * cd..(p + 1) * cd]);
            let mut o = vec![0f32; cd];
            conv1d_causal(&mut cpu, &w, k, &x[p * cd..(p + 1) * cd], &mut o).unwrap();
            assert_eq!(ring_to_window(&ring, cpu.len(), p + 1).unwrap(), cpu, "{p}");
        }
    }

    mod fixture {
        use super::super::*;
        use super::kernel_window;
        use redlite_model::arch::Arch;
        use redlite_model::{CpuSequence, KvElem, Logits, Model, Sequence};
        use std::sync::Arc;

        fn model() -> Arc<Model> {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../tests/fixtures/qwen3next/tiny-qwen3next-q8_0.gguf"
            );
            let file = Arc::new(redlite_gguf::GgufFile::open(path).unwrap());
            Arc::new(Model::load(file, Default::default()).unwrap())
        }

        /// The DeltaNet shapes the device decoder builds for `m`.
        fn dims(m: &Model) -> Vec<GdnDims> {
            let Arch::Qwen3Next(q) = m.arch() else {
                panic!("a qwen3next fixture")
            };
            let p = q.deltanet_params();
            let d = GdnDims {
                n_k: p.shape.n_k_heads,
                n_v: p.shape.n_v_heads,
                dk: p.shape.dk,
                dv: p.shape.dv,
                conv_kernel: p.conv_kernel,
            };
            let layout = StateLayout::of(m, KvElem::F32);
            let n = layout
                .layers
                .iter()
                .filter(|l| matches!(l, LayerShape::Recurrent { .. }))
                .count();
            vec![d; n]
        }

        /// The CPU backend's image after `n` prompt tokens, owned: the
        /// layout state files hold (expected values of these tests).
        fn cpu_image(m: &Arc<Model>, n: usize) -> StateImage<'static> {
            let mut seq = CpuSequence::new(m.clone(), 64);
            let prompt: Vec<u32> = (0..n as u32).map(|i| (i * 37 + 11) % 512).collect();
            seq.prefill(&prompt, Logits::Last).unwrap();
            let cp = seq.checkpoint().unwrap();
            let img = seq.export_checkpoint(&cp).unwrap();
            let own = |d: &KvData<'_>| match d {
                KvData::F32(v) => KvData::F32(Cow::Owned(v.to_vec())),
                KvData::F16(v) => KvData::F16(Cow::Owned(v.to_vec())),
            };
            StateImage {
                pos: img.pos,
                layers: img
                    .layers
                    .iter()
                    .map(|l| match l {
                        LayerImage::Kv { k, v } => LayerImage::Kv {
                            k: own(k),
                            v: own(v),
                        },
                        LayerImage::Recurrent { conv, ssm } => LayerImage::Recurrent {
                            conv: Cow::Owned(conv.to_vec()),
                            ssm: Cow::Owned(ssm.to_vec()),
                        },
                    })
                    .collect(),
            }
        }

        /// Every layer of the CPU's image reaches the device form in layer
        /// order (KV rows and recurrent states as they are, each window
        /// where the decode step reads it) and comes back unchanged; at
        /// positions before, at and after the first ring turn.
        #[test]
        fn the_cpu_image_goes_to_the_device_form_and_back_unchanged() {
            let m = model();
            let layout = StateLayout::of(&m, KvElem::F32);
            let dims = dims(&m);
            for n in [1, 2, 3, 4, 9] {
                let img = cpu_image(&m, n);
                let h = from_image(&layout, img.clone(), 64, &dims).unwrap();
                assert_eq!(h.pos, n);
                let (mut kv, mut gdn) = (h.kv.iter(), h.gdn.iter());
                for l in &img.layers {
                    match l {
                        LayerImage::Kv { k, v } => {
                            let (dk, dv) = kv.next().unwrap();
                            assert_eq!((dk, dv), (k, v));
                        }
                        LayerImage::Recurrent { conv, ssm } => {
                            let (ring, dssm) = gdn.next().unwrap();
                            assert_eq!(dssm, ssm, "the recurrent state as it is");
                            let d = dims[0];
                            let w = kernel_window(ring, d.conv_kernel, d.conv_dim(), n);
                            assert_eq!(&w[..], &conv[..], "the window where the step reads it");
                        }
                    }
                }
                assert!(kv.next().is_none() && gdn.next().is_none());
                assert_eq!(to_image(&layout, h).unwrap(), img, "{n} positions");
            }
        }

        #[test]
        fn an_image_or_device_state_that_does_not_fit_is_an_error() {
            let m = model();
            let layout = StateLayout::of(&m, KvElem::F32);
            let dims = dims(&m);
            let img = cpu_image(&m, 5);
            let err = |r: Result<HostState<'_>>| r.unwrap_err().to_string();
            // f32 rows into an f16 sequence.
            let f16 = StateLayout::of(&m, KvElem::F16);
            let e = err(from_image(&f16, img.clone(), 64, &dims));
            assert!(e.contains("rows are f32, expected f16"), "{e}");
            let e = err(from_image(&layout, img.clone(), 4, &dims));
            assert!(e.contains("does not fit a context of 4"), "{e}");
            let e = err(from_image(&layout, img.clone(), 64, &dims[1..]));
            assert!(e.contains("DeltaNet layers"), "{e}");
            let mut k3 = dims.clone();
            k3[0].conv_kernel = 3;
            let e = err(from_image(&layout, img.clone(), 64, &k3));
            assert!(e.contains("layer 0") || e.contains("DeltaNet state"), "{e}");
            let mut short = img.clone();
            short.layers.pop();
            let e = err(from_image(&layout, short, 64, &dims));
            assert!(e.contains("layers, the model has"), "{e}");
            // A device state with a layer missing or one too many.
            let h = from_image(&layout, img.clone(), 64, &dims).unwrap();
            let mut less = h.clone();
            less.kv.pop();
            let e = to_image(&layout, less).unwrap_err().to_string();
            assert!(e.contains("fewer attention layers"), "{e}");
            let mut more = h.clone();
            more.gdn.push(more.gdn[0].clone());
            let e = to_image(&layout, more).unwrap_err().to_string();
            assert!(e.contains("more layers"), "{e}");
            // f16 rows exported under an f32 layout.
            let mut h16 = h;
            for (k, v) in &mut h16.kv {
                *k = KvData::F16(Cow::Owned(vec![0; k.len()]));
                *v = KvData::F16(Cow::Owned(vec![0; v.len()]));
            }
            let e = to_image(&layout, h16).unwrap_err().to_string();
            assert!(e.contains("rows are f16, expected f32"), "{e}");
        }
    }

    #[test]
    fn mismatched_ring_and_window_sizes_are_errors() {
        assert!(ring_to_window(&[0.0; 12], 12, 0).is_err());
        assert!(ring_to_window(&[0.0; 12], 7, 0).is_err());
        assert!(ring_to_window(&[0.0; 4], 0, 0).is_err());
        assert!(window_to_ring(&[0.0; 7], 4, 0).is_err());
        assert!(window_to_ring(&[0.0; 6], 1, 0).is_err());
    }
}
