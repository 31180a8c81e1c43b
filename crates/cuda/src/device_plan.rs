//! The device memory plan: what goes on the GPU, how many expert slots
//! each MoE layer keeps, and where misses come from. Pure (no device): the
//! caller measures free device memory and available RAM; the numbers in,
//! the decision and its one start-up line out, or a refusal with the
//! numbers before anything is uploaded.

use crate::decoder::ExpertCacheOptions;
use crate::error::{CudaError, Result};
use redlite_model::expertcache::plan::{human, DEFAULT_RESERVE};
use redlite_model::expertcache::{plan, ExpertResidency, Plan, PlanInput};

/// Where the misses of a bounded device cache are copied from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertSource {
    /// Pinned when the experts fit in the available RAM (+ 1 GiB), else
    /// the file.
    Auto,
    Pinned,
    File,
}

/// What the plan is made from.
#[derive(Clone, Debug)]
pub struct DevicePlanInput {
    /// Weights that go on the device besides the routed experts (the token
    /// embedding stays on the host and is not counted).
    pub dense_bytes: u64,
    /// All routed experts.
    pub expert_bytes: u64,
    /// MoE layers and experts per layer.
    pub moe_layers: u64,
    pub experts_per_layer: u64,
    /// Bytes of the largest expert (gate + up + down).
    pub slot_bytes: u64,
    /// Experts a token uses per layer.
    pub k: u64,
    /// K and V values per position over all attention layers, and the
    /// bytes of one in the decoder's cache (`KvType::bytes`: 2 for f16, 4
    /// for f32); the fixed DeltaNet state. The state for `ctx` positions is
    /// [`DevicePlanInput::state_bytes`].
    pub kv_values_per_pos: u64,
    pub kv_value_bytes: u64,
    pub recurrent_bytes: u64,
    pub ctx: u64,
    /// Free and total device memory.
    pub device_free: u64,
    pub device_total: u64,
    /// `--memory`, `--expert-cache`.
    pub memory: Option<u64>,
    pub expert_cache: Option<u64>,
    /// RAM available to this process (MemAvailable, cgroup limit).
    pub host_available: Option<u64>,
    pub source: ExpertSource,
    /// Pre-gating wanted (it needs pinned experts).
    pub pregate: bool,
    /// Prompt tokens a batched-prefill chunk asks for (`--ubatch`; 0:
    /// prompts token by token), and an estimate of the chunk scratch's
    /// device bytes per token ([`crate::prefill_experts::scratch_per_token`]).
    /// Under a bounded cache both the scratch and the prefill's staging
    /// images are counted against the budget.
    pub prefill_chunk: u64,
    pub prefill_bytes_per_token: u64,
}

impl DevicePlanInput {
    /// KV cache and DeltaNet state for `ctx` positions, at the cache's
    /// element size.
    pub fn state_bytes(&self) -> u64 {
        self.kv_values_per_pos * self.kv_value_bytes * self.ctx + self.recurrent_bytes
    }
}

/// RAM kept free beside the pinned experts.
const HOST_MARGIN: u64 = 1 << 30;

fn invalid(m: String) -> CudaError {
    CudaError::Invalid(format!("device memory plan: {m}"))
}

/// The shared plan with `extra` device bytes beside the dense weights.
fn run_plan(i: &DevicePlanInput, extra: u64) -> Result<Plan> {
    plan(PlanInput {
        dense_bytes: i.dense_bytes + extra,
        expert_bytes: i.expert_bytes,
        n_experts: i.moe_layers * i.experts_per_layer,
        slot_bytes: i.slot_bytes,
        // Every layer's pool must hold a token's experts.
        n_used: i.k * i.moe_layers,
        state_bytes: i.state_bytes(),
        ctx: i.ctx,
        available: Some(i.device_free),
        memory: i.memory,
        expert_cache: i.expert_cache,
        reserve: DEFAULT_RESERVE,
    })
    .map_err(|e| invalid(e.to_string()))
}

/// The batched prefill's share of a bounded cache's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PrefillShare {
    chunk: u64,
    staging: u64,
    scratch: u64,
    /// Slots per layer left beside it.
    per_layer: u64,
}

/// Padding a device slot may add to each of an expert's three
/// projections (slots are 256-byte aligned).
const SLOT_PAD: u64 = 3 * 256;

/// The largest chunk (halving from `prefill_chunk`, at least
/// `MIN_BATCHED_PREFILL` tokens) whose scratch and staging images fit
/// beside at least a token's slots per layer, and the slots left. Two
/// passes: the staging holds `experts - slots` entries, so the slots of
/// the first pass (staging for zero slots) make the second pass's staging
/// smaller, and its slots (at least as many) still fit.
fn prefill_share(i: &DevicePlanInput, p0: &Plan, per_layer0: u64) -> Result<Option<PrefillShare>> {
    if i.prefill_chunk == 0 || i.moe_layers == 0 || p0.budget.is_none() {
        return Ok(None);
    }
    let slot = i.slot_bytes + SLOT_PAD;
    let e = i.experts_per_layer;
    let slots_of = |p: &Plan| match p.experts {
        ExpertResidency::Cached { slots } => {
            Some((slots / i.moe_layers).max(i.k).min(e.saturating_sub(1)))
        }
        _ => None,
    };
    let mut chunk = i.prefill_chunk;
    let min = crate::sequence::MIN_BATCHED_PREFILL as u64;
    while chunk >= min {
        let scratch = chunk * i.prefill_bytes_per_token;
        let first = run_plan(i, 2 * e * slot + scratch).ok();
        if let Some(s1) = first.as_ref().and_then(slots_of) {
            let staging = 2 * (e - s1) * slot;
            let s2 = run_plan(i, staging + scratch)
                .ok()
                .as_ref()
                .and_then(slots_of)
                .unwrap_or(s1)
                .min(per_layer0);
            return Ok(Some(PrefillShare {
                chunk,
                staging: 2 * (e - s2) * slot,
                scratch,
                per_layer: s2,
            }));
        }
        chunk /= 2;
    }
    Ok(None)
}

/// Prompt tokens a batched-prefill chunk takes at full expert residency
/// unless `--ubatch` says: on the iq2 80B file pp8192 ran at 9,077 tok/s
/// in chunks of 4096 against 8,227 in chunks of 2048, pp2048 the same
/// (history 27), for 1.2 GiB of scratch instead of 0.6.
pub const RESIDENT_UBATCH: u64 = 4096;

/// The same under a bounded expert cache (and the smallest default at
/// full residency): a larger chunk's scratch would come out of the decode
/// cache's slots; the seeds' engine took 2048 under full residency and
/// 512 under a bounded cache, and the plan halves it further there when
/// the staging images and scratch do not fit ([`plan_device`]).
pub const BOUNDED_UBATCH: u64 = 2048;

/// The chunk at full residency (the plan gave no cache): `given`
/// (`--ubatch`) when set; else [`RESIDENT_UBATCH`], halved while its
/// scratch (`prefill_bytes_per_token` a token) would no longer leave every
/// expert resident, down to [`BOUNDED_UBATCH`]; never more than the
/// context.
pub fn resident_chunk(i: &DevicePlanInput, given: Option<u64>) -> u64 {
    if let Some(c) = given {
        return c.min(i.ctx);
    }
    let mut chunk = RESIDENT_UBATCH;
    while chunk > BOUNDED_UBATCH {
        let scratch = chunk.saturating_mul(i.prefill_bytes_per_token);
        if matches!(
            run_plan(i, scratch).map(|p| p.experts),
            Ok(ExpertResidency::Mapped)
        ) {
            break;
        }
        chunk /= 2;
    }
    chunk.min(i.ctx)
}

/// Decide. `Ok((None, line))`: every expert resident on the device.
pub fn plan_device(i: &DevicePlanInput) -> Result<(Option<ExpertCacheOptions>, String)> {
    let p = run_plan(i, 0)?;
    let budget = match (p.budget, i.memory) {
        (Some(b), Some(m)) if m == b => format!("{} (--memory)", human(b)),
        (Some(b), _) => format!(
            "{} (free on the device of {})",
            human(b),
            human(i.device_total)
        ),
        (None, _) => "unlimited".into(),
    };
    let head = format!(
        "memory plan (cuda): budget {budget} | on the device: dense {} + state {} ({} KV) for {} positions + reserve {}",
        human(i.dense_bytes),
        human(i.state_bytes()),
        if i.kv_value_bytes == 2 { "f16" } else { "f32" },
        i.ctx,
        human(DEFAULT_RESERVE)
    );
    let resident = || {
        let line = format!("{head} + every expert ({}) resident", human(i.expert_bytes));
        Ok((None, line))
    };
    let slots = match p.experts {
        ExpertResidency::Cached { slots } if i.moe_layers > 0 => slots,
        _ => return resident(),
    };
    let per_layer = (slots / i.moe_layers).max(i.k).min(i.experts_per_layer);
    if per_layer >= i.experts_per_layer {
        // An --expert-cache as large as every expert: no cache needed.
        return resident();
    }
    let pinned_fits = i
        .host_available
        .is_none_or(|a| i.expert_bytes + HOST_MARGIN <= a);
    let from_file = match i.source {
        ExpertSource::File => true,
        ExpertSource::Pinned if !pinned_fits => {
            return Err(invalid(format!(
                "--expert-source pinned needs {} + {} of RAM for the experts, but {} is available (use --expert-source file)",
                human(i.expert_bytes),
                human(HOST_MARGIN),
                human(i.host_available.unwrap_or(0))
            )))
        }
        ExpertSource::Pinned => false,
        ExpertSource::Auto => !pinned_fits,
    };
    // The batched prefill under the cache: two staging images of every
    // expert a layer can miss, and the chunk's scratch, set aside before
    // the slots; the chunk halves until they fit beside the slots a token
    // needs (none fitting: prompts token by token).
    let prefill = (!from_file)
        .then(|| prefill_share(i, &p, per_layer))
        .transpose()?
        .flatten();
    let per_layer = prefill.map_or(per_layer, |f| f.per_layer);
    let mut c = ExpertCacheOptions::new(per_layer as usize);
    c.from_file = from_file;
    c.pregate = !from_file && i.pregate;
    c.prefill_bytes = prefill.map_or(0, |f| f.staging + f.scratch);
    let source = if from_file {
        format!(
            "misses read from the file by the host ({} of RAM available; graph cut after each MoE layer's plan)",
            i.host_available.map_or("unknown".into(), human)
        )
    } else {
        format!(
            "every expert in pinned host memory ({}), misses copied over PCIe",
            human(i.expert_bytes)
        )
    };
    let prefill_line = match prefill {
        Some(f) => format!(
            " | batched prefill: staging {} (2 x {} experts) + scratch {} ({} tokens a chunk)",
            human(f.staging),
            i.experts_per_layer - per_layer,
            human(f.scratch),
            f.chunk
        ),
        None if i.prefill_chunk > 0 => " | prompts token by token under the cache".to_string(),
        None => String::new(),
    };
    let line = format!(
        "{head} + expert cache {}: {per_layer} of {} slots per MoE layer x {} layers ({:.1}% of the experts), LRU, pre-gating {} | {source}{prefill_line}",
        human(per_layer * i.moe_layers * i.slot_bytes),
        i.experts_per_layer,
        i.moe_layers,
        100.0 * per_layer as f64 / i.experts_per_layer as f64,
        if c.pregate { "on" } else { "off" },
    );
    Ok((Some(c), line))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// 4 MoE layers x 16 experts of 64 MiB (4 GiB of experts), k = 4,
    /// dense 1 GiB, state 512 MiB (32768 f32 K and V values per position x
    /// 4096 positions); with the 512 MiB reserve the fixed part is 2 GiB.
    fn input() -> DevicePlanInput {
        DevicePlanInput {
            dense_bytes: GIB,
            expert_bytes: 4 * GIB,
            moe_layers: 4,
            experts_per_layer: 16,
            slot_bytes: 64 * MIB,
            k: 4,
            kv_values_per_pos: 32768,
            kv_value_bytes: 4,
            recurrent_bytes: 0,
            ctx: 4096,
            device_free: 80 * GIB,
            device_total: 80 * GIB,
            memory: None,
            expert_cache: None,
            host_available: Some(64 * GIB),
            source: ExpertSource::Auto,
            pregate: true,
            prefill_chunk: 0,
            prefill_bytes_per_token: 0,
        }
    }

    /// 4096-token chunks where their scratch leaves the experts resident,
    /// 2048 where only that fits, `--ubatch` as given, the context caps.
    #[test]
    fn the_resident_chunk_is_the_larger_one_where_it_fits() {
        let mut i = input();
        i.prefill_bytes_per_token = MIB;
        assert_eq!(resident_chunk(&i, None), RESIDENT_UBATCH);
        // 80 GiB free: dense 1 + state 0.5 + reserve 0.5 + experts 4 = 6
        // GiB; leave 4 GiB + 3 GiB for a chunk: 2048 MiB of scratch fits,
        // 4096 MiB does not.
        i.device_free = 9 * GIB;
        assert_eq!(resident_chunk(&i, None), BOUNDED_UBATCH);
        assert_eq!(resident_chunk(&i, Some(512)), 512);
        assert_eq!(resident_chunk(&i, Some(8192)), 4096, "capped at ctx");
        i.ctx = 1000;
        assert_eq!(resident_chunk(&i, None), 1000);
    }

    #[test]
    fn everything_fits() {
        let (c, line) = plan_device(&input()).unwrap();
        assert!(c.is_none());
        assert!(line.contains("every expert (4.00 GiB) resident"), "{line}");
    }

    #[test]
    fn budget_gives_slots_per_layer() {
        // 4 GiB - 2 GiB fixed = 2 GiB = 32 slots of 64 MiB = 8 per layer.
        let mut i = input();
        i.memory = Some(4 * GIB);
        let (c, line) = plan_device(&i).unwrap();
        let c = c.unwrap();
        assert_eq!(
            (c.slots_per_layer, c.pregate, c.from_file),
            (8, true, false)
        );
        assert!(
            line.contains("8 of 16 slots per MoE layer x 4 layers (50.0% of the experts)"),
            "{line}"
        );
        assert!(line.contains("budget 4.00 GiB (--memory)"), "{line}");
        // --expert-cache 1 GiB: 16 slots = 4 per layer, the minimum.
        i.expert_cache = Some(GIB);
        assert_eq!(plan_device(&i).unwrap().0.unwrap().slots_per_layer, 4);
    }

    #[test]
    fn f16_kv_halves_the_state() {
        // 32768 values x 2 bytes x 4096 positions = 256 MiB, + 8 MiB of
        // DeltaNet state: fixed 1 GiB + 264 MiB + 512 MiB; a 4 GiB budget
        // leaves 2 GiB + 248 MiB = 35 slots of 64 MiB (56 MiB left over):
        // 8 per layer (35 / 4).
        let mut i = input();
        assert_eq!(i.state_bytes(), 512 * MIB);
        i.kv_value_bytes = 2;
        i.recurrent_bytes = 8 * MIB;
        assert_eq!(i.state_bytes(), 264 * MIB);
        i.memory = Some(4 * GIB);
        let (c, line) = plan_device(&i).unwrap();
        assert_eq!(c.unwrap().slots_per_layer, 8);
        assert!(
            line.contains("state 264.00 MiB (f16 KV) for 4096 positions"),
            "{line}"
        );
        // Without the DeltaNet state: 2 GiB + 256 MiB = 36 slots, 9 a layer
        // (f32: 8, budget_gives_slots_per_layer).
        i.recurrent_bytes = 0;
        assert_eq!(plan_device(&i).unwrap().0.unwrap().slots_per_layer, 9);
    }

    #[test]
    fn the_prefill_staging_and_scratch_come_out_of_the_slots() {
        // 8 GiB, 32 experts of 64 MiB a layer: 6 GiB for experts beside
        // the 2 GiB fixed. A chunk of 512 tokens at 1 MiB each takes 512
        // MiB; the first pass stages all 32 experts twice, the second
        // 32 - (its slots) twice, giving slots back; all of it fits.
        let mut i = input();
        i.experts_per_layer = 32;
        i.expert_bytes = 8 * GIB;
        i.memory = Some(8 * GIB);
        i.prefill_chunk = 512;
        i.prefill_bytes_per_token = MIB;
        let (c, line) = plan_device(&i).unwrap();
        let c = c.unwrap();
        let slot = 64 * MIB + SLOT_PAD;
        let per = c.slots_per_layer as u64;
        let fixed = 2 * GIB;
        let staging = 2 * (32 - per) * slot;
        assert!(
            fixed + 512 * MIB + staging + 4 * per * 64 * MIB <= 8 * GIB,
            "{line}"
        );
        assert_eq!(c.prefill_bytes, staging + 512 * MIB, "{line}");
        // First pass: 6 GiB - 512 MiB - 2 x 32 x 64.75 MiB = 1.45 GiB, 5
        // slots a layer; the second stages 2 x 27 and leaves more.
        assert!(per > 5, "the second pass gave slots back: {per}");
        assert!(line.contains("batched prefill: staging"), "{line}");
        assert!(line.contains("512 tokens a chunk"), "{line}");
        // A chunk too large for the budget halves until it fits.
        i.prefill_chunk = 4096;
        let (c, line) = plan_device(&i).unwrap();
        assert!(c.unwrap().prefill_bytes > 0);
        assert!(!line.contains("4096 tokens a chunk"), "{line}");
        // No room at all: token by token, the slots as without a prefill.
        i.prefill_bytes_per_token = 8 * GIB;
        let (c, line) = plan_device(&i).unwrap();
        assert_eq!(c.unwrap().prefill_bytes, 0);
        assert!(line.contains("prompts token by token"), "{line}");
        // Misses from the file: no batched prefill under the cache.
        i.prefill_bytes_per_token = MIB;
        i.source = ExpertSource::File;
        assert_eq!(plan_device(&i).unwrap().0.unwrap().prefill_bytes, 0);
    }

    #[test]
    fn a_cache_of_every_expert_is_full_residency() {
        let mut i = input();
        i.expert_cache = Some(8 * GIB);
        let (c, line) = plan_device(&i).unwrap();
        assert!(c.is_none() && line.contains("resident"), "{line}");
    }

    #[test]
    fn too_small_is_refused_with_the_numbers() {
        // 2 GiB + 100 MiB leaves one slot; a token needs 4 per layer (16).
        let mut i = input();
        i.memory = Some(2 * GIB + 100 * MIB);
        let e = plan_device(&i).unwrap_err().to_string();
        assert!(
            e.contains("does not fit") && e.contains("16 slots of 64.00 MiB"),
            "{e}"
        );
    }

    #[test]
    fn short_ram_reads_misses_from_the_file() {
        let mut i = input();
        i.memory = Some(4 * GIB);
        i.host_available = Some(4 * GIB); // < 4 GiB of experts + 1 GiB
        let (c, line) = plan_device(&i).unwrap();
        let c = c.unwrap();
        assert!(c.from_file && !c.pregate);
        assert!(line.contains("misses read from the file"), "{line}");
        i.source = ExpertSource::Pinned;
        let e = plan_device(&i).unwrap_err().to_string();
        assert!(e.contains("--expert-source pinned needs 4.00 GiB"), "{e}");
        i.source = ExpertSource::File;
        i.host_available = Some(64 * GIB);
        assert!(plan_device(&i).unwrap().0.unwrap().from_file);
    }
}
