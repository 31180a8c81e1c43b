//! Recording the token's graph (one, or one per MoE layer plus one when
//! the host serves misses from the file), and the profile: the same ops
//! recorded with a timing event before each kernel class.

use super::stages::Op;
use super::{CudaDecoder, CudaTuning, TokenProfile};
use crate::device::Gpu;
use crate::error::{ensure, Context, CudaError, Result};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaEvent;
use redlite_model::Model;

/// What recording the graph needs besides the buffers: the side stream
/// that prefetches, the event of the prefetch the next MoE layer must
/// wait for, and every event recorded (alive until the graph is built).
pub(super) struct Capture<'a> {
    pub(super) side: &'a Gpu,
    /// The stream a MoE layer's shared expert runs on: a branch of the
    /// graph beside the router, top-k and routed experts (it needs only
    /// h), joined before the combine.
    pub(super) shared: &'a Gpu,
    pub(super) pending: Option<CudaEvent>,
    pub(super) events: Vec<CudaEvent>,
    /// Profiling: a timing event recorded before each kernel class, with
    /// its label and the launch count at that point.
    pub(super) marks: Option<Vec<(CudaEvent, &'static str, usize)>>,
    /// The GEMV configurations.
    pub(super) tuning: &'a CudaTuning,
    /// Ablation (timing only): kernel classes whose launches are left out
    /// of the graph, by label substring ([`CudaTuning::ablate`]).
    pub(super) ablate: &'a [String],
}

impl Capture<'_> {
    /// What runs from here until the next mark is kernel class `label`:
    /// timed when profiling, left out when ablated.
    pub(super) fn mark(&mut self, gpu: &Gpu, label: &'static str) -> Result<()> {
        gpu.set_suppressed(self.ablate.iter().any(|a| label.contains(a.as_str())));
        if let Some(m) = &mut self.marks {
            let ev = gpu
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            // Recorded as an external event: inside a stream capture a
            // plain record only orders work within the capture, the
            // external flag makes it an event record node that timestamps.
            // SAFETY: both handles are live objects of this context (the
            // event is kept in `marks` until the graph is done with).
            unsafe {
                cudarc::driver::sys::cuEventRecordWithFlags(
                    ev.cu_event(),
                    gpu.stream.cu_stream(),
                    cudarc::driver::sys::CUevent_record_flags::CU_EVENT_RECORD_EXTERNAL as u32,
                )
            }
            .result()?;
            m.push((ev, label, gpu.launch_count()));
        }
        Ok(())
    }
}

/// Which part of an op to record: all of it, or (MoE) the half before
/// the host serves cache misses from the file, or the half after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    All,
    Head,
    Tail,
}

impl CudaDecoder {
    pub(super) fn capture(&mut self) -> Result<()> {
        let gpu = &self.gpu;
        gpu.sync()?;
        if !self.tuning.ablate.is_empty() {
            // On stderr whatever the log level: these outputs must not be
            // mistaken for real ones.
            eprintln!(
                "warning: REDLITE_CUDA_ABLATE: kernels of {:?} left out: timing only, outputs are wrong",
                self.tuning.ablate
            );
        }
        let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        let flags = CUgraphInstantiate_flags(0);
        let mut cap = Capture {
            side: &self.side,
            shared: &self.shared_side,
            pending: None,
            events: Vec::new(),
            marks: None,
            tuning: &self.tuning,
            ablate: &self.tuning.ablate,
        };
        let (mut graphs, mut points) = (Vec::new(), Vec::new());
        gpu.stream.begin_capture(mode)?;
        let mut res = Ok(());
        for (i, op) in self.ops.iter_mut().enumerate() {
            let split = matches!(op, Op::Moe(m) if m.file.is_some());
            if !split {
                res = op.run(gpu, &mut self.bufs, &mut cap, Phase::All);
            } else {
                res = op.run(gpu, &mut self.bufs, &mut cap, Phase::Head);
                if res.is_err() {
                    break;
                }
                // The capture ends here whatever happens: a failure above
                // left it open.
                graphs.push(
                    gpu.stream
                        .end_capture(flags)?
                        .context("captured an empty graph")?,
                );
                points.push(i);
                gpu.stream.begin_capture(mode)?;
                res = op.run(gpu, &mut self.bufs, &mut cap, Phase::Tail);
            }
            if res.is_err() {
                break;
            }
        }
        if res.is_ok() && cap.pending.is_some() {
            res = Err(CudaError::Invalid(
                "a prefetch was never joined (no MoE layer after it)".into(),
            ));
        }
        let graph = gpu.stream.end_capture(flags);
        gpu.set_suppressed(false);
        drop(cap);
        res?;
        graphs.push(graph?.context("captured an empty graph")?);
        self.graphs = graphs;
        self.host_points = points;
        Ok(())
    }

    /// Where a token's time goes: a second graph of the same ops with a
    /// timing event before each kernel class, replayed `reps` times at the
    /// current position (after one warm-up token); the GPU time between
    /// consecutive events is summed per class. Returns the rows (class,
    /// µs per token, kernels per token), the profiled token's total and a
    /// plain graph replay's time for the same token (the events' own cost
    /// is the difference). Single-graph decoders only.
    pub fn profile(&mut self, model: &Model, token: u32, reps: usize) -> Result<TokenProfile> {
        ensure!(
            self.host_points.is_empty(),
            "profile: the token is cut into several graphs (experts read from the file)"
        );
        let gpu = &self.gpu;
        gpu.sync()?;
        let mut cap = Capture {
            side: &self.side,
            shared: &self.shared_side,
            pending: None,
            events: Vec::new(),
            marks: Some(Vec::new()),
            tuning: &self.tuning,
            ablate: &[],
        };
        gpu.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
        let mut res = Ok(());
        for op in &mut self.ops {
            res = op.run(gpu, &mut self.bufs, &mut cap, Phase::All);
            if res.is_err() {
                break;
            }
        }
        if res.is_ok() {
            res = cap.mark(gpu, "end");
        }
        let graph = gpu.stream.end_capture(CUgraphInstantiate_flags(0));
        res?;
        let graph = graph?.context("captured an empty graph")?;
        let marks = cap.marks.take().unwrap_or_default();
        drop(cap);
        let pos = self.pos;
        let timing = || {
            self.gpu
                .ctx
                .new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))
        };
        let (t0, t1) = (timing()?, timing()?);
        let mut per: Vec<f64> = vec![0.0; marks.len().saturating_sub(1)];
        let (mut total, mut plain) = (0.0f64, 0.0f64);
        for rep in 0..=reps {
            // The profiled graph, then the plain one, at the same position.
            self.pos = pos;
            self.write_token(model, token)?;
            graph.launch()?;
            self.gpu.sync()?;
            if rep > 0 {
                for (i, w) in marks.windows(2).enumerate() {
                    per[i] += w[0].0.elapsed_ms(&w[1].0)? as f64 * 1e3;
                }
                total += marks[0].0.elapsed_ms(&marks[marks.len() - 1].0)? as f64 * 1e3;
            }
            self.write_token(model, token)?;
            t0.record(&self.gpu.stream)?;
            self.graphs[0].launch()?;
            t1.record(&self.gpu.stream)?;
            self.gpu.sync()?;
            if rep > 0 {
                plain += t0.elapsed_ms(&t1)? as f64 * 1e3;
            }
        }
        self.pos = pos;
        let n = reps.max(1) as f64;
        let mut rows: Vec<(&'static str, f64, usize)> = Vec::new();
        for (i, w) in marks.windows(2).enumerate() {
            let kernels = w[1].2 - w[0].2;
            match rows.iter_mut().find(|r| r.0 == w[0].1) {
                Some(r) => {
                    r.1 += per[i] / n;
                    r.2 += kernels;
                }
                None => rows.push((w[0].1, per[i] / n, kernels)),
            }
        }
        Ok(TokenProfile {
            rows,
            total_us: total / n,
            plain_us: plain / n,
        })
    }
}
