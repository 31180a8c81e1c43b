//! `bench model --profile`'s prefill table: a prompt run with the stream
//! drained after each step of every chunk, each step's host-timed wall
//! time added to its class (`lap!` in `prefill.rs`), then run again
//! undisturbed for the real rate.

use super::CudaDecoder;
use crate::device::Gpu;
use crate::error::{ensure, Result};
use redlite_model::Model;

/// Host-timed laps of a profiled prefill: the stream is drained after each
/// step and its wall time added to the step's class.
pub(super) struct Laps {
    last: std::time::Instant,
    pub(super) rows: Vec<(&'static str, f64, usize)>,
}

impl Laps {
    pub(super) fn new() -> Self {
        Self {
            last: std::time::Instant::now(),
            rows: Vec::new(),
        }
    }

    pub(super) fn lap(&mut self, gpu: &Gpu, label: &'static str, launches: usize) -> Result<()> {
        gpu.sync()?;
        let now = std::time::Instant::now();
        let us = (now - self.last).as_secs_f64() * 1e6;
        self.last = now;
        match self.rows.iter_mut().find(|r| r.0 == label) {
            Some(r) => {
                r.1 += us;
                r.2 += launches;
            }
            None => self.rows.push((label, us, launches)),
        }
        Ok(())
    }
}

impl CudaDecoder {
    /// Where a prompt's time goes: `tokens` prefilled from the current
    /// position with the stream drained after each step (host-timed), then
    /// again without; µs per prompt token by step class.
    pub fn profile_prefill(
        &mut self,
        model: &Model,
        tokens: &[u32],
    ) -> Result<super::TokenProfile> {
        ensure!(
            self.batched_prefill(),
            "the prefill profile needs the batched prefill"
        );
        let chunk = self.prefill_chunk;
        let pos0 = self.pos;
        let n = tokens.len() as f64;
        let mut laps = Some(Laps::new());
        let t0 = std::time::Instant::now();
        self.begin_prefill()?;
        let mut res = Ok(());
        for part in tokens.chunks(chunk) {
            res = self.run_chunk(model, part, chunk, None, &mut laps);
            if res.is_err() {
                break;
            }
        }
        let end = self.end_prefill();
        res?;
        end?;
        let total_us = t0.elapsed().as_secs_f64() * 1e6 / n;
        self.set_pos(pos0)?;
        let t1 = std::time::Instant::now();
        self.prefill(model, tokens, false)?;
        let plain_us = t1.elapsed().as_secs_f64() * 1e6 / n;
        let rows = laps
            .map(|l| l.rows)
            .unwrap_or_default()
            .into_iter()
            .map(|(label, us, k)| (label, us / n, k))
            .collect();
        Ok(super::TokenProfile {
            rows,
            total_us,
            plain_us,
        })
    }
}
