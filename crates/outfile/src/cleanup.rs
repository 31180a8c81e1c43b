//! The registry of temporaries that SIGINT/SIGTERM must remove.
//!
//! Signals arrive on an ordinary thread (signal-hook's iterator), not in a
//! signal handler, so removing files and taking a mutex are allowed there.
//! Creating, renaming and removing a temporary all happen with the
//! registry lock held, and the signal thread exits the process while
//! holding it: a temporary is either committed (renamed into place, no
//! longer registered) or removed, never left behind.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once};

struct Entry {
    id: u64,
    path: PathBuf,
    is_dir: bool,
}

#[derive(Default)]
struct Registry {
    next: u64,
    entries: Vec<Entry>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry {
    next: 0,
    entries: Vec::new(),
});
static INSTALL: Once = Once::new();

fn lock() -> MutexGuard<'static, Registry> {
    // A panic while holding the lock leaves the list itself intact.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

fn remove(path: &Path, is_dir: bool) {
    let _ = if is_dir {
        std::fs::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
}

/// Start the signal thread (once per process). Without it (signal-hook
/// could not register), temporaries are still removed on error and drop.
fn install() {
    INSTALL.call_once(|| {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]) else {
            return;
        };
        let _ = std::thread::Builder::new()
            .name("redlite-outfile-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let reg = lock();
                    for e in &reg.entries {
                        remove(&e.path, e.is_dir);
                    }
                    // Exit with the lock held: no commit can follow.
                    std::process::exit(128 + sig);
                }
            });
    });
}

/// Run `create` (which makes the temporary at `path`) with the lock held
/// and register the path when it succeeds.
pub(crate) fn register<T, E>(
    path: &Path,
    is_dir: bool,
    create: impl FnOnce() -> Result<T, E>,
) -> Result<(u64, T), E> {
    install();
    let mut reg = lock();
    let value = create()?;
    let id = reg.next;
    reg.next += 1;
    reg.entries.push(Entry {
        id,
        path: path.to_path_buf(),
        is_dir,
    });
    Ok((id, value))
}

/// Run `f` (a rename into place, or the removal) with the lock held, then
/// forget temporary `id`.
pub(crate) fn finish<T>(id: u64, f: impl FnOnce() -> T) -> T {
    let mut reg = lock();
    let r = f();
    reg.entries.retain(|e| e.id != id);
    r
}

pub(crate) fn pending() -> Vec<PathBuf> {
    lock().entries.iter().map(|e| e.path.clone()).collect()
}
