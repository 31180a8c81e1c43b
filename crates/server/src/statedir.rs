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

use redlite_model::sequence::{Checkpoint, Sequence};
use redlite_model::{KvElem, LayerShape, StateLayout};
use redlite_statefile::{Expect, ModelId, StateFile};
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
    bytes: u64,
    last_used: u64,
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
            .map(|(i, (_, path, tokens, bytes))| Entry {
                path,
                tokens,
                bytes,
                last_used: i as u64,
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

    /// Tokens of the longest saved state that is a prefix of `prompt`.
    pub fn best(&self, prompt: &[u32]) -> Option<usize> {
        self.entries
            .iter()
            .filter(|e| e.tokens.len() <= prompt.len() && prompt.starts_with(&e.tokens))
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

    /// Persist `state` (of `seq`'s backend, holding `tokens`, with the last
    /// position's `logits`), then evict down to the limit.
    pub fn save(
        &mut self,
        seq: &dyn Sequence,
        state: &Checkpoint,
        tokens: &[u32],
        logits: &[f32],
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
        self.clock += 1;
        self.entries.retain(|e| e.path != path);
        self.entries.push(Entry {
            path: path.clone(),
            tokens: tokens.to_vec(),
            bytes: stats.bytes,
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
