//! The device: one context, one stream, the compiled kernels; and the
//! raw-address and launch-shape helpers every launch wrapper uses.

use crate::error::{ensure, Context, CudaError, Result};
use crate::kernels;
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
};
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Arc;

/// One GPU with every kernel of [`kernels::FILES`] loaded.
pub struct Gpu {
    /// Kernels launched (or recorded into a graph) through [`Gpu::launch`]
    /// on this handle: the profile counts kernels per class with it.
    launches: std::sync::atomic::AtomicUsize,
    /// Launches are dropped while set (ablation while recording a graph:
    /// the decoder's `REDLITE_CUDA_ABLATE`, a measuring tool).
    suppressed: std::sync::atomic::AtomicBool,
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Device name and compute capability, for reports.
    pub name: String,
    /// Seconds spent in NVRTC + module load.
    pub compile_s: f64,
    /// Streaming multiprocessors (sizes the split of decode attention).
    pub sms: usize,
    /// Launch every kernel with programmatic dependent launch (PDL): the
    /// next kernel of the stream may be scheduled while the previous one
    /// still runs, hiding the launch latency between dependent kernels
    /// (the kernels wait for their predecessor in `PDL_PROLOGUE`, see
    /// `kernels/common.cuh`). Off by default; the CLI's `--pdl` sets it.
    /// Read at launch time, so it must be set before a decoder records
    /// its graph.
    pub pdl: bool,
}

/// A kernel argument passed by value: a scalar or a raw device address
/// (`u64`). Device buffers are passed as addresses, never as `CudaSlice`:
/// with one stream and event tracking off there is nothing for cudarc's
/// per-buffer bookkeeping to do.
pub trait KernelArg {
    /// The address of the value, as the driver's parameter array holds it.
    fn param(&self) -> *mut c_void;
}

impl<T: DeviceRepr> KernelArg for T {
    fn param(&self) -> *mut c_void {
        // The driver only reads through it (it copies the value at launch).
        self as *const T as *mut c_void
    }
}

impl Gpu {
    /// Open device `ordinal` (loads libcuda and libnvrtc at run time) and
    /// compile every kernel file with its own tuning constants.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_defines(ordinal, &[])
    }

    /// [`Gpu::new`] with NVRTC `-D` overrides of the kernels' `#ifndef`
    /// tuning constants ([`crate::tuning::CudaTuning::defines`]).
    pub fn with_defines(ordinal: usize, defines: &[String]) -> Result<Self> {
        // cudarc panics when libcuda cannot be loaded: make that an error
        // (the panic's own message is kept off stderr meanwhile).
        let hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let ctx = std::panic::catch_unwind(|| CudaContext::new(ordinal));
        std::panic::set_hook(hook);
        let ctx = ctx
            .map_err(|_| {
                CudaError::Invalid("libcuda not found (no NVIDIA driver on this machine?)".into())
            })?
            .context("opening the CUDA device")?;
        let (major, minor) = ctx.compute_capability()?;
        let name = format!("{} (sm_{major}{minor})", ctx.name()?);
        let sms = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_or(132, |n| n.max(1) as usize);
        // SAFETY: everything this crate does runs on the one stream below,
        // so cudarc's per-buffer events (cross-stream ordering) are not
        // needed; without them launches can be captured into CUDA graphs.
        unsafe { ctx.disable_event_tracking() };
        // A created stream, not the legacy default stream: only those can be
        // captured into graphs.
        let stream = ctx.new_stream()?;
        let t = std::time::Instant::now();
        let ptxs = kernels::compile_all(defines)?;
        let mut funcs = HashMap::new();
        for (file, ptx) in kernels::FILES.iter().zip(ptxs) {
            let module = ctx
                .load_module(ptx)
                .with_context(|| format!("loading {}", file.name))?;
            for &k in file.kernels {
                funcs.insert(k, module.load_function(k).with_context(|| k.to_string())?);
            }
        }
        // The f16 tensor-core decode attention takes more dynamic shared
        // memory than the default 48 KB: allowed once here, where no graph
        // capture is running (the decoder captures its launches).
        for d in [2usize, 4, 8] {
            let name = format!("attn_split_mma_kvf16_d{d}");
            if let Some(f) = funcs.get(name.as_str()) {
                f.set_attribute(
                    cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    crate::ops::mma_smem_bytes(32 * d) as i32,
                )
                .with_context(|| format!("{name}: shared memory"))?;
            }
        }
        Ok(Self {
            launches: Default::default(),
            suppressed: Default::default(),
            ctx,
            stream,
            funcs,
            name,
            compile_s: t.elapsed().as_secs_f64(),
            sms,
            pdl: false,
        })
    }

    /// The same device and kernels on a new stream (a branch of a captured
    /// graph: work on it joins the main stream through events).
    pub fn side(&self) -> Result<Gpu> {
        Ok(Self {
            launches: Default::default(),
            suppressed: Default::default(),
            ctx: self.ctx.clone(),
            stream: self.ctx.new_stream()?,
            funcs: self.funcs.clone(),
            name: self.name.clone(),
            compile_s: 0.0,
            sms: self.sms,
            pdl: self.pdl,
        })
    }

    /// (free, total) bytes of device memory.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.ctx.bind_to_thread()?;
        Ok(cudarc::driver::result::mem_get_info()?)
    }

    /// The kernel named `name`.
    pub fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs
            .get(name)
            .ok_or_else(|| CudaError::Invalid(format!("no kernel {name:?} loaded")))
    }

    /// Launch kernel `name` on the stream: the one launch path of every
    /// kernel of this crate (ops and GEMVs), so `pdl` applies to all of
    /// them. Without `pdl` it is the plain `cuLaunchKernel` that cudarc's
    /// `LaunchArgs::launch` issues; with it `cuLaunchKernelEx` with the
    /// programmatic-stream-serialization attribute.
    ///
    /// # Safety
    /// `args` must match the kernel's parameter list in order and type, and
    /// every address must point at a live buffer large enough for what the
    /// kernel reads and writes with these sizes and this grid.
    pub unsafe fn launch(
        &self,
        name: &str,
        cfg: LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<()> {
        let f = self.func(name)?.cu_function();
        if self.suppressed.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        self.launches
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // The driver API acts on the thread's current context.
        self.ctx.bind_to_thread()?;
        // Pointers to the argument values, which outlive this call; the
        // driver copies the values before it returns.
        let mut params: Vec<*mut c_void> = args.iter().map(|a| a.param()).collect();
        let stream = self.stream.cu_stream();
        if !self.pdl {
            // SAFETY: `f` is a function of a module `self` keeps loaded,
            // `stream` is this context's live stream, and `params` holds
            // one pointer per kernel parameter (the caller's contract).
            unsafe {
                cudarc::driver::result::launch_kernel(
                    f,
                    cfg.grid_dim,
                    cfg.block_dim,
                    cfg.shared_mem_bytes,
                    stream,
                    &mut params,
                )
            }?;
            return Ok(());
        }
        // Writing a union field is safe; start from all zero bytes so the
        // driver sees no stray bits around the int it reads for this id.
        let mut value = sys::CUlaunchAttributeValue { pad: [0; 64] };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attr = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: stream,
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as above for `f`, `stream` and `params`; `config` and the
        // one attribute it points at live on this frame for the call, and
        // no `extra` array is passed (null).
        unsafe { sys::cuLaunchKernelEx(&config, f, params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()?;
        Ok(())
    }

    /// While `on`, [`Gpu::launch`] records nothing (and counts nothing).
    pub fn set_suppressed(&self, on: bool) {
        self.suppressed
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Kernels launched through this handle so far.
    pub fn launch_count(&self) -> usize {
        self.launches.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Wait for the stream and surface any asynchronous kernel error.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize()?;
        self.ctx.check_err()?;
        Ok(())
    }
}

/// The raw device address of a buffer (0 for `None`: a null pointer).
pub fn dptr<T>(gpu: &Gpu, s: Option<&CudaSlice<T>>) -> u64 {
    match s {
        Some(s) => s.device_ptr(&gpu.stream).0,
        None => 0,
    }
}

/// A vector inside a buffer: the buffer and the offset (in floats) where
/// the vector starts (several GEMV outputs share one buffer when their
/// matrices are uploaded as one).
pub type At<'a> = (&'a CudaSlice<f32>, usize);

/// The raw address of `a` (checked to hold `n` floats).
pub fn at_ptr(gpu: &Gpu, a: At, n: usize) -> Result<u64> {
    ensure!(
        a.0.len() >= a.1 + n,
        "buffer of {} floats holds no {n} at {}",
        a.0.len(),
        a.1
    );
    Ok(dptr(gpu, Some(a.0)) + 4 * a.1 as u64)
}

/// A launch of `grid` blocks of `block` threads, no dynamic shared memory.
pub fn cfg(grid: (u32, u32), block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0, grid.1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `n` as a kernel's `int` argument (an error past `i32::MAX`).
pub fn i32_of(n: usize) -> Result<i32> {
    ensure!(n <= i32::MAX as usize, "size {n} exceeds i32");
    Ok(n as i32)
}
