//! The MTP drafter's state beside a state file (`NAME.mtp` next to
//! `NAME.state`): the MTP head's K and V rows of every position the state
//! covers and the trunk's hidden row at its last position. A server that
//! drafts with the head needs both to continue the sequence, and rebuilding
//! them takes the trunk's hidden rows of every position, that is a prefill
//! of the whole prefix. The file is tied to the model and to the exact
//! tokens of its state file, and checksummed.
//!
//! ```text
//! magic "RLMTPST\0" | version u32 | tensor-table hash u64 | n_tokens u64
//! | FNV-1a 64 of the tokens (u32 LE each) | row u64 | width u64
//! | K f32 × n_tokens × row | V f32 × n_tokens × row | hidden f32 × width
//! | crc32 u32 of every byte before it
//! ```

use crate::format::CrcWriter;
use crate::{fnv1a64, ModelId, StateError};
use redlite_outfile::Output;
use std::io::{Read, Write};
use std::path::Path;

/// The first bytes of every MTP state file.
pub const MTP_MAGIC: [u8; 8] = *b"RLMTPST\0";
/// The MTP state format version this build reads and writes.
pub const MTP_VERSION: u32 = 1;
/// Bytes before the rows.
const HEADER: usize = 8 + 4 + 8 * 5;

/// The head's rows and the hidden row, as saved.
#[derive(Clone, Debug, PartialEq)]
pub struct MtpImage {
    /// `n_tokens × row` each.
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    /// The trunk's hidden row at the last position (`width`).
    pub hidden: Vec<f32>,
}

/// What a loaded MTP state must match.
#[derive(Clone, Copy, Debug)]
pub struct MtpExpect<'a> {
    pub model: &'a ModelId,
    /// The tokens of the state file it belongs to.
    pub tokens: &'a [u32],
    /// Floats per position of the head's K (and V) rows.
    pub row: usize,
    /// The model's hidden width.
    pub width: usize,
}

fn tokens_hash(tokens: &[u32]) -> u64 {
    let mut b = Vec::with_capacity(tokens.len() * 4);
    tokens
        .iter()
        .for_each(|t| b.extend_from_slice(&t.to_le_bytes()));
    fnv1a64(&b)
}

/// Write the MTP state `img` (rows of `row` floats) of the state holding
/// `tokens` to `path` atomically; returns the bytes written.
pub fn write_mtp(
    path: &Path,
    model: &ModelId,
    tokens: &[u32],
    row: usize,
    img: &MtpImage,
) -> Result<u64, StateError> {
    if img.k.len() != tokens.len() * row || img.v.len() != img.k.len() {
        return Err(StateError::Invalid {
            path: path.to_path_buf(),
            what: format!(
                "MTP rows of {} and {} values for {} tokens",
                img.k.len(),
                img.v.len(),
                tokens.len()
            ),
        });
    }
    let io = |e| StateError::Io {
        path: path.to_path_buf(),
        op: "write",
        source: e,
    };
    let mut w = CrcWriter {
        w: Output::create(path, &[])?,
        crc: crc32fast::Hasher::new(),
        n: 0,
    };
    w.put(&MTP_MAGIC).map_err(io)?;
    w.u32(MTP_VERSION).map_err(io)?;
    for x in [
        model.tensor_hash,
        tokens.len() as u64,
        tokens_hash(tokens),
        row as u64,
        img.hidden.len() as u64,
    ] {
        w.put(&x.to_le_bytes()).map_err(io)?;
    }
    w.f32s(&img.k).map_err(io)?;
    w.f32s(&img.v).map_err(io)?;
    w.f32s(&img.hidden).map_err(io)?;
    let crc = w.crc.clone().finalize();
    let n = w.n + 4;
    let mut out = w.w;
    out.write_all(&crc.to_le_bytes()).map_err(io)?;
    out.commit()?;
    Ok(n)
}

/// Read the MTP state at `path`, checked against `expect`: the header
/// before anything is allocated, then the file's length, then its CRC.
pub fn read_mtp(path: &Path, expect: &MtpExpect<'_>) -> Result<MtpImage, StateError> {
    let p = path.to_path_buf();
    let io = |op: &'static str| {
        let p = p.clone();
        move |source| StateError::Io {
            path: p,
            op,
            source,
        }
    };
    let mut f = std::fs::File::open(path).map_err(io("open"))?;
    let len = f.metadata().map_err(io("stat"))?.len();
    let mut head = [0u8; HEADER];
    f.read_exact(&mut head).map_err(|_| StateError::Truncated {
        path: p.clone(),
        what: format!("{len} bytes, shorter than the {HEADER}-byte header"),
    })?;
    if head[..8] != MTP_MAGIC {
        return Err(StateError::Magic {
            path: p,
            found: head[..8].to_vec(),
        });
    }
    let version = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes"));
    if version != MTP_VERSION {
        return Err(StateError::Invalid {
            path: p,
            what: format!("MTP state format version {version}, this build reads {MTP_VERSION}"),
        });
    }
    let field = |i: usize| u64::from_le_bytes(head[12 + 8 * i..20 + 8 * i].try_into().expect("8"));
    let [hash, n_tokens, toks, row, width] = [0, 1, 2, 3, 4].map(field);
    let invalid = |what: String| StateError::Invalid {
        path: p.clone(),
        what,
    };
    if hash != expect.model.tensor_hash {
        return Err(StateError::OtherModel {
            path: p.clone(),
            what: format!(
                "MTP state of tensor table {hash:016x}, the model's is {:016x}",
                expect.model.tensor_hash
            ),
        });
    }
    if n_tokens != expect.tokens.len() as u64 || toks != tokens_hash(expect.tokens) {
        return Err(invalid(format!(
            "an MTP state of {n_tokens} other tokens than its state file's {}",
            expect.tokens.len()
        )));
    }
    if row != expect.row as u64 || width != expect.width as u64 {
        return Err(invalid(format!(
            "MTP rows of {row} and a hidden row of {width}, the model's head has {} and {}",
            expect.row, expect.width
        )));
    }
    // Both are the model's, and n_tokens the state file's: bounded.
    let floats = 2 * expect.tokens.len() * expect.row + expect.width;
    let want = (HEADER + floats * 4 + 4) as u64;
    if len != want {
        return Err(StateError::Truncated {
            path: p,
            what: format!("{len} bytes, the header says {want}"),
        });
    }
    let mut body = vec![0u8; floats * 4 + 4];
    f.read_exact(&mut body).map_err(io("read"))?;
    let (data, stored) = body.split_at(floats * 4);
    let stored = u32::from_le_bytes(stored.try_into().expect("4 bytes"));
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head);
    crc.update(data);
    let computed = crc.finalize();
    if stored != computed {
        return Err(StateError::Checksum {
            path: p,
            stored,
            computed,
        });
    }
    let mut values = data
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")));
    let rows = expect.tokens.len() * expect.row;
    let k: Vec<f32> = values.by_ref().take(rows).collect();
    let v: Vec<f32> = values.by_ref().take(rows).collect();
    let hidden: Vec<f32> = values.collect();
    Ok(MtpImage { k, v, hidden })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ModelId {
        ModelId {
            arch: "qwen3next".into(),
            tensor_hash: 0x1234_5678_9abc_def0,
            n_tensors: 93,
            n_vocab: 512,
        }
    }

    fn image(n: usize, row: usize, width: usize) -> MtpImage {
        MtpImage {
            k: (0..n * row).map(|i| i as f32 * 0.5).collect(),
            v: (0..n * row).map(|i| -(i as f32)).collect(),
            hidden: (0..width).map(|i| i as f32 + 0.25).collect(),
        }
    }

    #[test]
    fn a_written_state_reads_back_and_a_mismatch_is_refused_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("redlite-mtp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.mtp");
        let tokens = [5u32, 7, 11];
        let img = image(3, 4, 6);
        let m = model();
        let n = write_mtp(&path, &m, &tokens, 4, &img).unwrap();
        assert_eq!(n, std::fs::metadata(&path).unwrap().len());
        // The layout by hand: header, then K, V, hidden, CRC.
        assert_eq!(n as usize, HEADER + (2 * 3 * 4 + 6) * 4 + 4);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"RLMTPST\0");
        assert_eq!(
            u32::from_le_bytes(bytes[n as usize - 4..].try_into().unwrap()),
            crc32fast::hash(&bytes[..n as usize - 4])
        );
        let expect = MtpExpect {
            model: &m,
            tokens: &tokens,
            row: 4,
            width: 6,
        };
        assert_eq!(read_mtp(&path, &expect).unwrap(), img);

        let name = path.display().to_string();
        let other_tokens = [5u32, 7, 12];
        let other_model = ModelId {
            tensor_hash: 1,
            ..model()
        };
        for (what, e) in [
            (
                "other tokens",
                MtpExpect {
                    tokens: &other_tokens,
                    ..expect
                },
            ),
            (
                "fewer tokens",
                MtpExpect {
                    tokens: &tokens[..2],
                    ..expect
                },
            ),
            ("another row", MtpExpect { row: 8, ..expect }),
            ("another width", MtpExpect { width: 5, ..expect }),
            (
                "another model",
                MtpExpect {
                    model: &other_model,
                    ..expect
                },
            ),
        ] {
            let err = read_mtp(&path, &e).unwrap_err().to_string();
            assert!(err.contains(&name), "{what}: {err}");
        }
        // A flipped bit in the rows, a truncated file.
        let mut bad = bytes.clone();
        bad[HEADER + 5] ^= 1;
        std::fs::write(&path, &bad).unwrap();
        let err = read_mtp(&path, &expect).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let err = read_mtp(&path, &expect).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::write(&path, &bytes[..10]).unwrap();
        let err = read_mtp(&path, &expect).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
