//! [`Output`] and [`OutputDir`]: the temporary, the commit, the cleanup.

use crate::{check_target, cleanup, OutfileError, TargetKind};
use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// The temporary's path beside `target`: hidden, named after the target,
/// the process and a per-process counter (so two outputs of one run, or
/// two runs, never share one).
fn temp_beside(target: &Path, tag: &str) -> Result<PathBuf, OutfileError> {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = target.file_name().ok_or_else(|| OutfileError::NoFileName {
        path: target.to_path_buf(),
    })?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(format!(
        ".{tag}.{}.{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    Ok(dir.join(tmp))
}

/// Make the rename durable: sync the directory that now holds the name.
/// Best effort (some file systems refuse to sync a directory).
fn sync_parent(target: &Path) {
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

enum State {
    /// Writing a registered temporary, renamed over the target on commit.
    Temp {
        id: u64,
        tmp: PathBuf,
        w: BufWriter<File>,
    },
    /// Writing a device or FIFO directly.
    Direct { w: BufWriter<File> },
    /// Committed, or cleaned up.
    Done,
}

/// A file being written: bytes go to a temporary beside the target, which
/// appears (complete and synced) only on [`commit`](Output::commit).
pub struct Output {
    target: PathBuf,
    state: State,
}

impl Output {
    /// Check `target` against `inputs` (see [`check_target`]) and create
    /// its temporary. Nothing is opened for writing when the check fails.
    pub fn create(target: impl AsRef<Path>, inputs: &[&Path]) -> Result<Output, OutfileError> {
        let target = target.as_ref();
        let state = match check_target(target, inputs)? {
            TargetKind::Special => {
                let f = OpenOptions::new()
                    .write(true)
                    .open(target)
                    .map_err(|e| OutfileError::io(target, "open", e))?;
                State::Direct {
                    w: BufWriter::with_capacity(1 << 20, f),
                }
            }
            TargetKind::New | TargetKind::Regular => {
                let tmp = temp_beside(target, "redlite-tmp")?;
                let (id, f) = cleanup::register(&tmp, false, || {
                    OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .open(&tmp)
                        .map_err(|e| OutfileError::io(target, "create a temporary beside it", e))
                })?;
                State::Temp {
                    id,
                    tmp,
                    w: BufWriter::with_capacity(1 << 20, f),
                }
            }
        };
        Ok(Output {
            target: target.to_path_buf(),
            state,
        })
    }

    /// The path the output will have.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The temporary being written (None when written directly or done).
    pub fn temp_path(&self) -> Option<&Path> {
        match &self.state {
            State::Temp { tmp, .. } => Some(tmp),
            _ => None,
        }
    }

    /// Flush, sync and rename the temporary into place. On error the
    /// temporary is removed and the target is left as it was.
    pub fn commit(mut self) -> Result<(), OutfileError> {
        match std::mem::replace(&mut self.state, State::Done) {
            State::Done => Ok(()),
            State::Direct { mut w } => w
                .flush()
                .map_err(|e| OutfileError::io(&self.target, "write", e)),
            State::Temp { id, tmp, w } => {
                let target = &self.target;
                let synced = w
                    .into_inner()
                    .map_err(|e| OutfileError::io(target, "write", e.into_error()))
                    .and_then(|f| {
                        f.sync_all()
                            .map_err(|e| OutfileError::io(target, "sync", e))
                    });
                cleanup::finish(id, || {
                    let r = synced.and_then(|()| {
                        fs::rename(&tmp, target).map_err(|e| {
                            OutfileError::io(target, "rename the temporary into place", e)
                        })
                    });
                    if r.is_err() {
                        let _ = fs::remove_file(&tmp);
                    }
                    r
                })?;
                sync_parent(target);
                Ok(())
            }
        }
    }
}

impl Write for Output {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.state {
            State::Temp { w, .. } | State::Direct { w } => w.write(buf),
            State::Done => Err(io::Error::other("output already committed")),
        }
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        match &mut self.state {
            State::Temp { w, .. } | State::Direct { w } => w.write_all(buf),
            State::Done => Err(io::Error::other("output already committed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.state {
            State::Temp { w, .. } | State::Direct { w } => w.flush(),
            State::Done => Ok(()),
        }
    }
}

impl Drop for Output {
    fn drop(&mut self) {
        if let State::Temp { id, tmp, w } = std::mem::replace(&mut self.state, State::Done) {
            // Unflushed bytes are discarded with the file.
            let (f, _) = w.into_parts();
            drop(f);
            cleanup::finish(id, || {
                let _ = fs::remove_file(&tmp);
            });
        }
    }
}

/// A private directory beside the target, for a writer that creates and
/// renames its own file (the GGUF stream writer): it writes
/// [`path`](OutputDir::path), and [`commit`](OutputDir::commit) moves that
/// file over the target. The directory and everything in it are removed
/// on error, drop and SIGINT/SIGTERM.
pub struct OutputDir {
    target: PathBuf,
    dir: PathBuf,
    inner: PathBuf,
    id: Option<u64>,
}

impl OutputDir {
    /// Check `target` (which must be new or a regular file) against
    /// `inputs` and create the directory.
    pub fn create(target: impl AsRef<Path>, inputs: &[&Path]) -> Result<OutputDir, OutfileError> {
        let target = target.as_ref();
        if check_target(target, inputs)? == TargetKind::Special {
            return Err(OutfileError::NotRegular {
                path: target.to_path_buf(),
            });
        }
        let dir = temp_beside(target, "redlite-tmpdir")?;
        let name = target.file_name().ok_or_else(|| OutfileError::NoFileName {
            path: target.to_path_buf(),
        })?;
        let inner = dir.join(name);
        let (id, ()) = cleanup::register(&dir, true, || {
            fs::create_dir(&dir)
                .map_err(|e| OutfileError::io(target, "create a temporary directory beside it", e))
        })?;
        Ok(OutputDir {
            target: target.to_path_buf(),
            dir,
            inner,
            id: Some(id),
        })
    }

    /// Where the writer puts the file.
    pub fn path(&self) -> &Path {
        &self.inner
    }

    /// The target.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Move the finished file over the target and remove the directory.
    pub fn commit(mut self) -> Result<(), OutfileError> {
        let Some(id) = self.id.take() else {
            return Ok(());
        };
        let (target, dir, inner) = (&self.target, &self.dir, &self.inner);
        cleanup::finish(id, || {
            let r = fs::rename(inner, target)
                .map_err(|e| OutfileError::io(target, "rename the finished file into place", e));
            let _ = fs::remove_dir_all(dir);
            r
        })?;
        sync_parent(target);
        Ok(())
    }
}

impl Drop for OutputDir {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            cleanup::finish(id, || {
                let _ = fs::remove_dir_all(&self.dir);
            });
        }
    }
}
