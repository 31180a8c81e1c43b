//! Where each expert's bytes lie in the model file, and the loader that
//! reads them with positioned reads.
//!
//! A stacked expert tensor (`ffn_gate_exps`, `[d, ff, E]`) stores expert
//! `e`'s rows contiguously: its bytes are `offset + e·stride ..+ stride`.
//! An expert is one such range per part (gate, up, down; or merged gate_up,
//! down), copied one after the other into its slot.
//!
//! The loader asks the kernel not to read ahead on its descriptor
//! (`POSIX_FADV_RANDOM`) and, after each read, to drop the pages it just
//! read from the page cache (`POSIX_FADV_DONTNEED`): the expert's bytes now
//! live in the slot, and cached copies would compete (under a cgroup limit:
//! be charged) with the memory-mapped dense weights, which the kernel would
//! then evict and read again every token.

use crate::cache::{ExpertKey, ExpertLoader};
use crate::error::CacheError;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One part of every expert of a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpertPart {
    /// The stacked tensor's name (for error messages).
    pub tensor: String,
    /// Absolute file offset of expert 0's bytes.
    pub offset: u64,
    /// Bytes per expert.
    pub stride: u64,
}

/// The routed experts of one layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerExperts {
    pub n_expert: usize,
    pub parts: Vec<ExpertPart>,
}

impl LayerExperts {
    /// Bytes of one expert (all parts).
    pub fn expert_bytes(&self) -> u64 {
        self.parts.iter().map(|p| p.stride).sum()
    }

    /// Where each part lies inside a slot: (start, length).
    pub fn slot_ranges(&self) -> Vec<(usize, usize)> {
        let mut at = 0usize;
        self.parts
            .iter()
            .map(|p| {
                let r = (at, p.stride as usize);
                at += p.stride as usize;
                r
            })
            .collect()
    }
}

/// The experts of every layer (`None` for layers without routed experts).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertLayout {
    pub layers: Vec<Option<LayerExperts>>,
}

impl ExpertLayout {
    /// The largest expert: the size of a cache slot.
    pub fn slot_bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(LayerExperts::expert_bytes)
            .max()
            .unwrap_or(0)
    }

    /// Bytes of all experts of all layers.
    pub fn total_bytes(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|l| l.n_expert as u64 * l.expert_bytes())
            .sum()
    }

    /// Number of (layer, expert) pairs.
    pub fn n_experts(&self) -> u64 {
        self.layers
            .iter()
            .flatten()
            .map(|l| l.n_expert as u64)
            .sum()
    }

    /// Byte ranges of the file that hold experts (one per stacked tensor).
    pub fn file_ranges(&self) -> Vec<std::ops::Range<u64>> {
        self.layers
            .iter()
            .flatten()
            .flat_map(|l| {
                l.parts
                    .iter()
                    .map(move |p| p.offset..p.offset + p.stride * l.n_expert as u64)
            })
            .collect()
    }

    pub fn layer(&self, layer: usize) -> Option<&LayerExperts> {
        self.layers.get(layer).and_then(Option::as_ref)
    }
}

/// Reads experts from the model file into slots.
#[derive(Debug)]
pub struct FileLoader {
    file: File,
    path: PathBuf,
    layout: Arc<ExpertLayout>,
    drop_cache: bool,
}

impl FileLoader {
    /// Open `path` for expert reads. With `drop_cache`, reads bypass
    /// read-ahead and leave nothing behind in the page cache.
    pub fn open(
        path: &Path,
        layout: Arc<ExpertLayout>,
        drop_cache: bool,
    ) -> Result<FileLoader, CacheError> {
        let file = File::open(path).map_err(|source| CacheError::Open {
            file: path.to_path_buf(),
            source,
        })?;
        if drop_cache {
            fadvise(&file, 0, 0, libc::POSIX_FADV_RANDOM);
        }
        Ok(FileLoader {
            file,
            path: path.to_path_buf(),
            layout,
            drop_cache,
        })
    }

    pub fn layout(&self) -> &ExpertLayout {
        &self.layout
    }
}

/// Advice on a file's page cache; failures only cost speed, so they are
/// logged, not returned.
fn fadvise(file: &File, offset: u64, len: u64, advice: libc::c_int) {
    use std::os::fd::AsRawFd;
    // SAFETY: posix_fadvise reads no memory of ours; the descriptor is open
    // for the lifetime of `file`. Exercised by `file_loader_reads_parts_and_names_the_tensor_on_error`.
    let rc = unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            advice,
        )
    };
    if rc != 0 {
        tracing::debug!(
            "posix_fadvise({advice}) failed: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
}

impl ExpertLoader for FileLoader {
    fn load(&self, key: ExpertKey, buf: &mut [u8]) -> Result<u64, CacheError> {
        let (layer, expert) = (key.layer as usize, key.expert as usize);
        let l = self
            .layout
            .layer(layer)
            .ok_or(CacheError::NoExperts { layer })?;
        if expert >= l.n_expert {
            return Err(CacheError::ExpertRange {
                layer,
                expert,
                n_expert: l.n_expert,
            });
        }
        let need = l.expert_bytes();
        if need > buf.len() as u64 {
            return Err(CacheError::SlotTooSmall {
                layer,
                need,
                slot: buf.len() as u64,
            });
        }
        let mut at = 0usize;
        for p in &l.parts {
            let off = p.offset + expert as u64 * p.stride;
            let len = p.stride as usize;
            self.file
                .read_exact_at(&mut buf[at..at + len], off)
                .map_err(|source| CacheError::Read {
                    file: self.path.clone(),
                    tensor: p.tensor.clone(),
                    layer,
                    expert,
                    offset: off,
                    len: p.stride,
                    source,
                })?;
            if self.drop_cache {
                fadvise(&self.file, off, p.stride, libc::POSIX_FADV_DONTNEED);
            }
            at += len;
        }
        Ok(need)
    }
}
