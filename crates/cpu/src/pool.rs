//! The thread pool the kernels run on.

/// A fixed-size pool of worker threads (`-t` threads). Kernels run their
/// parallel loops inside [`Pool::install`], so two models with two pools do
/// not share workers.
pub struct Pool {
    inner: rayon::ThreadPool,
    threads: usize,
}

impl Pool {
    /// A pool of `threads` workers (0 means the number of CPUs).
    pub fn new(threads: usize) -> Pool {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let inner = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("redlite-cpu-{i}"))
            .build()
            .unwrap_or_else(|_| {
                // Building a pool fails only when the OS refuses threads;
                // fall back to a single worker rather than dying.
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .build()
                    .expect("a one-thread pool")
            });
        Pool { inner, threads }
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run `f` on this pool; rayon parallel iterators inside use its workers.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.inner.install(f)
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Pool({} threads)", self.threads)
    }
}
