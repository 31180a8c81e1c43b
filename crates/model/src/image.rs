//! A checkpoint in host memory in a layout every backend shares: what a
//! state file holds between the file format and a backend's own state.
//!
//! A backend exports a [`Checkpoint`](crate::Checkpoint) it made into a
//! [`StateImage`] (the CPU lends its vectors; a GPU copies its device
//! buffers to the host) and imports one back into a checkpoint. The image
//! is checked against the [`StateLayout`] the model and backend expect
//! before anything is built from it.

use crate::blocks::attention::KvCache;
use crate::blocks::deltanet::RecurrentState;
use crate::session::{LayerState, Session};
use crate::{Model, ModelError};
use std::borrow::Cow;

/// The element type of the K and V rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvElem {
    F32,
    F16,
}

impl KvElem {
    pub fn name(self) -> &'static str {
        match self {
            KvElem::F32 => "f32",
            KvElem::F16 => "f16",
        }
    }

    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            KvElem::F32 => 4,
            KvElem::F16 => 2,
        }
    }

    /// The id written in state files.
    pub fn id(self) -> u32 {
        match self {
            KvElem::F32 => 0,
            KvElem::F16 => 1,
        }
    }

    pub fn from_id(id: u32) -> Option<KvElem> {
        match id {
            0 => Some(KvElem::F32),
            1 => Some(KvElem::F16),
            _ => None,
        }
    }
}

/// K or V rows of the filled positions, position-major (`pos × row`).
#[derive(Clone, Debug, PartialEq)]
pub enum KvData<'a> {
    F32(Cow<'a, [f32]>),
    /// f16 bit patterns.
    F16(Cow<'a, [u16]>),
}

impl KvData<'_> {
    pub fn elem(&self) -> KvElem {
        match self {
            KvData::F32(_) => KvElem::F32,
            KvData::F16(_) => KvElem::F16,
        }
    }

    /// Elements held.
    pub fn len(&self) -> usize {
        match self {
            KvData::F32(v) => v.len(),
            KvData::F16(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One layer's state.
#[derive(Clone, Debug, PartialEq)]
pub enum LayerImage<'a> {
    /// An attention layer's K and V rows.
    Kv { k: KvData<'a>, v: KvData<'a> },
    /// A DeltaNet layer's conv window and recurrent state.
    Recurrent {
        conv: Cow<'a, [f32]>,
        ssm: Cow<'a, [f32]>,
    },
}

/// A whole sequence state at `pos`, in host memory.
#[derive(Clone, Debug, PartialEq)]
pub struct StateImage<'a> {
    pub pos: usize,
    pub layers: Vec<LayerImage<'a>>,
}

/// What one layer's state must look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerShape {
    /// Elements of one position's K row (the same for V).
    Kv { row: usize },
    /// Elements of the conv window and of the recurrent state.
    Recurrent { conv: usize, ssm: usize },
}

/// The shape of a state: per layer, and the KV element type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateLayout {
    pub kv_elem: KvElem,
    pub layers: Vec<LayerShape>,
}

impl StateLayout {
    /// The layout of `model`'s states with K and V rows of `kv_elem`.
    pub fn of(model: &Model, kv_elem: KvElem) -> StateLayout {
        let (n_kv, head_dim) = model.arch().kv_dims();
        let layers = model
            .arch()
            .new_states()
            .iter()
            .map(|s| match s {
                LayerState::Kv(_) => LayerShape::Kv {
                    row: n_kv * head_dim,
                },
                LayerState::Recurrent(r) => LayerShape::Recurrent {
                    conv: r.conv.len(),
                    ssm: r.ssm.len(),
                },
            })
            .collect();
        StateLayout { kv_elem, layers }
    }

    /// Bytes of the layer data of a state at `pos` (None on overflow).
    pub fn data_bytes(&self, pos: usize) -> Option<u64> {
        let mut total = 0u64;
        for l in &self.layers {
            let b = match *l {
                LayerShape::Kv { row } => (row as u64)
                    .checked_mul(pos as u64)?
                    .checked_mul(2 * self.kv_elem.size() as u64)?,
                LayerShape::Recurrent { conv, ssm } => (conv as u64 + ssm as u64) * 4,
            };
            total = total.checked_add(b)?;
        }
        Some(total)
    }
}

impl StateImage<'_> {
    /// Check every layer against `layout`; the first difference is named.
    pub fn check(&self, layout: &StateLayout) -> Result<(), String> {
        if self.layers.len() != layout.layers.len() {
            return Err(format!(
                "{} layers, the model has {}",
                self.layers.len(),
                layout.layers.len()
            ));
        }
        for (i, (l, shape)) in self.layers.iter().zip(&layout.layers).enumerate() {
            match (l, *shape) {
                (LayerImage::Kv { k, v }, LayerShape::Kv { row }) => {
                    let want = row * self.pos;
                    for (name, d) in [("K", k), ("V", v)] {
                        if d.elem() != layout.kv_elem {
                            return Err(format!(
                                "layer {i}: {name} rows are {}, expected {}",
                                d.elem().name(),
                                layout.kv_elem.name()
                            ));
                        }
                        if d.len() != want {
                            return Err(format!(
                                "layer {i}: {} {name} elements, expected {want} ({} positions of {row})",
                                d.len(),
                                self.pos
                            ));
                        }
                    }
                }
                (
                    LayerImage::Recurrent { conv: c, ssm: s },
                    LayerShape::Recurrent { conv, ssm },
                ) => {
                    if c.len() != conv || s.len() != ssm {
                        return Err(format!(
                            "layer {i}: recurrent state of {} + {} elements, expected {conv} + {ssm}",
                            c.len(),
                            s.len()
                        ));
                    }
                }
                (LayerImage::Kv { .. }, _) => {
                    return Err(format!(
                        "layer {i}: KV rows where the model has a DeltaNet layer"
                    ))
                }
                (LayerImage::Recurrent { .. }, _) => {
                    return Err(format!(
                        "layer {i}: a DeltaNet state where the model has an attention layer"
                    ))
                }
            }
        }
        Ok(())
    }
}

/// The image of a CPU session: its vectors, lent.
pub(crate) fn session_image(s: &Session) -> StateImage<'_> {
    let layers = s
        .states()
        .iter()
        .map(|st| match st {
            LayerState::Kv(kv) => LayerImage::Kv {
                k: KvData::F32(Cow::Borrowed(&kv.k[..])),
                v: KvData::F32(Cow::Borrowed(&kv.v[..])),
            },
            LayerState::Recurrent(r) => LayerImage::Recurrent {
                conv: Cow::Borrowed(&r.conv[..]),
                ssm: Cow::Borrowed(&r.ssm[..]),
            },
        })
        .collect();
    StateImage {
        pos: s.pos(),
        layers,
    }
}

/// A CPU session of `ctx_len` positions from a checked image.
pub(crate) fn session_from_image(
    model: &Model,
    image: StateImage<'_>,
    ctx_len: usize,
) -> Result<Session, ModelError> {
    let bad = |what: String| ModelError::Backend {
        backend: crate::sequence::CPU,
        what,
    };
    image
        .check(&StateLayout::of(model, KvElem::F32))
        .map_err(|e| bad(format!("the state does not fit this model: {e}")))?;
    if image.pos > ctx_len {
        return Err(bad(format!(
            "a state of {} positions does not fit a context of {ctx_len}",
            image.pos
        )));
    }
    let pos = image.pos;
    let mut states = Vec::with_capacity(image.layers.len());
    for l in image.layers {
        states.push(match l {
            LayerImage::Kv {
                k: KvData::F32(k),
                v: KvData::F32(v),
            } => LayerState::Kv(KvCache {
                k: k.into_owned(),
                v: v.into_owned(),
                len: pos,
            }),
            LayerImage::Recurrent { conv, ssm } => LayerState::Recurrent(
                RecurrentState::from_parts(conv.into_owned(), ssm.into_owned()),
            ),
            // check() above refused f16 rows for the f32 layout.
            LayerImage::Kv { .. } => return Err(bad("f16 KV rows on the CPU".into())),
        });
    }
    Ok(Session::from_states(states, pos, ctx_len))
}
