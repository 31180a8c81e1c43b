//! The memory planner: from the file's dense and expert bytes, the session
//! state, the memory this process may use and the user's budgets, decide
//! what is resident and how many expert slots to keep; refuse, with the
//! numbers, what cannot run.
//!
//! Rules, in order:
//! 1. The budget is the smaller of `--memory` and the available memory
//!    (MemAvailable and the cgroup limit); with neither known, unlimited.
//! 2. Dense weights (everything but routed experts), the session state and
//!    a reserve for activations and I/O buffers are always resident.
//! 3. `--expert-cache SIZE` asks for a cache of that many bytes (rounded
//!    down to whole slots, at most every expert); it must hold at least one
//!    token's experts of a layer (`n_used` slots) and fit the budget.
//! 4. Otherwise, when everything fits the budget, experts stay in the
//!    memory-mapped file (full residency through the page cache); else the
//!    cache gets every slot the budget leaves, and at least `n_used`.
//!    When the budget is the available memory (no `--memory` below it),
//!    [`HEADROOM_PERCENT`] of it is kept free for these two decisions:
//!    MemAvailable counts reclaimable page cache, the model file's own
//!    pages included, so a file that "fits" with a thin margin is evicted
//!    by the machine's other work and re-read every token (measured on a
//!    shared 23 GiB machine: the 20 GiB file mapped decoded at 1.1–1.4
//!    tok/s, 24.7 GiB read in 64 tokens; with a 16 GiB budget 2.1–2.5).
//!    A configuration is refused only when it does not fit the whole budget.

use std::fmt;

/// Bytes kept free for activations, scratch and in-flight reads.
pub const DEFAULT_RESERVE: u64 = 512 << 20;

/// Share of the available memory left free when the budget is not given by
/// `--memory` (rule 4 of the module documentation).
pub const HEADROOM_PERCENT: u64 = 15;

/// What the planner knows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanInput {
    /// Every tensor byte that is not a routed expert.
    pub dense_bytes: u64,
    /// All routed experts' bytes.
    pub expert_bytes: u64,
    /// (layer, expert) pairs.
    pub n_experts: u64,
    /// Bytes of one cache slot (the largest expert).
    pub slot_bytes: u64,
    /// Experts a token uses per layer.
    pub n_used: u64,
    /// KV cache and recurrent state for the context.
    pub state_bytes: u64,
    /// Context positions the state is sized for (for the summary).
    pub ctx: u64,
    /// MemAvailable / cgroup limit, when known.
    pub available: Option<u64>,
    /// `--memory`.
    pub memory: Option<u64>,
    /// `--expert-cache`.
    pub expert_cache: Option<u64>,
    pub reserve: u64,
}

/// Where the routed experts live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertResidency {
    /// In the memory-mapped file (all of them fit).
    Mapped,
    /// In a cache of this many slots; misses are read from the file.
    Cached { slots: u64 },
}

/// The decision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub input: PlanInput,
    pub budget: Option<u64>,
    pub experts: ExpertResidency,
}

/// A configuration that cannot run, with its numbers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "a context of {ctx} positions × {sessions} session(s) needs more state than 2^64 bytes: give a smaller context size"
    )]
    StateOverflow { ctx: u64, sessions: u64 },
    #[error(
        "dense weights ({dense} bytes) + state ({state} bytes for a context of {ctx} positions) + experts exceed 2^64 bytes: give a smaller context size"
    )]
    Overflow { dense: u64, state: u64, ctx: u64 },
    #[error(
        "does not fit: dense weights {dense} + state {state} ({ctx} positions) + reserve {reserve} + the smallest expert cache {min_cache} ({n_used} slots of {slot}) = {need}, but the budget is {budget}{hint}",
        dense = human(*dense), state = human(*state), reserve = human(*reserve),
        min_cache = human(*min_cache), slot = human(*slot), need = human(*need), budget = human(*budget)
    )]
    TooSmall {
        dense: u64,
        state: u64,
        ctx: u64,
        reserve: u64,
        min_cache: u64,
        n_used: u64,
        slot: u64,
        need: u64,
        budget: u64,
        hint: String,
    },
    #[error(
        "does not fit: weights {dense} + state {state} ({ctx} positions) + reserve {reserve} = {need}, but the budget is {budget}{hint}",
        dense = human(*dense), state = human(*state), reserve = human(*reserve),
        need = human(*need), budget = human(*budget)
    )]
    DenseTooLarge {
        dense: u64,
        state: u64,
        ctx: u64,
        reserve: u64,
        need: u64,
        budget: u64,
        hint: String,
    },
    #[error(
        "--expert-cache {asked} holds {slots} slots of {slot}, fewer than the {n_used} experts a token uses per layer: give at least {min}",
        asked = human(*asked), slot = human(*slot), min = human(*n_used * *slot)
    )]
    CacheBelowMinimum {
        asked: u64,
        slots: u64,
        slot: u64,
        n_used: u64,
    },
    #[error(
        "--expert-cache {cache} does not fit: dense weights {dense} + state {state} + reserve {reserve} + cache {cache} = {need}, but the budget is {budget}",
        cache = human(*cache), dense = human(*dense), state = human(*state),
        reserve = human(*reserve), need = human(*need), budget = human(*budget)
    )]
    CacheOverBudget {
        cache: u64,
        dense: u64,
        state: u64,
        reserve: u64,
        need: u64,
        budget: u64,
    },
}

/// Decide. See the module documentation for the rules.
pub fn plan(input: PlanInput) -> Result<Plan, PlanError> {
    let budget = match (input.memory, input.available) {
        (Some(m), Some(a)) => Some(m.min(a)),
        (m, a) => m.or(a),
    };
    // Every sum below is at most `fixed` plus every expert (or the cache,
    // at most every expert's slot): check those once, and the arithmetic
    // after cannot wrap.
    let overflow = || PlanError::Overflow {
        dense: input.dense_bytes,
        state: input.state_bytes,
        ctx: input.ctx,
    };
    let fixed = input
        .dense_bytes
        .checked_add(input.state_bytes)
        .and_then(|b| b.checked_add(input.reserve))
        .ok_or_else(overflow)?;
    let all_slots = input.n_experts.checked_mul(input.slot_bytes.max(1));
    let most = all_slots
        .zip(fixed.checked_add(input.expert_bytes))
        .and_then(|(a, b)| b.checked_add(a));
    if most.is_none() {
        return Err(overflow());
    }
    // The budget the residency decision uses: the available memory less the
    // headroom, unless --memory set a budget at or below it.
    let from_available = input
        .memory
        .is_none_or(|m| input.available.is_some_and(|a| a < m));
    let usable = budget.map(|b| {
        if from_available {
            b - b / 100 * HEADROOM_PERCENT
        } else {
            b
        }
    });
    let hint = |b: u64| {
        if input.memory.is_some_and(|m| m > b) {
            format!(" (--memory asks for more than the {} available)", human(b))
        } else {
            String::new()
        }
    };
    if input.n_experts == 0 {
        // No routed experts: everything is dense and must fit.
        return match budget {
            Some(b) if fixed > b => Err(PlanError::DenseTooLarge {
                dense: input.dense_bytes,
                state: input.state_bytes,
                ctx: input.ctx,
                reserve: input.reserve,
                need: fixed,
                budget: b,
                hint: hint(b),
            }),
            _ => Ok(Plan {
                input,
                budget,
                experts: ExpertResidency::Mapped,
            }),
        };
    }
    let slot = input.slot_bytes.max(1);
    let n_used = input.n_used.max(1).min(input.n_experts.max(1));
    let experts = if let Some(asked) = input.expert_cache {
        let slots = (asked / slot).min(input.n_experts);
        if slots < n_used {
            return Err(PlanError::CacheBelowMinimum {
                asked,
                slots,
                slot,
                n_used,
            });
        }
        let cache = slots * slot;
        if let Some(b) = budget {
            if fixed + cache > b {
                return Err(PlanError::CacheOverBudget {
                    cache,
                    dense: input.dense_bytes,
                    state: input.state_bytes,
                    reserve: input.reserve,
                    need: fixed + cache,
                    budget: b,
                });
            }
        }
        ExpertResidency::Cached { slots }
    } else {
        match (budget, usable) {
            (None, _) | (_, None) => ExpertResidency::Mapped,
            (Some(_), Some(u)) if fixed + input.expert_bytes <= u => ExpertResidency::Mapped,
            (Some(b), Some(u)) => {
                let mut slots = (u.saturating_sub(fixed) / slot).min(input.n_experts);
                if slots < n_used {
                    // The headroom is a preference: use the whole budget
                    // before refusing.
                    slots = (b.saturating_sub(fixed) / slot).min(input.n_experts);
                }
                if slots < n_used {
                    let min_cache = n_used * slot;
                    let hint = hint(b);
                    return Err(PlanError::TooSmall {
                        dense: input.dense_bytes,
                        state: input.state_bytes,
                        ctx: input.ctx,
                        reserve: input.reserve,
                        min_cache,
                        n_used,
                        slot,
                        need: fixed + min_cache,
                        budget: b,
                        hint,
                    });
                }
                ExpertResidency::Cached { slots }
            }
        }
    };
    Ok(Plan {
        input,
        budget,
        experts,
    })
}

impl Plan {
    /// Bytes this plan keeps resident (dense, state, reserve, experts).
    pub fn resident_bytes(&self) -> u64 {
        let i = &self.input;
        let experts = match self.experts {
            ExpertResidency::Mapped => i.expert_bytes,
            ExpertResidency::Cached { slots } => slots * i.slot_bytes,
        };
        i.dense_bytes + i.state_bytes + i.reserve + experts
    }
}

impl fmt::Display for Plan {
    /// The one-line start-up statement.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = &self.input;
        let budget = match (self.budget, i.memory) {
            (None, _) => "unlimited".to_string(),
            (Some(b), Some(m)) if m == b => format!("{} (--memory)", human(b)),
            (Some(b), _) if i.n_experts > 0 => format!(
                "{} (available; {HEADROOM_PERCENT}% of it kept free when placing experts)",
                human(b)
            ),
            (Some(b), _) => format!("{} (available)", human(b)),
        };
        write!(
            f,
            "memory plan: budget {budget} | dense {} resident | state {} for {} positions | reserve {} | ",
            human(i.dense_bytes),
            human(i.state_bytes),
            i.ctx,
            human(i.reserve)
        )?;
        match self.experts {
            ExpertResidency::Mapped if i.n_experts == 0 => write!(f, "no routed experts"),
            ExpertResidency::Mapped => write!(
                f,
                "experts {} resident with the other weights, no cache",
                human(i.expert_bytes)
            ),
            ExpertResidency::Cached { slots } => write!(
                f,
                "experts {}: cache of {slots} slots × {} = {} ({:.1}% of {} experts), misses read from the file",
                human(i.expert_bytes),
                human(i.slot_bytes),
                human(slots * i.slot_bytes),
                100.0 * slots as f64 / i.n_experts.max(1) as f64,
                i.n_experts
            ),
        }
    }
}

/// `8G`, `6GiB`, `4096M`, `512MiB`, `1.5G`, `1000000` (bytes). K, M, G, T
/// are binary (1024-based) with or without `B`/`iB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}`: not a size (examples: 8G, 6GiB, 4096M)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        u => return Err(format!("`{s}`: unknown unit `{u}` (K, M, G, T)")),
    };
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{s}`: not a size"));
    }
    Ok((v * mult as f64).round() as u64)
}

/// Bytes in binary units, two decimals.
pub fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    /// The iq2 synth file's shape: 48 layers × 512 experts of 792 KiB.
    fn iq2() -> PlanInput {
        PlanInput {
            dense_bytes: 1400 * MIB,
            expert_bytes: 48 * 512 * 792 * 1024,
            n_experts: 48 * 512,
            slot_bytes: 792 * 1024,
            n_used: 10,
            state_bytes: 80 * MIB,
            ctx: 64,
            available: Some(22 * GIB),
            memory: None,
            expert_cache: None,
            reserve: DEFAULT_RESERVE,
        }
    }

    #[test]
    fn everything_fits_stays_mapped() {
        let p = plan(PlanInput {
            available: Some(40 * GIB),
            ..iq2()
        })
        .unwrap();
        assert_eq!(p.experts, ExpertResidency::Mapped);
        assert_eq!(p.budget, Some(40 * GIB));
        let p = plan(PlanInput {
            available: None,
            ..iq2()
        })
        .unwrap();
        assert_eq!(p.experts, ExpertResidency::Mapped);
        assert!(p.to_string().contains("budget unlimited"));
    }

    #[test]
    fn budget_below_file_gives_the_rest_to_the_cache() {
        let i = PlanInput {
            memory: Some(8 * GIB),
            ..iq2()
        };
        let p = plan(i.clone()).unwrap();
        // (8 GiB - 1400 MiB - 80 MiB - 512 MiB) / 792 KiB = 6200 MiB·1024/792 = 8016.2
        let want = (8 * GIB - 1400 * MIB - 80 * MIB - 512 * MIB) / (792 * 1024);
        assert_eq!(want, 8016);
        assert_eq!(p.experts, ExpertResidency::Cached { slots: want });
        assert!(p.resident_bytes() <= 8 * GIB);
        assert!(p.resident_bytes() + 792 * 1024 > 8 * GIB);
        let line = p.to_string();
        assert!(line.contains("budget 8.00 GiB (--memory)"), "{line}");
        assert!(line.contains("8016 slots"), "{line}");
        // the smaller of --memory and what is available wins
        let p = plan(PlanInput {
            available: Some(6 * GIB),
            ..i
        })
        .unwrap();
        assert_eq!(p.budget, Some(6 * GIB));
        assert!(p.to_string().contains("(available; 15% of it kept free"));
    }

    /// With the budget taken from the available memory, 15% of it stays
    /// free: the 20.5 GiB iq2 file does not count as fitting 22 GiB (it
    /// gets a cache sized to 85% of it); the same 22 GiB given as --memory
    /// is trusted and maps everything. A configuration that fits only into
    /// the headroom still runs.
    #[test]
    fn available_memory_keeps_headroom() {
        let p = plan(iq2()).unwrap();
        let usable = 22 * GIB - 22 * GIB / 100 * HEADROOM_PERCENT;
        let want = (usable - 1400 * MIB - 80 * MIB - 512 * MIB) / (792 * 1024);
        assert_eq!(p.experts, ExpertResidency::Cached { slots: want });
        assert!(p.resident_bytes() <= usable);
        let p = plan(PlanInput {
            memory: Some(22 * GIB),
            ..iq2()
        })
        .unwrap();
        assert_eq!(p.experts, ExpertResidency::Mapped);
        // 2100 MiB available: 85% (1785 MiB) is below the 1992 MiB fixed
        // part, the whole budget leaves 108 MiB = 139 slots.
        let p = plan(PlanInput {
            available: Some(2100 * MIB),
            ..iq2()
        })
        .unwrap();
        assert_eq!(
            p.experts,
            ExpertResidency::Cached {
                slots: 108 * MIB / (792 * 1024)
            }
        );
    }

    #[test]
    fn refuses_below_the_minimum_with_numbers() {
        let i = PlanInput {
            memory: Some(2 * GIB),
            ..iq2()
        };
        // 2 GiB - 1992 MiB = 56 MiB: 72 slots; fits (>= 10)
        assert_eq!(
            plan(i.clone()).unwrap().experts,
            ExpertResidency::Cached { slots: 72 }
        );
        let e = plan(PlanInput {
            memory: Some(1992 * MIB + 9 * 792 * 1024),
            ..i
        })
        .unwrap_err();
        match &e {
            PlanError::TooSmall { need, budget, .. } => {
                assert_eq!(*need, 1992 * MIB + 10 * 792 * 1024);
                assert_eq!(*budget, 1992 * MIB + 9 * 792 * 1024);
            }
            other => panic!("{other:?}"),
        }
        let msg = e.to_string();
        assert!(
            msg.contains("does not fit") && msg.contains("10 slots"),
            "{msg}"
        );
    }

    #[test]
    fn explicit_cache_size() {
        let i = PlanInput {
            expert_cache: Some(4 * GIB),
            ..iq2()
        };
        let p = plan(i.clone()).unwrap();
        assert_eq!(
            p.experts,
            ExpertResidency::Cached {
                slots: 4 * GIB / (792 * 1024)
            }
        );
        // larger than all experts: every expert, in the cache
        let p = plan(PlanInput {
            expert_cache: Some(100 * GIB),
            available: Some(200 * GIB),
            ..i.clone()
        })
        .unwrap();
        assert_eq!(p.experts, ExpertResidency::Cached { slots: 48 * 512 });
        // below n_used slots
        assert!(matches!(
            plan(PlanInput {
                expert_cache: Some(9 * 792 * 1024),
                ..i.clone()
            }),
            Err(PlanError::CacheBelowMinimum { slots: 9, .. })
        ));
        // over the budget
        let e = plan(PlanInput {
            expert_cache: Some(7 * GIB),
            memory: Some(8 * GIB),
            ..i
        })
        .unwrap_err();
        assert!(matches!(e, PlanError::CacheOverBudget { .. }), "{e:?}");
        assert!(e.to_string().contains("budget is 8.00 GiB"));
    }

    #[test]
    fn dense_models_fit_or_are_refused() {
        let dense = PlanInput {
            dense_bytes: 4 * GIB,
            expert_bytes: 0,
            n_experts: 0,
            slot_bytes: 0,
            n_used: 0,
            ..iq2()
        };
        let p = plan(dense.clone()).unwrap();
        assert_eq!(p.experts, ExpertResidency::Mapped);
        assert!(p.to_string().ends_with("no routed experts"), "{p}");
        let e = plan(PlanInput {
            memory: Some(4 * GIB),
            ..dense
        })
        .unwrap_err();
        assert!(matches!(e, PlanError::DenseTooLarge { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("weights 4.00 GiB") && msg.contains("budget is 4.00 GiB"),
            "{msg}"
        );
    }

    #[test]
    fn sums_that_overflow_are_refused_naming_the_context() {
        // Before: the sums wrapped, and a state near 2^64 planned as tiny.
        let ctx = 4611686018427387904;
        for (dense, state, slot) in [
            (1, u64::MAX - 10, 1),
            (u64::MAX / 2, u64::MAX / 2 + 1, 1),
            (1, 1, u64::MAX / 1000),
        ] {
            let input = PlanInput {
                dense_bytes: dense,
                state_bytes: state,
                slot_bytes: slot,
                ctx,
                ..iq2()
            };
            let e = plan(input.clone()).unwrap_err();
            assert_eq!(e, PlanError::Overflow { dense, state, ctx });
            assert!(
                e.to_string().contains("4611686018427387904 positions"),
                "{e}"
            );
            let dense_only = PlanInput {
                n_experts: 0,
                expert_bytes: 0,
                ..input
            };
            if slot == 1 {
                assert!(plan(dense_only).is_err());
            }
        }
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8G").unwrap(), 8 * GIB);
        assert_eq!(parse_size("6GiB").unwrap(), 6 * GIB);
        assert_eq!(parse_size("4096M").unwrap(), 4 * GIB);
        assert_eq!(parse_size("512mib").unwrap(), 512 * MIB);
        assert_eq!(parse_size("1.5G").unwrap(), 3 * GIB / 2);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size(" 2 GB ").unwrap(), 2 * GIB);
        assert!(parse_size("8X").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("").is_err());
    }
}
