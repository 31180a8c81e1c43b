//! What the machine has: RAM and the cgroup limit, for the start-up
//! statement of what will be resident and the refusal of runs that cannot fit.

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

/// How the model file's bytes are held: `--mmap` maps it (pages read on
/// demand, evictable), `--no-mmap` reads it into anonymous memory with
/// transparent huge pages (not evictable; faster streaming), and the default
/// reads it in when it takes at most half of the available memory.
pub fn open_model(
    path: &std::path::Path,
    mmap: bool,
    no_mmap: bool,
) -> anyhow::Result<redlite_gguf::GgufFile> {
    use anyhow::Context;
    let file = if mmap {
        redlite_gguf::GgufFile::open(path)
    } else if no_mmap {
        redlite_gguf::GgufFile::open_in_memory(path)
    } else {
        redlite_gguf::GgufFile::open_auto(path, available_bytes())
    };
    file.with_context(|| format!("opening model {}", path.display()))
}

/// How the start-up line names where the weights are.
pub fn weights_residency(file: &redlite_gguf::GgufFile) -> &'static str {
    if file.is_in_memory() {
        "read into memory (huge pages)"
    } else {
        "mapped from the file"
    }
}

pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}
