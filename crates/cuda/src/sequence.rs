//! The CUDA backend's [`Sequence`]: the whole-token decoder with the model
//! it reads embedding rows from, and checkpoints of its state kept in
//! device memory.
//!
//! A checkpoint copies, device to device, the KV rows of the filled
//! positions of every attention layer and the conv window and recurrent
//! state of every DeltaNet layer; restoring copies them back into the
//! buffers the captured graph reads, so the graph stays valid. The conv
//! window is a ring indexed by the position, which the checkpoint carries.
//!
//! For a state file a checkpoint is exported to the host in the layout
//! every backend shares and imported back ([`crate::state_image`] says
//! what is converted): the filled KV rows as they are, the recurrent
//! states as they are, the conv ring reordered into the CPU's window.

use crate::decoder::{CudaDecoder, DecoderOptions};
use crate::device::Gpu;
use crate::error::{bail, ensure, CudaError, Result};
use crate::ops::{KvCache, KvType};
use crate::state_image::{from_image, to_image, HostState};
use cudarc::driver::CudaSlice;
use redlite_model::sequence::{CacheCounters, Checkpoint, Sequence, TokenProfile};
use redlite_model::trace::TraceRecord;
use redlite_model::{KvData, KvElem, Logits, Model, ModelError, StateImage, StateLayout};
use std::borrow::Cow;
use std::sync::Arc;

/// The CUDA backend's name in messages and checkpoints.
pub const CUDA: &str = "cuda";

/// Fewer prompt tokens than this run as decode steps (one graph replay
/// each, ~2.7 ms a token on the 80B shapes) rather than as a batched
/// chunk, whose fixed cost (a host round trip per MoE layer for the
/// routing, ~150 launches) a few tokens do not repay; a single decoded
/// token always takes the graph.
pub const MIN_BATCHED_PREFILL: usize = 8;

/// One sequence on the GPU.
pub struct CudaSequence {
    model: Arc<Model>,
    dec: CudaDecoder,
    verify: VerifySlots,
    /// The KV caches' element type (what state files hold).
    kv_elem: KvElem,
}

/// A verify pass's DeltaNet snapshots: slot `i` holds every DeltaNet
/// layer's conv window and recurrent state after the pass's `i`-th token
/// (device-to-device copies, a few tens of microseconds a token on the 80B
/// shapes). KV rows need none: rows past the kept position are written
/// again before they are read. The slots are allocated on the first pass
/// that needs them and reused.
#[derive(Default)]
struct VerifySlots {
    slots: Vec<Vec<(CudaSlice<f32>, CudaSlice<f32>)>>,
    /// (position before the pass, tokens in it).
    pending: Option<(usize, usize)>,
}

/// Device copies of a sequence's state (see the module comment).
struct DeviceState {
    ctx: usize,
    pos: usize,
    /// Per attention layer: the K and V rows of positions `0..pos`.
    kv: Vec<Option<KvRows>>,
    /// Per DeltaNet layer: conv window, recurrent state.
    gdn: Vec<(CudaSlice<f32>, CudaSlice<f32>)>,
}

enum KvRows {
    F32(CudaSlice<f32>, CudaSlice<f32>),
    F16(CudaSlice<u16>, CudaSlice<u16>),
}

fn backend_err(e: CudaError) -> ModelError {
    ModelError::Backend {
        backend: CUDA,
        what: e.to_string(),
    }
}

/// The first `n` values of `src`, copied into a new device buffer.
fn head<T: cudarc::driver::DeviceRepr>(
    gpu: &Gpu,
    src: &CudaSlice<T>,
    n: usize,
) -> Result<CudaSlice<T>> {
    Ok(gpu.stream.clone_dtod(&src.slice(..n))?)
}

/// Values of one position's row in a cache of `ctx` rows.
fn row_len(len: usize, ctx: usize) -> usize {
    len / ctx.max(1)
}

impl CudaSequence {
    /// Upload `model`'s weights and capture the token graph for
    /// `opts.ctx` positions on `gpu`.
    pub fn new(gpu: Gpu, model: Arc<Model>, opts: &DecoderOptions) -> Result<CudaSequence> {
        let dec = CudaDecoder::new(gpu, &model, opts)?;
        let kv_elem = match opts.kv_type {
            KvType::F32 => KvElem::F32,
            KvType::F16 => KvElem::F16,
        };
        Ok(CudaSequence {
            model,
            dec,
            verify: VerifySlots::default(),
            kv_elem,
        })
    }

    /// The decoder underneath (device name, bytes, counters, profiling).
    pub fn decoder(&self) -> &CudaDecoder {
        &self.dec
    }

    pub fn decoder_mut(&mut self) -> &mut CudaDecoder {
        &mut self.dec
    }

    /// The model this sequence reads its embedding rows from.
    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    fn save(&mut self) -> Result<(DeviceState, u64)> {
        let b = self.dec.state_buffers();
        let pos = *b.pos;
        let mut bytes = 0u64;
        let mut kv = Vec::with_capacity(b.kv.len());
        for c in &b.kv {
            let rows = match &**c {
                KvCache::F32 { k, v } => {
                    let n = pos * row_len(k.len(), b.ctx);
                    bytes += 8 * n as u64;
                    (n > 0)
                        .then(|| -> Result<KvRows> {
                            Ok(KvRows::F32(head(b.gpu, k, n)?, head(b.gpu, v, n)?))
                        })
                        .transpose()?
                }
                KvCache::F16 { k, v } => {
                    let n = pos * row_len(k.len(), b.ctx);
                    bytes += 4 * n as u64;
                    (n > 0)
                        .then(|| -> Result<KvRows> {
                            Ok(KvRows::F16(head(b.gpu, k, n)?, head(b.gpu, v, n)?))
                        })
                        .transpose()?
                }
            };
            kv.push(rows);
        }
        let mut gdn = Vec::with_capacity(b.gdn.len());
        for (ring, state) in &b.gdn {
            bytes += 4 * (ring.len() + state.len()) as u64;
            gdn.push((
                b.gpu.stream.clone_dtod(&**ring)?,
                b.gpu.stream.clone_dtod(&**state)?,
            ));
        }
        b.gpu.sync()?;
        Ok((
            DeviceState {
                ctx: b.ctx,
                pos,
                kv,
                gdn,
            },
            bytes,
        ))
    }

    /// Copy the live DeltaNet state into verify slot `i`.
    fn snapshot(&mut self, i: usize) -> Result<()> {
        let b = self.dec.state_buffers();
        let stream = &b.gpu.stream;
        if self.verify.slots.len() <= i {
            let mut slot = Vec::with_capacity(b.gdn.len());
            for (ring, state) in &b.gdn {
                slot.push((stream.clone_dtod(&**ring)?, stream.clone_dtod(&**state)?));
            }
            self.verify.slots.push(slot);
        } else {
            for ((ring, state), (sr, ss)) in b.gdn.iter().zip(&mut self.verify.slots[i]) {
                stream.memcpy_dtod(&**ring, sr)?;
                stream.memcpy_dtod(&**state, ss)?;
            }
        }
        Ok(())
    }

    /// Copy verify slot `i` back into the live DeltaNet state.
    fn roll_back_to(&mut self, i: usize) -> Result<()> {
        let b = self.dec.state_buffers();
        let stream = &b.gpu.stream;
        for ((ring, state), (sr, ss)) in b.gdn.into_iter().zip(&self.verify.slots[i]) {
            stream.memcpy_dtod(sr, ring)?;
            stream.memcpy_dtod(ss, state)?;
        }
        b.gpu.sync()
    }

    fn load(&mut self, s: &DeviceState) -> Result<()> {
        let b = self.dec.state_buffers();
        ensure!(
            s.ctx == b.ctx && s.kv.len() == b.kv.len() && s.gdn.len() == b.gdn.len(),
            "a checkpoint of another decoder shape ({} positions, {} attention and {} DeltaNet layers) restored into one of {} positions, {} and {}",
            s.ctx,
            s.kv.len(),
            s.gdn.len(),
            b.ctx,
            b.kv.len(),
            b.gdn.len()
        );
        let stream = &b.gpu.stream;
        // KV rows at and past `pos` are written before they are read (the
        // attention reads positions 0..=pos after appending pos), so only
        // the filled rows are copied back.
        for (dst, src) in b.kv.into_iter().zip(&s.kv) {
            match (dst, src) {
                (_, None) => {}
                (KvCache::F32 { k, v }, Some(KvRows::F32(sk, sv))) => {
                    stream.memcpy_dtod(sk, &mut k.slice_mut(..sk.len()))?;
                    stream.memcpy_dtod(sv, &mut v.slice_mut(..sv.len()))?;
                }
                (KvCache::F16 { k, v }, Some(KvRows::F16(sk, sv))) => {
                    stream.memcpy_dtod(sk, &mut k.slice_mut(..sk.len()))?;
                    stream.memcpy_dtod(sv, &mut v.slice_mut(..sv.len()))?;
                }
                _ => bail!("a checkpoint with another KV element type"),
            }
        }
        for ((ring, state), (sr, ss)) in b.gdn.into_iter().zip(&s.gdn) {
            stream.memcpy_dtod(sr, ring)?;
            stream.memcpy_dtod(ss, state)?;
        }
        b.gpu.sync()?;
        *b.pos = s.pos;
        Ok(())
    }
}

/// Bytes a device state holds (the checkpoint's accounting).
fn state_bytes(s: &DeviceState) -> u64 {
    let kv: u64 =
        s.kv.iter()
            .flatten()
            .map(|r| match r {
                KvRows::F32(k, v) => 4 * (k.len() + v.len()) as u64,
                KvRows::F16(k, v) => 2 * (k.len() + v.len()) as u64,
            })
            .sum();
    let gdn: u64 = s
        .gdn
        .iter()
        .map(|(r, st)| 4 * (r.len() + st.len()) as u64)
        .sum();
    kv + gdn
}

impl CudaSequence {
    /// The layout of this sequence's states (the model's layers, this
    /// sequence's KV element type).
    fn layout(&self) -> StateLayout {
        StateLayout::of(&self.model, self.kv_elem)
    }

    /// `s` copied to the host in the shared layout, per model layer.
    fn export(&self, s: &DeviceState) -> Result<StateImage<'static>> {
        let gpu = self.dec.gpu();
        let stream = &gpu.stream;
        // Finish whatever still writes the buffers (the checkpoint's copies).
        gpu.sync()?;
        let empty = |e: KvElem| match e {
            KvElem::F32 => KvData::F32(Cow::Owned(Vec::new())),
            KvElem::F16 => KvData::F16(Cow::Owned(Vec::new())),
        };
        let mut kv = Vec::with_capacity(s.kv.len());
        for rows in &s.kv {
            kv.push(match rows {
                None => (empty(self.kv_elem), empty(self.kv_elem)),
                Some(KvRows::F32(k, v)) => (
                    KvData::F32(Cow::Owned(stream.clone_dtoh(k)?)),
                    KvData::F32(Cow::Owned(stream.clone_dtoh(v)?)),
                ),
                Some(KvRows::F16(k, v)) => (
                    KvData::F16(Cow::Owned(stream.clone_dtoh(k)?)),
                    KvData::F16(Cow::Owned(stream.clone_dtoh(v)?)),
                ),
            });
        }
        let mut gdn = Vec::with_capacity(s.gdn.len());
        for (ring, state) in &s.gdn {
            gdn.push((
                stream.clone_dtoh(ring)?,
                Cow::Owned(stream.clone_dtoh(state)?),
            ));
        }
        gpu.sync()?;
        to_image(
            &self.layout(),
            HostState {
                pos: s.pos,
                kv,
                gdn,
            },
        )
    }

    /// A device state from a host image, checked against the model's
    /// layout, this sequence's KV type, its context and its DeltaNet
    /// shapes first.
    fn import(&self, image: StateImage<'_>) -> Result<DeviceState> {
        let ctx = self.dec.ctx();
        let (n_attn, dims) = self.dec.state_shapes();
        let h = from_image(&self.layout(), image, ctx, &dims)?;
        ensure!(
            h.kv.len() == n_attn,
            "the decoder has {n_attn} attention layers, the state {}",
            h.kv.len()
        );
        let gpu = self.dec.gpu();
        let stream = &gpu.stream;
        let mut kv = Vec::with_capacity(h.kv.len());
        for (k, v) in &h.kv {
            kv.push(match (k, v) {
                _ if k.is_empty() => None,
                (KvData::F32(k), KvData::F32(v)) => Some(KvRows::F32(
                    stream.clone_htod(&k[..])?,
                    stream.clone_htod(&v[..])?,
                )),
                (KvData::F16(k), KvData::F16(v)) => Some(KvRows::F16(
                    stream.clone_htod(&k[..])?,
                    stream.clone_htod(&v[..])?,
                )),
                _ => bail!("K and V rows of different types"),
            });
        }
        let mut gdn = Vec::with_capacity(h.gdn.len());
        for (ring, ssm) in &h.gdn {
            gdn.push((stream.clone_htod(&ring[..])?, stream.clone_htod(&ssm[..])?));
        }
        // The host buffers must outlive the copies.
        gpu.sync()?;
        Ok(DeviceState {
            ctx,
            pos: h.pos,
            kv,
            gdn,
        })
    }
}

impl CudaSequence {
    fn check_tokens(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::NoTokens);
        }
        let ctx = self.ctx_len();
        if self.pos() + tokens.len() > ctx {
            return Err(ModelError::ContextOverflow {
                pos: self.pos(),
                n_tokens: tokens.len(),
                ctx_len: ctx,
            });
        }
        let n_vocab = self.model.n_vocab();
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::BadToken {
                token: bad,
                n_vocab,
            });
        }
        Ok(())
    }
}

impl Sequence for CudaSequence {
    /// Exact: the pass runs its tokens as decode steps (one graph replay
    /// each, so every row is the decode's logits), snapshotting the
    /// DeltaNet state after each; `accept` copies the kept position's
    /// snapshot back. A pass costs its tokens' decode steps: no faster than
    /// plain decoding yet (a small-batch graph is what would make it pay).
    fn verify(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        self.verify.pending = None;
        self.check_tokens(tokens)?;
        let start = self.pos();
        self.snapshot(0).map_err(backend_err)?;
        let mut all = Vec::with_capacity(tokens.len() * self.model.n_vocab());
        for (i, &t) in tokens.iter().enumerate() {
            let l = self.dec.step(&self.model, t).map_err(backend_err)?;
            all.extend(l);
            if i + 1 < tokens.len() {
                self.snapshot(i + 1).map_err(backend_err)?;
            }
        }
        self.verify.pending = Some((start, tokens.len()));
        Ok(all)
    }

    fn accept(&mut self, keep: usize) -> Result<(), ModelError> {
        let Some((start, n)) = self.verify.pending.take() else {
            return Err(ModelError::Rollback(
                "keep without a verify pass before it".into(),
            ));
        };
        if keep > n {
            return Err(ModelError::Rollback(format!(
                "keeping {keep} tokens of a pass of {n}"
            )));
        }
        if keep < n {
            self.roll_back_to(keep).map_err(backend_err)?;
            self.dec.set_pos(start + keep).map_err(backend_err)?;
        }
        Ok(())
    }

    fn prefill(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, ModelError> {
        self.verify.pending = None;
        self.check_tokens(tokens)?;
        if self.dec.batched_prefill() && tokens.len() >= MIN_BATCHED_PREFILL {
            return self
                .dec
                .prefill(&self.model, tokens, want == Logits::All)
                .map_err(backend_err);
        }
        // Token by token: one graph replay each (a bounded expert cache,
        // or --ubatch 0).
        let mut all = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            let last = i + 1 == tokens.len();
            if want == Logits::All || last {
                let l = self.dec.step(&self.model, t).map_err(backend_err)?;
                all.extend(l);
            } else {
                self.dec
                    .step_no_logits(&self.model, t)
                    .map_err(backend_err)?;
            }
        }
        Ok(all)
    }

    fn pos(&self) -> usize {
        self.dec.pos()
    }

    fn ctx_len(&self) -> usize {
        self.dec.ctx()
    }

    fn reset(&mut self) -> Result<(), ModelError> {
        self.verify.pending = None;
        self.dec.reset().map_err(backend_err)
    }

    fn checkpoint(&mut self) -> Result<Checkpoint, ModelError> {
        let (state, bytes) = self.save().map_err(backend_err)?;
        Ok(Checkpoint::new(CUDA, state.pos, bytes, Box::new(state)))
    }

    fn restore(&mut self, checkpoint: &Checkpoint) -> Result<(), ModelError> {
        let s: &DeviceState = checkpoint.state(CUDA)?;
        self.verify.pending = None;
        self.load(s).map_err(backend_err)
    }

    fn kv_elem(&self) -> KvElem {
        self.kv_elem
    }

    fn export_checkpoint<'a>(
        &self,
        checkpoint: &'a Checkpoint,
    ) -> Result<StateImage<'a>, ModelError> {
        let s: &DeviceState = checkpoint.state(CUDA)?;
        self.export(s).map_err(backend_err)
    }

    fn import_checkpoint(&self, image: StateImage<'_>) -> Result<Checkpoint, ModelError> {
        let s = self.import(image).map_err(backend_err)?;
        let bytes = state_bytes(&s);
        Ok(Checkpoint::new(CUDA, s.pos, bytes, Box::new(s)))
    }

    fn skip_to(&mut self, pos: usize) -> Result<(), ModelError> {
        self.dec.set_pos(pos).map_err(backend_err)
    }

    fn take_trace(&mut self) -> Vec<TraceRecord> {
        Vec::new()
    }

    fn last_routes(&self) -> Result<Vec<Vec<u32>>, ModelError> {
        self.dec.routes().map_err(backend_err)
    }

    fn cache_counters(&self) -> Result<Option<CacheCounters>, ModelError> {
        Ok(self
            .dec
            .cache_totals()
            .map_err(backend_err)?
            .map(|(c, bytes)| CacheCounters {
                hits: c.hits,
                misses: c.misses,
                prefetched: c.prefetched,
                prefetch_used: c.prefetch_used,
                bytes_moved: bytes,
            }))
    }

    fn profile_prefill(&mut self, tokens: &[u32]) -> Result<TokenProfile, ModelError> {
        let p = self
            .dec
            .profile_prefill(&self.model, tokens)
            .map_err(backend_err)?;
        Ok(TokenProfile {
            rows: p.rows,
            total_us: p.total_us,
            plain_us: p.plain_us,
        })
    }

    fn profile(&mut self, token: u32, reps: usize) -> Result<TokenProfile, ModelError> {
        let p = self
            .dec
            .profile(&self.model, token, reps)
            .map_err(backend_err)?;
        Ok(TokenProfile {
            rows: p.rows,
            total_us: p.total_us,
            plain_us: p.plain_us,
        })
    }

    fn backend(&self) -> &'static str {
        CUDA
    }
}
