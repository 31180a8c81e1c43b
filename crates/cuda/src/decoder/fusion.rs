//! Build-time fusion passes over the recorded ops: a norm after a MoE op
//! into its combine, a post-mixer norm into the fused router launch.

use super::moe::MoeOp;
use super::stages::{head_int8, Op};
use crate::ops;

/// Fold each Norm (without a residual add) or Head norm that follows a MoE
/// op into that op's combine.
pub(super) fn fuse_norms(ops: Vec<Op>) -> Vec<Op> {
    let mut out: Vec<Op> = Vec::with_capacity(ops.len());
    for op in ops {
        let prev = match out.last_mut() {
            Some(Op::Moe(m)) if m.next_norm.is_none() => Some(m),
            _ => None,
        };
        match (prev, op) {
            (
                Some(m),
                Op::Norm {
                    w,
                    eps,
                    add_mix: false,
                },
            ) => m.next_norm = Some((w, eps, true)),
            (
                Some(m),
                Op::Head {
                    norm: Some(n),
                    eps,
                    w,
                },
            ) => {
                // h is quantized for the head only where the head has an
                // int8 kernel (and only in int8 mode: otherwise there is
                // no hq to write into).
                m.next_norm = Some((n, eps, head_int8(&w)));
                out.push(Op::Head { norm: None, eps, w });
            }
            (_, op) => out.push(op),
        }
    }
    out
}

/// Fold each post-mixer Norm (with the residual add) into the fused
/// router launch of the MoE op after it, where that launch runs and its
/// combine takes the deferred residual add (the fused next norm, d % 8 ==
/// 0, d <= 4096): one launch fewer per layer (+1.4% decode on the H200
/// against the norm as its own launch, docs/cuda.md).
pub(super) fn fuse_router_norms(ops: Vec<Op>, d: usize) -> Vec<Op> {
    let fits = |m: &MoeOp| {
        m.fused_router
            && m.next_norm.is_some()
            && ops::v8_block(d).is_some()
            && ops::router_in_norm_fits(d, m.x.n_expert)
    };
    let mut out: Vec<Op> = Vec::with_capacity(ops.len());
    let mut pending: Option<Op> = None;
    for op in ops {
        match (pending.take(), op) {
            (
                Some(Op::Norm {
                    w,
                    eps,
                    add_mix: true,
                }),
                Op::Moe(mut m),
            ) if fits(&m) => {
                m.in_norm = Some((w, eps));
                out.push(Op::Moe(m));
            }
            (p, op) => {
                out.extend(p);
                if matches!(op, Op::Norm { add_mix: true, .. }) {
                    pending = Some(op);
                } else {
                    out.push(op);
                }
            }
        }
    }
    out.extend(pending);
    out
}
