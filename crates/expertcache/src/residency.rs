//! What memory this process may use (MemAvailable, cgroup limits), and
//! advice to the kernel about a memory-mapped file: read the dense weights
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

/// Bytes of memory this process may use: the smaller of MemAvailable and any
/// cgroup (v1 or v2) limit on it.
pub fn available_bytes() -> Option<u64> {
    let mem_available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemAvailable:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let cgroup = cgroup_limit_bytes();
    match (mem_available, cgroup) {
        (Some(a), Some(c)) => Some(a.min(c)),
        (a, c) => a.or(c),
    }
}

/// The memory limit of this process's cgroup, if one is set.
pub fn cgroup_limit_bytes() -> Option<u64> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in groups.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let candidates: Vec<String> = if controllers.is_empty() {
            vec![format!("/sys/fs/cgroup{path}/memory.max")]
        } else if controllers.split(',').any(|c| c == "memory") {
            vec![format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")]
        } else {
            continue;
        };
        for c in candidates {
            if let Ok(v) = std::fs::read_to_string(&c) {
                let v = v.trim();
                if let Ok(n) = v.parse::<u64>() {
                    // cgroup v1 reports "no limit" as a huge page-rounded number.
                    if n < (1u64 << 60) {
                        return Some(n);
                    }
                }
            }
        }
    }
    None
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
