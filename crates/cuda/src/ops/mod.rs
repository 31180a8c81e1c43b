//! Launch wrappers of the decode kernels other than the GEMVs: RMSNorm,
//! the attention input (norm + RoPE + KV append), split-K grouped decode
//! attention and its merge, the fused Gated DeltaNet step, the router
//! top-k and the element-wise helpers; and the prefill's chunk kernels
//! and its routed tile list built on the device. Each checks the sizes it
//! can see and passes raw device pointers (the kernels take plain
//! pointers; buffers live on the one stream of [`Gpu`], so no
//! cross-stream ordering is needed, see `device.rs`).
//!
//! The float64 references of every kernel are in [`crate::reference`].//!
//! One module per kernel file (`kernels/<name>.cu`); the GEMVs are in
//! [`crate::gemv`], the expert cache's kernels in [`crate::expert_cache`].

mod attention;
mod attn_chunk;
mod attn_prep;
mod chunk;
mod deltanet;
mod elementwise;
mod gdn_wy;
mod norm;
mod route;
mod router;

pub use attention::{
    attention, default_nsplit, f16_round, mma_smem_bytes, split_kernel, AttnDims, AttnMergeArgs,
    AttnScratch, AttnSplitArgs, KvCache, KvType,
};
pub use attn_chunk::{
    attn_chunk, flash_part_floats, flash_smem_bytes, flash_splits, AttnChunkArgs, AttnKernel,
    FLASH_MAX_SPLIT, FLASH_ROWS,
};
pub use attn_prep::{attn_prep, AttnPrepArgs};
pub use chunk::{
    add_bias_rows, attn_prep_chunk, gdn_chunk, gdn_chunk_split, moe_combine_chunk,
    router_topk_chunk, to_f16_rows, GdnChunkScratch, GdnForm, GdnRecurArgs, MoeCombineChunkArgs,
    Rows, SharedRows,
};
pub use deltanet::{gdn_step, GdnDims, GdnWeights, GDN_THREADS};
pub use elementwise::{add_inplace, moe_combine, swiglu, MoeCombineNormArgs, NextNorm};
pub use gdn_wy::{wy_scratch_floats, wy_state_kernel, wy_state_smem_bytes, GdnWyArgs, GDN_SUB};
pub use norm::{rms_norm, v8_block, RmsNormArgs};
pub use route::{
    max_route_tiles, route_tiles_device, route_warps, DeviceRoutes, ROUTE_MAX_EXPERT,
    ROUTE_MAX_TOKENS,
};
pub use router::{
    router_gemv_topk, router_gemv_topk_fits, router_in_norm_fits, router_topk, InNorm, Route,
    RouterGemvArgs, ROUTER_MAX_N,
};

use crate::device::{dptr, Gpu};
use crate::gemv::Q8Vec;

/// Raw pointers of an int8 activation buffer (null, null for `None`).
fn q8ptrs(gpu: &Gpu, q8: Option<&Q8Vec>) -> (u64, u64) {
    (dptr(gpu, q8.map(|q| &q.q)), dptr(gpu, q8.map(|q| &q.d)))
}
