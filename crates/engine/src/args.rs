//! `--device` and the options of a GPU backend: one clap struct shared by
//! `generate`, `bench model`, `parity` and `serve`, turned into the
//! engine's typed [`BackendOptions`] once.

use crate::{Activations, BackendOptions, Device, ExpertSource, KvType};

/// Where to run (a clap value).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceArg {
    #[default]
    Cpu,
    /// An NVIDIA GPU (builds with `--features cuda`): one CUDA graph per
    /// token; prompts run token by token.
    Cuda,
}

/// `--kv-type`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvTypeArg {
    F16,
    F32,
}

/// `--expert-source`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertSourceArg {
    #[default]
    Auto,
    Pinned,
    File,
}

/// The device flags.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceArg::Cpu)]
    pub device: DeviceArg,
    /// With --device cuda: f32 activations everywhere (the CPU reference
    /// path's math) instead of int8 activations for the int8 kernels.
    #[arg(long)]
    pub f32_activations: bool,
    /// With --device cuda: element type of the KV cache (f16 halves the
    /// bytes the decode attention reads; default f16 with int8
    /// activations, f32 with --f32-activations).
    #[arg(long, value_enum)]
    pub kv_type: Option<KvTypeArg>,
    /// With --device cuda: plain kernel launches instead of programmatic
    /// dependent launch (PDL, the default: each kernel starts while the
    /// previous one finishes and prefetches its weights into L2;
    /// docs/cuda.md).
    #[arg(long)]
    pub no_pdl: bool,
    /// With --device cuda and a bounded expert cache: where misses are
    /// copied from. pinned: every expert in page-locked host memory (fast;
    /// needs RAM for all experts); file: read from the model file by the
    /// host (through the page cache) when RAM cannot hold them; auto:
    /// pinned when the experts fit in the available RAM.
    #[arg(long, value_enum, default_value_t = ExpertSourceArg::Auto)]
    pub expert_source: ExpertSourceArg,
    /// With --device cuda: prompt tokens per batched-prefill chunk
    /// (llama.cpp's -ub; default 4096 at full expert residency where its
    /// scratch fits, else 2048, or the context if smaller; 0: token
    /// by token). Under a bounded cache the plan halves it until the
    /// staging images and scratch fit beside the slots.
    #[arg(long)]
    pub ubatch: Option<usize>,
    /// Backend tuning switches by name, filled by the front end from the
    /// environment (`REDLITE_CUDA_*`), not a flag.
    #[arg(skip)]
    pub tuning: Vec<(String, String)>,
}

impl DeviceArgs {
    /// The engine's options.
    pub fn options(&self) -> BackendOptions {
        BackendOptions {
            device: match self.device {
                DeviceArg::Cpu => Device::Cpu,
                DeviceArg::Cuda => Device::Cuda,
            },
            activations: if self.f32_activations {
                Activations::F32
            } else {
                Activations::Int8
            },
            kv_type: self.kv_type.map(|k| match k {
                KvTypeArg::F16 => KvType::F16,
                KvTypeArg::F32 => KvType::F32,
            }),
            pdl: !self.no_pdl,
            expert_source: match self.expert_source {
                ExpertSourceArg::Auto => ExpertSource::Auto,
                ExpertSourceArg::Pinned => ExpertSource::Pinned,
                ExpertSourceArg::File => ExpertSource::File,
            },
            ubatch: self.ubatch,
            tuning: self.tuning.clone(),
        }
    }

    /// Whether the weights are copied off the host (then mapping the file
    /// beats reading it into anonymous memory: a second copy only costs).
    pub fn offloads_weights(&self) -> bool {
        self.device != DeviceArg::Cpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        d: DeviceArgs,
    }

    #[test]
    fn flags_become_typed_options() {
        let o = T::parse_from(["t"]).d.options();
        assert_eq!(o, BackendOptions::default());
        let o = T::parse_from([
            "t",
            "--device",
            "cuda",
            "--f32-activations",
            "--kv-type",
            "f16",
            "--no-pdl",
            "--expert-source",
            "file",
        ])
        .d
        .options();
        assert_eq!(o.device, Device::Cuda);
        assert_eq!(o.activations, Activations::F32);
        assert_eq!(o.kv_type, Some(KvType::F16));
        assert!(!o.pdl);
        assert_eq!(o.expert_source, ExpertSource::File);
        assert!(T::try_parse_from(["t", "--device", "metal"]).is_err());
    }
}
