//! The byte layout: writing and checked reading.
//!
//! ```text
//! magic "RLSTATE\0" | version u32 | header_len u32 | header | header crc32 u32
//! | tokens u32 × pos | logits f32 × n_logits
//! | per layer: K then V (pos × row elements of the KV type), or conv then ssm (f32)
//! | crc32 u32 of every byte before it
//! ```
//!
//! The header's own CRC lets a corrupted header be reported as corruption
//! rather than as "another model"; the sizes it gives are checked against
//! the model and the file's length before anything is allocated.

use crate::{ModelId, StateError, StateFile, MAGIC, VERSION};
use redlite_model::{KvData, KvElem, LayerImage, LayerShape, StateImage, StateLayout};
use redlite_outfile::Output;
use std::borrow::Cow;
use std::fs::File;
use std::io::{BufReader, Read, Write};
use std::path::Path;

/// A header longer than this is refused before it is read.
const MAX_HEADER: u32 = 1 << 20;
/// Bytes converted per write or read call.
const CHUNK: usize = 1 << 20;

/// What a loaded file must match.
#[derive(Clone, Debug)]
pub struct Expect {
    pub model: ModelId,
    pub layout: StateLayout,
    /// Positions the sequence it is loaded into holds.
    pub ctx_len: usize,
}

/// What a save wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SaveStats {
    pub bytes: u64,
}

pub(crate) struct CrcWriter<W: Write> {
    pub(crate) w: W,
    pub(crate) crc: crc32fast::Hasher,
    pub(crate) n: u64,
}

impl<W: Write> CrcWriter<W> {
    pub(crate) fn put(&mut self, b: &[u8]) -> std::io::Result<()> {
        self.crc.update(b);
        self.n += b.len() as u64;
        self.w.write_all(b)
    }
    pub(crate) fn u32(&mut self, x: u32) -> std::io::Result<()> {
        self.put(&x.to_le_bytes())
    }
    pub(crate) fn f32s(&mut self, v: &[f32]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(CHUNK.min(v.len() * 4));
        for c in v.chunks(CHUNK / 4) {
            buf.clear();
            c.iter()
                .for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
            self.put(&buf)?;
        }
        Ok(())
    }
    fn u16s(&mut self, v: &[u16]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(CHUNK.min(v.len() * 2));
        for c in v.chunks(CHUNK / 2) {
            buf.clear();
            c.iter()
                .for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
            self.put(&buf)?;
        }
        Ok(())
    }
}

fn header_bytes(sf: &StateFile<'_>) -> Vec<u8> {
    let mut h = Vec::new();
    let arch = sf.model.arch.as_bytes();
    h.extend_from_slice(&(arch.len() as u32).to_le_bytes());
    h.extend_from_slice(arch);
    h.extend_from_slice(&sf.model.tensor_hash.to_le_bytes());
    h.extend_from_slice(&sf.model.n_tensors.to_le_bytes());
    h.extend_from_slice(&sf.model.n_vocab.to_le_bytes());
    h.extend_from_slice(&sf.kv_elem.id().to_le_bytes());
    h.extend_from_slice(&sf.ctx_len.to_le_bytes());
    h.extend_from_slice(&(sf.image.pos as u64).to_le_bytes());
    h.extend_from_slice(&u32::from(sf.rng.is_some()).to_le_bytes());
    h.extend_from_slice(&sf.rng.unwrap_or(0).to_le_bytes());
    h.extend_from_slice(&(sf.logits.len() as u64).to_le_bytes());
    h.extend_from_slice(&(sf.image.layers.len() as u32).to_le_bytes());
    for l in &sf.image.layers {
        let (kind, a, b) = match l {
            LayerImage::Kv { k, v } => (0u32, k.len() as u64, v.len() as u64),
            LayerImage::Recurrent { conv, ssm } => (1u32, conv.len() as u64, ssm.len() as u64),
        };
        h.extend_from_slice(&kind.to_le_bytes());
        h.extend_from_slice(&a.to_le_bytes());
        h.extend_from_slice(&b.to_le_bytes());
    }
    h
}

/// Write `sf` to `path` atomically (nothing appears at `path` until the
/// whole file is written and synced; an existing file is replaced only
/// then). `inputs` are the run's input files, which `path` must not be.
pub fn write(path: &Path, inputs: &[&Path], sf: &StateFile<'_>) -> Result<SaveStats, StateError> {
    let invalid = |what: String| StateError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    if sf.tokens.len() != sf.image.pos {
        return Err(invalid(format!(
            "{} tokens for a state of {} positions",
            sf.tokens.len(),
            sf.image.pos
        )));
    }
    for l in &sf.image.layers {
        if let LayerImage::Kv { k, v } = l {
            if k.elem() != sf.kv_elem || v.elem() != sf.kv_elem {
                return Err(invalid(
                    "KV rows of another element type than the header's".into(),
                ));
            }
        }
    }
    let out = Output::create(path, inputs)?;
    let mut w = CrcWriter {
        w: out,
        crc: crc32fast::Hasher::new(),
        n: 0,
    };
    let io = |e| StateError::Io {
        path: path.to_path_buf(),
        op: "write",
        source: e,
    };
    let header = header_bytes(sf);
    w.put(&MAGIC).map_err(io)?;
    w.u32(VERSION).map_err(io)?;
    w.u32(header.len() as u32).map_err(io)?;
    w.put(&header).map_err(io)?;
    w.u32(crc32fast::hash(&header)).map_err(io)?;
    let mut toks = Vec::with_capacity(sf.tokens.len() * 4);
    sf.tokens
        .iter()
        .for_each(|t| toks.extend_from_slice(&t.to_le_bytes()));
    w.put(&toks).map_err(io)?;
    w.f32s(&sf.logits).map_err(io)?;
    for l in &sf.image.layers {
        match l {
            LayerImage::Kv { k, v } => {
                for d in [k, v] {
                    match d {
                        KvData::F32(x) => w.f32s(x),
                        KvData::F16(x) => w.u16s(x),
                    }
                    .map_err(io)?;
                }
            }
            LayerImage::Recurrent { conv, ssm } => {
                w.f32s(conv).map_err(io)?;
                w.f32s(ssm).map_err(io)?;
            }
        }
    }
    let crc = w.crc.clone().finalize();
    let n = w.n + 4;
    let mut out = w.w;
    out.write_all(&crc.to_le_bytes()).map_err(io)?;
    out.commit()?;
    Ok(SaveStats { bytes: n })
}

/// A reader that keeps the CRC of what it returned and names the section
/// a short read happened in.
struct CrcReader<'p, R: Read> {
    r: R,
    crc: crc32fast::Hasher,
    path: &'p Path,
    at: u64,
}

impl<R: Read> CrcReader<'_, R> {
    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<(), StateError> {
        self.raw(buf, what)?;
        self.crc.update(buf);
        Ok(())
    }
    /// Read without adding to the CRC (the stored CRCs themselves).
    fn raw(&mut self, buf: &mut [u8], what: &str) -> Result<(), StateError> {
        match self.r.read_exact(buf) {
            Ok(()) => {
                self.at += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(StateError::Truncated {
                path: self.path.to_path_buf(),
                what: format!("the file ends in {what} (after byte {})", self.at),
            }),
            Err(e) => Err(StateError::Io {
                path: self.path.to_path_buf(),
                op: "read",
                source: e,
            }),
        }
    }
    fn u32(&mut self, what: &str) -> Result<u32, StateError> {
        let mut b = [0u8; 4];
        self.fill(&mut b, what)?;
        Ok(u32::from_le_bytes(b))
    }
    fn f32s(&mut self, n: usize, what: &str) -> Result<Vec<f32>, StateError> {
        let mut v = Vec::with_capacity(n);
        let mut buf = vec![0u8; CHUNK.min(n * 4)];
        let mut left = n;
        while left > 0 {
            let m = left.min(CHUNK / 4);
            self.fill(&mut buf[..m * 4], what)?;
            v.extend(
                buf[..m * 4]
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            );
            left -= m;
        }
        Ok(v)
    }
    fn u16s(&mut self, n: usize, what: &str) -> Result<Vec<u16>, StateError> {
        let mut v = Vec::with_capacity(n);
        let mut buf = vec![0u8; CHUNK.min(n * 2)];
        let mut left = n;
        while left > 0 {
            let m = left.min(CHUNK / 2);
            self.fill(&mut buf[..m * 2], what)?;
            v.extend(
                buf[..m * 2]
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]])),
            );
            left -= m;
        }
        Ok(v)
    }
}

/// Fields of a header, read from its bytes.
struct Cursor<'a> {
    b: &'a [u8],
}

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.b.len() < n {
            return None;
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Some(h)
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Option<u64> {
        self.take(8).map(|b| {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            u64::from_le_bytes(a)
        })
    }
}

struct Header {
    model: ModelId,
    kv_elem: u32,
    ctx_len: u64,
    pos: u64,
    rng: Option<u64>,
    n_logits: u64,
    layers: Vec<(u32, u64, u64)>,
}

fn parse_header(b: &[u8]) -> Option<Header> {
    let mut c = Cursor { b };
    let arch_len = c.u32()? as usize;
    let arch = String::from_utf8_lossy(c.take(arch_len)?).into_owned();
    let tensor_hash = c.u64()?;
    let n_tensors = c.u64()?;
    let n_vocab = c.u64()?;
    let kv_elem = c.u32()?;
    let ctx_len = c.u64()?;
    let pos = c.u64()?;
    let has_rng = c.u32()?;
    let rng = c.u64()?;
    let n_logits = c.u64()?;
    let n_layers = c.u32()? as usize;
    // Each layer entry is 20 bytes: a count past the header is refused
    // before the vector is sized.
    if n_layers > c.b.len() / 20 {
        return None;
    }
    let mut layers = Vec::with_capacity(n_layers);
    for _ in 0..n_layers {
        layers.push((c.u32()?, c.u64()?, c.u64()?));
    }
    if !c.b.is_empty() {
        return None;
    }
    Some(Header {
        model: ModelId {
            arch,
            tensor_hash,
            n_tensors,
            n_vocab,
        },
        kv_elem,
        ctx_len,
        pos,
        rng: (has_rng != 0).then_some(rng),
        n_logits,
        layers,
    })
}

/// A file opened and its header checked, the reader at the tokens.
struct Opened<'p> {
    r: CrcReader<'p, BufReader<File>>,
    h: Header,
    kv_elem: KvElem,
    pos: usize,
}

/// Open `path` and check everything the header says against `expect`
/// and the file's length.
fn open_checked<'p>(path: &'p Path, expect: &Expect) -> Result<Opened<'p>, StateError> {
    let p = path.to_path_buf();
    let f = File::open(path).map_err(|e| StateError::Io {
        path: p.clone(),
        op: "open",
        source: e,
    })?;
    let file_len = f
        .metadata()
        .map_err(|e| StateError::Io {
            path: p.clone(),
            op: "stat",
            source: e,
        })?
        .len();
    let mut r = CrcReader {
        r: BufReader::with_capacity(CHUNK, f),
        crc: crc32fast::Hasher::new(),
        path,
        at: 0,
    };
    let mut magic = [0u8; 8];
    let got = r.r.read(&mut magic).map_err(|e| StateError::Io {
        path: p.clone(),
        op: "read",
        source: e,
    })?;
    if got < magic.len() && magic[..got] == MAGIC[..got] {
        // A short read of a good prefix: read the rest or report truncation.
        r.at = got as u64;
        r.raw(&mut magic[got..], "the magic")?;
    } else if got < magic.len() {
        return Err(StateError::Magic {
            path: p,
            found: magic[..got].to_vec(),
        });
    }
    if magic != MAGIC {
        return Err(StateError::Magic {
            path: p,
            found: magic.to_vec(),
        });
    }
    r.at = 8;
    r.crc.update(&magic);
    let version = r.u32("the version")?;
    if version != VERSION {
        return Err(StateError::Version {
            path: p,
            found: version,
        });
    }
    let header_len = r.u32("the header length")?;
    if header_len > MAX_HEADER {
        return Err(StateError::Invalid {
            path: p,
            what: format!("a header of {header_len} bytes (at most {MAX_HEADER})"),
        });
    }
    let mut hb = vec![0u8; header_len as usize];
    r.fill(&mut hb, "the header")?;
    let mut hc = [0u8; 4];
    r.fill(&mut hc, "the header checksum")?;
    let stored = u32::from_le_bytes(hc);
    let computed = crc32fast::hash(&hb);
    if stored != computed {
        return Err(StateError::Checksum {
            path: p,
            stored,
            computed,
        });
    }
    let h = parse_header(&hb).ok_or_else(|| StateError::Invalid {
        path: p.clone(),
        what: "the header's fields do not fill its length".into(),
    })?;
    if let Some(what) = h.model.difference(&expect.model) {
        return Err(StateError::OtherModel { path: p, what });
    }
    let kv_elem = KvElem::from_id(h.kv_elem).ok_or_else(|| StateError::Invalid {
        path: p.clone(),
        what: format!("unknown KV element type id {}", h.kv_elem),
    })?;
    if kv_elem != expect.layout.kv_elem {
        return Err(StateError::KvType {
            path: p,
            found: kv_elem.name(),
            expected: expect.layout.kv_elem.name(),
        });
    }
    let invalid = |what: String| StateError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    if h.pos > expect.ctx_len as u64 {
        return Err(invalid(format!(
            "a state of {} positions does not fit the context of {} (raise --ctx-size)",
            h.pos, expect.ctx_len
        )));
    }
    let pos = h.pos as usize;
    let want_logits = if pos == 0 { 0 } else { h.model.n_vocab };
    if h.n_logits != want_logits {
        return Err(invalid(format!(
            "{} logits, expected {want_logits}",
            h.n_logits
        )));
    }
    if h.layers.len() != expect.layout.layers.len() {
        return Err(invalid(format!(
            "{} layers, the model has {}",
            h.layers.len(),
            expect.layout.layers.len()
        )));
    }
    for (i, (&(kind, a, b), shape)) in h.layers.iter().zip(&expect.layout.layers).enumerate() {
        let ok = match *shape {
            LayerShape::Kv { row } => {
                let n = (row as u64) * h.pos;
                kind == 0 && a == n && b == n
            }
            LayerShape::Recurrent { conv, ssm } => kind == 1 && a == conv as u64 && b == ssm as u64,
        };
        if !ok {
            return Err(invalid(format!(
                "layer {i}: kind {kind} of {a} + {b} elements, the model expects {shape:?} at {pos} positions"
            )));
        }
    }
    let data = expect
        .layout
        .data_bytes(pos)
        .ok_or_else(|| invalid("the state's size overflows".into()))?;
    let expected_len = 8 + 4 + 4 + header_len as u64 + 4 + h.pos * 4 + h.n_logits * 4 + data + 4;
    if file_len < expected_len {
        return Err(StateError::Truncated {
            path: p,
            what: format!("the file is {file_len} bytes, its header describes {expected_len}"),
        });
    }
    if file_len > expected_len {
        return Err(invalid(format!(
            "the file is {file_len} bytes, its header describes {expected_len} (trailing bytes)"
        )));
    }
    Ok(Opened { r, h, kv_elem, pos })
}

/// The tokens a state file covers, with its header checked against
/// `expect` (the layer data and the whole-file checksum are not read: a
/// prompt cache indexes its files with this, then [`read`]s the one it
/// uses).
pub fn read_tokens(path: &Path, expect: &Expect) -> Result<Vec<u32>, StateError> {
    let Opened { mut r, pos, .. } = open_checked(path, expect)?;
    let mut tb = vec![0u8; pos * 4];
    r.fill(&mut tb, "the tokens")?;
    Ok(tb
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// Read and check the state file at `path` against `expect`. Every size is
/// checked against the model and the file's length before it is read, and
/// nothing is returned unless the whole file's checksum matches.
pub fn read(path: &Path, expect: &Expect) -> Result<StateFile<'static>, StateError> {
    let p = path.to_path_buf();
    let invalid = |what: String| StateError::Invalid {
        path: path.to_path_buf(),
        what,
    };
    let Opened {
        mut r,
        h,
        kv_elem,
        pos,
    } = open_checked(path, expect)?;
    let mut tb = vec![0u8; pos * 4];
    r.fill(&mut tb, "the tokens")?;
    let tokens: Vec<u32> = tb
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let logits = r.f32s(h.n_logits as usize, "the logits")?;
    let mut layers = Vec::with_capacity(h.layers.len());
    for (i, &(kind, a, b)) in h.layers.iter().enumerate() {
        let what = format!("layer {i}");
        layers.push(if kind == 0 {
            let mut kv = Vec::with_capacity(2);
            for n in [a, b] {
                kv.push(match kv_elem {
                    KvElem::F32 => KvData::F32(Cow::Owned(r.f32s(n as usize, &what)?)),
                    KvElem::F16 => KvData::F16(Cow::Owned(r.u16s(n as usize, &what)?)),
                });
            }
            let v = kv.pop().expect("two entries");
            let k = kv.pop().expect("two entries");
            LayerImage::Kv { k, v }
        } else {
            LayerImage::Recurrent {
                conv: Cow::Owned(r.f32s(a as usize, &what)?),
                ssm: Cow::Owned(r.f32s(b as usize, &what)?),
            }
        });
    }
    let computed = r.crc.clone().finalize();
    let mut sc = [0u8; 4];
    r.raw(&mut sc, "the checksum")?;
    let stored = u32::from_le_bytes(sc);
    if stored != computed {
        return Err(StateError::Checksum {
            path: p,
            stored,
            computed,
        });
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as u64 >= h.model.n_vocab) {
        return Err(invalid(format!(
            "token id {bad} is outside the vocabulary of {}",
            h.model.n_vocab
        )));
    }
    Ok(StateFile {
        model: h.model,
        ctx_len: h.ctx_len,
        tokens,
        rng: h.rng,
        logits,
        kv_elem,
        image: StateImage { pos, layers },
    })
}
