//! Advice to the kernel about a memory-mapped file: read the dense weights
//! now and keep them, do not read around expert pages.

use std::ops::Range;

/// What to tell the kernel about a range of a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advice {
    /// Read the range now (asynchronously).
    WillNeed,
    /// No read-ahead around faults in the range.
    Random,
    /// The kernel's default.
    Normal,
}

/// `madvise` the pages covering `bytes[range]` (`bytes` is a mapping or any
/// memory of this process). Linux only; elsewhere a no-op.
pub fn advise(bytes: &[u8], range: Range<usize>, advice: Advice) -> std::io::Result<()> {
    if range.start >= range.end || range.end > bytes.len() {
        return Ok(());
    }
    #[cfg(target_os = "linux")]
    {
        let page = 4096usize;
        let start = bytes.as_ptr() as usize + range.start;
        let aligned = start & !(page - 1);
        let len = range.end - range.start + (start - aligned);
        let code = match advice {
            Advice::WillNeed => libc::MADV_WILLNEED,
            Advice::Random => libc::MADV_RANDOM,
            Advice::Normal => libc::MADV_NORMAL,
        };
        // SAFETY: advice only, no memory is written or freed: these three
        // advices leave contents as they are. The range is rounded down to
        // its page, which belongs to the same mapping (mappings start on a
        // page) or, for heap memory, to this process. Exercised by
        // `advise_accepts_heap_and_bounds`.
        let rc = unsafe { libc::madvise(aligned as *mut libc::c_void, len, code) };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (bytes, advice);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advise_accepts_heap_and_bounds() {
        let v = vec![1u8; 3 * 4096 + 100];
        for a in [Advice::WillNeed, Advice::Random, Advice::Normal] {
            advise(&v, 10..2 * 4096 + 7, a).unwrap();
        }
        // out of range or empty: nothing to do
        advise(&v, 0..v.len() + 1, Advice::Random).unwrap();
        advise(&v, 5..5, Advice::Random).unwrap();
        assert!(v.iter().all(|&b| b == 1), "advice leaves contents alone");
    }
}
