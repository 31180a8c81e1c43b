//! `redlite synth`: arguments and the command.

use crate::{report, write_checked, Layout, Plan, SynthError, TokenizerSource, WriteOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write a synthetic GGUF with the exact Qwen3-Next-80B-A3B shapes and random valid blocks.
#[derive(clap::Args, Debug, Clone)]
pub struct SynthArgs {
    /// Quantization layout: iq2 (experts IQ2_XXS), cf2 (IQ1_M gate/up, IQ2_XS down), q4km (Q4_K gate/up, Q6_K down).
    #[arg(long, default_value = "iq2")]
    pub layout: String,
    /// Output file (omit with --report to only print the report).
    #[arg(long, required_unless_present = "report")]
    pub out: Option<PathBuf>,
    /// Seed of the random blocks.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Layers (48 in the real model); every 4th layer is full attention.
    #[arg(long, default_value_t = 48)]
    pub layers: usize,
    /// NextN (MTP) blocks after the layers: 1 as in the released model and
    /// llama.cpp's converter's default output; 0 as with its `--no-mtp`.
    #[arg(long, default_value_t = 1)]
    pub mtp_layers: usize,
    /// Generator threads (default: all cores).
    #[arg(short, long)]
    pub threads: Option<usize>,
    /// Copy tokenizer.* from this GGUF instead of the embedded Qwen2 tokenizer.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Print the expert-usage report of the routers (simulated hidden states).
    #[arg(long)]
    pub report: bool,
    /// Simulated tokens per layer for --report.
    #[arg(long, default_value_t = 256)]
    pub report_tokens: usize,
    /// Token-to-token correlation of the simulated hidden states for --report.
    #[arg(long, default_value_t = 0.8)]
    pub report_rho: f64,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
}

pub fn run(a: SynthArgs) -> Result<(), SynthError> {
    let layout: Layout = a.layout.parse()?;
    let inputs: Vec<&Path> = a.tokenizer.iter().map(PathBuf::as_path).collect();
    if let Some(out) = &a.out {
        // Up front: a directory or the tokenizer file itself is refused
        // before planning, not after gigabytes are written.
        redlite_outfile::check_target(out, &inputs)?;
    }
    let tok = a
        .tokenizer
        .clone()
        .map_or(TokenizerSource::Embedded, TokenizerSource::File);
    let plan = Plan::with_mtp(layout, a.layers, a.mtp_layers, a.seed, &tok)?;
    if let Some(out) = &a.out {
        let threads = a
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .max(1);
        eprintln!(
            "synth: layout {layout}, {} layers + {} MTP ({:.2} GB of it), seed {}, {} tensors, {:.2} GB of tensor data, {threads} threads -> {}",
            a.layers,
            a.mtp_layers,
            plan.mtp_bytes() as f64 / 1e9,
            a.seed,
            plan.tensors.len(),
            plan.data_bytes() as f64 / 1e9,
            out.display()
        );
        let st = write_checked(
            &plan,
            out,
            &inputs,
            &WriteOptions {
                threads,
                progress: !a.quiet,
            },
        )?;
        eprintln!(
            "synth: wrote {:.2} GB in {:.1} s ({:.2} GB/s, synced)",
            st.file_bytes as f64 / 1e9,
            st.seconds,
            st.gb_per_s()
        );
    }
    if a.report {
        let usage = report::simulate(&plan, a.report_tokens.max(2), a.report_rho)?;
        let text = report::format(&usage, a.report_tokens.max(2), a.report_rho);
        let mut o = std::io::stdout().lock();
        o.write_all(text.as_bytes())
            .and_then(|()| o.flush())
            .map_err(SynthError::Stdout)?;
    }
    Ok(())
}
