//! The device: one context, one stream, the compiled kernels.

use crate::error::{Context, CudaError, Result};
use crate::kernels;
use cudarc::driver::{CudaContext, CudaFunction, CudaStream};
use std::collections::HashMap;
use std::sync::Arc;

/// One GPU with every kernel of [`kernels::FILES`] loaded.
pub struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    funcs: HashMap<&'static str, CudaFunction>,
    /// Device name and compute capability, for reports.
    pub name: String,
    /// Seconds spent in NVRTC + module load.
    pub compile_s: f64,
    /// Streaming multiprocessors (sizes the split of decode attention).
    pub sms: usize,
}

impl Gpu {
    /// Open device `ordinal` (loads libcuda and libnvrtc at run time) and
    /// compile every kernel file.
    pub fn new(ordinal: usize) -> Result<Self> {
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
        let ptxs = kernels::compile_all()?;
        let mut funcs = HashMap::new();
        for (file, ptx) in kernels::FILES.iter().zip(ptxs) {
            let module = ctx
                .load_module(ptx)
                .with_context(|| format!("loading {}", file.name))?;
            for &k in file.kernels {
                funcs.insert(k, module.load_function(k).with_context(|| k.to_string())?);
            }
        }
        Ok(Self {
            ctx,
            stream,
            funcs,
            name,
            compile_s: t.elapsed().as_secs_f64(),
            sms,
        })
    }

    /// The same device and kernels on a new stream (a branch of a captured
    /// graph: work on it joins the main stream through events).
    pub fn side(&self) -> Result<Gpu> {
        Ok(Self {
            ctx: self.ctx.clone(),
            stream: self.ctx.new_stream()?,
            funcs: self.funcs.clone(),
            name: self.name.clone(),
            compile_s: 0.0,
            sms: self.sms,
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

    /// Wait for the stream and surface any asynchronous kernel error.
    pub fn sync(&self) -> Result<()> {
        self.stream.synchronize()?;
        self.ctx.check_err()?;
        Ok(())
    }
}
