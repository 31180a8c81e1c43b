//! Bounded expert residency for MoE models that do not fit in memory.
//!
//! - [`cache`]: a fixed number of slots in anonymous memory (the page cache
//!   cannot evict them) keyed by (layer, expert), a pluggable eviction
//!   [`policy`], parallel reads on I/O threads, prefetch, counters;
//! - [`file`]: where each expert's bytes lie in the model file and the
//!   loader that reads them with `pread`, leaving no page-cache copy;
//! - [`plan`]: the memory planner (what is resident, how many slots, or a
//!   refusal with the numbers) and its one-line summary;
//! - [`residency`]: `madvise` for the mapped dense weights;
//! - [`sim`]: replay of routing traces to compare policies and sizes.
//!
//! Nothing here knows a model: keys are numbers, bytes are bytes.

pub mod cache;
pub mod error;
pub mod file;
pub mod plan;
pub mod policy;
pub mod residency;
pub mod sim;

pub use cache::{CacheConfig, CacheStats, ExpertCache, ExpertKey, ExpertLoader, SlotRef};
pub use error::CacheError;
pub use file::{ExpertLayout, ExpertPart, FileLoader, LayerExperts};
pub use plan::{parse_size, plan, ExpertResidency, Plan, PlanError, PlanInput};
pub use policy::PolicyKind;
