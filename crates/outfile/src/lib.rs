//! Output files that never replace an input and never appear half-written.
//!
//! Every file Red Lite writes goes through [`Output`] (a stream of bytes)
//! or [`OutputDir`] (a private directory for a writer that manages its own
//! file, such as the GGUF stream writer). Both:
//!
//! - refuse, before anything is opened for writing, a target that is a
//!   directory or that is the same file as one of the run's inputs
//!   (compared by device and inode, so hard links, symlinks and `./x` vs
//!   `x` are all caught);
//! - write to a temporary beside the target (same directory, so the final
//!   rename cannot cross file systems), sync it, and rename it into place
//!   only on [`Output::commit`];
//! - remove the temporary on error, when dropped without commit, and when
//!   the process gets SIGINT or SIGTERM (it then exits with 130 or 143, as
//!   a shell reports a process killed by those signals).
//!
//! A target that exists and is neither a regular file nor a directory (a
//! character device such as `/dev/null`, a FIFO) is written directly: it
//! cannot be renamed over, and a stream has no half-written file to leave.

mod cleanup;
mod output;

use std::io;
use std::path::{Path, PathBuf};

pub use output::{Output, OutputDir};

/// What can go wrong preparing or writing an output.
#[derive(Debug, thiserror::Error)]
pub enum OutfileError {
    #[error("output {}: is a directory (give a file name)", path.display())]
    IsDirectory { path: PathBuf },
    #[error(
        "output {} is the same file as the input {}: refusing to write over it",
        path.display(),
        input.display()
    )]
    SameAsInput { path: PathBuf, input: PathBuf },
    #[error("output {}: the path has no file name", path.display())]
    NoFileName { path: PathBuf },
    #[error("output {}: not a regular file (this output needs one)", path.display())]
    NotRegular { path: PathBuf },
    #[error("output {}: {op}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

impl OutfileError {
    pub(crate) fn io(path: &Path, op: &'static str, source: io::Error) -> OutfileError {
        OutfileError::Io {
            path: path.to_path_buf(),
            op,
            source,
        }
    }
}

/// What a checked target is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// Nothing there yet.
    New,
    /// An existing regular file (replaced by rename on commit).
    Regular,
    /// An existing device, FIFO or socket (written directly).
    Special,
}

/// Check `target` against `inputs` without opening anything for writing:
/// a directory, or the same file as an input, is refused. Inputs that do
/// not exist are skipped (they cannot be the target).
pub fn check_target(target: &Path, inputs: &[&Path]) -> Result<TargetKind, OutfileError> {
    let meta = match std::fs::metadata(target) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(TargetKind::New),
        Err(e) => return Err(OutfileError::io(target, "stat", e)),
    };
    if meta.is_dir() {
        return Err(OutfileError::IsDirectory {
            path: target.to_path_buf(),
        });
    }
    for input in inputs {
        if let Ok(im) = std::fs::metadata(input) {
            if same_file(&meta, &im, target, input) {
                return Err(OutfileError::SameAsInput {
                    path: target.to_path_buf(),
                    input: input.to_path_buf(),
                });
            }
        }
    }
    Ok(if meta.is_file() {
        TargetKind::Regular
    } else {
        TargetKind::Special
    })
}

#[cfg(unix)]
fn same_file(a: &std::fs::Metadata, b: &std::fs::Metadata, _: &Path, _: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    a.dev() == b.dev() && a.ino() == b.ino()
}

#[cfg(not(unix))]
fn same_file(_: &std::fs::Metadata, _: &std::fs::Metadata, a: &Path, b: &Path) -> bool {
    // No inode numbers: compare the resolved paths (catches symlinks and
    // relative spellings, not hard links).
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// The temporaries registered now (for tests and diagnostics).
pub fn pending_temporaries() -> Vec<PathBuf> {
    cleanup::pending()
}

#[cfg(test)]
mod tests;
