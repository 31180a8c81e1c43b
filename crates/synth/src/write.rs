//! Streaming a plan to disk: workers generate fixed-size chunks (claimed
//! in file order, at most `window` ahead of the writer), the calling
//! thread writes them in order.

use crate::{Plan, SynthError};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use redlite_gguf::{GgufStreamWriter, TensorDecl};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Condvar, Mutex};
use std::time::Instant;

/// Target chunk size (bytes of tensor data per work item).
pub const CHUNK_BYTES: u64 = 4 << 20;

#[derive(Clone, Debug)]
pub struct WriteOptions {
    /// Generator threads (at least 1).
    pub threads: usize,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

impl Default for WriteOptions {
    fn default() -> WriteOptions {
        WriteOptions {
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            progress: false,
        }
    }
}

/// What [`write`] did.
#[derive(Clone, Debug)]
pub struct WriteStats {
    /// Bytes of the file.
    pub file_bytes: u64,
    /// Seconds from start to the synced, renamed file.
    pub seconds: f64,
}

impl WriteStats {
    pub fn gb_per_s(&self) -> f64 {
        self.file_bytes as f64 / 1e9 / self.seconds.max(1e-9)
    }
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    tensor: usize,
    first_unit: u64,
    bytes: usize,
}

fn chunks(plan: &Plan) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (i, t) in plan.tensors.iter().enumerate() {
        let total = t.n_bytes();
        let (_, unit_bytes) = plan.unit(i);
        let per = (CHUNK_BYTES / unit_bytes).max(1);
        let n_units = total.div_ceil(unit_bytes);
        let mut u = 0;
        while u < n_units {
            let k = per.min(n_units - u);
            let bytes = (k * unit_bytes).min(total - u * unit_bytes);
            out.push(Chunk {
                tensor: i,
                first_unit: u,
                bytes: bytes as usize,
            });
            u += k;
        }
    }
    out
}

/// Generate `plan` into `path` (atomically: temporary file, then rename).
pub fn write(plan: &Plan, path: &Path, opts: &WriteOptions) -> Result<WriteStats, SynthError> {
    write_checked(plan, path, &[], opts)
}

/// [`write`], refusing (before anything is written) a `path` that is a
/// directory or the same file as one of `inputs`. The file is written in
/// a private directory beside `path` and moved over it when complete; on
/// error, on drop and on SIGINT/SIGTERM the directory is removed.
pub fn write_checked(
    plan: &Plan,
    path: &Path,
    inputs: &[&Path],
    opts: &WriteOptions,
) -> Result<WriteStats, SynthError> {
    let start = Instant::now();
    let out = redlite_outfile::OutputDir::create(path, inputs)?;
    let file_bytes = write_into(plan, out.path(), opts)?;
    out.commit()?;
    Ok(WriteStats {
        file_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// Stream `plan` into `path` (the GGUF writer's own temporary and
/// rename); the bytes of the finished file.
fn write_into(plan: &Plan, path: &Path, opts: &WriteOptions) -> Result<u64, SynthError> {
    let decls: Vec<TensorDecl> = plan
        .tensors
        .iter()
        .map(|t| TensorDecl::new(t.name.clone(), t.dims.clone(), t.ty))
        .collect();
    let mut w = GgufStreamWriter::create(path, &plan.metadata, &decls)?;
    let work = chunks(plan);
    let threads = opts.threads.max(1);
    let window = 2 * threads + 2;

    let pb = if opts.progress {
        ProgressBar::with_draw_target(Some(plan.data_bytes()), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }

    let next = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    // Chunks written so far; workers wait until their chunk is within the window.
    let written = Mutex::new(0usize);
    let cv = Condvar::new();
    let pool: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());
    let (tx, rx) = mpsc::channel::<(usize, Result<Vec<u8>, SynthError>)>();

    let result = std::thread::scope(|s| {
        for _ in 0..threads {
            let tx = tx.clone();
            let (next, abort, written, cv, pool, work) =
                (&next, &abort, &written, &cv, &pool, &work);
            s.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = work.get(i).copied() else { break };
                {
                    let mut g = written.lock().unwrap_or_else(|e| e.into_inner());
                    while i >= *g + window && !abort.load(Ordering::Relaxed) {
                        g = cv.wait(g).unwrap_or_else(|e| e.into_inner());
                    }
                }
                if abort.load(Ordering::Relaxed) {
                    break;
                }
                let mut buf = pool
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .pop()
                    .unwrap_or_default();
                buf.resize(c.bytes, 0);
                let r = plan.fill(c.tensor, c.first_unit, &mut buf).map(|()| buf);
                if tx.send((i, r)).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        let mut pending: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut done = 0usize;
        let res = (|| -> Result<(), SynthError> {
            while done < work.len() {
                let (i, r) = rx
                    .recv()
                    .map_err(|_| SynthError::Io("generator threads stopped early".into()))?;
                pending.insert(i, r?);
                while let Some(buf) = pending.remove(&done) {
                    let c = work[done];
                    w.write_tensor_data(&plan.tensors[c.tensor].name, &buf)?;
                    pb.inc(buf.len() as u64);
                    pool.lock().unwrap_or_else(|e| e.into_inner()).push(buf);
                    done += 1;
                    *written.lock().unwrap_or_else(|e| e.into_inner()) = done;
                    cv.notify_all();
                }
            }
            Ok(())
        })();
        if res.is_err() {
            abort.store(true, Ordering::Relaxed);
            cv.notify_all();
        }
        drop(rx);
        res
    });
    result?;
    pb.set_message("syncing");
    w.finish()?;
    pb.finish_and_clear();
    let file_bytes = std::fs::metadata(path)
        .map_err(|e| SynthError::Io(format!("stat {}: {e}", path.display())))?
        .len();
    Ok(file_bytes)
}
