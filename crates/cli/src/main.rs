use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use redlite_cli::{generate, inspect, limits, modelbench, out, outln, quantbench};
use redlite_gguf::{GgmlType, GgufFile};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Red Lite: fast inference for Qwen3-Next-class GGUF models.
#[derive(Parser)]
#[command(name = "redlite", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a GGUF file holds: architecture, hyperparameters, tokenizer, tensors by type and role, and what this build can compute.
    Inspect {
        /// The GGUF file.
        file: PathBuf,
        /// Also list every metadata key and every tensor.
        #[arg(long)]
        all: bool,
        /// A tensor to dump (with --dump).
        #[arg(long, requires = "dump")]
        tensor: Option<String>,
        /// Write --tensor dequantized as raw little-endian f32, GGUF element order.
        #[arg(long, requires = "tensor")]
        dump: Option<PathBuf>,
    },
    /// Generate text (or token ids) from a prompt, streamed to stdout; logs and speed go to stderr.
    Generate(generate::GenerateArgs),
    /// Perplexity of a text as llama-perplexity computes it (chunks of -c tokens, the second half of each scored), or the KL divergence from a base run's logits.
    Perplexity(redlite_cli::perplexity::PerplexityArgs),
    /// Serve the OpenAI API (chat, completions, streaming, tools) over HTTP.
    Serve(redlite_server::ServeArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize {
        /// The GGUF model file (its tokenizer is used).
        #[arg(short, long)]
        model: PathBuf,
        /// Treat special-token text such as <|im_start|> as plain text.
        #[arg(long)]
        no_special: bool,
        /// The text.
        #[arg(required_unless_present = "file", conflicts_with = "file")]
        text: Option<String>,
        /// Read the text from this file instead (UTF-8).
        #[arg(short = 'f', long)]
        file: Option<PathBuf>,
    },
    /// Write a synthetic GGUF with the exact Qwen3-Next-80B-A3B shapes (random valid blocks) for speed work.
    Synth(redlite_synth::cli::SynthArgs),
    /// CUDA kernel self-test: every kernel against a float64 CPU reference (needs a GPU).
    #[cfg(feature = "cuda")]
    Selftest {
        /// Plain launches instead of programmatic dependent launch (PDL, the default; docs/cuda.md).
        #[arg(long)]
        no_pdl: bool,
    },
    /// CUDA decoder against the CPU engine on GGUF files: logits at every step (argmax, KL, max |dlogit|), greedy tokens, checkpoints, verify passes, state files carried between the backends (needs a GPU).
    #[cfg(feature = "cuda")]
    Parity {
        /// The GGUF files (e.g. tests/fixtures/qwen3next/*.gguf).
        #[arg(short, long, num_args = 1.., required = true)]
        model: Vec<PathBuf>,
        /// Prompt tokens (random ids), run one at a time on both.
        #[arg(long, default_value_t = 24)]
        n_prompt: usize,
        /// Greedy tokens after the prompt.
        #[arg(long, default_value_t = 32)]
        n_greedy: usize,
        /// KL gate (per step, CPU || GPU).
        #[arg(long, default_value_t = 1e-4)]
        kl_max: f64,
        /// Worst-position KL gate of the batched prefill with f32
        /// activations (against the same device token by token and
        /// against the CPU reference): its GEMMs round activations to f16,
        /// and where a router's top-k has a near tie that rounding flips
        /// an expert at one position (docs/cuda.md, batched prefill).
        /// Measured on the tiny fixtures: 40-token prompts 1.1e-6;
        /// 200-token prompts 2.0e-3 at one or two of 216 steps, median
        /// 4.6e-7 (the seeds bound 1100 positions at 3.5e-3). Besides it,
        /// at most 2% of the steps may exceed 1e-4 and 99% of the argmaxes
        /// must agree.
        #[arg(long, default_value_t = 5e-3)]
        prefill_kl_max: f64,
        /// Only the batched prefill's table (long prompts: 4096 and 8192
        /// positions, where the other tables would take long).
        #[arg(long)]
        prefill_only: bool,
        /// Plain launches instead of programmatic dependent launch (PDL, the default; docs/cuda.md).
        #[arg(long)]
        no_pdl: bool,
        /// Real prompts (repeatable), tokenized with each file's tokenizer
        /// and run instead of the random ids (chat-formatted when the file
        /// has a template).
        #[arg(short, long)]
        prompt: Vec<String>,
    },
    /// Benchmarks.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Throughput of every block format's dot kernel (GB/s of weights, one and all threads).
    Quant {
        /// Only these types (e.g. Q4_K,IQ2_XXS).
        #[arg(long, value_delimiter = ',')]
        types: Vec<String>,
        /// Threads for the all-threads column (default: all cores).
        #[arg(short, long)]
        threads: Option<usize>,
        /// Elements per row.
        #[arg(long, default_value_t = 4096)]
        row_len: usize,
        /// Rows per matrix.
        #[arg(long, default_value_t = 1024)]
        rows: usize,
        /// Timed passes per type (the median is reported).
        #[arg(long, default_value_t = 5)]
        passes: usize,
    },
    /// Per-token cost of a JSON-schema grammar's token mask over a model's vocabulary.
    Grammar(redlite_cli::grammarbench::GrammarBenchArgs),
    /// What undoing rejected draft tokens costs the DeltaNet layers (per-token snapshots against replaying the kept tokens).
    Rollback(redlite_cli::rollbackbench::RollbackBenchArgs),
    /// Prompt and decode tok/s of a whole model, printed like llama-bench (pp512, tg64@d4096, ...).
    Model(Box<modelbench::ModelBenchArgs>),
    /// CUDA kernels: GB/s per kernel and shape against the measured device copy bandwidth.
    #[cfg(feature = "cuda")]
    Kernels {
        /// Only the decode kernels other than the GEMVs (attention, DeltaNet step).
        #[arg(long)]
        decode_only: bool,
        /// Plain launches instead of programmatic dependent launch (PDL, the default; docs/cuda.md).
        #[arg(long)]
        no_pdl: bool,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("REDLITE_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        // A closed stdout (`| head`) ends the command quietly, as under
        // SIGPIPE; every output's temporary was removed on the way out.
        Err(e) if out::is_broken_pipe(&e) => ExitCode::from(out::BROKEN_PIPE_STATUS),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "Error: {e:?}");
            ExitCode::FAILURE
        }
    }
}

fn run(mut cli: Cli) -> Result<()> {
    match &mut cli.command {
        Command::Generate(a) => a.dev.tuning = redlite_cli::tuning_vars(),
        Command::Serve(a) => a.dev.tuning = redlite_cli::tuning_vars(),
        Command::Perplexity(a) => a.dev.tuning = redlite_cli::tuning_vars(),
        Command::Bench {
            what: BenchCommand::Model(a),
        } => a.dev.tuning = redlite_cli::tuning_vars(),
        _ => {}
    }
    // REDLITE_REFERENCE, parsed once for the whole process (the CPU
    // kernels' dispatch reads it; docs in redlite_quant::reference).
    redlite_quant::set_reference_mode(redlite_quant::ReferenceMode::from_lookup(|n| {
        std::env::var(n).ok()
    })?);
    match cli.command {
        Command::Inspect {
            file,
            all,
            tensor,
            dump,
        } => {
            limits::input_file(&file, "inspect")?;
            let gguf =
                GgufFile::open(&file).with_context(|| format!("opening {}", file.display()))?;
            if let (Some(name), Some(out)) = (tensor, dump) {
                let n = inspect::dump_tensor(&gguf, &name, &out)?;
                eprintln!("wrote {n} f32 values of {name} to {}", out.display());
            } else {
                out::print(&inspect::report(&gguf, all))?;
            }
        }
        Command::Generate(args) => generate::run(args)?,
        Command::Perplexity(args) => redlite_cli::perplexity::run(args)?,
        Command::Serve(mut args) => {
            limits::input_file(&args.model, "--model")?;
            args.threads = limits::cap_threads(args.threads, "--threads");
            let model = args.model.display().to_string();
            redlite_server::run(args).with_context(|| format!("serve {model}"))?
        }
        Command::Synth(mut args) => {
            args.threads = args.threads.map(|t| limits::cap_threads(t, "--threads"));
            redlite_synth::cli::run(args)?
        }
        #[cfg(feature = "cuda")]
        Command::Selftest { no_pdl } => {
            redlite_cuda::selftest_cli(!no_pdl, &redlite_cli::cudabench::tuning()?)?
        }
        #[cfg(feature = "cuda")]
        Command::Parity {
            model,
            n_prompt,
            n_greedy,
            kl_max,
            prefill_kl_max,
            prefill_only,
            no_pdl,
            prompt,
        } => redlite_cli::cudabench::parity_cli(
            &model,
            n_prompt,
            n_greedy,
            (kl_max, prefill_kl_max),
            !no_pdl,
            &prompt,
            prefill_only,
        )?,
        #[cfg(feature = "cuda")]
        Command::Bench {
            what:
                BenchCommand::Kernels {
                    decode_only,
                    no_pdl,
                },
        } => redlite_cuda::bench_cli(decode_only, !no_pdl, &redlite_cli::cudabench::tuning()?)?,
        Command::Tokenize {
            model,
            no_special,
            text,
            file,
        } => {
            let text = match (text, file) {
                (Some(t), _) => t,
                (None, Some(f)) => std::fs::read_to_string(&f)
                    .with_context(|| format!("--file {}: reading the text", f.display()))?,
                (None, None) => anyhow::bail!("give the text or --file"),
            };
            outln!(
                "{}",
                serde_json::to_string(&generate::tokenize(&model, &text, no_special)?)?
            )?;
        }
        Command::Bench {
            what: BenchCommand::Model(args),
        } => modelbench::run(*args)?,
        Command::Bench {
            what: BenchCommand::Grammar(args),
        } => redlite_cli::grammarbench::run(args)?,
        Command::Bench {
            what: BenchCommand::Rollback(args),
        } => redlite_cli::rollbackbench::run(args)?,
        Command::Bench {
            what:
                BenchCommand::Quant {
                    types,
                    threads,
                    row_len,
                    rows,
                    passes,
                },
        } => {
            let types: Vec<GgmlType> = if types.is_empty() {
                GgmlType::ALL.to_vec()
            } else {
                types
                    .iter()
                    .map(|t| {
                        GgmlType::from_name(t).with_context(|| format!("unknown tensor type {t:?}"))
                    })
                    .collect::<Result<_>>()?
            };
            let threads = limits::cap_threads(
                threads
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
                "--threads",
            );
            outln!("| type | weights | GB/s 1 thread | GB/s {threads} threads |")?;
            outln!("|---|---:|---:|---:|")?;
            for row in quantbench::bench(&types, row_len, rows, passes.max(1), threads)? {
                outln!(
                    "| {} | {:.1} MiB | {:.2} | {:.2} |",
                    row.ty,
                    row.weight_bytes as f64 / (1 << 20) as f64,
                    row.gbps_one_thread,
                    row.gbps_all_threads
                )?;
            }
        }
    }
    Ok(())
}
