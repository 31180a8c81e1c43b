//! Architectures on top of the CPU kernels: config from GGUF metadata,
//! tensor specs checked at load, the forward pass, sessions, sampling.
//!
//! ```no_run
//! use redlite_model::{LoadOptions, Logits, Model};
//! use std::sync::Arc;
//! let file = Arc::new(redlite_gguf::GgufFile::open("model.gguf")?);
//! let model = Model::load(file, LoadOptions::default())?;
//! let mut s = model.new_session(4096);
//! let logits = s.forward(&model, &[1, 2, 3], Logits::Last)?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod arch;
pub mod blocks;
pub mod check;
pub mod error;
pub mod exec;
pub mod image;
pub mod model;
pub mod sample;
pub mod sequence;
pub mod session;
pub mod stages;
pub mod trace;
pub mod weights;

pub use arch::qwen3next_mtp::{MtpHead, MtpOutput, MtpState};
pub use check::check_model_bytes;
pub use error::ModelError;
pub use image::{KvData, KvElem, LayerImage, LayerShape, StateImage, StateLayout};
pub use model::{ExpertCacheOptions, LoadOptions, MemoryRequest, Model};
pub use redlite_expertcache as expertcache;
pub use sequence::{CacheCounters, Checkpoint, CpuSequence, Sequence, TokenProfile};
pub use session::{LayerState, Logits, Session};
