//! The default context: the model's trained context as far as the memory
//! plan allows, else the largest multiple of 1024 positions that fits.
//!
//! "Fits" means the plan for that context succeeds *and* keeps the experts
//! where the smallest context would put them: the KV state does not push
//! a model whose experts stay mapped into an expert cache, and takes at
//! most [`MAX_CACHE_LOSS_PERCENT`] of a cache's slots (decode speed of a
//! cached model follows its hit rate, which a long default context should
//! not quietly cut). A context the user gives is planned as asked.

use redlite_model::expertcache::plan::human;
use redlite_model::expertcache::{ExpertResidency, Plan};
use redlite_model::{MemoryRequest, Model, ModelError};

/// Positions the fallback is rounded down to.
pub const CONTEXT_STEP: usize = 1024;

/// Share of the smallest context's expert-cache slots a default context may
/// take.
pub const MAX_CACHE_LOSS_PERCENT: u64 = 10;

/// The context chosen and the start-up line that says why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContextChoice {
    pub ctx: usize,
    pub line: String,
}

/// Choose the default context for `model` under `mem` (its `ctx` is
/// ignored). An error when not even the smallest context fits: the plan's
/// own refusal, with its numbers.
pub fn default_context(model: &Model, mem: &MemoryRequest) -> Result<ContextChoice, ModelError> {
    let (per_position, _) = model.state_bytes();
    choose(
        model.arch().context_length(),
        per_position,
        mem.sessions.max(1),
        |ctx| model.preview_plan(&MemoryRequest { ctx, ..*mem }),
    )
}

/// [`default_context`] over any planner (`plan_at(ctx)`), for tests.
pub fn choose<E>(
    trained: usize,
    kv_per_position: u64,
    sessions: usize,
    plan_at: impl Fn(usize) -> Result<Plan, E>,
) -> Result<ContextChoice, E> {
    let trained = trained.max(1);
    let smallest = trained.min(CONTEXT_STEP);
    let base = plan_at(smallest)?;
    let fits = |ctx: usize| plan_at(ctx).ok().filter(|p| keeps_experts(&base, p));
    let kv = |ctx: usize| human(kv_per_position.saturating_mul(ctx as u64));
    let sessions_note = if sessions > 1 {
        format!(" per session, {sessions} sessions with the prompt cache")
    } else {
        String::new()
    };
    if fits(trained).is_some() {
        return Ok(ContextChoice {
            ctx: trained,
            line: format!(
                "context: {trained} positions (the model's trained context; KV {} f32{sessions_note})",
                kv(trained)
            ),
        });
    }
    // The plan is monotone in the context: bisect over whole steps.
    let (mut lo, mut hi) = (1usize, trained / CONTEXT_STEP);
    let mut best = None;
    while lo <= hi {
        let mid = lo + (hi - lo) / 2;
        match fits(mid * CONTEXT_STEP) {
            Some(p) => {
                best = Some((mid * CONTEXT_STEP, p));
                lo = mid + 1;
            }
            None => hi = mid - 1,
        }
    }
    let (ctx, plan) = best.unwrap_or((smallest, base));
    let budget = match (plan.budget, plan.input.memory) {
        (Some(b), Some(m)) if m == b => format!("--memory {}", human(b)),
        (Some(b), _) => format!("the {} of memory available", human(b)),
        (None, _) => "the memory plan".to_string(),
    };
    let weights = match plan.experts {
        ExpertResidency::Mapped => plan.input.dense_bytes + plan.input.expert_bytes,
        ExpertResidency::Cached { slots } => plan.input.dense_bytes + slots * plan.input.slot_bytes,
    };
    Ok(ContextChoice {
        ctx,
        line: format!(
            "context: {ctx} positions (trained {trained}; limited by {budget}: weights {} + KV {} f32{sessions_note}; give -c to choose)",
            human(weights),
            kv(ctx),
        ),
    })
}

/// Whether `p` keeps the experts where `base` (the smallest context) has
/// them.
fn keeps_experts(base: &Plan, p: &Plan) -> bool {
    match (base.experts, p.experts) {
        (ExpertResidency::Mapped, ExpertResidency::Mapped) => true,
        (ExpertResidency::Mapped, ExpertResidency::Cached { .. }) => false,
        (ExpertResidency::Cached { slots: b }, ExpertResidency::Cached { slots }) => {
            slots.saturating_mul(100) >= b.saturating_mul(100 - MAX_CACHE_LOSS_PERCENT)
        }
        (ExpertResidency::Cached { .. }, ExpertResidency::Mapped) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redlite_model::expertcache::plan::{plan, PlanError, PlanInput, DEFAULT_RESERVE};

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;

    /// Qwen2.5-0.5B's shape: 24 layers × 2 KV heads × 64 dims × K and V ×
    /// f32 = 24576 bytes per position (its GGUF: qwen2.block_count 24,
    /// attention.head_count_kv 2, embedding 896 / 14 heads), 32768 trained.
    const QWEN2_KV: u64 = 24 * 2 * 64 * 2 * 4;

    fn dense(
        memory: Option<u64>,
        available: Option<u64>,
    ) -> impl Fn(usize) -> Result<Plan, PlanError> {
        move |ctx| {
            plan(PlanInput {
                dense_bytes: 491 * MIB,
                expert_bytes: 0,
                n_experts: 0,
                slot_bytes: 0,
                n_used: 0,
                state_bytes: QWEN2_KV * ctx as u64,
                ctx: ctx as u64,
                available,
                memory,
                expert_cache: None,
                reserve: DEFAULT_RESERVE,
            })
        }
    }

    #[test]
    fn the_trained_context_when_it_fits() {
        let c = choose(32768, QWEN2_KV, 1, dense(None, Some(16 * GIB))).unwrap();
        assert_eq!(c.ctx, 32768);
        // 24576 × 32768 = 768 MiB.
        assert_eq!(
            c.line,
            "context: 32768 positions (the model's trained context; KV 768.00 MiB f32)"
        );
    }

    #[test]
    fn a_budget_lowers_it_to_a_multiple_of_1024_that_fits() {
        // 2 GiB − 491 MiB weights − 512 MiB reserve = 1045 MiB for the
        // state: 1045 MiB / 24 KiB = 44586 positions, 44032 in whole steps
        // (the trained 65536 does not fit).
        let c = choose(65536, QWEN2_KV, 1, dense(Some(2 * GIB), None)).unwrap();
        let room = 2 * GIB - 491 * MIB - DEFAULT_RESERVE;
        let want = (room / QWEN2_KV) as usize / 1024 * 1024;
        assert_eq!(c.ctx, want);
        assert_eq!(c.ctx, 44032);
        assert!(c.line.starts_with("context: 44032 positions (trained 65536; limited by --memory 2.00 GiB: weights 491.00 MiB + KV 1.01 GiB f32"), "{}", c.line);
        // One more step would not fit; this one does.
        assert!(dense(Some(2 * GIB), None)(want + 1024).is_err());
        assert!(dense(Some(2 * GIB), None)(want).is_ok());
    }

    #[test]
    fn sessions_are_named_and_nothing_fitting_is_the_plans_error() {
        let c = choose(4096, QWEN2_KV, 5, dense(None, None)).unwrap();
        assert!(c.line.contains("5 sessions"), "{}", c.line);
        // 600 MiB cannot hold the weights and the reserve.
        let e = choose(4096, QWEN2_KV, 1, dense(Some(600 * MIB), None)).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
        // A trained context below one step is kept whole.
        assert_eq!(
            choose(300, QWEN2_KV, 1, dense(None, None)).unwrap().ctx,
            300
        );
    }

    #[test]
    fn a_context_does_not_push_mapped_experts_into_a_cache() {
        // An MoE file whose experts fit mapped with a short context: 1 GiB
        // dense + 4 GiB experts in an 8 GiB budget (85% usable: 6.8 GiB).
        let moe = |ctx: usize| {
            plan(PlanInput {
                dense_bytes: GIB,
                expert_bytes: 4 * GIB,
                n_experts: 4096,
                slot_bytes: MIB,
                n_used: 8,
                state_bytes: 48 * 1024 * ctx as u64,
                ctx: ctx as u64,
                available: None,
                memory: Some(8 * GIB),
                expert_cache: None,
                reserve: DEFAULT_RESERVE,
            })
        };
        let c = choose(262144, 48 * 1024, 1, moe).unwrap();
        let p = moe(c.ctx).unwrap();
        assert_eq!(p.experts, ExpertResidency::Mapped);
        assert_ne!(moe(c.ctx + 1024).unwrap().experts, ExpertResidency::Mapped);
        assert!(c.ctx < 262144 && c.ctx % 1024 == 0);
    }
}
