//! `serve --state-dir DIR`: the prompt cache's checkpoints persisted as
//! state files, so a conversation's state survives a restart.
//!
//! Every checkpoint the engine loop keeps (the end of a prompt, the end of
//! a turn) is also written to DIR as a state file named after a hash of
//! its tokens. At start the directory is indexed (each file's header is
//! checked against the model and its tokens read; files of another model
//! or version are left alone, with a warning). A prompt that extends a
//! file's tokens further than any checkpoint in memory restores the file
//! (its whole checksum checked) instead of computing the prefix. The
//! directory is kept under a size limit: the least recently used files go
//! first.
//!
//! A checkpoint that keeps the MTP drafter's state also writes it beside
//! its state file (`NAME.mtp`, [`redlite_statefile::write_mtp`]), and a
//! restore reads it back, so that an MTP job can resume from the file too.

use redlite_model::sequence::{Checkpoint, Sequence};
use redlite_model::{KvElem, LayerShape, StateLayout};
use redlite_spec::mtp::{MtpDrafter, MtpSnapshot};
use redlite_statefile::{Expect, ModelId, MtpExpect, MtpImage, StateFile};
use std::path::{Path, PathBuf};

/// What the server knows of the model, to check files against.
#[derive(Clone, Debug)]
pub struct StateDirConfig {
    pub dir: PathBuf,
    /// Bytes the directory's state files may take together.
    pub limit: u64,
    pub model: ModelId,
    /// The layer shapes (the KV element type comes from the sequence).
    pub layers: Vec<LayerShape>,
}

struct Entry {
    path: PathBuf,
    tokens: Vec<u32>,
    /// The state file's and its MTP file's bytes.
    bytes: u64,
    /// Whether an MTP file lies beside it (checked when loaded).
    has_mtp: bool,
    last_used: u64,
}

/// The MTP file beside the state file at `state`.
fn mtp_path(state: &Path) -> PathBuf {
    state.with_extension("mtp")
}

/// The bytes of the MTP file beside `state` (None: there is none).
fn mtp_bytes(state: &Path) -> Option<u64> {
    std::fs::metadata(mtp_path(state))
        .ok()
        .filter(|m| m.is_file())
        .map(|m| m.len())
}

/// The directory's files, indexed.
pub struct StateDir {
    cfg: StateDirConfig,
    expect: Expect,
    entries: Vec<Entry>,
    clock: u64,
}

impl StateDir {
    /// Index `cfg.dir` (created when missing) for a sequence of `ctx_len`
    /// positions keeping KV rows of `kv_elem`.
    pub fn open(cfg: StateDirConfig, kv_elem: KvElem, ctx_len: usize) -> std::io::Result<StateDir> {
        std::fs::create_dir_all(&cfg.dir)?;
        let expect = Expect {
            model: cfg.model.clone(),
            layout: StateLayout {
                kv_elem,
                layers: cfg.layers.clone(),
            },
            ctx_len,
        };
        let mut found = Vec::new();
        for e in std::fs::read_dir(&cfg.dir)? {
            let e = e?;
            let path = e.path();
            if path.extension().is_none_or(|x| x != "state") {
                continue;
            }
            let meta = e.metadata()?;
            match redlite_statefile::read_tokens(&path, &expect) {
                Ok(tokens) => found.push((meta.modified().ok(), path, tokens, meta.len())),
                Err(err) => tracing::warn!("--state-dir: skipping {err}"),
            }
        }
        // Oldest first, so the clock orders them by modification time.
        found.sort_by_key(|f| f.0);
        let entries: Vec<Entry> = found
            .into_iter()
            .enumerate()
            .map(|(i, (_, path, tokens, bytes))| {
                let mtp = mtp_bytes(&path);
                Entry {
                    bytes: bytes + mtp.unwrap_or(0),
                    has_mtp: mtp.is_some(),
                    path,
                    tokens,
                    last_used: i as u64,
                }
            })
            .collect();
        let clock = entries.len() as u64;
        tracing::info!(
            "--state-dir {}: {} saved states, {} bytes (limit {})",
            cfg.dir.display(),
            entries.len(),
            entries.iter().map(|e| e.bytes).sum::<u64>(),
            cfg.limit
        );
        let mut d = StateDir {
            cfg,
            expect,
            entries,
            clock,
        };
        d.evict(None);
        Ok(d)
    }

    /// Tokens of the longest saved state that is a prefix of `prompt` (and
    /// has an MTP file, with `need_mtp`).
    pub fn best(&self, prompt: &[u32], need_mtp: bool) -> Option<usize> {
        self.entries
            .iter()
            .filter(|e| e.tokens.len() <= prompt.len() && prompt.starts_with(&e.tokens))
            .filter(|e| !need_mtp || e.has_mtp)
            .map(|e| e.tokens.len())
            .max()
    }

    /// Load the saved state of `len` tokens that prefixes `prompt` into a
    /// checkpoint of `seq`'s backend, with its tokens and last logits.
    /// A file that no longer loads is dropped from the index (and the
    /// error returned, for the log).
    pub fn load(
        &mut self,
        prompt: &[u32],
        len: usize,
        seq: &dyn Sequence,
    ) -> Result<(Vec<u32>, Checkpoint, Vec<f32>), String> {
        let i = self
            .entries
            .iter()
            .position(|e| e.tokens.len() == len && prompt.starts_with(&e.tokens))
            .ok_or("no such saved state")?;
        let path = self.entries[i].path.clone();
        let loaded = redlite_statefile::read(&path, &self.expect)
            .map_err(|e| e.to_string())
            .and_then(|sf| {
                let StateFile {
                    tokens,
                    logits,
                    image,
                    ..
                } = sf;
                seq.import_checkpoint(image)
                    .map(|cp| (tokens, cp, logits))
                    .map_err(|e| format!("{}: {e}", path.display()))
            });
        match loaded {
            Ok(x) => {
                self.clock += 1;
                self.entries[i].last_used = self.clock;
                Ok(x)
            }
            Err(e) => {
                self.entries.remove(i);
                Err(e)
            }
        }
    }

    /// Whether the saved state of exactly `tokens` has an MTP file.
    pub fn has_mtp(&self, tokens: &[u32]) -> bool {
        self.entries.iter().any(|e| e.tokens == tokens && e.has_mtp)
    }

    /// The MTP drafter's state saved beside the state of exactly `tokens`,
    /// checked against the file's header and `drafter`'s head. A file that
    /// does not load is not offered again (the state file stays).
    pub fn load_mtp(
        &mut self,
        tokens: &[u32],
        drafter: &MtpDrafter,
    ) -> Result<MtpSnapshot, String> {
        let e = self
            .entries
            .iter_mut()
            .find(|e| e.tokens == tokens && e.has_mtp)
            .ok_or("no such saved MTP state")?;
        let path = mtp_path(&e.path);
        let expect = MtpExpect {
            model: &self.cfg.model,
            tokens,
            row: drafter.kv_row(),
            width: drafter.width(),
        };
        let loaded = redlite_statefile::read_mtp(&path, &expect)
            .map_err(|e| e.to_string())
            .and_then(|img| {
                drafter
                    .snapshot_from_parts(img.k, img.v, img.hidden)
                    .map_err(|e| format!("{}: {e}", path.display()))
            });
        if loaded.is_err() {
            e.has_mtp = false;
        }
        loaded
    }

    /// Persist `state` (of `seq`'s backend, holding `tokens`, with the last
    /// position's `logits`) and, when given, the MTP drafter's state with
    /// it (rows of `row` floats), then evict down to the limit.
    pub fn save(
        &mut self,
        seq: &dyn Sequence,
        state: &Checkpoint,
        tokens: &[u32],
        logits: &[f32],
        mtp: Option<(&MtpSnapshot, usize)>,
    ) -> Result<(), String> {
        let mut key = Vec::with_capacity(tokens.len() * 4);
        tokens
            .iter()
            .for_each(|t| key.extend_from_slice(&t.to_le_bytes()));
        let path = self
            .cfg
            .dir
            .join(format!("{:016x}.state", redlite_statefile::fnv1a64(&key)));
        let image = seq.export_checkpoint(state).map_err(|e| e.to_string())?;
        let sf = StateFile {
            model: self.cfg.model.clone(),
            ctx_len: seq.ctx_len() as u64,
            tokens: tokens.to_vec(),
            rng: None,
            logits: logits.to_vec(),
            kv_elem: seq.kv_elem(),
            image,
        };
        let stats = redlite_statefile::write(&path, &[], &sf).map_err(|e| e.to_string())?;
        if let Some((snap, row)) = mtp {
            let (k, v, hidden) = snap.parts();
            let img = MtpImage {
                k: k.to_vec(),
                v: v.to_vec(),
                hidden: hidden.to_vec(),
            };
            if let Err(e) =
                redlite_statefile::write_mtp(&mtp_path(&path), &self.cfg.model, tokens, row, &img)
            {
                // The state file stands without it: only MTP jobs skip it.
                tracing::warn!("--state-dir: saving the MTP state: {e}");
            }
        }
        // An MTP file of the same tokens from an earlier save still holds.
        let mtp = mtp_bytes(&path);
        self.clock += 1;
        self.entries.retain(|e| e.path != path);
        self.entries.push(Entry {
            path: path.clone(),
            tokens: tokens.to_vec(),
            bytes: stats.bytes + mtp.unwrap_or(0),
            has_mtp: mtp.is_some(),
            last_used: self.clock,
        });
        self.evict(Some(&path));
        Ok(())
    }

    /// Remove least recently used files until the directory fits the
    /// limit; `keep` (the file just written) goes last.
    fn evict(&mut self, keep: Option<&Path>) {
        loop {
            let total: u64 = self.entries.iter().map(|e| e.bytes).sum();
            if total <= self.cfg.limit || self.entries.is_empty() {
                return;
            }
            let victim = self
                .entries
                .iter()
                .enumerate()
                .filter(|(_, e)| Some(e.path.as_path()) != keep || self.entries.len() == 1)
                .min_by_key(|(_, e)| e.last_used)
                .map(|(i, _)| i)
                .unwrap_or(0);
            let e = self.entries.remove(victim);
            if e.has_mtp {
                if let Err(err) = std::fs::remove_file(mtp_path(&e.path)) {
                    tracing::warn!(
                        "--state-dir: removing {}: {err}",
                        mtp_path(&e.path).display()
                    );
                }
            }
            if let Err(err) = std::fs::remove_file(&e.path) {
                tracing::warn!("--state-dir: removing {}: {err}", e.path.display());
            } else {
                tracing::info!(
                    "--state-dir: evicted {} ({} tokens, {} bytes) to stay under {} bytes",
                    e.path.display(),
                    e.tokens.len(),
                    e.bytes,
                    self.cfg.limit
                );
            }
        }
    }

    /// Files indexed and their bytes (for the metrics).
    pub fn usage(&self) -> (usize, u64) {
        (
            self.entries.len(),
            self.entries.iter().map(|e| e.bytes).sum(),
        )
    }
}
