//! [`ReferenceMode`]: which arithmetic the CPU kernels use, one value per
//! process.
//!
//! `REDLITE_REFERENCE` is parsed once, by the binary at start-up
//! ([`ReferenceMode::from_lookup`]), and stored with
//! [`set_reference_mode`]: the kernel dispatch of this crate ([`crate::dot`],
//! [`crate::dot_rows_fn`], [`crate::gemm_fn`], the activation quantizers)
//! is reached from deep inside every matmul, so it reads the process-wide
//! value ([`reference_mode`]) instead of carrying it through each call.
//! Nothing in the library reads the environment.

use std::sync::atomic::{AtomicU8, Ordering};

/// What the reference switch asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReferenceMode {
    /// The fast kernels (SIMD where there are some). `REDLITE_REFERENCE`
    /// unset, empty or `0`.
    #[default]
    Off,
    /// The scalar reference kernels everywhere, activations quantized as
    /// ggml quantizes them (`REDLITE_REFERENCE=1`).
    Ggml,
    /// The scalar reference kernels, and the model's reference path keeps
    /// f32 activations (matmuls as `Σ w_deq · x`): the arithmetic of the
    /// CUDA decoder's f32-activation kernels (`REDLITE_REFERENCE=f32`).
    F32,
}

/// A `REDLITE_REFERENCE` value that names no mode.
#[derive(Debug, thiserror::Error)]
#[error("{}: {value:?}: expected 0, 1 or f32", ReferenceMode::VAR)]
pub struct ReferenceModeError {
    pub value: String,
}

impl ReferenceMode {
    /// The environment variable the binaries map to the mode.
    pub const VAR: &'static str = "REDLITE_REFERENCE";

    /// The mode a value of [`ReferenceMode::VAR`] names (None: unset).
    pub fn parse(v: Option<&str>) -> Result<Self, ReferenceModeError> {
        match v {
            None | Some("") | Some("0") => Ok(Self::Off),
            Some("1") => Ok(Self::Ggml),
            Some(s) if s.eq_ignore_ascii_case("f32") => Ok(Self::F32),
            Some(s) => Err(ReferenceModeError {
                value: s.to_string(),
            }),
        }
    }

    /// The mode from `get(name)` (a binary passes `|n| std::env::var(n).ok()`).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ReferenceModeError> {
        Self::parse(get(Self::VAR).as_deref())
    }

    /// Whether the scalar reference kernels (and the model's reference
    /// path) are forced.
    pub fn is_on(self) -> bool {
        self != Self::Off
    }

    /// Whether the model's reference path keeps f32 activations.
    pub fn f32_activations(self) -> bool {
        self == Self::F32
    }
}

static MODE: AtomicU8 = AtomicU8::new(0);

/// Set the process's mode: once at start-up, before any model runs (a
/// kernel picked before the change keeps running as it was picked).
pub fn set_reference_mode(m: ReferenceMode) {
    let v = match m {
        ReferenceMode::Off => 0,
        ReferenceMode::Ggml => 1,
        ReferenceMode::F32 => 2,
    };
    MODE.store(v, Ordering::Relaxed);
}

/// The process's mode ([`ReferenceMode::Off`] until set).
pub fn reference_mode() -> ReferenceMode {
    match MODE.load(Ordering::Relaxed) {
        0 => ReferenceMode::Off,
        1 => ReferenceMode::Ggml,
        _ => ReferenceMode::F32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_name_modes() {
        assert_eq!(ReferenceMode::parse(None).unwrap(), ReferenceMode::Off);
        assert_eq!(ReferenceMode::parse(Some("")).unwrap(), ReferenceMode::Off);
        assert_eq!(ReferenceMode::parse(Some("0")).unwrap(), ReferenceMode::Off);
        assert_eq!(
            ReferenceMode::parse(Some("1")).unwrap(),
            ReferenceMode::Ggml
        );
        assert_eq!(
            ReferenceMode::parse(Some("F32")).unwrap(),
            ReferenceMode::F32
        );
        for bad in ["2", "yes", "f16", " 1"] {
            let e = ReferenceMode::parse(Some(bad)).unwrap_err().to_string();
            assert!(
                e.contains("REDLITE_REFERENCE") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        let m = ReferenceMode::from_lookup(|n| (n == "REDLITE_REFERENCE").then(|| "f32".into()));
        assert!(m.unwrap().f32_activations());
        assert!(ReferenceMode::Ggml.is_on() && !ReferenceMode::Ggml.f32_activations());
        assert!(!ReferenceMode::Off.is_on());
    }
}
