//! The typed options of a backend: which device, and how it computes.

use crate::EngineError;

/// Where sequences run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Device {
    /// The CPU (always built).
    #[default]
    Cpu,
    /// An NVIDIA GPU through CUDA (builds with `--features cuda`).
    Cuda,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
}

/// Activations of the device's matrix kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Activations {
    /// int8 activations for the formats with int8 kernels (the default;
    /// the CPU fast path's math).
    #[default]
    Int8,
    /// f32 activations everywhere (the CPU reference path's math).
    F32,
}

/// Element type of a device KV cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F16,
    F32,
}

/// Where a bounded device expert cache copies misses from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpertSource {
    /// Pinned when every expert fits in the available RAM, else the file.
    #[default]
    Auto,
    /// Every expert in page-locked host memory.
    Pinned,
    /// Read from the model file by the host.
    File,
}

/// How to run: the device and its options. The CPU takes none of the
/// device options; they are refused there rather than ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackendOptions {
    pub device: Device,
    pub activations: Activations,
    /// None: f16 with int8 activations, f32 with f32 activations.
    pub kv_type: Option<KvType>,
    /// Programmatic dependent launch (GPU).
    pub pdl: bool,
    pub expert_source: ExpertSource,
    /// Prompt tokens per batched-prefill chunk on the GPU (llama.cpp's
    /// `-ub`): None, the backend's choice (2048, or the context if
    /// smaller); Some(0): token by token.
    pub ubatch: Option<usize>,
    /// Backend tuning switches by name (the GPU's `REDLITE_CUDA_*`,
    /// docs/cuda.md), as the front end read them; the backend parses them
    /// once, at open, and names a bad one.
    pub tuning: Vec<(String, String)>,
}

impl Default for BackendOptions {
    fn default() -> Self {
        BackendOptions {
            device: Device::Cpu,
            activations: Activations::Int8,
            kv_type: None,
            pdl: true,
            expert_source: ExpertSource::Auto,
            ubatch: None,
            tuning: Vec::new(),
        }
    }
}

impl BackendOptions {
    /// The KV element type these options give.
    pub fn kv(&self) -> KvType {
        self.kv_type.unwrap_or(match self.activations {
            Activations::Int8 => KvType::F16,
            Activations::F32 => KvType::F32,
        })
    }

    /// Options that only a GPU takes are refused on the CPU.
    pub(crate) fn check(&self) -> Result<(), EngineError> {
        if self.device == Device::Cpu {
            let mut bad = Vec::new();
            if self.activations != Activations::Int8 {
                bad.push("--f32-activations (the CPU's --reference path is its f32 math)");
            }
            if self.kv_type.is_some() {
                bad.push("--kv-type (the CPU keeps f32 K and V)");
            }
            if self.expert_source != ExpertSource::Auto {
                bad.push("--expert-source (the CPU's expert cache reads the file)");
            }
            if self.ubatch.is_some() {
                bad.push("--ubatch (the CPU batches prompts by -b/--batch-size)");
            }
            if let Some((name, _)) = self.tuning.first() {
                tracing::warn!("{name} and the other GPU tuning switches do nothing on the CPU");
            }
            if !bad.is_empty() {
                return Err(EngineError::Options(format!(
                    "these options need --device cuda: {}",
                    bad.join(", ")
                )));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_type_follows_activations_unless_given() {
        let mut o = BackendOptions::default();
        assert_eq!(o.kv(), KvType::F16);
        o.activations = Activations::F32;
        assert_eq!(o.kv(), KvType::F32);
        o.kv_type = Some(KvType::F16);
        assert_eq!(o.kv(), KvType::F16);
    }

    #[test]
    fn gpu_options_are_refused_on_the_cpu() {
        let o = BackendOptions {
            kv_type: Some(KvType::F16),
            ..Default::default()
        };
        let e = o.check().unwrap_err().to_string();
        assert!(e.contains("--kv-type"), "{e}");
        assert!(BackendOptions::default().check().is_ok());
        let gpu = BackendOptions {
            device: Device::Cuda,
            kv_type: Some(KvType::F32),
            ..Default::default()
        };
        assert!(gpu.check().is_ok());
    }
}
