//! Standard output that reports its errors instead of panicking (as
//! `print!` does): a closed pipe (`| head`) ends the command quietly with
//! status 141, as coreutils do under SIGPIPE; any other error (`>/dev/full`)
//! is reported naming stdout.

use anyhow::{Context, Result};
use std::io::Write;

/// The context of every error writing standard output.
pub const STDOUT: &str = "writing to stdout";

/// The exit status of a command whose stdout was closed (128 + SIGPIPE).
pub const BROKEN_PIPE_STATUS: u8 = 141;

/// Write `s` to stdout and flush.
pub fn print(s: &str) -> Result<()> {
    let mut o = std::io::stdout().lock();
    o.write_all(s.as_bytes())
        .and_then(|()| o.flush())
        .context(STDOUT)
}

/// Whether the error (or one of its causes) is a closed pipe.
pub fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// `print!` that returns the error instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::print(&format!($($arg)*))
    };
}

/// `println!` that returns the error instead of panicking.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::print("\n")
    };
    ($($arg:tt)*) => {
        $crate::out::print(&format!("{}\n", format_args!($($arg)*)))
    };
}
