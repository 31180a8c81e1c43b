//! What the machine has: RAM and the cgroup limit, for the start-up
//! statement of what will be resident and the refusal of runs that cannot fit.

pub use redlite_model::expertcache::residency::{available_bytes, cgroup_limit_bytes};

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
