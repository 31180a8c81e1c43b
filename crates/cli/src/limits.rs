//! Limits on numbers that come from the command line: thread counts,
//! sampling parameters, the context size; and the check that an input path
//! is a file.

use anyhow::{bail, Result};
use std::path::Path;

/// Compute threads beyond this multiple of the cores only add switching
/// (and a huge count hangs spawning them): capped, with a warning.
pub const THREAD_CAP_PER_CORE: usize = 4;

/// I/O threads wait on the disk, not the cores: the cap never goes below
/// this (the `--io-threads` default is 8).
pub const MIN_IO_THREAD_CAP: usize = 64;

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The largest compute thread count accepted.
pub fn thread_cap() -> usize {
    THREAD_CAP_PER_CORE * cores()
}

/// `n` threads from `flag`, capped at [`thread_cap`] (0 stays 0: "all
/// cores" to the callee).
pub fn cap_threads(n: usize, flag: &str) -> usize {
    cap(n, thread_cap(), flag, "threads")
}

/// `--io-threads n`, capped at the larger of [`thread_cap`] and
/// [`MIN_IO_THREAD_CAP`].
pub fn cap_io_threads(n: usize, flag: &str) -> usize {
    cap(n, thread_cap().max(MIN_IO_THREAD_CAP), flag, "I/O threads")
}

fn cap(n: usize, max: usize, flag: &str, what: &str) -> usize {
    if n > max {
        tracing::warn!(
            "{flag} {n}: more {what} than {THREAD_CAP_PER_CORE} per core ({} cores) cannot help; using {max}",
            cores()
        );
        max
    } else {
        n
    }
}

fn number_in(s: &str, lo: f32, hi: f32) -> Result<f32, String> {
    let x: f32 = s
        .trim()
        .parse()
        .map_err(|e| format!("{s:?} is not a number ({e})"))?;
    // Written so that NaN fails too.
    if !(x >= lo && x <= hi) {
        return Err(format!("must be between {lo} and {hi}, got {s}"));
    }
    Ok(x)
}

// The ranges are the server's (crates/server/src/request.rs, the
// OpenAI-compatible API): one set of valid values for both front ends.

/// `--temp`: 0 (greedy) to 2.
pub fn temperature(s: &str) -> Result<f32, String> {
    number_in(s, 0.0, 2.0)
}

/// `--top-p`, `--min-p`: a probability.
pub fn probability(s: &str) -> Result<f32, String> {
    number_in(s, 0.0, 1.0)
}

/// `--repeat-penalty`: 0 to 10 (1 is off).
pub fn repeat_penalty(s: &str) -> Result<f32, String> {
    number_in(s, 0.0, 10.0)
}

/// Warn when the context asked for is longer than the model was trained
/// on (attention past it is extrapolation; llama.cpp warns the same way).
pub fn warn_context(ctx: usize, trained: usize) {
    redlite_engine::warn_context(ctx, trained);
}

/// An input given by `flag` must be a file: a directory gets a clear error
/// here (opening one would fail with "No such device" from the map).
pub fn input_file(path: &Path, flag: &str) -> Result<()> {
    if path.is_dir() {
        bail!("{flag} {}: is a directory, not a GGUF file", path.display());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_ranges() {
        assert_eq!(temperature("0"), Ok(0.0));
        assert_eq!(temperature("2"), Ok(2.0));
        assert!(temperature("-1").is_err());
        assert!(temperature("nan").unwrap_err().contains("between 0 and 2"));
        assert!(temperature("inf").is_err());
        assert!(temperature("x").unwrap_err().contains("not a number"));
        assert_eq!(probability("1"), Ok(1.0));
        assert!(probability("2").is_err());
        assert!(probability("-0.1").is_err());
        assert!(repeat_penalty("11").is_err());
        assert_eq!(repeat_penalty("1.1"), Ok(1.1));
    }

    #[test]
    fn thread_caps() {
        let cap = thread_cap();
        assert!(cap >= THREAD_CAP_PER_CORE);
        assert_eq!(cap_threads(0, "-t"), 0);
        assert_eq!(cap_threads(cap, "-t"), cap);
        assert_eq!(cap_threads(100_000, "-t"), cap);
        assert_eq!(cap_io_threads(8, "--io-threads"), 8);
        assert_eq!(
            cap_io_threads(100_000, "--io-threads"),
            cap.max(MIN_IO_THREAD_CAP)
        );
    }
}
